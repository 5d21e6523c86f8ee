//! Outbound hooks: external systems follow an agent's lifecycle through signed HTTP POSTs
//! (or EventBridge events), one per hook whose type matches what happened.
//!
//! A hook is never delivered inside the request that emits it: the
//! engine enqueues a delivery, and the dispatcher sends it, retrying by re-enqueueing with
//! a delay (never by sleeping). Every attempt is logged; a receiver that answers 410 Gone,
//! or fails without a break for too long, has its hook disabled.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

use super::chat::Secret;
use super::hook_type::HookType;
use super::ids::{AgentId, HookId};
use super::time::{format_duration, parse_duration};
use super::unreadable::Unreadable;
use crate::error::ValidationError;

/// Where a hook delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookTarget {
    /// A POST to this URL (https; http only for receivers on an allow-listed address).
    Url(Url),
    /// A PutEvents to this EventBridge bus (a name or an ARN), source `pulse`,
    /// detail-type = the hook type, detail = the payload.
    EventBridge {
        /// The bus.
        bus: String,
    },
}

impl HookTarget {
    const EVENTBRIDGE: &'static str = "eventbridge://";

    /// Reads `https://…`, `http://…` or `eventbridge://BUS_NAME`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let s = s.trim();
        if let Some(bus) = s.strip_prefix(Self::EVENTBRIDGE) {
            let ok = !bus.is_empty()
                && bus.len() <= 1600
                && bus
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b));
            return if ok {
                Ok(Self::EventBridge {
                    bus: bus.to_owned(),
                })
            } else {
                Err(ValidationError::new(
                    "hook target",
                    format!(
                        "{s:?}: give an event bus name or ARN after eventbridge:// (letters, digits, . _ - / :)"
                    ),
                ))
            };
        }
        let url = Url::parse(s).map_err(|e| {
            ValidationError::new(
                "hook target",
                format!("{s:?} is not a URL ({e}); give https://… or eventbridge://BUS_NAME"),
            )
        })?;
        if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
            return Err(ValidationError::new(
                "hook target",
                format!("{s:?}: a hook posts to an https:// URL, or to eventbridge://BUS_NAME"),
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ValidationError::new(
                "hook target",
                "credentials in a URL end up in logs; give them with --auth-header instead",
            ));
        }
        Ok(Self::Url(url))
    }

    /// Whether it is a plain-http URL (allowed, but only reaches allow-listed addresses
    /// in practice; warned about).
    pub fn is_plain_http(&self) -> bool {
        matches!(self, Self::Url(u) if u.scheme() == "http")
    }
}

impl fmt::Display for HookTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(u) => f.write_str(u.as_str()),
            Self::EventBridge { bus } => write!(f, "{}{bus}", Self::EVENTBRIDGE),
        }
    }
}

impl Serialize for HookTarget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HookTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// The delays between a hook's attempts: the n-th entry is the wait after attempt n
/// failed. A delivery gets `len + 1` attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrySchedule(Vec<SignedDuration>);

impl RetrySchedule {
    /// Longest single delay accepted.
    pub const MAX_DELAY: SignedDuration = SignedDuration::from_hours(24);
    /// Most retries accepted.
    pub const MAX_RETRIES: usize = 20;

    /// 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: eight attempts over about 27.6 hours
    /// (the Standard Webhooks recommendation).
    pub fn standard() -> Self {
        let m = SignedDuration::from_mins;
        let h = SignedDuration::from_hours;
        Self(vec![
            SignedDuration::from_secs(5),
            m(5),
            m(30),
            h(2),
            h(5),
            h(10),
            h(10),
        ])
    }

