//! `pulse agents …`: create, list, show, update, pause, resume, snooze and delete agents.

mod lifecycle;

pub(crate) use lifecycle::lifecycle_failure;

use clap::{Args, Subcommand};
use pulse_shared::domain::{
    ActiveHours, Agent, AgentChanges, AgentLlm, AgentTool, AutoPause, Budgets, ChannelKind,
    ChatAccess, DiscordAccess, DiscordListen, Expectation, Interval, Must, NewAgent, ProviderKind,
    Retention, ThinkPolicy, TimeZoneName,
};
use pulse_shared::engine::budget;

use super::heartbeats::heartbeat_table;
use super::{AgentRef, Ctx, agent_ref, input, store};
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
        /// The agent: its id, name or alias.
        id: String,
    },
    /// Change an agent's settings (validated as on create). A new interval, active hours
    /// or time zone re-plans its pending heartbeat at once.
    Update(Box<UpdateAgent>),
    /// Pause an agent: its heartbeats stop (one already running finishes) until
    /// `resume`. Its user's messages are still answered.
    Pause {
        /// The agent: its id, name or alias.
        id: String,
    },
    /// Resume a paused or snoozed agent: its next heartbeat is due at once.
    Resume {
        /// The agent: its id, name or alias.
        id: String,
    },
    /// Snooze an agent: no heartbeats of its own until the time shown (its reminders
    /// still fire); `resume` ends it sooner.
    Snooze {
        /// The agent: its id, name or alias.
        id: String,
        /// How long: a minute to 30 days (e.g. 2h, 1d).
        length: String,
    },
    /// Delete an agent and everything that is its own: heartbeats, events, actions,
    /// conversation, memories, webhooks (their URLs then answer 404), hooks and their
    /// deliveries, its subscriptions and channel binding. Without --yes, says what would
    /// be deleted and exits 2.
    Delete {
        /// The agent: its id, name or alias.
        id: String,
        /// Delete it; without this nothing is deleted.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args, Debug)]
pub(crate) struct UpdateAgent {
    /// The agent: its id, name or alias.
    id: String,
    /// Display name.
    #[arg(long)]
    name: Option<String>,
    /// Time between heartbeats (2s, 15m, 1h).
    #[arg(long)]
    interval: Option<String>,
    /// Hours in which heartbeats may run, HH:MM-HH:MM; `always` removes them.
    #[arg(long, value_name = "HH:MM-HH:MM")]
    active_hours: Option<String>,
    /// IANA time zone of the active hours.
    #[arg(long)]
    timezone: Option<String>,
    /// What to do on waking; "" removes them. Tasks with cadences are headings such
    /// as `## Inbox (every 4h)`, `(cron 0 8 * * MON-FRI)`, `(on ci.failed)` or
    /// `(when silent 2d)`; under --think auto a beat with nothing new and no task due
    /// makes no model call.
    #[arg(long, conflicts_with = "instructions_file")]
    instructions: Option<String>,
    /// Read the instructions from this file (e.g. HEARTBEAT.md): read again each time it
    /// is given, so an edited file is taken up by `agents update --instructions-file`.
    #[arg(long, value_name = "FILE")]
    instructions_file: Option<std::path::PathBuf>,
    /// Persona (the system prompt's first part, at most 16,000 characters); "" removes it.
    #[arg(long)]
    persona: Option<String>,
    /// LLM provider: anthropic, openai or offline; "" goes back to the configured one.
    #[arg(long, value_name = "PROVIDER")]
    llm_provider: Option<String>,
    /// Model; "" goes back to the configured one.
    #[arg(long, value_name = "MODEL")]
    llm_model: Option<String>,
    /// The model its heartbeats think with (the same provider): a cheaper one for beats,
    /// the chat model for the person; "" goes back to the chat model.
    #[arg(long, value_name = "MODEL")]
    heartbeat_model: Option<String>,
    /// API base URL; "" goes back to the configured one.
    #[arg(long, value_name = "URL")]
    llm_base_url: Option<String>,
    /// Send the images users send to the model: on, off, or auto (on for models known
    /// to accept images).
    #[arg(long, value_name = "on|off|auto")]
    vision: Option<String>,
    /// Most LLM calls per heartbeat.
    #[arg(long)]
    max_steps: Option<u32>,
    /// Most tokens per heartbeat.
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Most model tokens a day (heartbeats and turns, from midnight in its time zone);
    /// `off` removes the budget.
    #[arg(long, value_name = "N|off")]
    daily_tokens: Option<String>,
    /// Most US dollars a day of model calls (at the price table's prices); `off`
    /// removes the budget.
    #[arg(long, value_name = "USD|off")]
    budget_usd_day: Option<String>,
    /// Most US dollars a calendar month of model calls; `off` removes the budget.
    #[arg(long, value_name = "USD|off")]
    budget_usd_month: Option<String>,
    /// Most model calls in a minute, heartbeats and turns together; `off` removes the
    /// limit.
    #[arg(long, value_name = "N|off")]
    max_calls_per_minute: Option<String>,
    /// The breaker: most heartbeats that start in an hour before the agent is paused;
    /// `default` goes back to 60 (or twice what the interval plans, if more).
    #[arg(long, value_name = "N|default")]
    max_beats_per_hour: Option<String>,
    /// How long after a user turn the next heartbeat waits; "" goes back to half the
    /// interval.
    #[arg(long, value_name = "DURATION")]
    quiet_period: Option<String>,
    /// How long the agent's memories take to fade to half their weight (counted in its
    /// beats); "" goes back to 30d.
    #[arg(long, value_name = "DURATION")]
    memory_half_life: Option<String>,
    /// How long a tool call parked for approval waits for a decision before it expires
    /// (1m to 30d); "" goes back to 1d.
    #[arg(long, value_name = "DURATION")]
    approval_expiry: Option<String>,
    /// The Discord channel the agent speaks in; "" unbinds it.
    #[arg(long, value_name = "CHANNEL_ID")]
    discord_channel: Option<String>,
    /// The Discord users whose direct messages it answers (user ids, comma-separated;
    /// the list replaces the old one, "" for nobody).
    #[arg(long, value_name = "ID,...")]
    discord_users: Option<String>,
    /// When it answers in its channel over the gateway: mentions (when mentioned) or all.
    #[arg(long, value_name = "mentions|all")]
    discord_listen: Option<String>,
    /// The Telegram chat it speaks in first (a group's id, negative); "" unbinds it.
    #[arg(long, value_name = "CHAT_ID", allow_hyphen_values = true)]
    telegram_chat: Option<String>,
    /// The Telegram users who may talk to it privately and steer it (user ids,
    /// comma-separated; the list replaces the old one, "" for nobody).
    #[arg(long, value_name = "ID,...")]
    telegram_users: Option<String>,
    /// When it answers in its Telegram group: mentions (a mention of the bot, a command,
    /// a reply to it) or all.
    #[arg(long, value_name = "mentions|all")]
    telegram_listen: Option<String>,
    /// The Slack channel it speaks in first (its id, `C…`); "" unbinds it.
    #[arg(long, value_name = "CHANNEL_ID")]
    slack_channel: Option<String>,
    /// The Slack users who may talk to it in direct messages and steer it (member ids,
    /// `U…`, comma-separated; the list replaces the old one, "" for nobody).
    #[arg(long, value_name = "ID,...")]
    slack_users: Option<String>,
    /// When it answers in its Slack channel: mentions (of the app) or all.
    #[arg(long, value_name = "mentions|all")]
    slack_listen: Option<String>,
    /// When the heartbeat agent calls the model: auto, events, always or every:N.
    #[arg(long, value_name = "POLICY")]
    think: Option<String>,
    /// What each heartbeat must do: speak, act, or none. One that does not ends
    /// `incomplete`.
    #[arg(long, value_name = "speak|act|none")]
    expect: Option<String>,
    /// Incomplete heartbeats in a row before the HEARTBEAT_INCOMPLETE hook fires (1 to 100).
    #[arg(long, value_name = "N")]
    alert_after: Option<u32>,
    /// How long its finished heartbeats, processed events, actions, conversation turns,
    /// hook deliveries and webhook request logs are kept (1d to 3650d); "" goes back to
    /// PULSE_RETENTION.
    #[arg(long, value_name = "DURATION")]
    retention: Option<String>,
    /// After how long a silence from its user it stops beating on its own (1d to 366d,
    /// or off; its reminders still fire, the user's next message brings it back); ""
    /// goes back to 30d.
    #[arg(long, value_name = "DURATION|off")]
    auto_pause_after: Option<String>,
    /// The MCP servers whose tools it may call, in heartbeats and chat turns
    /// (mcp:NAME,...; replaces the list; "" detaches them all).
    #[arg(long, value_name = "mcp:NAME,...")]
    tools: Option<String>,
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
    /// What to do on waking, like a HEARTBEAT.md. Tasks with cadences are headings such
    /// as `## Inbox (every 4h)`, `(cron 0 8 * * MON-FRI)`, `(on ci.failed)` or
    /// `(when silent 2d)`; under --think auto a beat with nothing new and no task due
    /// makes no model call. Text without tasks is one task, due every beat.
    #[arg(long, conflicts_with = "instructions_file")]
    instructions: Option<String>,
    /// Read the instructions from this file (e.g. HEARTBEAT.md).
    #[arg(long, value_name = "FILE")]
    instructions_file: Option<std::path::PathBuf>,
    /// Persona (the system prompt's first part, at most 16,000 characters).
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
    /// The model its heartbeats think with (the same provider), when not --llm-model:
    /// a cheaper one for beats, the chat model for the person.
    #[arg(long, value_name = "MODEL")]
    heartbeat_model: Option<String>,
    /// API base URL for this agent (an OpenAI-compatible server, a proxy). The
    /// deployment's key is sent there only if the URL is listed in PULSE_LLM_BASE_URLS;
    /// otherwise give the agent its own key with --llm-api-key-env.
    #[arg(long, value_name = "URL")]
    llm_base_url: Option<String>,
    /// The variable holding this agent's own API key, named PULSE_LLM_KEY_<NAME> (set it
    /// where Pulse runs; in AWS, under the secrets path). Only the name is stored.
    #[arg(long, value_name = "VAR")]
    llm_api_key_env: Option<String>,
    /// Send the images users send to the model: on, off, or auto (on for models known
    /// to accept images; others read `[image: URL]`).
    #[arg(long, value_name = "on|off|auto", default_value = "auto")]
    vision: String,
    /// Most LLM calls per heartbeat.
    #[arg(long, default_value_t = 8)]
    max_steps: u32,
    /// Most tokens per heartbeat.
    #[arg(long, default_value_t = 50_000)]
    max_tokens: u64,
    /// Most model tokens a day, heartbeats and conversation turns together, counted from
    /// midnight in its time zone. Once spent, heartbeats do not think, a user message
    /// gets one short notice a day, and BUDGET_EXHAUSTED fires once (default: no budget).
    #[arg(long, value_name = "N")]
    daily_tokens: Option<u64>,
    /// Most US dollars a day of model calls, heartbeats and turns together, at the price
    /// table's prices (`PULSE_PRICES`), from midnight in its time zone. Each call holds
    /// its worst case (the prompt, and all of its `max_tokens` written) before it is
    /// made; one that does not fit is not made (default: no budget).
    #[arg(long, value_name = "USD")]
    budget_usd_day: Option<String>,
    /// Most US dollars a calendar month of model calls, in its time zone; as
    /// `--budget-usd-day`.
    #[arg(long, value_name = "USD")]
    budget_usd_month: Option<String>,
    /// Most model calls in a minute, heartbeats and turns together, counted in the
    /// store: past it a heartbeat yields its window to the next one and a turn waits its
    /// turn (default: no limit).
    #[arg(long, value_name = "N")]
    max_calls_per_minute: Option<u32>,
    /// The breaker: most heartbeats that start in an hour, however a backlog or
    /// wake-ups pull them forward; past it the agent is paused with BREAKER_TRIPPED
    /// until resumed (default: 60, or twice what the interval plans, if more).
    #[arg(long, value_name = "N")]
    max_beats_per_hour: Option<u32>,
    /// How long after a user turn the next heartbeat waits (default: half the interval).
    #[arg(long, value_name = "DURATION")]
    quiet_period: Option<String>,
    /// How long the agent's memories take to fade to half their weight, counted in its
    /// beats (default 30d).
    #[arg(long, value_name = "DURATION")]
    memory_half_life: Option<String>,
    /// How long a tool call parked for approval waits for a decision before it expires
    /// (1m to 30d; default 1d).
    #[arg(long, value_name = "DURATION")]
    approval_expiry: Option<String>,
    /// The Discord channel the agent speaks in when no interaction is open.
    #[arg(long, value_name = "CHANNEL_ID")]
    discord_channel: Option<String>,
    /// The Discord users whose direct messages it answers (user ids, comma-separated);
    /// the first is where it speaks first when it has no channel.
    #[arg(long, value_name = "ID,...")]
    discord_users: Option<String>,
    /// When it answers in its channel over the gateway: mentions (when mentioned) or all.
    #[arg(long, value_name = "mentions|all", default_value = "mentions")]
    discord_listen: String,
    /// The Telegram chat it speaks in first (a group's id, negative); without one, its
    /// first Telegram user's private chat.
    #[arg(long, value_name = "CHAT_ID", allow_hyphen_values = true)]
    telegram_chat: Option<String>,
    /// The Telegram users who may talk to it privately and steer it (user ids,
    /// comma-separated).
    #[arg(long, value_name = "ID,...")]
    telegram_users: Option<String>,
    /// When it answers in its Telegram group: mentions (a mention of the bot, a command,
    /// a reply to it) or all.
    #[arg(long, value_name = "mentions|all", default_value = "mentions")]
    telegram_listen: String,
    /// The Slack channel it speaks in first (its id, `C…`); without one, its first Slack
    /// user's direct messages.
    #[arg(long, value_name = "CHANNEL_ID")]
    slack_channel: Option<String>,
    /// The Slack users who may talk to it in direct messages and steer it (member ids,
    /// `U…`, comma-separated).
    #[arg(long, value_name = "ID,...")]
    slack_users: Option<String>,
    /// When it answers in its Slack channel: mentions (of the app) or all.
    #[arg(long, value_name = "mentions|all", default_value = "mentions")]
    slack_listen: String,
    /// When the heartbeat agent calls the model: auto (new events or a task due),
    /// events (new events only), always, or every:N (every Nth beat). A heartbeat that
    /// does not think records its action SKIPPED, at no token cost.
    #[arg(long, value_name = "POLICY", default_value = "auto")]
    think: String,
    /// What each heartbeat must do: speak (to its user) or act (speak, or call a tool
    /// that does something). One that does not ends `incomplete`, and after
    /// --alert-after of them in a row the HEARTBEAT_INCOMPLETE hook fires, once.
    #[arg(long, value_name = "speak|act")]
    expect: Option<String>,
    /// Incomplete heartbeats in a row before the HEARTBEAT_INCOMPLETE hook fires (1 to
    /// 100; default 3).
    #[arg(long, value_name = "N", requires = "expect")]
    alert_after: Option<u32>,
    /// How long its finished heartbeats, processed events, actions, conversation turns,
    /// hook deliveries and webhook request logs are kept, 1d to 3650d (default:
    /// PULSE_RETENTION, 30d). Memories and settings are kept while the agent exists.
    #[arg(long, value_name = "DURATION")]
    retention: Option<String>,
    /// After how long a silence from its user it stops beating on its own, 1d to 366d, or
    /// off (default 30d). Its reminders still fire; the user's next message brings it back.
    #[arg(long, value_name = "DURATION|off")]
    auto_pause_after: Option<String>,
}

/// A validated agents command.
pub(crate) enum AgentsPlan {
    Create(Box<NewAgent>),
    List,
    Show(AgentRef),
    Update(AgentRef, Box<AgentChanges>),
    Pause(AgentRef),
    Resume(AgentRef),
    Snooze(AgentRef, jiff::SignedDuration),
    Delete { id: AgentRef, yes: bool },
}

impl AgentsPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Create(_))
    }
}

