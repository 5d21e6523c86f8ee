//! The retention pass: every agent's records past its retention removed (or, for a dry
//! run, counted), then the freed space given back. `pulse serve` runs it hourly,
//! `pulse prune` once, and on AWS the sweeper's daily run.

use jiff::Timestamp;
use tracing::{info, warn};

use crate::domain::{AgentId, Retention};
use crate::error::StoreError;
use crate::ports::{Pruned, Reclaimed, Store};

/// What one pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PruneReport {
    /// Agents looked at.
    pub agents: u64,
    /// Rows removed (or, dry, that would be), by kind.
    pub pruned: Pruned,
    /// The store's size before and after giving space back (after removing only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimed: Option<Reclaimed>,
    /// Agents whose records could not be pruned, with why: the next pass tries again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<(AgentId, String)>,
}

/// Prunes every agent's records that finished more than its retention (`default` unless
/// the agent sets one) before `now`; with `apply` they are removed, the space given
/// back and what went logged, without they are only counted. An agent whose prune fails is reported and
/// skipped: one bad partition does not keep the others growing.
pub async fn prune(
    store: &dyn Store,
    default: Retention,
    now: Timestamp,
    apply: bool,
) -> Result<PruneReport, StoreError> {
    let mut report = PruneReport::default();
    for agent in store.list_agents().await? {
        report.agents += 1;
        let horizon = agent.retention.unwrap_or(default).horizon(now);
        match store.prune_agent(&agent.id, horizon, now, apply).await {
            Ok(p) => report.pruned += p,
            Err(e) => {
                warn!(agent = %agent.id, error = %e, "cannot prune the agent's records; the next pass tries again");
                report.failed.push((agent.id.clone(), e.to_string()));
            }
        }
    }
    if apply {
        let reclaimed = store.reclaim().await?;
        report.reclaimed = Some(reclaimed);
        let p = &report.pruned;
        if p.total() > 0 {
            info!(
                agents = report.agents,
                heartbeats = p.heartbeats,
                events = p.events,
                actions = p.actions,
                conversation = p.conversation,
                hook_deliveries = p.hook_deliveries,
                webhook_records = p.webhook_records,
                tool_counts = p.tool_counts,
                approvals = p.approvals,
                bytes_before = reclaimed.bytes_before,
                bytes_after = reclaimed.bytes_after,
                "pruned records past their retention"
            );
        }
    }
    Ok(report)
}
