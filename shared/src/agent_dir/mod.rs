//! An agent as a directory of files, kept in git and applied with `pulse apply`:
//!
//! - `agent.toml`: its settings (name, interval, hours, model, budgets, Discord, tools);
//! - `SOUL.md`: its persona, the system prompt's first part;
//! - `HEARTBEAT.md`: what it does on each beat;
//! - `schedules.toml`: its reminders, each with a name that stays;
//! - `hooks.toml`, `webhooks.toml`: its outbound hooks and inbound webhooks, by name;
//! - `tools.toml`: the tools its files own and the events that run tools;
//! - `memories.md`: seed memories, each given once.
//!
//! Every key is checked: a key no file knows is refused with the file and the key, so a
//! typo never leaves a setting quietly at its default. A file holds the whole truth of
//! what it covers: a setting it leaves out is the default, and the plan shows a store
//! that differs. [`plan`] compares directories with a store, [`apply`] carries a plan
//! out, and [`AgentDir::of`] writes an agent back as files (`pulse export`).

mod hooks;
mod plan;
mod tools;
mod webhooks;

pub use hooks::{HOOKS_TOML, HookChange, HookToml, HooksToml, header_variable};
pub use tools::{
    HttpToolToml, McpToml, SubscriptionToml, TOOLS_TOML, ToolChange, ToolTarget, ToolsToml,
    config_variable,
};
pub use webhooks::{WEBHOOKS_TOML, WebhookChange, WebhookToml, WebhooksToml};

pub use plan::{
    APPLIED, AgentPlan, Applied, ApplyOptions, NewSecret, NewWebhook, Plan, PlanError, PlanOptions,
    ScheduleChange, Verb,
};
pub use plan::{apply, plan};

use std::fmt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::domain::{
    ActiveHours, Agent, AgentLlm, AgentTool, AutoPause, Budgets, ChatAccess, DiscordAccess,
    DiscordListen, Expectation, Interval, MAX_PROMPT_TEXT, Must, NewAgent, ProviderKind, Retention,
    Schedule, ScheduleRule, ThinkPolicy, TimeZoneName, Usd,
};

/// The settings file.
pub const AGENT_TOML: &str = "agent.toml";
/// The persona file.
pub const SOUL_MD: &str = "SOUL.md";
/// The heartbeat instructions file.
pub const HEARTBEAT_MD: &str = "HEARTBEAT.md";
/// The reminders file.
pub const SCHEDULES_TOML: &str = "schedules.toml";
/// The seed memories file.
pub const MEMORIES_MD: &str = "memories.md";

/// Most characters of a schedule's name.
pub const MAX_SCHEDULE_NAME: usize = 60;

/// One setting that differs: as the store has it, and as the files say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    /// Its key as the files write it (`interval`, `model.provider`, `SOUL.md`).
    pub field: String,
    /// In the store; `None` when unset.
    pub before: Option<String>,
    /// In the files; `None` when unset.
    pub after: Option<String>,
}

impl FieldChange {
    /// The settings of `after` that differ from `before`'s, both by key.
    pub(crate) fn between(
        before: &std::collections::BTreeMap<&'static str, Option<String>>,
        after: &std::collections::BTreeMap<&'static str, Option<String>>,
    ) -> Vec<Self> {
        before
            .iter()
            .filter(|(k, v)| after.get(*k) != Some(*v))
            .map(|(k, v)| Self {
                field: (*k).to_owned(),
                before: v.clone(),
                after: after.get(k).cloned().flatten(),
            })
            .collect()
    }
}

/// What is wrong with a file: which, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file (or directory).
    pub file: PathBuf,
    /// What is wrong.
    pub problem: String,
}

impl FileError {
    fn new(file: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.problem)
    }
}

impl std::error::Error for FileError {}

