//! The chat platforms an agent speaks on, and a place on one of them.

use serde::{Deserialize, Serialize};

/// A chat platform an agent can be reached on. Discord came first, and its own reply
/// targets ([`super::ReplyTarget`]'s interaction, channel and user) stay its own; every
/// other platform's place is a [`ChatTarget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    /// Discord: interactions over HTTP, messages over the gateway.
    Discord,
    /// Telegram's Bot API: updates pushed to a webhook.
    Telegram,
    /// Slack's Events API and interactivity, over signed HTTP.
    Slack,
}

impl ChannelKind {
    /// Every platform, in the order an agent's home is looked for.
    pub const ALL: [ChannelKind; 3] = [
        ChannelKind::Discord,
        ChannelKind::Telegram,
        ChannelKind::Slack,
    ];

    /// Its name in records: a signal's `source`, a reply target's `channel`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Discord => "discord",
            Self::Telegram => "telegram",
            Self::Slack => "slack",
        }
    }

    /// Its name in sentences ("Telegram did not take part 1: …").
    pub fn title(self) -> &'static str {
        match self {
            Self::Discord => "Discord",
            Self::Telegram => "Telegram",
            Self::Slack => "Slack",
        }
    }

    /// The platform a signal's `source` names; none for the API, the dashboard, the CLI,
    /// a heartbeat or a webhook.
    pub fn from_source(source: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == source)
    }
}

impl std::fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.title())
    }
}

/// A place on a platform other than Discord: where a reply goes, or where "typing…"
/// shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTarget {
    /// The platform.
    pub channel: ChannelKind,
    /// The chat (Telegram's `chat_id`, a private chat's id being its user's; Slack's
    /// channel id, or a user's id for the app's direct messages).
    pub chat: String,
    /// The topic or thread within the chat, where the message came from one (Telegram's
    /// `message_thread_id`, Slack's `thread_ts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The message the reply's first part answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_names_its_platform_and_nothing_else_does() {
        assert_eq!(
            ChannelKind::from_source("telegram"),
            Some(ChannelKind::Telegram)
        );
        assert_eq!(
            ChannelKind::from_source("discord"),
            Some(ChannelKind::Discord)
        );
        for other in ["api", "dashboard", "cli", "heartbeat", "github", ""] {
            assert_eq!(ChannelKind::from_source(other), None, "{other}");
        }
    }
}
