//! Tools and the subscriptions that route events to them. What a tool is sent and answers
//! is [`super::tool_request`]; the record of each run, [`super::action`].

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use super::event::{Event, Priority};
use super::ids::{AgentId, EventType, SubscriptionId, ToolName};
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
    /// The keys of `config` whose values were read from variables, with each one's
    /// name (`tools.toml`'s `config_env`): secrets, never written back to a file.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_env: BTreeMap<String, String>,
    /// A disabled tool matches no subscription.
    pub active: bool,
    /// Whether calling it twice does no harm (`--idempotent`): a call whose answer was
    /// lost may then be made again; otherwise it is recorded UNKNOWN for an operator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
    /// The agent whose files declare it (`tools.toml`, applied with `pulse apply`): only
    /// that agent's files change or remove it. `None` for a tool registered with `pulse
    /// tools add`, the deployment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<AgentId>,
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
            config_env: BTreeMap::new(),
            active: true,
            idempotent: false,
            owner: None,
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
            config_env: BTreeMap::new(),
            active: true,
            idempotent: false,
            owner: None,
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
            config_env: BTreeMap::new(),
            active: true,
            owner: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NewEvent;
    use serde_json::json;

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
}