/// `agent.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentToml {
    /// Its name: how `apply` finds it in the store (1 to 100 characters).
    pub name: String,
    /// Its short handle (`@scout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Time between heartbeats (`2s`, `15m`, `1h`).
    #[serde(default = "default_interval")]
    #[schemars(with = "String")]
    pub interval: Interval,
    /// Hours in which heartbeats may run, `HH:MM-HH:MM`; always when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub active_hours: Option<ActiveHours>,
    /// The IANA time zone of the active hours and budgets' days (UTC when left out).
    #[serde(default = "TimeZoneName::utc", skip_serializing_if = "is_utc")]
    #[schemars(with = "String")]
    pub timezone: TimeZoneName,
    /// How long after its user's message the next heartbeat waits (half the interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub quiet_period: Option<Interval>,
    /// When its heartbeat agent calls the model: auto, events, always or every:N.
    #[serde(default, skip_serializing_if = "ThinkPolicy::is_auto")]
    #[schemars(with = "String")]
    pub think: ThinkPolicy,
    /// What each heartbeat must do: speak or act.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub expect: Option<Must>,
    /// Heartbeats in a row that did not before its operator is told (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_after: Option<u32>,
    /// How many days of beats halve a memory's weight (30d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub memory_half_life: Option<Interval>,
    /// How long a call parked for approval waits (1d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub approval_expiry: Option<Interval>,
    /// How long its finished records are kept (the deployment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub retention: Option<Retention>,
    /// How long its user may stay silent before it stops beating on its own (30d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub auto_pause_after: Option<AutoPause>,
    /// The MCP servers whose tools it may call (`mcp:NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub tools: Vec<AgentTool>,
    /// Its own model settings, over the deployment's.
    #[serde(default, skip_serializing_if = "ModelToml::is_default")]
    pub model: ModelToml,
    /// What one heartbeat, a day or a month may spend.
    #[serde(default, skip_serializing_if = "BudgetsToml::is_default")]
    pub budgets: BudgetsToml,
    /// Who reaches it on Discord, and where it speaks.
    #[serde(default, skip_serializing_if = "DiscordToml::is_default")]
    pub discord: DiscordToml,
    /// Who reaches it on Telegram, and where it speaks.
    #[serde(default, skip_serializing_if = "TelegramToml::is_default")]
    pub telegram: TelegramToml,
    /// Who reaches it on Slack, and where it speaks.
    #[serde(default, skip_serializing_if = "SlackToml::is_default")]
    pub slack: SlackToml,
}

fn default_interval() -> Interval {
    Interval::DEFAULT
}

fn is_utc(tz: &TimeZoneName) -> bool {
    *tz == TimeZoneName::utc()
}

/// `[model]` in `agent.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelToml {
    /// anthropic, openai or offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub provider: Option<ProviderKind>,
    /// The model it talks with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model its heartbeats think with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_model: Option<String>,
    /// An API base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub base_url: Option<url::Url>,
    /// The variable holding its own API key (`PULSE_LLM_KEY_…`): the name, never the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Whether the model is sent images (decided by the model when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<bool>,
}

impl ModelToml {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl From<AgentLlm> for ModelToml {
    fn from(l: AgentLlm) -> Self {
        Self {
            provider: l.provider,
            model: l.model,
            heartbeat_model: l.heartbeat_model,
            base_url: l.base_url,
            api_key_env: l.api_key_env,
            vision: l.vision,
        }
    }
}

impl From<ModelToml> for AgentLlm {
    fn from(m: ModelToml) -> Self {
        Self {
            provider: m.provider,
            model: m.model.filter(|s| !s.trim().is_empty()),
            heartbeat_model: m.heartbeat_model.filter(|s| !s.trim().is_empty()),
            base_url: m.base_url,
            api_key_env: m.api_key_env.map(|v| v.trim().to_owned()),
            vision: m.vision,
        }
    }
}

/// `[budgets]` in `agent.toml`; each left out is the default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetsToml {
    /// Most model calls in one heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Most tokens in one heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most tokens a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    /// Most dollars a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<f64>")]
    pub usd_day: Option<Usd>,
    /// Most dollars a month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<f64>")]
    pub usd_month: Option<Usd>,
    /// Most model calls a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_per_minute: Option<u32>,
    /// The breaker's cap on heartbeats an hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_beats_per_hour: Option<u32>,
}

