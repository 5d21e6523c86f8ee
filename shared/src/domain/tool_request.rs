//! The tool protocol: what a tool is sent (the event, the agent, the heartbeat with its
//! beats, its own configuration) and what it answers.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::agent::{Agent, ThinkPolicy};
use super::event::{Event, EventCursor, NewEvent};
use super::found::Found;
use super::ids::{ActionId, AgentId, HeartbeatId};

/// What a tool receives: the event, the agent, the heartbeat's beats, and its config.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ToolRequest {
    /// The action's id; a tool can use it as an idempotency key, since a retried action
    /// keeps its id.
    pub action_id: ActionId,
    /// Which attempt this is.
    pub attempt: u32,
    /// The triggering event.
    pub event: Event,
    /// The agent.
    pub agent: AgentContext,
    /// The heartbeat, with its beats.
    pub heartbeat: HeartbeatContext,
    /// The tool's own configuration.
    pub tool_config: Value,
}

/// The agent as tools see it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentContext {
    /// Id.
    pub id: AgentId,
    /// Name.
    pub name: String,
    /// Alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Persona.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    /// Heartbeat instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// When its heartbeat agent thinks (`auto` is left out).
    #[serde(default, skip_serializing_if = "ThinkPolicy::is_auto")]
    pub think: ThinkPolicy,
}

impl AgentContext {
    /// Whether the heartbeat agent calls the model in `heartbeat`: `Err(reason)` when
    /// the daily budget is spent or the think policy finds nothing to think about.
    pub fn thinks(&self, heartbeat: &HeartbeatContext) -> Result<(), String> {
        if let Some(why) = &heartbeat.budget_spent {
            return Err(why.clone());
        }
        self.think.decide(
            heartbeat.beats.beat,
            heartbeat.window_events + heartbeat.found.events(),
            heartbeat.tasks_due.len(),
        )
    }
}

impl From<&Agent> for AgentContext {
    fn from(a: &Agent) -> Self {
        Self {
            id: a.id.clone(),
            name: a.name.clone(),
            alias: a.alias.clone(),
            persona: a.persona.clone(),
            instructions: a.instructions.clone(),
            think: a.think,
        }
    }
}

/// The heartbeat as tools see it, with its beats.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeartbeatContext {
    /// Id.
    pub id: HeartbeatId,
    /// `{"beat": N, "since_last": M}`.
    pub beats: Beats,
    /// When it was scheduled.
    pub scheduled_at: Timestamp,
    /// When it started.
    pub started_at: Timestamp,
    /// Its event window starts after this cursor.
    pub window_start: EventCursor,
    /// And ends at this one.
    pub window_end: EventCursor,
    /// Events in the window: what arrived since the last heartbeat (not counting its
    /// HEARTBEAT event or what its tools emit).
    #[serde(default)]
    pub window_events: usize,
    /// Why the heartbeat agent may not call the model this beat (the agent's daily
    /// token budget is spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_spent: Option<String>,
    /// What the tools found before the heartbeat agent thinks: set on its request only
    /// (the tools run first, the thinking last).
    #[serde(default, skip_serializing_if = "Found::is_empty")]
    pub found: Found,
    /// The agent's heartbeat tasks due in this heartbeat, by name: set on the heartbeat
    /// agent's request, with `found`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks_due: Vec<String>,
    /// The agent's prompt cache as the heartbeat found it, when it is kept warm: set on
    /// the heartbeat agent's request, with `found`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::domain::CacheKept>,
    /// Whether the heartbeat agent, having nothing to think about, should make one
    /// small call to keep that cache from lapsing before the next beat
    /// ([`crate::engine::prompt::warm_up_due`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm_up: bool,
}

/// The agent's sense of time: its beat counter, and beats since the user last
/// interacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beats {
    /// The beat number of this heartbeat.
    pub beat: u64,
    /// Beats since the last user interaction.
    pub since_last: u64,
}

/// What a tool answers.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResponse {
    /// Whether the tool did its job.
    pub success: bool,
    /// Its output.
    pub output: Value,
    /// Events to append to the agent's log; processed in the same heartbeat.
    pub new_events: Vec<NewEvent>,
    /// Usage figures (tokens, cost) as the tool reports them.
    pub usage: Value,
    /// The tool's own error message when `success` is false.
    pub error: Option<String>,
}

/// Why a tool's answer is not a tool response (the whole answer is rejected).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadToolResponse(pub String);

impl ToolResponse {
    /// Most events one action may append; a transaction carries them with the action.
    pub const MAX_NEW_EVENTS: usize = 50;

    /// Validates a tool's JSON answer: `{success, output, new_events, usage, error}`.
    /// Anything malformed, including an event with priority 0, rejects the whole answer.
    pub fn from_json(v: &Value) -> Result<Self, BadToolResponse> {
        Self::read(v).map_err(BadToolResponse)
    }

    fn read(v: &Value) -> Result<Self, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "the response is not a JSON object".to_owned())?;
        let success = obj
            .get("success")
            .and_then(Value::as_bool)
            .ok_or_else(|| "the response has no boolean \"success\" field".to_owned())?;
        let raw_events = match obj.get("new_events") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(_) => return Err("\"new_events\" is not an array".to_owned()),
        };
        if raw_events.len() > Self::MAX_NEW_EVENTS {
            return Err(format!(
                "the response has {} new events; at most {} are accepted per action",
                raw_events.len(),
                Self::MAX_NEW_EVENTS
            ));
        }
        let mut new_events = Vec::with_capacity(raw_events.len());
        for (i, e) in raw_events.iter().enumerate() {
            new_events.push(parse_new_event(e).map_err(|m| format!("new_events[{i}]: {m}"))?);
        }
        Ok(Self {
            success,
            output: obj.get("output").cloned().unwrap_or(Value::Null),
            new_events,
            usage: obj
                .get("usage")
                .or_else(|| obj.get("usage_stats"))
                .cloned()
                .unwrap_or(Value::Null),
            error: obj.get("error").and_then(Value::as_str).map(str::to_owned),
        })
    }
}

fn parse_new_event(e: &Value) -> Result<NewEvent, String> {
    let obj = e.as_object().ok_or("is not an object")?;
    let ty = obj
        .get("type")
        .or_else(|| obj.get("event_type"))
        .and_then(Value::as_str)
        .ok_or("has no \"type\"")?;
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => None,
        Some(p) => Some(p.as_i64().ok_or("\"priority\" is not an integer")?),
    };
    let mut ev = NewEvent::new(
        ty,
        obj.get("payload")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default())),
        priority,
    )
    .map_err(|e| e.to_string())?;
    ev.metadata = obj.get("metadata").cloned().unwrap_or(Value::Null);
    ev.check_size().map_err(|e| e.to_string())?;
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;
    use serde_json::json;

    #[test]
    fn a_tool_response_with_a_zero_priority_event_is_malformed() {
        let err = ToolResponse::from_json(
            &json!({"success": true, "new_events": [{"type": "B", "priority": 0}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("new_events[0]") && err.contains("priority"),
            "{err}"
        );
        assert!(ToolResponse::from_json(&json!({"output": 1})).is_err());
        let ok =
            ToolResponse::from_json(&json!({"success": true, "new_events": [{"event_type": "B"}]}))
                .unwrap();
        assert_eq!(ok.new_events[0].priority, Priority::DEFAULT);
    }
}
