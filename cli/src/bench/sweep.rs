//! `pulse bench sweep` and `pulse bench turn`: figures, printed, not asserted.
//!
//! `sweep` measures the heartbeat path as deployed: the built-in heartbeat agent is on,
//! with the offline model, so an idle beat skips thinking and a busy one thinks.
//! Embedded: a fleet of due heartbeats in a fresh SQLite file; one sweep claims them all
//! (claims/s), then the worker runs every job (cycles/s). On an AWS emulator: the same
//! steps with every SDK request counted and its DynamoDB capacity computed, reported per
//! heartbeat cycle by operation and priced per million cycles, idle and with one new
//! event — what a fleet costs in requests does not depend on the emulator's speed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_shared::adapters::aws::{self, AwsClients, DynamoStore, SqsQueue};
use pulse_shared::app::{Connected, Services, connect};
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{
    ConversationMessage, NewAgent, ProviderKind, ReplyTarget, Requests, Role, Signal, SignalId,
    SignalMeta, Turn, TurnId, TurnStatus, Usage,
};
use pulse_shared::engine::{AwsPrices, EngineSettings, Worker, intake};
use pulse_shared::ports::{AgentStore, Clock, EventLog, SessionQueue, Store, SystemClock};
use serde_json::json;

use crate::Failure;
use crate::output::{Out, figure};

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
    let embedded = embedded(n, out).await?;
    let aws = match aws_endpoint {
        Some(url) => Some(on_aws(n.min(AWS_MAX), &url, out).await?),
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

pub(super) fn fleet(
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

/// Services with the offline model and no Discord: the benches measure Pulse, not a
/// provider.
pub(super) fn offline_services() -> Services {
    Services::offline(pulse_egress::Egress::new(pulse_egress::AllowList::default()))
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

/// Runs every queued job through `worker`, as `pulse serve`'s worker loop does (batches
/// of ten, each settled on the queue at once), reading the queue with `queue`.
pub(super) async fn drain(worker: &Worker, queue: &dyn SessionQueue) -> Result<usize, Failure> {
    let mut ran = 0;
    loop {
        let polled = worker
            .poll_once(queue, 10, Duration::from_secs(300))
            .await?;
        if polled.failed > 0 {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "{} jobs failed during the benchmark",
                polled.failed
            )));
        }
        if polled.received == 0 {
            return Ok(ran);
        }
        ran += polled.received;
    }
}

async fn embedded(n: usize, out: &Out) -> Result<serde_json::Value, Failure> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = Config {
        backend: Backend::Sqlite {
            path: dir.path().join("bench.db"),
        },
        engine: settings(n),
        ..Config::defaults()
    };
    let backend = connect(&config, clock.clone()).await?;
    backend
        .store
        .import_agents(&fleet(n, clock.as_ref()))
        .await?;

    let sweep_secs = timed_sweep(&backend, clock.as_ref(), n).await?;
    let worker = backend.worker(clock.clone(), &config.engine, &offline_services());
    let started = Instant::now();
    let ran = drain(&worker, backend.queue.as_ref()).await?;
    let run_secs = started.elapsed().as_secs_f64();

    let floor = floors(n, dir.path(), clock.as_ref()).await?;
    let claims_per_s = n as f64 / sweep_secs;
    let cycles_per_s = ran as f64 / run_secs;
    let sweep_ratio = floor.sweep.as_secs_f64() / sweep_secs;
    let worker_ratio = floor.worker.as_secs_f64() / run_secs;
    let verdict = |ratio: f64, goal: f64| if ratio >= goal { "met" } else { "not met" };
    figure!(out, "embedded store (SQLite, WAL), {n} due heartbeats:");
    figure!(
        out,
        "  sweep: {n} claimed and queued in {sweep_secs:.3} s = {claims_per_s:.0} claims/s"
    );
    figure!(
        out,
        "    floor, its {} statements run bare: {:.0} claims/s; the sweep at {:.0} % of it (goal >= {:.0} %: {})",
        floor.sweep_statements,
        n as f64 / floor.sweep.as_secs_f64(),
        sweep_ratio * 100.0,
        SWEEP_GOAL * 100.0,
        verdict(sweep_ratio, SWEEP_GOAL)
    );
    figure!(
        out,
        "  worker: {ran} heartbeats run and finished in {run_secs:.3} s = {cycles_per_s:.0} cycles/s"
    );
    figure!(
        out,
        "    floor, its {} statements run bare ({:.1} a cycle): {:.0} cycles/s; the worker at {:.0} % of it (goal >= {:.0} %: {})",
        floor.worker_statements,
        floor.worker_statements as f64 / ran.max(1) as f64,
        ran as f64 / floor.worker.as_secs_f64(),
        worker_ratio * 100.0,
        WORKER_GOAL * 100.0,
        verdict(worker_ratio, WORKER_GOAL)
    );
    Ok(json!({
        "heartbeats": n,
        "sweep_seconds": sweep_secs,
        "claims_per_second": claims_per_s,
        "sweep_floor_seconds": floor.sweep.as_secs_f64(),
        "sweep_statements": floor.sweep_statements,
        "sweep_ratio": sweep_ratio,
        "sweep_goal_ratio": SWEEP_GOAL,
        "run_seconds": run_secs,
        "cycles_per_second": cycles_per_s,
        "worker_floor_seconds": floor.worker.as_secs_f64(),
        "worker_statements": floor.worker_statements,
        "worker_ratio": worker_ratio,
        "worker_goal_ratio": WORKER_GOAL,
    }))
}

