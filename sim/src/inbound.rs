//! The agents' webhooks as their senders use them: every event comes in as a signed
//! request through the receiver's real router (in process: no socket, the same handlers
//! `pulse serve` and the webhook-receiver function run), and is in the ledger only once
//! the receiver has answered that it is stored. Senders misbehave as real ones do: one
//! sends a delivery again because its answer was lost (within the signature's tolerance,
//! so it must be recognised as a duplicate), and a captured request is replayed after the
//! tolerance (so it must be refused). Neither may ever make a second event.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use pulse_shared::domain::{AgentId, EventId, WebhookScheme};
use serde_json::Value;
use tower::ServiceExt;

use crate::faults::{Fault, lock};
use crate::setup::{Sim, WEBHOOK_SECRET};
use crate::world::PING;

/// The largest answer read back from the receiver.
const ANSWER_LIMIT: usize = 64 * 1024;

/// One signed request, kept as its sender would keep it to send again.
struct Sent {
    webhook: String,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    body: Vec<u8>,
}

/// Sends a fresh event to `agent`'s webhook; once the receiver has stored it, it is in
/// the ledger. Now and then its sender sends it again, or it is replayed much later.
pub(crate) async fn send_event(sim: &Arc<Sim>, agent: &AgentId) {
    let Some(webhook) = sim.webhooks.get(agent) else {
        return;
    };
    let delivery = format!("msg_{:016x}", sim.dice.below(u64::MAX));
    let body = serde_json::json!({"event_type": PING, "payload": {"n": 1}}).to_string();
    let signed = pulse_signatures::inbound::sign(
        WebhookScheme::Standard.signing(),
        WEBHOOK_SECRET,
        body.as_bytes(),
        sim.clock.now().as_second(),
        &delivery,
    );
    let Ok(headers) = signed else {
        return;
    };
    let sent = Sent {
        webhook: webhook.to_string(),
        headers,
        body: body.into_bytes(),
    };
    let (status, answer) = post(sim, &sent).await;
    let accepted = status == 200 && answer["status"] == "accepted";
    lock(&sim.inbound).checked(accepted, || {
        format!("a fresh signed delivery {delivery} to {webhook} was answered {status}: {answer}")
    });
    let Some(event) = accepted
        .then(|| answer["event_id"].as_str()?.parse::<EventId>().ok())
        .flatten()
    else {
        return;
    };
    lock(&sim.ledger)
        .events
        .entry(agent.clone())
        .or_default()
        .push(event.clone());
    let again = if sim.dice.roll(Fault::WebhookResent) {
        // Its answer was lost on the way back: the sender retries within minutes.
        Some(sim.dice.between(Duration::ZERO, Duration::from_secs(240)))
    } else if sim.dice.roll(Fault::WebhookReplayed) {
        // Someone who captured it sends it again, past the signature's tolerance.
        Some(
            sim.dice
                .between(Duration::from_secs(360), Duration::from_secs(1800)),
        )
    } else {
        None
    };
    if let Some(after) = again {
        let sim = sim.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(after).await;
            let (status, answer) = post(&sim, &sent).await;
            // A duplicate names the first event; anything else must be a refusal.
            let ok = status != 200
                || (answer["status"] == "duplicate" && answer["event_id"] == event.as_str());
            lock(&sim.inbound).checked(ok, || {
                format!(
                    "delivery {delivery} sent again after {} s made a second event: {status} {answer}",
                    after.as_secs()
                )
            });
        });
    }
}

/// POSTs `sent` through the receiver's router; the status and the JSON answer.
async fn post(sim: &Sim, sent: &Sent) -> (u16, Value) {
    let mut request = http::Request::post(format!("/webhooks/{}", sent.webhook))
        .header(http::header::CONTENT_TYPE, "application/json");
    for (k, v) in &sent.headers {
        request = request.header(k, v);
    }
    let Ok(request) = request.body(Body::from(sent.body.clone())) else {
        return (0, Value::Null);
    };
    let Ok(response) = sim.receiver.clone().oneshot(request).await;
    let status = response.status().as_u16();
    let answer = axum::body::to_bytes(response.into_body(), ANSWER_LIMIT)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (status, answer)
}
