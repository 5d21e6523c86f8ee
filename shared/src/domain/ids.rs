//! Identifiers and names. Every id is a newtype so an agent id can never be passed where an
//! event id is expected, and every one validates what it accepts from outside.
//!
//! Ids that need an order (events) or that are minted by users' commands are ULIDs with a
//! prefix: they sort by creation time, which is what makes the event cursor work. Ids that
//! must come out the same on a retry (a heartbeat's own events, actions) are derived from
//! what they identify, so a redelivered job writes the same records again instead of new ones.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use ulid::Ulid;

use crate::error::ValidationError;

/// Implements Display, FromStr, Serialize and Deserialize through `parse`, so every path in
/// (CLI argument, JSON body, stored record) is validated the same way.
macro_rules! string_newtype {
    ($name:ident) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// `prefix` and `ulid`'s 26 characters: an id made or parsed without the formatting
/// machinery (a webhook request makes and parses several).
fn prefixed(prefix: &str, ulid: Ulid) -> String {
    let mut id = String::with_capacity(prefix.len() + ulid::ULID_LEN);
    id.push_str(prefix);
    id.push_str(ulid.array_to_str(&mut [0; ulid::ULID_LEN]));
    id
}

fn parse_prefixed_ulid(kind: &'static str, prefix: &str, s: &str) -> Result<Ulid, ValidationError> {
    let rest = s.strip_prefix(prefix).ok_or_else(|| {
        ValidationError::new(kind, format!("{s:?} does not start with {prefix:?}"))
    })?;
    Ulid::from_string(rest).map_err(|_| {
        ValidationError::new(
            kind,
            format!("{s:?} is not {prefix} followed by a 26-character ULID"),
        )
    })
}

/// First 16 bytes of SHA-256 over the parts, separated so ("ab","c") and ("a","bc") differ.
/// The first id with `prefix` (`tn_`, `wr_`, ...) stamped at `t`: every id of that kind
/// stamped before `t` sorts below it, every one stamped at or after it does not (what
/// retention removes below).
pub fn first_id_at(prefix: &str, t: jiff::Timestamp) -> String {
    prefixed(
        prefix,
        Ulid::from_parts(t.as_millisecond().max(0) as u64, 0),
    )
}

fn digest128(parts: &[&str]) -> u128 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let out = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&out[..16]);
    u128::from_be_bytes(b)
}

/// An agent: `ag_` + ULID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(String);
string_newtype!(AgentId);

impl AgentId {
    /// A new random id.
    pub fn generate() -> Self {
        Self(prefixed("ag_", crate::entropy::ulid()))
    }
    /// Validates an id given by a user or read back from storage.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("agent id", "ag_", s).map(|u| Self(prefixed("ag_", u)))
    }
    /// A stable 16-bit hash, used to spread agents over index shards.
    pub fn stable_hash(&self) -> u16 {
        (digest128(&[&self.0]) >> 112) as u16
    }
}

/// An event: `ev_` + ULID. The ULID's timestamp is the event's creation time in
/// milliseconds, so ids sort in creation order; the event log's cursor relies on that.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);
string_newtype!(EventId);

impl EventId {
    /// A new id stamped with `ms` (milliseconds since the Unix epoch) and random bits.
    /// Ids made by one process in the same millisecond increase, so events appended one
    /// after another keep their order.
    pub fn generate(ms: u64) -> Self {
        Self::from_parts(ms, crate::entropy::monotonic(ms))
    }
    /// A deterministic id: the same `ms` and `parts` always give the same id.
    pub fn derived(ms: u64, parts: &[&str]) -> Self {
        Self::from_parts(ms, digest128(parts))
    }
    fn from_parts(ms: u64, random: u128) -> Self {
        Self(prefixed("ev_", Ulid::from_parts(ms, random)))
    }
    /// Validates an id given by a user or read back from storage.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("event id", "ev_", s).map(|u| Self(prefixed("ev_", u)))
    }
    /// The creation time encoded in the id, in milliseconds since the Unix epoch.
    pub fn timestamp_ms(&self) -> u64 {
        // Validated at construction, so the ULID part always parses.
        Ulid::from_string(&self.0[3..]).map_or(0, |u| u.timestamp_ms())
    }
}

/// A subscription: derived from its route (tool, event type, agent), so the same route
/// cannot be subscribed twice.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(String);
string_newtype!(SubscriptionId);