impl BudgetsToml {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    fn of(b: &Budgets) -> Self {
        let d = Budgets::default();
        Self {
            max_steps: (b.max_steps != d.max_steps).then_some(b.max_steps),
            max_tokens: (b.max_tokens != d.max_tokens).then_some(b.max_tokens),
            daily_tokens: b.daily_tokens,
            usd_day: b.usd_day,
            usd_month: b.usd_month,
            max_calls_per_minute: b.max_calls_per_minute,
            max_beats_per_hour: b.max_beats_per_hour,
        }
    }

    fn budgets(&self) -> Budgets {
        let d = Budgets::default();
        Budgets {
            max_steps: self.max_steps.unwrap_or(d.max_steps),
            max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
            daily_tokens: self.daily_tokens,
            usd_day: self.usd_day,
            usd_month: self.usd_month,
            max_calls_per_minute: self.max_calls_per_minute,
            max_beats_per_hour: self.max_beats_per_hour,
        }
    }
}

/// `[discord]` in `agent.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiscordToml {
    /// The channel it speaks in (its id, all digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The users whose direct messages it answers (Discord user ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// When it answers in its channel: mentions or all.
    #[serde(default, skip_serializing_if = "is_mentions")]
    #[schemars(with = "String")]
    pub listen: DiscordListen,
}

fn is_mentions(l: &DiscordListen) -> bool {
    *l == DiscordListen::Mentions
}

impl DiscordToml {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `[telegram]` in `agent.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelegramToml {
    /// The chat it speaks in when nobody spoke to it first (a group's id, negative);
    /// without one, its first user's private chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The users who may talk to it privately and steer it (Telegram user ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// When it answers in its group: mentions or all.
    #[serde(default, skip_serializing_if = "is_mentions")]
    #[schemars(with = "String")]
    pub listen: DiscordListen,
}

impl TelegramToml {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `[slack]` in `agent.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlackToml {
    /// The channel it speaks in when nobody spoke to it first (its id, `C…`); without
    /// one, its first user's direct messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The users who may talk to it in direct messages and steer it (member ids, `U…`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// When it answers in its channel: mentions or all.
    #[serde(default, skip_serializing_if = "is_mentions")]
    #[schemars(with = "String")]
    pub listen: DiscordListen,
}

impl SlackToml {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `schedules.toml`: `[[schedule]]` tables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulesToml {
    /// The reminders.
    #[serde(default, rename = "schedule", skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleToml>,
}

/// One `[[schedule]]`: `cron` (with `timezone`, the agent's when left out) or `at`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleToml {
    /// Its name: how `apply` finds it again (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// A cron pattern (minute, hour, day of month, month, day of week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The time zone of `cron`; the agent's when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub timezone: Option<TimeZoneName>,
    /// Once, at this time (RFC 3339, e.g. `2026-12-24T09:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub at: Option<Timestamp>,
    /// What it is about, given to the agent with each wake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What each heartbeat it wakes must do: speak or act.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub expect: Option<Must>,
    /// Its runs in a row that did not before its operator is told (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_after: Option<u32>,
}

impl ScheduleToml {
    /// The rule it names, in `agent_zone` when it gives no zone of its own.
    pub fn rule(&self, agent_zone: &TimeZoneName) -> Result<ScheduleRule, String> {
        match (&self.cron, self.at) {
            (Some(pattern), None) => ScheduleRule::cron(
                pattern,
                self.timezone.clone().unwrap_or_else(|| agent_zone.clone()),
            )
            .map_err(|e| e.to_string()),
            (None, Some(at)) if self.timezone.is_none() => Ok(ScheduleRule::Once { at }),
            (None, Some(_)) => {
                Err("`timezone` goes with `cron`; `at` is a time in UTC or with its offset".into())
            }
            _ => Err("give one of `cron` or `at`".into()),
        }
    }

    /// What each heartbeat it wakes must do.
    pub fn expectation(&self) -> Result<Option<Expectation>, String> {
        match (self.expect, self.alert_after) {
            (None, Some(_)) => Err("`alert_after` goes with `expect`".into()),
            (None, None) => Ok(None),
            (Some(must), n) => Expectation {
                must,
                alert_after: n.unwrap_or(Expectation::ALERT_AFTER),
            }
            .checked("runs")
            .map(Some)
            .map_err(|e| e.to_string()),
        }
    }

