//! An agent's page: its tabs, and the forms that change, pause, resume or delete it —
//! through the engine's lifecycle operations.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use pulse_shared::domain::{
    ActiveHours, Agent, AgentChanges, EventType, HeartbeatStatus, Interval, ThinkPolicy,
    TimeZoneName,
};
use pulse_shared::engine::Toggled;
use pulse_shared::ports::EventQuery;
use serde::Deserialize;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, back_to, badge, button, csrf, empty, live_part, short};
use crate::{Dashboard, Problem};

/// Rows a tab shows.
const ROWS: usize = 100;

/// `?partial=1`: only the part a live update swaps.
#[derive(Deserialize, Default)]
pub(crate) struct View {
    #[serde(default)]
    partial: Option<u8>,
    /// Events: only these types, comma-separated.
    #[serde(default, rename = "type")]
    types: Option<String>,
}

impl View {
    /// Whether only the live part is asked for.
    pub(crate) fn is_partial(&self) -> bool {
        self.partial.is_some()
    }
}

/// `GET /ui/agents/{id}`: its first tab. Anything but an agent id (a CR/LF in the path
/// included) is not found, never echoed into a header.
pub(crate) async fn home(Path(id): Path<String>) -> Result<Redirect, Problem> {
    let id = pulse_shared::domain::AgentId::parse(&id)
        .map_err(|_| Problem::NotFound(format!("agent {}", id.escape_debug())))?;
    Ok(Redirect::to(&format!("/ui/agents/{id}/heartbeats")))
}

/// A tab's body, or only its live part when asked.
fn tab(agent: &Agent, tab: Tab, view: &View, part: Markup, around: Markup) -> Markup {
    if view.is_partial() {
        return part;
    }
    agent_page(agent, tab, html! { (around) (part) })
}

/// `GET /ui/agents/{id}/heartbeats`: the timeline, refreshed when a heartbeat changes.
pub(crate) async fn heartbeats(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<View>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let hbs = d.0.store.list_heartbeats(&agent.id, ROWS).await?;
    let url = format!("/ui/agents/{}/heartbeats?partial=1", agent.id);
    let part = live_part(
        "heartbeats",
        &url,
        "heartbeats",
        html! {
                @if hbs.is_empty() {
                    (empty("No heartbeats yet: one is due as soon as `pulse serve` (or the sweeper) runs.", "pulse serve"))
                } @else {
                    div.scroll { table {
                        thead { tr { th { "Beat" } th { "Status" } th { "Scheduled" } th { "Completed" }
                            th { "Events" } th { "Actions" } th { "Failed" } th { "Outcome" } th { "Thinking" } th { "Error" } } }
                        tbody { @for h in &hbs { tr {
                            td { a href={"/ui/agents/" (agent.id) "/heartbeats/" (h.beat)} { "#" (h.beat) } }
                            td { (badge(h.status.as_str())) }
                            td { (ago(now, Some(h.scheduled_at))) }
                            td { (ago(now, h.completed_at)) }
                            td { (h.events_processed) }
                            td { (h.actions_triggered) }
                            td { (h.actions_failed) }
                            td.wrap { @if let Some(o) = &h.outcome {
                                (badge(o.kind.as_str())) " " span.muted { (short(&o.reason, 80)) }
                            } }
                            td.wrap.muted { (h.thinking().map(|t| short(&t, 80)).unwrap_or_default()) }
                            td.wrap {
                                @if let (HeartbeatStatus::Executing, Some(until)) = (h.status, h.lease_until) {
                                    "running since " (ago(now, h.started_at)) "; if its worker stopped, retried " (ago(now, Some(until))) " "
                                    (button(&d, &format!("/ui/agents/{}/heartbeats/{}/cancel", agent.id, h.beat), "Stop", "quiet", &format!("/ui/agents/{}/heartbeats", agent.id)))
                                } @else {
                                    (h.error.as_deref().map(|e| short(e, 120)).unwrap_or_default())
                                }
                            }
                        } } }
                    } }
                }
        },
    );
    let around = match view.is_partial() {
        true => html! {},
        false => charts_part(&d, &agent).await?,
    };
    Ok(tab(&agent, Tab::Heartbeats, &view, part, around))
}

