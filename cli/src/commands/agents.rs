//! `pulse agents …`: create, list and show agents.

use clap::{Args, Subcommand};
use pulse_shared::domain::{
    ActiveHours, AgentId, AgentLlm, Budgets, Interval, NewAgent, ProviderKind, TimeZoneName,
};

use super::heartbeats::heartbeat_table;
use super::{Ctx, agent_id, input, require_agent, store};
use crate::Failure;
use crate::output::{outln, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum AgentsCmd {
    /// Create an agent; its first heartbeat is due at once.
    Create(Box<CreateAgent>),
    /// List agents.
    List,
    /// Show one agent and its latest heartbeat.
    Show {
        /// The agent's id.
        id: String,
    },
}

#[derive(Args, Debug)]
pub(crate) struct CreateAgent {
    /// Display name.
    #[arg(long)]
    name: String,
    /// Time between heartbeats (2s, 15m, 1h).
    #[arg(long, default_value = "15m")]
    interval: String,
    /// Hours in which heartbeats may run, HH:MM-HH:MM (wrapping midnight is fine).
    #[arg(long, value_name = "HH:MM-HH:MM")]
    active_hours: Option<String>,
    /// IANA time zone of the active hours.
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// What to look at on waking, like a HEARTBEAT.md.
    #[arg(long)]
    instructions: Option<String>,
    /// Persona (system prompt).
    #[arg(long)]
    persona: Option<String>,
    /// Short handle.
    #[arg(long)]
    alias: Option<String>,
    /// LLM provider for this agent: anthropic, openai or offline (default: the configured one).
    #[arg(long, value_name = "PROVIDER")]
    llm_provider: Option<String>,
    /// Model for this agent.
    #[arg(long, value_name = "MODEL")]
    llm_model: Option<String>,
    /// API base URL for this agent (an OpenAI-compatible server, a proxy). The
    /// deployment's key is sent there only if the URL is listed in PULSE_LLM_BASE_URLS;
    /// otherwise give the agent its own key with --llm-api-key-env.
    #[arg(long, value_name = "URL")]
    llm_base_url: Option<String>,
    /// The variable holding this agent's own API key, named PULSE_LLM_KEY_<NAME> (set it
    /// where Pulse runs; in AWS, under the secrets path). Only the name is stored.
    #[arg(long, value_name = "VAR")]
    llm_api_key_env: Option<String>,
    /// Most LLM calls per heartbeat.
    #[arg(long, default_value_t = 8)]
    max_steps: u32,
    /// Most tokens per heartbeat.
    #[arg(long, default_value_t = 50_000)]
    max_tokens: u64,
    /// How long after a user turn the next heartbeat waits (default: half the interval).
    #[arg(long, value_name = "DURATION")]
    quiet_period: Option<String>,
    /// The Discord channel the agent speaks in when no interaction is open.
    #[arg(long, value_name = "CHANNEL_ID")]
    discord_channel: Option<String>,
}

/// A validated agents command.
pub(crate) enum AgentsPlan {
    Create(Box<NewAgent>),
    List,
    Show(AgentId),
}

impl AgentsPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Create(_))
    }
}

pub(crate) fn plan(cmd: AgentsCmd, now: jiff::Timestamp) -> Result<AgentsPlan, Failure> {
    Ok(match cmd {
        AgentsCmd::Create(a) => AgentsPlan::Create(Box::new(new_agent(*a, now)?)),
        AgentsCmd::List => AgentsPlan::List,
        AgentsCmd::Show { id } => AgentsPlan::Show(agent_id(&id)?),
    })
}

fn new_agent(a: CreateAgent, now: jiff::Timestamp) -> Result<NewAgent, Failure> {
    let mut new = NewAgent::named(a.name);
    new.interval = a.interval.parse::<Interval>().map_err(input)?;
    new.active_hours = a
        .active_hours
        .as_deref()
        .map(str::parse::<ActiveHours>)
        .transpose()
        .map_err(input)?;
    new.timezone = TimeZoneName::parse(&a.timezone).map_err(input)?;
    new.instructions = a.instructions;
    new.persona = a.persona;
    new.alias = a.alias;
    new.llm = AgentLlm {
        provider: a
            .llm_provider
            .as_deref()
            .map(ProviderKind::parse)
            .transpose()
            .map_err(input)?,
        model: a.llm_model.filter(|m| !m.trim().is_empty()),
        base_url: a
            .llm_base_url
            .as_deref()
            .map(|u| {
                url::Url::parse(u)
                    .map_err(|e| Failure::Input(format!("invalid LLM base URL {u:?}: {e}")))
            })
            .transpose()?,
        api_key_env: a.llm_api_key_env.map(|v| v.trim().to_owned()),
    };
    new.budgets = Budgets {
        max_steps: a.max_steps,
        max_tokens: a.max_tokens,
    };
    new.quiet_period = a
        .quiet_period
        .as_deref()
        .map(str::parse::<Interval>)
        .transpose()
        .map_err(input)?;
    new.discord_channel = a.discord_channel;
    // Validate the name now, so a bad one is reported before anything is opened.
    new.clone().create(now).map_err(input)?;
    Ok(new)
}

pub(crate) async fn execute(plan: AgentsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        AgentsPlan::Create(new) => {
            let (agent, first) = new.create(cx.clock.now()).map_err(input)?;
            b.store.create_agent(&agent, &first).await.map_err(store)?;
            out.created(
                &agent,
                agent.id.as_str(),
                &format!(
                    "created agent {} ({}); its first heartbeat is due now",
                    agent.name, agent.id
                ),
            );
        }
        AgentsPlan::List => {
            let agents = b.store.list_agents().await?;
            out.table(
                &agents,
                &["ID", "NAME", "INTERVAL", "ACTIVE HOURS", "TZ", "CREATED"],
                |a| {
                    vec![
                        a.id.to_string(),
                        a.name.clone(),
                        a.interval.to_string(),
                        a.active_hours.map_or("always".into(), |h| h.to_string()),
                        a.timezone.to_string(),
                        when(Some(a.created_at)),
                    ]
                },
            );
        }
        AgentsPlan::Show(id) => {
            let agent = require_agent(b, &id).await?;
            let recent = b.store.list_heartbeats(&id, 5).await?;
            if out.json {
                out.json_value(&serde_json::json!({ "agent": agent, "heartbeats": recent }));
                return Ok(());
            }
            let field = |k: &str, v: String| outln!("{k:<18}{v}");
            field("id", agent.id.to_string());
            field("name", agent.name.clone());
            if let Some(a) = &agent.alias {
                field("alias", a.clone());
            }
            field("interval", agent.interval.to_string());
            field(
                "active hours",
                agent
                    .active_hours
                    .map_or("always".into(), |h| h.to_string()),
            );
            field("time zone", agent.timezone.to_string());
            field("session", agent.session.to_string());
            field("created", when(Some(agent.created_at)));
            field("last interaction", when(agent.last_interaction_at));
            if let Some(i) = &agent.instructions {
                field("instructions", short(i, 200));
            }
            if let Some(p) = &agent.persona {
                field("persona", short(p, 200));
            }
            outln!();
            heartbeat_table(out, &recent);
        }
    }
    Ok(())
}
