//! The records of an agent's life: the agent itself, its heartbeats (the due index, claims,
//! finishes) and its event log.

use async_trait::async_trait;
use futures::StreamExt;
use jiff::Timestamp;
use jiff::civil::Date;

use crate::domain::{
    Agent, AgentId, AgentStates, ClaimRequest, Event, EventCursor, EventId, EventType, Heartbeat,
    HeartbeatId, HeartbeatStatus, Limit, Spend, Tally, Usd,
};
use crate::error::StoreError;

/// Agents.
#[async_trait]
pub trait AgentStore: Send + Sync {
    /// Creates the agent and its first heartbeat in one atomic write.
    async fn create_agent(&self, agent: &Agent, first: &Heartbeat) -> Result<(), StoreError>;
    /// Creates many agents with their first heartbeats, for seeding a fleet. Faster than
    /// one `create_agent` each, but not atomic per agent on DynamoDB and it overwrites
    /// records with the same ids: if it fails, run it again with the same input.
    async fn import_agents(&self, agents: &[(Agent, Heartbeat)]) -> Result<(), StoreError>;
    /// Reads an agent.
    async fn get_agent(&self, id: &AgentId) -> Result<Option<Agent>, StoreError>;
    /// All agents, oldest first.
    async fn list_agents(&self) -> Result<Vec<Agent>, StoreError>;
    /// The agents from `offset` (oldest first) up to `limit` of them, with how many
    /// agents there are in each state: what a listing page needs, without reading every
    /// agent's whole record where the store can count them itself.
    async fn agents_page(&self, offset: usize, limit: usize) -> Result<AgentsPage, StoreError>;
    /// Records that the user interacted with the agent at `at` (beats count from here).
    async fn record_interaction(&self, id: &AgentId, at: Timestamp) -> Result<(), StoreError>;
    /// The agent that answers in a Discord channel (`--discord-channel`), if any. One
    /// agent per channel: creating a second one for a channel is `AlreadyExists`.
    async fn agent_for_channel(&self, channel_id: &str) -> Result<Option<AgentId>, StoreError>;
    /// Replaces the settings of `previous` with those of `agent` (same id), moving its
    /// channel binding when the channel changed. Its pause state, last interaction and
    /// next wake are not written here: they have their own writes. `NotFound` if the agent is
    /// gone; `AlreadyExists` if another agent answers in the new channel (then nothing
    /// is written).
    async fn update_agent(&self, agent: &Agent, previous: &Agent) -> Result<(), StoreError>;
    /// Sets (or with `None` clears) the agent's next schedule wake, and nothing else.
    /// `NotFound` if the agent is gone.
    async fn set_next_wake(&self, id: &AgentId, at: Option<Timestamp>) -> Result<(), StoreError>;
    /// Pauses (`paused_at` set) or resumes (`None`) an agent and appends `event` to its
    /// log, atomically, within the deadline `writer` has. False, with nothing written,
    /// when it already was so; `NotFound` if the agent is gone. The pending heartbeat is
    /// moved by [`HeartbeatStore::reschedule`], a running one marked with
    /// [`Reschedule::Running`], so its finish schedules the next one PAUSED.
    async fn set_paused(
        &self,
        id: &AgentId,
        paused_at: Option<Timestamp>,
        event: &Event,
        writer: Writer,
    ) -> Result<bool, StoreError>;
    /// Everything that is the agent's own: its record, heartbeats, events, actions,
    /// conversation, memories, webhooks (with their request logs, replay keys and
    /// counters), hooks (with their deliveries and attempts), the subscriptions made for
    /// it and its channel binding. With `apply` it is deleted (on SQLite in one
    /// transaction; on DynamoDB by batched deletes, the agent's record among the first, so
    /// nothing is scheduled for it meanwhile); without, only counted. Works on the
    /// leftovers of an interrupted delete too, when the record is gone already.
    async fn purge_agent(&self, id: &AgentId, apply: bool) -> Result<Footprint, StoreError>;
    /// Writes `spend` to the agent's ledger, replacing an entry of the same day and
    /// source (a rerun records once). Entries older than [`Spend::KEPT_DAYS`] go.
    async fn record_spend(&self, agent: &AgentId, spend: &Spend) -> Result<(), StoreError>;
    /// The agent's ledger entries of `day`.
    async fn spend_of_day(&self, agent: &AgentId, day: Date) -> Result<Vec<Spend>, StoreError>;
    /// Holds `amount` against each of `limits` (a day's and a month's dollar budget) —
    /// in all of them or none, atomically, so two workers cannot both take what is
    /// left. `Ok(Err(tally))`, with nothing held, names the first period it does not
    /// fit in: what that period has spent and held.
    async fn hold_usd(
        &self,
        agent: &AgentId,
        limits: &[Limit],
        amount: Usd,
        at: Timestamp,
    ) -> Result<Result<(), Tally>, StoreError>;
    /// Settles a hold: releases `held` and adds what the call cost, `spent`, in each of
    /// `periods`. The tallies after, in order; each settle's change of `spent` is the
    /// only one between the two values it returns, so a threshold crossed is crossed by
    /// one settle only.
    async fn settle_usd(
        &self,
        agent: &AgentId,
        periods: &[String],
        held: Usd,
        spent: Usd,
        at: Timestamp,
    ) -> Result<Vec<Tally>, StoreError>;
    /// Marks that `period`'s budget crossed `percent`: `true` the first time only, so
    /// what is told of it is told once per period whoever finds it.
    async fn mark_usd(
        &self,
        agent: &AgentId,
        period: &str,
        percent: u64,
        at: Timestamp,
    ) -> Result<bool, StoreError>;
    /// Counts one model call of the agent in `minute` (`2026-12-06T10:15`) if fewer than
    /// `limit` were counted in it: `true` when counted (the call may be made), `false`
    /// when the minute is full. The check and the count are one write.
    async fn take_call(
        &self,
        agent: &AgentId,
        minute: &str,
        limit: u32,
        at: Timestamp,
    ) -> Result<bool, StoreError>;
    /// The tallies of `periods`, in order (zero for one nothing was held in).
    async fn usd_tallies(
        &self,
        agent: &AgentId,
        periods: &[String],
    ) -> Result<Vec<Tally>, StoreError>;
}