    /// The file's entry for a stored schedule: its name, or its id when it has none.
    pub fn of(s: &Schedule, agent_zone: &TimeZoneName) -> Self {
        let (cron, timezone, at) = match &s.rule {
            ScheduleRule::Cron { pattern, timezone } => (
                Some(pattern.clone()),
                (timezone != agent_zone).then(|| timezone.clone()),
                None,
            ),
            ScheduleRule::Once { at } => (None, None, Some(*at)),
        };
        Self {
            name: s.key().to_owned(),
            cron,
            timezone,
            at,
            note: s.note.clone(),
            expect: s.expect.map(|e| e.must),
            alert_after: s
                .expect
                .map(|e| e.alert_after)
                .filter(|n| *n != Expectation::ALERT_AFTER),
        }
    }
}

/// What is an agent's own beside its record, as a store holds it: what an export writes.
#[derive(Clone, Debug, Default)]
pub struct Owned {
    /// Its schedules.
    pub schedules: Vec<Schedule>,
    /// Its hooks.
    pub hooks: Vec<crate::domain::Hook>,
    /// Its webhooks.
    pub webhooks: Vec<crate::domain::Webhook>,
    /// The tools its files own.
    pub tools: Vec<crate::domain::Tool>,
    /// The subscriptions of its events.
    pub subscriptions: Vec<crate::domain::Subscription>,
    /// Its memories that were given as seeds and are still kept.
    pub seeds: Vec<crate::domain::Memory>,
}

impl Owned {
    /// `agent`'s, read from `store`.
    pub async fn of(
        store: &dyn crate::ports::Store,
        agent: &crate::domain::AgentId,
    ) -> Result<Self, crate::error::StoreError> {
        let registry = store.load_registry().await?;
        Ok(Self {
            tools: registry
                .tools
                .into_iter()
                .filter(|t| t.owner.as_ref() == Some(agent))
                .collect(),
            subscriptions: registry
                .subscriptions
                .into_iter()
                .filter(|s| s.agent_id.as_ref() == Some(agent))
                .collect(),
            schedules: store.schedules(agent).await?,
            hooks: store.list_hooks(agent).await?,
            webhooks: store
                .list_webhooks()
                .await?
                .into_iter()
                .filter(|w| w.agent_id == *agent)
                .collect(),
            seeds: match store.get_agent(agent).await? {
                Some(a) if !a.seeded.is_empty() => store
                    .all_memories(agent)
                    .await?
                    .into_iter()
                    .filter(|m| a.seeded.contains(&seed_key(&m.text)))
                    .collect(),
                _ => Vec::new(),
            },
        })
    }
}

/// One agent's directory, read.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentDir {
    /// Where it was read from.
    pub path: PathBuf,
    /// `agent.toml`.
    pub agent: AgentToml,
    /// `SOUL.md`, trimmed; `None` when absent or empty.
    pub soul: Option<String>,
    /// `HEARTBEAT.md`, trimmed; `None` when absent or empty.
    pub heartbeat: Option<String>,
    /// `schedules.toml`'s entries.
    pub schedules: Vec<ScheduleToml>,
    /// `hooks.toml`'s entries.
    pub hooks: Vec<HookToml>,
    /// `webhooks.toml`'s entries.
    pub webhooks: Vec<WebhookToml>,
    /// `tools.toml`.
    pub tools: ToolsToml,
    /// `memories.md`'s seed memories, one a line.
    pub memories: Vec<String>,
}

/// The seed memories of `memories.md`: one a line; blank lines and headings (`#`) left
/// out, a list's `- ` or `* ` taken off.
fn seed_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.strip_prefix("- ")
                .or_else(|| l.strip_prefix("* "))
                .unwrap_or(l)
                .trim()
                .to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// How an agent's record remembers a seed memory it was given: a digest of its text.
pub fn seed_key(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.trim().as_bytes());
    hex::encode(&digest[..8])
}

/// Checks a schedule's or a hook's name: what is wrong with it.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_SCHEDULE_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: give 1 to {MAX_SCHEDULE_NAME} letters, digits, `-`, `_` or `.`"
        ))
    }
}

