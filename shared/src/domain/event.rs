//! Events: the immutable log of what happened to an agent, and the cursor over it.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use ulid::Ulid;

use super::ids::{AgentId, EventId, EventType, HeartbeatId};
use crate::error::ValidationError;

/// How important an event is: 1 (highest) to 10 (lowest). A missing priority means 5; an
/// explicit 0 is an error, never silently 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// The priority of an event that does not give one.
    pub const DEFAULT: Priority = Priority(5);
    /// The highest priority.
    pub const HIGHEST: Priority = Priority(1);

    /// Validates a priority.
    pub fn new(n: i64) -> Result<Self, ValidationError> {
        if (1..=10).contains(&n) {
            Ok(Self(n as u8))
        } else {
            Err(ValidationError::new(
                "priority",
                format!(
                    "{n} is out of range; use 1 (highest) to 10 (lowest), or leave it out for 5"
                ),
            ))
        }
    }
    /// A given priority, or the default when none was given.
    pub fn or_default(n: Option<i64>) -> Result<Self, ValidationError> {
        n.map_or(Ok(Self::DEFAULT), Self::new)
    }
    /// The number.
    pub fn get(self) -> u8 {
        self.0
    }
    /// Whether this priority is at least as important as `bound` (numerically ≤).
    pub fn at_least(self, bound: Priority) -> bool {
        self.0 <= bound.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Priority {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.0)
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        Self::new(n).map_err(serde::de::Error::custom)
    }
}

/// Marks an event that a heartbeat created and processed itself: its HEARTBEAT event and
/// the events its tools returned (cascades). Such events are never part of a later window,
/// so each is processed exactly once, by the heartbeat that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cascade {
    /// The heartbeat that created and processed the event.
    pub heartbeat_id: HeartbeatId,
    /// 0 for the HEARTBEAT event, parent's depth + 1 for a tool's output.
    pub depth: u8,
    /// True when the event was beyond the cascade depth cap and was therefore not
    /// processed: the record of a stopped loop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capped: bool,
}

/// JSON text kept as it was received, checked but not parsed into a tree: a webhook's
/// payload goes into the log this way, so a request is spared building, copying out and
/// freeing a tree of maps and strings that only the log's writer would read.
pub type RawJson = Box<serde_json::value::RawValue>;

/// What an event's payload and metadata are held as: a parsed tree ([`Value`], as every
/// event read from a log is) or, for an event on its way in, the JSON text it arrived as
/// ([`RawJson`]). Both are written into a log alike and read back as trees.
pub trait Json: Serialize {
    /// Whether it is JSON `null` (metadata that is null is not written).
    fn is_null(&self) -> bool;
}

impl Json for Value {
    fn is_null(&self) -> bool {
        Value::is_null(self)
    }
}

impl Json for RawJson {
    fn is_null(&self) -> bool {
        self.get() == "null"
    }
}

/// One immutable event in an agent's log. Its payload and metadata are trees (`P` =
/// [`Value`]) but for a webhook's event on its way into the log (see [`RawJson`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "P: Json", deserialize = "P: Deserialize<'de> + Default"))]
pub struct Event<P = Value> {
    /// Time-ordered id; its timestamp is `created_at`.
    pub id: EventId,
    /// The agent whose log holds the event.
    pub agent_id: AgentId,
    /// What kind of event it is; subscriptions match on it.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// 1 (highest) to 10.
    pub priority: Priority,
    /// Where it came from: `cli`, `system`, `tool:<name>`, `webhook`, ...
    pub source: String,
    /// Event-specific data, given to tools.
    pub payload: P,
    /// Extra context (tags, delivery ids).
    #[serde(default, skip_serializing_if = "Json::is_null")]
    pub metadata: P,
    /// The event whose tool produced this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<EventId>,
    /// Set when a heartbeat created and processed this event itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade: Option<Cascade>,
    /// When the event was appended.
    pub created_at: Timestamp,
}

