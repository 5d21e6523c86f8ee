//! Heartbeats: one record per cycle of an agent, from PENDING through its claim to the
//! end it was recorded with, and the claim that takes one.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::action::{Action, ActionStatus};
use super::agent::Agent;
use super::event::EventCursor;
use super::found::Found;
use super::ids::{ActionId, AgentId, EventId, HeartbeatId, SessionId, ToolName};
use super::instructions::TaskLedger;
use super::requests::Requests;
use super::tool::HEARTBEAT_AGENT;

/// Where a heartbeat is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HeartbeatStatus {
    /// Scheduled, waiting to be due and claimed.
    Pending,
    /// Claimed by a sweeper under a lease; a worker runs or will run it.
    Executing,
    /// Ran to the end; the next one is scheduled.
    Completed,
    /// The engine could not finish it; the error is recorded and the next one is scheduled.
    Failed,
    /// Stopped before it finished (its agent is gone).
    Cancelled,
    /// Scheduled, but its agent is paused: out of the due index, never claimed, until
    /// the agent is resumed.
    Paused,
}

impl HeartbeatStatus {
    /// The stored name (`PENDING`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Executing => "EXECUTING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Paused => "PAUSED",
        }
    }
    /// Reads a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Self::Pending,
            "EXECUTING" => Self::Executing,
            "COMPLETED" => Self::Completed,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            "PAUSED" => Self::Paused,
            _ => return None,
        })
    }
    /// Whether the heartbeat is over.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// How a finished heartbeat ended, in one word: what "it ran" does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// Something was done: its agent spoke, called a tool, remembered or emitted an
    /// event, or a tool subscribed to its events ran.
    Acted,
    /// It ran and found nothing to do: no new events and no task due (its agent was not
    /// called), or its agent thought and chose to do nothing.
    NothingToDo,
    /// Its agent was not called for a reason outside it (a spent budget).
    Skipped,
    /// The engine could not finish it.
    Failed,
    /// It ran, but did not do what its agent expects of every heartbeat (`--expect`).
    Incomplete,
    /// It spoke, and what it said could not be delivered: the channel refused it at
    /// every try (it is kept as a dead letter, and in the dashboard's conversation).
    Undeliverable,
}

impl OutcomeKind {
    /// Every kind, in the order they are listed.
    pub const ALL: [Self; 6] = [
        Self::Acted,
        Self::NothingToDo,
        Self::Skipped,
        Self::Failed,
        Self::Incomplete,
        Self::Undeliverable,
    ];

    /// The kind as it is written: `acted`, `nothing_to_do`, `skipped`, `failed`,
    /// `incomplete`, `undeliverable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acted => "acted",
            Self::NothingToDo => "nothing_to_do",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
            Self::Incomplete => "incomplete",
            Self::Undeliverable => "undeliverable",
        }
    }

    /// The kind written `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a heartbeat ended and a short reason: what it did, why it did nothing, why it
/// was skipped, or its error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub kind: OutcomeKind,
    pub reason: String,
}

impl Outcome {
    /// The most of a reason kept, in characters.
    pub const REASON_CHARS: usize = 200;

    /// An outcome of `kind`, its reason cut to its first line and
    /// [`Outcome::REASON_CHARS`].
    pub fn new(kind: OutcomeKind, reason: &str) -> Self {
        let line = reason.trim().lines().next().unwrap_or("").trim();
        let mut reason: String = line.chars().take(Self::REASON_CHARS).collect();
        if line.chars().count() > Self::REASON_CHARS {
            reason.push('…');
        }
        Self { kind, reason }
    }
}

