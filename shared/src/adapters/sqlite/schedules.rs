//! Agents' schedules (reminders) on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::codec::{read_docs, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{AgentId, Schedule, ScheduleId};
use crate::error::StoreError;
use crate::ports::ScheduleStore;

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn put_schedule(&self, schedule: &Schedule) -> Result<(), StoreError> {
        let schedule = schedule.clone();
        self.db
            .call("write schedule", move |conn| {
                conn.exec(
                    "INSERT OR REPLACE INTO schedules (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                    params![
                        schedule.agent_id.as_str(),
                        schedule.id.as_str(),
                        to_doc(&schedule)
                    ],
                )
                .map_err(sqlite_err("write schedule"))?;
                Ok(())
            })
            .await
    }

    async fn schedules(&self, agent: &AgentId) -> Result<Vec<Schedule>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read schedules", move |conn| {
                read_docs(
                    conn,
                    "read schedules",
                    "SELECT id, doc FROM schedules WHERE agent_id = ?1 ORDER BY id",
                    params![agent],
                )
            })
            .await
    }

    async fn delete_schedule(&self, agent: &AgentId, id: &ScheduleId) -> Result<bool, StoreError> {
        let (agent, id) = (agent.to_string(), id.to_string());
        self.db
            .call("delete schedule", move |conn| {
                let n = conn
                    .exec(
                        "DELETE FROM schedules WHERE agent_id = ?1 AND id = ?2",
                        params![agent, id],
                    )
                    .map_err(sqlite_err("delete schedule"))?;
                Ok(n > 0)
            })
            .await
    }
}
