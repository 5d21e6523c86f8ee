//! Agents and their heartbeats.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::chat::ProviderKind;
use super::event::EventCursor;
use super::ids::{ActionId, AgentId, EventId, HeartbeatId, SessionId, ToolName};
use super::requests::Requests;
use super::time::{ActiveHours, Interval, Retention, TimeZoneName};
use super::tool::{Action, ActionStatus, HEARTBEAT_AGENT};
use crate::error::ValidationError;

/// An autonomous agent: who it is, and when it wakes.
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
    /// user's message interrupts it (seed 004).
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
    /// When it was paused (`pulse agents pause`): its heartbeats are not claimed until it
    /// is resumed; its user's messages are still answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<Timestamp>,
    /// When its heartbeat agent calls the model.
    #[serde(default, skip_serializing_if = "ThinkPolicy::is_auto")]
    pub think: ThinkPolicy,
    /// The earliest next wake of its schedules (reminders), if it has any: the finish
    /// of a heartbeat files the next one no later than this. Written on its own
    /// ([`crate::ports::AgentStore::set_next_wake`]), never by a settings update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_wake: Option<Timestamp>,
    /// How long its finished records are kept, over the deployment's `PULSE_RETENTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
}

impl Agent {
    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }

    /// Checks the settings a user gives (on create and on update) and normalises them:
    /// the name trimmed, an empty alias or channel dropped.
    pub fn validated(mut self) -> Result<Self, ValidationError> {
        self.name = self.name.trim().to_owned();
        if self.name.is_empty() || self.name.chars().count() > 100 {
            return Err(ValidationError::new(
                "agent name",
                "give a name of 1 to 100 characters",
            ));
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
        Ok(self)
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

    /// How long after a user turn the next heartbeat waits.
    pub fn quiet_period(&self) -> SignedDuration {
        match self.quiet_period {
            Some(q) => q.duration(),
            None => self.interval.duration() / 2,
        }
    }
}

/// The agents `name` refers to: those whose name it is (ignoring case), or whose alias it
/// is, with or without a leading `@`.
pub fn agents_named<'a>(agents: &'a [Agent], name: &str) -> Vec<&'a Agent> {
    let name = name.trim();
    let bare = name.strip_prefix('@').unwrap_or(name);
    agents
        .iter()
        .filter(|a| {
            a.name.eq_ignore_ascii_case(name)
                || a.alias.as_deref().is_some_and(|alias| {
                    alias
                        .strip_prefix('@')
                        .unwrap_or(alias)
                        .eq_ignore_ascii_case(bare)
                })
        })
        .collect()
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
    /// or the agent has heartbeat instructions.
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
    /// `window_events` counts the events that arrived since the last heartbeat (its own
    /// HEARTBEAT event and its cascades not included).
    pub fn decide(
        self,
        beat: u64,
        window_events: usize,
        has_instructions: bool,
    ) -> Result<(), String> {
        let events = window_events > 0;
        match self {
            Self::Always => Ok(()),
            Self::Auto if events || has_instructions => Ok(()),
            Self::Auto => Err("think auto: no new events and no heartbeat instructions".into()),
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

/// What a user gives to create an agent.
#[derive(Clone, Debug)]
pub struct NewAgent {
    /// Display name (required).
    pub name: String,
    /// Short handle.
    pub alias: Option<String>,
    /// Persona.
    pub persona: Option<String>,
    /// Heartbeat instructions.
    pub instructions: Option<String>,
    /// Heartbeat interval.
    pub interval: Interval,
    /// Active hours.
    pub active_hours: Option<ActiveHours>,
    /// Time zone for the active hours.
    pub timezone: TimeZoneName,
    /// LLM overrides.
    pub llm: AgentLlm,
    /// Heartbeat agent budgets.
    pub budgets: Budgets,
    /// Quiet period after a user turn.
    pub quiet_period: Option<Interval>,
    /// Discord channel.
    pub discord_channel: Option<String>,
    /// When its heartbeat agent thinks.
    pub think: ThinkPolicy,
    /// How long its finished records are kept; the deployment's when unset.
    pub retention: Option<Retention>,
}

impl NewAgent {
    /// An agent with a name and defaults for everything else.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            alias: None,
            persona: None,
            instructions: None,
            interval: Interval::DEFAULT,
            active_hours: None,
            timezone: TimeZoneName::utc(),
            llm: AgentLlm::default(),
            budgets: Budgets::default(),
            quiet_period: None,
            discord_channel: None,
            think: ThinkPolicy::Auto,
            retention: None,
        }
    }

    /// Validates the input and creates the agent with its first heartbeat, due at once
    /// (seed 001: a new agent wakes immediately), or when its active hours next open.
    pub fn create(self, now: Timestamp) -> Result<(Agent, Heartbeat), ValidationError> {
        let id = AgentId::generate();
        let agent = Agent {
            session: SessionId::for_agent(&id),
            id,
            name: self.name,
            alias: self.alias,
            persona: self.persona,
            instructions: self.instructions,
            interval: self.interval,
            active_hours: self.active_hours,
            timezone: self.timezone,
            created_at: now,
            last_interaction_at: None,
            llm: self.llm,
            budgets: self.budgets,
            quiet_period: self.quiet_period,
            discord_channel: self.discord_channel,
            paused_at: None,
            think: self.think,
            next_wake: None,
            retention: self.retention,
        }
        .validated()?;
        let due = agent.in_active_hours(now);
        let first = Heartbeat::pending(&agent, 1, due, EventCursor::origin(), 0, None, 0);
        Ok((agent, first))
    }
}

