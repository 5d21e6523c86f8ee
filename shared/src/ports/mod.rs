//! Ports: the small traits the engine needs from the outside world. Each backend (SQLite,
//! DynamoDB + SQS) implements them in its adapter; the engine sees only these.
//!
//! Every write here is idempotent under retry: creates are conditional on the record's
//! identity, and records whose ids are derived (heartbeats, a heartbeat's own events,
//! actions) are rewritten with the same content.
//!
//! ## Layout
//!
//! - here: the clock;
//! - `heartbeats`: agents, heartbeats and the event log;
//! - `records`: actions, the registry, conversations, schedules, memories, webhooks, hooks;
//! - `maintenance`: the retention pass, and [`Store`], every store port at once;
//! - `queues`: the sessions and hooks queues;
//! - `outside`: tools, models, Discord, hook senders, event buses;
//! - `channel`: the chat platforms replies go out on.

mod channel;
mod heartbeats;
mod maintenance;
mod outside;
mod queues;
mod records;

pub use channel::*;
pub use heartbeats::*;
pub use maintenance::*;
pub use outside::*;
pub use queues::*;
pub use records::*;

use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};

/// Where the time comes from. Injected so tests and benchmarks control it.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    /// A clock stopped at `t`.
    pub fn new(t: Timestamp) -> Self {
        Self(Mutex::new(t))
    }
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: SignedDuration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t = t.saturating_add(d).unwrap_or(*t);
    }
    /// Sets the clock.
    pub fn set(&self, t: Timestamp) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
