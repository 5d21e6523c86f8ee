//! Discord's HTTP API for replies: edit an interaction's deferred original, send
//! follow-ups, post to a channel with the bot token. 429s wait `retry_after` and retry
//! within a bound; 5xx and transport errors retry with a short backoff; other errors are
//! returned at once. Tokens are never logged.

mod channel;
pub mod envelope;
mod lease;

pub use channel::{DiscordChannel, card};
pub use lease::{GatewayRecord, lease_name};

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tracing::warn;
use url::Url;

use crate::domain::Secret;
use crate::error::DiscordError;
use crate::ports::DiscordApi;

pub use crate::domain::{MESSAGE_LIMIT, split_message};

/// Where and as whom to call Discord.
#[derive(Clone, Debug)]
pub struct DiscordConfig {
    /// API base, `https://discord.com/api/v10` unless `DISCORD_API_BASE` says otherwise.
    pub api_base: Url,
    /// `DISCORD_BOT_TOKEN`: needed to post to channels.
    pub bot_token: Option<Secret>,
    /// `DISCORD_APPLICATION_ID`: needed for interaction responses.
    pub application_id: Option<String>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Most attempts of one call when rate limited.
    pub max_attempts: u32,
    /// Longest single `retry_after` waited; a longer one gives up.
    pub max_retry_wait: Duration,
    /// `DISCORD_GATEWAY_URL`: the gateway to connect to instead of the one
    /// `GET /gateway/bot` names.
    pub gateway_url: Option<String>,
    /// `PULSE_DISCORD_GATEWAY`: whether `pulse serve` opens the gateway when it has a
    /// bot token.
    pub gateway: bool,
}

impl DiscordConfig {
    /// Discord's public API with no credentials: nothing is sent.
    pub fn unconfigured() -> Self {
        Self {
            api_base: Url::parse("https://discord.com/api/v10")
                .unwrap_or_else(|_| unreachable!("a valid constant URL")),
            bot_token: None,
            application_id: None,
            timeout: Duration::from_secs(10),
            max_attempts: 4,
            max_retry_wait: Duration::from_secs(10),
            gateway_url: None,
            gateway: true,
        }
    }

    /// Whether replies can go anywhere (a bot token or an application id is set).
    pub fn is_configured(&self) -> bool {
        self.bot_token.is_some() || self.application_id.is_some()
    }
}

/// The Discord client: one HTTP client, built once.
#[derive(Clone)]
pub struct DiscordClient {
    config: DiscordConfig,
    http: reqwest::Client,
}

impl DiscordClient {
    /// A client for `config`.
    pub fn new(config: DiscordConfig) -> Self {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(pulse_egress::tls::client_config().as_ref().clone())
            .timeout(config.timeout)
            // The bot token must never follow a redirect to another host.
            .redirect(reqwest::redirect::Policy::none())
            // Discord asks bots to identify themselves this way.
            .user_agent(concat!(
                "DiscordBot (https://github.com/pulse-agents/pulse, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()
            .unwrap_or_else(|e| panic!("cannot start the HTTP client: {e}"));
        Self { config, http }
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}/{path}",
            self.config.api_base.as_str().trim_end_matches('/')
        )
    }

    fn application_id(&self) -> Result<&str, DiscordError> {
        self.config.application_id.as_deref().ok_or_else(|| {
            DiscordError::NotConfigured(
                "DISCORD_APPLICATION_ID is not set; it is needed to answer interactions".into(),
            )
        })
    }

