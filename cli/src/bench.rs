//! `pulse bench sweep`: figures for the heartbeat path, printed, not asserted.
//!
//! Embedded: a fleet of due heartbeats in a fresh SQLite file; one sweep claims them all
//! (claims/s), then the worker runs every job (cycles/s). On an AWS emulator: the same
//! steps with every SDK request counted, reported per heartbeat cycle by operation —
//! what a fleet costs in requests does not depend on the emulator's speed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_shared::adapters::aws::{self, AwsClients, DynamoStore, SqsQueue};
use pulse_shared::adapters::{Connected, connect};
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::NewAgent;
use pulse_shared::engine::{EngineSettings, Worker};
use pulse_shared::ports::{AgentStore, Clock, SessionQueue, SystemClock};
use serde_json::json;

use crate::Failure;
use crate::output::Out;

/// Emulators copy a table per transaction, so the AWS run uses at most this many
/// heartbeats; per-cycle request counts do not depend on the fleet size.
const AWS_MAX: usize = 500;

pub(crate) async fn sweep(
    n: usize,
    aws_endpoint: Option<String>,
    out: &Out,
) -> Result<(), Failure> {
    if !(1..=1_000_000).contains(&n) {
        return Err(Failure::Input(format!(
            "invalid --heartbeats {n}: use 1 to 1000000"
        )));
    }
    let embedded = embedded(n).await?;
    let aws = match aws_endpoint {
        Some(url) => Some(on_aws(n.min(AWS_MAX), &url).await?),
        None => None,
    };
    if out.json {
        out.json_value(&json!({ "embedded": embedded, "aws": aws }));
    }
    Ok(())
}

fn settings(n: usize) -> EngineSettings {
    EngineSettings {
        sweep_max: n,
        ..EngineSettings::default()
    }
}

fn fleet(
    n: usize,
    clock: &dyn Clock,
) -> Vec<(pulse_shared::domain::Agent, pulse_shared::domain::Heartbeat)> {
    (0..n)
        .map(|i| {
            NewAgent::named(format!("bench-{i}"))
                .create(clock.now())
                .expect("a valid agent")
        })
        .collect()
}

/// One sweep over `n` due heartbeats; fails unless it claimed and queued them all.
/// Returns the seconds it took.
async fn timed_sweep(backend: &Connected, clock: &dyn Clock, n: usize) -> Result<f64, Failure> {
    let sweeper = backend.sweeper(&settings(n));
    let started = Instant::now();
    let report = sweeper.sweep_once(clock.now()).await;
    let secs = started.elapsed().as_secs_f64();
    if report.claimed != n || report.queued != n || !report.errors.is_empty() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "the sweep claimed {} and queued {} of {n}: {:?}",
            report.claimed,
            report.queued,
            report.errors
        )));
    }
    Ok(secs)
}

/// Runs every queued job through `worker`, reading the queue with `queue`.
async fn drain(worker: &Worker, queue: &dyn SessionQueue) -> Result<usize, Failure> {
    let mut ran = 0;
    loop {
        let batch = queue.receive(10, Duration::from_secs(300)).await?;
        if batch.is_empty() {
            return Ok(ran);
        }
        let outcome = worker.process_batch(&batch).await;
        if !outcome.failed.is_empty() {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "{} jobs failed during the benchmark",
                outcome.failed.len()
            )));
        }
        for d in &batch {
            queue.ack(&d.receipt).await?;
        }
        ran += batch.len();
    }
}

async fn embedded(n: usize) -> Result<serde_json::Value, Failure> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = Config {
        backend: Backend::Sqlite {
            path: dir.path().join("bench.db"),
        },
        engine: settings(n),
    };
    let backend = connect(&config, clock.clone()).await?;
    backend
        .store
        .import_agents(&fleet(n, clock.as_ref()))
        .await?;

    let sweep_secs = timed_sweep(&backend, clock.as_ref(), n).await?;
    let worker = backend.worker(clock, &config.engine);
    let started = Instant::now();
    let ran = drain(&worker, backend.queue.as_ref()).await?;
    let run_secs = started.elapsed().as_secs_f64();

    let claims_per_s = n as f64 / sweep_secs;
    let cycles_per_s = ran as f64 / run_secs;
    eprintln!("embedded store (SQLite, WAL), {n} due heartbeats:");
    eprintln!(
        "  sweep: {n} claimed and queued in {sweep_secs:.3} s = {claims_per_s:.0} claims/s (target >= 5000)"
    );
    eprintln!(
        "  worker: {ran} heartbeats run and finished in {run_secs:.3} s = {cycles_per_s:.0} cycles/s"
    );
    Ok(json!({
        "heartbeats": n,
        "sweep_seconds": sweep_secs,
        "claims_per_second": claims_per_s,
        "run_seconds": run_secs,
        "cycles_per_second": cycles_per_s,
    }))
}

async fn on_aws(n: usize, endpoint: &str) -> Result<serde_json::Value, Failure> {
    // Counted clients for the engine; separate, uncounted ones for the bench's own setup
    // and for receiving jobs (Lambda's event source does that, not Pulse).
    let counted = AwsClients::for_emulator(endpoint);
    let setup = AwsClients::for_emulator(endpoint);
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let table = format!("pulse-bench-{id}");
    aws::create_table(&setup.dynamodb, &table).await?;
    let url = aws::create_sessions_queue(&setup.sqs, &format!("pulse-bench-{id}.fifo")).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    DynamoStore::new(setup.dynamodb.clone(), &table, Duration::from_secs(30))
        .import_agents(&fleet(n, clock.as_ref()))
        .await?;
    let backend = Connected {
        store: Arc::new(DynamoStore::new(
            counted.dynamodb.clone(),
            &table,
            Duration::from_secs(30),
        )),
        queue: Arc::new(SqsQueue::new(counted.sqs.clone(), &url)),
        aws_requests: Some(counted.counter.clone()),
    };

    counted.counter.reset();
    let sweep_secs = timed_sweep(&backend, clock.as_ref(), n).await?;
    let sweep_ops = counted.counter.snapshot();
    let worker = backend.worker(clock, &settings(n));
    counted.counter.reset();
    let ran = drain(&worker, &SqsQueue::new(setup.sqs.clone(), &url)).await?;
    let run_ops = counted.counter.snapshot();

    let per = |ops: &BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        ops.iter()
            .map(|(k, v)| (k.clone(), *v as f64 / n as f64))
            .collect()
    };
    eprintln!("AWS backend on {endpoint}, {n} due heartbeats ({ran} run):");
    eprintln!(
        "  sweep: {n} claimed in {sweep_secs:.2} s = {:.0} claims/s (emulator speed, not AWS's)",
        n as f64 / sweep_secs
    );
    eprintln!("  requests per heartbeat cycle, by operation:");
    for (phase, ops) in [("sweep", &sweep_ops), ("worker", &run_ops)] {
        for (op, count) in ops {
            eprintln!(
                "    {phase:<7} {op:<28} {:>8.3}   ({count} in all)",
                *count as f64 / n as f64
            );
        }
    }
    eprintln!(
        "  targets: <= 1 claim write + 1 window read + 1 completion transaction; due queries and sends <= 0.1 each"
    );
    let _ = setup
        .dynamodb
        .delete_table()
        .table_name(&table)
        .send()
        .await;
    let _ = setup.sqs.delete_queue().queue_url(&url).send().await;
    Ok(json!({
        "heartbeats": n,
        "sweep_seconds": sweep_secs,
        "per_cycle": { "sweep": per(&sweep_ops), "worker": per(&run_ops) },
    }))
}
