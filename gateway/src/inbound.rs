//! What arrives over the gateway, made into signals and events.
//!
//! **Who may talk.** A message in a guild channel is for the agent bound to the channel
//! (`--discord-channel`, else `PULSE_DISCORD_DEFAULT_AGENT`), which answers when the
//! message mentions it, or every message with `--discord-listen all`. A direct message
//! is for the agent whose allowed users (`--discord-users`) include its author; anyone
//! else is a stranger: no answer, counted, logged without the content. Messages from
//! bots — the agent's own included — are never answered, so two bots cannot loop.
//!
//! **What the agent reads.** The message's text (the bot's mention taken out), its
//! pictures as image parts, and its envelope in the signal's metadata (shown to the
//! model once, never persisted). A message with no text — a voice note, a file, a
//! sticker — is never dropped: its text says what arrived.
//!
//! **One user cannot flood an agent.** An agent reads at most
//! [`USER_MESSAGES_PER_MINUTE`] messages a minute from one user (a clock minute, counted
//! in this process, which holds the gateway's lease); the ones past it are not queued and
//! are counted as `rate_limited`, and the first of them in a minute is answered once with
//! a note saying so, so the person knows to wait rather than think they were read.
//!
//! **Nothing twice.** The signal's id is derived from the message's id, so a message
//! replayed after a resume is the same signal: the queue drops a duplicate it still
//! holds, and a turn never answers a signal it answered. A reaction's event id is
//! derived from the message, the user and the emoji, so a replay rewrites the same event.
//!
//! **What the person saw.** A reaction to one of the agent's messages, and a reply to
//! one, mark the reply that wrote it seen ([`mark_seen`]): the first sign is kept.

use std::time::Duration;

use jiff::Timestamp;
use pulse_shared::discord::envelope::{
    attachments, bounded, describe, display_name, image_block, message_envelope,
};
use pulse_shared::domain::{
    Agent, AgentId, DiscordListen, Event, EventId, EventType, Priority, Signal, SignalMeta,
};
use pulse_shared::engine::{intake, mark_seen};
use pulse_shared::error::{StoreError, chain};
use pulse_shared::http::discord::{message_signal_id, snowflake_time};
use pulse_shared::ports::DiscordApi;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::Gateway;

/// The event type a reaction to an agent's message is recorded as.
pub const DISCORD_REACTION: &str = "DISCORD_REACTION";

/// Most messages an agent reads from one user in a minute.
pub const USER_MESSAGES_PER_MINUTE: u32 = 20;

/// What a user is told, once a minute, when their messages pass the rate.
pub const SLOW_DOWN: &str = "You are writing faster than I read: I take at most 20 messages a minute from one person, and the ones past that this minute were not read. Send what is still needed in a minute.";

/// Messages each user sent each agent in the current minute.
#[derive(Default)]
pub(crate) struct UserRates {
    /// The minute counted (since the epoch).
    minute: i64,
    /// (agent, user) → messages this minute.
    counts: std::collections::HashMap<(AgentId, String), u32>,
}

/// How one more message from a user stands against their rate.
#[derive(Debug, PartialEq, Eq)]
enum Rate {
    /// Within it: queue it.
    Within,
    /// The first past it this minute: not queued; say so once.
    FirstPast,
    /// Past it again: not queued.
    Past,
}

impl UserRates {
    /// Counts one message from `user` to `agent` at `now`.
    fn count(&mut self, agent: &AgentId, user: &str, now: Timestamp) -> Rate {
        let minute = now.as_second().div_euclid(60);
        if minute != self.minute {
            // A new minute: every count starts again (and the map holds only this one).
            self.minute = minute;
            self.counts.clear();
        }
        let n = self
            .counts
            .entry((agent.clone(), user.to_owned()))
            .or_default();
        *n = n.saturating_add(1);
        match *n {
            n if n <= USER_MESSAGES_PER_MINUTE => Rate::Within,
            n if n == USER_MESSAGES_PER_MINUTE + 1 => Rate::FirstPast,
            _ => Rate::Past,
        }
    }
}

/// How many messages' texts are kept to tell an edit what the message read before.
const TEXTS_REMEMBERED: usize = 1_024;

/// Longest wait between two tries to queue a message the queue did not take.
const MOST_RETRY_WAIT: Duration = Duration::from_secs(30);

/// Why a message is not for any agent.
#[derive(Debug, PartialEq, Eq)]
enum Skip {
    /// From a bot.
    Bot,
    /// A direct message from someone no agent lets in.
    Stranger,
    /// A channel message the agent does not answer (no mention, or no agent there).
    NotAddressed,
}

