//! Calls parked for a person's approval on SQLite: one row each, the record as JSON
//! beside its agent, whether it is pending, whether it is open (not yet settled) and when
//! it expires (the open ones are found by expiry through a partial index).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::codec::{from_doc, read_docs, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{AgentId, Approval, ApprovalId, to_ms};
use crate::error::StoreError;
use crate::ports::ApprovalStore;

fn read_one(
    conn: &rusqlite::Connection,
    op: &'static str,
    id: &str,
) -> Result<Option<Approval>, StoreError> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM approvals WHERE id = ?1")
        .and_then(|mut st| st.query_row([id], |r| r.get(0)).optional())
        .map_err(sqlite_err(op))?;
    doc.map(|d| from_doc(id, &d)).transpose()
}

#[async_trait]
impl ApprovalStore for SqliteStore {
    async fn park_approval(&self, approval: &Approval) -> Result<Option<Approval>, StoreError> {
        let a = approval.clone();
        self.db
            .call("park approval", move |conn| {
                let n = conn
                    .exec(
                        "INSERT OR IGNORE INTO approvals (id, agent_id, pending, open, expires_ms, doc) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        params![
                            a.id.as_str(),
                            a.agent_id.as_str(),
                            a.is_pending(),
                            a.outcome.is_none(),
                            to_ms(a.expires_at),
                            to_doc(&a)
                        ],
                    )
                    .map_err(sqlite_err("park approval"))?;
                if n == 1 {
                    return Ok(None);
                }
                read_one(conn, "park approval", a.id.as_str())
            })
            .await
    }

    async fn get_approval(
        &self,
        agent: &AgentId,
        id: &ApprovalId,
    ) -> Result<Option<Approval>, StoreError> {
        let (agent, id) = (agent.clone(), id.to_string());
        self.db
            .call("read approval", move |conn| {
                Ok(read_one(conn, "read approval", &id)?.filter(|a| a.agent_id == agent))
            })
            .await
    }

    async fn approvals(&self, agent: &AgentId, limit: usize) -> Result<Vec<Approval>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read approvals", move |conn| {
                read_docs(
                    conn,
                    "read approvals",
                    "SELECT id, doc FROM approvals WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2",
                    params![agent, limit as i64],
                )
            })
            .await
    }

    async fn open_approvals(&self, limit: usize) -> Result<Vec<Approval>, StoreError> {
        self.db
            .call("read open approvals", move |conn| {
                read_docs(
                    conn,
                    "read open approvals",
                    "SELECT id, doc FROM approvals WHERE open = 1 \
                     ORDER BY expires_ms, id LIMIT ?1",
                    params![limit as i64],
                )
            })
            .await
    }

    async fn decide_approval(&self, decided: &Approval) -> Result<Option<Approval>, StoreError> {
        let d = decided.clone();
        self.db
            .call("decide approval", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE approvals SET pending = 0, doc = ?3 \
                         WHERE id = ?1 AND agent_id = ?2 AND pending = 1",
                        params![d.id.as_str(), d.agent_id.as_str(), to_doc(&d)],
                    )
                    .map_err(sqlite_err("decide approval"))?;
                if n == 1 {
                    return Ok(None);
                }
                match read_one(conn, "decide approval", d.id.as_str())? {
                    Some(stored) if stored.agent_id == d.agent_id => Ok(Some(stored)),
                    _ => Err(StoreError::NotFound(format!("approval {}", d.id))),
                }
            })
            .await
    }

    async fn settle_approval(&self, settled: &Approval) -> Result<(), StoreError> {
        let (id, agent, outcome) = (
            settled.id.to_string(),
            settled.agent_id.clone(),
            settled.outcome.clone(),
        );
        self.db
            .call("settle approval", move |conn| {
                let Some(mut stored) =
                    read_one(conn, "settle approval", &id)?.filter(|a| a.agent_id == agent)
                else {
                    return Err(StoreError::NotFound(format!("approval {id}")));
                };
                if stored.is_pending() {
                    return Err(StoreError::Conflict(format!(
                        "approval {id} is still pending: decide it before settling it"
                    )));
                }
                stored.outcome = outcome;
                conn.exec(
                    "UPDATE approvals SET doc = ?2, open = 0 WHERE id = ?1",
                    params![id, to_doc(&stored)],
                )
                .map_err(sqlite_err("settle approval"))?;
                Ok(())
            })
            .await
    }

    async fn mark_asked(&self, asked: &Approval) -> Result<bool, StoreError> {
        let (id, agent, at) = (asked.id.to_string(), asked.agent_id.clone(), asked.asked_at);
        self.db
            .call("mark approval asked", move |conn| {
                let Some(mut stored) =
                    read_one(conn, "mark approval asked", &id)?.filter(|a| a.agent_id == agent)
                else {
                    return Err(StoreError::NotFound(format!("approval {id}")));
                };
                if !stored.is_pending() || stored.asked_at.is_some() {
                    return Ok(false);
                }
                stored.asked_at = at;
                conn.exec(
                    "UPDATE approvals SET doc = ?2 WHERE id = ?1 AND pending = 1",
                    params![id, to_doc(&stored)],
                )
                .map_err(sqlite_err("mark approval asked"))
                .map(|n| n == 1)
            })
            .await
    }
}
