//! What the heartbeat agent's model reads: its system prompt, the briefing of one
//! heartbeat, and Pulse's own tools.

use serde_json::json;

use crate::domain::{Agent, Event, Found, ToolRequest, ToolSpec};
use crate::engine::{framing, memory, reminders};

/// Events shown to the model per run; the rest are counted.
pub(super) const MAX_EVENTS_SHOWN: usize = 50;
/// Characters of one event's payload shown to the model.
const MAX_PAYLOAD_CHARS: usize = 500;

pub(super) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}

pub(super) fn system_prompt(agent: &Agent) -> String {
    let persona = agent
        .persona
        .clone()
        .unwrap_or_else(|| format!("You are {}, an autonomous assistant.", agent.name));
    format!(
        "{persona}\n\nThis is your heartbeat: you woke on your own schedule, not because the user wrote. \
         Look at what happened since you last woke and at what your tools found this heartbeat (they run before you), and decide whether anything is worth telling the user. \
         If it is, call speak with your thought (what you want to bring up and why); your conversational \
         self will phrase it. If nothing is worth saying, do not call speak: silence is a fine outcome. \
         Use remember for facts worth keeping, recall to look them up, emit_event to raise events for \
         other tools, schedule to wake yourself at a later time (a SCHEDULED event brings its note back). \
         Be brief; every step costs.\n\n{}",
        framing::EXPLAINED
    )
}

/// What the heartbeat's memories are recalled for: its window's events and what its
/// tools found (their types and payloads, the tools' outputs), or, with none of these,
/// its instructions.
pub(super) fn about(agent: &Agent, window: &[Event], found: &Found) -> String {
    let mut lines: Vec<String> = window
        .iter()
        .map(|e| format!("{} {}", e.event_type, clip(&e.payload.to_string(), 500)))
        .collect();
    for r in &found.results {
        lines.extend(r.output.as_deref().map(|o| clip(o, 500)));
        lines.extend(
            r.events
                .iter()
                .map(|e| format!("{} {}", e.event_type, clip(&e.payload.to_string(), 500))),
        );
    }
    if lines.is_empty() {
        return agent.instructions.clone().unwrap_or_default();
    }
    lines.join("\n")
}

/// What the tools found, as the briefing shows it: one frame of data per tool run.
fn found_section(found: &Found, out: &mut String) {
    if found.is_empty() {
        return;
    }
    out.push_str(&format!(
        "\nWhat your tools found this heartbeat (they ran before you; {} runs, {} events returned):\n",
        found.results.len() + found.more_results,
        found.events()
    ));
    for r in &found.results {
        let from = format!(
            "tool {} on {} ({}{})",
            r.tool,
            r.event_type,
            r.status.as_str().to_lowercase(),
            if r.late {
                ", after your last heartbeat's thinking, on what you raised"
            } else {
                ""
            }
        );
        let mut data = serde_json::Map::new();
        if let Some(output) = &r.output {
            data.insert("output".into(), json!(output));
        }
        if let Some(error) = &r.error {
            data.insert("error".into(), json!(error));
        }
        if !r.events.is_empty() {
            let events: Vec<_> = r
                .events
                .iter()
                .map(|e| json!({"type": e.event_type, "priority": e.priority.get(), "payload": e.payload}))
                .collect();
            data.insert("events".into(), json!(events));
        }
        out.push_str(&framing::frame_data(
            &from,
            &serde_json::Value::Object(data),
        ));
        out.push('\n');
    }
    if found.more_results > 0 || found.more_events > 0 {
        out.push_str(&format!(
            "({} more runs and {} more events not shown)\n",
            found.more_results, found.more_events
        ));
    }
}

/// The heartbeat's briefing: its instructions, the window's events (`window`, the first
/// of `total`), what its tools found, what it remembers and the recent conversation.
pub(super) fn briefing(
    agent: &Agent,
    req: &ToolRequest,
    (window, total): (&[Event], usize),
    digest: &[String],
    known: Option<&str>,
) -> String {
    let mut out = String::new();
    out.push_str("Heartbeat instructions:\n");
    out.push_str(
        agent
            .instructions
            .as_deref()
            .unwrap_or("(none: use your judgement)"),
    );
    out.push_str(&format!(
        "\n\nBeats: {}\nNow: {}\n",
        json!({"beat": req.heartbeat.beats.beat, "since_last": req.heartbeat.beats.since_last}),
        req.heartbeat.started_at
    ));
    if total > window.len() {
        out.push_str(&format!(
            "\nEvents since you last woke ({total}; the oldest {} are shown, the other {} are not, and the next heartbeat starts after them; the memories their REMEMBER events carry were kept all the same):\n",
            window.len(),
            total - window.len()
        ));
    } else {
        out.push_str(&format!(
            "\nEvents since you last woke ({}):\n",
            window.len()
        ));
    }
    if window.is_empty() {
        out.push_str("(none)\n");
    }
    for e in window {
        let from = format!(
            "event {} (priority {}, from {}, at {})",
            e.event_type,
            e.priority.get(),
            e.source,
            e.created_at
        );
        let payload = e.payload.to_string();
        // Whole when it fits; cut (as text) when it does not.
        let line = if payload.chars().count() <= MAX_PAYLOAD_CHARS {
            framing::frame_data(&from, &e.payload)
        } else {
            framing::frame(&from, &clip(&payload, MAX_PAYLOAD_CHARS))
        };
        out.push_str(&line);
        out.push('\n');
    }
    found_section(&req.heartbeat.found, &mut out);
    if let Some(known) = known {
        out.push_str("\nWhat you remember that bears on this:\n");
        out.push_str(known);
        out.push('\n');
    }
    out.push_str("\nRecent conversation:\n");
    if digest.is_empty() {
        out.push_str("(none yet)\n");
    }
    for line in digest {
        out.push_str(line);
        out.push('\n');
    }
    out
}

pub(super) fn tool_specs() -> Vec<ToolSpec> {
    let mut specs = vec![
        ToolSpec {
            name: "speak".to_owned(),
            description: "Communicate something to the user. Use when you have something worth saying: a proactive check-in, a reminder, a thought to share. Returns at once; your conversational self phrases and sends it.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"thought": {"type": "string", "description": "Your thought, e.g. 'The user mentioned a deadline tomorrow; I should check in about it'"}},
                "required": ["thought"]
            }),
        },
        ToolSpec {
            name: "emit_event".to_owned(),
            description: "Raise an event in your log; subscribed tools process it in this same heartbeat, after you.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "type": {"type": "string", "description": "Event type, e.g. REMINDER_DUE"},
                    "payload": {"type": "object"},
                    "priority": {"type": "integer", "minimum": 1, "maximum": 10, "description": "1 highest, 10 lowest; 5 if left out"}
                },
                "required": ["type"]
            }),
        },
    ];
    // After speak, as before: remember, recall; schedule last.
    specs.splice(1..1, memory::specs("in later heartbeats and conversations"));
    specs.push(reminders::tool_spec());
    specs
}
