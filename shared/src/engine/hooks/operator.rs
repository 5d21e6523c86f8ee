//! What an operator asks of the dispatcher: a test delivery, a replay of a past one.

use serde_json::json;

use super::Dispatcher;
use super::dispatcher::Health;
use crate::domain::{
    DeliveryStatus, Hook, HookAttempt, HookDelivery, HookDeliveryId, HookPayload, HookTask,
    PayloadAgent, PayloadContext, to_ms,
};
use crate::error::{EngineError, StoreError};
use crate::ports::Store;

/// What [`set_hook_active`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switched {
    /// Turned on or off now.
    Done,
    /// It already was so.
    Already,
}

/// Turns a hook on (forgetting the failure streak that disabled it) or off, over the
/// version read, reading again when a delivery's health update got there first.
/// `NotFound` if there is no such hook.
pub async fn set_hook_active(
    store: &dyn Store,
    id: &crate::domain::HookId,
    active: bool,
) -> Result<Switched, StoreError> {
    for _ in 0..5 {
        let mut hook = store
            .get_hook(id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("hook {id}")))?;
        if hook.active == active {
            return Ok(Switched::Already);
        }
        hook.active = active;
        if active {
            hook.failing_since = None;
            hook.disabled_reason = None;
        } else {
            hook.disabled_reason = Some("disabled by a user".into());
        }
        hook.version += 1;
        match store.update_hook(&hook).await {
            Ok(()) => return Ok(Switched::Done),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict(format!(
        "hook {id} kept changing (deliveries in flight); try again"
    )))
}

impl Dispatcher {
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
        let attempt = self
            .attempt(hook.clone(), d, None, Health::Untouched)
            .await?;
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
        let attempt = self.attempt(hook, claimed, None, Health::Counts).await?;
        let d = self
            .store
            .get_delivery(id)
            .await?
            .ok_or_else(|| EngineError::Missing(format!("delivery {id}")))?;
        Ok((d, attempt))
    }
}

/// Deliveries of one hook looked through by [`Dispatcher::recover`].
pub const RECOVER_SCAN: usize = 1_000;

/// What [`Dispatcher::recover`] did.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Deliveries sent again, with the attempt each made.
    pub replayed: Vec<(HookDelivery, HookAttempt)>,
    /// Deliveries left as they were, and why.
    pub skipped: Vec<(HookDeliveryId, String)>,
    /// Hooks with more than [`RECOVER_SCAN`] deliveries since then: run it again for the
    /// older ones.
    pub truncated: Vec<crate::domain::HookId>,
}

