//! How a run ends: completed, interrupted, failed, cancelled, deferred — each one atomic
//! finish that also schedules the next heartbeat — and what a run that lost its claim
//! reports.

use jiff::Timestamp;
use serde_json::json;
use tracing::{error, info, warn};

use super::{HeartbeatRunner, Plan, RunOutcome, Stats};
use crate::domain::{
    Agent, EventCursor, EventId, Found, Heartbeat, HeartbeatId, HeartbeatStatus, HookType,
    Instructions, Outcome, OutcomeKind, TaskLedger, to_ms,
};
use crate::engine::budget;
use crate::engine::schedule::next_run;
use crate::error::{EngineError, StoreError, chain};
use crate::ports::{Finish, FinishOutcome, Reschedule, Writer};

impl HeartbeatRunner {
    /// Puts the claimed heartbeat back to PENDING, due at `until`.
    pub(super) async fn defer(
        &self,
        hb: &Heartbeat,
        until: Timestamp,
        why: &'static str,
    ) -> Result<RunOutcome, EngineError> {
        if self.store.defer(hb, until).await? {
            info!(until = %until, "{why}");
            self.park_if_paused(hb).await?;
            return Ok(RunOutcome::Deferred(until));
        }
        Ok(RunOutcome::Superseded)
    }

    /// A heartbeat put back to PENDING (deferred, or released by a stopping worker)
    /// while its agent is paused goes on to PAUSED, out of the due index: a heartbeat
    /// that was running when the agent was paused finishes, but is not run again.
    pub(super) async fn park_if_paused(&self, hb: &Heartbeat) -> Result<(), StoreError> {
        let paused = |a: Option<Agent>| a.is_some_and(|a| a.is_paused());
        if !paused(self.store.get_agent(&hb.agent_id).await?) {
            return Ok(());
        }
        self.store.reschedule(&hb.id(), Reschedule::Pause).await?;
        // A resume that came in between found this heartbeat still claimed and left it
        // alone: it is resumed here instead.
        if !paused(self.store.get_agent(&hb.agent_id).await?) {
            self.store
                .reschedule(&hb.id(), Reschedule::Resume(self.clock.now()))
                .await?;
        }
        info!("the agent is paused: its heartbeat is parked until it is resumed");
        Ok(())
    }

