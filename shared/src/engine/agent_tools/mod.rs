//! The tools an agent is given beyond Pulse's own: the tools of the MCP servers it is
//! attached to (`pulse agents update A --tools mcp:NAME`), offered to the model in its
//! heartbeats and its chat turns alike.
//!
//! An agent with nothing attached costs nothing here: no read is made. Otherwise the
//! registry is read once per run and each attached, active server's stored list is
//! offered (see [`crate::domain::offered`] for the names), within
//! [`crate::domain::MAX_OFFERED_BYTES`] of definitions a request. A server that said its list
//! changed is listed again, and the new list stored, before it is offered.
//!
//! A call is checked against the tool's schema (an object, its required properties)
//! before it is sent; what comes back — the server's answer, its `isError`, or a call
//! whose answer was lost — reaches the model as the call's result, so it can say so
//! rather than guess. Each call is an action in the agent's log (see [`calls`]).

mod calls;
mod parked;

pub(crate) use calls::answer_of;
pub use calls::{Called, Race, Site};
pub use parked::{not_sent, told};

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::domain::{
    Agent, HookRoute, McpServer, OfferedTool, Tool, ToolKind, ToolName, ToolSpec, ToolUse,
};
use crate::engine::HookEmitter;
use crate::engine::tool_health::ToolHealth;
use crate::error::chain;
use crate::ports::{Clock, Store};
use crate::tools::McpClients;

/// The MCP tools of the agents, and the sessions their calls go through.
#[derive(Clone)]
pub struct AgentTools {
    store: Arc<dyn Store>,
    clients: McpClients,
    clock: Arc<dyn Clock>,
    hooks: Option<HookEmitter>,
    health: Arc<ToolHealth>,
    /// Where a parked call's owner is asked (see [`crate::engine::approvals::ask`]).
    channels: crate::ports::Channels,
}

/// What one run offers the model, and where each call goes.
#[derive(Clone, Default)]
pub struct Offer {
    tools: Vec<OfferedTool>,
    /// Each server, and whether its tools may be called again safely.
    servers: HashMap<ToolName, (McpServer, bool)>,
    /// The agent's hooks, read with the offer when it has tools and hooks are on.
    routes: Vec<HookRoute>,
}

impl Offer {
    /// The tools' definitions for the model.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.iter().map(|t| &t.spec)
    }

    /// Whether `name` is one of the offered tools.
    pub fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.model_name == name)
    }
}

impl AgentTools {
    /// Over `store`, calling servers through `clients`.
    pub fn new(store: Arc<dyn Store>, clients: McpClients, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clients,
            clock,
            hooks: None,
            health: Arc::default(),
            channels: crate::ports::Channels::default(),
        }
    }

    /// Asking the owner of a parked call on `channels` (none: it is decided from the
    /// CLI, the dashboard or the API only).
    pub fn with_channels(mut self, channels: crate::ports::Channels) -> Self {
        self.channels = channels;
        self
    }

    /// Asks `agent`'s owner about its parked calls not asked about yet (they were parked
    /// while it was snoozed or outside its active hours, or the post failed): the
    /// heartbeat runner calls this when the agent wakes. How many were asked.
    pub async fn ask_waiting(&self, agent: &Agent) -> usize {
        if self.channels.is_empty() || agent.tools.is_empty() {
            return 0;
        }
        crate::engine::approvals::ask_waiting(
            self.store.as_ref(),
            &self.channels,
            agent,
            self.clock.now(),
        )
        .await
    }

    /// Emitting the calls' hooks (BEFORE/AFTER_<SERVER>, ACTION_*, TOOL_DEGRADED and
    /// TOOL_RECOVERED) through `emitter`.
    pub fn with_hooks(mut self, emitter: HookEmitter) -> Self {
        self.hooks = Some(emitter);
        self
    }

    /// The tools' health counts of this process, shared with the heartbeat runner.
    pub fn health(&self) -> Arc<ToolHealth> {
        self.health.clone()
    }

    /// The sessions with the servers.
    pub fn clients(&self) -> &McpClients {
        &self.clients
    }

    /// What `agent` is offered, named apart from `taken` (Pulse's own tools). A failure
    /// to read the registry offers nothing, and says so in the log: the run goes on
    /// with Pulse's own tools.
    pub async fn offer(&self, agent: &Agent, taken: &[&str]) -> Offer {
        if agent.tools.is_empty() {
            return Offer::default();
        }
        let registry = match self.store.load_registry().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %chain(&e), "the agent's MCP tools could not be read; this run goes without them");
                return Offer::default();
            }
        };
        let mut servers = Vec::new();
        for attached in &agent.tools {
            let Some(tool) = registry
                .tools
                .iter()
                .find(|t| t.name == attached.server && t.active)
            else {
                continue;
            };
            let Some(server) = tool.mcp_server() else {
                continue;
            };
            // A server that says its tools changed is listed again, at most once a
            // minute: one that says so on every call is not followed on every call.
            let due = server
                .listed_at
                .is_none_or(|at| self.clock.now().duration_since(at) >= RELIST_EVERY);
            let server = if due && self.clients.changed(&tool.name) {
                match self.refresh(tool).await {
                    Ok((fresh, _)) => fresh
                        .mcp_server()
                        .cloned()
                        .unwrap_or_else(|| server.clone()),
                    Err(why) => {
                        warn!(server = %tool.name, error = %why, "the changed tools list could not be read; the stored one is offered");
                        server.clone()
                    }
                }
            } else {
                server.clone()
            };
            servers.push((tool.name.clone(), server, tool.idempotent));
        }
        let tools = crate::domain::offered(servers.iter().map(|(n, s, _)| (n, s)), taken);
        // Every request carries the definitions: past their budget, a tool is not
        // offered (the first attached and listed come first).
        let (tools, left_out) = crate::domain::within_budget(tools);
        if !left_out.is_empty() {
            warn!(
                agent_id = %agent.id,
                left_out = left_out.len(),
                first = %left_out[0],
                budget_bytes = crate::domain::MAX_OFFERED_BYTES,
                "the agent's MCP tool definitions exceed what one request carries: these tools are not offered; attach fewer servers, or offer fewer of a server's tools (`pulse tools add-mcp NAME URL --allow TOOL,...`)"
            );
        }
        let routes = match &self.hooks {
            Some(hooks) if !tools.is_empty() => hooks.routes(&agent.id).await.unwrap_or_else(|e| {
                warn!(error = %e, "the agent's hooks could not be read; its tool calls emit none this run");
                Vec::new()
            }),
            _ => Vec::new(),
        };
        Offer {
            tools,
            servers: servers
                .into_iter()
                .map(|(n, s, idem)| (n, (s, idem)))
                .collect(),
            routes,
        }
    }

    /// Lists the server `tool` is and stores the list: the tool as stored, and the
    /// listed tools left out (with why).
    pub async fn refresh(&self, tool: &Tool) -> Result<(Tool, Vec<String>), String> {
        let ToolKind::Mcp(server) = &tool.kind else {
            return Err(format!("{} is not an MCP server", tool.name));
        };
        let (tools, left_out) = self.clients.list(&tool.name, server).await?;
        let mut updated = tool.clone();
        if let ToolKind::Mcp(s) = &mut updated.kind {
            s.tools = tools;
            s.listed_at = Some(self.clock.now());
        }
        self.store
            .update_tool(&updated)
            .await
            .map_err(|e| chain(&e))?;
        info!(server = %tool.name, tools = updated.mcp_server().map_or(0, |s| s.tools.len()), "MCP tools listed");
        Ok((updated, left_out))
    }
}