impl Dispatcher {
    /// Sends again, oldest first and one attempt each, every delivery of `hooks` made at
    /// or after `since` that ended without success: exhausted, or cancelled while its
    /// hook was off. A disabled hook's deliveries are skipped (enable it first), as are
    /// those another dispatcher is attempting now.
    pub async fn recover(
        &self,
        hooks: &[Hook],
        since: jiff::Timestamp,
    ) -> Result<Recovered, EngineError> {
        let mut done = Recovered::default();
        for hook in hooks {
            let deliveries = self.store.list_deliveries(&hook.id, RECOVER_SCAN).await?;
            if deliveries.len() == RECOVER_SCAN
                && deliveries.last().is_some_and(|d| d.created_at >= since)
            {
                done.truncated.push(hook.id.clone());
            }
            let mut failed: Vec<&HookDelivery> = deliveries
                .iter()
                .filter(|d| d.created_at >= since)
                .filter(|d| {
                    matches!(
                        d.status,
                        DeliveryStatus::Exhausted | DeliveryStatus::Cancelled
                    )
                })
                .filter(|d| !is_test(d))
                .collect();
            failed.reverse();
            for d in failed {
                if !hook.active {
                    done.skipped.push((
                        d.id.clone(),
                        format!(
                            "hook {} is disabled; `pulse hooks enable {}` first",
                            hook.id, hook.id
                        ),
                    ));
                    continue;
                }
                match self.replay(&d.id).await {
                    Ok(sent) => done.replayed.push(sent),
                    Err(EngineError::Missing(why) | EngineError::Contended(why)) => {
                        done.skipped.push((d.id.clone(), why));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(done)
    }
}

/// Whether a delivery is a test `pulse hooks test` sent (its payload says so).
fn is_test(d: &HookDelivery) -> bool {
    serde_json::from_str::<serde_json::Value>(&d.body)
        .ok()
        .and_then(|v| {
            v.pointer("/context/triggered_by")?
                .as_str()
                .map(|t| t == "TEST")
        })
        .unwrap_or(false)
}

/// How long [`Dispatcher::redrive`] hides each dead letter it took while it sends them
/// (a page of ten, each within its hook's timeout).
const REDRIVE_HIDE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// What [`Dispatcher::redrive`] did with each dead letter it took.
#[derive(Debug, Default)]
pub struct Redriven {
    /// Sent again, with the attempt each made: a success left the dead-letter queue, a
    /// failure stays in it.
    pub sent: Vec<(HookDelivery, HookAttempt)>,
    /// Left the dead-letter queue with nothing sent, and why: the delivery succeeded
    /// already, or it or its hook is gone.
    pub dropped: Vec<(String, String)>,
    /// Stayed in the dead-letter queue unsent, and why: its hook is disabled, another
    /// attempt is in flight, or the letter cannot be read.
    pub kept: Vec<(String, String)>,
}

impl Redriven {
    /// Letters that stay in the dead-letter queue: kept, or sent and failed again.
    pub fn left(&self) -> usize {
        self.kept.len()
            + self
                .sent
                .iter()
                .filter(|(_, a)| a.status != crate::domain::AttemptStatus::Success)
                .count()
    }
}

/// What became of one dead letter.
enum Fate {
    Sent(Box<(HookDelivery, HookAttempt)>),
    Dropped(String),
    Kept(String),
}

impl Dispatcher {
    /// Empties the hooks dead-letter queue, up to `max` letters, oldest first: each
    /// delivery is sent again now, one attempt (as `replay`), and leaves the queue when
    /// it succeeds or when there is nothing left to send (it succeeded already, or it or
    /// its hook is gone). A failure, a disabled hook or an attempt in flight leaves the
    /// letter where it was, visible again at once.
    pub async fn redrive(&self, max: usize) -> Result<Redriven, EngineError> {
        let mut done = Redriven::default();
        let mut again = Vec::new();
        let mut taken = 0;
        while taken < max {
            let page = self
                .queue
                .receive_dead((max - taken).min(10), REDRIVE_HIDE)
                .await?;
            if page.is_empty() {
                break;
            }
            taken += page.len();
            for letter in page {
                let (id, fate) = self.redrive_one(&letter).await?;
                let delete = match fate {
                    Fate::Sent(sent) => {
                        let ok = sent.1.status == crate::domain::AttemptStatus::Success;
                        done.sent.push(*sent);
                        ok
                    }
                    Fate::Dropped(why) => {
                        done.dropped.push((id, why));
                        true
                    }
                    Fate::Kept(why) => {
                        done.kept.push((id, why));
                        false
                    }
                };
                if delete {
                    self.queue
                        .settle_dead(&letter.receipt, crate::ports::Settle::Delete)
                        .await?;
                } else {
                    again.push(letter.receipt);
                }
            }
        }
        // Shown again only now, so this run does not take them twice.
        for receipt in again {
            self.queue
                .settle_dead(
                    &receipt,
                    crate::ports::Settle::Release(std::time::Duration::ZERO),
                )
                .await?;
        }
        Ok(done)
    }

    async fn redrive_one(
        &self,
        letter: &crate::domain::Delivery,
    ) -> Result<(String, Fate), EngineError> {
        let task = match HookTask::decode(&letter.body) {
            Ok(task) => task,
            Err(e) => {
                return Ok((
                    letter.message_id.to_string(),
                    Fate::Kept(format!("the letter cannot be read as a hook delivery: {e}")),
                ));
            }
        };
        let id = task.delivery_id.to_string();
        let Some(d) = self.store.get_delivery(&task.delivery_id).await? else {
            return Ok((
                id,
                Fate::Dropped("the delivery is no longer stored (retention removed it)".into()),
            ));
        };
        if d.status == DeliveryStatus::Succeeded {
            return Ok((
                id,
                Fate::Dropped("it succeeded already, sent again since".into()),
            ));
        }
        let Some(hook) = self.store.get_hook(&d.hook_id).await? else {
            return Ok((
                id,
                Fate::Dropped(format!("its hook {} was deleted", d.hook_id)),
            ));
        };
        if !hook.active {
            return Ok((
                id,
                Fate::Kept(format!(
                    "hook {} is disabled; `pulse hooks enable {}` first",
                    hook.id, hook.id
                )),
            ));
        }
        Ok((
            id,
            match self.replay(&task.delivery_id).await {
                Ok(sent) => Fate::Sent(Box::new(sent)),
                Err(EngineError::Missing(why) | EngineError::Contended(why)) => Fate::Kept(why),
                Err(e) => return Err(e),
            },
        ))
    }
}
