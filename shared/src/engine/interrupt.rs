//! A model call the user's next message makes pointless is dropped, not awaited.
//!
//! Every user message records its arrival on the agent (`last_interaction_at`) before it
//! is queued, on any channel. While a model call is in flight, [`unless_user_speaks`]
//! reads that mark every [`LOOK_EVERY`]; when it moves past what the caller already
//! knows about, the call's future is dropped, which closes its HTTP request: the
//! provider stops generating and no more output tokens are billed. The caller then
//! records what it spent (an estimate: the provider's usage never arrives for a
//! dropped call) and lets the newer message be answered.

use std::time::Duration;

use jiff::Timestamp;

use crate::domain::{AgentId, ChatMessage, Usage};
use crate::ports::Store;

/// How often the mark is read during a model call (one read of the agent each time).
pub const LOOK_EVERY: Duration = Duration::from_millis(300);

/// How a raced call ended.
pub enum Raced<T> {
    /// It finished first.
    Done(T),
    /// A user message arrived at this time first; the call was dropped.
    Interrupted(Timestamp),
}

/// What stops a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopOn {
    /// A user message (a conversation turn's call).
    UserMessage,
    /// A user message, or its operator cancelling the heartbeat (a heartbeat's call).
    UserOrCancel,
}

/// Runs `call` unless a user message newer than `known` reaches `agent` first (or, with
/// [`StopOn::UserOrCancel`], a cancel asked after `known`).
pub async fn unless_user_speaks<T>(
    store: &dyn Store,
    agent: &AgentId,
    known: Option<Timestamp>,
    stop: StopOn,
    call: impl Future<Output = T>,
) -> Raced<T> {
    tokio::select! {
        biased;
        done = call => Raced::Done(done),
        at = stopped_after(store, agent, known, stop) => Raced::Interrupted(at),
    }
}

/// Resolves when the agent's mark is later than `known`. A failed read is not an
/// interruption: the call goes on.
async fn stopped_after(
    store: &dyn Store,
    agent: &AgentId,
    known: Option<Timestamp>,
    stop: StopOn,
) -> Timestamp {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let Ok(Some(a)) = store.get_agent(agent).await else {
            continue;
        };
        let cancel = match stop {
            StopOn::UserMessage => None,
            StopOn::UserOrCancel => a.cancel_requested_at,
        };
        if let Some(at) = a.last_interaction_at.into_iter().chain(cancel).max()
            && known.is_none_or(|k| at > k)
        {
            return at;
        }
    }
}

/// What a dropped call is counted as: its prompt's tokens (estimated at four characters
/// a token), no output.
pub fn estimated_usage(messages: &[ChatMessage]) -> Usage {
    let chars: usize = messages.iter().map(|m| m.text().map_or(0, str::len)).sum();
    Usage {
        input_tokens: (chars as u64).div_ceil(4),
        ..Usage::default()
    }
}
