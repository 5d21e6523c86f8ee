//! `pulse actions …`: an agent's tool runs.

use clap::Subcommand;
use pulse_shared::domain::AgentId;

use super::{Ctx, agent_id, limit, require_agent};
use crate::Failure;
use crate::output::short;

#[derive(Subcommand, Debug)]
pub(crate) enum ActionsCmd {
    /// List an agent's latest actions.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// A validated actions command.
pub(crate) enum ActionsPlan {
    List { agent: AgentId, limit: usize },
}

pub(crate) fn plan(cmd: ActionsCmd) -> Result<ActionsPlan, Failure> {
    Ok(match cmd {
        ActionsCmd::List { agent, limit: n } => ActionsPlan::List {
            agent: agent_id(&agent)?,
            limit: limit(n)?,
        },
    })
}

pub(crate) async fn execute(plan: ActionsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        ActionsPlan::List { agent, limit } => {
            require_agent(cx.b, &agent).await?;
            let actions = cx.b.store.list_actions(&agent, limit).await?;
            cx.out.table(
                &actions,
                &[
                    "ID", "TOOL", "EVENT", "BEAT", "STATUS", "TRY", "MS", "ERROR",
                ],
                |a| {
                    vec![
                        a.id.to_string(),
                        a.tool.to_string(),
                        a.event_id.to_string(),
                        a.heartbeat_id.beat().to_string(),
                        format!("{:?}", a.status).to_uppercase(),
                        a.attempt.to_string(),
                        a.duration_ms.map_or("-".into(), |d| d.to_string()),
                        a.error.as_deref().map_or("-".into(), |e| short(e, 80)),
                    ]
                },
            );
        }
    }
    Ok(())
}
