//! Inbound webhooks on SQLite: the webhooks, their request log, the delivery ids they
//! remember and their hourly counters.
//!
//! An acceptance is one IMMEDIATE transaction (or part of one: see [`Batcher`]) —
//! the delivery-id check, the counter and the writes — so two requests with one delivery
//! id can never both append an event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

use super::codec::{delete_with, from_doc, read_sealed, to_doc};
use super::events::{INSERT_NEW_EVENT, write_event};
use super::sqlite_err;
use super::{CachedExecute, SqliteStore};
use crate::domain::{AcceptOutcome, Acceptance};
use crate::domain::{
    AgentId, EventId, REFUSED_LOG_BUDGET, RateLimit, RequestId, RequestStatus, Webhook, WebhookId,
    WebhookRequest, to_ms,
};
use crate::error::StoreError;
use crate::ports::WebhookStore;

fn insert_log(conn: &Connection, r: &WebhookRequest) -> Result<(), StoreError> {
    write_log(
        conn,
        r,
        "INSERT OR REPLACE INTO webhook_requests (webhook_id, id, doc) VALUES (?1, ?2, ?3)",
    )
}

/// Logs an accepted request, whose entry is new: a plain insert, with no statement
/// journal (see [`INSERT_NEW_EVENT`]).
fn insert_new_log(conn: &Connection, r: &WebhookRequest) -> Result<(), StoreError> {
    write_log(
        conn,
        r,
        "INSERT INTO webhook_requests (webhook_id, id, doc) VALUES (?1, ?2, ?3)",
    )
}

fn write_log(conn: &Connection, r: &WebhookRequest, sql: &str) -> Result<(), StoreError> {
    let doc = accepted_doc(r).unwrap_or_else(|| to_doc(r));
    conn.prepare_cached(sql)
        .and_then(|mut st| st.execute(params![r.webhook_id.as_str(), r.id.as_str(), doc]))
        .map_err(sqlite_err("log webhook request"))?;
    Ok(())
}

/// An accepted request's entry as stored: a JSON array of what only it holds,
///
/// `[agent_id, received_at (ns since the epoch), source_ip, delivery_id, event_type,
/// event_id, body_bytes]`,
///
/// about 140 bytes where its whole document is 350. The webhook and the entry's id are
/// the row's key columns, and the statuses (ACCEPTED, 200) go without saying. Nearly
/// every request logged is an accepted one, and the log's pages are a third of what an
/// acceptance's commit writes. `None` for any other entry, which is stored as its
/// document; [`read_log`] reads both.
fn accepted_doc(r: &WebhookRequest) -> Option<String> {
    // Every field is named, so that a field added to the entry cannot be left out of
    // the short form unnoticed.
    let WebhookRequest {
        id: _,
        webhook_id: _,
        agent_id,
        received_at,
        status: RequestStatus::Accepted,
        http_status: 200,
        reason: None,
        source_ip,
        delivery_id,
        event_type: Some(event_type),
        event_id: Some(event_id),
        body_bytes,
        body: None,
        count: None,
    } = r
    else {
        return None;
    };
    let received = i64::try_from(received_at.as_nanosecond()).ok()?;
    Some(to_doc(&AcceptedRow(
        agent_id,
        received,
        source_ip.as_deref(),
        delivery_id.as_deref(),
        event_type.as_str(),
        event_id,
        *body_bytes,
    )))
}

/// The fields of an accepted request's stored entry, in order (see [`accepted_doc`]):
/// borrowed from the entry to write it, owned to read it back.
#[derive(serde::Serialize, serde::Deserialize)]
struct AcceptedRow<Agent, Text, EventKey>(
    Agent,
    i64,
    Option<Text>,
    Option<Text>,
    Text,
    EventKey,
    usize,
);

