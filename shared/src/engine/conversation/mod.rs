//! The conversation: consecutive signals of a session become one turn.
//!
//! A turn builds the context ([`build_context`]) — the persona as system prompt, the
//! history within a token budget (oldest dropped first; only the latest messages are
//! read, so a turn's cost does not grow with the history), a context message with the
//! agent's beats, what it knows and the raw Discord envelopes (never persisted), framed
//! as data, all pending user messages as one time-stamped user message, and the
//! heartbeat's spoken thoughts last as one assistant
//! message — asks the model, and writes the turn (its inbound messages, the reply, and
//! marks that its signals are answered) in one atomic write *before* delivering the
//! reply. Delivery then records each part sent. A redelivered signal finds its turn and
//! resumes delivery where it stopped instead of asking the model again, so the same
//! signals never produce a second Discord message. (Channel posts also carry a nonce
//! Discord enforces, which closes the gap between sending a part and recording it.)
//!
//! ## Layout
//!
//! - here: the engine, and a turn from its signals to its record;
//! - `context`: what the model reads, and what the turn persists;
//! - `images`: the pictures the messages carry;
//! - `ask`: the model's tool loop;
//! - `deliver`: the reply to Discord, part by part, and the turn's hooks;
//! - `taken_over`: what the turns a turn takes over (dropped for a newer message) did;
//! - `seen`: a reply the person reacted to, or replied to, on Discord.

mod ask;
mod commands;
pub(crate) use commands::is_interaction;
mod context;
mod deliver;
mod images;
mod seen;
mod taken_over;

pub use context::build_context;
use context::{persisted, target, turn_beats};
pub use seen::{SEEN_SCAN, mark_seen};

use std::sync::Arc;

use jiff::Timestamp;
use tracing::{Instrument, info, info_span, warn};

use crate::domain::{
    Agent, AgentId, ChatMessage, ConsolidateJob, Signal, SignalId, SignalKind, Spend, Turn, TurnId,
    TurnStatus, split_message,
};
use crate::engine::{budget, memory, prompt};
use crate::error::EngineError;
use crate::ports::{Channels, Clock, ImageFetcher, LlmSelector, Store, TurnStart};
use ask::Asked;

/// The agent's latest `limit` messages, newest first, the messages of its turns that wait
/// on the model among them (marked waiting): what a person reads as the conversation,
/// their message shown from the moment the model first failed it.
pub async fn history(
    store: &dyn Store,
    agent: &AgentId,
    limit: usize,
) -> Result<Vec<crate::domain::ConversationMessage>, crate::error::StoreError> {
    let mut messages = store.recent_messages(agent, limit).await?;
    let waiting = store.list_waiting(1_000).await?;
    let mut held: Vec<_> = waiting
        .iter()
        .filter(|w| w.agent_id == *agent)
        .flat_map(context::waiting_messages)
        .collect();
    if held.is_empty() {
        return Ok(messages);
    }
    messages.append(&mut held);
    messages.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| b.id.cmp(&a.id))
    });
    messages.truncate(limit);
    Ok(messages)
}

/// A turn's steps as the turn keeps them: within [`Turn::KEPT_STEPS`].
fn kept_steps(steps: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    super::transcript::kept(steps, Turn::KEPT_STEPS)
}

/// Tunables of conversation turns.
#[derive(Clone, Debug)]
pub struct ConversationSettings {
    /// Most tokens of a reply.
    pub reply_max_tokens: u32,
    /// How long a turn waits on a model that does not answer (unreachable, 429, 5xx),
    /// tried again with growing gaps, before it is answered with an apology instead.
    pub patience: jiff::SignedDuration,
    /// Bounds on the schedules the `schedule` tool makes.
    pub schedules: super::reminders::ScheduleLimits,
    /// The prices dollar budgets are kept at.
    pub prices: std::sync::Arc<super::Prices>,
}