/// One consciousness cycle of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The agent.
    pub agent_id: AgentId,
    /// The beat number: 1 for the first heartbeat, +1 for each next one.
    pub beat: u64,
    /// The session whose queue group runs it.
    pub session: SessionId,
    /// Its status.
    pub status: HeartbeatStatus,
    /// When it is due.
    pub scheduled_at: Timestamp,
    /// How many times it was claimed (1 normally; more after an expired lease). A worker
    /// may only complete the claim it was given.
    pub claim: u32,
    /// Until when the current claim holds; after that a sweeper may reclaim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    /// When it was first claimed. Kept across reclaims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// Its event window starts after this cursor (the previous heartbeat's end).
    pub window_start: EventCursor,
    /// Its event window ends at this cursor; fixed at the first claim so a reclaimed run
    /// reads the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<EventCursor>,
    /// The beat at which the user last interacted (0: never).
    pub last_interaction_beat: u64,
    /// The agent's `last_interaction_at` already counted into `last_interaction_beat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_seen_at: Option<Timestamp>,
    /// Beats since the last user interaction, as given to tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_last: Option<u64>,
    /// Failed heartbeats in a row before this one; drives the retry backoff.
    pub consecutive_failures: u32,
    /// Events processed: window events, the HEARTBEAT event, and cascades.
    pub events_processed: u32,
    /// Actions run (or found already done) in this heartbeat.
    pub actions_triggered: u32,
    /// Of those, how many failed.
    pub actions_failed: u32,
    /// Tool output events beyond the cascade depth cap, recorded but not processed.
    pub cascade_capped: u32,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The start of the breaker's current hour: the first heartbeat counted in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hour_from: Option<Timestamp>,
    /// Heartbeats started in the hour from `hour_from`, before this one.
    #[serde(default)]
    pub beats_in_hour: u32,
    /// Why its heartbeat agent was not called (its think policy found nothing to think
    /// about): that SKIPPED action is kept here, on the record the finish writes anyway,
    /// rather than as an action and a HEARTBEAT event of its own.
    /// [`Heartbeat::skipped_action`] gives it back as an action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The cloud requests it made — its claim, its run and its finish — where the
    /// backend counts them (AWS; none on the embedded store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Requests>,
    /// What tools found after the previous heartbeat's thinking (the events returned by
    /// tools that ran on what its heartbeat agent raised), handed on for this
    /// heartbeat's agent to think about with its own tools' findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_on: Option<Found>,
    /// When its run began its work: after its claim, its wait on the sessions queue and
    /// any hold (a snooze, a quiet period, the active hours, which file it again with a
    /// later due time instead). From its due time to this is how late it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_at: Option<Timestamp>,
    /// Its agent's heartbeat tasks: when each was last done, handed on from the
    /// heartbeat before, and which were due in this one once it ran.
    #[serde(default, skip_serializing_if = "TaskLedger::is_empty")]
    pub tasks: TaskLedger,
    /// How it ended, once it has (none before, and none on heartbeats finished before
    /// outcomes were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The OpenTelemetry trace its last run was recorded in (32 hex digits), when
    /// traces were sent: the dashboard links to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl Heartbeat {
    /// A new PENDING heartbeat.
    pub fn pending(
        agent: &Agent,
        beat: u64,
        scheduled_at: Timestamp,
        window_start: EventCursor,
        last_interaction_beat: u64,
        interaction_seen_at: Option<Timestamp>,
        consecutive_failures: u32,
    ) -> Self {
        Self {
            agent_id: agent.id.clone(),
            beat,
            session: agent.session.clone(),
            status: HeartbeatStatus::Pending,
            scheduled_at,
            claim: 0,
            lease_until: None,
            started_at: None,
            completed_at: None,
            window_start,
            window_end: None,
            last_interaction_beat,
            interaction_seen_at,
            since_last: None,
            consecutive_failures,
            events_processed: 0,
            actions_triggered: 0,
            actions_failed: 0,
            cascade_capped: 0,
            error: None,
            hour_from: None,
            beats_in_hour: 0,
            skipped: None,
            requests: None,
            handed_on: None,
            ran_at: None,
            tasks: TaskLedger::default(),
            outcome: None,
            trace_id: None,
        }
    }

    /// This pending heartbeat, given what an earlier run found after its thinking (see
    /// [`Heartbeat::handed_on`]); nothing when it found nothing.
    pub fn handing_on(mut self, found: Found) -> Self {
        self.handed_on = (!found.is_empty()).then_some(found);
        self
    }

    /// This pending heartbeat, given its agent's task ledger as the run before left it.
    pub fn carrying(mut self, tasks: TaskLedger) -> Self {
        self.tasks = tasks;
        self
    }

    /// What its heartbeat agent did about thinking, in a few words: why it did not
    /// think, or the heartbeat tasks that were due when it did; `None` before it ran or
    /// when neither is known.
    pub fn thinking(&self) -> Option<String> {
        if let Some(why) = &self.skipped {
            return Some(format!("skipped: {why}"));
        }
        (!self.tasks.due.is_empty()).then(|| format!("tasks due: {}", self.tasks.due.join(", ")))
    }

    /// The beat its agent is at, this being the newest heartbeat: its own once it has
    /// started, the one before while it waits.
    pub fn beat_reached(&self) -> u64 {
        if self.started_at.is_some() {
            self.beat
        } else {
            self.beat.saturating_sub(1)
        }
    }

    /// The id of its HEARTBEAT event, derived from the heartbeat and when it started.
    pub fn heartbeat_event_id(&self, started_at: Timestamp) -> EventId {
        EventId::derived(
            started_at.as_millisecond().max(0) as u64,
            &["heartbeat", &self.id().to_string()],
        )
    }

    /// The heartbeat agent's SKIPPED action when it was not called ([`Heartbeat::skipped`]),
    /// as it would have been recorded.
    pub fn skipped_action(&self) -> Option<Action> {
        let why = self.skipped.clone()?;
        let started = self.started_at?;
        let at = self.completed_at.unwrap_or(started);
        let event_id = self.heartbeat_event_id(started);
        let tool = ToolName::parse(HEARTBEAT_AGENT).ok()?;
        Some(Action {
            id: ActionId::for_event(&event_id, &tool),
            agent_id: self.agent_id.clone(),
            heartbeat_id: self.id(),
            event_id,
            tool,
            status: ActionStatus::Skipped,
            attempt: 1,
            depth: 0,
            // The tool was not called: there was no request.
            request: serde_json::Value::Null,
            response: Some(serde_json::json!({
                "output": {"skipped": why},
                "usage": {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0},
            })),
            error: Some(why),
            started_at: at,
            completed_at: Some(at),
            duration_ms: Some(0),
            new_events: Vec::new(),
            call: None,
        })
    }

    /// The breaker's count for this heartbeat started at `started`: the hour it falls
    /// in and how many heartbeats started in that hour, this one included. An hour
    /// starts with the first heartbeat after the last one ended.
    pub fn hour_count(&self, started: Timestamp) -> (Timestamp, u32) {
        match self.hour_from {
            Some(from) if started.duration_since(from) < SignedDuration::from_hours(1) => {
                (from, self.beats_in_hour.saturating_add(1))
            }
            _ => (started, 1),
        }
    }

    /// Carries the breaker's count `(hour, beats)` of the heartbeat before it.
    pub fn counted(mut self, (from, beats): (Timestamp, u32)) -> Self {
        self.hour_from = Some(from);
        self.beats_in_hour = beats;
        self
    }

    /// Its id.
    pub fn id(&self) -> HeartbeatId {
        HeartbeatId::new(self.agent_id.clone(), self.beat)
    }

    /// The id of the heartbeat scheduled after this one.
    pub fn next_id(&self) -> HeartbeatId {
        HeartbeatId::new(self.agent_id.clone(), self.beat + 1)
    }

    /// When the heartbeat should next be looked at by a sweeper: its schedule while
    /// pending, its lease end while executing, never once it is over.
    pub fn due_at(&self) -> Option<Timestamp> {
        match self.status {
            HeartbeatStatus::Pending => Some(self.scheduled_at),
            HeartbeatStatus::Executing => self.lease_until,
            _ => None,
        }
    }
}

