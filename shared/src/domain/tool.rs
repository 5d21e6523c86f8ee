//! Tools, the subscriptions that route events to them, and the actions that record each run.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use super::agent::{Agent, ThinkPolicy};
use super::event::{Event, EventCursor, NewEvent, Priority, json_size};
use super::found::Found;
use super::ids::{ActionId, AgentId, EventId, EventType, HeartbeatId, SubscriptionId, ToolName};
use super::mcp::ModelCall;
use crate::error::ValidationError;

/// How a tool runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolKind {
    /// POST the tool request as JSON to `url`; the response body is the tool response.
    Http {
        /// Where to POST.
        url: Url,
        /// How long to wait for the whole exchange.
        timeout_ms: u64,
    },
    /// The built-in heartbeat agent: an LLM tool loop with speak, remember, recall and
    /// emit_event.
    HeartbeatAgent,
    /// An MCP server whose tools the agents attached to it may call (never run on
    /// events: subscriptions name the other kinds).
    Mcp(Box<super::mcp::McpServer>),
}

/// A capability agents can use, registered once and shared by all agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Unique name.
    pub name: ToolName,
    /// What it does, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// How it runs.
    pub kind: ToolKind,
    /// Passed to the tool in every request as `tool_config`.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub config: Value,
    /// A disabled tool matches no subscription.
    pub active: bool,
    /// Whether calling it twice does no harm (`--idempotent`): a call whose answer was
    /// lost may then be made again; otherwise it is recorded UNKNOWN for an operator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
    /// When it was registered.
    pub created_at: Timestamp,
}

impl Tool {
    /// The default timeout of an HTTP tool.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A new active HTTP tool. Only `http` and `https` URLs are accepted.
    pub fn http(
        name: ToolName,
        url: &str,
        timeout: Duration,
        now: Timestamp,
    ) -> Result<Self, ValidationError> {
        let url = super::outbound::web_url(
            "tool url",
            url,
            "credentials in a tool URL end up in listings, action errors and logs; take them out of the URL (a tool authenticates Pulse by its own means, e.g. a secret in --config)",
        )?;
        super::outbound::check_timeout("tool timeout", timeout)?;
        Ok(Self {
            name,
            description: None,
            kind: ToolKind::Http {
                url,
                timeout_ms: timeout.as_millis() as u64,
            },
            config: Value::Null,
            active: true,
            idempotent: false,
            created_at: now,
        })
    }

    /// A new active MCP server tool, its tools not listed yet.
    pub fn mcp(name: ToolName, server: super::mcp::McpServer, now: Timestamp) -> Self {
        Self {
            name,
            description: None,
            kind: ToolKind::Mcp(Box::new(server)),
            config: Value::Null,
            active: true,
            idempotent: false,
            created_at: now,
        }
    }

    /// The tool as it may be shown: an MCP server's header values, an HTTP tool's URL
    /// query values and every value of its config replaced by `***` (the names kept).
    pub fn redacted(&self) -> Self {
        let mut shown = self.clone();
        match &mut shown.kind {
            ToolKind::Mcp(s) => {
                for h in &mut s.headers {
                    h.value = super::chat::Secret::new("***");
                }
            }
            ToolKind::Http { url, .. } => {
                if let Ok(u) = url::Url::parse(&pulse_egress::redacted(url)) {
                    *url = u;
                }
            }
            ToolKind::HeartbeatAgent => {}
        }
        hide_values(&mut shown.config);
        shown
    }

    /// The MCP server it is, if it is one.
    pub fn mcp_server(&self) -> Option<&super::mcp::McpServer> {
        match &self.kind {
            ToolKind::Mcp(s) => Some(s),
            _ => None,
        }
    }
}

/// Every scalar of `v` replaced by `***`, its structure and keys kept.
fn hide_values(v: &mut Value) {
    match v {
        Value::Null => {}
        Value::Object(m) => m.values_mut().for_each(hide_values),
        Value::Array(a) => a.iter_mut().for_each(hide_values),
        other => *other = Value::String("***".into()),
    }
}

