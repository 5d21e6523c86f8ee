//! One heartbeat's trace, read from the store: its window and the events it read, each
//! action (the heartbeat agent's thought, tool calls and tokens among them), the events
//! it created, the hooks it emitted, the next heartbeat. The CLI prints it
//! (`pulse heartbeats show`); the dashboard renders it.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use crate::domain::{Action, Event, EventCursor, EventId, Heartbeat, HeartbeatId, HookDelivery};
use crate::error::StoreError;
use crate::ports::{EventQuery, Store};

/// Most records of each kind a story reads.
const MOST: usize = 1_000;

/// One heartbeat's whole story, as `pulse heartbeats show --json` prints it and the
/// dashboard's trace shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Trace {
    /// The heartbeat's id.
    pub id: HeartbeatId,
    /// The heartbeat as stored.
    pub heartbeat: Heartbeat,
    /// The events of its window, `(window_start, window_end]`, that it read.
    pub window_events: Vec<Event>,
    /// Its actions, in event order.
    pub actions: Vec<Action>,
    /// The events it created (HEARTBEAT and its tools' cascades).
    pub created: Vec<Event>,
    /// The hook deliveries it emitted.
    pub hooks: Vec<HookDelivery>,
    /// The heartbeat after it, once scheduled.
    pub next: Option<Heartbeat>,
}

/// Reads the trace of `heartbeat` (one still running is read up to `now`).
pub async fn trace(
    store: &dyn Store,
    heartbeat: Heartbeat,
    now: Timestamp,
) -> Result<Trace, StoreError> {
    let (agent, id) = (heartbeat.agent_id.clone(), heartbeat.id());
    let window_events = match &heartbeat.window_end {
        Some(end) => {
            let query = EventQuery {
                after: Some(heartbeat.window_start.clone()),
                // The cursor is the greatest id of its millisecond: nothing equals it.
                before: EventId::parse(end.as_str()).ok(),
                limit: MOST,
                ..EventQuery::default()
            };
            let events = store.query_events(&agent, &query).await?;
            events
                .into_iter()
                .filter(|e| e.cascade.is_none() && end.covers(&e.id))
                .collect()
        }
        None => Vec::new(),
    };
    let end = heartbeat.completed_at.unwrap_or(now);
    let mut actions: Vec<_> = store
        .actions_between(
            &agent,
            &heartbeat.window_start,
            &EventCursor::through(end),
            MOST,
        )
        .await?
        .into_iter()
        .filter(|a| a.heartbeat_id == id)
        .collect();
    // An idle beat's heartbeat agent skip is kept on the heartbeat itself.
    actions.extend(heartbeat.skipped_action());
    let created = match heartbeat.started_at {
        Some(started) => {
            let query = EventQuery {
                after: Some(EventCursor::since(started)),
                limit: MOST,
                ..EventQuery::default()
            };
            store
                .query_events(&agent, &query)
                .await?
                .into_iter()
                .filter(|e| e.cascade.as_ref().is_some_and(|c| c.heartbeat_id == id))
                .collect()
        }
        None => Vec::new(),
    };
    let mut hooks = Vec::new();
    for hook in store.list_hooks(&agent).await? {
        for d in store.list_deliveries(&hook.id, MOST).await? {
            let body: Value = serde_json::from_str(&d.body).unwrap_or(Value::Null);
            if body["heartbeat_id"].as_str() == Some(id.to_string().as_str()) {
                hooks.push(d);
            }
        }
    }
    hooks.sort_by_key(|d| d.created_at);
    let next = store.get_heartbeat(&heartbeat.next_id()).await?;
    let id = heartbeat.id();
    Ok(Trace {
        id,
        heartbeat,
        window_events,
        actions,
        created,
        hooks,
        next,
    })
}
