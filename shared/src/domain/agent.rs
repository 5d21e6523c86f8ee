//! Agents: who an agent is and when it wakes — its record, its model settings, when its
//! heartbeat agent thinks, and what it may spend.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::channel::{ChannelKind, ChatTarget};
use super::chat::ProviderKind;
use super::conversation::ReplyTarget;
use super::expectation::Expectation;
use super::ids::{AgentId, SessionId, ToolName};
use super::time::{ActiveHours, Interval, Retention, TimeZoneName};
use crate::error::ValidationError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    /// Its id.
    pub id: AgentId,
    /// Display name.
    pub name: String,
    /// Short handle (`@scout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Persona (system prompt) used by its LLM tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    /// What to look at when it wakes, like a HEARTBEAT.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Time between the end of one heartbeat and the start of the next.
    pub interval: Interval,
    /// Hours of the day in which heartbeats may run; always when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_hours: Option<ActiveHours>,
    /// The zone `active_hours` are read in.
    pub timezone: TimeZoneName,
    /// The session (FIFO message group) its work runs in.
    pub session: SessionId,
    /// When it was created.
    pub created_at: Timestamp,
    /// The last time its user interacted with it; beats are counted from there. A
    /// heartbeat that started before it and is still running is cancel-requested: the
    /// user's message interrupts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_interaction_at: Option<Timestamp>,
    /// Its own LLM provider, model or base URL, over the configured defaults.
    #[serde(default, skip_serializing_if = "AgentLlm::is_default")]
    pub llm: AgentLlm,
    /// Per-run limits of its heartbeat agent.
    #[serde(default)]
    pub budgets: Budgets,
    /// How long after a user turn its next heartbeat waits; half the interval when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_period: Option<Interval>,
    /// The Discord channel it speaks in when no interaction is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_channel: Option<String>,
    /// Who may talk to it in direct messages, and when it answers in its channel.
    #[serde(default, skip_serializing_if = "DiscordAccess::is_default")]
    pub discord: DiscordAccess,
    /// Where it speaks on Telegram, and who may talk to it there.
    #[serde(default, skip_serializing_if = "ChatAccess::is_default")]
    pub telegram: ChatAccess,
    /// Where it speaks on Slack, and who may talk to it there.
    #[serde(default, skip_serializing_if = "ChatAccess::is_default")]
    pub slack: ChatAccess,
    /// When it was paused (`pulse agents pause`): its heartbeats are not claimed until it
    /// is resumed; its user's messages are still answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<Timestamp>,
    /// Until when its user snoozed it (`pulse agents snooze`, `/snooze 2h`): no
    /// heartbeat of its own before then; reminders still wake it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snoozed_until: Option<Timestamp>,
    /// How long its user may stay silent before it stops beating on its own
    /// ([`AutoPause::DEFAULT`], 30 days, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_after: Option<super::time::AutoPause>,
    /// Since when its user has been silent, when that silence auto-paused it: no
    /// heartbeats of its own (reminders still fire) until the user writes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_paused_since: Option<Timestamp>,
    /// When its operator asked the heartbeat running then to stop (`pulse heartbeats
    /// cancel`): a heartbeat that started before it stops at its next step or model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<Timestamp>,
    /// When its heartbeat agent calls the model.
    #[serde(default, skip_serializing_if = "ThinkPolicy::is_auto")]
    pub think: ThinkPolicy,
    /// What each of its heartbeats must do (`--expect`), and after how many in a row
    /// that did not its operator is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expectation>,
    /// The earliest next wake of its schedules (reminders), if it has any: the finish
    /// of a heartbeat files the next one no later than this. Written on its own
    /// ([`crate::ports::AgentStore::set_next_wake`]), never by a settings update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_wake: Option<Timestamp>,
    /// How long its finished records are kept, over the deployment's `PULSE_RETENTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// How many days of beats halve a memory's weight (default 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_half_life: Option<Interval>,
    /// How long a call parked for its owner's approval waits before it expires (default
    /// a day; see [`super::Approval`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_expiry: Option<Interval>,
    /// The MCP servers whose tools it may call, in heartbeats and chat turns alike.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<super::mcp::AgentTool>,
    /// Tools whose policy is `ask` that it may call without asking: granted by an
    /// approval made with `--always` (see [`super::ToolGrant`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub granted: Vec<super::ToolGrant>,
    /// The seed memories it was given from its `memories.md` (`pulse apply`), each by a
    /// digest of its text: each is given once, and not again once forgotten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeded: Vec<String>,
    /// Where its settings were last applied from (`pulse apply`): it is kept as files,
    /// and a change made elsewhere is drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedFrom>,
}

