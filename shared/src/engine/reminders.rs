//! Reminders: an agent's schedules wake it beside its interval.
//!
//! A schedule's next wake is kept on the schedule, and the earliest of them on the agent
//! record ([`Agent::next_wake`]), which every heartbeat reads with its window anyway: a
//! heartbeat's finish files the next one no later than that ([`super::next_run`]), and
//! making a schedule pulls the agent's pending heartbeat forward. So a wake goes through
//! the same due index and conditional claim as every heartbeat: no timer of its own, no
//! other sweep, and an idle cycle reads nothing more.
//!
//! The heartbeat that runs at or after a wake ([`wake`]) appends one SCHEDULED event per
//! schedule due, with its note, and processes it like the events of its window; then it
//! moves each schedule on (a cron pattern to its next time, a one-time schedule is
//! removed) and stores the agent's next wake. The event's id is derived from the
//! schedule and the time it was due, and it is dated inside the heartbeat's window, so
//! a heartbeat run again finds it in its window rather than making another, and the
//! next heartbeat's window does not read it again.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::domain::{
    Agent, AgentId, Event, EventCursor, EventId, Expectation, HeartbeatStatus, SCHEDULE_MISSED,
    SCHEDULED, Schedule, ScheduleRule, TimeZoneName, ToolSpec, WAKE_REQUESTED, busiest_hour,
    parse_duration,
};
use crate::error::{StoreError, ValidationError, chain};
use crate::ports::{Reschedule, Store};

/// What a wake did: the SCHEDULED events to process, and the agent's next wake.
pub(crate) struct Woken {
    pub(crate) events: Vec<Event>,
    pub(crate) next_wake: Option<Timestamp>,
}

/// Why the `schedule` tool made nothing: what the model sees as the tool's error.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleToolError {
    /// The model's arguments do not name one time or pattern.
    #[error("{0}")]
    Input(String),
    /// The schedule was refused, or could not be stored.
    #[error("{}", chain(.0))]
    Made(#[from] MakeError),
}

/// Why a schedule was not made.
#[derive(Debug, thiserror::Error)]
pub enum MakeError {
    /// It is not a valid schedule, or would pass the breaker.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Bounds on an agent's schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleLimits {
    /// Most schedules one agent has (`PULSE_MAX_SCHEDULES`).
    pub max_per_agent: usize,
    /// How late a wake may still run: after downtime (a stopped serve, a paused agent, a
    /// failed sweep) a schedule runs once if its latest missed wake is this recent, and
    /// what it missed is recorded as a SCHEDULE_MISSED event, never skipped in silence.
    pub grace: SignedDuration,
}

impl Default for ScheduleLimits {
    fn default() -> Self {
        Self {
            max_per_agent: 100,
            grace: SignedDuration::from_hours(1),
        }
    }
}

/// What a schedule is to be: when, about what, what each run must do, and its name.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec {
    /// When it wakes the agent.
    pub rule: ScheduleRule,
    /// What it is about.
    pub note: Option<String>,
    /// What each heartbeat it wakes must do.
    pub expect: Option<Expectation>,
    /// Its name in the agent's `schedules.toml`.
    pub name: Option<String>,
}

impl ScheduleSpec {
    /// A schedule waking at `rule` about `note`, expecting nothing, unnamed.
    pub fn new(rule: ScheduleRule, note: Option<String>) -> Self {
        Self {
            rule,
            note,
            expect: None,
            name: None,
        }
    }
}

/// Makes a schedule for `agent` as `spec` says, expecting its `expect` of each heartbeat it wakes, and
/// stores its next wake: refused when it would never wake, when it is more than ten
/// years ahead, when its expectation's `alert_after` is out of range, when the agent has
/// `limits.max_per_agent` schedules already, or when the wakes of all its schedules
/// together, with the heartbeats the interval plans, would pass the breaker's cap in some
/// hour. The agent's pending heartbeat is pulled forward to the first wake when it is due
/// later (`pulled`); a running one is left to its finish.
pub async fn make(
    store: &dyn Store,
    agent: &Agent,
    spec: ScheduleSpec,
    now: Timestamp,
    limits: ScheduleLimits,
) -> Result<(Schedule, Option<Timestamp>), MakeError> {
    let schedule = Schedule::new(&agent.id, spec.rule, spec.note, now)?
        .expecting(spec.expect)?
        .named(spec.name);
    let existing = store.schedules(&agent.id).await?;
    if existing.len() >= limits.max_per_agent {
        return Err(ValidationError::new(
            "schedule",
            format!(
                "the agent has {} schedules, the most one may have (PULSE_MAX_SCHEDULES); delete some first (`pulse schedules list`, `pulse schedules delete`)",
                existing.len()
            ),
        )
        .into());
    }
    let mut rules: Vec<ScheduleRule> = existing.into_iter().map(|s| s.rule).collect();
    rules.push(schedule.rule.clone());
    let busiest = busiest_hour(&rules, now);
    let planned = agent.scheduled_beats_per_hour();
    let cap = agent.beat_cap();
    if busiest.saturating_add(planned) > cap {
        let what = match rules.len() {
            1 => "it wakes".to_owned(),
            n => format!("with the agent's other {} schedules, they wake", n - 1),
        };
        let beats = if planned == 1 {
            "heartbeat"
        } else {
            "heartbeats"
        };
        return Err(ValidationError::new(
            "schedule",
            format!(
                "{what} the agent up to {busiest} times in an hour; with the {planned} {beats} its interval plans, that passes the breaker's cap of {cap} an hour (raise it with --max-beats-per-hour, or wake less often)"
            ),
        )
        .into());
    }
    store.put_schedule(&schedule).await?;
    refresh(store, &agent.id).await?;
    let pulled = pull_forward(store, agent, schedule.next_at.unwrap_or(now)).await?;
    info!(agent_id = %agent.id, schedule_id = %schedule.id, next_at = ?schedule.next_at, pulled = ?pulled, "schedule made");
    Ok((schedule, pulled))
}

