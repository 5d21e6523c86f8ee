//! A fake Discord API on loopback: the routes replies use (edit an interaction's
//! original, follow-ups, channel posts, typing, opening a direct-message channel) and
//! `GET /gateway/bot` (naming the gateway set with [`FakeDiscord::set_gateway`]). It
//! records requests, keeps the messages
//! "created" (an edit of `@original` counts once per interaction), enforces nonces like
//! Discord, and can answer the next requests with a status (429 with `retry_after`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{patch, post, put};
use axum::{Json, Router};
use serde_json::{Value, json};

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct DiscordRequest {
    /// Method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// JSON body.
    pub body: Value,
}

/// A message as Discord would show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Posted {
    /// `channel:<id>` or `interaction:<token>`.
    pub place: String,
    /// Its content.
    pub content: String,
}

#[derive(Default)]
struct Inner {
    requests: Vec<DiscordRequest>,
    messages: Vec<(String, Posted)>,
    nonces: HashMap<(String, String), String>,
    statuses: VecDeque<u16>,
    next_id: u64,
    gateway: Option<String>,
}

/// The fake Discord API.
#[derive(Clone)]
pub struct FakeDiscord {
    base: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeDiscord {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            next_id: 1_000,
            ..Inner::default()
        }));
        let app = Router::new()
            .route(
                "/api/v10/webhooks/{app}/{token}/messages/@original",
                patch(edit_original),
            )
            .route("/api/v10/webhooks/{app}/{token}", post(follow_up))
            .route("/api/v10/channels/{channel}/messages", post(create))
            .route("/api/v10/channels/{channel}/typing", post(typing))
            .route("/api/v10/users/@me/channels", post(open_dm))
            .route("/api/v10/gateway/bot", axum::routing::get(gateway_bot))
            .route(
                "/api/v10/applications/{app}/commands",
                put(overwrite_commands),
            )
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/api/v10", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, inner }
    }
    /// The API base for `DiscordConfig::api_base`.
    pub fn api_base(&self) -> String {
        self.base.clone()
    }
    /// Answers the next requests with these statuses (429 carries `retry_after: 0.01`).
    pub fn fail_next(&self, statuses: impl IntoIterator<Item = u16>) {
        self.inner.lock().unwrap().statuses.extend(statuses);
    }
    /// The gateway `GET /gateway/bot` names.
    pub fn set_gateway(&self, url: &str) {
        self.inner.lock().unwrap().gateway = Some(url.to_owned());
    }
    /// Every request.
    pub fn requests(&self) -> Vec<DiscordRequest> {
        self.inner.lock().unwrap().requests.clone()
    }
    /// The messages a user would see, in creation order.
    pub fn messages(&self) -> Vec<Posted> {
        self.inner
            .lock()
            .unwrap()
            .messages
            .iter()
            .map(|(_, p)| p.clone())
            .collect()
    }
}

fn record(
    inner: &Mutex<Inner>,
    method: Method,
    uri: &Uri,
    headers: HeaderMap,
    body: &Value,
) -> Option<Response> {
    let mut g = inner.lock().unwrap();
    g.requests.push(DiscordRequest {
        method,
        path: uri.to_string(),
        headers,
        body: body.clone(),
    });
    let code = g.statuses.pop_front()?;
    Some(if code == 429 {
        (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"message": "You are being rate limited.", "retry_after": 0.01, "global": false})),
        )
            .into_response()
    } else {
        (
            StatusCode::from_u16(code).unwrap(),
            Json(json!({"message": format!("scripted {code}"), "code": 0})),
        )
            .into_response()
    })
}

fn message(id: &str, content: &str) -> Response {
    Json(json!({"id": id, "content": content, "type": 0})).into_response()
}

