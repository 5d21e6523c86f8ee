//! Signals (queued inputs of a session), conversation turns and their persisted
//! messages, and agents' memories.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::channel::{ChannelKind, ChatTarget};
use super::chat::Usage;
use super::ids::{AgentId, HeartbeatId, SessionId, SignalId, TurnId};
use super::requests::Requests;
use crate::error::ValidationError;

/// What kind of input a signal is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    /// A user's message.
    Message,
    /// A thought the heartbeat agent decided to speak.
    Heartbeat,
    /// Something an external system sent through a webhook.
    Webhook,
    /// What came of a call parked for approval: approved (and what the tool answered),
    /// denied or expired.
    Approval,
}

impl SignalKind {
    /// The name (`message`, `heartbeat`, `webhook`, `approval`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::Heartbeat => "heartbeat",
            Self::Webhook => "webhook",
            Self::Approval => "approval",
        }
    }
}

/// A piece of a signal's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by reference.
    Image {
        /// Where it is.
        url: String,
        /// Its media type, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
}

/// An open Discord interaction a reply can answer through (its token is valid for 15
/// minutes after `issued_at`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct InteractionRef {
    /// The interaction token. A secret: never logged.
    pub token: String,
    /// When Discord sent the interaction.
    pub issued_at: Timestamp,
}

impl std::fmt::Debug for InteractionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InteractionRef")
            .field("token", &"***")
            .field("issued_at", &self.issued_at)
            .finish()
    }
}

impl InteractionRef {
    /// How long Discord accepts an interaction token.
    pub const VALIDITY: SignedDuration = SignedDuration::from_mins(15);

    /// Whether the token can still be used at `now`, with a minute to spare for the
    /// exchange itself.
    pub fn usable_at(&self, now: Timestamp) -> bool {
        now.duration_since(self.issued_at) < Self::VALIDITY - SignedDuration::from_mins(1)
    }
}

/// Who sent a signal and how it arrived.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SignalMeta {
    /// Where it came from (`discord`, `cli`, `heartbeat`, a webhook's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The user's id on that source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The user's display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
    /// The channel or chat it came from, on the platform `source` names (Discord when
    /// `source` names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<String>,
    /// The message it came from (over Discord's gateway, or a platform's webhook): the
    /// reply answers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The topic or thread within the chat it came from (platforms other than Discord).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// What the platform said, as it said it (the raw message): shown to the model
    /// once, never persisted in the conversation. Older releases called it `discord`.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "discord")]
    pub envelope: Option<Value>,
    /// The interaction to answer through, if it came as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction: Option<InteractionRef>,
    /// The heartbeat that spoke it (heartbeat signals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_id: Option<HeartbeatId>,
}

/// A queued input of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    /// Its id; also the queue's deduplication id.
    pub id: SignalId,
    /// The agent it is for.
    pub agent_id: AgentId,
    /// The session (queue group).
    pub session: SessionId,
    /// What kind it is.
    pub kind: SignalKind,
    /// Its content.
    pub content: Vec<ContentBlock>,
    /// Who and how.
    #[serde(default)]
    pub meta: SignalMeta,
    /// When it was made.
    pub created_at: Timestamp,
}

/// Most characters of text one signal may carry.
pub const MAX_SIGNAL_TEXT: usize = 16_000;

impl Signal {
    /// A user's text message, validated (non-empty, bounded).
    pub fn user_message(
        agent_id: &AgentId,
        session: &SessionId,
        text: &str,
        meta: SignalMeta,
        now: Timestamp,
    ) -> Result<Self, ValidationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ValidationError::new("message", "the message is empty"));
        }
        if text.chars().count() > MAX_SIGNAL_TEXT {
            return Err(ValidationError::new(
                "message",
                format!("the message is longer than {MAX_SIGNAL_TEXT} characters"),
            ));
        }
        Ok(Self {
            id: SignalId::generate(now.as_millisecond().max(0) as u64),
            agent_id: agent_id.clone(),
            session: session.clone(),
            kind: SignalKind::Message,
            content: vec![ContentBlock::Text {
                text: text.to_owned(),
            }],
            meta,
            created_at: now,
        })
    }

    /// The platform it came over: the one its `source` names, or Discord for a signal
    /// that came from a channel without naming one; none when it came from no chat
    /// (the API, the dashboard, the CLI, a heartbeat, a webhook).
    pub fn channel(&self) -> Option<ChannelKind> {
        match self
            .meta
            .source
            .as_deref()
            .and_then(ChannelKind::from_source)
        {
            Some(k) => Some(k),
            None => self
                .meta
                .channel_id
                .is_some()
                .then_some(ChannelKind::Discord),
        }
    }

    /// Where a reply to it goes, from the place it came from (its interaction aside):
    /// the channel or chat, answering its message; none when it came from no place.
    pub fn place(&self) -> Option<ReplyTarget> {
        let chat = self.meta.channel_id.clone()?;
        Some(match self.channel()? {
            ChannelKind::Discord => ReplyTarget::Channel {
                channel_id: chat,
                reply_to: self.meta.message_id.clone(),
            },
            channel => ReplyTarget::Chat(ChatTarget {
                channel,
                chat,
                thread: self.meta.thread.clone(),
                reply_to: self.meta.message_id.clone(),
            }),
        })
    }

    /// Its text blocks joined by newlines.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for b in &self.content {
            match b {
                ContentBlock::Text { text } => {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(text);
                }
                ContentBlock::Image { url, .. } => {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(&format!("[image: {url}]"));
                }
            }
        }
        out
    }
}