    pub(super) async fn complete(
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
        )
        .counted(plan.hour)
        .handing_on(stats.late.clone())
        .carrying(
            ledger(&plan.agent, &done, stats.thought)
                .caching(stats.cache.or(plan.heartbeat_context.cache)),
        );
        let outcome = self
            .file(Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: heartbeat_event(&plan, &stats),
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                self.after(&plan, &done, Some(at)).await?;
                self.incomplete_hook(&plan, &done).await?;
                self.schedule_hooks(&plan, &stats, &done).await?;
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
    pub(super) async fn interrupt(
        &self,
        plan: Plan,
        stats: Stats,
    ) -> Result<RunOutcome, EngineError> {
        let now = self.clock.now();
        let reason = stats.interrupted.clone().unwrap_or_default();
        // The interaction fields stay as claimed: the interruption is counted by the
        // next heartbeat, dated to this beat.
        let (done, next, at) = self.cancelled(&plan, &stats, &reason, now);
        let next = next.counted(plan.hour);
        let outcome = self
            .file(Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: heartbeat_event(&plan, &stats),
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                self.after(&plan, &done, Some(at)).await?;
                info!(reason = %reason, actions = stats.actions_triggered, next_at = %at, "heartbeat interrupted; recorded CANCELLED, its window handed on");
                RunOutcome::Interrupted(done)
            }
            other => self.finished_before(&plan, other).await?,
        })
    }

    /// The breaker: more heartbeats started in an hour than the agent's cap. The agent
    /// is paused with a BREAKER_TRIPPED event in its log (and the BREAKER_TRIPPED and
    /// AGENT_PAUSED hooks), and this heartbeat ends CANCELLED without running: its
    /// window is handed on to the next one, which is scheduled PAUSED, with a fresh
    /// hour, until `pulse agents resume`.
    pub(super) async fn trip(&self, plan: Plan) -> Result<RunOutcome, EngineError> {
        let now = self.clock.now();
        let (from, beats) = plan.hour;
        let cap = plan.agent.beat_cap();
        let id = plan.heartbeat_context.id.clone();
        let reason = format!(
            "breaker tripped: {beats} heartbeats started within an hour of {from}, over the cap of {cap} (--max-beats-per-hour); the agent is paused until `pulse agents resume {}`",
            plan.agent.id
        );
        let payload = json!({
            "heartbeat_id": id,
            "beats": beats,
            "cap": cap,
            "hour_from": from,
            "paused_at": now,
        });
        let event = budget::system_event(
            &plan.agent,
            HookType::BREAKER_TRIPPED,
            EventId::derived(to_ms(now).max(0) as u64, &["breaker", &id.to_string()]),
            payload.clone(),
            now,
        );
        let paused = match self
            .store
            .set_paused(&plan.agent.id, Some(now), &event, Writer::Session)
            .await
        {
            Ok(paused) => paused,
            Err(StoreError::NotFound(_)) => return self.cancel(&plan.heartbeat).await,
            Err(e) => return Err(e.into()),
        };
        // This run still holds the heartbeat: its finish files the next one PAUSED.
        self.store
            .reschedule(
                &plan.heartbeat.id(),
                Reschedule::Running { pause_next: true },
            )
            .await?;
        // Paused already (by its operator meanwhile): no event was written, no hooks.
        let hook_types = if paused {
            [HookType::BREAKER_TRIPPED, HookType::AGENT_PAUSED].as_slice()
        } else {
            &[]
        };
        for hook_type in hook_types {
            self.emit(&plan, HookType::of(hook_type), None, "BREAKER", || {
                payload.clone()
            })
            .await?;
        }
        // The agent is paused now, so the store schedules the next heartbeat PAUSED,
        // with a fresh hour.
        let (done, next, _) = self.cancelled(&plan, &Stats::default(), &reason, now);
        let outcome = self
            .file(Finish {
                heartbeat: done.clone(),
                next: Some(next),
                heartbeat_event: None,
            })
            .await?;
        Ok(match outcome {
            FinishOutcome::Finished => {
                warn!(beats, cap, hour_from = %from, "{reason}");
                RunOutcome::Tripped(done)
            }
            other => self.not_finished(&id, other),
        })
    }

    /// The heartbeat ended CANCELLED with `reason`, and the next one, due an interval
    /// later, which reads the same window again.
    fn cancelled(
        &self,
        plan: &Plan,
        stats: &Stats,
        reason: &str,
        now: Timestamp,
    ) -> (Heartbeat, Heartbeat, Timestamp) {
        let done = ended(
            plan,
            stats,
            HeartbeatStatus::Cancelled,
            now,
            Some(reason.to_owned()),
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
        )
        .handing_on(handed_on(&plan.heartbeat, stats))
        .carrying(
            ledger(&plan.agent, &done, stats.thought)
                .caching(stats.cache.or(plan.heartbeat_context.cache)),
        );
        (done, next, at)
    }

    pub(super) async fn fail(
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
        done.outcome = Some(Outcome::new(OutcomeKind::Failed, &message));
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
        )
        .counted(hb.hour_count(hb.started_at.unwrap_or(now)))
        .handing_on(handed_on(hb, &Stats::default()))
        .carrying(ledger(&agent, hb, false));
        let outcome = self
            .file(Finish {
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

    pub(super) async fn cancel(&self, hb: &Heartbeat) -> Result<RunOutcome, EngineError> {
        let mut done = hb.clone();
        done.status = HeartbeatStatus::Cancelled;
        done.completed_at = Some(self.clock.now());
        done.error = Some("the agent no longer exists".to_owned());
        done.outcome = Some(Outcome::new(
            OutcomeKind::Skipped,
            "the agent no longer exists",
        ));
        let outcome = self
            .file(Finish {
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

    /// Files a finish, the requests this run made counted on the finished record.
    async fn file(&self, mut finish: Finish) -> Result<FinishOutcome, StoreError> {
        crate::tally::stamp(&mut finish.heartbeat.requests);
        self.store.finish(&finish).await
    }

    pub(super) fn not_finished(&self, id: &HeartbeatId, outcome: FinishOutcome) -> RunOutcome {
        match outcome {
            FinishOutcome::Superseded { claim, status } => {
                warn!(heartbeat_id = %id, current_claim = claim, status = status.as_str(), "a later claim owns this heartbeat; this run's result is dropped (its actions are reused)");
                RunOutcome::Superseded
            }
            FinishOutcome::Gone => {
                info!(heartbeat_id = %id, "the heartbeat was deleted with its agent; nothing more to do");
                RunOutcome::Cancelled
            }
            _ => {
                info!(heartbeat_id = %id, "heartbeat already finished by this claim");
                RunOutcome::AlreadyFinished
            }
        }
    }
}

/// The HEARTBEAT event to store with the finish: not for an idle beat, where the only
/// tool on it was the heartbeat agent, skipped without a call (the skip is on the
/// heartbeat record); an event an action of its own refers to is stored already.
fn heartbeat_event(plan: &Plan, stats: &Stats) -> Option<crate::domain::Event> {
    (stats.skipped.is_none() || stats.heartbeat_event_stored).then(|| plan.heartbeat_event.clone())
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
    done.skipped = stats.skipped.clone();
    done.since_last = Some(plan.beats.since_last);
    done.outcome = Some(stats.outcome(
        &plan.agent,
        &plan.schedule_expects,
        status,
        error.as_deref(),
    ));
    done.error = error;
    done
}

/// The task ledger the next heartbeat starts from: the tasks due in `done` marked done
/// at its start when its heartbeat agent thought.
fn ledger(agent: &Agent, done: &Heartbeat, thought: bool) -> TaskLedger {
    done.tasks.handed_on(
        thought,
        done.started_at.unwrap_or(done.scheduled_at),
        &Instructions::of(agent.instructions.as_deref()),
    )
}

/// What a heartbeat that did not complete hands on to the next: what it was handed
/// (its agent may not have thought about it), and what its tools found after thinking.
fn handed_on(hb: &Heartbeat, stats: &Stats) -> Found {
    let mut out = Found::default();
    if let Some(earlier) = hb.handed_on.clone() {
        out.hand_on(earlier);
    }
    out.hand_on(stats.late.clone());
    out
}
