//! The action log on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::codec::{read_docs, to_doc};
use super::events::upsert_event;
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{Action, ActionId, AgentId, Event, EventCursor};
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
}

impl SqliteStore {
    /// Writes `action` over the stored one if that is at `expected_attempt` and its
    /// status passes `status` (`status = 'RUNNING'`, or `<>`); false otherwise.
    async fn replace_action(
        &self,
        action: &Action,
        expected_attempt: u32,
        status: &'static str,
        op: &'static str,
    ) -> Result<bool, StoreError> {
        let action = action.clone();
        let sql = format!(
            "UPDATE actions SET status = ?2, attempt = ?3, doc = ?4 WHERE id = ?1 AND attempt = ?5 AND {status}"
        );
        self.db
            .call(op, move |conn| {
                let n = conn
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
                Ok(n == 1)
            })
            .await
    }
}