/// An event as given by a user, a webhook or a tool, before it gets an id and a time.
/// Its payload and metadata are trees, or the JSON text a webhook sent (see [`Event`]).
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent<P = Value> {
    /// Its type.
    pub event_type: EventType,
    /// Its priority (already defaulted).
    pub priority: Priority,
    /// Its payload.
    pub payload: P,
    /// Its metadata.
    pub metadata: P,
}

/// The most an event's payload and metadata may hold together, as JSON: a webhook
/// body's limit. An event is read into the request of every tool subscribed to it, and
/// that request is kept whole on the tool's action (a retry sends it again), so this and
/// the most of a tool's answer the action keeps ([`super::Action::KEPT_RESPONSE`]) stay
/// well inside a DynamoDB item's 400 KB. The one request that carries more than its
/// event is the heartbeat agent's, on the HEARTBEAT event (a few hundred bytes): it also
/// carries what the tools found, at most [`super::Found::MAX_BYTES`] (about 125 KB).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

impl NewEvent {
    /// Validates an event given from outside the engine. HEARTBEAT is reserved; the
    /// payload is at most [`MAX_EVENT_BYTES`].
    pub fn new(
        event_type: &str,
        payload: Value,
        priority: Option<i64>,
    ) -> Result<Self, ValidationError> {
        let event = NewEvent::with_payload(event_type, payload, Value::Null, priority)?;
        event.check_size()?;
        Ok(event)
    }

    /// Whether the payload and metadata together keep within [`MAX_EVENT_BYTES`].
    pub fn check_size(&self) -> Result<(), ValidationError> {
        let metadata = if self.metadata.is_null() {
            0
        } else {
            json_size(&self.metadata)
        };
        let size = json_size(&self.payload) + metadata;
        if size > MAX_EVENT_BYTES {
            return Err(ValidationError::new(
                "event",
                format!(
                    "its payload and metadata are {size} bytes of JSON; an event holds at most {} KiB: \
                     keep the large part elsewhere and send a link to it",
                    MAX_EVENT_BYTES / 1024
                ),
            ));
        }
        Ok(())
    }
}

/// The length of a value's compact JSON, counted without building the text.
/// The bytes `c` takes inside a JSON string as it is written (serde_json escapes
/// quotes, backslashes and control characters, and nothing else).
pub(crate) fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if u32::from(c) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The bytes `s` takes inside a JSON string, its quotes left out.
pub(crate) fn json_str_len(s: &str) -> usize {
    s.chars().map(escaped_len).sum()
}

/// The longest start of `s` that takes at most `max` bytes inside a JSON string.
pub(crate) fn json_prefix(s: &str, max: usize) -> &str {
    let mut used = 0;
    for (at, c) in s.char_indices() {
        used += escaped_len(c);
        if used > max {
            return &s[..at];
        }
    }
    s
}

