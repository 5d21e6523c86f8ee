//! The hooks a heartbeat run emits: BEFORE/AFTER_HEARTBEAT, HEARTBEAT_FAILED,
//! HEARTBEAT_INCOMPLETE, BEFORE/AFTER_<TOOL> and ACTION_*, each under a delivery id derived
//! from the heartbeat (and a schedule) or the action, so a rerun emits the same
//! deliveries.

use jiff::Timestamp;
use serde_json::Value;

use super::expects::{ScheduleExpect, short_of_agent};
use super::{HeartbeatRunner, Plan, RunOutcome, Stats};
use crate::domain::{
    Action, ActionId, ActionStatus, Event, EventId, Heartbeat, HeartbeatStatus, HookData, HookType,
    Outcome, OutcomeKind, Tool, to_ms,
};
use crate::engine::hooks::Emission;
use crate::error::EngineError;
use crate::ports::FinishOutcome;

impl HeartbeatRunner {
    /// Whether a hook of `hook_type` of the agent's is there to be told (and hooks are
    /// emitted at all).
    fn tells(&self, plan: &Plan, hook_type: &HookType) -> bool {
        self.hooks.is_some()
            && plan
                .routes
                .iter()
                .any(|r| r.active && &r.hook_type == hook_type)
    }

    /// Enqueues the hooks of `hook_type` for this run. `data` is built only when one of
    /// the agent's hooks fires on it.
    ///
    /// Delivery ids come from the heartbeat, or for an action's hooks from the action
    /// (and its event's time), so a rerun, or a later heartbeat reusing the action, emits
    /// the same deliveries and the dispatcher sends each once. A failure to enqueue fails
    /// the job, which the queue runs again.
    pub(super) async fn emit(
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
        if !self.tells(plan, &hook_type) {
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
    pub(super) async fn start_hooks(
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
    pub(super) async fn finish_hooks(
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

    /// HEARTBEAT_FAILED for `done`, the next one due at `next_at`.
    pub(super) async fn failed_hook(
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
    pub(super) async fn finished_before(
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
    pub(super) async fn after(
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

    /// The `HEARTBEAT_INCOMPLETE` hook, when `done` is the `--alert-after`-th incomplete
    /// heartbeat in a row of its agent: once a streak (the next incomplete ones make no
    /// second, until one meets the expectation and a new streak starts). A heartbeat
    /// incomplete only by a schedule's expectation met the agent's: it ends the streak.
    /// The heartbeats before it are read only when a hook of that type is there to tell.
    pub(super) async fn incomplete_hook(
        &self,
        plan: &Plan,
        done: &Heartbeat,
    ) -> Result<(), EngineError> {
        let incomplete = |h: &Heartbeat| h.outcome.as_ref().is_some_and(short_of_agent);
        let (Some(expect), true) = (plan.agent.expect, incomplete(done)) else {
            return Ok(());
        };
        let hook_type = HookType::of(HookType::HEARTBEAT_INCOMPLETE);
        if !self.tells(plan, &hook_type) {
            return Ok(());
        }
        let n = expect.alert_after as usize;
        let before = self
            .store
            .heartbeats_page(&done.agent_id, Some(done.beat), n)
            .await?;
        let streak = 1 + before.iter().take_while(|h| incomplete(h)).count();
        if streak != n {
            return Ok(());
        }
        let reason = done.outcome.as_ref().map(|o| o.reason.clone());
        self.emit(plan, hook_type, None, "SCHEDULE", || {
            serde_json::json!({
                "beat": done.beat,
                "expect": expect.must.as_str(),
                "in_a_row": n,
                "reason": reason,
            })
        })
        .await
    }

    /// Counts this run against each schedule that woke the agent expecting something of
    /// it; nothing is read when none did. The count is kept on the schedule, as a daily
    /// schedule's runs lie a day apart with the agent's ordinary beats between: a run that
    /// met the expectation sets it back to 0, one that did not adds 1, and the
    /// `alert_after`-th in a row fires `HEARTBEAT_INCOMPLETE`, once a streak. The schedule
    /// is stored again only when its count changed. A one-time schedule has one run: its
    /// alert fires on that run. A skipped or failed run counts for nothing.
    pub(super) async fn schedule_hooks(
        &self,
        plan: &Plan,
        stats: &Stats,
        done: &Heartbeat,
    ) -> Result<(), EngineError> {
        if plan.schedule_expects.is_empty() {
            return Ok(());
        }
        let did = stats.did(done.status, done.error.as_deref());
        if matches!(did.kind, OutcomeKind::Skipped | OutcomeKind::Failed) {
            return Ok(());
        }
        let mut schedules = self.store.schedules(&plan.agent.id).await?;
        for expect in &plan.schedule_expects {
            let met = stats.met(expect.must, &did);
            let schedule = schedules.iter_mut().find(|s| s.id == expect.id);
            let before = schedule.as_ref().map_or(0, |s| s.incomplete_runs);
            let runs = if met { 0 } else { before.saturating_add(1) };
            let alert_after = match &schedule {
                Some(s) => s.expect.map_or(expect.alert_after, |e| e.alert_after),
                // Gone since it woke (a one-time schedule is removed as it wakes): this
                // run alone is its streak.
                None if expect.once => 1,
                None => expect.alert_after,
            };
            if !met && runs == alert_after {
                self.schedule_hook(plan, done, expect, &did, runs).await?;
            }
            if let Some(s) = schedule
                && runs != before
            {
                s.incomplete_runs = runs;
                self.store.put_schedule(s).await?;
            }
        }
        Ok(())
    }

    /// `HEARTBEAT_INCOMPLETE` for the schedule `expect` names: `in_a_row` of its runs,
    /// `done` the last, did not do what it expects (`did` instead). Its delivery id comes
    /// from the heartbeat and the schedule, so it is apart from the agent's own alert and
    /// other schedules' in the same run, and a rerun makes the same.
    async fn schedule_hook(
        &self,
        plan: &Plan,
        done: &Heartbeat,
        expect: &ScheduleExpect,
        did: &Outcome,
        in_a_row: u32,
    ) -> Result<(), EngineError> {
        let hook_type = HookType::of(HookType::HEARTBEAT_INCOMPLETE);
        let Some(hooks) = self.hooks.as_ref().filter(|_| self.tells(plan, &hook_type)) else {
            return Ok(());
        };
        let reason = Outcome::new(OutcomeKind::Incomplete, &expect.unmet(did)).reason;
        let emission = Emission {
            hook_type,
            heartbeat_id: Some(plan.heartbeat_context.id.clone()),
            action_id: None,
            data: serde_json::json!({
                "beat": done.beat,
                "expect": expect.must.as_str(),
                "in_a_row": in_a_row,
                "reason": reason,
                "schedule_id": expect.id,
                "note": expect.note,
            }),
            triggered_by: "SCHEDULE".to_owned(),
            key_ms: to_ms(plan.heartbeat_context.started_at).max(0) as u64,
            key: vec![plan.heartbeat_context.id.to_string(), expect.id.to_string()],
        };
        hooks
            .emit(&plan.routes, &plan.agent, emission)
            .await
            .map(|_| ())
    }
}
