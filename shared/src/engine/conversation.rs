//! The conversation: consecutive signals of a session become one turn.
//!
//! A turn builds the context (seeds 000 and 002) — the persona as system prompt, the
//! history within a token budget (oldest dropped first; only the latest messages are
//! read, so a turn's cost does not grow with the history), all pending user messages as
//! one time-stamped user message, one ephemeral system message with the agent's beats
//! (seed 003) and the raw Discord envelopes (never persisted), and the heartbeat's
//! spoken thoughts last as one assistant
//! message — asks the model, and writes the turn (its inbound messages, the reply, and
//! marks that its signals are answered) in one atomic write *before* delivering the
//! reply. Delivery then records each part sent. A redelivered signal finds its turn and
//! resumes delivery where it stopped instead of asking the model again, so the same
//! signals never produce a second Discord message. (Channel posts also carry a nonce
//! Discord enforces, which closes the gap between sending a part and recording it.)

use std::sync::Arc;

use base64::Engine as _;
use jiff::Timestamp;
use tracing::{Instrument, error, info, info_span, warn};

use crate::domain::{
    Agent, AgentId, Beats, ChatMessage, ContentBlock, ConversationMessage, Heartbeat, HookData,
    HookType, ImageInput, LlmRequest, MESSAGE_LIMIT, MemoryId, ReplyTarget, Role, Signal,
    SignalKind, Spend, Turn, TurnId, TurnStatus, Usage, split_message,
};
use crate::engine::{budget, memory, reminders, transcript};
use crate::error::{DiscordError, EngineError, chain};
use crate::ports::{Clock, DiscordApi, ImageFetcher, LlmSelector, Store, TurnStart};

/// Tunables of conversation turns.
#[derive(Clone, Debug)]
pub struct ConversationSettings {
    /// Most history tokens (estimated at 4 characters a token) put in a context.
    pub history_tokens: usize,
    /// Most history messages read per turn.
    pub history_messages: usize,
    /// Most tokens of a reply.
    pub reply_max_tokens: u32,
}

impl Default for ConversationSettings {
    fn default() -> Self {
        Self {
            history_tokens: 8_000,
            history_messages: 100,
            reply_max_tokens: 1_024,
        }
    }
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    /// The turns that answered the signals (one, or more when a redelivery found an
    /// earlier turn for some of them).
    pub turns: Vec<TurnId>,
    /// Reply parts delivered by this call.
    pub parts_sent: usize,
    /// Whether the model was asked (false when everything was answered already).
    pub asked_model: bool,
}

/// What the model answered a turn.
#[derive(Default)]
struct Asked {
    text: String,
    provider: String,
    model: String,
    usage: Usage,
    failed: Option<String>,
    steps: Vec<serde_json::Value>,
}

/// Runs conversation turns.
pub struct Conversation {
    store: Arc<dyn Store>,
    llm: Arc<dyn LlmSelector>,
    discord: Option<Arc<dyn DiscordApi>>,
    clock: Arc<dyn Clock>,
    settings: ConversationSettings,
    hooks: Option<super::hooks::HookEmitter>,
    images: Option<Arc<dyn ImageFetcher>>,
}

/// Estimated tokens of a text: 4 characters a token, plus a little per message.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4) + 4
}

/// Builds a turn's context. `history` is newest first, as read.
pub fn build_context(
    agent: &Agent,
    history: &[ConversationMessage],
    signals: &[Signal],
    beats: Option<Beats>,
    known: Option<&str>,
    now: Timestamp,
    history_tokens: usize,
) -> Vec<ChatMessage> {
    let system = match known {
        Some(k) => format!("{}\n\n{k}", system_prompt(agent)),
        None => system_prompt(agent),
    };
    let mut messages = vec![ChatMessage::system(system)];

    // Newest first until the budget is spent, then back to oldest first.
    let mut budget = history_tokens;
    let mut kept = Vec::new();
    for m in history {
        let cost = estimate_tokens(&m.content);
        if cost > budget {
            break;
        }
        budget -= cost;
        kept.push(m);
    }
    for m in kept.into_iter().rev() {
        messages.push(match m.role {
            Role::User => ChatMessage::user(m.content.clone()),
            Role::Assistant => ChatMessage::assistant(m.content.clone()),
        });
    }

    let mut user_parts = Vec::new();
    let mut thoughts = Vec::new();
    let mut envelopes = Vec::new();
    for s in signals {
        let text = s.text();
        match s.kind {
            SignalKind::Heartbeat => thoughts.push(text),
            SignalKind::Message => user_parts.push(text),
            SignalKind::Webhook => user_parts.push(format!(
                "[webhook {}] {text}",
                s.meta.source.as_deref().unwrap_or("external")
            )),
        }
        if let Some(env) = &s.meta.discord {
            envelopes.push(env.clone());
        }
    }
    if !user_parts.is_empty() {
        let at = signals
            .iter()
            .filter(|s| s.kind != SignalKind::Heartbeat)
            .map(|s| s.created_at)
            .max()
            .unwrap_or(now);
        messages.push(ChatMessage::user(format!(
            "[{at}]\n{}",
            user_parts.join("\n")
        )));
    }
    // The ephemeral envelope: the agent's beats and what Discord said of the messages.
    let mut envelope = Vec::new();
    if let Some(b) = beats {
        envelope.push(format!(
            "Beats: {} (your sense of time: a beat is one heartbeat, every {}; since_last counts the beats since the user last wrote before this)",
            serde_json::json!({"beat": b.beat, "since_last": b.since_last}),
            agent.interval
        ));
    }
    if !envelopes.is_empty() {
        envelope.push(format!(
            "The user sent {} message(s) via Discord.\n\nRaw message envelopes:\n{}",
            envelopes.len(),
            serde_json::to_string_pretty(&envelopes).unwrap_or_default()
        ));
    }
    if !envelope.is_empty() {
        messages.push(ChatMessage::system(envelope.join("\n\n")));
    }
    if !thoughts.is_empty() {
        messages.push(ChatMessage::assistant(thoughts.join("\n")));
    }
    messages
}

