//! A hook's health: consecutive failures counted after each attempt, and the hook
//! disabled (with a HOOK_DISABLED notice) past its limit.

use jiff::Timestamp;
use serde_json::Value;
use tracing::{error, warn};

use super::{Dispatcher, Emission};
use crate::domain::{Event, EventId, EventType, Hook, HookData, HookType, Priority, to_ms};
use crate::error::{EngineError, StoreError, chain};

impl Dispatcher {
    /// Records the outcome on the hook: a success ends a failure streak, a failure
    /// starts one, and `disable` disables it (logged, a HOOK_DISABLED event appended
    /// and emitted). Conflicting writes are re-read and retried.
    pub(super) async fn health(
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
        // Stamped as it is written, not when the failing attempt began: the log takes an
        // event from outside the agent's session only soon after its stamp.
        let ms = to_ms(self.clock.now()).max(0) as u64;
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
}
