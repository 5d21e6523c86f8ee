//! Auto-pause: an agent whose user has been silent longer than its `--auto-pause-after`
//! (30 days unless set; `off` never) stops beating on its own, and the user's next
//! message, on any channel, brings it back.
//!
//! The heartbeat that finds the silence marks the agent (`auto_paused_since`: when its
//! user last wrote), records AGENT_AUTO_PAUSED in its log and as a hook, and is put off
//! to the agent's next reminder — reminders the user set still fire — or else a year
//! ahead. Each later heartbeat a reminder brings is put off the same way, without a
//! second mark. The conversation turn that answers the user's next message clears the
//! mark, records AGENT_RESUMED, and makes the next heartbeat due (it then waits out the
//! quiet period after the turn, as any heartbeat does).

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::hooks::{Emission, HookEmitter};
use crate::domain::{Agent, Event, EventId, EventType, HeartbeatStatus, HookType, Priority, to_ms};
use crate::error::{EngineError, chain};
use crate::ports::{Reschedule, Store};

/// Why an auto-paused agent's heartbeat is put off (the runner logs it).
pub(crate) const AUTO_PAUSED: &str = "the user has been silent longer than the agent's --auto-pause-after: auto-paused; heartbeat put off to its next reminder, or until the user writes";

/// How far an auto-paused agent's heartbeat is put off when no reminder comes sooner.
pub(crate) const PUT_OFF: SignedDuration = SignedDuration::from_hours(366 * 24);

/// Marks `agent` auto-paused at `now` (its user silent since `since`), once.
pub(crate) async fn auto_pause(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    since: Timestamp,
    now: Timestamp,
) -> Result<(), EngineError> {
    let mut marked = agent.clone();
    marked.auto_paused_since = Some(since);
    store.update_agent(&marked, agent).await?;
    let data = json!({"at": now, "silent_since": since});
    record(store, hooks, agent, HookType::AGENT_AUTO_PAUSED, data, now).await?;
    info!(agent_id = %agent.id, silent_since = %since, "the user has been silent too long: agent auto-paused");
    Ok(())
}

/// Brings an auto-paused `agent` back: its user wrote at `now`.
pub(crate) async fn wake(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    now: Timestamp,
) -> Result<(), EngineError> {
    let mut back = agent.clone();
    back.auto_paused_since = None;
    store.update_agent(&back, agent).await?;
    let at = agent.in_active_hours(now);
    if let Some(hb) = store.list_heartbeats(&agent.id, 1).await?.pop()
        && hb.status == HeartbeatStatus::Pending
        && hb.scheduled_at > at
    {
        store.reschedule(&hb.id(), Reschedule::Due(at)).await?;
    }
    let data = json!({"at": now, "next_heartbeat_at": at, "reason": "the user wrote"});
    record(store, hooks, agent, HookType::AGENT_RESUMED, data, now).await?;
    info!(agent_id = %agent.id, "the user wrote: auto-paused agent resumed");
    Ok(())
}

/// The event in the agent's log, and its hook when hooks are on (a failed emission is
/// logged: the change is made either way).
async fn record(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    name: &'static str,
    data: Value,
    now: Timestamp,
) -> Result<(), EngineError> {
    let event = Event {
        id: EventId::generate(to_ms(now).max(0) as u64),
        agent_id: agent.id.clone(),
        event_type: EventType::parse(name).unwrap_or_else(|_| EventType::heartbeat()),
        priority: Priority::DEFAULT,
        source: "pulse".to_owned(),
        payload: data.clone(),
        metadata: Value::Null,
        parent_id: None,
        cascade: None,
        created_at: now,
    };
    store.append_in_session(&event).await?;
    let Some(hooks) = hooks else {
        return Ok(());
    };
    let emission = Emission {
        hook_type: HookType::of(name),
        heartbeat_id: None,
        action_id: None,
        data,
        triggered_by: "PULSE".to_owned(),
        key_ms: to_ms(now).max(0) as u64,
        key: vec![event.id.to_string()],
    };
    let emitted = match hooks.routes(&agent.id).await {
        Ok(routes) => hooks.emit(&routes, agent, emission).await,
        Err(e) => Err(e),
    };
    if let Err(e) = emitted {
        warn!(error = %chain(&e), hook_type = name, "cannot emit the hook");
    }
    Ok(())
}
