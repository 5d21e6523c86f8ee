//! Retention on SQLite: an agent's finished records removed in batches of at most
//! [`PRUNE_BATCH`] rows, each batch its own short transaction, and the space they took
//! given back by incremental vacuum, a few hundred pages at a time.

use std::time::Instant;

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{Connection, ToSql};

use super::{SqliteStore, sqlite_err};
use crate::domain::{AgentId, COUNT_DAYS, EventCursor, first_id_at, hour_of, to_ms};
use crate::error::StoreError;
use crate::ports::{Maintenance, PRUNE_BATCH, Pruned, Reclaimed};

/// Which count of [`Pruned`] some rows add to.
type Counter = fn(&mut Pruned) -> &mut u64;

/// The agent's webhooks and hooks.
const WEBHOOKS: &str = "(SELECT id FROM webhooks WHERE agent_id = :agent)";
const HOOKS: &str = "(SELECT id FROM hooks WHERE agent_id = :agent)";

/// Rows of one table that a prune removes: the table, the columns that name a row, which
/// rows (an SQL condition over the named parameters of [`Bounds`]), and what they count as.
struct Doomed {
    table: &'static str,
    key: &'static str,
    filter: String,
    count: Counter,
}

/// Everything a prune removes, dependents before what they hang from.
fn doomed() -> Vec<Doomed> {
    let d = |table, key, filter: &str, count: Counter| Doomed {
        table,
        key,
        filter: filter.to_owned(),
        count,
    };
    vec![
        d(
            "heartbeats",
            "agent_id, beat",
            "agent_id = :agent AND due_ms IS NULL \
             AND status IN ('COMPLETED', 'FAILED', 'CANCELLED') \
             AND COALESCE(completed_ms, scheduled_ms) < :horizon",
            |p| &mut p.heartbeats,
        ),
        d(
            "actions",
            "rowid",
            "agent_id = :agent AND event_id <= :events_to",
            |p| &mut p.actions,
        ),
        d(
            "events",
            "agent_id, id",
            "agent_id = :agent AND id <= :events_to",
            |p| &mut p.events,
        ),
        d(
            "messages",
            "agent_id, id",
            "agent_id = :agent AND id < :turns_to",
            |p| &mut p.conversation,
        ),
        d(
            "signal_turns",
            "agent_id, signal_id",
            "agent_id = :agent AND turn_id < :turns_to",
            |p| &mut p.conversation,
        ),
        d(
            "turns",
            "agent_id, id",
            "agent_id = :agent AND id < :turns_to",
            |p| &mut p.conversation,
        ),
        d(
            "hook_attempts",
            "delivery_id, attempt",
            &format!(
                "delivery_id IN (SELECT id FROM hook_deliveries WHERE hook_id IN {HOOKS} \
                 AND created_ms < :horizon)"
            ),
            |p| &mut p.hook_deliveries,
        ),
        d(
            "hook_deliveries",
            "rowid",
            &format!("hook_id IN {HOOKS} AND created_ms < :horizon"),
            |p| &mut p.hook_deliveries,
        ),
        d(
            "webhook_requests",
            "webhook_id, id",
            &format!("webhook_id IN {WEBHOOKS} AND id < :requests_to"),
            |p| &mut p.webhook_records,
        ),
        d(
            "webhook_deliveries",
            "webhook_id, delivery_id",
            &format!("webhook_id IN {WEBHOOKS} AND expires_ms < :now"),
            |p| &mut p.webhook_records,
        ),
        d(
            "tool_times",
            "hour, agent_id, tool, bucket",
            "agent_id = :agent AND hour < :counts_to",
            |p| &mut p.tool_counts,
        ),
        d(
            "tool_counts",
            "hour, agent_id, tool",
            "agent_id = :agent AND hour < :counts_to",
            |p| &mut p.tool_counts,
        ),
        d(
            "approvals",
            "id",
            "agent_id = :agent AND open = 0 AND id < :approvals_to",
            |p| &mut p.approvals,
        ),
    ]
}

