//! The domain: agents, heartbeats, events, tools, subscriptions, actions and the queue's
//! tasks. Types, newtypes and validation; no I/O.

mod agent;
mod chat;
mod event;
mod ids;
mod task;
mod time;
mod tool;

pub use agent::{Agent, AgentLlm, Budgets, ClaimRequest, Heartbeat, HeartbeatStatus, NewAgent};
pub use chat::{
    ChatMessage, LlmRequest, LlmResponse, ProviderKind, Secret, StopReason, ToolSpec, ToolUse, Usage,
};
pub use event::{Cascade, Event, EventCursor, NewEvent, Priority};
pub use ids::{
    ActionId, AgentId, EventId, EventType, HeartbeatId, SessionId, SubscriptionId, ToolName,
};
pub use task::{Delivery, HeartbeatJob, OutgoingTask, SessionTask, TASK_VERSION, TaskEnvelope};
pub use time::{
    ActiveHours, Interval, TimeZoneName, format_duration, from_ms, parse_duration, to_ms,
};
pub use tool::{
    Action, ActionStatus, AgentContext, Beats, Filter, HeartbeatContext, Registry, Subscription,
    Tool, ToolKind, ToolRequest, ToolResponse,
};
