//! The records around a heartbeat and a turn: actions, the tool registry, conversations,
//! schedules, memories, inbound webhooks and outbound hooks.

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::{
    AcceptOutcome, Acceptance, Action, ActionId, AgentId, ApiToken, Approval, ApprovalId,
    ConversationMessage, Event, EventCursor, EventId, Hook, HookAttempt, HookDelivery,
    HookDeliveryId, HookId, HookRoute, Memory, MemoryChange, MemoryId, Registry, Schedule,
    ScheduleId, SessionId, SignalId, Subscription, SubscriptionId, TokenId, Tool, ToolCount,
    ToolName, Turn, TurnId, Undelivered, WaitingTurn, Webhook, WebhookId, WebhookRequest,
};
use crate::error::StoreError;

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
    /// Runs a finished action again at its operator's asking: writes `action` (RUNNING,
    /// the next attempt) if the stored one is finished (not RUNNING) at
    /// `expected_attempt`. False if it is running, or another retry came first.
    async fn retry_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError>;
    /// Settles an UNKNOWN action at its operator's word: writes `action` (its outcome
    /// as the operator found it) if the stored one is still UNKNOWN at
    /// `expected_attempt`. False if it is not UNKNOWN, or another write came first.
    async fn settle_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError>;
    /// Records the action's outcome and appends the events its tool returned, atomically,
    /// if the stored action is still RUNNING at `action.attempt`; `Conflict` otherwise
    /// (another run took it over). The events are written within the deadline `writer`
    /// has.
    async fn finish_action(
        &self,
        action: &Action,
        new_events: &[Event],
        writer: super::Writer,
    ) -> Result<(), StoreError>;
    /// One of the agent's actions by id. Actions are filed by (event, tool), so on
    /// DynamoDB this reads the agent's actions newest first until it is found.
    async fn get_action(
        &self,
        agent: &AgentId,
        id: &ActionId,
    ) -> Result<Option<Action>, StoreError>;
    /// The agent's action on `event` by `tool` (how actions are filed): one keyed read.
    async fn action_on(
        &self,
        agent: &AgentId,
        event: &EventId,
        tool: &ToolName,
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
    /// The hourly call counts of every agent's tools (only `agent`'s, when given) from
    /// the hour `from` falls in through the hour `through` falls in. Each finished or
    /// settled action updates its tool's count in the same write
    /// ([`CountChange`](crate::domain::CountChange)).
    async fn tool_counts(
        &self,
        from: jiff::Timestamp,
        through: jiff::Timestamp,
        agent: Option<&AgentId>,
    ) -> Result<Vec<ToolCount>, StoreError>;
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
    /// A receiver that changes each time a turn is written through this store, where
    /// the store can tell (the embedded one: its writers share the process); `None`
    /// where it cannot (DynamoDB: the worker is another function), and a waiter looks
    /// again on a timer.
    fn turns_written(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
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
    /// The agent's `limit` messages just older than message `before` (by id), newest
    /// first: the page before one that starts at `before`.
    async fn messages_before(
        &self,
        agent: &AgentId,
        before: &str,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError>;
    /// Keeps a session's turn that waits on the model, in place of the one before.
    async fn put_waiting(&self, waiting: &WaitingTurn) -> Result<(), StoreError>;
    /// The session's waiting turn.
    async fn get_waiting(
        &self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Option<WaitingTurn>, StoreError>;
    /// Forgets the session's waiting turn (answered, or given up).
    async fn delete_waiting(&self, agent: &AgentId, session: &SessionId) -> Result<(), StoreError>;
    /// The waiting turns, soonest due first, at most `limit`.
    async fn list_waiting(&self, limit: usize) -> Result<Vec<WaitingTurn>, StoreError>;
    /// Keeps a turn whose reply was not delivered, in place of its record before.
    async fn put_undelivered(&self, undelivered: &Undelivered) -> Result<(), StoreError>;
    /// The turn's undelivered record.
    async fn get_undelivered(
        &self,
        agent: &AgentId,
        turn: &TurnId,
    ) -> Result<Option<Undelivered>, StoreError>;
    /// Forgets the turn's undelivered record (delivered at last, or dismissed).
    async fn delete_undelivered(&self, agent: &AgentId, turn: &TurnId) -> Result<(), StoreError>;
    /// The undelivered replies: those still retrying, soonest due first, then the
    /// undeliverable, newest first; at most `limit`.
    async fn list_undelivered(&self, limit: usize) -> Result<Vec<Undelivered>, StoreError>;
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
    /// Stores memories (with their vectors); one with an existing id is replaced. Bumps
    /// the agent's memory version once (all of `memories` are the agent's).
    async fn remember(&self, memories: &[Memory]) -> Result<(), StoreError>;
    /// The agent's latest `limit` memories, newest first (with their vectors).
    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError>;
    /// Every memory of the agent, with its vector: what a recall index is built from.
    async fn all_memories(&self, agent: &AgentId) -> Result<Vec<Memory>, StoreError>;
    /// One memory.
    async fn get_memory(
        &self,
        agent: &AgentId,
        id: &MemoryId,
    ) -> Result<Option<Memory>, StoreError>;
    /// The agent's memory version: bumped by every change to its memories but a recall's
    /// reinforcement, so a cached index is read again only when it must be.
    async fn memory_version(&self, agent: &AgentId) -> Result<u64, StoreError>;
    /// Writes what a recall changed of each memory — its weight, the beat it was weighed
    /// at, its recall time and count — and nothing else (a fold or an edit made meanwhile
    /// stands), and only if it still exists and its stored recall count is one less than
    /// the given one: no other recall reinforced it since it was read. The ids of those
    /// not written (forgotten, or reinforced by another process meanwhile), which the
    /// caller reads again. Does not bump the version: another process's index sees the
    /// change when it next loads.
    async fn reinforce(&self, memories: &[Memory]) -> Result<Vec<MemoryId>, StoreError>;
    /// Deletes a memory; `false` if there was none. Bumps the version.
    async fn forget(&self, agent: &AgentId, id: &MemoryId) -> Result<bool, StoreError>;
    /// Writes `changes` (at most [`MAX_CHANGES`] of the agent's), all or none: each only
    /// if the store holds what it was read from (see [`MemoryChange`]). Bumps the
    /// version. `false`, with nothing written, when one had changed meanwhile.
    async fn change(&self, agent: &AgentId, changes: &[MemoryChange]) -> Result<bool, StoreError>;
    /// Stores the vectors of `memories` (all the agent's) and nothing else, each only if
    /// the memory still exists; bumps the version once if one was written. The ids of
    /// those not written: forgotten meanwhile.
    async fn set_vectors(
        &self,
        agent: &AgentId,
        memories: &[Memory],
    ) -> Result<Vec<MemoryId>, StoreError>;
}

/// Most writes one [`MemoryStore::change`] takes: a DynamoDB transaction holds 100
/// items, one of them the memory version.
pub const MAX_CHANGES: usize = 99;

/// The error of a [`MemoryStore::change`] given more than [`MAX_CHANGES`]: the caller's
/// mistake, not the store's.
pub fn too_many_changes(backend: &'static str, n: usize) -> StoreError {
    StoreError::backend(
        backend,
        "change memories",
        format!("{n} memory changes in one write; at most {MAX_CHANGES}"),
    )
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
    /// sent twice at once still makes one event. Like [`EventLog::append`], it fails,
    /// writing nothing, when the event would be committed later than the event write
    /// deadline after its stamp.
    ///
    /// [`EventLog::append`]: super::EventLog::append
    ///
    /// The acceptance is shared rather than borrowed so that an adapter writing it from
    /// another thread (SQLite's group commit) need not copy its event.
    async fn accept_webhook(
        &self,
        acceptance: Arc<Acceptance>,
    ) -> Result<AcceptOutcome, StoreError>;
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

/// API tokens of the messages API (only their secrets' digests).
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Saves a new token.
    async fn put_token(&self, token: &ApiToken) -> Result<(), StoreError>;
    /// Reads a token by its id.
    async fn get_token(&self, id: &TokenId) -> Result<Option<ApiToken>, StoreError>;
    /// Every token, or `agent`'s, oldest first.
    async fn list_tokens(&self, agent: Option<&AgentId>) -> Result<Vec<ApiToken>, StoreError>;
    /// Marks a token revoked at `at` (a token revoked already keeps its first time).
    /// `NotFound` if there is none.
    async fn revoke_token(&self, id: &TokenId, at: jiff::Timestamp) -> Result<(), StoreError>;
    /// Counts one request of `token` in the minute `now` falls in, unless `limit` were
    /// counted in it already: true when counted, false when over the limit. The count is
    /// the store's, so every receiver sharing it shares the limit.
    async fn count_api_request(
        &self,
        token: &TokenId,
        now: jiff::Timestamp,
        limit: u32,
    ) -> Result<bool, StoreError>;
}

/// Calls parked for a person's approval (see [`crate::domain::Approval`]).
#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// Parks `approval` (pending), unless an approval with its id exists: then that one
    /// is returned and nothing is written (a run made again finds what it parked).
    async fn park_approval(&self, approval: &Approval) -> Result<Option<Approval>, StoreError>;
    /// Reads one of the agent's approvals.
    async fn get_approval(
        &self,
        agent: &AgentId,
        id: &ApprovalId,
    ) -> Result<Option<Approval>, StoreError>;
    /// The agent's latest `limit` approvals, newest first, decided or not.
    async fn approvals(&self, agent: &AgentId, limit: usize) -> Result<Vec<Approval>, StoreError>;
    /// The approvals not yet settled — pending, or decided with what came of the decision
    /// still to be recorded — of every agent, soonest to expire first, at most `limit`:
    /// what the sweep expires, and carries out again when a decision's carrying out was
    /// lost with its process.
    async fn open_approvals(&self, limit: usize) -> Result<Vec<Approval>, StoreError>;
    /// Writes `decided` (approved, denied or expired) only if the stored approval is
    /// still pending, in one conditional write: the first decision is the only one. It
    /// stays open until it is settled. `None` when it was written; the stored approval, unchanged, when it had been
    /// decided already. `NotFound` if there is none.
    async fn decide_approval(&self, decided: &Approval) -> Result<Option<Approval>, StoreError>;
    /// Writes what came of a decided approval (its outcome) and nothing else, and closes
    /// it (no longer open). `NotFound` if there is none; `Conflict` if it is still
    /// pending.
    async fn settle_approval(&self, settled: &Approval) -> Result<(), StoreError>;
    /// Records that the owner was asked about `asked` (its `asked_at`) and nothing else,
    /// only if it is still pending and was not asked before: true when this call marked
    /// it. `NotFound` if there is none.
    async fn mark_asked(&self, asked: &Approval) -> Result<bool, StoreError>;
}
