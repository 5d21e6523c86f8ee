//! The store ports on SQLite. Records other than heartbeats are kept as JSON documents
//! beside the columns that queries need; heartbeats are plain columns, since claims and
//! finishes update them field by field.

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Db, sqlite_err};
use crate::domain::{
    Action, ActionStatus, Agent, AgentId, ClaimRequest, ConversationMessage, Event, EventCursor,
    EventId, Heartbeat, HeartbeatId, HeartbeatStatus, Memory, Registry, SessionId, SignalId,
    Subscription, SubscriptionId, Tool, ToolName, Turn, TurnId, from_ms, to_ms,
};
use crate::error::StoreError;
use crate::ports::{
    ActionLog, AgentStore, ConversationStore, DuePage, EventLog, Finish, FinishOutcome,
    HeartbeatStore, MemoryStore, PageToken, ToolRegistry, TurnStart, Window,
};
use crate::sealing::{EncryptionKeys, SealError, SealedRecord, Stored};

/// The records of Pulse in a SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    pub(super) db: Db,
    /// The group-commit writer of webhook acceptances, started on first use.
    pub(super) accepts: std::sync::Arc<std::sync::OnceLock<super::webhooks::Batcher>>,
    /// Seals the secrets of webhooks and hooks.
    pub(super) keys: EncryptionKeys,
}

impl SqliteStore {
    /// A store over an open database. It has no encryption key until given one with
    /// [`SqliteStore::with_keys`]: writing a secret then fails, saying so.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            accepts: std::sync::Arc::default(),
            keys: EncryptionKeys::none(),
        }
    }

    /// Seals secrets with `keys`.
    pub fn with_keys(mut self, keys: EncryptionKeys) -> Self {
        self.keys = keys;
        self
    }
}