/// Where an agent's files were applied from, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedFrom {
    /// The directory, as `pulse apply` was given it.
    pub dir: String,
    /// What `--source` said (a commit), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// When.
    pub at: Timestamp,
}

impl Agent {
    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }

    /// Whether it beats on its own, and if not why.
    pub fn state(&self) -> super::AgentState {
        super::AgentState::of(
            self.is_paused(),
            self.auto_paused_since.is_some(),
            self.snoozed_until.is_some(),
        )
    }

    /// Since when its user has been silent, if for longer than its auto-pause allows at
    /// `now`: then it should stop beating on its own.
    pub fn silent_too_long(&self, now: Timestamp) -> Option<Timestamp> {
        let after = self
            .auto_pause_after
            .unwrap_or(super::time::AutoPause::DEFAULT)
            .after()?;
        let since = self.last_interaction_at.unwrap_or(self.created_at);
        (now.duration_since(since) >= after).then_some(since)
    }

    /// Checks the settings a user gives (on create and on update) and normalises them:
    /// the name trimmed, an empty alias or channel dropped.
    pub fn validated(mut self) -> Result<Self, ValidationError> {
        if let Some(e) = self.expect {
            e.checked("heartbeats")?;
        }
        self.name = self.name.trim().to_owned();
        if self.name.is_empty() || self.name.chars().count() > 100 {
            return Err(ValidationError::new(
                "agent name",
                "give a name of 1 to 100 characters",
            ));
        }
        for (what, text) in [
            ("persona", &mut self.persona),
            ("instructions", &mut self.instructions),
        ] {
            *text = text
                .take()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty());
            let chars = text.as_deref().map_or(0, |t| t.chars().count());
            if chars > MAX_PROMPT_TEXT {
                return Err(ValidationError::new(
                    what,
                    format!(
                        "{chars} characters; at most {MAX_PROMPT_TEXT} (it is sent with every model call): shorten it"
                    ),
                ));
            }
        }
        if let Some(text) = &self.instructions {
            super::instructions::Instructions::parse(text)?;
        }
        if let Some(var) = &self.llm.api_key_env {
            check_key_variable(var)?;
        }
        if self.budgets.max_steps == 0 || self.budgets.max_tokens == 0 {
            return Err(ValidationError::new(
                "budgets",
                "max steps and max tokens must be at least 1",
            ));
        }
        if self.budgets.daily_tokens == Some(0) {
            return Err(ValidationError::new(
                "daily tokens",
                "give at least 1, or `off` for no daily budget",
            ));
        }
        for usd in [self.budgets.usd_day, self.budgets.usd_month]
            .into_iter()
            .flatten()
        {
            if usd == super::Usd::ZERO || usd > super::Usd::MAX_BUDGET {
                return Err(ValidationError::new(
                    "dollar budget",
                    format!("{usd}: give more than $0 and at most $1000000, or `off` for none"),
                ));
            }
        }
        if let Some(e) = self.approval_expiry {
            super::check_approval_expiry(e.duration())?;
        }
        let scheduled = self.scheduled_beats_per_hour();
        if let Some(cap) = self.budgets.max_beats_per_hour
            && cap < scheduled
        {
            return Err(ValidationError::new(
                "max beats per hour",
                format!(
                    "{cap} is fewer than its interval of {} plans ({scheduled} an hour); raise it or lengthen the interval",
                    self.interval
                ),
            ));
        }
        self.alias = self.alias.filter(|a| !a.trim().is_empty());
        self.discord_channel = self
            .discord_channel
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty());
        if let Some(c) = &self.discord_channel
            && (c.len() > 20 || !c.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(ValidationError::new(
                "discord channel",
                format!(
                    "{c:?} is not a Discord channel id; copy it with Developer Mode on (right-click the channel, Copy Channel ID): it is all digits"
                ),
            ));
        }
        self.discord = self.discord.validated()?;
        self.telegram = self.telegram.validated(ChannelKind::Telegram)?;
        self.slack = self.slack.validated(ChannelKind::Slack)?;
        Ok(self)
    }

    /// Where it speaks when nobody spoke to it first (a heartbeat's `speak`, an
    /// approval to ask), in the order tried: on Discord its channel, else a direct
    /// message to its first allowed user; then on Telegram, then on Slack, its chat,
    /// else its first allowed user's direct messages. The first on a platform that is
    /// set up is used.
    pub fn homes(&self) -> Vec<ReplyTarget> {
        let mut homes = Vec::new();
        match (&self.discord_channel, self.discord.users.first()) {
            (Some(c), _) => homes.push(ReplyTarget::Channel {
                channel_id: c.clone(),
                reply_to: None,
            }),
            (None, Some(u)) => homes.push(ReplyTarget::User { user_id: u.clone() }),
            (None, None) => {}
        }
        for (channel, access) in [
            (ChannelKind::Telegram, &self.telegram),
            (ChannelKind::Slack, &self.slack),
        ] {
            if let Some(chat) = access.home() {
                homes.push(ReplyTarget::Chat(ChatTarget {
                    channel,
                    chat: chat.to_owned(),
                    thread: None,
                    reply_to: None,
                }));
            }
        }
        homes
    }

    /// Whether `user` may talk to it privately on `channel`, and steer it there.
    pub fn lets_in(&self, channel: ChannelKind, user: &str) -> bool {
        match channel {
            ChannelKind::Discord => self.discord.allows(user),
            ChannelKind::Telegram => self.telegram.allows(user),
            ChannelKind::Slack => self.slack.allows(user),
        }
    }

    /// Whether `other` wakes on a different plan (interval, active hours or their zone):
    /// then the pending heartbeat is planned again.
    pub fn schedule_differs(&self, other: &Agent) -> bool {
        self.interval != other.interval
            || self.active_hours != other.active_hours
            || self.timezone != other.timezone
    }

    /// `at`, moved to the first instant inside the agent's active hours (in its time
    /// zone); `at` itself when it has none. Every due time the engine sets goes through
    /// this.
    pub fn in_active_hours(&self, at: Timestamp) -> Timestamp {
        match self.active_hours {
            Some(h) => h.next_active(at, &self.timezone.zone()),
            None => at,
        }
    }

    /// Whether `at` falls inside the agent's active hours (always, when it has none).
    pub fn is_active_at(&self, at: Timestamp) -> bool {
        self.in_active_hours(at) == at
    }

    /// How many heartbeats an hour its interval plans (rounded up).
    pub fn scheduled_beats_per_hour(&self) -> u32 {
        let secs = self.interval.duration().as_secs().max(1) as u64;
        u32::try_from(3600_u64.div_ceil(secs)).unwrap_or(u32::MAX)
    }

    /// The breaker's cap: at most this many heartbeats start in an hour, however a
    /// backlog or wake-ups pull them forward. `--max-beats-per-hour`, or by default
    /// [`DEFAULT_BEATS_PER_HOUR`] or twice what the interval plans, whichever is more.
    pub fn beat_cap(&self) -> u32 {
        self.budgets.max_beats_per_hour.unwrap_or_else(|| {
            DEFAULT_BEATS_PER_HOUR.max(self.scheduled_beats_per_hour().saturating_mul(2))
        })
    }

    /// How many of its beats halve a memory's weight: its memory half-life (default
    /// [`DEFAULT_MEMORY_HALF_LIFE`]) over its interval, at least one.
    pub fn memory_half_life_beats(&self) -> u64 {
        let life = self
            .memory_half_life
            .map_or(DEFAULT_MEMORY_HALF_LIFE, |h| h.duration());
        let interval = self.interval.duration().as_secs().max(1);
        (life.as_secs().max(1) / interval).max(1) as u64
    }

    /// Whether it was granted `server`'s `tool` (its calls are not asked about).
    pub fn is_granted(&self, server: &ToolName, tool: &str) -> bool {
        self.granted
            .iter()
            .any(|g| g.server == *server && g.tool == tool)
    }

    /// How long a parked call waits for a decision.
    pub fn approval_expiry(&self) -> SignedDuration {
        self.approval_expiry
            .map_or(super::DEFAULT_APPROVAL_EXPIRY, |e| e.duration())
    }

    /// How long after a user turn the next heartbeat waits.
    pub fn quiet_period(&self) -> SignedDuration {
        match self.quiet_period {
            Some(q) => q.duration(),
            None => self.interval.duration() / 2,
        }
    }
}

