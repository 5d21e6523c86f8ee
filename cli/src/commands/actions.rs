//! `pulse actions …`: an agent's tool runs, listed and shown one at a time.

use clap::Subcommand;
use pulse_shared::domain::{Action, ActionId, ActionStatus, EventCursor, ToolName};
use pulse_shared::engine::actions;

use super::events::Since;
use super::{AgentRef, Ctx, agent_ref, input, limit};
use crate::Failure;
use crate::output::{duration_ms, outln, short, when};

/// How many of the latest actions a filter looks through when no --since bounds it.
const FILTER_WINDOW: usize = 1_000;

#[derive(Subcommand, Debug)]
pub(crate) enum ActionsCmd {
    /// List an agent's latest actions, newest first, filtered. Without --since, a filter
    /// looks through the latest 1,000 actions.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// Only these tools (comma-separated).
        #[arg(long, value_name = "TOOL,...", value_delimiter = ',')]
        tool: Vec<String>,
        /// Only these statuses (comma-separated): RUNNING, COMPLETED, FAILED, CANCELLED.
        #[arg(long, value_name = "STATUS,...", value_delimiter = ',')]
        status: Vec<String>,
        /// Only actions on events created since then: a duration back from now (10m,
        /// 2h) or a time (2026-11-23T09:00:00Z).
        #[arg(long, value_name = "10m|TIMESTAMP")]
        since: Option<String>,
        /// How many: the newest that match.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Run a finished action again, as the next attempt of the same action id: its tool
    /// is called with the request it was given; the events it returns are read by the
    /// agent's next heartbeat.
    Retry {
        /// The action's id (act_…).
        id: String,
        /// The agent (its id, name or alias), to look in its actions only.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Settle an UNKNOWN action (its request went out and no answer came back) as the
    /// tool's own records show it: done, or not done.
    Resolve {
        /// The action's id (act_…).
        id: String,
        /// What happened: succeeded or failed.
        #[arg(long = "as", value_name = "succeeded|failed")]
        outcome: String,
        /// The agent (its id, name or alias), to look in its actions only.
        #[arg(long)]
        agent: Option<String>,
    },
    /// One action: its request, response, timing, attempts and the events it made.
    Show {
        /// The action's id (act_…).
        id: String,
        /// The agent (its id, name or alias), to look in its actions only; without it
        /// every agent's are searched (each agent's newest 1,000 on AWS: give it on a
        /// large deployment).
        #[arg(long)]
        agent: Option<String>,
    },
}

/// A validated actions command.
pub(crate) enum ActionsPlan {
    List(Box<Listing>),
    Show {
        agent: Option<AgentRef>,
        id: ActionId,
    },
    Retry {
        agent: Option<AgentRef>,
        id: ActionId,
    },
    Resolve {
        agent: Option<AgentRef>,
        id: ActionId,
        succeeded: bool,
    },
}

/// Which actions to list.
pub(crate) struct Listing {
    agent: AgentRef,
    tools: Vec<ToolName>,
    statuses: Vec<ActionStatus>,
    since: Option<Since>,
    limit: usize,
}

impl Listing {
    fn matches(&self, a: &Action) -> bool {
        (self.tools.is_empty() || self.tools.contains(&a.tool))
            && (self.statuses.is_empty() || self.statuses.contains(&a.status))
    }
}

fn status_arg(s: &str) -> Result<ActionStatus, Failure> {
    ActionStatus::parse(s).ok_or_else(|| {
        Failure::Input(format!(
            "invalid --status {s:?}: use RUNNING, COMPLETED, FAILED, CANCELLED, SKIPPED or UNKNOWN"
        ))
    })
}

pub(crate) fn plan(cmd: ActionsCmd) -> Result<ActionsPlan, Failure> {
    Ok(match cmd {
        ActionsCmd::List {
            agent,
            tool,
            status,
            since,
            limit: n,
        } => ActionsPlan::List(Box::new(Listing {
            agent: agent_ref(&agent)?,
            tools: tool
                .iter()
                .map(|t| ToolName::parse(t.trim()))
                .collect::<Result<_, _>>()
                .map_err(input)?,
            statuses: status
                .iter()
                .map(|s| status_arg(s))
                .collect::<Result<_, _>>()?,
            since: since.as_deref().map(Since::parse).transpose()?,
            limit: limit(n)?,
        })),
        ActionsCmd::Retry { id, agent } => ActionsPlan::Retry {
            agent: agent.as_deref().map(agent_ref).transpose()?,
            id: ActionId::parse(&id).map_err(input)?,
        },
        ActionsCmd::Resolve { id, outcome, agent } => ActionsPlan::Resolve {
            agent: agent.as_deref().map(agent_ref).transpose()?,
            id: ActionId::parse(&id).map_err(input)?,
            succeeded: match outcome.trim().to_ascii_lowercase().as_str() {
                "succeeded" | "completed" | "done" => true,
                "failed" | "not-done" => false,
                other => {
                    return Err(Failure::Input(format!(
                        "--as {other:?}: say succeeded (the tool did its work) or failed (it did not)"
                    )));
                }
            },
        },
        ActionsCmd::Show { id, agent } => ActionsPlan::Show {
            agent: agent.as_deref().map(agent_ref).transpose()?,
            id: ActionId::parse(&id).map_err(input)?,
        },
    })
}

pub(crate) async fn execute(plan: ActionsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        ActionsPlan::List(l) => {
            let agent = l.agent.find(cx.b).await?.id;
            let actions = list(cx, &agent, &l).await?;
            cx.out.table(
                &actions,
                &[
                    "ID", "TOOL", "EVENT", "BEAT", "STATUS", "TRY", "TOOK", "ERROR",
                ],
                |a| {
                    vec![
                        a.id.to_string(),
                        a.label(),
                        a.event_id.to_string(),
                        a.heartbeat_id.beat().to_string(),
                        a.status.as_str().to_owned(),
                        a.attempt.to_string(),
                        a.duration_ms.map_or("-".into(), duration_ms),
                        a.error.as_deref().map_or("-".into(), |e| short(e, 80)),
                    ]
                },
            );
        }
        ActionsPlan::Show { agent, id } => {
            let action = find(cx, agent.as_ref(), &id).await?;
            show(cx, &action);
        }
        ActionsPlan::Resolve {
            agent,
            id,
            succeeded,
        } => resolve(cx, agent.as_ref(), &id, succeeded).await?,
        ActionsPlan::Retry { agent, id } => {
            let found = find(cx, agent.as_ref(), &id).await?;
            let services = pulse_shared::app::Services::from_config(cx.config);
            let memories = cx.b.memories(&services);
            let agent_tools = cx.b.agent_tools(cx.clock.clone(), &services);
            let tools = cx.b.tools(
                cx.clock.clone(),
                &cx.config.engine,
                &services,
                memories,
                agent_tools,
            );
            let runner = cx.b.runner(cx.clock.clone(), &cx.config.engine, tools);
            let done = runner
                .retry_action(&found.agent_id, &id)
                .await
                .map_err(|e| match e {
                    pulse_shared::engine::RetryError::Invalid(v) => input(v),
                    pulse_shared::engine::RetryError::Failed(e) => Failure::Runtime(e.into()),
                })?;
            if cx.out.json {
                cx.out.json_value(&done);
            } else {
                let how = match &done.error {
                    Some(e) => format!("{}: {e}", done.status.as_str()),
                    None => format!(
                        "{}, {} new events",
                        done.status.as_str(),
                        done.new_events.len()
                    ),
                };
                cx.out.done(&format!(
                    "action {id} ran again as attempt {}: {how}",
                    done.attempt
                ));
            }
        }
    }
    Ok(())
}

