//! `pulse subscriptions …`: route event types to tools, and remove routes.

use clap::Subcommand;
use pulse_shared::domain::{
    EventType, Filter, Subscription, SubscriptionId, ToolName, builtin_tools,
};
use pulse_shared::engine::switch_subscription;

use super::{AgentRef, Ctx, agent_ref, input, store, yes_no};
use crate::Failure;

#[derive(Subcommand, Debug)]
pub(crate) enum SubscriptionsCmd {
    /// Route an event type to a tool.
    Add {
        /// The tool's name.
        #[arg(long)]
        tool: String,
        /// The event type.
        #[arg(long)]
        event: String,
        /// Lower runs first among the tools of one event.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        order: i32,
        /// JSON filter: {"min_priority": N, "topics": [..], "payload": {"path": value}}.
        #[arg(long)]
        filter: Option<String>,
        /// Only this agent's events (all agents when left out).
        #[arg(long)]
        agent: Option<String>,
    },
    /// List subscriptions.
    List,
    /// Let a subscription fire again.
    Enable {
        /// The subscription's id.
        id: String,
    },
    /// Stop a subscription from firing.
    Disable {
        /// The subscription's id.
        id: String,
    },
    /// Remove a subscription.
    Remove {
        /// The subscription's id.
        id: String,
    },
}

/// A validated subscriptions command.
pub(crate) enum SubscriptionsPlan {
    Add(Option<AgentRef>, Box<Subscription>),
    List,
    Set { id: SubscriptionId, active: bool },
    Remove(SubscriptionId),
}

impl SubscriptionsPlan {
    pub(crate) fn writes(&self) -> bool {
        !matches!(self, Self::List)
    }
}

pub(crate) fn plan(
    cmd: SubscriptionsCmd,
    now: jiff::Timestamp,
) -> Result<SubscriptionsPlan, Failure> {
    Ok(match cmd {
        SubscriptionsCmd::Add {
            tool,
            event,
            order,
            filter,
            agent,
        } => {
            let tool = ToolName::parse(&tool).map_err(input)?;
            let event_type = EventType::parse(&event).map_err(input)?;
            let agent = agent.as_deref().map(agent_ref).transpose()?;
            let filter = filter
                .as_deref()
                .map(Filter::parse)
                .transpose()
                .map_err(input)?
                .unwrap_or_default();
            // Its id names the agent, so it is made once the agent is found.
            SubscriptionsPlan::Add(
                agent,
                Box::new(Subscription {
                    id: SubscriptionId::for_route(&tool, &event_type, None),
                    tool,
                    event_type,
                    agent_id: None,
                    filter,
                    order,
                    active: true,
                    created_at: now,
                }),
            )
        }
        SubscriptionsCmd::List => SubscriptionsPlan::List,
        SubscriptionsCmd::Enable { id } => SubscriptionsPlan::Set {
            id: SubscriptionId::parse(&id).map_err(input)?,
            active: true,
        },
        SubscriptionsCmd::Disable { id } => SubscriptionsPlan::Set {
            id: SubscriptionId::parse(&id).map_err(input)?,
            active: false,
        },
        SubscriptionsCmd::Remove { id } => {
            let id = SubscriptionId::parse(&id).map_err(input)?;
            if id == Subscription::heartbeat_agent().id {
                return Err(Failure::Input(format!(
                    "{id} is the built-in heartbeat agent's subscription: disable it instead (`pulse subscriptions disable {id}`)"
                )));
            }
            SubscriptionsPlan::Remove(id)
        }
    })
}

pub(crate) async fn execute(plan: SubscriptionsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        SubscriptionsPlan::Add(agent, mut sub) => {
            if let Some(agent) = agent {
                let agent = agent.find(b).await?.id;
                sub.id = SubscriptionId::for_route(&sub.tool, &sub.event_type, Some(&agent));
                sub.agent_id = Some(agent);
            }
            let registry = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools());
            if !registry.tools.iter().any(|t| t.name == sub.tool) {
                return Err(Failure::Input(format!(
                    "tool {} is not registered; add it first with `pulse tools add`",
                    sub.tool
                )));
            }
            b.store.add_subscription(&sub).await.map_err(store)?;
            out.created(
                &sub,
                sub.id.as_str(),
                &format!("subscribed {} to {} ({})", sub.tool, sub.event_type, sub.id),
            );
        }
        SubscriptionsPlan::List => {
            let mut subs = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools())
                .subscriptions;
            subs.sort_by(|a, b| {
                (&a.event_type, a.order, &a.tool).cmp(&(&b.event_type, b.order, &b.tool))
            });
            out.table(
                &subs,
                &["ID", "EVENT", "TOOL", "ORDER", "ACTIVE", "AGENT", "FILTER"],
                |s| {
                    vec![
                        s.id.to_string(),
                        s.event_type.to_string(),
                        s.tool.to_string(),
                        s.order.to_string(),
                        yes_no(s.active),
                        s.agent_id.as_ref().map_or("all".into(), |a| a.to_string()),
                        serde_json::to_string(&s.filter).unwrap_or_default(),
                    ]
                },
            );
        }
        SubscriptionsPlan::Set { id, active } => {
            switch_subscription(b.store.as_ref(), &id, active)
                .await
                .map_err(store)?;
            out.done(&format!(
                "subscription {id} {}",
                if active { "enabled" } else { "disabled" }
            ));
        }
        SubscriptionsPlan::Remove(id) => {
            b.store.remove_subscription(&id).await.map_err(store)?;
            out.done(&format!("removed subscription {id}"));
        }
    }
    Ok(())
}
