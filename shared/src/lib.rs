//! # Pulse: the shared engine
//!
//! Everything the `pulse` CLI and the Lambda functions run lives here, behind ports, so
//! the same engine runs under Lambda (DynamoDB + SQS FIFO), under `pulse serve` (SQLite),
//! and in tests.
//!
//! ## Layout
//!
//! - [`domain`]: agents, heartbeats, events, tools, subscriptions, actions, queue tasks —
//!   types, newtypes and validation; no I/O.
//! - [`ports`]: the traits the engine needs (stores, the sessions queue, the clock, tool
//!   execution).
//! - [`engine`]: the sweeper (due → claim → queue), the heartbeat runner (window by
//!   cursor → tools and cascades → atomic finish and next schedule), the worker (batches
//!   in order per session, partial failures), and hooks (emit at lifecycle points,
//!   dispatch with delayed retries).
//! - [`tools`]: tool execution; the generic HTTP tool.
//! - [`outbound`]: the hook sender — signed POSTs through the SSRF-guarded egress client
//!   (`pulse-egress`, which the HTTP tool uses too), or PutEvents to EventBridge.
//! - [`http`]: the axum router of the webhook receiver — Discord interactions, signed
//!   webhooks, health — served by Lambda and by `pulse serve --listen`. Signature schemes
//!   live in the `pulse-signatures` crate (a leaf crate, so its fuzz target builds fast).
//! - [`adapters`]: `sqlite` and `aws` (DynamoDB, SQS) — the only place SQL or SDK types
//!   appear — and [`adapters::connect`], which picks one from the configuration.
//! - [`sealing`]: secrets at rest — AES-256-GCM sealing of webhook and hook secrets,
//!   which the store adapters apply on write and undo on read.
//! - [`config`]: typed configuration from the environment.
//! - [`lambda`]: Lambda event shapes to and from the engine's types.
//! - [`telemetry`]: tracing setup (JSON under Lambda, readable lines in a terminal).
//!
//! Arrows point down: adapters implement ports, the engine uses ports, the domain uses
//! nothing.

pub mod adapters;
pub mod app;
pub mod config;
pub mod discord;
pub mod domain;
pub mod engine;
pub mod error;
pub mod http;
pub mod lambda;
pub mod llm;
pub mod outbound;
pub mod ports;
pub mod sealing;
pub mod telemetry;
pub mod tools;
