//! The action log on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::codec::{read_docs, to_doc};
use super::events::upsert_event;
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{
    Action, ActionId, AgentId, CountChange, Event, EventCursor, EventId, ToolCount, ToolName,
    hour_of,
};
use crate::error::StoreError;
use crate::ports::{ActionLog, Writer};

#[async_trait]
impl ActionLog for SqliteStore {
    async fn start_action(&self, action: &Action) -> Result<Option<Action>, StoreError> {
        let action = action.clone();
        self.db
            .call("start action", move |conn| {
                let op = "start action";
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let n = tx
                    .exec(
                        "INSERT INTO actions (id, agent_id, event_id, tool, status, attempt, doc) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING",
                        params![
                            action.id.as_str(),
                            action.agent_id.as_str(),
                            action.event_id.as_str(),
                            action.tool.as_str(),
                            action.status.as_str(),
                            action.attempt,
                            to_doc(&action)
                        ],
                    )
                    .map_err(sqlite_err(op))?;
                let existing = if n == 0 {
                    read_docs(
                        &tx,
                        op,
                        "SELECT id, doc FROM actions WHERE id = ?1",
                        [action.id.as_str()],
                    )?
                    .pop()
                } else {
                    None
                };
                tx.commit().map_err(sqlite_err(op))?;
                Ok(existing)
            })
            .await
    }

    async fn restart_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(
            action,
            expected_attempt,
            "status = 'RUNNING'",
            "restart action",
            None,
        )
        .await
    }

    async fn retry_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(
            action,
            expected_attempt,
            "status <> 'RUNNING'",
            "retry action",
            None,
        )
        .await
    }

    async fn settle_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(
            action,
            expected_attempt,
            "status = 'UNKNOWN'",
            "settle action",
            CountChange::settled(action),
        )
        .await
    }

    async fn finish_action(
        &self,
        action: &Action,
        new_events: &[Event],
        writer: Writer,
    ) -> Result<(), StoreError> {
        let (action, new_events) = (action.clone(), new_events.to_vec());
        let deadline = self.db.deadline_for(writer);
        self.db
            .call("finish action", move |conn| {
                let op = sqlite_err("finish action");
                let tx = super::begin(conn).map_err(&op)?;
                let n = tx
                    .exec(
                        "UPDATE actions SET status = ?2, doc = ?3 WHERE id = ?1 AND attempt = ?4 AND status = 'RUNNING'",
                        params![action.id.as_str(), action.status.as_str(), to_doc(&action), action.attempt],
                    )
                    .map_err(&op)?;
                if n == 0 {
                    return Err(StoreError::Conflict(format!(
                        "action {} is no longer RUNNING at attempt {}; another run took it over",
                        action.id, action.attempt
                    )));
                }
                if let Some(change) = CountChange::finished(&action) {
                    add_count(&tx, &change).map_err(&op)?;
                }
                for e in &new_events {
                    upsert_event(&tx, e, deadline.as_ref())?;
                }
                tx.commit().map_err(&op)
            })
            .await
    }

    async fn get_action(
        &self,
        agent: &AgentId,
        id: &ActionId,
    ) -> Result<Option<Action>, StoreError> {
        let (agent, id) = (agent.clone(), id.clone());
        self.db
            .call("get action", move |conn| {
                Ok(read_docs(
                    conn,
                    "get action",
                    "SELECT id, doc FROM actions WHERE id = ?1 AND agent_id = ?2",
                    params![id.as_str(), agent.as_str()],
                )?
                .pop())
            })
            .await
    }

    async fn action_on(
        &self,
        agent: &AgentId,
        event: &EventId,
        tool: &ToolName,
    ) -> Result<Option<Action>, StoreError> {
        let (agent, event, tool) = (agent.to_string(), event.to_string(), tool.to_string());
        self.db
            .call("read action", move |conn| {
                Ok(read_docs(
                    conn,
                    "read action",
                    "SELECT id, doc FROM actions WHERE agent_id = ?1 AND event_id = ?2 AND tool = ?3",
                    params![agent, event, tool],
                )?
                .pop())
            })
            .await
    }

    async fn list_actions(&self, agent: &AgentId, limit: usize) -> Result<Vec<Action>, StoreError> {
        let agent = agent.clone();
        self.db
            .call("list actions", move |conn| {
                read_docs(
                    conn,
                    "list actions",
                    "SELECT id, doc FROM actions WHERE agent_id = ?1 ORDER BY event_id DESC, tool LIMIT ?2",
                    params![agent.as_str(), limit as i64],
                )
            })
            .await
    }

    async fn actions_between(
        &self,
        agent: &AgentId,
        after: &EventCursor,
        through: &EventCursor,
        limit: usize,
    ) -> Result<Vec<Action>, StoreError> {
        let (agent, lo, hi) = (
            agent.clone(),
            after.as_str().to_owned(),
            through.as_str().to_owned(),
        );
        self.db
            .call("list actions", move |conn| {
                read_docs(
                    conn,
                    "list actions",
                    "SELECT id, doc FROM actions WHERE agent_id = ?1 AND event_id > ?2 AND event_id <= ?3 ORDER BY event_id, tool LIMIT ?4",
                    params![agent.as_str(), lo, hi, limit as i64],
                )
            })
            .await
    }

    async fn tool_counts(
        &self,
        from: jiff::Timestamp,
        through: jiff::Timestamp,
        agent: Option<&AgentId>,
    ) -> Result<Vec<ToolCount>, StoreError> {
        let (from, through) = (hour_of(from), hour_of(through));
        let agent = agent.map(|a| a.as_str().to_owned());
        self.db
            .call("read tool counts", move |conn| {
                let op = sqlite_err("read tool counts");
                let mut counts = std::collections::BTreeMap::new();
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT hour, agent_id, tool, succeeded, failed, unknown FROM tool_counts \
                         WHERE hour BETWEEN ?1 AND ?3 AND (?2 IS NULL OR agent_id = ?2)",
                    )
                    .map_err(&op)?;
                let mut rows = stmt.query(params![from, agent, through]).map_err(&op)?;
                while let Some(r) = rows.next().map_err(&op)? {
                    let key: (i64, String, String) = (
                        r.get(0).map_err(&op)?,
                        r.get(1).map_err(&op)?,
                        r.get(2).map_err(&op)?,
                    );
                    let count = ToolCount {
                        hour: key.0,
                        agent_id: AgentId::parse(&key.1)
                            .map_err(|e| StoreError::corrupt("tool_counts", e))?,
                        tool: key.2.clone(),
                        succeeded: r.get(3).map_err(&op)?,
                        failed: r.get(4).map_err(&op)?,
                        unknown: r.get(5).map_err(&op)?,
                        times: Default::default(),
                    };
                    counts.insert(key, count);
                }
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT hour, agent_id, tool, bucket, calls FROM tool_times \
                         WHERE hour BETWEEN ?1 AND ?3 AND (?2 IS NULL OR agent_id = ?2)",
                    )
                    .map_err(&op)?;
                let mut rows = stmt.query(params![from, agent, through]).map_err(&op)?;
                while let Some(r) = rows.next().map_err(&op)? {
                    let key: (i64, String, String) = (
                        r.get(0).map_err(&op)?,
                        r.get(1).map_err(&op)?,
                        r.get(2).map_err(&op)?,
                    );
                    if let Some(count) = counts.get_mut(&key) {
                        count
                            .times
                            .insert(r.get(3).map_err(&op)?, r.get(4).map_err(&op)?);
                    }
                }
                Ok(counts.into_values().collect())
            })
            .await
    }
}

