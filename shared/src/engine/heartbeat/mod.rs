//! Running one heartbeat job.
//!
//! The run reads the window `(window_start, window_end]` of the agent's log (both cursors
//! are on the claimed record, so a retried run reads the same window), appends the
//! HEARTBEAT event, and runs every subscribed tool for every event, breadth first: the
//! events a level's tools return form the next level, up to the depth cap. The heartbeat
//! agent runs last, on the HEARTBEAT event, told what those tools found
//! ([`crate::domain::Found`]); the events it raises cascade the same way. Then one atomic
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

mod actions;
pub use retry::RetryError;
mod emitting;
mod ending;
mod expects;
mod retry;

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Value, json};
use tracing::{Instrument, debug, info, info_span};

use super::EngineSettings;
use super::hooks::HookEmitter;
use super::silence;
use super::{budget, reminders};
use crate::domain::{
    Agent, AgentContext, Beats, Cascade, Event, EventCursor, EventType, Found, HEARTBEAT_AGENT,
    Heartbeat, HeartbeatContext, HeartbeatJob, HookData, HookRoute, HookType, Instructions,
    Priority, Registry, TaskMoment, Tool,
};
use crate::error::{EngineError, StoreError};
use crate::ports::{Clock, Store, ToolRunner, Window};

/// How a heartbeat job ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// The heartbeat completed; the record as written.
    Completed(Heartbeat),
    /// The engine could not finish the work; recorded FAILED, the next one scheduled.
    Failed(Heartbeat),
    /// The agent no longer exists; recorded CANCELLED, nothing scheduled (or the
    /// heartbeat was deleted with it).
    Cancelled,
    /// A user message interrupted it; recorded CANCELLED with what it had done, the
    /// window handed on, the next one scheduled.
    Interrupted(Heartbeat),
    /// Too many heartbeats in an hour: the breaker paused the agent and the heartbeat
    /// was recorded CANCELLED without running, its window handed on.
    Tripped(Heartbeat),
    /// The user talked to the agent within its quiet period: put back to PENDING, due
    /// at this time.
    Deferred(Timestamp),
    /// This claim had already finished the heartbeat (a redelivered job).
    AlreadyFinished,
    /// A later claim owns the heartbeat; this run's result was dropped.
    Superseded,
}

impl RunOutcome {
    /// How the heartbeat was recorded, if this run finished it: `completed`, `failed`
    /// or `cancelled`.
    pub fn finished_as(&self) -> Option<&'static str> {
        match self {
            Self::Completed(_) => Some("completed"),
            Self::Failed(_) => Some("failed"),
            Self::Cancelled | Self::Interrupted(_) | Self::Tripped(_) => Some("cancelled"),
            Self::Deferred(_) | Self::AlreadyFinished | Self::Superseded => None,
        }
    }

    /// How the heartbeat ended (`acted`, `nothing_to_do`, …), if this run finished it
    /// and wrote the record.
    pub fn outcome(&self) -> Option<crate::domain::OutcomeKind> {
        match self {
            Self::Completed(h) | Self::Failed(h) | Self::Interrupted(h) | Self::Tripped(h) => {
                h.outcome.as_ref().map(|o| o.kind)
            }
            _ => None,
        }
    }
}

/// Runs heartbeat jobs.
pub struct HeartbeatRunner {
    store: Arc<dyn Store>,
    tools: Arc<dyn ToolRunner>,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    /// Emits hooks at the lifecycle points, when a hooks queue is configured.
    hooks: Option<HookEmitter>,
    /// The tools' health counts (shared with the agents' MCP calls).
    health: Arc<crate::engine::tool_health::ToolHealth>,
    /// The agents' MCP tools: a heartbeat asks the owner about the calls parked while the
    /// agent was snoozed or outside its active hours.
    agent_tools: Option<Arc<crate::engine::agent_tools::AgentTools>>,
    /// The cached registry. An async mutex, held while loading, so runs that start
    /// together share one read instead of each making their own.
    registry: tokio::sync::Mutex<Option<Arc<Registry>>>,
}

