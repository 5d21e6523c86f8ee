//! Agents' memories on SQLite: each memory's record (JSON), its vector beside it
//! (quantized bytes and the model that made it), and a version per agent that cached
//! recall indexes check (words are scored by the recall index, in the worker).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::codec::{from_doc, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{AgentId, Embedding, Memory, MemoryChange, MemoryId};
use crate::error::StoreError;
use crate::ports::{MAX_CHANGES, MemoryStore};

const COLUMNS: &str = "id, doc, vector, vector_model";

/// A row: id, record, vector bytes, vector model.
type MemoryRow = (String, String, Option<Vec<u8>>, Option<String>);

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MemoryRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn memory_of((id, doc, vector, model): MemoryRow) -> Result<Memory, StoreError> {
    let mut memory: Memory = from_doc(&id, &doc)?;
    memory.embedding = match (vector, model) {
        (Some(bytes), Some(model)) => Some(Embedding {
            model,
            values: bytes.into_iter().map(|b| b as i8).collect(),
        }),
        _ => None,
    };
    Ok(memory)
}

fn read_memories(
    conn: &Connection,
    op: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Memory>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite_err(op))?;
    let rows = stmt
        .query_map(args, read_row)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(sqlite_err(op))?;
    rows.into_iter().map(memory_of).collect()
}

fn bump(tx: &Connection, agent: &str) -> rusqlite::Result<usize> {
    tx.exec(
        "INSERT INTO memory_versions (agent_id, version) VALUES (?1, 1)
         ON CONFLICT (agent_id) DO UPDATE SET version = version + 1",
        [agent],
    )
}

/// Writes one memory (replacing the one with its id).
fn write_memory(tx: &Connection, m: &Memory) -> rusqlite::Result<()> {
    let (vector, model) = vector_of(m);
    tx.exec(
        "INSERT OR REPLACE INTO memories (agent_id, id, doc, vector, vector_model)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![m.agent_id.as_str(), m.id.as_str(), to_doc(m), vector, model],
    )?;
    Ok(())
}

/// Writes one conditional change (see [`MemoryChange`]); `false` when the store no
/// longer holds what it was read from.
fn write_change(tx: &Connection, c: &MemoryChange) -> rusqlite::Result<bool> {
    let m = &c.memory;
    let n = match &c.read {
        None => {
            let (vector, model) = vector_of(m);
            tx.exec(
                "INSERT INTO memories (agent_id, id, doc, vector, vector_model)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                params![m.agent_id.as_str(), m.id.as_str(), to_doc(m), vector, model],
            )?
        }
        // The record only: the vector stays as stored.
        Some(read) => tx.exec(
            "UPDATE memories SET doc = ?3 WHERE agent_id = ?1 AND id = ?2 \
             AND COALESCE(json_extract(doc, '$.recalls'), 0) = ?4 \
             AND json_extract(doc, '$.folded_into') IS ?5",
            params![
                m.agent_id.as_str(),
                m.id.as_str(),
                to_doc(m),
                read.recalls,
                read.folded_into.as_ref().map(MemoryId::as_str),
            ],
        )?,
    };
    Ok(n == 1)
}