impl SubscriptionId {
    /// The id of the subscription routing `event_type` (of `agent`, or of every agent) to
    /// `tool`.
    pub fn for_route(tool: &ToolName, event_type: &EventType, agent: Option<&AgentId>) -> Self {
        let agent = agent.map_or("*", AgentId::as_str);
        Self(format!(
            "sub_{:024x}",
            digest128(&[tool.as_str(), event_type.as_str(), agent]) >> 32
        ))
    }
    /// Validates an id given by a user or read back from storage.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let ok =
            s.len() == 28 && s.starts_with("sub_") && s[4..].bytes().all(|b| b.is_ascii_hexdigit());
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "subscription id",
                format!("{s:?} is not sub_ followed by 24 hex digits"),
            ))
        }
    }
}

/// An action: one per (event, tool), so its id is derived from both. A job delivered twice,
/// or a heartbeat retried after a crash, finds the same action instead of running the tool
/// again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionId(String);
string_newtype!(ActionId);

impl ActionId {
    /// The id of the action that runs `tool` for `event`.
    pub fn for_event(event: &EventId, tool: &ToolName) -> Self {
        Self(format!(
            "act_{:032x}",
            digest128(&[event.as_str(), tool.as_str()])
        ))
    }
    /// Validates an id read back from storage or given by a user.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let ok =
            s.len() == 36 && s.starts_with("act_") && s[4..].bytes().all(|b| b.is_ascii_hexdigit());
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "action id",
                format!("{s:?} is not act_ followed by 32 hex digits"),
            ))
        }
    }
}

/// A heartbeat: the agent and the beat number. Heartbeat `n + 1` is written by the
/// completion of heartbeat `n`, so the id of the next one is known in advance and writing
/// it again on a retry is harmless.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeartbeatId {
    agent: AgentId,
    beat: u64,
}

impl HeartbeatId {
    /// The id of beat `beat` of `agent`.
    pub fn new(agent: AgentId, beat: u64) -> Self {
        Self { agent, beat }
    }
    /// The agent this heartbeat belongs to.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }
    /// The beat number (1 for an agent's first heartbeat).
    pub fn beat(&self) -> u64 {
        self.beat
    }
    /// Validates `hb_<agent ulid>_<beat>`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = || {
            ValidationError::new(
                "heartbeat id",
                format!("{s:?} is not hb_<agent ULID>_<beat number>"),
            )
        };
        let rest = s.strip_prefix("hb_").ok_or_else(bad)?;
        let (ulid, beat) = rest.split_once('_').ok_or_else(bad)?;
        let agent = AgentId::parse(&format!("ag_{ulid}")).map_err(|_| bad())?;
        let beat = beat.parse::<u64>().map_err(|_| bad())?;
        Ok(Self { agent, beat })
    }
}

impl fmt::Display for HeartbeatId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hb_{}_{}", &self.agent.as_str()[3..], self.beat)
    }
}

impl FromStr for HeartbeatId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for HeartbeatId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HeartbeatId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A conversation session: the unit of ordering. All work of one session (heartbeat jobs
/// now, conversation turns later) goes through one FIFO message group, so it never runs
/// twice at once and keeps its order. The value is used as the SQS `MessageGroupId`, so it
/// follows SQS's rules: 1–128 printable ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(String);
string_newtype!(SessionId);

impl SessionId {
    /// The default session of an agent, used until it is bound to e.g. a Discord channel.
    pub fn for_agent(agent: &AgentId) -> Self {
        Self(format!("agent:{agent}"))
    }
    /// Validates a session id (SQS MessageGroupId rules).
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "session id",
                format!("{s:?} must be 1-128 printable ASCII characters without spaces"),
            ))
        }
    }
}

/// A tool's unique name, chosen by the user (`FeedReader`, `snip-create`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolName(String);
string_newtype!(ToolName);

impl ToolName {
    /// Validates a tool name: a letter, then letters, digits, `_` or `-`; at most 64.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let mut bytes = s.bytes();
        let ok = s.len() <= 64
            && bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "tool name",
                format!(
                    "{s:?} must start with a letter and contain only letters, digits, '_' or '-' (at most 64)"
                ),
            ))
        }
    }
}

/// An event type (`HEARTBEAT`, `FEED_SUMMARIZED`, `GITHUB_PUSH`, `invoice.paid`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventType(String);
string_newtype!(EventType);

impl EventType {
    /// The type of the event every heartbeat appends for itself. Only the engine emits it.
    pub const HEARTBEAT: &'static str = "HEARTBEAT";