/// Each completed heartbeat of an agent's history beside the completed one before it,
/// in beat order: the links of the chain its event windows must form.
///
/// A heartbeat that failed or was cancelled reads nothing for good (the next one reads
/// its window again), so the chain runs over the completed ones: where each starts its
/// window where the one before ended it ([`WindowLink::joined`]), no event was skipped
/// and none read twice.
pub fn window_links(beats: &[Heartbeat]) -> Vec<WindowLink<'_>> {
    let mut completed: Vec<&Heartbeat> = beats
        .iter()
        .filter(|h| h.status == HeartbeatStatus::Completed)
        .collect();
    completed.sort_by_key(|h| h.beat);
    completed
        .windows(2)
        .map(|pair| WindowLink {
            before: pair[0],
            after: pair[1],
        })
        .collect()
}

/// Two completed heartbeats in a row (see [`window_links`]).
#[derive(Clone, Copy, Debug)]
pub struct WindowLink<'a> {
    /// The earlier.
    pub before: &'a Heartbeat,
    /// The next completed one.
    pub after: &'a Heartbeat,
}

impl WindowLink<'_> {
    /// Whether `after` starts its window where `before` ended its own.
    pub fn joined(&self) -> bool {
        self.before.window_end.as_ref() == Some(&self.after.window_start)
    }
}