/// Conditions an event must meet, beyond its type, for a subscription to fire.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Filter {
    /// Only events at least this important (priority number ≤ this).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_priority: Option<Priority>,
    /// The event's `payload.topics` array must contain at least one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// Each dotted path into the payload (`repo.name`, `items.0.id`) must equal the value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub payload: BTreeMap<String, Value>,
}

impl Filter {
    /// Parses a filter given as JSON, naming unknown keys.
    pub fn parse(json: &str) -> Result<Self, ValidationError> {
        serde_json::from_str(json).map_err(|e| {
            ValidationError::new(
                "filter",
                format!("{e}; expected {{\"min_priority\": N, \"topics\": [..], \"payload\": {{\"path\": value}}}}"),
            )
        })
    }

    /// Whether `event` passes the filter.
    pub fn matches(&self, event: &Event) -> bool {
        if let Some(bound) = self.min_priority
            && !event.priority.at_least(bound)
        {
            return false;
        }
        if !self.topics.is_empty() {
            let topics = event.payload.get("topics").and_then(Value::as_array);
            let hit = topics.is_some_and(|ts| {
                ts.iter()
                    .filter_map(Value::as_str)
                    .any(|t| self.topics.iter().any(|want| want == t))
            });
            if !hit {
                return false;
            }
        }
        self.payload
            .iter()
            .all(|(path, want)| lookup(&event.payload, path).is_some_and(|got| json_eq(got, want)))
    }
}

fn lookup<'a>(mut v: &'a Value, path: &str) -> Option<&'a Value> {
    for part in path.split('.') {
        v = match v {
            Value::Object(m) => m.get(part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// JSON equality where `1` equals `1.0`.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Routes events of one type to one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    /// Its id.
    pub id: SubscriptionId,
    /// The tool to run.
    pub tool: ToolName,
    /// The event type it listens to.
    pub event_type: EventType,
    /// Only this agent's events, or every agent's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    /// Further conditions.
    #[serde(default)]
    pub filter: Filter,
    /// Lower runs first among the subscriptions of one event.
    pub order: i32,
    /// A disabled subscription never fires.
    pub active: bool,
    /// When it was created.
    pub created_at: Timestamp,
}

/// The tools and subscriptions in force, read once per run.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// All tools.
    pub tools: Vec<Tool>,
    /// All subscriptions.
    pub subscriptions: Vec<Subscription>,
    /// The store's registry version when this was read: every change to a tool or a
    /// subscription adds one, in the same write as the change.
    pub version: u64,
}

impl Registry {
    /// The active tools subscribed to `event` of `agent` whose filters pass, in execution
    /// order (subscription order, then tool name).
    pub fn matching<'a>(&'a self, event: &Event) -> Vec<(&'a Subscription, &'a Tool)> {
        let mut out: Vec<_> = self
            .subscriptions
            .iter()
            .filter(|s| s.active && s.event_type == event.event_type)
            .filter(|s| s.agent_id.as_ref().is_none_or(|a| *a == event.agent_id))
            .filter(|s| s.filter.matches(event))
            .filter_map(|s| {
                self.tools
                    .iter()
                    .find(|t| t.name == s.tool && t.active && t.mcp_server().is_none())
                    .map(|t| (s, t))
            })
            .collect();
        out.sort_by(|a, b| a.0.order.cmp(&b.0.order).then(a.1.name.cmp(&b.1.name)));
        // Two subscriptions of one tool to one event still make one action.
        out.dedup_by(|a, b| a.1.name == b.1.name);
        out
    }
}

/// The built-in heartbeat agent's tool name.
pub const HEARTBEAT_AGENT: &str = "heartbeat-agent";