/// A run ready to go: its window, its agent, and where the window ends.
struct Ready {
    window: Window,
    agent: Agent,
    window_end: EventCursor,
}

/// Whether a heartbeat due now waits, and until when: after the user talked to the
/// agent, its next heartbeat waits out a quiet period instead of chiming in; and due
/// times are planned inside the active hours, so one that comes up outside them (claimed
/// late, or the hours changed) waits for them to open. A reminder the user asked for
/// fires at its time all the same, as does a heartbeat its user asked for: those bound
/// the agent's own initiative, not a wake it was asked for. A snoozed agent waits for
/// the end of its snooze.
fn held_back(agent: &Agent, now: Timestamp) -> Option<(Timestamp, &'static str)> {
    if agent.next_wake.is_some_and(|w| w <= now) {
        return None;
    }
    if let Some(until) = agent.snoozed_until.filter(|u| *u > now) {
        return Some((
            until,
            "the agent is snoozed: heartbeat deferred to the end of the snooze",
        ));
    }
    if agent.silent_too_long(now).is_some() {
        let until = agent
            .next_wake
            .filter(|w| *w > now)
            .unwrap_or_else(|| now.saturating_add(silence::PUT_OFF).unwrap_or(now));
        return Some((until, silence::AUTO_PAUSED));
    }
    if let Some(at) = agent.last_interaction_at {
        let until = agent.in_active_hours(at.saturating_add(agent.quiet_period()).unwrap_or(at));
        if until > now {
            return Some((
                until,
                "the user talked to the agent recently: heartbeat deferred to the end of its quiet period",
            ));
        }
    }
    if !agent.is_active_at(now) {
        return Some((
            agent.in_active_hours(now),
            "outside the agent's active hours: heartbeat deferred to their next start",
        ));
    }
    None
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
    /// The breaker's hour and the heartbeats started in it, this one included.
    hour: (Timestamp, u32),
    /// What the schedules that woke the agent, by the SCHEDULED events of the window,
    /// expect of this run.
    schedule_expects: Vec<expects::ScheduleExpect>,
}

#[derive(Default)]
struct Stats {
    events_processed: u32,
    actions_triggered: u32,
    actions_failed: u32,
    cascade_capped: u32,
    /// Set when a tool stopped because a user message arrived: the run stops there.
    interrupted: Option<String>,
    /// Why the heartbeat agent was not called: its SKIPPED action goes onto the record
    /// the finish writes.
    skipped: Option<String>,
    /// Whether the HEARTBEAT event was stored for an action of its own.
    heartbeat_event_stored: bool,
    /// Whether an action made schedules (the heartbeat agent's `schedule` tool).
    scheduled: bool,
    /// What tools found after the thinking (on what the heartbeat agent raised): the
    /// next heartbeat's agent is told.
    late: Found,
    /// Whether the heartbeat agent was called and finished: the tasks due are done.
    thought: bool,
    /// What was done, for the outcome: "spoke", a tool's name.
    acted: Vec<String>,
    /// Why the heartbeat agent, called, made no model call (a spent budget).
    thinker_skipped: Option<String>,
    /// What the heartbeat agent's model said last, for the outcome of a run that did
    /// nothing: its reason.
    thinker_said: Option<String>,
    /// Each action that failed: its tool and error.
    failures: Vec<String>,
    /// The agent's prompt cache as the heartbeat agent's calls left it.
    cache: Option<crate::domain::CacheKept>,
}

/// Tools the heartbeat agent calls that only read: calling one is not acting.
const READING_TOOLS: [&str; 1] = ["recall"];

