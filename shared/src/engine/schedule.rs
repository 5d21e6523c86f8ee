//! When the next heartbeat runs.

use jiff::{SignedDuration, Timestamp};

use crate::domain::Agent;

/// The delay after `failures` failed heartbeats in a row: the interval, doubling with each
/// further failure, capped at `max(interval, cap)`. An agent that keeps failing slows
/// down instead of burning tokens, and never stops.
pub fn failure_delay(
    interval: SignedDuration,
    failures: u32,
    cap: SignedDuration,
) -> SignedDuration {
    let doublings = failures.saturating_sub(1).min(16);
    let delay = interval
        .checked_mul(1i32 << doublings)
        .unwrap_or(SignedDuration::MAX);
    delay.min(interval.max(cap))
}

/// When the heartbeat after one that ended at `ended` should run: the interval after it
/// (with backoff after failures), moved into the agent's active hours — or the agent's
/// next schedule wake if that is sooner. A wake is not moved: a reminder fires at its
/// time, inside the active hours or not, and one that came due while the heartbeat ran
/// makes the next one due at once — unless the heartbeat failed: then the backoff holds,
/// so a wake that keeps failing does not spin.
pub fn next_run(agent: &Agent, ended: Timestamp, failures: u32, cap: SignedDuration) -> Timestamp {
    let interval = agent.interval.duration();
    let delay = if failures == 0 {
        interval
    } else {
        failure_delay(interval, failures, cap)
    };
    let planned = agent.in_active_hours(ended.saturating_add(delay).unwrap_or(Timestamp::MAX));
    match agent.next_wake {
        Some(wake) if failures == 0 || wake > ended => planned.min(wake),
        _ => planned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NewAgent;

    #[test]
    fn failures_back_off_by_doubling_up_to_the_cap() {
        let i = SignedDuration::from_mins(15);
        let cap = SignedDuration::from_hours(24);
        assert_eq!(failure_delay(i, 1, cap), i);
        assert_eq!(failure_delay(i, 2, cap), SignedDuration::from_mins(30));
        assert_eq!(failure_delay(i, 4, cap), SignedDuration::from_hours(2));
        assert_eq!(failure_delay(i, 40, cap), cap);
        // An interval longer than the cap is never shortened.
        let week = SignedDuration::from_hours(24 * 7);
        assert_eq!(failure_delay(week, 3, cap), week);
    }

    #[test]
    fn the_next_run_respects_active_hours() {
        let mut new = NewAgent::named("a");
        new.interval = "1h".parse().unwrap();
        new.active_hours = Some("08:00-22:00".parse().unwrap());
        let (agent, _) = new.create(Timestamp::UNIX_EPOCH).unwrap();
        let ended: Timestamp = "2026-05-01T21:30:00Z".parse().unwrap();
        let cap = SignedDuration::from_hours(24);
        assert_eq!(
            next_run(&agent, ended, 0, cap),
            "2026-05-02T08:00:00Z".parse::<Timestamp>().unwrap()
        );
        let morning: Timestamp = "2026-05-01T09:00:00Z".parse().unwrap();
        assert_eq!(
            next_run(&agent, morning, 0, cap),
            "2026-05-01T10:00:00Z".parse::<Timestamp>().unwrap()
        );
    }

    #[test]
    fn a_wake_is_kept_at_its_time_outside_the_active_hours_and_a_failure_keeps_its_backoff() {
        let mut new = NewAgent::named("a");
        new.interval = "1h".parse().unwrap();
        new.active_hours = Some("08:00-22:00".parse().unwrap());
        let (mut agent, _) = new.create(Timestamp::UNIX_EPOCH).unwrap();
        let cap = SignedDuration::from_hours(24);
        let ended: Timestamp = "2026-05-01T21:30:00Z".parse().unwrap();
        // A reminder at 23:00, outside the hours: it fires then, not at 08:00.
        let late: Timestamp = "2026-05-01T23:00:00Z".parse().unwrap();
        agent.next_wake = Some(late);
        assert_eq!(next_run(&agent, ended, 0, cap), late);
        // A wake that came due while the heartbeat ran: the next one is due at once.
        let passed: Timestamp = "2026-05-01T21:29:00Z".parse().unwrap();
        agent.next_wake = Some(passed);
        assert_eq!(next_run(&agent, ended, 0, cap), passed);
        // After a failure, the backoff holds (a wake that fails does not spin).
        assert_eq!(
            next_run(&agent, ended, 2, cap),
            "2026-05-02T08:00:00Z".parse::<Timestamp>().unwrap()
        );
    }
}