/// A stored log entry of `webhook` with id `key`, in either form (see [`accepted_doc`]).
fn read_log(webhook: &WebhookId, key: &str, doc: &str) -> Result<WebhookRequest, StoreError> {
    if !doc.starts_with('[') {
        return from_doc(key, doc);
    }
    let AcceptedRow(agent_id, received, source_ip, delivery_id, event_type, event_id, body_bytes) =
        from_doc::<AcceptedRow<AgentId, String, EventId>>(key, doc)?;
    Ok(WebhookRequest {
        id: RequestId::parse(key).map_err(|e| StoreError::corrupt(key, e))?,
        webhook_id: webhook.clone(),
        agent_id,
        received_at: Timestamp::from_nanosecond(received.into())
            .map_err(|e| StoreError::corrupt(key, e))?,
        status: RequestStatus::Accepted,
        http_status: 200,
        reason: None,
        source_ip,
        delivery_id,
        event_type: Some(event_type),
        event_id: Some(event_id),
        body_bytes,
        body: None,
        count: None,
    })
}

/// Logs a request that was not accepted, within the webhook's budget: the first
/// [`REFUSED_LOG_BUDGET`] of a minute in full, the rest counted in the minute's SUPPRESSED
/// entry. Run inside a transaction.
fn log_refused(conn: &Connection, r: &WebhookRequest) -> Result<(), StoreError> {
    let op = sqlite_err("log webhook request");
    let minute = r.minute();
    let count: i64 = conn
        .prepare_cached(
            "INSERT INTO webhook_log_budget (webhook_id, minute, count) VALUES (?1, ?2, 1) \
             ON CONFLICT (webhook_id, minute) DO UPDATE SET count = count + 1 RETURNING count",
        )
        .and_then(|mut st| st.query_row(params![r.webhook_id.as_str(), minute], |row| row.get(0)))
        .map_err(&op)?;
    if count == 1 {
        conn.exec(
            "DELETE FROM webhook_log_budget WHERE webhook_id = ?1 AND minute < ?2",
            params![r.webhook_id.as_str(), minute],
        )
        .map_err(&op)?;
    }
    let count = count.max(0) as u64;
    if count <= REFUSED_LOG_BUDGET {
        insert_log(conn, r)
    } else {
        insert_log(
            conn,
            &WebhookRequest::suppressed(
                &r.webhook_id,
                &r.agent_id,
                minute,
                count - REFUSED_LOG_BUDGET,
            ),
        )
    }
}

/// The name of the thread that commits webhook acceptances (`pulse bench receive` reads
/// its CPU time by it).
pub const ACCEPT_THREAD: &str = "pulse-accept";

/// Commits made by the acceptance threads of every store in this process, and the
/// acceptances they held (see [`WriteCounts`](super::WriteCounts)).
pub(super) static ACCEPT_COMMITS: AtomicU64 = AtomicU64::new(0);
pub(super) static ACCEPTANCES: AtomicU64 = AtomicU64::new(0);

type Job = (
    Arc<Acceptance>,
    tokio::sync::oneshot::Sender<Result<AcceptOutcome, StoreError>>,
);

/// Most acceptances committed in one transaction.
const BATCH: usize = 256;

/// Group commit for webhook acceptances: one thread takes every acceptance waiting and
/// writes them in one transaction (one failing does not undo the others: see
/// [`commit_batch`]), then answers each. Under load, hundreds of requests share one
/// commit instead of queueing for the connection one by one; alone, a request commits at
/// once. Results are as if run one after another: a delivery id accepted earlier in the
/// batch makes a later one a duplicate.
pub(super) struct Batcher {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
}

impl Batcher {
    fn start(db: super::Db) -> Self {
        // A simulated database runs every call on the caller's thread, in the order the
        // run reaches it: a writer thread would decide that order itself (and the run's
        // virtual time would move on while it waited). Each acceptance commits inline.
        if db.inline {
            return Self { jobs: None };
        }
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name(ACCEPT_THREAD.into())
            .spawn(move || {
                let mut last = 0;
                // Ends when the store (the last sender) is dropped.
                while let Ok(first) = rx.recv() {
                    let jobs = gather(&rx, first, last, || std::thread::sleep(GATHER_WAIT));
                    last = jobs.len();
                    ACCEPT_COMMITS.fetch_add(1, Ordering::Relaxed);
                    ACCEPTANCES.fetch_add(jobs.len() as u64, Ordering::Relaxed);
                    let results = db.blocking(|conn| {
                        let before = conn.total_changes();
                        let results = commit_batch(conn, &jobs, db.deadline.as_ref());
                        let failed = results.iter().find_map(|r| r.as_ref().err());
                        super::note_writes(&db.trouble, conn.total_changes() != before, failed);
                        results
                    });
                    for ((_, reply), r) in jobs.into_iter().zip(results) {
                        let _ = reply.send(r);
                    }
                }
            });
        Self {
            jobs: spawned.ok().map(|_| tx),
        }
    }
}