    /// No retries: one attempt.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Reads `5s,5m,30m,2h` (or `none`).
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") {
            return Ok(Self::none());
        }
        let delays = s
            .split(',')
            .map(|p| {
                let d = parse_duration("retry delay", p)?;
                if d < SignedDuration::from_secs(1) || d > Self::MAX_DELAY {
                    return Err(ValidationError::new(
                        "retry schedule",
                        format!("{:?}: each delay must be between 1s and 24h", p.trim()),
                    ));
                }
                Ok(d)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if delays.len() > Self::MAX_RETRIES {
            return Err(ValidationError::new(
                "retry schedule",
                format!("at most {} retries", Self::MAX_RETRIES),
            ));
        }
        Ok(Self(delays))
    }

    /// How many attempts a delivery gets.
    pub fn attempts(&self) -> u32 {
        self.0.len() as u32 + 1
    }

    /// The scheduled wait after attempt `attempt` (1-based) failed; `None` after the last.
    pub fn after(&self, attempt: u32) -> Option<SignedDuration> {
        self.0.get(attempt.checked_sub(1)? as usize).copied()
    }
}

impl Default for RetrySchedule {
    fn default() -> Self {
        Self::standard()
    }
}

impl fmt::Display for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let parts: Vec<String> = self.0.iter().map(|d| format_duration(*d)).collect();
        f.write_str(&parts.join(","))
    }
}

impl Serialize for RetrySchedule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RetrySchedule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// The longest a receiver's `Retry-After` can push a retry back. The schedule's own delay
/// is never shortened by it.
pub const MAX_RETRY_AFTER: SignedDuration = SignedDuration::from_hours(1);

/// The wait before the next attempt after `attempt` failed: the scheduled delay with
/// ±20 % jitter (`unit` in [0, 1) picks where), at least the receiver's `Retry-After`
/// (bounded by [`MAX_RETRY_AFTER`]). `None` when the schedule is used up.
pub fn retry_delay(
    schedule: &RetrySchedule,
    attempt: u32,
    retry_after: Option<SignedDuration>,
    unit: f64,
) -> Option<SignedDuration> {
    let base = schedule.after(attempt)?;
    let factor = 0.8 + 0.4 * unit.clamp(0.0, 1.0);
    let jittered = SignedDuration::from_secs_f64(base.as_secs_f64() * factor);
    let asked = retry_after
        .map(|r| r.clamp(SignedDuration::ZERO, MAX_RETRY_AFTER))
        .unwrap_or_default();
    Some(jittered.max(asked))
}

/// An agent's outbound hook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hook {
    /// Its id.
    pub id: HookId,
    /// The agent it follows.
    pub agent_id: AgentId,
    /// Its name in the agent's `hooks.toml` (`pulse apply`), by which it is found
    /// again; none for one made otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it fires on.
    pub hook_type: HookType,
    /// Where it delivers.
    pub target: HookTarget,
    /// Its Standard Webhooks signing secret (`whsec_…`). Shown once at creation; never
    /// listed or logged.
    #[serde(with = "super::chat::secret_string")]
    pub secret: Secret,
    /// Sent as the `Authorization` header, if set. Never listed or logged.
    #[serde(
        default,
        with = "opt_secret_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub auth_header: Option<Secret>,
    /// How long one attempt may take.
    pub timeout: SignedDuration,
    /// Delays between attempts.
    pub retry: RetrySchedule,
    /// Failing without a break for this long disables the hook.
    pub disable_after: SignedDuration,
    /// Whether it fires.
    pub active: bool,
    /// Why it was disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// Since when its deliveries have been failing (cleared by a success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<Timestamp>,
    /// A note for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Bumped by every write; a write is conditional on the version it read.
    pub version: u64,
    /// Set when it was read and no configured key opens its secrets: they are kept as
    /// stored and never used (its deliveries wait). Never stored.
    #[serde(skip)]
    pub unreadable: Option<Unreadable>,
}

mod opt_secret_string {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::domain::Secret;

    pub(super) fn serialize<S: Serializer>(s: &Option<Secret>, ser: S) -> Result<S::Ok, S::Error> {
        match s {
            Some(s) => ser.serialize_some(s.expose()),
            None => ser.serialize_none(),
        }
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(Secret::new))
    }
}

