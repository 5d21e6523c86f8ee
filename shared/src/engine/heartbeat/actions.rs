//! One action: started idempotently (a finished one is reused, an unfinished one run
//! again), its tool called, its outcome and the events it returned recorded, its hooks
//! emitted.

use std::time::Instant;

use tracing::{Instrument, info, info_span, warn};

use super::{ActionDone, HeartbeatRunner, Plan, to_json};
use crate::domain::{
    Action, ActionId, ActionStatus, Cascade, Event, EventId, HEARTBEAT_AGENT, NewEvent, Tool,
    ToolKind, ToolRequest,
};
use crate::engine::budget;
use crate::engine::interrupt::{self, Raced};
use crate::error::{EngineError, StoreError};
use crate::meter;
use crate::ports::{ToolFailure, Writer};

/// What an UNKNOWN action's error says to do.
pub(super) const SETTLE: &str = "settle it with `pulse actions retry ID` (the same Idempotency-Key is sent) or `pulse actions resolve ID --as succeeded|failed`";

/// How starting an action went.
enum Begun {
    /// Run the tool with this request; the action is recorded RUNNING.
    Run(Box<(ToolRequest, Action)>),
    /// A run before finished it: reuse it.
    Finished(Box<Action>),
}

impl HeartbeatRunner {
    /// Runs `tool` on `event` as one action, or reuses the action a run before finished.
    pub(super) async fn run_action(
        &self,
        plan: &Plan,
        event: &Event,
        depth: u8,
        tool: &Tool,
    ) -> Result<ActionDone, EngineError> {
        let id = ActionId::for_event(&event.id, &tool.name);
        let span = info_span!("action", action_id = %id, tool = %tool.name, event_id = %event.id);
        let trace = match tool.kind {
            ToolKind::HeartbeatAgent => {
                crate::traces::action(tool.name.as_str(), id.as_str(), event.id.as_str())
            }
            _ => {
                let trace = crate::traces::tool(tool.name.as_str(), id.as_str(), "extension");
                trace.record("pulse.action.id", id.as_str());
                trace
            }
        };
        async {
            let (request, mut action) = match self.begin_action(plan, event, depth, tool).await? {
                Begun::Run(run) => *run,
                Begun::Finished(existing) => {
                    return self.replay(plan, event, tool, *existing).await;
                }
            };
            self.start_hooks(plan, event, tool, &id, request.attempt)
                .await?;
            let began = Instant::now();
            // An HTTP tool's call is raced against a user message, so the person is
            // answered first. One that is safe to make again is dropped: the action,
            // left RUNNING, is called again (the same key) by the heartbeat that reads
            // this window next. Any other goes on in the background and its outcome is
            // recorded when it ends; the next heartbeat reuses it.
            let call = if matches!(tool.kind, ToolKind::Http { .. }) {
                let mut sent = {
                    let (tools, tool, request) = (self.tools.clone(), tool.clone(), request.clone());
                    Box::pin(async move { tools.call(&tool, &request).await })
                };
                let raced = interrupt::unless_user_speaks(
                    self.store.as_ref(),
                    &plan.agent.id,
                    Some(plan.heartbeat_context.started_at),
                    interrupt::StopOn::UserOrCancel,
                    &mut sent,
                )
                .await;
                match raced {
                    Raced::Done(call) => call,
                    Raced::Interrupted(at) if tool.idempotent => {
                        info!(newer_message_at = %at, "a user message arrived during an idempotent tool's call: dropped, to be made again by the next heartbeat");
                        return Ok(self.dropped(action, at));
                    }
                    Raced::Interrupted(at) => {
                        info!(newer_message_at = %at, "a user message arrived during a tool's call that is not safe to make again: it finishes in the background");
                        let (recorder, running) = (self.recorder(plan, event, tool), action.clone());
                        tokio::spawn(async move {
                            let call = sent.await;
                            recorder.finish_behind(running, call, began).await;
                        });
                        return Ok(self.dropped(action, at));
                    }
                }
            } else {
                self.tools.call(tool, &request).await
            };
            let new_events = self
                .recorder(plan, event, tool)
                .settle_call(&mut action, call, began);
            let completed_at = action.completed_at.unwrap_or(action.started_at);
            match self
                .store
                .finish_action(&action, &new_events, Writer::Session)
                .await
            {
                Ok(()) => {}
                Err(StoreError::Conflict(why)) => return Err(EngineError::Contended(why)),
                Err(e) => return Err(e.into()),
            }
            // Counted once, when recorded: a replayed action is not counted again.
            if matches!(action.status, ActionStatus::Failed | ActionStatus::Unknown) {
                meter::action_failed();
            }
            let capped = new_events
                .iter()
                .filter(|e| e.cascade.as_ref().is_some_and(|c| c.capped))
                .count();
            if capped > 0 {
                meter::cascade_capped(capped);
            }
            if action.tool.as_str() == HEARTBEAT_AGENT {
                let tokens = model_tokens(action.response.as_ref());
                budget::record(
                    self.store.as_ref(),
                    &plan.agent,
                    completed_at,
                    action.id.as_str(),
                    tokens,
                )
                .await;
            }
            self.finish_hooks(plan, event, &action, &new_events).await?;
            // Health counts calls that were made: not a skipped or cancelled one.
            if matches!(tool.kind, ToolKind::Http { .. })
                && matches!(
                    action.status,
                    ActionStatus::Completed | ActionStatus::Failed | ActionStatus::Unknown
                )
            {
                let ok = action.status == ActionStatus::Completed;
                if let Some(change) =
                    self.health
                        .record(&plan.agent.id, &tool.name, ok, completed_at)
                {
                    change
                        .announce(self.hooks.as_ref(), &plan.routes, &plan.agent)
                        .await;
                }
            }
            let done = self.settle(&action, new_events);
            if action.status == ActionStatus::Skipped {
                info!(reason = action.error.as_deref(), "action skipped");
            } else if let Some(err) = &action.error {
                crate::traces::failed(&trace, "tool_error", err);
                warn!(duration_ms = action.duration_ms, error = %err, "action failed");
            } else {
                info!(
                    duration_ms = action.duration_ms,
                    new_events = action.new_events.len(),
                    "action completed"
                );
            }
            Ok(done)
        }
        .instrument(span)
        .instrument(trace.clone())
        .await
    }

