//! The agents page: every agent at a glance, create one, pause or resume.

use axum::Form;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use futures::StreamExt;
use maud::{Markup, html};
use pulse_shared::domain::{Agent, Heartbeat, HeartbeatStatus, Interval, NewAgent};
use pulse_shared::engine::budget;
use pulse_shared::error::StoreError;
use serde::Deserialize;

use crate::layout::{ago, badge, button, csrf, empty, page, status};
use crate::{Dashboard, Problem};

/// Agents per page.
const PER_PAGE: usize = 100;

/// `?page=N` (from 1).
#[derive(Deserialize, Default)]
pub(crate) struct Paging {
    #[serde(default)]
    page: Option<usize>,
}

/// `GET /ui/`: a hundred agents a page, each with its latest heartbeats (read a few at a
/// time: on DynamoDB each is a request).
pub(crate) async fn list(
    State(d): State<Dashboard>,
    Query(paging): Query<Paging>,
) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let agents = d.0.store.list_agents().await?;
    let total = agents.len();
    let pages = total.div_ceil(PER_PAGE).max(1);
    let at = paging.page.unwrap_or(1).clamp(1, pages);
    let shown: Vec<Agent> = agents
        .into_iter()
        .skip((at - 1) * PER_PAGE)
        .take(PER_PAGE)
        .collect();
    type Row = Result<(Vec<Heartbeat>, u64), StoreError>;
    let recent: Vec<Row> = futures::stream::iter(shown.iter().cloned())
        .map(|a| {
            let store = d.0.store.clone();
            async move {
                let (recent, today) = futures::try_join!(
                    store.list_heartbeats(&a.id, 2),
                    budget::spent_today(store.as_ref(), &a, now)
                )?;
                Ok((recent, today.spent))
            }
        })
        .buffered(16)
        .collect()
        .await;
    let mut rows = Vec::with_capacity(shown.len());
    for (a, r) in shown.iter().zip(recent) {
        let (recent, spent) = r?;
        rows.push((a, recent, spent));
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
                        th { "Next due" } th { "Failures in a row" } th { "Tokens today" } th {}
                    } }
                    tbody { @for (a, recent, spent) in &rows {
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
                                (spent)
                                @if let Some(n) = a.budgets.daily_tokens {
                                    span.muted { " / " (n) }
                                }
                            }
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
                @if pages > 1 {
                    p {
                        @if at > 1 { a href={"/ui/?page=" (at - 1)} { "← previous" } " " }
                        span.muted { "page " (at) " of " (pages) " (" (total) " agents)" }
                        @if at < pages { " " a href={"/ui/?page=" (at + 1)} { "next →" } }
                    }
                }
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