/// A text file, trimmed; `None` when it is absent or holds only white space.
fn read_text(path: &Path) -> Result<Option<String>, FileError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t.trim().to_owned()).filter(|t| !t.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(FileError::new(path, "is not UTF-8 text"))
        }
        Err(e) => Err(FileError::new(path, format!("cannot be read: {e}"))),
    }
}

/// A TOML file as `T`, its error naming the line and the key.
fn read_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, FileError> {
    toml::from_str(text).map_err(|e| FileError::new(path, e.to_string().trim_end().to_owned()))
}

impl AgentDir {
    /// Reads the directory at `path`: `agent.toml` must be there; the others may not.
    pub fn read(path: &Path) -> Result<Self, FileError> {
        if !path.is_dir() {
            return Err(FileError::new(
                path,
                "is not a directory; give an agent's directory (one holding agent.toml)",
            ));
        }
        let agent_file = path.join(AGENT_TOML);
        let Some(text) = read_text(&agent_file)? else {
            return Err(FileError::new(
                &agent_file,
                "is missing or empty; an agent's directory holds its settings there (`pulse export AGENT DIR` writes one)",
            ));
        };
        let agent: AgentToml = read_toml(&agent_file, &text)?;
        let schedules_file = path.join(SCHEDULES_TOML);
        let schedules = match read_text(&schedules_file)? {
            Some(text) => read_toml::<SchedulesToml>(&schedules_file, &text)?.schedules,
            None => Vec::new(),
        };
        let hooks_file = path.join(HOOKS_TOML);
        let hooks = match read_text(&hooks_file)? {
            Some(text) => read_toml::<HooksToml>(&hooks_file, &text)?.hooks,
            None => Vec::new(),
        };
        let webhooks_file = path.join(WEBHOOKS_TOML);
        let webhooks = match read_text(&webhooks_file)? {
            Some(text) => read_toml::<WebhooksToml>(&webhooks_file, &text)?.webhooks,
            None => Vec::new(),
        };
        let tools_file = path.join(TOOLS_TOML);
        let tools = match read_text(&tools_file)? {
            Some(text) => read_toml::<ToolsToml>(&tools_file, &text)?,
            None => ToolsToml::default(),
        };
        let memories_file = path.join(MEMORIES_MD);
        let memories = read_text(&memories_file)?
            .map(|t| seed_lines(&t))
            .unwrap_or_default();
        if let Some(long) = memories
            .iter()
            .find(|m| m.chars().count() > crate::domain::MAX_MEMORY_CHARS)
        {
            return Err(FileError::new(
                &memories_file,
                format!(
                    "a memory of {} characters (\"{}…\"); one is at most {}: keep the gist, one a line",
                    long.chars().count(),
                    long.chars().take(40).collect::<String>(),
                    crate::domain::MAX_MEMORY_CHARS
                ),
            ));
        }
        let dir = Self {
            path: path.to_owned(),
            agent,
            soul: read_text(&path.join(SOUL_MD))?,
            heartbeat: read_text(&path.join(HEARTBEAT_MD))?,
            schedules,
            hooks,
            webhooks,
            tools,
            memories,
        };
        webhooks::specs(&webhooks_file, &dir.webhooks)?;
        dir.check_schedules()?;
        Ok(dir)
    }

    fn check_schedules(&self) -> Result<(), FileError> {
        let file = self.path.join(SCHEDULES_TOML);
        let mut seen = std::collections::HashSet::new();
        for s in &self.schedules {
            let name = s.name.trim();
            check_name(name).map_err(|p| FileError::new(&file, format!("schedule name {p}")))?;
            if !seen.insert(name.to_ascii_lowercase()) {
                return Err(FileError::new(
                    &file,
                    format!("two schedules are named {name:?}; each needs its own name"),
                ));
            }
            s.rule(&self.agent.timezone)
                .and_then(|_| s.expectation())
                .map_err(|e| FileError::new(&file, format!("schedule {name:?}: {e}")))?;
        }
        Ok(())
    }

    /// The sizes of the texts sent with every model call, against their budget.
    pub fn sizes(&self) -> Vec<Size> {
        [(SOUL_MD, &self.soul), (HEARTBEAT_MD, &self.heartbeat)]
            .into_iter()
            .filter_map(|(file, text)| text.as_deref().map(|t| Size::of(file, t)))
            .collect()
    }