    /// Why the heartbeat agent need not be called for `event` at all: its think policy
    /// finds nothing to think about. Its SKIPPED action is then recorded with the
    /// heartbeat's finish, so an idle beat makes no write of its own for it. (A skip for
    /// a spent daily budget goes the usual way: it depends on what was spent, which a
    /// rerun may see differently, and a stored action must never be overwritten.)
    pub(super) fn skip_without_call(
        &self,
        plan: &Plan,
        event: &Event,
        tool: &Tool,
    ) -> Option<String> {
        if tool.name.as_str() != HEARTBEAT_AGENT
            || event.id != plan.heartbeat_event.id
            || plan.heartbeat_context.budget_spent.is_some()
        {
            return None;
        }
        // A beat that keeps the cache warm calls the heartbeat agent, which makes the
        // warm-up call and records it as its skip.
        let why = plan.agent_context.thinks(&plan.heartbeat_context).err()?;
        (!plan.heartbeat_context.warm_up).then_some(why)
    }

    /// Emits the hooks of the heartbeat agent's SKIPPED action, not called, as for any
    /// action; the finish records the skip on the heartbeat.
    pub(super) async fn skipped(
        &self,
        plan: &Plan,
        event: &Event,
        tool: &Tool,
        why: &str,
    ) -> Result<(), EngineError> {
        let mut hb = plan.heartbeat.clone();
        hb.started_at = Some(plan.heartbeat_context.started_at);
        hb.completed_at = Some(self.clock.now());
        hb.skipped = Some(why.to_owned());
        let Some(action) = hb.skipped_action() else {
            return Ok(());
        };
        self.start_hooks(plan, event, tool, &action.id, 1).await?;
        self.finish_hooks(plan, event, &action, &[]).await?;
        info!(action_id = %action.id, reason = why, "heartbeat agent skipped without being called");
        Ok(())
    }

