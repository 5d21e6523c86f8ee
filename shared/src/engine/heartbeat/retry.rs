//! An action run again at its operator's asking (`pulse actions retry ID`).
//!
//! The action keeps its id; its next attempt is written RUNNING in one conditional write
//! that only a finished action at the attempt read passes (a running action, or a retry
//! that came first, is refused), its tool is called with the request it was given — the
//! tool's configuration as it is now — and the outcome and the events it returned are
//! recorded as any action's. Those events are dated now, so the agent's next heartbeat
//! reads them. The heartbeat agent is not retried this way: its run belongs to a
//! heartbeat (wake the agent instead).

use std::time::Instant;

use tracing::{info, warn};

use super::HeartbeatRunner;
use crate::domain::{
    Action, ActionId, ActionStatus, AgentId, EventId, HEARTBEAT_AGENT, ToolRequest,
};
use crate::engine::actions;
use crate::error::{EngineError, StoreError, ValidationError};
use crate::ports::Writer;

/// Why an action was not retried.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    /// There is no such action, or it cannot be retried as it is.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Storage or the tool registry could not be read.
    #[error(transparent)]
    Failed(#[from] EngineError),
}

/// How many times a retried action's outcome is written, dated anew each time, before
/// the retry fails with the store's error.
const FINISH_TRIES: u32 = 3;

impl From<StoreError> for RetryError {
    fn from(e: StoreError) -> Self {
        Self::Failed(e.into())
    }
}

impl HeartbeatRunner {
    /// Runs agent `agent`'s action `id` again (see the module's documentation): the
    /// action as recorded after this attempt.
    pub async fn retry_action(&self, agent: &AgentId, id: &ActionId) -> Result<Action, RetryError> {
        let invalid = |m: String| RetryError::Invalid(ValidationError::new("action", m));
        let Some(before) = actions::find(self.store.as_ref(), agent, id).await? else {
            return Err(invalid(format!("agent {agent} has no action {id}")));
        };
        if before.tool.as_str() == HEARTBEAT_AGENT {
            return Err(invalid(format!(
                "the heartbeat agent runs within a heartbeat; wake the agent instead (`pulse heartbeats trigger {agent}`)"
            )));
        }
        if let Some(call) = &before.call {
            return Err(invalid(format!(
                "action {id} is a call the agent's model made to {}/{} in its own run; Pulse does not make it again on its own. Look at the server, then settle it with `pulse actions resolve {id} --as succeeded|failed`; the agent can make the call again",
                before.tool, call.tool
            )));
        }
        if before.status == ActionStatus::Running {
            return Err(invalid(format!(
                "action {id} is running (attempt {}); wait for it to finish",
                before.attempt
            )));
        }
        let registry = self.store.load_registry().await?;
        let Some(tool) = registry
            .tools
            .iter()
            .find(|t| t.name == before.tool)
            .cloned()
        else {
            return Err(invalid(format!(
                "its tool {} no longer exists; add it again first",
                before.tool
            )));
        };
        let mut request: ToolRequest = serde_json::from_value(before.request.clone())
            .map_err(|e| invalid(format!("its recorded request cannot be read again: {e}")))?;
        request.attempt = before.attempt + 1;
        request.tool_config = tool.config.clone();
        let mut action = Action {
            status: ActionStatus::Running,
            attempt: request.attempt,
            request: serde_json::to_value(&request).unwrap_or_default(),
            response: None,
            error: None,
            started_at: self.clock.now(),
            completed_at: None,
            duration_ms: None,
            new_events: Vec::new(),
            ..before.clone()
        };
        if !self.store.retry_action(&action, before.attempt).await? {
            return Err(invalid(format!(
                "action {id} changed meanwhile (running, or retried by someone else); look again with `pulse actions show {id}`"
            )));
        }
        let began = Instant::now();
        let call = self.tools.call(&tool, &request).await;
        let now = self.clock.now();
        action.completed_at = Some(now);
        action.duration_ms = Some(began.elapsed().as_millis() as u64);
        action.keep_response(call.response_meta);
        let returned =
            super::actions::outcome(&mut action, call.result, tool.idempotent).unwrap_or_default();
        // The events are read by the agent's next heartbeat, which may start at any
        // moment, so they are written within the event write deadline of their date. A
        // write refused for coming too late (the database stalled) writes nothing: the
        // events are dated again and written once more, rather than leaving the action
        // RUNNING, which no retry could take again.
        let attempt = action.attempt.to_string();
        let mut dated_at = now;
        for tries in 1.. {
            let ms = dated_at.as_millisecond().max(0) as u64;
            let new_events: Vec<_> = returned
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, ne)| {
                    let mut e =
                        ne.into_event(agent.clone(), format!("tool:{}", tool.name), dated_at);
                    e.id = EventId::derived(ms, &[id.as_str(), &attempt, &i.to_string()]);
                    e.parent_id = Some(before.event_id.clone());
                    e
                })
                .collect();
            action.new_events = new_events.iter().map(|e| e.id.clone()).collect();
            match self
                .store
                .finish_action(&action, &new_events, Writer::Outside)
                .await
            {
                Ok(()) => break,
                Err(e @ StoreError::Backend { .. }) if tries < FINISH_TRIES => {
                    warn!(action_id = %id, error = %crate::error::chain(&e), "the retried action's outcome was not written; writing it again");
                    dated_at = self.clock.now();
                }
                // A write that timed out may have landed all the same (DynamoDB): then
                // the next one finds the action finished at this attempt.
                Err(StoreError::Conflict(_)) if tries > 1 => {
                    match actions::find(self.store.as_ref(), agent, id).await? {
                        Some(stored)
                            if stored.attempt == action.attempt
                                && stored.status != ActionStatus::Running =>
                        {
                            action = stored;
                            break;
                        }
                        _ => {
                            return Err(invalid(format!(
                                "action {id} changed while its outcome was being written; look again with `pulse actions show {id}`"
                            )));
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        info!(action_id = %id, attempt = action.attempt, status = ?action.status, "action retried");
        Ok(action)
    }
}
