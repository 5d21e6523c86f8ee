//! Reading an agent's actions as its operator sees them: the action records, and the
//! heartbeat agent's SKIPPED runs, which an idle heartbeat keeps on its own record
//! ([`Heartbeat::skipped`]) rather than as an action and an event of their own.

use crate::domain::{
    Action, ActionId, AgentId, COUNT_DAYS, EventCursor, Heartbeat, ToolCount, bucket_ms,
};
use crate::error::StoreError;
use crate::ports::Store;

/// Heartbeats read a page at a time when looking back for skips.
const PAGE: usize = 200;
/// Most heartbeats looked through for one action id.
const FIND_SCAN: usize = 1_000;

/// Newest first, as action keys sort: by event, then tool.
fn newest_first(actions: &mut [Action]) {
    actions.sort_by(|a, b| b.event_id.cmp(&a.event_id).then(b.tool.cmp(&a.tool)));
}

/// The agent's latest `limit` actions, newest first.
pub async fn recent(
    store: &dyn Store,
    agent: &AgentId,
    limit: usize,
) -> Result<Vec<Action>, StoreError> {
    let mut out = store.list_actions(agent, limit).await?;
    out.extend(
        store
            .list_heartbeats(agent, limit)
            .await?
            .iter()
            .filter_map(Heartbeat::skipped_action),
    );
    newest_first(&mut out);
    out.truncate(limit);
    Ok(out)
}

/// At most `limit` of the agent's actions on events in `(after, through]`, in event
/// order (as [`crate::ports::ActionLog::actions_between`]).
pub async fn between(
    store: &dyn Store,
    agent: &AgentId,
    after: &EventCursor,
    through: &EventCursor,
    limit: usize,
) -> Result<Vec<Action>, StoreError> {
    let mut out = store.actions_between(agent, after, through, limit).await?;
    let mut before = None;
    'pages: loop {
        let page = store.heartbeats_page(agent, before, PAGE).await?;
        for hb in &page {
            let Some(started) = hb.started_at else {
                continue;
            };
            if !after.is_before(&hb.heartbeat_event_id(started)) {
                break 'pages;
            }
            if let Some(a) = hb.skipped_action()
                && through.covers(&a.event_id)
            {
                out.push(a);
            }
        }
        match page.last() {
            Some(last) if page.len() == PAGE => before = Some(last.beat),
            _ => break,
        }
    }
    newest_first(&mut out);
    out.reverse();
    out.truncate(limit);
    Ok(out)
}

/// One of the agent's actions by id: a record, or a skip among its latest
/// [`FIND_SCAN`] heartbeats.
pub async fn find(
    store: &dyn Store,
    agent: &AgentId,
    id: &ActionId,
) -> Result<Option<Action>, StoreError> {
    if let Some(a) = store.get_action(agent, id).await? {
        return Ok(Some(a));
    }
    let mut before = None;
    for _ in 0..FIND_SCAN.div_ceil(PAGE) {
        let page = store.heartbeats_page(agent, before, PAGE).await?;
        if let Some(a) = page
            .iter()
            .filter_map(Heartbeat::skipped_action)
            .find(|a| a.id == *id)
        {
            return Ok(Some(a));
        }
        match page.last() {
            Some(last) if page.len() == PAGE => before = Some(last.beat),
            _ => break,
        }
    }
    Ok(None)
}

