//! The sweep: due heartbeats → conditional claims → jobs on their session groups.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use serde::Serialize;
use tracing::{debug, info};

use super::EngineSettings;
use crate::domain::{ClaimRequest, EventCursor, Heartbeat, HeartbeatId, OutgoingTask};
use crate::error::{StoreError, chain};
use crate::ports::{SessionQueue, Store};

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
    /// Problems met (failed queries, claims or sends). A heartbeat claimed but not
    /// queued is picked up again when its lease expires.
    pub errors: Vec<String>,
}

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
        let shards = self.store.due_shards();
        let reports: Vec<SweepReport> = stream::iter(0..shards)
            .map(|shard| self.sweep_shard(shard, now, &budget))
            .buffer_unordered(usize::from(shards).max(1))
            .collect()
            .await;
        let mut total = SweepReport::default();
        for r in reports {
            total.due += r.due;
            total.claimed += r.claimed;
            total.skipped += r.skipped;
            total.queued += r.queued;
            total.errors.extend(r.errors);
        }
        if total.due > 0 || !total.errors.is_empty() {
            info!(
                due = total.due,
                claimed = total.claimed,
                skipped = total.skipped,
                queued = total.queued,
                errors = total.errors.len(),
                "sweep finished"
            );
        }
        total
    }

    async fn sweep_shard(&self, shard: u16, now: Timestamp, budget: &AtomicUsize) -> SweepReport {
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
                    report
                        .errors
                        .push(format!("due query of shard {shard}: {}", chain(&e)));
                    break;
                }
            };
            report.due += due.ids.len();
            let claimed = self.claim_all(due.ids, now, budget, &mut report).await;
            report.claimed += claimed.len();
            self.queue_jobs(claimed, &mut report).await;
            match due.next {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        report
    }

    async fn claim_all(
        &self,
        ids: Vec<HeartbeatId>,
        now: Timestamp,
        budget: &AtomicUsize,
        report: &mut SweepReport,
    ) -> Vec<Heartbeat> {
        let req = ClaimRequest {
            now,
            lease: self.settings.lease,
            window_end: EventCursor::through(
                now.saturating_sub(self.settings.event_settle)
                    .unwrap_or(now),
            ),
        };
        let results: Vec<(HeartbeatId, Result<Option<Heartbeat>, StoreError>)> = stream::iter(ids)
            .map(|id| {
                let req = &req;
                async move {
                    // Stop claiming once the sweep's budget is spent.
                    let take = budget
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                        .is_ok();
                    if !take {
                        return (id, Ok(None));
                    }
                    let r = self.store.claim(&id, req).await;
                    if !matches!(r, Ok(Some(_))) {
                        budget.fetch_add(1, Ordering::Relaxed);
                    }
                    (id, r)
                }
            })
            .buffer_unordered(self.settings.claim_concurrency.max(1))
            .collect()
            .await;
        let mut claimed = Vec::new();
        for (id, r) in results {
            match r {
                Ok(Some(hb)) => {
                    debug!(heartbeat_id = %id, claim = hb.claim, "claimed");
                    claimed.push(hb);
                }
                Ok(None) => report.skipped += 1,
                Err(e) => report.errors.push(format!("claim of {id}: {}", chain(&e))),
            }
        }
        claimed
    }

    async fn queue_jobs(&self, claimed: Vec<Heartbeat>, report: &mut SweepReport) {
        if claimed.is_empty() {
            return;
        }
        let tasks: Vec<OutgoingTask> = claimed.into_iter().map(OutgoingTask::heartbeat).collect();
        // Batches of ten (one SQS SendMessageBatch each), a few in flight at once. Each
        // batch yields how many were queued and what went wrong.
        let results: Vec<(usize, Vec<String>)> = stream::iter(tasks.chunks(10))
            .map(|chunk| async move {
                match self.queue.send(chunk).await {
                    Ok(r) => {
                        let errors = r
                            .failed
                            .iter()
                            .map(|(i, why)| {
                                format!(
                                    "job {} not queued ({why}); it is reclaimed when its lease expires",
                                    chunk[*i].dedup_id
                                )
                            })
                            .collect();
                        (chunk.len() - r.failed.len(), errors)
                    }
                    Err(e) => (
                        0,
                        vec![format!(
                            "sending {} jobs: {}; they are reclaimed when their leases expire",
                            chunk.len(),
                            chain(&e)
                        )],
                    ),
                }
            })
            .buffer_unordered(4)
            .collect()
            .await;
        for (queued, errors) in results {
            report.queued += queued;
            report.errors.extend(errors);
        }
    }
}