    /// Records the action as RUNNING, idempotently: a first run starts at attempt 1, a
    /// rerun of an unfinished action takes the next attempt, a finished one is returned
    /// for reuse.
    async fn begin_action(
        &self,
        plan: &Plan,
        event: &Event,
        depth: u8,
        tool: &Tool,
    ) -> Result<Begun, EngineError> {
        let id = ActionId::for_event(&event.id, &tool.name);
        let mut heartbeat = plan.heartbeat_context.clone();
        // What the tools found is for the heartbeat agent to think about: no other tool
        // is sent another tool's output.
        if tool.name.as_str() != HEARTBEAT_AGENT || event.id != plan.heartbeat_event.id {
            heartbeat.found = Default::default();
        }
        let mut request = ToolRequest {
            action_id: id.clone(),
            attempt: 1,
            event: event.clone(),
            agent: plan.agent_context.clone(),
            heartbeat,
            tool_config: tool.config.clone(),
        };
        let mut action = Action {
            id: id.clone(),
            agent_id: plan.agent.id.clone(),
            heartbeat_id: plan.heartbeat.id(),
            event_id: event.id.clone(),
            tool: tool.name.clone(),
            status: ActionStatus::Running,
            attempt: 1,
            depth,
            request: to_json(&request),
            response: None,
            error: None,
            started_at: self.clock.now(),
            completed_at: None,
            duration_ms: None,
            new_events: Vec::new(),
            call: None,
        };
        match self.store.start_action(&action).await? {
            None => {}
            Some(existing) if existing.status.is_final() => {
                return Ok(Begun::Finished(Box::new(existing)));
            }
            Some(existing)
                if !tool.idempotent
                    && match tool.kind {
                        ToolKind::Http { timeout_ms, .. } => existing
                            .started_at
                            .checked_add(jiff::SignedDuration::from_millis(
                                timeout_ms.saturating_add(5_000).min(i64::MAX as u64) as i64,
                            ))
                            .is_ok_and(|until| until > self.clock.now()),
                        _ => false,
                    } =>
            {
                // A run that yielded to the person may still be calling it in the
                // background: wait for it rather than call it twice or give up on it.
                return Err(EngineError::Contended(format!(
                    "{} may still be being called by an earlier run of this heartbeat (started {}); trying again later",
                    tool.name, existing.started_at
                )));
            }
            Some(existing) if !tool.idempotent => {
                // A run stopped while the tool was being called: it may have done its
                // work, so it is not called again blindly.
                let mut unknown = existing.clone();
                unknown.status = ActionStatus::Unknown;
                unknown.completed_at = Some(self.clock.now());
                unknown.error = Some(format!(
                    "an earlier run stopped while {} was being called (attempt {}), so it may have done its work; {SETTLE}",
                    tool.name, existing.attempt
                ));
                match self
                    .store
                    .finish_action(&unknown, &[], Writer::Session)
                    .await
                {
                    Ok(()) => {}
                    Err(StoreError::Conflict(why)) => return Err(EngineError::Contended(why)),
                    Err(e) => return Err(e.into()),
                }
                warn!(tool = %tool.name, attempt = existing.attempt, "an earlier run of this action did not finish and the tool is not idempotent: recorded UNKNOWN, not called again");
                meter::action_failed();
                return Ok(Begun::Finished(Box::new(unknown)));
            }
            Some(existing) => {
                request.attempt = existing.attempt + 1;
                action.attempt = request.attempt;
                action.request = to_json(&request);
                if !self.store.restart_action(&action, existing.attempt).await? {
                    return Err(EngineError::Contended(format!(
                        "action {id} was taken over by another run of this heartbeat"
                    )));
                }
                warn!(
                    attempt = action.attempt,
                    "an earlier run of this action did not finish; running it again"
                );
            }
        }
        Ok(Begun::Run(Box::new((request, action))))
    }

