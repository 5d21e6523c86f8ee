//! Conversation turns, their messages and the signals they answered, on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::codec::{from_doc, read_docs, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{
    AgentId, ConversationMessage, SessionId, SignalId, Turn, TurnId, Undelivered, WaitingTurn,
    to_ms,
};
use crate::error::StoreError;
use crate::ports::{ConversationStore, TurnStart};

#[async_trait]
impl ConversationStore for SqliteStore {
    async fn answered(
        &self,
        agent: &AgentId,
        signals: &[SignalId],
    ) -> Result<Vec<(SignalId, TurnId)>, StoreError> {
        let (agent, signals) = (agent.to_string(), signals.to_vec());
        self.db
            .call("read answered signals", move |conn| {
                let op = sqlite_err("read answered signals");
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT turn_id FROM signal_turns WHERE agent_id = ?1 AND signal_id = ?2",
                    )
                    .map_err(&op)?;
                let mut out = Vec::new();
                for s in signals {
                    let turn: Option<String> = stmt
                        .query_row(params![agent, s.as_str()], |r| r.get(0))
                        .optional()
                        .map_err(&op)?;
                    if let Some(t) = turn {
                        let t = TurnId::parse(&t)
                            .map_err(|e| StoreError::corrupt(format!("signal {s}"), e))?;
                        out.push((s, t));
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn begin_turn(
        &self,
        turn: &Turn,
        messages: &[ConversationMessage],
    ) -> Result<TurnStart, StoreError> {
        let (turn, messages) = (turn.clone(), messages.to_vec());
        self.db
            .call("begin turn", move |conn| {
                let op = sqlite_err("begin turn");
                let tx = super::begin(conn).map_err(&op)?;
                let agent = turn.agent_id.as_str();
                let existing: Option<String> = tx
                    .row(
                        "SELECT doc FROM turns WHERE agent_id = ?1 AND id = ?2",
                        params![agent, turn.id.as_str()],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(&op)?;
                if let Some(doc) = existing {
                    return Ok(TurnStart::Exists(Box::new(from_doc(turn.id.as_str(), &doc)?)));
                }
                for s in &turn.signals {
                    let n = tx
                        .exec(
                            "INSERT OR IGNORE INTO signal_turns (agent_id, signal_id, turn_id) VALUES (?1, ?2, ?3)",
                            params![agent, s.as_str(), turn.id.as_str()],
                        )
                        .map_err(&op)?;
                    if n == 0 {
                        return Err(StoreError::Conflict(format!(
                            "signal {s} is answered by another turn already"
                        )));
                    }
                }
                tx.exec(
                    "INSERT INTO turns (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                    params![agent, turn.id.as_str(), to_doc(&turn)],
                )
                .map_err(&op)?;
                for m in &messages {
                    tx.exec(
                        "INSERT OR REPLACE INTO messages (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                        params![m.agent_id.as_str(), m.id, to_doc(m)],
                    )
                    .map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(TurnStart::Created)
            })
            .await
            .inspect(|_| self.db.turn_written())
    }

    async fn update_turn(&self, turn: &Turn) -> Result<(), StoreError> {
        let turn = turn.clone();
        self.db
            .call("update turn", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE turns SET doc = ?3 WHERE agent_id = ?1 AND id = ?2",
                        params![turn.agent_id.as_str(), turn.id.as_str(), to_doc(&turn)],
                    )
                    .map_err(sqlite_err("update turn"))?;
                if n == 0 {
                    return Err(StoreError::NotFound(format!("turn {}", turn.id)));
                }
                Ok(())
            })
            .await
            .inspect(|()| self.db.turn_written())
    }

    fn turns_written(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.db.turns_written())
    }

    async fn get_turn(&self, agent: &AgentId, id: &TurnId) -> Result<Option<Turn>, StoreError> {
        let (agent, id) = (agent.to_string(), id.to_string());
        self.db
            .call("read turn", move |conn| {
                let docs: Vec<Turn> = read_docs(
                    conn,
                    "read turn",
                    "SELECT id, doc FROM turns WHERE agent_id = ?1 AND id = ?2",
                    params![agent, id],
                )?;
                Ok(docs.into_iter().next())
            })
            .await
    }

    async fn list_turns(&self, agent: &AgentId, limit: usize) -> Result<Vec<Turn>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("list turns", move |conn| {
                read_docs(
                    conn,
                    "list turns",
                    "SELECT id, doc FROM turns WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2",
                    params![agent, limit as i64],
                )
            })
            .await
    }

    async fn recent_messages(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError> {
        let agent = agent.to_string();
        self.db
            .call("read messages", move |conn| {
                read_docs(
                    conn,
                    "read messages",
                    "SELECT id, doc FROM messages WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2",
                    params![agent, limit as i64],
                )
            })
            .await
    }

    async fn messages_before(
        &self,
        agent: &AgentId,
        before: &str,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError> {
        let (agent, before) = (agent.to_string(), before.to_owned());
        self.db
            .call("read older messages", move |conn| {
                read_docs(
                    conn,
                    "read older messages",
                    "SELECT id, doc FROM messages WHERE agent_id = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
                    params![agent, before, limit as i64],
                )
            })
            .await
    }

    async fn put_waiting(&self, waiting: &WaitingTurn) -> Result<(), StoreError> {
        let w = waiting.clone();
        self.db
            .call("keep waiting turn", move |conn| {
                conn.exec(
                    "INSERT OR REPLACE INTO waiting_turns (agent_id, session, next_ms, doc) \
                     VALUES (?1, ?2, ?3, ?4)",
                    params![
                        w.agent_id.as_str(),
                        w.session.as_str(),
                        to_ms(w.next_at),
                        to_doc(&w)
                    ],
                )
                .map_err(sqlite_err("keep waiting turn"))?;
                Ok(())
            })
            .await
    }

    async fn get_waiting(
        &self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Option<WaitingTurn>, StoreError> {
        let (agent, session) = (agent.to_string(), session.to_string());
        self.db
            .call("read waiting turn", move |conn| {
                Ok(read_docs(
                    conn,
                    "read waiting turn",
                    "SELECT session, doc FROM waiting_turns WHERE agent_id = ?1 AND session = ?2",
                    params![agent, session],
                )?
                .pop())
            })
            .await
    }

    async fn delete_waiting(&self, agent: &AgentId, session: &SessionId) -> Result<(), StoreError> {
        let (agent, session) = (agent.to_string(), session.to_string());
        self.db
            .call("forget waiting turn", move |conn| {
                conn.exec(
                    "DELETE FROM waiting_turns WHERE agent_id = ?1 AND session = ?2",
                    params![agent, session],
                )
                .map_err(sqlite_err("forget waiting turn"))?;
                Ok(())
            })
            .await
    }

    async fn put_undelivered(&self, u: &Undelivered) -> Result<(), StoreError> {
        let u = u.clone();
        self.db
            .call("keep undelivered reply", move |conn| {
                conn.exec(
                    "INSERT OR REPLACE INTO undelivered (agent_id, turn_id, state, next_ms, doc) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        u.agent_id.as_str(),
                        u.turn_id.as_str(),
                        u.state.as_str(),
                        to_ms(u.next_at),
                        to_doc(&u)
                    ],
                )
                .map_err(sqlite_err("keep undelivered reply"))?;
                Ok(())
            })
            .await
    }

    async fn get_undelivered(
        &self,
        agent: &AgentId,
        turn: &TurnId,
    ) -> Result<Option<Undelivered>, StoreError> {
        let (agent, turn) = (agent.to_string(), turn.to_string());
        self.db
            .call("read undelivered reply", move |conn| {
                Ok(read_docs(
                    conn,
                    "read undelivered reply",
                    "SELECT turn_id, doc FROM undelivered WHERE agent_id = ?1 AND turn_id = ?2",
                    params![agent, turn],
                )?
                .pop())
            })
            .await
    }

    async fn delete_undelivered(&self, agent: &AgentId, turn: &TurnId) -> Result<(), StoreError> {
        let (agent, turn) = (agent.to_string(), turn.to_string());
        self.db
            .call("forget undelivered reply", move |conn| {
                conn.exec(
                    "DELETE FROM undelivered WHERE agent_id = ?1 AND turn_id = ?2",
                    params![agent, turn],
                )
                .map_err(sqlite_err("forget undelivered reply"))?;
                Ok(())
            })
            .await
    }

    async fn list_undelivered(&self, limit: usize) -> Result<Vec<Undelivered>, StoreError> {
        self.db
            .call("read undelivered replies", move |conn| {
                let mut all: Vec<Undelivered> = read_docs(
                    conn,
                    "read undelivered replies",
                    "SELECT turn_id, doc FROM undelivered WHERE state = 'retrying' \
                     ORDER BY next_ms LIMIT ?1",
                    params![limit as i64],
                )?;
                let left = limit.saturating_sub(all.len());
                all.extend(read_docs::<Undelivered>(
                    conn,
                    "read undelivered replies",
                    "SELECT turn_id, doc FROM undelivered WHERE state = 'undeliverable' \
                     ORDER BY next_ms DESC LIMIT ?1",
                    params![left as i64],
                )?);
                Ok(all)
            })
            .await
    }

    async fn list_waiting(&self, limit: usize) -> Result<Vec<WaitingTurn>, StoreError> {
        self.db
            .call("read waiting turns", move |conn| {
                read_docs(
                    conn,
                    "read waiting turns",
                    "SELECT session, doc FROM waiting_turns ORDER BY next_ms, agent_id, session LIMIT ?1",
                    params![limit as i64],
                )
            })
            .await
    }
}
