//! What a user gives: a new agent (checked, and created with its first heartbeat), and
//! the changes `pulse agents update` makes to one.

use jiff::Timestamp;

use super::agent::{
    Agent, AgentLlm, Budgets, ChatAccess, DiscordAccess, DiscordListen, ThinkPolicy,
};
use super::chat::ProviderKind;
use super::event::EventCursor;
use super::expectation::{Expectation, Must};
use super::heartbeat::Heartbeat;
use super::ids::{AgentId, SessionId};
use super::time::{ActiveHours, AutoPause, Interval, Retention, TimeZoneName};
use crate::error::ValidationError;

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
    /// Memory half-life (default 30 days).
    pub memory_half_life: Option<Interval>,
    /// How long a parked call waits for approval (default a day).
    pub approval_expiry: Option<Interval>,
    /// Discord channel.
    pub discord_channel: Option<String>,
    /// Who talks to it in direct messages, and when it answers in its channel.
    pub discord: DiscordAccess,
    /// Its Telegram chat, who talks to it there, and when it answers in a group.
    pub telegram: ChatAccess,
    /// Its Slack channel, who talks to it there, and when it answers in the channel.
    pub slack: ChatAccess,
    /// When its heartbeat agent thinks.
    pub think: ThinkPolicy,
    /// What each heartbeat must do.
    pub expect: Option<Expectation>,
    /// How long its finished records are kept; the deployment's when unset.
    pub retention: Option<Retention>,
    /// `--auto-pause-after` (default 30 days of silence).
    pub auto_pause_after: Option<AutoPause>,
    /// The MCP servers whose tools it may call.
    pub tools: Vec<super::mcp::AgentTool>,
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
            memory_half_life: None,
            approval_expiry: None,
            discord_channel: None,
            discord: DiscordAccess::default(),
            telegram: ChatAccess::default(),
            slack: ChatAccess::default(),
            think: ThinkPolicy::Auto,
            expect: None,
            retention: None,
            auto_pause_after: None,
            tools: Vec::new(),
        }
    }

    /// Validates the input and creates the agent with its first heartbeat, due at once
    /// (a new agent wakes immediately), or when its active hours next open.
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
            memory_half_life: self.memory_half_life,
            approval_expiry: self.approval_expiry,
            discord_channel: self.discord_channel,
            discord: self.discord,
            telegram: self.telegram,
            slack: self.slack,
            paused_at: None,
            snoozed_until: None,
            auto_pause_after: self.auto_pause_after,
            auto_paused_since: None,
            cancel_requested_at: None,
            think: self.think,
            expect: self.expect,
            next_wake: None,
            retention: self.retention,
            tools: self.tools,
            granted: Vec::new(),
            seeded: Vec::new(),
            applied: None,
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
    /// Short handle; `Some(None)` removes it.
    pub alias: Option<Option<String>>,
    /// Heartbeat interval.
    pub interval: Option<Interval>,
    /// Active hours; `Some(None)` removes them (always active).
    pub active_hours: Option<Option<ActiveHours>>,
    /// Time zone of the active hours.
    pub timezone: Option<TimeZoneName>,
    /// Heartbeat instructions; `Some(None)` removes them.
    pub instructions: Option<Option<String>>,
    /// Persona (the system prompt's first part); `Some(None)` removes it.
    pub persona: Option<Option<String>>,
    /// LLM provider; `Some(None)` goes back to the configured one.
    pub llm_provider: Option<Option<ProviderKind>>,
    /// Model; `Some(None)` goes back to the configured one.
    pub llm_model: Option<Option<String>>,
    /// The heartbeats' model; `Some(None)` goes back to the chat model.
    pub heartbeat_model: Option<Option<String>>,
    /// API base URL; `Some(None)` goes back to the configured one.
    pub llm_base_url: Option<Option<url::Url>>,
    /// The variable holding its own API key; `Some(None)` sends the deployment's.
    pub llm_api_key_env: Option<Option<String>>,
    /// Images to the model; `Some(None)` goes back to deciding by the model.
    pub vision: Option<Option<bool>>,
    /// Most LLM calls per heartbeat.
    pub max_steps: Option<u32>,
    /// Most tokens per heartbeat.
    pub max_tokens: Option<u64>,
    /// Most tokens a day; `Some(None)` removes the daily budget.
    pub daily_tokens: Option<Option<u64>>,
    /// Most dollars a day; `Some(None)` removes the budget.
    pub usd_day: Option<Option<super::Usd>>,
    /// Most dollars a month; `Some(None)` removes the budget.
    pub usd_month: Option<Option<super::Usd>>,
    /// Most model calls a minute; `Some(None)` removes the limit.
    pub max_calls_per_minute: Option<Option<u32>>,
    /// The breaker's cap; `Some(None)` goes back to the default.
    pub max_beats_per_hour: Option<Option<u32>>,
    /// Quiet period after a user turn; `Some(None)` goes back to half the interval.
    pub quiet_period: Option<Option<Interval>>,
    /// Discord channel; `Some(None)` unbinds it.
    pub discord_channel: Option<Option<String>>,
    /// Users it answers in direct messages (replaces the list; empty for none).
    pub discord_users: Option<Vec<String>>,
    /// When it answers in its channel.
    pub discord_listen: Option<DiscordListen>,
    /// Telegram chat; `Some(None)` unbinds it.
    pub telegram_chat: Option<Option<String>>,
    /// Users it answers privately on Telegram (replaces the list; empty for none).
    pub telegram_users: Option<Vec<String>>,
    /// When it answers in its Telegram group.
    pub telegram_listen: Option<DiscordListen>,
    /// Slack channel; `Some(None)` unbinds it.
    pub slack_channel: Option<Option<String>>,
    /// Users it answers in direct messages on Slack (replaces the list; empty for none).
    pub slack_users: Option<Vec<String>>,
    /// When it answers in its Slack channel.
    pub slack_listen: Option<DiscordListen>,
    /// When its heartbeat agent thinks.
    pub think: Option<ThinkPolicy>,
    /// What each heartbeat must do; `Some(None)` expects nothing.
    pub expect: Option<Option<Must>>,
    /// Incomplete heartbeats in a row before the hook fires (kept with a new `expect`).
    pub alert_after: Option<u32>,
    /// How long its finished records are kept; `Some(None)` goes back to the deployment's.
    pub retention: Option<Option<Retention>>,
    /// `--auto-pause-after`; `Some(None)` goes back to the default.
    pub auto_pause_after: Option<Option<AutoPause>>,
    /// Memory half-life; `Some(None)` goes back to 30 days.
    pub memory_half_life: Option<Option<Interval>>,
    /// How long a parked call waits for approval; `Some(None)` goes back to a day.
    pub approval_expiry: Option<Option<Interval>>,
    /// The MCP servers it may use (replaces the list; empty for none).
    pub tools: Option<Vec<super::mcp::AgentTool>>,
}

