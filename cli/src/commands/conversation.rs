//! `pulse say` and `pulse conversation …`: talk to an agent as if from Discord, and read
//! its conversation.

use clap::{Args, Subcommand};
use pulse_shared::domain::{AgentId, ConversationMessage, Role, SessionId, Signal, SignalMeta};
use pulse_shared::engine::intake;

use super::{AgentRef, Ctx, agent_ref, input, limit};
use crate::Failure;
use crate::output::{short, when};

#[derive(Args, Debug)]
pub(crate) struct SayArgs {
    /// The agent: its id, name or alias.
    #[arg(long)]
    agent: String,
    /// Your name, as the agent sees it.
    #[arg(long, default_value = "you")]
    user: String,
    /// What to say; `-` reads it from standard input.
    text: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConversationCmd {
    /// The latest messages, oldest first.
    Show {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// A validated conversation command.
pub(crate) enum ConversationPlan {
    Say {
        agent: AgentRef,
        user: String,
        text: String,
    },
    Show {
        agent: AgentRef,
        limit: usize,
    },
}

impl ConversationPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Say { .. })
    }
}

pub(crate) fn plan_say(a: SayArgs, now: jiff::Timestamp) -> Result<ConversationPlan, Failure> {
    let agent = agent_ref(&a.agent)?;
    let text = if a.text == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
            Failure::Input(format!("cannot read the message from standard input: {e}"))
        })?;
        text
    } else {
        a.text
    };
    // Validate the text now; the signal itself is made once the agent is read.
    let placeholder = AgentId::generate();
    Signal::user_message(
        &placeholder,
        &SessionId::for_agent(&placeholder),
        &text,
        SignalMeta::default(),
        now,
    )
    .map_err(input)?;
    Ok(ConversationPlan::Say {
        agent,
        user: a.user,
        text,
    })
}

pub(crate) fn plan(cmd: ConversationCmd) -> Result<ConversationPlan, Failure> {
    Ok(match cmd {
        ConversationCmd::Show { agent, limit: n } => ConversationPlan::Show {
            agent: agent_ref(&agent)?,
            limit: limit(n)?,
        },
    })
}

pub(crate) async fn execute(plan: ConversationPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        ConversationPlan::Say { agent, user, text } => {
            let a = agent.find(b).await?;
            let signal = Signal::user_message(
                &a.id,
                &a.session,
                &text,
                SignalMeta {
                    source: Some("cli".into()),
                    user_name: Some(user),
                    ..SignalMeta::default()
                },
                cx.clock.now(),
            )
            .map_err(input)?;
            intake::submit(b.store.as_ref(), b.queue.as_ref(), signal.clone()).await?;
            out.created(
                &signal,
                signal.id.as_str(),
                &format!(
                    "queued for {}; `pulse serve` (or `pulse sweep`) answers it, `pulse conversation show --agent {}` shows the reply",
                    a.name, a.id
                ),
            );
        }
        ConversationPlan::Show { agent, limit } => {
            let agent = agent.find(b).await?.id;
            // A message the model has not answered yet (it waits on the model) is shown,
            // marked waiting.
            let mut messages =
                pulse_shared::engine::history(b.store.as_ref(), &agent, limit).await?;
            messages.reverse();
            // A reply the person reacted to or replied to on Discord is marked seen.
            let turns = match out.json {
                true => Vec::new(),
                false => b.store.list_turns(&agent, limit).await?,
            };
            let seen = |m: &ConversationMessage| match m.source.as_str() {
                "conversation" => turns
                    .iter()
                    .find(|t| t.id == m.turn_id)
                    .and_then(|t| t.seen.as_ref()),
                _ => None,
            };
            out.table(&messages, &["TIME", "WHO", "SOURCE", "TEXT"], |m| {
                let who = match m.role {
                    Role::User => m.author.clone().unwrap_or_else(|| "user".into()),
                    Role::Assistant => m.agent.clone().unwrap_or_else(|| "agent".into()),
                };
                vec![
                    when(Some(m.created_at)),
                    who,
                    match (m.waiting, seen(m)) {
                        (true, _) => format!("{} (waiting on the model)", m.source),
                        (false, Some(s)) => format!("{} (seen: {})", m.source, s.by),
                        (false, None) => m.source.clone(),
                    },
                    short(&m.content, 120),
                ]
            });
        }
    }
    Ok(())
}