/// The most characters of an agent's persona, and of its heartbeat instructions.
pub const MAX_PROMPT_TEXT: usize = 16_000;
/// The most tokens a persona or instructions kept as files may take, counted as the
/// agent's model counts them where that is known (`pulse apply`): about as many as
/// [`MAX_PROMPT_TEXT`] characters of English, fewer characters of scripts that take
/// more tokens a character.
pub const MAX_PROMPT_TOKENS: usize = 4_000;

/// The agents `name` refers to: those whose name it is (ignoring case), or whose alias it
/// is, with or without a leading `@`.
pub fn agents_named<'a>(agents: &'a [Agent], name: &str) -> Vec<&'a Agent> {
    agents.iter().filter(|a| a.is_named(name)).collect()
}

impl Agent {
    /// Whether `name` is this agent's name (ignoring case) or its alias (with or
    /// without a leading `@`).
    pub fn is_named(&self, name: &str) -> bool {
        let name = name.trim();
        let bare = name.strip_prefix('@').unwrap_or(name);
        self.name.eq_ignore_ascii_case(name)
            || self.alias.as_deref().is_some_and(|alias| {
                alias
                    .strip_prefix('@')
                    .unwrap_or(alias)
                    .eq_ignore_ascii_case(bare)
            })
    }
}

