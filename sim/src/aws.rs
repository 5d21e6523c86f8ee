//! The run on the AWS backend: the real DynamoDB and SQS adapters over an emulator
//! (moto), with faults injected beneath the SDK, on the run's virtual time.
//!
//! ## What runs on virtual time, and what does not
//!
//! - **Requests** go out in lockstep ([`LockstepIo`]): the simulation's thread blocks
//!   for each, so virtual time stands still while the emulator works, and requests are
//!   made one at a time in the order the seed leads the tasks to make them. Beneath the
//!   SDK a seeded [`FaultPlan`] answers a share of them throttled, `500`, with a reset
//!   connection, or loses the answer of one the emulator carried out. The SDK retries
//!   on virtual time (its backoff jitter is drawn from the run's seed).
//! - **Visibility.** The emulator counts a received message's visibility timeout on
//!   real time, which passes a hundred times slower than the run's. So messages are
//!   received out of the emulator's sight for longer than any run ([`OUT_OF_SIGHT`]),
//!   and [`Visibility`] brings each back when its visibility runs out on virtual time:
//!   a message received and not deleted (the worker died, its delete failed or was
//!   lost) is delivered again, as SQS would. A release with a delay waits the same way.
//! - **Delays.** A hook retry sent with a delay is held by [`Visibility`] and sent when
//!   the delay has passed on virtual time.
//! - **What stays on real time:** the FIFO queue's five-minute deduplication window.
//!   A job sent again within it is dropped as a duplicate; since a run passes through
//!   hours in minutes, that window covers more of virtual time than on AWS. Every job
//!   sent again with the same deduplication id is meant to be the same job (a heartbeat
//!   claim's job names the claim; a user message, its signal), so a longer window drops
//!   only copies the engine must answer once anyway; every invariant is still checked
//!   against what the store and the outside world saw.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use pulse_shared::adapters::aws::faults::{self, FaultPlan};
use pulse_shared::adapters::aws::lockstep::LockstepIo;
use pulse_shared::adapters::aws::{self, AwsClients, DynamoStore, SqsHookQueue, SqsQueue};
use pulse_shared::domain::{Delivery, HookTask, OutgoingTask, Receipt};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{Backlog, Clock, HookMessage, HookQueue, SendReport, SessionQueue};
use pulse_shared::sealing::EncryptionKeys;

use crate::faults::lock;

/// How long a received message stays out of the emulator's sight: longer than any run
/// (SQS's most, twelve hours), so only [`Visibility`] brings it back.
const OUT_OF_SIGHT: Duration = Duration::from_secs(12 * 3600);

/// One shard's resources on the emulator and the clients that reach them.
pub(crate) struct Emulated {
    /// Clients with no faults: the receiver's side, the set-up, the checks, and SQS's
    /// own work (bringing messages back).
    pub clean: AwsClients,
    /// Clients whose requests meet the plan's faults: the engine's.
    pub faulty: AwsClients,
    pub plan: Arc<FaultPlan>,
    pub table: String,
    pub sessions_url: String,
    pub hooks_url: String,
}

impl Emulated {
    /// Creates a table and two queues of the run's own on the emulator at `endpoint`;
    /// says why when it cannot.
    pub(crate) async fn create(endpoint: &str, seed: u64, shard: usize) -> Result<Self, String> {
        let io = LockstepIo::start().map_err(|e| format!("the lockstep I/O thread: {e}"))?;
        let plan = FaultPlan::new();
        // With the retry and time limits the functions have on AWS.
        let clean = AwsClients::for_emulator_in_lockstep(endpoint, &io, None);
        let faulty = AwsClients::for_emulator_in_lockstep(endpoint, &io, Some(plan.clone()));
        // Names of the run's own: a seed may be run again against the same emulator.
        let unique = format!(
            "{seed:016x}-{shard}-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros()
        );
        let table = format!("pulse-sim-{unique}");
        let unreachable = |e: StoreError| {
            format!(
                "the emulator at {endpoint} ({e}): start one (e.g. `moto_server -p 5000`) and give its URL with --endpoint"
            )
        };
        aws::create_table(&clean.dynamodb, &table)
            .await
            .map_err(unreachable)?;
        let sessions_url =
            aws::create_sessions_queue(&clean.sqs, &format!("pulse-sim-{unique}.fifo"))
                .await
                .map_err(unreachable)?;
        let hooks_url = aws::create_hooks_queue(&clean.sqs, &format!("pulse-sim-hooks-{unique}"))
            .await
            .map_err(unreachable)?;
        Ok(Self {
            clean,
            faulty,
            plan,
            table,
            sessions_url,
            hooks_url,
        })
    }

