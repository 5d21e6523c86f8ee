//! The Discord gateway's lease: one process of many keeps a bot's gateway connection
//! (two answering would answer every message twice). The holder saves with it where to
//! resume (so a successor resumes the session instead of starting a new one, and
//! Discord replays what came meanwhile) and how it is doing (for `pulse status`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::Secret;

/// What a gateway saves with its lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayRecord {
    /// The session to resume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The last sequence number read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// Where to resume (READY's `resume_gateway_url`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_url: Option<String>,
    /// The bot's user id, from READY (a resumed session gets no READY).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bot_user: Option<String>,
    /// `connecting`, `connected`, `reconnecting`, `standby`, `stopped` or `failed`.
    pub state: String,
    /// What went wrong last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Messages queued for agents.
    pub accepted: u64,
    /// Direct messages from users no agent lets in.
    pub strangers: u64,
    /// Reactions recorded as events.
    pub reactions: u64,
    /// Messages for no agent: from bots, or channel messages not addressed to one.
    pub ignored: u64,
    /// Messages from one user to one agent past what it reads from them a minute: not
    /// queued.
    #[serde(default)]
    pub rate_limited: u64,
}

impl GatewayRecord {
    /// Whether it names a session to resume.
    pub fn resumable(&self) -> Option<(&str, u64, &str)> {
        Some((
            self.session_id.as_deref()?,
            self.sequence?,
            self.resume_url.as_deref()?,
        ))
    }
}

/// The lease of the gateway of the bot `token`: one per bot, named by a digest of its
/// token (never the token itself).
pub fn lease_name(token: &Secret) -> String {
    let digest = Sha256::digest(token.expose().as_bytes());
    format!("discord-gateway/{}", hex::encode(&digest[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_named_by_the_token_without_showing_it() {
        let a = lease_name(&Secret::new("token-a"));
        assert!(a.starts_with("discord-gateway/") && !a.contains("token"));
        assert_eq!(a, lease_name(&Secret::new("token-a")));
        assert_ne!(a, lease_name(&Secret::new("token-b")));
    }
}
