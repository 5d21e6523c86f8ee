//! The agents page: every agent at a glance, create one, pause or resume.

use axum::Form;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use futures::StreamExt;
use maud::{Markup, html};
use pulse_shared::domain::{
    Agent, AgentState, AgentStates, Heartbeat, HeartbeatStatus, Interval, NewAgent,
};
use pulse_shared::engine::budget;
use pulse_shared::error::StoreError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::layout::{ago, badge, button, csrf, empty, page};
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
    let Listed {
        total,
        pages,
        at,
        states,
        rows,
    } = listed(&d, paging.page, now).await?;
    let rows: Vec<(&Agent, &Vec<Heartbeat>, &u64)> =
        rows.iter().map(|(a, r, s)| (a, r, s)).collect();
    let fleet = fleet_of(&states, &rows);
    Ok(page(
        "Agents",
        None,
        html! {
            h1 { "Agents" }
            @if !rows.is_empty() { (fleet_charts(&fleet)) }
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
                            td { (badge(a.state().as_str())) }
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

/// One page of the agents listing, with what each row shows.
struct Listed {
    total: usize,
    pages: usize,
    at: usize,
    /// How many agents are in each state (all of them).
    states: AgentStates,
    /// The page's agents, their latest heartbeats and today's tokens.
    rows: Vec<(Agent, Vec<Heartbeat>, u64)>,
}

/// Reads page `page` (from 1) of the agents, each with its latest heartbeats and today's
/// tokens (read a few at a time: on DynamoDB each is a request).
async fn listed(
    d: &Dashboard,
    page: Option<usize>,
    now: jiff::Timestamp,
) -> Result<Listed, Problem> {
    let wanted = page.unwrap_or(1).max(1);
    let mut listing =
        d.0.store
            .agents_page((wanted - 1) * PER_PAGE, PER_PAGE)
            .await?;
    let total = listing.states.total();
    let pages = total.div_ceil(PER_PAGE).max(1);
    let at = wanted.min(pages);
    if at != wanted {
        // Past the last page: show the last one.
        listing = d.0.store.agents_page((at - 1) * PER_PAGE, PER_PAGE).await?;
    }
    let shown = listing.agents;
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
    for (a, r) in shown.into_iter().zip(recent) {
        let (recent, spent) = r?;
        rows.push((a, recent, spent));
    }
    Ok(Listed {
        total,
        pages,
        at,
        states: listing.states,
        rows,
    })
}

/// What the agents page's charts draw.
#[derive(Serialize)]
pub(crate) struct Fleet {
    /// How many agents are in each state (all agents).
    states: BTreeMap<&'static str, usize>,
    /// How many of the page's agents failed their last heartbeat(s).
    failing: usize,
    /// Today's tokens of the page's agents, most first (at most 12): name, tokens, budget.
    tokens_today: Vec<(String, u64, Option<u64>)>,
}

fn fleet_of(states: &AgentStates, rows: &[(&Agent, &Vec<Heartbeat>, &u64)]) -> Fleet {
    let counts = AgentState::ALL
        .iter()
        .map(|s| (s.as_str(), states.of(*s)))
        .collect();
    let mut tokens: Vec<(String, u64, Option<u64>)> = rows
        .iter()
        .map(|(a, _, s)| (a.name.clone(), **s, a.budgets.daily_tokens))
        .collect();
    tokens.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    tokens.truncate(12);
    Fleet {
        states: counts,
        failing: rows
            .iter()
            .filter(|(_, r, _)| r.first().is_some_and(|h| h.consecutive_failures > 0))
            .count(),
        tokens_today: tokens,
    }
}

fn fleet_charts(f: &Fleet) -> Markup {
    use crate::charts::{Series, bars};
    let names: Vec<String> = f
        .tokens_today
        .iter()
        .map(|t| crate::layout::short(&t.0, 10))
        .collect();
    let tokens = [Series {
        name: "tokens today",
        color: "#4a6fa5",
        values: f.tokens_today.iter().map(|t| t.1 as f64).collect(),
    }];
    let states: Vec<String> = f
        .states
        .keys()
        .map(|s| (*s).to_owned())
        .chain(["failing".to_owned()])
        .collect();
    let counts = [Series {
        name: "agents",
        color: "#2f7d4f",
        values: f
            .states
            .values()
            .map(|n| *n as f64)
            .chain([f.failing as f64])
            .collect(),
    }];
    html! {
        div.charts {
            (bars("Agents by state", &states, &counts, None))
            (bars("Tokens today, the most spending agents", &names, &tokens, None))
        }
    }
}

/// `GET /ui/charts.json[?page=N]`: the numbers the agents page's charts draw.
pub(crate) async fn charts_json(
    State(d): State<Dashboard>,
    Query(paging): Query<Paging>,
) -> Result<axum::Json<Fleet>, Problem> {
    let l = listed(&d, paging.page, d.0.clock.now()).await?;
    let rows: Vec<(&Agent, &Vec<Heartbeat>, &u64)> =
        l.rows.iter().map(|(a, r, s)| (a, r, s)).collect();
    Ok(axum::Json(fleet_of(&l.states, &rows)))
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
