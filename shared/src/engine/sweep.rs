//! The sweep: due heartbeats → conditional claims → jobs on their session groups.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::EngineSettings;
use crate::domain::{ClaimRequest, DedupId, EventCursor, Heartbeat, HeartbeatId, OutgoingTask};
use crate::error::chain;
use crate::meter;
use crate::ports::{SendFailure, SessionQueue, Store};

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Heartbeats the due index listed.
    pub due: usize,
    /// Heartbeats this sweep claimed.
    pub claimed: usize,
    /// Listed heartbeats it did not claim: another sweeper won, or the index was stale.
    pub skipped: usize,
    /// Jobs queued.
    pub queued: usize,
    /// Turns waiting on the model sent to be tried again (see `WaitingTurn`), and
    /// undelivered replies sent to be delivered again (see `Undelivered`).
    pub retried: usize,
    /// Approvals expired, and decisions queued again (see [`super::approvals::sweep`]).
    pub approvals: super::approvals::Expiry,
    /// Problems met (failed queries, claims or sends). A heartbeat claimed but not
    /// queued is picked up again when its lease expires.
    pub errors: Vec<SweepProblem>,
    /// How late the most overdue of the claimed heartbeats was: milliseconds from its
    /// due time to its claim (0 when none was claimed).
    pub lateness_max_ms: u64,
    /// The 99th percentile of the claims' lateness, in milliseconds.
    pub lateness_p99_ms: u64,
    /// Each claim's lateness, gathered across shards.
    #[serde(skip)]
    lateness: Vec<Duration>,
}

/// A problem one sweep met; displayed (and serialized) as the line an operator reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SweepProblem {
    /// A shard of the due index could not be read.
    #[error("due query of shard {shard}: {message}")]
    DueQuery {
        /// The shard.
        shard: u16,
        /// The store's error, with its causes.
        message: String,
    },
    /// A claim failed (not lost to another sweeper: that is a skip).
    #[error("claim of {heartbeat}: {message}")]
    Claim {
        /// The heartbeat.
        heartbeat: HeartbeatId,
        /// The store's error, with its causes.
        message: String,
    },
    /// The queue did not take one job of a batch.
    #[error("job {job} not queued ({why}); it is reclaimed when its lease expires")]
    NotQueued {
        /// The job's deduplication id.
        job: DedupId,
        /// The queue's reason.
        why: SendFailure,
    },
    /// The turns waiting on the model, or the undelivered replies, could not be read;
    /// they are tried at a later sweep.
    #[error("reading the turns that wait on the model or to be delivered again: {message}")]
    Waiting {
        /// The store's error, with its causes.
        message: String,
    },
    /// The open approvals could not be read or expired; they are at a later sweep.
    #[error("expiring approvals: {message}")]
    Approvals {
        /// The store's error, with its causes.
        message: String,
    },
    /// A whole batch could not be sent.
    #[error("sending {count} jobs: {message}; they are reclaimed when their leases expire")]
    Send {
        /// Jobs in the batch.
        count: usize,
        /// The queue's error, with its causes.
        message: String,
    },
}

impl Serialize for SweepProblem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Most waiting turns one sweep sends to be tried again.
const RETRIES_A_SWEEP: usize = 100;

/// Finds due heartbeats, claims them and queues their jobs.
pub struct Sweeper {
    store: Arc<dyn Store>,
    queue: Arc<dyn SessionQueue>,
    settings: EngineSettings,
}