    /// The HEARTBEAT event type.
    pub fn heartbeat() -> Self {
        Self(Self::HEARTBEAT.to_owned())
    }
    /// Validates a type: a letter, then letters, digits, `_`, `.`, `:` or `-`; at most 128.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let mut bytes = s.bytes();
        let ok = s.len() <= 128
            && bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
            && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "event type",
                format!(
                    "{} must start with a letter and contain only letters, digits, '_', '.', ':' or '-' (at most 128)",
                    quote_input(s)
                ),
            ))
        }
    }
    /// Whether this is the engine's own HEARTBEAT type.
    pub fn is_heartbeat(&self) -> bool {
        self.0 == Self::HEARTBEAT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_prefix_and_the_ulid_as_written() {
        for u in [
            Ulid::nil(),
            Ulid::from_parts(1_764_000_000_000, 42),
            Ulid::from(u128::MAX),
        ] {
            assert_eq!(prefixed("ev_", u), format!("ev_{u}"));
        }
        // Parsing writes a ULID given in lower case as the canonical upper case.
        let id = EventId::generate(1_764_000_000_000);
        let lower = format!("ev_{}", id.as_str()[3..].to_ascii_lowercase());
        assert_eq!(EventId::parse(&lower).unwrap(), id);
    }

    #[test]
    fn event_ids_sort_by_their_timestamp() {
        let a = EventId::generate(1_000);
        let b = EventId::generate(1_001);
        assert!(a < b);
        assert_eq!(a.timestamp_ms(), 1_000);
    }

    #[test]
    fn ids_made_in_one_millisecond_keep_their_order() {
        // Interleaved with ids of other milliseconds, as other threads make them.
        let ids: Vec<EventId> = (0..100)
            .map(|i| {
                let _ = EventId::generate(1_000 + i);
                EventId::generate(7)
            })
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.iter().all(|id| id.timestamp_ms() == 7));
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(
            EventId::derived(5, &["a", "b"]),
            EventId::derived(5, &["a", "b"])
        );
        assert_ne!(
            EventId::derived(5, &["ab", ""]),
            EventId::derived(5, &["a", "b"])
        );
    }

    #[test]
    fn a_heartbeat_id_round_trips_through_its_text_form() {
        let id = HeartbeatId::new(AgentId::generate(), 42);
        let parsed = HeartbeatId::parse(&id.to_string()).unwrap();
        assert_eq!(parsed, id);
        assert!(HeartbeatId::parse("hb_nope_1").is_err());
        assert!(HeartbeatId::parse(&format!("hb_{}_x", &id.agent().as_str()[3..])).is_err());
    }

    #[test]
    fn names_and_types_reject_what_they_cannot_carry() {
        assert!(ToolName::parse("SnipCreate").is_ok());
        assert!(ToolName::parse("1tool").is_err());
        assert!(ToolName::parse("has space").is_err());
        assert!(EventType::parse("invoice.paid").is_ok());
        assert!(EventType::parse("").is_err());
        assert!(SessionId::parse("agent:ag_1").is_ok());
        assert!(SessionId::parse("with space").is_err());
        assert!(AgentId::parse("ag_zzz").is_err());
    }

    #[test]
    fn an_action_id_depends_on_both_event_and_tool() {
        let e = EventId::generate(1);
        let t1 = ToolName::parse("a").unwrap();
        let t2 = ToolName::parse("b").unwrap();
        assert_eq!(ActionId::for_event(&e, &t1), ActionId::for_event(&e, &t1));
        assert_ne!(ActionId::for_event(&e, &t1), ActionId::for_event(&e, &t2));
        let id = ActionId::for_event(&e, &t1);
        assert_eq!(ActionId::parse(id.as_str()).unwrap(), id);
    }
}

/// A signal (a queued input of a session): `sg_` + ULID, so signals sort by creation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SignalId(String);
string_newtype!(SignalId);

impl SignalId {
    /// A new id stamped with `ms`.
    pub fn generate(ms: u64) -> Self {
        Self(prefixed(
            "sg_",
            Ulid::from_parts(ms, crate::entropy::bits()),
        ))
    }
    /// An id derived from `parts`, stamped with `ms`: the same parts give the same id, so
    /// a retried send is deduplicated by the queue.
    pub fn derived(ms: u64, parts: &[&str]) -> Self {
        Self(prefixed("sg_", Ulid::from_parts(ms, digest128(parts))))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("signal id", "sg_", s).map(|u| Self(prefixed("sg_", u)))
    }
    /// Its ULID part.
    pub fn ulid(&self) -> &str {
        &self.0[3..]
    }
}

/// A conversation turn: `tn_` + the ULID of the first signal it answers, so a redelivered
/// signal finds its turn and turns sort in the order of their signals.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnId(String);
string_newtype!(TurnId);

impl TurnId {
    /// The turn that answers signals starting with `first`.
    pub fn for_signal(first: &SignalId) -> Self {
        Self(format!("tn_{}", first.ulid()))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("turn id", "tn_", s).map(|u| Self(prefixed("tn_", u)))
    }
}