    /// The events a completed action returned, as events of this heartbeat's cascade one
    /// level below `event` (marked capped past the depth limit). Their ids derive from
    /// the action, so a rerun makes the same ones.
    /// What records `tool`'s action on `event` once its call ends.
    fn recorder(&self, plan: &Plan, event: &Event, tool: &Tool) -> Recorder {
        Recorder {
            store: self.store.clone(),
            clock: self.clock.clone(),
            cap: self.settings.cascade_depth,
            heartbeat: plan.heartbeat.id(),
            parent: event.id.clone(),
            tool: tool.name.clone(),
            idempotent: tool.idempotent,
        }
    }

    /// Reuses a finished action: its new events are read back and cascade as before,
    /// and its hooks are emitted again (a run that finished it may have stopped before
    /// they were queued; the same delivery ids make each go out once).
    async fn replay(
        &self,
        plan: &Plan,
        event: &Event,
        tool: &Tool,
        action: Action,
    ) -> Result<ActionDone, EngineError> {
        let events = self
            .store
            .get_events(&action.agent_id, &action.new_events)
            .await?;
        if events.len() != action.new_events.len() {
            return Err(EngineError::Missing(format!(
                "action {} lists {} new events but {} are stored",
                action.id,
                action.new_events.len(),
                events.len()
            )));
        }
        info!(status = ?action.status, "action already finished; reusing its result");
        self.start_hooks(plan, event, tool, &action.id, action.attempt)
            .await?;
        self.finish_hooks(plan, event, &action, &events).await?;
        Ok(self.settle(&action, events))
    }

    /// What an action whose call was dropped for a user message at `at` leaves: nothing
    /// recorded (it stays RUNNING, for the next run to make again), and the heartbeat
    /// interrupted.
    fn dropped(&self, mut action: Action, at: jiff::Timestamp) -> ActionDone {
        action.status = ActionStatus::Cancelled;
        ActionDone {
            action,
            returned: Vec::new(),
            scheduled: false,
            failed: false,
            cascade: Vec::new(),
            capped: 0,
            interrupted: Some(format!(
                "interrupted: a user message arrived at {at}, during a tool's call"
            )),
        }
    }

