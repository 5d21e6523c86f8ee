//! Outbound hooks: emitting (the engine enqueues a delivery and never waits on the
//! receiver) and dispatching (one attempt per queue message; a retry is a new message
//! with a delay, never a sleep).
//!
//! Why a delivery is attempted at most once per attempt number, however often its
//! message arrives: the dispatcher claims an attempt by writing the delivery with
//! `attempts = n` and a lease, conditional on the version it read. A second copy of the
//! message finds the attempt claimed (or done) and stops. A dispatcher that dies holding
//! a claim leaves a lease that expires; the message comes back and the attempt is made
//! again under the same `webhook-id`, which receivers deduplicate on.
//!
//! Why a retry is never lost: the attempt's outcome (with `next_attempt_at`) is written
//! before the next message is sent, and a message for an attempt already made re-sends
//! the next one if it is still due.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tracing::{error, info, warn};
use ulid::Ulid;

use crate::domain::{
    ActionId, Agent, AgentId, AttemptStatus, Delivery, DeliveryStatus, Event, EventId, EventType,
    HeartbeatId, Hook, HookAttempt, HookData, HookDelivery, HookDeliveryId, HookPayload, HookRoute,
    HookTask, HookType, MessageId, PayloadAgent, PayloadContext, Priority, retry_delay, to_ms,
    truncate_utf8,
};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::{Clock, HookMessage, HookQueue, HookSender, Store};

/// One emit point: what happened, to which agent, in which heartbeat and action.
#[derive(Clone, Debug)]
pub struct Emission {
    /// The hook type.
    pub hook_type: HookType,
    /// The heartbeat it happened in.
    pub heartbeat_id: Option<HeartbeatId>,
    /// The action it concerns.
    pub action_id: Option<ActionId>,
    /// What happened.
    pub data: Value,
    /// What caused it.
    pub triggered_by: String,
    /// The time the delivery ids are stamped with: fixed for a heartbeat (its start), so
    /// a rerun emits the same ids.
    pub key_ms: u64,
    /// What makes this emission unique besides the hook and type (heartbeat, action,
    /// turn): a rerun with the same key makes the same delivery ids.
    pub key: Vec<String>,
}

/// Emits hooks by enqueuing deliveries.
#[derive(Clone)]
pub struct HookEmitter {
    store: Arc<dyn Store>,
    queue: Arc<dyn HookQueue>,
    clock: Arc<dyn Clock>,
}

impl HookEmitter {
    /// An emitter over the store (to read routes) and the hooks queue.
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn HookQueue>, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            queue,
            clock,
        }
    }

    /// The agent's hook routes. A failure is logged and gives none: hooks never fail the
    /// work they report on.
    pub async fn routes(&self, agent: &AgentId) -> Result<Vec<HookRoute>, EngineError> {
        self.store.hook_routes(agent).await.map_err(|e| {
            EngineError::Unavailable(format!(
                "cannot read agent {agent}'s hooks ({}); the step is retried",
                chain(&e)
            ))
        })
    }

    /// Enqueues a delivery for every active route of `e.hook_type`; returns how many
    /// were queued. Nothing is read or sent when no route matches.
    ///
    /// Delivery ids are derived from the emission's key, so emitting the same point
    /// again (a rerun, a resumed turn) makes the same deliveries, which the dispatcher
    /// sends once. That is why a failure to enqueue is an error, not a log line: the
    /// caller fails its step, the queue runs it again, and it emits again.
    pub async fn emit(
        &self,
        routes: &[HookRoute],
        agent: &Agent,
        e: Emission,
    ) -> Result<usize, EngineError> {
        let matching: Vec<&HookRoute> = routes
            .iter()
            .filter(|r| r.active && r.hook_type == e.hook_type)
            .collect();
        if matching.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now();
        let payload = HookPayload {
            hook_type: e.hook_type.clone(),
            agent: PayloadAgent::from(agent),
            timestamp: now,
            heartbeat_id: e.heartbeat_id.clone(),
            action_id: e.action_id.clone(),
            data: e.data,
            context: PayloadContext {
                triggered_by: e.triggered_by,
                related_events: None,
            },
        };
        let body = serde_json::to_string(&payload).unwrap_or_default();
        let messages: Vec<HookMessage> = matching
            .iter()
            .map(|r| {
                let mut parts = vec![r.id.as_str(), e.hook_type.as_str()];
                parts.extend(e.key.iter().map(String::as_str));
                HookMessage {
                    task: HookTask {
                        v: HookTask::VERSION,
                        delivery_id: HookDeliveryId::derived(e.key_ms, &parts),
                        hook_id: r.id.clone(),
                        agent_id: agent.id.clone(),
                        hook_type: e.hook_type.clone(),
                        attempt: 1,
                        not_before: now,
                        body: body.clone(),
                        emitted_at: now,
                    },
                    delay: Duration::ZERO,
                }
            })
            .collect();
        let ids: Vec<String> = messages
            .iter()
            .map(|m| m.task.delivery_id.to_string())
            .collect();
        let refused = |why: String| {
            EngineError::Unavailable(format!(
                "the hooks queue did not take {} deliveries ({why}); the step is retried and emits them again",
                e.hook_type
            ))
        };
        match self.queue.send(&messages).await {
            Ok(report) if report.failed.is_empty() => Ok(messages.len()),
            Ok(report) => {
                let failed: Vec<String> = report
                    .failed
                    .iter()
                    .map(|(i, why)| format!("{}: {why}", ids.get(*i).map_or("?", |s| s)))
                    .collect();
                Err(refused(failed.join("; ")))
            }
            Err(err) => Err(refused(chain(&err))),
        }
    }
}