/// The values a prune's conditions compare with.
struct Bounds {
    agent: String,
    /// Events up to this id have been read by a finished heartbeat and were stamped
    /// before the horizon ("" when the agent has no live heartbeat: none are removed).
    events_to: String,
    horizon: i64,
    /// Turns (and their messages, `<turn id>.<n>`) sort before this when they began
    /// before the horizon.
    turns_to: String,
    /// Request log entries sort before this when received before the horizon.
    requests_to: String,
    now: i64,
    /// Tool call counts of hours before this are past [`COUNT_DAYS`].
    counts_to: i64,
    /// Approvals sort before this when parked by a run that began before the horizon.
    approvals_to: String,
}

impl Bounds {
    fn params(&self) -> [(&'static str, &dyn ToSql); 8] {
        [
            (":agent", &self.agent),
            (":events_to", &self.events_to),
            (":horizon", &self.horizon),
            (":turns_to", &self.turns_to),
            (":requests_to", &self.requests_to),
            (":now", &self.now),
            (":counts_to", &self.counts_to),
            (":approvals_to", &self.approvals_to),
        ]
    }
}

/// Runs `sql` with those of `bounds` (and `extra`) it names.
fn run<T>(
    conn: &Connection,
    sql: &str,
    bounds: &Bounds,
    extra: &[(&'static str, &dyn ToSql)],
    get: impl FnOnce(&mut rusqlite::Statement<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut st = conn.prepare_cached(sql)?;
    for (name, value) in bounds.params().iter().chain(extra) {
        if let Some(i) = st.parameter_index(name)? {
            st.raw_bind_parameter(i, value)?;
        }
    }
    get(&mut st)
}

/// Where the agent's events may be removed up to: the start of its live heartbeat's
/// window (everything up to there was read by heartbeats that finished), or of the
/// earliest if there were several, but no later than the horizon. "" (nothing) when it
/// has no live heartbeat.
fn events_to(conn: &Connection, agent: &str, horizon: Timestamp) -> rusqlite::Result<String> {
    let frontier: Option<String> = conn
        .prepare_cached(
            "SELECT MIN(window_start) FROM heartbeats WHERE agent_id = ?1 \
             AND status IN ('PENDING', 'EXECUTING', 'PAUSED')",
        )?
        .query_row([agent], |r| r.get(0))?;
    let stamped = EventCursor::since(horizon).as_str().to_owned();
    Ok(frontier.map_or(String::new(), |f| f.min(stamped)))
}

impl SqliteStore {
    async fn prune_rows(
        &self,
        bounds: std::sync::Arc<Bounds>,
        rows: Doomed,
        apply: bool,
    ) -> Result<u64, StoreError> {
        let op = "prune records";
        if !apply {
            let sql = format!("SELECT COUNT(*) FROM {} WHERE {}", rows.table, rows.filter);
            return self
                .db
                .call(op, move |conn| {
                    run(conn, &sql, &bounds, &[], |st| {
                        st.raw_query().next()?.map_or(Ok(0), |r| r.get::<_, i64>(0))
                    })
                    .map(|n| n.max(0) as u64)
                    .map_err(sqlite_err(op))
                })
                .await;
        }
        let sql = format!(
            "DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} WHERE {filter} LIMIT :limit)",
            table = rows.table,
            key = rows.key,
            filter = rows.filter
        );
        let sql = std::sync::Arc::new(sql);
        let mut total = 0;
        // One call (so one transaction, and one turn of the connection) per batch.
        loop {
            let (sql, bounds) = (sql.clone(), bounds.clone());
            let n = self
                .db
                .call(op, move |conn| {
                    let started = Instant::now();
                    let limit = PRUNE_BATCH as i64;
                    let n = run(conn, &sql, &bounds, &[(":limit", &limit)], |st| {
                        st.raw_execute()
                    })
                    .map_err(sqlite_err(op))?;
                    tracing::trace!(rows = n, held = ?started.elapsed(), "pruned a batch");
                    Ok(n as u64)
                })
                .await?;
            total += n;
            if n < PRUNE_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

#[async_trait]
impl Maintenance for SqliteStore {
    async fn prune_agent(
        &self,
        agent: &AgentId,
        horizon: Timestamp,
        now: Timestamp,
        apply: bool,
    ) -> Result<Pruned, StoreError> {
        let id = agent.as_str().to_owned();
        let events_to = self
            .db
            .call("prune records", move |conn| {
                events_to(conn, &id, horizon).map_err(sqlite_err("prune records"))
            })
            .await?;
        let bounds = std::sync::Arc::new(Bounds {
            agent: agent.as_str().to_owned(),
            events_to,
            horizon: to_ms(horizon),
            turns_to: first_id_at("tn_", horizon),
            requests_to: first_id_at("wr_", horizon),
            now: to_ms(now),
            counts_to: hour_of(now) - COUNT_DAYS * 24,
            approvals_to: first_id_at("ap_", horizon),
        });
        let mut pruned = Pruned::default();
        for rows in doomed() {
            let count = rows.count;
            *count(&mut pruned) += self.prune_rows(bounds.clone(), rows, apply).await?;
        }
        Ok(pruned)
    }

    fn write_trouble(&self) -> Option<String> {
        self.db.write_trouble()
    }

    async fn recheck_writes(&self) -> Option<String> {
        self.db.recheck_writes().await
    }

    async fn reclaim(&self) -> Result<Reclaimed, StoreError> {
        self.reclaim_space(false).await
    }
}

/// Pages one incremental vacuum step frees: 1 MiB at the default page size.
const VACUUM_STEP_PAGES: i64 = 256;

fn size(conn: &Connection) -> rusqlite::Result<(u64, i64)> {
    let pages: i64 = conn.pragma_query_value(None, "page_count", |r| r.get(0))?;
    let page: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
    let free: i64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    Ok(((pages * page).max(0) as u64, free))
}

impl SqliteStore {
    /// Gives free pages back to the file system: by incremental vacuum, a step of
    /// [`VACUUM_STEP_PAGES`] per transaction, when the file has auto-vacuum (every file
    /// made by this release does). With `rebuild`, a file made before auto-vacuum is
    /// switched to it and rebuilt by one full `VACUUM`, which holds the write lock for as
    /// long as copying the whole file takes: `pulse prune --vacuum`, with `pulse serve`
    /// stopped.
    pub async fn reclaim_space(&self, rebuild: bool) -> Result<Reclaimed, StoreError> {
        let op = "reclaim space";
        let (bytes_before, mode) = self
            .db
            .call(op, |conn| {
                let (bytes, _) = size(conn).map_err(sqlite_err(op))?;
                let mode: i64 = conn
                    .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
                    .map_err(sqlite_err(op))?;
                Ok((bytes, mode))
            })
            .await?;
        // 0 none, 1 full, 2 incremental.
        if mode != 2 && rebuild {
            self.db
                .call_alone(op, |conn| {
                    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
                        .and_then(|()| conn.execute_batch("VACUUM"))
                        .map_err(sqlite_err(op))
                })
                .await?;
        } else if mode == 2 {
            let mut last = i64::MAX;
            loop {
                let free = self
                    .db
                    .call_alone(op, |conn| {
                        conn.execute_batch(&format!(
                            "PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})"
                        ))
                        .and_then(|()| size(conn))
                        .map(|(_, free)| free)
                        .map_err(sqlite_err(op))
                    })
                    .await?;
                // Stop when nothing is left, or a step freed nothing (never loop).
                if free == 0 || free >= last {
                    break;
                }
                last = free;
            }
        }
        let (bytes_after, mode) = self
            .db
            .call_alone(op, |conn| {
                // Copy the write-ahead log into the file and empty it, so the file
                // shrinks and the log does not keep the size the pass gave it. It
                // waits for readers (busy timeout) and holds writers for the copy.
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .map_err(sqlite_err(op))?;
                let (bytes, _) = size(conn).map_err(sqlite_err(op))?;
                let mode: i64 = conn
                    .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
                    .map_err(sqlite_err(op))?;
                Ok((bytes, mode))
            })
            .await?;
        Ok(Reclaimed {
            bytes_before,
            bytes_after,
            shrinks: mode == 2,
        })
    }
}
