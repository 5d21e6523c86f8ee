//! What the schedules that woke the agent expect of the run. A schedule made with
//! `--expect` says so in each SCHEDULED event it puts in the agent's log, and the
//! heartbeat whose window holds the event is held to it beside the agent's own
//! expectation (`Stats::outcome`); the schedule counts its runs in a row that did not do
//! it (`HeartbeatRunner::schedule_hooks`).

use crate::domain::{Event, Expectation, Must, Outcome, OutcomeKind, SCHEDULED, ScheduleId};

/// How the reason of a run that met the agent's expectation but not a schedule's
/// starts: the schedule is named first.
const UNMET_PREFIX: &str = "schedule ";

/// What a schedule that woke the agent expects of this run, as its SCHEDULED event
/// carries it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ScheduleExpect {
    /// The schedule.
    pub(super) id: ScheduleId,
    /// Its note, when it woke.
    pub(super) note: Option<String>,
    /// What the run must do.
    pub(super) must: Must,
    /// Its runs in a row that did not before `HEARTBEAT_INCOMPLETE` fires, when it woke.
    pub(super) alert_after: u32,
    /// Whether it is a one-time schedule: removed as it woke, it has this run only.
    pub(super) once: bool,
}

impl ScheduleExpect {
    /// The expectations the SCHEDULED events among `events` carry, one per schedule.
    pub(super) fn of_window(events: &[Event]) -> Vec<Self> {
        let mut out: Vec<Self> = Vec::new();
        for expect in events.iter().filter_map(Self::of) {
            if !out.iter().any(|e| e.id == expect.id) {
                out.push(expect);
            }
        }
        out
    }

    /// The expectation a schedule's SCHEDULED `event` carries, if it has one.
    fn of(event: &Event) -> Option<Self> {
        if event.event_type.as_str() != SCHEDULED || event.source != "schedule" {
            return None;
        }
        let p = &event.payload;
        Some(Self {
            id: ScheduleId::parse(p["schedule_id"].as_str()?).ok()?,
            note: p["note"].as_str().map(str::to_owned),
            must: Must::parse(p["expect"].as_str()?).ok()?,
            alert_after: p["alert_after"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(Expectation::ALERT_AFTER),
            once: p["rule"].get("once").is_some(),
        })
    }

    /// Why a run that did `did` falls short of it, naming the schedule first.
    pub(super) fn unmet(&self, did: &Outcome) -> String {
        format!(
            "{UNMET_PREFIX}{} expected it to {}, it did not ({}: {})",
            self.id,
            self.must.as_str(),
            did.kind,
            did.reason
        )
    }
}

/// Whether `outcome` is incomplete by the agent's own expectation: a run that met it but
/// not a schedule's has a reason that names the schedule first, and does not count in
/// the agent's streak.
pub(super) fn short_of_agent(outcome: &Outcome) -> bool {
    outcome.kind == OutcomeKind::Incomplete && !outcome.reason.starts_with(UNMET_PREFIX)
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::domain::{AgentId, EventId, EventType, Priority};

    fn scheduled(payload: serde_json::Value, source: &str) -> Event {
        Event {
            id: EventId::derived(1, &["scheduled"]),
            agent_id: AgentId::generate(),
            event_type: EventType::parse(SCHEDULED).unwrap(),
            priority: Priority::DEFAULT,
            source: source.to_owned(),
            payload,
            metadata: serde_json::Value::Null,
            parent_id: None,
            cascade: None,
            created_at: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_scheduled_event_with_an_expectation_holds_the_run_to_it_once_per_schedule() {
        let id = ScheduleId::generate(Timestamp::UNIX_EPOCH);
        let cron = json!({"schedule_id": id, "note": "report", "expect": "speak",
            "alert_after": 2, "rule": {"cron": "0 9 * * *", "timezone": "UTC"}});
        let once = json!({"schedule_id": ScheduleId::generate(Timestamp::UNIX_EPOCH),
            "expect": "act", "rule": {"once": "2026-01-01T09:00:00Z"}});
        let plain = json!({"schedule_id": ScheduleId::generate(Timestamp::UNIX_EPOCH)});
        let events = [
            scheduled(cron.clone(), "schedule"),
            scheduled(cron.clone(), "schedule"),
            scheduled(once, "schedule"),
            scheduled(plain, "schedule"),
            scheduled(cron, "operator"),
        ];
        let expects = ScheduleExpect::of_window(&events);
        assert_eq!(expects.len(), 2, "{expects:?}");
        assert_eq!(
            (&expects[0].id, expects[0].must, expects[0].alert_after),
            (&id, Must::Speak, 2)
        );
        assert_eq!(expects[0].note.as_deref(), Some("report"));
        assert!(!expects[0].once);
        assert_eq!(
            (expects[1].must, expects[1].alert_after, expects[1].once),
            (Must::Act, Expectation::ALERT_AFTER, true)
        );
        let did = Outcome::new(OutcomeKind::NothingToDo, "quiet");
        let unmet = Outcome::new(OutcomeKind::Incomplete, &expects[0].unmet(&did));
        assert_eq!(
            unmet.reason,
            format!("schedule {id} expected it to speak, it did not (nothing_to_do: quiet)")
        );
        assert!(!short_of_agent(&unmet), "a schedule's is not the agent's");
        let own = Outcome::new(OutcomeKind::Incomplete, "expected to speak, it did not");
        assert!(short_of_agent(&own));
    }
}
