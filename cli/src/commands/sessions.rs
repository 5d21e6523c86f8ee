//! `pulse sessions`: the sessions queue, where heartbeat jobs and conversation turns
//! wait — what it holds, and the dead letters moved back onto it.

use clap::Subcommand;
use serde_json::json;

use super::Ctx;
use crate::Failure;
use crate::output::{count, outln};

#[derive(Subcommand, Debug)]
pub(crate) enum SessionsCmd {
    /// Move the sessions queue's dead letters (jobs and turns that failed five times)
    /// back onto it, oldest first, each behind what its session holds now and with its
    /// tries counted afresh. Fix what failed them first: the worker's log names each by
    /// message id.
    Redrive {
        /// Move at most this many.
        #[arg(long, default_value_t = 1_000)]
        limit: usize,
    },
}

/// A validated `pulse sessions` command.
pub(crate) enum SessionsPlan {
    Redrive { limit: usize },
}

pub(crate) fn plan(c: SessionsCmd) -> Result<SessionsPlan, Failure> {
    match c {
        SessionsCmd::Redrive { limit: 0 } => {
            Err(Failure::Input("--limit must be at least 1".into()))
        }
        SessionsCmd::Redrive { limit } => Ok(SessionsPlan::Redrive { limit }),
    }
}

pub(crate) async fn execute(plan: SessionsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        SessionsPlan::Redrive { limit } => {
            let before = cx.b.queue.backlog().await?;
            let moved = cx.b.queue.redrive(limit).await?;
            let left = before.dead.map(|d| d.saturating_sub(moved));
            if cx.out.json {
                cx.out
                    .json_value(&json!({ "redriven": moved, "dead_left": left }));
            } else {
                outln!(
                    "{} moved back onto the sessions queue{}",
                    count(moved as usize, "dead letter"),
                    match left {
                        Some(n) if n > 0 =>
                            format!("; about {n} left (run it again, or raise --limit)"),
                        _ => String::new(),
                    }
                );
            }
            Ok(())
        }
    }
}