/// One page of the agents and the count of all agents by state
/// ([`AgentStore::agents_page`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentsPage {
    /// How many agents are in each state (all of them, not only this page's).
    pub states: AgentStates,
    /// This page's agents, oldest first.
    pub agents: Vec<Agent>,
}

/// What belongs to an agent, by kind: what `pulse agents delete` removes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Footprint {
    /// Its own record (false when only leftovers of an interrupted delete remain).
    pub agent: bool,
    /// Heartbeats, past and pending.
    pub heartbeats: u64,
    /// Events in its log.
    pub events: u64,
    /// Actions (tool runs).
    pub actions: u64,
    /// Conversation records: turns, messages, answered-signal marks.
    pub conversation: u64,
    /// Memories.
    pub memories: u64,
    /// Inbound webhooks.
    pub webhooks: u64,
    /// Their request log entries, remembered replay keys and counters.
    pub webhook_records: u64,
    /// Outbound hooks.
    pub hooks: u64,
    /// Their deliveries and attempts.
    pub hook_deliveries: u64,
    /// Subscriptions made for this agent alone.
    pub subscriptions: u64,
    /// Entries of its daily spend ledger.
    pub usage: u64,
    /// Its schedules (reminders).
    pub schedules: u64,
    /// Calls parked for approval, decided or not.
    pub approvals: u64,
    /// The Discord channel it answered in.
    pub channel: Option<String>,
}

