//! The agents' webhooks as their senders use them: every event comes in as a signed
//! request through the receiver's real router (in process: no socket, the same handlers
//! `pulse serve` and the webhook-receiver function run), and is in the ledger only once
//! the receiver has answered that it is stored. Senders misbehave as real ones do: one
//! sends a delivery again because its answer was lost (within the signature's tolerance,
//! so it must be recognised as a duplicate), and a captured request is replayed after the
//! tolerance (so it must be refused). Neither may ever make a second event.
//!
//! The chatting users' messages come in the same way, as Discord delivers a slash
//! command: an interaction signed with the application's key, answered as deferred once
//! the receiver has queued it. The same interaction delivered again is the same message
//! (its signal id comes from the interaction's id), and one replayed past the tolerance
//! is refused.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use pulse_shared::domain::{Agent, AgentId, EventId, RateLimit, SignalId, WebhookScheme};
use pulse_shared::http::discord::{interaction_signal_id, message_signal_id, snowflake_time};
use serde_json::Value;
use tower::ServiceExt;

use crate::faults::{Fault, lock};
use crate::setup::{BOT, Sim, WEBHOOK_SECRET};
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
/// the ledger. Now and then its sender sends it again, or it is replayed much later; and
/// now and then it sends a burst of fresh ones, past the webhook's hourly limit.
pub(crate) async fn send_event(sim: &Arc<Sim>, agent: &AgentId) {
    send_fresh(sim, agent).await;
    if sim.dice.roll(Fault::WebhookBurst) {
        for _ in 0..BURST {
            send_fresh(sim, agent).await;
        }
    }
}

/// Deliveries a burst sends at once: more than a webhook's hourly limit in the
/// simulation ([`crate::setup::WEBHOOK_LIMIT`]).
const BURST: usize = 16;