/// The sweep's claims a second, as a share of its own statements' run bare.
const SWEEP_GOAL: f64 = 0.6;
/// The worker's cycles a second, as a share of its own statements' run bare.
const WORKER_GOAL: f64 = 0.4;

/// How long the sweep's and the worker's SQL took with nothing around it.
struct Floors {
    sweep: Duration,
    sweep_statements: usize,
    worker: Duration,
    worker_statements: usize,
}

/// The floors of the embedded run: a second fleet of `n` is swept and run as the
/// measured one was, with every statement recorded with its values (which slows it, so
/// it is not the one timed); each phase's statements then run again, in order and
/// bare, on a copy of that database made just before the phase.
async fn floors(n: usize, dir: &std::path::Path, clock: &dyn Clock) -> Result<Floors, Failure> {
    use pulse_shared::adapters::sqlite::Db;
    let path = dir.join("recorded.db");
    let config = Config {
        backend: Backend::Sqlite { path: path.clone() },
        engine: settings(n),
        ..Config::defaults()
    };
    let opened: Arc<std::sync::Mutex<Option<Db>>> = Arc::default();
    let keep = opened.clone();
    let backend = pulse_shared::app::connect_sqlite(&config, Arc::new(SystemClock), move || {
        let db = Db::open(&path)?;
        *keep.lock().unwrap_or_else(|e| e.into_inner()) = Some(db.clone());
        Ok(db)
    })
    .await?;
    let db = opened
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(|| Failure::Runtime(anyhow::anyhow!("the recorded store was not opened")))?;
    backend.store.import_agents(&fleet(n, clock)).await?;
    let sweep_copy = dir.join("sweep-bare.db");
    db.copy_to(&sweep_copy).await?;
    let recording = db.record_statements()?;
    timed_sweep(&backend, clock, n).await?;
    let sweep_statements = recording.finish()?;
    let worker_copy = dir.join("worker-bare.db");
    db.copy_to(&worker_copy).await?;
    let worker = backend.worker(Arc::new(SystemClock), &config.engine, &offline_services());
    let recording = db.record_statements()?;
    drain(&worker, backend.queue.as_ref()).await?;
    let worker_statements = recording.finish()?;
    let replay = |copy: std::path::PathBuf,
                  statements: Vec<pulse_shared::adapters::sqlite::Recorded>| {
        let durability = config.durability;
        tokio::task::spawn_blocking(move || {
            let db = Db::open(&copy)?.with_durability(durability)?;
            db.replay(&statements).map(|took| (took, statements.len()))
        })
    };
    let (sweep, sweep_statements) = replay(sweep_copy, sweep_statements)
        .await
        .map_err(|e| Failure::Runtime(e.into()))??;
    let (worker, worker_statements) = replay(worker_copy, worker_statements)
        .await
        .map_err(|e| Failure::Runtime(e.into()))??;
    Ok(Floors {
        sweep,
        sweep_statements,
        worker,
        worker_statements,
    })
}

