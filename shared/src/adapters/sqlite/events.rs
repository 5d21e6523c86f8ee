//! The event log on SQLite.

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::codec::{read_docs, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{Agent, AgentId, Event, EventCursor, EventId, Json};
use crate::error::StoreError;
use crate::ports::{EventLog, Window};

/// Writes `e` (again, if it is there), within the database's [`super::EventDeadline`].
pub(super) fn upsert_event(
    conn: &Connection,
    e: &Event,
    deadline: Option<&super::EventDeadline>,
) -> Result<(), StoreError> {
    write_event(
        conn,
        e,
        deadline,
        "INSERT INTO events (agent_id, id, own, doc) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (agent_id, id) DO UPDATE SET own = excluded.own, doc = excluded.doc",
    )
}

/// Inserts an event stamped moments ago with a fresh id (a webhook's), which cannot be
/// there yet, with [`write_event`]. A plain insert: SQLite writes it with no statement
/// journal, where an upsert inside a transaction first copies each page it changes, to
/// undo its update should a later step of the statement fail.
pub(super) const INSERT_NEW_EVENT: &str =
    "INSERT INTO events (agent_id, id, own, doc) VALUES (?1, ?2, ?3, ?4)";

/// Writes `e` with `sql` (an insert of its four columns), after the write deadline's
/// check.
pub(super) fn write_event<P: Json>(
    conn: &Connection,
    e: &Event<P>,
    deadline: Option<&super::EventDeadline>,
    sql: &str,
) -> Result<(), StoreError> {
    if let Some(d) = deadline {
        d.check(conn, e)?;
    }
    conn.exec(
        sql,
        params![
            e.agent_id.as_str(),
            e.id.as_str(),
            e.cascade.is_some(),
            to_doc(e)
        ],
    )
    .map_err(sqlite_err("append event"))?;
    Ok(())
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn append(&self, event: &Event) -> Result<(), StoreError> {
        let event = event.clone();
        let deadline = self.db.deadline.clone();
        self.db
            .call("append event", move |conn| {
                upsert_event(conn, &event, deadline.as_ref())
            })
            .await
    }

    async fn append_in_session(&self, event: &Event) -> Result<(), StoreError> {
        let event = event.clone();
        self.db
            .call("append event", move |conn| upsert_event(conn, &event, None))
            .await
    }

    async fn read_window(
        &self,
        agent: &AgentId,
        start: &EventCursor,
        end: &EventCursor,
        limit: usize,
    ) -> Result<Window, StoreError> {
        let (agent, start, end) = (agent.clone(), start.clone(), end.clone());
        self.db
            .call("read event window", move |conn| {
                let op = "read event window";
                let tx = super::begin_deferred(conn).map_err(sqlite_err(op))?;
                let found: Option<Agent> =
                    read_docs(&tx, op, "SELECT id, doc FROM agents WHERE id = ?1", [agent.as_str()])?.pop();
                let mut events: Vec<Event> = read_docs(
                    &tx,
                    op,
                    "SELECT id, doc FROM events WHERE agent_id = ?1 AND id > ?2 AND id <= ?3 AND own = 0 \
                     ORDER BY id LIMIT ?4",
                    params![agent.as_str(), start.as_str(), end.as_str(), limit as i64 + 1],
                )?;
                let truncated = events.len() > limit;
                events.truncate(limit);
                // Told here, in the same snapshot, so an agent without hooks costs its
                // heartbeat no read of its routes.
                let has_hooks: bool = tx
                    .prepare_cached("SELECT EXISTS (SELECT 1 FROM hooks WHERE agent_id = ?1)")
                    .and_then(|mut st| st.query_row([agent.as_str()], |r| r.get(0)))
                    .map_err(sqlite_err(op))?;
                Ok(Window {
                    agent: found,
                    events,
                    truncated,
                    has_hooks: Some(has_hooks),
                })
            })
            .await
    }

    async fn get_events(&self, agent: &AgentId, ids: &[EventId]) -> Result<Vec<Event>, StoreError> {
        let (agent, ids) = (agent.clone(), ids.to_vec());
        self.db
            .call("get events", move |conn| {
                let mut out = Vec::with_capacity(ids.len());
                for id in &ids {
                    out.extend(read_docs::<Event>(
                        conn,
                        "get events",
                        "SELECT id, doc FROM events WHERE agent_id = ?1 AND id = ?2",
                        [agent.as_str(), id.as_str()],
                    )?);
                }
                out.sort_by(|a, b| a.id.cmp(&b.id));
                Ok(out)
            })
            .await
    }

    async fn events_page(
        &self,
        agent: &AgentId,
        after: Option<&EventCursor>,
        before: Option<&EventId>,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let agent = agent.clone();
        // Every event id sorts after "" and before "~" (ids are `ev_` + ULID).
        let lo = after.map_or(String::new(), |c| c.as_str().to_owned());
        let hi = before.map_or("~".to_owned(), |id| id.as_str().to_owned());
        self.db
            .call("list events", move |conn| {
                read_docs(
                    conn,
                    "list events",
                    "SELECT id, doc FROM events WHERE agent_id = ?1 AND id > ?2 AND id < ?3 ORDER BY id DESC LIMIT ?4",
                    params![agent.as_str(), lo, hi, limit as i64],
                )
            })
            .await
    }
}
