//! # Pulse simulated: the whole system on virtual time, from one seed
//!
//! The real engine — sweeper, workers (heartbeat runner and conversation), hook
//! dispatcher, lifecycle — on the embedded store, or on the AWS adapters over an
//! emulator (see [`SimBackend`]), driven through a simulated day by one seed: the agents' webhooks, their users, their operator and the outside world (model,
//! Discord, tool, hook receivers) all act at times the seed draws, and faults are
//! injected at rates the mix sets. Afterwards the invariants are checked from the store
//! and from what the outside world received. The same seed gives the same run: a
//! failure replays from one number.
//!
//! ## How it is deterministic
//!
//! - **One thread, virtual time.** A current-thread tokio runtime started paused: every
//!   sleep is virtual, and time jumps to the next timer whenever every task waits. The
//!   engine reads time through its clock port, here that same virtual time.
//! - **No other threads.** The store runs its SQLite calls on the calling thread
//!   ([`Db::open_simulated`](pulse_shared::adapters::sqlite::Db::open_simulated)), so no
//!   thread pool decides the order calls finish in. On the AWS backend each request
//!   blocks the thread until its whole answer is in
//!   ([`lockstep`](pulse_shared::adapters::aws::lockstep)), so virtual time stands
//!   still while the emulator works and requests go out in the order the tasks make
//!   them; the `aws` module says what stays on the emulator's real time.
//! - **Seeded randomness.** The simulation's choices come from [`faults::Dice`]; the
//!   engine's own (id suffixes, jitter, the sweep's starting shard) from
//!   [`pulse_shared::entropy`], seeded from the same number.
//! - **Seeded interleavings.** Store calls yield to other tasks as the dice say, so a seed
//!   explores one order of the concurrent tasks and another seed another.
//! - **Shards share nothing.** A fleet larger than [`SHARD_AGENTS`] runs as shards, each
//!   a deployment of its own on a thread of its own, with a seed drawn from the run's;
//!   the split depends on the options alone and the report adds the shards up in order,
//!   so threads finishing in any order give the same report.
//!
//! ## Layout
//!
//! - [`faults`]: the kinds of fault, their mixes, and the dice.
//! - [`store`]: the store wrapper that asks a policy around every call (the integration
//!   tests use it too, with their own policy).
//! - [`queue`]: the simulation's policy — interleaving, store faults, lost queue
//!   acknowledgements, redeliveries, killed tasks — and the queue wrappers.
//! - [`world`]: the fake outside world, recording what it received.
//! - `aws`: the run's table and queues on the emulator, the clients that meet faults
//!   beneath the SDK, and the queues' visibility and delays on virtual time.
//! - `power`: the power-cut fault on the embedded store, and its check.
//! - `inbound`: the agents' webhooks, their events sent as signed requests through the
//!   receiver's real router, some sent again or replayed.
//! - [`setup`]: the options and constants of a run, a shard's store, fleet and engine.
//! - [`run`]: the shards side by side, the driving tasks, the drain. `check`: the
//!   invariants. [`report`]: what a run reports.
//!
//! Imports run one way: `faults`, `store`, `queue`, `world`, `aws`, `power` ← `setup` ←
//! `report`, `check`, `inbound` ← `run`.

pub mod faults;
pub mod queue;
pub mod report;
pub mod run;
pub mod setup;
pub mod store;
pub mod world;

mod approvals;
mod aws;
mod check;
mod inbound;
mod power;

pub use faults::{Fault, Mix};
pub use report::Report;
pub use run::run;
pub use setup::{Options, SimBackend, SimError};
pub use store::{FaultyStore, StorePolicy};

/// The most agents one simulated deployment holds, unless [`Options::shard_agents`] says
/// otherwise. A larger fleet is simulated as shards of near-equal size, each a deployment
/// of its own (store, sweeper, workers, dispatcher, outside world) driven by a seed drawn
/// from the run's, run side by side on the machine's cores; the report sums them. The
/// split follows from the options alone, never from the machine, so a seed replays the
/// same run on any machine.
pub const SHARD_AGENTS: usize = 5_000;
