//! Signals in: a user message (from Discord, the CLI, a webhook) is queued on its
//! session's group, behind any heartbeat job already there.

use tracing::info;

use crate::domain::{OutgoingTask, Signal};
use crate::error::StoreError;
use crate::ports::{SessionQueue, Store};

/// Queues a signal. A user message first records the interaction on the agent: that is
/// the cancel mark a running heartbeat checks between its steps (it started before the
/// interaction, so it yields), the mark that drops a reply being written to an earlier
/// message (the next turn answers both), and the start of the agent's quiet period.
///
/// A steering command (`/snooze 2h`, `/pause`, …, anyone's, refused or not) is no
/// interaction: it is answered without the model and asks nothing of the reply being
/// written, so it must not drop it, or the question that reply answers would never be
/// answered.
pub async fn submit(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    signal: Signal,
) -> Result<(), StoreError> {
    if super::conversation::is_interaction(&signal) {
        store
            .record_interaction(&signal.agent_id, signal.created_at)
            .await?;
    }
    let id = signal.id.clone();
    let report = queue.send(&[OutgoingTask::signal(signal)]).await?;
    if let Some((_, why)) = report.failed.into_iter().next() {
        return Err(StoreError::backend(
            "queue",
            "send signal",
            format!("signal {id} was not queued: {why}"),
        ));
    }
    info!(signal_id = %id, "signal queued");
    Ok(())
}
