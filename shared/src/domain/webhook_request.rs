//! A webhook's requests: each one logged with what became of it, and what accepting one
//! writes (the event, the log entry, the replay key) in one step.

use std::borrow::Cow;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::event::{Event, RawJson};
use super::ids::{AgentId, EventId, RequestId, WebhookId};
use super::webhook::{RateLimit, Webhook};

/// What became of a request to a webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RequestStatus {
    /// An event was appended.
    Accepted,
    /// Signed correctly, but refused: an unreadable body, a type not allowed, a disabled
    /// webhook.
    Rejected,
    /// Over the webhook's hourly limit.
    RateLimited,
    /// The signature or its timestamp did not check out.
    InvalidSignature,
    /// A request seen before (its signed delivery id or signed content): answered with
    /// the first one's event, or refused again if the first was refused.
    Duplicate,
    /// Not one request: the count of requests refused in one minute beyond the first
    /// [`REFUSED_LOG_BUDGET`], which are counted here instead of logged one by one.
    Suppressed,
}

impl RequestStatus {
    /// Its name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "ACCEPTED",
            Self::Rejected => "REJECTED",
            Self::RateLimited => "RATE_LIMITED",
            Self::InvalidSignature => "INVALID_SIGNATURE",
            Self::Duplicate => "DUPLICATE",
            Self::Suppressed => "SUPPRESSED",
        }
    }
}

/// Most bytes of a refused request's body kept in its log entry.
pub const LOGGED_BODY_LIMIT: usize = 2048;

/// Most characters of a refusal's reason kept in a log entry (and sent back).
pub const LOGGED_REASON_LIMIT: usize = 500;

/// How many requests a webhook refuses (bad signature, rejected, duplicate, over its rate
/// limit) that are logged in full in one minute. Beyond it they are only counted, in one
/// [`RequestStatus::Suppressed`] entry per minute, so a flood of unsigned requests to a
/// known URL cannot fill the store.
pub const REFUSED_LOG_BUDGET: u64 = 20;

/// One request to a webhook, accepted or not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WebhookRequest {
    /// Its id (time-ordered).
    pub id: RequestId,
    /// The webhook it was sent to.
    pub webhook_id: WebhookId,
    /// The webhook's agent.
    pub agent_id: AgentId,
    /// When it arrived.
    pub received_at: Timestamp,
    /// What became of it.
    pub status: RequestStatus,
    /// The HTTP status it was answered with.
    pub http_status: u16,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<String>,
    /// The sender's delivery id, when the scheme carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    /// The event type it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The event it created (or, for a duplicate, the first delivery's event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<EventId>,
    /// The size of its body.
    pub body_bytes: usize,
    /// The start of its body, for refused requests only (accepted bodies are in the
    /// event), cut at [`LOGGED_BODY_LIMIT`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// For a [`RequestStatus::Suppressed`] entry: how many requests it counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl WebhookRequest {
    /// A log entry for a request to `webhook` that arrived at `now`, with its outcome to
    /// be filled in.
    pub fn arrived(
        webhook: &Webhook,
        now: Timestamp,
        body: &[u8],
        source_ip: Option<String>,
    ) -> Self {
        Self {
            id: RequestId::generate(now.as_millisecond().max(0) as u64),
            webhook_id: webhook.id.clone(),
            agent_id: webhook.agent_id.clone(),
            received_at: now,
            status: RequestStatus::Rejected,
            http_status: 400,
            reason: None,
            source_ip,
            delivery_id: None,
            event_type: None,
            event_id: None,
            body_bytes: body.len(),
            body: None,
            count: None,
        }
    }

    /// The minute (Unix minutes) it arrived in: the unit of the logging budget.
    pub fn minute(&self) -> i64 {
        self.received_at.as_second().div_euclid(60)
    }

    /// The entry that counts `count` requests to `webhook` refused in `minute` beyond the
    /// [`REFUSED_LOG_BUDGET`]. Its id is fixed by the minute and sorts after the entries
    /// logged in full in it.
    pub fn suppressed(webhook: &WebhookId, agent: &AgentId, minute: i64, count: u64) -> Self {
        let end_ms = (minute.saturating_add(1).saturating_mul(60_000) - 1).max(0);
        Self {
            id: RequestId::derived(end_ms as u64, &["suppressed", webhook.as_str()]),
            webhook_id: webhook.clone(),
            agent_id: agent.clone(),
            received_at: Timestamp::from_millisecond(end_ms).unwrap_or(Timestamp::UNIX_EPOCH),
            status: RequestStatus::Suppressed,
            http_status: 0,
            reason: Some(format!(
                "refused requests in this minute beyond the first {REFUSED_LOG_BUDGET}: counted, not logged one by one"
            )),
            source_ip: None,
            delivery_id: None,
            event_type: None,
            event_id: None,
            body_bytes: 0,
            body: None,
            count: Some(count),
        }
    }

    /// The entry of a request accepted as `event`: an [`Acceptance`] carries its log in
    /// this form.
    pub fn accepted(mut self, event: &EventId) -> Self {
        self.status = RequestStatus::Accepted;
        self.http_status = 200;
        self.event_id = Some(event.clone());
        self
    }

    /// Marks it refused with `status`, keeping the start of the body.
    pub fn refuse(
        mut self,
        status: RequestStatus,
        http_status: u16,
        reason: impl Into<String>,
        body: &[u8],
    ) -> Self {
        self.status = status;
        self.http_status = http_status;
        self.reason = Some(cap_reason(reason.into()));
        self.body = Some(truncate_body(body));
        self
    }
}