/// Reads records whose secrets are sealed (webhooks, hooks) and opens them. With
/// `reseal`, one stored stale (plain, or under an old key) is sealed with the current
/// key and written back, if the stored document has not changed meanwhile.
pub(super) fn read_sealed<T: Serialize + DeserializeOwned + SealedRecord>(
    conn: &Connection,
    op: &'static str,
    table: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
    keys: &EncryptionKeys,
    reseal: bool,
) -> Result<Vec<T>, StoreError> {
    let rows: Vec<(String, String)> = {
        let mut stmt = conn.prepare_cached(sql).map_err(sqlite_err(op))?;
        stmt.query_map(args, |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(sqlite_err(op))?
    };
    let mut out = Vec::with_capacity(rows.len());
    for (id, doc) in rows {
        let mut record: T = from_doc(&id, &doc)?;
        if record.open(keys)? == Stored::Stale && reseal {
            match record.sealed(keys) {
                Ok(sealed) => {
                    conn.execute(
                        &format!("UPDATE {table} SET doc = ?2 WHERE id = ?1 AND doc = ?3"),
                        params![id, to_doc(&sealed), doc],
                    )
                    .map_err(sqlite_err(op))?;
                }
                // No key to seal with: it stays as it is, and is read as it is.
                Err(SealError::NoKey) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.push(record);
    }
    Ok(out)
}

pub(super) fn to_doc<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

pub(super) fn from_doc<T: DeserializeOwned>(key: &str, doc: &str) -> Result<T, StoreError> {
    serde_json::from_str(doc).map_err(|e| StoreError::corrupt(key, e))
}

const HB_COLS: &str = "agent_id, beat, session, status, scheduled_ms, claim, lease_ms, started_ms, \
    completed_ms, window_start, window_end, last_interaction_beat, interaction_seen_ms, since_last, \
    consecutive_failures, events_processed, actions_triggered, actions_failed, cascade_capped, error";

fn heartbeat_row(r: &Row<'_>) -> rusqlite::Result<Result<Heartbeat, StoreError>> {
    let agent: String = r.get(0)?;
    let beat: i64 = r.get(1)?;
    let session: String = r.get(2)?;
    let status: String = r.get(3)?;
    let ts = |i: usize| -> rusqlite::Result<Option<Timestamp>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(from_ms))
    };
    let n = |i: usize| -> rusqlite::Result<u32> { Ok(r.get::<_, i64>(i)? as u32) };
    let key = format!("heartbeat {agent}/{beat}");
    let (agent_id, session, status) = match (
        AgentId::parse(&agent),
        SessionId::parse(&session),
        HeartbeatStatus::parse(&status),
    ) {
        (Ok(a), Ok(s), Some(st)) => (a, s, st),
        (Err(e), _, _) => return Ok(Err(StoreError::corrupt(key, e))),
        (_, Err(e), _) => return Ok(Err(StoreError::corrupt(key, e))),
        (_, _, None) => {
            return Ok(Err(StoreError::corrupt(
                key,
                format!("unknown status {status}"),
            )));
        }
    };
    Ok(Ok(Heartbeat {
        agent_id,
        beat: beat as u64,
        session,
        status,
        scheduled_at: from_ms(r.get(4)?),
        claim: n(5)?,
        lease_until: ts(6)?,
        started_at: ts(7)?,
        completed_at: ts(8)?,
        window_start: EventCursor::from_stored(r.get::<_, String>(9)?),
        window_end: r
            .get::<_, Option<String>>(10)?
            .map(EventCursor::from_stored),
        last_interaction_beat: r.get::<_, i64>(11)? as u64,
        interaction_seen_at: ts(12)?,
        since_last: r.get::<_, Option<i64>>(13)?.map(|n| n as u64),
        consecutive_failures: n(14)?,
        events_processed: n(15)?,
        actions_triggered: n(16)?,
        actions_failed: n(17)?,
        cascade_capped: n(18)?,
        error: r.get(19)?,
    }))
}

fn insert_heartbeat(conn: &Connection, hb: &Heartbeat) -> Result<(), StoreError> {
    conn.execute(
        &format!(
            "INSERT INTO heartbeats ({HB_COLS}, due_ms) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)"
        ),
        params![
            hb.agent_id.as_str(),
            hb.beat as i64,
            hb.session.as_str(),
            hb.status.as_str(),
            to_ms(hb.scheduled_at),
            hb.claim,
            hb.lease_until.map(to_ms),
            hb.started_at.map(to_ms),
            hb.completed_at.map(to_ms),
            hb.window_start.as_str(),
            hb.window_end.as_ref().map(EventCursor::as_str),
            hb.last_interaction_beat as i64,
            hb.interaction_seen_at.map(to_ms),
            hb.since_last.map(|n| n as i64),
            hb.consecutive_failures,
            hb.events_processed,
            hb.actions_triggered,
            hb.actions_failed,
            hb.cascade_capped,
            hb.error,
            hb.due_at().map(to_ms),
        ],
    )
    .map_err(sqlite_err("insert heartbeat"))?;
    Ok(())
}

pub(super) fn upsert_event(conn: &Connection, e: &Event) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO events (agent_id, id, own, doc) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (agent_id, id) DO UPDATE SET own = excluded.own, doc = excluded.doc",
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

pub(super) fn read_docs<T: DeserializeOwned>(
    conn: &Connection,
    op: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite_err(op))?;
    let rows = stmt
        .query_map(args, |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(sqlite_err(op))?;
    let mut out = Vec::new();
    for row in rows {
        let (key, doc) = row.map_err(sqlite_err(op))?;
        out.push(from_doc(&key, &doc)?);
    }
    Ok(out)
}

/// Files `agent` as the one that answers in `channel`; `AlreadyExists` if another does.
fn claim_channel(conn: &Connection, channel: &str, agent: &AgentId) -> Result<(), StoreError> {
    let op = sqlite_err("create agent");
    let n = conn
        .execute(
            "INSERT INTO discord_channels (channel_id, agent_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![channel, agent.as_str()],
        )
        .map_err(&op)?;
    if n == 0 {
        let other: String = conn
            .query_row(
                "SELECT agent_id FROM discord_channels WHERE channel_id = ?1",
                [channel],
                |r| r.get(0),
            )
            .map_err(&op)?;
        return Err(StoreError::AlreadyExists(format!(
            "an agent for Discord channel {channel} ({other})"
        )));
    }
    Ok(())
}

#[async_trait]
impl AgentStore for SqliteStore {
    async fn agent_for_channel(&self, channel_id: &str) -> Result<Option<AgentId>, StoreError> {
        let channel = channel_id.to_owned();
        self.db
            .call("find channel's agent", move |conn| {
                let id: Option<String> = conn
                    .prepare_cached("SELECT agent_id FROM discord_channels WHERE channel_id = ?1")
                    .and_then(|mut st| st.query_row([&channel], |r| r.get(0)).optional())
                    .map_err(sqlite_err("find channel's agent"))?;
                id.map(|id| {
                    AgentId::parse(&id).map_err(|e| StoreError::corrupt("discord_channels", e))
                })
                .transpose()
            })
            .await
    }

    async fn create_agent(&self, agent: &Agent, first: &Heartbeat) -> Result<(), StoreError> {
        let (agent, first) = (agent.clone(), first.clone());
        self.db
            .call("create agent", move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sqlite_err("create agent"))?;
                let n = tx
                    .execute(
                        "INSERT INTO agents (id, created_ms, doc) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![agent.id.as_str(), to_ms(agent.created_at), to_doc(&agent)],
                    )
                    .map_err(sqlite_err("create agent"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("agent {}", agent.id)));
                }
                if let Some(channel) = &agent.discord_channel {
                    claim_channel(&tx, channel, &agent.id)?;
                }
                insert_heartbeat(&tx, &first)?;
                tx.commit().map_err(sqlite_err("create agent"))
            })
            .await
    }

    async fn import_agents(&self, agents: &[(Agent, Heartbeat)]) -> Result<(), StoreError> {
        let agents = agents.to_vec();
        self.db
            .call("import agents", move |conn| {
                let op = sqlite_err("import agents");
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(&op)?;
                for (agent, first) in &agents {
                    tx.execute(
                        "INSERT OR REPLACE INTO agents (id, created_ms, doc) VALUES (?1, ?2, ?3)",
                        params![agent.id.as_str(), to_ms(agent.created_at), to_doc(agent)],
                    )
                    .map_err(&op)?;
                    tx.execute(
                        "DELETE FROM heartbeats WHERE agent_id = ?1 AND beat = ?2",
                        params![first.agent_id.as_str(), first.beat as i64],
                    )
                    .map_err(&op)?;
                    if let Some(channel) = &agent.discord_channel {
                        tx.execute(
                            "INSERT OR REPLACE INTO discord_channels (channel_id, agent_id) VALUES (?1, ?2)",
                            params![channel, agent.id.as_str()],
                        )
                        .map_err(&op)?;
                    }
                    insert_heartbeat(&tx, first)?;
                }
                tx.commit().map_err(&op)
            })
            .await
    }

    async fn get_agent(&self, id: &AgentId) -> Result<Option<Agent>, StoreError> {
        let id = id.clone();
        self.db
            .call("get agent", move |conn| {
                Ok(read_docs(
                    conn,
                    "get agent",
                    "SELECT id, doc FROM agents WHERE id = ?1",
                    [id.as_str()],
                )?
                .pop())
            })
            .await
    }

    async fn list_agents(&self) -> Result<Vec<Agent>, StoreError> {
        self.db
            .call("list agents", |conn| {
                read_docs(
                    conn,
                    "list agents",
                    "SELECT id, doc FROM agents ORDER BY created_ms, id",
                    [],
                )
            })
            .await
    }

    async fn record_interaction(&self, id: &AgentId, at: Timestamp) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("record interaction", move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sqlite_err("record interaction"))?;
                let mut agent: Agent = read_docs(
                    &tx,
                    "record interaction",
                    "SELECT id, doc FROM agents WHERE id = ?1",
                    [id.as_str()],
                )?
                .pop()
                .ok_or_else(|| StoreError::NotFound(format!("agent {id}")))?;
                if agent.last_interaction_at.is_some_and(|t| t >= at) {
                    return Ok(());
                }
                agent.last_interaction_at = Some(at);
                tx.execute(
                    "UPDATE agents SET doc = ?2 WHERE id = ?1",
                    params![id.as_str(), to_doc(&agent)],
                )
                .map_err(sqlite_err("record interaction"))?;
                tx.commit().map_err(sqlite_err("record interaction"))
            })
            .await
    }
}

