//! The Discord gateway: the conversation people have in direct messages and channels.
//!
//! Interactions (`/ask`, the message menu) reach Pulse over HTTP; plain messages only
//! arrive over Discord's gateway, a WebSocket the bot keeps open. This crate keeps that
//! connection with `twilight-gateway` (which sends heartbeats, resumes a dropped session
//! from its sequence at READY's `resume_gateway_url`, reconnects with backoff after
//! RECONNECT or INVALID_SESSION, and spaces identifies by the token's session-start
//! limits) and turns what arrives into what the engine already understands:
//!
//! - a `MESSAGE_CREATE` an agent should answer becomes a `message` signal on the agent's
//!   session, through the one intake path every channel uses ([`inbound`]), and a
//!   `MESSAGE_UPDATE` that edited one becomes a signal telling the edit;
//! - a reaction to an agent's message becomes a `DISCORD_REACTION` event in its log, read
//!   by its next heartbeat; it, or a reply to the message, marks the agent's reply seen.
//!
//! The gateway never talks to the model: the conversation worker answers, as a reply to
//! the message, in the channel it came from. A message replayed after a resume is the same
//! signal (its id is derived from the message's id), and a turn never answers a signal
//! twice, so nothing is answered twice. Payloads are read as raw JSON, so an unknown or
//! malformed one is logged and skipped, never a crash.
//!
//! `pulse serve` runs it beside the sweeper when `DISCORD_BOT_TOKEN` is set; on AWS,
//! `pulse gateway` runs it alone, forwarding onto the sessions queue.

mod directory;
mod inbound;
mod lease;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use pulse_shared::discord::{DiscordClient, GatewayInfo, GatewayRecord};
use pulse_shared::domain::{AgentId, Secret};
use pulse_shared::error::DiscordError;
use pulse_shared::ports::{Clock, SessionQueue, Store};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{error, info, warn};
use twilight_gateway::error::ReceiveMessageErrorType;
use twilight_gateway::queue::InMemoryQueue;
use twilight_gateway::{CloseFrame, ConfigBuilder, Intents, Message, Shard, ShardId};

/// The largest gateway payload read: a message with every embed and attachment Discord
/// allows is a small fraction of it.
const MAX_PAYLOAD: usize = 1 << 20;

pub use directory::Directory;
pub use inbound::{DISCORD_REACTION, SLOW_DOWN, USER_MESSAGES_PER_MINUTE};

/// What the gateway listens to: messages in guilds and DMs (with their content), and
/// reactions in both.
pub fn intents() -> Intents {
    Intents::GUILD_MESSAGES
        | Intents::DIRECT_MESSAGES
        | Intents::MESSAGE_CONTENT
        | Intents::GUILD_MESSAGE_REACTIONS
        | Intents::DIRECT_MESSAGE_REACTIONS
}

/// How the gateway connects.
#[derive(Clone, Debug)]
pub struct GatewaySettings {
    /// `DISCORD_BOT_TOKEN`.
    pub token: Secret,
    /// `DISCORD_GATEWAY_URL`: where to connect, instead of asking `GET /gateway/bot`.
    pub url: Option<String>,
    /// `PULSE_DISCORD_DEFAULT_AGENT`: the agent of channels no agent is bound to.
    pub default_agent: Option<AgentId>,
    /// How long the lease on the connection lasts unrenewed: a standby takes over this
    /// long after its holder died, at most (it is renewed every third of it).
    pub lease: Duration,
}

/// The lease's length unless told otherwise.
pub const LEASE: Duration = Duration::from_secs(30);

/// Why the gateway stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Discord refused the token (close code 4004, or 401 from `GET /gateway/bot`).
    #[error(
        "Discord refused the bot token: check DISCORD_BOT_TOKEN (Developer Portal, your application, Bot, Reset Token)"
    )]
    TokenRefused,
    /// Discord closed the connection with a code that forbids reconnecting.
    #[error("Discord closed the gateway for good (close code {code}): {why}")]
    Closed {
        /// The close code.
        code: u16,
        /// What it means and what to do.
        why: String,
    },
}

