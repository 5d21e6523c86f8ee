//! The worker: a batch of queue messages in, the messages to redeliver out.
//!
//! Messages of one session (FIFO group) run in order; different sessions run
//! concurrently. The first failure in a group stops that group: its later messages are not
//! run and are reported failed with it, so the queue redelivers them in their order.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tracing::error;

use super::heartbeat::HeartbeatRunner;
use crate::domain::{Delivery, SessionTask, TaskEnvelope};
use crate::error::{StoreError, chain};
use crate::ports::SessionQueue;

/// The messages of a batch that must be delivered again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Message ids, in batch order.
    pub failed: Vec<String>,
}

/// What one poll of the queue did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Messages received.
    pub received: usize,
    /// Of those, how many will be delivered again.
    pub failed: usize,
}

/// Runs session tasks.
pub struct Worker {
    runner: Arc<HeartbeatRunner>,
}

impl Worker {
    /// A worker running heartbeat jobs with `runner`.
    pub fn new(runner: Arc<HeartbeatRunner>) -> Self {
        Self { runner }
    }

    /// Processes a batch in order per group; returns the messages to redeliver.
    pub async fn process_batch(&self, batch: &[Delivery]) -> BatchOutcome {
        let mut groups: Vec<(&str, Vec<&Delivery>)> = Vec::new();
        for d in batch {
            match groups.iter_mut().find(|(g, _)| *g == d.group) {
                Some((_, msgs)) => msgs.push(d),
                None => groups.push((&d.group, vec![d])),
            }
        }
        let failed: HashSet<String> =
            join_all(groups.into_iter().map(|(_, msgs)| self.run_group(msgs)))
                .await
                .into_iter()
                .flatten()
                .collect();
        BatchOutcome {
            failed: batch
                .iter()
                .filter(|d| failed.contains(&d.message_id))
                .map(|d| d.message_id.clone())
                .collect(),
        }
    }

    async fn run_group(&self, msgs: Vec<&Delivery>) -> Vec<String> {
        let mut failed = Vec::new();
        for d in msgs {
            if !failed.is_empty() {
                // Never run a message before the one ahead of it in its group.
                failed.push(d.message_id.clone());
                continue;
            }
            if let Err(why) = self.run_one(d).await {
                error!(
                    message_id = %d.message_id,
                    group = %d.group,
                    receive_count = d.receive_count,
                    error = %why,
                    "task failed; it and the rest of its group will be delivered again"
                );
                failed.push(d.message_id.clone());
            }
        }
        failed
    }

    async fn run_one(&self, d: &Delivery) -> Result<(), String> {
        let envelope = TaskEnvelope::decode(&d.body)?;
        match envelope.task {
            SessionTask::Heartbeat(job) => self
                .runner
                .run(&job.heartbeat)
                .await
                .map(|_| ())
                .map_err(|e| chain(&e)),
        }
    }

    /// Receives one batch from `queue`, runs it, deletes what succeeded and releases what
    /// failed for a retry with backoff. Used where no Lambda event source does this
    /// (`pulse serve`, `pulse sweep`).
    pub async fn poll_once(
        &self,
        queue: &dyn SessionQueue,
        max: usize,
        visibility: Duration,
    ) -> Result<PollReport, StoreError> {
        let batch = queue.receive(max, visibility).await?;
        if batch.is_empty() {
            return Ok(PollReport::default());
        }
        let outcome = self.process_batch(&batch).await;
        for d in &batch {
            if outcome.failed.contains(&d.message_id) {
                queue
                    .release(&d.receipt, retry_delay(d.receive_count))
                    .await?;
            } else {
                queue.ack(&d.receipt).await?;
            }
        }
        Ok(PollReport {
            received: batch.len(),
            failed: outcome.failed.len(),
        })
    }
}

/// 1 s, 2 s, 4 s … up to a minute, by delivery count.
fn retry_delay(receive_count: u32) -> Duration {
    Duration::from_secs(1u64 << receive_count.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