/// Moves the agent's pending heartbeat to `first` if it is due later; `None` when there
/// was nothing to move. The wake is not moved into the active hours: they bound the
/// agent's own initiative, not a reminder it was asked for.
pub(crate) async fn pull_forward(
    store: &dyn Store,
    agent: &Agent,
    first: Timestamp,
) -> Result<Option<Timestamp>, StoreError> {
    let Some(hb) = store.list_heartbeats(&agent.id, 1).await?.pop() else {
        return Ok(None);
    };
    if hb.status != HeartbeatStatus::Pending || hb.scheduled_at <= first {
        return Ok(None);
    }
    Ok(store
        .reschedule(&hb.id(), Reschedule::Due(first))
        .await?
        .map(|_| first))
}

/// The `schedule` tool the heartbeat agent and conversation turns offer the model.
pub fn tool_spec() -> ToolSpec {
    ToolSpec {
        name: "schedule".to_owned(),
        description: "Wake yourself later, e.g. for a reminder the user asked for: once at a time (`at`, RFC 3339 with an offset) or after a while (`in`: 30m, 2h, 1d), or on a cron pattern (`cron`: minute hour day-of-month month day-of-week, in `timezone`, default yours). The `note` comes back to you with the wake. With `action` \"list\", your reminders (id, when, next wake, note); with `action` \"cancel\", the one whose `schedule_id` is given, or whose note contains `note`.".to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["set", "list", "cancel"], "description": "set (the default), list or cancel"},
                "schedule_id": {"type": "string", "description": "The reminder to cancel (from list)"},
                "at": {"type": "string", "description": "e.g. 2026-11-25T09:00:00+01:00"},
                "in": {"type": "string", "description": "e.g. 90m"},
                "cron": {"type": "string", "description": "e.g. 0 9 * * MON-FRI"},
                "timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"},
                "note": {"type": "string", "description": "What to do or say when it wakes you"}
            }
        }),
    }
}

