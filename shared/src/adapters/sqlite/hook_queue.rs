//! The hooks queue of `pulse serve`: SQS-standard-like — no groups, a per-message
//! delay, a visibility timeout, and a dead-letter table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::SignedDuration;
use rusqlite::params;

use super::{CachedExecute, Db, sqlite_err};
use crate::domain::{Delivery, HookTask, Receipt, to_ms};
use crate::error::StoreError;
use crate::ports::{Backlog, Clock, HookMessage, HookQueue, SendReport, Settle};

/// The hooks queue of `pulse serve`.
#[derive(Clone)]
pub struct SqliteHookQueue {
    db: Db,
    clock: Arc<dyn Clock>,
}

impl SqliteHookQueue {
    /// The queue in `db`, timed by `clock`.
    pub fn new(db: Db, clock: Arc<dyn Clock>) -> Self {
        Self { db, clock }
    }

    /// Messages waiting or in flight.
    pub async fn depth(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM hook_queue").await
    }

    /// Dead-lettered deliveries.
    pub async fn dead_letters(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM hook_dead").await
    }

    async fn count(&self, sql: &'static str) -> Result<u64, StoreError> {
        self.db
            .call("count hook queue", move |conn| {
                conn.query_row(sql, [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
                    .map_err(sqlite_err("count hook queue"))
            })
            .await
    }

    fn at(&self, after: Duration) -> i64 {
        let now = self.clock.now();
        to_ms(
            now.saturating_add(SignedDuration::try_from(after).unwrap_or(SignedDuration::MAX))
                .unwrap_or(now),
        )
    }
}

#[async_trait]
impl HookQueue for SqliteHookQueue {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        super::session_queue::backlog(&self.db, "hook_queue", "hook_dead", self.clock.now()).await
    }

    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError> {
        let rows: Vec<(String, i64)> = messages
            .iter()
            .map(|m| (m.task.encode(), self.at(m.delay)))
            .collect();
        self.db
            .call("send to hook queue", move |conn| {
                let op = sqlite_err("send to hook queue");
                let tx = super::begin(conn).map_err(&op)?;
                for (body, visible) in &rows {
                    tx.prepare_cached("INSERT INTO hook_queue (body, visible_ms) VALUES (?1, ?2)")
                        .and_then(|mut st| st.execute(params![body, visible]))
                        .map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(SendReport::default())
            })
            .await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        let now = to_ms(self.clock.now());
        let hidden_until = self.at(visibility);
        self.db
            .call("receive from hook queue", move |conn| {
                let op = sqlite_err("receive from hook queue");
                let tx = super::begin(conn)
                    .map_err(&op)?;
                let picked: Vec<(i64, String, u32)> = {
                    let mut st = tx
                        .prepare_cached(
                            "SELECT seq, body, receive_count FROM hook_queue WHERE visible_ms <= ?1 \
                             ORDER BY visible_ms, seq LIMIT ?2",
                        )
                        .map_err(&op)?;
                    let rows = st
                        .query_map(params![now, max as i64], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        })
                        .map_err(&op)?;
                    rows.collect::<Result<_, _>>().map_err(&op)?
                };
                let mut out = Vec::with_capacity(picked.len());
                for (seq, body, count) in picked {
                    // As in the sessions queue: the receipt leads with the key, and its
                    // random part makes a stale receipt delete nothing.
                    let receipt = format!("{seq}.{}", crate::entropy::ulid());
                    tx.exec(
                        "UPDATE hook_queue SET receipt = ?2, visible_ms = ?3, receive_count = receive_count + 1 WHERE seq = ?1",
                        params![seq, receipt, hidden_until],
                    )
                    .map_err(&op)?;
                    out.push(Delivery {
                        message_id: seq.to_string().into(),
                        receipt: receipt.into(),
                        group: String::new(),
                        body,
                        receive_count: count + 1,
                    });
                }
                tx.commit().map_err(&op)?;
                Ok(out)
            })
            .await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        let Some(seq) = receipt
            .as_str()
            .split_once('.')
            .and_then(|(s, _)| s.parse::<i64>().ok())
        else {
            return Ok(());
        };
        let receipt = receipt.to_string();
        self.db
            .call("delete from hook queue", move |conn| {
                conn.exec(
                    "DELETE FROM hook_queue WHERE seq = ?1 AND receipt = ?2",
                    params![seq, receipt],
                )
                .map_err(sqlite_err("delete from hook queue"))?;
                Ok(())
            })
            .await
    }

    async fn receive_dead(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, StoreError> {
        let now = to_ms(self.clock.now());
        let hidden_until = self.at(visibility);
        self.db
            .call("receive dead hook deliveries", move |conn| {
                let op = sqlite_err("receive dead hook deliveries");
                let tx = super::begin(conn).map_err(&op)?;
                let picked: Vec<(i64, String)> = {
                    let mut st = tx
                        .prepare_cached(
                            "SELECT seq, body FROM hook_dead WHERE visible_ms <= ?1 \
                             ORDER BY seq LIMIT ?2",
                        )
                        .map_err(&op)?;
                    let rows = st
                        .query_map(params![now, max as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                        .map_err(&op)?;
                    rows.collect::<Result<_, _>>().map_err(&op)?
                };
                let mut out = Vec::with_capacity(picked.len());
                for (seq, body) in picked {
                    tx.exec(
                        "UPDATE hook_dead SET visible_ms = ?2 WHERE seq = ?1",
                        params![seq, hidden_until],
                    )
                    .map_err(&op)?;
                    out.push(Delivery {
                        message_id: seq.to_string().into(),
                        receipt: seq.to_string().into(),
                        group: String::new(),
                        body,
                        receive_count: 1,
                    });
                }
                tx.commit().map_err(&op)?;
                Ok(out)
            })
            .await
    }

    async fn settle_dead(&self, receipt: &Receipt, settle: Settle) -> Result<(), StoreError> {
        let Ok(seq) = receipt.as_str().parse::<i64>() else {
            return Ok(());
        };
        let visible = match settle {
            Settle::Delete => None,
            Settle::Release(after) => Some(self.at(after)),
        };
        self.db
            .call("settle dead hook delivery", move |conn| {
                let op = sqlite_err("settle dead hook delivery");
                match visible {
                    None => conn.exec("DELETE FROM hook_dead WHERE seq = ?1", [seq]),
                    Some(at) => conn.exec(
                        "UPDATE hook_dead SET visible_ms = ?2 WHERE seq = ?1",
                        params![seq, at],
                    ),
                }
                .map_err(op)?;
                Ok(())
            })
            .await
    }

    async fn dead_letter(&self, task: &HookTask, reason: &str) -> Result<(), StoreError> {
        let body = task.encode();
        let reason = reason.to_owned();
        let now = to_ms(self.clock.now());
        self.db
            .call("dead-letter hook", move |conn| {
                conn.exec(
                    "INSERT INTO hook_dead (body, reason, dead_ms) VALUES (?1, ?2, ?3)",
                    params![body, reason, now],
                )
                .map_err(sqlite_err("dead-letter hook"))?;
                Ok(())
            })
            .await
    }
}
