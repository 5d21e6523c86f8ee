//! Dispatching: one attempt per queue message, claimed on the delivery record; a retry
//! is a new message with a delay.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use tokio::sync::OnceCell;
use tracing::{Instrument as _, error, info, warn};

use super::HookEmitter;
use crate::domain::{
    AttemptStatus, Delivery, DeliveryStatus, Hook, HookAttempt, HookDelivery, HookId, HookTask,
    MessageId, retry_delay, truncate_utf8,
};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::{Clock, HookMessage, HookQueue, HookSender, Store};

/// Tunables of the dispatcher.
#[derive(Clone, Debug)]
pub struct DispatchSettings {
    /// How long a claimed attempt is held before another dispatcher may make it again.
    /// Longer than any hook's timeout.
    pub lease: SignedDuration,
    /// Deliveries attempted at once per batch.
    pub concurrency: usize,
    /// Leave queued (sent on with a short delay) the deliveries this process may not
    /// send, e.g. to a loopback receiver outside its `PULSE_HOOKS_ALLOW`, instead of
    /// failing them: `pulse sweep` run beside `pulse serve` leaves them to the server.
    pub leave_unsendable: bool,
}

/// Deliveries received and attempted at once from the embedded hooks queue (SQS hands
/// over ten at most). Calls that reach the database together are committed together,
/// so a larger batch writes its claims and outcomes in fewer commits: 64 took the
/// hooks bench from about 7,000 deliveries a second to about 10,000 beside 16. The
/// egress pool keeps as many idle connections per destination.
pub const HOOK_BATCH: usize = 64;

/// How long a delivery left for another process waits before it is offered again.
const LEFT_DELAY: SignedDuration = SignedDuration::from_secs(30);

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            lease: SignedDuration::from_mins(2),
            concurrency: HOOK_BATCH,
            leave_unsendable: false,
        }
    }
}

/// What became of one message.
#[derive(Clone, Debug, PartialEq)]
pub enum Handled {
    /// An attempt was made.
    Attempted(HookAttempt),
    /// Its time has not come: sent on with the rest of its delay.
    Deferred(Timestamp),
    /// Nothing to do, and why (already delivered, claimed elsewhere, hook disabled).
    Skipped(String),
    /// This process may not send it: left queued for one that may, and why.
    Left(String),
}

/// A batch's outcome: the message ids to deliver again.
#[derive(Clone, Debug, Default)]
pub struct DispatchReport {
    /// Messages handled.
    pub handled: usize,
    /// Attempts made.
    pub attempts: usize,
    /// Deliveries left queued for a process that may send them.
    pub left: usize,
    /// Message ids that failed for a reason outside the delivery (storage, queue) and
    /// must come back.
    pub failed: Vec<MessageId>,
}

/// Delivers hooks.
#[derive(Clone)]
pub struct Dispatcher {
    pub(super) store: Arc<dyn Store>,
    pub(super) queue: Arc<dyn HookQueue>,
    pub(super) sender: Arc<dyn HookSender>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: DispatchSettings,
    pub(super) emitter: HookEmitter,
    pub(super) jitter: Arc<dyn Fn() -> f64 + Send + Sync>,
}

/// A uniform number in [0, 1).
fn unit_random() -> f64 {
    crate::entropy::unit()
}

/// Whether an attempt counts toward its hook's health (the failure streak that disables
/// it, and what `pulse status` reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Health {
    /// A delivery's attempt, queued or replayed: it does.
    Counts,
    /// A test an operator sent (`pulse hooks test`): it does not.
    Untouched,
}