/// An agent's own LLM settings; each unset field falls back to the configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentLlm {
    /// Provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model its heartbeats think with (of the same provider), when not the one it
    /// talks with: a cheaper model for beats, the chat model for the person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_model: Option<String>,
    /// API base URL (an OpenAI-compatible server, a proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<url::Url>,
    /// The variable holding this agent's own API key (`PULSE_LLM_KEY_…`), for a base URL
    /// the deployment's key is not sent to. The name is stored, never the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Whether the model is sent the images users send (`--vision on|off`); unset: on
    /// for models known to accept them ([`crate::domain::model_sees_images`]), off for
    /// others, which read `[image: URL]` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<bool>,
}

impl AgentLlm {
    /// Whether `model` (the one this agent's requests go to) is sent images.
    pub fn sees_images(&self, model: &str) -> bool {
        self.vision
            .unwrap_or_else(|| super::chat::model_sees_images(model))
    }
    /// True when nothing is overridden.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The prefix of the variables an agent may name as its key (`--llm-api-key-env`). Only
/// these are ever sent to a base URL an agent chose, so an agent can never name the
/// deployment's own keys, tokens or cloud credentials.
pub const AGENT_KEY_PREFIX: &str = "PULSE_LLM_KEY_";

/// An agent's key variable must be one of `PULSE_LLM_KEY_…` (upper case, digits, `_`):
/// only those are ever sent to a base URL an agent chose.
pub fn check_key_variable(var: &str) -> Result<(), ValidationError> {
    const PREFIX: &str = AGENT_KEY_PREFIX;
    let ok = var.len() > PREFIX.len()
        && var.len() <= 128
        && var.starts_with(PREFIX)
        && var
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "LLM key variable",
            format!(
                "{} must be a variable named {PREFIX}<NAME> (upper case, digits, _): only those are sent to an agent's own base URL, so the deployment's keys and credentials never are",
                super::ids::quote_input(var)
            ),
        ))
    }
}