/// What a sweeper asks of a claim.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The claim is valid only if the heartbeat is due at `now` (or its lease expired).
    pub now: Timestamp,
    /// How long the claim holds.
    pub lease: SignedDuration,
    /// The end of the event window, set only by the first claim.
    pub window_end: EventCursor,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NewAgent;

    #[test]
    fn an_outcome_keeps_the_first_line_of_its_reason_within_its_bound() {
        let o = Outcome::new(OutcomeKind::NothingToDo, "  All quiet.\nMore detail.  ");
        assert_eq!(o.reason, "All quiet.");
        let long = Outcome::new(OutcomeKind::Acted, &"x".repeat(500));
        assert_eq!(long.reason.chars().count(), Outcome::REASON_CHARS + 1);
        assert!(long.reason.ends_with('…'));
        for kind in OutcomeKind::ALL {
            assert_eq!(OutcomeKind::parse(kind.as_str()), Some(kind));
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::json!(kind.as_str())
            );
        }
        assert_eq!(OutcomeKind::parse("done"), None);
    }

    #[test]
    fn window_links_pass_over_failed_heartbeats_and_find_a_gap() {
        let now: Timestamp = "2026-01-05T00:00:00Z".parse().unwrap();
        let (agent, _) = NewAgent::named("a").create(now).unwrap();
        let cursor = |m: i64| EventCursor::through(now + SignedDuration::from_mins(m));
        let beat = |n: u64, status, start: EventCursor, end: Option<EventCursor>| {
            let mut h = Heartbeat::pending(&agent, n, now, start, 0, None, 0);
            h.status = status;
            h.window_end = end;
            h
        };
        use HeartbeatStatus::{Completed, Failed, Pending};
        // Beat 2 failed: beat 3 reads its window again, from where beat 1 ended. Given
        // out of order, as a page of the store may be.
        let beats = vec![
            beat(3, Completed, cursor(15), Some(cursor(45))),
            beat(1, Completed, EventCursor::origin(), Some(cursor(15))),
            beat(2, Failed, cursor(15), Some(cursor(30))),
            beat(4, Pending, cursor(45), None),
        ];
        let links = window_links(&beats);
        let pairs: Vec<_> = links
            .iter()
            .map(|l| (l.before.beat, l.after.beat, l.joined()))
            .collect();
        assert_eq!(pairs, [(1, 3, true)]);

        // Beat 3 starting where the failed beat 2 ended skips beat 2's events.
        let mut gap = beats.clone();
        gap[0].window_start = cursor(30);
        assert!(!window_links(&gap)[0].joined());
    }
}