/// A memory of an agent: `mem_` + ULID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoryId(String);
string_newtype!(MemoryId);

impl MemoryId {
    /// An id derived from `parts` (the action and call that made it), so a retried
    /// `remember` writes the same memory again rather than a second one.
    pub fn derived(ms: u64, parts: &[&str]) -> Self {
        Self(prefixed("mem_", Ulid::from_parts(ms, digest128(parts))))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("memory id", "mem_", s).map(|u| Self(prefixed("mem_", u)))
    }
}

/// A call parked for a person's approval: `ap_` + ULID, derived from the call's key and
/// stamped with its run's time, so a run made again after a crash finds the approval it
/// parked rather than parking a second.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApprovalId(String);
string_newtype!(ApprovalId);

impl ApprovalId {
    /// The id of the call parked with `key`, stamped with `ms`.
    pub fn derived(ms: u64, key: &str) -> Self {
        Self(prefixed(
            "ap_",
            Ulid::from_parts(ms, digest128(&["approval", key])),
        ))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("approval id", "ap_", s).map(|u| Self(prefixed("ap_", u)))
    }
}

/// `s` in capitals, each character that is not a letter or a digit as `_` (`on-call` →
/// `ON_CALL`): the shape of an event type or a variable's name.
pub fn upper_snake(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// `s` quoted for an error message, cut to its first 40 characters (with its length) when
/// longer: an error about an input must not repeat a huge input back.
pub fn quote_input(s: &str) -> String {
    const SHOWN: usize = 40;
    let n = s.chars().count();
    if n <= SHOWN {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(SHOWN).collect();
        format!("{head:?}… ({n} characters)")
    }
}

/// An inbound webhook: `wh_` + ULID. It is the only thing in the webhook's URL; the
/// signing secret never is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WebhookId(String);
string_newtype!(WebhookId);

impl WebhookId {
    /// A new random id.
    pub fn generate() -> Self {
        Self(prefixed("wh_", crate::entropy::ulid()))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("webhook id", "wh_", s).map(|u| Self(prefixed("wh_", u)))
    }
}

/// One logged request to a webhook: `wr_` + ULID stamped with its arrival, so a
/// webhook's log reads in time order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(String);
string_newtype!(RequestId);

impl RequestId {
    /// A new id stamped with `ms`; ids made one after another in the same millisecond
    /// increase, so a webhook's log keeps arrival order.
    pub fn generate(ms: u64) -> Self {
        Self(prefixed(
            "wr_",
            Ulid::from_parts(ms, crate::entropy::monotonic(ms)),
        ))
    }
    /// The id stamped `ms` derived from `parts`: the same parts give the same id.
    pub fn derived(ms: u64, parts: &[&str]) -> Self {
        Self(prefixed("wr_", Ulid::from_parts(ms, digest128(parts))))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("request id", "wr_", s).map(|u| Self(prefixed("wr_", u)))
    }
}

/// An API token of the messages API: `pt_` + ULID (the token's public half).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId(String);
string_newtype!(TokenId);

impl TokenId {
    /// A new random id.
    pub fn generate() -> Self {
        Self(prefixed("pt_", crate::entropy::ulid()))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("token id", "pt_", s).map(|u| Self(prefixed("pt_", u)))
    }
}

/// An outbound hook: `hk_` + ULID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HookId(String);
string_newtype!(HookId);

impl HookId {
    /// A new random id.
    pub fn generate() -> Self {
        Self(prefixed("hk_", crate::entropy::ulid()))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("hook id", "hk_", s).map(|u| Self(prefixed("hk_", u)))
    }
}

/// One delivery of a hook: `msg_` + ULID, sent as the Standard Webhooks `webhook-id`
/// and stable across retries. Deliveries the engine emits are derived from what they
/// report (hook, hook type, heartbeat, action), so a heartbeat run twice emits the same
/// ids and the dispatcher delivers each once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HookDeliveryId(String);
string_newtype!(HookDeliveryId);

impl HookDeliveryId {
    /// A new random id stamped with `ms`.
    pub fn generate(ms: u64) -> Self {
        Self(format!(
            "msg_{}",
            Ulid::from_parts(ms, crate::entropy::bits())
        ))
    }
    /// A deterministic id: the same `ms` and `parts` always give the same id.
    pub fn derived(ms: u64, parts: &[&str]) -> Self {
        Self(prefixed("msg_", Ulid::from_parts(ms, digest128(parts))))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        parse_prefixed_ulid("delivery id", "msg_", s).map(|u| Self(prefixed("msg_", u)))
    }
}
