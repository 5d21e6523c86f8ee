//! # Pulse signatures: verifying signed webhooks
//!
//! Pulse accepts events from outside systems over HTTP. Before any of them becomes an
//! event, its signature is checked here: HMAC-SHA256 over the raw body for webhooks
//! (Pulse's own scheme, Standard Webhooks, GitHub, Stripe) and Ed25519 for Discord
//! interactions. Everything is pure: the caller passes the headers, the raw body bytes
//! and the current time, so tests and the benchmark need no clock and no network.
//!
//! ## Layout
//!
//! - [`inbound`]: the HMAC schemes — [`inbound::verify`], [`inbound::sign`] (what a
//!   sender would send, for tests and the demo), [`inbound::generate_secret`],
//!   [`inbound::standard_signature`] (also used to sign Pulse's outbound hooks) and the
//!   header parsers, which are public because they are the fuzz targets.
//! - [`discord`]: Discord's Ed25519 interaction signatures — [`discord::verify_discord`]
//!   and a [`discord::DiscordSigner`] for tests.
//! - [`slack`]: Slack's `v0` request signatures — [`slack::verify_slack`] and
//!   [`slack::sign_slack`] for tests.
//!
//! Both share [`VerifyError`], whose messages tell a sender what was wrong and what to
//! do, and never contain a secret or an expected signature.

pub mod discord;
pub mod inbound;
pub mod slack;

pub use discord::{DiscordKey, DiscordSigner, KeyError, verify_discord};
pub use inbound::{
    Scheme, StripeHeader, TOLERANCE_SECS, Verified, VerifyError, generate_secret, sign,
    standard_signature, verify,
};
