//! `POST /webhooks/{webhook_id}`: signed events from external systems.
//!
//! In order: find the (active) webhook → verify the signature over the raw body with its
//! scheme and current secrets (401, logged INVALID_SIGNATURE) → read the event from the
//! body (400, REJECTED) → check the allowed types (403, REJECTED) → let the store dedup the
//! request by its replay key, count it against the hourly limit (429 with Retry-After,
//! RATE_LIMITED) and append the event with its log entry in one atomic write → answer
//! `{"event_id": ...}`. A duplicate is answered with the first one's event.
//!
//! The replay key comes only from what the signature covers (a signed delivery id, else
//! the digest of the signed content), so a captured request sent again with its unsigned
//! headers changed is still a duplicate. GitHub's event name is such a header: a GitHub
//! request refused for its type has its key remembered too, so it cannot come back under
//! another, allowed name. Refused requests are logged within a per-webhook budget
//! ([`REFUSED_LOG_BUDGET`](crate::domain::REFUSED_LOG_BUDGET) a minute in full, the rest
//! counted).
//!
//! What the body means depends on the scheme:
//! - `pulse` and `standard`: a JSON object; the event type is its `event_type` (or
//!   `type`, as Standard Webhooks senders put it), else `WEBHOOK_TRIGGER`; the payload is
//!   its `payload` (or `data`), else the whole object; `priority` 1–10, 5 when absent.
//! - `github`: any JSON; the type is `GITHUB_<X-GitHub-Event>`; the payload is the body.
//! - `stripe`: a Stripe event; the type is `STRIPE_<type>` (`invoice.paid` →
//!   `STRIPE_INVOICE_PAID`); the payload is the body.
//!
//! Allowed types (`--allow`) are checked against those final names.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use pulse_signatures::inbound::{self, Scheme, Verified};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::{Inbound, Json, client_ip, error_response, read_body, store_failure};
use crate::domain::{
    ContentBlock, Event, EventType, NewEvent, RateLimit, RequestStatus, Signal, SignalId,
    SignalKind, SignalMeta, Webhook, WebhookId, WebhookRequest, WebhookScheme, cap_reason, to_ms,
    truncate_body,
};
use crate::engine::intake;
use crate::error::chain;
use crate::ports::{AcceptOutcome, Acceptance, Refusal};

/// The event type of a body that names none.
pub const DEFAULT_EVENT_TYPE: &str = "WEBHOOK_TRIGGER";

/// The signature scheme that checks a webhook of scheme `s`.
pub fn signature_scheme(s: WebhookScheme) -> Scheme {
    match s {
        WebhookScheme::Pulse => Scheme::Pulse,
        WebhookScheme::Standard => Scheme::Standard,
        WebhookScheme::Github => Scheme::Github,
        WebhookScheme::Stripe => Scheme::Stripe,
    }
}

