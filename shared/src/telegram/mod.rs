//! Telegram's Bot API as a [`Channel`]: replies with `sendMessage` (threaded, answering
//! the message they reply to), "typing…" with `sendChatAction`, an approval as a message
//! with an inline keyboard. 429s wait `parameters.retry_after` within a bound; 5xx and
//! transport errors retry with a short backoff; other errors are returned at once.
//!
//! The bot token is part of every request's URL (`/bot<token>/<method>`), so no error
//! here carries a URL: a transport error is worded without it, and the token never
//! reaches a log, a turn's error or an undelivered reply's reason.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tracing::warn;
use url::Url;

use crate::domain::{Agent, Approval, ChannelKind, ChatTarget, ReplyTarget, Secret, TurnId};
use crate::error::ChannelError;
use crate::ports::Channel;

/// The longest part a reply to Telegram is split to, in characters. Telegram takes
/// 4,096 UTF-16 code units a message; a character is at most two, so even a reply of
/// emoji fits.
pub const TELEGRAM_MESSAGE_LIMIT: usize = 2_048;

const TITLE: &str = "Telegram";

/// Where and as whom to call Telegram.
#[derive(Clone, Debug)]
pub struct TelegramConfig {
    /// API base, `https://api.telegram.org` unless `TELEGRAM_API_BASE` says otherwise.
    pub api_base: Url,
    /// `TELEGRAM_BOT_TOKEN`, from @BotFather: needed for everything.
    pub bot_token: Option<Secret>,
    /// `TELEGRAM_WEBHOOK_SECRET`: the secret token Telegram sends with every update
    /// (`X-Telegram-Bot-Api-Secret-Token`); updates without it are refused.
    pub webhook_secret: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Most attempts of one call when rate limited or failing.
    pub max_attempts: u32,
    /// Longest single `retry_after` waited; a longer one gives up (the reply is tried
    /// again later, and the session goes on).
    pub max_retry_wait: Duration,
}

impl TelegramConfig {
    /// Telegram's public API with no credentials: nothing is sent.
    pub fn unconfigured() -> Self {
        Self {
            api_base: Url::parse("https://api.telegram.org")
                .unwrap_or_else(|_| unreachable!("a valid constant URL")),
            bot_token: None,
            webhook_secret: None,
            timeout: Duration::from_secs(10),
            max_attempts: 4,
            max_retry_wait: Duration::from_secs(10),
        }
    }

    /// Whether replies can go out (a bot token is set).
    pub fn is_configured(&self) -> bool {
        self.bot_token.is_some()
    }
}

/// The Telegram client: one HTTP client, built once.
#[derive(Clone)]
pub struct TelegramClient {
    config: TelegramConfig,
    http: reqwest::Client,
}

impl TelegramClient {
    /// A client for `config`.
    pub fn new(config: TelegramConfig) -> Self {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(pulse_egress::tls::client_config().as_ref().clone())
            .timeout(config.timeout)
            // The token is in the URL: it must never follow a redirect to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|e| panic!("cannot start the HTTP client: {e}"));
        Self { config, http }
    }