/// The agent's charts, redrawn when a heartbeat changes.
async fn charts_part(d: &Dashboard, agent: &Agent) -> Result<Markup, Problem> {
    let days = crate::charts::agent_days(d.0.store.as_ref(), agent, d.0.clock.now()).await?;
    Ok(live_part(
        "charts",
        &format!("/ui/agents/{}/charts", agent.id),
        "heartbeats",
        crate::charts::agent_charts(&days),
    ))
}

/// `GET /ui/agents/{id}/charts`: the charts alone (what the live update swaps).
pub(crate) async fn charts(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    charts_part(&d, &agent).await
}

/// `GET /ui/agents/{id}/charts.json`: the numbers the agent's charts draw.
pub(crate) async fn charts_json(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<axum::Json<crate::charts::AgentDays>, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    Ok(axum::Json(
        crate::charts::agent_days(d.0.store.as_ref(), &agent, now).await?,
    ))
}

/// `GET /ui/agents/{id}/events`: the log, newest first, filtered by type, with parents.
pub(crate) async fn events(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<View>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let typed = view.types.clone().unwrap_or_default();
    let types = typed
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(EventType::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Problem::Invalid(e.to_string()))?;
    let query = EventQuery {
        types,
        limit: ROWS,
        ..EventQuery::default()
    };
    let mut events = d.0.store.query_events(&agent.id, &query).await?;
    events.reverse();
    let filter = html! {
        form.card method="get" action={"/ui/agents/" (agent.id) "/events"} {
            label for="type" { "Types " }
            input #type name="type" value=(typed) placeholder="NOTE,SUMMARY";
            " " button.quiet type="submit" { "Filter" }
        }
    };
    let url = format!("/ui/agents/{}/events?partial=1&type={typed}", agent.id);
    let part = live_part(
        "events",
        &url,
        "events",
        html! {
                @if events.is_empty() {
                    (empty("No events yet. Send one with", &format!("pulse events emit --agent {} --type NOTE --payload '{{\"text\": \"hi\"}}'", agent.id)))
                } @else {
                    div.scroll { table {
                        thead { tr { th { "Type" } th { "When" } th { "Source" } th { "Parent" } th { "Payload" } } }
                        tbody { @for e in &events { tr id=(e.id) {
                            td { code { (e.event_type) } }
                            td { (ago(now, Some(e.created_at))) }
                            td { (e.source) }
                            td { @if let Some(p) = &e.parent_id { a href={"#" (p)} { "parent" } } }
                            td.wrap { code { (short(&e.payload.to_string(), 160)) } }
                        } } }
                    } }
                }
        },
    );
    Ok(tab(&agent, Tab::Events, &view, part, filter))
}

/// `GET /ui/agents/{id}/actions`.
pub(crate) async fn actions(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<View>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    let actions =
        pulse_shared::engine::actions::recent(d.0.store.as_ref(), &agent.id, ROWS).await?;
    let url = format!("/ui/agents/{}/actions?partial=1", agent.id);
    let part = live_part(
        "actions",
        &url,
        "heartbeats",
        html! {
                @if actions.is_empty() {
                    (empty("No actions yet: tools run when a heartbeat reads an event they are subscribed to.", "pulse subscriptions list"))
                } @else {
                    div.scroll { table {
                        thead { tr { th { "Tool" } th { "Beat" } th { "Status" } th { "Try" } th { "Started" } th { "Took" } th { "Error" } th {} } }
                        tbody { @for a in &actions {
                            tr {
                                td { (a.label()) }
                                td { a href={"/ui/agents/" (agent.id) "/heartbeats/" (a.heartbeat_id.beat())} { "#" (a.heartbeat_id.beat()) } }
                                td { (badge(a.status.as_str())) }
                                td { (a.attempt) }
                                td { (ago(now, Some(a.started_at))) }
                                td { (a.duration_ms.map(|ms| format!("{ms} ms")).unwrap_or_default()) }
                                td.wrap { (a.error.as_deref().map(|e| short(e, 120)).unwrap_or_default()) }
                                td {
                                    // A finished action of a tool (not the heartbeat agent's run, nor a model's call) can run again.
                                    @if a.status.is_final() && a.call.is_none() && a.tool.as_str() != pulse_shared::domain::HEARTBEAT_AGENT {
                                        (button(&d, &format!("/ui/agents/{}/actions/{}/retry", agent.id, a.id), "Retry", "quiet", &format!("/ui/agents/{}/actions", agent.id)))
                                    }
                                    // Nobody knows whether it was done: the operator, who can look, says.
                                    @if a.status == pulse_shared::domain::ActionStatus::Unknown {
                                        (button(&d, &format!("/ui/agents/{}/actions/{}/resolve/succeeded", agent.id, a.id), "It was done", "quiet", &format!("/ui/agents/{}/actions", agent.id)))
                                        (button(&d, &format!("/ui/agents/{}/actions/{}/resolve/failed", agent.id, a.id), "It was not", "quiet", &format!("/ui/agents/{}/actions", agent.id)))
                                    }
                                }
                            }
                        } }
                    } }
                }
        },
    );
    Ok(tab(&agent, Tab::Actions, &view, part, html! {}))
}

