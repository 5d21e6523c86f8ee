//! Running the `pulse` binary as a user does, in a directory of its own.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// `pulse args` in `dir` with the offline model, no Discord, no dashboard token and
/// loopback allowed, whatever the developer's shell has.
pub(crate) fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pulse"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("PULSE_DB")
        .env_remove("PULSE_BACKEND")
        .env_remove("PULSE_DASHBOARD_TOKEN")
        .env("PULSE_LLM_PROVIDER", "offline")
        .env_remove("DISCORD_BOT_TOKEN")
        .env_remove("DISCORD_APPLICATION_ID")
        .env("PULSE_EVENT_SETTLE", "0s")
        // The fake tools and hook receivers listen on loopback, which outbound requests
        // may not reach unless allowed.
        .env("PULSE_HOOKS_ALLOW", "127.0.0.1/32");
    cmd
}

/// Runs `pulse args` in `dir` (see [`command`]).
pub(crate) fn pulse(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("pulse runs")
}

pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let out = pulse(dir, args);
    assert!(
        out.status.success(),
        "pulse {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(crate) fn json(dir: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&ok(dir, &all)).unwrap()
}

pub(crate) fn bad(dir: &Path, args: &[&str]) -> String {
    let out = pulse(dir, args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "pulse {args:?} should reject its input"
    );
    String::from_utf8(out.stderr).unwrap()
}