pub(super) async fn receive(
    State(app): State<Arc<Inbound>>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let ip = client_ip(&req);
    let (parts, body) = req.into_parts();
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let not_found = || {
        error_response(
            StatusCode::NOT_FOUND,
            "no active webhook with this id; `pulse webhooks list` shows the URLs",
        )
    };
    let Some(id) = id.ok().and_then(|Path(id)| WebhookId::parse(&id).ok()) else {
        return not_found();
    };
    let mut webhook = match app.webhook(&id, false).await {
        Ok(Some(w)) => w,
        Ok(None) => return not_found(),
        Err(e) => return store_failure("reading the webhook", &e),
    };
    let now = app.clock.now();
    let log = WebhookRequest::arrived(&webhook, now, &body, ip.clone());
    if !webhook.active {
        return refuse(
            &app,
            log,
            RequestStatus::Rejected,
            StatusCode::NOT_FOUND,
            "the webhook is disabled; `pulse webhooks enable` turns it back on",
            &body,
        )
        .await;
    }

    let check = |w: &Webhook| {
        inbound::verify(
            signature_scheme(w.scheme),
            &w.secrets_at(now),
            &parts.headers,
            &body,
            now.as_second(),
        )
    };
    let mut checked = check(&webhook);
    if checked.is_err() {
        // The cached copy may predate a rotation: check once more against the store.
        match app.webhook(&id, true).await {
            Ok(Some(w)) => {
                webhook = w;
                checked = check(&webhook);
            }
            Ok(None) => return not_found(),
            Err(e) => return store_failure("reading the webhook", &e),
        }
    }
    let verified = match checked {
        Ok(v) => v,
        Err(e) => {
            let reason = format!("invalid signature: {e}");
            return refuse(
                &app,
                log,
                RequestStatus::InvalidSignature,
                StatusCode::UNAUTHORIZED,
                &reason,
                &body,
            )
            .await;
        }
    };
    let mut log = log;
    log.delivery_id = verified.delivery_id.clone();

    let new = match read_event(webhook.scheme, &verified, &body) {
        Ok(n) => n,
        Err(reason) => {
            return refuse(
                &app,
                log,
                RequestStatus::Rejected,
                StatusCode::BAD_REQUEST,
                &reason,
                &body,
            )
            .await;
        }
    };
    log.event_type = Some(new.event_type.to_string());
    let mut refusal = None;
    if !webhook.allows(&new.event_type) {
        let reason = format!(
            "event type {} is not allowed on this webhook (allowed: {})",
            new.event_type,
            webhook
                .allowed_types
                .iter()
                .map(EventType::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if webhook.scheme != WebhookScheme::Github {
            // The type is signed: the same request is refused again whatever is resent.
            return refuse(
                &app,
                log,
                RequestStatus::Rejected,
                StatusCode::FORBIDDEN,
                &reason,
                &body,
            )
            .await;
        }
        refusal = Some(Refusal {
            http_status: StatusCode::FORBIDDEN.as_u16(),
            reason: cap_reason(reason),
        });
    }

    let event = stamp(new, &webhook, &verified, ip.as_deref(), now);
    let acceptance = Acceptance {
        event,
        log,
        replay_key: verified.replay_key.clone(),
        rate_limit: webhook.rate_limit,
        excerpt: truncate_body(&body),
        remember_until: now
            .saturating_add(app.config.delivery_memory)
            .unwrap_or(now),
        refusal,
    };
    match app.store.accept_webhook(&acceptance).await {
        Ok(AcceptOutcome::Accepted) => {
            let event = &acceptance.event;
            info!(webhook_id = %webhook.id, event_id = %event.id, event_type = %event.event_type, "webhook accepted");
            if webhook.wake {
                wake(&app, &webhook, event).await;
            }
            Json(json!({"event_id": event.id, "status": "accepted"})).into_response()
        }
        Ok(AcceptOutcome::Duplicate(first)) => {
            info!(webhook_id = %webhook.id, event_id = %first, "duplicate delivery answered with its first event");
            Json(json!({"event_id": first, "status": "duplicate"})).into_response()
        }
        Ok(AcceptOutcome::RefusedBefore) => {
            warn!(webhook_id = %webhook.id, "a request refused before was sent again");
            error_response(
                StatusCode::CONFLICT,
                "this signed request was received before and refused; send a new delivery",
            )
        }
        Ok(AcceptOutcome::Refused) => {
            let reason = acceptance
                .refusal
                .as_ref()
                .map_or_else(String::new, |r| r.reason.clone());
            warn!(webhook_id = %webhook.id, reason, "webhook request refused");
            error_response(StatusCode::FORBIDDEN, reason)
        }
        Ok(AcceptOutcome::RateLimited) => {
            let retry = RateLimit::retry_after(now);
            let mut r = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "over this webhook's limit of {}; retry after {retry} s",
                    webhook
                        .rate_limit
                        .map_or_else(String::new, |l| l.to_string())
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry));
            r
        }
        Err(e) => store_failure("storing the event", &e),
    }
}