/// The agent's beats at a turn (seed 003), from its newest heartbeat record: the beat it
/// is at (a heartbeat not yet started has not happened), and the beats since the user
/// last wrote before this turn — 0 when that was after the newest heartbeat counted the
/// interactions (`history`: the messages before this turn, newest first). `None` for an
/// agent without heartbeats.
pub(crate) fn turn_beats(
    newest: Option<&Heartbeat>,
    history: &[ConversationMessage],
) -> Option<Beats> {
    let h = newest?;
    let beat = if h.started_at.is_some() {
        h.beat
    } else {
        h.beat.saturating_sub(1)
    };
    let previous = history
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.created_at)
        .max();
    let uncounted = previous.is_some_and(|p| h.interaction_seen_at.is_none_or(|seen| p > seen));
    let since_last = if uncounted {
        0
    } else {
        beat.saturating_sub(h.last_interaction_beat)
    };
    Some(Beats { beat, since_last })
}

/// How long before an expiring attachment URL's end the provider is no longer trusted
/// to fetch it in time.
const URL_MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Whether a model provider can fetch `url` itself: HTTPS on a public name, and for a
/// Discord attachment (signed, expiring: `ex=` is its end, in hex seconds) not within
/// [`URL_MARGIN`] of expiring. Otherwise Pulse fetches it and sends the bytes.
pub(crate) fn provider_reaches(url: &str, now: Timestamp) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    let Some(url::Host::Domain(host)) = u.host() else {
        return false;
    };
    let private = host == "localhost"
        || [".localhost", ".local", ".internal", ".lan", ".home.arpa"]
            .iter()
            .any(|s| host.ends_with(s))
        || !host.contains('.');
    if u.scheme() != "https" || private {
        return false;
    }
    let discord = ["cdn.discordapp.com", "media.discordapp.net"].contains(&host);
    if !discord {
        return true;
    }
    let expires = u
        .query_pairs()
        .find(|(k, _)| k == "ex")
        .and_then(|(_, v)| i64::from_str_radix(&v, 16).ok())
        .and_then(|s| Timestamp::from_second(s).ok());
    expires.is_none_or(|end| now + URL_MARGIN < end)
}

fn system_prompt(agent: &Agent) -> String {
    agent.persona.clone().unwrap_or_else(|| {
        format!(
            "You are {}, an assistant talking with your user on Discord. Be warm and brief.",
            agent.name
        )
    })
}

