//! Running one heartbeat job.
//!
//! The run reads the window `(window_start, window_end]` of the agent's log (both cursors
//! are on the claimed record, so a retried run reads the same window), appends the
//! HEARTBEAT event, and runs every subscribed tool for every event, breadth first: the
//! events a level's tools return form the next level, up to the depth cap. Then one atomic
//! write finishes the heartbeat, schedules the next one with `window_start` = this
//! `window_end`, and stores the HEARTBEAT event.
//!
//! Why events are never lost or processed twice:
//! - Events appended while the run goes on are stamped after `window_end` (which lies
//!   `event_settle` before the claim), so the next heartbeat reads them.
//! - Events the run makes itself (HEARTBEAT, tool outputs) are marked with this
//!   heartbeat and skipped by every window: they are processed here, once.
//! - Actions have ids derived from (event, tool). A redelivered job, or a rerun after a
//!   crash or an engine failure, finds the finished action and reuses its result.

use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;
use serde_json::{Value, json};
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::EngineSettings;
use super::hooks::{Emission, HookEmitter};
use super::schedule::next_run;
use crate::domain::{
    Action, ActionId, ActionStatus, Agent, AgentContext, Beats, Cascade, Event, EventCursor,
    EventId, EventType, Heartbeat, HeartbeatContext, HeartbeatId, HeartbeatStatus, HookData,
    HookRoute, HookType, Priority, Registry, Tool, ToolRequest, to_ms,
};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::{Clock, Finish, FinishOutcome, Store, ToolFailure, ToolRunner};

/// How a heartbeat job ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// The heartbeat completed; the record as written.
    Completed(Heartbeat),
    /// The engine could not finish the work; recorded FAILED, the next one scheduled.
    Failed(Heartbeat),
    /// The agent no longer exists; recorded CANCELLED, nothing scheduled.
    Cancelled,
    /// A user message interrupted it; recorded CANCELLED with what it had done, the
    /// window handed on, the next one scheduled.
    Interrupted(Heartbeat),
    /// The user talked to the agent within its quiet period: put back to PENDING, due
    /// at this time.
    Deferred(Timestamp),
    /// This claim had already finished the heartbeat (a redelivered job).
    AlreadyFinished,
    /// A later claim owns the heartbeat; this run's result was dropped.
    Superseded,
}

/// Runs heartbeat jobs.
pub struct HeartbeatRunner {
    store: Arc<dyn Store>,
    tools: Arc<dyn ToolRunner>,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    /// Emits hooks at the lifecycle points, when a hooks queue is configured.
    hooks: Option<HookEmitter>,
    /// The cached registry. An async mutex, held while loading, so runs that start
    /// together share one read instead of each making their own.
    registry: tokio::sync::Mutex<Option<(Timestamp, Arc<Registry>)>>,
}

/// What a run knows once it has read its window.
struct Plan {
    heartbeat: Heartbeat,
    agent: Agent,
    beats: Beats,
    last_interaction_beat: u64,
    interaction_seen_at: Option<Timestamp>,
    heartbeat_event: Event,
    agent_context: AgentContext,
    heartbeat_context: HeartbeatContext,
    /// The agent's hooks, read once per run.
    routes: Vec<HookRoute>,
}

#[derive(Default)]
struct Stats {
    events_processed: u32,
    actions_triggered: u32,
    actions_failed: u32,
    cascade_capped: u32,
    /// Set when a tool stopped because a user message arrived: the run stops there.
    interrupted: Option<String>,
}

struct ActionDone {
    failed: bool,
    cascade: Vec<Event>,
    capped: u32,
    interrupted: Option<String>,
}

impl HeartbeatRunner {
    /// A runner over a store, the tools, and a clock.
    pub fn new(
        store: Arc<dyn Store>,
        tools: Arc<dyn ToolRunner>,
        clock: Arc<dyn Clock>,
        settings: EngineSettings,
    ) -> Self {
        Self {
            store,
            tools,
            clock,
            settings,
            hooks: None,
            registry: tokio::sync::Mutex::new(None),
        }
    }

