//! `pulse memories …`: what agents remembered.

use super::{AgentRef, Ctx, agent_ref, limit};
use crate::Failure;
use crate::output::{short, when};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum MemoriesCmd {
    /// An agent's latest memories, newest first.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// A validated memories command.
pub(crate) enum MemoriesPlan {
    List { agent: AgentRef, limit: usize },
}

pub(crate) fn plan(cmd: MemoriesCmd) -> Result<MemoriesPlan, Failure> {
    Ok(match cmd {
        MemoriesCmd::List { agent, limit: n } => MemoriesPlan::List {
            agent: agent_ref(&agent)?,
            limit: limit(n)?,
        },
    })
}

pub(crate) async fn execute(plan: MemoriesPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        MemoriesPlan::List { agent, limit } => {
            let agent = agent.find(cx.b).await?.id;
            let memories = cx.b.store.memories(&agent, limit).await?;
            cx.out
                .table(&memories, &["ID", "TIME", "HEARTBEAT", "TEXT"], |m| {
                    vec![
                        m.id.to_string(),
                        when(Some(m.created_at)),
                        m.heartbeat_id
                            .as_ref()
                            .map_or("-".into(), |h| h.beat().to_string()),
                        short(&m.text, 120),
                    ]
                });
        }
    }
    Ok(())
}
