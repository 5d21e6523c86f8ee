//! A durable FIFO queue in SQLite with the semantics Pulse relies on from SQS FIFO:
//!
//! - order per group (the sequence number is assigned at send, in commit order);
//! - one group is locked while any of its messages is in flight, so a session never runs
//!   two tasks at once; other groups are delivered meanwhile;
//! - a received message is hidden for its visibility timeout and comes back (same order,
//!   higher receive count) if it is not deleted in time;
//! - a deduplication id seen in the last five minutes is accepted but not enqueued;
//! - a message received `max_receives` times without being deleted moves to a dead-letter
//!   table, as an SQS redrive policy does.
//!
//! Time comes from the injected clock, so visibility and deduplication are testable.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use rusqlite::params;

use super::{CachedExecute, Db, sqlite_err};
use crate::domain::{Delivery, OutgoingTask, Receipt, to_ms};
use crate::error::StoreError;
use crate::ports::{Backlog, Clock, SendReport, SessionQueue, Settle};

/// The sessions queue of `pulse serve`.
#[derive(Clone)]
pub struct SqliteQueue {
    db: Db,
    clock: Arc<dyn Clock>,
    max_receives: u32,
}

/// How long a deduplication id is remembered (SQS: five minutes).
const DEDUP_WINDOW: SignedDuration = SignedDuration::from_mins(5);

impl SqliteQueue {
    /// Receives before a message is dead-lettered, by default.
    pub const DEFAULT_MAX_RECEIVES: u32 = 5;

    /// The queue in `db`, timed by `clock`.
    pub fn new(db: Db, clock: Arc<dyn Clock>) -> Self {
        Self {
            db,
            clock,
            max_receives: Self::DEFAULT_MAX_RECEIVES,
        }
    }

    /// Sets how many receives a message gets before it is dead-lettered.
    pub fn with_max_receives(mut self, n: u32) -> Self {
        self.max_receives = n.max(1);
        self
    }

    /// Messages waiting or in flight.
    pub async fn depth(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM queue_messages").await
    }

    /// Messages moved to the dead-letter table.
    pub async fn dead_letters(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM queue_dead").await
    }

    /// The dead-lettered messages, oldest first: each one's sequence number (the order
    /// it was sent in, which its receipts start with) and body.
    pub async fn dead_lettered(&self) -> Result<Vec<(i64, String)>, StoreError> {
        self.db
            .call("read dead letters", move |conn| {
                let mut stmt = conn
                    .prepare("SELECT seq, body FROM queue_dead ORDER BY seq")
                    .map_err(sqlite_err("read dead letters"))?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                    .map_err(sqlite_err("read dead letters"))?;
                rows.collect::<Result<Vec<_>, _>>()
                    .map_err(sqlite_err("read dead letters"))
            })
            .await
    }