/// Why an action could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// It is not UNKNOWN (anymore): nothing to settle.
    #[error("{0}")]
    NotUnknown(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Settles an UNKNOWN action as its operator found it (the tool's own records say
/// whether the work was done): COMPLETED or FAILED, with a note of who said so.
pub async fn settle(
    store: &dyn Store,
    action: &Action,
    succeeded: bool,
    now: jiff::Timestamp,
) -> Result<Action, SettleError> {
    use crate::domain::ActionStatus;
    if action.status != ActionStatus::Unknown {
        return Err(SettleError::NotUnknown(format!(
            "action {} is {}, not UNKNOWN: only an action whose outcome is not known is settled by hand",
            action.id,
            action.status.as_str()
        )));
    }
    let mut settled = action.clone();
    settled.status = if succeeded {
        ActionStatus::Completed
    } else {
        ActionStatus::Failed
    };
    settled.completed_at = Some(now);
    let was = action
        .error
        .as_deref()
        .unwrap_or("its outcome was not known");
    settled.error = Some(format!(
        "settled by its operator at {now} as {}; before: {was}",
        settled.status.as_str()
    ));
    if !store.settle_action(&settled, action.attempt).await? {
        return Err(SettleError::NotUnknown(format!(
            "action {} changed meanwhile (retried or settled): look at it again",
            action.id
        )));
    }
    Ok(settled)
}

/// How one tool fared: its calls since a time, by outcome, and how long they took.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ToolStats {
    /// The tool.
    pub tool: String,
    /// Calls started in the window that have finished (a running call is counted
    /// when it ends; cancelled and skipped runs are no calls).
    pub calls: u64,
    /// Completed.
    pub succeeded: u64,
    /// Failed.
    pub failed: u64,
    /// Whose outcome is not known.
    pub unknown: u64,
    /// Median time of the calls, in milliseconds (within 10 %: read from buckets).
    pub p50_ms: Option<u64>,
    /// 95th percentile, in milliseconds.
    pub p95_ms: Option<u64>,
}

/// Every tool's calls started from the hour `since` falls in through `now`, over every
/// agent, by tool name (a model's MCP calls by `server/tool`): the sums of the counts
/// written with the actions, so the window is exact however many calls it holds, and
/// a fleet's figures cost one read a day. A window reaches back [`COUNT_DAYS`] days at
/// most.
pub async fn tool_stats(
    store: &dyn Store,
    since: jiff::Timestamp,
    now: jiff::Timestamp,
) -> Result<Vec<ToolStats>, StoreError> {
    let since = since.max(now - jiff::SignedDuration::from_hours(COUNT_DAYS * 24));
    Ok(sum(store.tool_counts(since, now, None).await?))
}

/// [`tool_stats`] for one agent.
pub async fn agent_tool_stats(
    store: &dyn Store,
    agent: &AgentId,
    since: jiff::Timestamp,
    now: jiff::Timestamp,
) -> Result<Vec<ToolStats>, StoreError> {
    let since = since.max(now - jiff::SignedDuration::from_hours(COUNT_DAYS * 24));
    Ok(sum(store.tool_counts(since, now, Some(agent)).await?))
}

/// Hourly counts added up by tool, percentiles read from their time buckets.
fn sum(counts: Vec<ToolCount>) -> Vec<ToolStats> {
    use std::collections::BTreeMap;
    let mut by_tool: BTreeMap<String, (ToolStats, BTreeMap<u8, u64>)> = BTreeMap::new();
    for c in counts {
        let (s, times) = by_tool.entry(c.tool.clone()).or_default();
        s.tool = c.tool;
        s.succeeded += c.succeeded.max(0) as u64;
        s.failed += c.failed.max(0) as u64;
        s.unknown += c.unknown.max(0) as u64;
        for (b, n) in c.times {
            *times.entry(b).or_default() += n.max(0) as u64;
        }
    }
    by_tool
        .into_values()
        .filter_map(|(mut s, times)| {
            s.calls = s.succeeded + s.failed + s.unknown;
            let timed: u64 = times.values().sum();
            let at = |q: f64| {
                let rank = ((timed as f64 * q).ceil() as u64).clamp(1, timed.max(1));
                let mut seen = 0;
                times.iter().find_map(|(b, n)| {
                    seen += n;
                    (seen >= rank).then(|| bucket_ms(*b))
                })
            };
            if timed > 0 {
                s.p50_ms = at(0.5);
                s.p95_ms = at(0.95);
            }
            (s.calls > 0).then_some(s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bucket_of;

    fn count(tool: &str, hour: i64, ok: i64, times: &[(u64, i64)]) -> ToolCount {
        ToolCount {
            hour,
            agent_id: AgentId::generate(),
            tool: tool.into(),
            succeeded: ok,
            failed: 0,
            unknown: 0,
            times: times.iter().map(|(ms, n)| (bucket_of(*ms), *n)).collect(),
        }
    }

    #[test]
    fn hours_add_up_by_tool_and_percentiles_come_from_the_buckets() {
        let stats = sum(vec![
            count("a", 1, 90, &[(100, 90)]),
            count("a", 2, 10, &[(2_000, 10)]),
            count("b", 1, 1, &[]),
            // An hour whose only call was settled away from unknown: no calls left.
            ToolCount {
                unknown: 0,
                ..count("c", 1, 0, &[])
            },
        ]);
        assert_eq!(stats.len(), 2, "{stats:?}");
        let a = &stats[0];
        assert_eq!((a.tool.as_str(), a.calls, a.succeeded), ("a", 100, 100));
        let near = |got: Option<u64>, want: f64| {
            let got = got.expect("a percentile") as f64;
            assert!((got - want).abs() / want < 0.1, "{got} is not near {want}");
        };
        near(a.p50_ms, 100.0);
        near(a.p95_ms, 2_000.0);
        assert_eq!((stats[1].calls, stats[1].p50_ms), (1, None));
    }
}