/// How long the acceptance thread waits, once, for more acceptances when it finds fewer
/// than its last batch held.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_micros(50);

/// `first` and the acceptances waiting behind it, up to [`BATCH`]. When they are fewer
/// than the last batch (`last`), requests are still arriving: the thread waits once
/// (`wait`: a sleep of [`GATHER_WAIT`]) and takes those that came meanwhile. A commit
/// costs about the same for one acceptance as for ten (the pages every commit writes: the
/// last leaf of each table, the levels above), so under load the batches grow from about
/// 6 to about 12 and the commit's share of each acceptance halves, while the sleep leaves
/// the CPU to the threads preparing the next requests (and a sleeping thread, unlike one
/// waiting on the channel, needs no wake from each sender). A request alone (the last
/// batch was one) is committed at once.
fn gather<T>(
    rx: &std::sync::mpsc::Receiver<T>,
    first: T,
    last: usize,
    mut wait: impl FnMut(),
) -> Vec<T> {
    let mut jobs = vec![first];
    let mut waited = false;
    while jobs.len() < BATCH {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(std::sync::mpsc::TryRecvError::Empty) if !waited && jobs.len() < last => {
                waited = true;
                wait();
            }
            Err(_) => break,
        }
    }
    jobs
}

/// Commits `jobs` in one transaction. Most batches fail nowhere, so the first attempt
/// runs them with no savepoints: a savepoint copies every page a job touches before the
/// job changes it, which was a tenth of the writer thread's time. When a job fails, that
/// attempt is rolled back and the batch is run again with a savepoint each, so that the
/// failure is that job's alone.
fn commit_batch(
    conn: &mut Connection,
    jobs: &[Job],
    deadline: Option<&super::EventDeadline>,
) -> Vec<Result<AcceptOutcome, StoreError>> {
    if let Some(results) = commit_all(conn, jobs, deadline) {
        return results.into_iter().map(Ok).collect();
    }
    commit_each(conn, jobs, deadline)
}

/// The batch with no savepoints: every result, or `None` (nothing written) when a job or
/// the commit failed.
fn commit_all(
    conn: &mut Connection,
    jobs: &[Job],
    deadline: Option<&super::EventDeadline>,
) -> Option<Vec<AcceptOutcome>> {
    let tx = super::begin(conn).ok()?;
    let mut results = Vec::with_capacity(jobs.len());
    for (a, _) in jobs {
        // On an error the transaction is dropped, which rolls it back.
        results.push(accept_in(&tx, a, deadline).ok()?);
    }
    tx.commit().ok()?;
    Some(results)
}

