//! What a heartbeat's tools found before its agent thinks: each tool's outcome, the start
//! of its output and the events it returned, bounded. The tools run first and the
//! thinking last, so an inbox or a weather tool subscribed to the heartbeat, or a tool
//! that checks what an event announced, is read by the thinking it exists for.
//!
//! It travels in the heartbeat agent's request alone ([`super::HeartbeatContext::found`]:
//! no other tool is sent another's output), which its action keeps whole, so every
//! part is bounded in bytes as it is written, escapes counted: all of it stays under
//! [`Found::MAX_BYTES`] whatever the tools answered.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Action, ActionStatus, Event, EventType, Priority, ToolName};

/// What the tools found on one heartbeat, in the order they ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Found {
    /// The first [`Found::MAX_RESULTS`] tool runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ToolResult>,
    /// Tool runs past those, counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_results: usize,
    /// Events returned past the [`Found::MAX_EVENTS`] shown, counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_events: usize,
}

/// One tool's run on an event of the heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The tool.
    pub tool: ToolName,
    /// The type of the event it ran on.
    pub event_type: EventType,
    /// How it ended.
    pub status: ActionStatus,
    /// The start of its output, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The events it returned (the first ones of the heartbeat, up to
    /// [`Found::MAX_EVENTS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<FoundEvent>,
    /// It ran after the previous heartbeat's thinking (on what the heartbeat agent
    /// raised), and is handed on to this one's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
}

/// An event a tool returned, as the thinking reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoundEvent {
    /// Its type.
    pub event_type: EventType,
    /// Its priority.
    pub priority: Priority,
    /// Its payload: whole when its JSON is at most [`Found::MAX_PAYLOAD_BYTES`] bytes,
    /// else the start of that text.
    pub payload: Value,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `s` whole, or as much of its start as takes at most `max` bytes written as a JSON
/// string (its escapes counted: a quote takes two, a control character up to six), and
/// an ellipsis. One pass over `s`.
fn clip(s: &str, max: usize) -> String {
    let start = super::event::json_prefix(s, max);
    match start.len() == s.len() {
        true => s.to_owned(),
        false => format!("{start}…"),
    }
}

impl Found {
    /// Tool runs shown.
    pub const MAX_RESULTS: usize = 20;
    /// Bytes of one tool's output shown (as a JSON string), and of its error.
    pub const MAX_OUTPUT_BYTES: usize = 2_000;
    /// Events shown, over all the runs.
    pub const MAX_EVENTS: usize = 50;
    /// Bytes of one event's payload shown, as JSON.
    pub const MAX_PAYLOAD_BYTES: usize = 500;
    /// The most all of it takes as JSON: each result's output and error at their bound
    /// (and an ellipsis each), each event's payload at its bound, and a generous 600
    /// bytes a result and 200 an event for the rest (names, types, statuses, keys).
    pub const MAX_BYTES: usize = Self::MAX_RESULTS * (2 * (Self::MAX_OUTPUT_BYTES + 5) + 600)
        + Self::MAX_EVENTS * (Self::MAX_PAYLOAD_BYTES + 5 + 200);

    /// Adds a finished action on `on` and the events it returned.
    pub fn add(&mut self, on: &Event, action: &Action, events: &[Event]) {
        let Some(room) = self.room_for(events.len()) else {
            return;
        };
        self.results.push(ToolResult {
            tool: action.tool.clone(),
            event_type: on.event_type.clone(),
            status: action.status,
            output: output_of(action).map(|o| clip(&o, Self::MAX_OUTPUT_BYTES)),
            error: action
                .error
                .as_deref()
                .map(|e| clip(e, Self::MAX_OUTPUT_BYTES)),
            events: events
                .iter()
                .take(room)
                .map(|e| FoundEvent {
                    event_type: e.event_type.clone(),
                    priority: e.priority,
                    payload: payload_shown(&e.payload),
                })
                .collect(),
            late: false,
        });
    }

    /// Adds what `other` found after this, within the same bounds (what does not fit is
    /// counted), marked [`ToolResult::late`].
    pub fn hand_on(&mut self, other: Found) {
        self.more_results += other.more_results;
        self.more_events += other.more_events;
        for mut r in other.results {
            let Some(room) = self.room_for(r.events.len()) else {
                continue;
            };
            r.events.truncate(room);
            r.late = true;
            self.results.push(r);
        }
    }

    /// How many of a new run's `events` are shown, the rest counted; `None`, with the
    /// run and its events counted, when no more runs are shown.
    fn room_for(&mut self, events: usize) -> Option<usize> {
        if self.results.len() >= Self::MAX_RESULTS {
            self.more_results += 1;
            self.more_events += events;
            return None;
        }
        let shown: usize = self.results.iter().map(|r| r.events.len()).sum();
        let room = Self::MAX_EVENTS.saturating_sub(shown);
        self.more_events += events.saturating_sub(room);
        Some(room)
    }

    /// Whether no tool ran.
    pub fn is_empty(&self) -> bool {
        self.results.is_empty() && self.more_results == 0
    }

    /// The events the tools returned, all of them (shown or counted).
    pub fn events(&self) -> usize {
        self.results.iter().map(|r| r.events.len()).sum::<usize>() + self.more_events
    }
}