/// An optional text argument where "" means "remove".
fn cleared(v: Option<String>) -> Option<Option<String>> {
    v.map(|s| Some(s.trim().to_owned()).filter(|s| !s.is_empty()))
}

/// Parses an optional argument where "" means "remove".
fn cleared_with<T>(
    v: Option<String>,
    parse: impl FnOnce(&str) -> Result<T, Failure>,
) -> Result<Option<Option<T>>, Failure> {
    cleared(v)
        .map(|v| v.as_deref().map(parse).transpose())
        .transpose()
}

/// The text of `--instructions-file`.
fn instructions_file(path: &std::path::Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Input(format!("--instructions-file {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Err(Failure::Input(format!(
            "--instructions-file {} is empty: write what the agent should look at when it wakes, or give --instructions \"\" to remove them",
            path.display()
        )));
    }
    Ok(text)
}

fn changes(mut a: UpdateAgent) -> Result<AgentChanges, Failure> {
    if let Some(path) = &a.instructions_file {
        a.instructions = Some(instructions_file(path)?);
    }
    let changes = AgentChanges {
        name: a.name,
        interval: a
            .interval
            .as_deref()
            .map(str::parse::<Interval>)
            .transpose()
            .map_err(input)?,
        active_hours: cleared_with(
            a.active_hours
                .map(|h| if h == "always" { String::new() } else { h }),
            |h| h.parse::<ActiveHours>().map_err(input),
        )?,
        timezone: a
            .timezone
            .as_deref()
            .map(TimeZoneName::parse)
            .transpose()
            .map_err(input)?,
        instructions: cleared(a.instructions),
        persona: cleared(a.persona),
        llm_provider: cleared_with(a.llm_provider, |p| ProviderKind::parse(p).map_err(input))?,
        llm_model: cleared(a.llm_model),
        heartbeat_model: cleared(a.heartbeat_model),
        llm_base_url: cleared_with(a.llm_base_url, base_url)?,
        vision: a.vision.as_deref().map(vision).transpose()?,
        max_steps: a.max_steps,
        max_tokens: a.max_tokens,
        daily_tokens: a
            .daily_tokens
            .map(|v| number_or(&v, "off", "--daily-tokens"))
            .transpose()?,
        usd_day: a
            .budget_usd_day
            .map(|v| usd_or_off(&v, "--budget-usd-day"))
            .transpose()?,
        usd_month: a
            .budget_usd_month
            .map(|v| usd_or_off(&v, "--budget-usd-month"))
            .transpose()?,
        max_calls_per_minute: a
            .max_calls_per_minute
            .map(|v| number_or(&v, "off", "--max-calls-per-minute"))
            .transpose()?,
        max_beats_per_hour: a
            .max_beats_per_hour
            .map(|v| number_or(&v, "default", "--max-beats-per-hour"))
            .transpose()?,
        quiet_period: cleared_with(a.quiet_period, |q| q.parse::<Interval>().map_err(input))?,
        memory_half_life: cleared_with(a.memory_half_life, |q| {
            q.parse::<Interval>().map_err(input)
        })?,
        approval_expiry: cleared_with(a.approval_expiry, |q| q.parse::<Interval>().map_err(input))?,
        retention: cleared_with(a.retention, |r| r.parse::<Retention>().map_err(input))?,
        auto_pause_after: cleared_with(a.auto_pause_after, |r| {
            r.parse::<AutoPause>().map_err(input)
        })?,
        discord_channel: cleared(a.discord_channel),
        discord_users: a
            .discord_users
            .as_deref()
            .map(DiscordAccess::parse_users)
            .transpose()
            .map_err(input)?,
        discord_listen: a
            .discord_listen
            .as_deref()
            .map(DiscordListen::parse)
            .transpose()
            .map_err(input)?,
        telegram_chat: cleared(a.telegram_chat),
        telegram_users: a
            .telegram_users
            .as_deref()
            .map(|u| ChatAccess::parse_users(ChannelKind::Telegram, u))
            .transpose()
            .map_err(input)?,
        telegram_listen: a
            .telegram_listen
            .as_deref()
            .map(DiscordListen::parse)
            .transpose()
            .map_err(input)?,
        slack_channel: cleared(a.slack_channel),
        slack_users: a
            .slack_users
            .as_deref()
            .map(|u| ChatAccess::parse_users(ChannelKind::Slack, u))
            .transpose()
            .map_err(input)?,
        slack_listen: a
            .slack_listen
            .as_deref()
            .map(DiscordListen::parse)
            .transpose()
            .map_err(input)?,
        think: a
            .think
            .as_deref()
            .map(ThinkPolicy::parse)
            .transpose()
            .map_err(input)?,
        expect: a
            .expect
            .as_deref()
            .map(|e| match e.trim() {
                "none" | "" => Ok(None),
                e => Must::parse(e).map(Some),
            })
            .transpose()
            .map_err(input)?,
        alert_after: a.alert_after,
        tools: a
            .tools
            .as_deref()
            .map(AgentTool::parse_list)
            .transpose()
            .map_err(input)?,
        ..AgentChanges::default()
    };
    if changes.is_empty() {
        return Err(Failure::Input(
            "nothing to change: give at least one setting, e.g. --interval 30m (`pulse agents update --help` lists them)".into(),
        ));
    }
    Ok(changes)
}

