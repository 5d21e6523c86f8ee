//! The daily token budget (`--daily-tokens`): what an agent's heartbeats and turns spent
//! today, read from its spend ledger in one read before a model call, and the
//! BUDGET_EXHAUSTED event and hook, fired once a day.
//!
//! Only agents with a budget read the ledger, and only when about to call the model: an
//! idle heartbeat that does not think reads nothing. Every model call's tokens are
//! recorded (one write beside a model call), so `pulse agents list` and the dashboard
//! show tokens today for every agent.

use std::collections::BTreeSet;

use jiff::Timestamp;
use jiff::civil::Date;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::hooks::{Emission, HookEmitter};
use crate::domain::{Agent, AgentId, Event, EventId, EventType, HookType, Priority, Spend, to_ms};
use crate::error::{EngineError, StoreError, chain};
use crate::ports::Store;

/// The agent's day at `now`, in its time zone.
pub fn day_of(agent: &Agent, now: Timestamp) -> Date {
    now.to_zoned(agent.timezone.zone()).date()
}

/// When the agent's next day starts (midnight in its time zone).
pub fn next_midnight(agent: &Agent, now: Timestamp) -> Timestamp {
    let zone = agent.timezone.zone();
    let today = now.to_zoned(zone.clone()).date();
    today
        .tomorrow()
        .ok()
        .and_then(|d| d.to_zoned(zone).ok())
        .map_or(now, |z| z.timestamp())
}

/// What an agent spent on one day, from its ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Today {
    /// The day.
    pub day: Date,
    /// Tokens spent.
    pub spent: u64,
    /// The marks set that day.
    marks: BTreeSet<String>,
}

impl Today {
    /// Sums ledger entries of one day.
    pub fn from_entries(day: Date, entries: &[Spend]) -> Self {
        Self {
            day,
            spent: entries.iter().map(|e| e.tokens).sum(),
            marks: entries
                .iter()
                .filter(|e| e.source.starts_with('!'))
                .map(|e| e.source.clone())
                .collect(),
        }
    }

    /// Whether `mark` ([`Spend::EXHAUSTED`], [`Spend::NOTICE`]) was set that day.
    pub fn marked(&self, mark: &str) -> bool {
        self.marks.contains(mark)
    }
}