    /// Sends one request, waiting out 429s (`retry_after`) and retrying 5xx and transport
    /// errors within the attempt budget; returns the written message's id.
    async fn send(
        &self,
        method: reqwest::Method,
        url: String,
        bot: bool,
        body: Value,
    ) -> Result<String, DiscordError> {
        let v = self.request(method, url, bot, body).await?;
        v.get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| DiscordError::Malformed("the message has no id".into()))
    }

    /// Replaces the application's global commands with `commands` (Discord's bulk
    /// overwrite); returns the commands as Discord registered them.
    pub async fn overwrite_commands(&self, commands: &Value) -> Result<Vec<Value>, DiscordError> {
        let url = self.url(&format!("applications/{}/commands", self.application_id()?));
        let v = self
            .request(reqwest::Method::PUT, url, true, commands.clone())
            .await?;
        v.as_array()
            .cloned()
            .ok_or_else(|| DiscordError::Malformed("the answer is not a list of commands".into()))
    }

    /// One request, as `send`, returning the JSON answer.
    async fn request(
        &self,
        method: reqwest::Method,
        url: String,
        bot: bool,
        body: Value,
    ) -> Result<Value, DiscordError> {
        let content_len = body["content"].as_str().map_or(0, |c| c.chars().count());
        if content_len > MESSAGE_LIMIT {
            return Err(DiscordError::Status {
                status: 400,
                body: format!(
                    "content is {content_len} characters; Discord allows {MESSAGE_LIMIT}: split it with split_message"
                ),
            });
        }
        let token = if bot {
            Some(self.config.bot_token.as_ref().ok_or_else(|| {
                DiscordError::NotConfigured(
                    "DISCORD_BOT_TOKEN is not set; it is needed to post to channels".into(),
                )
            })?)
        } else {
            None
        };
        let attempts = self.config.max_attempts.max(1);
        let mut last = DiscordError::Transport("no attempt was made".into());
        for attempt in 1..=attempts {
            let mut req = self.http.request(method.clone(), &url);
            if !body.is_null() {
                req = req.json(&body);
            }
            if let Some(t) = token {
                req = req.header("authorization", format!("Bot {}", t.expose()));
            }
            let wait = match req.send().await {
                Err(e) => {
                    last = DiscordError::Transport(crate::error::chain(&e));
                    Duration::from_millis(200 << attempt.min(5))
                }
                Ok(resp) => {
                    let status = resp.status();
                    let header_wait = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<f64>().ok());
                    let text = resp.text().await.unwrap_or_default();
                    if status.is_success() {
                        if text.trim().is_empty() {
                            // 204 No Content (typing).
                            return Ok(Value::Null);
                        }
                        return serde_json::from_str(&text).map_err(|e| {
                            DiscordError::Malformed(format!("the body is not JSON: {e}"))
                        });
                    }
                    if status.as_u16() == 429 {
                        let secs = serde_json::from_str::<Value>(&text)
                            .ok()
                            .and_then(|v| v.get("retry_after").and_then(Value::as_f64))
                            .or(header_wait)
                            .unwrap_or(1.0)
                            .max(0.0);
                        let wait = Duration::from_secs_f64(secs);
                        if wait > self.config.max_retry_wait {
                            warn!(
                                retry_after_s = secs,
                                "Discord asks to wait longer than the bound; giving up"
                            );
                            return Err(DiscordError::RateLimited { attempts: attempt });
                        }
                        last = DiscordError::RateLimited { attempts: attempt };
                        wait
                    } else if status.is_server_error() {
                        last = DiscordError::Status {
                            status: status.as_u16(),
                            body: excerpt(&text),
                        };
                        Duration::from_millis(200 << attempt.min(5))
                    } else {
                        return Err(DiscordError::Status {
                            status: status.as_u16(),
                            body: excerpt(&text),
                        });
                    }
                }
            };
            if attempt < attempts {
                warn!(attempt, wait_ms = wait.as_millis() as u64, error = %last, "Discord request failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
        Err(last)
    }
}

fn excerpt(s: &str) -> String {
    s.chars().take(500).collect()
}

fn body(content: &str) -> Value {
    // An agent's reply must not ping @everyone or roles.
    json!({"content": content, "allowed_mentions": {"parse": []}})
}

#[async_trait]
impl DiscordApi for DiscordClient {
    async fn edit_original(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError> {
        let url = self.url(&format!(
            "webhooks/{}/{interaction_token}/messages/@original",
            self.application_id()?
        ));
        self.send(reqwest::Method::PATCH, url, false, body(content))
            .await
    }

    async fn follow_up(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError> {
        let url = self.url(&format!(
            "webhooks/{}/{interaction_token}?wait=true",
            self.application_id()?
        ));
        self.send(reqwest::Method::POST, url, false, body(content))
            .await
    }

    async fn create_message(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
        reply_to: Option<&str>,
    ) -> Result<String, DiscordError> {
        let mut b = body(content);
        b["nonce"] = json!(nonce);
        b["enforce_nonce"] = json!(true);
        if let Some(m) = reply_to {
            // A reply to a message deleted meanwhile is still posted, as a plain message.
            b["message_reference"] = json!({"message_id": m, "fail_if_not_exists": false});
        }
        let url = self.url(&format!("channels/{channel_id}/messages"));
        self.send(reqwest::Method::POST, url, true, b).await
    }

    async fn post_card(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
        components: serde_json::Value,
    ) -> Result<String, DiscordError> {
        let mut b = body(content);
        b["nonce"] = json!(nonce);
        b["enforce_nonce"] = json!(true);
        b["components"] = components;
        let url = self.url(&format!("channels/{channel_id}/messages"));
        self.send(reqwest::Method::POST, url, true, b).await
    }

    async fn typing(&self, channel_id: &str) -> Result<(), DiscordError> {
        let url = self.url(&format!("channels/{channel_id}/typing"));
        self.request(reqwest::Method::POST, url, true, json!({}))
            .await
            .map(|_| ())
    }

    async fn open_dm(&self, user_id: &str) -> Result<String, DiscordError> {
        let url = self.url("users/@me/channels");
        self.send(
            reqwest::Method::POST,
            url,
            true,
            json!({"recipient_id": user_id}),
        )
        .await
    }
}

/// Where the gateway is and how many sessions may start (`GET /gateway/bot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayInfo {
    /// The WebSocket URL (`wss://gateway.discord.gg`).
    pub url: String,
    /// Sessions that may still start before `reset_after`.
    pub remaining: u32,
    /// Sessions allowed a day.
    pub total: u32,
    /// When `remaining` resets.
    pub reset_after: Duration,
    /// Identifies allowed at once (every 5 s).
    pub max_concurrency: u16,
}

impl DiscordClient {
    /// Where the gateway is, and the session-start limits of the bot token.
    pub async fn gateway_bot(&self) -> Result<GatewayInfo, DiscordError> {
        let v = self
            .request(
                reqwest::Method::GET,
                self.url("gateway/bot"),
                true,
                Value::Null,
            )
            .await?;
        let url = v
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| DiscordError::Malformed("GET /gateway/bot names no url".into()))?
            .to_owned();
        let limit = |k: &str| {
            v.pointer(&format!("/session_start_limit/{k}"))
                .and_then(Value::as_u64)
        };
        Ok(GatewayInfo {
            url,
            remaining: limit("remaining").unwrap_or(1000) as u32,
            total: limit("total").unwrap_or(1000) as u32,
            reset_after: Duration::from_millis(limit("reset_after").unwrap_or(86_400_000)),
            max_concurrency: limit("max_concurrency").unwrap_or(1).clamp(1, 64) as u16,
        })
    }
}

/// The name of the slash command `pulse discord register-commands` registers.
pub const ASK_COMMAND: &str = "ask";

/// The commands Pulse answers: `/ask text:<...> [file:<attachment>]`; the steering
/// commands `/heartbeat`, `/pause`, `/resume`, `/snooze for:<2h>` and
/// `/quiet hours:<22:00-07:00|off>` (their owner only: the agent's `--discord-users`);
/// and a message context-menu command (`menu_name`, e.g. "Ask Pulse") on any message.
pub fn command_definitions(menu_name: &str) -> Value {
    serde_json::json!([
        {
            "name": ASK_COMMAND,
            "type": 1,
            "description": "Ask the agent of this channel",
            "options": [
                {"type": 3, "name": "text", "description": "What to say", "required": true, "max_length": 6000},
                {"type": 11, "name": "file", "description": "A file or voice message to show it", "required": false}
            ]
        },
        {"name": "heartbeat", "type": 1, "description": "Wake the agent now"},
        {"name": "pause", "type": 1, "description": "Pause the agent's heartbeats (it still answers you)"},
        {"name": "resume", "type": 1, "description": "Resume a paused or snoozed agent"},
        {
            "name": "snooze",
            "type": 1,
            "description": "No heartbeats for a while",
            "options": [{"type": 3, "name": "for", "description": "How long, e.g. 2h or 1d", "required": true, "max_length": 20}]
        },
        {
            "name": "quiet",
            "type": 1,
            "description": "Hours the agent keeps quiet",
            "options": [{"type": 3, "name": "hours", "description": "e.g. 22:00-07:00, or off", "required": true, "max_length": 20}]
        },
        {"name": menu_name, "type": 3}
    ])
}