impl Gateway {
    /// A `MESSAGE_CREATE`: queued for its agent, or counted and dropped.
    pub(crate) async fn on_message(&self, m: &Value) {
        self.take_message(m, None).await;
    }

    /// A `MESSAGE_UPDATE` that edited a message's text: queued for its agent as an
    /// edit, saying what the message reads now and, when this gateway saw it, what it
    /// read before; any other update (an embed unfurled, a pin) is not an edit.
    pub(crate) async fn on_update(&self, m: &Value) {
        let edited = m
            .get("edited_timestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok());
        match edited {
            // The bot's own messages (its replies, edited as they are written) are not
            // the person's edits.
            _ if m.pointer("/author/bot").and_then(Value::as_bool) == Some(true) => {}
            Some(at) if m.get("content").is_some_and(Value::is_string) => {
                self.take_message(m, Some(at)).await;
            }
            _ => {}
        }
    }

    /// A message, or the edit of one made at `edited`: queued for its agent, or counted
    /// and dropped.
    async fn take_message(&self, m: &Value, edited: Option<Timestamp>) {
        let (Some(id), Some(channel)) = (
            m.get("id").and_then(Value::as_str),
            m.get("channel_id").and_then(Value::as_str),
        ) else {
            self.count("malformed");
            warn!("a MESSAGE_CREATE without an id or a channel was skipped");
            return;
        };
        let author = m.get("author").cloned().unwrap_or(Value::Null);
        let author_id = author.get("id").and_then(Value::as_str).unwrap_or_default();
        let agent = match self.addressee_kept(m, id, channel, author_id).await {
            Ok(a) => a,
            Err(skip) => {
                match skip {
                    Skip::Bot => self.count("bot"),
                    Skip::NotAddressed => self.count("not_addressed"),
                    Skip::Stranger => {
                        self.count("stranger");
                        // Who and where, never what: a stranger's words are not ours to keep.
                        info!(
                            user_id = author_id,
                            channel_id = channel,
                            message_id = id,
                            "a direct message from a user no agent lets in was not answered"
                        );
                    }
                }
                return;
            }
        };
        // The id's time is the message's own, so a replay (minutes later, or read by a
        // clock behind Discord's) derives the same signal id.
        let Some(minted) = snowflake_time(id) else {
            self.count("malformed");
            warn!(
                message_id = id,
                "a Discord message whose id is not a snowflake was skipped"
            );
            return;
        };
        let rate = crate::lock(&self.rates).count(&agent.id, author_id, self.clock.now());
        if rate != Rate::Within {
            self.count("rate_limited");
            if rate == Rate::FirstPast {
                // Who and where, once a minute: never what.
                info!(
                    agent_id = %agent.id,
                    user_id = author_id,
                    channel_id = channel,
                    per_minute = USER_MESSAGES_PER_MINUTE,
                    "a user's messages passed the rate an agent reads them at: the rest of this minute's are not queued"
                );
                let (discord, channel, id) =
                    (self.discord.clone(), channel.to_owned(), id.to_owned());
                let nonce = format!("slow-{id}");
                tokio::spawn(async move {
                    if let Err(e) = discord
                        .create_message(&channel, SLOW_DOWN, &nonce, Some(&id))
                        .await
                    {
                        warn!(error = %e, "the note that messages passed the rate could not be posted");
                    }
                });
            }
            return;
        }
        let mut signal = match self.signal(&agent, m, id, channel, &author, minted) {
            Ok(s) => s,
            Err(why) => {
                self.count("malformed");
                warn!(message_id = id, error = %why, "a Discord message could not be taken");
                return;
            }
        };
        let now_reads = signal.text();
        let before = self.remember_text(id, &now_reads);
        if let Some(at) = edited {
            // An edit is its own signal (an id from the message and the edit's time), told
            // as an edit: the turn that reads it, or the one that already answered the
            // message's first words, knows what changed.
            signal.id = pulse_shared::domain::SignalId::derived(
                at.as_millisecond().max(0) as u64,
                &["discord-edit", id, &at.to_string()],
            );
            signal.created_at = at.min(self.clock.now());
            let told = match before {
                Some(old) if old != now_reads => format!(
                    "(edited their message {id}; it read: {old:?}; it reads now:) {now_reads}"
                ),
                _ => format!("(edited their message {id}; it reads now:) {now_reads}"),
            };
            if let Some(pulse_shared::domain::ContentBlock::Text { text }) =
                signal.content.first_mut()
            {
                *text = told;
            }
        }
        let signal_id = signal.id.clone();
        if !self.submit(signal).await {
            // Deleted after it was found: the message is for no one now.
            self.count("not_addressed");
            info!(agent_id = %agent.id, message_id = id, "a Discord message was not queued: its agent was deleted meanwhile");
            return;
        }
        self.count("accepted");
        info!(agent_id = %agent.id, signal_id = %signal_id, message_id = id, "Discord message queued");
        // A reply to one of the agent's messages: the person saw that message.
        if edited.is_none()
            && let Some(to) = replied_to(m, self.bot_id().as_deref())
        {
            self.note_seen(&agent.id, to, "reply").await;
        }
    }

    /// [`Self::addressee`], asked again with backoff while the store cannot answer:
    /// Discord does not send the message again, so it is kept here meanwhile.
    async fn addressee_kept(
        &self,
        m: &Value,
        id: &str,
        channel: &str,
        author: &str,
    ) -> Result<Agent, Skip> {
        kept(
            || self.addressee(m, channel, author),
            |why, wait| warn!(message_id = id, error = %why, retry_in = ?wait, "cannot tell which agent a Discord message is for; keeping it and trying again"),
        )
        .await
    }

    /// The agent a message is for, or why it is for none.
    async fn addressee(
        &self,
        m: &Value,
        channel: &str,
        author: &str,
    ) -> Result<Result<Agent, Skip>, String> {
        let bot = self.bot_id();
        if m.pointer("/author/bot").and_then(Value::as_bool) == Some(true)
            || bot.as_deref() == Some(author)
        {
            return Ok(Err(Skip::Bot));
        }
        let store = self.store.as_ref();
        if m.get("guild_id").is_none_or(Value::is_null) {
            let found = self
                .directory
                .agent_for_user(author)
                .await
                .map_err(|e| chain(&e))?;
            // The directory may be a minute old: the agent's own record says last.
            let live = match found {
                Some(a) => store.get_agent(&a.id).await.map_err(|e| chain(&e))?,
                None => None,
            };
            return Ok(live
                .filter(|a| a.discord.allows(author))
                .ok_or(Skip::Stranger));
        }
        let id = match store
            .agent_for_channel(channel)
            .await
            .map_err(|e| chain(&e))?
        {
            Some(id) => id,
            None => match &self.settings.default_agent {
                Some(id) => id.clone(),
                None => return Ok(Err(Skip::NotAddressed)),
            },
        };
        let Some(agent) = store.get_agent(&id).await.map_err(|e| chain(&e))? else {
            return Ok(Err(Skip::NotAddressed));
        };
        let heard = agent.discord.listen == DiscordListen::All
            || bot.as_deref().is_some_and(|b| mentions(m, b));
        Ok(if heard {
            Ok(agent)
        } else {
            Err(Skip::NotAddressed)
        })
    }

    /// The signal of a message: its words, pictures and envelope, under an id derived
    /// from the message's.
    fn signal(
        &self,
        agent: &Agent,
        m: &Value,
        id: &str,
        channel: &str,
        author: &Value,
        minted: Timestamp,
    ) -> Result<Signal, String> {
        let files = attachments(m);
        let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
        let said = match &self.bot_id() {
            Some(b) => without_mention(content, b),
            None => content.trim().to_owned(),
        };
        let text = if !said.is_empty() {
            bounded(&said)
        } else if files.is_empty() && m.get("sticker_items").is_some() {
            "(no text; a sticker)".to_owned()
        } else {
            describe(&files)
        };
        let mut envelope = message_envelope(m);
        envelope["channel"] = json!({
            "id": channel,
            "kind": if m.get("guild_id").is_none_or(Value::is_null) { "direct" } else { "guild" },
        });
        let meta = SignalMeta {
            source: Some("discord".to_owned()),
            user_id: author.get("id").and_then(Value::as_str).map(str::to_owned),
            user_name: display_name(author, m.pointer("/member/nick")),
            channel_id: Some(channel.to_owned()),
            message_id: Some(id.to_owned()),
            thread: None,
            envelope: Some(envelope),
            interaction: None,
            heartbeat_id: None,
        };
        let at = minted.min(self.clock.now());
        let mut signal = Signal::user_message(&agent.id, &agent.session, &text, meta, at)
            .map_err(|e| e.to_string())?;
        signal.id = message_signal_id(id, minted);
        signal.content.extend(files.iter().filter_map(image_block));
        Ok(signal)
    }

    /// Keeps what message `id` reads now among the last texts seen; what it read before,
    /// when this gateway saw it.
    fn remember_text(&self, id: &str, text: &str) -> Option<String> {
        let mut said = crate::lock(&self.said_lately);
        let before = said
            .iter()
            .position(|(seen, _)| seen == id)
            .and_then(|i| said.remove(i))
            .map(|(_, t)| t);
        if said.len() >= TEXTS_REMEMBERED {
            said.pop_front();
        }
        said.push_back((id.to_owned(), text.to_owned()));
        before
    }

    /// Queues `signal`, trying again with backoff for as long as the queue does not
    /// take it: Discord will not send the message again, so it is kept here, and the
    /// gateway reads nothing else meanwhile (a long wait ends in a resume, which
    /// replays what was missed). Whether it was queued: not when its agent was deleted
    /// meanwhile, which no retry would change.
    async fn submit(&self, signal: Signal) -> bool {
        kept(
            || async {
                match intake::submit(self.store.as_ref(), self.queue.as_ref(), signal.clone())
                    .await
                {
                    Ok(()) => Ok(true),
                    Err(StoreError::NotFound(_)) => Ok(false),
                    Err(e) => Err(chain(&e)),
                }
            },
            |why, wait| warn!(signal_id = %signal.id, error = %why, retry_in = ?wait, "cannot queue a Discord message; keeping it and trying again"),
        )
        .await
    }

    /// A `MESSAGE_REACTION_ADD`: a person's reaction to one of the agent's messages
    /// becomes a `DISCORD_REACTION` event for the agent of that channel or user, and
    /// marks the reply that wrote the message seen.
    pub(crate) async fn on_reaction(&self, r: &Value) {
        let Some(bot) = self.bot_id() else { return };
        let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
        let (user, channel, message) = (field("user_id"), field("channel_id"), field("message_id"));
        if user.is_empty() || message.is_empty() || user == bot {
            return;
        }
        // Only reactions to what the agent said tell it something.
        if r.get("message_author_id").and_then(Value::as_str) != Some(bot.as_str()) {
            return;
        }
        let direct = r.get("guild_id").is_none_or(Value::is_null);
        let agent = if direct {
            self.directory
                .agent_for_user(user)
                .await
                .map(|a| a.map(|a| a.id))
        } else {
            match self.store.agent_for_channel(channel).await {
                Ok(None) => Ok(self.settings.default_agent.clone()),
                other => other,
            }
        };
        let agent = match agent {
            Ok(Some(a)) => a,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %chain(&e), "cannot tell which agent a reaction is for");
                return;
            }
        };
        let emoji = r
            .pointer("/emoji/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        // A replay after a resume is the same reaction: recorded once. (The event's id
        // must carry the time it is recorded, or a heartbeat past that time would never
        // read it, so the replay is recognised here rather than by its id.)
        let key = format!("{message}/{user}/{emoji}");
        if !self.first_time(key) {
            return;
        }
        let now = self.clock.now();
        let payload = json!({
            "emoji": emoji,
            "emoji_id": r.pointer("/emoji/id"),
            "user_id": user,
            "user_name": r.pointer("/member/nick").or_else(|| r.pointer("/member/user/global_name")).or_else(|| r.pointer("/member/user/username")),
            "message_id": message,
            "channel_id": channel,
        });
        let Ok(event_type) = EventType::parse(DISCORD_REACTION) else {
            return;
        };
        let event = Event {
            id: EventId::derived(
                now.as_millisecond().max(0) as u64,
                &["discord-reaction", message, user, emoji],
            ),
            agent_id: agent.clone(),
            event_type,
            priority: Priority::default(),
            source: "discord".to_owned(),
            payload,
            metadata: Value::Null,
            parent_id: None,
            cascade: None,
            created_at: now,
        };
        match self.store.append(&event).await {
            Ok(()) => {
                self.count("reaction");
                info!(agent_id = %agent, event_id = %event.id, "Discord reaction recorded");
            }
            Err(e) => warn!(error = %chain(&e), "cannot record a Discord reaction"),
        }
        self.note_seen(&agent, message, &format!("reaction {emoji}"))
            .await;
    }

