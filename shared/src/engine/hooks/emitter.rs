//! Emitting: the engine enqueues a delivery per matching hook and never waits on the
//! receiver.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::domain::{
    ActionId, Agent, AgentId, HeartbeatId, HookDeliveryId, HookPayload, HookRoute, HookTask,
    HookType, PayloadAgent, PayloadContext,
};
use crate::error::{EngineError, chain};
use crate::ports::{Clock, HookMessage, HookQueue, Store};

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
            data: crate::domain::clipped(e.data, HookPayload::MAX_DATA),
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