/// The messages a turn persists: each inbound signal (a spoken thought as the agent's
/// own, with source `heartbeat`), then the reply (source and agent `conversation`).
fn persisted(
    turn: &Turn,
    signals: &[Signal],
    reply: &str,
    now: Timestamp,
) -> Vec<ConversationMessage> {
    let mut out = Vec::with_capacity(signals.len() + 1);
    for (i, s) in signals.iter().enumerate() {
        let (role, source, agent) = match s.kind {
            SignalKind::Heartbeat => (
                Role::Assistant,
                "heartbeat".to_owned(),
                Some("heartbeat".to_owned()),
            ),
            SignalKind::Message => (
                Role::User,
                s.meta.source.clone().unwrap_or_else(|| "cli".to_owned()),
                None,
            ),
            SignalKind::Webhook => (
                Role::User,
                s.meta
                    .source
                    .clone()
                    .unwrap_or_else(|| "webhook".to_owned()),
                None,
            ),
        };
        out.push(ConversationMessage {
            id: format!("{}.{i:02}", turn.id),
            agent_id: turn.agent_id.clone(),
            turn_id: turn.id.clone(),
            role,
            source,
            agent,
            author: s.meta.user_name.clone(),
            content: s.text(),
            created_at: s.created_at,
        });
    }
    if reply.is_empty() {
        return out;
    }
    out.push(ConversationMessage {
        id: format!("{}.{:02}", turn.id, signals.len()),
        agent_id: turn.agent_id.clone(),
        turn_id: turn.id.clone(),
        role: Role::Assistant,
        source: "conversation".to_owned(),
        agent: Some("conversation".to_owned()),
        author: None,
        content: reply.to_owned(),
        created_at: now,
    });
    out
}

/// Where a reply goes: the newest open interaction, else the newest channel the signals
/// came from, else the agent's channel; nowhere when Discord is not configured.
fn target(agent: &Agent, signals: &[Signal], now: Timestamp, discord: bool) -> ReplyTarget {
    if !discord {
        return ReplyTarget::None;
    }
    if let Some(i) = signals
        .iter()
        .rev()
        .filter_map(|s| s.meta.interaction.as_ref())
        .find(|i| i.usable_at(now))
    {
        return ReplyTarget::Interaction(i.clone());
    }
    signals
        .iter()
        .rev()
        .find_map(|s| s.meta.channel_id.clone())
        .or_else(|| agent.discord_channel.clone())
        .map_or(ReplyTarget::None, |channel_id| ReplyTarget::Channel {
            channel_id,
        })
}

/// A nonce for a channel post (Discord allows 25 characters): the turn's ULID without
/// its time prefix, and the part number.
fn nonce(turn: &TurnId, part: usize) -> String {
    let ulid = turn.as_str().trim_start_matches("tn_");
    format!("{}{part:02}", &ulid[ulid.len().saturating_sub(22)..])
}

/// Whether a Discord error is worth retrying later (the queue redelivers).
fn transient(e: &DiscordError) -> bool {
    match e {
        DiscordError::Transport(_) | DiscordError::RateLimited { .. } => true,
        DiscordError::Status { status, .. } => *status >= 500,
        DiscordError::NotConfigured(_) | DiscordError::Malformed(_) => false,
    }
}

impl Conversation {
    /// A conversation engine. `discord` is `None` when Discord is not configured: replies
    /// are stored and logged only.
    pub fn new(
        store: Arc<dyn Store>,
        llm: Arc<dyn LlmSelector>,
        discord: Option<Arc<dyn DiscordApi>>,
        clock: Arc<dyn Clock>,
        settings: ConversationSettings,
    ) -> Self {
        Self {
            store,
            llm,
            discord,
            clock,
            settings,
            hooks: None,
            images: None,
        }
    }

    /// Fetches the images users send with `fetcher` when the model cannot reach their
    /// URL (without one, such images reach the model as `[image: URL]` text only).
    pub fn with_images(mut self, fetcher: Arc<dyn ImageFetcher>) -> Self {
        self.images = Some(fetcher);
        self
    }

    /// The images of `signals` as the agent's model takes them: none when the model is
    /// not sent images (`--vision`), a URL the provider can reach, or the bytes fetched
    /// (an expiring Discord attachment, a private address). One that cannot be fetched
    /// stays the `[image: URL]` text the message already carries.
    async fn images_for(
        &self,
        agent: &Agent,
        signals: &[Signal],
        now: Timestamp,
    ) -> Vec<ImageInput> {
        let blocks: Vec<&str> = signals
            .iter()
            .filter(|s| s.kind != SignalKind::Heartbeat)
            .flat_map(|s| &s.content)
            .filter_map(|b| match b {
                ContentBlock::Image { url, .. } => Some(url.as_str()),
                ContentBlock::Text { .. } => None,
            })
            .collect();
        if blocks.is_empty() {
            return Vec::new();
        }
        let model = match self.llm.select(agent) {
            Ok(llm) => llm.model().to_owned(),
            Err(_) => return Vec::new(),
        };
        if !agent.llm.sees_images(&model) {
            info!(model = %model, images = blocks.len(), "the model is not sent images (--vision): they reach it as text");
            return Vec::new();
        }
        let mut out = Vec::new();
        for url in blocks {
            if provider_reaches(url, now) {
                out.push(ImageInput::Url {
                    url: url.to_owned(),
                });
                continue;
            }
            let Some(fetcher) = &self.images else {
                continue;
            };
            match fetcher.fetch_image(url).await {
                Ok((media_type, bytes)) => out.push(ImageInput::Inline {
                    media_type,
                    data: base64::engine::general_purpose::STANDARD.encode(bytes),
                }),
                Err(why) => {
                    warn!(url = %url, error = %why, "an image could not be fetched; the model reads its URL as text");
                }
            }
        }
        out
    }

