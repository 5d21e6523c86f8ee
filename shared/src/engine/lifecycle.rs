//! An agent's life as its operator steers it: change its settings (re-planning the
//! pending heartbeat), pause and resume it, delete it with everything it owns.
//!
//! Pausing takes the pending heartbeat out of the due index (PAUSED), so no sweep reads or
//! claims it; a heartbeat already running finishes, and the store files its successor
//! PAUSED. The agent's user is still answered: conversation turns do not go through the
//! heartbeat. Resuming makes the next heartbeat due at once. Both are events in the
//! agent's log and hook types (AGENT_PAUSED, AGENT_RESUMED).

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::Value;
use tracing::{info, warn};

use super::EngineSettings;
use super::hooks::{Emission, HookEmitter};
use super::reminders;
use super::schedule::next_run;
use crate::domain::{
    Agent, AgentChanges, AgentId, Event, EventId, EventType, Expectation, Heartbeat, HeartbeatId,
    HeartbeatStatus, HookData, HookType, Priority, Schedule, ScheduleId, ScheduleRule, to_ms,
};
use crate::error::{StoreError, ValidationError, chain};
use crate::ports::{Clock, Footprint, Reschedule, Store, Writer};

/// How many times a pause or resume looks again at a heartbeat that moved on meanwhile
/// (claimed, or finished) before it settles.
pub(super) const MOVES: usize = 4;

/// Why a lifecycle operation did nothing.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// There is no such agent.
    #[error("agent {0} not found; `pulse agents list` shows the agents")]
    NotFound(AgentId),
    /// The changes are not valid settings.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The store refused or failed (another agent has the channel, storage down).
    #[error(transparent)]
    Store(StoreError),
}

impl LifecycleError {
    pub(super) fn store(id: &AgentId, e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => Self::NotFound(id.clone()),
            other => Self::Store(other),
        }
    }
}

/// What `update` did.
#[derive(Clone, Debug)]
pub struct Updated {
    /// The agent as stored now.
    pub agent: Agent,
    /// When its pending heartbeat is due now, if its plan changed and it was re-planned.
    pub replanned: Option<Timestamp>,
}

/// What `pause` or `resume` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Toggled {
    /// Paused or resumed now; on resume, when the next heartbeat is due.
    Done {
        /// The resumed agent's next heartbeat.
        next_heartbeat_at: Option<Timestamp>,
        /// The agent's latest heartbeat is running: it finishes first.
        running: bool,
    },
    /// It already was so; nothing was written.
    Already,
}

/// What `schedule` did.
#[derive(Clone, Debug)]
pub struct Scheduled {
    /// The schedule, with its first wake.
    pub schedule: Schedule,
    /// When the agent's pending heartbeat is due now, if it was pulled forward.
    pub pulled: Option<Timestamp>,
}

/// How many times `schedule` looks for the heartbeat to pull forward while one runs,
/// and how long it waits between looks.
const PULL_LOOKS: usize = 10;
const PULL_PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

/// Changes, pauses, resumes and deletes agents.
pub struct Lifecycle {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    settings: EngineSettings,
    hooks: Option<HookEmitter>,
}

