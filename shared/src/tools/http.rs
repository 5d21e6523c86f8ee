//! The generic HTTP tool: POST the tool request as JSON, read back
//! `{success, output, new_events, usage}`. Users extend Pulse with it without recompiling.
//!
//! Every failure (unreachable, timed out, non-2xx, not JSON, malformed) becomes a failed
//! action with a message that says which, and what is known of the exchange is kept as
//! the action's response. Nothing here fails the heartbeat.

use std::time::Duration;

use reqwest::{Client, redirect};
use serde_json::{Value, json};
use url::Url;

use crate::domain::{ToolRequest, ToolResponse};
use crate::error::chain;
use crate::ports::ToolCall;

/// Largest response body read from a tool.
const MAX_BODY: usize = 1 << 20;
/// How much of a bad body is kept on the action.
const EXCERPT: usize = 2_048;

/// Calls HTTP tools.
#[derive(Clone)]
pub struct HttpTool {
    client: Client,
}

impl HttpTool {
    /// A client with the given connect timeout. Redirects are not followed: a tool's 3xx
    /// is a failure, not a hop to somewhere else.
    pub fn new(connect_timeout: Duration) -> Self {
        let client = Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(redirect::Policy::none())
            .user_agent(concat!("pulse/", env!("CARGO_PKG_VERSION")))
            .build()
            // Building fails only if the TLS backend cannot start: nothing can run then.
            .unwrap_or_else(|e| panic!("cannot start the HTTP client: {e}"));
        Self { client }
    }

    /// POSTs `request` to `url` and validates the answer.
    pub async fn call(&self, url: &Url, timeout: Duration, request: &ToolRequest) -> ToolCall {
        let sent = self
            .client
            .post(url.clone())
            .timeout(timeout)
            .header("x-pulse-action-id", request.action_id.as_str())
            .json(request)
            .send()
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => return failure(describe(url, timeout, &e), None),
        };
        let status = resp.status();
        let body = match read_capped(&mut resp).await {
            Ok(b) => b,
            Err(e) => {
                let why = match e {
                    BodyError::TooLarge => format!(
                        "the tool at {url} answered with a body over {} KiB",
                        MAX_BODY / 1024
                    ),
                    BodyError::Http(e) => describe(url, timeout, &e),
                };
                return failure(why, Some(json!({ "status": status.as_u16() })));
            }
        };
        if !status.is_success() {
            return failure(
                format!(
                    "the tool at {url} answered HTTP {status}{}",
                    excerpt_suffix(&body)
                ),
                Some(json!({ "status": status.as_u16(), "body": excerpt(&body) })),
            );
        }
        let json: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return failure(
                    format!("the tool at {url} answered with a body that is not JSON: {e}"),
                    Some(json!({ "status": status.as_u16(), "body": excerpt(&body) })),
                );
            }
        };
        match ToolResponse::from_json(&json) {
            Ok(r) => ToolCall {
                result: Ok(r),
                response_meta: Some(json),
                interrupted: None,
            },
            Err(why) => failure(
                format!("the tool at {url} answered with a malformed response: {why}"),
                Some(json),
            ),
        }
    }
}

fn failure(why: String, meta: Option<Value>) -> ToolCall {
    ToolCall {
        result: Err(why),
        response_meta: meta,
        interrupted: None,
    }
}

fn describe(url: &Url, timeout: Duration, e: &reqwest::Error) -> String {
    if e.is_timeout() {
        format!("the tool at {url} did not answer within {timeout:?}")
    } else if e.is_connect() {
        format!("the tool at {url} is unreachable: {}", chain(e))
    } else {
        format!("the request to the tool at {url} failed: {}", chain(e))
    }
}

enum BodyError {
    TooLarge,
    Http(reqwest::Error),
}

async fn read_capped(resp: &mut reqwest::Response) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n as usize > MAX_BODY) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Http)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn excerpt(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(EXCERPT)]).into_owned();
    if body.len() > EXCERPT { s + "…" } else { s }
}

fn excerpt_suffix(body: &[u8]) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {}", excerpt(&body[..body.len().min(200)]))
    }
}
