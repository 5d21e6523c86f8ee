//! The HTTP surface: one axum router, served by `functions/webhook-receiver` behind a
//! Lambda Function URL and by `pulse serve --listen` on loopback.
//!
//! | route | what |
//! |---|---|
//! | `POST /discord/interactions` | Discord's interactions endpoint ([`discord`]) |
//! | `POST /webhooks/{webhook_id}` | signed webhooks from external systems ([`webhooks`]) |
//! | `POST /v1/agents/{agent_id}/messages` | the messages API: queue a message ([`messages`]) |
//! | `GET /v1/turns/{turn_id}?wait=30s` | the messages API: read (or wait for) the reply |
//! | `GET /v1/openapi.json` | the messages API's OpenAPI document |
//! | `GET /healthz` | liveness |
//!
//! Every answer that is not a success is a JSON body `{"error": "..."}` saying what was
//! wrong and what to do. Malformed input is a 4xx; only a backend that cannot be reached
//! is a 5xx (503, so senders retry). Bodies are read up to [`MAX_BODY`] bytes; larger ones
//! get 413 before anything is verified or stored.

pub mod approvals;
pub mod discord;
mod listener;
pub mod messages;
pub mod slack;
pub mod telegram;
pub mod webhooks;

pub use listener::{ServeLimits, StreamPlace, StreamSlot, StreamsFull, counted_as, serve_app};

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::error;

use crate::config::InboundConfig;
use crate::error::{StoreError, chain};
use crate::ports::{Clock, SessionQueue, Store};

/// The largest body read: 256 KiB.
pub const MAX_BODY: usize = 256 * 1024;

/// The address a request came from, put in the request's extensions by whoever serves
/// the router (the TCP peer under `pulse serve`, the Function URL's `sourceIp` in Lambda).
#[derive(Clone, Debug)]
pub struct ClientIp(pub String);

/// What the handlers share.
pub struct Inbound {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) queue: Arc<dyn SessionQueue>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) discord_key: Option<pulse_signatures::discord::DiscordKey>,
    pub(crate) config: InboundConfig,
    /// The signed-webhook use case.
    pub(crate) webhooks: crate::engine::WebhookIntake,
}

impl Inbound {
    /// The receiver over a backend. A public key that does not parse is left out (the
    /// configuration checks it at start, naming the variable).
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn SessionQueue>,
        clock: Arc<dyn Clock>,
        config: InboundConfig,
    ) -> Self {
        let discord_key = config
            .discord_public_key
            .as_deref()
            .and_then(|k| pulse_signatures::discord::DiscordKey::from_hex(k).ok());
        let webhooks = crate::engine::WebhookIntake::new(
            store.clone(),
            queue.clone(),
            clock.clone(),
            config.delivery_memory,
        );
        Self {
            store,
            queue,
            clock,
            discord_key,
            config,
            webhooks,
        }
    }
}

