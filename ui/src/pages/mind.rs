//! An agent's Memories and Tools tabs: what it remembers, and the tools that run on its
//! events.

use axum::extract::{Path, Query, State};
use axum::response::Redirect;
use maud::{Markup, html};
use pulse_shared::domain::{
    DEFAULT_MEMORY_HALF_LIFE, Memory, MemoryKind, MemoryStatus, SubscriptionId, ToolName,
    builtin_tools,
};
use pulse_shared::engine;
use pulse_shared::engine::memory::Recall;
use serde::Deserialize;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, badge, button, empty, short};
use crate::{Dashboard, Problem};

/// Messages and memories shown.
const ROWS: usize = 100;

/// The Memories tab's search and filters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MemoryView {
    /// A recall to run (by meaning and words, as the agent's own).
    #[serde(default)]
    q: Option<String>,
    /// `active`, `suspended` or `folded`.
    #[serde(default)]
    state: Option<String>,
    /// A kind.
    #[serde(default)]
    kind: Option<String>,
}

/// One row of the Memories tab.
struct Row {
    memory: Memory,
    state: &'static str,
    weight: f32,
    /// The recall's match score, when searching.
    matched: Option<f32>,
}

fn state_of(m: &Memory, status: MemoryStatus) -> &'static str {
    match (&m.folded_into, status) {
        (Some(_), _) => "folded",
        (None, MemoryStatus::Active) => "active",
        (None, MemoryStatus::Suspended) => "suspended",
    }
}

/// `GET /ui/agents/{id}/memories`: what the agent remembers, newest first, with kind,
/// state and weight; `?q=` runs the agent's recall (without reinforcing: looking is not
/// remembering) and shows what it finds, best first, with the match score.
pub(crate) async fn memories(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<MemoryView>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let beat = engine::memory::beat_now(d.0.store.as_ref(), &agent.id).await?;
    let half_life = agent.memory_half_life_beats();
    let query = view.q.as_deref().map(str::trim).filter(|q| !q.is_empty());
    let kind = match view.kind.as_deref().filter(|k| !k.is_empty()) {
        Some(k) => Some(MemoryKind::parse(k).map_err(|e| Problem::Invalid(e.to_string()))?),
        None => None,
    };
    let state = view.state.as_deref().filter(|s| !s.is_empty());
    if let Some(s) = state
        && !["active", "suspended", "folded"].contains(&s)
    {
        return Err(Problem::Invalid(format!(
            "state {:?}: give active, suspended or folded",
            s.escape_debug().to_string()
        )));
    }
    let rows: Vec<Row> = match query {
        Some(q) => {
            let recall = Recall {
                limit: 20,
                reinforce: false,
                skip_folded: false,
                ..Recall::for_model(q, beat)
            };
            d.0.memories
                .recall(&agent, &recall, now)
                .await?
                .into_iter()
                .map(|f| Row {
                    state: state_of(&f.memory, f.status),
                    weight: f.weight,
                    matched: Some(f.score),
                    memory: f.memory,
                })
                .collect()
        }
        None => {
            // A plain look reads the newest only; a filter looks through them all.
            let mut all = if state.is_none() && kind.is_none() {
                d.0.store.memories(&agent.id, ROWS).await?
            } else {
                d.0.memories.all(&agent.id).await?
            };
            all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
            all.into_iter()
                .map(|m| Row {
                    state: state_of(&m, m.status_at(beat, half_life)),
                    weight: m.weight_at(beat, half_life),
                    matched: None,
                    memory: m,
                })
                .collect()
        }
    };
    let total = rows.len();
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|r| state.is_none_or(|s| s == r.state))
        .filter(|r| kind.is_none_or(|k| k == r.memory.kind))
        .take(ROWS)
        .collect();
    let search = search_form(agent.id.as_ref(), query, state, kind);
    let model = d.0.memories.model().to_owned();
    Ok(agent_page(
        &agent,
        Tab::Memories,
        html! {
            (search)
            p.muted {
                @if let Some(q) = query {
                    "What a recall of " strong { (format!("{q:?}")) } " finds, best first (a look: nothing is reinforced). "
                } @else {
                    @if total >= ROWS { "The newest " (ROWS) " memories. " } @else { (total) " memories, newest first. " }
                }
                "Weights fade with the agent's beats (half-life " (format!("{:#}", agent.memory_half_life.map_or(DEFAULT_MEMORY_HALF_LIFE, |h| h.duration()))) " of beats, " (half_life) " beats) and come back when recalled; under 0.1 a memory is suspended. Embedded with " code { (model) }
                @if model.starts_with("offline") { ", which matches words, not meaning" }
                "."
            }
            @if rows.is_empty() {
                @if total == 0 && query.is_none() {
                    (empty("No memories yet: the agent keeps them with its remember tool, REMEMBER events bring them, and you can give it one with", &format!("pulse memories add {} \"The user is vegetarian\"", agent.name)))
                } @else {
                    p.empty { "Nothing matches." }
                }
            } @else {
                div.scroll { table.memories {
                    thead { tr {
                        th { "Memory" }
                        @if query.is_some() { th { "Match" } }
                        th { "Kind" } th { "State" } th { "Weight" } th { "Importance" } th { "Recalled" } th { "From" } th { "Kept" }
                    } }
                    tbody { @for r in &rows { @let m = &r.memory; tr id=(m.id) {
                        td.wrap { (m.text) }
                        @if let Some(x) = r.matched { td { (format!("{x:.2}")) } }
                        td { (m.kind.as_str()) }
                        td { (badge(r.state)) @if let Some(into) = &m.folded_into { " into " code { (short(into.as_str(), 14)) } } }
                        td { meter min="0" max="1" value=(format!("{:.2}", r.weight)) {} " " (format!("{:.2}", r.weight)) }
                        td { (format!("{:.2}", m.importance)) }
                        td { @if m.recalls == 0 { "never" } @else { (m.recalls) "× · " (ago(now, m.recalled_at)) } }
                        td { (m.source.as_str()) @if let Some(h) = &m.heartbeat_id {
                            " · " a href={"/ui/agents/" (agent.id) "/heartbeats/" (h.beat())} { "#" (h.beat()) }
                        } @if !m.after_reading.is_empty() {
                            br; span.muted title=(m.after_reading.iter().filter_map(|o| o.event_id.as_ref().map(|e| e.to_string())).collect::<Vec<_>>().join(" ")) {
                                "after reading " (m.read_from().join(", "))
                            }
                        } }
                        td { (ago(now, Some(m.created_at))) }
                    } } }
                } }
            }
        },
    ))
}

