//! The chat platforms replies go out on: one [`Channel`] per platform, behind the
//! engine's one voice.

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::{Agent, Approval, ChannelKind, MESSAGE_LIMIT, ReplyTarget, TurnId};
use crate::error::ChannelError;

/// A chat platform, as far as replies, "typing…" and approvals need it. Each method
/// takes targets on its own platform only ([`ReplyTarget::channel`]).
#[async_trait]
pub trait Channel: Send + Sync {
    /// The platform.
    fn kind(&self) -> ChannelKind;

    /// The longest message it takes, in characters: a reply for it is split into parts
    /// of at most this many when the turn is written.
    fn message_limit(&self) -> usize;

    /// Sends part `part` (from 0) of `turn`'s reply to `to`; the id of the message
    /// written, as a later reaction or reply names it. Where the platform takes an
    /// idempotency key, it comes from `turn` and `part`, so a part sent twice is
    /// written once.
    async fn send_part(
        &self,
        to: &ReplyTarget,
        turn: &TurnId,
        part: usize,
        text: &str,
    ) -> Result<String, ChannelError>;

    /// Sends a notice outside the reply (that it is delayed), keyed by `turn` as
    /// [`Channel::send_part`] is.
    async fn notify(&self, to: &ReplyTarget, turn: &TurnId, text: &str)
    -> Result<(), ChannelError>;

    /// Shows "typing…" at `at` for a few seconds. A platform that shows none for a
    /// bot keeps this default, with [`Channel::typing_every`] none.
    async fn typing(&self, at: &ReplyTarget) -> Result<(), ChannelError> {
        let _ = at;
        Ok(())
    }

    /// How often "typing…" is shown again while a turn runs; none where the platform
    /// shows no "typing…" for a bot, so nothing is started for it.
    fn typing_every(&self) -> Option<std::time::Duration>;

    /// Asks `agent`'s owner at `home` to approve or deny `approval`, with a button for
    /// each; the id of the message written.
    async fn ask_approval(
        &self,
        agent: &Agent,
        home: &ReplyTarget,
        approval: &Approval,
    ) -> Result<String, ChannelError>;
}

/// The platforms set up, each once. None: replies are stored only, and read over the
/// API, the dashboard and the CLI.
#[derive(Clone, Default)]
pub struct Channels(Vec<Arc<dyn Channel>>);

impl Channels {
    /// These platforms; a platform given twice keeps its first.
    pub fn new(list: impl IntoIterator<Item = Arc<dyn Channel>>) -> Self {
        let mut out: Vec<Arc<dyn Channel>> = Vec::new();
        for c in list {
            if !out.iter().any(|o| o.kind() == c.kind()) {
                out.push(c);
            }
        }
        Self(out)
    }

    /// The platform `kind`, if set up.
    pub fn get(&self, kind: ChannelKind) -> Option<&Arc<dyn Channel>> {
        self.0.iter().find(|c| c.kind() == kind)
    }

    /// The platform `target` is on, if set up.
    pub fn for_target(&self, target: &ReplyTarget) -> Option<&Arc<dyn Channel>> {
        target.channel().and_then(|k| self.get(k))
    }

    /// The longest part a reply to `target` may have: its platform's, or Discord's
    /// 2,000 characters when it goes nowhere (what is stored reads the same wherever it
    /// is read).
    pub fn limit_for(&self, target: &ReplyTarget) -> usize {
        self.for_target(target)
            .map_or(MESSAGE_LIMIT, |c| c.message_limit())
    }

    /// Whether no platform is set up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