    /// The table through `clients`.
    pub(crate) fn store(&self, clients: &AwsClients, keys: EncryptionKeys) -> DynamoStore {
        let settle = pulse_shared::engine::EngineSettings::default().event_settle;
        DynamoStore::new(
            clients.dynamodb.clone(),
            &self.table,
            pulse_shared::ports::event_write_timeout(settle),
        )
        .with_keys(keys)
    }

    /// The engine's two queues (faults beneath them), on the run's visibility.
    pub(crate) fn queues(
        &self,
        clock: Arc<dyn Clock>,
    ) -> (Arc<Visibility>, VirtualSessions, VirtualHooks) {
        let visibility = Arc::new(Visibility {
            clock,
            sqs: (*self.clean.sqs).clone(),
            sessions_url: self.sessions_url.clone(),
            hooks_url: self.hooks_url.clone(),
            hooks: SqsHookQueue::new(self.clean.sqs.clone(), &self.hooks_url, None),
            held: Mutex::default(),
            later: Mutex::default(),
            expired: AtomicU64::new(0),
            sessions_arrived: tokio::sync::Notify::new(),
            hooks_arrived: tokio::sync::Notify::new(),
        });
        let sessions = VirtualSessions {
            inner: SqsQueue::new(self.faulty.sqs.clone(), &self.sessions_url),
            visibility: visibility.clone(),
        };
        let hooks = VirtualHooks {
            inner: SqsHookQueue::new(self.faulty.sqs.clone(), &self.hooks_url, None),
            visibility: visibility.clone(),
        };
        (visibility, sessions, hooks)
    }

    /// The sessions queue with no faults, as the receiver sends to it.
    pub(crate) fn clean_sessions(&self, visibility: Arc<Visibility>) -> VirtualSessions {
        VirtualSessions {
            inner: SqsQueue::new(self.clean.sqs.clone(), &self.sessions_url),
            visibility,
        }
    }

    /// Faults from now on at the mix's shares (none when `on` is false).
    pub(crate) fn arm(&self, seed: u64, on: bool, per_million: [(faults::Fault, u32); 4]) {
        if on && per_million.iter().any(|(_, r)| *r > 0) {
            self.plan.random(seed ^ 0x0a75_fa17, per_million);
        } else {
            self.plan.calm();
        }
    }

    /// Deletes the run's table and queues (the run's report has what it found).
    pub(crate) async fn remove(&self) {
        let _ = self
            .clean
            .dynamodb
            .delete_table()
            .table_name(&self.table)
            .send()
            .await;
        for url in [&self.sessions_url, &self.hooks_url] {
            let _ = self.clean.sqs.delete_queue().queue_url(url).send().await;
        }
    }
}

/// A received message out of sight until `due`, on virtual time.
struct Held {
    hooks: bool,
    receipt: String,
    due: Timestamp,
    /// Released with a delay (not its visibility running out).
    released: bool,
}

/// The queues' clocks on virtual time: received messages come back when their
/// visibility runs out, and delayed hook messages are sent when their delay has passed.
pub(crate) struct Visibility {
    clock: Arc<dyn Clock>,
    sqs: aws_sdk_sqs::Client,
    sessions_url: String,
    hooks_url: String,
    /// The hooks queue with no faults, for the delayed messages.
    hooks: SqsHookQueue,
    held: Mutex<Vec<Held>>,
    later: Mutex<Vec<(Timestamp, HookMessage)>>,
    /// Messages whose visibility ran out before they were deleted.
    pub(crate) expired: AtomicU64,
    /// Told when the sessions queue or the hooks queue may have a message to take, as
    /// Lambda's event source mapping invokes a function when messages arrive.
    pub(crate) sessions_arrived: tokio::sync::Notify,
    pub(crate) hooks_arrived: tokio::sync::Notify,
}

impl Visibility {
    fn at(&self, after: Duration) -> Timestamp {
        let d = jiff::SignedDuration::try_from(after).unwrap_or(jiff::SignedDuration::MAX);
        let now = self.clock.now();
        now.saturating_add(d).unwrap_or(now)
    }

    fn hold(&self, hooks: bool, batch: &[Delivery], visibility: Duration) {
        let due = self.at(visibility);
        lock(&self.held).extend(batch.iter().map(|d| Held {
            hooks,
            receipt: d.receipt.as_str().to_owned(),
            due,
            released: false,
        }));
    }

