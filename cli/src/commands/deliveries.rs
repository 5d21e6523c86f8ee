//! `pulse deliveries`: the replies the channel did not take — those tried again later
//! while their session goes on, and those given up on (dead letters).

use clap::Subcommand;
use pulse_shared::domain::Undelivered;

use super::{AgentRef, Ctx, agent_ref, limit};
use crate::Failure;
use crate::output::{short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum DeliveriesCmd {
    /// List the replies Discord did not take: those still tried again (soonest due
    /// first), then those given up on after their tries (newest first). Each reply is
    /// in its agent's conversation all along (`pulse conversation show`, the dashboard).
    List {
        /// Only those given up on (a MESSAGE_UNDELIVERABLE hook told each).
        #[arg(long)]
        undeliverable: bool,
        /// Only this agent's: its id, name or alias.
        #[arg(long)]
        agent: Option<String>,
        /// List at most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

/// A validated `pulse deliveries` command.
pub(crate) enum DeliveriesPlan {
    List {
        undeliverable: bool,
        agent: Option<AgentRef>,
        limit: usize,
    },
}

pub(crate) fn plan(c: DeliveriesCmd) -> Result<DeliveriesPlan, Failure> {
    match c {
        DeliveriesCmd::List {
            undeliverable,
            agent,
            limit: n,
        } => Ok(DeliveriesPlan::List {
            undeliverable,
            agent: agent.as_deref().map(agent_ref).transpose()?,
            limit: limit(n)?,
        }),
    }
}

pub(crate) async fn execute(plan: DeliveriesPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        DeliveriesPlan::List {
            undeliverable,
            agent,
            limit,
        } => {
            let agent = match agent {
                Some(a) => Some(a.find(cx.b).await?.id),
                None => None,
            };
            // Read all that are kept (there are some only while a channel refuses
            // replies, and the dead letters), then filter.
            let rows: Vec<Undelivered> =
                cx.b.store
                    .list_undelivered(usize::MAX)
                    .await?
                    .into_iter()
                    .filter(|u| !undeliverable || u.undeliverable())
                    .filter(|u| agent.as_ref().is_none_or(|a| *a == u.agent_id))
                    .take(limit)
                    .collect();
            cx.out.table(
                &rows,
                &[
                    "TURN", "AGENT", "STATE", "TRIES", "SINCE", "NEXT TRY", "REASON",
                ],
                |u| {
                    vec![
                        u.turn_id.to_string(),
                        u.agent_id.to_string(),
                        u.state.as_str().to_owned(),
                        u.attempts.to_string(),
                        when(Some(u.since)),
                        match u.undeliverable() {
                            true => "-".to_owned(),
                            false => when(Some(u.next_at)),
                        },
                        short(&u.reason, 80),
                    ]
                },
            );
            Ok(())
        }
    }
}