/// When the heartbeat agent calls the model (`--think`). A heartbeat that does not think
/// records its action SKIPPED with the reason, at no token cost; the other tools
/// subscribed to HEARTBEAT run every beat all the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThinkPolicy {
    /// When there is something to think about: events arrived since the last heartbeat,
    /// or one of its heartbeat tasks is due (instructions without tasks are one, due
    /// every beat).
    #[default]
    Auto,
    /// Only when events arrived since the last heartbeat.
    Events,
    /// Every beat.
    Always,
    /// Every Nth beat (beats N, 2N, …).
    Every(u32),
}

impl ThinkPolicy {
    /// Reads `auto`, `events`, `always` or `every:N` (N ≥ 1).
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = || {
            ValidationError::new(
                "think policy",
                format!("{s:?}: use auto, events, always or every:N (N at least 1)"),
            )
        };
        Ok(match s.trim() {
            "auto" => Self::Auto,
            "events" => Self::Events,
            "always" => Self::Always,
            other => {
                let n: u32 = other
                    .strip_prefix("every:")
                    .and_then(|n| n.trim().parse().ok())
                    .ok_or_else(bad)?;
                if n == 0 {
                    return Err(bad());
                }
                Self::Every(n)
            }
        })
    }

    /// Whether it is the default (left out of stored records).
    pub fn is_auto(&self) -> bool {
        *self == Self::Auto
    }

    /// Whether a heartbeat thinks: `Ok(())`, or `Err(reason)` for the SKIPPED action.
    /// `events` counts the events that arrived since the last heartbeat and those its
    /// tools returned before the thinking (its own HEARTBEAT event not included).
    /// `tasks_due` counts the heartbeat tasks due.
    pub fn decide(self, beat: u64, events: usize, tasks_due: usize) -> Result<(), String> {
        let events = events > 0;
        match self {
            Self::Always => Ok(()),
            Self::Auto if events || tasks_due > 0 => Ok(()),
            Self::Auto => Err("think auto: no new events and no heartbeat task due".into()),
            Self::Events if events => Ok(()),
            Self::Events => Err("think events: no new events".into()),
            Self::Every(n) if beat.is_multiple_of(u64::from(n)) => Ok(()),
            Self::Every(n) => Err(format!(
                "think every:{n}: beat {beat} is not a multiple of {n}"
            )),
        }
    }
}

impl fmt::Display for ThinkPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Events => f.write_str("events"),
            Self::Always => f.write_str("always"),
            Self::Every(n) => write!(f, "every:{n}"),
        }
    }
}

impl Serialize for ThinkPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ThinkPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The breaker's default cap, for intervals of two minutes or more.
pub const DEFAULT_BEATS_PER_HOUR: u32 = 60;

/// How long an agent's memories take to fade to half their weight, unless it says
/// otherwise (`--memory-half-life`): 30 days of beats.
pub const DEFAULT_MEMORY_HALF_LIFE: SignedDuration = SignedDuration::from_hours(30 * 24);

/// Limits on what an agent spends: per heartbeat agent run (when one is hit the run
/// stops and says so), per day, and per hour of heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// Most LLM calls per run.
    pub max_steps: u32,
    /// Most tokens (input + output, summed over the run's calls) per run.
    pub max_tokens: u64,
    /// Most model tokens a day, heartbeats and conversation turns together, counted
    /// from midnight in the agent's time zone. Once spent, heartbeats do not think and
    /// a user message gets one short notice a day, until the next day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    /// Most US dollars a day of model calls (at the price table's prices), heartbeats
    /// and turns together, from midnight in the agent's time zone. Each call holds its
    /// worst case against it before it is made; one that does not fit is not made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_day: Option<super::Usd>,
    /// Most US dollars a calendar month, in the agent's time zone; as `usd_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_month: Option<super::Usd>,
    /// Most model calls in a minute (of the clock), heartbeats and turns together: past
    /// it a heartbeat yields its window to the next and a turn waits its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_per_minute: Option<u32>,
    /// Most heartbeats that start in an hour; past it the breaker pauses the agent.
    /// Unset: see [`Agent::beat_cap`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_beats_per_hour: Option<u32>,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            max_steps: 8,
            max_tokens: 50_000,
            daily_tokens: None,
            usd_day: None,
            usd_month: None,
            max_calls_per_minute: None,
            max_beats_per_hour: None,
        }
    }
}