impl Tool {
    /// The built-in heartbeat agent, active.
    pub fn heartbeat_agent() -> Self {
        Self {
            name: ToolName::parse(HEARTBEAT_AGENT).unwrap_or_else(|_| unreachable!()),
            description: Some(
                "Built in: wakes with the agent, reads its events and decides whether to speak"
                    .to_owned(),
            ),
            kind: ToolKind::HeartbeatAgent,
            // What it does is keyed by its action (its thoughts, memories and events
            // have ids derived from it): running it again does nothing twice.
            idempotent: true,
            config: Value::Null,
            active: true,
            created_at: Timestamp::UNIX_EPOCH,
        }
    }
}

impl Subscription {
    /// The built-in subscription of the heartbeat agent to HEARTBEAT, for every agent.
    pub fn heartbeat_agent() -> Self {
        let tool = ToolName::parse(HEARTBEAT_AGENT).unwrap_or_else(|_| unreachable!());
        let event_type = EventType::heartbeat();
        Self {
            id: SubscriptionId::for_route(&tool, &event_type, None),
            tool,
            event_type,
            agent_id: None,
            filter: Filter::default(),
            order: 0,
            active: true,
            created_at: Timestamp::UNIX_EPOCH,
        }
    }
}

/// The built-in tools with their default subscriptions.
pub fn builtin_tools() -> Vec<(Tool, Subscription)> {
    vec![(Tool::heartbeat_agent(), Subscription::heartbeat_agent())]
}

impl Registry {
    /// Adds built-in tools and their default subscriptions unless the store has records
    /// by the same name or id (which may disable them).
    pub fn with_builtins(mut self, builtins: Vec<(Tool, Subscription)>) -> Self {
        for (tool, sub) in builtins {
            if !self.tools.iter().any(|t| t.name == tool.name) {
                self.tools.push(tool);
            }
            if !self.subscriptions.iter().any(|s| s.id == sub.id) {
                self.subscriptions.push(sub);
            }
        }
        self
    }
}

/// Where an action is in its life. Actions are created when they start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActionStatus {
    /// The tool is being called.
    Running,
    /// The tool succeeded.
    Completed,
    /// The tool failed; `error` says why.
    Failed,
    /// The tool stopped because a user message interrupted its heartbeat.
    Cancelled,
    /// The tool chose not to run (the heartbeat agent with nothing to think about);
    /// `error` says why.
    Skipped,
    /// The request went out and no answer came back (a timeout, a connection lost
    /// mid-answer, a worker that stopped during the call): the tool may have done its
    /// work. Never run again on its own unless the tool is idempotent; an operator
    /// settles it (`pulse actions retry` or `pulse actions resolve`).
    Unknown,
}

impl ActionStatus {
    /// Every status, in the order of an action's life.
    pub const ALL: [ActionStatus; 6] = [
        Self::Running,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::Skipped,
        Self::Unknown,
    ];

    /// The stored name (`RUNNING`, ...), as it is serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "RUNNING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Skipped => "SKIPPED",
            Self::Unknown => "UNKNOWN",
        }
    }

    /// Reads a name, in any case.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether the action is over.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Running)
    }
}

/// One run of one tool for one event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// Derived from (event, tool).
    pub id: ActionId,
    /// The agent.
    pub agent_id: AgentId,
    /// The heartbeat that ran it (the latest, if it ran again after a crash).
    pub heartbeat_id: HeartbeatId,
    /// The event that triggered it. A model's call to an MCP tool has an id of its own
    /// here, derived from the call and dated with its run's event (or chat turn), so
    /// each call is one action and is filed, kept and deleted with its run.
    pub event_id: EventId,
    /// The tool (for a model's call, the MCP server).
    pub tool: ToolName,
    /// Its status.
    pub status: ActionStatus,
    /// 1 on the first run; more if a worker died while the tool ran.
    pub attempt: u32,
    /// Cascade depth of the triggering event.
    pub depth: u8,
    /// What was sent to the tool.
    pub request: Value,
    /// What the tool answered (or what is known of a failed exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Value>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When this attempt started.
    pub started_at: Timestamp,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// How long the tool took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Events the tool returned, appended to the log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_events: Vec<EventId>,
    /// Set for a call the model made to one of an MCP server's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ModelCall>,
}

