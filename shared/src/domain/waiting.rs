//! A turn waiting on the model: the signals of a session the model could not answer
//! (it was unreachable, or answered 429 or 5xx), kept until it answers again.
//!
//! A model outage would otherwise fail the turn's job until the queue dead-lettered it
//! (five tries in under a minute), and the person's message would be gone from the
//! conversation. A waiting turn is a record instead: the sweep sends it to be tried
//! again at [`WaitingTurn::next_at`], with growing gaps ([`WaitingTurn::backoff`]),
//! for as long as the agent's patience lasts; a newer message of the session joins it,
//! and one reply answers them all.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::{AgentId, SessionId, Signal, TurnId};

/// The first gap before a waiting turn is tried again; each try doubles it.
const FIRST_WAIT: SignedDuration = SignedDuration::from_secs(30);

/// The longest gap between two tries.
const LONGEST_WAIT: SignedDuration = SignedDuration::from_mins(15);

/// A session's signals the model has not answered yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitingTurn {
    /// The agent.
    pub agent_id: AgentId,
    /// The session.
    pub session: SessionId,
    /// The signals, oldest first.
    pub signals: Vec<Signal>,
    /// When the model first failed them.
    pub since: Timestamp,
    /// Tries made so far.
    pub attempts: u32,
    /// When it is tried again.
    pub next_at: Timestamp,
    /// Why the last try failed.
    pub reason: String,
    /// Whether the person was told, in the channel they wrote in, that the answer is
    /// delayed (once, from the [`WaitingTurn::TELL_AFTER`]th try).
    #[serde(default)]
    pub told: bool,
}

impl WaitingTurn {
    /// The try from which the person is told the answer is delayed: the second, about
    /// 30 s after the first.
    pub const TELL_AFTER: u32 = 2;

    /// The gap after `attempts` tries: 30 s, 1 min, 2 min … up to 15 min.
    pub fn backoff(attempts: u32) -> SignedDuration {
        let doubled = FIRST_WAIT.as_secs() << attempts.saturating_sub(1).min(10);
        SignedDuration::from_secs(doubled).min(LONGEST_WAIT)
    }

    /// The turn that will answer it (the turn of its first signal).
    pub fn turn_id(&self) -> Option<TurnId> {
        self.signals.first().map(|s| TurnId::for_signal(&s.id))
    }

    /// `signals` joined to the waiting ones, each once, in the order they were made.
    pub fn joined(&self, signals: &[Signal]) -> Vec<Signal> {
        let mut all = self.signals.clone();
        for s in signals {
            if !all.iter().any(|w| w.id == s.id) {
                all.push(s.clone());
            }
        }
        all.sort_by_key(|s| (s.created_at, s.id.to_string()));
        all
    }

    /// Another failed try at `now`, for `reason`: counted, and due again after the
    /// next gap.
    pub fn failed_again(mut self, signals: Vec<Signal>, reason: String, now: Timestamp) -> Self {
        self.signals = signals;
        self.attempts += 1;
        self.reason = reason;
        self.next_at = now
            .saturating_add(Self::backoff(self.attempts))
            .unwrap_or(now);
        self
    }

    /// The first failed try of `signals` at `now`.
    pub fn first(signals: Vec<Signal>, reason: String, now: Timestamp) -> Option<Self> {
        let first = signals.first()?;
        Some(
            Self {
                agent_id: first.agent_id.clone(),
                session: first.session.clone(),
                since: now,
                attempts: 0,
                next_at: now,
                reason: String::new(),
                signals: Vec::new(),
                told: false,
            }
            .failed_again(signals, reason, now),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_doubles_from_thirty_seconds_to_fifteen_minutes() {
        let gaps: Vec<i64> = (1..=8).map(|n| WaitingTurn::backoff(n).as_secs()).collect();
        assert_eq!(gaps, [30, 60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(WaitingTurn::backoff(1_000).as_secs(), 900);
    }
}