/// `GET /ui/agents/{id}/settings`: change, pause or resume, delete.
pub(crate) async fn settings(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let here = format!("/ui/agents/{}/settings", agent.id);
    let costs = costs(&d, &agent).await?;
    let now = d.0.clock.now();
    Ok(agent_page(
        &agent,
        Tab::Settings,
        html! {
            h2 { "Settings" }
            @if let Some(a) = &agent.applied {
                p.applied {
                    "Kept as files in " code { (a.dir) }
                    @if let Some(source) = &a.source { " (" code { (source) } ")" }
                    ", last applied " (ago(now, Some(a.at))) ". A change made here is drift: "
                    code { "pulse apply --check " (a.dir) } " shows it, and the next "
                    code { "pulse apply" } " puts the files' settings back."
                }
            }
            form.grid.card method="post" action={"/ui/agents/" (agent.id) "/update"} {
                (csrf(&d))
                label for="name" { "Name" }
                input #name name="name" value=(agent.name) required maxlength="100";
                label for="interval" { "Interval" }
                input #interval name="interval" value=(agent.interval.to_string());
                label for="active_hours" { "Active hours" }
                input #active_hours name="active_hours" placeholder="09:00-18:00, or empty for always"
                    value=(agent.active_hours.map(|h| h.to_string()).unwrap_or_default());
                label for="timezone" { "Time zone" }
                input #timezone name="timezone" value=(agent.timezone.to_string());
                label for="persona" { "Persona" }
                textarea #persona name="persona" rows="4" maxlength="16000" placeholder="Who the agent is: the system prompt's first part" { (agent.persona.clone().unwrap_or_default()) }
                label for="instructions" { "Instructions" }
                textarea #instructions name="instructions" rows="6" maxlength="16000" placeholder="What to do on waking. Tasks with cadences: ## Inbox (every 4h), ## Plan (cron 0 8 * * MON-FRI), ## Builds (on ci.failed), ## Check in (when silent 2d)" { (agent.instructions.clone().unwrap_or_default()) }
                label for="think" { "Think" }
                input #think name="think" value=(agent.think.to_string()) title="auto (new events or a heartbeat task due), events, always, or every:N";
                label for="vision" { "Images to the model" }
                select #vision name="vision" {
                    @for (value, label) in [("auto", "auto: if the model takes them"), ("on", "on"), ("off", "off: as [image: URL] text")] {
                        @let chosen = match agent.llm.vision { Some(true) => "on", Some(false) => "off", None => "auto" };
                        option value=(value) selected[chosen == value] { (label) }
                    }
                }
                label for="daily_tokens" { "Daily tokens" }
                input #daily_tokens name="daily_tokens" inputmode="numeric" placeholder="no daily budget"
                    value=(agent.budgets.daily_tokens.map(|n| n.to_string()).unwrap_or_default());
                label for="usd_day" { "Dollars a day" }
                input #usd_day name="usd_day" inputmode="decimal" placeholder="no dollar budget"
                    value=(agent.budgets.usd_day.map(|u| format!("{:.2}", u.dollars())).unwrap_or_default());
                label for="usd_month" { "Dollars a month" }
                input #usd_month name="usd_month" inputmode="decimal" placeholder="no dollar budget"
                    value=(agent.budgets.usd_month.map(|u| format!("{:.2}", u.dollars())).unwrap_or_default());
                label for="max_beats_per_hour" { "Max beats an hour" }
                input #max_beats_per_hour name="max_beats_per_hour" inputmode="numeric"
                    placeholder={"default (" (agent.beat_cap()) ")"}
                    value=(agent.budgets.max_beats_per_hour.map(|n| n.to_string()).unwrap_or_default());
                span {}
                button type="submit" { "Save" }
            }
            (costs)
            h2 { "Heartbeats" }
            div.card {
                @if agent.is_paused() {
                    p { "Paused " (ago(d.0.clock.now(), agent.paused_at)) ": no heartbeats run; its user is still answered." }
                    (button(&d, &format!("/ui/agents/{}/resume", agent.id), "Resume", "", &here))
                } @else {
                    @if let Some(until) = agent.snoozed_until {
                        p { "Snoozed: its own heartbeats wait until " (ago(d.0.clock.now(), Some(until))) " (reminders still wake it)." }
                        (button(&d, &format!("/ui/agents/{}/resume", agent.id), "Resume", "", &here))
                    } @else {
                        p { "Active. Pausing stops its heartbeats (one running finishes); its user is still answered." }
                    }
                    (button(&d, &format!("/ui/agents/{}/wake", agent.id), "Wake now", "", &here))
                    " "
                    form.inline method="post" action={"/ui/agents/" (agent.id) "/snooze"} {
                        (csrf(&d))
                        input type="hidden" name="back" value=(here);
                        input.short name="length" value="2h" aria-label="Snooze for" title="a minute to 30 days: 30m, 2h, 1d";
                        " " button.quiet type="submit" { "Snooze" }
                    }
                    " "
                    (button(&d, &format!("/ui/agents/{}/pause", agent.id), "Pause", "quiet", &here))
                }
            }
            h2 { "Delete" }
            form.card method="post" action={"/ui/agents/" (agent.id) "/delete"}
                data-confirm={"Delete " (agent.name) " and everything it owns?"} {
                (csrf(&d))
                p { "Deleting removes the agent and everything it owns: heartbeats, events, actions, conversation, memories, webhooks (their URLs then answer 404), hooks and their deliveries, its own subscriptions and its Discord channel binding. It cannot be undone." }
                label for="confirm" { "Type the agent's name to confirm: " }
                input #confirm name="confirm" autocomplete="off" required;
                " " button.danger type="submit" { "Delete" }
            }
        },
    ))
}

