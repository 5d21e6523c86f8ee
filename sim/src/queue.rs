//! The simulation's policy around the store and the queues: it yields at store calls so
//! tasks interleave, fails calls before or after they take effect, loses queue
//! acknowledgements, makes a message visible again while its first delivery runs, and
//! stops a worker or the dispatcher dead at a store call (the run then drops its future).
//! It also records the order in which each session's messages were completed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pulse_shared::domain::{Delivery, OutgoingTask, Receipt};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{Backlog, HookMessage, HookQueue, SendReport, SessionQueue};

use crate::faults::{Dice, Fault, lock};
use crate::store::StorePolicy;

/// Which long-lived task of the run is calling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Worker `n`.
    Worker(usize),
    /// The hook dispatcher.
    Dispatcher,
}

/// The simulation's policy.
pub struct SimPolicy {
    pub(crate) dice: Arc<Dice>,
    /// The running tasks that may be killed, by tokio task id.
    pub(crate) roles: Mutex<HashMap<tokio::task::Id, Role>>,
    /// Tasks stopped at a store call, for the run to drop.
    pub(crate) doomed: Mutex<Vec<Role>>,
    /// Per session: the queue sequence numbers of its completed messages, in order.
    pub(crate) completed: Mutex<BTreeMap<String, Vec<i64>>>,
    /// Receipt → session and the message's place in the queue, for the messages in
    /// flight.
    pub(crate) receipts: Mutex<HashMap<String, (String, Option<i64>)>>,
    /// Where receipts carry no sequence number (SQS): each message's place, numbered
    /// as it is first received. A FIFO queue hands a session's messages out in the
    /// order they were sent, so that is their order.
    pub(crate) first_received: Mutex<HashMap<String, i64>>,
}

impl SimPolicy {
    /// A policy drawing from `dice`.
    pub fn new(dice: Arc<Dice>) -> Self {
        Self {
            dice,
            roles: Mutex::default(),
            doomed: Mutex::default(),
            completed: Mutex::default(),
            receipts: Mutex::default(),
            first_received: Mutex::default(),
        }
    }

    fn role(&self) -> Option<Role> {
        let id = tokio::task::try_id()?;
        lock(&self.roles).get(&id).copied()
    }

    /// Stops the calling task for good if the dice kill it here.
    async fn maybe_die(&self) {
        let Some(role) = self.role() else {
            return;
        };
        let fault = match role {
            Role::Worker(_) => Fault::WorkerKilled,
            Role::Dispatcher => Fault::DispatcherKilled,
        };
        if self.dice.roll(fault) {
            lock(&self.doomed).push(role);
            std::future::pending::<()>().await;
        }
    }
}

fn injected(op: &'static str, what: &str) -> StoreError {
    StoreError::backend("sim", op, what.to_owned())
}

#[async_trait]
impl StorePolicy for SimPolicy {
    async fn before(&self, op: &'static str) -> Result<(), StoreError> {
        // Half the calls let other tasks run first: the interleavings the seed explores.
        if self.dice.unit() < 0.5 {
            tokio::task::yield_now().await;
        }
        self.maybe_die().await;
        if self.dice.roll(Fault::StoreFails) {
            return Err(injected(op, "injected failure before the call took effect"));
        }
        Ok(())
    }

    fn after(&self, op: &'static str) -> Result<(), StoreError> {
        if self.dice.roll(Fault::StoreLostAck) {
            return Err(injected(op, "injected failure after the call took effect"));
        }
        Ok(())
    }
}

/// The sessions queue under the simulation's policy.
pub struct SimQueue {
    pub(crate) inner: Arc<dyn SessionQueue>,
    pub(crate) policy: Arc<SimPolicy>,
}

/// The SQLite queue's receipts start with the message's sequence number, which orders
/// the messages of a session as they were sent.
fn seq(receipt: &Receipt) -> Option<i64> {
    receipt.as_str().split_once('.')?.0.parse().ok()
}

#[async_trait]
impl SessionQueue for SimQueue {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.inner.backlog().await
    }

    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError> {
        self.policy.before("queue send").await?;
        self.inner.send(tasks).await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        self.policy.maybe_die().await;
        let batch = self.inner.receive(max, visibility).await?;
        for d in &batch {
            let place = seq(&d.receipt).or_else(|| {
                let mut first = lock(&self.policy.first_received);
                let next = first.len() as i64;
                Some(*first.entry(d.message_id.to_string()).or_insert(next))
            });
            lock(&self.policy.receipts)
                .insert(d.receipt.as_str().to_owned(), (d.group.clone(), place));
            if self.policy.dice.roll(Fault::QueueRedelivered) {
                // Its visibility "timed out": another worker may take it while this one runs.
                self.inner.release(&d.receipt, Duration::ZERO).await?;
            }
        }
        Ok(batch)
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.policy.maybe_die().await;
        if self.policy.dice.roll(Fault::QueueLostAck) {
            return Err(injected("queue ack", "the delete was lost"));
        }
        self.inner.ack(receipt).await?;
        let taken = lock(&self.policy.receipts).remove(receipt.as_str());
        if let Some((group, Some(seq))) = taken {
            // A stale receipt (the message was delivered again meanwhile) deletes
            // nothing; the message counts as completed at its first acknowledgement.
            let mut completed = lock(&self.policy.completed);
            let done = completed.entry(group).or_default();
            if !done.contains(&seq) {
                done.push(seq);
            }
        }
        Ok(())
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError> {
        lock(&self.policy.receipts).remove(receipt.as_str());
        self.inner.release(receipt, delay).await
    }
}

/// The hooks queue under the simulation's policy.
pub struct SimHookQueue {
    pub(crate) inner: Arc<dyn HookQueue>,
    pub(crate) policy: Arc<SimPolicy>,
}

#[async_trait]
impl HookQueue for SimHookQueue {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.inner.backlog().await
    }

    fn max_delay(&self) -> Duration {
        self.inner.max_delay()
    }

    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError> {
        self.policy.before("hook queue send").await?;
        self.inner.send(messages).await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        self.policy.maybe_die().await;
        self.inner.receive(max, visibility).await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.policy.maybe_die().await;
        if self.policy.dice.roll(Fault::HookQueueLostAck) {
            return Err(injected("hook queue ack", "the delete was lost"));
        }
        self.inner.ack(receipt).await
    }

    async fn dead_letter(
        &self,
        task: &pulse_shared::domain::HookTask,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.inner.dead_letter(task, reason).await
    }
}
