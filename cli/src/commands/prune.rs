//! `pulse prune`: the retention pass once — what `pulse serve` runs hourly and the AWS
//! sweeper daily — with `--dry-run` to count first, and `--vacuum` to rebuild a SQLite
//! file made before auto-vacuum so it can shrink.

use clap::Args;
use pulse_shared::adapters::sqlite::{Db, SqliteStore};
use pulse_shared::config::Backend;
use pulse_shared::engine::{PruneReport, prune};
use pulse_shared::ports::Reclaimed;

use super::Ctx;
use crate::Failure;
use crate::output::{count, outln};

#[derive(Args, Debug)]
pub(crate) struct PruneArgs {
    /// Count what would be removed; remove nothing.
    #[arg(long, conflicts_with = "vacuum")]
    dry_run: bool,
    /// SQLite: rebuild a database file made before auto-vacuum (one full VACUUM; it
    /// holds the write lock throughout, so stop `pulse serve` first), after which it
    /// shrinks as records are pruned.
    #[arg(long)]
    vacuum: bool,
}

/// A validated `pulse prune`.
pub(crate) struct PrunePlan {
    apply: bool,
    vacuum: bool,
}

pub(crate) fn plan(a: PruneArgs) -> Result<PrunePlan, Failure> {
    Ok(PrunePlan {
        apply: !a.dry_run,
        vacuum: a.vacuum,
    })
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub(crate) async fn execute(plan: PrunePlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let sqlite = match &cx.config.backend {
        Backend::Sqlite { path } => Some(path.clone()),
        Backend::Aws(_) => None,
    };
    if plan.vacuum && sqlite.is_none() {
        return Err(Failure::Input(
            "--vacuum rebuilds a SQLite file; DynamoDB has nothing to rebuild".into(),
        ));
    }
    let mut report: PruneReport = prune(
        cx.b.store.as_ref(),
        cx.config.retention,
        cx.clock.now(),
        plan.apply,
    )
    .await?;
    if let (true, Some(path)) = (plan.vacuum, &sqlite) {
        let before = report.reclaimed.map(|r| r.bytes_before);
        let store = SqliteStore::new(Db::open(path)?);
        let mut rebuilt = store.reclaim_space(true).await?;
        rebuilt.bytes_before = before.unwrap_or(rebuilt.bytes_before);
        report.reclaimed = Some(rebuilt);
    }
    if cx.out.json {
        cx.out.json_value(&report);
    } else {
        print(
            &report,
            plan.apply,
            cx.config.retention.to_string(),
            sqlite.is_some(),
        );
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Runtime(anyhow::anyhow!(
            "{} could not be pruned; run `pulse prune` again (the rest was)",
            count(report.failed.len(), "agent")
        )))
    }
}

fn print(report: &PruneReport, apply: bool, retention: String, sqlite: bool) {
    let p = &report.pruned;
    outln!(
        "{} looked at (PULSE_RETENTION {retention}, unless an agent sets --retention); {}:",
        count(report.agents as usize, "agent"),
        if apply {
            "removed"
        } else {
            "would remove (dry run)"
        }
    );
    for (n, what) in [
        (p.heartbeats, "finished heartbeats"),
        (p.events, "events its heartbeats have read"),
        (p.actions, "actions"),
        (
            p.conversation,
            "conversation records (turns, messages, answered signals)",
        ),
        (p.hook_deliveries, "hook deliveries and attempts"),
        (p.webhook_records, "webhook log entries and replay keys"),
        (p.tool_counts, "hourly tool call counts past their 90 days"),
        (p.approvals, "approvals decided and carried out"),
    ] {
        outln!("  {n:>8}  {what}");
    }
    if !sqlite {
        outln!(
            "  hook deliveries, webhook logs and tool call counts on DynamoDB expire by TTL, written with them"
        );
    }
    for (agent, e) in &report.failed {
        outln!("  {agent}: not pruned: {e}");
    }
    match report.reclaimed {
        Some(Reclaimed {
            bytes_before,
            bytes_after,
            shrinks: true,
        }) if sqlite => outln!("database {} -> {}", mib(bytes_before), mib(bytes_after)),
        Some(Reclaimed { bytes_after, .. }) if sqlite => outln!(
            "database {}: made before auto-vacuum, its free pages are reused but the file keeps its size; run `pulse prune --vacuum` once with `pulse serve` stopped",
            mib(bytes_after)
        ),
        _ => {}
    }
}