/// `actions resolve`.
async fn resolve(
    cx: &Ctx<'_>,
    agent: Option<&AgentRef>,
    id: &ActionId,
    succeeded: bool,
) -> Result<(), Failure> {
    let found = find(cx, agent, id).await?;
    let settled = pulse_shared::engine::actions::settle(
        cx.b.store.as_ref(),
        &found,
        succeeded,
        cx.clock.now(),
    )
    .await
    .map_err(|e| match e {
        pulse_shared::engine::actions::SettleError::NotUnknown(why) => Failure::Input(why),
        pulse_shared::engine::actions::SettleError::Store(e) => super::store(e),
    })?;
    cx.out.created(
        &settled,
        settled.id.as_str(),
        &format!("action {id} settled as {}", settled.status.as_str()),
    );
    Ok(())
}

/// The action `id`: among `agent`'s actions, or every agent's.
pub(crate) async fn find(
    cx: &Ctx<'_>,
    agent: Option<&AgentRef>,
    id: &ActionId,
) -> Result<Action, Failure> {
    let store = cx.b.store.as_ref();
    let agents = match agent {
        Some(a) => vec![a.find(cx.b).await?],
        None => store.list_agents().await?,
    };
    for a in &agents {
        if let Some(action) = actions::find(store, &a.id, id).await? {
            return Ok(action);
        }
    }
    Err(Failure::Input(match agent {
        Some(_) => format!(
            "action {id} not found for agent {}; `pulse actions list --agent {}` shows its actions",
            agents[0].id, agents[0].id
        ),
        None => format!(
            "action {id} not found for any agent; `pulse actions list --agent AGENT` shows an agent's actions"
        ),
    }))
}

