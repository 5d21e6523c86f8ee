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

use jiff::Timestamp;
use serde_json::json;
use tracing::info;

use crate::domain::{
    Agent, AgentId, Event, EventCursor, EventId, SCHEDULED, Schedule, ScheduleRule,
};
use crate::error::StoreError;
use crate::ports::Store;

/// What a wake did: the SCHEDULED events to process, and the agent's next wake.
pub(crate) struct Woken {
    pub(crate) events: Vec<Event>,
    pub(crate) next_wake: Option<Timestamp>,
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

/// The SCHEDULED event of `schedule` due at `due`, dated at `at`.
fn scheduled_event(agent: &Agent, schedule: &Schedule, due: Timestamp, at: Timestamp) -> Event {
    let ms = at.as_millisecond().max(0) as u64;
    let due_ms = due.as_millisecond().to_string();
    let rule = match &schedule.rule {
        ScheduleRule::Once { .. } => json!({"once": due}),
        ScheduleRule::Cron { pattern, timezone } => {
            json!({"cron": pattern, "timezone": timezone.as_str()})
        }
    };
    let mut event = super::budget::system_event(
        agent,
        SCHEDULED,
        EventId::derived(ms, &["scheduled", schedule.id.as_str(), &due_ms]),
        json!({
            "schedule_id": schedule.id,
            "note": schedule.note,
            "due_at": due,
            "rule": rule,
        }),
        at,
    );
    event.source = "schedule".to_owned();
    event
}

/// Wakes `agent`'s schedules due by `now`, in a heartbeat whose window is
/// `(start, end]`: appends their SCHEDULED events, dated inside that window, moves the
/// schedules on, and stores the agent's next wake.
pub(crate) async fn wake(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
    start: &EventCursor,
    end: &EventCursor,
) -> Result<Woken, StoreError> {
    let schedules = store.schedules(&agent.id).await?;
    let (lo, hi) = (start.ms().saturating_add(1), end.ms());
    let mut events = Vec::new();
    for mut schedule in schedules {
        let Some(due) = schedule.next_at.filter(|t| *t <= now) else {
            continue;
        };
        let ms = (due.as_millisecond().max(0) as u64).clamp(lo.min(hi), hi);
        let at = Timestamp::from_millisecond(ms as i64).unwrap_or(due);
        let event = scheduled_event(agent, &schedule, due, at);
        store.append(&event).await?;
        info!(schedule_id = %schedule.id, due_at = %due, event_id = %event.id, "a schedule woke the agent");
        events.push(event);
        schedule.wakes = schedule.wakes.saturating_add(1);
        schedule.next_at = schedule.rule.next_after(now);
        match schedule.next_at {
            Some(_) => store.put_schedule(&schedule).await?,
            None => {
                store.delete_schedule(&agent.id, &schedule.id).await?;
            }
        }
    }
    let next_wake = refresh(store, &agent.id).await?;
    Ok(Woken { events, next_wake })
}
