//! Signed webhooks from external systems, as a use case: a request in, a [`Verdict`]
//! out, which the HTTP layer (`http/webhooks.rs`) turns into a status and a body.
//!
//! In order: find the (active) webhook → verify the signature over the raw body with its
//! scheme and current secrets (logged INVALID_SIGNATURE) → read the event from the body
//! (REJECTED) → check the allowed types (REJECTED) → let the store dedup the request by
//! its replay key, count it against the hourly limit (RATE_LIMITED) and append the event
//! with its log entry in one atomic write. A duplicate is answered with the first one's
//! event.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderMap;
use jiff::{SignedDuration, Timestamp};
use pulse_signatures::inbound::{self, Verified};
use serde_json::value::RawValue;
use tracing::{Instrument as _, info, warn};

use super::{intake, json_body};
use crate::domain::{
    AcceptOutcome, Acceptance, ContentBlock, Event, EventId, EventType, NewEvent, RateLimit,
    RawJson, Refusal, RequestStatus, Signal, SignalId, SignalKind, SignalMeta, Webhook, WebhookId,
    WebhookRequest, WebhookScheme, cap_reason, to_ms, truncate_body,
};
use crate::error::{StoreError, ValidationError, chain};
use crate::ports::{Clock, SessionQueue, Store};

/// The event type of a body that names none.
pub const DEFAULT_EVENT_TYPE: &str = "WEBHOOK_TRIGGER";

/// How long a webhook read stays cached. A rotated secret is seen at once (a failed
/// check reads the webhook again); enabling or disabling takes effect within this time.
pub const WEBHOOK_CACHE_TTL: SignedDuration = SignedDuration::from_secs(2);

/// Most webhooks cached at once; the cache is emptied beyond it.
const WEBHOOK_CACHE_MAX: usize = 10_000;

/// Why a request was refused: what the HTTP layer answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No webhook with this id (404).
    NotFound,
    /// The webhook is disabled (404).
    Disabled,
    /// The signature or its timestamp did not check out (401).
    BadSignature,
    /// The body is not an event (400).
    BadBody,
    /// The event type is not allowed (403).
    NotAllowed,
    /// The same signed request was refused before (409).
    SeenAndRefused,
}

/// What became of a request to a webhook.
#[derive(Debug)]
pub enum Verdict {
    /// The event was appended.
    Accepted(EventId),
    /// The request was accepted before, as this event.
    Duplicate(EventId),
    /// Refused, and why (logged already).
    Refused(Refused, String),
    /// Over the webhook's hourly limit; retry after so many seconds.
    RateLimited {
        /// The limit.
        limit: Option<RateLimit>,
        /// Seconds until the next hour's counter.
        retry_after: u64,
    },
    /// The store could not be reached or read: what was being done, and why.
    Unavailable(&'static str, StoreError),
    /// No configured key opens the webhook's secrets: nothing can be checked until the
    /// key is restored or the secret rotated (logged with the key id, never told to the
    /// sender).
    SecretUnreadable,
}

impl Verdict {
    /// Its name in metrics: `accepted`, `duplicate`, `rate_limited`, `unavailable`, or
    /// why the request was refused.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Accepted(_) => "accepted",
            Self::Duplicate(_) => "duplicate",
            Self::RateLimited { .. } => "rate_limited",
            Self::Unavailable(..) => "unavailable",
            Self::SecretUnreadable => "secret_unreadable",
            Self::Refused(why, _) => match why {
                Refused::NotFound => "not_found",
                Refused::Disabled => "disabled",
                Refused::BadSignature => "bad_signature",
                Refused::BadBody => "bad_body",
                Refused::NotAllowed => "not_allowed",
                Refused::SeenAndRefused => "refused_before",
            },
        }
    }
}