/// What one phase of the AWS run counted, per heartbeat cycle.
struct Phase {
    requests: BTreeMap<String, u64>,
    capacity: aws::Capacity,
    seconds: f64,
}

/// The fleet the scheduler's cost is shared by: 10,000 agents at 15 minutes make 667
/// cycles a minute, against one sweeper invocation a minute.
const FLEET_CYCLES_PER_MINUTE: f64 = 10_000.0 / 15.0;
/// Jobs the worker's event source hands over per invocation (SQS FIFO's batch).
const JOBS_PER_BATCH: f64 = 10.0;
/// The functions' memory, in GB.
const LAMBDA_GB: f64 = 0.125;

/// Dollars per million cycles, by line, from what a cycle counted.
fn dollars(sweep: &Phase, run: &Phase, n: usize) -> Vec<(&'static str, f64)> {
    let per = |x: f64| x / n as f64;
    let units = |p: &Phase| (per(p.capacity.write), per(p.capacity.read));
    let (sw, sr) = units(sweep);
    let (rw, rr) = units(run);
    let sqs_sends: u64 = sweep
        .requests
        .iter()
        .chain(&run.requests)
        .filter(|(k, _)| k.starts_with("SQS."))
        .map(|(_, v)| *v)
        .sum();
    // Lambda's event source receives and deletes each batch: two requests per batch.
    let sqs = per(sqs_sends as f64) + 2.0 / JOBS_PER_BATCH;
    let busy = per(sweep.seconds + run.seconds);
    // The list prices `pulse usage` uses too (the book's Costs chapter dates them).
    let price = AwsPrices::default();
    vec![
        ("DynamoDB writes", (sw + rw) * price.dynamodb_write_units),
        ("DynamoDB reads", (sr + rr) * price.dynamodb_read_units),
        ("SQS FIFO requests", sqs * price.sqs_requests),
        (
            "Lambda duration (arm64, 128 MB, as measured)",
            busy * LAMBDA_GB * price.lambda_gb_seconds * 1e6,
        ),
        (
            "Lambda invocations",
            (1.0 / JOBS_PER_BATCH + 1.0 / FLEET_CYCLES_PER_MINUTE) * price.lambda_invocations,
        ),
        (
            "scheduler",
            price.scheduler_invocations / FLEET_CYCLES_PER_MINUTE,
        ),
    ]
}

/// What the AWS run measures with: the engine on counted clients, and a queue reader
/// of its own.
struct Rig {
    backend: Connected,
    worker: Worker,
    receive: SqsQueue,
    counter: aws::RequestCounter,
    clock: Arc<dyn Clock>,
    n: usize,
}

impl Rig {
    /// Claims and runs the `n` due heartbeats, counting each phase, and reports them
    /// under `title` (given how many jobs ran).
    async fn phase(
        &self,
        out: &Out,
        title: impl Fn(usize) -> String,
    ) -> Result<serde_json::Value, Failure> {
        let since = self.clock.now();
        let (sweep, run, ran) = measured_cycles(self).await?;
        let mut figures = report(out, &title(ran), &sweep, &run, self.n);
        let recorded = self.recorded(since).await?;
        let per = |x: f64| x / self.n as f64;
        figure!(
            out,
            "    recorded on the heartbeats (what `pulse usage` prices): {:.2} requests, {:.2} WRU, {:.2} RRU, ${:.3} per million; \
             not in it: the sweep's due-index Query and queue send, shared by a sweep's heartbeats",
            per(recorded.total() as f64),
            per(recorded.wru),
            per(recorded.rru),
            AwsPrices::default().of(&recorded) / self.n as f64 * 1e6,
        );
        figures["recorded"] = json!({
            "requests": per(recorded.total() as f64),
            "wru": per(recorded.wru),
            "rru": per(recorded.rru),
        });
        Ok(figures)
    }