/// One entry of an agent's daily spend ledger: the model tokens one heartbeat agent run
/// or one conversation turn used, or a mark (no tokens) that something happened that
/// day. The daily budget is checked against it, one read before a model call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spend {
    /// The day, in the agent's time zone.
    pub day: jiff::civil::Date,
    /// What spent: the action or turn id, or a mark ([`Spend::EXHAUSTED`], [`Spend::NOTICE`]).
    /// One entry per day and source: recording it again replaces it.
    pub source: String,
    /// Input and output tokens.
    pub tokens: u64,
    /// When it was recorded.
    pub at: Timestamp,
}

impl Spend {
    /// The mark that BUDGET_EXHAUSTED fired that day.
    pub const EXHAUSTED: &'static str = "!exhausted";
    /// The mark that the user was told that day that the budget is spent.
    pub const NOTICE: &'static str = "!notice";
    /// How many days of entries a store keeps.
    pub const KEPT_DAYS: i64 = 7;
}

#[cfg(test)]
mod tests {
    use super::ThinkPolicy;

    #[test]
    fn think_policies_parse_print_and_decide() {
        for s in ["auto", "events", "always", "every:3"] {
            assert_eq!(ThinkPolicy::parse(s).unwrap().to_string(), s);
        }
        for bad in ["", "sometimes", "every:0", "every:x", "every:"] {
            assert!(ThinkPolicy::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            serde_json::to_string(&ThinkPolicy::Every(4)).unwrap(),
            "\"every:4\""
        );
        let auto = ThinkPolicy::Auto;
        assert!(auto.decide(1, 0, 0).is_err());
        assert!(auto.decide(1, 1, 0).is_ok());
        assert!(auto.decide(1, 0, 1).is_ok());
        assert!(ThinkPolicy::Events.decide(1, 0, 1).is_err());
        assert!(ThinkPolicy::Always.decide(1, 0, 0).is_ok());
        let every = ThinkPolicy::Every(3);
        let thought: Vec<u64> = (1..=9).filter(|b| every.decide(*b, 5, 1).is_ok()).collect();
        assert_eq!(thought, [3, 6, 9], "every:N counts beats, events or not");
    }
}

/// When an agent answers in a guild channel bound to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscordListen {
    /// Only messages that mention it.
    #[default]
    Mentions,
    /// Every message (from people; bots are never answered).
    All,
}

impl DiscordListen {
    /// Reads `mentions` or `all`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s.trim() {
            "mentions" => Ok(Self::Mentions),
            "all" => Ok(Self::All),
            other => Err(ValidationError::new(
                "discord listen",
                format!(
                    "{other:?}: give `mentions` (answer when mentioned) or `all` (every message)"
                ),
            )),
        }
    }

    /// `mentions` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mentions => "mentions",
            Self::All => "all",
        }
    }
}

/// Who reaches an agent over the Discord gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscordAccess {
    /// Users whose direct messages it answers (Discord user ids), in order; the first
    /// is its home when it has no channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// When it answers in its channel.
    #[serde(default, skip_serializing_if = "is_mentions")]
    pub listen: DiscordListen,
}

fn is_mentions(l: &DiscordListen) -> bool {
    *l == DiscordListen::Mentions
}

/// Most users one agent lets talk to it directly.
pub const MAX_DISCORD_USERS: usize = 50;

impl DiscordAccess {
    /// Nobody in direct messages, mentions only.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `user` may talk to the agent in direct messages.
    pub fn allows(&self, user: &str) -> bool {
        self.users.iter().any(|u| u == user)
    }

    /// Reads a comma-separated list of user ids ("" for none).
    pub fn parse_users(list: &str) -> Result<Vec<String>, ValidationError> {
        let users: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        Self {
            users,
            listen: DiscordListen::Mentions,
        }
        .validated()
        .map(|a| a.users)
    }

