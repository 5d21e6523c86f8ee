//! Agents' memories on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::codec::{read_docs, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{AgentId, Memory};
use crate::error::StoreError;
use crate::ports::MemoryStore;

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn remember(&self, memory: &Memory) -> Result<(), StoreError> {
        let memory = memory.clone();
        self.db
            .call("write memory", move |conn| {
                conn.exec(
                    "INSERT OR REPLACE INTO memories (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                    params![
                        memory.agent_id.as_str(),
                        memory.id.as_str(),
                        to_doc(&memory)
                    ],
                )
                .map_err(sqlite_err("write memory"))?;
                Ok(())
            })
            .await
    }

    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read memories", move |conn| {
                read_docs(
                    conn,
                    "read memories",
                    "SELECT id, doc FROM memories WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2",
                    params![agent, limit as i64],
                )
            })
            .await
    }
}
