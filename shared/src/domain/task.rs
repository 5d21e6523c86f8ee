//! Messages on the sessions queue. Versioned and tagged, so a worker can tell a message
//! from a newer release apart from a damaged one, and later issues can add kinds (user
//! signals) without breaking messages already queued.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::conversation::Signal;
use super::heartbeat::Heartbeat;
use super::ids::{AgentId, SessionId};

/// An opaque string a queue hands out, as a type of its own so one cannot be passed for
/// another.
macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Wraps what the queue gave.
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }
            /// As a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

opaque_id!(
    /// A queue's id of a message: what is reported back when it must be delivered again.
    MessageId
);
opaque_id!(
    /// The handle a received message is deleted or released with; it belongs to that one
    /// delivery of it.
    Receipt
);
opaque_id!(
    /// A send's deduplication id: a second send with it within the queue's window is
    /// accepted and dropped.
    DedupId
);

/// Why a queue message is not a task this release can run.
#[derive(Debug, thiserror::Error)]
pub enum TaskDecodeError {
    /// Not JSON with a version.
    #[error("not a Pulse task envelope: {0}")]
    NotAnEnvelope(#[source] serde_json::Error),
    /// Written by another release.
    #[error("task envelope version {0} is not supported by this release (it reads {TASK_VERSION})")]
    Version(u32),
    /// The right version, but not a task of it.
    #[error("malformed task: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// The envelope version this release writes and reads.
pub const TASK_VERSION: u32 = 1;

/// One unit of work of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "a task is decoded from its message and handled one at a time, never kept in bulk"
)]
pub enum SessionTask {
    /// Run a claimed heartbeat.
    Heartbeat(HeartbeatJob),
    /// Answer a signal (a user message, a spoken heartbeat thought, a webhook).
    Signal(SignalJob),
    /// Consolidate an agent's memories (the daily pass).
    Consolidate(ConsolidateJob),
    /// Try again a session's turn that waits on the model (see `WaitingTurn`).
    Retry(RetryJob),
    /// Deliver again a turn's reply the channel did not take (see `Undelivered`).
    Redeliver(RedeliverJob),
}

/// An undelivered reply to try again: the sweep sends one when it is due.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RedeliverJob {
    /// The agent.
    pub agent_id: AgentId,
    /// The turn whose reply was not delivered.
    pub turn_id: super::TurnId,
}

/// A waiting turn to try again: the sweep sends one when it is due.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryJob {
    /// The agent.
    pub agent_id: AgentId,
    /// The session whose turn waits.
    pub session: SessionId,
}

/// The daily consolidation of one agent's memories, run by the worker (which has the
/// model and the embedder) in the agent's own session, after what was queued before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConsolidateJob {
    /// The agent.
    pub agent_id: AgentId,
    /// The day it was queued for (`2026-11-25`, UTC): one pass a day.
    pub day: String,
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
    /// The registry version the sweeper read after the claim: every tool or subscription
    /// change made before an event of this heartbeat's window is in it, so a worker whose
    /// cached registry is older reads it again. `None` when the sweeper could not read it
    /// (then the worker reads the registry afresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_version: Option<u64>,
    /// The sweep's claim span as a W3C `traceparent`, when traces are sent: the run
    /// continues that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
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
    pub fn decode(body: &str) -> Result<Self, TaskDecodeError> {
        #[derive(Deserialize)]
        struct Version {
            v: u32,
        }
        let version: Version =
            serde_json::from_str(body).map_err(TaskDecodeError::NotAnEnvelope)?;
        if version.v != TASK_VERSION {
            return Err(TaskDecodeError::Version(version.v));
        }
        serde_json::from_str(body).map_err(TaskDecodeError::Malformed)
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
    pub dedup_id: DedupId,
    /// The task.
    pub envelope: TaskEnvelope,
}

impl OutgoingTask {
    /// The message for a claimed heartbeat. The deduplication id is the heartbeat id plus
    /// the claim number: a retried send of one claim is dropped, while a reclaim after an
    /// expired lease is a new message (with the bare heartbeat id, SQS would drop a
    /// reclaim made within five minutes of the first send).
    pub fn heartbeat(
        heartbeat: Heartbeat,
        registry_version: Option<u64>,
        traceparent: Option<String>,
    ) -> Self {
        Self {
            group: heartbeat.session.clone(),
            dedup_id: DedupId::new(format!("{}.c{}", heartbeat.id(), heartbeat.claim)),
            envelope: TaskEnvelope::new(SessionTask::Heartbeat(HeartbeatJob {
                heartbeat,
                registry_version,
                traceparent,
            })),
        }
    }
}

impl OutgoingTask {
    /// The message for a signal; its id is the deduplication id.
    pub fn signal(signal: Signal) -> Self {
        Self {
            group: signal.session.clone(),
            dedup_id: DedupId::new(signal.id.to_string()),
            envelope: TaskEnvelope::new(SessionTask::Signal(SignalJob { signal })),
        }
    }
}

impl OutgoingTask {
    /// The message that tries `waiting` again: one a try (its deduplication id counts
    /// the tries), so sweeps that overlap send it once.
    pub fn retry(waiting: &super::WaitingTurn) -> Self {
        Self {
            group: waiting.session.clone(),
            dedup_id: DedupId::new(format!(
                "retry.{}.{}.{}",
                waiting.agent_id, waiting.session, waiting.attempts
            )),
            envelope: TaskEnvelope::new(SessionTask::Retry(RetryJob {
                agent_id: waiting.agent_id.clone(),
                session: waiting.session.clone(),
            })),
        }
    }
}

impl OutgoingTask {
    /// The message that delivers `undelivered` again, in its session's group: one a try
    /// (its deduplication id counts the tries), so sweeps that overlap send it once.
    pub fn redeliver(undelivered: &super::Undelivered) -> Self {
        Self {
            group: undelivered.session.clone(),
            dedup_id: DedupId::new(format!(
                "redeliver.{}.{}.{}",
                undelivered.agent_id, undelivered.turn_id, undelivered.attempts
            )),
            envelope: TaskEnvelope::new(SessionTask::Redeliver(RedeliverJob {
                agent_id: undelivered.agent_id.clone(),
                turn_id: undelivered.turn_id.clone(),
            })),
        }
    }
}

impl OutgoingTask {
    /// The message for `agent`'s consolidation on `day`; a second send the same day is
    /// dropped within the queue's deduplication window.
    pub fn consolidate(agent: &AgentId, day: &str) -> Self {
        Self {
            group: SessionId::for_agent(agent),
            dedup_id: DedupId::new(format!("consolidate.{agent}.{day}")),
            envelope: TaskEnvelope::new(SessionTask::Consolidate(ConsolidateJob {
                agent_id: agent.clone(),
                day: day.to_owned(),
            })),
        }
    }
}

/// A message received from the sessions queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// The queue's id of the message (reported back on failure).
    pub message_id: MessageId,
    /// The handle to delete or release it with.
    pub receipt: Receipt,
    /// Its FIFO group.
    pub group: String,
    /// Its body.
    pub body: String,
    /// How many times the queue has delivered it.
    pub receive_count: u32,
}