/// The Memories tab's search box and filters.
fn search_form(
    agent: &str,
    query: Option<&str>,
    state: Option<&str>,
    kind: Option<MemoryKind>,
) -> Markup {
    html! {
        form.card.search method="get" action={"/ui/agents/" (agent) "/memories"} {
            label for="q" { "Recall " }
            input #q name="q" type="search" value=(query.unwrap_or("")) placeholder="what does the user eat?";
            label for="state" { "State " }
            select #state name="state" {
                option value="" selected[state.is_none()] { "any" }
                @for s in ["active", "suspended", "folded"] {
                    option value=(s) selected[state == Some(s)] { (s) }
                }
            }
            label for="kind" { "Kind " }
            select #kind name="kind" {
                option value="" selected[kind.is_none()] { "any" }
                @for k in MemoryKind::ALL {
                    option value=(k.as_str()) selected[kind == Some(k)] { (k.as_str()) }
                }
            }
            button.quiet type="submit" { "Search" }
        }
    }
}

/// A status with the button that flips it.
fn switch(d: &Dashboard, back: &str, base: &str, active: bool) -> Markup {
    html! {
        @if active {
            (badge("active")) " " (button(d, &format!("{base}/disable"), "Disable", "quiet", back))
        } @else {
            (badge("paused")) " " (button(d, &format!("{base}/enable"), "Enable", "quiet", back))
        }
    }
}

/// On or off, from the path's last segment.
fn on(to: &str) -> Result<bool, Problem> {
    match to {
        "enable" => Ok(true),
        "disable" => Ok(false),
        _ => Err(Problem::NotFound(format!("/{to}"))),
    }
}

/// `POST /ui/agents/{id}/tools/{tool}/enable` and `/disable`.
pub(crate) async fn switch_tool(
    State(d): State<Dashboard>,
    Path((id, tool, to)): Path<(String, String, String)>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let name = ToolName::parse(&tool).map_err(|_| Problem::NotFound(format!("tool {tool}")))?;
    engine::switch_tool(d.0.store.as_ref(), &name, on(&to)?).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/tools", agent.id)))
}

