//! Ports: the small traits the engine needs from the outside world. Each backend (SQLite,
//! DynamoDB + SQS) implements them in its adapter; the engine sees only these.
//!
//! Every write here is idempotent under retry: creates are conditional on the record's
//! identity, and records whose ids are derived (heartbeats, a heartbeat's own events,
//! actions) are rewritten with the same content.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use jiff::civil::Date;
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::domain::{
    AcceptOutcome, Acceptance, Action, ActionId, Agent, AgentId, ClaimRequest, ConversationMessage,
    Delivery, Event, EventCursor, EventId, EventType, Heartbeat, HeartbeatId, HeartbeatStatus,
    Hook, HookAttempt, HookDelivery, HookDeliveryId, HookId, HookRoute, HookTask, LlmRequest,
    LlmResponse, Memory, OutgoingTask, Receipt, Registry, Schedule, ScheduleId, SignalId, Spend,
    Subscription, SubscriptionId, Tool, ToolName, ToolRequest, ToolResponse, Turn, TurnId, Webhook,
    WebhookId, WebhookRequest,
};
use crate::error::{DiscordError, LlmError, StoreError};

/// Where the time comes from. Injected so tests and benchmarks control it.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    /// A clock stopped at `t`.
    pub fn new(t: Timestamp) -> Self {
        Self(Mutex::new(t))
    }
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: SignedDuration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t = t.saturating_add(d).unwrap_or(*t);
    }
    /// Sets the clock.
    pub fn set(&self, t: Timestamp) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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
    /// log, atomically. False, with nothing written, when it already was so; `NotFound`
    /// if the agent is gone. The pending heartbeat is moved by
    /// [`HeartbeatStore::reschedule`], a running one marked with
    /// [`Reschedule::Running`], so its finish schedules the next one PAUSED.
    async fn set_paused(
        &self,
        id: &AgentId,
        paused_at: Option<Timestamp>,
        event: &Event,
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
    /// the agent's record, which the window read returns): `Some(false)` spares the
    /// routes read. `None`: unknown; read them.
    pub has_hooks: Option<bool>,
}

/// The event log.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Appends an event. Writing an event with an existing id replaces it; ids are only
    /// reused for the engine's derived events, whose content is the same.
    async fn append(&self, event: &Event) -> Result<(), StoreError>;
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

/// Actions.
#[async_trait]
pub trait ActionLog: Send + Sync {
    /// Creates the action (RUNNING) unless one with its id exists; returns the existing
    /// one in that case.
    async fn start_action(&self, action: &Action) -> Result<Option<Action>, StoreError>;
    /// Takes over a RUNNING action left behind by a worker that died: writes `action`
    /// (the next attempt) if the stored attempt is still `expected_attempt`. Returns
    /// false if someone else took it over first.
    async fn restart_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError>;
    /// Records the action's outcome and appends the events its tool returned, atomically,
    /// if the stored action is still RUNNING at `action.attempt`; `Conflict` otherwise
    /// (another run took it over).
    async fn finish_action(&self, action: &Action, new_events: &[Event]) -> Result<(), StoreError>;
    /// One of the agent's actions by id. Actions are filed by (event, tool), so on
    /// DynamoDB this reads the agent's actions newest first until it is found.
    async fn get_action(
        &self,
        agent: &AgentId,
        id: &ActionId,
    ) -> Result<Option<Action>, StoreError>;
    /// An agent's latest actions, newest first.
    async fn list_actions(&self, agent: &AgentId, limit: usize) -> Result<Vec<Action>, StoreError>;
    /// At most `limit` of the agent's actions on events with ids in `(after, through]`, in
    /// event order: a heartbeat's actions lie between its window's start and its end.
    async fn actions_between(
        &self,
        agent: &AgentId,
        after: &EventCursor,
        through: &EventCursor,
        limit: usize,
    ) -> Result<Vec<Action>, StoreError>;
}

