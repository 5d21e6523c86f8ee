//! `pulse heartbeats …`: an agent's heartbeats.

use clap::Subcommand;
use pulse_shared::domain::{AgentId, Heartbeat, HeartbeatId};

use super::{Ctx, agent_id, input, limit, require_agent};
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
    /// One heartbeat's whole story: its window and the events it read, each action (with
    /// the heartbeat agent's thought, tool calls and tokens), the events it created, the
    /// hooks it emitted, and the next heartbeat.
    Show {
        /// The heartbeat's id (hb_…); or give --agent and --beat.
        #[arg(required_unless_present = "beat")]
        id: Option<String>,
        /// The agent's id, with --beat.
        #[arg(long, requires = "beat")]
        agent: Option<String>,
        /// The beat number, with --agent.
        #[arg(long, requires = "agent", conflicts_with = "id")]
        beat: Option<u64>,
    },
}

/// A validated heartbeats command.
pub(crate) enum HeartbeatsPlan {
    List { agent: AgentId, limit: usize },
    Show(HeartbeatId),
}

pub(crate) fn plan(cmd: HeartbeatsCmd) -> Result<HeartbeatsPlan, Failure> {
    Ok(match cmd {
        HeartbeatsCmd::List { agent, limit: n } => HeartbeatsPlan::List {
            agent: agent_id(&agent)?,
            limit: limit(n)?,
        },
        HeartbeatsCmd::Show { id, agent, beat } => HeartbeatsPlan::Show(match (id, agent, beat) {
            (Some(id), _, _) => HeartbeatId::parse(&id).map_err(input)?,
            (None, Some(agent), Some(beat)) => HeartbeatId::new(agent_id(&agent)?, beat),
            _ => {
                return Err(Failure::Input(
                    "give a heartbeat id, or --agent and --beat".into(),
                ));
            }
        }),
    })
}

pub(crate) async fn execute(plan: HeartbeatsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        HeartbeatsPlan::List { agent, limit } => {
            require_agent(cx.b, &agent).await?;
            let hbs = cx.b.store.list_heartbeats(&agent, limit).await?;
            heartbeat_table(cx.out, &hbs);
        }
        HeartbeatsPlan::Show(id) => super::story::show(cx, &id).await?,
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