/// What `pulse agents update` changes; every field left `None` stays as it is.
#[derive(Clone, Debug, Default)]
pub struct AgentChanges {
    /// Display name.
    pub name: Option<String>,
    /// Heartbeat interval.
    pub interval: Option<Interval>,
    /// Active hours; `Some(None)` removes them (always active).
    pub active_hours: Option<Option<ActiveHours>>,
    /// Time zone of the active hours.
    pub timezone: Option<TimeZoneName>,
    /// Heartbeat instructions; `Some(None)` removes them.
    pub instructions: Option<Option<String>>,
    /// LLM provider; `Some(None)` goes back to the configured one.
    pub llm_provider: Option<Option<ProviderKind>>,
    /// Model; `Some(None)` goes back to the configured one.
    pub llm_model: Option<Option<String>>,
    /// API base URL; `Some(None)` goes back to the configured one.
    pub llm_base_url: Option<Option<url::Url>>,
    /// Images to the model; `Some(None)` goes back to deciding by the model.
    pub vision: Option<Option<bool>>,
    /// Most LLM calls per heartbeat.
    pub max_steps: Option<u32>,
    /// Most tokens per heartbeat.
    pub max_tokens: Option<u64>,
    /// Most tokens a day; `Some(None)` removes the daily budget.
    pub daily_tokens: Option<Option<u64>>,
    /// The breaker's cap; `Some(None)` goes back to the default.
    pub max_beats_per_hour: Option<Option<u32>>,
    /// Quiet period after a user turn; `Some(None)` goes back to half the interval.
    pub quiet_period: Option<Option<Interval>>,
    /// Discord channel; `Some(None)` unbinds it.
    pub discord_channel: Option<Option<String>>,
    /// When its heartbeat agent thinks.
    pub think: Option<ThinkPolicy>,
    /// How long its finished records are kept; `Some(None)` goes back to the deployment's.
    pub retention: Option<Option<Retention>>,
}