/// Tools and subscriptions.
#[async_trait]
pub trait ToolRegistry: Send + Sync {
    /// Registers a tool; `AlreadyExists` if the name is taken.
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError>;
    /// Enables or disables a tool; `NotFound` if there is none by that name.
    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError>;
    /// Replaces a tool's definition; `NotFound` if there is none by that name.
    async fn update_tool(&self, tool: &Tool) -> Result<(), StoreError>;
    /// Removes a tool; `NotFound` if there is none by that name. Its subscriptions are
    /// not touched (the caller refuses while there are some).
    async fn remove_tool(&self, name: &ToolName) -> Result<(), StoreError>;
    /// Removes a subscription; `NotFound` if it does not exist.
    async fn remove_subscription(&self, id: &SubscriptionId) -> Result<(), StoreError>;
    /// Adds a subscription; `AlreadyExists` if its route is subscribed already.
    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError>;
    /// Enables or disables a subscription; `NotFound` if it does not exist.
    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError>;
    /// Every tool and subscription, with the registry version they are at (read
    /// consistently: a version read before is never newer than what this returns).
    async fn load_registry(&self) -> Result<Registry, StoreError>;
    /// The registry version alone: one small read. Every change to a tool or a
    /// subscription adds one to it in the same atomic write.
    async fn registry_version(&self) -> Result<u64, StoreError>;
}

/// What `begin_turn` found.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnStart {
    /// The turn was written now.
    Created,
    /// A turn with this id exists (an earlier delivery wrote it): here it is, unchanged.
    Exists(Box<Turn>),
}

/// Conversations: turns, their persisted messages, and which signals they answered.
#[async_trait]
pub trait ConversationStore: Send + Sync {
    /// Which of `signals` a turn answered already, as (signal, turn) pairs.
    async fn answered(
        &self,
        agent: &AgentId,
        signals: &[SignalId],
    ) -> Result<Vec<(SignalId, TurnId)>, StoreError>;
    /// Writes a turn, its messages, and the marks that its signals are answered, in one
    /// atomic write, unless the turn exists (then it is returned unchanged). `Conflict` if
    /// one of its signals belongs to another turn.
    async fn begin_turn(
        &self,
        turn: &Turn,
        messages: &[ConversationMessage],
    ) -> Result<TurnStart, StoreError>;
    /// Records a turn's delivery progress (status, parts delivered, message ids, error).
    async fn update_turn(&self, turn: &Turn) -> Result<(), StoreError>;
    /// Reads a turn.
    async fn get_turn(&self, agent: &AgentId, id: &TurnId) -> Result<Option<Turn>, StoreError>;
    /// The agent's latest `limit` turns, newest first (turn ids are time-ordered).
    async fn list_turns(&self, agent: &AgentId, limit: usize) -> Result<Vec<Turn>, StoreError>;
    /// The agent's latest `limit` messages, newest first. Reads only those, so the cost
    /// of a turn does not grow with the length of the history.
    async fn recent_messages(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError>;
}

/// Agents' schedules (reminders).
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Stores a schedule; one with the same id is replaced.
    async fn put_schedule(&self, schedule: &Schedule) -> Result<(), StoreError>;
    /// The agent's schedules, oldest first.
    async fn schedules(&self, agent: &AgentId) -> Result<Vec<Schedule>, StoreError>;
    /// Deletes a schedule; false if the agent has none with that id.
    async fn delete_schedule(&self, agent: &AgentId, id: &ScheduleId) -> Result<bool, StoreError>;
}

/// Agents' memories.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// Stores a memory; writing one with an existing id replaces it.
    async fn remember(&self, memory: &Memory) -> Result<(), StoreError>;
    /// The agent's latest `limit` memories, newest first.
    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError>;
}