#[derive(Deserialize)]
pub(crate) struct UpdateForm {
    name: String,
    interval: String,
    #[serde(default)]
    active_hours: String,
    timezone: String,
    #[serde(default)]
    instructions: String,
    /// Absent: unchanged; empty: none.
    #[serde(default)]
    persona: Option<String>,
    #[serde(default)]
    think: String,
    /// `auto`, `on` or `off`; absent: unchanged.
    #[serde(default)]
    vision: Option<String>,
    /// Absent: unchanged; empty: no daily budget.
    #[serde(default)]
    daily_tokens: Option<String>,
    /// Absent: unchanged; empty: the default cap.
    #[serde(default)]
    max_beats_per_hour: Option<String>,
    /// Absent: unchanged; empty: no dollar budget.
    #[serde(default)]
    usd_day: Option<String>,
    /// Absent: unchanged; empty: no dollar budget.
    #[serde(default)]
    usd_month: Option<String>,
}

/// An optional dollar budget from a form field: empty for none.
fn optional_usd(v: &str, what: &str) -> Result<Option<pulse_shared::domain::Usd>, Problem> {
    match v.trim() {
        "" => Ok(None),
        v => pulse_shared::domain::Usd::parse_budget(v)
            .map(Some)
            .map_err(|e| Problem::Invalid(format!("{what}: {e}, or leave it empty"))),
    }
}