    /// Emits MESSAGE_RECEIVED and MESSAGE_SENT hooks through `emitter`.
    pub fn with_hooks(mut self, emitter: super::hooks::HookEmitter) -> Self {
        self.hooks = Some(emitter);
        self
    }

    /// Enqueues the agent's hooks of `hook_type` for `turn`. A failure fails the step:
    /// the signals are delivered again, the turn resumes, and the hooks are emitted
    /// again under the same delivery ids.
    async fn emit(
        &self,
        agent: &Agent,
        turn: &Turn,
        hook_type: &'static str,
        triggered_by: &str,
        data: serde_json::Value,
    ) -> Result<(), EngineError> {
        let Some(hooks) = &self.hooks else {
            return Ok(());
        };
        let routes = hooks.routes(&agent.id).await?;
        let emission = super::hooks::Emission {
            hook_type: crate::domain::HookType::of(hook_type),
            heartbeat_id: None,
            action_id: None,
            data,
            triggered_by: triggered_by.to_owned(),
            key_ms: turn.created_at.as_millisecond().max(0) as u64,
            key: vec![turn.id.to_string()],
        };
        hooks.emit(&routes, agent, emission).await.map(|_| ())
    }

    /// MESSAGE_RECEIVED for `turn`, which took in `signals`.
    async fn emit_received(
        &self,
        agent: &Agent,
        turn: &Turn,
        signals: &[Signal],
    ) -> Result<(), EngineError> {
        let trigger = signals
            .first()
            .map_or("message", |s| s.kind.as_str())
            .to_ascii_uppercase();
        let data = HookData::message_received(turn, signals);
        self.emit(agent, turn, HookType::MESSAGE_RECEIVED, &trigger, data)
            .await
    }

    /// MESSAGE_SENT for `turn`, once its reply has reached Discord.
    async fn emit_sent(&self, agent: &Agent, turn: &Turn) -> Result<(), EngineError> {
        if turn.status != TurnStatus::Done || turn.delivered == 0 {
            return Ok(());
        }
        let channel = match &turn.target {
            ReplyTarget::Channel { channel_id } => Some(channel_id.clone()),
            _ => agent.discord_channel.clone(),
        };
        let data = HookData::message_sent(turn, channel);
        self.emit(agent, turn, HookType::MESSAGE_SENT, "TURN", data)
            .await
    }

    /// Answers consecutive signals of one session with one turn. An `Err` means the
    /// signals should be delivered again (storage or the model unavailable, Discord down);
    /// a redelivery resumes where this call stopped.
    pub async fn run(&self, signals: &[Signal]) -> Result<TurnOutcome, EngineError> {
        let Some(first) = signals.first() else {
            return Ok(TurnOutcome {
                turns: Vec::new(),
                parts_sent: 0,
                asked_model: false,
            });
        };
        let span = info_span!("turn", agent_id = %first.agent_id, session = %first.session, signals = signals.len());
        // The requests the run makes are counted onto the turn it writes.
        let outcome = crate::tally::scope(
            self.run_inner(&first.agent_id.clone(), signals)
                .instrument(span),
        )
        .await;
        if outcome.is_err() {
            crate::meter::turn_failed();
        }
        outcome
    }

