//! The worker: a batch of queue messages in, the messages to redeliver out.
//!
//! Messages of one session (FIFO group) run in order; different sessions run
//! concurrently. Consecutive signals of a group are answered as one conversation turn.
//! The first failure in a group stops that group: its later messages are not run and are
//! reported failed with it, so the queue redelivers them in their order.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tracing::error;

use super::conversation::Conversation;
use super::heartbeat::HeartbeatRunner;
use crate::domain::{
    ConsolidateJob, Delivery, MessageId, Receipt, RedeliverJob, RetryJob, SessionTask, Signal,
    TaskDecodeError, TaskEnvelope,
};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::{SessionQueue, Settle};

/// The messages of a batch that must be delivered again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Message ids, in batch order.
    pub failed: Vec<MessageId>,
}

/// Why a task of the sessions queue did not run to its end; it is delivered again.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The message is not a task this release reads.
    #[error(transparent)]
    Undecodable(#[from] TaskDecodeError),
    /// Running it failed (storage, the model or Discord unavailable, ...).
    #[error(transparent)]
    Failed(#[from] EngineError),
    /// A signal, but this worker answers none.
    #[error("this worker has no conversation engine; signals wait")]
    NoConversation,
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
    conversation: Option<Arc<Conversation>>,
}

impl Worker {
    /// A worker running heartbeat jobs with `runner`; signals fail (and are redelivered)
    /// until a conversation engine is given with [`Worker::with_conversation`].
    pub fn new(runner: Arc<HeartbeatRunner>) -> Self {
        Self {
            runner,
            conversation: None,
        }
    }

    /// The worker, answering signals with `conversation`.
    pub fn with_conversation(mut self, conversation: Arc<Conversation>) -> Self {
        self.conversation = Some(conversation);
        self
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
        let failed: HashSet<MessageId> =
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

    async fn run_group(&self, msgs: Vec<&Delivery>) -> Vec<MessageId> {
        let mut i = 0;
        while i < msgs.len() {
            // A run of consecutive signals is one turn; anything else runs alone.
            let (n, result): (usize, Result<(), TaskError>) =
                match TaskEnvelope::decode(&msgs[i].body) {
                    Err(why) => (1, Err(why.into())),
                    Ok(envelope) => match envelope.task {
                        SessionTask::Heartbeat(job) => (
                            1,
                            self.runner
                                .run_job(&job)
                                .await
                                .map(|_| ())
                                .map_err(TaskError::from),
                        ),
                        SessionTask::Signal(job) => {
                            let mut signals = vec![job.signal];
                            for d in &msgs[i + 1..] {
                                match TaskEnvelope::decode(&d.body).map(|e| e.task) {
                                    Ok(SessionTask::Signal(next)) => signals.push(next.signal),
                                    _ => break,
                                }
                            }
                            (signals.len(), self.answer(&signals).await)
                        }
                        SessionTask::Consolidate(job) => (1, self.consolidate(&job).await),
                        SessionTask::Retry(job) => (1, self.retry(&job).await),
                        SessionTask::Redeliver(job) => (1, self.redeliver(&job).await),
                    },
                };
            if let Err(why) = result {
                let d = msgs[i];
                error!(
                    message_id = %d.message_id,
                    group = %d.group,
                    receive_count = d.receive_count,
                    error = %chain(&why),
                    "task failed; it and the rest of its group will be delivered again"
                );
                // Never run a message before the one ahead of it in its group.
                return msgs[i..].iter().map(|d| d.message_id.clone()).collect();
            }
            i += n;
        }
        Vec::new()
    }

    async fn answer(&self, signals: &[Signal]) -> Result<(), TaskError> {
        let Some(conversation) = &self.conversation else {
            return Err(TaskError::NoConversation);
        };
        conversation.run(signals).await?;
        Ok(())
    }

    async fn retry(&self, job: &RetryJob) -> Result<(), TaskError> {
        let Some(conversation) = &self.conversation else {
            return Err(TaskError::NoConversation);
        };
        conversation.retry(job).await?;
        Ok(())
    }

    async fn redeliver(&self, job: &RedeliverJob) -> Result<(), TaskError> {
        let Some(conversation) = &self.conversation else {
            return Err(TaskError::NoConversation);
        };
        conversation.redeliver(job).await?;
        Ok(())
    }

    async fn consolidate(&self, job: &ConsolidateJob) -> Result<(), TaskError> {
        let Some(conversation) = &self.conversation else {
            return Err(TaskError::NoConversation);
        };
        conversation.consolidate(job).await?;
        Ok(())
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
        // In the batch's order, stopping at the first that fails: a message whose ack
        // failed comes back, and so must every later one of its session, or it would run
        // again after them.
        let settled: Vec<(Receipt, Settle)> = batch
            .iter()
            .map(|d| {
                let settle = if outcome.failed.contains(&d.message_id) {
                    Settle::Release(retry_delay(d.receive_count))
                } else {
                    Settle::Delete
                };
                (d.receipt.clone(), settle)
            })
            .collect();
        queue.settle(&settled).await?;
        Ok(PollReport {
            received: batch.len(),
            failed: outcome.failed.len(),
        })
    }
}

impl Worker {
    /// Gives back the heartbeats whose jobs are still waiting in `queue`, for a worker
    /// that is stopping: each is put back to PENDING, due now, and its job deleted, so it
    /// is not left EXECUTING with no one to run it; the next sweep (of this process when
    /// it starts again, or of another) claims it afresh. Signals stay queued: they are
    /// received to reach the jobs behind them and handed back at the end (their receive
    /// count goes up by one). Returns how many heartbeats were released.
    pub async fn release_queued(&self, queue: &dyn SessionQueue) -> Result<usize, StoreError> {
        let mut held = Vec::new();
        let mut released = 0;
        let result = async {
            loop {
                // Held messages stay in flight, so each receive brings new ones.
                let batch = queue.receive(10, Duration::from_secs(60)).await?;
                if batch.is_empty() {
                    return Ok(());
                }
                for d in batch {
                    match TaskEnvelope::decode(&d.body).map(|e| e.task) {
                        Ok(SessionTask::Heartbeat(job)) => {
                            released += usize::from(self.runner.release(&job.heartbeat).await?);
                            queue.ack(&d.receipt).await?;
                        }
                        _ => held.push(d.receipt),
                    }
                }
            }
        }
        .await;
        for receipt in &held {
            queue.release(receipt, Duration::ZERO).await?;
        }
        result.map(|()| released)
    }
}

/// 1 s, 2 s, 4 s … up to a minute, by delivery count.
fn retry_delay(receive_count: u32) -> Duration {
    Duration::from_secs(1u64 << receive_count.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