/// A tool's output as text: its answer's `output` (a string as it is, anything else as
/// JSON), or the start of an answer the action kept clipped.
fn output_of(action: &Action) -> Option<String> {
    let response = action.response.as_ref()?;
    if response["clipped"] == Value::Bool(true) {
        return response["start"].as_str().map(str::to_owned);
    }
    match response.get("output") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    }
}

fn payload_shown(payload: &Value) -> Value {
    let text = payload.to_string();
    if text.len() <= Found::MAX_PAYLOAD_BYTES {
        payload.clone()
    } else {
        Value::String(clip(&text, Found::MAX_PAYLOAD_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::domain::{ActionId, AgentId, EventId, HeartbeatId, NewEvent};

    fn action(tool: &str, response: Value) -> Action {
        let agent = AgentId::generate();
        let on = EventId::generate(0);
        Action {
            id: ActionId::for_event(&on, &ToolName::parse(tool).unwrap()),
            agent_id: agent.clone(),
            heartbeat_id: HeartbeatId::new(agent, 1),
            event_id: on,
            tool: ToolName::parse(tool).unwrap(),
            status: ActionStatus::Completed,
            attempt: 1,
            depth: 0,
            request: json!({}),
            response: Some(response),
            error: None,
            started_at: Timestamp::UNIX_EPOCH,
            completed_at: None,
            duration_ms: None,
            new_events: Vec::new(),
            call: None,
        }
    }

    fn event(payload: Value) -> Event {
        event_of("DEPLOY_CHECKED", payload)
    }

    fn event_of(ty: &str, payload: Value) -> Event {
        NewEvent::new(ty, payload, None).unwrap().into_event(
            AgentId::generate(),
            "tool:checker",
            Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn a_result_keeps_the_start_of_the_output_and_the_events_payloads() {
        let mut found = Found::default();
        let long = "x".repeat(5_000);
        let on = event_of("DEPLOY_FINISHED", json!({}));
        found.add(
            &on,
            &action("checker", json!({"success": true, "output": long})),
            &[
                event(json!({"ok": true})),
                event(json!({"log": "y".repeat(900)})),
            ],
        );
        let r = &found.results[0];
        assert_eq!(r.event_type.as_str(), "DEPLOY_FINISHED");
        assert_eq!(
            r.output.as_ref().unwrap().chars().count(),
            Found::MAX_OUTPUT_BYTES + 1
        );
        assert_eq!(r.events[0].payload, json!({"ok": true}));
        let cut = r.events[1].payload.as_str().unwrap();
        // The payload's JSON, its quotes escaped: `{\"log\":\"yyy…`.
        let written = serde_json::to_string(cut).unwrap().len();
        assert!(
            (Found::MAX_PAYLOAD_BYTES - 4..=Found::MAX_PAYLOAD_BYTES + 5).contains(&written),
            "{written}"
        );
        assert_eq!(found.events(), 2);
        // An object output is shown as its JSON; a clipped answer by its start.
        found.add(&on, &action("a", json!({"output": {"n": 1}})), &[]);
        found.add(
            &on,
            &action("b", json!({"clipped": true, "start": "{\"out"})),
            &[],
        );
        assert_eq!(found.results[1].output.as_deref(), Some(r#"{"n":1}"#));
        assert_eq!(found.results[2].output.as_deref(), Some("{\"out"));
    }

    #[test]
    fn past_the_bounds_runs_and_events_are_counted_not_shown() {
        let mut found = Found::default();
        let events: Vec<Event> = (0..30).map(|i| event(json!({"i": i}))).collect();
        for _ in 0..25 {
            found.add(&events[0], &action("t", json!({"output": "ok"})), &events);
        }
        assert_eq!(found.results.len(), Found::MAX_RESULTS);
        assert_eq!(found.more_results, 5);
        let shown: usize = found.results.iter().map(|r| r.events.len()).sum();
        assert_eq!(shown, Found::MAX_EVENTS);
        assert_eq!(found.events(), 25 * 30);
        let json = serde_json::to_value(&found).unwrap();
        assert_eq!(serde_json::from_value::<Found>(json).unwrap(), found);
    }

    #[test]
    fn the_bound_holds_in_bytes_for_wide_and_escaped_text() {
        let mut found = Found::default();
        // Four bytes a character, quotes and control characters that escape to two and
        // six bytes: as many results and events as it shows, each at its worst.
        let hostile = "𝄞\"\u{1}".repeat(3_000);
        let events: Vec<Event> = (0..3)
            .map(|_| event(json!({"text": hostile, "more": [hostile, hostile]})))
            .collect();
        for i in 0..Found::MAX_RESULTS + 3 {
            let mut a = action(
                &format!("tool-{i}"),
                json!({"success": false, "output": {"text": hostile}}),
            );
            a.error = Some(hostile.clone());
            found.add(&events[0], &a, &events);
        }
        let written = serde_json::to_string(&found).unwrap().len();
        assert!(
            written <= Found::MAX_BYTES,
            "{written} bytes past the bound of {}",
            Found::MAX_BYTES
        );
        for r in &found.results {
            for text in [&r.output, &r.error] {
                let n = serde_json::to_string(text.as_ref().unwrap()).unwrap().len();
                assert!(n <= Found::MAX_OUTPUT_BYTES + 5, "{n}");
            }
        }
    }
}