impl Stats {
    /// Notes what `action` did for the outcome: a subscribed tool that ran acted; the
    /// heartbeat agent (`thinker`) acted when it spoke or called a tool that does
    /// something, and otherwise said why not, or was skipped.
    fn note(&mut self, action: &crate::domain::Action, thinker: bool) {
        use crate::domain::ActionStatus;
        if action.status == ActionStatus::Failed {
            self.failures.push(format!(
                "{} failed: {}",
                action.tool,
                action.error.as_deref().unwrap_or("no reason given")
            ));
        }
        if !thinker {
            if action.status == ActionStatus::Completed {
                self.did_act(action.tool.as_str());
            }
            return;
        }
        let output = action.response.as_ref().map(|r| &r["output"]);
        if let Some(kept) = output.and_then(|o| serde_json::from_value(o["cache"].clone()).ok()) {
            self.cache = Some(kept);
        }
        if action.status == ActionStatus::Skipped {
            // A warm-up is a beat with nothing to do that kept the cache alive, not a
            // thought that was held back.
            if output.is_some_and(|o| o["warm_up"] == true) {
                self.skipped = action.error.clone();
            } else {
                self.thinker_skipped = action.error.clone();
            }
        }
        let Some(output) = output else {
            return;
        };
        if output["spoke"].as_array().is_some_and(|s| !s.is_empty()) {
            self.did_act("spoke");
        }
        for step in output["steps"].as_array().into_iter().flatten() {
            match step["kind"].as_str() {
                Some("tool") => {
                    let name = step["name"].as_str().unwrap_or_default();
                    if step["is_error"] != true && name != "speak" && !READING_TOOLS.contains(&name)
                    {
                        self.did_act(name);
                    }
                }
                Some("llm") => {
                    if let Some(text) = step["text"].as_str().filter(|t| !t.trim().is_empty()) {
                        self.thinker_said = Some(text.to_owned());
                    }
                }
                _ => {}
            }
        }
    }

    /// Notes that `what` acted, once however often it did.
    fn did_act(&mut self, what: &str) {
        if !self.acted.iter().any(|a| a == what) {
            self.acted.push(what.to_owned());
        }
    }

    /// How a run of `agent` that ended with `status` (and `error`) ended: what it did,
    /// held against what the agent expects of every heartbeat, if anything, then against
    /// what each schedule that woke it expects (`schedules`). The first expectation it
    /// did not meet makes it incomplete; a skipped or failed run stays so.
    fn outcome(
        &self,
        agent: &Agent,
        schedules: &[expects::ScheduleExpect],
        status: crate::domain::HeartbeatStatus,
        error: Option<&str>,
    ) -> crate::domain::Outcome {
        use crate::domain::{Outcome, OutcomeKind};
        let did = self.did(status, error);
        if matches!(did.kind, OutcomeKind::Skipped | OutcomeKind::Failed) {
            return did;
        }
        if let Some(expect) = agent.expect
            && !self.met(expect.must, &did)
        {
            return Outcome::new(
                OutcomeKind::Incomplete,
                &format!(
                    "expected to {}, it did not ({}: {})",
                    expect.must.as_str(),
                    did.kind,
                    did.reason
                ),
            );
        }
        match schedules.iter().find(|s| !self.met(s.must, &did)) {
            Some(unmet) => Outcome::new(OutcomeKind::Incomplete, &unmet.unmet(&did)),
            None => did,
        }
    }

    /// Whether a run that did `did` did what `must` asks: spoke, or acted.
    fn met(&self, must: crate::domain::Must, did: &crate::domain::Outcome) -> bool {
        use crate::domain::{Must, OutcomeKind};
        match must {
            Must::Speak => self.acted.iter().any(|a| a == "spoke"),
            Must::Act => did.kind == OutcomeKind::Acted,
        }
    }