/// A request to a webhook whose secrets no configured key opens: logged with the key's
/// id and the fix, answered 503 without saying why.
fn unreadable(webhook: &Webhook, why: &crate::domain::Unreadable) -> Verdict {
    warn!(
        webhook_id = %webhook.id,
        key_id = %why.key_id,
        "a request to a webhook whose signing secret cannot be read: {why}; restore that key (PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_OLD_KEYS), or run `pulse webhooks rotate {}`",
        webhook.id
    );
    Verdict::SecretUnreadable
}

/// Takes signed webhook requests in: the webhooks it has read recently, and the store
/// and queue it writes to.
pub struct WebhookIntake {
    store: Arc<dyn Store>,
    queue: Arc<dyn SessionQueue>,
    clock: Arc<dyn Clock>,
    /// How long a request's replay key is remembered (`PULSE_DELIVERY_MEMORY`).
    delivery_memory: SignedDuration,
    /// Webhooks read in the last [`WEBHOOK_CACHE_TTL`]: most requests then cost no read.
    cache: Mutex<HashMap<WebhookId, (Arc<Webhook>, Timestamp)>>,
}

impl WebhookIntake {
    /// An intake over a store and the sessions queue (for `--wake`).
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn SessionQueue>,
        clock: Arc<dyn Clock>,
        delivery_memory: SignedDuration,
    ) -> Self {
        Self {
            store,
            queue,
            clock,
            delivery_memory,
            cache: Mutex::default(),
        }
    }

    /// The webhook, from the cache if it was read within [`WEBHOOK_CACHE_TTL`] and
    /// `fresh` is not asked for.
    async fn webhook(
        &self,
        id: &WebhookId,
        fresh: bool,
    ) -> Result<Option<Arc<Webhook>>, StoreError> {
        let now = self.clock.now();
        if !fresh {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((w, at)) = cache.get(id)
                && now.duration_since(*at) < WEBHOOK_CACHE_TTL
            {
                return Ok(Some(w.clone()));
            }
        }
        let w = self.store.get_webhook(id).await?.map(Arc::new);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= WEBHOOK_CACHE_MAX {
            cache.clear();
        }
        match &w {
            Some(w) => {
                cache.insert(id.clone(), (w.clone(), now));
            }
            None => {
                cache.remove(id);
            }
        }
        Ok(w)
    }

    /// Takes in a request to webhook `id` (as the URL gave it) with its headers, raw
    /// body and source address. Headers and body are dropped once the event is made,
    /// before the store is waited for: under `pulse serve` they hold on to the
    /// connection's read buffer.
    pub async fn receive(
        &self,
        id: &str,
        headers: HeaderMap,
        body: Bytes,
        ip: Option<String>,
    ) -> Verdict {
        let trace = crate::traces::webhook(id);
        let verdict = async {
            match self.assess(id, &headers, &body, ip).await {
                Ok((webhook, acceptance, now)) => {
                    drop((headers, body));
                    self.accept(&webhook, acceptance, now).await
                }
                Err(verdict) => verdict,
            }
        }
        .instrument(trace.clone())
        .await;
        let event = match &verdict {
            Verdict::Accepted(e) | Verdict::Duplicate(e) => Some(e.to_string()),
            _ => None,
        };
        crate::traces::webhook_answered(&trace, verdict.outcome(), event.as_deref());
        crate::meter::webhook_request(verdict.outcome());
        verdict
    }

    /// Whether a request to webhook `id` (as the URL gave it) can be taken at all, before
    /// its body is read: `Err` with the verdict when no webhook has that id (404) or the
    /// store cannot say. A body is read only for a webhook that exists, so a stranger's
    /// slow body to a made-up id holds no connection (the lookup is cached).
    pub async fn precheck(&self, id: &str) -> Result<(), Verdict> {
        let verdict = match WebhookId::parse(id) {
            Err(_) => not_found(),
            Ok(id) => match self.webhook(&id, false).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => not_found(),
                Err(e) => Verdict::Unavailable("reading the webhook", e),
            },
        };
        crate::meter::webhook_request(verdict.outcome());
        Err(verdict)
    }

    /// Everything before the store's decision: the webhook, the signature, the event and
    /// its allowed type. A request refused on the way is logged and answered here
    /// (`Err`); one that may be accepted gives what the store is to write.
    async fn assess(
        &self,
        id: &str,
        headers: &HeaderMap,
        body: &[u8],
        ip: Option<String>,
    ) -> Result<(Arc<Webhook>, Acceptance, Timestamp), Verdict> {
        let Ok(id) = WebhookId::parse(id) else {
            return Err(not_found());
        };
        let webhook = match self.webhook(&id, false).await {
            Ok(Some(w)) => w,
            Ok(None) => return Err(not_found()),
            Err(e) => return Err(Verdict::Unavailable("reading the webhook", e)),
        };
        let now = self.clock.now();
        let log = WebhookRequest::arrived(&webhook, now, body, ip.clone());
        if !webhook.active {
            let why = "the webhook is disabled; `pulse webhooks enable` turns it back on";
            return Err(self
                .refuse(log, RequestStatus::Rejected, Refused::Disabled, why, body)
                .await);
        }
        if let Some(why) = &webhook.unreadable {
            return Err(unreadable(&webhook, why));
        }
        let (webhook, verified) = match self.verify(webhook, headers, body, now).await {
            Ok(checked) => checked,
            Err(Ok(why)) => {
                let reason = format!("invalid signature: {why}");
                return Err(self
                    .refuse(
                        log,
                        RequestStatus::InvalidSignature,
                        Refused::BadSignature,
                        &reason,
                        body,
                    )
                    .await);
            }
            Err(Err(verdict)) => return Err(verdict),
        };
        let mut log = log;
        log.delivery_id = verified.delivery_id.clone();
        let new = match read_event(webhook.scheme, &verified, body) {
            Ok(n) => n,
            Err(bad) => {
                return Err(self
                    .refuse(
                        log,
                        RequestStatus::Rejected,
                        Refused::BadBody,
                        &bad.to_string(),
                        body,
                    )
                    .await);
            }
        };
        log.event_type = Some(new.event_type.to_string());
        let mut refusal = None;
        if !webhook.allows(&new.event_type) {
            let reason = not_allowed(&webhook, &new.event_type);
            if webhook.scheme != WebhookScheme::Github {
                // The type is signed: the same request is refused again whatever is resent.
                return Err(self
                    .refuse(
                        log,
                        RequestStatus::Rejected,
                        Refused::NotAllowed,
                        &reason,
                        body,
                    )
                    .await);
            }
            refusal = Some(Refusal {
                http_status: 403,
                reason: cap_reason(reason),
            });
        }
        let event = stamp(new, &webhook, &verified, ip.as_deref(), now);
        let log = log.accepted(&event.id);
        let acceptance = Acceptance {
            event,
            log,
            replay_key: verified.replay_key,
            rate_limit: webhook.rate_limit,
            excerpt: truncate_body(body),
            remember_until: now.saturating_add(self.delivery_memory).unwrap_or(now),
            refusal,
        };
        Ok((webhook, acceptance, now))
    }

    /// Checks the signature with the webhook's current secrets; a failure with a cached
    /// copy reads the webhook again (a rotation may have happened) and checks once more.
    /// `Err(Ok(why))` for a bad signature, `Err(Err(verdict))` when the store failed.
    async fn verify(
        &self,
        mut webhook: Arc<Webhook>,
        headers: &HeaderMap,
        body: &[u8],
        now: Timestamp,
    ) -> Result<(Arc<Webhook>, Verified), Result<inbound::VerifyError, Verdict>> {
        let check = |w: &Webhook| {
            inbound::verify(
                w.scheme.signing(),
                &w.secrets_at(now),
                headers,
                body,
                now.as_second(),
            )
        };
        if let Ok(v) = check(&webhook) {
            return Ok((webhook, v));
        }
        webhook = match self.webhook(&webhook.id, true).await {
            Ok(Some(w)) => w,
            Ok(None) => {
                return Err(Err(Verdict::Refused(
                    Refused::NotFound,
                    "no active webhook with this id; `pulse webhooks list` shows the URLs".into(),
                )));
            }
            Err(e) => return Err(Err(Verdict::Unavailable("reading the webhook", e))),
        };
        if let Some(why) = &webhook.unreadable {
            return Err(Err(unreadable(&webhook, why)));
        }
        match check(&webhook) {
            Ok(v) => Ok((webhook, v)),
            Err(e) => Err(Ok(e)),
        }
    }

    /// Lets the store dedup, count and write the request.
    async fn accept(&self, webhook: &Webhook, acceptance: Acceptance, now: Timestamp) -> Verdict {
        let acceptance = Arc::new(acceptance);
        match self.store.accept_webhook(acceptance.clone()).await {
            Ok(AcceptOutcome::Accepted) => {
                let event = &acceptance.event;
                info!(webhook_id = %webhook.id, event_id = %event.id, event_type = %event.event_type, "webhook accepted");
                if webhook.wake {
                    self.wake(webhook, event).await;
                }
                Verdict::Accepted(event.id.clone())
            }
            Ok(AcceptOutcome::Duplicate(first)) => {
                info!(webhook_id = %webhook.id, event_id = %first, "duplicate delivery answered with its first event");
                Verdict::Duplicate(first)
            }
            Ok(AcceptOutcome::RefusedBefore) => {
                warn!(webhook_id = %webhook.id, "a request refused before was sent again");
                Verdict::Refused(
                    Refused::SeenAndRefused,
                    "this signed request was received before and refused; send a new delivery"
                        .into(),
                )
            }
            Ok(AcceptOutcome::Refused) => {
                let reason = acceptance
                    .refusal
                    .as_ref()
                    .map_or_else(String::new, |r| r.reason.clone());
                warn!(webhook_id = %webhook.id, reason, "webhook request refused");
                Verdict::Refused(Refused::NotAllowed, reason)
            }
            Ok(AcceptOutcome::RateLimited) => Verdict::RateLimited {
                limit: webhook.rate_limit,
                retry_after: RateLimit::retry_after(now),
            },
            Err(e) => Verdict::Unavailable("storing the event", e),
        }
    }

    /// Logs a refused request (within the webhook's budget) and refuses it.
    async fn refuse(
        &self,
        log: WebhookRequest,
        status: RequestStatus,
        refused: Refused,
        reason: &str,
        body: &[u8],
    ) -> Verdict {
        let http_status = match refused {
            Refused::NotFound | Refused::Disabled => 404,
            Refused::BadSignature => 401,
            Refused::BadBody => 400,
            Refused::NotAllowed => 403,
            Refused::SeenAndRefused => 409,
        };
        let entry = log.refuse(status, http_status, reason, body);
        let reason = entry.reason.clone().unwrap_or_default();
        warn!(webhook_id = %entry.webhook_id, status = status.as_str(), reason, "webhook request refused");
        if let Err(e) = self.store.log_request(&entry).await {
            warn!(error = %chain(&e), "could not log a refused webhook request");
        }
        Verdict::Refused(refused, reason)
    }

    /// Wakes the agent's conversation with a `webhook` signal. The event is stored already,
    /// so a queue failure only costs the early wake-up: the next heartbeat sees the event.
    async fn wake(&self, webhook: &Webhook, event: &Event<RawJson>) {
        let agent = match self.store.get_agent(&webhook.agent_id).await {
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
        if let Err(e) = intake::submit(self.store.as_ref(), self.queue.as_ref(), signal).await {
            warn!(error = %chain(&e), webhook_id = %webhook.id, "could not wake the agent; the next heartbeat will see the event");
        }
    }
}