/// What the agent spent today (one read).
pub async fn spent_today(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<Today, StoreError> {
    let day = day_of(agent, now);
    let entries = store.spend_of_day(&agent.id, day).await?;
    Ok(Today::from_entries(day, &entries))
}

/// Whether the agent may call the model now: `Ok(None)` when it has no daily budget or
/// some is left (a read only when it has one); `Ok(Some(today))` when it is spent.
pub async fn exhausted(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<Option<Today>, StoreError> {
    let Some(limit) = agent.budgets.daily_tokens else {
        return Ok(None);
    };
    let today = spent_today(store, agent, now).await?;
    Ok((today.spent >= limit).then_some(today))
}

/// Why a model call was not made: for the SKIPPED action and the logs.
pub fn reason(agent: &Agent, today: &Today, now: Timestamp) -> String {
    format!(
        "daily token budget spent: {} of {} tokens on {}; the model is called again after midnight ({}, {})",
        today.spent,
        agent.budgets.daily_tokens.unwrap_or_default(),
        today.day,
        agent.timezone,
        next_midnight(agent, now)
    )
}

/// Records `tokens` spent by `source` (an action or turn id) today. Nothing is written
/// for no tokens. A failure is logged, not raised: the work it counts is done.
pub async fn record(store: &dyn Store, agent: &Agent, now: Timestamp, source: &str, tokens: u64) {
    if tokens == 0 {
        return;
    }
    mark(store, &agent.id, day_of(agent, now), source, tokens, now).await;
}

async fn mark(
    store: &dyn Store,
    agent: &AgentId,
    day: Date,
    source: &str,
    tokens: u64,
    now: Timestamp,
) {
    let spend = Spend {
        day,
        source: source.to_owned(),
        tokens,
        at: now,
    };
    if let Err(e) = store.record_spend(agent, &spend).await {
        warn!(error = %chain(&e), source, tokens, "cannot record the tokens spent; today's total undercounts them");
    }
}

/// Marks that the user was told today that the budget is spent.
pub async fn mark_notice(store: &dyn Store, agent: &Agent, today: &Today, now: Timestamp) {
    mark(store, &agent.id, today.day, Spend::NOTICE, 0, now).await;
}

/// BUDGET_EXHAUSTED, once a day: the event in the agent's log (its id derived from the
/// agent and the day, so a second firing writes the same event) and the hooks on it,
/// then the day's mark. Called when a model call was refused.
pub async fn fire_exhausted(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    today: &Today,
    now: Timestamp,
) -> Result<(), EngineError> {
    if today.marked(Spend::EXHAUSTED) {
        return Ok(());
    }
    let day = today.day.to_string();
    let payload = json!({
        "day": day,
        "spent_tokens": today.spent,
        "daily_tokens": agent.budgets.daily_tokens,
        "resets_at": next_midnight(agent, now),
    });
    told(
        store,
        hooks,
        agent,
        HookType::BUDGET_EXHAUSTED,
        &["budget", agent.id.as_str(), &day],
        payload,
        now,
    )
    .await?;
    info!(spent = today.spent, day = %today.day, "daily token budget spent: no model calls until midnight");
    mark(store, &agent.id, today.day, Spend::EXHAUSTED, 0, now).await;
    Ok(())
}

/// A budget's event (`name`, its id derived from `key` and the time) written into the
/// agent's log, and the agent's hooks on it told.
pub(crate) async fn told(
    store: &dyn Store,
    hooks: Option<&HookEmitter>,
    agent: &Agent,
    name: &'static str,
    key: &[&str],
    payload: Value,
    now: Timestamp,
) -> Result<(), EngineError> {
    let at_ms = to_ms(now).max(0) as u64;
    let event = system_event(
        agent,
        name,
        EventId::derived(at_ms, key),
        payload.clone(),
        now,
    );
    store.append_in_session(&event).await?;
    if let Some(hooks) = hooks {
        let routes = hooks.routes(&agent.id).await?;
        let emission = Emission {
            hook_type: HookType::of(name),
            heartbeat_id: None,
            action_id: None,
            data: payload,
            triggered_by: "BUDGET".to_owned(),
            key_ms: at_ms,
            key: vec![event.id.to_string()],
        };
        hooks.emit(&routes, agent, emission).await?;
    }
    Ok(())
}

/// An event the engine writes into an agent's log (BUDGET_EXHAUSTED, BREAKER_TRIPPED).
pub(crate) fn system_event(
    agent: &Agent,
    name: &str,
    id: EventId,
    payload: Value,
    at: Timestamp,
) -> Event {
    Event {
        id,
        agent_id: agent.id.clone(),
        event_type: EventType::parse(name).unwrap_or_else(|_| EventType::heartbeat()),
        priority: Priority::DEFAULT,
        source: "system".to_owned(),
        payload,
        metadata: Value::Null,
        parent_id: None,
        cascade: None,
        created_at: at,
    }
}

/// The short notice a user message gets, once a day, when the budget is spent.
pub fn notice(agent: &Agent, now: Timestamp) -> String {
    format!(
        "I have used up today's budget of {} tokens, so I cannot answer until it renews at midnight ({}); please ask me again then. (To raise the budget: `pulse agents update {} --daily-tokens N`.)",
        agent.budgets.daily_tokens.unwrap_or_default(),
        next_midnight(agent, now)
            .to_zoned(agent.timezone.zone())
            .strftime("%Y-%m-%d %H:%M %Z"),
        agent.id
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{NewAgent, TimeZoneName};

    #[test]
    fn the_day_and_its_end_are_the_agents_own() {
        let mut new = NewAgent::named("a");
        new.timezone = TimeZoneName::parse("America/New_York").unwrap();
        let (agent, _) = new.create(Timestamp::UNIX_EPOCH).unwrap();
        // 03:00 UTC is still the day before in New York.
        let now: Timestamp = "2026-11-24T03:00:00Z".parse().unwrap();
        assert_eq!(day_of(&agent, now).to_string(), "2026-11-23");
        assert_eq!(
            next_midnight(&agent, now),
            "2026-11-24T05:00:00Z".parse::<Timestamp>().unwrap()
        );
    }

    #[test]
    fn a_day_sums_its_entries_and_knows_its_marks() {
        let day: Date = "2026-11-23".parse().unwrap();
        let at = Timestamp::UNIX_EPOCH;
        let e = |source: &str, tokens| Spend {
            day,
            source: source.into(),
            tokens,
            at,
        };
        let today = Today::from_entries(
            day,
            &[e("act_1", 300), e("trn_2", 200), e(Spend::NOTICE, 0)],
        );
        assert_eq!(today.spent, 500);
        assert!(today.marked(Spend::NOTICE));
        assert!(!today.marked(Spend::EXHAUSTED));
    }
}
