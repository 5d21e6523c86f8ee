//! Whether the person saw a reply: a reaction to one of its Discord messages, or a reply
//! to one, marks its turn seen ([`Turn::seen`]). The first sign is kept: a second
//! reaction, or a reply after a reaction, changes nothing.
//!
//! The turn is found among the agent's [`SEEN_SCAN`] most recent turns, by the Discord
//! messages it wrote. A reply still being delivered (some of its parts not sent yet) is
//! not marked: its delivery writes the whole turn as it goes, and a mark written between
//! two of its writes would be lost, or would set its progress back.

use jiff::Timestamp;
use tracing::info;

use crate::domain::{AgentId, Seen, Turn, TurnId, TurnStatus};
use crate::error::StoreError;
use crate::ports::Store;

/// The agent's most recent turns looked through for the message a sign is about. People
/// react to, and reply to, what was said lately, so the recent turns hold it; a sign
/// about an older message marks nothing. Kept small: a turn can hold its tool steps,
/// and on DynamoDB each sign reads these turns.
pub const SEEN_SCAN: usize = 50;

/// Marks seen, at `at` and by `how` (`reaction 👍`, `reply`), the reply of `agent` that
/// wrote Discord message `discord_message_id`, unless it was seen already. The turn
/// marked, or none: no recent turn wrote that message, it was seen before, or its
/// delivery is still under way.
pub async fn mark_seen(
    store: &dyn Store,
    agent: &AgentId,
    discord_message_id: &str,
    how: &str,
    at: Timestamp,
) -> Result<Option<TurnId>, StoreError> {
    let turns = store.list_turns(agent, SEEN_SCAN).await?;
    let Some(mut turn) = turns.into_iter().find(|t| wrote(t, discord_message_id)) else {
        return Ok(None);
    };
    if turn.seen.is_some() || turn.status == TurnStatus::Delivering {
        return Ok(None);
    }
    turn.seen = Some(Seen {
        at,
        by: how.to_owned(),
    });
    store.update_turn(&turn).await?;
    info!(agent_id = %agent, turn_id = %turn.id, by = how, "the person saw the reply");
    Ok(Some(turn.id))
}

/// Whether `turn` wrote Discord message `id`.
fn wrote(turn: &Turn, id: &str) -> bool {
    turn.discord_message_ids.iter().any(|m| m == id)
}