fn not_allowed(webhook: &Webhook, event_type: &EventType) -> String {
    format!(
        "event type {event_type} is not allowed on this webhook (allowed: {})",
        webhook
            .allowed_types
            .iter()
            .map(EventType::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Why a verified body does not make an event; the text is what the sender is told.
#[derive(Debug, thiserror::Error)]
enum BadBody {
    #[error("the body is not JSON ({0}); send application/json")]
    NotJson(serde_json::Error),
    #[error(
        "the body must be a JSON object: {{\"event_type\": ..., \"payload\": ..., \"priority\": 1-10}}"
    )]
    NotObject,
    #[error("event_type must be a string")]
    EventTypeNotString,
    #[error("priority must be a whole number from 1 (highest) to 10")]
    PriorityNotWhole,
    #[error("the X-GitHub-Event header is missing")]
    NoGithubEvent,
    #[error("the Stripe event has no \"type\"")]
    NoStripeType,
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

/// The event a verified body asks for, its payload the body's JSON text (checked, not
/// parsed into a tree: see [`json_body`]).
fn read_event(
    scheme: WebhookScheme,
    verified: &Verified,
    body: &[u8],
) -> Result<NewEvent<RawJson>, BadBody> {
    let text = json_body::checked(body).map_err(BadBody::NotJson)?;
    let whole = || json_body::raw(text).map_err(BadBody::NotJson);
    let (event_type, payload, priority) = match scheme {
        WebhookScheme::Pulse | WebhookScheme::Standard => {
            let fields = json_body::Fields::of(text).ok_or(BadBody::NotObject)?;
            let event_type = match fields.event_type.or(fields.type_) {
                None => None,
                Some(t) => serde_json::from_str::<Option<String>>(t.get())
                    .map_err(|_| BadBody::EventTypeNotString)?,
            };
            let priority = match fields.priority {
                None => None,
                Some(p) => serde_json::from_str::<Option<i64>>(p.get())
                    .map_err(|_| BadBody::PriorityNotWhole)?,
            };
            // A body with neither field is the payload as a whole.
            let payload = match fields.payload.or(fields.data) {
                Some(p) => p.to_owned(),
                None => whole()?,
            };
            let event_type = event_type.unwrap_or_else(|| DEFAULT_EVENT_TYPE.to_owned());
            (event_type, payload, priority)
        }
        WebhookScheme::Github | WebhookScheme::Stripe => {
            let event_type =
                verified
                    .event_type
                    .clone()
                    .ok_or(if scheme == WebhookScheme::Github {
                        BadBody::NoGithubEvent
                    } else {
                        BadBody::NoStripeType
                    })?;
            (event_type, whole()?, None)
        }
    };
    Ok(NewEvent::with_payload(
        &event_type,
        payload,
        RawValue::NULL.to_owned(),
        priority,
    )?)
}

/// A webhook event's metadata, its fields in the order a JSON tree writes them.
#[derive(serde::Serialize)]
struct WebhookMetadata<'a> {
    delivery_id: Option<&'a str>,
    scheme: WebhookScheme,
    source_ip: Option<&'a str>,
    webhook_id: &'a WebhookId,
}

pub(crate) fn stamp(
    mut new: NewEvent<RawJson>,
    webhook: &Webhook,
    verified: &Verified,
    ip: Option<&str>,
    now: Timestamp,
) -> Event<RawJson> {
    let metadata = WebhookMetadata {
        delivery_id: verified.delivery_id.as_deref(),
        scheme: webhook.scheme,
        source_ip: ip,
        webhook_id: &webhook.id,
    };
    new.metadata =
        serde_json::value::to_raw_value(&metadata).expect("ids and addresses always write as JSON");
    new.into_event(webhook.agent_id.clone(), "webhook", now)
}

/// The answer to a request for a webhook that does not exist (or an id that is none).
fn not_found() -> Verdict {
    Verdict::Refused(
        Refused::NotFound,
        "no active webhook with this id; `pulse webhooks list` shows the URLs".into(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn verified() -> Verified {
        Verified {
            delivery_id: Some("d1".into()),
            timestamp: None,
            event_type: None,
            secret_index: 0,
            replay_key: "d1".into(),
        }
    }

    fn verified_github() -> Verified {
        Verified {
            event_type: Some("push".into()),
            ..verified()
        }
    }

    /// The event `body` makes, its payload parsed back into a tree.
    fn read(body: Value) -> NewEvent {
        let e = read_event(
            WebhookScheme::Pulse,
            &verified(),
            body.to_string().as_bytes(),
        )
        .unwrap();
        NewEvent::new(
            e.event_type.as_str(),
            serde_json::from_str(e.payload.get()).unwrap(),
            Some(i64::from(e.priority.get())),
        )
        .unwrap()
    }

    /// The payload is the body's `payload`, else its `data`, else the whole body; the
    /// type is `event_type`, else `type`, and a null one is the default.
    #[test]
    fn the_payload_is_payload_then_data_then_the_whole_body() {
        let e = read(json!({"event_type": "A", "payload": {"n": 1}, "data": {"n": 2}}));
        assert_eq!((e.event_type.as_str(), e.payload), ("A", json!({"n": 1})));
        let e = read(json!({"type": "B", "data": [1, 2]}));
        assert_eq!((e.event_type.as_str(), e.payload), ("B", json!([1, 2])));
        let body = json!({"type": "C", "n": 3, "priority": 2});
        let e = read(body.clone());
        assert_eq!((e.event_type.as_str(), &e.payload), ("C", &body));
        assert_eq!(e.priority.get(), 2);
        let e = read(json!({"event_type": null, "type": "D", "payload": null}));
        assert_eq!(e.event_type.as_str(), DEFAULT_EVENT_TYPE);
        assert_eq!(e.payload, Value::Null);
    }

    /// The payload is stored as the sender wrote it (its keys in their order, its white
    /// space inside), and a body the log could not read back is refused as not JSON.
    #[test]
    fn the_payload_is_kept_as_sent_and_checked() {
        let body = br#" {"payload": {"z": 1, "a": [1, 2.50]}, "type": "T"} "#;
        let e = read_event(WebhookScheme::Pulse, &verified(), body).unwrap();
        assert_eq!(e.payload.get(), r#"{"z": 1, "a": [1, 2.50]}"#);
        let whole = read_event(WebhookScheme::Github, &verified_github(), body).unwrap();
        assert_eq!(
            whole.payload.get(),
            r#"{"payload": {"z": 1, "a": [1, 2.50]}, "type": "T"}"#
        );
        for bad in [
            &br#"{"payload": 1e999}"#[..],
            br#"{"payload": "\ud800"}"#,
            b"{} x",
        ] {
            let e = read_event(WebhookScheme::Pulse, &verified(), bad);
            assert!(matches!(e, Err(BadBody::NotJson(_))), "{e:?}");
        }
        for (body, want) in [
            (&b"[1]"[..], "NotObject"),
            (br#"{"type": 1}"#, "EventTypeNotString"),
            (br#"{"priority": 2.5}"#, "PriorityNotWhole"),
            (br#"{"priority": "2"}"#, "PriorityNotWhole"),
        ] {
            let e = read_event(WebhookScheme::Pulse, &verified(), body).unwrap_err();
            assert!(format!("{e:?}").starts_with(want), "{e:?}");
        }
    }

    /// A webhook's event carries its metadata as the tree it was written from before.
    #[test]
    fn the_metadata_is_what_it_was() {
        let now = Timestamp::UNIX_EPOCH;
        let agent = crate::domain::AgentId::generate();
        let webhook = Webhook::new(agent, WebhookScheme::Pulse, "secret-1", now).unwrap();
        let new = read_event(WebhookScheme::Pulse, &verified(), b"{}").unwrap();
        let event = stamp(new, &webhook, &verified(), Some("10.0.0.1"), now);
        let metadata = json!({
            "webhook_id": webhook.id,
            "scheme": webhook.scheme,
            "delivery_id": "d1",
            "source_ip": "10.0.0.1",
        });
        assert_eq!(event.metadata.get(), metadata.to_string());
    }
}