/// The batch with a savepoint each, so that one failing does not undo the others.
fn commit_each(
    conn: &mut Connection,
    jobs: &[Job],
    deadline: Option<&super::EventDeadline>,
) -> Vec<Result<AcceptOutcome, StoreError>> {
    let op = sqlite_err("accept webhook request");
    let all_fail = |e: StoreError| -> Vec<Result<AcceptOutcome, StoreError>> {
        let msg = crate::error::chain(&e);
        jobs.iter()
            .map(|_| {
                Err(StoreError::backend(
                    "sqlite",
                    "accept webhook request",
                    msg.clone(),
                ))
            })
            .collect()
    };
    let mut tx = match super::begin(conn) {
        Ok(tx) => tx,
        Err(e) => return all_fail(op(e)),
    };
    let mut results = Vec::with_capacity(jobs.len());
    for (a, _) in jobs {
        let r = match tx.savepoint() {
            Ok(sp) => match accept_in(&sp, a, deadline) {
                Ok(outcome) => sp.commit().map_err(&op).map(|()| outcome),
                Err(e) => {
                    let _ = sp.rollback();
                    Err(e)
                }
            },
            Err(e) => Err(op(e)),
        };
        results.push(r);
    }
    match tx.commit() {
        Ok(()) => results,
        // A statement's failure may have rolled the whole transaction back (SQLite does
        // on a full disk), so the commit finds none: that failure says why.
        Err(e) => all_fail(
            results
                .into_iter()
                .find_map(Result::err)
                .unwrap_or_else(|| op(e)),
        ),
    }
}