/// One fresh delivery to `agent`'s webhook, and its answer checked: accepted while the
/// clock hour's count is under the webhook's limit, 429 (with `Retry-After`) once it
/// is at the limit.
async fn send_fresh(sim: &Arc<Sim>, agent: &AgentId) {
    let Some(webhook) = sim.webhooks.get(agent) else {
        return;
    };
    let delivery = format!("msg_{:016x}", sim.dice.below(u64::MAX));
    let body = serde_json::json!({"event_type": PING, "payload": {"n": 1}}).to_string();
    let now = sim.clock.now();
    let signed = pulse_signatures::inbound::sign(
        WebhookScheme::Standard.signing(),
        WEBHOOK_SECRET,
        body.as_bytes(),
        now.as_second(),
        &delivery,
    );
    let Ok(headers) = signed else {
        lock(&sim.inbound).checked(false, || {
            format!("the delivery to {webhook} could not be signed")
        });
        return;
    };
    let sent = Sent {
        webhook: webhook.to_string(),
        headers,
        body: body.into_bytes(),
    };
    let (status, answer, retry_after) = post(sim, &sent).await;
    let accepted = status == 200 && answer["status"] == "accepted";
    let hour = (webhook.to_string(), RateLimit::window(now));
    {
        let mut counts = lock(&sim.hourly);
        let count = counts.entry(hour).or_default();
        let full = *count >= crate::setup::WEBHOOK_LIMIT;
        let limited = status == 429 && retry_after.is_some_and(|s| s > 0 && s <= 3600);
        lock(&sim.limits).checked(if full { limited } else { accepted }, || {
            format!(
                "delivery {delivery} to {webhook}, with {count} accepted this hour (limit {}), was answered {status}: {answer}",
                crate::setup::WEBHOOK_LIMIT
            )
        });
        if full {
            return;
        }
        *count += u32::from(accepted);
    }
    lock(&sim.inbound).checked(accepted, || {
        format!("a fresh signed delivery {delivery} to {webhook} was answered {status}: {answer}")
    });
    let Some(event) = accepted
        .then(|| answer["event_id"].as_str()?.parse::<EventId>().ok())
        .flatten()
    else {
        return;
    };
    sim.accepted_event(agent, event.clone());
    let again = again(sim, Fault::WebhookResent, Fault::WebhookReplayed);
    if let Some(after) = again {
        let sim = sim.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(after).await;
            let (status, answer, _) = post(&sim, &sent).await;
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

/// When a request is sent again, if it is: within minutes (`resent`: its answer was lost
/// on the way back, and its sender retries), or 6 to 30 minutes later (`replayed`: someone
/// who captured it sends it again, past the signature's tolerance).
fn again(sim: &Sim, resent: Fault, replayed: Fault) -> Option<Duration> {
    if sim.dice.roll(resent) {
        Some(sim.dice.between(Duration::ZERO, Duration::from_secs(240)))
    } else if sim.dice.roll(replayed) {
        Some(
            sim.dice
                .between(Duration::from_secs(360), Duration::from_secs(1800)),
        )
    } else {
        None
    }
}

/// Discord's epoch (2015-01-01) in Unix milliseconds: snowflakes count from it.
const DISCORD_EPOCH_MS: i64 = 1_420_070_400_000;

/// A new Discord id (a snowflake), minted now.
fn snowflake(sim: &Sim) -> String {
    let seq = sim
        .interaction_seq
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let minted = (sim.clock.now().as_millisecond() - DISCORD_EPOCH_MS).max(0) as u64;
    ((minted << 22) | (seq & 0x3f_ffff)).to_string()
}

/// A user's message in `agent`'s Discord channel, mentioning the bot, handed to the
/// gateway as its connection hands over a `MESSAGE_CREATE`. The gateway keeps trying
/// until it is queued, or its agent is gone. The signal it was queued under.
pub(crate) async fn channel_message(sim: &Sim, agent: &Agent) -> Option<SignalId> {
    let channel = agent.discord_channel.as_deref()?;
    let id = snowflake(sim);
    let payload = serde_json::json!({
        "op": 0,
        "t": "MESSAGE_CREATE",
        "s": 1,
        "d": {
            "id": id,
            "channel_id": channel,
            "guild_id": "1100000000000000000",
            "author": {"id": "1000000000000000001", "username": "sim-user"},
            "content": format!("<@{BOT}> how is it going?"),
            "mentions": [{"id": BOT, "username": "sim-bot", "bot": true}],
            "attachments": [],
        }
    });
    let before = sim.gateway.status().accepted;
    sim.gateway.on_payload(&payload.to_string()).await;
    if sim.gateway.status().accepted == before {
        return None;
    }
    snowflake_time(&id).map(|at| message_signal_id(&id, at))
}

/// A user's message to `agent` (which has a Discord channel), as Discord delivers a
/// slash command: `/ask` signed with the application's key, through the receiver's
/// router. The message id it was queued under, once the receiver answered it deferred.
/// Now and then Discord delivers it again, or someone replays it much later.
pub(crate) async fn send_message(sim: &Arc<Sim>, agent: &Agent) -> Option<SignalId> {
    let channel = agent.discord_channel.as_deref()?;
    let now = sim.clock.now();
    let id = snowflake(sim);
    let body = serde_json::json!({
        "id": id,
        "application_id": "1200000000000000000",
        "type": 2,
        "token": format!("sim-token-{id}"),
        "version": 1,
        "channel": {"id": channel, "type": 0},
        "channel_id": channel,
        "guild_id": "1100000000000000000",
        "member": {"user": {"id": "1000000000000000001", "username": "sim-user"}, "nick": null},
        "data": {
            "id": "1250000000000000000",
            "name": "ask",
            "type": 1,
            "options": [{"name": "text", "type": 3, "value": "how is it going?"}]
        }
    })
    .to_string()
    .into_bytes();
    let sent = Sent {
        webhook: String::new(),
        headers: sim.discord.sign(now.as_second(), &body),
        body,
    };
    let (status, answer, _) = post_to(sim, "/discord/interactions", &sent).await;
    let taken = status == 200 && answer["type"] == 5;
    if !taken {
        // Pulse could not queue it (its store failed): the user sees the command fail
        // and sends it again, as a new interaction.
        lock(&sim.interactions).checked(status >= 500, || {
            format!(
                "a fresh signed slash command {id} to {channel} was answered {status}: {answer}"
            )
        });
        return None;
    }
    lock(&sim.interactions).checked(true, String::new);
    let signal = snowflake_time(&id).map(|at| interaction_signal_id(&id, at))?;
    let again = again(sim, Fault::InteractionResent, Fault::InteractionReplayed);
    if let Some(after) = again {
        let sim = sim.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(after).await;
            let (status, answer, _) = post_to(&sim, "/discord/interactions", &sent).await;
            let within = after.as_secs() < pulse_signatures::TOLERANCE_SECS as u64;
            // Within the tolerance it is taken again as the same message (a second
            // queueing of it makes no second turn: the turns are checked); past it, refused.
            let ok = if within {
                status >= 500 || (status == 200 && (answer["type"] == 5 || answer["type"] == 4))
            } else {
                status == 401
            };
            lock(&sim.interactions).checked(ok, || {
                format!(
                    "interaction {id} delivered again after {} s was answered {status}: {answer}",
                    after.as_secs()
                )
            });
        });
    }
    Some(signal)
}

/// POSTs `sent` through the receiver's router; the status, the JSON answer and the
/// `Retry-After` seconds.
async fn post(sim: &Sim, sent: &Sent) -> (u16, Value, Option<u64>) {
    post_to(sim, &format!("/webhooks/{}", sent.webhook), sent).await
}

/// POSTs `sent` to `path` through the receiver's router.
async fn post_to(sim: &Sim, path: &str, sent: &Sent) -> (u16, Value, Option<u64>) {
    let mut request =
        http::Request::post(path).header(http::header::CONTENT_TYPE, "application/json");
    for (k, v) in &sent.headers {
        request = request.header(k, v);
    }
    let Ok(request) = request.body(Body::from(sent.body.clone())) else {
        return (0, Value::Null, None);
    };
    let Ok(response) = sim.receiver.clone().oneshot(request).await;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let answer = axum::body::to_bytes(response.into_body(), ANSWER_LIMIT)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (status, answer, retry_after)
}