    /// The requests the heartbeats finished since `since` recorded, summed.
    async fn recorded(&self, since: jiff::Timestamp) -> Result<Requests, Failure> {
        let store = self.backend.store.as_ref();
        let mut sum = Requests::default();
        for agent in store.list_agents().await? {
            for h in store.heartbeats_page(&agent.id, None, 3).await? {
                if h.completed_at.is_some_and(|t| t >= since)
                    && let Some(r) = &h.requests
                {
                    sum.add(r);
                }
            }
        }
        Ok(sum)
    }
}

/// Claims and runs the rig's `n` due heartbeats, counting each phase.
async fn measured_cycles(rig: &Rig) -> Result<(Phase, Phase, usize), Failure> {
    let Rig {
        backend,
        worker,
        receive,
        counter,
        clock,
        n,
    } = rig;
    let (clock, n) = (clock.as_ref(), *n);
    counter.reset();
    let seconds = timed_sweep(backend, clock, n).await?;
    let sweep = Phase {
        requests: counter.snapshot(),
        capacity: counter.capacity(),
        seconds,
    };
    counter.reset();
    let started = Instant::now();
    let ran = drain(worker, receive).await?;
    let run = Phase {
        requests: counter.snapshot(),
        capacity: counter.capacity(),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((sweep, run, ran))
}

fn report(out: &Out, title: &str, sweep: &Phase, run: &Phase, n: usize) -> serde_json::Value {
    let per = |x: f64| x / n as f64;
    figure!(out, "  {title}, per heartbeat cycle:");
    for (phase, p) in [("sweep", sweep), ("worker", run)] {
        for (op, count) in &p.requests {
            figure!(
                out,
                "    {phase:<7} {op:<28} {:>8.3}   ({count} in all)",
                per(*count as f64)
            );
        }
    }
    let wru = per(sweep.capacity.write + run.capacity.write);
    let rru = per(sweep.capacity.read + run.capacity.read);
    figure!(
        out,
        "    DynamoDB capacity: {wru:.2} WRU and {rru:.2} RRU (computed from the items written and read)"
    );
    let lines = dollars(sweep, run, n);
    let total: f64 = lines.iter().map(|(_, d)| d).sum();
    for (what, d) in &lines {
        figure!(out, "    ${d:>7.3}  {what}");
    }
    figure!(out, "    ${total:>7.3}  per million cycles");
    let per_op = |ops: &BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        ops.iter()
            .map(|(k, v)| (k.clone(), per(*v as f64)))
            .collect()
    };
    json!({
        "requests": { "sweep": per_op(&sweep.requests), "worker": per_op(&run.requests) },
        "wru": wru,
        "rru": rru,
        "seconds": per(sweep.seconds + run.seconds),
        "dollars_per_million": lines.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<BTreeMap<_, _>>(),
        "dollars_per_million_total": total,
    })
}

