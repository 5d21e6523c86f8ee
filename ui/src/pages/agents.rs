//! The agents page: every agent at a glance, create one, pause or resume.

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use pulse_shared::domain::{Heartbeat, HeartbeatStatus, Interval, NewAgent};
use serde::Deserialize;

use crate::layout::{ago, badge, button, csrf, empty, page, status};
use crate::{Dashboard, Problem};

/// `GET /ui/`.
pub(crate) async fn list(State(d): State<Dashboard>) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let agents = d.0.store.list_agents().await?;
    let mut rows = Vec::with_capacity(agents.len());
    for a in agents {
        let recent = d.0.store.list_heartbeats(&a.id, 2).await?;
        rows.push((a, recent));
    }
    Ok(page(
        "Agents",
        None,
        html! {
            h1 { "Agents" }
            @if rows.is_empty() {
                (empty("No agents yet: create one below, or from a terminal with", "pulse agents create --name scout"))
            } @else {
                div.scroll { table {
                    thead { tr {
                        th { "Name" } th { "Status" } th { "Beat" } th { "Last heartbeat" }
                        th { "Next due" } th { "Failures in a row" } th {}
                    } }
                    tbody { @for (a, recent) in &rows {
                        @let live = recent.first();
                        @let last = recent.iter().find(|h| h.completed_at.is_some());
                        tr {
                            td { a href={"/ui/agents/" (a.id) "/heartbeats"} { (a.name) } }
                            td { (badge(status(a))) }
                            td { (live.map_or(0, |h| h.beat)) }
                            td { (last_heartbeat(now, last)) }
                            td { (next_due(now, live)) }
                            td { (live.map_or(0, |h| h.consecutive_failures)) }
                            td {
                                @if a.is_paused() {
                                    (button(&d, &format!("/ui/agents/{}/resume", a.id), "Resume", "quiet", "/ui/"))
                                } @else {
                                    (button(&d, &format!("/ui/agents/{}/pause", a.id), "Pause", "quiet", "/ui/"))
                                }
                            }
                        }
                    } }
                } }
            }
            h2 { "Create an agent" }
            form.grid.card method="post" action="/ui/agents" {
                (csrf(&d))
                label for="name" { "Name" }
                input #name name="name" required maxlength="100";
                label for="interval" { "Interval" }
                input #interval name="interval" value="15m";
                label for="instructions" { "Instructions" }
                textarea #instructions name="instructions" rows="3" placeholder="What to look at on waking" {}
                span {}
                button type="submit" { "Create" }
            }
        },
    ))
}

fn last_heartbeat(now: jiff::Timestamp, last: Option<&Heartbeat>) -> Markup {
    match last {
        Some(h) => html! { (badge(h.status.as_str())) " " (ago(now, h.completed_at)) },
        None => html! { span.muted { "none yet" } },
    }
}

fn next_due(now: jiff::Timestamp, live: Option<&Heartbeat>) -> Markup {
    match live {
        Some(h) if h.status == HeartbeatStatus::Pending => ago(now, Some(h.scheduled_at)),
        Some(h) => badge(h.status.as_str()),
        None => html! { span.muted { "–" } },
    }
}

#[derive(Deserialize)]
pub(crate) struct CreateForm {
    name: String,
    interval: String,
    #[serde(default)]
    instructions: String,
}

/// `POST /ui/agents`.
pub(crate) async fn create(
    State(d): State<Dashboard>,
    Form(f): Form<CreateForm>,
) -> Result<Response, Problem> {
    let mut new = NewAgent::named(f.name);
    new.interval = f
        .interval
        .trim()
        .parse::<Interval>()
        .map_err(|e| Problem::Invalid(e.to_string()))?;
    new.instructions = Some(f.instructions.trim().to_owned()).filter(|i| !i.is_empty());
    let (agent, first) = new
        .create(d.0.clock.now())
        .map_err(|e| Problem::Invalid(e.to_string()))?;
    d.0.store.create_agent(&agent, &first).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/heartbeats", agent.id)).into_response())
}
