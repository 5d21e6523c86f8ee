//! Hook deliveries: the payload every delivery carries (the documented hook payload, with the
//! `data` of each hook type built here, so the documented shape lives in one place), the
//! delivery and attempt records the dispatcher keeps, and the queue message that carries
//! a delivery.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::action::Action;
use super::agent::Agent;
use super::conversation::{ReplyTarget, Signal, Turn};
use super::event::Event;
use super::heartbeat::Heartbeat;
use super::hook::HookTarget;
use super::hook_type::HookType;
use super::ids::{ActionId, AgentId, HeartbeatId, HookDeliveryId, HookId, ToolName};
use super::tool_request::Beats;
use crate::error::ValidationError;

/// The agent as a payload names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadAgent {
    /// Its id.
    pub id: AgentId,
    /// Its name.
    pub name: String,
    /// Its alias (the name when none is set).
    pub alias: String,
}

impl From<&Agent> for PayloadAgent {
    fn from(a: &Agent) -> Self {
        Self {
            id: a.id.clone(),
            name: a.name.clone(),
            alias: a.alias.clone().unwrap_or_else(|| a.name.clone()),
        }
    }
}

/// What caused a hook.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PayloadContext {
    /// The event type or cause (`SCHEDULE`, `FEED_SUMMARIZED`, `DISCORD_MESSAGE`).
    pub triggered_by: String,
    /// Related events, when there are some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related_events: Option<Vec<Value>>,
}

/// The JSON body of every delivery: what happened, to which agent, when, and its data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HookPayload {
    /// The hook type.
    pub hook_type: HookType,
    /// The agent.
    pub agent: PayloadAgent,
    /// When it happened.
    pub timestamp: Timestamp,
    /// The heartbeat it happened in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_id: Option<HeartbeatId>,
    /// The action it concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_id: Option<ActionId>,
    /// What happened, per hook type.
    pub data: Value,
    /// What caused it.
    pub context: PayloadContext,
}

impl HookPayload {
    /// The most of `data` a delivery carries, as JSON: its longest texts are cut past
    /// it ([`super::clipped`]). A delivery travels whole in a queue message (SQS takes
    /// 256 KiB, with the body escaped inside it) and in an EventBridge entry (256 KB),
    /// and an event's payload alone may be 256 KiB.
    pub const MAX_DATA: usize = 96 * 1024;
}

/// The `data` of each hook type, as the book's hook table (docs/src/hooks.md) documents it: the one place
/// that shape is written.
pub struct HookData;

impl HookData {
    /// BEFORE_HEARTBEAT: the heartbeat starts processing its window.
    pub fn before_heartbeat(
        beats: Beats,
        scheduled_at: Timestamp,
        started_at: Timestamp,
        window_events: usize,
    ) -> Value {
        json!({
            "beat": beats.beat,
            "since_last": beats.since_last,
            "scheduled_at": scheduled_at,
            "started_at": started_at,
            "window_events": window_events,
        })
    }

    /// AFTER_HEARTBEAT: it completed, or was interrupted (status CANCELLED).
    pub fn after_heartbeat(
        done: &Heartbeat,
        started_at: Timestamp,
        next_at: Option<Timestamp>,
    ) -> Value {
        json!({
            "status": done.status.as_str(),
            "beat": done.beat,
            "events_processed": done.events_processed,
            "actions_triggered": done.actions_triggered,
            "actions_failed": done.actions_failed,
            "cascade_capped": done.cascade_capped,
            "duration_ms": done.completed_at.map(|c| c.duration_since(started_at).as_millis()),
            "next_at": next_at,
            "error_message": done.error,
        })
    }

    /// HEARTBEAT_FAILED: it failed; the next one is due at `next_at`.
    pub fn heartbeat_failed(done: &Heartbeat, failures: u32, next_at: Timestamp) -> Value {
        json!({
            "beat": done.beat,
            "error_message": done.error,
            "consecutive_failures": failures,
            "next_at": next_at,
        })
    }

    /// BEFORE_<TOOL> and ACTION_STARTED: `tool` runs for `event`.
    pub fn tool_started(tool: &ToolName, attempt: u32, event: &Event) -> Value {
        json!({
            "tool_name": tool,
            "attempt": attempt,
            "event": {
                "id": event.id,
                "type": event.event_type,
                "priority": event.priority,
                "source": event.source,
                "payload": event.payload,
            },
        })
    }