    /// What a run that ended with `status` (and `error`) did.
    fn did(
        &self,
        status: crate::domain::HeartbeatStatus,
        error: Option<&str>,
    ) -> crate::domain::Outcome {
        use crate::domain::{HeartbeatStatus, Outcome, OutcomeKind};
        if status == HeartbeatStatus::Failed {
            return Outcome::new(OutcomeKind::Failed, error.unwrap_or("failed"));
        }
        if !self.acted.is_empty() {
            let mut did = self.acted.join(", ");
            if !self.failures.is_empty() {
                did.push_str(&format!("; {} failed", self.failures.len()));
            }
            return Outcome::new(OutcomeKind::Acted, &did);
        }
        if status == HeartbeatStatus::Cancelled {
            return Outcome::new(OutcomeKind::Skipped, error.unwrap_or("cancelled"));
        }
        if let Some(failed) = self.failures.first() {
            return Outcome::new(OutcomeKind::Failed, failed);
        }
        if let Some(why) = &self.thinker_skipped {
            return Outcome::new(OutcomeKind::Skipped, why);
        }
        if let Some(why) = &self.skipped {
            return Outcome::new(OutcomeKind::NothingToDo, why);
        }
        match &self.thinker_said {
            Some(said) if self.thought => Outcome::new(OutcomeKind::NothingToDo, said),
            _ if self.thought => Outcome::new(OutcomeKind::NothingToDo, "thought, and did nothing"),
            _ => Outcome::new(OutcomeKind::NothingToDo, "no tool runs on its events"),
        }
    }
}

/// The two phases of a heartbeat's processing: the tools, then the thinking.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Tools,
    Thinking,
}