/// `--vision`: on, off, or auto (none: by the model).
fn vision(v: &str) -> Result<Option<bool>, Failure> {
    match v.trim() {
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        "auto" => Ok(None),
        other => Err(Failure::Input(format!(
            "--vision: {other:?} is not on, off or auto"
        ))),
    }
}

/// A number, or `word` for none.
fn number_or<T: std::str::FromStr>(v: &str, word: &str, flag: &str) -> Result<Option<T>, Failure> {
    let v = v.trim();
    if v == word {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| Failure::Input(format!("{flag} {v:?}: give a whole number, or {word}")))
}

/// A dollar budget's amount.
fn usd(v: &str) -> Result<pulse_shared::domain::Usd, Failure> {
    pulse_shared::domain::Usd::parse_budget(v).map_err(input)
}

/// A dollar budget's amount, or `off` for none.
fn usd_or_off(v: &str, flag: &str) -> Result<Option<pulse_shared::domain::Usd>, Failure> {
    match v.trim() {
        "off" => Ok(None),
        v => pulse_shared::domain::Usd::parse_budget(v)
            .map(Some)
            .map_err(|e| Failure::Input(format!("{flag}: {e}, or off"))),
    }
}

fn base_url(u: &str) -> Result<url::Url, Failure> {
    url::Url::parse(u).map_err(|e| Failure::Input(format!("invalid LLM base URL {u:?}: {e}")))
}