/// The last seven days' model costs of `agent`: what it spent, what share of its prompts
/// the provider's cache read, and what that saved.
async fn costs(d: &Dashboard, agent: &Agent) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let since = now - jiff::SignedDuration::from_hours(24 * 7);
    let report = pulse_shared::engine::usage(d.0.store.as_ref(), agent, since, &d.0.prices).await?;
    let rows = &report.models;
    let calls: u64 = rows.iter().map(|r| r.calls).sum();
    let input: u64 = rows.iter().map(|r| r.input_tokens).sum();
    let read: u64 = rows.iter().map(|r| r.cache_read_tokens).sum();
    let cost: Option<f64> = rows.iter().map(|r| r.cost_usd).sum();
    let saved: f64 = rows.iter().filter_map(|r| r.saved_usd).sum();
    let usd = |c: f64| {
        if c > 0.0 && c < 0.01 {
            format!("${c:.4}")
        } else {
            format!("${c:.2}")
        }
    };
    Ok(html! {
        h2 { "Model costs" }
        div.card #costs {
            @if calls == 0 {
                p { "No model calls in the last 7 days." }
            } @else {
                p {
                    "Last 7 days: " (calls) @if calls == 1 { " model call, " } @else { " model calls, " }
                    @match cost {
                        Some(c) => { strong { (usd(c)) } }
                        None => { "a cost unknown (a model the price table does not know)" }
                    }
                    ". "
                    @if read > 0 {
                        (format!("{:.0}", read as f64 * 100.0 / input.max(1) as f64)) " % of prompt tokens read from the provider's cache, saving about " (usd(saved)) "."
                    } @else {
                        "No prompt tokens read from the provider's cache."
                    }
                }
                p.muted { "At list prices (PULSE_PRICES overrides them); " code { "pulse usage --by action" } " lists each run and turn." }
            }
        }
    })
}

/// An optional whole number from a form field: empty for none.
fn optional_number<T: std::str::FromStr>(v: &str, what: &str) -> Result<Option<T>, Problem> {
    match v.trim() {
        "" => Ok(None),
        n => n.parse().map(Some).map_err(|_| {
            Problem::Invalid(format!("{what}: give a whole number, or leave it empty"))
        }),
    }
}

/// `POST /ui/agents/{id}/update`.
pub(crate) async fn update(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<UpdateForm>,
) -> Result<Response, Problem> {
    let agent = agent_of(&d, &id).await?;
    let invalid = |e: pulse_shared::error::ValidationError| Problem::Invalid(e.to_string());
    let changes = AgentChanges {
        name: Some(f.name),
        interval: Some(f.interval.trim().parse::<Interval>().map_err(invalid)?),
        active_hours: Some(match f.active_hours.trim() {
            "" | "always" => None,
            h => Some(h.parse::<ActiveHours>().map_err(invalid)?),
        }),
        timezone: Some(TimeZoneName::parse(f.timezone.trim()).map_err(invalid)?),
        instructions: Some(Some(f.instructions.trim().to_owned()).filter(|i| !i.is_empty())),
        persona: f
            .persona
            .map(|p| Some(p.trim().to_owned()).filter(|p| !p.is_empty())),
        think: match f.think.trim() {
            "" => None,
            t => Some(ThinkPolicy::parse(t).map_err(invalid)?),
        },
        vision: match f.vision.as_deref().map(str::trim) {
            None => None,
            Some("auto") => Some(None),
            Some("on") => Some(Some(true)),
            Some("off") => Some(Some(false)),
            Some(other) => {
                return Err(Problem::Invalid(format!(
                    "images to the model: {other:?} is not auto, on or off"
                )));
            }
        },
        daily_tokens: f
            .daily_tokens
            .map(|v| optional_number(&v, "daily tokens"))
            .transpose()?,
        max_beats_per_hour: f
            .max_beats_per_hour
            .map(|v| optional_number(&v, "max beats an hour"))
            .transpose()?,
        usd_day: f
            .usd_day
            .map(|v| optional_usd(&v, "dollars a day"))
            .transpose()?,
        usd_month: f
            .usd_month
            .map(|v| optional_usd(&v, "dollars a month"))
            .transpose()?,
        ..AgentChanges::default()
    };
    d.0.lifecycle.update(&agent.id, &changes).await?;
    Ok(Redirect::to(&format!("/ui/agents/{}/settings", agent.id)).into_response())
}

#[derive(Deserialize)]
pub(crate) struct Back {
    #[serde(default)]
    back: Option<String>,
}