/// What a close code that ends the gateway means, and what to do about it.
fn closed_for_good(code: u16) -> GatewayError {
    let why = match code {
        4004 => return GatewayError::TokenRefused,
        4010 | 4011 => "this bot needs sharding, which Pulse does not do yet".to_owned(),
        4012 => "the gateway API version is not supported".to_owned(),
        4013 => "the intents are invalid".to_owned(),
        4014 => "a privileged intent is not enabled: turn on Message Content Intent in the Developer Portal (your application, Bot)".to_owned(),
        other => format!("close code {other}"),
    };
    GatewayError::Closed { code, why }
}

/// How the gateway is doing, for logs, `/metrics` and `pulse status` (saved with its
/// lease).
pub type GatewayStatus = GatewayRecord;

/// What the read loop does next.
enum Step {
    /// Handle what the shard read.
    Read(Option<Result<Message, twilight_gateway::error::ReceiveMessageError>>),
    /// Renew the lease.
    Renew,
    /// Stop.
    Stop,
}

/// How a connection ended, when not for good.
enum Ended {
    /// `stop` was set.
    Stopped,
    /// Another process holds the lease now.
    LeaseLost,
}

/// The gateway connection of one bot token.
pub struct Gateway {
    store: Arc<dyn Store>,
    queue: Arc<dyn SessionQueue>,
    clock: Arc<dyn Clock>,
    discord: DiscordClient,
    settings: GatewaySettings,
    directory: Directory,
    status: Arc<Mutex<GatewayStatus>>,
    /// This process's name in the lease.
    holder: String,
    /// The lease's name (from the token).
    lease_name: String,
    /// When the lease was last written.
    renewed: Mutex<Option<std::time::Instant>>,
    /// The bot's own user id, from READY: its mentions, and its own messages ignored.
    bot: Mutex<Option<String>>,
    /// The reactions recorded lately (message/user/emoji), oldest first: a resume
    /// replays what the connection missed, and a replayed reaction is recorded once.
    reactions_seen: Mutex<std::collections::VecDeque<String>>,
    /// Messages each user sent each agent in the current minute.
    rates: Mutex<inbound::UserRates>,
    /// The latest messages' texts (id, text), oldest first: an edit says what the
    /// message read before.
    said_lately: Mutex<std::collections::VecDeque<(String, String)>>,
}

/// How many recent reactions are remembered to recognise a replay.
const REACTIONS_REMEMBERED: usize = 4_096;

