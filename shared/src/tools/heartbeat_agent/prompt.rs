//! What the heartbeat agent's model reads after the prompt it shares with the agent's
//! conversation turns ([`prompt`]): the briefing of one heartbeat.

use serde_json::json;

use crate::domain::{Agent, BeatTask, EVERY_BEAT_TASK, Event, Found, Instructions, ToolRequest};
use crate::engine::{framing, prompt};

/// Events shown to the model per run; the rest are counted.
pub(super) const MAX_EVENTS_SHOWN: usize = 50;
/// Characters of one event's payload shown to the model.
const MAX_PAYLOAD_CHARS: usize = 500;

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
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

/// The agent's heartbeat instructions as this heartbeat reads them: the guidance, and
/// only the tasks due (the others are named, with their cadences, so the model knows they
/// are not for now).
fn instructions_section(instructions: Option<&str>, due: &[String], out: &mut String) {
    let tasks = Instructions::of(instructions);
    out.push_str("\n\nHeartbeat instructions:\n");
    if tasks.guidance.is_empty() && tasks.tasks.is_empty() {
        out.push_str("(none: use your judgement)");
        return;
    }
    if !tasks.guidance.is_empty() {
        out.push_str(&tasks.guidance);
        out.push('\n');
    }
    let (now, later): (Vec<&BeatTask>, Vec<&BeatTask>) =
        tasks.tasks.iter().partition(|t| due.contains(&t.name));
    if let [only] = now.as_slice()
        && only.name == EVERY_BEAT_TASK
    {
        out.push_str(&only.text);
        return;
    }
    if now.is_empty() {
        out.push_str(
            "\nNo task is due this heartbeat: look at what is new, and act only if it matters.\n",
        );
    } else {
        out.push_str("\nTasks due now:\n");
        for t in &now {
            out.push_str(&format!("\n## {} ({})\n{}\n", t.name, t.cadence, t.text));
        }
    }
    if !later.is_empty() {
        let names: Vec<String> = later
            .iter()
            .map(|t| format!("{} ({})", t.name, t.cadence))
            .collect();
        out.push_str(&format!("\nNot due now: {}.", names.join("; ")));
    }
}

/// The heartbeat's briefing, after the conversation's history: that this is a
/// heartbeat, its instructions, the window's events (`window`, the first of `total`),
/// what its tools found, what it remembers, and what is left of a dollar budget once
/// two thirds are spent.
pub(super) fn briefing(
    agent: &Agent,
    req: &ToolRequest,
    (window, total): (&[Event], usize),
    known: Option<&str>,
    budget: Option<&str>,
) -> String {
    let mut out = String::new();
    out.push_str(prompt::HEARTBEAT_OPENING);
    instructions_section(
        agent.instructions.as_deref(),
        &req.heartbeat.tasks_due,
        &mut out,
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
    if let Some(budget) = budget {
        out.push('\n');
        out.push_str(budget);
        out.push('\n');
    }
    out
}