/// `POST /ui/agents/{id}/pause`.
pub(crate) async fn pause(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let _: Toggled = d.0.lifecycle.pause(&agent.id).await?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

/// `POST /ui/agents/{id}/heartbeats/{beat}/cancel`: asks the running heartbeat to stop.
pub(crate) async fn cancel(
    State(d): State<Dashboard>,
    Path((id, beat)): Path<(String, u64)>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let hb = pulse_shared::domain::HeartbeatId::new(agent.id.clone(), beat);
    d.0.lifecycle.cancel_heartbeat(&hb).await?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

/// `POST /ui/agents/{id}/actions/{action}/retry`: runs a finished action again, as its
/// next attempt, and comes back when it is done.
pub(crate) async fn retry(
    State(d): State<Dashboard>,
    Path((id, action)): Path<(String, String)>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let action = pulse_shared::domain::ActionId::parse(&action)
        .map_err(|_| Problem::NotFound(format!("action {}", action.escape_debug())))?;
    d.0.runner
        .retry_action(&agent.id, &action)
        .await
        .map_err(|e| match e {
            pulse_shared::engine::RetryError::Invalid(v) => Problem::Invalid(v.message),
            pulse_shared::engine::RetryError::Failed(pulse_shared::error::EngineError::Store(
                e,
            )) => Problem::Store(e),
            pulse_shared::engine::RetryError::Failed(e) => {
                Problem::Invalid(format!("the retry did not run: {e}"))
            }
        })?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

/// `POST /ui/agents/{id}/actions/{action}/resolve/{as}`: settles an UNKNOWN action as
/// `succeeded` or `failed`, as `pulse actions resolve` does.
pub(crate) async fn resolve(
    State(d): State<Dashboard>,
    Path((id, action, to)): Path<(String, String, String)>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let succeeded = match to.as_str() {
        "succeeded" => true,
        "failed" => false,
        _ => return Err(Problem::NotFound(format!("outcome {}", to.escape_debug()))),
    };
    let missing = || Problem::NotFound(format!("action {}", action.escape_debug()));
    let id = pulse_shared::domain::ActionId::parse(&action).map_err(|_| missing())?;
    let found = pulse_shared::engine::actions::find(d.0.store.as_ref(), &agent.id, &id)
        .await?
        .ok_or_else(missing)?;
    pulse_shared::engine::actions::settle(d.0.store.as_ref(), &found, succeeded, d.0.clock.now())
        .await
        .map_err(|e| match e {
            pulse_shared::engine::actions::SettleError::NotUnknown(why) => Problem::Invalid(why),
            pulse_shared::engine::actions::SettleError::Store(e) => Problem::Store(e),
        })?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

/// `POST /ui/agents/{id}/wake`: a heartbeat due now (none more if one is due or running).
pub(crate) async fn wake(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    d.0.lifecycle.wake(&agent.id).await?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

#[derive(Deserialize)]
pub(crate) struct SnoozeForm {
    #[serde(default)]
    length: String,
    #[serde(default)]
    back: Option<String>,
}

/// `POST /ui/agents/{id}/snooze`.
pub(crate) async fn snooze(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<SnoozeForm>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let length = pulse_shared::domain::parse_duration("snooze", &f.length)
        .map_err(|e| Problem::Invalid(format!("{}; e.g. 2h", e.message)))?;
    d.0.lifecycle.snooze(&agent.id, length).await?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

/// `POST /ui/agents/{id}/resume`.
pub(crate) async fn resume(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<Back>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let _: Toggled = d.0.lifecycle.resume(&agent.id).await?;
    Ok(Redirect::to(&back_to(f.back.as_deref(), "/ui/")))
}

#[derive(Deserialize)]
pub(crate) struct DeleteForm {
    #[serde(default)]
    confirm: String,
}

/// `POST /ui/agents/{id}/delete`: only when the agent's name was typed.
pub(crate) async fn delete(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<DeleteForm>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    if f.confirm.trim() != agent.name {
        return Err(Problem::Invalid(format!(
            "not deleted: type the agent's name ({}) to confirm",
            agent.name
        )));
    }
    d.0.lifecycle.delete(&agent.id, true).await?;
    Ok(Redirect::to("/ui/"))
}