/// Inbound webhooks, their request log, delivery ids and rate counters.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Creates a webhook; `AlreadyExists` if its id is taken.
    async fn create_webhook(&self, webhook: &Webhook) -> Result<(), StoreError>;
    /// Reads a webhook.
    async fn get_webhook(&self, id: &WebhookId) -> Result<Option<Webhook>, StoreError>;
    /// Every webhook, oldest first.
    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError>;
    /// Replaces a webhook (rotation, enabling); `NotFound` if it does not exist.
    async fn update_webhook(&self, webhook: &Webhook) -> Result<(), StoreError>;
    /// Deletes a webhook with its request log, replay keys and counters: its URL answers
    /// 404 from then on. `NotFound` if it does not exist.
    async fn delete_webhook(&self, id: &WebhookId) -> Result<(), StoreError>;
    /// Accepts a signed request, in this order: a replay key seen before is a duplicate
    /// (answered with the first event, or as refused before); a request with a
    /// [`Acceptance::refusal`] then only records its key and log entry; otherwise the
    /// hour's counter is incremented by one conditional write, refused at the limit; then
    /// the event, the log entry and the key are written atomically, so the same request
    /// sent twice at once still makes one event.
    async fn accept_webhook(&self, acceptance: &Acceptance) -> Result<AcceptOutcome, StoreError>;
    /// Logs a request that was not accepted, within the webhook's logging budget: the
    /// first [`REFUSED_LOG_BUDGET`](crate::domain::REFUSED_LOG_BUDGET) of a minute in
    /// full, the rest only counted, in that minute's SUPPRESSED entry. (The duplicate and
    /// rate-limited entries `accept_webhook` writes are budgeted the same way.)
    async fn log_request(&self, request: &WebhookRequest) -> Result<(), StoreError>;
    /// A webhook's latest requests, newest first.
    async fn list_requests(
        &self,
        id: &WebhookId,
        limit: usize,
    ) -> Result<Vec<WebhookRequest>, StoreError>;
}

/// Outbound hooks, their deliveries and the log of every attempt.
///
/// Hooks and deliveries carry a version: each write is conditional on the version the
/// writer read (`version - 1` of the record written), so two dispatchers never both
/// claim an attempt and a health update never undoes a user's `hooks disable`.
#[async_trait]
pub trait HookStore: Send + Sync {
    /// Creates a hook; `AlreadyExists` if its id is taken.
    async fn create_hook(&self, hook: &Hook) -> Result<(), StoreError>;
    /// Reads a hook.
    async fn get_hook(&self, id: &HookId) -> Result<Option<Hook>, StoreError>;
    /// An agent's hooks, oldest first.
    async fn list_hooks(&self, agent: &AgentId) -> Result<Vec<Hook>, StoreError>;
    /// What the engine needs to route an agent's emit points: one small read per run.
    async fn hook_routes(&self, agent: &AgentId) -> Result<Vec<HookRoute>, StoreError>;
    /// Replaces a hook if the stored one is at `hook.version - 1`; `Conflict` if it
    /// changed meanwhile, `NotFound` if it does not exist.
    async fn update_hook(&self, hook: &Hook) -> Result<(), StoreError>;
    /// Deletes a hook with its deliveries and their attempts; queued messages for it are
    /// dropped by the dispatcher when they come up. `NotFound` if it does not exist.
    async fn delete_hook(&self, id: &HookId) -> Result<(), StoreError>;
    /// Reads a delivery.
    async fn get_delivery(&self, id: &HookDeliveryId) -> Result<Option<HookDelivery>, StoreError>;
    /// Writes a delivery and the attempt it records, if any, in one atomic write,
    /// conditional on the stored delivery being at `delivery.version - 1` (absent when
    /// that is 0); `Conflict` otherwise.
    async fn save_delivery(
        &self,
        delivery: &HookDelivery,
        attempt: Option<&HookAttempt>,
    ) -> Result<(), StoreError>;
    /// A hook's latest deliveries, newest first.
    async fn list_deliveries(
        &self,
        hook: &HookId,
        limit: usize,
    ) -> Result<Vec<HookDelivery>, StoreError>;
    /// A delivery's attempts, first first.
    async fn list_attempts(
        &self,
        delivery: &HookDeliveryId,
    ) -> Result<Vec<HookAttempt>, StoreError>;
}