impl Action {
    /// The most of a tool's answer the action keeps, as JSON (the engine reads all of
    /// it). With the request, which holds an event of up to
    /// [`MAX_EVENT_BYTES`](super::MAX_EVENT_BYTES) and is kept whole, the record stays
    /// well inside a DynamoDB item's 400 KB.
    pub const KEPT_RESPONSE: usize = 64 * 1024;

    /// Keeps `response` as the action's: whole, or [`clipped`] to
    /// [`Self::KEPT_RESPONSE`] (its longest texts cut, its usage figures kept, so costs
    /// still count what the call spent).
    pub fn keep_response(&mut self, response: Option<Value>) {
        self.response = response.map(|r| clipped(r, Self::KEPT_RESPONSE));
    }

    /// What the action ran, as listings and `pulse tools stats` name it: the tool, or
    /// for a model's call `server/tool`.
    pub fn label(&self) -> String {
        match &self.call {
            Some(c) => format!("{}/{}", self.tool, c.tool),
            None => self.tool.to_string(),
        }
    }
}

/// `value` within `limit` bytes of JSON: whole when it fits; else with its longest
/// strings cut (each cut one ending `… [N more bytes]`), so that its shape — usage
/// figures, statuses, ids, what was scheduled — is kept; else, when strings are not what
/// makes it long, the start of its JSON text, marked clipped, with the whole length.
///
/// The bound holds by construction, escapes counted: the strings' written sizes are
/// read in one pass, one cap is chosen from them that removes the excess (each cut
/// string given room for its marker), every longer string is cut to it once, and what
/// is written is measured. Linear in the value's size, but for sorting its strings.
pub fn clipped(mut value: Value, limit: usize) -> Value {
    let whole = json_size(&value);
    if whole <= limit {
        return value;
    }
    let mut sizes = Vec::new();
    string_sizes(&value, &mut sizes);
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    if let Some(cap) = cap_for(&sizes, whole - limit) {
        cut_strings(&mut value, cap);
        if json_size(&value) <= limit {
            return value;
        }
    }
    let text = value.to_string();
    let start = super::event::json_prefix(&text, limit.saturating_sub(CLIPPED_WRAPPER));
    serde_json::json!({"clipped": true, "bytes": whole, "start": start})
}

/// Room for a cut string's marker, `… [N more bytes]`, as written.
const CUT_MARKER: usize = 40;
/// A string is never cut below this many bytes (nor is one this short cut at all).
const MIN_KEPT: usize = 64;
/// Room for `{"clipped":true,"bytes":N,"start":""}` around the start of the text.
const CLIPPED_WRAPPER: usize = 64;

/// The written sizes of every string value in `v` (keys are kept whole).
fn string_sizes(v: &Value, out: &mut Vec<usize>) {
    match v {
        Value::String(s) => out.push(super::event::json_str_len(s)),
        Value::Array(items) => items.iter().for_each(|i| string_sizes(i, out)),
        Value::Object(map) => map.values().for_each(|i| string_sizes(i, out)),
        _ => {}
    }
}

/// The largest cap such that cutting every string longer than it (sizes sorted, the
/// longest first) removes `excess` bytes with a marker on each; None when that would
/// cut a string below [`MIN_KEPT`].
fn cap_for(sizes: &[usize], excess: usize) -> Option<usize> {
    let mut sum = 0;
    for (k, size) in sizes.iter().enumerate() {
        let cut = k + 1;
        sum += size;
        // Cutting the `cut` longest to `cap` removes sum - cut * cap, and adds markers.
        let Some(room) = sum.checked_sub(excess + cut * CUT_MARKER) else {
            continue;
        };
        let cap = room / cut;
        if cap >= sizes.get(cut).copied().unwrap_or(0) {
            return (cap >= MIN_KEPT).then_some(cap);
        }
    }
    None
}