    /// The agent the files describe, to create or to compare with the store's. Refused,
    /// with the file, its size and the budget, when a text is over its budget: a file
    /// is never cut.
    pub fn new_agent(&self) -> Result<NewAgent, FileError> {
        for size in self.sizes() {
            if size.chars > size.budget {
                return Err(FileError::new(
                    self.path.join(size.file),
                    format!(
                        "{} characters (about {} tokens); the budget is {} characters, as it is sent with every model call: shorten it (nothing was applied)",
                        size.chars, size.tokens, size.budget
                    ),
                ));
            }
        }
        let a = &self.agent;
        let file = self.path.join(AGENT_TOML);
        let expect = match (a.expect, a.alert_after) {
            (None, Some(_)) => {
                return Err(FileError::new(&file, "`alert_after` goes with `expect`"));
            }
            (must, n) => must.map(|must| Expectation {
                must,
                alert_after: n.unwrap_or(Expectation::ALERT_AFTER),
            }),
        };
        let mut discord_users = a.discord.users.clone();
        discord_users.retain(|u| !u.trim().is_empty());
        Ok(NewAgent {
            name: a.name.clone(),
            alias: a.alias.clone(),
            persona: self.soul.clone(),
            instructions: self.heartbeat.clone(),
            interval: a.interval,
            active_hours: a.active_hours,
            timezone: a.timezone.clone(),
            llm: a.model.clone().into(),
            budgets: a.budgets.budgets(),
            quiet_period: a.quiet_period,
            memory_half_life: a.memory_half_life,
            approval_expiry: a.approval_expiry,
            discord_channel: a.discord.channel.clone(),
            discord: DiscordAccess {
                users: discord_users,
                listen: a.discord.listen,
            },
            telegram: ChatAccess {
                chat: a.telegram.chat.clone(),
                users: a.telegram.users.clone(),
                listen: a.telegram.listen,
            },
            slack: ChatAccess {
                chat: a.slack.channel.clone(),
                users: a.slack.users.clone(),
                listen: a.slack.listen,
            },
            think: a.think,
            expect,
            retention: a.retention,
            auto_pause_after: a.auto_pause_after,
            tools: a.tools.clone(),
        })
    }

    /// The directory that describes `agent` with what is its own, to write at `path`.
    pub fn of(agent: &Agent, own: &Owned, path: &Path) -> Self {
        let schedules = &own.schedules;
        Self {
            path: path.to_owned(),
            agent: AgentToml {
                name: agent.name.clone(),
                alias: agent.alias.clone(),
                interval: agent.interval,
                active_hours: agent.active_hours,
                timezone: agent.timezone.clone(),
                quiet_period: agent.quiet_period,
                think: agent.think,
                expect: agent.expect.map(|e| e.must),
                alert_after: agent
                    .expect
                    .map(|e| e.alert_after)
                    .filter(|n| *n != Expectation::ALERT_AFTER),
                memory_half_life: agent.memory_half_life,
                approval_expiry: agent.approval_expiry,
                retention: agent.retention,
                auto_pause_after: agent.auto_pause_after,
                tools: agent.tools.clone(),
                model: agent.llm.clone().into(),
                budgets: BudgetsToml::of(&agent.budgets),
                discord: DiscordToml {
                    channel: agent.discord_channel.clone(),
                    users: agent.discord.users.clone(),
                    listen: agent.discord.listen,
                },
                telegram: TelegramToml {
                    chat: agent.telegram.chat.clone(),
                    users: agent.telegram.users.clone(),
                    listen: agent.telegram.listen,
                },
                slack: SlackToml {
                    channel: agent.slack.chat.clone(),
                    users: agent.slack.users.clone(),
                    listen: agent.slack.listen,
                },
            },
            soul: agent.persona.clone(),
            heartbeat: agent.instructions.clone(),
            schedules: schedules
                .iter()
                .filter(|s| s.next_at.is_some() || s.name.is_some())
                .map(|s| ScheduleToml::of(s, &agent.timezone))
                .collect(),
            hooks: hooks::entries(&own.hooks),
            webhooks: webhooks::entries(&own.webhooks),
            tools: tools::entries(&own.tools, &own.subscriptions),
            memories: {
                // In the order they were given.
                let mut seeds = own.seeds.clone();
                seeds.sort_by_key(|m| {
                    let key = seed_key(&m.text);
                    agent.seeded.iter().position(|k| *k == key)
                });
                seeds.into_iter().map(|m| m.text).collect()
            },
        }
    }