    /// Emits hooks through `emitter` (BEFORE/AFTER_HEARTBEAT, HEARTBEAT_FAILED,
    /// BEFORE/AFTER_<TOOL>, ACTION_*).
    pub fn with_hooks(mut self, emitter: HookEmitter) -> Self {
        self.hooks = Some(emitter);
        self
    }

    /// Enqueues the hooks of `hook_type` for this run. `data` is built only when one of
    /// the agent's hooks fires on it.
    ///
    /// Delivery ids come from the heartbeat, or for an action's hooks from the action
    /// (and its event's time), so a rerun, or a later heartbeat reusing the action, emits
    /// the same deliveries and the dispatcher sends each once. A failure to enqueue fails
    /// the job, which the queue runs again.
    async fn emit(
        &self,
        plan: &Plan,
        hook_type: HookType,
        action: Option<(&ActionId, &EventId)>,
        triggered_by: &str,
        data: impl FnOnce() -> Value,
    ) -> Result<(), EngineError> {
        let Some(hooks) = &self.hooks else {
            return Ok(());
        };
        if !plan
            .routes
            .iter()
            .any(|r| r.active && r.hook_type == hook_type)
        {
            return Ok(());
        }
        let (key_ms, key) = match action {
            Some((a, event)) => (event.timestamp_ms(), vec![a.to_string()]),
            None => (
                to_ms(plan.heartbeat_context.started_at).max(0) as u64,
                vec![plan.heartbeat_context.id.to_string()],
            ),
        };
        let emission = Emission {
            hook_type,
            heartbeat_id: Some(plan.heartbeat_context.id.clone()),
            action_id: action.map(|(a, _)| a.clone()),
            data: data(),
            triggered_by: triggered_by.to_owned(),
            key_ms,
            key,
        };
        hooks
            .emit(&plan.routes, &plan.agent, emission)
            .await
            .map(|_| ())
    }

    /// BEFORE_<TOOL> and ACTION_STARTED for an action of `tool` on `event`.
    async fn start_hooks(
        &self,
        plan: &Plan,
        event: &Event,
        tool: &Tool,
        id: &ActionId,
        attempt: u32,
    ) -> Result<(), EngineError> {
        let data = || HookData::tool_started(&tool.name, attempt, event);
        let triggered_by = event.event_type.as_str();
        let action = Some((id, &event.id));
        self.emit(
            plan,
            HookType::before_tool(&tool.name),
            action,
            triggered_by,
            data,
        )
        .await?;
        self.emit(
            plan,
            HookType::of(HookType::ACTION_STARTED),
            action,
            triggered_by,
            data,
        )
        .await
    }

    /// AFTER_<TOOL> and ACTION_COMPLETED or ACTION_FAILED for a finished `action`.
    async fn finish_hooks(
        &self,
        plan: &Plan,
        event: &Event,
        action: &Action,
        new_events: &[Event],
    ) -> Result<(), EngineError> {
        let data = || HookData::tool_finished(action, new_events);
        let triggered_by = event.event_type.as_str();
        let id = Some((&action.id, &event.id));
        self.emit(
            plan,
            HookType::after_tool(&action.tool),
            id,
            triggered_by,
            data,
        )
        .await?;
        let finished_type = match action.status {
            ActionStatus::Completed => Some(HookType::ACTION_COMPLETED),
            ActionStatus::Failed => Some(HookType::ACTION_FAILED),
            _ => None,
        };
        match finished_type {
            Some(t) => {
                self.emit(plan, HookType::of(t), id, triggered_by, data)
                    .await
            }
            None => Ok(()),
        }
    }

    /// Puts the claimed heartbeat back to PENDING, due at `until`.
    async fn defer(
        &self,
        hb: &Heartbeat,
        until: Timestamp,
        why: &'static str,
    ) -> Result<RunOutcome, EngineError> {
        if self.store.defer(hb, until).await? {
            info!(until = %until, "{why}");
            return Ok(RunOutcome::Deferred(until));
        }
        Ok(RunOutcome::Superseded)
    }

    /// Gives back a claimed heartbeat whose job was never started (its worker is
    /// stopping): PENDING again, due now, so the next sweep claims it afresh. False if the
    /// claim was no longer held.
    pub async fn release(&self, heartbeat: &Heartbeat) -> Result<bool, StoreError> {
        let released = self.store.defer(heartbeat, self.clock.now()).await?;
        if released {
            info!(heartbeat_id = %heartbeat.id(), claim = heartbeat.claim, "claimed heartbeat released: its job was not started");
        }
        Ok(released)
    }

