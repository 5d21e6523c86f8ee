//! `pulse heartbeats show`: one heartbeat's whole story, read from the store — its window
//! and the events it read, each action (the heartbeat agent's thought, tool calls and
//! tokens among them), the events it created, the hooks it emitted, the next heartbeat.

use pulse_shared::domain::{
    Action, Event, EventCursor, EventId, Heartbeat, HeartbeatId, HookDelivery,
};
use pulse_shared::ports::EventQuery;
use serde::Serialize;
use serde_json::Value;

use super::Ctx;
use crate::Failure;
use crate::output::{count, outln, short, when};

/// Most records of each kind a story reads.
const MOST: usize = 1_000;

/// The story, as `--json` prints it.
#[derive(Serialize)]
struct Story {
    id: HeartbeatId,
    heartbeat: Heartbeat,
    /// The events of its window, `(window_start, window_end]`, that it read.
    window_events: Vec<Event>,
    /// Its actions, in event order.
    actions: Vec<Action>,
    /// The events it created (HEARTBEAT and its tools' cascades).
    created: Vec<Event>,
    /// The hook deliveries it emitted.
    hooks: Vec<HookDelivery>,
    /// The heartbeat after it, once scheduled.
    next: Option<Heartbeat>,
}

pub(crate) async fn show(cx: &Ctx<'_>, id: &HeartbeatId) -> Result<(), Failure> {
    let Some(heartbeat) = cx.b.store.get_heartbeat(id).await? else {
        return Err(Failure::Input(format!(
            "heartbeat {id} not found; `pulse heartbeats list --agent {}` lists the agent's heartbeats",
            id.agent()
        )));
    };
    let story = read(cx, heartbeat).await?;
    if cx.out.json {
        cx.out.json_value(&story);
    } else {
        print(&story);
    }
    Ok(())
}

async fn read(cx: &Ctx<'_>, heartbeat: Heartbeat) -> Result<Story, Failure> {
    let store = &cx.b.store;
    let (agent, id) = (heartbeat.agent_id.clone(), heartbeat.id());
    let window_events = match &heartbeat.window_end {
        Some(end) => {
            let query = EventQuery {
                after: Some(heartbeat.window_start.clone()),
                // The cursor is the greatest id of its millisecond: nothing equals it.
                before: EventId::parse(end.as_str()).ok(),
                limit: MOST,
                ..EventQuery::default()
            };
            let events = store.query_events(&agent, &query).await?;
            events
                .into_iter()
                .filter(|e| e.cascade.is_none() && end.covers(&e.id))
                .collect()
        }
        None => Vec::new(),
    };
    let end = heartbeat.completed_at.unwrap_or_else(|| cx.clock.now());
    let actions = store
        .actions_between(
            &agent,
            &heartbeat.window_start,
            &EventCursor::through(end),
            MOST,
        )
        .await?
        .into_iter()
        .filter(|a| a.heartbeat_id == id)
        .collect();
    let created = match heartbeat.started_at {
        Some(started) => {
            let query = EventQuery {
                after: Some(EventCursor::since(started)),
                limit: MOST,
                ..EventQuery::default()
            };
            store
                .query_events(&agent, &query)
                .await?
                .into_iter()
                .filter(|e| e.cascade.as_ref().is_some_and(|c| c.heartbeat_id == id))
                .collect()
        }
        None => Vec::new(),
    };
    let mut hooks = Vec::new();
    for hook in store.list_hooks(&agent).await? {
        for d in store.list_deliveries(&hook.id, MOST).await? {
            let body: Value = serde_json::from_str(&d.body).unwrap_or(Value::Null);
            if body["heartbeat_id"].as_str() == Some(id.to_string().as_str()) {
                hooks.push(d);
            }
        }
    }
    hooks.sort_by_key(|d| d.created_at);
    let next = store.get_heartbeat(&heartbeat.next_id()).await?;
    let id = heartbeat.id();
    Ok(Story {
        id,
        heartbeat,
        window_events,
        actions,
        created,
        hooks,
        next,
    })
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
    if let Some(e) = &h.error {
        outln!("  error: {e}");
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
    let failed = s.actions.iter().filter(|a| a.error.is_some()).count();
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
        format!("{:?}", a.status).to_uppercase(),
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