impl Gateway {
    /// A gateway that hands what arrives to `store` and `queue`.
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn SessionQueue>,
        clock: Arc<dyn Clock>,
        discord: DiscordClient,
        settings: GatewaySettings,
    ) -> Self {
        Self {
            holder: format!("{}-{}", std::process::id(), ulid::Ulid::new()),
            lease_name: pulse_shared::discord::lease_name(&settings.token),
            renewed: Mutex::new(None),
            directory: Directory::new(store.clone()),
            store,
            queue,
            clock,
            discord,
            settings,
            status: Arc::new(Mutex::new(GatewayStatus {
                state: "connecting".into(),
                ..GatewayStatus::default()
            })),
            bot: Mutex::new(None),
            reactions_seen: Mutex::new(std::collections::VecDeque::new()),
            rates: Mutex::new(inbound::UserRates::default()),
            said_lately: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// How it is doing now.
    pub fn status(&self) -> GatewayStatus {
        lock(&self.status).clone()
    }

    fn set_state(&self, state: &str, error: Option<String>) {
        let mut s = lock(&self.status);
        s.state = state.to_owned();
        if error.is_some() {
            s.last_error = error;
        }
    }

    /// Keeps the connection until `stop` is set (then `Ok`), or until Discord ends it for
    /// good (a refused token, a missing intent). Only the holder of the bot's lease
    /// connects: another process running with the same token stands by, and takes over
    /// (resuming the session where the holder saved it) once the lease is given up or
    /// runs out.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> Result<(), GatewayError> {
        // One crypto provider for the WebSocket's TLS (rustls refuses to guess).
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        loop {
            let Some(resume) = self.stand_by(&mut stop).await else {
                self.set_state("stopped", None);
                return Ok(());
            };
            match self.connect_and_read(&mut stop, resume).await {
                Ok(Ended::Stopped) => {
                    self.set_state("stopped", None);
                    self.give_up().await;
                    return Ok(());
                }
                Ok(Ended::LeaseLost) => {
                    warn!("another process holds the Discord gateway's lease now; standing by");
                }
                Err(e) => {
                    error!(error = %e, "the Discord gateway stopped");
                    self.set_state("failed", Some(e.to_string()));
                    self.give_up().await;
                    return Err(e);
                }
            }
        }
    }

    async fn connect_and_read(
        &self,
        stop: &mut watch::Receiver<bool>,
        resume: Option<(String, u64, String)>,
    ) -> Result<Ended, GatewayError> {
        let Some(info) = self.locate(stop).await? else {
            return Ok(Ended::Stopped);
        };
        let queue = InMemoryQueue::new(
            info.max_concurrency,
            info.remaining,
            info.reset_after,
            info.total,
        );
        let mut config = ConfigBuilder::new(self.settings.token.expose().to_owned(), intents())
            .proxy_url(info.url.trim_end_matches('/').to_owned())
            .queue(queue);
        if let Some((session, sequence, url)) = resume {
            info!(
                sequence,
                "resuming the Discord gateway session saved with the lease"
            );
            config = config
                .session(twilight_gateway::Session::new(sequence, session))
                .resume_url(url);
        }
        let mut shard = Shard::with_config(ShardId::ONE, config.build());
        info!(url = %info.url, "connecting to the Discord gateway");
        let mut renew = tokio::time::interval(self.settings.lease / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_close: Option<u16> = None;
        loop {
            // Chosen first, acted on after: what is done may wait, and the branches'
            // futures must not be held across that.
            let step = tokio::select! {
                item = shard.next() => Step::Read(item),
                _ = renew.tick() => Step::Renew,
                _ = stop.wait_for(|s| *s) => Step::Stop,
            };
            let item = match step {
                Step::Read(item) => item,
                Step::Renew => {
                    self.remember(&shard);
                    if !self.renew().await {
                        // Closed so the session stays resumable for the new holder.
                        shard.close(CloseFrame::RESUME);
                        return Ok(Ended::LeaseLost);
                    }
                    continue;
                }
                Step::Stop => {
                    self.remember(&shard);
                    shard.close(CloseFrame::RESUME);
                    info!("Discord gateway closed");
                    return Ok(Ended::Stopped);
                }
            };
            match item {
                None => return Err(closed_for_good(last_close.unwrap_or(1000))),
                Some(Ok(Message::Text(json))) => {
                    if self.on_payload(&json).await {
                        // Connected: `pulse status` and a successor see it at once.
                        self.remember(&shard);
                        if !self.renew().await {
                            shard.close(CloseFrame::RESUME);
                            return Ok(Ended::LeaseLost);
                        }
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    last_close = frame.as_ref().map(|f| f.code);
                    let code = last_close.unwrap_or(1006);
                    warn!(
                        close_code = code,
                        "the Discord gateway connection closed; resuming"
                    );
                    self.set_state(
                        "reconnecting",
                        Some(format!("connection closed (code {code})")),
                    );
                }
                Some(Err(e)) => match e.kind() {
                    ReceiveMessageErrorType::Deserializing { .. } => {
                        pulse_shared::meter::gateway_message("malformed");
                        // The error carries the payload: only its start is logged.
                        let said: String = e.to_string().chars().take(300).collect();
                        warn!(error = %said, "an unreadable gateway payload was skipped");
                    }
                    _ => {
                        warn!(error = %e, "the Discord gateway failed to reconnect; trying again");
                        self.set_state("reconnecting", Some(e.to_string()));
                    }
                },
            }
        }
    }

    /// Where to connect: `DISCORD_GATEWAY_URL`, else `GET /gateway/bot` (with the
    /// token's session-start limits), asked again with backoff while Discord cannot be
    /// reached. `None` when stopped meanwhile.
    async fn locate(
        &self,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<GatewayInfo>, GatewayError> {
        if let Some(url) = &self.settings.url {
            return Ok(Some(GatewayInfo {
                url: url.clone(),
                remaining: 1000,
                total: 1000,
                reset_after: Duration::from_secs(86_400),
                max_concurrency: 1,
            }));
        }
        let mut wait = Duration::from_secs(1);
        loop {
            match self.discord.gateway_bot().await {
                Ok(info) => return Ok(Some(info)),
                Err(DiscordError::Status { status: 401, .. }) => {
                    return Err(GatewayError::TokenRefused);
                }
                Err(e) => {
                    let why = pulse_shared::error::chain(&e);
                    warn!(error = %why, retry_in = ?wait, "cannot ask Discord where the gateway is");
                    self.set_state("connecting", Some(why));
                }
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return Ok(None),
            }
            wait = (wait * 2).min(Duration::from_secs(60));
        }
    }

    /// One payload from the gateway: READY and RESUMED mark the connection up; messages
    /// and reactions go to [`inbound`]; everything else is the shard's business.
    /// Whether the connection just came up (READY or RESUMED). Returns once what
    /// arrived is queued (or known to be for no agent). The simulation hands its users'
    /// channel messages in here, as the connection would.
    pub async fn on_payload(&self, json: &str) -> bool {
        if json.len() > MAX_PAYLOAD {
            // Nothing Discord sends a bot comes near: not parsed, and not logged whole.
            pulse_shared::meter::gateway_message("too_large");
            warn!(
                bytes = json.len(),
                start = %json.chars().take(120).collect::<String>(),
                "a gateway payload past {} KiB was skipped",
                MAX_PAYLOAD / 1024
            );
            return false;
        }
        let Ok(v) = serde_json::from_str::<Value>(json) else {
            pulse_shared::meter::gateway_message("malformed");
            warn!("a gateway payload that is not JSON was skipped");
            return false;
        };
        if v.get("op").and_then(Value::as_u64) != Some(0) {
            return false;
        }
        let data = v.get("d").unwrap_or(&Value::Null);
        match v.get("t").and_then(Value::as_str) {
            Some("READY") => {
                let user = data.pointer("/user/id").and_then(Value::as_str);
                *lock(&self.bot) = user.map(str::to_owned);
                lock(&self.status).bot_user = user.map(str::to_owned);
                info!(bot_user = user.unwrap_or("?"), "Discord gateway ready");
                self.set_state("connected", None);
                return true;
            }
            Some("RESUMED") => {
                info!("Discord gateway session resumed");
                self.set_state("connected", None);
                return true;
            }
            Some("MESSAGE_CREATE") => self.on_message(data).await,
            Some("MESSAGE_UPDATE") => self.on_update(data).await,
            Some("MESSAGE_REACTION_ADD") => self.on_reaction(data).await,
            _ => {}
        }
        false
    }

    /// Whether `key` was not seen among the recent reactions (and now is).
    fn first_time(&self, key: String) -> bool {
        let mut seen = lock(&self.reactions_seen);
        if seen.contains(&key) {
            return false;
        }
        if seen.len() == REACTIONS_REMEMBERED {
            seen.pop_front();
        }
        seen.push_back(key);
        true
    }

    fn bot_id(&self) -> Option<String> {
        lock(&self.bot).clone()
    }

    fn count(&self, outcome: &'static str) {
        pulse_shared::meter::gateway_message(outcome);
        let mut s = lock(&self.status);
        match outcome {
            "accepted" => s.accepted += 1,
            "stranger" => s.strangers += 1,
            "reaction" => s.reactions += 1,
            "bot" | "not_addressed" => s.ignored += 1,
            "rate_limited" => s.rate_limited += 1,
            _ => {}
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_token_and_a_missing_intent_say_what_to_do() {
        assert!(matches!(closed_for_good(4004), GatewayError::TokenRefused));
        let e = closed_for_good(4014).to_string();
        assert!(e.contains("Message Content Intent"), "{e}");
        assert!(
            GatewayError::TokenRefused
                .to_string()
                .contains("DISCORD_BOT_TOKEN")
        );
    }
}