/// The least time between two listings of a server's tools that a change notice asks.
const RELIST_EVERY: jiff::SignedDuration = jiff::SignedDuration::from_mins(1);

/// What a run offers the model: `own` (Pulse's tools), then the MCP tools `agent` is
/// given, when `tools` is set up.
pub async fn with_own(
    tools: Option<&AgentTools>,
    agent: &Agent,
    mut own: Vec<ToolSpec>,
) -> (Vec<ToolSpec>, Offer) {
    let offer = match tools {
        Some(at) => {
            let taken: Vec<&str> = own.iter().map(|t| t.name.as_str()).collect();
            at.offer(agent, &taken).await
        }
        None => Offer::default(),
    };
    own.extend(offer.specs().cloned());
    (own, offer)
}

/// The idempotency key of `call` within its run.
pub fn idempotency_key(key: &str, call: &ToolUse) -> String {
    let mut h = Sha256::new();
    h.update(call.name.as_bytes());
    h.update([0]);
    h.update(call.input.to_string().as_bytes());
    let digest = h.finalize();
    format!("{key}.{}", hex::encode(&digest[..6]))
}

/// Whether `input` fits the top of `schema`: an object with every required property,
/// and properties of the primitive types the schema names. The server checks the rest.
fn fits(input: &Value, schema: &Value) -> Result<(), String> {
    let Some(obj) = input.as_object() else {
        return Err(format!("they must be a JSON object, not {input}"));
    };
    for req in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = req.as_str()
            && !obj.contains_key(r)
        {
            return Err(format!("\"{r}\" is required"));
        }
    }
    for (k, v) in obj {
        let Some(want) = schema["properties"][k]["type"].as_str() else {
            continue;
        };
        let ok = match want {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => true,
        };
        if !ok {
            return Err(format!("\"{k}\" must be of type {want}, not {v}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_against_the_top_of_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"]
        });
        assert!(fits(&json!({"a": 1, "b": "x"}), &schema).is_ok());
        assert!(
            fits(&json!({"b": "x"}), &schema)
                .unwrap_err()
                .contains("\"a\" is required")
        );
        assert!(
            fits(&json!({"a": "1"}), &schema)
                .unwrap_err()
                .contains("type integer")
        );
        assert!(fits(&json!([1]), &schema).is_err());
    }

    #[test]
    fn the_idempotency_key_is_the_same_for_the_same_call_only() {
        let call = |input: Value| ToolUse {
            id: "c1".into(),
            name: "cal__add".into(),
            input,
        };
        let a = idempotency_key("ac_1.0", &call(json!({"x": 1})));
        assert_eq!(a, idempotency_key("ac_1.0", &call(json!({"x": 1}))));
        assert_ne!(a, idempotency_key("ac_1.0", &call(json!({"x": 2}))));
        assert_ne!(a, idempotency_key("ac_1.1", &call(json!({"x": 1}))));
        assert!(a.starts_with("ac_1.0."));
    }
}
