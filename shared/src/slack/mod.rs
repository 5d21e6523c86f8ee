//! Slack's Web API as a [`Channel`]: replies with `chat.postMessage` (in the thread they
//! came from), an approval as a message with Block Kit buttons. Slack answers HTTP 200
//! with `ok: false` and an error code for a refusal; a 429 waits `Retry-After` within a
//! bound, and 5xx and transport errors retry with a short backoff. The bot token goes in
//! the `Authorization` header only, never in a URL or a log.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tracing::warn;
use url::Url;

use crate::domain::{Agent, Approval, ChannelKind, ChatTarget, ReplyTarget, Secret, TurnId};
use crate::error::ChannelError;
use crate::ports::Channel;

/// The longest part a reply to Slack is split to, in characters: Slack asks for
/// messages of at most 4,000 characters (it cuts longer ones at 40,000).
pub const SLACK_MESSAGE_LIMIT: usize = 4_000;

const TITLE: &str = "Slack";

/// Slack's error codes for a request that trying again cannot mend.
const HOPELESS: [&str; 6] = [
    "msg_too_long",
    "no_text",
    "invalid_blocks",
    "invalid_arguments",
    "too_many_attachments",
    "invalid_thread_ts",
];

/// Where and as whom to call Slack.
#[derive(Clone, Debug)]
pub struct SlackConfig {
    /// API base, `https://slack.com/api` unless `SLACK_API_BASE` says otherwise.
    pub api_base: Url,
    /// `SLACK_BOT_TOKEN` (`xoxb-…`): needed to reply.
    pub bot_token: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Most attempts of one call when rate limited or failing.
    pub max_attempts: u32,
    /// Longest single `Retry-After` waited; a longer one gives up (the reply is tried
    /// again later, and the session goes on).
    pub max_retry_wait: Duration,
}