    /// The files' contents, by name: `agent.toml` always, the others when they hold
    /// something.
    pub fn files(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![(
            AGENT_TOML,
            toml::to_string(&self.agent).expect("agent.toml is plain TOML"),
        )];
        if let Some(t) = &self.soul {
            out.push((SOUL_MD, format!("{t}\n")));
        }
        if let Some(t) = &self.heartbeat {
            out.push((HEARTBEAT_MD, format!("{t}\n")));
        }
        if !self.schedules.is_empty() {
            let file = SchedulesToml {
                schedules: self.schedules.clone(),
            };
            out.push((
                SCHEDULES_TOML,
                toml::to_string(&file).expect("schedules.toml is plain TOML"),
            ));
        }
        if !self.webhooks.is_empty() {
            let file = WebhooksToml {
                webhooks: self.webhooks.clone(),
            };
            out.push((
                WEBHOOKS_TOML,
                toml::to_string(&file).expect("webhooks.toml is plain TOML"),
            ));
        }
        if !self.tools.is_empty() {
            out.push((
                TOOLS_TOML,
                toml::to_string(&self.tools).expect("tools.toml is plain TOML"),
            ));
        }
        if !self.memories.is_empty() {
            let lines: String = self.memories.iter().map(|m| format!("- {m}\n")).collect();
            out.push((MEMORIES_MD, lines));
        }
        if !self.hooks.is_empty() {
            let file = HooksToml {
                hooks: self.hooks.clone(),
            };
            out.push((
                HOOKS_TOML,
                toml::to_string(&file).expect("hooks.toml is plain TOML"),
            ));
        }
        out
    }
}

/// The JSON Schema of `agent.toml` (read as JSON: TOML's tables are its objects).
pub fn agent_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(AgentToml)).expect("a schema is JSON")
}

/// The JSON Schema of `schedules.toml`.
pub fn schedules_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(SchedulesToml)).expect("a schema is JSON")
}

/// The JSON Schema of `webhooks.toml`.
pub fn webhooks_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(WebhooksToml)).expect("a schema is JSON")
}

/// The JSON Schema of `tools.toml`.
pub fn tools_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(ToolsToml)).expect("a schema is JSON")
}

/// The JSON Schema of `hooks.toml`.
pub fn hooks_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(HooksToml)).expect("a schema is JSON")
}

/// A text's size against its budgets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Size {
    /// The file.
    pub file: &'static str,
    /// Its characters.
    pub chars: usize,
    /// Its tokens, as `counted_by` says.
    pub tokens: usize,
    /// How its tokens were counted: the model's tokenizer or provider, or an estimate
    /// at four characters a token and why.
    pub counted_by: String,
    /// Whether the model's own counting gave `tokens`.
    pub exact: bool,
    /// The most characters it may hold.
    pub budget: usize,
    /// The most tokens it may take, when the model's counting is known.
    pub token_budget: usize,
}

