//! Inbound webhooks: how an external system may push events into an agent's log, and the
//! log of every request made to one.
//!
//! Unlike seed 001, the secret is never part of the URL (the URL names the webhook's id
//! only) and it is not compared as a string: requests carry an HMAC signature of their raw
//! body, checked by the scheme the webhook was created with.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::chat::Secret;
use super::event::Event;
use super::ids::{AgentId, EventId, EventType, RequestId, WebhookId};
use crate::error::ValidationError;

/// How a webhook's requests are signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookScheme {
    /// Pulse's own: `X-Pulse-Signature: sha256=<hex>` of `{timestamp}.{body}`.
    Pulse,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    Standard,
    /// GitHub: `X-Hub-Signature-256`, the event type from `X-GitHub-Event`.
    Github,
    /// Stripe: `Stripe-Signature: t=..,v1=..`, the event type from the body's `type`.
    Stripe,
}

impl WebhookScheme {
    /// Every scheme, for help texts.
    pub const ALL: [WebhookScheme; 4] = [Self::Pulse, Self::Standard, Self::Github, Self::Stripe];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pulse => "pulse",
            Self::Standard => "standard",
            Self::Github => "github",
            Self::Stripe => "stripe",
        }
    }

    /// The signature scheme that checks its requests.
    pub fn signing(self) -> pulse_signatures::Scheme {
        match self {
            Self::Pulse => pulse_signatures::Scheme::Pulse,
            Self::Standard => pulse_signatures::Scheme::Standard,
            Self::Github => pulse_signatures::Scheme::Github,
            Self::Stripe => pulse_signatures::Scheme::Stripe,
        }
    }

    /// Reads a scheme's name.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|x| x.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                ValidationError::new(
                    "scheme",
                    format!("{s:?} is not a scheme; use pulse, standard, github or stripe"),
                )
            })
    }
}

impl fmt::Display for WebhookScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of a webhook's signing secrets. After a rotation the old one keeps working until
/// `retires_at`, so senders can be switched over without dropping requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// The secret. Stored (it is needed to check signatures); never listed or logged.
    #[serde(with = "secret_string")]
    pub secret: Secret,
    /// When it was added.
    pub added_at: Timestamp,
    /// When it stops being accepted; `None` while it is the current secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires_at: Option<Timestamp>,
}

mod secret_string {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::domain::Secret;

    pub(super) fn serialize<S: Serializer>(s: &Secret, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.expose())
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// How many requests a webhook accepts per clock hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Accepted requests per hour.
    pub per_hour: u32,
}

impl RateLimit {
    /// Seed 001's default: 100 an hour.
    pub const DEFAULT: RateLimit = RateLimit { per_hour: 100 };

    /// Reads `100/h` (also `100/hour`, `2400/d`, `100`). `none` means no limit.
    pub fn parse(s: &str) -> Result<Option<Self>, ValidationError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") || s.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let bad = || {
            ValidationError::new(
                "rate limit",
                format!("{s:?} is not a rate; write e.g. 100/h or 2400/d, or none"),
            )
        };
        let (n, per) = s.split_once('/').unwrap_or((s, "h"));
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        let per_hour = match per.trim() {
            "h" | "hour" => n,
            "d" | "day" => n.div_ceil(24),
            _ => return Err(bad()),
        };
        if per_hour == 0 {
            return Err(ValidationError::new(
                "rate limit",
                "a limit of 0 would refuse every request; disable the webhook instead",
            ));
        }
        Ok(Some(Self { per_hour }))
    }

    /// The hour `now` falls in: the key of its counter.
    pub fn window(now: Timestamp) -> i64 {
        now.as_second().div_euclid(3600)
    }

    /// Seconds from `now` until the next window opens (for Retry-After).
    pub fn retry_after(now: Timestamp) -> u64 {
        (3600 - now.as_second().rem_euclid(3600)) as u64
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/h", self.per_hour)
    }
}