    async fn run_inner(
        &self,
        agent_id: &AgentId,
        signals: &[Signal],
    ) -> Result<TurnOutcome, EngineError> {
        let ids: Vec<_> = signals.iter().map(|s| s.id.clone()).collect();
        let answered = self.store.answered(agent_id, &ids).await?;
        let mut outcome = TurnOutcome {
            turns: Vec::new(),
            parts_sent: 0,
            asked_model: false,
        };
        // Finish delivering turns an earlier delivery of these signals began.
        for (_, turn_id) in &answered {
            if outcome.turns.contains(turn_id) {
                continue;
            }
            outcome.turns.push(turn_id.clone());
            let Some(mut turn) = self.store.get_turn(agent_id, turn_id).await? else {
                continue;
            };
            if turn.status == TurnStatus::Delivering {
                info!(turn_id = %turn.id, delivered = turn.delivered, "resuming the delivery of a turn begun earlier");
                let (sent, delivered) = self.deliver(turn).await?;
                outcome.parts_sent += sent;
                turn = delivered;
            }
            // The step that wrote this turn may have stopped before its hooks were
            // queued: emit them again (the same delivery ids: each is sent once).
            if self.hooks.is_some()
                && let Some(agent) = self.store.get_agent(agent_id).await?
            {
                let took: Vec<Signal> = signals
                    .iter()
                    .filter(|s| turn.signals.contains(&s.id))
                    .cloned()
                    .collect();
                self.emit_received(&agent, &turn, &took).await?;
                self.emit_sent(&agent, &turn).await?;
            }
        }
        let pending: Vec<Signal> = signals
            .iter()
            .filter(|s| !answered.iter().any(|(id, _)| *id == s.id))
            .cloned()
            .collect();
        if pending.is_empty() {
            return Ok(outcome);
        }

        let Some(agent) = self.store.get_agent(agent_id).await? else {
            warn!("the agent no longer exists; its signals are dropped");
            return Ok(outcome);
        };
        let history = self
            .store
            .recent_messages(agent_id, self.settings.history_messages)
            .await?;
        let now = self.clock.now();
        let newest = self.store.heartbeats_page(agent_id, None, 1).await?;
        let said: Vec<String> = pending.iter().map(Signal::text).collect();
        let memories = self.store.memories(agent_id, memory::PROMPT_SCAN).await?;
        let known = memory::known(&memories, &said.join("\n"), memory::PROMPT_TOKENS);
        let mut context = build_context(
            &agent,
            &history,
            &pending,
            turn_beats(newest.first(), &history),
            known.as_deref(),
            now,
            self.settings.history_tokens,
        );
        let turn_id = TurnId::for_signal(&pending[0].id);
        let user_spoke = pending.iter().any(|s| s.kind == SignalKind::Message);
        let spent = budget::exhausted(self.store.as_ref(), &agent, now).await?;
        // Memories the turn's tools keep get ids from the turn and its first signal's
        // time, so a redelivered turn keeps each once.
        let first_ms = pending[0].created_at.as_millisecond().max(0) as u64;
        let (reply, provider, model, usage, failed, steps) = match &spent {
            None => {
                outcome.asked_model = true;
                // The pictures sent with the turn's messages, on its user message.
                let images = self.images_for(&agent, &pending, now).await;
                if !images.is_empty()
                    && let Some(ChatMessage::User { images: slot, .. }) = context
                        .iter_mut()
                        .rev()
                        .find(|m| matches!(m, ChatMessage::User { .. }))
                {
                    *slot = images;
                }
                let a = self.ask(&agent, context, &turn_id, first_ms).await?;
                (a.text, a.provider, a.model, a.usage, a.failed, a.steps)
            }
            Some(today) => {
                budget::fire_exhausted(
                    self.store.as_ref(),
                    self.hooks.as_ref(),
                    &agent,
                    today,
                    now,
                )
                .await?;
                let why = budget::reason(&agent, today, now);
                info!(reason = %why, "no model call for this turn");
                if user_spoke && !today.marked(Spend::NOTICE) {
                    let notice = budget::notice(&agent, now);
                    (
                        notice,
                        "pulse".into(),
                        String::new(),
                        Usage::default(),
                        None,
                        Vec::new(),
                    )
                } else {
                    // Told once today already (or nothing a user said): no reply.
                    let why = format!("not answered: {why}");
                    (
                        String::new(),
                        "pulse".into(),
                        String::new(),
                        Usage::default(),
                        Some(why),
                        Vec::new(),
                    )
                }
            }
        };
        // A turn with nothing to say is recorded answered, its signals kept in the
        // history, with nothing to deliver.
        let silent = reply.is_empty();
        let parts = if silent {
            Vec::new()
        } else {
            split_message(&reply, MESSAGE_LIMIT)
        };
        let mut turn = Turn {
            id: turn_id,
            agent_id: agent_id.clone(),
            session: pending[0].session.clone(),
            signals: pending.iter().map(|s| s.id.clone()).collect(),
            status: if silent {
                TurnStatus::Done
            } else {
                TurnStatus::Delivering
            },
            parts,
            delivered: 0,
            target: target(&agent, &pending, now, self.discord.is_some()),
            discord_message_ids: Vec::new(),
            provider,
            model,
            usage,
            steps,
            error: failed,
            created_at: now,
            completed_at: silent.then_some(now),
            requests: None,
        };
        let messages = persisted(&turn, &pending, &reply, now);
        crate::tally::stamp(&mut turn.requests);
        match self.store.begin_turn(&turn, &messages).await? {
            TurnStart::Created => {
                budget::record(
                    self.store.as_ref(),
                    &agent,
                    now,
                    turn.id.as_str(),
                    turn.usage.total(),
                )
                .await;
                if let Some(today) = &spent
                    && !silent
                {
                    budget::mark_notice(self.store.as_ref(), &agent, today, now).await;
                }
                self.emit_received(&agent, &turn, &pending).await?
            }
            TurnStart::Exists(existing) => {
                info!(turn_id = %existing.id, "the turn was written by an earlier delivery; resuming it");
                turn = *existing;
                self.emit_received(&agent, &turn, &pending).await?;
            }
        }
        outcome.turns.push(turn.id.clone());
        if turn.status == TurnStatus::Delivering {
            let (sent, delivered) = self.deliver(turn).await?;
            outcome.parts_sent += sent;
            self.emit_sent(&agent, &delivered).await?;
        }
        if user_spoke {
            // The quiet period before the next heartbeat counts from the end of the turn.
            self.store
                .record_interaction(agent_id, self.clock.now())
                .await?;
        }
        let waited = self.clock.now().duration_since(pending[0].created_at);
        crate::meter::turn_answered(waited.try_into().unwrap_or_default());
        Ok(outcome)
    }