impl AgentChanges {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.interval.is_none()
            && self.active_hours.is_none()
            && self.timezone.is_none()
            && self.instructions.is_none()
            && self.llm_provider.is_none()
            && self.llm_model.is_none()
            && self.llm_base_url.is_none()
            && self.vision.is_none()
            && self.max_steps.is_none()
            && self.max_tokens.is_none()
            && self.daily_tokens.is_none()
            && self.max_beats_per_hour.is_none()
            && self.quiet_period.is_none()
            && self.discord_channel.is_none()
            && self.think.is_none()
            && self.retention.is_none()
    }

    /// `agent` with the changes, validated as on create.
    pub fn apply(&self, agent: &Agent) -> Result<Agent, ValidationError> {
        fn set<T: Clone>(field: &mut T, change: &Option<T>) {
            if let Some(v) = change {
                *field = v.clone();
            }
        }
        let mut a = agent.clone();
        set(&mut a.name, &self.name);
        set(&mut a.interval, &self.interval);
        set(&mut a.active_hours, &self.active_hours);
        set(&mut a.timezone, &self.timezone);
        set(&mut a.instructions, &self.instructions);
        set(&mut a.llm.provider, &self.llm_provider);
        set(&mut a.llm.model, &self.llm_model);
        set(&mut a.llm.base_url, &self.llm_base_url);
        set(&mut a.llm.vision, &self.vision);
        set(&mut a.budgets.max_steps, &self.max_steps);
        set(&mut a.budgets.max_tokens, &self.max_tokens);
        set(&mut a.budgets.daily_tokens, &self.daily_tokens);
        set(&mut a.budgets.max_beats_per_hour, &self.max_beats_per_hour);
        set(&mut a.quiet_period, &self.quiet_period);
        set(&mut a.discord_channel, &self.discord_channel);
        set(&mut a.think, &self.think);
        set(&mut a.retention, &self.retention);
        a.validated()
    }
}

/// Where a heartbeat is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HeartbeatStatus {
    /// Scheduled, waiting to be due and claimed.
    Pending,
    /// Claimed by a sweeper under a lease; a worker runs or will run it.
    Executing,
    /// Ran to the end; the next one is scheduled.
    Completed,
    /// The engine could not finish it; the error is recorded and the next one is scheduled.
    Failed,
    /// Stopped before it finished (its agent is gone).
    Cancelled,
    /// Scheduled, but its agent is paused: out of the due index, never claimed, until
    /// the agent is resumed.
    Paused,
}

impl HeartbeatStatus {
    /// The stored name (`PENDING`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Executing => "EXECUTING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Paused => "PAUSED",
        }
    }
    /// Reads a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Self::Pending,
            "EXECUTING" => Self::Executing,
            "COMPLETED" => Self::Completed,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            "PAUSED" => Self::Paused,
            _ => return None,
        })
    }
    /// Whether the heartbeat is over.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// One consciousness cycle of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The agent.
    pub agent_id: AgentId,
    /// The beat number: 1 for the first heartbeat, +1 for each next one.
    pub beat: u64,
    /// The session whose queue group runs it.
    pub session: SessionId,
    /// Its status.
    pub status: HeartbeatStatus,
    /// When it is due.
    pub scheduled_at: Timestamp,
    /// How many times it was claimed (1 normally; more after an expired lease). A worker
    /// may only complete the claim it was given.
    pub claim: u32,
    /// Until when the current claim holds; after that a sweeper may reclaim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    /// When it was first claimed. Kept across reclaims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// Its event window starts after this cursor (the previous heartbeat's end).
    pub window_start: EventCursor,
    /// Its event window ends at this cursor; fixed at the first claim so a reclaimed run
    /// reads the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<EventCursor>,
    /// The beat at which the user last interacted (0: never).
    pub last_interaction_beat: u64,
    /// The agent's `last_interaction_at` already counted into `last_interaction_beat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_seen_at: Option<Timestamp>,
    /// Beats since the last user interaction, as given to tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_last: Option<u64>,
    /// Failed heartbeats in a row before this one; drives the retry backoff.
    pub consecutive_failures: u32,
    /// Events processed: window events, the HEARTBEAT event, and cascades.
    pub events_processed: u32,
    /// Actions run (or found already done) in this heartbeat.
    pub actions_triggered: u32,
    /// Of those, how many failed.
    pub actions_failed: u32,
    /// Tool output events beyond the cascade depth cap, recorded but not processed.
    pub cascade_capped: u32,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The start of the breaker's current hour: the first heartbeat counted in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hour_from: Option<Timestamp>,
    /// Heartbeats started in the hour from `hour_from`, before this one.
    #[serde(default)]
    pub beats_in_hour: u32,
    /// Why its heartbeat agent was not called (its think policy found nothing to think
    /// about): that SKIPPED action is kept here, on the record the finish writes anyway,
    /// rather than as an action and a HEARTBEAT event of its own.
    /// [`Heartbeat::skipped_action`] gives it back as an action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The cloud requests it made — its claim, its run and its finish — where the
    /// backend counts them (AWS; none on the embedded store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Requests>,
}