impl Default for ConversationSettings {
    fn default() -> Self {
        Self {
            reply_max_tokens: 1_024,
            patience: ConversationSettings::DEFAULT_PATIENCE,
            schedules: super::reminders::ScheduleLimits::default(),
            prices: std::sync::Arc::new(super::Prices::default()),
        }
    }
}

impl ConversationSettings {
    /// How long a turn waits on the model by default: a day.
    pub const DEFAULT_PATIENCE: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);
}

/// How a turn ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnOutcome {
    /// The turns that answered the signals (one, or more when a redelivery found an
    /// earlier turn for some of them).
    pub turns: Vec<TurnId>,
    /// Reply parts delivered by this call.
    pub parts_sent: usize,
    /// Whether the model was asked (false when everything was answered already).
    pub asked_model: bool,
    /// The model did not answer: the turn waits, and is tried again later.
    pub waiting: bool,
    /// The OpenTelemetry trace the run was recorded in, when traces are sent: written
    /// on the turns it makes.
    pub trace_id: Option<String>,
}

/// Runs conversation turns.
pub struct Conversation {
    store: Arc<dyn Store>,
    llm: Arc<dyn LlmSelector>,
    channels: Channels,
    clock: Arc<dyn Clock>,
    settings: ConversationSettings,
    hooks: Option<crate::engine::hooks::HookEmitter>,
    images: Option<Arc<dyn ImageFetcher>>,
    memories: Arc<memory::Memories>,
    lifecycle: Option<Arc<crate::engine::Lifecycle>>,
    agent_tools: Option<Arc<crate::engine::agent_tools::AgentTools>>,
}

impl Conversation {
    /// A conversation engine, replying on `channels` (none set up: replies are stored
    /// and logged only, and read over the API, the dashboard and the CLI).
    pub fn new(
        store: Arc<dyn Store>,
        llm: Arc<dyn LlmSelector>,
        channels: Channels,
        clock: Arc<dyn Clock>,
        settings: ConversationSettings,
        memories: Arc<memory::Memories>,
    ) -> Self {
        Self {
            store,
            llm,
            channels,
            clock,
            settings,
            hooks: None,
            images: None,
            memories,
            lifecycle: None,
            agent_tools: None,
        }
    }

    /// Offers the model the tools of the MCP servers each agent is attached to.
    pub fn with_agent_tools(mut self, tools: Arc<crate::engine::agent_tools::AgentTools>) -> Self {
        self.agent_tools = Some(tools);
        self
    }

    /// Fetches the images users send with `fetcher` when the model cannot reach their
    /// URL (without one, such images reach the model as `[image: URL]` text only).
    pub fn with_images(mut self, fetcher: Arc<dyn ImageFetcher>) -> Self {
        self.images = Some(fetcher);
        self
    }