pub(crate) fn plan(cmd: AgentsCmd, now: jiff::Timestamp) -> Result<AgentsPlan, Failure> {
    Ok(match cmd {
        AgentsCmd::Create(a) => AgentsPlan::Create(Box::new(new_agent(*a, now)?)),
        AgentsCmd::List => AgentsPlan::List,
        AgentsCmd::Show { id } => AgentsPlan::Show(agent_ref(&id)?),
        AgentsCmd::Update(a) => {
            let id = agent_ref(&a.id)?;
            AgentsPlan::Update(id, Box::new(changes(*a)?))
        }
        AgentsCmd::Pause { id } => AgentsPlan::Pause(agent_ref(&id)?),
        AgentsCmd::Resume { id } => AgentsPlan::Resume(agent_ref(&id)?),
        AgentsCmd::Snooze { id, length } => {
            let length = pulse_shared::domain::parse_duration("snooze", &length).map_err(input)?;
            let (lo, hi) = pulse_shared::engine::steering::SNOOZE_RANGE;
            if length < lo || length > hi {
                return Err(Failure::Input(
                    "a snooze lasts from a minute to 30 days (e.g. 2h, 1d)".to_owned(),
                ));
            }
            AgentsPlan::Snooze(agent_ref(&id)?, length)
        }
        AgentsCmd::Delete { id, yes } => AgentsPlan::Delete {
            id: agent_ref(&id)?,
            yes,
        },
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
    new.instructions = match &a.instructions_file {
        Some(path) => Some(instructions_file(path)?),
        None => a.instructions,
    };
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
        heartbeat_model: a.heartbeat_model.filter(|m| !m.trim().is_empty()),
        base_url: a.llm_base_url.as_deref().map(base_url).transpose()?,
        api_key_env: a.llm_api_key_env.map(|v| v.trim().to_owned()),
        vision: vision(&a.vision)?,
    };
    new.budgets = Budgets {
        max_steps: a.max_steps,
        max_tokens: a.max_tokens,
        daily_tokens: a.daily_tokens,
        usd_day: a.budget_usd_day.as_deref().map(usd).transpose()?,
        usd_month: a.budget_usd_month.as_deref().map(usd).transpose()?,
        max_calls_per_minute: a.max_calls_per_minute,
        max_beats_per_hour: a.max_beats_per_hour,
    };
    new.quiet_period = a
        .quiet_period
        .as_deref()
        .map(str::parse::<Interval>)
        .transpose()
        .map_err(input)?;
    new.memory_half_life = a
        .memory_half_life
        .as_deref()
        .map(str::parse::<Interval>)
        .transpose()
        .map_err(input)?;
    new.approval_expiry = a
        .approval_expiry
        .as_deref()
        .map(str::parse::<Interval>)
        .transpose()
        .map_err(input)?;
    new.discord_channel = a.discord_channel;
    new.discord = DiscordAccess {
        users: a
            .discord_users
            .as_deref()
            .map(DiscordAccess::parse_users)
            .transpose()
            .map_err(input)?
            .unwrap_or_default(),
        listen: DiscordListen::parse(&a.discord_listen).map_err(input)?,
    };
    new.telegram = ChatAccess {
        chat: a.telegram_chat,
        users: a
            .telegram_users
            .as_deref()
            .map(|u| ChatAccess::parse_users(ChannelKind::Telegram, u))
            .transpose()
            .map_err(input)?
            .unwrap_or_default(),
        listen: DiscordListen::parse(&a.telegram_listen).map_err(input)?,
    };
    new.slack = ChatAccess {
        chat: a.slack_channel,
        users: a
            .slack_users
            .as_deref()
            .map(|u| ChatAccess::parse_users(ChannelKind::Slack, u))
            .transpose()
            .map_err(input)?
            .unwrap_or_default(),
        listen: DiscordListen::parse(&a.slack_listen).map_err(input)?,
    };
    new.think = ThinkPolicy::parse(&a.think).map_err(input)?;
    new.expect = a
        .expect
        .as_deref()
        .map(Must::parse)
        .transpose()
        .map_err(input)?
        .map(|must| Expectation {
            must,
            alert_after: a.alert_after.unwrap_or(Expectation::ALERT_AFTER),
        });
    new.retention = a
        .retention
        .as_deref()
        .map(str::parse::<Retention>)
        .transpose()
        .map_err(input)?;
    new.auto_pause_after = a
        .auto_pause_after
        .as_deref()
        .map(str::parse::<AutoPause>)
        .transpose()
        .map_err(input)?;
    // Validate the name now, so a bad one is reported before anything is opened.
    new.clone().create(now).map_err(input)?;
    Ok(new)
}

pub(crate) async fn execute(plan: AgentsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        AgentsPlan::Create(new) => {
            let (agent, first) = new.create(cx.clock.now()).map_err(input)?;
            // The store holds each name for one agent; this read also finds a name
            // another agent has as its alias, and agents made before names were held.
            let agents = b.store.list_agents().await?;
            if let Some(other) = pulse_shared::domain::agents_named(&agents, &agent.name).first() {
                return Err(Failure::Input(format!(
                    "an agent named {:?} already exists ({}, named {:?}); give this one another name, or rename that one with `pulse agents update {} --name NEW`",
                    agent.name, other.id, other.name, other.id
                )));
            }
            b.store.create_agent(&agent, &first).await.map_err(store)?;
            warn_without_key(cx, &agent);
            out.created(
                &agent,
                agent.id.as_str(),
                &format!(
                    "created agent {} ({}); its first heartbeat is due now",
                    agent.name, agent.id
                ),
            );
        }
        AgentsPlan::List => list(cx).await?,
        AgentsPlan::Show(agent) => show(cx, &agent).await?,
        other => return lifecycle::lifecycle(other, cx).await,
    }
    Ok(())
}

