//! A fake Telegram Bot API on loopback: `POST /bot<token>/<method>` for the methods
//! replies use (`sendMessage`, `sendChatAction`) and `setWebhook` (its secret token
//! checked as Telegram checks it), answering as Telegram does
//! (`{"ok": true, "result": …}`, or `{"ok": false, "error_code", "description"}`). It
//! checks the token, refuses a message Telegram would refuse (empty, over 4,096 UTF-16
//! code units, a `reply_parameters` naming no message), records every request, keeps
//! the messages sent, and can answer the next messages with a status (a 429 carries
//! `parameters.retry_after: 1`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// The token the fake takes.
pub const TOKEN: &str = "123456:telegram-test-token";

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct TelegramRequest {
    /// The Bot API method (`sendMessage`).
    pub method: String,
    /// The token in the path.
    pub token: String,
    /// Its JSON body.
    pub body: Value,
}

/// A message sent, as a chat would show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sent {
    /// The chat.
    pub chat: String,
    /// Its id in the chat.
    pub message_id: i64,
    /// Its text.
    pub text: String,
    /// The message it answers, if any.
    pub reply_to: Option<i64>,
    /// The topic it went to, if any.
    pub thread: Option<i64>,
}

#[derive(Default)]
struct Inner {
    requests: Vec<TelegramRequest>,
    sent: Vec<Sent>,
    statuses: VecDeque<u16>,
    next_id: i64,
}

/// The fake Bot API.
#[derive(Clone)]
pub struct FakeTelegram {
    base: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeTelegram {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            next_id: 1,
            ..Inner::default()
        }));
        let app = Router::new()
            .route("/{bot}/{method}", post(call))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, inner }
    }

    /// The API base for `TelegramConfig::api_base`.
    pub fn api_base(&self) -> String {
        self.base.clone()
    }

    /// A client of this fake with its token, answering 429s within 2 s.
    pub fn client(&self) -> pulse_shared::telegram::TelegramClient {
        use pulse_shared::telegram::{TelegramClient, TelegramConfig};
        TelegramClient::new(TelegramConfig {
            api_base: self.base.parse().unwrap(),
            bot_token: Some(pulse_shared::domain::Secret::new(TOKEN)),
            max_retry_wait: std::time::Duration::from_secs(2),
            ..TelegramConfig::unconfigured()
        })
    }

    /// Answers the next `sendMessage` requests with these statuses ("typing…" is not
    /// refused, so a test says which message fails).
    pub fn fail_next(&self, statuses: impl IntoIterator<Item = u16>) {
        self.inner.lock().unwrap().statuses.extend(statuses);
    }

    /// Every request.
    pub fn requests(&self) -> Vec<TelegramRequest> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// The messages sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.inner.lock().unwrap().sent.clone()
    }
}

fn refused(status: u16, description: &str) -> Response {
    let mut body = json!({"ok": false, "error_code": status, "description": description});
    if status == 429 {
        body["parameters"] = json!({"retry_after": 1});
    }
    (StatusCode::from_u16(status).unwrap(), Json(body)).into_response()
}

async fn call(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((bot, method)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let token = bot.strip_prefix("bot").unwrap_or("").to_owned();
    let mut g = inner.lock().unwrap();
    g.requests.push(TelegramRequest {
        method: method.clone(),
        token: token.clone(),
        body: body.clone(),
    });
    if token != TOKEN {
        return refused(401, "Unauthorized");
    }
    if let Some(code) = (method == "sendMessage")
        .then(|| g.statuses.pop_front())
        .flatten()
    {
        let description = match code {
            429 => "Too Many Requests: retry after 1".to_owned(),
            400 => "Bad Request: chat not found".to_owned(),
            403 => "Forbidden: bot was blocked by the user".to_owned(),
            other => format!("scripted {other}"),
        };
        return refused(code, &description);
    }
    if method == "setWebhook" {
        let secret_ok = body["secret_token"].as_str().is_some_and(|t| {
            (1..=256).contains(&t.len())
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
        if !secret_ok {
            return refused(
                400,
                "Bad Request: secret token contains unallowed characters",
            );
        }
        return Json(json!({"ok": true, "result": true, "description": "Webhook was set"}))
            .into_response();
    }
    let chat = match &body["chat_id"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return refused(400, "Bad Request: chat_id is empty"),
    };
    let thread = body["message_thread_id"].as_i64();
    match method.as_str() {
        "sendChatAction" => {
            if body["action"] != "typing" {
                return refused(400, "Bad Request: wrong parameter action in request");
            }
            Json(json!({"ok": true, "result": true})).into_response()
        }
        "sendMessage" => {
            let text = body["text"].as_str().unwrap_or("");
            let units = text.encode_utf16().count();
            if text.trim().is_empty() {
                return refused(400, "Bad Request: message text is empty");
            }
            if units > 4_096 {
                return refused(400, "Bad Request: message is too long");
            }
            let reply_to = body
                .pointer("/reply_parameters/message_id")
                .map(|m| m.as_i64());
            if reply_to == Some(None) {
                return refused(400, "Bad Request: field \"message_id\" must be a number");
            }
            let message_id = g.next_id;
            g.next_id += 1;
            g.sent.push(Sent {
                chat: chat.clone(),
                message_id,
                text: text.to_owned(),
                reply_to: reply_to.flatten(),
                thread,
            });
            Json(json!({"ok": true, "result": {
                "message_id": message_id,
                "date": 1_700_000_000,
                "chat": {"id": chat.parse::<i64>().unwrap_or(0), "type": "private"},
                "text": text,
            }}))
            .into_response()
        }
        other => refused(404, &format!("Not Found: method {other} is not faked")),
    }
}