    fn forget(&self, receipt: &Receipt) {
        lock(&self.held).retain(|h| h.receipt != receipt.as_str());
    }

    fn delay(&self, receipt: &Receipt, delay: Duration) {
        let due = self.at(delay);
        for h in lock(&self.held).iter_mut() {
            if h.receipt == receipt.as_str() {
                h.due = due;
                h.released = true;
            }
        }
    }

    /// Brings back every message whose visibility has run out, and sends every delayed
    /// hook message whose delay has passed.
    pub(crate) async fn tick(&self) {
        let now = self.clock.now();
        let due: Vec<Held> = {
            let mut held = lock(&self.held);
            let (due, keep) = std::mem::take(&mut *held)
                .into_iter()
                .partition(|h| h.due <= now);
            *held = keep;
            due
        };
        for h in due {
            let url = if h.hooks {
                &self.hooks_url
            } else {
                &self.sessions_url
            };
            // A message deleted meanwhile (its delete's answer was lost) is gone, and its
            // receipt is refused.
            let back = self
                .sqs
                .change_message_visibility()
                .queue_url(url)
                .receipt_handle(&h.receipt)
                .visibility_timeout(0)
                .send()
                .await;
            if back.is_ok() {
                if !h.released {
                    self.expired.fetch_add(1, Ordering::Relaxed);
                }
                self.arrived(h.hooks);
            }
        }
        let ready: Vec<HookMessage> = {
            let mut later = lock(&self.later);
            let (ready, keep) = std::mem::take(&mut *later)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            *later = keep;
            ready.into_iter().map(|(_, m)| m).collect()
        };
        if !ready.is_empty() {
            // SQS's own work: it does not fail here.
            let _ = self.hooks.send(&ready).await;
            self.arrived(true);
        }
    }

    fn arrived(&self, hooks: bool) {
        if hooks {
            self.hooks_arrived.notify_one();
        } else {
            self.sessions_arrived.notify_one();
        }
    }
}

/// The sessions queue on the run's visibility.
pub(crate) struct VirtualSessions {
    inner: SqsQueue,
    visibility: Arc<Visibility>,
}

#[async_trait]
impl SessionQueue for VirtualSessions {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.inner.backlog().await
    }

    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError> {
        let sent = self.inner.send(tasks).await;
        self.visibility.arrived(false);
        sent
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        let batch = self.inner.receive(max, OUT_OF_SIGHT).await?;
        self.visibility.hold(false, &batch, visibility);
        Ok(batch)
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.inner.ack(receipt).await?;
        self.visibility.forget(receipt);
        Ok(())
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError> {
        if delay.is_zero() {
            self.inner.release(receipt, delay).await?;
            self.visibility.forget(receipt);
        } else {
            self.inner.release(receipt, OUT_OF_SIGHT).await?;
            self.visibility.delay(receipt, delay);
        }
        Ok(())
    }
}

/// The hooks queue on the run's visibility and delays.
pub(crate) struct VirtualHooks {
    inner: SqsHookQueue,
    visibility: Arc<Visibility>,
}

#[async_trait]
impl HookQueue for VirtualHooks {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.inner.backlog().await
    }

    fn max_delay(&self) -> Duration {
        self.inner.max_delay()
    }

    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError> {
        // Sent now: those with no delay. The report's indexes are the caller's.
        let (now, places): (Vec<HookMessage>, Vec<usize>) = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.delay.is_zero())
            .map(|(i, m)| (m.clone(), i))
            .unzip();
        let mut report = if now.is_empty() {
            SendReport::default()
        } else {
            let sent = self.inner.send(&now).await;
            self.visibility.arrived(true);
            sent?
        };
        for (i, _) in report.failed.iter_mut() {
            *i = places.get(*i).copied().unwrap_or(*i);
        }
        // Held on virtual time, as SQS holds a delayed message: taken once sent.
        let mut later = lock(&self.visibility.later);
        for m in messages.iter().filter(|m| !m.delay.is_zero()) {
            let at = self.visibility.at(m.delay);
            later.push((
                at,
                HookMessage {
                    task: m.task.clone(),
                    delay: Duration::ZERO,
                },
            ));
        }
        Ok(report)
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        let batch = self.inner.receive(max, OUT_OF_SIGHT).await?;
        self.visibility.hold(true, &batch, visibility);
        Ok(batch)
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.inner.ack(receipt).await?;
        self.visibility.forget(receipt);
        Ok(())
    }

    async fn dead_letter(&self, task: &HookTask, reason: &str) -> Result<(), StoreError> {
        self.inner.dead_letter(task, reason).await
    }
}
