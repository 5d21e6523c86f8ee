//! One heartbeat's trace: its window, each action (the heartbeat agent's thoughts, tool
//! calls and tokens), the events it created by depth, the hooks it emitted and the next
//! heartbeat — the engine's `trace`, as `pulse heartbeats show` prints it.

use axum::extract::{Path, State};
use maud::{Markup, html};
use pulse_shared::domain::{Action, HeartbeatId};
use pulse_shared::engine::{Trace, trace};
use serde_json::Value;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, badge, empty, short, trace_link};
use crate::{Dashboard, Problem};

/// `GET /ui/agents/{id}/heartbeats/{beat}`.
pub(crate) async fn show(
    State(d): State<Dashboard>,
    Path((id, beat)): Path<(String, u64)>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let hid = HeartbeatId::new(agent.id.clone(), beat);
    let hb =
        d.0.store
            .get_heartbeat(&hid)
            .await?
            .ok_or_else(|| Problem::NotFound(format!("heartbeat {beat} of {}", agent.name)))?;
    let now = d.0.clock.now();
    let t = trace(d.0.store.as_ref(), hb, now).await?;
    Ok(agent_page(
        &agent,
        Tab::Heartbeats,
        render(&t, now, d.0.trace_url.as_deref()),
    ))
}

fn render(t: &Trace, now: jiff::Timestamp, trace_url: Option<&str>) -> Markup {
    let h = &t.heartbeat;
    let base = format!("/ui/agents/{}/heartbeats", h.agent_id);
    html! {
        h2 { "Heartbeat #" (h.beat) " " (badge(h.status.as_str())) }
        div.card {
            p { "Scheduled " (ago(now, Some(h.scheduled_at))) ", started " (ago(now, h.started_at))
                ", completed " (ago(now, h.completed_at)) "." }
            p.muted { "Window: after " code { (h.window_start) } " through "
                code { (h.window_end.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "–".into())) } }
            @if let Some(r) = &h.requests {
                p.muted { "AWS requests: " (r.total()) " ("
                    @for (i, (op, n)) in r.ops.iter().enumerate() { @if i > 0 { ", " } (n) " " code { (op) } }
                    "), " (format!("{:.1}", r.wru)) " write and " (format!("{:.1}", r.rru)) " read units." }
            }
            @if let Some(o) = &h.outcome { p { "Outcome: " (badge(o.kind.as_str())) " " (o.reason) } }
            @if let Some(t) = h.thinking() { p.muted { "Thinking: " (t) } }
            @if let Some(id) = &h.trace_id { p.muted { "Recorded in OpenTelemetry " (trace_link(trace_url, id)) "." } }
            @if let Some(e) = &h.error { p.error { (e) } }
        }
        h2 { "Events it read (" (t.window_events.len()) ")" }
        @if t.window_events.is_empty() { p.muted { "None: only its own HEARTBEAT event." } }
        @else { ul { @for e in &t.window_events {
            li { code { (e.event_type) } " " span.muted { (short(&e.payload.to_string(), 120)) } }
        } } }
        h2 { "Actions (" (t.actions.len()) ")" }
        @if t.actions.is_empty() { (empty("No tool ran: nothing is subscribed to these events.", "pulse subscriptions list")) }
        @for a in &t.actions { (action(a, now)) }
        h2 { "Events it created (" (t.created.len()) ")" }
        @if t.created.is_empty() { p.muted { "None." } }
        @else { ul { @for e in &t.created {
            @let depth = e.cascade.as_ref().map_or(0, |c| c.depth);
            li class={"depth-" (depth.min(3))} {
                code { (e.event_type) } " depth " (depth)
                @if e.cascade.as_ref().is_some_and(|c| c.capped) { " " span.error { "(past the depth cap: not run)" } }
                " " span.muted { (short(&e.payload.to_string(), 120)) }
            }
        } } }
        h2 { "Hooks it emitted (" (t.hooks.len()) ")" }
        @if t.hooks.is_empty() { p.muted { "None." } }
        @else { div.scroll { table {
            thead { tr { th { "Type" } th { "Delivery" } th { "Status" } th { "Attempts" } th { "Last error" } } }
            tbody { @for d in &t.hooks { tr {
                td { code { (d.hook_type) } } td { code { (d.id) } }
                td { (badge(d.status.as_str())) } td { (d.attempts) }
                td.wrap { (d.last_error.as_deref().map(|e| short(e, 120)).unwrap_or_default()) }
            } } }
        } } }
        h2 { "Next" }
        @match &t.next {
            Some(n) => p { a href={(base) "/" (n.beat)} { "Heartbeat #" (n.beat) } " " (badge(n.status.as_str())) ", due " (ago(now, Some(n.scheduled_at))) },
            None => p.muted { "None scheduled." },
        }
    }
}

/// One action; for the heartbeat agent, its steps: thoughts, tool calls, tokens.
fn action(a: &Action, now: jiff::Timestamp) -> Markup {
    let steps = a
        .response
        .as_ref()
        .and_then(|r| r["output"]["steps"].as_array().cloned());
    html! {
        div.card {
            p { strong { (a.label()) } " " (badge(a.status.as_str())) " started " (ago(now, Some(a.started_at)))
                @if let Some(ms) = a.duration_ms { ", took " (ms) " ms" }
                @if a.attempt > 1 { " (attempt " (a.attempt) ")" } }
            @if let Some(e) = &a.error { p.error { (e) } }
            @match (&steps, &a.response) {
                (Some(steps), Some(r)) => {
                    @for s in steps { (step(s)) }
                    p.muted { "Tokens: " (r["usage"]["input_tokens"].as_u64().unwrap_or(0)) " in, "
                        (r["usage"]["output_tokens"].as_u64().unwrap_or(0)) " out" }
                },
                (None, Some(r)) => pre { (short(&r.to_string(), 600)) },
                _ => {},
            }
        }
    }
}

fn step(s: &Value) -> Markup {
    html! {
        @if s["kind"] == "llm" {
            @if let Some(text) = s["text"].as_str().filter(|t| !t.trim().is_empty()) {
                p { span.muted { "Thought: " } (text) }
            }
        } @else if s["kind"] == "tool" {
            p { code { (s["name"].as_str().unwrap_or("?")) "(" (short(&s["input"].to_string(), 100)) ")" }
                " → " code { (short(&s["result"].to_string(), 100)) }
                @if s["is_error"] == true { " " span.error { "(error)" } } }
        }
    }
}
