//! A reply the channel would not take: a turn's delivery that failed, tried again
//! later without holding up its session, then given up on and kept as a dead letter.
//!
//! A failed delivery used to fail the turn's job, so the queue delivered it again —
//! and the session's group waited behind it: every later message and heartbeat thought
//! of the session queued up while Discord (or a permission on a channel) was broken. It
//! is a record instead: the job finishes, the session goes on, and the sweep sends the
//! turn to be delivered again at [`Undelivered::next_at`], with growing gaps, for
//! [`Undelivered::MAX_TRIES`] tries (about 45 minutes); then it is
//! [`UndeliveredState::Undeliverable`], listed by `pulse deliveries list` and told by a
//! MESSAGE_UNDELIVERABLE hook. The reply itself is in the conversation all along (the
//! dashboard and the messages API show it).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{AgentId, SessionId, TurnId, WaitingTurn};

/// Where an undelivered reply stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UndeliveredState {
    /// Tried again at `next_at`.
    Retrying,
    /// Given up on: a dead letter.
    Undeliverable,
}

impl UndeliveredState {
    /// Its name, as listed.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retrying => "retrying",
            Self::Undeliverable => "undeliverable",
        }
    }
}

/// A turn whose reply the channel did not take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Undelivered {
    /// The agent.
    pub agent_id: AgentId,
    /// The session whose group delivers it.
    pub session: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Tries that failed so far.
    pub attempts: u32,
    /// When the first try failed.
    pub since: Timestamp,
    /// When it is tried again (for one still retrying).
    pub next_at: Timestamp,
    /// Why the last try failed.
    pub reason: String,
    /// Retrying, or given up on.
    pub state: UndeliveredState,
}

impl Undelivered {
    /// Tries before a reply is given up on: the first and seven more, 30 s, 1, 2, 4, 8
    /// and 15 minutes apart and 15 again: about 45 minutes.
    pub const MAX_TRIES: u32 = 8;

    /// The first failed try of `turn_id`'s reply at `now`, for `reason`; given up on at
    /// once when trying again cannot help (`hopeless`: a reply the channel refuses as
    /// malformed, or no channel configured).
    pub fn first(
        (agent_id, session, turn_id): (AgentId, SessionId, TurnId),
        reason: String,
        hopeless: bool,
        now: Timestamp,
    ) -> Self {
        Self {
            agent_id,
            session,
            turn_id,
            attempts: 0,
            since: now,
            next_at: now,
            reason: String::new(),
            state: UndeliveredState::Retrying,
        }
        .failed_again(reason, hopeless, now)
    }

    /// Another failed try at `now`: counted, due again after the next gap, or given up
    /// on after the last try (or at once, `hopeless`).
    pub fn failed_again(mut self, reason: String, hopeless: bool, now: Timestamp) -> Self {
        self.attempts += 1;
        self.reason = reason;
        if hopeless || self.attempts >= Self::MAX_TRIES {
            self.state = UndeliveredState::Undeliverable;
            self.next_at = now;
        } else {
            self.next_at = now
                .saturating_add(WaitingTurn::backoff(self.attempts))
                .unwrap_or(now);
        }
        self
    }

    /// Whether it is given up on.
    pub fn undeliverable(&self) -> bool {
        self.state == UndeliveredState::Undeliverable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_tried_eight_times_over_about_three_quarters_of_an_hour_then_given_up() {
        let now = Timestamp::UNIX_EPOCH;
        let ids = (
            AgentId::parse("ag_01J00000000000000000000000").unwrap(),
            SessionId::parse("se_01J00000000000000000000000").unwrap(),
            TurnId::parse("tn_01J00000000000000000000000").unwrap(),
        );
        let mut u = Undelivered::first(ids.clone(), "503".into(), false, now);
        let mut at = now;
        while !u.undeliverable() {
            assert_eq!(u.state, UndeliveredState::Retrying);
            at = u.next_at;
            u = u.failed_again("503 again".into(), false, at);
        }
        assert_eq!(u.attempts, Undelivered::MAX_TRIES);
        let took = at.duration_since(now).as_mins();
        assert!((40..=50).contains(&took), "{took} minutes");
        // A reply that cannot be sent however often it is tried is given up at once.
        let bad = Undelivered::first(ids, "400".into(), true, now);
        assert!(bad.undeliverable() && bad.attempts == 1);
    }
}
