//! `pulse bench retention`: one agent at 15 minutes for a year of simulated time on a
//! fresh SQLite file — an event and a heartbeat every beat, a conversation turn a day,
//! through the real sweeper and worker with the offline model — then the retention pass:
//! the file's size before and after, and how long the pass took.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use pulse_shared::app::connect;
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{NewAgent, NewEvent, Retention, Signal, SignalMeta};
use pulse_shared::engine::{intake, prune};
use pulse_shared::ports::{Clock, ManualClock};
use serde_json::json;

use super::sweep::{drain, offline_services};
use crate::Failure;
use crate::output::{Out, figure};

/// Beats in a year at 15 minutes.
pub(crate) const YEAR_OF_BEATS: usize = 365 * 96;

/// The database file with its write-ahead log, in bytes.
fn on_disk(path: &Path) -> u64 {
    let wal = path.with_extension("db-wal");
    [path, wal.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub(crate) async fn retention(beats: usize, out: &Out) -> Result<(), Failure> {
    if !(96..=10 * YEAR_OF_BEATS).contains(&beats) {
        return Err(Failure::Input(format!(
            "invalid --beats {beats}: use 96 (a day) to {}",
            10 * YEAR_OF_BEATS
        )));
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("year.db");
    let start: Timestamp = "2026-01-01T00:00:00Z".parse().expect("a valid time");
    let manual = Arc::new(ManualClock::new(start));
    let clock: Arc<dyn Clock> = manual.clone();
    let config = Config {
        backend: Backend::Sqlite { path: path.clone() },
        ..Config::defaults()
    };
    let b = connect(&config, clock.clone()).await?;
    let (agent, first) = NewAgent::named("year").create(clock.now())?;
    b.store.create_agent(&agent, &first).await?;
    let sweeper = b.sweeper(&config.engine);
    let worker = b.worker(clock.clone(), &config.engine, &offline_services());

    let started = Instant::now();
    for beat in 0..beats {
        let event = NewEvent::new("TICK", json!({"beat": beat}), None)?.into_event(
            agent.id.clone(),
            "bench",
            clock.now(),
        );
        b.store.append(&event).await?;
        if beat % 96 == 48 {
            let said = Signal::user_message(
                &agent.id,
                &agent.session,
                "how is it going?",
                SignalMeta::default(),
                clock.now(),
            )?;
            intake::submit(b.store.as_ref(), b.queue.as_ref(), said).await?;
        }
        manual.advance(SignedDuration::from_mins(15));
        let swept = sweeper.sweep_once(clock.now()).await;
        if let Some(e) = swept.errors.first() {
            return Err(Failure::Runtime(anyhow::anyhow!("sweep failed: {e}")));
        }
        drain(&worker, b.queue.as_ref()).await?;
    }
    let ran = started.elapsed().as_secs_f64();
    let days = beats as f64 / 96.0;
    // The same checkpoint the pass ends with, so both sizes are of the file alone.
    let before = b.store.reclaim().await?.bytes_after;
    let before_disk = on_disk(&path);

    let counted = prune(b.store.as_ref(), Retention::DEFAULT, clock.now(), false).await?;
    let started = Instant::now();
    let done = prune(b.store.as_ref(), Retention::DEFAULT, clock.now(), true).await?;
    let pass = started.elapsed().as_secs_f64();
    let after = done.reclaimed.map_or(0, |r| r.bytes_after);
    let after_disk = on_disk(&path);
    let kept_days = Retention::DEFAULT.duration().as_hours() as f64 / 24.0;
    let p = &done.pruned;

    figure!(
        out,
        "one agent at 15 min for {days:.0} days on SQLite: {beats} heartbeats run in {ran:.1} s ({:.0} a second)",
        beats as f64 / ran
    );
    figure!(
        out,
        "  database before the retention pass: {:.1} MiB ({:.1} KiB a day; {:.1} MiB on disk)",
        mib(before),
        before as f64 / 1024.0 / days,
        mib(before_disk)
    );
    figure!(
        out,
        "  the pass (30d) removed {} rows in {pass:.2} s: {} heartbeats, {} events, {} actions, {} conversation records",
        p.total(),
        p.heartbeats,
        p.events,
        p.actions,
        p.conversation
    );
    figure!(
        out,
        "  database after: {:.1} MiB = {:.1} % of before ({kept_days:.0} days of {days:.0} kept; {:.1} MiB on disk)",
        mib(after),
        after as f64 * 100.0 / before.max(1) as f64,
        mib(after_disk)
    );
    if out.json {
        out.json_value(&json!({
            "beats": beats,
            "run_seconds": ran,
            "bytes_before": before,
            "bytes_after": after,
            "disk_before": before_disk,
            "disk_after": after_disk,
            "pass_seconds": pass,
            "counted": counted.pruned,
            "pruned": done.pruned,
        }));
    }
    Ok(())
}