/// The router.
pub fn router(inbound: Arc<Inbound>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/discord/interactions", post(discord::interaction))
        .route("/telegram/webhook", post(telegram::update))
        .route("/slack/events", post(slack::events))
        .route("/slack/interactions", post(slack::interactions))
        .route("/webhooks/{webhook_id}", post(webhooks::receive))
        .route("/v1/agents/{agent_id}/messages", post(messages::post))
        .route("/v1/turns/{turn_id}", get(messages::get))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{approval_id}", post(approvals::decide))
        .route("/v1/openapi.json", get(messages::openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(inbound)
}

/// Serves the receiver's router on `listener` until `shutdown` resolves, within
/// `limits`, recording each request's peer address as its [`ClientIp`].
pub async fn serve(
    listener: TcpListener,
    inbound: Arc<Inbound>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_app(listener, router(inbound), limits, shutdown).await
}

/// `ok`, or `degraded` (503) with why when the store cannot write: a full disk answers
/// every webhook 503, so a load balancer should stop sending here.
async fn healthz(axum::extract::State(inbound): axum::extract::State<Arc<Inbound>>) -> Response {
    match inbound.store.recheck_writes().await {
        None => Json(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")})).into_response(),
        Some(why) => {
            let mut r = Json(json!({
                "status": "degraded",
                "reason": format!("the store cannot write: {why}"),
                "version": env!("CARGO_PKG_VERSION"),
            }))
            .into_response();
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r
        }
    }
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no such route; Pulse serves POST /discord/interactions, POST /telegram/webhook, POST /slack/events, POST /slack/interactions, POST /webhooks/{webhook_id}, the messages API (GET /v1/openapi.json describes it) and GET /healthz",
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed; the receiver takes POST on /discord/interactions, /telegram/webhook, /slack/events, /slack/interactions, /webhooks/{webhook_id} and /v1/agents/{agent_id}/messages, GET on /v1/turns/{turn_id}, /v1/openapi.json and /healthz",
    )
}

/// A JSON body with a status.
pub(crate) struct Json(pub(crate) Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        json_body(self.0.to_string())
    }
}

/// A 200 answer of `body`, JSON written already, with its content type.
pub(crate) fn json_body(body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `{"error": message}` with `status`.
pub(crate) fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    let mut r = Json(json!({ "error": message.into() })).into_response();
    *r.status_mut() = status;
    r
}

/// Longest text taken from one chat message (Telegram, Slack); longer is cut, with a
/// note.
const MAX_CHAT_TEXT: usize = 4_000;

/// A chat message's text as the agent reads it: what was written, then what else arrived
/// in words (`also`: "a voice note of 7 s"), so a message with no text is never
/// dropped: `(no text; …)` alone, `(with …)` after words; cut at 4,000 characters, saying
/// how long it was.
pub(crate) fn chat_text(text: String, also: &[String]) -> String {
    let mut text = match (text.is_empty(), also.join(", ")) {
        (_, what) if what.is_empty() => text,
        (true, what) => format!("(no text; {what})"),
        (false, what) => format!("{text}\n(with {what})"),
    };
    let n = text.chars().count();
    if n > MAX_CHAT_TEXT {
        text = text.chars().take(MAX_CHAT_TEXT).collect::<String>()
            + &format!("… (cut: {n} characters in all)");
    }
    text
}

/// The answer to a store failure: 503 for an outage (the sender should retry), 500 for
/// a record that cannot be read.
pub(crate) fn store_failure(what: &str, e: &StoreError) -> Response {
    error!(error = %chain(e), "{what}");
    // What went wrong inside stays in the log: the caller is told only whether to retry.
    match e {
        StoreError::Backend { .. } | StoreError::Secret(_) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what}: the store is unavailable; retry later"),
        ),
        _ => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{what}: an internal error; the server's log says more"),
        ),
    }
}

/// How long any body may take to arrive, beyond what its size allows at
/// [`MIN_BODY_RATE`].
pub const BODY_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The slowest a body may arrive, in bytes a second: a sender on any working link sends
/// far faster, and a body trickled slower holds its connection only until its deadline
/// ([`body_deadline`]).
pub const MIN_BODY_RATE: u64 = 32 * 1024;

/// How long a body of the size `headers` declare (or, without a `Content-Length`, of
/// `limit` bytes) may take: [`BODY_GRACE`] and its size at [`MIN_BODY_RATE`] — 10 s for
/// the largest webhook.
pub fn body_deadline(headers: &HeaderMap, limit: usize) -> std::time::Duration {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(limit as u64)
        .min(limit as u64);
    BODY_GRACE + std::time::Duration::from_millis(declared * 1_000 / MIN_BODY_RATE)
}

/// Reads the body up to `limit` bytes (a larger one is 413), within its deadline (a
/// slower one is 408).
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, Response> {
    let deadline = body_deadline(headers, limit);
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) if is_reading_full(&e) => {
            let mut r = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests from your address are still sending their bodies; send each in one go, and retry in a few seconds",
            );
            let h = r.headers_mut();
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(r)
        }
        Ok(Err(_)) => Err(error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is larger than {} KiB (or was cut off); send less",
                limit / 1024
            ),
        )),
        Err(_) => Err(error_response(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} s (it may come no slower than {} KiB a second); send it in one go",
                deadline.as_secs_f64().ceil(),
                MIN_BODY_RATE / 1024
            ),
        )),
    }
}

/// Whether reading a body failed because its address has its share reading.
fn is_reading_full(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<listener::ReadingFull>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The client address recorded in a request's extensions.
pub(crate) fn client_ip(req: &Request) -> Option<String> {
    req.extensions().get::<ClientIp>().map(|c| c.0.clone())
}