impl Footprint {
    /// Whether nothing of the agent is stored.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The non-zero kinds, as `(count, noun)` pairs for a person to read.
    pub fn kinds(&self) -> Vec<(u64, &'static str)> {
        [
            (u64::from(self.agent), "agent record"),
            (self.heartbeats, "heartbeat"),
            (self.events, "event"),
            (self.actions, "action"),
            (self.conversation, "conversation record"),
            (self.memories, "memory"),
            (self.webhooks, "webhook"),
            (self.webhook_records, "webhook request record"),
            (self.hooks, "hook"),
            (self.hook_deliveries, "hook delivery record"),
            (self.subscriptions, "subscription"),
            (self.usage, "usage record"),
            (self.schedules, "schedule"),
            (self.approvals, "approval"),
            (u64::from(self.channel.is_some()), "channel binding"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .collect()
    }
}

/// An opaque position in a paged listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageToken(pub String);

/// One page of due heartbeats.
#[derive(Clone, Debug, Default)]
pub struct DuePage {
    /// Heartbeats that looked due (the claim re-checks on the record itself).
    pub ids: Vec<HeartbeatId>,
    /// Where the next page starts, if there is one.
    pub next: Option<PageToken>,
}

/// How a heartbeat is finished.
#[derive(Clone, Debug)]
pub struct Finish {
    /// The heartbeat in its final state; `claim` is the claim that finishes it.
    pub heartbeat: Heartbeat,
    /// The next heartbeat to schedule, PENDING.
    pub next: Option<Heartbeat>,
    /// The heartbeat's own HEARTBEAT event.
    pub heartbeat_event: Option<Event>,
}

/// How [`HeartbeatStore::reschedule`] moves a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reschedule {
    /// A PENDING heartbeat becomes due at this time (its agent's plan changed).
    Due(Timestamp),
    /// A PENDING heartbeat becomes PAUSED and leaves the due index.
    Pause,
    /// A PAUSED heartbeat becomes PENDING, due at this time.
    Resume(Timestamp),
    /// An EXECUTING heartbeat stays so; its agent was paused (`true`) or resumed while
    /// it ran, so its finish files the next one PAUSED or PENDING. (SQLite's finish reads
    /// the agent's state itself: there it only checks the heartbeat still runs.)
    Running {
        /// Whether the next heartbeat is filed PAUSED.
        pause_next: bool,
    },
}

/// What became of a finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishOutcome {
    /// Written now.
    Finished,
    /// This same claim had already finished it (a retried finish): nothing to do.
    AlreadyFinished,
    /// The heartbeat no longer exists: its agent was deleted.
    Gone,
    /// Another claim holds or finished the heartbeat; this run's result is dropped.
    Superseded {
        /// The heartbeat's claim number now.
        claim: u32,
        /// Its status now.
        status: HeartbeatStatus,
    },
}

