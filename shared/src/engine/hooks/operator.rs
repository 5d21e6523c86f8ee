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