    /// Asks the model for the reply, in a tool loop with `remember` and `recall` under
    /// the agent's step and token budgets (the heartbeat agent's): each request asks for
    /// at most the tokens left, and the last step allowed offers no tools, so the loop
    /// ends with words. A failure that retrying cannot fix (no key, a rejected request)
    /// becomes a reply saying so, recorded as the turn's error, rather than a message
    /// that is redelivered until it is dead-lettered.
    async fn ask(
        &self,
        agent: &Agent,
        mut messages: Vec<ChatMessage>,
        turn_id: &TurnId,
        first_ms: u64,
    ) -> Result<Asked, EngineError> {
        let llm = match self.llm.select(agent) {
            Ok(l) => l,
            Err(e) => {
                let why = chain(&e);
                error!(error = %why, "no model for this agent");
                return Ok(Asked {
                    text: apology(&why),
                    provider: "none".into(),
                    model: "none".into(),
                    failed: Some(why),
                    ..Asked::default()
                });
            }
        };
        let mut asked = Asked {
            provider: llm.provider().to_owned(),
            ..Asked::default()
        };
        let mut tools = memory::specs("in later conversations and heartbeats");
        tools.push(reminders::tool_spec());
        let budgets = &agent.budgets;
        let steps = budgets.max_steps.max(1);
        let mut last_input = 0;
        let mut calls = 0usize;
        for step in 0..steps {
            // Another step only if a prompt as long as the last one still fits.
            let left = budgets
                .max_tokens
                .saturating_sub(asked.usage.total() + last_input);
            if step > 0 && left == 0 {
                warn!(
                    budget = budgets.max_tokens,
                    "the turn's token budget is spent; replying with what was written"
                );
                break;
            }
            let last = step + 1 == steps;
            let request = LlmRequest {
                model: None,
                messages: messages.clone(),
                tools: if last { Vec::new() } else { tools.clone() },
                max_tokens: u32::try_from(left)
                    .unwrap_or(u32::MAX)
                    .min(self.settings.reply_max_tokens),
            };
            let resp = match llm.complete(&request).await {
                Ok(resp) => resp,
                Err(e) => {
                    let why = chain(&e);
                    let retry = match &e {
                        crate::error::LlmError::Transport { .. } => true,
                        crate::error::LlmError::Status { status, .. } => {
                            *status == 429 || *status >= 500
                        }
                        _ => false,
                    };
                    if retry {
                        return Err(EngineError::Unavailable(format!(
                            "the model did not answer: {why}"
                        )));
                    }
                    error!(error = %why, "the model rejected the turn");
                    asked.text = apology(&why);
                    asked.failed = Some(why);
                    return Ok(asked);
                }
            };
            asked.usage.add(resp.usage);
            crate::meter::tokens(resp.provider, &resp.usage);
            last_input = resp.usage.input_tokens;
            asked.provider = resp.provider.to_owned();
            asked.model = resp.model.clone();
            if asked.steps.is_empty() && resp.tool_calls.is_empty() {
                // A plain reply, as most are: no steps to keep.
                asked.text = resp.text.unwrap_or_default();
                break;
            }
            asked
                .steps
                .push(transcript::call_step(step, &resp, "reply"));
            asked.text = resp.text.clone().unwrap_or_default();
            if resp.tool_calls.is_empty() || last {
                break;
            }
            messages.push(ChatMessage::Assistant {
                text: resp.text.clone(),
                tool_calls: resp.tool_calls.clone(),
            });
            for call in &resp.tool_calls {
                let id = MemoryId::derived(
                    first_ms,
                    &[turn_id.as_str(), &step.to_string(), &calls.to_string()],
                );
                calls += 1;
                let now = self.clock.now();
                let result =
                    match memory::run(self.store.as_ref(), agent, call, id, None, now).await {
                        Some(r) => r,
                        None if call.name == "schedule" => {
                            reminders::run_tool(self.store.as_ref(), agent, &call.input, now)
                                .await
                                .map(|(_, answer)| answer)
                        }
                        None => Err(format!(
                            "there is no tool {:?}; use remember, recall or schedule",
                            call.name
                        )),
                    };
                info!(tool = %call.name, is_error = result.is_err(), "reply tool call");
                let (step, message) = transcript::tool_step(call, result);
                asked.steps.push(step);
                messages.push(message);
            }
        }
        info!(
            provider = %asked.provider,
            model = %asked.model,
            input_tokens = asked.usage.input_tokens,
            output_tokens = asked.usage.output_tokens,
            steps = asked.steps.len(),
            "reply written"
        );
        if asked.text.trim().is_empty() {
            asked.text = "(no reply)".to_owned();
        }
        Ok(asked)
    }