    /// Marks seen, `how`, the reply of `agent` that wrote Discord message `message`
    /// (see [`mark_seen`]). A failure is logged: it stops nothing.
    async fn note_seen(&self, agent: &AgentId, message: &str, how: &str) {
        let now = self.clock.now();
        if let Err(e) = mark_seen(self.store.as_ref(), agent, message, how, now).await {
            warn!(agent_id = %agent, message_id = message, error = %chain(&e), "cannot mark a reply seen");
        }
    }
}

/// Discord's type of a message that replies to another.
const REPLY: u64 = 19;

/// The message `m` replies to, unless it is known to be someone else's than the bot's
/// (`bot`). A forward, which refers to a message too, is not a reply.
fn replied_to<'a>(m: &'a Value, bot: Option<&str>) -> Option<&'a str> {
    if m.get("type").and_then(Value::as_u64) != Some(REPLY) {
        return None;
    }
    let author = m
        .pointer("/referenced_message/author/id")
        .and_then(Value::as_str);
    if author.is_some_and(|a| Some(a) != bot) {
        return None;
    }
    m.pointer("/message_reference/message_id")
        .and_then(Value::as_str)
}

/// Runs `attempt` until it succeeds, waiting from 200 ms, doubling to [`MOST_RETRY_WAIT`],
/// after each failure (told to `failed` with the wait): what Discord sent is kept here
/// meanwhile, since it will not be sent again.
async fn kept<T, F>(mut attempt: impl FnMut() -> F, failed: impl Fn(&str, Duration)) -> T
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let mut wait = Duration::from_millis(200);
    loop {
        match attempt().await {
            Ok(v) => return v,
            Err(why) => {
                failed(&why, wait);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MOST_RETRY_WAIT);
            }
        }
    }
}