/// `reason`, cut at [`LOGGED_REASON_LIMIT`] characters.
pub fn cap_reason(reason: String) -> String {
    if reason.chars().count() <= LOGGED_REASON_LIMIT {
        return reason;
    }
    let mut cut: String = reason.chars().take(LOGGED_REASON_LIMIT - 1).collect();
    cut.push('…');
    cut
}

/// The first [`LOGGED_BODY_LIMIT`] bytes of a body as text (invalid UTF-8 replaced).
pub fn truncate_body(body: &[u8]) -> String {
    let cut = &body[..body.len().min(LOGGED_BODY_LIMIT)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if body.len() > LOGGED_BODY_LIMIT {
        s.push('…');
    }
    s
}

/// A signed request a webhook may accept: what to write if it is accepted.
#[derive(Clone, Debug)]
pub struct Acceptance {
    /// The event to append, its payload and metadata as the JSON text they arrived as.
    pub event: Event<RawJson>,
    /// Its log entry as ACCEPTED; the store turns it into DUPLICATE, RATE_LIMITED or
    /// REJECTED when that is the outcome.
    pub log: WebhookRequest,
    /// What identifies the signed request (`Verified::replay_key`: a signed delivery id,
    /// or the digest of the signed content): a second request with it is a duplicate,
    /// whatever its unsigned headers say.
    pub replay_key: String,
    /// The webhook's limit, counted per clock hour.
    pub rate_limit: Option<RateLimit>,
    /// The start of the body, kept in the log if the request is refused.
    pub excerpt: String,
    /// How long the replay key is remembered.
    pub remember_until: Timestamp,
    /// Set when the request is refused but its key must be remembered all the same:
    /// when the refusal rests on something the signature does not cover (GitHub's event
    /// header), a replay with that changed must not be accepted. The store then writes
    /// the key (with no event) and the REJECTED log entry instead of the event.
    pub refusal: Option<Refusal>,
}

/// Why a verified request is refused, for [`Acceptance::refusal`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status it is answered with.
    pub http_status: u16,
    /// Why.
    pub reason: String,
}

/// What became of an [`Acceptance`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptOutcome {
    /// The event, its log entry and the replay key were written, in one atomic write.
    Accepted,
    /// The request was accepted before, as this event: nothing new was written but the
    /// DUPLICATE log entry.
    Duplicate(EventId),
    /// The request was refused before (its key remembered with no event): nothing new
    /// was written but the DUPLICATE log entry.
    RefusedBefore,
    /// Over the hourly limit: nothing written but the RATE_LIMITED log entry.
    RateLimited,
    /// The [`Acceptance::refusal`] was recorded: the key and the REJECTED log entry.
    Refused,
}

