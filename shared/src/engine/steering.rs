//! Steering an agent in a word, for its owner on any channel: wake it now, snooze it.
//!
//! A wake makes the agent's pending heartbeat due now through the usual claim, and sets
//! its next wake to now, so the heartbeat runs through the quiet period and outside the
//! active hours (as a reminder does) and reads a WAKE_REQUESTED event. A second wake
//! while one is due or running makes no second heartbeat.
//!
//! A cancel asks the heartbeat running now to stop: it is marked on the agent, which the
//! heartbeat agent reads before each step and during each model call (the call is
//! dropped), so it ends CANCELLED with what it had done, and the next heartbeat is
//! planned as usual. A heartbeat busy in another tool stops when that tool returns.
//!
//! A snooze keeps the agent's own heartbeats back until a time: the pending one is
//! re-planned to then (or to an earlier reminder, which still wakes it), and one filed
//! meanwhile waits for the end of the snooze when it comes due. `resume` ends a snooze.

use jiff::{SignedDuration, Timestamp};
use tracing::info;

use super::lifecycle::{Lifecycle, LifecycleError, MOVES, Toggled};
use crate::domain::{Agent, AgentId, HeartbeatId, HeartbeatStatus};
use crate::error::ValidationError;
use crate::ports::Reschedule;

/// The shortest and longest snooze.
pub const SNOOZE_RANGE: (SignedDuration, SignedDuration) = (
    SignedDuration::from_mins(1),
    SignedDuration::from_hours(30 * 24),
);

/// What a wake did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A heartbeat is due now.
    Due(Timestamp),
    /// One was due already (a wake asked before, or its time had come): no second.
    AlreadyDue(Timestamp),
    /// One is running now: no second.
    Running,
}

impl Lifecycle {
    /// Makes the agent's pending heartbeat due now (see the module's documentation). A
    /// paused agent is refused with the fix; a snoozed one wakes (the snooze ends).
    pub async fn wake(&self, id: &AgentId) -> Result<Woken, LifecycleError> {
        let mut agent = self.agent(id).await?;
        if agent.is_paused() {
            return Err(ValidationError::new(
                "wake",
                format!(
                    "{} is paused: resume it first (`pulse agents resume {}`, or /resume)",
                    agent.name, agent.id
                ),
            )
            .into());
        }
        let now = self.clock.now();
        if agent.snoozed_until.is_some() {
            agent = self.set_snooze(&agent, None).await?;
        }
        for _ in 0..MOVES {
            let Some(hb) = self.latest(id).await? else {
                break;
            };
            match hb.status {
                HeartbeatStatus::Executing => return Ok(Woken::Running),
                HeartbeatStatus::Pending
                    if hb.scheduled_at <= now && agent.next_wake.is_some_and(|w| w <= now) =>
                {
                    return Ok(Woken::AlreadyDue(hb.scheduled_at));
                }
                HeartbeatStatus::Pending => {
                    if agent.next_wake.is_none_or(|w| w > now) {
                        self.store
                            .set_next_wake(id, Some(now))
                            .await
                            .map_err(|e| LifecycleError::store(id, e))?;
                    }
                    if hb.scheduled_at <= now || self.moved(&hb, Reschedule::Due(now)).await? {
                        info!(agent_id = %id, "a heartbeat was asked for: due now");
                        return Ok(Woken::Due(now));
                    }
                }
                _ => break,
            }
        }
        Err(ValidationError::new(
            "wake",
            "the agent has no heartbeat to wake right now; try again in a moment",
        )
        .into())
    }

    /// Asks the running heartbeat `id` to stop (see the module's documentation): when
    /// it was asked. A heartbeat that is not running is refused with its status.
    pub async fn cancel_heartbeat(&self, id: &HeartbeatId) -> Result<Timestamp, LifecycleError> {
        let hb = self
            .store
            .get_heartbeat(id)
            .await
            .map_err(LifecycleError::Store)?
            .ok_or_else(|| ValidationError::new("heartbeat", format!("no heartbeat {id}")))?;
        if hb.status != HeartbeatStatus::Executing {
            return Err(ValidationError::new(
                "heartbeat",
                format!(
                    "heartbeat {id} is {}, not running: nothing to cancel",
                    hb.status.as_str()
                ),
            )
            .into());
        }
        let agent = self.agent(&hb.agent_id).await?;
        let now = self.clock.now();
        let mut marked = agent.clone();
        marked.cancel_requested_at = Some(now);
        self.store
            .update_agent(&marked, &agent)
            .await
            .map_err(|e| LifecycleError::store(&agent.id, e))?;
        info!(heartbeat_id = %id, "the operator asked the running heartbeat to stop");
        Ok(now)
    }

    /// Snoozes the agent for `length` (a minute to 30 days): when it will wake.
    pub async fn snooze(
        &self,
        id: &AgentId,
        length: SignedDuration,
    ) -> Result<Timestamp, LifecycleError> {
        let (lo, hi) = SNOOZE_RANGE;
        if length < lo || length > hi {
            return Err(ValidationError::new(
                "snooze",
                "a snooze lasts from a minute to 30 days (e.g. 2h, 1d)",
            )
            .into());
        }
        let agent = self.agent(id).await?;
        if agent.is_paused() {
            return Err(ValidationError::new(
                "snooze",
                format!(
                    "{} is paused already: `pulse agents resume {}` (or /resume) wakes it",
                    agent.name, agent.id
                ),
            )
            .into());
        }
        let until = self.clock.now() + length;
        let agent = self.set_snooze(&agent, Some(until)).await?;
        // A reminder due sooner still wakes it then.
        let due = agent.next_wake.filter(|w| *w < until).unwrap_or(until);
        for _ in 0..MOVES {
            match self.latest(id).await? {
                Some(hb) if hb.status == HeartbeatStatus::Pending => {
                    if self.moved(&hb, Reschedule::Due(due)).await? {
                        break;
                    }
                }
                // Running: the one it files waits for the snooze's end.
                _ => break,
            }
        }
        info!(agent_id = %id, until = %until, "agent snoozed");
        Ok(until)
    }

    /// Ends a snooze: the next heartbeat is due now (inside the active hours).
    pub(super) async fn unsnooze(&self, agent: &Agent) -> Result<Toggled, LifecycleError> {
        let agent = self.set_snooze(agent, None).await?;
        let at = agent.in_active_hours(self.clock.now());
        let mut running = false;
        for _ in 0..MOVES {
            let Some(hb) = self.latest(&agent.id).await? else {
                break;
            };
            match hb.status {
                HeartbeatStatus::Pending if self.moved(&hb, Reschedule::Due(at)).await? => break,
                HeartbeatStatus::Pending => {}
                HeartbeatStatus::Executing => {
                    running = true;
                    break;
                }
                _ => break,
            }
        }
        info!(agent_id = %agent.id, next_at = %at, "snooze ended");
        Ok(Toggled::Done {
            next_heartbeat_at: Some(at),
            running,
        })
    }

    async fn set_snooze(
        &self,
        agent: &Agent,
        until: Option<Timestamp>,
    ) -> Result<Agent, LifecycleError> {
        let mut next = agent.clone();
        next.snoozed_until = until;
        self.store
            .update_agent(&next, agent)
            .await
            .map_err(|e| LifecycleError::store(&agent.id, e))?;
        Ok(next)
    }
}
