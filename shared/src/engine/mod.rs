//! The heartbeat engine: pure logic over the ports.
//!
//! - [`Sweeper`] finds due heartbeats, claims each with a conditional write and a lease,
//!   and queues a job on the agent's session group.
//! - [`HeartbeatRunner`] runs one job: reads the event window by cursor, appends the
//!   HEARTBEAT event, runs the subscribed tools (cascading breadth-first up to a depth
//!   cap), then finishes the heartbeat and schedules the next in one atomic write.
//! - [`Worker`] takes a batch of queue messages and runs them in order per session,
//!   reporting the messages that must be redelivered.
//! - [`WebhookIntake`] takes signed webhook requests in: verify, read the event, dedup,
//!   count, append; a [`Verdict`] for the HTTP layer.
//! - [`Lifecycle`] changes, pauses, resumes and deletes agents for their operator.
//! - [`HookEmitter`] enqueues hook deliveries at the lifecycle points; [`Dispatcher`]
//!   delivers them, one attempt per message, retrying by re-enqueueing with a delay.

pub mod actions;
pub mod agent_tools;
pub mod approvals;
pub mod budget;
mod conversation;
pub mod dollars;
pub mod framing;
mod heartbeat;
mod hooks;
pub mod intake;
pub mod interrupt;
mod json_body;
mod lifecycle;
pub mod memory;
pub mod pace;
pub mod prompt;
pub mod reminders;
mod retention;
mod schedule;
mod silence;
mod status;
pub mod steering;
mod sweep;
mod switches;
pub mod tool_health;
mod trace;
pub mod transcript;
mod usage;
mod webhooks;
mod worker;

use jiff::SignedDuration;

pub use conversation::{
    Conversation, ConversationSettings, SEEN_SCAN, TurnOutcome, build_context, history, mark_seen,
};
pub use heartbeat::{HeartbeatRunner, RetryError, RunOutcome};
pub use hooks::{
    DispatchReport, DispatchSettings, Dispatcher, Emission, HOOK_BATCH, Handled, HookEmitter,
    RECOVER_SCAN, Recovered, Redriven, Switched, set_hook_active,
};
pub use lifecycle::{Lifecycle, LifecycleError, Scheduled, Toggled, Updated};
pub use prompt::estimate_tokens;
pub use retention::{PruneReport, prune};
pub use schedule::{failure_delay, next_run};
pub use status::{AgentCounts, Finding, GatewayReport, Status, gateway_status, status};
pub use sweep::{SweepProblem, SweepReport, Sweeper};
pub use switches::{switch_subscription, switch_tool};
pub use trace::{Trace, trace};
pub use usage::{
    AwsPrices, AwsRow, CallRecord, ModelPrice, PRICES_AS_OF, PriceTableError, Prices, Records,
    USAGE_SCAN, UsageReport, UsageRow, records, usage,
};
pub use webhooks::{DEFAULT_EVENT_TYPE, Refused, Verdict, WEBHOOK_CACHE_TTL, WebhookIntake};
pub use worker::{BatchOutcome, PollReport, TaskError, Worker};

/// Tunables of the engine. Defaults suit production; tests shorten them.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// How long a claim holds before another sweeper may take the heartbeat over. Must
    /// exceed the time a job can wait in its queue group plus the worker's timeout, and be
    /// at least five minutes so SQS deduplication never drops a reclaim's message.
    pub lease: SignedDuration,
    /// How far behind the claim time a window ends. Events become visible to readers a
    /// moment after they are stamped; the window stops this far back so it never passes
    /// an event that is still being written. Event writes are bounded well under it.
    pub event_settle: SignedDuration,
    /// Cascade depth cap: events produced at a greater depth are recorded, not processed.
    pub cascade_depth: u8,
    /// Most window events one heartbeat processes; the rest go to the next heartbeat,
    /// which is then due at once.
    pub max_window_events: usize,
    /// Claims one sweep makes concurrently.
    pub claim_concurrency: usize,
    /// Due-index shards one sweep works on at once.
    pub shard_concurrency: usize,
    /// Most heartbeats one sweep claims; the rest wait for the next sweep.
    pub sweep_max: usize,
    /// Due heartbeats read per index query.
    pub due_page_size: usize,
    /// Longest delay after repeated failures.
    pub max_backoff: SignedDuration,
    /// Bounds on agents' schedules: how many, and how late a missed wake still runs.
    pub schedules: reminders::ScheduleLimits,
    /// How long a conversation turn waits on a model that does not answer before it is
    /// answered with an apology (`PULSE_TURN_PATIENCE`; see `WaitingTurn`).
    pub turn_patience: SignedDuration,
    /// The model prices dollar budgets are kept at (`PULSE_PRICES` over the built-in).
    pub prices: std::sync::Arc<Prices>,
    /// Whether a beat that does not think makes one small call to keep its agent's
    /// hour-long prompt cache from lapsing before the next beat (`PULSE_CACHE_WARM`; see
    /// [`prompt::warm_up_due`]).
    pub keep_cache_warm: bool,
    /// Where the dashboard links a heartbeat's or a turn's trace: a URL with
    /// `{trace_id}` in it (`PULSE_TRACE_URL`; see [`crate::traces::link`]).
    pub trace_url: Option<String>,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease: SignedDuration::from_mins(10),
            event_settle: SignedDuration::from_secs(2),
            cascade_depth: 3,
            max_window_events: 500,
            claim_concurrency: 32,
            shard_concurrency: 4,
            sweep_max: 10_000,
            due_page_size: 1_000,
            max_backoff: SignedDuration::from_hours(24),
            schedules: reminders::ScheduleLimits::default(),
            turn_patience: conversation::ConversationSettings::DEFAULT_PATIENCE,
            prices: std::sync::Arc::new(Prices::default()),
            keep_cache_warm: true,
            trace_url: None,
        }
    }
}