    /// Runs the steering commands users say (`/pause`, `/snooze 2h`, …) with
    /// `lifecycle`; without it they are answered as unavailable.
    pub fn with_lifecycle(mut self, lifecycle: Arc<crate::engine::Lifecycle>) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }

    /// Emits MESSAGE_RECEIVED and MESSAGE_SENT hooks through `emitter`.
    pub fn with_hooks(mut self, emitter: crate::engine::hooks::HookEmitter) -> Self {
        self.hooks = Some(emitter);
        self
    }

    /// Runs an agent's daily consolidation of its memories ([`memory::consolidate`]),
    /// summarizing with its model; an agent deleted since the job was queued has none.
    pub async fn consolidate(&self, job: &ConsolidateJob) -> Result<(), EngineError> {
        let Some(agent) = self.store.get_agent(&job.agent_id).await? else {
            return Ok(());
        };
        let beat = memory::beat_now(self.store.as_ref(), &agent.id).await?;
        let done = memory::consolidate::consolidate(
            &self.memories,
            self.store.as_ref(),
            Some((self.llm.as_ref(), &self.settings.prices)),
            &agent,
            beat,
            self.clock.now(),
        )
        .await?;
        if let Some(why) = &done.no_summary {
            info!(agent_id = %agent.id, reason = %why, "no summary of faded episodes in this consolidation");
        }
        Ok(())
    }

    /// Answers consecutive signals of one session with one turn. An `Err` means the
    /// signals should be delivered again (storage or the model unavailable, Discord down);
    /// a redelivery resumes where this call stopped.
    pub async fn run(&self, signals: &[Signal]) -> Result<TurnOutcome, EngineError> {
        let Some(first) = signals.first() else {
            return Ok(TurnOutcome::default());
        };
        let span = info_span!("turn", agent_id = %first.agent_id, session = %first.session, signals = signals.len(), turn_id = tracing::field::Empty, trace_id = tracing::field::Empty);
        let trace = crate::traces::turn(
            first.agent_id.as_str(),
            first.session.as_str(),
            signals.len(),
        );
        if let Some(id) = crate::traces::trace_id(&trace) {
            span.record("trace_id", id);
        }
        // The requests the run makes are counted onto the turn it writes.
        let outcome = crate::tally::scope(
            self.run_inner(&first.agent_id.clone(), signals, &trace)
                .instrument(span)
                .instrument(trace.clone()),
        )
        .await;
        match &outcome {
            Ok(done) => {
                if let Some(turn) = done.turns.last() {
                    trace.record("pulse.turn.id", turn.as_str());
                }
                let ended = if done.waiting { "waiting" } else { "answered" };
                crate::traces::ended(&trace, ended, "");
            }
            Err(e) => {
                crate::meter::turn_failed();
                crate::traces::failed(&trace, "engine_error", &e.to_string());
            }
        }
        outcome
    }

    async fn run_inner(
        &self,
        agent_id: &AgentId,
        signals: &[Signal],
        trace: &tracing::Span,
    ) -> Result<TurnOutcome, EngineError> {
        // A turn of this session that waits on the model: its signals come first, and
        // this turn answers them with the new ones.
        let session = signals[0].session.clone();
        let waiting = self.store.get_waiting(agent_id, &session).await?;
        let signals = match &waiting {
            Some(w) => w.joined(signals),
            None => signals.to_vec(),
        };
        let ids: Vec<_> = signals.iter().map(|s| s.id.clone()).collect();
        let answered = self.store.answered(agent_id, &ids).await?;
        let mut outcome = TurnOutcome {
            trace_id: crate::traces::trace_id(trace),
            ..TurnOutcome::default()
        };
        self.resume(agent_id, &signals, &answered, &mut outcome)
            .await?;
        let pending: Vec<Signal> = signals
            .iter()
            .filter(|s| !answered.iter().any(|(id, _)| *id == s.id))
            .cloned()
            .collect();
        let agent = match pending.is_empty() {
            true => None,
            false => self.store.get_agent(agent_id).await?,
        };
        let Some(agent) = agent else {
            if !pending.is_empty() {
                warn!("the agent no longer exists; its signals are dropped");
            }
            if waiting.is_some() {
                self.store.delete_waiting(agent_id, &session).await?;
            }
            return Ok(outcome);
        };
        crate::traces::agent_known(trace, agent.name.as_str(), agent.session.as_str());
        let pending = self.carry_out(&agent, pending).await?;
        match self.answer(&agent, &pending, None, &mut outcome).await {
            Ok(()) => {}
            Err(EngineError::ModelDown(why)) => {
                return self.wait(&agent, waiting, pending, why, outcome).await;
            }
            Err(e) => return Err(e),
        }
        if waiting.is_some() {
            info!(
                signals = pending.len(),
                "the model answered: the turn that waited on it is answered"
            );
            self.store.delete_waiting(agent_id, &session).await?;
        }
        Ok(outcome)
    }

    /// Carries out the decided approvals among `pending` (see
    /// [`crate::engine::approvals`]): an approved call is sent (or, checked again, not),
    /// a denied or expired one is not; the outcome is settled on the approval and its hook
    /// emitted; and the signal's text becomes what the agent is told of it. A redelivery
    /// finds the outcome settled, or the call's action recorded, and sends nothing twice.
    async fn carry_out(
        &self,
        agent: &Agent,
        mut pending: Vec<Signal>,
    ) -> Result<Vec<Signal>, EngineError> {
        for s in &mut pending {
            let Some(id) = crate::engine::approvals::carried(s) else {
                continue;
            };
            let Some(approval) = self.store.get_approval(&agent.id, &id).await? else {
                warn!(approval_id = %id, "the approval a signal carries is gone");
                continue;
            };
            if approval.is_pending() {
                continue;
            }
            let outcome = match &approval.outcome {
                Some(o) => o.clone(),
                None => {
                    let now = self.clock.now();
                    let outcome = match (
                        crate::engine::agent_tools::not_sent(&approval, now),
                        &self.agent_tools,
                    ) {
                        (Some(o), _) => o,
                        (None, Some(at)) => at.carry_out(agent, &approval).await,
                        (None, None) => crate::domain::ApprovalOutcome {
                            sent: false,
                            action_id: None,
                            summary: "approved, but not sent: this worker has no MCP tools set up"
                                .to_owned(),
                            failed: false,
                            at: now,
                        },
                    };
                    let mut settled = approval.clone();
                    settled.outcome = Some(outcome.clone());
                    self.store.settle_approval(&settled).await?;
                    if let Some(hooks) = &self.hooks {
                        let kind = match settled.status {
                            crate::domain::ApprovalStatus::Expired => {
                                crate::domain::HookType::APPROVAL_EXPIRED
                            }
                            _ => crate::domain::HookType::APPROVAL_DECIDED,
                        };
                        crate::engine::approvals::announce(hooks, agent, &settled, kind).await;
                    }
                    outcome
                }
            };
            s.content = vec![crate::domain::ContentBlock::Text {
                text: crate::engine::agent_tools::told(&approval, &outcome),
            }];
        }
        Ok(pending)
    }

    /// Tries again a session's turn that waits on the model, when it is due: as a
    /// redelivery of its signals would. Nothing, when it was answered meanwhile (a newer
    /// message of the session took it along) or is not due yet.
    pub async fn retry(&self, job: &crate::domain::RetryJob) -> Result<TurnOutcome, EngineError> {
        let Some(w) = self.store.get_waiting(&job.agent_id, &job.session).await? else {
            return Ok(TurnOutcome::default());
        };
        if w.next_at > self.clock.now() {
            return Ok(TurnOutcome::default());
        }
        info!(agent_id = %w.agent_id, attempts = w.attempts, since = %w.since, "trying again a turn that waits on the model");
        self.run(&w.signals).await
    }

    /// The model did not answer `pending`: the turn waits (kept, to be tried again after
    /// a growing gap), or, past the agent's patience, is answered with an apology.
    async fn wait(
        &self,
        agent: &Agent,
        waiting: Option<crate::domain::WaitingTurn>,
        pending: Vec<Signal>,
        why: String,
        mut outcome: TurnOutcome,
    ) -> Result<TurnOutcome, EngineError> {
        let now = self.clock.now();
        let session = pending[0].session.clone();
        let since = waiting.as_ref().map_or(now, |w| w.since);
        if now.duration_since(since) >= self.settings.patience {
            warn!(since = %since, error = %why, "the model has not answered this turn for as long as it may wait: it is answered with an apology");
            let asked = Asked {
                text: format!(
                    "I could not answer this: the model I think with has not answered since {}. Please say it again later.",
                    since.strftime("%Y-%m-%d %H:%M UTC")
                ),
                provider: "pulse".into(),
                model: "none".into(),
                failed: Some(format!(
                    "the model did not answer for {:#}: {why}",
                    now.duration_since(since)
                )),
                ..Asked::default()
            };
            self.answer(agent, &pending, Some(asked), &mut outcome)
                .await?;
            self.store.delete_waiting(&agent.id, &session).await?;
            return Ok(outcome);
        }
        let next = match waiting {
            Some(w) => w.failed_again(pending, why.clone(), now),
            None => match crate::domain::WaitingTurn::first(pending, why.clone(), now) {
                Some(w) => w,
                None => return Ok(outcome),
            },
        };
        warn!(error = %why, attempts = next.attempts, next_at = %next.next_at, "the model did not answer: the turn waits and is tried again");
        let mut next = next;
        if !next.told && next.attempts >= crate::domain::WaitingTurn::TELL_AFTER {
            next.told = self.tell_delayed(agent, &next, now).await;
        }
        self.store.put_waiting(&next).await?;
        outcome.waiting = true;
        Ok(outcome)
    }

    /// Finishes the turns an earlier delivery of these signals began: the rest of their
    /// delivery, and their hooks again (the same delivery ids: each is sent once), since
    /// the step that wrote a turn may have stopped before its hooks were queued.
    async fn resume(
        &self,
        agent_id: &AgentId,
        signals: &[Signal],
        answered: &[(SignalId, TurnId)],
        outcome: &mut TurnOutcome,
    ) -> Result<(), EngineError> {
        for (_, turn_id) in answered {
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
        Ok(())
    }

    /// Answers `pending` with a new turn: the reply (from the model, or the budget's
    /// notice, and what its steering commands did), the turn written with its messages,
    /// then delivered.
    async fn answer(
        &self,
        agent: &Agent,
        pending: &[Signal],
        preset: Option<Asked>,
        outcome: &mut TurnOutcome,
    ) -> Result<(), EngineError> {
        let now = self.clock.now();
        let turn_id = TurnId::for_signal(&pending[0].id);
        tracing::Span::current().record("turn_id", tracing::field::display(&turn_id));
        let user_spoke = pending.iter().any(is_interaction);
        if user_spoke && agent.auto_paused_since.is_some() {
            crate::engine::silence::wake(self.store.as_ref(), self.hooks.as_ref(), agent, now)
                .await?;
        }
        if let Some(asked) = preset {
            let turn = self
                .write(agent, pending, asked, None, now, outcome.trace_id.clone())
                .await?;
            outcome.turns.push(turn.id.clone());
            if turn.status == TurnStatus::Delivering {
                let (sent, delivered) = self.deliver(turn).await?;
                outcome.parts_sent += sent;
                self.emit_sent(agent, &delivered).await?;
            }
            return Ok(());
        }
        let (steered, talk) = self.steer(agent, pending).await;
        // Steering alone asks no model: the day's budget does not bear on it.
        let spent = match talk.is_empty() {
            true => None,
            false => budget::exhausted(self.store.as_ref(), agent, now).await?,
        };
        let mut asked = if talk.is_empty() {
            Asked {
                provider: "pulse".into(),
                model: "steering".into(),
                ..Asked::default()
            }
        } else {
            self.reply(agent, &talk, &turn_id, spent.as_ref(), outcome, now)
                .await?
        };
        if !steered.is_empty() {
            asked.text = match asked.text.is_empty() {
                true => steered.join("\n"),
                false => format!("{}\n\n{}", steered.join("\n"), asked.text),
            };
        }
        let turn = self
            .write(
                agent,
                pending,
                asked,
                spent.as_ref(),
                now,
                outcome.trace_id.clone(),
            )
            .await?;
        outcome.turns.push(turn.id.clone());
        if turn.status == TurnStatus::Delivering {
            let (sent, delivered) = self.deliver(turn).await?;
            outcome.parts_sent += sent;
            self.emit_sent(agent, &delivered).await?;
        }
        if user_spoke {
            // The quiet period before the next heartbeat counts from the end of the turn.
            self.store
                .record_interaction(&agent.id, self.clock.now())
                .await?;
        }
        let waited = self.clock.now().duration_since(pending[0].created_at);
        crate::meter::turn_answered(waited.try_into().unwrap_or_default());
        Ok(())
    }

    /// The reply to `talk` (the pending signals that are not steering commands): from
    /// the model, or the budget's notice when today's tokens are spent.
    async fn reply(
        &self,
        agent: &Agent,
        talk: &[Signal],
        turn_id: &TurnId,
        spent: Option<&budget::Today>,
        outcome: &mut TurnOutcome,
        now: Timestamp,
    ) -> Result<Asked, EngineError> {
        let user_spoke = talk.iter().any(is_interaction);
        Ok(match spent {
            None => {
                outcome.asked_model = true;
                let _typing = self.typing(talk).await;
                let (mut context, prefix, beat, unanswered) =
                    self.context(agent, talk, now).await?;
                // Only a turn whose messages got no reply can have been taken over.
                let mut taken = match unanswered {
                    true => taken_over::taken_over(self.store.as_ref(), &agent.id).await?,
                    false => taken_over::TakenOver::default(),
                };
                context.extend(std::mem::take(&mut taken.messages));
                // Memories the turn's tools keep get ids from the turn and its first
                // signal's time, so a redelivered turn keeps each once.
                let first_ms = talk[0].created_at.as_millisecond().max(0) as u64;
                // What this turn answers already: a user message later than this
                // supersedes it.
                let known = talk
                    .iter()
                    .filter(|s| is_interaction(s))
                    .map(|s| s.created_at)
                    .chain(agent.last_interaction_at)
                    .max();
                self.ask(
                    agent,
                    (context, prefix),
                    turn_id,
                    (first_ms, taken),
                    (beat, user_spoke),
                    known,
                )
                .await?
            }
            Some(today) => {
                budget::fire_exhausted(self.store.as_ref(), self.hooks.as_ref(), agent, today, now)
                    .await?;
                let why = budget::reason(agent, today, now);
                info!(reason = %why, "no model call for this turn");
                if user_spoke && !today.marked(Spend::NOTICE) {
                    Asked {
                        text: budget::notice(agent, now),
                        provider: "pulse".into(),
                        ..Asked::default()
                    }
                } else {
                    // Told once today already (or nothing a user said): no reply.
                    Asked {
                        provider: "pulse".into(),
                        failed: Some(format!("not answered: {why}")),
                        ..Asked::default()
                    }
                }
            }
        })
    }

    /// Runs the steering commands among `pending` (see [`commands`]): the lines that
    /// answer them, and the signals left for the model.
    async fn steer(&self, agent: &Agent, pending: &[Signal]) -> (Vec<String>, Vec<Signal>) {
        let mut said = Vec::new();
        let mut talk = Vec::new();
        for s in pending {
            let Some(command) = commands::parse(s) else {
                talk.push(s.clone());
                continue;
            };
            said.push(match (command, &self.lifecycle) {
                _ if !commands::owner(agent, s) => {
                    info!(signal_id = %s.id, "a steering command from someone who does not own the agent: refused");
                    "Only my owner can steer me (wake, pause, snooze, quiet hours).".to_owned()
                }
                (Err(why), _) => why,
                (Ok(c), Some(lifecycle)) => {
                    info!(signal_id = %s.id, command = ?c, "steering command");
                    commands::run(lifecycle, agent, c).await
                }
                (Ok(_), None) => "Steering is not available here.".to_owned(),
            });
        }
        (said, talk)
    }

    /// The turn's context — the history, what the agent knows that bears on the new
    /// messages, its beats, and the pictures sent with the messages (on its user
    /// message) — the beat it is at, and whether the newest message of the history is
    /// the user's, left without a reply (by a turn a newer message dropped, maybe).
    async fn context(
        &self,
        agent: &Agent,
        pending: &[Signal],
        now: Timestamp,
    ) -> Result<(Vec<ChatMessage>, usize, u64, bool), EngineError> {
        let history = self
            .store
            .recent_messages(&agent.id, prompt::HISTORY_MESSAGES)
            .await?;
        let newest = self.store.heartbeats_page(&agent.id, None, 1).await?;
        let said: Vec<String> = pending.iter().map(Signal::text).collect();
        let beats = turn_beats(newest.first(), &history);
        let beat = beats.map_or(0, |b| b.beat);
        let known = memory::known(
            &self.memories,
            agent,
            &said.join("\n"),
            beat,
            memory::PROMPT_TOKENS,
            now,
        )
        .await?;
        // From two thirds of a dollar budget on, the model reads what is left.
        let left = super::dollars::left_line(self.store.as_ref(), agent, now).await?;
        let known = match (known, left) {
            (Some(k), Some(l)) => Some(format!("{k}\n{l}")),
            (k, l) => k.or(l),
        };
        let (mut context, prefix) = build_context(
            agent,
            &history,
            pending,
            beats,
            known.as_deref(),
            now,
            (prompt::HISTORY_TOKENS, prompt::HISTORY_MESSAGES),
        );
        let images = self.images_for(agent, pending, now).await;
        if !images.is_empty()
            && let Some(ChatMessage::User { images: slot, .. }) = context
                .iter_mut()
                .rev()
                .find(|m| matches!(m, ChatMessage::User { .. }))
        {
            *slot = images;
        }
        let unanswered = history
            .first()
            .is_some_and(|m| m.role == crate::domain::Role::User);
        Ok((context, prefix, beat, unanswered))
    }

    /// Writes the turn with its messages and the marks that its signals are answered
    /// (or finds the one an earlier delivery wrote), and emits MESSAGE_RECEIVED. A
    /// turn with nothing to say is recorded answered, with nothing to deliver.
    async fn write(
        &self,
        agent: &Agent,
        pending: &[Signal],
        asked: Asked,
        spent: Option<&budget::Today>,
        now: Timestamp,
        trace_id: Option<String>,
    ) -> Result<Turn, EngineError> {
        let silent = asked.text.is_empty();
        let target = target(agent, pending, now, &self.channels);
        let parts = if silent {
            Vec::new()
        } else {
            split_message(&asked.text, self.channels.limit_for(&target))
        };
        let mut turn = Turn {
            id: TurnId::for_signal(&pending[0].id),
            agent_id: agent.id.clone(),
            session: pending[0].session.clone(),
            signals: pending.iter().map(|s| s.id.clone()).collect(),
            status: if silent {
                TurnStatus::Done
            } else {
                TurnStatus::Delivering
            },
            parts,
            delivered: 0,
            target,
            discord_message_ids: Vec::new(),
            cost_usd: self
                .settings
                .prices
                .of(&asked.model)
                .filter(|_| asked.usage.total() > 0)
                .map(|p| crate::domain::Usd::from_dollars(p.cost(&asked.usage))),
            provider: asked.provider,
            model: asked.model,
            usage: asked.usage,
            steps: kept_steps(asked.steps),
            error: asked.failed,
            created_at: now,
            completed_at: silent.then_some(now),
            requests: None,
            spoken_by: pending
                .iter()
                .filter(|s| s.kind == SignalKind::Heartbeat)
                .find_map(|s| s.meta.heartbeat_id.clone()),
            trace_id,
            seen: None,
        };
        let messages = persisted(&turn, pending, &asked.text, now);
        crate::tally::stamp(&mut turn.requests);
        match self.store.begin_turn(&turn, &messages).await? {
            TurnStart::Created => {
                budget::record(
                    self.store.as_ref(),
                    agent,
                    now,
                    turn.id.as_str(),
                    turn.usage.total(),
                )
                .await;
                if let Some(today) = spent
                    && !silent
                {
                    budget::mark_notice(self.store.as_ref(), agent, today, now).await;
                }
            }
            TurnStart::Exists(existing) => {
                info!(turn_id = %existing.id, "the turn was written by an earlier delivery; resuming it");
                turn = *existing;
            }
        }
        self.emit_received(agent, &turn, pending).await?;
        Ok(turn)
    }
}