/// One acceptance inside a transaction: dedup, count, write.
///
/// The replay key is inserted first, unless present already: for a new delivery (nearly
/// every request) one statement both checks and remembers it. Only a key seen before is
/// read back, and only a request over the rate limit takes its key out again (the key of
/// a request refused for its rate is not remembered: it may be sent again later).
fn accept_in(
    tx: &Connection,
    a: &Acceptance,
    deadline: Option<&super::EventDeadline>,
) -> Result<AcceptOutcome, StoreError> {
    let op = sqlite_err("accept webhook request");
    let hook = a.log.webhook_id.as_str();
    let now = a.log.received_at;
    // The key is remembered with its event's id, or '' when the request is refused.
    let event_id = if a.refusal.is_some() {
        ""
    } else {
        a.event.id.as_str()
    };
    let new = tx
        .prepare_cached(
            "INSERT INTO webhook_deliveries (webhook_id, delivery_id, event_id, expires_ms) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (webhook_id, delivery_id) DO NOTHING",
        )
        .and_then(|mut st| {
            st.execute(params![
                hook,
                a.replay_key,
                event_id,
                to_ms(a.remember_until)
            ])
        })
        .map_err(&op)?
        == 1;
    if !new {
        let first: String = tx
            .prepare_cached(
                "SELECT event_id FROM webhook_deliveries WHERE webhook_id = ?1 AND delivery_id = ?2",
            )
            .and_then(|mut st| st.query_row(params![hook, a.replay_key], |r| r.get(0)))
            .map_err(&op)?;
        let outcome = if first.is_empty() {
            AcceptOutcome::RefusedBefore
        } else {
            AcceptOutcome::Duplicate(
                EventId::parse(&first).map_err(|e| StoreError::corrupt("webhook_deliveries", e))?,
            )
        };
        log_refused(tx, &a.log_for(&outcome))?;
        return Ok(outcome);
    }
    if a.refusal.is_some() {
        let outcome = AcceptOutcome::Refused;
        insert_log(tx, &a.log_for(&outcome))?;
        return Ok(outcome);
    }
    if let Some(limit) = a.rate_limit {
        let window = RateLimit::window(now);
        let count: Option<i64> = tx
            .prepare_cached(
                "INSERT INTO webhook_counters (webhook_id, window, count) VALUES (?1, ?2, 1) \
                 ON CONFLICT (webhook_id, window) DO UPDATE SET count = count + 1 \
                 WHERE count < ?3 RETURNING count",
            )
            .and_then(|mut st| {
                st.query_row(params![hook, window, limit.per_hour], |r| r.get(0))
                    .optional()
            })
            .map_err(&op)?;
        match count {
            None => {
                tx.exec(
                    "DELETE FROM webhook_deliveries WHERE webhook_id = ?1 AND delivery_id = ?2",
                    params![hook, a.replay_key],
                )
                .map_err(&op)?;
                let outcome = AcceptOutcome::RateLimited;
                log_refused(tx, &a.log_for(&outcome))?;
                return Ok(outcome);
            }
            // The hour's first request: the counters of past hours go (as a minute's
            // first refusal takes the past minutes' log budgets). Delivery ids and the
            // request log are removed by the retention pass (`Maintenance::prune_agent`).
            Some(1) => {
                tx.exec(
                    "DELETE FROM webhook_counters WHERE webhook_id = ?1 AND window < ?2",
                    params![hook, window],
                )
                .map_err(&op)?;
            }
            Some(_) => {}
        }
    }
    write_event(tx, &a.event, deadline, INSERT_NEW_EVENT)?;
    insert_new_log(tx, &a.log_for(&AcceptOutcome::Accepted))?;
    Ok(AcceptOutcome::Accepted)
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn create_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        let w = self.keys.seal_webhook(webhook)?;
        self.db
            .call("create webhook", move |conn| {
                let n = conn
                    .exec(
                        "INSERT INTO webhooks (id, agent_id, doc) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![w.id.as_str(), w.agent_id.as_str(), to_doc(&w)],
                    )
                    .map_err(sqlite_err("create webhook"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("webhook {}", w.id)));
                }
                Ok(())
            })
            .await
    }

    async fn get_webhook(&self, id: &WebhookId) -> Result<Option<Webhook>, StoreError> {
        let id = id.clone();
        let keys = self.keys.clone();
        self.db
            .call("get webhook", move |conn| {
                Ok(read_sealed(
                    conn,
                    "get webhook",
                    "webhooks",
                    "SELECT id, doc FROM webhooks WHERE id = ?1",
                    [id.as_str()],
                    &keys,
                    true,
                )?
                .pop())
            })
            .await
    }

    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError> {
        let keys = self.keys.clone();
        self.db
            .call("list webhooks", move |conn| {
                read_sealed(
                    conn,
                    "list webhooks",
                    "webhooks",
                    "SELECT id, doc FROM webhooks ORDER BY id",
                    [],
                    &keys,
                    false,
                )
            })
            .await
    }

    async fn update_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        let w = self.keys.seal_webhook(webhook)?;
        self.db
            .call("update webhook", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE webhooks SET doc = ?2 WHERE id = ?1",
                        params![w.id.as_str(), to_doc(&w)],
                    )
                    .map_err(sqlite_err("update webhook"))?;
                if n == 0 {
                    return Err(StoreError::NotFound(format!("webhook {}", w.id)));
                }
                Ok(())
            })
            .await
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("delete webhook", move |conn| {
                delete_with(
                    conn,
                    "delete webhook",
                    "DELETE FROM webhooks WHERE id = ?1",
                    &[
                        "DELETE FROM webhook_requests WHERE webhook_id = ?1",
                        "DELETE FROM webhook_deliveries WHERE webhook_id = ?1",
                        "DELETE FROM webhook_counters WHERE webhook_id = ?1",
                        "DELETE FROM webhook_log_budget WHERE webhook_id = ?1",
                    ],
                    id.as_str(),
                    format!("webhook {id}"),
                )
            })
            .await
    }

    async fn accept_webhook(
        &self,
        acceptance: Arc<Acceptance>,
    ) -> Result<AcceptOutcome, StoreError> {
        let batcher = self.accepts.get_or_init(|| Batcher::start(self.db.clone()));
        let (reply, answer) = tokio::sync::oneshot::channel();
        if let Some(jobs) = &batcher.jobs
            && jobs.send((acceptance.clone(), reply)).is_ok()
            && let Ok(result) = answer.await
        {
            return result;
        }
        // No writer thread: one transaction of its own.
        let deadline = self.db.deadline.clone();
        self.db
            .call("accept webhook request", move |conn| {
                let op = sqlite_err("accept webhook request");
                let tx = super::begin(conn).map_err(&op)?;
                let outcome = accept_in(&tx, &acceptance, deadline.as_ref())?;
                tx.commit().map_err(&op)?;
                Ok(outcome)
            })
            .await
    }

    async fn log_request(&self, request: &WebhookRequest) -> Result<(), StoreError> {
        let r = request.clone();
        self.db
            .call("log webhook request", move |conn| {
                let op = sqlite_err("log webhook request");
                let tx = super::begin(conn).map_err(&op)?;
                log_refused(&tx, &r)?;
                tx.commit().map_err(&op)
            })
            .await
    }

    async fn list_requests(
        &self,
        id: &WebhookId,
        limit: usize,
    ) -> Result<Vec<WebhookRequest>, StoreError> {
        let id = id.clone();
        self.db
            .call("list webhook requests", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT id, doc FROM webhook_requests WHERE webhook_id = ?1 ORDER BY id DESC LIMIT ?2",
                    )
                    .map_err(sqlite_err("list webhook requests"))?;
                let rows = st
                    .query_map(params![id.as_str(), limit as i64], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                    })
                    .map_err(sqlite_err("list webhook requests"))?;
                let mut out = Vec::new();
                for row in rows {
                    let (key, doc) = row.map_err(sqlite_err("list webhook requests"))?;
                    out.push(read_log(&id, &key, &doc)?);
                }
                Ok(out)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};
    use serde_json::json;

    use super::*;
    use crate::domain::{AgentId, NewEvent, WebhookScheme};
    use crate::ports::ManualClock;

    /// A new delivery `key` to `webhook`, its event stamped at `stamped`.
    fn job(webhook: &Webhook, key: &str, stamped: Timestamp) -> Job {
        let event = NewEvent::new("NOTE", json!({ "key": key }), None)
            .unwrap()
            .into_event(webhook.agent_id.clone(), "webhook", stamped)
            .into_raw();
        let acceptance = Acceptance {
            event,
            log: WebhookRequest::arrived(webhook, stamped, b"{}", None),
            replay_key: key.to_owned(),
            rate_limit: None,
            excerpt: String::new(),
            remember_until: stamped + SignedDuration::from_hours(1),
            refusal: None,
        };
        (Arc::new(acceptance), tokio::sync::oneshot::channel().0)
    }

    /// A Pulse-scheme webhook of a new agent, made at `now`.
    fn webhook(now: Timestamp) -> Webhook {
        Webhook::new(
            AgentId::generate(),
            WebhookScheme::Pulse,
            "a-secret-of-enough-characters",
            now,
        )
        .unwrap()
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    /// A batch is first written with no savepoints; when one of its acceptances fails
    /// (here, an event stamped longer ago than the write deadline), the others are
    /// written all the same, with the outcomes they would have had one after another.
    #[test]
    fn an_acceptance_that_fails_in_a_batch_fails_alone() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&conn, std::path::Path::new(":memory:")).unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let deadline = super::super::EventDeadline {
            clock: Arc::new(ManualClock::new(now)),
            within: std::time::Duration::from_secs(1),
        };
        let webhook = webhook(now);

        // Nothing fails: one transaction, every outcome as if one after another.
        let jobs = [job(&webhook, "a", now), job(&webhook, "a", now)];
        let results = commit_batch(&mut conn, &jobs, Some(&deadline));
        let first = jobs[0].0.event.id.clone();
        assert!(
            matches!(results[0], Ok(AcceptOutcome::Accepted)),
            "{results:?}"
        );
        assert!(
            matches!(&results[1], Ok(AcceptOutcome::Duplicate(id)) if *id == first),
            "{results:?}"
        );

        let late = now - SignedDuration::from_secs(3);
        let jobs = [
            job(&webhook, "b", now),
            job(&webhook, "c", late),
            job(&webhook, "b", now),
            job(&webhook, "d", now),
        ];
        let results = commit_batch(&mut conn, &jobs, Some(&deadline));
        let b = jobs[0].0.event.id.clone();
        assert!(
            matches!(results[0], Ok(AcceptOutcome::Accepted)),
            "{results:?}"
        );
        let why = crate::error::chain(results[1].as_ref().unwrap_err());
        assert!(why.contains("send it again"), "{why}");
        assert!(
            matches!(&results[2], Ok(AcceptOutcome::Duplicate(id)) if *id == b),
            "{results:?}"
        );
        assert!(
            matches!(results[3], Ok(AcceptOutcome::Accepted)),
            "{results:?}"
        );
        // a, b and d: the late event and its delivery id were not written.
        assert_eq!(count(&conn, "events"), 3);
        assert_eq!(count(&conn, "webhook_deliveries"), 3);
    }

    /// An accepted request's entry is stored in its short form and read back whole; every
    /// other entry, and an accepted one stored as a whole document (as before the short
    /// form), reads back as written.
    #[test]
    fn accepted_entries_are_stored_short_and_read_back_whole() {
        let conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&conn, std::path::Path::new(":memory:")).unwrap();
        // A time with nanoseconds: the short form keeps them.
        let now = Timestamp::new(1_800_000_000, 123_456_789).unwrap();
        let webhook = webhook(now);
        let body = br#"{"event_type":"ORDER_PLACED","payload":{"order":1}}"#;
        let mut arrived = WebhookRequest::arrived(&webhook, now, body, Some("10.0.0.7".into()));
        arrived.delivery_id = Some("delivery-1".into());
        arrived.event_type = Some("ORDER_PLACED".into());
        let accepted = arrived
            .clone()
            .accepted(&EventId::generate(1_800_000_000_123));
        let mut refused = arrived.refuse(RequestStatus::Rejected, 403, "not allowed", body);
        refused.id = RequestId::generate(1_800_000_000_124);
        let mut old = WebhookRequest::arrived(&webhook, now, b"{}", None);
        old.received_at = Timestamp::from_second(1_700_000_000).unwrap();
        let old = old.accepted(&EventId::generate(1_700_000_000_000));

        insert_new_log(&conn, &accepted).unwrap();
        insert_log(&conn, &refused).unwrap();
        conn.execute(
            "INSERT INTO webhook_requests (webhook_id, id, doc) VALUES (?1, ?2, ?3)",
            params![old.webhook_id.as_str(), old.id.as_str(), to_doc(&old)],
        )
        .unwrap();

        let stored = |r: &WebhookRequest| -> String {
            conn.query_row(
                "SELECT doc FROM webhook_requests WHERE id = ?1",
                [r.id.as_str()],
                |row| row.get(0),
            )
            .unwrap()
        };
        let short = stored(&accepted);
        assert!(short.starts_with('[') && short.len() < 160, "{short}");
        assert!(short.len() * 2 < to_doc(&accepted).len(), "{short}");
        assert!(stored(&refused).starts_with('{'));
        for r in [&accepted, &refused, &old] {
            assert_eq!(
                &read_log(&webhook.id, r.id.as_str(), &stored(r)).unwrap(),
                r
            );
        }
        // A damaged short entry is reported as corrupt, with its key.
        let err = read_log(&webhook.id, accepted.id.as_str(), "[1, 2]").unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { key, .. } if *key == accepted.id.as_str()),
            "{err:?}"
        );
    }

    /// The batch waits once for more when it is smaller than the last, and takes what
    /// arrived meanwhile; it does not wait when it is as large as the last (or the last
    /// was none), and never grows past [`BATCH`].
    #[test]
    fn a_batch_smaller_than_the_last_waits_once_for_more() {
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(2).unwrap();
        let mut waits = 0;
        // Two waiting, the last batch held five: one wait, during which 3 and 4 arrive.
        let jobs = gather(&rx, 1, 5, || {
            waits += 1;
            tx.send(3).unwrap();
            tx.send(4).unwrap();
        });
        assert_eq!(jobs, [1, 2, 3, 4]);
        assert_eq!(waits, 1, "it waits once, though still fewer than five");

        // As many as the last batch, or no last batch: no wait.
        for last in [0, 1, 2] {
            tx.send(2).unwrap();
            let jobs = gather(&rx, 1, last, || {
                panic!("waited with a last batch of {last}")
            });
            assert_eq!(jobs, [1, 2]);
        }

        // A full batch leaves the rest for the next.
        for i in 0..BATCH + 10 {
            tx.send(i).unwrap();
        }
        let jobs = gather(&rx, 0, BATCH, || panic!("waited with a full batch"));
        assert_eq!(jobs.len(), BATCH);
        assert_eq!(rx.try_iter().count(), 11);
    }
}