    /// Runs a claimed heartbeat to its end. An `Err` means the outcome could not be
    /// recorded (storage unavailable); the job should be delivered again.
    pub async fn run(&self, heartbeat: &Heartbeat) -> Result<RunOutcome, EngineError> {
        let span = info_span!(
            "heartbeat",
            agent_id = %heartbeat.agent_id,
            heartbeat_id = %heartbeat.id(),
            beat = heartbeat.beat,
        );
        self.run_inner(heartbeat).instrument(span).await
    }

    async fn run_inner(&self, hb: &Heartbeat) -> Result<RunOutcome, EngineError> {
        let Some(window_end) = hb.window_end.clone() else {
            return Err(EngineError::Missing(format!(
                "heartbeat {} has no window end: the job was not made by a claim",
                hb.id()
            )));
        };
        debug!(claim = hb.claim, window_start = %hb.window_start, window_end = %window_end, "heartbeat started");
        // A job normally starts moments after its claim. One that waited (delivered again
        // after its worker died, or queued behind a stuck message or a stopped worker)
        // may have outlived half its lease, and a sweeper may have reclaimed it since:
        // renew the claim before any work, or step aside for the newer claim, so a stale
        // job never runs the heartbeat a second time.
        let now = self.clock.now();
        let half = self.settings.lease / 2;
        if hb
            .lease_until
            .is_none_or(|until| until.duration_since(now) < half)
        {
            let until = now.saturating_add(self.settings.lease).unwrap_or(now);
            if !self.store.renew(hb, until).await? {
                info!(
                    claim = hb.claim,
                    "this job's claim was taken over or the heartbeat ended: nothing to run"
                );
                return Ok(RunOutcome::Superseded);
            }
            info!(claim = hb.claim, lease_until = %until, "a late job renewed its claim");
        }
        let window = match self
            .store
            .read_window(
                &hb.agent_id,
                &hb.window_start,
                &window_end,
                self.settings.max_window_events,
            )
            .await
        {
            Ok(w) => w,
            Err(e) => return self.fail(hb, None, e.into()).await,
        };
        let Some(agent) = window.agent else {
            return self.cancel(hb).await;
        };
        // Seed 004, option D: right after the user talked to the agent, its next
        // heartbeat waits out a quiet period instead of chiming in.
        let now = self.clock.now();
        if let Some(at) = agent.last_interaction_at {
            let until =
                agent.in_active_hours(at.saturating_add(agent.quiet_period()).unwrap_or(at));
            if until > now {
                return self
                    .defer(hb, until, "the user talked to the agent recently: heartbeat deferred to the end of its quiet period")
                    .await;
            }
        }
        // Due times are planned inside the active hours; one that comes up outside them
        // (claimed late, or the hours changed) waits for them to open.
        if !agent.is_active_at(now) {
            let until = agent.in_active_hours(now);
            return self
                .defer(
                    hb,
                    until,
                    "outside the agent's active hours: heartbeat deferred to their next start",
                )
                .await;
        }
        let next_start = match (window.truncated, window.events.last()) {
            (true, Some(last)) => EventCursor::after(&last.id),
            _ => window_end,
        };
        let mut plan = self.plan(hb, agent);
        if let Some(hooks) = &self.hooks {
            plan.routes = hooks.routes(&plan.agent.id).await?;
        }
        self.emit(
            &plan,
            HookType::of(HookType::BEFORE_HEARTBEAT),
            None,
            "SCHEDULE",
            || {
                HookData::before_heartbeat(
                    plan.beats,
                    plan.heartbeat_context.scheduled_at,
                    plan.heartbeat_context.started_at,
                    window.events.len(),
                )
            },
        )
        .await?;
        match self.process(&plan, window.events).await {
            Ok(stats) if stats.interrupted.is_some() => self.interrupt(plan, stats).await,
            Ok(stats) => {
                self.complete(plan, stats, next_start, window.truncated)
                    .await
            }
            // Not the heartbeat's failure: the job runs again (a hook not queued, a run
            // of the same heartbeat busy), and the rerun reuses what finished.
            Err(e @ (EngineError::Contended(_) | EngineError::Unavailable(_))) => Err(e),
            Err(e) => {
                let agent = plan.agent.clone();
                self.fail(hb, Some(agent), e).await
            }
        }
    }