    async fn count(&self, sql: &'static str) -> Result<u64, StoreError> {
        self.db
            .call("count queue", move |conn| {
                conn.query_row(sql, [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
                    .map_err(sqlite_err("count queue"))
            })
            .await
    }
}

/// Counts a queue table's messages (in flight: received, their visibility not yet
/// over) and its dead-letter table's.
pub(super) async fn backlog(
    db: &Db,
    queue: &'static str,
    dead: &'static str,
    now: Timestamp,
) -> Result<Backlog, StoreError> {
    let now = to_ms(now);
    let sql = format!(
        "SELECT COUNT(*), COALESCE(SUM(receipt IS NOT NULL AND visible_ms > ?1), 0), \
         (SELECT COUNT(*) FROM {dead}) FROM {queue}"
    );
    db.call("count queue", move |conn| {
        conn.query_row(&sql, [now], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .map(|(all, flying, dead)| Backlog {
            waiting: (all - flying).max(0) as u64,
            in_flight: flying.max(0) as u64,
            dead: Some(dead.max(0) as u64),
        })
        .map_err(sqlite_err("count queue"))
    })
    .await
}

#[async_trait]
impl SessionQueue for SqliteQueue {
    fn batch_size(&self) -> usize {
        // A page of claims in a few transactions; each holds the connection for about
        // a millisecond.
        250
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        backlog(&self.db, "queue_messages", "queue_dead", self.clock.now()).await
    }

    async fn redrive(&self, max: usize) -> Result<u64, StoreError> {
        let now = to_ms(self.clock.now());
        self.db
            .call("redrive dead letters", move |conn| {
                let op = sqlite_err("redrive dead letters");
                let tx = super::begin(conn).map_err(&op)?;
                // A new sequence number puts each behind its group's messages; the
                // oldest first keeps their order among themselves.
                let moved = tx
                    .exec(
                        "INSERT INTO queue_messages (message_id, group_id, body, sent_ms, visible_ms) \
                         SELECT message_id, group_id, body, ?1, ?1 FROM queue_dead \
                         WHERE seq IN (SELECT seq FROM queue_dead ORDER BY seq LIMIT ?2) \
                         ORDER BY seq",
                        params![now, max as i64],
                    )
                    .map_err(&op)?;
                tx.exec(
                    "DELETE FROM queue_dead WHERE seq IN (SELECT seq FROM queue_dead ORDER BY seq LIMIT ?1)",
                    params![max as i64],
                )
                .map_err(&op)?;
                tx.commit().map_err(&op)?;
                Ok(moved as u64)
            })
            .await
    }

    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError> {
        let tasks = tasks.to_vec();
        let now = self.clock.now();
        let forget_before = to_ms(now.saturating_sub(DEDUP_WINDOW).unwrap_or(now));
        let now = to_ms(now);
        self.db
            .call("send to queue", move |conn| {
                let op = sqlite_err("send to queue");
                let tx = super::begin(conn).map_err(&op)?;
                tx.exec("DELETE FROM queue_dedup WHERE sent_ms < ?1", [forget_before])
                    .map_err(&op)?;
                for t in &tasks {
                    let fresh = tx
                        .exec(
                            "INSERT INTO queue_dedup (dedup_id, sent_ms) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                            params![t.dedup_id.as_str(), now],
                        )
                        .map_err(&op)?;
                    if fresh == 0 {
                        // A duplicate within the window: accepted, not enqueued (as SQS).
                        continue;
                    }
                    tx.exec(
                        "INSERT INTO queue_messages (message_id, group_id, body, sent_ms, visible_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?4)",
                        params![crate::entropy::ulid().to_string(), t.group.as_str(), t.envelope.encode(), now],
                    )
                    .map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(SendReport::default())
            })
            .await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        let now = self.clock.now();
        let hidden_until = to_ms(
            now.saturating_add(SignedDuration::try_from(visibility).unwrap_or(SignedDuration::MAX))
                .unwrap_or(now),
        );
        let now = to_ms(now);
        let max_receives = self.max_receives;
        let receiver = self.db.claimants.id();
        self.db
            .call("receive from queue", move |conn| {
                let op = sqlite_err("receive from queue");
                let tx = super::begin(conn).map_err(&op)?;
                // Messages that used up their receives and are not in flight go to the
                // dead-letter table, unblocking their group.
                tx.exec(
                    "INSERT INTO queue_dead (seq, message_id, group_id, body, sent_ms, receive_count, dead_ms) \
                     SELECT seq, message_id, group_id, body, sent_ms, receive_count, ?1 FROM queue_messages \
                     WHERE receive_count >= ?2 AND visible_ms <= ?1",
                    params![now, max_receives],
                )
                .map_err(&op)?;
                tx.exec(
                    "DELETE FROM queue_messages WHERE receive_count >= ?2 AND visible_ms <= ?1",
                    params![now, max_receives],
                )
                .map_err(&op)?;
                let picked: Vec<(i64, String, String, String, u32)> = {
                    let mut stmt = tx
                        .prepare_cached(
                            "SELECT seq, message_id, group_id, body, receive_count FROM queue_messages m \
                             WHERE m.visible_ms <= ?1 AND NOT EXISTS ( \
                                 SELECT 1 FROM queue_messages l \
                                 WHERE l.group_id = m.group_id AND l.receipt IS NOT NULL AND l.visible_ms > ?1) \
                             ORDER BY seq LIMIT ?2",
                        )
                        .map_err(&op)?;
                    let rows = stmt
                        .query_map(params![now, max as i64], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                        })
                        .map_err(&op)?;
                    rows.collect::<Result<_, _>>().map_err(&op)?
                };
                let mut out = Vec::with_capacity(picked.len());
                for (seq, message_id, group, body, count) in picked {
                    // The receipt leads with the sequence number, so acks and releases
                    // find the message by its key; the random part makes stale receipts
                    // (from an earlier delivery of the same message) match nothing.
                    let receipt = format!("{seq}.{}", crate::entropy::ulid());
                    tx.exec(
                        "UPDATE queue_messages SET receipt = ?2, visible_ms = ?3, receive_count = receive_count + 1, \
                             received_by = ?4 WHERE seq = ?1",
                        params![seq, receipt, hidden_until, receiver],
                    )
                    .map_err(&op)?;
                    out.push(Delivery {
                        message_id: message_id.into(),
                        receipt: receipt.into(),
                        group,
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
        self.settle(&[(receipt.clone(), Settle::Delete)]).await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError> {
        self.settle(&[(receipt.clone(), Settle::Release(delay))])
            .await
    }

    async fn settle(&self, batch: &[(Receipt, Settle)]) -> Result<(), StoreError> {
        let now = self.clock.now();
        // Receipts this queue did not issue are no message of it: nothing to settle.
        let settled: Vec<(i64, String, Option<i64>)> = batch
            .iter()
            .filter_map(|(receipt, settle)| {
                let seq = receipt_seq(receipt)?;
                let visible = match settle {
                    Settle::Delete => None,
                    Settle::Release(delay) => Some(to_ms(
                        now.saturating_add(
                            SignedDuration::try_from(*delay).unwrap_or(SignedDuration::MAX),
                        )
                        .unwrap_or(now),
                    )),
                };
                Some((seq, receipt.to_string(), visible))
            })
            .collect();
        if settled.is_empty() {
            return Ok(());
        }
        self.db
            .call("settle queue messages", move |conn| {
                let op = sqlite_err("settle queue messages");
                // One transaction: every message settled, or none.
                let tx = super::begin(conn).map_err(&op)?;
                for (seq, receipt, visible) in &settled {
                    // A stale receipt (the message was delivered again since) changes
                    // nothing, as with SQS: the newer delivery owns the message.
                    match visible {
                        None => tx.exec(
                            "DELETE FROM queue_messages WHERE seq = ?1 AND receipt = ?2",
                            params![seq, receipt],
                        ),
                        Some(at) => tx.exec(
                            "UPDATE queue_messages SET visible_ms = ?3 WHERE seq = ?1 AND receipt = ?2",
                            params![seq, receipt, at],
                        ),
                    }
                    .map_err(&op)?;
                }
                tx.commit().map_err(&op)
            })
            .await
    }
}

/// The sequence number a receipt starts with; `None` for anything this queue did not issue.
fn receipt_seq(receipt: &Receipt) -> Option<i64> {
    receipt.as_str().split_once('.')?.0.parse().ok()
}