async fn edit_original(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((_app, token)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record(&inner, Method::PATCH, &uri, headers, &body) {
        return r;
    }
    let content = body["content"].as_str().unwrap_or("").to_owned();
    let mut g = inner.lock().unwrap();
    let key = format!("original:{token}");
    let place = format!("interaction:{token}");
    match g.messages.iter_mut().find(|(k, _)| *k == key) {
        Some((_, p)) => p.content = content.clone(),
        None => g.messages.push((
            key.clone(),
            Posted {
                place,
                content: content.clone(),
            },
        )),
    }
    message(&key, &content)
}

async fn follow_up(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((_app, token)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record(&inner, Method::POST, &uri, headers, &body) {
        return r;
    }
    let content = body["content"].as_str().unwrap_or("").to_owned();
    let mut g = inner.lock().unwrap();
    g.next_id += 1;
    let id = g.next_id.to_string();
    g.messages.push((
        id.clone(),
        Posted {
            place: format!("interaction:{token}"),
            content: content.clone(),
        },
    ));
    message(&id, &content)
}

/// Discord's 401 for a request that does not carry a bot token.
fn without_bot_token(headers: &HeaderMap) -> Option<Response> {
    let bot = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bot "));
    (!bot).then(|| {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401: Unauthorized"})),
        )
            .into_response()
    })
}

/// Bulk overwrite of an application's commands: echoes them with ids (bot token only).
async fn overwrite_commands(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(app): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record(&inner, Method::PUT, &uri, headers.clone(), &body) {
        return r;
    }
    if let Some(refused) = without_bot_token(&headers) {
        return refused;
    }
    let commands: Vec<Value> = body
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            c["id"] = json!(format!("{}", 1_400_000_000_000_000_000u64 + i as u64));
            c["application_id"] = json!(app);
            c
        })
        .collect();
    Json(Value::Array(commands)).into_response()
}

async fn create(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(channel): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record(&inner, Method::POST, &uri, headers.clone(), &body) {
        return r;
    }
    if let Some(refused) = without_bot_token(&headers) {
        return refused;
    }
    let content = body["content"].as_str().unwrap_or("").to_owned();
    let mut g = inner.lock().unwrap();
    let nonce = body["nonce"].as_str().map(str::to_owned);
    if body["enforce_nonce"] == json!(true)
        && let Some(n) = &nonce
        && let Some(id) = g.nonces.get(&(channel.clone(), n.clone())).cloned()
    {
        return message(&id, &content);
    }
    g.next_id += 1;
    let id = g.next_id.to_string();
    if let Some(n) = nonce {
        g.nonces.insert((channel.clone(), n), id.clone());
    }
    g.messages.push((
        id.clone(),
        Posted {
            place: format!("channel:{channel}"),
            content: content.clone(),
        },
    ));
    message(&id, &content)
}

/// "typing…": 204, bot token only.
async fn typing(State(inner): State<Arc<Mutex<Inner>>>, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(r) = record(&inner, Method::POST, &uri, headers.clone(), &Value::Null) {
        return r;
    }
    if let Some(refused) = without_bot_token(&headers) {
        return refused;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// The direct-message channel with a user: `9<user id>`, the same every time.
async fn open_dm(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record(&inner, Method::POST, &uri, headers.clone(), &body) {
        return r;
    }
    if let Some(refused) = without_bot_token(&headers) {
        return refused;
    }
    let user = body["recipient_id"].as_str().unwrap_or_default();
    Json(json!({"id": format!("9{user}"), "type": 1, "recipients": [{"id": user}]})).into_response()
}

/// Where the gateway is, with generous session-start limits.
async fn gateway_bot(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = record(&inner, Method::GET, &uri, headers.clone(), &Value::Null) {
        return r;
    }
    if let Some(refused) = without_bot_token(&headers) {
        return refused;
    }
    let url = inner
        .lock()
        .unwrap()
        .gateway
        .clone()
        .unwrap_or_else(|| "ws://127.0.0.1:9".into());
    Json(json!({"url": url, "shards": 1, "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}})).into_response()
}
