//! The HTTP surface: one axum router, served by `functions/webhook-receiver` behind a
//! Lambda Function URL and by `pulse serve --listen` on loopback.
//!
//! | route | what |
//! |---|---|
//! | `POST /discord/interactions` | Discord's interactions endpoint ([`discord`]) |
//! | `POST /webhooks/{webhook_id}` | signed webhooks from external systems ([`webhooks`]) |
//! | `GET /healthz` | liveness |
//!
//! Every answer that is not a success is a JSON body `{"error": "..."}` saying what was
//! wrong and what to do. Malformed input is a 4xx; only a backend that cannot be reached
//! is a 5xx (503, so senders retry). Bodies are read up to [`MAX_BODY`] bytes; larger ones
//! get 413 before anything is verified or stored.

pub mod discord;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::error;

use jiff::{SignedDuration, Timestamp};

use crate::config::InboundConfig;
use crate::domain::{Webhook, WebhookId};
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
    /// Webhooks read in the last [`WEBHOOK_CACHE_TTL`]: most requests then cost no read.
    webhooks: std::sync::Mutex<std::collections::HashMap<WebhookId, (Webhook, Timestamp)>>,
}

/// How long a webhook read stays cached. A rotated secret is seen at once (a failed
/// check reads the webhook again); enabling or disabling takes effect within this time.
pub const WEBHOOK_CACHE_TTL: SignedDuration = SignedDuration::from_secs(2);

/// Most webhooks cached at once; the cache is emptied beyond it.
const WEBHOOK_CACHE_MAX: usize = 10_000;

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
        Self {
            store,
            queue,
            clock,
            discord_key,
            config,
            webhooks: std::sync::Mutex::default(),
        }
    }

    /// The webhook, from the cache if it was read within [`WEBHOOK_CACHE_TTL`] and
    /// `fresh` is not asked for.
    pub(crate) async fn webhook(
        &self,
        id: &WebhookId,
        fresh: bool,
    ) -> Result<Option<Webhook>, StoreError> {
        let now = self.clock.now();
        if !fresh {
            let cache = self.webhooks.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((w, at)) = cache.get(id)
                && now.duration_since(*at) < WEBHOOK_CACHE_TTL
            {
                return Ok(Some(w.clone()));
            }
        }
        let w = self.store.get_webhook(id).await?;
        let mut cache = self.webhooks.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= WEBHOOK_CACHE_MAX {
            cache.clear();
        }
        match &w {
            Some(w) => {
                cache.insert(id.clone(), (w.clone(), now));
            }
            None => {
                cache.remove(id);
            }
        }
        Ok(w)
    }
}

/// The router.
pub fn router(inbound: Arc<Inbound>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/discord/interactions", post(discord::interaction))
        .route("/webhooks/{webhook_id}", post(webhooks::receive))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(inbound)
}

/// Serves the router on `listener` until `shutdown` resolves, recording each request's
/// peer address as its [`ClientIp`].
pub async fn serve(
    listener: TcpListener,
    inbound: Arc<Inbound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(inbound).layer(axum::middleware::from_fn(peer_ip));
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

async fn peer_ip(mut req: Request, next: Next) -> Response {
    if let Some(ConnectInfo(addr)) = req.extensions().get::<ConnectInfo<SocketAddr>>().cloned() {
        req.extensions_mut().insert(ClientIp(addr.ip().to_string()));
    }
    next.run(req).await
}

async fn healthz() -> Response {
    Json(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")})).into_response()
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no such route; Pulse serves POST /discord/interactions, POST /webhooks/{webhook_id} and GET /healthz",
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed; the receiver takes POST on /discord/interactions and /webhooks/{webhook_id}, GET on /healthz",
    )
}

/// A JSON body with a status.
pub(crate) struct Json(pub(crate) Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        let mut r = Response::new(Body::from(self.0.to_string()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

/// `{"error": message}` with `status`.
pub(crate) fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    let mut r = Json(json!({ "error": message.into() })).into_response();
    *r.status_mut() = status;
    r
}

/// The answer to a store failure: 503 for an outage (the sender should retry), 500 for
/// a record that cannot be read.
pub(crate) fn store_failure(what: &str, e: &StoreError) -> Response {
    error!(error = %chain(e), "{what}");
    match e {
        StoreError::Backend { .. } => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what}: the store is unavailable; retry later"),
        ),
        _ => error_response(StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}")),
    }
}

/// Reads the body up to [`MAX_BODY`]; a larger one is 413.
pub(crate) async fn read_body(body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is larger than {} KiB (or was cut off); send less",
                MAX_BODY / 1024
            ),
        )
    })
}

/// The client address recorded in a request's extensions.
pub(crate) fn client_ip(req: &Request) -> Option<String> {
    req.extensions().get::<ClientIp>().map(|c| c.0.clone())
}