/// Every string of `v` written longer than `cap` bytes cut to at most `cap`, and marked.
fn cut_strings(v: &mut Value, cap: usize) {
    match v {
        Value::String(s) if super::event::json_str_len(s) > cap => {
            let kept = super::event::json_prefix(s, cap);
            *s = format!("{kept}… [{} more bytes]", s.len() - kept.len());
        }
        Value::Array(items) => items.iter_mut().for_each(|i| cut_strings(i, cap)),
        Value::Object(map) => map.values_mut().for_each(|i| cut_strings(i, cap)),
        _ => {}
    }
}

/// What a tool receives: the event, the agent, the heartbeat's beats, and its config.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ToolRequest {
    /// The action's id; a tool can use it as an idempotency key, since a retried action
    /// keeps its id.
    pub action_id: ActionId,
    /// Which attempt this is.
    pub attempt: u32,
    /// The triggering event.
    pub event: Event,
    /// The agent.
    pub agent: AgentContext,
    /// The heartbeat, with its beats.
    pub heartbeat: HeartbeatContext,
    /// The tool's own configuration.
    pub tool_config: Value,
}

/// The agent as tools see it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentContext {
    /// Id.
    pub id: AgentId,
    /// Name.
    pub name: String,
    /// Alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Persona.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    /// Heartbeat instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// When its heartbeat agent thinks (`auto` is left out).
    #[serde(default, skip_serializing_if = "ThinkPolicy::is_auto")]
    pub think: ThinkPolicy,
}

impl AgentContext {
    /// Whether the heartbeat agent calls the model in `heartbeat`: `Err(reason)` when
    /// the daily budget is spent or the think policy finds nothing to think about.
    pub fn thinks(&self, heartbeat: &HeartbeatContext) -> Result<(), String> {
        if let Some(why) = &heartbeat.budget_spent {
            return Err(why.clone());
        }
        self.think.decide(
            heartbeat.beats.beat,
            heartbeat.window_events + heartbeat.found.events(),
            heartbeat.tasks_due.len(),
        )
    }
}

impl From<&Agent> for AgentContext {
    fn from(a: &Agent) -> Self {
        Self {
            id: a.id.clone(),
            name: a.name.clone(),
            alias: a.alias.clone(),
            persona: a.persona.clone(),
            instructions: a.instructions.clone(),
            think: a.think,
        }
    }
}

/// The heartbeat as tools see it, with its beats.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeartbeatContext {
    /// Id.
    pub id: HeartbeatId,
    /// `{"beat": N, "since_last": M}`.
    pub beats: Beats,
    /// When it was scheduled.
    pub scheduled_at: Timestamp,
    /// When it started.
    pub started_at: Timestamp,
    /// Its event window starts after this cursor.
    pub window_start: EventCursor,
    /// And ends at this one.
    pub window_end: EventCursor,
    /// Events in the window: what arrived since the last heartbeat (not counting its
    /// HEARTBEAT event or what its tools emit).
    #[serde(default)]
    pub window_events: usize,
    /// Why the heartbeat agent may not call the model this beat (the agent's daily
    /// token budget is spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_spent: Option<String>,
    /// What the tools found before the heartbeat agent thinks: set on its request only
    /// (the tools run first, the thinking last).
    #[serde(default, skip_serializing_if = "Found::is_empty")]
    pub found: Found,
    /// The agent's heartbeat tasks due in this heartbeat, by name: set on the heartbeat
    /// agent's request, with `found`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks_due: Vec<String>,
}

/// The agent's sense of time: its beat counter, and beats since the user last
/// interacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beats {
    /// The beat number of this heartbeat.
    pub beat: u64,
    /// Beats since the last user interaction.
    pub since_last: u64,
}

/// What a tool answers.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResponse {
    /// Whether the tool did its job.
    pub success: bool,
    /// Its output.
    pub output: Value,
    /// Events to append to the agent's log; processed in the same heartbeat.
    pub new_events: Vec<NewEvent>,
    /// Usage figures (tokens, cost) as the tool reports them.
    pub usage: Value,
    /// The tool's own error message when `success` is false.
    pub error: Option<String>,
}

