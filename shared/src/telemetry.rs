//! Logging. JSON lines under Lambda (CloudWatch parses them), readable lines in a terminal.
//! The filter comes from `RUST_LOG` (default `info`). Every line of a heartbeat carries
//! its span's `agent_id` and `heartbeat_id`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line, with span fields; for Lambda.
    Json,
    /// Human-readable lines; for a terminal.
    Text,
}

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            // Lambda adds its own timestamp and request id to each line.
            .without_time()
            .try_init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init(),
    };
}