/// `POST /ui/agents/{id}/subscriptions/{sub}/enable` and `/disable`.
pub(crate) async fn switch_subscription(
    State(d): State<Dashboard>,
    Path((id, sub, to)): Path<(String, String, String)>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let sub = SubscriptionId::parse(&sub)
        .map_err(|_| Problem::NotFound(format!("subscription {sub}")))?;
    engine::switch_subscription(d.0.store.as_ref(), &sub, on(&to)?).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/tools", agent.id)))
}

/// `GET /ui/agents/{id}/tools`: the tools and the subscriptions that apply to this agent
/// (its own and everyone's), in the order they run.
pub(crate) async fn tools(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let registry =
        d.0.store
            .load_registry()
            .await?
            .with_builtins(builtin_tools());
    let mut subs: Vec<_> = registry
        .subscriptions
        .iter()
        .filter(|s| s.agent_id.as_ref().is_none_or(|a| *a == agent.id))
        .collect();
    subs.sort_by(|a, b| (&a.event_type, a.order, &a.tool).cmp(&(&b.event_type, b.order, &b.tool)));
    let back = format!("/ui/agents/{}/tools", agent.id);
    let now = d.0.clock.now();
    let since = now - jiff::SignedDuration::from_hours(24);
    let stats =
        engine::actions::agent_tool_stats(d.0.store.as_ref(), &agent.id, since, now).await?;
    Ok(agent_page(
        &agent,
        Tab::Tools,
        html! {
            h2 { "Health, last 24 hours" }
            @if stats.is_empty() {
                (empty("No tool ran for this agent in the last 24 hours. The whole deployment's figures:", "pulse tools stats --since 1d"))
            } @else {
                div.scroll { table #tool-stats {
                    thead { tr { th { "Tool" } th { "Calls" } th { "Succeeded" } th { "Failed" } th { "Unknown" } th { "p50" } th { "p95" } } }
                    tbody { @for s in &stats { tr {
                        td { (s.tool) }
                        td { (s.calls) }
                        td { (s.succeeded) }
                        td { @if s.failed > 0 { (badge("FAILED")) " " } (s.failed) }
                        td { @if s.unknown > 0 { (badge("UNKNOWN")) " " } (s.unknown) }
                        td { (s.p50_ms.map(|ms| format!("{ms} ms")).unwrap_or_else(|| "-".into())) }
                        td { (s.p95_ms.map(|ms| format!("{ms} ms")).unwrap_or_else(|| "-".into())) }
                    } } }
                } }
            }
            p.muted { "Tools and subscriptions for every agent are shared: switching one here switches it for all of them." }
            h2 { "Subscriptions" }
            div.scroll { table {
                thead { tr { th { "Event" } th { "Tool" } th { "Order" } th { "For" } th { "Filter" } th { "Active" } } }
                tbody { @for s in &subs { tr {
                    td { code { (s.event_type) } }
                    td { (s.tool) }
                    td { (s.order) }
                    td { @if s.agent_id.is_some() { "this agent" } @else { "every agent" } }
                    td { code { (serde_json::to_string(&s.filter).unwrap_or_default()) } }
                    td { (switch(&d, &back, &format!("/ui/agents/{}/subscriptions/{}", agent.id, s.id), s.active)) }
                } } }
            } }
            h2 { "Tools" }
            div.scroll { table {
                thead { tr { th { "Name" } th { "Kind" } th { "Description" } th { "Active" } } }
                tbody { @for t in &registry.tools { tr {
                    td { (t.name) }
                    td { @match &t.kind {
                        pulse_shared::domain::ToolKind::Http { url, .. } => code { (url) },
                        pulse_shared::domain::ToolKind::HeartbeatAgent => "built in",
                        pulse_shared::domain::ToolKind::Mcp(m) => {
                            "MCP " code { (m.place()) } " · " (m.allowed().count()) " tools"
                            @if agent.tools.iter().any(|a| a.server == t.name) { " · attached" }
                        },
                    } }
                    td.wrap { (t.description.clone().unwrap_or_default()) }
                    td { (switch(&d, &back, &format!("/ui/agents/{}/tools/{}", agent.id, t.name), t.active)) }
                } } }
            } }
        },
    ))
}