impl Heartbeat {
    /// A new PENDING heartbeat.
    pub fn pending(
        agent: &Agent,
        beat: u64,
        scheduled_at: Timestamp,
        window_start: EventCursor,
        last_interaction_beat: u64,
        interaction_seen_at: Option<Timestamp>,
        consecutive_failures: u32,
    ) -> Self {
        Self {
            agent_id: agent.id.clone(),
            beat,
            session: agent.session.clone(),
            status: HeartbeatStatus::Pending,
            scheduled_at,
            claim: 0,
            lease_until: None,
            started_at: None,
            completed_at: None,
            window_start,
            window_end: None,
            last_interaction_beat,
            interaction_seen_at,
            since_last: None,
            consecutive_failures,
            events_processed: 0,
            actions_triggered: 0,
            actions_failed: 0,
            cascade_capped: 0,
            error: None,
            hour_from: None,
            beats_in_hour: 0,
            skipped: None,
            requests: None,
        }
    }

    /// The id of its HEARTBEAT event, derived from the heartbeat and when it started.
    pub fn heartbeat_event_id(&self, started_at: Timestamp) -> EventId {
        EventId::derived(
            started_at.as_millisecond().max(0) as u64,
            &["heartbeat", &self.id().to_string()],
        )
    }

    /// The heartbeat agent's SKIPPED action when it was not called ([`Heartbeat::skipped`]),
    /// as it would have been recorded.
    pub fn skipped_action(&self) -> Option<Action> {
        let why = self.skipped.clone()?;
        let started = self.started_at?;
        let at = self.completed_at.unwrap_or(started);
        let event_id = self.heartbeat_event_id(started);
        let tool = ToolName::parse(HEARTBEAT_AGENT).ok()?;
        Some(Action {
            id: ActionId::for_event(&event_id, &tool),
            agent_id: self.agent_id.clone(),
            heartbeat_id: self.id(),
            event_id,
            tool,
            status: ActionStatus::Skipped,
            attempt: 1,
            depth: 0,
            // The tool was not called: there was no request.
            request: serde_json::Value::Null,
            response: Some(serde_json::json!({
                "output": {"skipped": why},
                "usage": {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0},
            })),
            error: Some(why),
            started_at: at,
            completed_at: Some(at),
            duration_ms: Some(0),
            new_events: Vec::new(),
        })
    }

    /// The breaker's count for this heartbeat started at `started`: the hour it falls
    /// in and how many heartbeats started in that hour, this one included. An hour
    /// starts with the first heartbeat after the last one ended.
    pub fn hour_count(&self, started: Timestamp) -> (Timestamp, u32) {
        match self.hour_from {
            Some(from) if started.duration_since(from) < SignedDuration::from_hours(1) => {
                (from, self.beats_in_hour.saturating_add(1))
            }
            _ => (started, 1),
        }
    }

    /// Carries the breaker's count `(hour, beats)` of the heartbeat before it.
    pub fn counted(mut self, (from, beats): (Timestamp, u32)) -> Self {
        self.hour_from = Some(from);
        self.beats_in_hour = beats;
        self
    }