    /// Records the turn as it stands, with the requests made since its last write.
    async fn save(&self, turn: &mut Turn) -> Result<(), crate::error::StoreError> {
        crate::tally::stamp(&mut turn.requests);
        self.store.update_turn(turn).await
    }

    /// Delivers a turn's remaining parts, recording each; returns how many were sent, and
    /// the turn as recorded.
    async fn deliver(&self, mut turn: Turn) -> Result<(usize, Turn), EngineError> {
        let mut sent = 0;
        while (turn.delivered as usize) < turn.parts.len() {
            let i = turn.delivered as usize;
            let part = turn.parts[i].clone();
            let result = match (&turn.target, &self.discord) {
                (ReplyTarget::None, _) | (_, None) => {
                    info!(turn_id = %turn.id, reply = %part, "reply stored (no Discord destination configured)");
                    Ok(None)
                }
                (ReplyTarget::Interaction(it), Some(d)) => {
                    if i == 0 {
                        d.edit_original(&it.token, &part).await.map(Some)
                    } else {
                        d.follow_up(&it.token, &part).await.map(Some)
                    }
                }
                (ReplyTarget::Channel { channel_id }, Some(d)) => d
                    .create_message(channel_id, &part, &nonce(&turn.id, i))
                    .await
                    .map(Some),
            };
            match result {
                Ok(id) => {
                    turn.discord_message_ids.extend(id);
                    turn.delivered += 1;
                    if turn.target != ReplyTarget::None {
                        sent += 1;
                    }
                    if turn.delivered as usize == turn.parts.len() {
                        turn.status = if turn.error.is_some() {
                            TurnStatus::Failed
                        } else {
                            TurnStatus::Done
                        };
                        turn.completed_at = Some(self.clock.now());
                    }
                    self.save(&mut turn).await?;
                }
                Err(e) => {
                    let why = chain(&e);
                    if transient(&e) {
                        turn.error = Some(why.clone());
                        self.save(&mut turn).await?;
                        return Err(EngineError::Unavailable(format!(
                            "Discord did not take part {} of turn {}: {why}",
                            i + 1,
                            turn.id
                        )));
                    }
                    error!(turn_id = %turn.id, error = %why, "Discord refused the reply; the turn is recorded FAILED");
                    turn.status = TurnStatus::Failed;
                    turn.error = Some(why);
                    turn.completed_at = Some(self.clock.now());
                    self.save(&mut turn).await?;
                    return Ok((sent, turn));
                }
            }
        }
        if sent > 0 {
            info!(turn_id = %turn.id, parts = sent, "reply delivered");
        }
        Ok((sent, turn))
    }
}

