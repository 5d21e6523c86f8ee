//! Inbound webhooks: how an external system may push events into an agent's log, and the
//! log of every request made to one.
//!
//! The secret is never part of the URL (the URL names the webhook's id
//! only) and it is not compared as a string: requests carry an HMAC signature of their raw
//! body, checked by the scheme the webhook was created with.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::chat::Secret;
use super::ids::{AgentId, EventType, WebhookId};
use super::unreadable::Unreadable;
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
    #[serde(with = "super::chat::secret_string")]
    pub secret: Secret,
    /// When it was added.
    pub added_at: Timestamp,
    /// When it stops being accepted; `None` while it is the current secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires_at: Option<Timestamp>,
}

/// How many requests a webhook accepts per clock hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Accepted requests per hour.
    pub per_hour: u32,
}

impl RateLimit {
    /// The default: 100 an hour, a steady trickle for one agent's webhook.
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
    /// Its name in the agent's `webhooks.toml` (`pulse apply`), by which it is found
    /// again; none for one made otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
    /// Set when it was read and no configured key opens its secrets: they are kept as
    /// stored and never used (requests to it are answered 503). Never stored.
    #[serde(skip)]
    pub unreadable: Option<Unreadable>,
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
            name: None,
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
            unreadable: None,
        })
    }

    /// The secrets a request may be signed with at `now`: none while they are unreadable.
    pub fn secrets_at(&self, now: Timestamp) -> Vec<&str> {
        if self.unreadable.is_some() {
            return Vec::new();
        }
        self.secrets
            .iter()
            .filter(|s| s.retires_at.is_none_or(|r| now < r))
            .map(|s| s.secret.expose())
            .collect()
    }

    /// Adds `secret` as the current one. The secrets valid now stay valid for `grace`
    /// (none if zero); those already retired are dropped. Unreadable secrets are dropped
    /// at once: no grace can make them usable again.
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
        if self.unreadable.take().is_some() {
            self.secrets.clear();
        }
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
            unreadable: self.unreadable.clone(),
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
    /// Why its secrets cannot be read, when no configured key opens them (fix: restore
    /// the key, or `pulse webhooks rotate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<Unreadable>,
    /// When the previous secret stops being accepted, during a rotation.
    pub old_secret_retires_at: Option<Timestamp>,
    /// Its note.
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
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
}