/// An inbound webhook of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    /// Its id, the last segment of its URL.
    pub id: WebhookId,
    /// The agent whose log its events go to.
    pub agent_id: AgentId,
    /// How requests are signed.
    pub scheme: WebhookScheme,
    /// Its secrets: the current one last; older ones until they retire.
    pub secrets: Vec<WebhookSecret>,
    /// Event types it may create; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_types: Vec<EventType>,
    /// Its rate limit; `None` means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Whether an accepted request also wakes the agent's conversation (a `webhook`
    /// signal) instead of waiting for the next heartbeat.
    #[serde(default)]
    pub wake: bool,
    /// Whether it accepts requests.
    pub active: bool,
    /// A note for people (what sends to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
}

/// Shortest secret accepted from a user.
const MIN_SECRET: usize = 8;

fn check_secret(secret: &str) -> Result<(), ValidationError> {
    if secret.len() < MIN_SECRET || secret.len() > 1024 || secret.chars().any(char::is_whitespace) {
        return Err(ValidationError::new(
            "secret",
            format!(
                "a secret must be {MIN_SECRET} to 1024 characters without spaces; leave it out to have one generated"
            ),
        ));
    }
    Ok(())
}

impl Webhook {
    /// How long an old secret stays valid after a rotation, by default.
    pub const DEFAULT_GRACE: SignedDuration = SignedDuration::from_hours(24);

    /// A new active webhook with one secret.
    pub fn new(
        agent_id: AgentId,
        scheme: WebhookScheme,
        secret: &str,
        now: Timestamp,
    ) -> Result<Self, ValidationError> {
        check_secret(secret)?;
        Ok(Self {
            id: WebhookId::generate(),
            agent_id,
            scheme,
            secrets: vec![WebhookSecret {
                secret: Secret::new(secret),
                added_at: now,
                retires_at: None,
            }],
            allowed_types: Vec::new(),
            rate_limit: Some(RateLimit::DEFAULT),
            wake: false,
            active: true,
            description: None,
            created_at: now,
        })
    }

    /// The secrets a request may be signed with at `now`.
    pub fn secrets_at(&self, now: Timestamp) -> Vec<&str> {
        self.secrets
            .iter()
            .filter(|s| s.retires_at.is_none_or(|r| now < r))
            .map(|s| s.secret.expose())
            .collect()
    }

    /// Adds `secret` as the current one. The secrets valid now stay valid for `grace`
    /// (none if zero); those already retired are dropped.
    pub fn rotate(
        &mut self,
        secret: &str,
        grace: SignedDuration,
        now: Timestamp,
    ) -> Result<(), ValidationError> {
        check_secret(secret)?;
        if grace.is_negative() {
            return Err(ValidationError::new(
                "grace",
                "the grace period is negative",
            ));
        }
        let until = now.saturating_add(grace).unwrap_or(now);
        self.secrets
            .retain(|s| s.retires_at.is_none_or(|r| now < r));
        for s in &mut self.secrets {
            s.retires_at = Some(s.retires_at.map_or(until, |r| r.min(until)));
        }
        self.secrets.push(WebhookSecret {
            secret: Secret::new(secret),
            added_at: now,
            retires_at: None,
        });
        Ok(())
    }

    /// Whether it may create events of type `t`.
    pub fn allows(&self, t: &EventType) -> bool {
        self.allowed_types.is_empty() || self.allowed_types.contains(t)
    }

    /// The event types a webhook allows, from what a user typed: blank items and `any`
    /// are dropped, so none left means any type.
    pub fn parse_allowed<'a>(
        items: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<EventType>, ValidationError> {
        items
            .into_iter()
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("any"))
            .map(EventType::parse)
            .collect()
    }

    /// What a listing shows: everything but the secrets.
    pub fn summary(&self, now: Timestamp) -> WebhookSummary {
        WebhookSummary {
            id: self.id.clone(),
            agent_id: self.agent_id.clone(),
            path: format!("/webhooks/{}", self.id),
            scheme: self.scheme,
            allowed_types: self.allowed_types.clone(),
            rate_limit: self.rate_limit.map(|r| r.to_string()),
            wake: self.wake,
            active: self.active,
            secrets: self.secrets_at(now).len(),
            old_secret_retires_at: self
                .secrets
                .iter()
                .filter_map(|s| s.retires_at)
                .filter(|r| now < *r)
                .max(),
            description: self.description.clone(),
            created_at: self.created_at,
        }
    }
}