/// `agents list`: each agent with its status, plan and today's tokens.
async fn list(cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    let agents = b.store.list_agents().await?;
    let now = cx.clock.now();
    let mut rows = Vec::with_capacity(agents.len());
    for a in agents {
        let today = budget::spent_today(b.store.as_ref(), &a, now).await?;
        rows.push(Listed {
            agent: a,
            tokens_today: today.spent,
        });
    }
    out.table(
        &rows,
        &[
            "ID",
            "NAME",
            "STATUS",
            "INTERVAL",
            "ACTIVE HOURS",
            "TZ",
            "TOKENS TODAY",
            "CREATED",
        ],
        |Listed {
             agent: a,
             tokens_today: spent,
         }| {
            vec![
                a.id.to_string(),
                a.name.clone(),
                a.state().as_str().into(),
                a.interval.to_string(),
                a.active_hours.map_or("always".into(), |h| h.to_string()),
                a.timezone.to_string(),
                match a.budgets.daily_tokens {
                    Some(n) => format!("{spent}/{n}"),
                    None => spent.to_string(),
                },
                when(Some(a.created_at)),
            ]
        },
    );

    Ok(())
}

/// `agents show`: one agent's settings, spend and latest heartbeats.
async fn show(cx: &Ctx<'_>, agent: &AgentRef) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    let agent = agent.find(b).await?;
    let id = agent.id.clone();
    let recent = b.store.list_heartbeats(&id, 5).await?;
    let today = budget::spent_today(b.store.as_ref(), &agent, cx.clock.now()).await?;
    if out.json {
        out.json_value(&serde_json::json!({
            "agent": agent,
            "heartbeats": recent,
            "tokens_today": today.spent,
            "max_beats_per_hour": agent.beat_cap(),
        }));
        return Ok(());
    }
    let field = |k: &str, v: String| outln!("{k:<18}{v}");
    field("id", agent.id.to_string());
    field("name", agent.name.clone());
    field(
        "status",
        match agent.paused_at {
            Some(at) => format!("paused since {}", when(Some(at))),
            None => "active".into(),
        },
    );
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
    field("think", agent.think.to_string());
    field(
        "expect",
        agent.expect.map_or("nothing".into(), |e| {
            format!(
                "{} (HEARTBEAT_INCOMPLETE after {} in a row that do not)",
                e.must.as_str(),
                e.alert_after
            )
        }),
    );
    field(
        "retention",
        match agent.retention {
            Some(r) => r.to_string(),
            None => format!("{} (PULSE_RETENTION)", cx.config.retention),
        },
    );
    field(
        "auto-pause",
        match (
            agent.auto_pause_after.unwrap_or(AutoPause::DEFAULT),
            agent.auto_paused_since,
        ) {
            (_, Some(since)) => format!("paused: user silent since {}", when(Some(since))),
            (AutoPause::Off, None) => "off".into(),
            (after, None) => format!("after {after} of silence"),
        },
    );
    field(
        "vision",
        match agent.llm.vision {
            Some(true) => "on".into(),
            Some(false) => "off".into(),
            None => "auto (on for models known to accept images)".into(),
        },
    );
    field(
        "tokens today",
        match agent.budgets.daily_tokens {
            Some(n) => format!("{} of {n} (daily budget)", today.spent),
            None => format!("{} (no daily budget)", today.spent),
        },
    );
    if let Some(n) = agent.budgets.max_calls_per_minute {
        field("calls a minute", format!("at most {n}"));
    }
    for (what, limit) in [
        ("dollars a day", agent.budgets.usd_day),
        ("dollars a month", agent.budgets.usd_month),
    ] {
        if let Some(limit) = limit {
            field(what, format!("at most {limit}"));
        }
    }
    field(
        "breaker",
        format!("{} heartbeats an hour", agent.beat_cap()),
    );
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

    Ok(())
}

/// Says so on stderr when the agent's model cannot be reached from here for want of a
/// key, rather than letting its first reply fail.
pub(super) fn warn_without_key(cx: &Ctx<'_>, agent: &Agent) {
    let services = pulse_shared::app::Services::from_config(cx.config);
    if let Err(e) = services.llm.select(agent) {
        eprintln!(
            "warning: agent {} cannot reach its model with this configuration: {e}. Its heartbeats and replies fail until the process that runs it (pulse serve, or the functions) has it; --llm-provider offline needs no key",
            agent.name
        );
    }
}

/// An agent as listed: its record and what it spent today.
#[derive(serde::Serialize)]
struct Listed {
    #[serde(flatten)]
    agent: Agent,
    tokens_today: u64,
}
