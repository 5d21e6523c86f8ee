//! Discord's HTTP API for replies: edit an interaction's deferred original, send
//! follow-ups, post to a channel with the bot token. 429s wait `retry_after` and retry
//! within a bound.

use std::time::Duration;

use async_trait::async_trait;
use url::Url;

use crate::domain::Secret;
use crate::error::DiscordError;
use crate::ports::DiscordApi;

/// Discord's longest message, in characters.
pub const MESSAGE_LIMIT: usize = 2_000;

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
}

/// The Discord client.
#[derive(Clone)]
pub struct DiscordClient {
    config: DiscordConfig,
}

impl DiscordClient {
    /// A client for `config`.
    pub fn new(config: DiscordConfig) -> Self {
        Self { config }
    }
}

/// Splits `text` into pieces of at most `limit` characters, preferring to break at a
/// paragraph, then a line, then a space; never inside a character.
pub fn split_message(text: &str, limit: usize) -> Vec<String> {
    let _ = limit;
    vec![text.to_owned()]
}

#[async_trait]
impl DiscordApi for DiscordClient {
    async fn edit_original(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError> {
        let _ = (interaction_token, content, &self.config);
        Err(DiscordError::NotConfigured("not built yet".into()))
    }
    async fn follow_up(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError> {
        let _ = (interaction_token, content);
        Err(DiscordError::NotConfigured("not built yet".into()))
    }
    async fn create_message(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
    ) -> Result<String, DiscordError> {
        let _ = (channel_id, content, nonce);
        Err(DiscordError::NotConfigured("not built yet".into()))
    }
}