/// Who said a persisted message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user (or an external system, for webhook signals).
    User,
    /// The agent: its replies and its spoken heartbeat thoughts.
    Assistant,
}

/// One persisted message of a conversation (with its source and the agent that wrote it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConversationMessage {
    /// `<turn id>.<n>`: sorts by turn, then position in the turn.
    pub id: String,
    /// The agent.
    pub agent_id: AgentId,
    /// The turn it belongs to.
    pub turn_id: TurnId,
    /// Who said it.
    pub role: Role,
    /// Where it came from: `discord`, `cli`, `webhook` for inbound messages, `heartbeat`
    /// for a spoken thought, `conversation` for replies.
    pub source: String,
    /// Which of the agent's parts produced it (`conversation`, `heartbeat`); none for
    /// the user's messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The user's name, for inbound messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The text.
    pub content: String,
    /// When it was said (the signal's time for inbound messages).
    pub created_at: Timestamp,
    /// A message of a turn that waits on the model: not answered yet, and not stored as
    /// part of a turn (it is read from the waiting turn).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting: bool,
}

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TurnStatus {
    /// The reply is written and being delivered; a redelivered signal resumes delivery
    /// from `delivered` instead of asking the model again.
    Delivering,
    /// Delivered (or there was nowhere to deliver it: stored only).
    Done,
    /// Delivery failed for good; `error` says why.
    Failed,
}

/// Where a reply goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplyTarget {
    /// Edit the deferred original of an interaction, follow-ups for further parts.
    Interaction(InteractionRef),
    /// Post to a channel with the bot token.
    Channel {
        /// The channel.
        channel_id: String,
        /// The user's message the first part replies to (a message that came over the
        /// gateway).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to: Option<String>,
    },
    /// Post to a user's direct messages (opened when the reply is delivered): an agent
    /// with no channel speaking first to its first allowed user.
    User {
        /// The user.
        user_id: String,
    },
    /// A place on another platform ([`ChatTarget`]).
    Chat(ChatTarget),
    /// Nowhere (no platform configured, or no place known): stored and logged only.
    None,
    /// A target this release does not know, written by a newer one: its turn is kept
    /// and tried again, never taken for delivered.
    #[serde(other)]
    Unknown,
}

impl ReplyTarget {
    /// The platform it is on; none for [`ReplyTarget::None`] and [`ReplyTarget::Unknown`].
    pub fn channel(&self) -> Option<ChannelKind> {
        match self {
            Self::Interaction(_) | Self::Channel { .. } | Self::User { .. } => {
                Some(ChannelKind::Discord)
            }
            Self::Chat(c) => Some(c.channel),
            Self::None | Self::Unknown => None,
        }
    }
}

/// One conversation turn: the signals it answers and its reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Its id (from its first signal).
    pub id: TurnId,
    /// The agent.
    pub agent_id: AgentId,
    /// The session.
    pub session: SessionId,
    /// The signals it answers, in order.
    pub signals: Vec<SignalId>,
    /// Where it is.
    pub status: TurnStatus,
    /// The reply, split into the parts sent one by one.
    pub parts: Vec<String>,
    /// How many parts were delivered.
    pub delivered: u32,
    /// Where the reply goes.
    pub target: ReplyTarget,
    /// Ids of the Discord messages written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discord_message_ids: Vec<String>,
    /// The provider and model that wrote the reply.
    pub provider: String,
    /// The model.
    pub model: String,
    /// Tokens used.
    pub usage: Usage,
    /// What the turn's model calls cost at the prices of the day they were made (none
    /// for a model the price table did not know): a later price change does not
    /// rewrite it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<super::Usd>,
    /// The model's steps when it used tools (`remember`, `recall`): each call with its
    /// text, tool calls, usage and stop reason, and each tool's input and result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Value>,
    /// Why delivery failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was written.
    pub created_at: Timestamp,
    /// When delivery ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// The cloud requests its writing and delivery made, up to its last write (AWS;
    /// none on the embedded store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Requests>,
    /// The heartbeat whose thought it delivers, when it answers one: a reply given up
    /// on makes that heartbeat `undeliverable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoken_by: Option<super::HeartbeatId>,
    /// The OpenTelemetry trace it was written in (32 hex digits), when traces were
    /// sent: the dashboard links to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// When and how the person showed they saw the reply on Discord (a reaction to one
    /// of its messages, or a reply to one); the first sign is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Seen>,
}

