//! `pulse events …`: emit an event into an agent's log, and list the log.

use clap::Subcommand;
use pulse_shared::domain::{AgentId, NewEvent};

use super::{Ctx, agent_id, input, json_arg, limit, require_agent};
use crate::Failure;
use crate::output::{short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum EventsCmd {
    /// Append an event to an agent's log; the next heartbeat processes it.
    Emit {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// Event type in SCREAMING_SNAKE_CASE, e.g. NEW_MENTION (what subscriptions match).
        #[arg(long = "type", value_name = "TYPE")]
        event_type: String,
        /// JSON payload.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// 1 (highest) to 10; 5 when left out.
        #[arg(long)]
        priority: Option<i64>,
    },
    /// List an agent's latest events.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// A validated events command.
pub(crate) enum EventsPlan {
    Emit { agent: AgentId, event: NewEvent },
    List { agent: AgentId, limit: usize },
}

impl EventsPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Emit { .. })
    }
}

pub(crate) fn plan(cmd: EventsCmd) -> Result<EventsPlan, Failure> {
    Ok(match cmd {
        EventsCmd::Emit {
            agent,
            event_type,
            payload,
            priority,
        } => EventsPlan::Emit {
            agent: agent_id(&agent)?,
            event: NewEvent::new(
                emit_type(&event_type)?,
                json_arg("payload", &payload)?,
                priority,
            )
            .map_err(input)?,
        },
        EventsCmd::List { agent, limit: n } => EventsPlan::List {
            agent: agent_id(&agent)?,
            limit: limit(n)?,
        },
    })
}

/// The type of an event emitted by hand: SCREAMING_SNAKE_CASE, as subscriptions and the
/// engine's own types are written, so `note` is not stored where `NOTE` was meant.
/// (Webhook senders keep their own spellings; their types are not typed by hand.)
fn emit_type(t: &str) -> Result<&str, Failure> {
    let mut bytes = t.bytes();
    let screaming = bytes.next().is_some_and(|b| b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if screaming {
        return Ok(t);
    }
    let hint: String = t
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    let hint = hint.trim_matches('_');
    let suggestion = if hint.is_empty() || !hint.starts_with(|c: char| c.is_ascii_uppercase()) {
        String::new()
    } else {
        format!(" (did you mean {hint}?)")
    };
    Err(Failure::Input(format!(
        "invalid event type {t:?}: emitted types are SCREAMING_SNAKE_CASE — capital letters, digits and '_', starting with a letter{suggestion}"
    )))
}

pub(crate) async fn execute(plan: EventsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        EventsPlan::Emit { agent, event } => {
            require_agent(b, &agent).await?;
            let event = event.into_event(agent, "cli", cx.clock.now());
            b.store.append(&event).await?;
            out.created(
                &event,
                event.id.as_str(),
                &format!(
                    "emitted {} {}; the next heartbeat processes it",
                    event.event_type, event.id
                ),
            );
        }
        EventsPlan::List { agent, limit } => {
            require_agent(b, &agent).await?;
            let events = b.store.list_events(&agent, limit).await?;
            out.table(
                &events,
                &[
                    "ID", "TYPE", "PRIO", "SOURCE", "CREATED", "PARENT", "PAYLOAD",
                ],
                |e| {
                    let mut source = e.source.clone();
                    if let Some(c) = &e.cascade {
                        source = format!(
                            "{source} (depth {}{})",
                            c.depth,
                            if c.capped { ", capped" } else { "" }
                        );
                    }
                    vec![
                        e.id.to_string(),
                        e.event_type.to_string(),
                        e.priority.to_string(),
                        source,
                        when(Some(e.created_at)),
                        e.parent_id.as_ref().map_or("-".into(), |p| p.to_string()),
                        short(&e.payload.to_string(), 60),
                    ]
                },
            );
        }
    }
    Ok(())
}