/// A webhook as listed: no secrets.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WebhookSummary {
    /// Its id.
    pub id: WebhookId,
    /// Its agent.
    pub agent_id: AgentId,
    /// Its path on the receiver (`/webhooks/<id>`).
    pub path: String,
    /// Its signature scheme.
    pub scheme: WebhookScheme,
    /// Allowed event types; empty means any.
    pub allowed_types: Vec<EventType>,
    /// Its rate limit, or none.
    pub rate_limit: Option<String>,
    /// Whether accepted requests wake the conversation.
    pub wake: bool,
    /// Whether it accepts requests.
    pub active: bool,
    /// How many secrets are valid now (2 during a rotation's grace period).
    pub secrets: usize,
    /// When the previous secret stops being accepted, during a rotation.
    pub old_secret_retires_at: Option<Timestamp>,
    /// Its note.
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
}

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
    /// The event to append.
    pub event: Event,
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
    /// Its log entry for `outcome`.
    pub fn log_for(&self, outcome: &AcceptOutcome) -> WebhookRequest {
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
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn rate_limits_read_per_hour_and_per_day() {
        assert_eq!(RateLimit::parse("100/h").unwrap().unwrap().per_hour, 100);
        assert_eq!(RateLimit::parse("2400/d").unwrap().unwrap().per_hour, 100);
        assert_eq!(RateLimit::parse("7").unwrap().unwrap().per_hour, 7);
        assert_eq!(RateLimit::parse("none").unwrap(), None);
        assert!(RateLimit::parse("0/h").is_err());
        assert!(RateLimit::parse("ten/h").is_err());
        assert!(RateLimit::parse("10/week").is_err());
        assert_eq!(RateLimit::retry_after(t(7200 + 600)), 3000);
        assert_eq!(RateLimit::window(t(7200 + 600)), 2);
    }

    #[test]
    fn after_a_rotation_both_secrets_work_until_the_grace_period_ends() {
        let a = AgentId::generate();
        let mut w = Webhook::new(a, WebhookScheme::Pulse, "first-secret", t(0)).unwrap();
        w.rotate("second-secret", SignedDuration::from_hours(24), t(100))
            .unwrap();
        assert_eq!(w.secrets_at(t(200)), ["first-secret", "second-secret"]);
        assert_eq!(w.secrets_at(t(100 + 86_400)), ["second-secret"]);
        // A second rotation drops what has retired and never extends an old deadline.
        w.rotate(
            "third-secret",
            SignedDuration::from_hours(48),
            t(100 + 86_400),
        )
        .unwrap();
        assert_eq!(w.secrets.len(), 2);
        assert_eq!(w.summary(t(100 + 86_400)).secrets, 2);
    }

    #[test]
    fn a_summary_never_carries_a_secret() {
        let w = Webhook::new(
            AgentId::generate(),
            WebhookScheme::Github,
            "s3cret-value",
            t(0),
        )
        .unwrap();
        let json = serde_json::to_string(&w.summary(t(1))).unwrap();
        assert!(!json.contains("s3cret-value"), "{json}");
        assert!(!format!("{w:?}").contains("s3cret-value"));
        // The stored form keeps it: signatures are checked with it.
        assert!(serde_json::to_string(&w).unwrap().contains("s3cret-value"));
    }

    #[test]
    fn short_or_spaced_secrets_are_refused() {
        let a = AgentId::generate();
        assert!(Webhook::new(a.clone(), WebhookScheme::Pulse, "short", t(0)).is_err());
        assert!(Webhook::new(a, WebhookScheme::Pulse, "has a space in it", t(0)).is_err());
    }

    #[test]
    fn a_long_body_is_cut_for_the_log() {
        let body = vec![b'x'; LOGGED_BODY_LIMIT + 10];
        let s = truncate_body(&body);
        assert!(s.ends_with('…'));
        assert_eq!(s.chars().filter(|c| *c == 'x').count(), LOGGED_BODY_LIMIT);
        assert_eq!(truncate_body(&[0xff, b'a']), "\u{fffd}a");
    }
}
