//! An agent's Conversation, Memories and Tools tabs: what it said and heard, what it
//! remembers, and the tools that run on its events.

use axum::extract::{Path, State};
use axum::response::Redirect;
use maud::{Markup, html};
use pulse_shared::domain::{Role, SubscriptionId, ToolName, builtin_tools};
use pulse_shared::engine;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, badge, button, empty};
use crate::{Dashboard, Problem};

/// Messages and memories shown.
const ROWS: usize = 100;

/// `GET /ui/agents/{id}/conversation`: the latest messages, oldest first, with who spoke
/// — the user, the conversation's reply, or a heartbeat's thought a reply came from.
pub(crate) async fn conversation(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let mut messages = d.0.store.recent_messages(&agent.id, ROWS).await?;
    messages.reverse();
    // The tools a reply's turn used (remember, recall), shown under the reply.
    let turns = d.0.store.list_turns(&agent.id, ROWS).await?;
    let tools_of = |m: &pulse_shared::domain::ConversationMessage| -> Vec<String> {
        if m.role != Role::Assistant || m.source == "heartbeat" {
            return Vec::new();
        }
        turns
            .iter()
            .find(|t| t.id == m.turn_id)
            .map(|t| {
                t.steps
                    .iter()
                    .filter(|s| s["kind"] == "tool")
                    .map(|s| format!("{} {}", s["name"].as_str().unwrap_or("?"), s["input"]))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(agent_page(
        &agent,
        Tab::Conversation,
        html! {
            @if messages.is_empty() {
                (empty("No conversation yet. Say something as if from Discord with", &format!("pulse say --agent {} \"hello\"", agent.id)))
            }
            @for m in &messages {
                @let who = match (m.role, m.source.as_str()) {
                    (Role::User, _) => format!("user{}", m.author.as_deref().map(|a| format!(" ({a})")).unwrap_or_default()),
                    (_, "heartbeat") => "heartbeat thought".to_owned(),
                    _ => format!("{} reply", m.agent.as_deref().unwrap_or("agent")),
                };
                div.card {
                    p.muted { strong { (who) } " · " (ago(now, Some(m.created_at))) }
                    p { (m.content) }
                    @for used in tools_of(m) { p.muted { "used " code { (used) } } }
                }
            }
        },
    ))
}

/// `GET /ui/agents/{id}/memories`.
pub(crate) async fn memories(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let memories = d.0.store.memories(&agent.id, ROWS).await?;
    Ok(agent_page(
        &agent,
        Tab::Memories,
        html! {
            @if memories.is_empty() {
                (empty("No memories yet: the heartbeat agent and the conversation keep them with their remember tool; list them with", &format!("pulse memories list --agent {}", agent.id)))
            } @else {
                div.scroll { table {
                    thead { tr { th { "Memory" } th { "When" } th { "Kept by" } } }
                    tbody { @for m in &memories { tr {
                        td.wrap { (m.text) }
                        td { (ago(now, Some(m.created_at))) }
                        td { @if let Some(h) = &m.heartbeat_id {
                            "heartbeat " a href={"/ui/agents/" (agent.id) "/heartbeats/" (h.beat())} { "#" (h.beat()) }
                        } @else { "conversation" } }
                    } } }
                } }
            }
        },
    ))
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
    Ok(agent_page(
        &agent,
        Tab::Tools,
        html! {
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
                    } }
                    td.wrap { (t.description.clone().unwrap_or_default()) }
                    td { (switch(&d, &back, &format!("/ui/agents/{}/tools/{}", agent.id, t.name), t.active)) }
                } } }
            } }
        },
    ))
}
