//! Keeping the store bounded (the retention pass), and [`Store`]: every store port at once.

use async_trait::async_trait;
use jiff::Timestamp;

use super::*;
use crate::domain::AgentId;
use crate::error::StoreError;

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
    /// Hourly tool call counts older than [`COUNT_DAYS`](crate::domain::COUNT_DAYS)
    /// (on DynamoDB they expire by TTL).
    pub tool_counts: u64,
    /// Approvals parked before the horizon and settled (decided and carried out).
    pub approvals: u64,
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
            + self.tool_counts
            + self.approvals
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
        self.tool_counts += o.tool_counts;
        self.approvals += o.approvals;
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
    ///   memory ended before `now`;
    /// - its approvals parked before it and settled (an open one is kept, whatever its
    ///   age).
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
    /// Why writes are failing now (a full disk, a read-only file), from the last one that
    /// failed so until one succeeds; `None` while writes go through, or when the store
    /// cannot tell. `/healthz` reports it.
    fn write_trouble(&self) -> Option<String> {
        None
    }
    /// [`Maintenance::write_trouble`], looked at again while there is trouble: a store
    /// that can tell whether its cause is gone (room on the disk again) tries a write,
    /// so `/healthz` turns ok on the next probe, not at the next write that comes.
    async fn recheck_writes(&self) -> Option<String> {
        self.write_trouble()
    }
}

/// A named lease: which process holds it, until when, and what the holder keeps with it
/// (the Discord gateway keeps its resume point and its state there).
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    /// Its name.
    pub name: String,
    /// Who holds (or last held) it.
    pub holder: String,
    /// When it runs out; a lease given up runs out at once.
    pub until: Timestamp,
    /// What the holder saved with it.
    pub state: serde_json::Value,
}

/// Leases that make one process of many the one that acts (the Discord gateway: two
/// forwarders with one token must never both answer).
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes or renews `name` for `holder` until `until`, saving `state` with it, if it
    /// is free, ran out by `now`, or is `holder`'s already; in one conditional write.
    /// Whether `holder` holds it now.
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
        state: &serde_json::Value,
    ) -> Result<bool, StoreError>;
    /// The lease `name`, if it was ever taken.
    async fn get_lease(&self, name: &str) -> Result<Option<Lease>, StoreError>;
    /// Gives `name` up if `holder` holds it (it runs out at `now`), saving `state`:
    /// another process may take it at once and carry on from that state.
    async fn release_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        state: &serde_json::Value,
    ) -> Result<(), StoreError>;
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
    + LeaseStore
    + TokenStore
    + ApprovalStore
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
        + LeaseStore
        + TokenStore
        + ApprovalStore
{
}