    /// AFTER_<TOOL>, ACTION_COMPLETED and ACTION_FAILED: `action` finished with
    /// `new_events`.
    pub fn tool_finished(action: &Action, new_events: &[Event]) -> Value {
        json!({
            "tool_name": action.tool,
            "status": action.status,
            "event_id": action.event_id,
            "response": action.response,
            "error_message": action.error,
            "new_events": new_events
                .iter()
                .map(|e| json!({ "id": e.id, "type": e.event_type }))
                .collect::<Vec<_>>(),
            "execution_time_ms": action.duration_ms,
        })
    }

    /// MESSAGE_RECEIVED: `turn` took in `signals`.
    pub fn message_received(turn: &Turn, signals: &[Signal]) -> Value {
        json!({
            "turn_id": turn.id,
            "session": turn.session,
            "signals": signals.iter().map(|s| json!({
                "id": s.id,
                "kind": s.kind.as_str(),
                "text": s.text(),
            })).collect::<Vec<_>>(),
        })
    }

    /// MESSAGE_SENT: `turn`'s reply reached its platform (`channel`: `discord`,
    /// `telegram`, or none when it was stored only), in `channel_id` (a Discord channel
    /// or another platform's chat; for an interaction, a direct message or a stored
    /// reply, the agent's Discord channel as before), with the ids of the messages
    /// written (`message_ids`; `discord_message_ids` names Discord's alone). Never the
    /// interaction token: it is a credential for 15 minutes.
    pub fn message_sent(turn: &Turn, discord_channel: Option<String>) -> Value {
        let (channel_id, discord) = match &turn.target {
            ReplyTarget::Channel { channel_id, .. } => (Some(channel_id.clone()), true),
            ReplyTarget::Chat(c) => (Some(c.chat.clone()), false),
            ReplyTarget::Interaction(_) | ReplyTarget::User { .. } => (discord_channel, true),
            ReplyTarget::None | ReplyTarget::Unknown => (discord_channel, false),
        };
        json!({
            "turn_id": turn.id,
            "parts": turn.parts,
            "channel": turn.target.channel().map(|k| k.as_str()),
            "channel_id": channel_id,
            "message_ids": turn.discord_message_ids,
            "discord_message_ids": if discord { turn.discord_message_ids.as_slice() } else { &[] },
        })
    }

    /// MESSAGE_UNDELIVERABLE: `turn`'s reply, given up on after `attempts` tries, and
    /// why the last failed.
    pub fn message_undeliverable(turn: &Turn, attempts: u32, reason: &str) -> Value {
        json!({
            "turn_id": turn.id,
            "parts": turn.parts,
            "delivered_parts": turn.delivered,
            "attempts": attempts,
            "reason": reason,
        })
    }

    /// AGENT_PAUSED / AGENT_RESUMED: when, and (on resume) when the next heartbeat is due.
    pub fn agent_lifecycle(at: Timestamp, next_heartbeat_at: Option<Timestamp>) -> Value {
        match next_heartbeat_at {
            Some(next) => json!({ "at": at, "next_heartbeat_at": next }),
            None => json!({ "at": at }),
        }
    }

    /// HOOK_DISABLED: one of the agent's hooks was disabled, and why.
    pub fn hook_disabled(
        hook: &HookId,
        hook_type: &HookType,
        target: &HookTarget,
        reason: &str,
    ) -> Value {
        json!({
            "hook_id": hook,
            "hook_type": hook_type,
            "target": target.to_string(),
            "reason": reason,
        })
    }
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliveryStatus {
    /// Queued, being attempted, or waiting for its next attempt.
    Pending,
    /// A receiver answered 2xx (or EventBridge accepted the event).
    Succeeded,
    /// Every attempt failed; dead-lettered. `pulse hooks replay` sends it again.
    Exhausted,
    /// Not delivered because its hook was disabled or deleted.
    Cancelled,
}

impl DeliveryStatus {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Succeeded => "SUCCEEDED",
            Self::Exhausted => "EXHAUSTED",
            Self::Cancelled => "CANCELLED",
        }
    }
    /// Whether nothing more happens to it without a replay.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Pending)
    }
}

/// How one attempt went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AttemptStatus {
    /// 2xx.
    Success,
    /// Any other answer, or no answer (refused connection, TLS, EventBridge error).
    Failed,
    /// No answer within the hook's timeout.
    Timeout,
    /// The target resolves to an address that is not public: nothing was sent.
    RejectedSsrf,
}

impl AttemptStatus {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::Failed => "FAILED",
            Self::Timeout => "TIMEOUT",
            Self::RejectedSsrf => "REJECTED_SSRF",
        }
    }
}