impl SlackConfig {
    /// Slack's public API with no credentials: nothing is sent.
    pub fn unconfigured() -> Self {
        Self {
            api_base: Url::parse("https://slack.com/api")
                .unwrap_or_else(|_| unreachable!("a valid constant URL")),
            bot_token: None,
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

/// The Slack client: one HTTP client, built once.
#[derive(Clone)]
pub struct SlackClient {
    config: SlackConfig,
    http: reqwest::Client,
}

impl SlackClient {
    /// A client for `config`.
    pub fn new(config: SlackConfig) -> Self {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(pulse_egress::tls::client_config().as_ref().clone())
            .timeout(config.timeout)
            // The bot token must never follow a redirect to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|e| panic!("cannot start the HTTP client: {e}"));
        Self { config, http }
    }

    /// Calls the Web API's `method` with `body`, waiting out 429s and retrying 5xx and
    /// transport errors within the attempt budget; the answer.
    pub async fn call(&self, method: &str, body: Value) -> Result<Value, ChannelError> {
        let token = self
            .config
            .bot_token
            .as_ref()
            .ok_or_else(|| ChannelError::NotConfigured {
                channel: TITLE,
                message: "SLACK_BOT_TOKEN is not set; it is needed to reply on Slack".into(),
            })?;
        let url = format!(
            "{}/{method}",
            self.config.api_base.as_str().trim_end_matches('/')
        );
        let attempts = self.config.max_attempts.max(1);
        let mut last = ChannelError::Transport {
            channel: TITLE,
            message: "no attempt was made".into(),
        };
        for attempt in 1..=attempts {
            let backoff = Duration::from_millis(200 << attempt.min(5));
            let sent = self
                .http
                .post(&url)
                .bearer_auth(token.expose())
                .json(&body)
                .send()
                .await;
            let wait = match sent {
                Err(e) => {
                    last = ChannelError::Transport {
                        channel: TITLE,
                        message: format!("{method}: {}", crate::error::chain(&e.without_url())),
                    };
                    backoff
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<f64>().ok());
                    let text = resp.text().await.unwrap_or_default();
                    if status == 429 {
                        let wait = Duration::from_secs_f64(retry_after.unwrap_or(1.0).max(0.0));
                        if wait > self.config.max_retry_wait {
                            warn!(
                                retry_after_s = wait.as_secs_f64(),
                                "Slack asks to wait longer than the bound; giving up"
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
                            body: excerpt(&text),
                        };
                        backoff
                    } else if !(200..300).contains(&status) {
                        return Err(ChannelError::Status {
                            channel: TITLE,
                            status,
                            body: excerpt(&text),
                        });
                    } else {
                        let answer: Value =
                            serde_json::from_str(&text).map_err(|e| ChannelError::Malformed {
                                channel: TITLE,
                                message: format!("{method} answered with no JSON: {e}"),
                            })?;
                        if answer["ok"].as_bool() == Some(true) {
                            return Ok(answer);
                        }
                        let code = answer["error"].as_str().unwrap_or("an unnamed error");
                        return Err(ChannelError::Refused {
                            channel: TITLE,
                            code: code.to_owned(),
                            hopeless: HOPELESS.contains(&code),
                        });
                    }
                }
            };
            if attempt < attempts {
                warn!(attempt, wait_ms = wait.as_millis() as u64, error = %last, "Slack request failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
        Err(last)
    }

    /// Posts `text` (and `extra` fields: blocks) to `to`: in its thread, else, in a
    /// channel, in a thread started at the message it answers; its id as
    /// `<channel>/<ts>`.
    async fn post(
        &self,
        to: &ChatTarget,
        text: &str,
        extra: Value,
    ) -> Result<String, ChannelError> {
        let mut body = json!({ "channel": to.chat, "text": text, "unfurl_links": false });
        let direct = to.chat.starts_with('D');
        let thread = to
            .thread
            .as_deref()
            .or(to.reply_to.as_deref().filter(|_| !direct));
        if let Some(ts) = thread {
            body["thread_ts"] = json!(ts);
        }
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        let answer = self.call("chat.postMessage", body).await?;
        match (answer["channel"].as_str(), answer["ts"].as_str()) {
            (Some(channel), Some(ts)) => Ok(format!("{channel}/{ts}")),
            _ => Err(ChannelError::Malformed {
                channel: TITLE,
                message: "chat.postMessage answered without a channel and ts".into(),
            }),
        }
    }
}

/// The chat `to` is, if it is Slack's.
fn chat_of(to: &ReplyTarget) -> Result<&ChatTarget, ChannelError> {
    match to {
        ReplyTarget::Chat(c) if c.channel == ChannelKind::Slack => Ok(c),
        other => Err(ChannelError::Malformed {
            channel: TITLE,
            message: format!("a target on {:?} is not Slack's", other.channel()),
        }),
    }
}

fn excerpt(s: &str) -> String {
    s.chars().take(500).collect()
}

#[async_trait]
impl Channel for SlackClient {
    fn kind(&self) -> ChannelKind {
        ChannelKind::Slack
    }

    fn message_limit(&self) -> usize {
        SLACK_MESSAGE_LIMIT
    }

    async fn send_part(
        &self,
        to: &ReplyTarget,
        _turn: &TurnId,
        _part: usize,
        text: &str,
    ) -> Result<String, ChannelError> {
        // Slack takes no idempotency key: a crash between this post and the turn's
        // record of it posts the part again when the turn resumes.
        self.post(chat_of(to)?, text, json!({})).await
    }

    async fn notify(
        &self,
        to: &ReplyTarget,
        _turn: &TurnId,
        text: &str,
    ) -> Result<(), ChannelError> {
        self.post(chat_of(to)?, text, json!({})).await.map(|_| ())
    }

    fn typing_every(&self) -> Option<Duration> {
        // Slack's Web API shows no "typing…" for a bot's messages.
        None
    }

    async fn ask_approval(
        &self,
        agent: &Agent,
        home: &ReplyTarget,
        approval: &Approval,
    ) -> Result<String, ChannelError> {
        let text = approval.asking(&agent.name);
        let blocks = json!({ "blocks": [
            { "type": "section", "text": { "type": "plain_text", "text": text.chars().take(2_900).collect::<String>() } },
            { "type": "actions", "block_id": "approval", "elements": [
                { "type": "button", "action_id": "approve", "style": "primary",
                  "text": { "type": "plain_text", "text": "Approve" }, "value": approval.short_button(true) },
                { "type": "button", "action_id": "deny", "style": "danger",
                  "text": { "type": "plain_text", "text": "Deny" }, "value": approval.short_button(false) },
            ]},
        ]});
        self.post(chat_of(home)?, &text, blocks).await
    }
}
