//! How many calls each tool made, counted as the calls are written: `pulse tools stats`
//! and the dashboard's tool health add these up instead of reading the action log, so
//! a window of any length is exact and a fleet's figures cost one read a day, not one
//! per agent.
//!
//! A call is counted in the hour its attempt started, when its outcome is written
//! (completed, failed, or unknown: cancelled and skipped runs are no calls); an
//! operator settling an unknown call moves it to its outcome in the same hour. Its time
//! goes into a histogram of [`BUCKETS_PER_DOUBLING`] buckets per doubling, so a
//! percentile read from it is within 10 % of the true one. Counts are kept
//! [`COUNT_DAYS`] days.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{Action, ActionStatus, AgentId};

/// Buckets per doubling of a call's time: each spans a factor of 2^(1/4) ≈ 1.19.
pub(crate) const BUCKETS_PER_DOUBLING: u32 = 4;
/// How long an hour's counts are kept (then DynamoDB's TTL or SQLite's retention
/// removes them): the longest window `tools stats` reads.
pub const COUNT_DAYS: i64 = 90;
/// The last bucket holds every call of 2^20 ms (about 17 minutes) or more.
pub(crate) const LAST_BUCKET: u8 = 20 * BUCKETS_PER_DOUBLING as u8;

/// The hour a time falls in, as hours since 1970.
pub fn hour_of(at: Timestamp) -> i64 {
    at.as_second().div_euclid(3600)
}

/// The bucket of a call that took `ms` milliseconds: 0 for under a millisecond and
/// for one; then one per 2^(1/4) step.
pub fn bucket_of(ms: u64) -> u8 {
    if ms <= 1 {
        return 0;
    }
    let b = ((ms as f64).log2() * f64::from(BUCKETS_PER_DOUBLING)).floor() as u64;
    b.min(u64::from(LAST_BUCKET)) as u8
}

/// The time a bucket stands for: the geometric middle of its span.
pub fn bucket_ms(bucket: u8) -> u64 {
    if bucket == 0 {
        return 1;
    }
    let per = f64::from(BUCKETS_PER_DOUBLING);
    (2f64.powf((f64::from(bucket) + 0.5) / per)).round() as u64
}

/// One hour's calls of one tool by one agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCount {
    /// The hour (hours since 1970) the calls started in.
    pub hour: i64,
    /// The agent.
    pub agent_id: AgentId,
    /// The tool, as listings name it ([`Action::label`]).
    pub tool: String,
    /// Calls that completed.
    pub succeeded: i64,
    /// Calls that failed.
    pub failed: i64,
    /// Calls whose outcome is not known.
    pub unknown: i64,
    /// Calls by time: bucket ([`bucket_of`]) to count.
    pub times: BTreeMap<u8, i64>,
}

/// What one write of an action adds to its tool's counts (a settled call: -1 unknown,
/// +1 its outcome).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountChange {
    /// The hour its attempt started.
    pub hour: i64,
    /// The agent.
    pub agent_id: AgentId,
    /// The tool, as listings name it.
    pub tool: String,
    /// Added to the completed calls.
    pub succeeded: i64,
    /// Added to the failed calls.
    pub failed: i64,
    /// Added to the calls of unknown outcome.
    pub unknown: i64,
    /// The bucket its time adds one to, for a call newly counted.
    pub time: Option<u8>,
}

impl CountChange {
    /// A finished attempt: one call, by its outcome. None for a run that made no call
    /// (cancelled, skipped) or is still running.
    pub fn finished(action: &Action) -> Option<Self> {
        let mut c = Self::empty(action);
        match action.status {
            ActionStatus::Completed => c.succeeded = 1,
            ActionStatus::Failed => c.failed = 1,
            ActionStatus::Unknown => c.unknown = 1,
            _ => return None,
        }
        c.time = action.duration_ms.map(bucket_of);
        Some(c)
    }

    /// An unknown call settled by its operator: moved to its outcome.
    pub fn settled(action: &Action) -> Option<Self> {
        let mut c = Self::empty(action);
        match action.status {
            ActionStatus::Completed => c.succeeded = 1,
            ActionStatus::Failed => c.failed = 1,
            _ => return None,
        }
        c.unknown = -1;
        Some(c)
    }

    fn empty(action: &Action) -> Self {
        Self {
            hour: hour_of(action.started_at),
            agent_id: action.agent_id.clone(),
            tool: action.label(),
            succeeded: 0,
            failed: 0,
            unknown: 0,
            time: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_stands_for_its_times_within_ten_percent() {
        for ms in [2u64, 3, 7, 15, 100, 333, 1_000, 1_500, 29_999, 600_000] {
            let back = bucket_ms(bucket_of(ms)) as f64;
            let off = (back - ms as f64).abs() / ms as f64;
            assert!(off < 0.1, "{ms} ms reads back as {back} ms");
        }
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(u64::MAX), LAST_BUCKET);
        assert!(bucket_of(1_000) < bucket_of(1_200));
    }

    #[test]
    fn hours_count_from_1970_also_before_it() {
        assert_eq!(hour_of(Timestamp::from_second(7_199).unwrap()), 1);
        assert_eq!(hour_of(Timestamp::from_second(-1).unwrap()), -1);
    }
}