/// What one prune of an agent's records removed (or, counted without removing, would).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    /// Finished heartbeats.
    pub heartbeats: u64,
    /// Events its heartbeats have read.
    pub events: u64,
    /// Actions of those events.
    pub actions: u64,
    /// Conversation records: turns, their messages, answered-signal marks.
    pub conversation: u64,
    /// Outbound hook deliveries and their attempts.
    pub hook_deliveries: u64,
    /// Webhook request log entries and replay keys past their memory.
    pub webhook_records: u64,
}

impl Pruned {
    /// Rows in all.
    pub fn total(&self) -> u64 {
        self.heartbeats
            + self.events
            + self.actions
            + self.conversation
            + self.hook_deliveries
            + self.webhook_records
    }
}

impl std::ops::AddAssign for Pruned {
    fn add_assign(&mut self, o: Self) {
        self.heartbeats += o.heartbeats;
        self.events += o.events;
        self.actions += o.actions;
        self.conversation += o.conversation;
        self.hook_deliveries += o.hook_deliveries;
        self.webhook_records += o.webhook_records;
    }
}

/// What giving freed space back did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reclaimed {
    /// Bytes the store took before.
    pub bytes_before: u64,
    /// Bytes it takes now.
    pub bytes_after: u64,
    /// Whether the store can shrink in place. False for a SQLite file made before
    /// auto-vacuum: its free pages are reused, but the file keeps its size until
    /// `pulse prune --vacuum` rebuilds it once.
    pub shrinks: bool,
}

/// Keeping the store bounded: the retention pass (`pulse serve` hourly, `pulse prune`).
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Removes the agent's records that finished before `horizon` (with `apply`; without,
    /// only counts them):
    /// - heartbeats completed, failed or cancelled before it;
    /// - events stamped before it **that its live heartbeat's window has passed**: an
    ///   event a heartbeat has still to read (a paused or backlogged agent's) is never
    ///   removed, and the window cursor stays where it was;
    /// - the actions of the events removed;
    /// - conversation turns begun before it, with their messages and answered signals;
    /// - hook deliveries made before it, with their attempts;
    /// - its webhooks' request log entries received before it, and replay keys whose
    ///   memory ended before `now`.
    ///
    /// On SQLite in batches of at most [`PRUNE_BATCH`] rows, each its own transaction, so
    /// receivers and workers wait for one batch at most. DynamoDB removes hook deliveries
    /// and webhook records by the TTL written with them, so it counts none of those here.
    async fn prune_agent(
        &self,
        agent: &AgentId,
        horizon: Timestamp,
        now: Timestamp,
        apply: bool,
    ) -> Result<Pruned, StoreError>;
    /// Gives the space pruning freed back to the file system, in short steps (SQLite's
    /// incremental vacuum). DynamoDB has nothing to give back.
    async fn reclaim(&self) -> Result<Reclaimed, StoreError>;
}

/// Rows one pruning transaction removes at most.
pub const PRUNE_BATCH: usize = 500;

/// Everything the engine stores.
pub trait Store:
    AgentStore
    + HeartbeatStore
    + EventLog
    + ActionLog
    + ToolRegistry
    + ConversationStore
    + MemoryStore
    + ScheduleStore
    + WebhookStore
    + HookStore
    + Maintenance
{
}
impl<T> Store for T where
    T: AgentStore
        + HeartbeatStore
        + EventLog
        + ActionLog
        + ToolRegistry
        + ConversationStore
        + MemoryStore
        + ScheduleStore
        + WebhookStore
        + HookStore
        + Maintenance
{
}

/// A hook delivery to enqueue, visible after `delay`.
#[derive(Clone, Debug)]
pub struct HookMessage {
    /// The task.
    pub task: HookTask,
    /// How long the queue hides it (SQS: at most 15 minutes; longer waits are chained
    /// through `task.not_before`).
    pub delay: Duration,
}