    fn plan(&self, hb: &Heartbeat, agent: Agent) -> Plan {
        let started_at = hb.started_at.unwrap_or_else(|| self.clock.now());
        // An interaction not yet counted happened since the previous heartbeat: it is
        // dated to the previous beat, as in seed 003 (`since_last` = 1 right after one).
        let (last_interaction_beat, interaction_seen_at) = match agent.last_interaction_at {
            Some(t) if hb.interaction_seen_at.is_none_or(|seen| t > seen) => {
                (hb.beat.saturating_sub(1), Some(t))
            }
            _ => (hb.last_interaction_beat, hb.interaction_seen_at),
        };
        let beats = Beats {
            beat: hb.beat,
            since_last: hb.beat.saturating_sub(last_interaction_beat),
        };
        let id = hb.id();
        let heartbeat_event = Event {
            id: EventId::derived(
                started_at.as_millisecond().max(0) as u64,
                &["heartbeat", &id.to_string()],
            ),
            agent_id: agent.id.clone(),
            event_type: EventType::heartbeat(),
            priority: Priority::DEFAULT,
            source: "system".to_owned(),
            payload: json!({
                "heartbeat_id": id,
                "beat": beats.beat,
                "since_last": beats.since_last,
                "scheduled_at": hb.scheduled_at,
            }),
            metadata: Value::Null,
            parent_id: None,
            cascade: Some(Cascade {
                heartbeat_id: id.clone(),
                depth: 0,
                capped: false,
            }),
            created_at: started_at,
        };
        Plan {
            agent_context: AgentContext::from(&agent),
            heartbeat_context: HeartbeatContext {
                id,
                beats,
                scheduled_at: hb.scheduled_at,
                started_at,
                window_start: hb.window_start.clone(),
                window_end: hb
                    .window_end
                    .clone()
                    .unwrap_or_else(|| hb.window_start.clone()),
            },
            heartbeat: hb.clone(),
            agent,
            routes: Vec::new(),
            beats,
            last_interaction_beat,
            interaction_seen_at,
            heartbeat_event,
        }
    }

    /// Processes the window and the HEARTBEAT event, then the cascades they cause, one
    /// level at a time.
    async fn process(&self, plan: &Plan, window: Vec<Event>) -> Result<Stats, EngineError> {
        let registry = self.registry().await?;
        let mut stats = Stats::default();
        let mut level = window;
        level.push(plan.heartbeat_event.clone());
        let mut heartbeat_event_stored = false;
        let mut depth = 0u8;
        while !level.is_empty() {
            let mut next = Vec::new();
            for event in &level {
                stats.events_processed += 1;
                let matching = registry.matching(event);
                // Actions refer to their event: store HEARTBEAT before its first action,
                // not only with the finish.
                if !matching.is_empty()
                    && !heartbeat_event_stored
                    && event.id == plan.heartbeat_event.id
                {
                    self.store.append(&plan.heartbeat_event).await?;
                    heartbeat_event_stored = true;
                }
                for (_, tool) in matching {
                    let done = self.run_action(plan, event, depth, tool).await?;
                    stats.actions_triggered += 1;
                    stats.actions_failed += u32::from(done.failed);
                    stats.cascade_capped += done.capped;
                    next.extend(done.cascade);
                    if done.interrupted.is_some() {
                        // Yield to the user's turn now: nothing else runs in this heartbeat.
                        stats.interrupted = done.interrupted;
                        return Ok(stats);
                    }
                }
            }
            level = next;
            depth = depth.saturating_add(1);
        }
        Ok(stats)
    }