pub(crate) fn json_size(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` into a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

impl<P> NewEvent<P> {
    /// [`NewEvent::new`] with its payload and metadata held as `P`.
    pub fn with_payload(
        event_type: &str,
        payload: P,
        metadata: P,
        priority: Option<i64>,
    ) -> Result<Self, ValidationError> {
        let event_type = EventType::parse(event_type)?;
        if event_type.is_heartbeat() {
            return Err(ValidationError::new(
                "event type",
                "HEARTBEAT is emitted by the engine itself; choose another type",
            ));
        }
        Ok(Self {
            event_type,
            priority: Priority::or_default(priority)?,
            payload,
            metadata,
        })
    }

    /// Stamps the event into an agent's log at `now` with a fresh id.
    pub fn into_event(
        self,
        agent_id: AgentId,
        source: impl Into<String>,
        now: Timestamp,
    ) -> Event<P> {
        Event {
            id: EventId::generate(now.as_millisecond().max(0) as u64),
            agent_id,
            event_type: self.event_type,
            priority: self.priority,
            source: source.into(),
            payload: self.payload,
            metadata: self.metadata,
            parent_id: None,
            cascade: None,
            created_at: now,
        }
    }
}

impl Event {
    /// The event with its payload and metadata as JSON text, the form a webhook's event
    /// is written in (see [`RawJson`]).
    pub fn into_raw(self) -> Event<RawJson> {
        let raw = |v: &Value| {
            serde_json::value::to_raw_value(v).expect("a JSON tree always writes as text")
        };
        Event {
            payload: raw(&self.payload),
            metadata: raw(&self.metadata),
            id: self.id,
            agent_id: self.agent_id,
            event_type: self.event_type,
            priority: self.priority,
            source: self.source,
            parent_id: self.parent_id,
            cascade: self.cascade,
            created_at: self.created_at,
        }
    }
}

/// A position in an agent's event log. A heartbeat processes the events after its window's
/// start cursor and up to (including) its end cursor, in id order.
///
/// A cursor is compared with event ids as a string: `origin` sorts before every id, and
/// `through(t)` sorts after every id stamped at or before `t` and before every later one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventCursor(String);

impl EventCursor {
    /// Before the first event.
    pub fn origin() -> Self {
        Self(String::new())
    }
    /// Just before every event created at or after `t`: what `--since t` reads after.
    pub fn since(t: Timestamp) -> Self {
        Self::through(
            t.saturating_sub(jiff::SignedDuration::from_millis(1))
                .unwrap_or(t),
        )
    }
    /// Just after every event created at or before `t`.
    pub fn through(t: Timestamp) -> Self {
        let ms = t.as_millisecond().max(0) as u64;
        Self(format!("ev_{}", Ulid::from_parts(ms, u128::MAX)))
    }
    /// The millisecond the cursor stands at (0 for the origin).
    pub fn ms(&self) -> u64 {
        self.0
            .strip_prefix("ev_")
            .and_then(|u| Ulid::from_string(u).ok())
            .map_or(0, |u| u.timestamp_ms())
    }
    /// Just after `event` (used when a window is cut short at a size limit).
    pub fn after(event: &EventId) -> Self {
        Self(event.as_str().to_owned())
    }
    /// Whether `id` comes after this cursor.
    pub fn is_before(&self, id: &EventId) -> bool {
        self.0.as_str() < id.as_str()
    }
    /// Whether `id` is at or before this cursor.
    pub fn covers(&self, id: &EventId) -> bool {
        id.as_str() <= self.0.as_str()
    }
    /// The cursor's key, comparable with event ids.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Reads a cursor back from storage. Anything is accepted: cursors only compare.
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl fmt::Display for EventCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("origin")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl Serialize for EventCursor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventCursor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_priority_is_five_and_zero_is_an_error() {
        assert_eq!(Priority::or_default(None).unwrap().get(), 5);
        assert!(Priority::or_default(Some(0)).is_err());
        assert!(Priority::new(11).is_err());
        assert_eq!(Priority::new(1).unwrap(), Priority::HIGHEST);
        assert!(serde_json::from_str::<Priority>("0").is_err());
    }

    #[test]
    fn heartbeat_is_reserved_for_the_engine() {
        assert!(NewEvent::new("HEARTBEAT", Value::Null, None).is_err());
        assert!(NewEvent::new("NEW_MENTION", Value::Null, Some(3)).is_ok());
    }

    #[test]
    fn a_cursor_through_a_time_splits_ids_at_that_millisecond() {
        let t = Timestamp::from_millisecond(10_000).unwrap();
        let c = EventCursor::through(t);
        assert!(c.covers(&EventId::generate(10_000)));
        assert!(c.covers(&EventId::generate(9_999)));
        assert!(c.is_before(&EventId::generate(10_001)));
        assert!(EventCursor::origin().is_before(&EventId::generate(0)));
    }
}
