//! A fake LLM API on loopback: a real HTTP server answering both the Anthropic Messages
//! API (`POST /v1/messages`, and `/v1/messages/count_tokens` at a token a character) and
//! OpenAI chat completions (`POST /chat/completions`). It records every request and answers from a script of provider-neutral replies, rendered
//! in the wire format the path implies; with an empty script it answers "ok".
//!
//! Point Anthropic clients at [`FakeLlm::url`] and OpenAI ones at the same URL (their base
//! would include `/v1` in real life; here `{url}/chat/completions` is served).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// What the fake answers next.
#[derive(Clone, Debug)]
pub enum Scripted {
    /// A model answer: text and tool calls (name, input).
    Answer {
        /// Text.
        text: Option<String>,
        /// Tool calls, in order.
        tools: Vec<(String, Value)>,
    },
    /// An error status, with a `Retry-After: 0` header on 429.
    Status(u16),
    /// This response body, as it is (in the wire format of the path asked).
    Raw(Value),
}

impl Scripted {
    /// A text answer.
    pub fn text(t: &str) -> Self {
        Self::Answer {
            text: Some(t.to_owned()),
            tools: Vec::new(),
        }
    }
    /// An answer calling one tool.
    pub fn tool(name: &str, input: Value) -> Self {
        Self::Answer {
            text: None,
            tools: vec![(name.to_owned(), input)],
        }
    }
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `/v1/messages` or `/chat/completions`.
    pub path: String,
    /// Headers, lowercase names.
    pub headers: HeaderMap,
    /// The JSON body.
    pub body: Value,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Scripted>,
    requests: Vec<Recorded>,
    /// While set, requests wait for `release` before being answered.
    held: Option<Arc<tokio::sync::Semaphore>>,
    /// Requests whose client closed the connection before they were answered.
    abandoned: usize,
    /// While set, every request is answered with this status (an outage), the script
    /// left as it is.
    down: Option<u16>,
}

/// The fake LLM server.
#[derive(Clone)]
pub struct FakeLlm {
    url: String,
    inner: Arc<Mutex<Inner>>,
    arrived: Arc<tokio::sync::Notify>,
}

impl FakeLlm {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let arrived = Arc::new(tokio::sync::Notify::new());
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .route("/chat/completions", post(openai))
            .with_state((inner.clone(), arrived.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            inner,
            arrived,
        }
    }
    /// From now on, requests are recorded but not answered until [`FakeLlm::release`].
    pub fn hold(&self) {
        self.inner.lock().unwrap().held = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }
    /// Answers one held request (the first to take the permit) and goes on holding.
    pub fn release_one(&self) {
        if let Some(gate) = self.inner.lock().unwrap().held.as_ref() {
            gate.add_permits(1);
        }
    }

    /// Answers the held requests and stops holding.
    pub fn release(&self) {
        if let Some(gate) = self.inner.lock().unwrap().held.take() {
            gate.add_permits(1_000);
        }
    }
    /// Waits until `n` requests have arrived.
    pub async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.arrived.notified();
            if self.requests().len() >= n {
                return;
            }
            notified.await;
        }
    }
    /// The base URL.
    pub fn url(&self) -> String {
        self.url.clone()
    }
    /// Queues the next answers.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.inner.lock().unwrap().script.extend(answers);
    }
    /// From now on answers every request with `status` (an outage: 500, 503, 429), or,
    /// with `None`, from the script again.
    pub fn down(&self, status: Option<u16>) {
        self.inner.lock().unwrap().down = status;
    }
    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }
    /// How many requests the client gave up on (closed) before their answer.
    pub fn abandoned(&self) -> usize {
        self.inner.lock().unwrap().abandoned
    }
    /// Waits until `n` requests were given up on by their client (at most 10 s).
    pub async fn wait_abandoned(&self, n: usize) {
        for _ in 0..1000 {
            if self.abandoned() >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{} requests abandoned, expected {n}", self.abandoned());
    }
}

/// Counts a request as abandoned if its handler is dropped before it answers (hyper
/// drops it when the client closes the connection).
struct Answering(Arc<Mutex<Inner>>, bool);

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.1 {
            self.0.lock().unwrap().abandoned += 1;
        }
    }
}

type Shared = (Arc<Mutex<Inner>>, Arc<tokio::sync::Notify>);

async fn next((inner, arrived): &Shared, path: &str, headers: HeaderMap, body: Value) -> Scripted {
    let gate = {
        let mut g = inner.lock().unwrap();
        g.requests.push(Recorded {
            path: path.to_owned(),
            headers,
            body,
        });
        g.held.clone()
    };
    arrived.notify_waiters();
    let mut answering = Answering(inner.clone(), false);
    if let Some(gate) = gate
        && let Ok(permit) = gate.acquire().await
    {
        // Each held request takes a permit for good: `release_one` answers one.
        permit.forget();
    }
    answering.1 = true;
    let mut g = inner.lock().unwrap();
    if let Some(code) = g.down {
        return Scripted::Status(code);
    }
    g.script.pop_front().unwrap_or_else(|| Scripted::text("ok"))
}

fn status(code: u16) -> Response {
    let mut r = (
        StatusCode::from_u16(code).unwrap(),
        Json(json!({"error": {"message": format!("scripted {code}")}})),
    )
        .into_response();
    if code == 429 {
        r.headers_mut().insert("retry-after", "0".parse().unwrap());
    }
    r
}

async fn anthropic(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    match next(&shared, "/v1/messages", headers, body).await {
        Scripted::Status(code) => status(code),
        Scripted::Raw(body) => Json(body).into_response(),
        Scripted::Answer { text, tools } => {
            let mut content = Vec::new();
            if let Some(t) = text {
                content.push(json!({"type": "text", "text": t}));
            }
            for (i, (name, input)) in tools.iter().enumerate() {
                content.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": input}));
            }
            Json(json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
                "content": content,
                "stop_reason": if tools.is_empty() { "end_turn" } else { "tool_use" },
                "usage": {"input_tokens": 100, "output_tokens": 20}
            }))
            .into_response()
        }
    }
}

/// Anthropic's count-tokens endpoint, counting one token a character of the messages'
/// text (a scripted status or body is answered as it is).
async fn count_tokens(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let chars: usize = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .map(|t| t.chars().count())
        .sum();
    match next(&shared, "/v1/messages/count_tokens", headers, body).await {
        Scripted::Status(code) => status(code),
        Scripted::Raw(body) => Json(body).into_response(),
        Scripted::Answer { .. } => Json(json!({ "input_tokens": chars })).into_response(),
    }
}

async fn openai(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    match next(&shared, "/chat/completions", headers, body).await {
        Scripted::Status(code) => status(code),
        Scripted::Raw(body) => Json(body).into_response(),
        Scripted::Answer { text, tools } => {
            let calls: Vec<Value> = tools
                .iter()
                .enumerate()
                .map(|(i, (name, input))| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": input.to_string()}}))
                .collect();
            let mut message = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            Json(json!({
                "id": "chatcmpl_fake", "model": "fake-gpt",
                "choices": [{"index": 0, "message": message, "finish_reason": if tools.is_empty() { "stop" } else { "tool_calls" }}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20}
            }))
            .into_response()
        }
    }
}
