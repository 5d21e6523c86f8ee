//! `pulse heartbeats show`: one heartbeat's whole story, read from the store — its window
//! and the events it read, each action (the heartbeat agent's thought, tool calls and
//! tokens among them), the events it created, the hooks it emitted, the next heartbeat;
//! on AWS, the requests it made.

use pulse_shared::domain::{Action, ActionStatus, Event, HeartbeatId};
use pulse_shared::engine::{Trace, trace};
use serde_json::Value;

use super::Ctx;
use crate::Failure;
use crate::output::{count, outln, short, when};

type Story = Trace;

pub(crate) async fn show(cx: &Ctx<'_>, id: &HeartbeatId) -> Result<(), Failure> {
    let Some(heartbeat) = cx.b.store.get_heartbeat(id).await? else {
        return Err(Failure::Input(format!(
            "heartbeat {id} not found; `pulse heartbeats list --agent {}` lists the agent's heartbeats",
            id.agent()
        )));
    };
    let story = trace(cx.b.store.as_ref(), heartbeat, cx.clock.now()).await?;
    if cx.out.json {
        cx.out.json_value(&story);
    } else {
        print(&story);
    }
    Ok(())
}

fn print(s: &Story) {
    let h = &s.heartbeat;
    outln!(
        "heartbeat {} (beat {}): {}",
        h.id(),
        h.beat,
        h.status.as_str()
    );
    outln!(
        "  scheduled {}  started {}  completed {}",
        when(Some(h.scheduled_at)),
        when(h.started_at),
        when(h.completed_at)
    );
    if let Some(o) = &h.outcome {
        outln!("  outcome: {}: {}", o.kind, o.reason);
    }
    if let Some(e) = &h.error {
        outln!("  error: {e}");
    }
    if let Some(r) = &h.requests {
        let ops: Vec<String> = r.ops.iter().map(|(op, n)| format!("{n} {op}")).collect();
        outln!(
            "  AWS requests: {} ({}), {:.1} WRU, {:.1} RRU",
            r.total(),
            ops.join(", "),
            r.wru,
            r.rru
        );
    }
    outln!(
        "window ({}, {}]: {} read",
        h.window_start.as_str(),
        h.window_end.as_ref().map_or("-", |c| c.as_str()),
        count(s.window_events.len(), "event")
    );
    for e in &s.window_events {
        outln!(
            "  {}  {}  {}  {}",
            e.id,
            e.event_type,
            e.source,
            short(&e.payload.to_string(), 80)
        );
    }
    // A skip carries its reason as an error, but it is not a failure.
    let failed = s
        .actions
        .iter()
        .filter(|a| a.status == ActionStatus::Failed)
        .count();
    outln!("actions: {} ({failed} failed)", s.actions.len());
    for a in &s.actions {
        print_action(a, &s.created, &s.window_events);
    }
    outln!("created: {}", count(s.created.len(), "event"));
    for e in &s.created {
        let depth = e.cascade.as_ref().map_or(0, |c| c.depth);
        let parent = e.parent_id.as_ref().map_or("-".into(), ToString::to_string);
        outln!(
            "  {}  {}  depth {depth}{}  from {}  parent {parent}",
            e.id,
            e.event_type,
            if e.cascade.as_ref().is_some_and(|c| c.capped) {
                " (capped)"
            } else {
                ""
            },
            e.source
        );
    }
    outln!("hooks: {}", count(s.hooks.len(), "delivery"));
    for d in &s.hooks {
        outln!(
            "  {}  {}  {}  {}{}",
            d.id,
            d.hook_type,
            d.status.as_str(),
            count(d.attempts as usize, "attempt"),
            d.last_error
                .as_ref()
                .map_or(String::new(), |e| format!("  {}", short(e, 80)))
        );
    }
    match &s.next {
        Some(n) => outln!(
            "next: beat {} {}, due {}",
            n.beat,
            n.status.as_str(),
            when(Some(n.scheduled_at))
        ),
        None => outln!("next: none scheduled"),
    }
}

/// One action, and for the heartbeat agent its steps: thoughts, tool calls, tokens.
fn print_action(a: &Action, created: &[Event], read: &[Event]) {
    let event_type = created
        .iter()
        .chain(read)
        .find(|e| e.id == a.event_id)
        .map_or("-".to_owned(), |e| e.event_type.to_string());
    outln!(
        "  {} on {event_type} {}: {}{}{}",
        a.tool,
        a.event_id,
        a.status.as_str(),
        a.duration_ms
            .map_or(String::new(), |ms| format!(" in {ms} ms")),
        if a.attempt > 1 {
            format!(" (attempt {})", a.attempt)
        } else {
            String::new()
        }
    );
    if let Some(e) = &a.error {
        outln!("    error: {}", short(e, 200));
    }
    let Some(response) = &a.response else { return };
    let steps = response["output"]["steps"].as_array();
    match steps {
        None => outln!("    output: {}", short(&response.to_string(), 120)),
        Some(steps) => {
            for step in steps {
                print_step(step);
            }
            let usage = &response["usage"];
            outln!(
                "    tokens: {} in, {} out",
                usage["input_tokens"].as_u64().unwrap_or(0),
                usage["output_tokens"].as_u64().unwrap_or(0)
            );
        }
    }
}

fn print_step(step: &Value) {
    if step["kind"] == "llm" {
        if let Some(text) = step["text"].as_str().filter(|t| !t.trim().is_empty()) {
            outln!("    thought: {}", short(text, 200));
        }
    } else if step["kind"] == "tool" {
        outln!(
            "    {}({}) → {}{}",
            step["name"].as_str().unwrap_or("?"),
            short(&step["input"].to_string(), 80),
            short(&step["result"].to_string(), 80),
            if step["is_error"] == true {
                " (error)"
            } else {
                ""
            }
        );
    }
}