/// A sign that the person saw a reply: the first reaction to one of its Discord
/// messages, or the first reply to one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// When the sign arrived.
    pub at: Timestamp,
    /// What it was: `reaction <emoji>` or `reply`.
    pub by: String,
}

impl Turn {
    /// The most of a turn's steps kept on it, as JSON: a tool's answer can run to a
    /// megabyte, and the turn is one DynamoDB item (400 KB). Longer ones have their
    /// longest texts cut ([`super::clipped`]).
    pub const KEPT_STEPS: usize = 96 * 1024;

    /// The error of a turn whose model call was dropped because a newer user message
    /// arrived: it has no reply; the next turn answers its messages with the newer ones.
    pub const SUPERSEDED: &'static str = "superseded: a newer message arrived while the model was answering; the next turn answers both";

    /// Whether a newer message superseded this turn.
    pub fn superseded(&self) -> bool {
        self.error.as_deref() == Some(Self::SUPERSEDED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_target_written_by_a_newer_release_reads_as_unknown_and_older_ones_as_they_were() {
        let read = |v: Value| serde_json::from_value::<ReplyTarget>(v).unwrap();
        assert_eq!(
            read(json!({"type": "channel", "channel_id": "1001", "reply_to": "7"})),
            ReplyTarget::Channel {
                channel_id: "1001".into(),
                reply_to: Some("7".into())
            }
        );
        assert_eq!(
            read(json!({"type": "user", "user_id": "42"})),
            ReplyTarget::User {
                user_id: "42".into()
            }
        );
        assert_eq!(read(json!({"type": "none"})), ReplyTarget::None);
        assert_eq!(
            read(json!({"type": "carrier_pigeon", "loft": "north"})),
            ReplyTarget::Unknown
        );
        let chat = ReplyTarget::Chat(ChatTarget {
            channel: ChannelKind::Telegram,
            chat: "-1001234".into(),
            thread: Some("9".into()),
            reply_to: Some("55".into()),
        });
        let written = serde_json::to_value(&chat).unwrap();
        assert_eq!(
            written,
            json!({"type": "chat", "channel": "telegram", "chat": "-1001234", "thread": "9", "reply_to": "55"})
        );
        assert_eq!(read(written), chat);
        assert_eq!(chat.channel(), Some(ChannelKind::Telegram));
        assert_eq!(ReplyTarget::Unknown.channel(), None);
    }

    #[test]
    fn a_signal_an_older_release_queued_keeps_its_envelope() {
        let meta: SignalMeta = serde_json::from_value(json!({
            "source": "discord", "channel_id": "1001", "discord": {"type": 0, "content": "hi"}
        }))
        .unwrap();
        assert_eq!(meta.envelope, Some(json!({"type": 0, "content": "hi"})));
        assert_eq!(meta.thread, None);
        let again = serde_json::to_value(&meta).unwrap();
        assert_eq!(again["envelope"]["content"], "hi");
    }

    #[test]
    fn a_signal_replies_to_the_place_it_came_from_on_its_own_platform() {
        let agent = AgentId::generate();
        let signal = |meta: SignalMeta| Signal {
            id: SignalId::generate(1),
            agent_id: agent.clone(),
            session: SessionId::for_agent(&agent),
            kind: SignalKind::Message,
            content: Vec::new(),
            meta,
            created_at: Timestamp::UNIX_EPOCH,
        };
        let from = |source: Option<&str>, channel: Option<&str>| {
            signal(SignalMeta {
                source: source.map(str::to_owned),
                channel_id: channel.map(str::to_owned),
                message_id: Some("77".into()),
                thread: Some("5".into()),
                ..SignalMeta::default()
            })
        };
        assert_eq!(
            from(Some("telegram"), Some("-100200")).place(),
            Some(ReplyTarget::Chat(ChatTarget {
                channel: ChannelKind::Telegram,
                chat: "-100200".into(),
                thread: Some("5".into()),
                reply_to: Some("77".into()),
            }))
        );
        // A channel without a platform named is Discord's, as before there were others.
        for source in [Some("discord"), None, Some("cli")] {
            assert_eq!(
                from(source, Some("1001")).place(),
                Some(ReplyTarget::Channel {
                    channel_id: "1001".into(),
                    reply_to: Some("77".into())
                }),
                "{source:?}"
            );
        }
        assert_eq!(from(Some("api"), None).place(), None);
        assert_eq!(from(Some("telegram"), None).place(), None);
    }
}
