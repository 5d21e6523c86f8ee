//! A recording hook receiver on 127.0.0.1: keeps every request (headers and raw body)
//! and answers with a status, headers and a delay that a test can switch at any time.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::Notify;

/// One answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// Extra headers (e.g. `retry-after`, `location`).
    pub headers: Vec<(&'static str, String)>,
    /// Wait this long first.
    pub delay: Duration,
    /// The body.
    pub body: String,
}

impl Answer {
    /// A plain answer with this status.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: format!("status {status}"),
        }
    }
    /// With a header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    /// After a delay.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A received request.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its headers.
    pub headers: HeaderMap,
    /// Its raw body.
    pub body: Bytes,
}

impl Received {
    /// A header as a string.
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct ReceiverState {
    received: Mutex<Vec<Received>>,
    /// Answers to give in turn; the last one repeats.
    script: Mutex<VecDeque<Answer>>,
    arrived: Notify,
}

/// The receiver. Stops when dropped.
pub struct FakeReceiver {
    addr: SocketAddr,
    state: Arc<ReceiverState>,
    task: tokio::task::JoinHandle<()>,
}

async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state
        .received
        .lock()
        .unwrap()
        .push(Received { headers, body });
    state.arrived.notify_waiters();
    let answer = {
        let mut script = state.script.lock().unwrap();
        if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script
                .front()
                .cloned()
                .unwrap_or_else(|| Answer::status(200))
        }
    };
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    let mut resp = (
        StatusCode::from_u16(answer.status).unwrap(),
        answer.body.clone(),
    )
        .into_response();
    for (k, v) in answer.headers {
        resp.headers_mut().insert(k, v.parse().unwrap());
    }
    resp
}

impl FakeReceiver {
    /// A receiver answering 200 to everything.
    pub async fn start() -> Self {
        let state = Arc::new(ReceiverState::default());
        let app = Router::new()
            .route("/{*path}", post(receive))
            .route("/", post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    /// Its URL (`/hook`).
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answers with these in turn from now on; the last one repeats.
    pub fn script(&self, answers: Vec<Answer>) {
        *self.state.script.lock().unwrap() = answers.into();
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The hook types received (`X-Pulse-Hook-Type`), sorted.
    pub fn hook_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self
            .received()
            .iter()
            .map(|r| r.header("x-pulse-hook-type"))
            .collect();
        types.sort();
        types
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for(&self, n: usize) {
        let wait = async {
            loop {
                let notified = self.state.arrived.notified();
                if self.state.received.lock().unwrap().len() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("the receiver did not get {n} requests"));
    }
}

impl Drop for FakeReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