/// The hooks queue: unordered, per-message delay, redelivery after a visibility timeout.
#[async_trait]
pub trait HookQueue: Send + Sync {
    /// Most delay one message can carry.
    fn max_delay(&self) -> Duration {
        Duration::from_secs(900)
    }
    /// Sends messages. Messages that could not be sent are reported, not retried.
    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError>;
    /// Receives up to `max` visible messages, hiding them for `visibility`.
    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError>;
    /// Deletes a handled message.
    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError>;
    /// Keeps a delivery whose attempts are used up, for inspection and redrive.
    async fn dead_letter(&self, task: &HookTask, reason: &str) -> Result<(), StoreError>;
    /// What it holds, and its dead-letter queue.
    async fn backlog(&self) -> Result<Backlog, StoreError>;
}

/// What came of one attempt to send a hook.
#[derive(Clone, Debug, PartialEq)]
pub struct SendResult {
    /// How it went.
    pub status: crate::domain::AttemptStatus,
    /// The receiver's HTTP status, if it answered.
    pub http_status: Option<u16>,
    /// The start of the response body.
    pub body: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// The receiver's `Retry-After`, if it gave one.
    pub retry_after: Option<Duration>,
}

/// Sends one attempt of a delivery to its hook's target. Never returns an error: every
/// failure is an attempt outcome.
#[async_trait]
pub trait HookSender: Send + Sync {
    /// Sends `delivery` to `hook`'s target, signed at `timestamp` (Unix seconds).
    async fn send(&self, hook: &Hook, delivery: &HookDelivery, timestamp: i64) -> SendResult;
    /// Whether this process may send to `hook`'s target at all (its egress allow-list,
    /// its EventBridge client); `Err` says why not. A dispatcher told to
    /// ([`DispatchSettings::leave_unsendable`](crate::engine::DispatchSettings)) leaves
    /// such deliveries queued for a process that may.
    async fn can_send(&self, hook: &Hook) -> Result<(), String> {
        let _ = hook;
        Ok(())
    }
}

/// An EventBridge-like event bus.
#[async_trait]
pub trait EventBus: Send + Sync {
    /// Puts one event on `bus` with source `pulse`; `Err` says why it was not accepted.
    async fn put_event(&self, bus: &str, detail_type: &str, detail: &str) -> Result<(), BusError>;
}

/// Why an event bus did not take an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus could not be reached.
    #[error("PutEvents to {bus} failed: {reason}")]
    Unreachable {
        /// The bus.
        bus: String,
        /// What the client said.
        reason: String,
    },
    /// The bus answered, refusing the event.
    #[error("EventBridge refused the event on {bus}: {code} {message}")]
    Refused {
        /// The bus.
        bus: String,
        /// Its error code.
        code: String,
        /// Its message.
        message: String,
    },
}

/// A message a queue did not take, with the queue's own code and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SendFailure {
    /// The queue's error code.
    pub code: String,
    /// Its message.
    pub message: String,
}

/// Tasks that could not be sent.
#[derive(Clone, Debug, Default)]
pub struct SendReport {
    /// Index into the sent slice, and why.
    pub failed: Vec<(usize, SendFailure)>,
}

/// What a queue holds (SQS: approximate counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Backlog {
    /// Waiting to be received, delayed ones included.
    pub waiting: u64,
    /// Received and not yet deleted.
    pub in_flight: u64,
    /// In its dead-letter queue; `None` when it has none this process can read.
    pub dead: Option<u64>,
}

/// The sessions queue: FIFO per group (session), one in-flight message per group,
/// deduplication by id, redelivery after a visibility timeout.
#[async_trait]
pub trait SessionQueue: Send + Sync {
    /// Sends tasks, in order. Tasks that could not be sent are reported, not retried.
    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError>;
    /// Receives up to `max` messages, hiding them for `visibility`. Messages of a group
    /// come in order, and none while another message of the group is in flight.
    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError>;
    /// Deletes a processed message.
    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError>;
    /// Makes an in-flight message visible again after `delay`.
    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError>;
    /// What it holds, and its dead-letter queue.
    async fn backlog(&self) -> Result<Backlog, StoreError>;
}