/// Runs the `schedule` tool for `agent`: the schedule made (none when it listed or
/// cancelled), and what the model reads.
pub async fn run_tool(
    store: &dyn Store,
    agent: &Agent,
    input: &Value,
    now: Timestamp,
    limits: ScheduleLimits,
) -> Result<(Option<Schedule>, Value), ScheduleToolError> {
    let text = |k: &str| {
        input
            .get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    let bad = |why: String| ScheduleToolError::Input(why);
    match text("action").unwrap_or("set") {
        "set" => {}
        "list" => {
            let listed = store.schedules(&agent.id).await.map_err(MakeError::from)?;
            return Ok((
                None,
                json!({"schedules": listed.iter().map(|s| listed_json(s, now)).collect::<Vec<_>>()}),
            ));
        }
        "cancel" => return cancel(store, agent, text("schedule_id"), text("note")).await,
        other => {
            return Err(bad(format!(
                "\"action\" {other:?}: give set, list or cancel"
            )));
        }
    }
    let rule = match (text("at"), text("in"), text("cron")) {
        (Some(at), None, None) => ScheduleRule::Once {
            at: at
                .parse::<Timestamp>()
                .map_err(|e| bad(format!("\"at\" {at:?}: {e}; give RFC 3339 with an offset")))?,
        },
        (None, Some(d), None) => {
            let d = parse_duration("in", d).map_err(|e| bad(e.to_string()))?;
            ScheduleRule::Once {
                at: now.saturating_add(d).unwrap_or(now),
            }
        }
        (None, None, Some(pattern)) => {
            let tz = match text("timezone") {
                Some(tz) => TimeZoneName::parse(tz).map_err(|e| bad(e.to_string()))?,
                None => agent.timezone.clone(),
            };
            ScheduleRule::cron(pattern, tz).map_err(|e| bad(e.to_string()))?
        }
        _ => {
            return Err(bad(
                "give exactly one of \"at\", \"in\" or \"cron\"".to_owned()
            ));
        }
    };
    let note = text("note").map(str::to_owned);
    let (schedule, _) = make(store, agent, ScheduleSpec::new(rule, note), now, limits).await?;
    let answer = json!({
        "scheduled": true,
        "schedule_id": schedule.id,
        "next_at": schedule.next_at,
    });
    Ok((Some(schedule), answer))
}

/// A schedule as the `schedule` tool lists it.
fn listed_json(s: &Schedule, now: Timestamp) -> Value {
    json!({
        "schedule_id": s.id,
        "rule": rule_json(&s.rule, s.next_at.unwrap_or(now)),
        "next_at": s.next_at,
        "note": s.note,
    })
}

/// Cancels the agent's schedule `id`, or the one whose note contains `note` (ignoring
/// case): refused, saying which, when none or several match.
async fn cancel(
    store: &dyn Store,
    agent: &Agent,
    id: Option<&str>,
    note: Option<&str>,
) -> Result<(Option<Schedule>, Value), ScheduleToolError> {
    let listed = store.schedules(&agent.id).await.map_err(MakeError::from)?;
    let found: Vec<&Schedule> = match (id, note) {
        (Some(id), _) => listed.iter().filter(|s| s.id.as_str() == id).collect(),
        (None, Some(note)) => {
            let note = note.to_lowercase();
            listed
                .iter()
                .filter(|s| {
                    s.note
                        .as_deref()
                        .is_some_and(|n| n.to_lowercase().contains(&note))
                })
                .collect()
        }
        (None, None) => {
            return Err(ScheduleToolError::Input(
                "to cancel, give \"schedule_id\" (from action list) or words of its \"note\""
                    .to_owned(),
            ));
        }
    };
    let schedule = match found.as_slice() {
        [one] => *one,
        [] => {
            return Err(ScheduleToolError::Input(format!(
                "no reminder matches{}; you have {}: use action list to see them",
                id.map(|i| format!(" the id {i}"))
                    .or_else(|| note.map(|n| format!(" the note {n:?}")))
                    .unwrap_or_default(),
                listed.len()
            )));
        }
        several => {
            let ids: Vec<&str> = several.iter().map(|s| s.id.as_str()).collect();
            return Err(ScheduleToolError::Input(format!(
                "{} reminders match that note ({}); cancel one by its schedule_id",
                several.len(),
                ids.join(", ")
            )));
        }
    };
    store
        .delete_schedule(&agent.id, &schedule.id)
        .await
        .map_err(MakeError::from)?;
    refresh(store, &agent.id).await.map_err(MakeError::from)?;
    info!(agent_id = %agent.id, schedule_id = %schedule.id, "schedule cancelled by the agent");
    Ok((
        None,
        json!({"cancelled": true, "schedule_id": schedule.id, "note": schedule.note}),
    ))
}

/// The earliest next wake of `schedules`.
pub fn earliest(schedules: &[Schedule]) -> Option<Timestamp> {
    schedules.iter().filter_map(|s| s.next_at).min()
}

/// Stores the agent's next wake from its schedules; returns it.
pub async fn refresh(store: &dyn Store, agent: &AgentId) -> Result<Option<Timestamp>, StoreError> {
    let next = earliest(&store.schedules(agent).await?);
    store.set_next_wake(agent, next).await?;
    Ok(next)
}

/// The SCHEDULED event of `schedule` due at `due`, dated at `at`. A schedule that
/// expects something of the heartbeat it wakes says what (`expect`, `alert_after`): the
/// heartbeat that processes the event is held to it.
fn scheduled_event(agent: &Agent, schedule: &Schedule, due: Timestamp, at: Timestamp) -> Event {
    let ms = at.as_millisecond().max(0) as u64;
    let due_ms = due.as_millisecond().to_string();
    let mut payload = json!({
        "schedule_id": schedule.id,
        "note": schedule.note,
        "due_at": due,
        "rule": rule_json(&schedule.rule, due),
    });
    if let Some(e) = schedule.expect {
        payload["expect"] = json!(e.must.as_str());
        payload["alert_after"] = json!(e.alert_after);
    }
    let mut event = super::budget::system_event(
        agent,
        SCHEDULED,
        EventId::derived(ms, &["scheduled", schedule.id.as_str(), &due_ms]),
        payload,
        at,
    );
    event.source = "schedule".to_owned();
    event
}

/// The SCHEDULE_MISSED event of `schedule`, whose wakes `missed` (in order) passed
/// without a run, dated at `at`.
fn missed_event(agent: &Agent, schedule: &Schedule, missed: &[Timestamp], at: Timestamp) -> Event {
    let ms = at.as_millisecond().max(0) as u64;
    let first = missed.first().copied().unwrap_or(at);
    let last = missed.last().copied().unwrap_or(at);
    let first_ms = first.as_millisecond().to_string();
    let mut event = super::budget::system_event(
        agent,
        SCHEDULE_MISSED,
        EventId::derived(ms, &["missed", schedule.id.as_str(), &first_ms]),
        json!({
            "schedule_id": schedule.id,
            "note": schedule.note,
            "missed": missed.len(),
            "first_missed_at": first,
            "last_missed_at": last,
            "rule": rule_json(&schedule.rule, first),
        }),
        at,
    );
    event.source = "schedule".to_owned();
    event
}

fn rule_json(rule: &ScheduleRule, due: Timestamp) -> Value {
    match rule {
        ScheduleRule::Once { .. } => json!({"once": due}),
        ScheduleRule::Cron { pattern, timezone } => {
            json!({"cron": pattern, "timezone": timezone.as_str()})
        }
    }
}

/// Most missed wakes of one schedule looked through (a minute's pattern over a long
/// outage has many).
const MISSED_SCAN: usize = 10_000;

/// Wakes `agent`'s schedules due by `now`, in a heartbeat whose window is
/// `(start, end]`: each due schedule runs once — a SCHEDULED event for its latest wake,
/// if that is within `limits.grace` — and the wakes before it (or all, past the grace)
/// are recorded in one SCHEDULE_MISSED event; the events are dated inside the window.
/// Then the schedules move on, and the agent's next wake is stored.
pub(crate) async fn wake(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
    start: &EventCursor,
    end: &EventCursor,
    limits: ScheduleLimits,
) -> Result<Woken, StoreError> {
    let mut schedules = store.schedules(&agent.id).await?;
    let (lo, hi) = (start.ms().saturating_add(1), end.ms());
    let dated = |t: Timestamp| {
        let ms = (t.as_millisecond().max(0) as u64).clamp(lo.min(hi), hi);
        Timestamp::from_millisecond(ms as i64).unwrap_or(t)
    };
    let mut events = Vec::new();
    for schedule in &mut schedules {
        let Some(due) = schedule.next_at.filter(|t| *t <= now) else {
            continue;
        };
        // Every wake from the one due up to now: the last runs, if it is recent enough.
        let mut wakes = vec![due];
        wakes.extend(schedule.rule.wakes_between(due, now, MISSED_SCAN));
        let latest = wakes.last().copied().unwrap_or(due);
        let runs = now.duration_since(latest) <= limits.grace;
        let missed = if runs {
            &wakes[..wakes.len() - 1]
        } else {
            &wakes[..]
        };
        if !missed.is_empty() {
            let event = missed_event(agent, schedule, missed, dated(missed[0]));
            store.append_in_session(&event).await?;
            warn!(schedule_id = %schedule.id, missed = missed.len(), first_missed_at = %missed[0], "a schedule's wakes passed without a run: recorded SCHEDULE_MISSED");
            events.push(event);
        }
        if runs {
            let event = scheduled_event(agent, schedule, latest, dated(latest));
            store.append_in_session(&event).await?;
            info!(schedule_id = %schedule.id, due_at = %latest, event_id = %event.id, "a schedule woke the agent");
            events.push(event);
            schedule.wakes = schedule.wakes.saturating_add(1);
        }
        schedule.next_at = schedule.rule.next_after(now);
        match schedule.next_at {
            Some(_) => store.put_schedule(schedule).await?,
            None => {
                store.delete_schedule(&agent.id, &schedule.id).await?;
            }
        }
    }
    // Woken with no schedule due: its user asked for this heartbeat (a trigger).
    if events.is_empty() {
        let at = dated(now);
        let ms = at.as_millisecond().max(0) as u64;
        let wake_ms = agent.next_wake.unwrap_or(now).as_millisecond().to_string();
        let mut event = super::budget::system_event(
            agent,
            WAKE_REQUESTED,
            EventId::derived(ms, &["wake", agent.id.as_str(), &wake_ms]),
            json!({"requested_for": agent.next_wake}),
            at,
        );
        event.source = "user".to_owned();
        store.append_in_session(&event).await?;
        info!(event_id = %event.id, "the agent was asked to wake now");
        events.push(event);
    }
    // The schedules as they are now: no need to read them again.
    let next_wake = earliest(&schedules);
    store.set_next_wake(&agent.id, next_wake).await?;
    Ok(Woken { events, next_wake })
}