/// Why a tool's answer is not a tool response (the whole answer is rejected).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadToolResponse(pub String);

impl ToolResponse {
    /// Most events one action may append; a transaction carries them with the action.
    pub const MAX_NEW_EVENTS: usize = 50;

    /// Validates a tool's JSON answer: `{success, output, new_events, usage, error}`.
    /// Anything malformed, including an event with priority 0, rejects the whole answer.
    pub fn from_json(v: &Value) -> Result<Self, BadToolResponse> {
        Self::read(v).map_err(BadToolResponse)
    }

    fn read(v: &Value) -> Result<Self, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "the response is not a JSON object".to_owned())?;
        let success = obj
            .get("success")
            .and_then(Value::as_bool)
            .ok_or_else(|| "the response has no boolean \"success\" field".to_owned())?;
        let raw_events = match obj.get("new_events") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(_) => return Err("\"new_events\" is not an array".to_owned()),
        };
        if raw_events.len() > Self::MAX_NEW_EVENTS {
            return Err(format!(
                "the response has {} new events; at most {} are accepted per action",
                raw_events.len(),
                Self::MAX_NEW_EVENTS
            ));
        }
        let mut new_events = Vec::with_capacity(raw_events.len());
        for (i, e) in raw_events.iter().enumerate() {
            new_events.push(parse_new_event(e).map_err(|m| format!("new_events[{i}]: {m}"))?);
        }
        Ok(Self {
            success,
            output: obj.get("output").cloned().unwrap_or(Value::Null),
            new_events,
            usage: obj
                .get("usage")
                .or_else(|| obj.get("usage_stats"))
                .cloned()
                .unwrap_or(Value::Null),
            error: obj.get("error").and_then(Value::as_str).map(str::to_owned),
        })
    }
}