/// What came of calling a tool.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// The validated response, or why the call produced none.
    pub result: Result<ToolResponse, ToolFailure>,
    /// What is recorded on the action as the response: the body received, or what is
    /// known of a failed exchange (HTTP status, an excerpt of the body).
    pub response_meta: Option<Value>,
}

/// Why a tool call produced no usable response. Each carries the message recorded on
/// the action as its error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolFailure {
    /// The tool was not reached in time: a timeout, a refused or failed connection, an
    /// address the egress guard refuses.
    #[error("{0}")]
    Unreachable(String),
    /// The tool answered, but not with a usable response: an HTTP error status, a body
    /// that is not JSON, too large, or not shaped as a tool response.
    #[error("{0}")]
    BadAnswer(String),
    /// The built-in heartbeat agent failed (its model could not be reached, or answered
    /// with something unusable).
    #[error("{0}")]
    Agent(String),
    /// The tool stopped because a user message interrupted its heartbeat: the action
    /// ends CANCELLED and the heartbeat yields to the user's turn.
    #[error("{0}")]
    Interrupted(String),
    /// This process cannot run the tool's kind.
    #[error("{0}")]
    Unavailable(String),
    /// The tool chose not to run (the heartbeat agent with nothing to think about): the
    /// action ends SKIPPED with this reason.
    #[error("{0}")]
    Skipped(String),
}

/// Runs tools. Never returns an error: a tool's failure is an outcome recorded on its
/// action, not a failure of the heartbeat.
#[async_trait]
pub trait ToolRunner: Send + Sync {
    /// Calls `tool` with `request`.
    async fn call(&self, tool: &Tool, request: &ToolRequest) -> ToolCall;
    /// The built-in tools this runner provides, with their default subscriptions; the
    /// engine adds them to the registry unless the store overrides them.
    fn builtins(&self) -> Vec<(Tool, crate::domain::Subscription)> {
        Vec::new()
    }
}

/// A language model behind some provider.
#[async_trait]
pub trait Llm: Send + Sync {
    /// The provider's name (`anthropic`, `openai`, `offline`), for logs and records.
    fn provider(&self) -> &'static str;
    /// The model a request that names none is sent to.
    fn model(&self) -> &str;
    /// Sends one request. Transient failures (429, 5xx, timeouts) are retried inside,
    /// within a bound; what is returned is final.
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError>;
}

/// Fetches an image a user sent, for a model that cannot reach its URL itself.
#[async_trait]
pub trait ImageFetcher: Send + Sync {
    /// The image at `url`: its media type and bytes; why not, as a sentence (refused by
    /// the egress guard, unreachable, too large, not an image a model takes).
    async fn fetch_image(&self, url: &str) -> Result<(String, Vec<u8>), String>;
}

/// Picks the model client for an agent: the configured default, or the agent's own
/// provider, model and base URL.
pub trait LlmSelector: Send + Sync {
    /// The client for `agent`; `NotConfigured` if its provider has no API key.
    fn select(&self, agent: &Agent) -> Result<std::sync::Arc<dyn Llm>, LlmError>;
}

/// Discord's HTTP API, as far as replies need it. Each method returns the id of the
/// message written. 429s are waited out (`retry_after`) and retried within a bound.
#[async_trait]
pub trait DiscordApi: Send + Sync {
    /// Edits the deferred original response of an interaction (valid for 15 minutes
    /// after the interaction).
    async fn edit_original(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError>;
    /// Sends a follow-up message through the interaction's webhook.
    async fn follow_up(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError>;
    /// Posts a message to a channel with the bot token. `nonce` (at most 25 characters)
    /// is enforced, so a retried post with the same nonce does not post twice.
    async fn create_message(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
    ) -> Result<String, DiscordError>;
}
