//! What an operator asks of the dispatcher: a test delivery, a replay of a past one.

use serde_json::json;

use super::Dispatcher;
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
}