/// Logs a refused request and answers it.
async fn refuse(
    app: &Inbound,
    log: WebhookRequest,
    status: RequestStatus,
    http: StatusCode,
    reason: &str,
    body: &[u8],
) -> Response {
    let entry = log.refuse(status, http.as_u16(), reason, body);
    let reason = entry.reason.clone().unwrap_or_default();
    warn!(webhook_id = %entry.webhook_id, status = status.as_str(), reason, "webhook request refused");
    if let Err(e) = app.store.log_request(&entry).await {
        warn!(error = %chain(&e), "could not log a refused webhook request");
    }
    error_response(http, reason)
}

/// The event a verified body asks for.
pub fn read_event(
    scheme: WebhookScheme,
    verified: &Verified,
    body: &[u8],
) -> Result<NewEvent, String> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not JSON ({e}); send application/json"))?;
    let (event_type, payload, priority) = match scheme {
        WebhookScheme::Pulse | WebhookScheme::Standard => {
            let Value::Object(obj) = &json else {
                return Err(
                    "the body must be a JSON object: {\"event_type\": ..., \"payload\": ..., \"priority\": 1-10}".into(),
                );
            };
            let event_type = match obj.get("event_type").or_else(|| obj.get("type")) {
                None | Some(Value::Null) => DEFAULT_EVENT_TYPE.to_owned(),
                Some(Value::String(t)) => t.clone(),
                Some(_) => return Err("event_type must be a string".into()),
            };
            let priority = match obj.get("priority") {
                None | Some(Value::Null) => None,
                Some(p) => Some(
                    p.as_i64()
                        .ok_or("priority must be a whole number from 1 (highest) to 10")?,
                ),
            };
            let payload = obj
                .get("payload")
                .or_else(|| obj.get("data"))
                .cloned()
                .unwrap_or_else(|| json.clone());
            (event_type, payload, priority)
        }
        WebhookScheme::Github | WebhookScheme::Stripe => {
            let event_type = verified.event_type.clone().ok_or_else(|| {
                if scheme == WebhookScheme::Github {
                    "the X-GitHub-Event header is missing".to_owned()
                } else {
                    "the Stripe event has no \"type\"".to_owned()
                }
            })?;
            (event_type, json, None)
        }
    };
    NewEvent::new(&event_type, payload, priority).map_err(|e| e.to_string())
}

fn stamp(
    mut new: NewEvent,
    webhook: &Webhook,
    verified: &Verified,
    ip: Option<&str>,
    now: Timestamp,
) -> Event {
    new.metadata = json!({
        "webhook_id": webhook.id,
        "scheme": webhook.scheme,
        "delivery_id": verified.delivery_id,
        "source_ip": ip,
    });
    new.into_event(webhook.agent_id.clone(), "webhook", now)
}

/// Wakes the agent's conversation with a `webhook` signal. The event is stored already,
/// so a queue failure only costs the early wake-up: the next heartbeat sees the event.
async fn wake(app: &Inbound, webhook: &Webhook, event: &Event) {
    let agent = match app.store.get_agent(&webhook.agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(e) => {
            warn!(error = %chain(&e), "could not read the agent to wake it");
            return;
        }
    };
    let mut payload = event.payload.to_string();
    if payload.len() > 4000 {
        let mut cut = 4000;
        while !payload.is_char_boundary(cut) {
            cut -= 1;
        }
        payload.truncate(cut);
        payload.push('…');
    }
    let signal = Signal {
        id: SignalId::derived(
            to_ms(event.created_at).max(0) as u64,
            &["webhook", event.id.as_str()],
        ),
        agent_id: agent.id.clone(),
        session: agent.session.clone(),
        kind: SignalKind::Webhook,
        content: vec![ContentBlock::Text {
            text: format!("event {} ({}): {payload}", event.event_type, event.id),
        }],
        meta: SignalMeta {
            source: Some(webhook.id.to_string()),
            ..SignalMeta::default()
        },
        created_at: event.created_at,
    };
    if let Err(e) = intake::submit(app.store.as_ref(), app.queue.as_ref(), signal).await {
        warn!(error = %chain(&e), webhook_id = %webhook.id, "could not wake the agent; the next heartbeat will see the event");
    }
}