/// Tunables of the dispatcher.
#[derive(Clone, Debug)]
pub struct DispatchSettings {
    /// How long a claimed attempt is held before another dispatcher may make it again.
    /// Longer than any hook's timeout.
    pub lease: SignedDuration,
    /// Deliveries attempted at once per batch.
    pub concurrency: usize,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            lease: SignedDuration::from_mins(2),
            concurrency: 16,
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
}

/// A batch's outcome: the message ids to deliver again.
#[derive(Clone, Debug, Default)]
pub struct DispatchReport {
    /// Messages handled.
    pub handled: usize,
    /// Attempts made.
    pub attempts: usize,
    /// Message ids that failed for a reason outside the delivery (storage, queue) and
    /// must come back.
    pub failed: Vec<MessageId>,
}

/// Delivers hooks.
#[derive(Clone)]
pub struct Dispatcher {
    store: Arc<dyn Store>,
    queue: Arc<dyn HookQueue>,
    sender: Arc<dyn HookSender>,
    clock: Arc<dyn Clock>,
    settings: DispatchSettings,
    emitter: HookEmitter,
    jitter: Arc<dyn Fn() -> f64 + Send + Sync>,
}

/// A uniform number in [0, 1).
fn unit_random() -> f64 {
    (Ulid::new().random() as u64 >> 11) as f64 / (1u64 << 53) as f64
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
        let now = self.clock.now();
        // SQS delays are whole seconds of at most 15 minutes: a longer wait arrives early
        // and is sent on with what remains.
        let remaining = task.not_before.duration_since(now);
        if remaining >= SignedDuration::from_secs(1) {
            self.requeue(task.clone(), remaining).await?;
            return Ok(Handled::Deferred(task.not_before));
        }
        let Some(hook) = self.store.get_hook(&task.hook_id).await? else {
            warn!(hook_id = %task.hook_id, delivery_id = %task.delivery_id, "the hook no longer exists; delivery dropped");
            return Ok(Handled::Skipped("the hook no longer exists".into()));
        };
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
        d.attempts = task.attempt;
        match self.claim(d, now).await? {
            Some(d) => Ok(Handled::Attempted(self.attempt(hook, d, Some(task)).await?)),
            None => Ok(Handled::Skipped(format!(
                "attempt {} of {} was claimed by another dispatcher",
                task.attempt, task.delivery_id
            ))),
        }
    }

    /// Writes the claim of attempt `d.attempts`; `None` if another writer got there first.
    async fn claim(
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
    async fn attempt(
        &self,
        hook: Hook,
        mut d: HookDelivery,
        task: Option<&HookTask>,
    ) -> Result<HookAttempt, EngineError> {
        let at = self.clock.now();
        let began = Instant::now();
        let result = self.sender.send(&hook, &d, at.as_second()).await;
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
        self.health(&hook, succeeded, at, disable).await?;
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

    async fn requeue(&self, task: HookTask, delay: SignedDuration) -> Result<(), EngineError> {
        let delay = delay.unsigned_abs().min(self.queue.max_delay());
        let report = self.queue.send(&[HookMessage { task, delay }]).await?;
        if let Some((_, why)) = report.failed.first() {
            return Err(EngineError::Unavailable(format!(
                "the hooks queue refused a retry: {why}"
            )));
        }
        Ok(())
    }

    /// Records the outcome on the hook: a success ends a failure streak, a failure
    /// starts one, and `disable` disables it (logged, a HOOK_DISABLED event appended
    /// and emitted). Conflicting writes are re-read and retried.
    async fn health(
        &self,
        seen: &Hook,
        succeeded: bool,
        at: Timestamp,
        disable: Option<String>,
    ) -> Result<(), EngineError> {
        let unchanged = disable.is_none()
            && if succeeded {
                seen.failing_since.is_none()
            } else {
                seen.failing_since.is_some()
            };
        if unchanged {
            return Ok(());
        }
        for _ in 0..5 {
            let Some(mut hook) = self.store.get_hook(&seen.id).await? else {
                return Ok(());
            };
            if succeeded {
                hook.failing_since = None;
            } else if hook.failing_since.is_none() {
                hook.failing_since = Some(at);
            }
            let disabling = match &disable {
                Some(why) if hook.active => {
                    hook.active = false;
                    hook.disabled_reason = Some(why.clone());
                    true
                }
                _ => false,
            };
            hook.version += 1;
            match self.store.update_hook(&hook).await {
                Ok(()) => {
                    if disabling {
                        self.disabled(&hook, at).await;
                    }
                    return Ok(());
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(StoreError::NotFound(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Err(EngineError::Contended(format!(
            "hook {} kept changing while its health was recorded",
            seen.id
        )))
    }

    /// Tells the agent and its other hooks that `hook` was disabled.
    async fn disabled(&self, hook: &Hook, at: Timestamp) {
        let reason = hook.disabled_reason.clone().unwrap_or_default();
        warn!(hook_id = %hook.id, agent_id = %hook.agent_id, reason = %reason, "hook disabled; `pulse hooks enable {}` turns it back on", hook.id);
        let data = HookData::hook_disabled(&hook.id, &hook.hook_type, &hook.target, &reason);
        let ms = to_ms(at).max(0) as u64;
        let event = Event {
            id: EventId::generate(ms),
            agent_id: hook.agent_id.clone(),
            event_type: EventType::parse(HookType::HOOK_DISABLED)
                .unwrap_or_else(|_| EventType::heartbeat()),
            priority: Priority::DEFAULT,
            source: "hooks".to_owned(),
            payload: data.clone(),
            metadata: Value::Null,
            parent_id: None,
            cascade: None,
            created_at: at,
        };
        if let Err(e) = self.store.append(&event).await {
            error!(error = %chain(&e), "cannot append the HOOK_DISABLED event");
        }
        match self.store.get_agent(&hook.agent_id).await {
            Ok(Some(agent)) => {
                let emission = Emission {
                    hook_type: HookType::of(HookType::HOOK_DISABLED),
                    heartbeat_id: None,
                    action_id: None,
                    data,
                    triggered_by: "HOOK_DISABLED".to_owned(),
                    key_ms: ms,
                    key: vec![hook.id.to_string()],
                };
                // The disabling is recorded (and in the agent's log) whatever happens here.
                let emitted = match self.emitter.routes(&agent.id).await {
                    Ok(routes) => self.emitter.emit(&routes, &agent, emission).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = emitted {
                    error!(error = %chain(&e), "cannot emit HOOK_DISABLED");
                }
            }
            Ok(None) => {}
            Err(e) => error!(error = %chain(&e), "cannot read the agent to emit HOOK_DISABLED"),
        }
    }

    /// Sends a test delivery to `hook` now (one attempt, no retries), recorded like any
    /// other; `pulse hooks test` prints it.
    pub async fn send_test(&self, hook: &Hook) -> Result<(HookDelivery, HookAttempt), EngineError> {
        let now = self.clock.now();
        let agent = self.store.get_agent(&hook.agent_id).await?;
        let payload = HookPayload {
            hook_type: hook.hook_type.clone(),
            agent: agent
                .as_ref()
                .map(PayloadAgent::from)
                .unwrap_or_else(|| PayloadAgent {
                    id: hook.agent_id.clone(),
                    name: String::new(),
                    alias: String::new(),
                }),
            timestamp: now,
            heartbeat_id: None,
            action_id: None,
            data: json!({ "test": true, "message": "a test delivery sent by `pulse hooks test`" }),
            context: PayloadContext {
                triggered_by: "TEST".to_owned(),
                related_events: None,
            },
        };
        let task = HookTask {
            v: HookTask::VERSION,
            delivery_id: HookDeliveryId::generate(to_ms(now).max(0) as u64),
            hook_id: hook.id.clone(),
            agent_id: hook.agent_id.clone(),
            hook_type: hook.hook_type.clone(),
            attempt: 1,
            not_before: now,
            body: serde_json::to_string(&payload).unwrap_or_default(),
            emitted_at: now,
        };
        let mut d = task.new_delivery(now);
        d.attempts = 1;
        let d = self.claim(d, now).await?.ok_or_else(|| {
            EngineError::Contended(format!("delivery {} exists already", task.delivery_id))
        })?;
        let attempt = self.attempt(hook.clone(), d, None).await?;
        let d = self
            .store
            .get_delivery(&task.delivery_id)
            .await?
            .ok_or_else(|| EngineError::Missing(format!("delivery {}", task.delivery_id)))?;
        Ok((d, attempt))
    }

    /// Sends a delivery that failed, was exhausted or was cancelled again, now: one more
    /// attempt under the same `webhook-id`.
    pub async fn replay(
        &self,
        id: &HookDeliveryId,
    ) -> Result<(HookDelivery, HookAttempt), EngineError> {
        let d = self
            .store
            .get_delivery(id)
            .await?
            .ok_or_else(|| EngineError::Missing(format!("there is no delivery {id}")))?;
        if d.status == DeliveryStatus::Succeeded {
            return Err(EngineError::Missing(format!(
                "delivery {id} succeeded already; `pulse hooks test` sends a fresh test delivery"
            )));
        }
        if d.lease_until.is_some_and(|l| l > self.clock.now()) {
            return Err(EngineError::Contended(format!(
                "an attempt of {id} is in flight now; try again in a minute"
            )));
        }
        let hook = self.store.get_hook(&d.hook_id).await?.ok_or_else(|| {
            EngineError::Missing(format!(
                "the hook {} of delivery {id} no longer exists",
                d.hook_id
            ))
        })?;
        if !hook.active {
            return Err(EngineError::Missing(format!(
                "hook {} is disabled ({}); `pulse hooks enable {}` first",
                hook.id,
                hook.disabled_reason.as_deref().unwrap_or("by a user"),
                hook.id
            )));
        }
        let now = self.clock.now();
        let mut claim = d.clone();
        claim.attempts += 1;
        let claimed = self.claim(claim, now).await?.ok_or_else(|| {
            EngineError::Contended(format!("delivery {id} changed meanwhile; try again"))
        })?;
        let attempt = self.attempt(hook, claimed, None).await?;
        let d = self
            .store
            .get_delivery(id)
            .await?
            .ok_or_else(|| EngineError::Missing(format!("delivery {id}")))?;
        Ok((d, attempt))
    }

    /// Handles a batch of queue messages concurrently; reports those to deliver again.
    /// An unreadable message is logged and dropped (nothing Pulse sent looks like it).
    pub async fn process_batch(&self, batch: &[Delivery]) -> DispatchReport {
        let results: Vec<(MessageId, Result<Handled, EngineError>)> =
            futures::stream::iter(batch.iter())
                .map(|m| async move {
                    let r = match HookTask::decode(&m.body) {
                        Ok(task) => self.handle(&task).await,
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
        for m in &batch {
            if !report.failed.contains(&m.message_id) {
                self.queue.ack(&m.receipt).await?;
            }
        }
        Ok(report)
    }

    /// Polls until no message is ready (retries scheduled later stay queued); returns
    /// the attempts made. `pulse sweep`, the demo and the hooks bench deliver this way.
    pub async fn drain(&self, max: usize, visibility: Duration) -> Result<usize, StoreError> {
        let mut attempts = 0;
        loop {
            let r = self.poll_once(max, visibility).await?;
            if r.handled == 0 {
                return Ok(attempts);
            }
            attempts += r.attempts;
        }
    }
}

fn log_attempt(hook: &Hook, d: &HookDelivery, a: &HookAttempt) {
    match a.status {
        AttemptStatus::Success => {
            info!(hook_id = %hook.id, delivery_id = %d.id, attempt = a.attempt, http_status = a.http_status, duration_ms = a.duration_ms, "hook delivered")
        }
        _ => {
            warn!(hook_id = %hook.id, delivery_id = %d.id, attempt = a.attempt, status = a.status.as_str(), http_status = a.http_status, error = a.error.as_deref().unwrap_or(""), next_attempt_at = ?a.next_attempt_at, delivery_status = d.status.as_str(), "hook attempt failed")
        }
    }
}