impl AgentChanges {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.alias.is_none()
            && self.llm_api_key_env.is_none()
            && self.interval.is_none()
            && self.active_hours.is_none()
            && self.timezone.is_none()
            && self.instructions.is_none()
            && self.persona.is_none()
            && self.llm_provider.is_none()
            && self.llm_model.is_none()
            && self.heartbeat_model.is_none()
            && self.llm_base_url.is_none()
            && self.vision.is_none()
            && self.max_steps.is_none()
            && self.max_tokens.is_none()
            && self.daily_tokens.is_none()
            && self.usd_day.is_none()
            && self.usd_month.is_none()
            && self.max_calls_per_minute.is_none()
            && self.max_beats_per_hour.is_none()
            && self.quiet_period.is_none()
            && self.discord_channel.is_none()
            && self.discord_users.is_none()
            && self.discord_listen.is_none()
            && self.telegram_chat.is_none()
            && self.telegram_users.is_none()
            && self.telegram_listen.is_none()
            && self.slack_channel.is_none()
            && self.slack_users.is_none()
            && self.slack_listen.is_none()
            && self.think.is_none()
            && self.expect.is_none()
            && self.alert_after.is_none()
            && self.retention.is_none()
            && self.auto_pause_after.is_none()
            && self.memory_half_life.is_none()
            && self.approval_expiry.is_none()
            && self.tools.is_none()
    }

    /// The changes that make an agent what `new` describes, every setting given (what
    /// `pulse apply` writes: the files hold the whole truth of what they cover).
    pub fn to(new: &NewAgent) -> Self {
        Self {
            name: Some(new.name.clone()),
            alias: Some(new.alias.clone()),
            interval: Some(new.interval),
            active_hours: Some(new.active_hours),
            timezone: Some(new.timezone.clone()),
            instructions: Some(new.instructions.clone()),
            persona: Some(new.persona.clone()),
            llm_provider: Some(new.llm.provider),
            llm_model: Some(new.llm.model.clone()),
            heartbeat_model: Some(new.llm.heartbeat_model.clone()),
            llm_base_url: Some(new.llm.base_url.clone()),
            llm_api_key_env: Some(new.llm.api_key_env.clone()),
            vision: Some(new.llm.vision),
            max_steps: Some(new.budgets.max_steps),
            max_tokens: Some(new.budgets.max_tokens),
            daily_tokens: Some(new.budgets.daily_tokens),
            usd_day: Some(new.budgets.usd_day),
            usd_month: Some(new.budgets.usd_month),
            max_calls_per_minute: Some(new.budgets.max_calls_per_minute),
            max_beats_per_hour: Some(new.budgets.max_beats_per_hour),
            quiet_period: Some(new.quiet_period),
            discord_channel: Some(new.discord_channel.clone()),
            discord_users: Some(new.discord.users.clone()),
            discord_listen: Some(new.discord.listen),
            telegram_chat: Some(new.telegram.chat.clone()),
            telegram_users: Some(new.telegram.users.clone()),
            telegram_listen: Some(new.telegram.listen),
            slack_channel: Some(new.slack.chat.clone()),
            slack_users: Some(new.slack.users.clone()),
            slack_listen: Some(new.slack.listen),
            think: Some(new.think),
            expect: Some(new.expect.map(|e| e.must)),
            alert_after: new.expect.map(|e| e.alert_after),
            retention: Some(new.retention),
            auto_pause_after: Some(new.auto_pause_after),
            memory_half_life: Some(new.memory_half_life),
            approval_expiry: Some(new.approval_expiry),
            tools: Some(new.tools.clone()),
        }
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
        set(&mut a.alias, &self.alias);
        set(&mut a.llm.api_key_env, &self.llm_api_key_env);
        set(&mut a.interval, &self.interval);
        set(&mut a.active_hours, &self.active_hours);
        set(&mut a.timezone, &self.timezone);
        set(&mut a.instructions, &self.instructions);
        set(&mut a.persona, &self.persona);
        set(&mut a.llm.provider, &self.llm_provider);
        set(&mut a.llm.model, &self.llm_model);
        set(&mut a.llm.heartbeat_model, &self.heartbeat_model);
        set(&mut a.llm.base_url, &self.llm_base_url);
        set(&mut a.llm.vision, &self.vision);
        set(&mut a.budgets.max_steps, &self.max_steps);
        set(&mut a.budgets.max_tokens, &self.max_tokens);
        set(&mut a.budgets.daily_tokens, &self.daily_tokens);
        set(&mut a.budgets.usd_day, &self.usd_day);
        set(&mut a.budgets.usd_month, &self.usd_month);
        set(
            &mut a.budgets.max_calls_per_minute,
            &self.max_calls_per_minute,
        );
        set(&mut a.budgets.max_beats_per_hour, &self.max_beats_per_hour);
        set(&mut a.quiet_period, &self.quiet_period);
        set(&mut a.discord_channel, &self.discord_channel);
        set(&mut a.discord.users, &self.discord_users);
        set(&mut a.discord.listen, &self.discord_listen);
        set(&mut a.telegram.chat, &self.telegram_chat);
        set(&mut a.telegram.users, &self.telegram_users);
        set(&mut a.telegram.listen, &self.telegram_listen);
        set(&mut a.slack.chat, &self.slack_channel);
        set(&mut a.slack.users, &self.slack_users);
        set(&mut a.slack.listen, &self.slack_listen);
        set(&mut a.think, &self.think);
        if let Some(must) = self.expect {
            let alert_after = self
                .alert_after
                .or(a.expect.map(|e| e.alert_after))
                .unwrap_or(Expectation::ALERT_AFTER);
            a.expect = must.map(|must| Expectation { must, alert_after });
        } else if let Some(n) = self.alert_after {
            let Some(e) = &mut a.expect else {
                return Err(ValidationError::new(
                    "alert-after",
                    "the agent expects nothing of its heartbeats: give --expect speak|act with it",
                ));
            };
            e.alert_after = n;
        }
        set(&mut a.retention, &self.retention);
        set(&mut a.auto_pause_after, &self.auto_pause_after);
        set(&mut a.memory_half_life, &self.memory_half_life);
        set(&mut a.approval_expiry, &self.approval_expiry);
        set(&mut a.tools, &self.tools);
        a.validated()
    }
}

#[cfg(test)]
mod tests {
    use super::{AgentChanges, NewAgent};
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
}