impl Dispatcher {
    /// A dispatcher over the store, the hooks queue and a sender.
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn HookQueue>,
        sender: Arc<dyn HookSender>,
        clock: Arc<dyn Clock>,
        settings: DispatchSettings,
    ) -> Self {
        Self {
            emitter: HookEmitter::new(store.clone(), queue.clone(), clock.clone()),
            store,
            queue,
            sender,
            clock,
            settings,
            jitter: Arc::new(unit_random),
        }
    }

    /// Handles one queue message.
    pub async fn handle(&self, task: &HookTask) -> Result<Handled, EngineError> {
        self.handle_with(task, &HookReads::default()).await
    }

    /// Handles one queue message, reading its hook through `reads`, which the messages
    /// of one batch share.
    async fn handle_with(
        &self,
        task: &HookTask,
        reads: &HookReads,
    ) -> Result<Handled, EngineError> {
        let now = self.clock.now();
        // SQS delays are whole seconds of at most 15 minutes: a longer wait arrives early
        // and is sent on with what remains.
        let remaining = task.not_before.duration_since(now);
        if remaining >= SignedDuration::from_secs(1) {
            self.requeue(task.clone(), remaining).await?;
            return Ok(Handled::Deferred(task.not_before));
        }
        let Some(hook) = reads.get(self.store.as_ref(), &task.hook_id).await? else {
            warn!(hook_id = %task.hook_id, delivery_id = %task.delivery_id, "the hook no longer exists; delivery dropped");
            return Ok(Handled::Skipped("the hook no longer exists".into()));
        };
        if task.attempt == 1 && hook.active && !self.settings.leave_unsendable {
            // The common case, a first attempt with no delivery stored yet, is claimed
            // straight away: the claim is conditional on there being none, so the read
            // before it is spared. If there is one (the message came again, or the
            // dispatcher that claimed it stopped), what is stored decides, below. A
            // dispatcher that leaves what it may not send (`pulse sweep`) asks that
            // first, below, only of deliveries still to be made.
            let mut fresh = task.new_delivery(now);
            fresh.attempts = 1;
            if let Some(d) = self.claim(fresh, now).await? {
                return Ok(Handled::Attempted(
                    self.attempt(hook, d, Some(task), Health::Counts).await?,
                ));
            }
        }
        let mut d = match self.store.get_delivery(&task.delivery_id).await? {
            Some(d) => d,
            None => task.new_delivery(now),
        };
        if d.status.is_final() {
            return Ok(Handled::Skipped(format!(
                "delivery {} is {} already",
                d.id,
                d.status.as_str()
            )));
        }
        if d.attempts >= task.attempt {
            match d.lease_until {
                Some(l) if l > now => {
                    return Ok(Handled::Skipped(format!(
                        "attempt {} of {} is in flight elsewhere",
                        task.attempt, d.id
                    )));
                }
                // The dispatcher holding it died: make the attempt again.
                Some(_) => {}
                None => {
                    // Made already. If its retry is still due, the message for it may
                    // have been lost between recording and sending: send it (again).
                    if d.attempts == task.attempt
                        && let Some(at) = d.next_attempt_at
                    {
                        self.schedule(task, &d, at).await?;
                    }
                    return Ok(Handled::Skipped(format!(
                        "attempt {} of {} was made already",
                        task.attempt, d.id
                    )));
                }
            }
        }
        if !hook.active {
            d.status = DeliveryStatus::Cancelled;
            d.last_error = Some(format!(
                "the hook is disabled{}",
                hook.disabled_reason
                    .as_deref()
                    .map_or_else(String::new, |r| format!(": {r}"))
            ));
            d.next_attempt_at = None;
            d.updated_at = now;
            d.version += 1;
            return match self.store.save_delivery(&d, None).await {
                Ok(()) | Err(StoreError::Conflict(_)) => {
                    Ok(Handled::Skipped("the hook is disabled".into()))
                }
                Err(e) => Err(e.into()),
            };
        }
        if self.settings.leave_unsendable
            && let Err(why) = self.sender.can_send(&hook).await
        {
            self.requeue(task.clone(), LEFT_DELAY).await?;
            info!(hook_id = %hook.id, delivery_id = %d.id, reason = %why, "delivery left for a process that may send it");
            return Ok(Handled::Left(why.to_string()));
        }
        d.attempts = task.attempt;
        match self.claim(d, now).await? {
            Some(d) => Ok(Handled::Attempted(
                self.attempt(hook, d, Some(task), Health::Counts).await?,
            )),
            None => Ok(Handled::Skipped(format!(
                "attempt {} of {} was claimed by another dispatcher",
                task.attempt, task.delivery_id
            ))),
        }
    }

    /// Writes the claim of attempt `d.attempts`; `None` if another writer got there first.
    pub(super) async fn claim(
        &self,
        mut d: HookDelivery,
        now: Timestamp,
    ) -> Result<Option<HookDelivery>, EngineError> {
        d.status = DeliveryStatus::Pending;
        d.lease_until = Some(now.saturating_add(self.settings.lease).unwrap_or(now));
        d.next_attempt_at = None;
        d.updated_at = now;
        d.version += 1;
        match self.store.save_delivery(&d, None).await {
            Ok(()) => Ok(Some(d)),
            Err(StoreError::Conflict(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the claimed attempt `d.attempts`, records it, updates the hook's health, and
    /// schedules the next attempt (when `task` is given: replays and tests get one).
    pub(super) async fn attempt(
        &self,
        hook: Hook,
        mut d: HookDelivery,
        task: Option<&HookTask>,
        health: Health,
    ) -> Result<HookAttempt, EngineError> {
        let at = self.clock.now();
        let began = Instant::now();
        let trace = crate::traces::hook(
            d.hook_type.as_str(),
            hook.id.as_str(),
            d.id.as_str(),
            d.attempts,
        );
        let result = match &hook.unreadable {
            Some(why) => not_sent(&hook, &d, why),
            None => {
                self.sender
                    .send(&hook, &d, at.as_second())
                    .instrument(trace.clone())
                    .await
            }
        };
        crate::traces::hook_answered(&trace, result.status.as_str(), result.http_status);
        if result.status != AttemptStatus::Success {
            let why = result.error.as_deref().unwrap_or(result.status.as_str());
            crate::traces::failed(&trace, result.status.as_str(), why);
        }
        let duration_ms = began.elapsed().as_millis() as u64;
        let done = self.clock.now();
        let mut attempt = HookAttempt {
            delivery_id: d.id.clone(),
            hook_id: hook.id.clone(),
            attempt: d.attempts,
            status: result.status,
            http_status: result.http_status,
            response_body: result
                .body
                .as_deref()
                .map(|b| truncate_utf8(b, crate::domain::ATTEMPT_BODY_LIMIT)),
            error: result.error.clone(),
            duration_ms,
            at,
            next_attempt_at: None,
        };
        d.lease_until = None;
        d.last_status = Some(result.status);
        d.last_error = result.error.clone();
        d.updated_at = done;
        d.version += 1;
        let mut disable = None;
        let succeeded = result.status == AttemptStatus::Success;
        if succeeded {
            d.status = DeliveryStatus::Succeeded;
        } else if health == Health::Untouched {
            // A test: one attempt, and the hook's standing is not the test's to change.
            d.status = DeliveryStatus::Exhausted;
        } else if result.http_status == Some(410) {
            disable = Some("the receiver answered 410 Gone".to_owned());
            d.status = DeliveryStatus::Cancelled;
        } else {
            let since = hook.failing_since.unwrap_or(at);
            if done.duration_since(since) >= hook.disable_after {
                disable = Some(format!(
                    "its deliveries have failed without a success since {since} (disable-after {:#})",
                    hook.disable_after
                ));
                d.status = DeliveryStatus::Cancelled;
            } else if let Some(delay) = task.and_then(|_| {
                retry_delay(
                    &hook.retry,
                    d.attempts,
                    result
                        .retry_after
                        .and_then(|r| SignedDuration::try_from(r).ok()),
                    (self.jitter)(),
                )
            }) {
                let next = done.saturating_add(delay).unwrap_or(done);
                d.next_attempt_at = Some(next);
                attempt.next_attempt_at = Some(next);
            } else {
                // The schedule is used up, or this was a replay or a test (one attempt).
                d.status = DeliveryStatus::Exhausted;
            }
        }
        if let Some(why) = &disable {
            d.last_error = Some(format!(
                "{}; the hook is disabled: {why}",
                result.error.as_deref().unwrap_or("failed")
            ));
        }
        match self.store.save_delivery(&d, Some(&attempt)).await {
            Ok(()) => {}
            Err(StoreError::Conflict(why)) => {
                return Err(EngineError::Contended(format!(
                    "attempt {} of {} was taken over while in flight: {why}",
                    d.attempts, d.id
                )));
            }
            Err(e) => return Err(e.into()),
        }
        log_attempt(&hook, &d, &attempt);
        crate::meter::hook_delivery(if succeeded { "succeeded" } else { "failed" });
        if health == Health::Counts {
            self.health(&hook, succeeded, at, disable).await?;
        }
        if let (Some(task), Some(next)) = (task, d.next_attempt_at) {
            self.schedule(task, &d, next).await?;
        }
        if d.status == DeliveryStatus::Exhausted
            && let Some(task) = task
        {
            let reason = format!(
                "{} attempts failed; last: {}",
                d.attempts,
                d.last_error.as_deref().unwrap_or("?")
            );
            self.queue.dead_letter(task, &reason).await?;
            crate::meter::hook_delivery("dead_lettered");
            warn!(hook_id = %hook.id, delivery_id = %d.id, attempts = d.attempts, "hook delivery exhausted; dead-lettered (`pulse hooks replay --delivery {}` sends it again)", d.id);
        }
        Ok(attempt)
    }

    /// Sends the message for the attempt after `d.attempts`, due at `at`.
    async fn schedule(
        &self,
        task: &HookTask,
        d: &HookDelivery,
        at: Timestamp,
    ) -> Result<(), EngineError> {
        let mut next = task.clone();
        next.attempt = d.attempts + 1;
        next.not_before = at;
        let delay = at.duration_since(self.clock.now());
        self.requeue(next, delay).await
    }

    pub(super) async fn requeue(
        &self,
        task: HookTask,
        delay: SignedDuration,
    ) -> Result<(), EngineError> {
        let delay = delay.unsigned_abs().min(self.queue.max_delay());
        let report = self.queue.send(&[HookMessage { task, delay }]).await?;
        if let Some((_, why)) = report.failed.first() {
            return Err(EngineError::Unavailable(format!(
                "the hooks queue refused a retry: {why}"
            )));
        }
        Ok(())
    }

    /// Handles a batch of queue messages concurrently; reports those to deliver again.
    /// An unreadable message is logged and dropped (nothing Pulse sent looks like it).
    pub async fn process_batch(&self, batch: &[Delivery]) -> DispatchReport {
        let reads = &HookReads::default();
        let results: Vec<(MessageId, Result<Handled, EngineError>)> =
            futures::stream::iter(batch.iter())
                .map(|m| async move {
                    let r = match HookTask::decode(&m.body) {
                        Ok(task) => self.handle_with(&task, reads).await,
                        Err(e) => {
                            error!(message_id = %m.message_id, error = %e, body = %truncate_utf8(&m.body, 200), "not a hook task; dropped");
                            Ok(Handled::Skipped("unreadable message".into()))
                        }
                    };
                    (m.message_id.clone(), r)
                })
                .buffer_unordered(self.settings.concurrency.max(1))
                .collect()
                .await;
        let mut report = DispatchReport::default();
        for (id, r) in results {
            report.handled += 1;
            match r {
                Ok(Handled::Attempted(_)) => report.attempts += 1,
                Ok(Handled::Left(_)) => report.left += 1,
                Ok(_) => {}
                Err(e) => {
                    error!(message_id = %id, error = %chain(&e), "hook message will be delivered again");
                    report.failed.push(id);
                }
            }
        }
        report
    }

    /// Receives up to `max` messages from the hooks queue, handles them, and deletes
    /// those handled (`pulse serve`'s loop and tests drive this).
    pub async fn poll_once(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<DispatchReport, StoreError> {
        let batch = self.queue.receive(max, visibility).await?;
        let report = self.process_batch(&batch).await;
        // Deleted together: the embedded queue commits them as one group, and SQS
        // takes the requests side by side.
        let handled = batch
            .iter()
            .filter(|m| !report.failed.contains(&m.message_id));
        futures::future::try_join_all(handled.map(|m| self.queue.ack(&m.receipt))).await?;
        Ok(report)
    }

    /// Polls until no message is ready (retries scheduled later stay queued); returns
    /// the attempts made. `pulse sweep`, the demo and the hooks bench deliver this way.
    pub async fn drain(&self, max: usize, visibility: Duration) -> Result<usize, StoreError> {
        Ok(self.drain_report(max, visibility).await?.attempts)
    }

    /// As [`drain`](Self::drain), with the totals of what it handled.
    pub async fn drain_report(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<DispatchReport, StoreError> {
        let mut total = DispatchReport::default();
        loop {
            let r = self.poll_once(max, visibility).await?;
            if r.handled == 0 {
                return Ok(total);
            }
            total.handled += r.handled;
            total.attempts += r.attempts;
            total.left += r.left;
            total.failed.extend(r.failed);
        }
    }
}

/// The hooks the messages of one batch read, each read from the store once: a batch is
/// mostly deliveries to the same few hooks, and a hook changes rarely. A read that failed
/// is not kept, so the next message of the batch reads again.
#[derive(Default)]
struct HookReads(std::sync::Mutex<HashMap<HookId, Arc<OnceCell<Option<Hook>>>>>);

impl HookReads {
    async fn get(&self, store: &dyn Store, id: &HookId) -> Result<Option<Hook>, StoreError> {
        let cell = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default()
            .clone();
        cell.get_or_try_init(|| store.get_hook(id)).await.cloned()
    }
}

pub(super) fn log_attempt(hook: &Hook, d: &HookDelivery, a: &HookAttempt) {
    match a.status {
        AttemptStatus::Success => {
            info!(hook_id = %hook.id, delivery_id = %d.id, attempt = a.attempt, http_status = a.http_status, duration_ms = a.duration_ms, "hook delivered")
        }
        _ => {
            warn!(hook_id = %hook.id, delivery_id = %d.id, attempt = a.attempt, status = a.status.as_str(), http_status = a.http_status, error = a.error.as_deref().unwrap_or(""), next_attempt_at = ?a.next_attempt_at, delivery_status = d.status.as_str(), "hook attempt failed")
        }
    }
}

/// The attempt of a hook whose secrets no configured key opens: nothing can be signed,
/// so it fails without being sent, and is retried on the hook's schedule — a restored
/// key or a rotated secret lets a later one through.
fn not_sent(
    hook: &Hook,
    d: &HookDelivery,
    why: &crate::domain::Unreadable,
) -> crate::ports::SendResult {
    warn!(hook_id = %hook.id, key_id = %why.key_id, delivery_id = %d.id, "a hook delivery was not sent: {why}");
    crate::ports::SendResult {
        status: AttemptStatus::Failed,
        http_status: None,
        body: None,
        error: Some(format!(
            "not sent: {why}; restore that key (PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_OLD_KEYS), or run `pulse hooks rotate {}`",
            hook.id
        )),
        retry_after: None,
    }
}
