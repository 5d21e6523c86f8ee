//! Delivering a turn's reply, part by part, each recorded; and the hooks a turn emits.

use tracing::{error, info};

use super::*;
use crate::domain::{Agent, HookData, HookType, ReplyTarget, Signal, Turn, TurnId, TurnStatus};
use crate::error::{DiscordError, EngineError, chain};

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

    /// MESSAGE_RECEIVED for `turn`, which took in `signals`.
    pub(super) async fn emit_received(
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
    pub(super) async fn emit_sent(&self, agent: &Agent, turn: &Turn) -> Result<(), EngineError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_nonce_fits_discords_limit_and_differs_per_part() {
        let t = TurnId::parse("tn_01JABCDEFGHJKMNPQRSTVWXYZ0").unwrap();
        assert!(nonce(&t, 0).len() <= 25);
        assert_ne!(nonce(&t, 0), nonce(&t, 1));
    }
}