/// Heartbeats: the due index, claims, and completion.
#[async_trait]
pub trait HeartbeatStore: Send + Sync {
    /// How many shards the due index is spread over; a sweep reads each.
    fn due_shards(&self) -> u16;
    /// Heartbeats of `shard` that are due at `now`: PENDING and scheduled, or EXECUTING
    /// with an expired lease.
    async fn due(
        &self,
        shard: u16,
        now: Timestamp,
        page: Option<PageToken>,
        limit: usize,
    ) -> Result<DuePage, StoreError>;
    /// Claims a heartbeat if, on the record itself, it is PENDING and due, or EXECUTING
    /// with an expired lease. Returns the claimed record, or `None` if another sweeper won
    /// or it is not due. Exactly one of any number of concurrent claims wins.
    async fn claim(
        &self,
        id: &HeartbeatId,
        req: &ClaimRequest,
    ) -> Result<Option<Heartbeat>, StoreError>;
    /// Claims several heartbeats, as `claim` each; results in the order of `ids`. Backends
    /// with cheap local transactions claim a whole page in one; the default makes up to
    /// `concurrency` single claims at once (right for DynamoDB, which has no batch
    /// conditional update).
    async fn claim_many(
        &self,
        ids: &[HeartbeatId],
        req: &ClaimRequest,
        concurrency: usize,
    ) -> Vec<Result<Option<Heartbeat>, StoreError>> {
        futures::stream::iter(ids.to_vec())
            .map(|id| async move { self.claim(&id, req).await })
            .buffered(concurrency.max(1))
            .collect()
            .await
    }
    /// Finishes a heartbeat, schedules the next one and writes the HEARTBEAT event, in one
    /// atomic write conditional on the heartbeat still being EXECUTING under this claim.
    /// The next heartbeat is written PAUSED if the agent was paused while it ran (the
    /// pause marked it: [`Reschedule::Running`]; SQLite reads the agent's record in the
    /// same transaction). A finish of a heartbeat deleted with its agent is `Gone`; one
    /// racing a delete half-way may leave a next heartbeat, which is cancelled when it
    /// is claimed and finds no agent.
    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError>;
    /// Moves a heartbeat that is not running: see [`Reschedule`]. Returns the record as
    /// written, or `None` when it was not in the state the move applies to (claimed
    /// meanwhile, over, or gone): nothing is written then.
    async fn reschedule(
        &self,
        id: &HeartbeatId,
        to: Reschedule,
    ) -> Result<Option<Heartbeat>, StoreError>;
    /// Puts a claimed heartbeat back to PENDING, due at `until`, if it is still EXECUTING
    /// under this claim (the quiet period after a user turn). The window end and start
    /// time are cleared so the next claim reads a fresh window. False if the claim was
    /// lost.
    async fn defer(&self, heartbeat: &Heartbeat, until: Timestamp) -> Result<bool, StoreError>;
    /// Extends the lease of a claim to `lease_until`, if the heartbeat is still EXECUTING
    /// under this claim: a job that waited in the queue (redelivered after a crash, or
    /// behind a stuck message) makes sure it still owns the heartbeat before working.
    /// False if a later claim took it or it ended.
    async fn renew(
        &self,
        heartbeat: &Heartbeat,
        lease_until: Timestamp,
    ) -> Result<bool, StoreError>;
    /// Reads a heartbeat.
    async fn get_heartbeat(&self, id: &HeartbeatId) -> Result<Option<Heartbeat>, StoreError>;
    /// Records that what a finished heartbeat said could not be delivered: its outcome
    /// becomes `undeliverable`, with `reason`. Nothing when the heartbeat is gone
    /// (pruned) or has not finished.
    async fn mark_undeliverable(&self, id: &HeartbeatId, reason: &str) -> Result<(), StoreError>;
    /// At most `limit` of an agent's heartbeats with beats below `before` (all when
    /// `None`), newest first. Read consistently: the first of them is the agent's live
    /// heartbeat (pending, paused or running).
    async fn heartbeats_page(
        &self,
        agent: &AgentId,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError>;
    /// An agent's latest heartbeats, newest first.
    async fn list_heartbeats(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        self.heartbeats_page(agent, None, limit).await
    }
}

/// What a heartbeat reads when it starts: the agent's live record and its event window.
#[derive(Clone, Debug)]
pub struct Window {
    /// The agent, or `None` if it no longer exists.
    pub agent: Option<Agent>,
    /// Events after the start cursor up to the end cursor, in id order, without events a
    /// heartbeat made for itself.
    pub events: Vec<Event>,
    /// True when `limit` cut the window short; the rest is left for the next heartbeat.
    pub truncated: bool,
    /// Whether the agent has outbound hooks, when the read told (DynamoDB keeps a flag on
    /// the agent's record, which the window read returns; SQLite looks in the same
    /// snapshot): `Some(false)` spares the routes read. `None`: unknown; read them.
    pub has_hooks: Option<bool>,
}

/// Who writes the events of a write that carries some with it (a pause, an action's
/// outcome): that decides how late after its stamp an event may still be committed, as
/// [`EventLog::append`] and [`EventLog::append_in_session`] do for a single event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// A job of the agent's own session (a heartbeat run, a conversation turn): the
    /// agent's windows are read by later jobs of that session, after this write, so the
    /// events may be committed however long after their stamps.
    Session,
    /// Anything else (an operator's `pulse agents pause`, `pulse actions retry`): the
    /// write is refused, with nothing written, when it would be committed later than the
    /// event write deadline after an event's stamp, since a heartbeat may already have
    /// read past it. The caller makes it again, with new stamps.
    Outside,
}