struct ActionDone {
    /// The action, and every event it returned (capped ones too), for what the tools
    /// found.
    action: crate::domain::Action,
    returned: Vec<Event>,
    scheduled: bool,
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
            health: Arc::default(),
            agent_tools: None,
            registry: tokio::sync::Mutex::new(None),
        }
    }

    /// Emits hooks through `emitter` (BEFORE/AFTER_HEARTBEAT, HEARTBEAT_FAILED,
    /// BEFORE/AFTER_<TOOL>, ACTION_*).
    pub fn with_hooks(mut self, emitter: HookEmitter) -> Self {
        self.hooks = Some(emitter);
        self
    }

    /// Counts the HTTP tools' outcomes in `health` (TOOL_DEGRADED, TOOL_RECOVERED).
    pub fn with_health(mut self, health: Arc<crate::engine::tool_health::ToolHealth>) -> Self {
        self.health = health;
        self
    }

    /// Asks, at each heartbeat of an agent with MCP tools, about its parked calls whose
    /// owner was not asked yet (see [`crate::engine::agent_tools::AgentTools::ask_waiting`]).
    pub fn with_agent_tools(mut self, tools: Arc<crate::engine::agent_tools::AgentTools>) -> Self {
        self.agent_tools = Some(tools);
        self
    }

    /// Gives back a claimed heartbeat whose job was never started (its worker is
    /// stopping): PENDING again, due now, so the next sweep claims it afresh. False if the
    /// claim was no longer held.
    pub async fn release(&self, heartbeat: &Heartbeat) -> Result<bool, StoreError> {
        let released = self.store.defer(heartbeat, self.clock.now()).await?;
        if released {
            self.park_if_paused(heartbeat).await?;
            info!(heartbeat_id = %heartbeat.id(), claim = heartbeat.claim, "claimed heartbeat released: its job was not started");
        }
        Ok(released)
    }

    /// Runs a claimed heartbeat to its end, with a registry no older than the one the
    /// job names. An `Err` means the outcome could not be recorded (storage unavailable);
    /// the job should be delivered again.
    pub async fn run_job(&self, job: &HeartbeatJob) -> Result<RunOutcome, EngineError> {
        self.run_with(
            &job.heartbeat,
            job.registry_version,
            job.traceparent.as_deref(),
        )
        .await
    }

    /// Runs a claimed heartbeat whose job names no registry version: the registry is
    /// read afresh.
    pub async fn run(&self, heartbeat: &Heartbeat) -> Result<RunOutcome, EngineError> {
        self.run_with(heartbeat, None, None).await
    }

    async fn run_with(
        &self,
        heartbeat: &Heartbeat,
        registry_version: Option<u64>,
        traceparent: Option<&str>,
    ) -> Result<RunOutcome, EngineError> {
        let span = info_span!(
            "heartbeat",
            agent_id = %heartbeat.agent_id,
            heartbeat_id = %heartbeat.id(),
            beat = heartbeat.beat,
            trace_id = tracing::field::Empty,
        );
        let trace = crate::traces::heartbeat(
            heartbeat.agent_id.as_str(),
            &heartbeat.id().to_string(),
            heartbeat.beat,
        );
        // A claimed heartbeat continues the trace of the sweep's claim.
        if let Some(parent) = traceparent {
            crate::traces::continues(&trace, parent);
        }
        // The trace is written on the records the run files, so the dashboard links to it.
        let mut heartbeat = heartbeat.clone();
        heartbeat.trace_id = crate::traces::trace_id(&trace);
        if let Some(id) = &heartbeat.trace_id {
            span.record("trace_id", id);
        }
        // The requests the run makes are counted onto the finished record.
        let outcome = crate::tally::scope(
            self.run_inner(&heartbeat, registry_version, &trace)
                .instrument(span)
                .instrument(trace.clone()),
        )
        .await;
        match &outcome {
            Ok(
                RunOutcome::Completed(h)
                | RunOutcome::Failed(h)
                | RunOutcome::Interrupted(h)
                | RunOutcome::Tripped(h),
            ) => {
                if h.status == crate::domain::HeartbeatStatus::Failed {
                    let why = h.error.as_deref().unwrap_or_default();
                    crate::traces::failed(&trace, "heartbeat_failed", why);
                }
                if let Some(o) = &h.outcome {
                    crate::traces::ended(&trace, o.kind.as_str(), &o.reason);
                }
            }
            Err(e) => crate::traces::failed(&trace, "engine_error", &e.to_string()),
            Ok(_) => {}
        }
        if let Ok(outcome) = &outcome
            && let Some(name) = outcome.finished_as()
        {
            crate::meter::heartbeat(name);
        }
        if let Some(kind) = outcome.as_ref().ok().and_then(RunOutcome::outcome) {
            crate::meter::heartbeat_outcome(kind.as_str());
        }
        outcome
    }

    async fn run_inner(
        &self,
        hb: &Heartbeat,
        registry_version: Option<u64>,
        trace: &tracing::Span,
    ) -> Result<RunOutcome, EngineError> {
        let Ready {
            mut window,
            mut agent,
            window_end,
        } = {
            let read = crate::traces::window();
            let begun = self.begin(hb).instrument(read.clone()).await?;
            if let Ok(ready) = &begun {
                crate::traces::window_read(
                    &read,
                    ready.window.events.len(),
                    ready.window.truncated,
                );
            }
            match begun {
                Ok(ready) => ready,
                Err(ended) => return Ok(ended),
            }
        };
        crate::traces::agent_known(trace, agent.name.as_str(), agent.session.as_str());
        let now = self.clock.now();
        if let Some((until, why)) = held_back(&agent, now) {
            if why == silence::AUTO_PAUSED
                && agent.auto_paused_since.is_none()
                && let Some(since) = agent.silent_too_long(now)
            {
                silence::auto_pause(self.store.as_ref(), self.hooks.as_ref(), &agent, since, now)
                    .await?;
            }
            return self.defer(hb, until, why).await;
        }
        if agent.next_wake.is_some_and(|w| w <= now) {
            self.wake(hb, &mut agent, &mut window, &window_end, now)
                .await?;
        }
        // Awake: its owner is asked about the calls parked while it was not.
        if let Some(tools) = &self.agent_tools {
            tools.ask_waiting(&agent).await;
        }
        let next_start = match (window.truncated, window.events.last()) {
            (true, Some(last)) => EventCursor::after(&last.id),
            _ => window_end,
        };
        let mut plan = self.plan(hb, agent);
        plan.heartbeat_context.window_events = window.events.len();
        plan.schedule_expects = expects::ScheduleExpect::of_window(&window.events);
        // Held back or not, its work starts now: how late is kept on its record.
        plan.heartbeat.ran_at = Some(now);
        crate::meter::heartbeat_started(
            now.duration_since(hb.scheduled_at)
                .try_into()
                .unwrap_or_default(),
        );
        // An agent the store knows has no hooks costs no routes read.
        if let Some(hooks) = &self.hooks
            && window.has_hooks != Some(false)
        {
            plan.routes = hooks.routes(&plan.agent.id).await?;
        }
        if plan.hour.1 > plan.agent.beat_cap() {
            return self.trip(plan).await;
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
        let result = self
            .process(&mut plan, window.events, registry_version)
            .await;
        // Schedules made in this run (the `schedule` tool) moved the agent's next wake:
        // read it, so the finish files the next heartbeat no later than that.
        if let Ok(stats) = &result
            && stats.scheduled
            && let Some(fresh) = self.store.get_agent(&plan.agent.id).await?
        {
            plan.agent.next_wake = fresh.next_wake;
        }
        match result {
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

    /// The run's start: a claim still held (renewed for a job that waited), its window
    /// read with the agent's live record — or, as `Err`, how the run already ended
    /// (superseded, the agent gone, the agent paused, the store failing).
    async fn begin(&self, hb: &Heartbeat) -> Result<Result<Ready, RunOutcome>, EngineError> {
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
                return Ok(Err(RunOutcome::Superseded));
            }
            info!(claim = hb.claim, lease_until = %until, "a late job renewed its claim");
        }
        let mut window = match self
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
            Err(e) => return Ok(Err(self.fail(hb, None, e.into()).await?)),
        };
        let Some(agent) = window.agent.take() else {
            return Ok(Err(self.cancel(hb).await?));
        };
        // A heartbeat claimed after its agent was paused (filed PENDING by a finish that
        // raced the pause) is parked, not run; one claimed before the pause runs on.
        if let Some(paused_at) = agent.paused_at
            && hb.started_at.is_some_and(|s| s > paused_at)
        {
            let parked = self
                .defer(
                    hb,
                    self.clock.now(),
                    "the agent is paused: heartbeat parked",
                )
                .await?;
            return Ok(Err(parked));
        }
        Ok(Ok(Ready {
            window,
            agent,
            window_end,
        }))
    }

    /// Reminders: the schedules due by now wake the agent. Their SCHEDULED events are
    /// processed with the window's (a window cut short leaves them to the next
    /// heartbeat, whose window holds them).
    async fn wake(
        &self,
        hb: &Heartbeat,
        agent: &mut Agent,
        window: &mut Window,
        window_end: &EventCursor,
        now: Timestamp,
    ) -> Result<(), EngineError> {
        let woken = reminders::wake(
            self.store.as_ref(),
            agent,
            now,
            &hb.window_start,
            window_end,
            self.settings.schedules,
        )
        .await?;
        agent.next_wake = woken.next_wake;
        if !window.truncated {
            for e in woken.events {
                if !window.events.iter().any(|w| w.id == e.id) {
                    window.events.push(e);
                }
            }
            window
                .events
                .sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        }
        Ok(())
    }

    /// The daily budget, read only when the heartbeat agent is about to think (after the
    /// tools, so what they found counts): spent, the heartbeat agent is told so (and
    /// BUDGET_EXHAUSTED fires once a day).
    async fn check_budget(&self, plan: &mut Plan, now: Timestamp) -> Result<(), EngineError> {
        if plan.agent.budgets.daily_tokens.is_none()
            || plan.agent_context.thinks(&plan.heartbeat_context).is_err()
        {
            return Ok(());
        }
        if let Some(today) = budget::exhausted(self.store.as_ref(), &plan.agent, now).await? {
            plan.heartbeat_context.budget_spent = Some(budget::reason(&plan.agent, &today, now));
            budget::fire_exhausted(
                self.store.as_ref(),
                self.hooks.as_ref(),
                &plan.agent,
                &today,
                now,
            )
            .await?;
        }
        Ok(())
    }

    fn plan(&self, hb: &Heartbeat, agent: Agent) -> Plan {
        let started_at = hb.started_at.unwrap_or_else(|| self.clock.now());
        // An interaction not yet counted happened since the previous heartbeat: it is
        // dated to the previous beat (`since_last` = 1 right after one).
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
            id: hb.heartbeat_event_id(started_at),
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
                window_events: 0,
                budget_spent: None,
                found: Found::default(),
                tasks_due: Vec::new(),
                cache: None,
                warm_up: false,
            },
            hour: hb.hour_count(started_at),
            heartbeat: hb.clone(),
            agent,
            routes: Vec::new(),
            schedule_expects: Vec::new(),
            beats,
            last_interaction_beat,
            interaction_seen_at,
            heartbeat_event,
        }
    }

    /// Processes the window and the HEARTBEAT event, then the cascades they cause, one
    /// level at a time: first with every tool but the heartbeat agent, then the heartbeat
    /// agent on the HEARTBEAT event, told what the tools found, and what it raises. The
    /// tools run first and the thinking last, so what they fetched or checked (an inbox
    /// subscribed to the heartbeat, a check of what an event announced) is thought about
    /// in the heartbeat that found it.
    async fn process(
        &self,
        plan: &mut Plan,
        window: Vec<Event>,
        registry_version: Option<u64>,
    ) -> Result<Stats, EngineError> {
        let registry = self.registry(registry_version).await?;
        let mut stats = Stats::default();
        let window_types: Vec<String> = window.iter().map(|e| e.event_type.to_string()).collect();
        let mut level = window;
        level.push(plan.heartbeat_event.clone());
        // What the previous heartbeat's tools found after its thinking comes first.
        let mut found = Found::default();
        if let Some(earlier) = plan.heartbeat.handed_on.clone() {
            found.hand_on(earlier);
        }
        self.levels(plan, &registry, level, Phase::Tools, &mut stats, &mut found)
            .await?;
        if stats.interrupted.is_some() {
            return Ok(stats);
        }
        plan.heartbeat_context.found = found;
        let due = tasks_due(plan, &window_types);
        plan.heartbeat_context.tasks_due = due.clone();
        plan.heartbeat.tasks.due = due;
        if self.settings.keep_cache_warm {
            let now = self.clock.now();
            let kept = crate::engine::prompt::cache_kept(&plan.agent, plan.heartbeat.tasks.cache);
            plan.heartbeat_context.warm_up =
                crate::engine::prompt::warm_up_due(&plan.agent, kept.as_ref(), now);
            plan.heartbeat_context.cache = kept;
        }
        // The budget is read when the model would be called, whatever makes it think:
        // events in the window, or what the tools just found.
        self.check_budget(plan, self.clock.now()).await?;
        let hb_event = vec![plan.heartbeat_event.clone()];
        let mut late = Found::default();
        self.levels(
            plan,
            &registry,
            hb_event,
            Phase::Thinking,
            &mut stats,
            &mut late,
        )
        .await?;
        stats.late = late;
        Ok(stats)
    }

    /// Runs `level` and the levels of events its actions return, to the depth cap. In
    /// the tools' phase the heartbeat agent is left out on the HEARTBEAT event, and each
    /// action is added to `found`; in the thinking's phase the first level is the
    /// heartbeat agent's alone, and each later action that returned events is added to
    /// `found`: what the next heartbeat's agent is told, since this one's has thought.
    async fn levels(
        &self,
        plan: &Plan,
        registry: &Registry,
        mut level: Vec<Event>,
        phase: Phase,
        stats: &mut Stats,
        found: &mut Found,
    ) -> Result<(), EngineError> {
        let mut depth = 0u8;
        while !level.is_empty() {
            let mut next = Vec::new();
            for event in &level {
                let thinker_level = phase == Phase::Thinking && depth == 0;
                if !thinker_level {
                    stats.events_processed += 1;
                }
                let runs = |tool: &Tool| {
                    let thinker = event.id == plan.heartbeat_event.id
                        && tool.name.as_str() == HEARTBEAT_AGENT;
                    match phase {
                        Phase::Tools => !thinker,
                        Phase::Thinking => thinker || !thinker_level,
                    }
                };
                let matching: Vec<&Tool> = registry
                    .matching(event)
                    .into_iter()
                    .map(|(_, tool)| tool)
                    .filter(|tool| runs(tool))
                    .collect();
                // Actions refer to their event: store HEARTBEAT before its first action
                // of its own, not only with the finish.
                if !stats.heartbeat_event_stored
                    && event.id == plan.heartbeat_event.id
                    && matching
                        .iter()
                        .any(|tool| self.skip_without_call(plan, event, tool).is_none())
                {
                    self.store.append_in_session(&plan.heartbeat_event).await?;
                    stats.heartbeat_event_stored = true;
                }
                for tool in matching {
                    if let Some(why) = self.skip_without_call(plan, event, tool) {
                        self.skipped(plan, event, tool, &why).await?;
                        stats.actions_triggered += 1;
                        stats.skipped = Some(why);
                        continue;
                    }
                    let done = self.run_action(plan, event, depth, tool).await?;
                    let thinker = thinker_level && tool.name.as_str() == HEARTBEAT_AGENT;
                    stats.thought |=
                        thinker && done.action.status == crate::domain::ActionStatus::Completed;
                    stats.note(&done.action, thinker);
                    stats.actions_triggered += 1;
                    stats.actions_failed += u32::from(done.failed);
                    stats.cascade_capped += done.capped;
                    stats.scheduled |= done.scheduled;
                    if phase == Phase::Tools || (!thinker_level && !done.returned.is_empty()) {
                        found.add(event, &done.action, &done.returned);
                    }
                    next.extend(done.cascade);
                    if done.interrupted.is_some() {
                        // Yield to the user's turn now: nothing else runs in this heartbeat.
                        stats.interrupted = done.interrupted;
                        return Ok(());
                    }
                }
            }
            level = next;
            depth = depth.saturating_add(1);
        }
        Ok(())
    }

    /// The registry: the cached one when it is at least at `version` (the job's), else
    /// read again — also for a job that names no version. A tool or subscription changed
    /// before an event of the window is thus always seen by the heartbeat that reads the
    /// event, and an unchanged registry costs no read.
    async fn registry(&self, version: Option<u64>) -> Result<Arc<Registry>, StoreError> {
        let mut cache = self.registry.lock().await;
        if let Some((r, v)) = cache.as_ref().zip(version)
            && r.version >= v
        {
            return Ok(r.clone());
        }
        let r = Arc::new(
            self.store
                .load_registry()
                .await?
                .with_builtins(self.tools.builtins()),
        );
        *cache = Some(r.clone());
        Ok(r)
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The agent's heartbeat tasks due in this heartbeat: by their cadences, the ledger the
/// heartbeat before handed on, the types of the window's events (`window_types`) and
/// of what the tools found.
fn tasks_due(plan: &Plan, window_types: &[String]) -> Vec<String> {
    let tasks = Instructions::of(plan.agent.instructions.as_deref());
    if tasks.tasks.is_empty() {
        return Vec::new();
    }
    let found = &plan.heartbeat_context.found;
    let types: Vec<&str> = window_types
        .iter()
        .map(String::as_str)
        .chain(
            found
                .results
                .iter()
                .flat_map(|r| r.events.iter().map(|e| e.event_type.as_str())),
        )
        .collect();
    tasks.due(&TaskMoment {
        now: plan.heartbeat_context.started_at,
        interval: plan.agent.interval.duration(),
        timezone: &plan.agent.timezone,
        silent_since: plan
            .agent
            .last_interaction_at
            .unwrap_or(plan.agent.created_at),
        event_types: &types,
        runs: &plan.heartbeat.tasks.runs,
    })
}