async fn on_aws(n: usize, endpoint: &str, out: &Out) -> Result<serde_json::Value, Failure> {
    // Counted clients for the engine; separate, uncounted ones for the bench's own setup
    // and for receiving jobs (Lambda's event source does that, not Pulse).
    let counted = AwsClients::for_emulator(endpoint);
    let setup = AwsClients::for_emulator(endpoint);
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let table = format!("pulse-bench-{id}");
    aws::create_table(&setup.dynamodb, &table).await?;
    let url = aws::create_sessions_queue(&setup.sqs, &format!("pulse-bench-{id}.fifo")).await?;
    let hooks_url = aws::create_hooks_queue(&setup.sqs, &format!("pulse-bench-hooks-{id}")).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let setup_store = DynamoStore::new(setup.dynamodb.clone(), &table, Duration::from_secs(30));
    let backend = Connected {
        store: Arc::new(DynamoStore::new(
            counted.dynamodb.clone(),
            &table,
            Duration::from_secs(30),
        )),
        queue: Arc::new(SqsQueue::new(counted.sqs.clone(), &url)),
        // A hooks queue, as deployed.
        hooks: Some(Arc::new(aws::SqsHookQueue::new(
            counted.sqs.clone(),
            &hooks_url,
            None,
        ))),
        bus: None,
        aws_requests: Some(counted.counter.clone()),
        orphans: None,
        keys_missing: None,
    };
    // As deployed: the heartbeat agent on (the offline model), the registry cached.
    let rig = Rig {
        worker: backend.worker(clock.clone(), &settings(n), &offline_services()),
        backend,
        receive: SqsQueue::new(setup.sqs.clone(), &url),
        counter: counted.counter.clone(),
        clock: clock.clone(),
        n,
    };
    figure!(
        out,
        "AWS backend on {endpoint}, {n} heartbeats a phase, the heartbeat agent on (offline model):"
    );

    // Idle: nothing arrived since the last heartbeat.
    setup_store.import_agents(&fleet(n, clock.as_ref())).await?;
    let idle = rig.phase(out, |ran| format!("idle ({ran} run)")).await?;

    // Busy: one new event in each agent's window, so the heartbeat agent thinks.
    let busy_fleet = fleet(n, clock.as_ref());
    setup_store.import_agents(&busy_fleet).await?;
    for (agent, _) in &busy_fleet {
        let event =
            pulse_shared::domain::NewEvent::new("NOTE", json!({"text": "the build broke"}), None)?
                .into_event(agent.id.clone(), "bench", clock.now());
        setup_store.append(&event).await?;
    }
    // Windows end the settle time before their claim.
    let settle = EngineSettings::default().event_settle.unsigned_abs();
    tokio::time::sleep(settle + Duration::from_millis(500)).await;
    let busy = rig
        .phase(out, |ran| {
            format!("one new event each ({ran} jobs run, thoughts included)")
        })
        .await?;
    figure!(
        out,
        "  targets: idle <= 1 claim + 1 window read + 1 completion (the next heartbeat put, the record updated), other requests <= 0.1 each; <= $3 per million idle cycles"
    );
    let _ = setup
        .dynamodb
        .delete_table()
        .table_name(&table)
        .send()
        .await;
    for q in [&url, &hooks_url] {
        let _ = setup.sqs.delete_queue().queue_url(q).send().await;
    }
    Ok(json!({ "heartbeats": n, "idle": idle, "one_event": busy }))
}

/// `pulse bench turn`: the worker's own cost per conversation turn (receive, context,
/// persist, ack; the offline model, no Discord) with histories of each size.
pub(crate) async fn turn(sizes: &[usize], turns: usize, out: &Out) -> Result<(), Failure> {
    if !(1..=10_000).contains(&turns) {
        return Err(Failure::Input(format!(
            "invalid --turns {turns}: use 1 to 10000"
        )));
    }
    if sizes.is_empty() || sizes.iter().any(|&s| s > 1_000_000) {
        return Err(Failure::Input(
            "invalid --history: give sizes from 0 to 1000000, e.g. 10,1000,10000".into(),
        ));
    }
    let mut rows = Vec::new();
    figure!(
        out,
        "conversation turns on the embedded store, offline model, {turns} turns per size:"
    );
    for &size in sizes {
        let per_turn_ms = turns_with_history(size, turns).await?;
        figure!(
            out,
            "  history {size:>7} messages: {per_turn_ms:.3} ms per turn (goal <= 1 ms)"
        );
        rows.push(json!({ "history": size, "ms_per_turn": per_turn_ms }));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let ratio = last["ms_per_turn"].as_f64().unwrap_or(0.0)
            / first["ms_per_turn"]
                .as_f64()
                .unwrap_or(1.0)
                .max(f64::MIN_POSITIVE);
        figure!(
            out,
            "  largest / smallest history: {ratio:.2}x (flat is ~1x: a turn reads a bounded slice of history)"
        );
    }
    if out.json {
        out.json_value(&json!({ "turns": turns, "sizes": rows }));
    }
    Ok(())
}

/// A fresh embedded store in `dir` with default settings, and one agent in it.
pub(super) async fn bench_agent(
    dir: &std::path::Path,
    clock: Arc<dyn Clock>,
) -> Result<(Config, Connected, pulse_shared::domain::Agent), Failure> {
    bench_agent_with(dir, clock, pulse_shared::config::Durability::Synced, false).await
}