impl SqliteStore {
    /// Writes `action` over the stored one if that is at `expected_attempt` and its
    /// status passes `status` (`status = 'RUNNING'`, or `<>`), and adds `change` to its
    /// tool's counts in the same transaction; false otherwise.
    async fn replace_action(
        &self,
        action: &Action,
        expected_attempt: u32,
        status: &'static str,
        op: &'static str,
        change: Option<CountChange>,
    ) -> Result<bool, StoreError> {
        let action = action.clone();
        let sql = format!(
            "UPDATE actions SET status = ?2, attempt = ?3, doc = ?4 WHERE id = ?1 AND attempt = ?5 AND {status}"
        );
        self.db
            .call(op, move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let n = tx
                    .exec(
                        &sql,
                        params![
                            action.id.as_str(),
                            action.status.as_str(),
                            action.attempt,
                            to_doc(&action),
                            expected_attempt
                        ],
                    )
                    .map_err(sqlite_err(op))?;
                if n == 1
                    && let Some(change) = &change
                {
                    add_count(&tx, change).map_err(sqlite_err(op))?;
                }
                tx.commit().map_err(sqlite_err(op))?;
                Ok(n == 1)
            })
            .await
    }
}

/// Adds one write's change to its tool's hourly counts.
fn add_count(conn: &rusqlite::Connection, c: &CountChange) -> rusqlite::Result<()> {
    conn.exec(
        "INSERT INTO tool_counts (hour, agent_id, tool, succeeded, failed, unknown) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (hour, agent_id, tool) DO UPDATE SET \
         succeeded = succeeded + excluded.succeeded, failed = failed + excluded.failed, \
         unknown = unknown + excluded.unknown",
        params![
            c.hour,
            c.agent_id.as_str(),
            c.tool,
            c.succeeded,
            c.failed,
            c.unknown
        ],
    )?;
    if let Some(bucket) = c.time {
        conn.exec(
            "INSERT INTO tool_times (hour, agent_id, tool, bucket, calls) \
             VALUES (?1, ?2, ?3, ?4, 1) ON CONFLICT (hour, agent_id, tool, bucket) \
             DO UPDATE SET calls = calls + 1",
            params![c.hour, c.agent_id.as_str(), c.tool, bucket],
        )?;
    }
    Ok(())
}

/// Counts the calls already in the action log, for a file that had no counts (the
/// migration to version 14). A record that does not read is not counted.
pub(super) fn count_logged_calls(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    let op = sqlite_err("migrate schema");
    let mut stmt = conn
        .prepare("SELECT doc FROM actions WHERE status IN ('COMPLETED', 'FAILED', 'UNKNOWN')")
        .map_err(&op)?;
    let mut rows = stmt.query([]).map_err(&op)?;
    while let Some(row) = rows.next().map_err(&op)? {
        let doc: String = row.get(0).map_err(&op)?;
        if let Ok(action) = serde_json::from_str::<Action>(&doc)
            && let Some(change) = CountChange::finished(&action)
        {
            add_count(conn, &change).map_err(&op)?;
        }
    }
    Ok(())
}
