//! Discord as a [`Channel`]: replies through an open interaction, to a channel, or to a
//! user's direct messages; "typing…" in a channel; an approval as a card with buttons.

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::{Agent, Approval, ChannelKind, MESSAGE_LIMIT, ReplyTarget, TurnId};
use crate::error::ChannelError;
use crate::ports::{Channel, DiscordApi};

/// Discord's side of the one voice, over its HTTP API.
pub struct DiscordChannel {
    api: Arc<dyn DiscordApi>,
}

impl DiscordChannel {
    /// Over `api`.
    pub fn new(api: Arc<dyn DiscordApi>) -> Self {
        Self { api }
    }

    /// Where a post to `to` goes: its channel, or the user's direct messages (opened).
    async fn channel_of(&self, to: &ReplyTarget) -> Result<String, ChannelError> {
        match to {
            ReplyTarget::Channel { channel_id, .. } => Ok(channel_id.clone()),
            ReplyTarget::User { user_id } => Ok(self.api.open_dm(user_id).await?),
            other => Err(not_here(other)),
        }
    }
}

/// A target on another platform, handed to Discord: a mistake in the caller.
fn not_here(to: &ReplyTarget) -> ChannelError {
    ChannelError::Malformed {
        channel: "Discord",
        message: format!("a target on {:?} is not Discord's", to.channel()),
    }
}

/// A nonce for a channel post (Discord allows 25 characters): the turn's ULID without
/// its time prefix, and the part number.
fn nonce(turn: &TurnId, part: usize) -> String {
    let ulid = turn.as_str().trim_start_matches("tn_");
    format!("{}{part:02}", &ulid[ulid.len().saturating_sub(22)..])
}

/// The part number a notice's nonce takes: past any reply's parts.
const NOTICE_PART: usize = 99;

#[async_trait]
impl Channel for DiscordChannel {
    fn kind(&self) -> ChannelKind {
        ChannelKind::Discord
    }

    fn message_limit(&self) -> usize {
        MESSAGE_LIMIT
    }

    async fn send_part(
        &self,
        to: &ReplyTarget,
        turn: &TurnId,
        part: usize,
        text: &str,
    ) -> Result<String, ChannelError> {
        Ok(match to {
            ReplyTarget::Interaction(it) if part == 0 => {
                self.api.edit_original(&it.token, text).await?
            }
            ReplyTarget::Interaction(it) => self.api.follow_up(&it.token, text).await?,
            ReplyTarget::Channel {
                channel_id,
                reply_to,
            } => {
                // The first part answers the user's message; the rest follow it.
                let reply_to = reply_to.as_deref().filter(|_| part == 0);
                self.api
                    .create_message(channel_id, text, &nonce(turn, part), reply_to)
                    .await?
            }
            ReplyTarget::User { .. } => {
                let channel = self.channel_of(to).await?;
                self.api
                    .create_message(&channel, text, &nonce(turn, part), None)
                    .await?
            }
            other => return Err(not_here(other)),
        })
    }

    async fn notify(
        &self,
        to: &ReplyTarget,
        turn: &TurnId,
        text: &str,
    ) -> Result<(), ChannelError> {
        match to {
            ReplyTarget::Interaction(it) => self.api.edit_original(&it.token, text).await?,
            ReplyTarget::Channel {
                channel_id,
                reply_to,
            } => {
                self.api
                    .create_message(
                        channel_id,
                        text,
                        &nonce(turn, NOTICE_PART),
                        reply_to.as_deref(),
                    )
                    .await?
            }
            ReplyTarget::User { .. } => {
                let channel = self.channel_of(to).await?;
                self.api
                    .create_message(&channel, text, &nonce(turn, NOTICE_PART), None)
                    .await?
            }
            other => return Err(not_here(other)),
        };
        Ok(())
    }

    async fn typing(&self, at: &ReplyTarget) -> Result<(), ChannelError> {
        match at {
            ReplyTarget::Channel { channel_id, .. } => Ok(self.api.typing(channel_id).await?),
            // An interaction shows its own "thinking…"; a direct message not yet
            // opened has nobody typing at.
            _ => Ok(()),
        }
    }

    fn typing_every(&self) -> Option<std::time::Duration> {
        // Discord shows "typing…" for about ten seconds.
        Some(std::time::Duration::from_secs(8))
    }

    async fn ask_approval(
        &self,
        agent: &Agent,
        home: &ReplyTarget,
        approval: &Approval,
    ) -> Result<String, ChannelError> {
        let channel = self.channel_of(home).await?;
        let (content, components) = card(agent, approval);
        let ulid = approval.id.as_str();
        let nonce = format!("ap{}", &ulid[ulid.len() - 23..]);
        Ok(self
            .api
            .post_card(&channel, &content, &nonce, components)
            .await?)
    }
}

/// The message that asks about `a` on Discord, and its Approve and Deny buttons.
pub fn card(agent: &Agent, a: &Approval) -> (String, serde_json::Value) {
    let clip = |s: &str, n: usize| {
        if s.chars().count() <= n {
            s.to_owned()
        } else {
            s.chars().take(n).collect::<String>() + "…"
        }
    };
    let args = serde_json::to_string_pretty(&a.arguments).unwrap_or_default();
    let mut text = format!(
        "**{}** asks to call `{}/{}`.\n",
        clip(&agent.name, 100),
        a.server,
        clip(&a.tool, 100)
    );
    if let Some(r) = &a.reason {
        text.push_str(&format!("> {}\n", clip(r, 300).replace('\n', "\n> ")));
    }
    text.push_str(&format!(
        "```json\n{}\n```\nApprove or deny before <t:{}:R>; it is not sent until you do. (approval `{}`)",
        clip(&args, 1_200).replace("```", "'''"),
        a.expires_at.as_second(),
        a.id
    ));
    let components = serde_json::json!([{
        "type": 1,
        "components": [
            {"type": 2, "style": 3, "label": "Approve", "custom_id": a.button(true)},
            {"type": 2, "style": 4, "label": "Deny", "custom_id": a.button(false)},
        ],
    }]);
    (text, components)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_nonce_fits_discords_limit_and_differs_per_part() {
        let t = TurnId::parse("tn_01JABCDEFGHJKMNPQRSTVWXYZ0").unwrap();
        assert!(nonce(&t, 0).len() <= 25);
        assert_ne!(nonce(&t, 0), nonce(&t, 1));
        assert_ne!(nonce(&t, 0), nonce(&t, NOTICE_PART));
    }
}
