//! The two queues: sessions (FIFO per session) and hooks (delayed, redelivered).

use std::time::Duration;

use async_trait::async_trait;

use crate::domain::{Delivery, HookTask, OutgoingTask, Receipt};
use crate::error::StoreError;

/// A hook delivery to enqueue, visible after `delay`.
#[derive(Clone, Debug)]
pub struct HookMessage {
    /// The task.
    pub task: HookTask,
    /// How long the queue hides it (SQS: at most 15 minutes; longer waits are chained
    /// through `task.not_before`).
    pub delay: Duration,
}

/// The hooks queue: unordered, per-message delay, redelivery after a visibility timeout.
#[async_trait]
pub trait HookQueue: Send + Sync {
    /// Most delay one message can carry.
    fn max_delay(&self) -> Duration {
        Duration::from_secs(900)
    }
    /// Sends messages. Messages that could not be sent are reported, not retried.
    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError>;
    /// Receives up to `max` visible messages, hiding them for `visibility`.
    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError>;
    /// Deletes a handled message.
    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError>;
    /// Keeps a delivery whose attempts are used up, for inspection and redrive.
    async fn dead_letter(&self, task: &HookTask, reason: &str) -> Result<(), StoreError>;
    /// What it holds, and its dead-letter queue.
    async fn backlog(&self) -> Result<Backlog, StoreError>;
    /// Up to `max` of its dead letters, oldest first as the queue hands them out, each
    /// hidden from the next reader for `visibility` until it is settled
    /// ([`HookQueue::settle_dead`]). A queue without a dead-letter queue it can read
    /// says so.
    async fn receive_dead(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, StoreError> {
        let _ = (max, visibility);
        Err(no_dead_letters())
    }
    /// Deletes a dead letter received by [`HookQueue::receive_dead`], or shows it again
    /// after a delay.
    async fn settle_dead(&self, receipt: &Receipt, settle: Settle) -> Result<(), StoreError> {
        let _ = (receipt, settle);
        Err(no_dead_letters())
    }
}

fn no_dead_letters() -> StoreError {
    StoreError::backend(
        "queue",
        "read dead letters",
        "this queue has no dead-letter queue to read",
    )
}

/// A message a queue did not take, with the queue's own code and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SendFailure {
    /// The queue's error code.
    pub code: String,
    /// Its message.
    pub message: String,
}

/// Tasks that could not be sent.
#[derive(Clone, Debug, Default)]
pub struct SendReport {
    /// Index into the sent slice, and why.
    pub failed: Vec<(usize, SendFailure)>,
}

/// What a queue holds (SQS: approximate counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Backlog {
    /// Waiting to be received, delayed ones included.
    pub waiting: u64,
    /// Received and not yet deleted.
    pub in_flight: u64,
    /// In its dead-letter queue; `None` when it has none this process can read.
    pub dead: Option<u64>,
}

/// The sessions queue: FIFO per group (session), one in-flight message per group,
/// deduplication by id, redelivery after a visibility timeout.
#[async_trait]
pub trait SessionQueue: Send + Sync {
    /// How many tasks one [`send`](Self::send) is best given: the sweep queues its
    /// claims in batches of this many, a few batches at once. SQS takes ten a request;
    /// the embedded queue writes a batch in one transaction, so it takes more.
    fn batch_size(&self) -> usize {
        10
    }
    /// Sends tasks, in order. Tasks that could not be sent are reported, not retried.
    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError>;
    /// Receives up to `max` messages, hiding them for `visibility`. Messages of a group
    /// come in order, and none while another message of the group is in flight.
    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError>;
    /// Deletes a processed message.
    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError>;
    /// Makes an in-flight message visible again after `delay`.
    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError>;
    /// Deletes or releases each of a batch's messages, in the batch's order, stopping at
    /// the first that fails: that one and every later one stay in flight, so a session's
    /// message never comes back behind a later one of its session that was deleted. One
    /// request each unless the queue can do better: the embedded queue settles the whole
    /// batch in one transaction (all of it or none).
    async fn settle(&self, batch: &[(Receipt, Settle)]) -> Result<(), StoreError> {
        for (receipt, settle) in batch {
            match settle {
                Settle::Delete => self.ack(receipt).await?,
                Settle::Release(delay) => self.release(receipt, *delay).await?,
            }
        }
        Ok(())
    }
    /// What it holds, and its dead-letter queue.
    async fn backlog(&self) -> Result<Backlog, StoreError>;
    /// Moves up to `max` of its dead-lettered messages back onto it, oldest first: each
    /// goes behind what its group holds now, with its receives counted afresh. Returns
    /// how many moved. A queue without a dead-letter queue it can read says so.
    async fn redrive(&self, max: usize) -> Result<u64, StoreError> {
        let _ = max;
        Err(StoreError::backend(
            "queue",
            "redrive dead letters",
            "this queue has no dead-letter queue to redrive",
        ))
    }
}

/// What becomes of a received message once it was handled ([`SessionQueue::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Done: deleted.
    Delete,
    /// To be tried again: visible again after this delay.
    Release(Duration),
}