    async fn run_action(
        &self,
        plan: &Plan,
        event: &Event,
        depth: u8,
        tool: &Tool,
    ) -> Result<ActionDone, EngineError> {
        let id = ActionId::for_event(&event.id, &tool.name);
        let span = info_span!("action", action_id = %id, tool = %tool.name, event_id = %event.id);
        async {
            let mut request = ToolRequest {
                action_id: id.clone(),
                attempt: 1,
                event: event.clone(),
                agent: plan.agent_context.clone(),
                heartbeat: plan.heartbeat_context.clone(),
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
            };
            match self.store.start_action(&action).await? {
                None => {}
                Some(existing) if existing.status.is_final() => {
                    return self.replay(plan, event, tool, existing).await;
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

            self.start_hooks(plan, event, tool, &id, request.attempt)
                .await?;
            let began = Instant::now();
            let call = self.tools.call(tool, &request).await;
            let completed_at = self.clock.now();
            action.completed_at = Some(completed_at);
            action.duration_ms = Some(began.elapsed().as_millis() as u64);
            action.response = call.response_meta;

            let mut new_events = Vec::new();
            match call.result {
                Err(ToolFailure::Interrupted(why)) => {
                    action.status = ActionStatus::Cancelled;
                    action.error = Some(why);
                }
                Ok(resp) if resp.success => {
                    action.status = ActionStatus::Completed;
                    let child_depth = depth.saturating_add(1);
                    let capped = child_depth > self.settings.cascade_depth;
                    let ms = completed_at.as_millisecond().max(0) as u64;
                    for (i, ne) in resp.new_events.into_iter().enumerate() {
                        new_events.push(Event {
                            id: EventId::derived(ms, &[id.as_str(), &i.to_string()]),
                            agent_id: plan.agent.id.clone(),
                            event_type: ne.event_type,
                            priority: ne.priority,
                            source: format!("tool:{}", tool.name),
                            payload: ne.payload,
                            metadata: ne.metadata,
                            parent_id: Some(event.id.clone()),
                            cascade: Some(Cascade {
                                heartbeat_id: plan.heartbeat.id(),
                                depth: child_depth,
                                capped,
                            }),
                            created_at: completed_at,
                        });
                    }
                    action.new_events = new_events.iter().map(|e| e.id.clone()).collect();
                }
                Ok(resp) => {
                    action.status = ActionStatus::Failed;
                    action.error = Some(
                        resp.error
                            .unwrap_or_else(|| "the tool answered \"success\": false".to_owned()),
                    );
                }
                Err(failure) => {
                    action.status = ActionStatus::Failed;
                    action.error = Some(failure.to_string());
                }
            }
            match self.store.finish_action(&action, &new_events).await {
                Ok(()) => {}
                Err(StoreError::Conflict(why)) => return Err(EngineError::Contended(why)),
                Err(e) => return Err(e.into()),
            }
            self.finish_hooks(plan, event, &action, &new_events).await?;
            let done = self.settle(&action, new_events);
            if let Some(err) = &action.error {
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
        .await
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

    /// Splits an action's new events into the ones to process next and the ones the
    /// depth cap stopped.
    fn settle(&self, action: &Action, new_events: Vec<Event>) -> ActionDone {
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
            failed: action.status == ActionStatus::Failed,
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

    async fn registry(&self) -> Result<Arc<Registry>, StoreError> {
        let mut cache = self.registry.lock().await;
        let now = self.clock.now();
        let ttl = self.settings.registry_ttl;
        if let Some((at, r)) = cache.as_ref()
            && ttl.is_positive()
            && now.duration_since(*at) < ttl
        {
            return Ok(r.clone());
        }
        let r = Arc::new(
            self.store
                .load_registry()
                .await?
                .with_builtins(self.tools.builtins()),
        );
        *cache = Some((now, r.clone()));
        Ok(r)
    }

    async fn complete(
        &self,
        plan: Plan,
        stats: Stats,
        next_start: EventCursor,
        backlog: bool,
    ) -> Result<RunOutcome, EngineError> {
        let now = self.clock.now();
        let mut done = ended(&plan, &stats, HeartbeatStatus::Completed, now, None);
        done.last_interaction_beat = plan.last_interaction_beat;
        done.interaction_seen_at = plan.interaction_seen_at;
        // A window cut short at its size limit leaves a backlog: the next heartbeat is
        // due at once (inside the active hours) rather than an interval later.
        let at = if backlog {
            plan.agent.in_active_hours(now)
        } else {
            next_run(&plan.agent, now, 0, self.settings.max_backoff)
        };
        let next = Heartbeat::pending(
            &plan.agent,
            done.beat + 1,
            at,
            next_start,
            plan.last_interaction_beat,
            plan.interaction_seen_at,
            0,
        );
        let outcome = self
            .store
            .finish(&Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: Some(plan.heartbeat_event.clone()),
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                self.after(&plan, &done, Some(at)).await?;
                info!(
                    events = stats.events_processed,
                    actions = stats.actions_triggered,
                    actions_failed = stats.actions_failed,
                    cascade_capped = stats.cascade_capped,
                    beat = plan.beats.beat,
                    since_last = plan.beats.since_last,
                    next_at = %at,
                    backlog,
                    "heartbeat completed"
                );
                RunOutcome::Completed(done)
            }
            other => self.finished_before(&plan, other).await?,
        })
    }

    /// Ends a heartbeat a user message interrupted: CANCELLED with what it had done. Its
    /// window is handed on (the next heartbeat reads it again and reuses the actions that
    /// finished), and the next heartbeat is scheduled as usual; the quiet period defers
    /// it further once the user's turn has run.
    async fn interrupt(&self, plan: Plan, stats: Stats) -> Result<RunOutcome, EngineError> {
        let now = self.clock.now();
        let reason = stats.interrupted.clone().unwrap_or_default();
        // The interaction fields stay as claimed: the interruption is counted by the
        // next heartbeat, dated to this beat.
        let done = ended(
            &plan,
            &stats,
            HeartbeatStatus::Cancelled,
            now,
            Some(reason.clone()),
        );
        let at = next_run(&plan.agent, now, 0, self.settings.max_backoff);
        let next = Heartbeat::pending(
            &plan.agent,
            done.beat + 1,
            at,
            plan.heartbeat.window_start.clone(),
            plan.heartbeat.last_interaction_beat,
            plan.heartbeat.interaction_seen_at,
            plan.heartbeat.consecutive_failures,
        );
        let outcome = self
            .store
            .finish(&Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: Some(plan.heartbeat_event.clone()),
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                self.after(&plan, &done, Some(at)).await?;
                info!(reason = %reason, actions = stats.actions_triggered, next_at = %at, "heartbeat interrupted by a user message; recorded CANCELLED");
                RunOutcome::Interrupted(done)
            }
            other => self.finished_before(&plan, other).await?,
        })
    }

    async fn fail(
        &self,
        hb: &Heartbeat,
        agent: Option<Agent>,
        err: EngineError,
    ) -> Result<RunOutcome, EngineError> {
        let message = chain(&err);
        let agent = match agent {
            Some(a) => a,
            None => match self.store.get_agent(&hb.agent_id).await? {
                Some(a) => a,
                None => return self.cancel(hb).await,
            },
        };
        let now = self.clock.now();
        let failures = hb.consecutive_failures.saturating_add(1);
        let at = next_run(&agent, now, failures, self.settings.max_backoff);
        let mut done = hb.clone();
        done.status = HeartbeatStatus::Failed;
        done.completed_at = Some(now);
        done.error = Some(message.clone());
        // The window is handed on unprocessed: the next heartbeat reads it again, and
        // the actions this run finished are reused, not repeated.
        let next = Heartbeat::pending(
            &agent,
            hb.beat + 1,
            at,
            hb.window_start.clone(),
            hb.last_interaction_beat,
            hb.interaction_seen_at,
            failures,
        );
        let outcome = self
            .store
            .finish(&Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: None,
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                error!(error = %message, consecutive_failures = failures, next_at = %at, "heartbeat failed; the next one is scheduled");
                if let Some(hooks) = &self.hooks {
                    let mut plan = self.plan(hb, agent);
                    plan.routes = hooks.routes(&plan.agent.id).await?;
                    self.failed_hook(&plan, &done, failures, at).await?;
                }
                RunOutcome::Failed(done)
            }
            FinishOutcome::AlreadyFinished if self.hooks.is_some() => {
                let mut plan = self.plan(hb, agent);
                if let Some(hooks) = &self.hooks {
                    plan.routes = hooks.routes(&plan.agent.id).await?;
                }
                self.finished_before(&plan, FinishOutcome::AlreadyFinished)
                    .await?
            }
            other => self.not_finished(&hb.id(), other),
        })
    }

