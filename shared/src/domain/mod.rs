//! The domain: agents, heartbeats, events, tools, subscriptions, actions and the queue's
//! tasks. Types, newtypes and validation; no I/O.

mod action;
mod agent;
mod agent_state;
mod approval;
mod channel;
mod chat;
mod conversation;
mod event;
mod expectation;
mod found;
mod heartbeat;
mod hook;
mod hook_delivery;
mod hook_type;
mod ids;
mod instructions;
mod mcp;
mod memory;
mod money;
mod new_agent;
mod outbound;
mod reply;
mod requests;
mod schedule;
mod task;
mod time;
mod token;
mod tool;
mod tool_count;
mod tool_request;
mod undelivered;
mod unreadable;
mod waiting;
mod webhook;
mod webhook_request;

pub use action::{Action, ActionStatus, clipped};
pub use agent::{
    AGENT_KEY_PREFIX, Agent, AgentLlm, AppliedFrom, Budgets, ChatAccess, DEFAULT_BEATS_PER_HOUR,
    DEFAULT_MEMORY_HALF_LIFE, DiscordAccess, DiscordListen, MAX_DISCORD_USERS, MAX_PROMPT_TEXT,
    MAX_PROMPT_TOKENS, Spend, ThinkPolicy, agents_named, check_key_variable,
};
pub use agent_state::{AgentState, AgentStates};
pub use approval::{
    APPROVAL_EXPIRY_RANGE, Approval, ApprovalOutcome, ApprovalStatus, DEFAULT_APPROVAL_EXPIRY,
    Decision, MAX_APPROVAL_REASON, MAX_PARKED_ARGUMENTS, PolicySource, ToolGrant, ToolPolicy,
    check_approval_expiry, clip_reason, parse_button, schema_digest,
};
pub use channel::{ChannelKind, ChatTarget};
pub use chat::{
    CacheKept, CacheTtl, ChatMessage, IMAGE_TYPES, ImageInput, LlmRequest, LlmResponse,
    MAX_IMAGE_BYTES, PromptCache, ProviderKind, Secret, StopReason, ToolSpec, ToolUse, Usage,
    model_sees_images,
};
pub use conversation::{
    ContentBlock, ConversationMessage, InteractionRef, MAX_SIGNAL_TEXT, ReplyTarget, Role, Seen,
    Signal, SignalKind, SignalMeta, Turn, TurnStatus,
};
pub use event::{Cascade, Event, EventCursor, Json, MAX_EVENT_BYTES, NewEvent, Priority, RawJson};
pub use expectation::{Expectation, Must};
pub use found::{Found, FoundEvent, ToolResult};
pub use heartbeat::{
    ClaimRequest, Heartbeat, HeartbeatStatus, Outcome, OutcomeKind, WindowLink, window_links,
};
pub use hook::{
    Hook, HookRoute, HookSummary, HookTarget, MAX_RETRY_AFTER, RetrySchedule, retry_delay,
};
pub use hook_delivery::{
    ATTEMPT_BODY_LIMIT, AttemptStatus, DeliveryStatus, HookAttempt, HookData, HookDelivery,
    HookPayload, HookTask, PayloadAgent, PayloadContext, truncate_utf8,
};
pub use hook_type::{HookType, screaming_snake};
pub use ids::{
    ActionId, AgentId, ApprovalId, EventId, EventType, HeartbeatId, HookDeliveryId, HookId,
    MemoryId, RequestId, SessionId, SignalId, SubscriptionId, TokenId, ToolName, TurnId, WebhookId,
    first_id_at, quote_input, upper_snake,
};
pub use instructions::{
    BeatTask, Cadence, EVERY_BEAT_TASK, Instructions, Moment as TaskMoment, TaskLedger,
};
pub use mcp::{
    AgentTool, MAX_KEPT_BYTES, MAX_MCP_TOOLS, MAX_OFFERED_BYTES, MCP_PREFIX, McpHeader, McpServer,
    McpTool, ModelCall, OfferedTool, offered, within_budget,
};
pub use memory::{
    DotQuery, Embedding, MAX_AFTER_READING, MAX_MEMORY_CHARS, Memory, MemoryChange, MemoryKind,
    MemoryRead, MemorySource, MemoryStatus, Outside, REMEMBER, STOP_WORDS, SUSPENDED_BELOW, dot_i8,
    telling_words,
};
pub use money::{Limit, Tally, Usd};
pub use new_agent::{AgentChanges, NewAgent};
pub use reply::{MESSAGE_LIMIT, split_message};
pub use requests::Requests;
pub use schedule::{
    MAX_NOTE_CHARS, SCHEDULE_MISSED, SCHEDULED, Schedule, ScheduleId, ScheduleRule, WAKE_REQUESTED,
    busiest_hour,
};
pub use task::{
    ConsolidateJob, DedupId, Delivery, HeartbeatJob, MessageId, OutgoingTask, Receipt,
    RedeliverJob, RetryJob, SessionTask, SignalJob, TASK_VERSION, TaskDecodeError, TaskEnvelope,
};
pub use time::{
    ActiveHours, AutoPause, Interval, Retention, TimeZoneName, format_duration, from_ms,
    parse_duration, to_ms,
};
pub use token::{ApiToken, MAX_TOKEN_LIFE, TokenRefusal};
pub use tool::{Filter, HEARTBEAT_AGENT, Registry, Subscription, Tool, ToolKind, builtin_tools};
pub use tool_count::{COUNT_DAYS, CountChange, ToolCount, bucket_ms, bucket_of, hour_of};
pub use tool_request::{
    AgentContext, BadToolResponse, Beats, HeartbeatContext, ToolRequest, ToolResponse,
};
pub use undelivered::{Undelivered, UndeliveredState};
pub use unreadable::Unreadable;
pub use waiting::WaitingTurn;
pub use webhook::{RateLimit, Webhook, WebhookScheme, WebhookSecret, WebhookSummary};
pub use webhook_request::{
    AcceptOutcome, Acceptance, LOGGED_BODY_LIMIT, LOGGED_REASON_LIMIT, REFUSED_LOG_BUDGET, Refusal,
    RequestStatus, WebhookRequest, cap_reason, truncate_body,
};
