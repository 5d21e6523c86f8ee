//! The calls-per-minute limit (`--max-calls-per-minute`): each model call of an agent
//! that has one is counted in the store against the minute it is made in (one
//! conditional write, the same on both backends), and one past the limit is not made —
//! a heartbeat yields its window to the next heartbeat, a conversation turn waits its
//! turn and is tried again.

use jiff::Timestamp;

use crate::domain::Agent;
use crate::error::StoreError;
use crate::ports::Store;

/// The minute `at` is in, as the count's key (`2026-12-06T10:15`, UTC).
pub fn minute(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M").to_string()
}

/// Counts a model call of `agent` now: `None` when it may be made (or the agent has no
/// limit: nothing is written then), `Some(why)` when this minute's calls are all made.
pub async fn take(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<Option<String>, StoreError> {
    let Some(limit) = agent.budgets.max_calls_per_minute else {
        return Ok(None);
    };
    let minute = minute(now);
    Ok((!store.take_call(&agent.id, &minute, limit, now).await?).then(|| {
        format!(
            "calls per minute: {limit} model calls made in the minute {minute} UTC, the agent's limit (--max-calls-per-minute); the next may be made in the next minute"
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_is_named_by_its_start() {
        let at: Timestamp = "2026-12-06T10:15:59.9Z".parse().unwrap();
        assert_eq!(minute(at), "2026-12-06T10:15");
    }
}