/// The newest `limit` actions that match: those on events since `since`, or among the
/// latest [`FILTER_WINDOW`].
async fn list(
    cx: &Ctx<'_>,
    agent: &pulse_shared::domain::AgentId,
    l: &Listing,
) -> Result<Vec<Action>, Failure> {
    let store = &cx.b.store;
    let filtered = !l.tools.is_empty() || !l.statuses.is_empty();
    let mut actions = match &l.since {
        Some(since) => {
            let now = cx.clock.now();
            let mut a = actions::between(
                store.as_ref(),
                agent,
                &since.cursor(now),
                &EventCursor::through(now),
                10_000,
            )
            .await?;
            a.reverse();
            a
        }
        None => {
            let n = if filtered { FILTER_WINDOW } else { l.limit };
            actions::recent(store.as_ref(), agent, n).await?
        }
    };
    actions.retain(|a| l.matches(a));
    actions.truncate(l.limit);
    Ok(actions)
}

fn show(cx: &Ctx<'_>, a: &Action) {
    if cx.out.json {
        cx.out.json_value(a);
        return;
    }
    let field = |k: &str, v: String| outln!("{k:<12}{v}");
    field("id", a.id.to_string());
    field("tool", a.label());
    match &a.call {
        // A model's MCP call: its own id stands in the event's place.
        Some(call) => {
            if let Some(e) = &call.event_id {
                field("event", e.to_string());
            }
            if let Some(t) = &call.turn_id {
                field("turn", t.to_string());
            }
            field("key", call.key.clone());
        }
        None => field("event", a.event_id.to_string()),
    }
    if a.heartbeat_id.beat() > 0 {
        field(
            "heartbeat",
            format!("{} (beat {})", a.heartbeat_id, a.heartbeat_id.beat()),
        );
    }
    field("status", a.status.as_str().to_owned());
    field("attempts", a.attempt.to_string());
    field("depth", a.depth.to_string());
    field("started", when(Some(a.started_at)));
    field("completed", when(a.completed_at));
    field("took", a.duration_ms.map_or("-".into(), duration_ms));
    if let Some(e) = &a.error {
        field("error", e.clone());
    }
    if !a.new_events.is_empty() {
        let ids: Vec<String> = a.new_events.iter().map(|e| e.to_string()).collect();
        field("made events", ids.join(", "));
    }
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    outln!("\nrequest:\n{}", pretty(&a.request));
    match &a.response {
        Some(r) => outln!("\nresponse:\n{}", pretty(r)),
        None => outln!("\nresponse: -"),
    }
}