impl Hook {
    /// Default time an attempt may take.
    pub const DEFAULT_TIMEOUT: SignedDuration = SignedDuration::from_secs(15);
    /// Longest time an attempt may take (the dispatcher's own time limit bounds it).
    pub const MAX_TIMEOUT: SignedDuration = SignedDuration::from_secs(60);
    /// Default: disabled after five days of failures without a success.
    pub const DEFAULT_DISABLE_AFTER: SignedDuration = SignedDuration::from_hours(5 * 24);

    /// A new active hook with a fresh signing secret and the default timeout, schedule
    /// and disable period.
    pub fn new(
        agent_id: AgentId,
        hook_type: HookType,
        target: HookTarget,
        secret: &str,
        now: Timestamp,
    ) -> Self {
        Self {
            id: HookId::generate(),
            agent_id,
            name: None,
            hook_type,
            target,
            secret: Secret::new(secret),
            auth_header: None,
            timeout: Self::DEFAULT_TIMEOUT,
            retry: RetrySchedule::standard(),
            disable_after: Self::DEFAULT_DISABLE_AFTER,
            active: true,
            disabled_reason: None,
            failing_since: None,
            description: None,
            created_at: now,
            version: 1,
            unreadable: None,
        }
    }

    /// Checks a timeout given by a user.
    pub fn check_timeout(t: SignedDuration) -> Result<SignedDuration, ValidationError> {
        if t < SignedDuration::from_millis(100) || t > Self::MAX_TIMEOUT {
            return Err(ValidationError::new(
                "timeout",
                format!(
                    "{} is out of range: give between 100ms and {}",
                    format_duration(t),
                    format_duration(Self::MAX_TIMEOUT)
                ),
            ));
        }
        Ok(t)
    }

    /// What routing needs to know of it.
    pub fn route(&self) -> HookRoute {
        HookRoute {
            id: self.id.clone(),
            hook_type: self.hook_type.clone(),
            active: self.active,
        }
    }

    /// Gives it a new signing secret. While its secrets are unreadable its Authorization
    /// header is too: `auth` replaces it (`Some(None)` removes it); without `auth` an
    /// unreadable header is refused, since it could never be sent again.
    pub fn rotate(
        &mut self,
        secret: &str,
        auth: Option<Option<Secret>>,
    ) -> Result<(), ValidationError> {
        if self.unreadable.is_some() && self.auth_header.is_some() && auth.is_none() {
            return Err(ValidationError::new(
                "auth header",
                "the hook's Authorization header cannot be read either: give it again with --auth-header, or remove it with --no-auth-header",
            ));
        }
        self.secret = Secret::new(secret);
        if let Some(auth) = auth {
            self.auth_header = auth;
        }
        self.unreadable = None;
        Ok(())
    }

    /// What a listing shows: no secret, no authorization value.
    pub fn summary(&self) -> HookSummary {
        HookSummary {
            id: self.id.clone(),
            agent_id: self.agent_id.clone(),
            hook_type: self.hook_type.clone(),
            target: self.target.to_string(),
            has_auth_header: self.auth_header.is_some(),
            timeout: format_duration(self.timeout),
            retry: self.retry.to_string(),
            disable_after: format_duration(self.disable_after),
            active: self.active,
            disabled_reason: self.disabled_reason.clone(),
            failing_since: self.failing_since,
            description: self.description.clone(),
            created_at: self.created_at,
            unreadable: self.unreadable.clone(),
        }
    }
}

/// What the engine reads to decide which hooks an emit point fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRoute {
    /// The hook.
    pub id: HookId,
    /// What it fires on.
    pub hook_type: HookType,
    /// Whether it fires.
    pub active: bool,
}