/// The event log.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Appends an event. Writing an event with an existing id replaces it; ids are only
    /// reused for the engine's derived events, whose content is the same.
    ///
    /// An event from outside the agent's session (the CLI, the hook dispatcher; a
    /// webhook's acceptance keeps the same rule) is refused when it was stamped longer ago than the
    /// event write deadline (three quarters of `event_settle`) by the time it would be
    /// committed: a heartbeat may already have read past its time. The caller sends it
    /// again with a new stamp.
    async fn append(&self, event: &Event) -> Result<(), StoreError>;
    /// Appends an event written by a job of the agent's own session (a heartbeat run, a
    /// conversation turn). The agent's windows are read by jobs of that same session, so
    /// by a later job than this one, after this write: the event may be written however
    /// long after its stamp, and may be dated back into the window of the heartbeat
    /// writing it (a reminder's wake, read by that heartbeat once written).
    async fn append_in_session(&self, event: &Event) -> Result<(), StoreError>;
    /// Reads the agent and at most `limit` events of the window `(start, end]`.
    async fn read_window(
        &self,
        agent: &AgentId,
        start: &EventCursor,
        end: &EventCursor,
        limit: usize,
    ) -> Result<Window, StoreError>;
    /// The given events of an agent, in id order; ids not found are left out.
    async fn get_events(&self, agent: &AgentId, ids: &[EventId]) -> Result<Vec<Event>, StoreError>;
    /// At most `limit` of the agent's events with ids after `after` and before `before`
    /// (either bound open when `None`), newest first. The one read every listing is
    /// built on.
    async fn events_page(
        &self,
        agent: &AgentId,
        after: Option<&EventCursor>,
        before: Option<&EventId>,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// The newest `query.limit` events that match `query`, oldest first. Pages through
    /// [`events_page`](Self::events_page), so a type filter costs reads of the events it
    /// skips, never a scan of the whole log at once.
    async fn query_events(
        &self,
        agent: &AgentId,
        query: &EventQuery,
    ) -> Result<Vec<Event>, StoreError> {
        let mut found = Vec::new();
        let mut before = query.before.clone();
        let page = if query.types.is_empty() {
            query.limit
        } else {
            query.limit.clamp(100, 1_000)
        };
        while found.len() < query.limit {
            let events = self
                .events_page(agent, query.after.as_ref(), before.as_ref(), page)
                .await?;
            let last = events.len() < page;
            before = events.last().map(|e| e.id.clone());
            found.extend(events.into_iter().filter(|e| query.matches(e)));
            if last || before.is_none() {
                break;
            }
        }
        found.truncate(query.limit);
        found.reverse();
        Ok(found)
    }

    /// The agent's latest `limit` events, oldest first.
    async fn list_events(&self, agent: &AgentId, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.query_events(agent, &EventQuery::latest(limit)).await
    }
}

/// Which of an agent's events to list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventQuery {
    /// Only events of these types; every type when empty.
    pub types: Vec<EventType>,
    /// Only events after this cursor: created after a time ([`EventCursor::through`]), or
    /// newer than an event ([`EventCursor::after`]).
    pub after: Option<EventCursor>,
    /// Only events older than this one (paging back through a long log).
    pub before: Option<EventId>,
    /// At most this many: the newest that match.
    pub limit: usize,
}

impl EventQuery {
    /// The newest `limit` events, of any type.
    pub fn latest(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Whether `event` passes the type filter (the bounds are the store's to apply).
    pub fn matches(&self, event: &Event) -> bool {
        self.types.is_empty() || self.types.contains(&event.event_type)
    }
}

/// Three quarters of the settle time: an event write that has not succeeded by then is
/// abandoned (and reported) rather than risk becoming visible behind a read window.
/// A settle of zero (tests, a single process) promises no such margin, so a write then
/// has [`UNSETTLED_WRITE_TIMEOUT`] rather than a cut-off a busy store would trip.
pub fn event_write_timeout(settle: jiff::SignedDuration) -> std::time::Duration {
    let settle = settle.unsigned_abs();
    if settle.is_zero() {
        return UNSETTLED_WRITE_TIMEOUT;
    }
    settle
        .mul_f64(0.75)
        .max(std::time::Duration::from_millis(100))
}

/// How long an event write may take when the settle time is zero.
pub const UNSETTLED_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_writes_stop_before_the_settle_time_unless_there_is_none() {
        let t = |s: i64| event_write_timeout(jiff::SignedDuration::from_millis(s));
        assert_eq!(t(2000), std::time::Duration::from_millis(1500));
        assert_eq!(t(40), std::time::Duration::from_millis(100));
        assert_eq!(t(0), UNSETTLED_WRITE_TIMEOUT);
    }
}
