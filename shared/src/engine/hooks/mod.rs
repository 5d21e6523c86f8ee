//! Outbound hooks: emitting (the engine enqueues a delivery and never waits on the
//! receiver) and dispatching (one attempt per queue message; a retry is a new message
//! with a delay, never a sleep).
//!
//! Why a delivery is attempted at most once per attempt number, however often its
//! message arrives: the dispatcher claims an attempt by writing the delivery with
//! `attempts = n` and a lease, conditional on the version it read. A second copy of the
//! message finds the attempt claimed (or done) and stops. A dispatcher that dies holding
//! a claim leaves a lease that expires; the message comes back and the attempt is made
//! again under the same `webhook-id`, which receivers deduplicate on.
//!
//! Why a retry is never lost: the attempt's outcome (with `next_attempt_at`) is written
//! before the next message is sent, and a message for an attempt already made re-sends
//! the next one if it is still due.

mod dispatcher;
mod emitter;
mod health;
mod operator;

pub use dispatcher::{DispatchReport, DispatchSettings, Dispatcher, HOOK_BATCH, Handled};
pub use emitter::{Emission, HookEmitter};
pub use operator::{RECOVER_SCAN, Recovered, Redriven, Switched, set_hook_active};