    fn validated(mut self) -> Result<Self, ValidationError> {
        let mut seen = std::collections::HashSet::new();
        self.users.retain(|u| seen.insert(u.clone()));
        if self.users.len() > MAX_DISCORD_USERS {
            return Err(ValidationError::new(
                "discord users",
                format!(
                    "{} users; one agent answers at most {MAX_DISCORD_USERS} in direct messages",
                    self.users.len()
                ),
            ));
        }
        if let Some(u) = self
            .users
            .iter()
            .find(|u| u.len() > 20 || u.is_empty() || !u.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(ValidationError::new(
                "discord users",
                format!(
                    "{:?} is not a Discord user id; copy it with Developer Mode on (right-click the user, Copy User ID): it is all digits",
                    u.escape_debug().to_string()
                ),
            ));
        }
        Ok(self)
    }
}

/// Who reaches an agent on a platform other than Discord, and where it speaks there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatAccess {
    /// The chat it speaks in when nobody spoke to it first (a group's id); without one,
    /// its first user's private chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// Users who may talk to it privately and steer it, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// When it answers in its group chat.
    #[serde(default, skip_serializing_if = "is_mentions")]
    pub listen: DiscordListen,
}

impl ChatAccess {
    /// No chat, nobody, mentions only.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `user` may talk to the agent privately, and steer it.
    pub fn allows(&self, user: &str) -> bool {
        self.users.iter().any(|u| u == user)
    }

    /// Where it speaks first: its chat, else its first user's direct messages (on
    /// Telegram a private chat's id is its user's; Slack takes a user's id for the app's
    /// direct messages).
    pub fn home(&self) -> Option<&str> {
        self.chat
            .as_deref()
            .or(self.users.first().map(String::as_str))
    }

    /// Reads a comma-separated list of `channel` user ids ("" for none).
    pub fn parse_users(channel: ChannelKind, list: &str) -> Result<Vec<String>, ValidationError> {
        let users = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        Self {
            users,
            ..Self::default()
        }
        .validated(channel)
        .map(|a| a.users)
    }