impl Size {
    fn of(file: &'static str, text: &str) -> Self {
        let estimate = crate::llm::tokens::TokenCount::estimate(text, "not counted yet");
        Self {
            file,
            chars: text.chars().count(),
            tokens: estimate.tokens,
            counted_by: estimate.by,
            exact: false,
            budget: MAX_PROMPT_TEXT,
            token_budget: crate::domain::MAX_PROMPT_TOKENS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        d
    }

    #[test]
    fn a_key_no_file_knows_is_refused_with_its_file_and_line() {
        let d = dir(&[(AGENT_TOML, "name = \"scout\"\nintervall = \"5m\"\n")]);
        let e = AgentDir::read(d.path()).unwrap_err();
        assert_eq!(e.file, d.path().join(AGENT_TOML));
        assert!(e.problem.contains("intervall"), "{e}");
        assert!(e.problem.contains("line 2"), "{e}");
        let d = dir(&[(AGENT_TOML, "name = \"scout\"\n[budgets]\nmax_stepz = 3\n")]);
        let e = AgentDir::read(d.path()).unwrap_err();
        assert!(e.problem.contains("max_stepz"), "{e}");
        let d = dir(&[(AGENT_TOML, "name = \"scout\"\ninterval = \"soon\"\n")]);
        let e = AgentDir::read(d.path()).unwrap_err();
        assert!(e.problem.contains("soon"), "{e}");
    }

    #[test]
    fn a_directory_without_settings_says_what_it_needs() {
        let d = dir(&[(SOUL_MD, "You are kind.")]);
        let e = AgentDir::read(d.path()).unwrap_err().to_string();
        assert!(e.contains("agent.toml: is missing"), "{e}");
        assert!(e.contains("pulse export"), "{e}");
    }

    #[test]
    fn schedules_need_a_name_each_and_one_rule() {
        let agent = (AGENT_TOML, "name = \"scout\"\n");
        for (text, says) in [
            (
                "[[schedule]]\nname = \"a b\"\ncron = \"0 9 * * *\"\n",
                "letters, digits",
            ),
            (
                "[[schedule]]\nname = \"a\"\ncron = \"0 9 * * *\"\n[[schedule]]\nname = \"A\"\ncron = \"0 10 * * *\"\n",
                "two schedules are named",
            ),
            ("[[schedule]]\nname = \"a\"\n", "give one of `cron` or `at`"),
            (
                "[[schedule]]\nname = \"a\"\ncron = \"61 9 * * *\"\n",
                "schedule \"a\"",
            ),
            (
                "[[schedule]]\nname = \"a\"\ncron = \"0 9 * * *\"\nalert_after = 2\n",
                "`alert_after` goes with `expect`",
            ),
        ] {
            let d = dir(&[agent, (SCHEDULES_TOML, text)]);
            let e = AgentDir::read(d.path()).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn an_oversized_soul_is_refused_with_its_size_never_cut() {
        let long = "word ".repeat(4_000);
        let d = dir(&[(AGENT_TOML, "name = \"scout\"\n"), (SOUL_MD, &long)]);
        let read = AgentDir::read(d.path()).unwrap();
        let e = read.new_agent().unwrap_err();
        assert_eq!(e.file, d.path().join(SOUL_MD));
        assert!(e.problem.starts_with("19999 characters"), "{e}");
        assert!(e.problem.contains("budget is 16000 characters"), "{e}");
    }

    #[test]
    fn files_written_from_an_agent_read_back_as_the_same_agent() {
        let text = r#"name = "scout"
alias = "sc"
interval = "30m"
active_hours = "08:00-22:00"
timezone = "Europe/Paris"
think = "every:3"
expect = "speak"
alert_after = 5
tools = ["mcp:github"]

[model]
provider = "openai"
heartbeat_model = "gpt-4o-mini"
vision = false

[budgets]
max_steps = 4
usd_day = 2.5

[discord]
channel = "123456789"
users = ["42"]
listen = "all"
"#;
        let d = dir(&[
            (AGENT_TOML, text),
            (SOUL_MD, "You are Scout.\n"),
            (HEARTBEAT_MD, "Look at the inbox.\n"),
        ]);
        let read = AgentDir::read(d.path()).unwrap();
        let (agent, _) = read
            .new_agent()
            .unwrap()
            .create(Timestamp::UNIX_EPOCH)
            .unwrap();
        assert_eq!(agent.budgets.usd_day, Some(Usd::from_dollars(2.5)));
        assert_eq!(agent.persona.as_deref(), Some("You are Scout."));
        let back = AgentDir::of(&agent, &Owned::default(), d.path());
        assert_eq!(back, read);
        let out = tempfile::tempdir().unwrap();
        for (name, text) in back.files() {
            std::fs::write(out.path().join(name), text).unwrap();
        }
        let again = AgentDir::read(out.path()).unwrap();
        assert_eq!(again.agent, read.agent);
        assert_eq!(again.soul, read.soul);
    }
}
