//! `pulse heartbeats …`: an agent's heartbeats.

use clap::Subcommand;
use pulse_shared::domain::{AgentId, Heartbeat};

use super::{Ctx, agent_id, limit, require_agent};
use crate::Failure;
use crate::output::{Out, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum HeartbeatsCmd {
    /// List an agent's latest heartbeats, newest first.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

/// A validated heartbeats command.
pub(crate) enum HeartbeatsPlan {
    List { agent: AgentId, limit: usize },
}

pub(crate) fn plan(cmd: HeartbeatsCmd) -> Result<HeartbeatsPlan, Failure> {
    Ok(match cmd {
        HeartbeatsCmd::List { agent, limit: n } => HeartbeatsPlan::List {
            agent: agent_id(&agent)?,
            limit: limit(n)?,
        },
    })
}

pub(crate) async fn execute(plan: HeartbeatsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        HeartbeatsPlan::List { agent, limit } => {
            require_agent(cx.b, &agent).await?;
            let hbs = cx.b.store.list_heartbeats(&agent, limit).await?;
            heartbeat_table(cx.out, &hbs);
        }
    }
    Ok(())
}

/// Heartbeats as a table.
pub(crate) fn heartbeat_table(out: &Out, hbs: &[Heartbeat]) {
    out.table(
        hbs,
        &[
            "BEAT",
            "STATUS",
            "SCHEDULED",
            "STARTED",
            "COMPLETED",
            "EVENTS",
            "ACTIONS",
            "FAILED",
            "ERROR",
        ],
        |h| {
            vec![
                h.beat.to_string(),
                h.status.as_str().to_owned(),
                when(Some(h.scheduled_at)),
                when(h.started_at),
                when(h.completed_at),
                h.events_processed.to_string(),
                h.actions_triggered.to_string(),
                h.actions_failed.to_string(),
                h.error.as_deref().map_or("-".into(), |e| short(e, 60)),
            ]
        },
    );
}