    /// Its id.
    pub fn id(&self) -> HeartbeatId {
        HeartbeatId::new(self.agent_id.clone(), self.beat)
    }

    /// The id of the heartbeat scheduled after this one.
    pub fn next_id(&self) -> HeartbeatId {
        HeartbeatId::new(self.agent_id.clone(), self.beat + 1)
    }

    /// When the heartbeat should next be looked at by a sweeper: its schedule while
    /// pending, its lease end while executing, never once it is over.
    pub fn due_at(&self) -> Option<Timestamp> {
        match self.status {
            HeartbeatStatus::Pending => Some(self.scheduled_at),
            HeartbeatStatus::Executing => self.lease_until,
            _ => None,
        }
    }
}

/// What a sweeper asks of a claim.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The claim is valid only if the heartbeat is due at `now` (or its lease expired).
    pub now: Timestamp,
    /// How long the claim holds.
    pub lease: SignedDuration,
    /// The end of the event window, set only by the first claim.
    pub window_end: EventCursor,
}

#[cfg(test)]
mod tests {
    use super::{AgentChanges, NewAgent, ThinkPolicy};
    use jiff::{SignedDuration, Timestamp};

    #[test]
    fn the_breaker_cap_defaults_to_sixty_or_twice_the_planned_beats() {
        let agent = |interval: &str| {
            let mut new = NewAgent::named("a");
            new.interval = interval.parse().unwrap();
            new.create(Timestamp::UNIX_EPOCH).unwrap().0
        };
        assert_eq!(agent("15m").beat_cap(), 60);
        assert_eq!(agent("1m").beat_cap(), 120);
        assert_eq!(agent("2s").scheduled_beats_per_hour(), 1800);
        assert_eq!(agent("2s").beat_cap(), 3600, "the quick start's agent runs");
        assert_eq!(agent("7m").scheduled_beats_per_hour(), 9, "rounded up");
        let a = agent("10m");
        let set = |n| AgentChanges {
            max_beats_per_hour: Some(n),
            ..AgentChanges::default()
        };
        assert_eq!(set(Some(6)).apply(&a).unwrap().beat_cap(), 6);
        let low = set(Some(5)).apply(&a).unwrap_err().to_string();
        assert!(
            low.contains("fewer than its interval of 10m plans (6 an hour)"),
            "{low}"
        );
        assert_eq!(set(None).apply(&a).unwrap().beat_cap(), 60);
        let zero = AgentChanges {
            daily_tokens: Some(Some(0)),
            ..AgentChanges::default()
        };
        assert!(zero.apply(&a).is_err());
    }

    #[test]
    fn the_breaker_counts_heartbeats_within_an_hour_of_the_first() {
        let t0: Timestamp = "2026-03-02T09:00:00Z".parse().unwrap();
        let (_, first) = NewAgent::named("a").create(t0).unwrap();
        assert_eq!(first.hour_count(t0), (t0, 1), "nothing counted yet");
        let counted = first.clone().counted((t0, 5));
        let later = t0 + SignedDuration::from_mins(59);
        assert_eq!(counted.hour_count(later), (t0, 6));
        let next_hour = t0 + SignedDuration::from_mins(60);
        assert_eq!(counted.hour_count(next_hour), (next_hour, 1));
    }

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
        assert!(auto.decide(1, 0, false).is_err());
        assert!(auto.decide(1, 1, false).is_ok());
        assert!(auto.decide(1, 0, true).is_ok());
        assert!(ThinkPolicy::Events.decide(1, 0, true).is_err());
        assert!(ThinkPolicy::Always.decide(1, 0, false).is_ok());
        let every = ThinkPolicy::Every(3);
        let thought: Vec<u64> = (1..=9)
            .filter(|b| every.decide(*b, 5, true).is_ok())
            .collect();
        assert_eq!(thought, [3, 6, 9], "every:N counts beats, events or not");
    }
}
