//! Messages on the sessions queue. Versioned and tagged, so a worker can tell a message
//! from a newer release apart from a damaged one, and later issues can add kinds (user
//! signals) without breaking messages already queued.

use serde::{Deserialize, Serialize};

use super::agent::Heartbeat;
use super::conversation::Signal;
use super::ids::SessionId;

/// The envelope version this release writes and reads.
pub const TASK_VERSION: u32 = 1;

/// One unit of work of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionTask {
    /// Run a claimed heartbeat.
    Heartbeat(HeartbeatJob),
    /// Answer a signal (a user message, a spoken heartbeat thought, a webhook).
    Signal(SignalJob),
}

/// A signal to answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignalJob {
    /// The signal.
    pub signal: Signal,
}

/// A claimed heartbeat, as the claim returned it, so the worker does not read it again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatJob {
    /// The heartbeat record after the claim (status EXECUTING, `claim` = this claim).
    pub heartbeat: Heartbeat,
}

/// The body of a queue message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskEnvelope {
    /// Format version.
    pub v: u32,
    /// How many times this task was sent (1 on the first send).
    pub attempt: u32,
    /// The task.
    #[serde(flatten)]
    pub task: SessionTask,
}

impl TaskEnvelope {
    /// Wraps a task for its first send.
    pub fn new(task: SessionTask) -> Self {
        Self {
            v: TASK_VERSION,
            attempt: 1,
            task,
        }
    }

    /// Reads a message body, saying why it cannot be read.
    pub fn decode(body: &str) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Version {
            v: u32,
        }
        let version: Version =
            serde_json::from_str(body).map_err(|e| format!("not a Pulse task envelope: {e}"))?;
        if version.v != TASK_VERSION {
            return Err(format!(
                "task envelope version {} is not supported by this release (it reads {TASK_VERSION})",
                version.v
            ));
        }
        serde_json::from_str(body).map_err(|e| format!("malformed task: {e}"))
    }

    /// The message body.
    pub fn encode(&self) -> String {
        // Serialising plain data to a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A task to send: its group (session), its deduplication id and its body.
#[derive(Clone, Debug, PartialEq)]
pub struct OutgoingTask {
    /// The FIFO group.
    pub group: SessionId,
    /// Repeated sends with this id within the queue's deduplication window are dropped.
    pub dedup_id: String,
    /// The task.
    pub envelope: TaskEnvelope,
}

impl OutgoingTask {
    /// The message for a claimed heartbeat. The deduplication id is the heartbeat id plus
    /// the claim number: a retried send of one claim is dropped, while a reclaim after an
    /// expired lease is a new message (with the bare heartbeat id, SQS would drop a
    /// reclaim made within five minutes of the first send).
    pub fn heartbeat(heartbeat: Heartbeat) -> Self {
        Self {
            group: heartbeat.session.clone(),
            dedup_id: format!("{}.c{}", heartbeat.id(), heartbeat.claim),
            envelope: TaskEnvelope::new(SessionTask::Heartbeat(HeartbeatJob { heartbeat })),
        }
    }
}

impl OutgoingTask {
    /// The message for a signal; its id is the deduplication id.
    pub fn signal(signal: Signal) -> Self {
        Self {
            group: signal.session.clone(),
            dedup_id: signal.id.to_string(),
            envelope: TaskEnvelope::new(SessionTask::Signal(SignalJob { signal })),
        }
    }
}

/// A message received from the sessions queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// The queue's id of the message (reported back on failure).
    pub message_id: String,
    /// The handle to delete or release it with.
    pub receipt: String,
    /// Its FIFO group.
    pub group: String,
    /// Its body.
    pub body: String,
    /// How many times the queue has delivered it.
    pub receive_count: u32,
}