impl Acceptance {
    /// Its log entry for `outcome`. The entry of an accepted request is [`Self::log`]
    /// itself when the engine made it in that form (see [`WebhookRequest::accepted`]),
    /// so the common case copies nothing.
    pub fn log_for(&self, outcome: &AcceptOutcome) -> Cow<'_, WebhookRequest> {
        if *outcome == AcceptOutcome::Accepted
            && self.log.status == RequestStatus::Accepted
            && self.log.http_status == 200
            && self.log.event_id.as_ref() == Some(&self.event.id)
        {
            return Cow::Borrowed(&self.log);
        }
        let mut log = self.log.clone();
        let seen = || {
            if self.replay_key.starts_with("sha256:") {
                "this signed request (the same signed content)".to_owned()
            } else {
                format!("delivery {}", self.replay_key)
            }
        };
        match outcome {
            AcceptOutcome::Accepted => {
                log.status = RequestStatus::Accepted;
                log.http_status = 200;
                log.event_id = Some(self.event.id.clone());
            }
            AcceptOutcome::Duplicate(first) => {
                log.status = RequestStatus::Duplicate;
                log.http_status = 200;
                log.reason = Some(format!("{} was accepted before as event {first}", seen()));
                log.event_id = Some(first.clone());
            }
            AcceptOutcome::RefusedBefore => {
                log.status = RequestStatus::Duplicate;
                log.http_status = 409;
                log.reason = Some(format!("{} was refused before", seen()));
                log.event_id = None;
                log.body = Some(self.excerpt.clone());
            }
            AcceptOutcome::RateLimited => {
                log.status = RequestStatus::RateLimited;
                log.http_status = 429;
                log.reason = Some(format!(
                    "over the webhook's limit of {}",
                    self.rate_limit.map_or_else(String::new, |r| r.to_string())
                ));
                log.event_id = None;
                log.body = Some(self.excerpt.clone());
            }
            AcceptOutcome::Refused => {
                let refusal = self.refusal.clone().unwrap_or(Refusal {
                    http_status: 400,
                    reason: String::new(),
                });
                log.status = RequestStatus::Rejected;
                log.http_status = refusal.http_status;
                log.reason = Some(refusal.reason);
                log.event_id = None;
                log.body = Some(self.excerpt.clone());
            }
        }
        Cow::Owned(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_body_is_cut_for_the_log() {
        let body = vec![b'x'; LOGGED_BODY_LIMIT + 10];
        let s = truncate_body(&body);
        assert!(s.ends_with('…'));
        assert_eq!(s.chars().filter(|c| *c == 'x').count(), LOGGED_BODY_LIMIT);
        assert_eq!(truncate_body(&[0xff, b'a']), "\u{fffd}a");
    }

    /// An acceptance made in the accepted form lends its entry for that outcome; any
    /// other outcome, or an entry not in that form, is written out afresh.
    #[test]
    fn the_accepted_entry_is_lent_and_the_others_made() {
        use crate::domain::{NewEvent, WebhookScheme};
        let now = Timestamp::UNIX_EPOCH;
        let webhook =
            Webhook::new(AgentId::generate(), WebhookScheme::Pulse, "secret-1", now).unwrap();
        let event = NewEvent::new("NOTE", serde_json::json!({}), None)
            .unwrap()
            .into_event(webhook.agent_id.clone(), "webhook", now)
            .into_raw();
        let arrived = WebhookRequest::arrived(&webhook, now, b"{}", None);
        let mut a = Acceptance {
            log: arrived.clone().accepted(&event.id),
            event,
            replay_key: "d1".into(),
            rate_limit: None,
            excerpt: "{}".into(),
            remember_until: now,
            refusal: None,
        };
        // What an entry says of its outcome.
        let said = |l: &WebhookRequest| (l.status, l.http_status, l.event_id.clone());
        let accepted = a.log_for(&AcceptOutcome::Accepted);
        assert!(matches!(accepted, Cow::Borrowed(_)));
        assert_eq!(
            said(&accepted),
            (RequestStatus::Accepted, 200, Some(a.event.id.clone()))
        );
        let limited = a.log_for(&AcceptOutcome::RateLimited);
        assert!(matches!(limited, Cow::Owned(_)));
        assert_eq!(said(&limited), (RequestStatus::RateLimited, 429, None));
        a.log = arrived;
        let made = a.log_for(&AcceptOutcome::Accepted);
        assert!(matches!(made, Cow::Owned(_)));
        assert_eq!(
            said(&made),
            (RequestStatus::Accepted, 200, Some(a.event.id.clone()))
        );
    }
}