/// Whether a message mentions the bot: in its mentions, or as `<@id>` in its text.
fn mentions(m: &Value, bot: &str) -> bool {
    let listed = m
        .get("mentions")
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            ms.iter()
                .any(|u| u.get("id").and_then(Value::as_str) == Some(bot))
        });
    let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
    listed || content.contains(&format!("<@{bot}>")) || content.contains(&format!("<@!{bot}>"))
}

/// The text with the bot's mentions taken out.
fn without_mention(content: &str, bot: &str) -> String {
    content
        .replace(&format!("<@!{bot}>"), "")
        .replace(&format!("<@{bot}>"), "")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_s_messages_are_counted_per_agent_and_per_minute() {
        let mut rates = UserRates::default();
        let (a, b) = (AgentId::generate(), AgentId::generate());
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        for _ in 0..USER_MESSAGES_PER_MINUTE {
            assert_eq!(rates.count(&a, "u1", t), Rate::Within);
        }
        assert_eq!(rates.count(&a, "u1", t), Rate::FirstPast);
        assert_eq!(rates.count(&a, "u1", t), Rate::Past);
        assert_eq!(rates.count(&a, "u2", t), Rate::Within, "another user");
        assert_eq!(rates.count(&b, "u1", t), Rate::Within, "another agent");
        let next = t.checked_add(jiff::SignedDuration::from_secs(60)).unwrap();
        assert_eq!(rates.count(&a, "u1", next), Rate::Within, "a new minute");
        assert_eq!(rates.counts.len(), 1, "only this minute's counts are kept");
        assert!(SLOW_DOWN.contains(&USER_MESSAGES_PER_MINUTE.to_string()));
    }

    #[test]
    fn a_mention_is_found_in_the_list_or_the_text_and_taken_out_of_the_words() {
        let listed = json!({"content": "hi", "mentions": [{"id": "42"}]});
        let inline = json!({"content": "<@!42> hi", "mentions": []});
        let other = json!({"content": "<@43> hi", "mentions": [{"id": "43"}]});
        assert!(mentions(&listed, "42"));
        assert!(mentions(&inline, "42"));
        assert!(!mentions(&other, "42"));
        assert_eq!(without_mention("<@42> what is up?", "42"), "what is up?");
        assert_eq!(without_mention("hey <@!42>", "42"), "hey");
    }

    #[test]
    fn a_reply_to_the_bot_s_message_names_it_and_a_forward_or_a_reply_to_another_does_not() {
        let reply = json!({"type": 19, "message_reference": {"type": 0, "message_id": "7"},
                           "referenced_message": {"id": "7", "author": {"id": "42"}}});
        assert_eq!(replied_to(&reply, Some("42")), Some("7"));
        assert_eq!(replied_to(&reply, Some("43")), None, "another's message");
        let unfetched = json!({"type": 19, "message_reference": {"message_id": "7"}});
        assert_eq!(replied_to(&unfetched, Some("42")), Some("7"));
        let forward = json!({"type": 0, "message_reference": {"type": 1, "message_id": "7"}});
        assert_eq!(replied_to(&forward, Some("42")), None);
        assert_eq!(replied_to(&json!({"type": 0}), Some("42")), None);
    }
}
