//! The generic HTTP tool: POST the tool request as JSON, read back
//! `{success, output, new_events, usage}`. Users extend Pulse with it without recompiling.
//!
//! Every failure (unreachable, timed out, non-2xx, not JSON, malformed) becomes a failed
//! action with a message that says which, and what is known of the exchange is kept as
//! the action's response. Nothing here fails the heartbeat.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use pulse_egress::{Egress, EgressError};
use serde_json::{Value, json};
use url::Url;

use crate::domain::{ToolRequest, ToolResponse};
use crate::ports::{ToolCall, ToolFailure};

/// Largest response body read from a tool.
const MAX_BODY: usize = 1 << 20;
/// How much of a bad body is kept on the action.
const EXCERPT: usize = 2_048;

/// Calls HTTP tools through the SSRF-guarded egress client: a tool URL that resolves to a
/// private, loopback or metadata address is refused unless `PULSE_HOOKS_ALLOW` lists it.
#[derive(Clone)]
pub struct HttpTool {
    egress: Egress,
}

impl HttpTool {
    /// A tool caller over `egress`. Redirects are not followed: a tool's 3xx is a failure,
    /// not a hop to somewhere else.
    pub fn new(egress: Egress) -> Self {
        Self { egress }
    }

    /// POSTs `request` to `url` and validates the answer. What a failure says of the
    /// tool's answer has each of `secrets` (the tool's own: see [`secrets`]) as `***`,
    /// so a tool that repeats its request in an error puts none of them in a log.
    pub async fn call(
        &self,
        url: &Url,
        timeout: Duration,
        request: &ToolRequest,
        secrets: &[String],
    ) -> ToolCall {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(request.action_id.as_str()) {
            // The same on every attempt of the action: a tool that honours it does the
            // work once.
            headers.insert("idempotency-key", v.clone());
            headers.insert("x-pulse-action-id", v);
        }
        let body = serde_json::to_vec(&on_the_wire(request)).unwrap_or_default();
        // What every error below says of the URL: no credentials, no query values.
        let url_shown = pulse_egress::redacted(url);
        let resp = match self
            .egress
            .post(url, headers, body.into(), timeout, MAX_BODY)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let why = describe(&url_shown, timeout, &e);
                let failure = if sent(&e) {
                    ToolFailure::Unknown(format!(
                        "{why}, after the request was sent: the tool may have done its work"
                    ))
                } else {
                    ToolFailure::Unreachable(why)
                };
                return ToolCall {
                    result: Err(failure),
                    response_meta: None,
                };
            }
        };
        let status = resp.status;
        if resp.truncated {
            return failure(
                format!(
                    "the tool at {url_shown} answered with a body over {} KiB",
                    MAX_BODY / 1024
                ),
                Some(json!({ "status": status.as_u16() })),
            );
        }
        let body = resp.body;
        // Hidden before it is cut: a secret cut in two would otherwise show its start.
        let shown = hide(String::from_utf8_lossy(&body).into_owned(), secrets).into_bytes();
        if !status.is_success() {
            return failure(
                format!(
                    "the tool at {url_shown} answered HTTP {status}{}",
                    excerpt_suffix(&shown)
                ),
                Some(json!({ "status": status.as_u16(), "body": excerpt(&shown) })),
            );
        }
        let json: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return failure(
                    hide(
                        format!(
                            "the tool at {url_shown} answered with a body that is not JSON: {e}"
                        ),
                        secrets,
                    ),
                    Some(json!({ "status": status.as_u16(), "body": excerpt(&shown) })),
                );
            }
        };
        match ToolResponse::from_json(&json) {
            Ok(r) => ToolCall {
                result: Ok(r),
                response_meta: Some(json),
            },
            Err(why) => failure(
                hide(
                    format!("the tool at {url_shown} answered with a malformed response: {why}"),
                    secrets,
                ),
                Some(serde_json::from_str(&hide(json.to_string(), secrets)).unwrap_or(Value::Null)),
            ),
        }
    }
}

/// The values of `tool`'s that are secret: its URL's query values, and the config
/// values its files read from variables (`config_env`). Values under four characters
/// are left (hiding every `1` would garble the message, and guess nothing).
pub(crate) fn secrets(url: &Url, tool: &crate::domain::Tool) -> Vec<String> {
    let from_config = tool
        .config_env
        .keys()
        .filter_map(|k| match &tool.config[k] {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        });
    url.query_pairs()
        .map(|(_, v)| v.into_owned())
        .chain(from_config)
        .filter(|s| s.chars().count() >= 4)
        .collect()
}

/// `text` with each of `secrets` as `***`.
fn hide(mut text: String, secrets: &[String]) -> String {
    for s in secrets {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "***");
        }
    }
    text
}

/// The tool answered, but not usably.
fn failure(why: String, meta: Option<Value>) -> ToolCall {
    ToolCall {
        result: Err(ToolFailure::BadAnswer(why)),
        response_meta: meta,
    }
}

/// Whether the request may have reached the tool: it timed out or broke after the
/// connection was made (a refused address, a failed lookup or connection never sent it).
fn sent(e: &EgressError) -> bool {
    !matches!(
        e,
        EgressError::BadUrl(_)
            | EgressError::Refused(_)
            | EgressError::Connect { .. }
            | EgressError::Resolve { .. }
            | EgressError::NoAddresses(_)
            | EgressError::Tls { .. }
    )
}

/// The request as the protocol documents it: the agent as `{id, name, instructions}`.
/// Its persona and think policy are the agent's own, not every subscribed tool's (a
/// subscription for every agent would otherwise receive every agent's persona).
fn on_the_wire(request: &ToolRequest) -> Value {
    let mut v = serde_json::to_value(request).unwrap_or(Value::Null);
    if let Some(agent) = v.get_mut("agent").and_then(Value::as_object_mut) {
        agent.retain(|k, _| matches!(k.as_str(), "id" | "name" | "instructions"));
    }
    v
}

fn describe(url: &str, timeout: Duration, e: &EgressError) -> String {
    match e {
        EgressError::Timeout(_) => format!("the tool at {url} did not answer within {timeout:?}"),
        EgressError::Refused(_) => format!("the tool at {url} is not reachable from Pulse: {e}"),
        EgressError::Connect { .. } | EgressError::Resolve { .. } | EgressError::NoAddresses(_) => {
            format!("the tool at {url} is unreachable: {e}")
        }
        _ => format!("the request to the tool at {url} failed: {e}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_secrets_are_hidden_in_what_a_failure_keeps_even_where_it_is_cut() {
        let url = Url::parse("https://tools.example.com/t?token=query-s3cret&team=ops").unwrap();
        let mut tool = crate::domain::Tool::http(
            crate::domain::ToolName::parse("vault").unwrap(),
            url.as_str(),
            Duration::from_secs(5),
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        tool.config = json!({"api_key": "vault-s3cret-1", "folder": "INBOX", "n": 7});
        tool.config_env = [("api_key".to_owned(), "VAULT_KEY".to_owned())].into();
        let secrets = secrets(&url, &tool);
        assert_eq!(
            secrets,
            ["query-s3cret", "vault-s3cret-1"],
            "not `ops`: too short"
        );
        // The secret straddles the 200 characters a failure's message keeps.
        let body = format!("{}vault-s3cret-1 and query-s3cret", "x".repeat(190));
        let shown = hide(body, &secrets).into_bytes();
        let said = excerpt_suffix(&shown);
        assert!(said.contains("x*** and") && !said.contains("s3"), "{said}");
        assert!(!excerpt(&shown).contains("s3cret"));
    }
}