fn vector_of(m: &Memory) -> (Option<Vec<u8>>, Option<&str>) {
    match &m.embedding {
        Some(e) => (
            Some(e.values.iter().map(|v| *v as u8).collect()),
            Some(e.model.as_str()),
        ),
        None => (None, None),
    }
}

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn remember(&self, memories: &[Memory]) -> Result<(), StoreError> {
        let Some(first) = memories.first() else {
            return Ok(());
        };
        let agent = first.agent_id.to_string();
        let memories = memories.to_vec();
        self.db
            .call("write memories", move |conn| {
                let op = sqlite_err("write memories");
                let tx = super::begin(conn).map_err(&op)?;
                for m in &memories {
                    write_memory(&tx, m).map_err(&op)?;
                }
                bump(&tx, &agent).map_err(&op)?;
                tx.commit().map_err(&op)?;
                Ok(())
            })
            .await
    }

    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read memories", move |conn| {
                read_memories(
                    conn,
                    "read memories",
                    &format!(
                        "SELECT {COLUMNS} FROM memories WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2"
                    ),
                    params![agent, limit as i64],
                )
            })
            .await
    }

    async fn all_memories(&self, agent: &AgentId) -> Result<Vec<Memory>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read memories", move |conn| {
                read_memories(
                    conn,
                    "read memories",
                    &format!("SELECT {COLUMNS} FROM memories WHERE agent_id = ?1 ORDER BY id"),
                    params![agent],
                )
            })
            .await
    }

    async fn get_memory(
        &self,
        agent: &AgentId,
        id: &MemoryId,
    ) -> Result<Option<Memory>, StoreError> {
        let (agent, id) = (agent.to_string(), id.to_string());
        self.db
            .call("read memory", move |conn| {
                Ok(read_memories(
                    conn,
                    "read memory",
                    &format!("SELECT {COLUMNS} FROM memories WHERE agent_id = ?1 AND id = ?2"),
                    params![agent, id],
                )?
                .pop())
            })
            .await
    }

    async fn memory_version(&self, agent: &AgentId) -> Result<u64, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read memory version", move |conn| {
                let v: Option<i64> = conn
                    .row(
                        "SELECT version FROM memory_versions WHERE agent_id = ?1",
                        [agent],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(sqlite_err("read memory version"))?;
                Ok(v.unwrap_or(0) as u64)
            })
            .await
    }

    async fn reinforce(&self, memories: &[Memory]) -> Result<Vec<MemoryId>, StoreError> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        let memories = memories.to_vec();
        self.db
            .call("reinforce memories", move |conn| {
                let op = sqlite_err("reinforce memories");
                let tx = super::begin(conn).map_err(&op)?;
                let mut missed = Vec::new();
                for m in &memories {
                    // The weighing only, and only over the count this recall read.
                    let n = tx
                        .exec(
                            "UPDATE memories SET doc = json_set(doc, '$.weight', ?3, '$.weighed_beat', ?4, \
                             '$.recalled_at', ?5, '$.recalls', ?6) \
                             WHERE agent_id = ?1 AND id = ?2 AND COALESCE(json_extract(doc, '$.recalls'), 0) = ?7",
                            params![
                                m.agent_id.as_str(),
                                m.id.as_str(),
                                f64::from(m.weight),
                                m.weighed_beat as i64,
                                m.recalled_at.map(|t| t.to_string()),
                                m.recalls,
                                m.recalls.saturating_sub(1),
                            ],
                        )
                        .map_err(&op)?;
                    if n == 0 {
                        missed.push(m.id.clone());
                    }
                }
                tx.commit().map_err(&op)?;
                Ok(missed)
            })
            .await
    }

    async fn change(&self, agent: &AgentId, changes: &[MemoryChange]) -> Result<bool, StoreError> {
        if changes.is_empty() {
            return Ok(true);
        }
        if changes.len() > MAX_CHANGES {
            return Err(crate::ports::too_many_changes("sqlite", changes.len()));
        }
        let agent = agent.to_string();
        let changes = changes.to_vec();
        self.db
            .call("change memories", move |conn| {
                let op = sqlite_err("change memories");
                let tx = super::begin(conn).map_err(&op)?;
                for c in &changes {
                    if !write_change(&tx, c).map_err(&op)? {
                        // Dropping the transaction rolls the others back.
                        return Ok(false);
                    }
                }
                bump(&tx, &agent).map_err(&op)?;
                tx.commit().map_err(&op)?;
                Ok(true)
            })
            .await
    }

    async fn set_vectors(
        &self,
        agent: &AgentId,
        memories: &[Memory],
    ) -> Result<Vec<MemoryId>, StoreError> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        let agent = agent.to_string();
        let memories = memories.to_vec();
        self.db
            .call("store vectors", move |conn| {
                let op = sqlite_err("store vectors");
                let tx = super::begin(conn).map_err(&op)?;
                let mut missed = Vec::new();
                for m in &memories {
                    let (vector, model) = vector_of(m);
                    let n = tx
                        .exec(
                            "UPDATE memories SET vector = ?3, vector_model = ?4 \
                             WHERE agent_id = ?1 AND id = ?2",
                            params![agent, m.id.as_str(), vector, model],
                        )
                        .map_err(&op)?;
                    if n == 0 {
                        missed.push(m.id.clone());
                    }
                }
                if missed.len() < memories.len() {
                    bump(&tx, &agent).map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(missed)
            })
            .await
    }

    async fn forget(&self, agent: &AgentId, id: &MemoryId) -> Result<bool, StoreError> {
        let (agent, id) = (agent.to_string(), id.to_string());
        self.db
            .call("forget memory", move |conn| {
                let op = sqlite_err("forget memory");
                let tx = super::begin(conn).map_err(&op)?;
                let n = tx
                    .exec(
                        "DELETE FROM memories WHERE agent_id = ?1 AND id = ?2",
                        params![agent, id],
                    )
                    .map_err(&op)?;
                if n > 0 {
                    bump(&tx, &agent).map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(n > 0)
            })
            .await
    }
}
