//! A fake Slack Web API on loopback: `POST /api/chat.postMessage`, answering as Slack
//! does (HTTP 200 with `{"ok": true, "channel", "ts"}`, or `{"ok": false, "error"}`; a
//! 429 with `Retry-After`). It checks the bot token (`Authorization: Bearer`), records
//! every request, keeps the messages posted, and can answer the next posts with an
//! error code or a status.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// The bot token the fake takes.
pub const TOKEN: &str = "xoxb-slack-test-token";

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct SlackRequest {
    /// The Web API method (`chat.postMessage`).
    pub method: String,
    /// The `Authorization` header.
    pub authorization: String,
    /// Its JSON body.
    pub body: Value,
}

/// A message posted, as a channel would show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Posted {
    /// The channel.
    pub channel: String,
    /// Its `ts`.
    pub ts: String,
    /// Its text.
    pub text: String,
    /// The thread it went to, if any.
    pub thread_ts: Option<String>,
}

/// What the next post is answered with.
#[derive(Clone, Debug)]
pub enum Next {
    /// An HTTP status (429 carries `Retry-After: 1`).
    Status(u16),
    /// HTTP 200 with `ok: false` and this error code.
    Error(&'static str),
}

#[derive(Default)]
struct Inner {
    requests: Vec<SlackRequest>,
    posted: Vec<Posted>,
    next: VecDeque<Next>,
    clock: u64,
}

/// The fake Web API.
#[derive(Clone)]
pub struct FakeSlack {
    base: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeSlack {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            clock: 1_700_000_000,
            ..Inner::default()
        }));
        let app = Router::new()
            .route("/api/{method}", post(call))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, inner }
    }

    /// The API base for `SlackConfig::api_base`.
    pub fn api_base(&self) -> String {
        self.base.clone()
    }

    /// A client of this fake with its token, answering 429s within 2 s.
    pub fn client(&self) -> pulse_shared::slack::SlackClient {
        use pulse_shared::slack::{SlackClient, SlackConfig};
        SlackClient::new(SlackConfig {
            api_base: self.base.parse().unwrap(),
            bot_token: Some(pulse_shared::domain::Secret::new(TOKEN)),
            max_retry_wait: std::time::Duration::from_secs(2),
            ..SlackConfig::unconfigured()
        })
    }

    /// Answers the next posts so.
    pub fn fail_next(&self, next: impl IntoIterator<Item = Next>) {
        self.inner.lock().unwrap().next.extend(next);
    }

    /// Every request.
    pub fn requests(&self) -> Vec<SlackRequest> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// The messages posted, in order.
    pub fn posted(&self) -> Vec<Posted> {
        self.inner.lock().unwrap().posted.clone()
    }
}

async fn call(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut g = inner.lock().unwrap();
    g.requests.push(SlackRequest {
        method: method.clone(),
        authorization: authorization.clone(),
        body: body.clone(),
    });
    let refuse = |error: &str| Json(json!({"ok": false, "error": error})).into_response();
    if authorization != format!("Bearer {TOKEN}") {
        return refuse("invalid_auth");
    }
    if method != "chat.postMessage" {
        return refuse("unknown_method");
    }
    match g.next.pop_front() {
        Some(Next::Status(429)) => {
            return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "").into_response();
        }
        Some(Next::Status(code)) => {
            return (StatusCode::from_u16(code).unwrap(), "scripted").into_response();
        }
        Some(Next::Error(code)) => return refuse(code),
        None => {}
    }
    let Some(channel) = body["channel"].as_str() else {
        return refuse("channel_not_found");
    };
    let text = body["text"].as_str().unwrap_or("");
    if text.trim().is_empty() && body.get("blocks").is_none() {
        return refuse("no_text");
    }
    if text.chars().count() > 40_000 {
        return refuse("msg_too_long");
    }
    g.clock += 1;
    let ts = format!("{}.000100", g.clock);
    g.posted.push(Posted {
        channel: channel.to_owned(),
        ts: ts.clone(),
        text: text.to_owned(),
        thread_ts: body["thread_ts"].as_str().map(str::to_owned),
    });
    Json(json!({"ok": true, "channel": channel, "ts": ts, "message": {"text": text}}))
        .into_response()
}
