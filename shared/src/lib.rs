//! # Pulse: the shared engine
//!
//! Everything the `pulse` CLI and the Lambda functions run lives here, behind ports, so
//! the same engine runs under Lambda (DynamoDB + SQS FIFO), under `pulse serve` (SQLite),
//! and in tests.
//!
//! ## Layout
//!
//! - [`domain`]: agents, heartbeats, events, tools, subscriptions, actions, turns, hooks
//!   and their deliveries, webhooks, queue tasks — types, newtypes, validation and the
//!   rules on them (a hook's payload per type, a webhook request's log entries, a reply
//!   split to the voice's limit); no I/O.
//! - [`ports`]: the traits the engine needs — one per store concern (agents, heartbeats,
//!   events, actions, registry, conversations, memories, webhooks, hooks), the sessions
//!   and hooks queues, the clock, tools, the model, Discord, hook senders — and the typed
//!   errors and reports at those seams.
//! - [`engine`]: the use cases. `sweep` (due → claim → queue), `heartbeat/` (one job:
//!   window by cursor → actions and cascades → one atomic finish), `worker` (batches in
//!   order per session), `conversation` and `intake` (signals in, one voice out),
//!   `hooks/` (emitter, dispatcher, health, operator verbs), `webhooks` (a signed request
//!   → a [`engine::Verdict`]).
//! - Adapters, each implementing ports: [`adapters`] `sqlite/` and `aws/` (one file per
//!   port, the same names on both sides, beside `codec` and the key layout — the only
//!   place SQL or SDK types appear); [`tools`] (the HTTP tool, the built-in heartbeat
//!   agent); [`llm`] (model providers); [`discord`], [`telegram`] and [`slack`] (the chat platforms
//!   replies go out on, each a [`ports::Channel`]); [`outbound`] (hook
//!   senders over the SSRF-guarded `pulse-egress` client, or EventBridge).
//! - [`sealing`]: secrets at rest — AES-256-GCM sealing of webhook and hook secrets,
//!   which the store adapters apply on write and undo on read.
//! - [`entropy`]: randomness and the wall time of new ids — from the operating system,
//!   or from a seed the simulator installs, so a simulated run replays exactly.
//! - [`tally`]: the cloud requests one heartbeat or turn made — a task-local count the
//!   AWS adapters add to as they send, and the engine writes onto the record.
//! - [`meter`]: the metrics an operator watches, named once — recorded through the
//!   `metrics` facade, printed as CloudWatch EMF lines under Lambda and served at
//!   `GET /metrics` by `pulse serve`.
//! - [`agent_dir`]: an agent as a directory of files (`agent.toml`, `SOUL.md`,
//!   `HEARTBEAT.md`, `schedules.toml`) — read, planned against a store field by field,
//!   applied through the engine's lifecycle, written back (`pulse apply`, `pulse export`).
//! - [`config`]: typed configuration from the environment, into the settings of the
//!   engine and the adapters.
//! - Entry points: [`http`] (the receiver's axum router — Discord interactions, signed
//!   webhooks, health — a thin mapping of the engine's verdicts to statuses; served by
//!   Lambda and by `pulse serve`) and [`lambda`] (Lambda event shapes to and from the
//!   engine's types; secrets from SSM before set-up).
//! - [`app`]: the wiring — [`app::connect`] turns a configuration (or injected stores and
//!   clients) into [`app::Connected`] and [`app::Services`], from small pieces the Lambda
//!   mains, the CLI, the benches and the tests all reuse.
//! - [`error`], [`telemetry`]: error types; tracing setup.
//!
//! Signature schemes live in the `pulse-signatures` crate (a leaf crate, so its fuzz
//! target builds fast).
//!
//! ## Arrows
//!
//! Imports run one way, down this list; nothing imports a module above it:
//!
//! ```text
//! error, entropy ← domain, sealing, tally, meter ← ports ← engine ← agent_dir, adapters, tools, llm, discord, telegram, slack, outbound
//!       ← config ← http, lambda ← app ← the `pulse` CLI and the Lambda functions
//! ```
//!
//! The engine knows ports only, never an adapter; adapters know the domain and ports, never
//! the engine; only `app` (and the binaries above it) knows every piece.

pub mod adapters;
pub mod agent_dir;
pub mod app;
pub mod config;
pub mod discord;
pub mod domain;
pub mod embed;
pub mod engine;
pub mod entropy;
pub mod error;
pub mod http;
pub mod lambda;
pub mod llm;
pub mod meter;
pub mod outbound;
pub mod ports;
pub mod sealing;
pub mod slack;
pub mod tally;
pub mod telegram;
pub mod telemetry;
pub mod tools;
pub mod traces;