    /// Calls the Bot API's `method` with `body`, waiting out 429s and retrying 5xx and
    /// transport errors within the attempt budget; the answer's `result`.
    pub async fn call(&self, method: &str, body: Value) -> Result<Value, ChannelError> {
        let token = self
            .config
            .bot_token
            .as_ref()
            .ok_or_else(|| ChannelError::NotConfigured {
                channel: TITLE,
                message: "TELEGRAM_BOT_TOKEN is not set; it is needed to reply on Telegram".into(),
            })?;
        let url = format!(
            "{}/bot{}/{method}",
            self.config.api_base.as_str().trim_end_matches('/'),
            token.expose()
        );
        let attempts = self.config.max_attempts.max(1);
        let mut last = ChannelError::Transport {
            channel: TITLE,
            message: "no attempt was made".into(),
        };
        for attempt in 1..=attempts {
            let backoff = Duration::from_millis(200 << attempt.min(5));
            let wait = match self.http.post(&url).json(&body).send().await {
                Err(e) => {
                    // Without the URL: it holds the token.
                    last = ChannelError::Transport {
                        channel: TITLE,
                        message: format!("{method}: {}", crate::error::chain(&e.without_url())),
                    };
                    backoff
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    let answer = serde_json::from_str::<Value>(&text).ok();
                    let ok = answer.as_ref().and_then(|a| a["ok"].as_bool());
                    if (200..300).contains(&status) && ok == Some(true) {
                        return Ok(answer.map(|mut a| a["result"].take()).unwrap_or_default());
                    }
                    if (200..300).contains(&status) {
                        return Err(ChannelError::Malformed {
                            channel: TITLE,
                            message: format!("{method} answered without `ok`: {}", excerpt(&text)),
                        });
                    }
                    let description = answer
                        .as_ref()
                        .and_then(|a| a["description"].as_str())
                        .map_or_else(|| excerpt(&text), excerpt);
                    if status == 429 {
                        let secs = answer
                            .as_ref()
                            .and_then(|a| a.pointer("/parameters/retry_after"))
                            .and_then(Value::as_f64)
                            .unwrap_or(1.0)
                            .max(0.0);
                        let wait = Duration::from_secs_f64(secs);
                        if wait > self.config.max_retry_wait {
                            warn!(
                                retry_after_s = secs,
                                "Telegram asks to wait longer than the bound; giving up"
                            );
                            return Err(ChannelError::RateLimited {
                                channel: TITLE,
                                attempts: attempt,
                            });
                        }
                        last = ChannelError::RateLimited {
                            channel: TITLE,
                            attempts: attempt,
                        };
                        wait
                    } else if status >= 500 {
                        last = ChannelError::Status {
                            channel: TITLE,
                            status,
                            body: description,
                        };
                        backoff
                    } else {
                        return Err(ChannelError::Status {
                            channel: TITLE,
                            status,
                            body: description,
                        });
                    }
                }
            };
            if attempt < attempts {
                warn!(attempt, wait_ms = wait.as_millis() as u64, error = %last, "Telegram request failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
        Err(last)
    }

    /// Registers `url` as where Telegram pushes the bot's updates (`setWebhook`), with
    /// `secret` as the token each update carries: messages, their edits and button
    /// presses.
    pub async fn set_webhook(&self, url: &str, secret: &str) -> Result<(), ChannelError> {
        self.call(
            "setWebhook",
            json!({
                "url": url,
                "secret_token": secret,
                "allowed_updates": ["message", "edited_message", "callback_query"],
            }),
        )
        .await
        .map(|_| ())
    }

    /// Sends `text` to `to` with `extra` fields (a keyboard); the message's id as
    /// `<chat>/<message_id>` (Telegram numbers messages per chat).
    async fn send(
        &self,
        to: &ChatTarget,
        text: &str,
        reply: bool,
        extra: Value,
    ) -> Result<String, ChannelError> {
        let mut body = json!({ "chat_id": to.chat, "text": text });
        if let Some(thread) = to.thread.as_deref().and_then(|t| t.parse::<i64>().ok()) {
            body["message_thread_id"] = json!(thread);
        }
        if reply && let Some(m) = to.reply_to.as_deref().and_then(|m| m.parse::<i64>().ok()) {
            // A reply to a message deleted meanwhile is sent as a plain message.
            body["reply_parameters"] =
                json!({ "message_id": m, "allow_sending_without_reply": true });
        }
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        let sent = self.call("sendMessage", body).await?;
        match sent["message_id"].as_i64() {
            Some(id) => Ok(format!("{}/{id}", to.chat)),
            None => Err(ChannelError::Malformed {
                channel: TITLE,
                message: "sendMessage answered without a message_id".into(),
            }),
        }
    }
}

/// The chat `to` is, if it is Telegram's.
fn chat_of(to: &ReplyTarget) -> Result<&ChatTarget, ChannelError> {
    match to {
        ReplyTarget::Chat(c) if c.channel == ChannelKind::Telegram => Ok(c),
        other => Err(ChannelError::Malformed {
            channel: TITLE,
            message: format!("a target on {:?} is not Telegram's", other.channel()),
        }),
    }
}

/// A new secret token for the webhook: 64 hexadecimal characters (Telegram takes A-Z,
/// a-z, 0-9, `_` and `-`, up to 256).
///
/// # Panics
///
/// If the operating system's random number generator fails, which leaves no safe way to
/// make a secret.
pub fn new_webhook_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    hex::encode(bytes)
}

fn excerpt(s: &str) -> String {
    s.chars().take(500).collect()
}

#[async_trait]
impl Channel for TelegramClient {
    fn kind(&self) -> ChannelKind {
        ChannelKind::Telegram
    }

    fn message_limit(&self) -> usize {
        TELEGRAM_MESSAGE_LIMIT
    }

    async fn send_part(
        &self,
        to: &ReplyTarget,
        _turn: &TurnId,
        part: usize,
        text: &str,
    ) -> Result<String, ChannelError> {
        // Telegram takes no idempotency key: a crash between this send and the turn's
        // record of it sends the part again when the turn resumes.
        self.send(chat_of(to)?, text, part == 0, json!({})).await
    }

    async fn notify(
        &self,
        to: &ReplyTarget,
        _turn: &TurnId,
        text: &str,
    ) -> Result<(), ChannelError> {
        self.send(chat_of(to)?, text, true, json!({}))
            .await
            .map(|_| ())
    }

    async fn typing(&self, at: &ReplyTarget) -> Result<(), ChannelError> {
        let chat = chat_of(at)?;
        let mut body = json!({ "chat_id": chat.chat, "action": "typing" });
        if let Some(thread) = chat.thread.as_deref().and_then(|t| t.parse::<i64>().ok()) {
            body["message_thread_id"] = json!(thread);
        }
        self.call("sendChatAction", body).await.map(|_| ())
    }

    fn typing_every(&self) -> Option<Duration> {
        // Telegram shows "typing…" for five seconds.
        Some(Duration::from_secs(4))
    }

    async fn ask_approval(
        &self,
        agent: &Agent,
        home: &ReplyTarget,
        approval: &Approval,
    ) -> Result<String, ChannelError> {
        let keyboard = json!({ "reply_markup": { "inline_keyboard": [[
            { "text": "Approve", "callback_data": approval.short_button(true) },
            { "text": "Deny", "callback_data": approval.short_button(false) },
        ]]}});
        self.send(
            chat_of(home)?,
            &approval.asking(&agent.name),
            false,
            keyboard,
        )
        .await
    }
}
