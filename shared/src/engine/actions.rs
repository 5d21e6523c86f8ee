//! Reading an agent's actions as its operator sees them: the action records, and the
//! heartbeat agent's SKIPPED runs, which an idle heartbeat keeps on its own record
//! ([`Heartbeat::skipped`]) rather than as an action and an event of their own.

use crate::domain::{Action, ActionId, AgentId, EventCursor, Heartbeat};
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

/// Most actions read per agent for [`tool_stats`].
pub const STATS_SCAN: usize = 5_000;

/// How one tool fared: its calls since a time, by outcome, and how long they took.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ToolStats {
    /// The tool.
    pub tool: String,
    /// Calls started in the window.
    pub calls: usize,
    /// Completed.
    pub succeeded: usize,
    /// Failed (cancelled and skipped runs are not counted as calls).
    pub failed: usize,
    /// Whose outcome is not known.
    pub unknown: usize,
    /// Still running.
    pub running: usize,
    /// Median time of the finished calls, in milliseconds.
    pub p50_ms: Option<u64>,
    /// 95th percentile, in milliseconds.
    pub p95_ms: Option<u64>,
}

/// Every tool's calls started since `since`, over every agent's latest
/// [`STATS_SCAN`] actions, by tool name (a model's MCP calls by `server/tool`).
pub async fn tool_stats(
    store: &dyn Store,
    since: jiff::Timestamp,
) -> Result<Vec<ToolStats>, StoreError> {
    let mut tally = Tally::default();
    for agent in store.list_agents().await? {
        tally.add(store.list_actions(&agent.id, STATS_SCAN).await?, since);
    }
    Ok(tally.stats())
}

/// [`tool_stats`] for one agent: one read of its latest [`STATS_SCAN`] actions.
pub async fn agent_tool_stats(
    store: &dyn Store,
    agent: &AgentId,
    since: jiff::Timestamp,
) -> Result<Vec<ToolStats>, StoreError> {
    let mut tally = Tally::default();
    tally.add(store.list_actions(agent, STATS_SCAN).await?, since);
    Ok(tally.stats())
}

/// Calls counted by tool, with their times.
#[derive(Default)]
struct Tally(std::collections::BTreeMap<String, (ToolStats, Vec<u64>)>);

impl Tally {
    fn add(&mut self, actions: Vec<Action>, since: jiff::Timestamp) {
        use crate::domain::ActionStatus;
        for a in actions {
            if a.started_at < since
                || matches!(a.status, ActionStatus::Cancelled | ActionStatus::Skipped)
            {
                continue;
            }
            let label = a.label();
            let (s, times) = self.0.entry(label.clone()).or_default();
            s.tool = label;
            s.calls += 1;
            match a.status {
                ActionStatus::Completed => s.succeeded += 1,
                ActionStatus::Failed => s.failed += 1,
                ActionStatus::Unknown => s.unknown += 1,
                _ => s.running += 1,
            }
            times.extend(a.duration_ms);
        }
    }

    fn stats(self) -> Vec<ToolStats> {
        self.0
            .into_values()
            .map(|(mut s, mut times)| {
                times.sort_unstable();
                let at = |q: f64| {
                    (!times.is_empty()).then(|| {
                        times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1]
                    })
                };
                s.p50_ms = at(0.5);
                s.p95_ms = at(0.95);
                s
            })
            .collect()
    }
}