    /// Splits an action's new events into the ones to process next and the ones the
    /// depth cap stopped.
    fn settle(&self, action: &Action, new_events: Vec<Event>) -> ActionDone {
        let returned = new_events.clone();
        let (capped, cascade): (Vec<Event>, Vec<Event>) = new_events
            .into_iter()
            .partition(|e| e.cascade.as_ref().is_some_and(|c| c.capped));
        if !capped.is_empty() {
            warn!(
                depth = self.settings.cascade_depth,
                events = capped.len(),
                "cascade depth cap reached: these events are recorded but not processed"
            );
        }
        ActionDone {
            action: action.clone(),
            returned,
            // The heartbeat agent made schedules: its finish must see the new wake.
            scheduled: action.response.as_ref().is_some_and(|r| {
                r["output"]["scheduled"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
            }),
            failed: matches!(action.status, ActionStatus::Failed | ActionStatus::Unknown),
            cascade,
            capped: capped.len() as u32,
            interrupted: (action.status == ActionStatus::Cancelled).then(|| {
                action
                    .error
                    .clone()
                    .unwrap_or_else(|| "interrupted".to_owned())
            }),
        }
    }
}

/// The model tokens (input and output) an action's response reports.
fn model_tokens(response: Option<&serde_json::Value>) -> u64 {
    let usage = response.map(|r| &r["usage"]);
    let n = |k: &str| usage.and_then(|u| u[k].as_u64()).unwrap_or(0);
    n("input_tokens") + n("output_tokens")
}

/// Records a tool's answer on `action`: its status and error. The events a completed
/// call returned, for the caller to date and file; `None` for any other outcome.
///
/// A call whose answer was lost after it was sent is UNKNOWN unless the tool is
/// idempotent (then it is a plain failure, safe to run again).
/// The events an action returned, as events of its heartbeat's cascade one level down
/// from `parent` (capped past `cap`), their ids derived from the action.
fn made_events(
    cap: u8,
    heartbeat: crate::domain::HeartbeatId,
    parent: &EventId,
    tool: &crate::domain::ToolName,
    action: &Action,
    returned: Vec<NewEvent>,
) -> Vec<Event> {
    let child_depth = action.depth.saturating_add(1);
    let capped = child_depth > cap;
    let completed_at = action.completed_at.unwrap_or(action.started_at);
    let ms = completed_at.as_millisecond().max(0) as u64;
    returned
        .into_iter()
        .enumerate()
        .map(|(i, ne)| Event {
            id: EventId::derived(ms, &[action.id.as_str(), &i.to_string()]),
            agent_id: action.agent_id.clone(),
            event_type: ne.event_type,
            priority: ne.priority,
            source: format!("tool:{tool}"),
            payload: ne.payload,
            metadata: ne.metadata,
            parent_id: Some(parent.clone()),
            cascade: Some(Cascade {
                heartbeat_id: heartbeat.clone(),
                depth: child_depth,
                capped,
            }),
            created_at: completed_at,
        })
        .collect()
}

/// What an action's call needs to be recorded when it ends: in the run, or after the
/// run yielded to the person (the next heartbeat then reuses the action, cascades its
/// events and emits its hooks).
struct Recorder {
    store: std::sync::Arc<dyn crate::ports::Store>,
    clock: std::sync::Arc<dyn crate::ports::Clock>,
    cap: u8,
    heartbeat: crate::domain::HeartbeatId,
    parent: EventId,
    tool: crate::domain::ToolName,
    idempotent: bool,
}

impl Recorder {
    /// Puts the call's outcome on `action` (its time, its response, its status); the
    /// events it returned, as events of the heartbeat's cascade.
    fn settle_call(
        &self,
        action: &mut Action,
        call: crate::ports::ToolCall,
        began: Instant,
    ) -> Vec<Event> {
        action.completed_at = Some(self.clock.now());
        action.duration_ms = Some(began.elapsed().as_millis() as u64);
        action.keep_response(call.response_meta);
        let Some(events) = outcome(action, call.result, self.idempotent) else {
            return Vec::new();
        };
        let made = made_events(
            self.cap,
            self.heartbeat.clone(),
            &self.parent,
            &self.tool,
            action,
            events,
        );
        action.new_events = made.iter().map(|e| e.id.clone()).collect();
        made
    }

    /// Records a call that ended after its run yielded.
    async fn finish_behind(self, mut action: Action, call: crate::ports::ToolCall, began: Instant) {
        let new_events = self.settle_call(&mut action, call, began);
        match self
            .store
            .finish_action(&action, &new_events, Writer::Session)
            .await
        {
            Ok(()) => {
                info!(action_id = %action.id, status = ?action.status, "a tool's call finished in the background; recorded")
            }
            Err(e) => {
                warn!(action_id = %action.id, error = %crate::error::chain(&e), "a tool's call finished in the background but could not be recorded; the next run finds it RUNNING")
            }
        }
    }
}

pub(super) fn outcome(
    action: &mut Action,
    result: Result<crate::domain::ToolResponse, ToolFailure>,
    idempotent: bool,
) -> Option<Vec<NewEvent>> {
    let (status, error) = match result {
        Ok(resp) if resp.success => {
            action.status = ActionStatus::Completed;
            return Some(resp.new_events);
        }
        Ok(resp) => (
            ActionStatus::Failed,
            resp.error
                .unwrap_or_else(|| "the tool answered \"success\": false".to_owned()),
        ),
        Err(ToolFailure::Interrupted(why)) => (ActionStatus::Cancelled, why),
        Err(ToolFailure::Skipped(why)) => (ActionStatus::Skipped, why),
        Err(ToolFailure::Unknown(why)) if !idempotent => {
            (ActionStatus::Unknown, format!("{why}; {SETTLE}"))
        }
        Err(failure) => (ActionStatus::Failed, failure.to_string()),
    };
    action.status = status;
    action.error = Some(error);
    None
}