/// [`bench_agent`] on a store that acknowledges as `durability` says, opened through the
/// faults' file system when `through_faults` (where a `SlowDisk` slows the syncs).
pub(super) async fn bench_agent_with(
    dir: &std::path::Path,
    clock: Arc<dyn Clock>,
    durability: pulse_shared::config::Durability,
    through_faults: bool,
) -> Result<(Config, Connected, pulse_shared::domain::Agent), Failure> {
    let path = dir.join("bench.db");
    let config = Config {
        backend: Backend::Sqlite { path: path.clone() },
        durability,
        ..Config::defaults()
    };
    let now = clock.now();
    let backend = if through_faults {
        // The faults' file system, where a `SlowDisk` slows the syncs.
        pulse_shared::app::connect_sqlite(&config, clock, move || {
            pulse_shared::adapters::sqlite::Db::open_with_faults(&path)
        })
        .await?
    } else {
        connect(&config, clock).await?
    };
    let (agent, first) = NewAgent::named("bench").create(now)?;
    backend.store.create_agent(&agent, &first).await?;
    Ok((config, backend, agent))
}

async fn turns_with_history(size: usize, turns: usize) -> Result<f64, Failure> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (config, backend, agent) = bench_agent(dir.path(), clock.clone()).await?;
    seed_history(backend.store.as_ref(), &agent, size, clock.now()).await?;
    let worker = backend.worker(clock.clone(), &config.engine, &offline_services());
    let mut busy = Duration::ZERO;
    for i in 0..turns {
        let signal = Signal::user_message(
            &agent.id,
            &agent.session,
            &format!("message {i}: how is the project going?"),
            SignalMeta::default(),
            clock.now(),
        )?;
        intake::submit(backend.store.as_ref(), backend.queue.as_ref(), signal).await?;
        let started = Instant::now();
        let report = worker
            .poll_once(backend.queue.as_ref(), 10, Duration::from_secs(300))
            .await?;
        busy += started.elapsed();
        if report.received != 1 || report.failed != 0 {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "turn {i}: received {} messages, {} failed",
                report.received,
                report.failed
            )));
        }
    }
    let answered = backend.store.recent_messages(&agent.id, 2 * turns).await?;
    if answered
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count()
        < turns
    {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "fewer replies than turns were stored"
        )));
    }
    Ok(busy.as_secs_f64() * 1000.0 / turns as f64)
}

/// Writes `size` messages of history (user and reply in turns), older than now.
async fn seed_history(
    store: &dyn Store,
    agent: &pulse_shared::domain::Agent,
    size: usize,
    now: jiff::Timestamp,
) -> Result<(), Failure> {
    let start_ms = now.as_millisecond() as u64 - size as u64 - 1_000;
    for k in 0..size.div_ceil(2) {
        let signal = SignalId::generate(start_ms + k as u64);
        let id = TurnId::for_signal(&signal);
        let turn = Turn {
            id: id.clone(),
            agent_id: agent.id.clone(),
            session: agent.session.clone(),
            signals: vec![signal],
            status: TurnStatus::Done,
            parts: vec!["ok".into()],
            delivered: 1,
            target: ReplyTarget::None,
            discord_message_ids: Vec::new(),
            provider: ProviderKind::Offline.to_string(),
            model: "offline".into(),
            usage: Usage::default(),
            cost_usd: None,
            steps: Vec::new(),
            error: None,
            created_at: now,
            completed_at: Some(now),
            requests: None,
            spoken_by: None,
            trace_id: None,
            seen: None,
        };
        let text =
            "a message of history, about as long as a short chat line, to fill the context. "
                .repeat(2);
        let messages: Vec<ConversationMessage> = [Role::User, Role::Assistant]
            .into_iter()
            .take(if 2 * k + 1 == size { 1 } else { 2 })
            .enumerate()
            .map(|(n, role)| ConversationMessage {
                id: format!("{id}.{n:02}"),
                agent_id: agent.id.clone(),
                turn_id: id.clone(),
                role,
                source: "bench".into(),
                agent: None,
                author: None,
                content: text.clone(),
                created_at: now,
                waiting: false,
            })
            .collect();
        store.begin_turn(&turn, &messages).await?;
    }
    Ok(())
}