/// A hook as listed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HookSummary {
    /// Its id.
    pub id: HookId,
    /// Its agent.
    pub agent_id: AgentId,
    /// What it fires on.
    pub hook_type: HookType,
    /// Where it delivers.
    pub target: String,
    /// Whether an Authorization header is sent.
    pub has_auth_header: bool,
    /// Time per attempt.
    pub timeout: String,
    /// Delays between attempts.
    pub retry: String,
    /// Failing this long disables it.
    pub disable_after: String,
    /// Whether it fires.
    pub active: bool,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
    /// Failing since.
    pub failing_since: Option<Timestamp>,
    /// Its note.
    pub description: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Why its secrets cannot be read, when no configured key opens them (fix: restore
    /// the key, or `pulse hooks rotate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<Unreadable>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_https_urls_or_event_buses() {
        assert!(matches!(
            HookTarget::parse("https://example.com/hook").unwrap(),
            HookTarget::Url(_)
        ));
        assert_eq!(
            HookTarget::parse("eventbridge://pulse-hooks").unwrap(),
            HookTarget::EventBridge {
                bus: "pulse-hooks".into()
            }
        );
        let t = HookTarget::parse("eventbridge://arn:aws:events:us-east-1:1:event-bus/x").unwrap();
        assert_eq!(
            t.to_string(),
            "eventbridge://arn:aws:events:us-east-1:1:event-bus/x"
        );
        assert!(HookTarget::parse("ftp://x").is_err());
        assert!(HookTarget::parse("eventbridge://").is_err());
        assert!(HookTarget::parse("https://user:pw@example.com/").is_err());
        assert!(
            HookTarget::parse("http://127.0.0.1:9/")
                .unwrap()
                .is_plain_http()
        );
    }

    #[test]
    fn the_default_schedule_is_seven_retries_and_parses_back() {
        let s = RetrySchedule::standard();
        assert_eq!(s.attempts(), 8);
        assert_eq!(s.after(1), Some(SignedDuration::from_secs(5)));
        assert_eq!(s.after(7), Some(SignedDuration::from_hours(10)));
        assert_eq!(s.after(8), None);
        assert_eq!(s.after(0), None);
        assert_eq!(RetrySchedule::parse(&s.to_string()).unwrap(), s);
        assert_eq!(RetrySchedule::parse("none").unwrap().attempts(), 1);
        assert!(RetrySchedule::parse("5s,0s").is_err());
        assert!(RetrySchedule::parse("5s,2d").is_err());
        assert!(RetrySchedule::parse("soon").is_err());
    }

    #[test]
    fn retry_delays_are_jittered_by_twenty_percent_and_honour_retry_after_within_a_bound() {
        let s = RetrySchedule::parse("100s,1h").unwrap();
        let secs = |d: Option<SignedDuration>| d.unwrap().as_secs_f64();
        assert!((secs(retry_delay(&s, 1, None, 0.0)) - 80.0).abs() < 1e-6);
        assert!((secs(retry_delay(&s, 1, None, 1.0)) - 120.0).abs() < 1e-6);
        assert!((secs(retry_delay(&s, 1, None, 0.5)) - 100.0).abs() < 1e-6);
        // Retry-After lengthens a short delay, never shortens one, and is capped.
        let ra = |secs| Some(SignedDuration::from_secs(secs));
        assert_eq!(secs(retry_delay(&s, 1, ra(600), 0.5)), 600.0);
        assert_eq!(secs(retry_delay(&s, 1, ra(10), 0.5)), 100.0);
        assert_eq!(secs(retry_delay(&s, 1, ra(86_400), 0.5)), 3_600.0);
        assert_eq!(retry_delay(&s, 3, ra(10), 0.5), None);
    }

    #[test]
    fn a_hook_serializes_its_secret_but_its_summary_and_debug_do_not() {
        let mut h = Hook::new(
            AgentId::generate(),
            HookType::of(HookType::AFTER_HEARTBEAT),
            HookTarget::parse("https://example.com/h").unwrap(),
            "whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
            Timestamp::UNIX_EPOCH,
        );
        h.auth_header = Some(Secret::new("Bearer tok-123"));
        let json = serde_json::to_string(&h).unwrap();
        assert!(json.contains("whsec_c2Vj") && json.contains("tok-123"));
        let back: Hook = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        let listed = serde_json::to_string(&h.summary()).unwrap();
        assert!(!listed.contains("whsec_") && !listed.contains("tok-123"));
        let debug = format!("{h:?}");
        assert!(!debug.contains("whsec_c2Vj") && !debug.contains("tok-123"));
    }
}
