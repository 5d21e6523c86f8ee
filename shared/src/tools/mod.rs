//! Tool execution. [`Tools`] dispatches on a tool's kind: the generic HTTP tool, and the
//! built-in heartbeat agent.

mod heartbeat_agent;
mod http;
mod mcp;

use std::time::Duration;

use async_trait::async_trait;
use pulse_egress::Egress;

pub use heartbeat_agent::HeartbeatAgent;
pub use http::HttpTool;
pub use mcp::{IMAGES, MAX_ANSWER, McpCall, McpClients};

use crate::domain::{Subscription, Tool, ToolKind, ToolRequest, builtin_tools};
use crate::ports::{ToolCall, ToolFailure, ToolRunner};

/// Runs every kind of tool.
#[derive(Clone)]
pub struct Tools {
    http: HttpTool,
    heartbeat_agent: Option<HeartbeatAgent>,
}

impl Tools {
    /// HTTP tools only, through `egress` (no redirects, the SSRF guard). The heartbeat
    /// agent fails with a message saying it is not set up.
    pub fn new(egress: Egress) -> Self {
        Self {
            http: HttpTool::new(egress),
            heartbeat_agent: None,
        }
    }

    /// Every tool, the heartbeat agent included: the production runner.
    pub fn with_heartbeat_agent(agent: HeartbeatAgent, egress: Egress) -> Self {
        Self {
            heartbeat_agent: Some(agent),
            ..Self::new(egress)
        }
    }
}

#[async_trait]
impl ToolRunner for Tools {
    fn builtins(&self) -> Vec<(Tool, Subscription)> {
        if self.heartbeat_agent.is_some() {
            builtin_tools()
        } else {
            Vec::new()
        }
    }

    async fn call(&self, tool: &Tool, request: &ToolRequest) -> ToolCall {
        match &tool.kind {
            ToolKind::Http { url, timeout_ms } => {
                self.http
                    .call(
                        url,
                        Duration::from_millis(*timeout_ms),
                        request,
                        &http::secrets(url, tool),
                    )
                    .await
            }
            ToolKind::Mcp(_) => ToolCall {
                result: Err(ToolFailure::Unavailable(format!(
                    "{} is an MCP server: its tools are called by the agents attached to it (`pulse agents update A --tools mcp:{}`), not run on events",
                    tool.name, tool.name
                ))),
                response_meta: None,
            },
            ToolKind::HeartbeatAgent => match &self.heartbeat_agent {
                Some(agent) => agent.call(request).await,
                None => ToolCall {
                    result: Err(ToolFailure::Unavailable(
                        "the heartbeat agent is not set up in this process".to_owned(),
                    )),
                    response_meta: None,
                },
            },
        }
    }
}