impl Lifecycle {
    /// Lifecycle operations over `store`; AGENT_PAUSED/RESUMED hooks are emitted through
    /// `hooks` when given.
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        settings: EngineSettings,
        hooks: Option<HookEmitter>,
    ) -> Self {
        Self {
            store,
            clock,
            settings,
            hooks,
        }
    }

    pub(super) async fn agent(&self, id: &AgentId) -> Result<Agent, LifecycleError> {
        self.store
            .get_agent(id)
            .await
            .map_err(LifecycleError::Store)?
            .ok_or_else(|| LifecycleError::NotFound(id.clone()))
    }

    /// The agent's latest heartbeat: the pending (or paused, or running) one.
    pub(super) async fn latest(&self, id: &AgentId) -> Result<Option<Heartbeat>, LifecycleError> {
        let mut latest = self
            .store
            .list_heartbeats(id, 1)
            .await
            .map_err(LifecycleError::Store)?;
        Ok(latest.pop())
    }

    /// Applies `changes`, validated as on create. A new interval, active hours or time
    /// zone re-plans the pending heartbeat at once: due an interval after the previous
    /// heartbeat ended (with the backoff of a failure streak), inside the new hours.
    pub async fn update(
        &self,
        id: &AgentId,
        changes: &AgentChanges,
    ) -> Result<Updated, LifecycleError> {
        let before = self.agent(id).await?;
        let agent = changes.apply(&before)?;
        if let Some(tools) = &changes.tools {
            self.check_tools(tools).await?;
        }
        // A new name is held by the store's write; this read also finds it as another
        // agent's alias, or held by an agent made before names were held.
        if !agent.name.eq_ignore_ascii_case(&before.name) {
            let agents = self
                .store
                .list_agents()
                .await
                .map_err(LifecycleError::Store)?;
            if let Some(other) = crate::domain::agents_named(&agents, &agent.name)
                .into_iter()
                .find(|a| a.id != agent.id)
            {
                return Err(LifecycleError::Store(StoreError::AlreadyExists(format!(
                    "an agent named {:?} ({}, named {:?})",
                    agent.name, other.id, other.name
                ))));
            }
        }
        self.store
            .update_agent(&agent, &before)
            .await
            .map_err(|e| LifecycleError::store(id, e))?;
        let mut replanned = None;
        if agent.schedule_differs(&before)
            && let Some(pending) = self.latest(id).await?
            && pending.status == HeartbeatStatus::Pending
        {
            let at = self.plan(&agent, &pending).await?;
            replanned = self
                .store
                .reschedule(&pending.id(), Reschedule::Due(at))
                .await
                .map_err(LifecycleError::Store)?
                .map(|hb| hb.scheduled_at);
        }
        info!(agent_id = %id, replanned = ?replanned, "agent updated");
        Ok(Updated { agent, replanned })
    }

    /// Every tool given to an agent is a registered MCP server.
    async fn check_tools(&self, tools: &[crate::domain::AgentTool]) -> Result<(), LifecycleError> {
        if tools.is_empty() {
            return Ok(());
        }
        let registry = self
            .store
            .load_registry()
            .await
            .map_err(LifecycleError::Store)?;
        for t in tools {
            match registry.tools.iter().find(|r| r.name == t.server) {
                Some(r) if r.mcp_server().is_some() => {}
                Some(_) => {
                    return Err(ValidationError::new(
                        "tools",
                        format!("{} is not an MCP server: HTTP tools run on events through subscriptions (`pulse subscriptions add`)", t.server),
                    )
                    .into());
                }
                None => {
                    return Err(ValidationError::new(
                        "tools",
                        format!("there is no MCP server {}: add it with `pulse tools add-mcp {} --url URL`", t.server, t.server),
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// When `pending` is due under the agent's new plan.
    async fn plan(&self, agent: &Agent, pending: &Heartbeat) -> Result<Timestamp, LifecycleError> {
        let previous = match pending.beat {
            0 | 1 => None,
            beat => self
                .store
                .get_heartbeat(&HeartbeatId::new(agent.id.clone(), beat - 1))
                .await
                .map_err(LifecycleError::Store)?,
        };
        Ok(match previous.and_then(|p| p.completed_at) {
            Some(ended) => next_run(
                agent,
                ended,
                pending.consecutive_failures,
                self.settings.max_backoff,
            ),
            // The first heartbeat: due at once, inside the (new) active hours.
            None => agent.in_active_hours(pending.scheduled_at),
        })
    }

    /// Pauses the agent: its pending heartbeat leaves the due index; one running
    /// finishes, and its successor is filed PAUSED. Pausing a paused agent parks a
    /// heartbeat still pending: what an earlier pause left undone when it failed between
    /// its two writes.
    pub async fn pause(&self, id: &AgentId) -> Result<Toggled, LifecycleError> {
        let agent = self.agent(id).await?;
        let now = self.clock.now();
        let event = lifecycle_event(&agent, HookType::AGENT_PAUSED, now, None);
        let already = !self
            .store
            .set_paused(id, Some(now), &event, Writer::Outside)
            .await
            .map_err(|e| LifecycleError::store(id, e))?;
        // The pending heartbeat is parked; a running one is marked, so its finish files
        // the next one PAUSED. Either may have moved on meanwhile: look again.
        let mut running = false;
        for _ in 0..MOVES {
            let Some(hb) = self.latest(id).await? else {
                break;
            };
            let to = match hb.status {
                HeartbeatStatus::Pending => Reschedule::Pause,
                HeartbeatStatus::Executing if !already => Reschedule::Running { pause_next: true },
                _ => break,
            };
            if self.moved(&hb, to).await? {
                running = hb.status == HeartbeatStatus::Executing;
                break;
            }
        }
        if already {
            return Ok(Toggled::Already);
        }
        info!(agent_id = %id, running, "agent paused");
        self.emit(&agent, HookType::AGENT_PAUSED, &event).await;
        Ok(Toggled::Done {
            next_heartbeat_at: None,
            running,
        })
    }

    /// Resumes the agent: its next heartbeat is due at once (inside its active hours).
    /// Resuming an active agent files a heartbeat still parked: what an earlier resume
    /// left undone when it failed between its two writes (without this, the agent would
    /// never beat again).
    pub async fn resume(&self, id: &AgentId) -> Result<Toggled, LifecycleError> {
        let agent = self.agent(id).await?;
        if !agent.is_paused() && agent.snoozed_until.is_some() {
            return self.unsnooze(&agent).await;
        }
        let now = self.clock.now();
        let at = agent.in_active_hours(now);
        let event = lifecycle_event(&agent, HookType::AGENT_RESUMED, now, Some(at));
        let already = !self
            .store
            .set_paused(id, None, &event, Writer::Outside)
            .await
            .map_err(|e| LifecycleError::store(id, e))?;
        let mut running = false;
        for _ in 0..MOVES {
            let Some(hb) = self.latest(id).await? else {
                break;
            };
            let to = match hb.status {
                HeartbeatStatus::Paused => Reschedule::Resume(at),
                HeartbeatStatus::Pending if !already => Reschedule::Due(at),
                HeartbeatStatus::Executing if !already => Reschedule::Running { pause_next: false },
                _ => break,
            };
            if self.moved(&hb, to).await? {
                running = hb.status == HeartbeatStatus::Executing;
                break;
            }
        }
        if already {
            return Ok(Toggled::Already);
        }
        info!(agent_id = %id, next_at = %at, "agent resumed");
        self.emit(&agent, HookType::AGENT_RESUMED, &event).await;
        Ok(Toggled::Done {
            next_heartbeat_at: Some(at),
            running,
        })
    }

    /// Moves `hb` as `to` says; false when it was no longer in the state the move is from.
    pub(super) async fn moved(
        &self,
        hb: &Heartbeat,
        to: Reschedule,
    ) -> Result<bool, LifecycleError> {
        Ok(self
            .store
            .reschedule(&hb.id(), to)
            .await
            .map_err(LifecycleError::Store)?
            .is_some())
    }

    /// Gives the agent a schedule (a reminder) waking it with `note`. Refused when it
    /// would never wake, or when its wakes and the heartbeats the interval plans would
    /// pass the breaker's cap in some hour. The agent's pending heartbeat is pulled
    /// forward to the first wake; a heartbeat running now finishes first, and the one
    /// after it is pulled forward once it is filed (looked for a few times, briefly).
    pub async fn schedule(
        &self,
        id: &AgentId,
        rule: ScheduleRule,
        note: Option<String>,
    ) -> Result<Scheduled, LifecycleError> {
        self.schedule_expecting(id, rule, note, None).await
    }

    /// [`Self::schedule`], the schedule expecting `expect` of each heartbeat it wakes
    /// (`pulse schedules add --expect`): one that does not do it ends `incomplete`, and
    /// the `alert_after`-th of its runs in a row fires `HEARTBEAT_INCOMPLETE`. Refused
    /// besides when `alert_after` is outside 1 to [`Expectation::MAX_ALERT_AFTER`].
    pub async fn schedule_expecting(
        &self,
        id: &AgentId,
        rule: ScheduleRule,
        note: Option<String>,
        expect: Option<Expectation>,
    ) -> Result<Scheduled, LifecycleError> {
        let spec = reminders::ScheduleSpec {
            expect,
            ..reminders::ScheduleSpec::new(rule, note)
        };
        self.schedule_spec(id, spec).await
    }

    /// [`Self::schedule_expecting`] with every part of the schedule given, its name too
    /// (`pulse apply`).
    pub async fn schedule_spec(
        &self,
        id: &AgentId,
        spec: reminders::ScheduleSpec,
    ) -> Result<Scheduled, LifecycleError> {
        let agent = self.agent(id).await?;
        let now = self.clock.now();
        let (schedule, mut pulled) = reminders::make(
            self.store.as_ref(),
            &agent,
            spec,
            now,
            self.settings.schedules,
        )
        .await
        .map_err(|e| match e {
            reminders::MakeError::Invalid(v) => LifecycleError::Invalid(v),
            reminders::MakeError::Store(e) => LifecycleError::store(id, e),
        })?;
        let first = schedule.next_at.unwrap_or(now);
        // A heartbeat running now finishes first: look for the one it files.
        for _ in 1..PULL_LOOKS {
            if pulled.is_some() {
                break;
            }
            match self.latest(id).await? {
                Some(hb) if hb.status == HeartbeatStatus::Executing => {
                    tokio::time::sleep(PULL_PAUSE).await;
                    pulled = reminders::pull_forward(self.store.as_ref(), &agent, first)
                        .await
                        .map_err(LifecycleError::Store)?;
                }
                _ => break,
            }
        }
        Ok(Scheduled { schedule, pulled })
    }

    /// The agent's schedules, oldest first.
    pub async fn schedules(&self, id: &AgentId) -> Result<Vec<Schedule>, LifecycleError> {
        self.agent(id).await?;
        self.store
            .schedules(id)
            .await
            .map_err(|e| LifecycleError::store(id, e))
    }

    /// Deletes one of the agent's schedules: it wakes the agent no more. False when the
    /// agent has no such schedule.
    pub async fn unschedule(
        &self,
        id: &AgentId,
        schedule: &ScheduleId,
    ) -> Result<bool, LifecycleError> {
        self.agent(id).await?;
        let deleted = self
            .store
            .delete_schedule(id, schedule)
            .await
            .map_err(|e| LifecycleError::store(id, e))?;
        reminders::refresh(self.store.as_ref(), id)
            .await
            .map_err(|e| LifecycleError::store(id, e))?;
        Ok(deleted)
    }

    /// What deleting the agent would remove (`apply` false), or removes it (`apply`
    /// true). Works on leftovers of an interrupted delete as well; `NotFound` only when
    /// nothing of the agent is stored.
    pub async fn delete(&self, id: &AgentId, apply: bool) -> Result<Footprint, LifecycleError> {
        // One walk: it counts what it deletes (deleting nothing when nothing is there).
        let footprint = self
            .store
            .purge_agent(id, apply)
            .await
            .map_err(LifecycleError::Store)?;
        if footprint.is_empty() {
            return Err(LifecycleError::NotFound(id.clone()));
        }
        if apply {
            info!(agent_id = %id, deleted = ?footprint, "agent deleted");
        }
        Ok(footprint)
    }

    /// Emits an AGENT_PAUSED/RESUMED hook. The change is made (and in the agent's log)
    /// whatever happens here; a failure is logged.
    async fn emit(&self, agent: &Agent, name: &'static str, event: &Event) {
        let Some(hooks) = &self.hooks else {
            return;
        };
        let emission = Emission {
            hook_type: HookType::of(name),
            heartbeat_id: None,
            action_id: None,
            data: event.payload.clone(),
            triggered_by: "OPERATOR".to_owned(),
            key_ms: to_ms(event.created_at).max(0) as u64,
            key: vec![event.id.to_string()],
        };
        let emitted = match hooks.routes(&agent.id).await {
            Ok(routes) => hooks.emit(&routes, agent, emission).await,
            Err(e) => Err(e),
        };
        if let Err(e) = emitted {
            warn!(error = %chain(&e), hook_type = name, "cannot emit the hook");
        }
    }
}

/// An AGENT_PAUSED or AGENT_RESUMED event for the agent's log.
fn lifecycle_event(agent: &Agent, name: &str, at: Timestamp, next: Option<Timestamp>) -> Event {
    Event {
        id: EventId::generate(to_ms(at).max(0) as u64),
        agent_id: agent.id.clone(),
        event_type: EventType::parse(name).unwrap_or_else(|_| EventType::heartbeat()),
        priority: Priority::DEFAULT,
        source: "operator".to_owned(),
        payload: HookData::agent_lifecycle(at, next),
        metadata: Value::Null,
        parent_id: None,
        cascade: None,
        created_at: at,
    }
}