fn parse_new_event(e: &Value) -> Result<NewEvent, String> {
    let obj = e.as_object().ok_or("is not an object")?;
    let ty = obj
        .get("type")
        .or_else(|| obj.get("event_type"))
        .and_then(Value::as_str)
        .ok_or("has no \"type\"")?;
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => None,
        Some(p) => Some(p.as_i64().ok_or("\"priority\" is not an integer")?),
    };
    let mut ev = NewEvent::new(
        ty,
        obj.get("payload")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default())),
        priority,
    )
    .map_err(|e| e.to_string())?;
    ev.metadata = obj.get("metadata").cloned().unwrap_or(Value::Null);
    ev.check_size().map_err(|e| e.to_string())?;
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clipping_cuts_the_longest_texts_and_keeps_the_shape() {
        let small = json!({"usage": {"input_tokens": 7}, "output": "ok"});
        assert_eq!(clipped(small.clone(), 1_000), small);
        let big = json!({
            "usage": {"input_tokens": 7},
            "output": {"scheduled": ["sc_1"], "steps": [{"result": "x".repeat(50_000)}, {"result": "é".repeat(30_000)}]},
        });
        let kept = clipped(big, 10_000);
        assert!(json_size(&kept) <= 10_000, "{}", json_size(&kept));
        assert_eq!(kept["usage"], json!({"input_tokens": 7}));
        assert_eq!(kept["output"]["scheduled"], json!(["sc_1"]));
        let first = kept["output"]["steps"][0]["result"].as_str().unwrap();
        assert!(
            first.starts_with("xxx") && first.ends_with("more bytes]"),
            "{first}"
        );
        let second = kept["output"]["steps"][1]["result"].as_str().unwrap();
        assert!(second.starts_with('é'), "cut on a character's boundary");
        // Made long by something else than text: the start of it, marked.
        let numbers = json!((0..5_000).collect::<Vec<u32>>());
        let kept = clipped(numbers, 1_000);
        assert_eq!(kept["clipped"], json!(true));
        assert!(json_size(&kept) <= 1_000, "{}", json_size(&kept));
        assert!(kept["start"].as_str().unwrap().starts_with("[0,1,2,"));
    }

    /// Values of the shapes that once broke the bound: many short strings (a fallback
    /// whose JSON text doubled as it was escaped again), quotes and control characters,
    /// wide characters, deep nesting.
    fn hostile() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = prop_oneof![
            "[a-z]{0,12}",
            "[\"\\\\\u{1}\n\t]{0,200}",
            "[𝄞é\"]{0,300}",
            "[a-z\"]{300,3000}",
        ];
        let leaf = prop_oneof![
            text.prop_map(Value::String),
            any::<i64>().prop_map(|n| json!(n)),
            Just(Value::Null),
        ];
        leaf.prop_recursive(4, 400, 40, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..40).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"]{1,8}", inner, 0..20)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        #[test]
        fn the_bound_holds_for_any_value(value in hostile(), limit in 100usize..6_000) {
            let fits = json_size(&value) <= limit;
            let kept = clipped(value.clone(), limit);
            proptest::prop_assert!(json_size(&kept) <= limit, "{} > {limit}", json_size(&kept));
            if fits {
                proptest::prop_assert_eq!(kept, value);
            }
        }
    }

    #[test]
    fn action_statuses_are_named_as_they_are_serialized() {
        for st in ActionStatus::ALL {
            assert_eq!(serde_json::to_value(st).unwrap(), json!(st.as_str()));
            assert_eq!(ActionStatus::parse(&st.as_str().to_lowercase()), Some(st));
        }
        assert_eq!(ActionStatus::parse("DONE"), None);
    }

    fn event(ty: &str, priority: u8, payload: Value) -> Event {
        NewEvent::new(ty, payload, Some(priority as i64))
            .unwrap()
            .into_event(AgentId::generate(), "test", Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn min_priority_keeps_events_at_least_that_important() {
        let f = Filter::parse(r#"{"min_priority": 7}"#).unwrap();
        assert!(f.matches(&event("A", 3, json!({}))));
        assert!(f.matches(&event("A", 7, json!({}))));
        assert!(!f.matches(&event("A", 8, json!({}))));
    }

    #[test]
    fn topics_need_one_shared_topic() {
        let f = Filter::parse(r#"{"topics": ["AI", "tech"]}"#).unwrap();
        assert!(f.matches(&event("A", 5, json!({"topics": ["tech"]}))));
        assert!(!f.matches(&event("A", 5, json!({"topics": ["cats"]}))));
        assert!(!f.matches(&event("A", 5, json!({}))));
    }

    #[test]
    fn payload_paths_compare_for_equality() {
        let f = Filter::parse(r#"{"payload": {"repo.name": "pulse", "n": 1}}"#).unwrap();
        assert!(f.matches(&event("A", 5, json!({"repo": {"name": "pulse"}, "n": 1.0}))));
        assert!(!f.matches(&event("A", 5, json!({"repo": {"name": "other"}, "n": 1}))));
        assert!(!f.matches(&event("A", 5, json!({"n": 1}))));
    }

    #[test]
    fn unknown_filter_keys_are_an_error() {
        let err = Filter::parse(r#"{"min_prio": 3}"#).unwrap_err();
        assert!(err.message.contains("min_prio"), "{err}");
    }

    #[test]
    fn a_tool_response_with_a_zero_priority_event_is_malformed() {
        let err = ToolResponse::from_json(
            &json!({"success": true, "new_events": [{"type": "B", "priority": 0}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("new_events[0]") && err.contains("priority"),
            "{err}"
        );
        assert!(ToolResponse::from_json(&json!({"output": 1})).is_err());
        let ok =
            ToolResponse::from_json(&json!({"success": true, "new_events": [{"event_type": "B"}]}))
                .unwrap();
        assert_eq!(ok.new_events[0].priority, Priority::DEFAULT);
    }
}
