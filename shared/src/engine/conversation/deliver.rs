//! Delivering a turn's reply, part by part, each recorded; and the hooks a turn emits.

use tracing::{error, info, warn};

use super::*;
use crate::domain::{
    Agent, HookData, HookType, ReplyTarget, Signal, Turn, TurnStatus, Undelivered,
};
use crate::error::{ChannelError, EngineError, chain};

/// Longest the first "typing…" may hold up a turn.
const TYPING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// "typing…" renewed in the background until dropped.
pub(super) struct Typing(Option<tokio::task::JoinHandle<()>>);

impl Drop for Typing {
    fn drop(&mut self) {
        if let Some(renewal) = self.0.take() {
            renewal.abort();
        }
    }
}

impl Conversation {
    /// Shows "typing…" where the newest message that came from a chat came from (an
    /// interaction shows its own "thinking…"): once now, then as often as its platform
    /// needs until the returned guard is dropped; nothing where it shows none for a bot.
    /// A failure is only logged: the reply matters, not the indicator.
    pub(super) async fn typing(&self, pending: &[Signal]) -> Typing {
        let Some((channel, place)) = pending
            .iter()
            .rev()
            .find(|s| s.meta.message_id.is_some())
            .and_then(Signal::place)
            .and_then(|p| Some((self.channels.for_target(&p)?.clone(), p)))
        else {
            return Typing(None);
        };
        let Some(every) = channel.typing_every() else {
            return Typing(None);
        };
        let shown = tokio::time::timeout(TYPING_WAIT, channel.typing(&place)).await;
        if let Ok(Err(e)) = &shown {
            warn!(error = %chain(e), "cannot show typing in {}", channel.kind());
        }
        Typing(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = channel.typing(&place).await {
                    warn!(error = %chain(&e), "cannot renew typing in {}", channel.kind());
                }
            }
        })))
    }

    /// Tells the person, where the reply would go, that it is delayed: the model does not
    /// answer. Whether they were told (or there is nowhere to tell them: a message over
    /// the API or the dashboard reads as waiting there); a failure is logged and tried
    /// at the next try. The notice is keyed by the waiting turn, so a platform that takes
    /// a key (Discord) takes a notice sent twice once.
    pub(super) async fn tell_delayed(
        &self,
        agent: &Agent,
        waiting: &crate::domain::WaitingTurn,
        now: jiff::Timestamp,
    ) -> bool {
        const NOTICE: &str = "The model I think with is not answering right now. I have your message, and I will reply as soon as it is back.";
        let Some(turn_id) = waiting.turn_id() else {
            return true;
        };
        let to = target(agent, &waiting.signals, now, &self.channels);
        let Some(channel) = self.channels.for_target(&to) else {
            return true;
        };
        let told = channel.notify(&to, &turn_id, NOTICE).await;
        match told {
            Ok(()) => {
                info!(turn_id = %turn_id, "told the person the reply is delayed");
                true
            }
            Err(e) => {
                warn!(error = %chain(&e), "cannot tell the person the reply is delayed; tried again at the next try");
                false
            }
        }
    }

    /// Records the turn as it stands, with the requests made since its last write.
    async fn save(&self, turn: &mut Turn) -> Result<(), crate::error::StoreError> {
        crate::tally::stamp(&mut turn.requests);
        self.store.update_turn(turn).await
    }

    /// Delivers a turn's remaining parts, recording each; returns how many were sent, and
    /// the turn as recorded.
    pub(super) async fn deliver(&self, mut turn: Turn) -> Result<(usize, Turn), EngineError> {
        let mut sent = 0;
        while (turn.delivered as usize) < turn.parts.len() {
            let i = turn.delivered as usize;
            let part = turn.parts[i].clone();
            let result = match self.channels.for_target(&turn.target) {
                Some(channel) => channel
                    .send_part(&turn.target, &turn.id, i, &part)
                    .await
                    .map(Some)
                    .map_err(|e| (channel.kind().title(), e)),
                None if turn.target == ReplyTarget::Unknown => {
                    Err(("Pulse", ChannelError::UnknownTarget))
                }
                None => {
                    // Ids and sizes, not what was said: message texts stay out of logs.
                    info!(turn_id = %turn.id, part = i + 1, chars = part.chars().count(), "reply stored (no chat platform configured for it)");
                    Ok(None)
                }
            };
            match result {
                Ok(id) => {
                    sent += usize::from(id.is_some());
                    turn.discord_message_ids.extend(id);
                    turn.delivered += 1;
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
                Err((title, e)) => {
                    let why = format!("{title} did not take part {}: {}", i + 1, chain(&e));
                    self.undelivered(&mut turn, why, e.hopeless()).await?;
                    return Ok((sent, turn));
                }
            }
        }
        if sent > 0 {
            info!(turn_id = %turn.id, parts = sent, "reply delivered");
        }
        Ok((sent, turn))
    }

    /// The channel did not take `turn`'s reply, for `why`: kept as undelivered, and
    /// tried again later by the sweep while the session goes on — or, after its last try
    /// (or at once, `hopeless`), given up on: the turn is FAILED and MESSAGE_UNDELIVERABLE
    /// told. The record is written before the turn, so a crash between the two leaves a
    /// turn that is tried again rather than one nobody tries.
    async fn undelivered(
        &self,
        turn: &mut Turn,
        why: String,
        hopeless: bool,
    ) -> Result<(), EngineError> {
        let now = self.clock.now();
        let record = match self.store.get_undelivered(&turn.agent_id, &turn.id).await? {
            Some(u) => u.failed_again(why.clone(), hopeless, now),
            None => Undelivered::first(
                (turn.agent_id.clone(), turn.session.clone(), turn.id.clone()),
                why.clone(),
                hopeless,
                now,
            ),
        };
        self.store.put_undelivered(&record).await?;
        crate::meter::reply_undelivered(record.undeliverable());
        if !record.undeliverable() {
            warn!(turn_id = %turn.id, attempts = record.attempts, next_at = %record.next_at, error = %why, "the reply was not delivered: it is tried again later, and the session goes on");
            return Ok(());
        }
        error!(turn_id = %turn.id, attempts = record.attempts, error = %why, "the reply could not be delivered: the turn is recorded FAILED, and kept as undeliverable");
        self.give_up(turn, &record).await
    }

    /// Tells MESSAGE_UNDELIVERABLE for `turn`, then records it FAILED. In that order:
    /// a failure between the two leaves the turn DELIVERING under a record given up
    /// on, which the next try finishes (the hook's delivery id is the same, so it is
    /// told once).
    async fn give_up(&self, turn: &mut Turn, record: &Undelivered) -> Result<(), EngineError> {
        if self.hooks.is_some()
            && let Some(agent) = self.store.get_agent(&turn.agent_id).await?
        {
            let data = HookData::message_undeliverable(turn, record.attempts, &record.reason);
            self.emit(&agent, turn, HookType::MESSAGE_UNDELIVERABLE, "TURN", data)
                .await?;
        }
        turn.status = TurnStatus::Failed;
        turn.error = Some(format!(
            "undeliverable after {} {}: {}",
            record.attempts,
            if record.attempts == 1 { "try" } else { "tries" },
            record.reason
        ));
        turn.completed_at = Some(self.clock.now());
        self.save(turn).await?;
        // What a heartbeat said and nobody got: that heartbeat did not reach anyone.
        if let Some(heartbeat) = &turn.spoken_by {
            let why = format!("what it said was not delivered: {}", record.reason);
            self.store.mark_undeliverable(heartbeat, &why).await?;
            crate::meter::heartbeat_outcome(crate::domain::OutcomeKind::Undeliverable.as_str());
        }
        Ok(())
    }

    /// Delivers again a turn whose reply the channel did not take, when it is due (the
    /// sweep sends it). Nothing when it was delivered meanwhile (a redelivery of its
    /// signals resumed it), given up on, or not due yet.
    pub async fn redeliver(
        &self,
        job: &crate::domain::RedeliverJob,
    ) -> Result<TurnOutcome, EngineError> {
        let mut outcome = TurnOutcome::default();
        let Some(u) = self
            .store
            .get_undelivered(&job.agent_id, &job.turn_id)
            .await?
        else {
            return Ok(outcome);
        };
        if u.next_at > self.clock.now() {
            return Ok(outcome);
        }
        let turn = self.store.get_turn(&job.agent_id, &job.turn_id).await?;
        let turn = turn.filter(|t| t.status == TurnStatus::Delivering);
        if u.undeliverable() {
            // Given up on, but not yet recorded so: finish that.
            if let Some(mut turn) = turn {
                self.give_up(&mut turn, &u).await?;
            }
            return Ok(outcome);
        }
        let Some(turn) = turn else {
            self.store
                .delete_undelivered(&job.agent_id, &job.turn_id)
                .await?;
            return Ok(outcome);
        };
        info!(turn_id = %turn.id, attempts = u.attempts, since = %u.since, "delivering again a reply the channel did not take");
        outcome.turns.push(turn.id.clone());
        let (sent, delivered) = self.deliver(turn).await?;
        outcome.parts_sent += sent;
        // Every part delivered: no longer undelivered. Otherwise `deliver` kept the
        // record, retrying or given up on.
        if delivered.delivered as usize == delivered.parts.len() {
            self.store
                .delete_undelivered(&job.agent_id, &job.turn_id)
                .await?;
            if let Some(agent) = self.store.get_agent(&job.agent_id).await? {
                self.emit_sent(&agent, &delivered).await?;
            }
        }
        Ok(outcome)
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
        let emission = crate::engine::hooks::Emission {
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

    /// MESSAGE_RECEIVED for `turn`, which took in `signals`: none when they are all the
    /// heartbeat's own thoughts.
    pub(super) async fn emit_received(
        &self,
        agent: &Agent,
        turn: &Turn,
        signals: &[Signal],
    ) -> Result<(), EngineError> {
        // A heartbeat's thought is the agent's own: not a message it received.
        let received: Vec<Signal> = signals
            .iter()
            .filter(|s| s.kind != SignalKind::Heartbeat)
            .cloned()
            .collect();
        let Some(first) = received.first() else {
            return Ok(());
        };
        let trigger = first.kind.as_str().to_ascii_uppercase();
        let data = HookData::message_received(turn, &received);
        self.emit(agent, turn, HookType::MESSAGE_RECEIVED, &trigger, data)
            .await
    }

    /// MESSAGE_SENT for `turn`, once its reply has reached its platform (or was stored).
    pub(super) async fn emit_sent(&self, agent: &Agent, turn: &Turn) -> Result<(), EngineError> {
        if turn.status != TurnStatus::Done || turn.delivered == 0 {
            return Ok(());
        }
        let data = HookData::message_sent(turn, agent.discord_channel.clone());
        self.emit(agent, turn, HookType::MESSAGE_SENT, "TURN", data)
            .await
    }
}