    /// Checked: ids as `channel` writes them (Telegram's are integers, a group's
    /// negative; Slack's are capitals and digits, a user's starting U or W, a channel's
    /// C, G or D), no more than [`MAX_DISCORD_USERS`] users, each once.
    pub fn validated(mut self, channel: ChannelKind) -> Result<Self, ValidationError> {
        let slack_id = |id: &str, first: &[u8]| {
            (2..=24).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
                && first.contains(&id.as_bytes()[0])
        };
        let number = |id: &str, negative: bool| {
            let digits = match id.strip_prefix('-') {
                Some(d) if negative => d,
                Some(_) => return false,
                None => id,
            };
            !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit())
        };
        let is_chat = |id: &str| match channel {
            ChannelKind::Slack => slack_id(id, b"CGD"),
            _ => number(id, true),
        };
        let is_user = |id: &str| match channel {
            ChannelKind::Slack => slack_id(id, b"UW"),
            _ => number(id, false),
        };
        let (chat_what, users_what, chat_hint, user_hint) = match channel {
            ChannelKind::Discord => ("discord channel", "discord users", "", ""),
            ChannelKind::Telegram => (
                "telegram chat",
                "telegram users",
                "it is a number (a group's starts with -100), found in any update the bot receives from that chat",
                "it is a positive number, shown by @userinfobot or in the update the bot receives",
            ),
            ChannelKind::Slack => (
                "slack channel",
                "slack users",
                "it is capitals and digits starting C (the channel's details show it at the bottom)",
                "it is capitals and digits starting U or W (a person's profile: More, Copy member ID)",
            ),
        };
        self.chat = self
            .chat
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty());
        if let Some(c) = self.chat.as_deref().filter(|c| !is_chat(c)) {
            return Err(ValidationError::new(
                chat_what,
                format!(
                    "{:?} is not a {} chat id: {chat_hint}",
                    c.escape_debug().to_string(),
                    channel.title()
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        self.users.retain(|u| seen.insert(u.clone()));
        if self.users.len() > MAX_DISCORD_USERS {
            return Err(ValidationError::new(
                users_what,
                format!(
                    "{} users; one agent answers at most {MAX_DISCORD_USERS} privately",
                    self.users.len()
                ),
            ));
        }
        if let Some(u) = self.users.iter().find(|u| !is_user(u)) {
            return Err(ValidationError::new(
                users_what,
                format!(
                    "{:?} is not a {} user id: {user_hint}",
                    u.escape_debug().to_string(),
                    channel.title()
                ),
            ));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod channel_tests {
    use super::*;

    fn agent() -> Agent {
        super::super::NewAgent::named("Scout")
            .create(Timestamp::UNIX_EPOCH)
            .unwrap()
            .0
    }

    #[test]
    fn a_record_written_before_telegram_reads_with_nobody_there() {
        let mut doc = serde_json::to_value(agent()).unwrap();
        doc.as_object_mut().unwrap().remove("telegram");
        let read: Agent = serde_json::from_value(doc).unwrap();
        assert!(read.telegram.is_default());
        assert!(read.homes().is_empty());
        assert!(
            !serde_json::to_string(&read).unwrap().contains("telegram"),
            "nothing written for a platform not used"
        );
    }

    #[test]
    fn homes_are_discord_first_then_the_telegram_chat_else_its_first_user() {
        let mut a = agent();
        a.telegram.users = vec!["777".into(), "888".into()];
        let telegram = |chat: &str| {
            ReplyTarget::Chat(ChatTarget {
                channel: ChannelKind::Telegram,
                chat: chat.into(),
                thread: None,
                reply_to: None,
            })
        };
        assert_eq!(a.homes(), [telegram("777")]);
        a.telegram.chat = Some("-1001".into());
        a.discord.users = vec!["42".into()];
        assert_eq!(
            a.homes(),
            [
                ReplyTarget::User {
                    user_id: "42".into()
                },
                telegram("-1001")
            ]
        );
        assert!(a.lets_in(ChannelKind::Telegram, "888"));
        assert!(!a.lets_in(ChannelKind::Telegram, "42"));
        assert!(a.lets_in(ChannelKind::Discord, "42"));
    }

    #[test]
    fn slack_ids_are_capitals_and_digits_a_member_u_or_w_a_channel_c_g_or_d() {
        let check = |chat: Option<&str>, users: &[&str]| {
            ChatAccess {
                chat: chat.map(str::to_owned),
                users: users.iter().map(|u| u.to_string()).collect(),
                listen: DiscordListen::Mentions,
            }
            .validated(ChannelKind::Slack)
        };
        assert!(check(Some("C0456EFGH"), &["U0123ABCD", "W0123ABCD"]).is_ok());
        assert!(check(Some("D0456EFGH"), &[]).is_ok());
        let e = check(Some("#general"), &[]).unwrap_err().to_string();
        assert!(
            e.contains("not a Slack chat id") && e.contains("starting C"),
            "{e}"
        );
        let e = check(None, &["u0123abcd"]).unwrap_err().to_string();
        assert!(e.contains("not a Slack user id"), "{e}");
        assert!(
            check(None, &["C0123ABCD"]).is_err(),
            "a channel is not a member"
        );
        let mut a = agent();
        a.slack.users = vec!["U0123ABCD".into()];
        assert!(a.lets_in(ChannelKind::Slack, "U0123ABCD"));
        assert!(!a.lets_in(ChannelKind::Telegram, "U0123ABCD"));
        assert_eq!(a.homes().len(), 1);
    }

    #[test]
    fn telegram_ids_are_numbers_and_a_user_is_never_a_group() {
        let check = |chat: Option<&str>, users: &[&str]| {
            ChatAccess {
                chat: chat.map(str::to_owned),
                users: users.iter().map(|u| u.to_string()).collect(),
                listen: DiscordListen::Mentions,
            }
            .validated(ChannelKind::Telegram)
        };
        assert!(check(Some("-1001234567890"), &["123456789"]).is_ok());
        assert!(check(Some(" 55 "), &[]).unwrap().chat.as_deref() == Some("55"));
        let e = check(Some("@mygroup"), &[]).unwrap_err().to_string();
        assert!(e.contains("not a Telegram chat id"), "{e}");
        let e = check(None, &["-100"]).unwrap_err().to_string();
        assert!(e.contains("not a Telegram user id"), "{e}");
        let many: Vec<String> = (0..=MAX_DISCORD_USERS).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(check(None, &many).is_err());
        assert_eq!(
            ChatAccess::parse_users(ChannelKind::Telegram, "1, 2,,1").unwrap(),
            ["1", "2"]
        );
    }
}