fn apology(why: &str) -> String {
    format!(
        "I could not think of a reply just now: {why}. An operator should check my LLM settings."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{NewAgent, SignalMeta};
    use serde_json::json;

    fn agent() -> Agent {
        let mut a = NewAgent::named("Scout");
        a.persona = Some("You are Scout.".into());
        a.create(Timestamp::UNIX_EPOCH).unwrap().0
    }

    fn history(agent: &Agent, n: usize, chars: usize) -> Vec<ConversationMessage> {
        // Newest first, as read.
        (0..n)
            .rev()
            .map(|i| ConversationMessage {
                id: format!("m{i:05}"),
                agent_id: agent.id.clone(),
                turn_id: TurnId::parse("tn_01J00000000000000000000000").unwrap(),
                role: if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                source: "cli".into(),
                agent: None,
                author: None,
                content: format!("{i:05}{}", "x".repeat(chars.saturating_sub(5))),
                created_at: Timestamp::UNIX_EPOCH,
            })
            .collect()
    }

    #[test]
    fn history_beyond_the_token_budget_is_dropped_oldest_first() {
        let a = agent();
        let h = history(&a, 50, 40); // 14 tokens each
        let ctx = build_context(&a, &h, &[], None, None, Timestamp::UNIX_EPOCH, 14 * 10);
        assert_eq!(ctx.len(), 11, "system + the 10 newest");
        assert!(ctx[1].text().unwrap().starts_with("00040"));
        assert!(ctx[10].text().unwrap().starts_with("00049"));
    }

    #[test]
    fn thoughts_come_last_as_the_agents_own_words_and_envelopes_before_them() {
        let a = agent();
        let now = Timestamp::UNIX_EPOCH;
        let mut m =
            Signal::user_message(&a.id, &a.session, "hi", SignalMeta::default(), now).unwrap();
        m.meta.discord = Some(json!({"attachments": [{"name": "a.ogg"}]}));
        let mut t = m.clone();
        t.kind = SignalKind::Heartbeat;
        t.meta.discord = None;
        t.content = vec![crate::domain::ContentBlock::Text {
            text: "check in".into(),
        }];
        let beats = Some(Beats {
            beat: 847,
            since_last: 2,
        });
        let ctx = build_context(
            &a,
            &[],
            &[t, m],
            beats,
            Some("What you know: tea"),
            now,
            1000,
        );
        let roles: Vec<_> = ctx.iter().map(ChatMessage::role).collect();
        assert_eq!(roles, ["system", "user", "system", "assistant"]);
        assert!(ctx[0].text().unwrap().ends_with("\n\nWhat you know: tea"));
        let envelope = ctx[2].text().unwrap();
        assert!(envelope.contains("a.ogg"));
        assert!(
            envelope.starts_with(r#"Beats: {"beat":847,"since_last":2}"#),
            "{envelope}"
        );
        assert_eq!(ctx[3].text(), Some("check in"));
    }

    #[test]
    fn a_turn_knows_its_beat_and_the_beats_since_the_user_last_wrote() {
        let a = agent();
        let t = |s: i64| Timestamp::from_second(s).unwrap();
        let (next, _) = crate::domain::NewAgent::named("x").create(t(0)).unwrap();
        let mut h = Heartbeat::pending(
            &next,
            12,
            t(1_000),
            crate::domain::EventCursor::origin(),
            9,
            Some(t(500)),
            0,
        );
        let said = |at: i64| {
            let mut m = history(&a, 1, 10).remove(0);
            m.role = Role::User;
            m.created_at = t(at);
            m
        };
        assert_eq!(turn_beats(None, &[]), None, "no heartbeat yet");
        // Beat 12 is due, not started: the agent is at beat 11; the user last wrote at
        // beat 9, counted by a heartbeat.
        let b = turn_beats(Some(&h), &[said(400)]).unwrap();
        assert_eq!((b.beat, b.since_last), (11, 2));
        // Started: it is beat 12.
        h.started_at = Some(t(1_000));
        assert_eq!(turn_beats(Some(&h), &[said(400)]).unwrap().since_last, 3);
        // The user wrote after the heartbeats counted: in this very beat.
        assert_eq!(turn_beats(Some(&h), &[said(600)]).unwrap().since_last, 0);
        // Never wrote: beats since the start.
        h.last_interaction_beat = 0;
        h.interaction_seen_at = None;
        assert_eq!(turn_beats(Some(&h), &[]).unwrap().since_last, 12);
    }

    #[test]
    fn a_provider_fetches_public_https_urls_and_discord_attachments_before_they_expire() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let discord = |ex: i64| {
            format!("https://cdn.discordapp.com/attachments/1/2/cat.png?ex={ex:x}&is=0&hm=ab")
        };
        assert!(provider_reaches("https://example.com/cat.png", now));
        assert!(provider_reaches(&discord(1_700_000_000 + 86_400), now));
        assert!(
            !provider_reaches(&discord(1_700_000_000 + 60), now),
            "expires within the margin"
        );
        assert!(!provider_reaches(&discord(1_600_000_000), now), "expired");
        for private in [
            "http://example.com/cat.png",
            "https://127.0.0.1/cat.png",
            "https://[::1]/cat.png",
            "https://localhost/cat.png",
            "https://printer.local/scan.png",
            "https://intranet/cat.png",
            "not a url",
        ] {
            assert!(!provider_reaches(private, now), "{private}");
        }
    }

    #[test]
    fn a_channel_nonce_fits_discords_limit_and_differs_per_part() {
        let t = TurnId::parse("tn_01JABCDEFGHJKMNPQRSTVWXYZ0").unwrap();
        assert!(nonce(&t, 0).len() <= 25);
        assert_ne!(nonce(&t, 0), nonce(&t, 1));
    }
}
