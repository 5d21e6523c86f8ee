//! Deleting an agent and everything that is its own, in one transaction.

use rusqlite::{Connection, OptionalExtension};

use super::{CachedExecute, sqlite_err};
use crate::domain::AgentId;
use crate::error::StoreError;
use crate::ports::Footprint;

const WEBHOOKS: &str = "(SELECT id FROM webhooks WHERE agent_id = ?1)";
const HOOKS: &str = "(SELECT id FROM hooks WHERE agent_id = ?1)";

/// Which count of the footprint some rows add to.
type Counter = fn(&mut Footprint) -> &mut u64;

/// Which rows of each table are the agent's, in the order they are deleted (dependents
/// before what they hang from), and which count of the footprint they add to.
fn owned() -> Vec<(String, Counter)> {
    let by_agent = |table: &str| format!("FROM {table} WHERE agent_id = ?1");
    let mut rows: Vec<(String, Counter)> = Vec::new();
    for table in [
        "webhook_requests",
        "webhook_deliveries",
        "webhook_counters",
        "webhook_log_budget",
    ] {
        rows.push((
            format!("FROM {table} WHERE webhook_id IN {WEBHOOKS}"),
            |f| &mut f.webhook_records,
        ));
    }
    rows.push((by_agent("webhooks"), |f| &mut f.webhooks));
    rows.push((
        format!(
            "FROM hook_attempts WHERE delivery_id IN (SELECT id FROM hook_deliveries WHERE hook_id IN {HOOKS})"
        ),
        |f| &mut f.hook_deliveries,
    ));
    rows.push((
        format!("FROM hook_deliveries WHERE hook_id IN {HOOKS}"),
        |f| &mut f.hook_deliveries,
    ));
    rows.push((by_agent("hooks"), |f| &mut f.hooks));
    rows.push((
        "FROM subscriptions WHERE json_extract(doc, '$.agent_id') = ?1".to_owned(),
        |f| &mut f.subscriptions,
    ));
    rows.push((by_agent("heartbeats"), |f| &mut f.heartbeats));
    rows.push((by_agent("events"), |f| &mut f.events));
    rows.push((by_agent("actions"), |f| &mut f.actions));
    for table in ["turns", "messages", "signal_turns"] {
        rows.push((by_agent(table), |f| &mut f.conversation));
    }
    rows.push((by_agent("memories"), |f| &mut f.memories));
    rows.push((by_agent("spend"), |f| &mut f.usage));
    rows.push((by_agent("usd"), |f| &mut f.usage));
    rows.push((by_agent("calls"), |f| &mut f.usage));
    rows.push((by_agent("schedules"), |f| &mut f.schedules));
    rows.push((by_agent("approvals"), |f| &mut f.approvals));
    rows
}

/// Counts what is the agent's, and with `apply` deletes it, in one transaction.
pub(super) fn purge(
    conn: &mut Connection,
    id: &AgentId,
    apply: bool,
) -> Result<Footprint, StoreError> {
    let op = sqlite_err("delete agent");
    let tx = super::begin(conn).map_err(&op)?;
    let mut footprint = Footprint {
        agent: tx
            .query_row("SELECT 1 FROM agents WHERE id = ?1", [id.as_str()], |_| {
                Ok(())
            })
            .optional()
            .map_err(&op)?
            .is_some(),
        channel: tx
            .query_row(
                "SELECT channel_id FROM discord_channels WHERE agent_id = ?1",
                [id.as_str()],
                |r| r.get(0),
            )
            .optional()
            .map_err(&op)?,
        ..Footprint::default()
    };
    for (rows, count) in owned() {
        // Applied, the DELETE says how many rows it removed; else they are counted.
        let n = if apply {
            tx.exec(&format!("DELETE {rows}"), [id.as_str()])
                .map_err(&op)? as u64
        } else {
            tx.query_row(&format!("SELECT COUNT(*) {rows}"), [id.as_str()], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(&op)? as u64
        };
        *count(&mut footprint) += n;
    }
    if apply {
        // The memories' version goes with them (counted as memories); its tool call
        // counts too (sums of its actions, not counted again).
        for table in [
            "memory_versions",
            "discord_channels",
            "agent_names",
            "tool_counts",
            "tool_times",
        ] {
            tx.exec(
                &format!("DELETE FROM {table} WHERE agent_id = ?1"),
                [id.as_str()],
            )
            .map_err(&op)?;
        }
        tx.exec("DELETE FROM agents WHERE id = ?1", [id.as_str()])
            .map_err(&op)?;
        tx.commit().map_err(&op)?;
    }
    Ok(footprint)
}