fn parse_page(token: &PageToken) -> Option<(i64, String, i64)> {
    let mut parts = token.0.splitn(3, '|');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_owned(),
        parts.next()?.parse().ok()?,
    ))
}

#[async_trait]
impl HeartbeatStore for SqliteStore {
    fn due_shards(&self) -> u16 {
        // One partial index; SQLite has no hot partitions to spread.
        1
    }

    async fn due(
        &self,
        _shard: u16,
        now: Timestamp,
        page: Option<PageToken>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        let after = page
            .as_ref()
            .and_then(parse_page)
            .unwrap_or((i64::MIN, String::new(), 0));
        self.db
            .call("query due heartbeats", move |conn| {
                let op = sqlite_err("query due heartbeats");
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT agent_id, beat, due_ms FROM heartbeats \
                         WHERE due_ms IS NOT NULL AND due_ms <= ?1 AND (due_ms, agent_id, beat) > (?2, ?3, ?4) \
                         ORDER BY due_ms, agent_id, beat LIMIT ?5",
                    )
                    .map_err(&op)?;
                let rows = stmt
                    .query_map(params![to_ms(now), after.0, after.1, after.2, limit as i64], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                    })
                    .map_err(&op)?;
                let mut ids = Vec::new();
                let mut last = None;
                for row in rows {
                    let (agent, beat, due) = row.map_err(&op)?;
                    let agent_id = AgentId::parse(&agent).map_err(|e| StoreError::corrupt(&agent, e))?;
                    ids.push(HeartbeatId::new(agent_id, beat as u64));
                    last = Some(format!("{due}|{agent}|{beat}"));
                }
                let next = if ids.len() == limit { last.map(PageToken) } else { None };
                Ok(DuePage { ids, next })
            })
            .await
    }

    async fn claim(
        &self,
        id: &HeartbeatId,
        req: &ClaimRequest,
    ) -> Result<Option<Heartbeat>, StoreError> {
        self.claim_many(std::slice::from_ref(id), req, 1)
            .await
            .pop()
            .unwrap_or(Ok(None))
    }

    async fn claim_many(
        &self,
        ids: &[HeartbeatId],
        req: &ClaimRequest,
        _concurrency: usize,
    ) -> Vec<Result<Option<Heartbeat>, StoreError>> {
        let (owned, req) = (ids.to_vec(), req.clone());
        // One transaction for the page: each UPDATE is still conditional on its row, so
        // concurrent sweepers (other connections) still claim each heartbeat once.
        let result = self
            .db
            .call("claim heartbeats", move |conn| {
                let op = sqlite_err("claim heartbeats");
                let now = to_ms(req.now);
                let lease = to_ms(req.now.saturating_add(req.lease).unwrap_or(req.now));
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(&op)?;
                let mut out = Vec::with_capacity(owned.len());
                {
                    let mut stmt = tx
                        .prepare_cached(&format!(
                            "UPDATE heartbeats SET status = 'EXECUTING', claim = claim + 1, lease_ms = ?3, due_ms = ?3, \
                                 started_ms = COALESCE(started_ms, ?4), window_end = COALESCE(window_end, ?5) \
                             WHERE agent_id = ?1 AND beat = ?2 AND \
                                 ((status = 'PENDING' AND scheduled_ms <= ?4) OR (status = 'EXECUTING' AND lease_ms <= ?4)) \
                             RETURNING {HB_COLS}"
                        ))
                        .map_err(&op)?;
                    for id in &owned {
                        let claimed = stmt
                            .query_row(
                                params![
                                    id.agent().as_str(),
                                    id.beat() as i64,
                                    lease,
                                    now,
                                    req.window_end.as_str()
                                ],
                                heartbeat_row,
                            )
                            .optional()
                            .map_err(&op)?
                            .transpose();
                        out.push(claimed);
                    }
                }
                tx.commit().map_err(&op)?;
                Ok(out)
            })
            .await;
        match result {
            Ok(out) => out,
            Err(e) => {
                let why = crate::error::chain(&e);
                ids.iter()
                    .map(|_| {
                        Err(StoreError::backend(
                            "sqlite",
                            "claim heartbeats",
                            why.clone(),
                        ))
                    })
                    .collect()
            }
        }
    }

    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        let finish = finish.clone();
        self.db
            .call("finish heartbeat", move |conn| {
                let op = sqlite_err("finish heartbeat");
                let hb = &finish.heartbeat;
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&op)?;
                let current: Option<(String, i64)> = tx
                    .query_row(
                        "SELECT status, claim FROM heartbeats WHERE agent_id = ?1 AND beat = ?2",
                        params![hb.agent_id.as_str(), hb.beat as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(&op)?;
                let Some((status, claim)) = current else {
                    return Err(StoreError::NotFound(format!("heartbeat {}", hb.id())));
                };
                let status = HeartbeatStatus::parse(&status)
                    .ok_or_else(|| StoreError::corrupt(hb.id().to_string(), format!("unknown status {status}")))?;
                let claim = claim as u32;
                if claim != hb.claim || status == HeartbeatStatus::Pending {
                    return Ok(FinishOutcome::Superseded { claim, status });
                }
                if status.is_final() {
                    return Ok(FinishOutcome::AlreadyFinished);
                }
                tx.execute(
                    "UPDATE heartbeats SET status = ?3, completed_ms = ?4, last_interaction_beat = ?5, \
                         interaction_seen_ms = ?6, since_last = ?7, events_processed = ?8, actions_triggered = ?9, \
                         actions_failed = ?10, cascade_capped = ?11, error = ?12, due_ms = NULL \
                     WHERE agent_id = ?1 AND beat = ?2",
                    params![
                        hb.agent_id.as_str(),
                        hb.beat as i64,
                        hb.status.as_str(),
                        hb.completed_at.map(to_ms),
                        hb.last_interaction_beat as i64,
                        hb.interaction_seen_at.map(to_ms),
                        hb.since_last.map(|n| n as i64),
                        hb.events_processed,
                        hb.actions_triggered,
                        hb.actions_failed,
                        hb.cascade_capped,
                        hb.error,
                    ],
                )
                .map_err(&op)?;
                if let Some(next) = &finish.next {
                    insert_heartbeat(&tx, next)?;
                }
                if let Some(e) = &finish.heartbeat_event {
                    upsert_event(&tx, e)?;
                }
                tx.commit().map_err(&op)?;
                Ok(FinishOutcome::Finished)
            })
            .await
    }

    async fn defer(&self, hb: &Heartbeat, until: Timestamp) -> Result<bool, StoreError> {
        let (agent, beat, claim) = (hb.agent_id.to_string(), hb.beat as i64, hb.claim);
        self.db
            .call("defer heartbeat", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE heartbeats SET status = 'PENDING', scheduled_ms = ?4, due_ms = ?4, lease_ms = NULL, \
                             started_ms = NULL, window_end = NULL \
                         WHERE agent_id = ?1 AND beat = ?2 AND claim = ?3 AND status = 'EXECUTING'",
                        params![agent, beat, claim, to_ms(until)],
                    )
                    .map_err(sqlite_err("defer heartbeat"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn renew(&self, hb: &Heartbeat, lease_until: Timestamp) -> Result<bool, StoreError> {
        let (agent, beat, claim) = (hb.agent_id.to_string(), hb.beat as i64, hb.claim);
        self.db
            .call("renew heartbeat lease", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE heartbeats SET lease_ms = ?4, due_ms = ?4 \
                         WHERE agent_id = ?1 AND beat = ?2 AND claim = ?3 AND status = 'EXECUTING'",
                        params![agent, beat, claim, to_ms(lease_until)],
                    )
                    .map_err(sqlite_err("renew heartbeat lease"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn get_heartbeat(&self, id: &HeartbeatId) -> Result<Option<Heartbeat>, StoreError> {
        let id = id.clone();
        self.db
            .call("get heartbeat", move |conn| {
                conn.query_row(
                    &format!("SELECT {HB_COLS} FROM heartbeats WHERE agent_id = ?1 AND beat = ?2"),
                    params![id.agent().as_str(), id.beat() as i64],
                    heartbeat_row,
                )
                .optional()
                .map_err(sqlite_err("get heartbeat"))?
                .transpose()
            })
            .await
    }

    async fn list_heartbeats(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let agent = agent.clone();
        self.db
            .call("list heartbeats", move |conn| {
                let op = sqlite_err("list heartbeats");
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT {HB_COLS} FROM heartbeats WHERE agent_id = ?1 ORDER BY beat DESC LIMIT ?2"
                    ))
                    .map_err(&op)?;
                let rows = stmt
                    .query_map(params![agent.as_str(), limit as i64], heartbeat_row)
                    .map_err(&op)?;
                rows.map(|r| r.map_err(&op)?).collect()
            })
            .await
    }
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn append(&self, event: &Event) -> Result<(), StoreError> {
        let event = event.clone();
        self.db
            .call("append event", move |conn| upsert_event(conn, &event))
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
                let tx = conn.transaction().map_err(sqlite_err(op))?;
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
                Ok(Window { agent: found, events, truncated })
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

    async fn list_events(&self, agent: &AgentId, limit: usize) -> Result<Vec<Event>, StoreError> {
        let agent = agent.clone();
        self.db
            .call("list events", move |conn| {
                let mut events: Vec<Event> = read_docs(
                    conn,
                    "list events",
                    "SELECT id, doc FROM events WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2",
                    params![agent.as_str(), limit as i64],
                )?;
                events.reverse();
                Ok(events)
            })
            .await
    }
}

#[async_trait]
impl ActionLog for SqliteStore {
    async fn start_action(&self, action: &Action) -> Result<Option<Action>, StoreError> {
        let action = action.clone();
        self.db
            .call("start action", move |conn| {
                let op = "start action";
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sqlite_err(op))?;
                let n = tx
                    .execute(
                        "INSERT INTO actions (id, agent_id, event_id, tool, status, attempt, doc) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING",
                        params![
                            action.id.as_str(),
                            action.agent_id.as_str(),
                            action.event_id.as_str(),
                            action.tool.as_str(),
                            status_name(action.status),
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
        let action = action.clone();
        self.db
            .call("restart action", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE actions SET status = ?2, attempt = ?3, doc = ?4 \
                         WHERE id = ?1 AND attempt = ?5 AND status = 'RUNNING'",
                        params![
                            action.id.as_str(),
                            status_name(action.status),
                            action.attempt,
                            to_doc(&action),
                            expected_attempt
                        ],
                    )
                    .map_err(sqlite_err("restart action"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn finish_action(&self, action: &Action, new_events: &[Event]) -> Result<(), StoreError> {
        let (action, new_events) = (action.clone(), new_events.to_vec());
        self.db
            .call("finish action", move |conn| {
                let op = sqlite_err("finish action");
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&op)?;
                let n = tx
                    .execute(
                        "UPDATE actions SET status = ?2, doc = ?3 WHERE id = ?1 AND attempt = ?4 AND status = 'RUNNING'",
                        params![action.id.as_str(), status_name(action.status), to_doc(&action), action.attempt],
                    )
                    .map_err(&op)?;
                if n == 0 {
                    return Err(StoreError::Conflict(format!(
                        "action {} is no longer RUNNING at attempt {}; another run took it over",
                        action.id, action.attempt
                    )));
                }
                for e in &new_events {
                    upsert_event(&tx, e)?;
                }
                tx.commit().map_err(&op)
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
}

fn status_name(s: ActionStatus) -> &'static str {
    match s {
        ActionStatus::Running => "RUNNING",
        ActionStatus::Completed => "COMPLETED",
        ActionStatus::Failed => "FAILED",
        ActionStatus::Cancelled => "CANCELLED",
    }
}

/// Reads a document, applies `change`, writes it back; `NotFound` if absent.
fn update_doc<T: Serialize + DeserializeOwned>(
    conn: &mut Connection,
    op: &'static str,
    table: &'static str,
    key_col: &'static str,
    key: &str,
    what: String,
    change: impl FnOnce(&mut T),
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_err(op))?;
    let mut doc: T = read_docs(
        &tx,
        op,
        &format!("SELECT {key_col}, doc FROM {table} WHERE {key_col} = ?1"),
        [key],
    )?
    .pop()
    .ok_or(StoreError::NotFound(what))?;
    change(&mut doc);
    tx.execute(
        &format!("UPDATE {table} SET doc = ?2 WHERE {key_col} = ?1"),
        params![key, to_doc(&doc)],
    )
    .map_err(sqlite_err(op))?;
    tx.commit().map_err(sqlite_err(op))
}

#[async_trait]
impl ToolRegistry for SqliteStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let tool = tool.clone();
        self.db
            .call("add tool", move |conn| {
                let n = conn
                    .execute(
                        "INSERT INTO tools (name, doc) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                        params![tool.name.as_str(), to_doc(&tool)],
                    )
                    .map_err(sqlite_err("add tool"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("tool {}", tool.name)));
                }
                Ok(())
            })
            .await
    }

    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        let name = name.clone();
        self.db
            .call("update tool", move |conn| {
                update_doc(
                    conn,
                    "update tool",
                    "tools",
                    "name",
                    name.as_str(),
                    format!("tool {name}"),
                    |t: &mut Tool| t.active = active,
                )
            })
            .await
    }

    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let sub = sub.clone();
        self.db
            .call("add subscription", move |conn| {
                let n = conn
                    .execute(
                        "INSERT INTO subscriptions (id, doc) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                        params![sub.id.as_str(), to_doc(&sub)],
                    )
                    .map_err(sqlite_err("add subscription"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!(
                        "subscription {} ({} -> {})",
                        sub.id, sub.event_type, sub.tool
                    )));
                }
                Ok(())
            })
            .await
    }

    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("update subscription", move |conn| {
                update_doc(
                    conn,
                    "update subscription",
                    "subscriptions",
                    "id",
                    id.as_str(),
                    format!("subscription {id}"),
                    |s: &mut Subscription| s.active = active,
                )
            })
            .await
    }

    async fn load_registry(&self) -> Result<Registry, StoreError> {
        self.db
            .call("load registry", |conn| {
                let tx = conn.transaction().map_err(sqlite_err("load registry"))?;
                let tools = read_docs(
                    &tx,
                    "load registry",
                    "SELECT name, doc FROM tools ORDER BY name",
                    [],
                )?;
                let subscriptions = read_docs(
                    &tx,
                    "load registry",
                    "SELECT id, doc FROM subscriptions ORDER BY id",
                    [],
                )?;
                Ok(Registry {
                    tools,
                    subscriptions,
                })
            })
            .await
    }
}

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
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&op)?;
                let agent = turn.agent_id.as_str();
                let existing: Option<String> = tx
                    .query_row(
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
                        .execute(
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
                tx.execute(
                    "INSERT INTO turns (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                    params![agent, turn.id.as_str(), to_doc(&turn)],
                )
                .map_err(&op)?;
                for m in &messages {
                    tx.execute(
                        "INSERT OR REPLACE INTO messages (agent_id, id, doc) VALUES (?1, ?2, ?3)",
                        params![m.agent_id.as_str(), m.id, to_doc(m)],
                    )
                    .map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(TurnStart::Created)
            })
            .await
    }

    async fn update_turn(&self, turn: &Turn) -> Result<(), StoreError> {
        let turn = turn.clone();
        self.db
            .call("update turn", move |conn| {
                let n = conn
                    .execute(
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
}

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn remember(&self, memory: &Memory) -> Result<(), StoreError> {
        let memory = memory.clone();
        self.db
            .call("write memory", move |conn| {
                conn.execute(
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