    async fn cancel(&self, hb: &Heartbeat) -> Result<RunOutcome, EngineError> {
        let mut done = hb.clone();
        done.status = HeartbeatStatus::Cancelled;
        done.completed_at = Some(self.clock.now());
        done.error = Some("the agent no longer exists".to_owned());
        let outcome = self
            .store
            .finish(&Finish {
                heartbeat: done,
                next: None,
                heartbeat_event: None,
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                warn!("the agent no longer exists; heartbeat cancelled and none scheduled");
                RunOutcome::Cancelled
            }
            other => self.not_finished(&hb.id(), other),
        })
    }

    /// HEARTBEAT_FAILED for `done`, the next one due at `next_at`.
    async fn failed_hook(
        &self,
        plan: &Plan,
        done: &Heartbeat,
        failures: u32,
        next_at: Timestamp,
    ) -> Result<(), EngineError> {
        self.emit(
            plan,
            HookType::of(HookType::HEARTBEAT_FAILED),
            None,
            "SCHEDULE",
            || HookData::heartbeat_failed(done, failures, next_at),
        )
        .await
    }

    /// A run that found its heartbeat already finished under this claim (the job ran
    /// before and stopped after finishing, before its hooks were queued, say) emits the
    /// heartbeat's end hooks again from what is stored; each goes out once.
    async fn finished_before(
        &self,
        plan: &Plan,
        outcome: FinishOutcome,
    ) -> Result<RunOutcome, EngineError> {
        let id = plan.heartbeat.id();
        let run = self.not_finished(&id, outcome);
        if run != RunOutcome::AlreadyFinished || self.hooks.is_none() {
            return Ok(run);
        }
        let Some(done) = self.store.get_heartbeat(&id).await? else {
            return Ok(run);
        };
        let next = self.store.get_heartbeat(&plan.heartbeat.next_id()).await?;
        match (done.status, &next) {
            (HeartbeatStatus::Failed, Some(next)) => {
                self.failed_hook(plan, &done, next.consecutive_failures, next.scheduled_at)
                    .await?
            }
            (HeartbeatStatus::Failed, None) => {}
            _ => {
                self.after(plan, &done, next.map(|n| n.scheduled_at))
                    .await?
            }
        }
        Ok(run)
    }

    /// AFTER_HEARTBEAT, with the run's counts.
    async fn after(
        &self,
        plan: &Plan,
        done: &Heartbeat,
        next_at: Option<Timestamp>,
    ) -> Result<(), EngineError> {
        let started_at = plan.heartbeat_context.started_at;
        self.emit(
            plan,
            HookType::of(HookType::AFTER_HEARTBEAT),
            None,
            "SCHEDULE",
            || HookData::after_heartbeat(done, started_at, next_at),
        )
        .await
    }

    fn not_finished(&self, id: &HeartbeatId, outcome: FinishOutcome) -> RunOutcome {
        match outcome {
            FinishOutcome::Superseded { claim, status } => {
                warn!(heartbeat_id = %id, current_claim = claim, status = status.as_str(), "a later claim owns this heartbeat; this run's result is dropped (its actions are reused)");
                RunOutcome::Superseded
            }
            _ => {
                info!(heartbeat_id = %id, "heartbeat already finished by this claim");
                RunOutcome::AlreadyFinished
            }
        }
    }
}

/// The heartbeat record of a run that ended with `status`, carrying what it did.
fn ended(
    plan: &Plan,
    stats: &Stats,
    status: HeartbeatStatus,
    now: Timestamp,
    error: Option<String>,
) -> Heartbeat {
    let mut done = plan.heartbeat.clone();
    done.status = status;
    done.completed_at = Some(now);
    done.events_processed = stats.events_processed;
    done.actions_triggered = stats.actions_triggered;
    done.actions_failed = stats.actions_failed;
    done.cascade_capped = stats.cascade_capped;
    done.since_last = Some(plan.beats.since_last);
    done.error = error;
    done
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