/// One delivery of one hook: the body is fixed when it is emitted, so every attempt
/// sends the same bytes under the same `webhook-id`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HookDelivery {
    /// Its id (`webhook-id`).
    pub id: HookDeliveryId,
    /// The hook.
    pub hook_id: HookId,
    /// The hook's agent.
    pub agent_id: AgentId,
    /// The hook type.
    pub hook_type: HookType,
    /// The JSON body.
    pub body: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts started so far.
    pub attempts: u32,
    /// While an attempt is in flight: when another dispatcher may take it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    /// When the next attempt is due, while one is scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Timestamp>,
    /// The last attempt's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<AttemptStatus>,
    /// Why the last attempt failed, or why the delivery was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it was emitted.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Bumped by every write; a write is conditional on the version it read.
    pub version: u64,
}

/// Most of a response body kept on an attempt.
pub const ATTEMPT_BODY_LIMIT: usize = 10 * 1024;

/// One attempt of a delivery, as logged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HookAttempt {
    /// The delivery.
    pub delivery_id: HookDeliveryId,
    /// The hook.
    pub hook_id: HookId,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// How it went.
    pub status: AttemptStatus,
    /// The receiver's HTTP status, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The start of its response body (at most 10 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body: Option<String>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
    /// When it started.
    pub at: Timestamp,
    /// When the next attempt is due, if one was scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Timestamp>,
}

/// A hook delivery as a queue message. It carries the body, so the dispatcher's first
/// attempt can record a delivery the store has never seen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HookTask {
    /// Message format version.
    pub v: u32,
    /// The delivery.
    pub delivery_id: HookDeliveryId,
    /// The hook.
    pub hook_id: HookId,
    /// The hook's agent.
    pub agent_id: AgentId,
    /// The hook type.
    pub hook_type: HookType,
    /// Which attempt this message is for (1 for the first).
    pub attempt: u32,
    /// Not to be attempted before this: delays longer than the queue's own limit (15
    /// minutes on SQS) are chained through several messages.
    pub not_before: Timestamp,
    /// The JSON body.
    pub body: String,
    /// When it was emitted.
    pub emitted_at: Timestamp,
}

impl HookTask {
    /// The current format version.
    pub const VERSION: u32 = 1;

    /// Encodes it as a message body.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes a message body; says what is wrong with one that is not a hook task.
    pub fn decode(body: &str) -> Result<Self, ValidationError> {
        let task: Self = serde_json::from_str(body)
            .map_err(|e| ValidationError::new("hook task", e.to_string()))?;
        if task.v != Self::VERSION {
            return Err(ValidationError::new(
                "hook task",
                format!(
                    "version {} is not understood by this dispatcher (version {}); deploy the same version everywhere",
                    task.v,
                    Self::VERSION
                ),
            ));
        }
        Ok(task)
    }

    /// The delivery record its first attempt creates.
    pub fn new_delivery(&self, now: Timestamp) -> HookDelivery {
        HookDelivery {
            id: self.delivery_id.clone(),
            hook_id: self.hook_id.clone(),
            agent_id: self.agent_id.clone(),
            hook_type: self.hook_type.clone(),
            body: self.body.clone(),
            status: DeliveryStatus::Pending,
            attempts: 0,
            lease_until: None,
            next_attempt_at: None,
            last_status: None,
            last_error: None,
            created_at: self.emitted_at,
            updated_at: now,
            version: 0,
        }
    }
}

/// Cuts `body` to at most `limit` bytes on a character boundary.
pub fn truncate_utf8(body: &str, limit: usize) -> String {
    if body.len() <= limit {
        return body.to_owned();
    }
    let mut end = limit;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_round_trips_and_a_newer_version_is_refused_with_a_reason() {
        let t = HookTask {
            v: HookTask::VERSION,
            delivery_id: HookDeliveryId::generate(1),
            hook_id: HookId::generate(),
            agent_id: AgentId::generate(),
            hook_type: HookType::of(HookType::AFTER_HEARTBEAT),
            attempt: 2,
            not_before: Timestamp::UNIX_EPOCH,
            body: "{}".into(),
            emitted_at: Timestamp::UNIX_EPOCH,
        };
        assert_eq!(HookTask::decode(&t.encode()).unwrap(), t);
        let newer = t.encode().replacen("\"v\":1", "\"v\":9", 1);
        assert!(
            HookTask::decode(&newer)
                .unwrap_err()
                .message
                .contains("version 9")
        );
        assert!(HookTask::decode("nope").is_err());
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
