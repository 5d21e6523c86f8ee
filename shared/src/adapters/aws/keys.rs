//! The key layout of the one DynamoDB table.
//!
//! ## Keys
//!
//! | item | pk | sk |
//! |---|---|---|
//! | event | `AG#<agent>` | `EV#<event id>` (time-ordered) |
//! | agent (live record) | `AG#<agent>` | `EV~` |
//! | heartbeat | `AG#<agent>` | `HB#<beat, 12 digits>` |
//! | action | `AG#<agent>` | `AC#<event id>#<tool>` |
//! | agent directory entry | `AGENTS` | `<agent>` |
//! | tool / subscription | `REG` | `T#<name>` / `S#<id>` |
//! | registry version (one more on every tool or subscription change) | `REG` | `!VERSION` |
//! | conversation turn | `AG#<agent>` | `TN#<turn id>` |
//! | conversation message | `AG#<agent>` | `MS#<turn id>.<n>` (time-ordered) |
//! | signal answered by a turn | `AG#<agent>` | `SG#<signal id>` |
//! | memory | `AG#<agent>` | `ME#<memory id>` (time-ordered) |
//! | daily spend ledger entry | `AG#<agent>` | `SP#<day>#<source>` (expires after a week) |
//! | dollar budget tally of a day or month | `AG#<agent>` | `USD#<period>` (expires two months after its last write) |
//! | model calls counted in a minute | `AG#<agent>` | `CPM#<minute>` (expires after a day) |
//! | schedule (reminder) | `AG#<agent>` | `SC#<schedule id>` |
//! | Discord channel's agent | `CH#<channel id>` | `CH` |
//! | a tool's calls in an hour | `TC#<day>` | `<agent>#<hour, 8 digits>#<tool>` (expires after 90 days) |
//!
//! Webhooks, their request logs, delivery ids and counters: see `webhooks.rs`. Outbound
//! hooks, their deliveries and attempts: see `hooks.rs`.
//!
//! Tool call counts are filed by day, not by agent: the fleet's figures for a window
//! are one Query a day, one agent's a `begins_with` on the same keys.
//!
//! `EV~` sorts after every `EV#…` key, so the one Query that reads a heartbeat's event
//! window also returns the agent's live record at its end: a heartbeat cycle costs one
//! read, not two.
//!
//! ## The due index
//!
//! A sparse GSI (`due_shard`, `due_at`), keys only. Only live heartbeats carry its keys:
//! PENDING ones with `due_at` = when scheduled, EXECUTING ones with `due_at` = when the
//! lease ends (so an expired lease shows up as due again). Finishing removes them. Agents
//! spread over [`DUE_SHARDS`] partition keys by a hash of their id, so no one key takes the
//! whole fleet's writes. GSIs lag, so every claim re-checks its condition on the item.

use crate::domain::{Action, AgentId, EventId, SignalId, TurnId};

/// The due index's name.
pub const DUE_INDEX: &str = "due";
/// How many partition keys the due index is spread over. Changing it would strand the
/// heartbeats filed under the old shards, so it is fixed.
pub const DUE_SHARDS: u16 = 16;

pub(super) const AGENT_SK: &str = "EV~";
/// On the agent's record: `false` while it has never had a hook (written when it is
/// created; a hook's creation sets it `true` in the same transaction). Absent on agents
/// created before the flag existed: unknown.
pub(super) const HAS_HOOKS: &str = "has_hooks";
pub(super) const DIRECTORY_PK: &str = "AGENTS";
pub(super) const REGISTRY_PK: &str = "REG";

pub(super) fn agent_pk(id: &AgentId) -> String {
    format!("AG#{id}")
}

pub(super) fn event_sk(id: &EventId) -> String {
    format!("EV#{id}")
}

pub(super) fn heartbeat_sk(beat: u64) -> String {
    format!("HB#{beat:012}")
}

pub(super) fn action_sk(a: &Action) -> String {
    format!("AC#{}#{}", a.event_id, a.tool)
}

/// The partition of the tool call counts of the day `hour` (hours since 1970) is in.
pub(super) fn tool_count_pk(hour: i64) -> String {
    let day = hour.div_euclid(24) * 86_400;
    let date = jiff::Timestamp::from_second(day)
        .map(|t| t.to_zoned(jiff::tz::TimeZone::UTC).date().to_string())
        .unwrap_or_else(|_| day.to_string());
    format!("TC#{date}")
}

/// The sort key of an agent's counts of one tool in one hour.
pub(super) fn tool_count_sk(agent: &AgentId, hour: i64, tool: &str) -> String {
    format!("{agent}#{hour:08}#{tool}")
}

pub(super) fn due_shard(agent: &AgentId) -> String {
    format!("{:02}", agent.stable_hash() % DUE_SHARDS)
}

pub(super) fn spend_sk(day: jiff::civil::Date, source: &str) -> String {
    format!("SP#{day}#{source}")
}

/// A dollar budget's tally of one period (`2026-12-06`, `2026-12`).
pub(super) fn usd_sk(period: &str) -> String {
    format!("USD#{period}")
}

/// The model calls of one minute (`2026-12-06T10:15`).
pub(super) fn calls_sk(minute: &str) -> String {
    format!("CPM#{minute}")
}

pub(super) fn schedule_sk(id: &crate::domain::ScheduleId) -> String {
    format!("SC#{id}")
}

pub(super) fn turn_sk(id: &TurnId) -> String {
    format!("TN#{id}")
}

pub(super) fn signal_sk(id: &SignalId) -> String {
    format!("SG#{id}")
}