impl Sweeper {
    /// A sweeper over a store and the sessions queue.
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn SessionQueue>,
        settings: EngineSettings,
    ) -> Self {
        Self {
            store,
            queue,
            settings,
        }
    }

    /// One sweep at `now`: every shard of the due index is read (concurrently), each due
    /// heartbeat is claimed, and the claimed ones are queued in batches. Safe to run
    /// concurrently with other sweeps: each heartbeat is claimed by exactly one.
    pub async fn sweep_once(&self, now: Timestamp) -> SweepReport {
        let budget = AtomicUsize::new(self.settings.sweep_max);
        // Claims from every shard meet here, so jobs go out in full batches of ten.
        let pending = Mutex::new(Vec::new());
        // Shards are walked a few at a time from a random starting point, so sweeps that
        // overlap (a slow sweep and the next minute's) mostly take different shards, and
        // find the ones already swept empty, instead of racing for every heartbeat.
        let shards = self.store.due_shards().max(1);
        let start = crate::entropy::below(u64::from(shards)) as u16;
        let order = (0..shards).map(|i| (start + i) % shards);
        let mut reports: Vec<SweepReport> = stream::iter(order)
            .map(|shard| self.sweep_shard(shard, now, &budget, &pending))
            .buffer_unordered(self.settings.shard_concurrency.max(1))
            .collect()
            .await;
        let rest = std::mem::take(&mut *lock(&pending));
        let mut last = SweepReport::default();
        self.queue_jobs(rest, &mut last).await;
        self.retry_waiting(now, &mut last).await;
        match super::approvals::sweep(self.store.as_ref(), self.queue.as_ref(), now).await {
            Ok(done) => last.approvals = done,
            Err(e) => last
                .errors
                .push(SweepProblem::Approvals { message: chain(&e) }),
        }
        reports.push(last);
        let mut total = SweepReport::default();
        for r in reports {
            total.due += r.due;
            total.claimed += r.claimed;
            total.skipped += r.skipped;
            total.queued += r.queued;
            total.retried += r.retried;
            total.approvals.expired += r.approvals.expired;
            total.approvals.requeued += r.approvals.requeued;
            total.errors.extend(r.errors);
            total.lateness.extend(r.lateness);
        }
        let (max, p99) = meter::max_and_p99(&total.lateness);
        total.lateness_max_ms = max.as_millis() as u64;
        total.lateness_p99_ms = p99.as_millis() as u64;
        meter::sweep(&total.lateness);
        if total.due > 0 || !total.errors.is_empty() {
            info!(
                due = total.due,
                claimed = total.claimed,
                lateness_max_ms = total.lateness_max_ms,
                skipped = total.skipped,
                queued = total.queued,
                errors = total.errors.len(),
                "sweep finished"
            );
        }
        total
    }

    async fn sweep_shard(
        &self,
        shard: u16,
        now: Timestamp,
        budget: &AtomicUsize,
        pending: &Mutex<Vec<(Heartbeat, Option<u64>)>>,
    ) -> SweepReport {
        let mut report = SweepReport::default();
        let mut page = None;
        loop {
            let want = self
                .settings
                .due_page_size
                .min(budget.load(Ordering::Relaxed));
            if want == 0 {
                break;
            }
            let due = match self.store.due(shard, now, page.take(), want).await {
                Ok(d) => d,
                Err(e) => {
                    report.errors.push(SweepProblem::DueQuery {
                        shard,
                        message: chain(&e),
                    });
                    break;
                }
            };
            report.due += due.ids.len();
            let claimed = self.claim_all(due.ids, now, budget, &mut report).await;
            report.claimed += claimed.len();
            let version = self.registry_version(&claimed).await;
            let full = {
                let mut pending = lock(pending);
                pending.extend(claimed.into_iter().map(|hb| (hb, version)));
                let whole = pending.len() / 10 * 10;
                pending.drain(..whole).collect()
            };
            self.queue_jobs(full, &mut report).await;
            match due.next {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        report
    }

    async fn claim_all(
        &self,
        mut ids: Vec<HeartbeatId>,
        now: Timestamp,
        budget: &AtomicUsize,
        report: &mut SweepReport,
    ) -> Vec<Heartbeat> {
        // Reserve budget for this page; what is not claimed is given back.
        let reserved = budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b - b.min(ids.len()))
            })
            .map_or(0, |before| before.min(ids.len()));
        report.skipped += ids.len() - reserved;
        ids.truncate(reserved);
        let req = ClaimRequest {
            now,
            lease: self.settings.lease,
            window_end: EventCursor::through(
                now.saturating_sub(self.settings.event_settle)
                    .unwrap_or(now),
            ),
        };
        let results = self
            .store
            .claim_many(&ids, &req, self.settings.claim_concurrency)
            .await;
        let mut claimed = Vec::new();
        for (id, r) in ids.into_iter().zip(results) {
            match r {
                Ok(Some(hb)) => {
                    debug!(heartbeat_id = %id, claim = hb.claim, "claimed");
                    let late = now.duration_since(hb.scheduled_at);
                    report
                        .lateness
                        .push(late.try_into().unwrap_or(Duration::ZERO));
                    claimed.push(hb);
                }
                Ok(None) => report.skipped += 1,
                Err(e) => report.errors.push(SweepProblem::Claim {
                    message: chain(&e),
                    heartbeat: id,
                }),
            }
        }
        budget.fetch_add(reserved - claimed.len(), Ordering::Relaxed);
        claimed
    }

    /// The registry version, read after `claimed` were claimed: their windows end before
    /// their claims, so a tool or subscription change made before any event they will
    /// read is in this version, and a worker holding an older registry reads it again.
    /// One read per page of claims; `None` (the worker then reads the registry) when it
    /// fails.
    async fn registry_version(&self, claimed: &[Heartbeat]) -> Option<u64> {
        if claimed.is_empty() {
            return None;
        }
        match self.store.registry_version().await {
            Ok(v) => Some(v),
            Err(e) => {
                warn!(error = %chain(&e), "the registry version could not be read: the workers read the registry afresh for these jobs");
                None
            }
        }
    }

    /// Sends the turns waiting on the model that are due to be tried again, the soonest
    /// due first, at most [`RETRIES_A_SWEEP`]. A try sent twice (sweeps that overlap)
    /// is one message (its deduplication id counts the tries), and a try that finds its
    /// turn answered or not yet due does nothing.
    async fn retry_waiting(&self, now: Timestamp, report: &mut SweepReport) {
        let waiting = match self.store.list_waiting(RETRIES_A_SWEEP).await {
            Ok(w) => w,
            Err(e) => {
                report
                    .errors
                    .push(SweepProblem::Waiting { message: chain(&e) });
                return;
            }
        };
        let mut due: Vec<OutgoingTask> = waiting
            .iter()
            .filter(|w| w.next_at <= now)
            .map(OutgoingTask::retry)
            .collect();
        // And the replies the channel did not take, due to be delivered again.
        match self.store.list_undelivered(RETRIES_A_SWEEP).await {
            Ok(undelivered) => due.extend(
                undelivered
                    .iter()
                    .filter(|u| !u.undeliverable() && u.next_at <= now)
                    .map(OutgoingTask::redeliver),
            ),
            Err(e) => report
                .errors
                .push(SweepProblem::Waiting { message: chain(&e) }),
        }
        for batch in due.chunks(self.queue.batch_size().max(1)) {
            let (sent, errors) = self.send_batch(batch.to_vec()).await;
            report.retried += sent;
            report.errors.extend(errors);
        }
    }

    async fn queue_jobs(&self, claimed: Vec<(Heartbeat, Option<u64>)>, report: &mut SweepReport) {
        if claimed.is_empty() {
            return;
        }
        // Each claim is a span its job carries on to the heartbeat's run, open until the
        // job is queued.
        let mut claims = Vec::with_capacity(claimed.len());
        let tasks: Vec<OutgoingTask> = claimed
            .into_iter()
            .map(|(hb, version)| {
                let claim = crate::traces::claim(&hb);
                let parent = crate::traces::traceparent(&claim);
                claims.push(claim);
                OutgoingTask::heartbeat(hb, version, parent)
            })
            .collect();
        // Batches of the queue's size (ten, one SQS SendMessageBatch each; more on the
        // embedded queue), a few in flight at once.
        let batches: Vec<Vec<OutgoingTask>> = tasks
            .chunks(self.queue.batch_size().max(1))
            .map(<[OutgoingTask]>::to_vec)
            .collect();
        let results: Vec<(usize, Vec<SweepProblem>)> = stream::iter(batches)
            .map(|batch| self.send_batch(batch))
            .buffer_unordered(4)
            .collect()
            .await;
        for (queued, errors) in results {
            report.queued += queued;
            report.errors.extend(errors);
        }
        drop(claims);
    }

    /// Sends one batch; returns how many were queued and what went wrong.
    async fn send_batch(&self, batch: Vec<OutgoingTask>) -> (usize, Vec<SweepProblem>) {
        match self.queue.send(&batch).await {
            Ok(r) => {
                let queued = batch.len() - r.failed.len();
                let errors = r
                    .failed
                    .into_iter()
                    .map(|(i, why)| SweepProblem::NotQueued {
                        job: batch[i].dedup_id.clone(),
                        why,
                    })
                    .collect();
                (queued, errors)
            }
            Err(e) => (
                0,
                vec![SweepProblem::Send {
                    count: batch.len(),
                    message: chain(&e),
                }],
            ),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
