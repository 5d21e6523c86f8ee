//! The domain: agents, heartbeats, events, tools, subscriptions, actions and the queue's
//! tasks. Types, newtypes and validation; no I/O.

mod agent;
mod chat;
mod conversation;
mod event;
mod ids;
mod task;
mod time;
mod tool;

pub use agent::{Agent, AgentLlm, Budgets, ClaimRequest, Heartbeat, HeartbeatStatus, NewAgent};
pub use chat::{
    ChatMessage, LlmRequest, LlmResponse, ProviderKind, Secret, StopReason, ToolSpec, ToolUse,
    Usage,
};
pub use conversation::{
    ContentBlock, ConversationMessage, InteractionRef, MAX_SIGNAL_TEXT, Memory, ReplyTarget, Role,
    Signal, SignalKind, SignalMeta, Turn, TurnStatus,
};
pub use event::{Cascade, Event, EventCursor, NewEvent, Priority};
pub use ids::{
    ActionId, AgentId, EventId, EventType, HeartbeatId, MemoryId, SessionId, SignalId,
    SubscriptionId, ToolName, TurnId,
};
pub use task::{
    Delivery, HeartbeatJob, OutgoingTask, SessionTask, SignalJob, TASK_VERSION, TaskEnvelope,
};
pub use time::{
    ActiveHours, Interval, TimeZoneName, format_duration, from_ms, parse_duration, to_ms,
};
pub use tool::{
    Action, ActionStatus, AgentContext, Beats, Filter, HEARTBEAT_AGENT, HeartbeatContext, Registry,
    Subscription, Tool, ToolKind, ToolRequest, ToolResponse, builtin_tools,
};
