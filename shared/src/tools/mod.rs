//! Tool execution. [`Tools`] dispatches on a tool's kind; for now the generic HTTP tool.
//! Built-in tools (the heartbeat agent) join here as further kinds.

mod http;

use std::time::Duration;

use async_trait::async_trait;

pub use http::HttpTool;

use crate::domain::{Tool, ToolKind, ToolRequest};
use crate::ports::{ToolCall, ToolRunner};

/// Runs every kind of tool.
#[derive(Clone)]
pub struct Tools {
    http: HttpTool,
}

impl Tools {
    /// The tool runner used in production: an HTTP client with no redirects.
    pub fn new() -> Self {
        Self {
            http: HttpTool::new(Duration::from_secs(5)),
        }
    }
}

impl Default for Tools {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl ToolRunner for Tools {
    async fn call(&self, tool: &Tool, request: &ToolRequest) -> ToolCall {
        match &tool.kind {
            ToolKind::Http { url, timeout_ms } => {
                self.http
                    .call(url, Duration::from_millis(*timeout_ms), request)
                    .await
            }
        }
    }
}
