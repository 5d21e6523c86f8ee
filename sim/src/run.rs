//! One simulated run: the shards run side by side, each on virtual time — the real
//! sweeper, workers and hook dispatcher driven with the user's traffic and the
//! operator's changes, faults injected throughout; then a quiet drain, and the
//! invariants checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use pulse_shared::domain::{AgentChanges, AgentId, Interval};
use pulse_shared::ports::Clock;
use tokio::task::JoinHandle;

use crate::faults::{Fault, lock};
use crate::queue::Role;
use crate::report::Report;
use crate::setup::{
    DRAIN, EVENTS_PER_AGENT_HOUR, MESSAGES_PER_CHATTER_HOUR, OPERATOR_EVERY, Options, START,
    SWEEP_EVERY, Shard, Sim, SimClock, SimError, VISIBILITY, WORKERS, fail, set_up, shards,
};

/// Runs the simulation `options` describe and checks it.
pub fn run(options: &Options) -> Result<Report, SimError> {
    let wall = Instant::now();
    let shards = shards(options);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<Mutex<Option<Result<Report, SimError>>>> =
        shards.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for t in 0..cores.min(shards.len()) {
            let (shards, next, done) = (&shards, &next, &done);
            let spawned = std::thread::Builder::new()
                .name(format!("pulse-sim-{t}"))
                // Deep futures run on this thread's stack.
                .stack_size(16 << 20)
                .spawn_scoped(scope, move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(shard) = shards.get(i) else { break };
                        *lock(&done[i]) = Some(run_shard(shard));
                    }
                });
            if let Err(e) = spawned {
                // The shards it would have run wait for the threads that did start.
                if t == 0 {
                    return Err(fail("a simulation thread")(&e));
                }
            }
        }
        Ok(())
    })?;
    let mut report: Option<Report> = None;
    for (shard, result) in shards.iter().zip(done) {
        let mut one = result
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| Err(SimError(format!("shard {} did not run", shard.index))))?;
        if shards.len() > 1 {
            one.name_shard(shard.index);
        }
        match report.as_mut() {
            None => report = Some(one),
            Some(r) => r.absorb(one),
        }
    }
    let mut report = report.ok_or_else(|| SimError("no shard ran".into()))?;
    report.seed = options.seed;
    report.agents = options.agents;
    report.shard_agents = options.shard_agents;
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}

/// Runs one shard on this thread: its own runtime, on virtual time.
fn run_shard(shard: &Shard) -> Result<Report, SimError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| fail("the runtime")(&e))?;
    // The AWS SDK draws its retry backoff's jitter from this thread's generator.
    fastrand::seed(shard.options.seed ^ 0x0b4c_c0ff);
    // Tasks are local: one thread runs them all, in the order the seed leads to.
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, simulate(shard))
}

async fn simulate(shard: &Shard) -> Result<Report, SimError> {
    let options = &shard.options;
    let start: Timestamp = START.parse().map_err(|e| fail("the start time")(&e))?;
    let clock: Arc<dyn Clock> = Arc::new(SimClock {
        start,
        base: tokio::time::Instant::now(),
    });
    let ids_clock = clock.clone();
    // Ids and the engine's own random choices come from the seed too.
    let _entropy = pulse_shared::entropy::seed(options.seed ^ 0x05ee_d1d5, move || {
        ids_clock.now().as_millisecond().max(0) as u64
    });
    let sim = Arc::new(set_up(shard, clock).await?);

    arm(&sim, true);
    let mut tasks = Tasks::default();
    tasks.start(&sim);
    let traffic = vec![
        tokio::task::spawn_local(events(sim.clone())),
        tokio::task::spawn_local(messages(sim.clone())),
        tokio::task::spawn_local(operator(sim.clone())),
    ];
    supervise(&sim, &mut tasks, options.duration).await;

    // The quiet drain: no faults, no new traffic, paused agents resumed.
    arm(&sim, false);
    for t in traffic {
        t.abort();
    }
    let paused: Vec<AgentId> = lock(&sim.ledger).paused.iter().cloned().collect();
    for id in paused {
        if sim.lifecycle.resume(&id).await.is_ok() {
            lock(&sim.ledger).paused.remove(&id);
        }
    }
    supervise(&sim, &mut tasks, DRAIN).await;
    tasks.stop();
    // Let aborted tasks drop their futures.
    tokio::task::yield_now().await;

    let report = crate::check::check(&sim, shard).await;
    if let Some(aws) = &sim.aws {
        aws.emulated.remove().await;
    }
    report
}

/// Faults on or off: the dice, and on the AWS backend the faults beneath the SDK.
fn arm(sim: &Sim, on: bool) {
    sim.dice.arm(on);
    if let Some(aws) = &sim.aws {
        let seed = sim.dice.seed();
        aws.emulated.arm(seed, on, sim.dice.mix().aws());
    }
}

/// The long-lived tasks: the sweeper, the workers and the dispatcher.
#[derive(Default)]
struct Tasks {
    running: BTreeMap<Role, JoinHandle<()>>,
    sweeper: Option<JoinHandle<()>>,
}

impl Tasks {
    fn start(&mut self, sim: &Arc<Sim>) {
        self.sweeper = Some(tokio::task::spawn_local(sweeps(sim.clone())));
        for n in 0..WORKERS {
            self.spawn(sim, Role::Worker(n));
        }
        self.spawn(sim, Role::Dispatcher);
    }

    fn spawn(&mut self, sim: &Arc<Sim>, role: Role) {
        let handle = match role {
            Role::Worker(_) => tokio::task::spawn_local(work(sim.clone())),
            Role::Dispatcher => tokio::task::spawn_local(dispatch(sim.clone())),
        };
        lock(&sim.policy.roles).insert(handle.id(), role);
        if let Some(old) = self.running.insert(role, handle) {
            lock(&sim.policy.roles).remove(&old.id());
            old.abort();
        }
    }

    fn stop(&mut self) {
        for (_, h) in std::mem::take(&mut self.running) {
            h.abort();
        }
        if let Some(h) = self.sweeper.take() {
            h.abort();
        }
    }
}

/// Runs for `span` of virtual time: replaces the tasks the dice killed (their futures
/// are dropped where they stopped) and sends the user messages the world decided to send
/// while a heartbeat ran.
async fn supervise(sim: &Arc<Sim>, tasks: &mut Tasks, span: Duration) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(aws) = &sim.aws {
            aws.visibility.tick().await;
        }
        let doomed: Vec<Role> = std::mem::take(&mut *lock(&sim.policy.doomed));
        for role in doomed {
            tasks.spawn(sim, role);
        }
        let interrupting: Vec<AgentId> = std::mem::take(&mut *lock(&sim.world.interruptions));
        for agent in interrupting {
            say(sim, &agent).await;
        }
    }
}

async fn sweeps(sim: Arc<Sim>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        if sim.dice.roll(Fault::SweepOverlap) {
            // A slow sweep still running when the next minute's starts.
            let other = sim.clone();
            let lag = sim.dice.between(Duration::ZERO, Duration::from_secs(5));
            tokio::task::spawn_local(async move {
                tokio::time::sleep(lag).await;
                other.sweeper.sweep_once(other.clock.now()).await;
            });
        }
        sim.sweeper.sweep_once(sim.clock.now()).await;
    }
}

/// Waits after finding a queue empty: on the AWS backend, until a message may have
/// arrived, or at most the idle time.
async fn idle(sim: &Sim, hooks: bool) {
    let Some(aws) = &sim.aws else {
        return tokio::time::sleep(sim.idle).await;
    };
    let v = &aws.visibility;
    let arrived = if hooks {
        v.hooks_arrived.notified()
    } else {
        v.sessions_arrived.notified()
    };
    let _ = tokio::time::timeout(sim.idle, arrived).await;
}

async fn work(sim: Arc<Sim>) {
    loop {
        let queue = sim.connected.queue.clone();
        match sim.worker.poll_once(queue.as_ref(), 10, VISIBILITY).await {
            Ok(r) if r.received > 0 => {}
            _ => idle(&sim, false).await,
        }
    }
}

async fn dispatch(sim: Arc<Sim>) {
    loop {
        match sim.dispatcher.poll_once(10, VISIBILITY).await {
            Ok(r) if r.handled > 0 => {}
            _ => idle(&sim, true).await,
        }
    }
}

/// The agents' webhooks: events arrive as a Poisson process over the whole fleet, each a
/// signed request through the receiver.
async fn events(sim: Arc<Sim>) {
    let n = sim.agents.len().max(1);
    let mean = Duration::from_secs_f64(3600.0 / (n as f64 * EVENTS_PER_AGENT_HOUR));
    loop {
        tokio::time::sleep(sim.dice.exponential(mean)).await;
        let agent = sim.agents[sim.dice.below(n as u64) as usize].clone();
        if lock(&sim.ledger).deleted.contains(&agent) {
            continue;
        }
        crate::inbound::send_event(&sim, &agent).await;
    }
}

/// The chatting users.
async fn messages(sim: Arc<Sim>) {
    let n = sim.chatting.len();
    if n == 0 {
        return;
    }
    let mean = Duration::from_secs_f64(3600.0 / (n as f64 * MESSAGES_PER_CHATTER_HOUR));
    loop {
        tokio::time::sleep(sim.dice.exponential(mean)).await;
        let agent = sim.chatting[sim.dice.below(n as u64) as usize].clone();
        say(&sim, &agent).await;
    }
}

/// A user message to `agent`, as Discord delivers one: half as a slash command through
/// the receiver's router (answered through the interaction), half as a channel message
/// through the gateway's handling (answered in the channel). When it cannot be queued, the user sends
/// it again.
async fn say(sim: &Arc<Sim>, agent: &AgentId) {
    if lock(&sim.ledger).deleted.contains(agent) {
        return;
    }
    let Ok(Some(a)) = sim.inner.get_agent(agent).await else {
        return;
    };
    let slash = sim.dice.below(2) == 0;
    for _ in 0..10 {
        let queued = if slash {
            crate::inbound::send_message(sim, &a).await
        } else {
            crate::inbound::channel_message(sim, &a).await
        };
        if let Some(id) = queued {
            sim.queued_message(agent, id);
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The operator: pauses agents (resuming them later), changes their interval, deletes
/// a few.
async fn operator(sim: Arc<Sim>) {
    let n = sim.agents.len() as u64;
    let chances = n.div_ceil(1000);
    loop {
        tokio::time::sleep(OPERATOR_EVERY).await;
        for _ in 0..chances {
            operate(&sim).await;
        }
    }
}

/// One round of the operator's chances.
async fn operate(sim: &Arc<Sim>) {
    let n = sim.agents.len() as u64;
    let pick = |sim: &Sim| sim.agents[sim.dice.below(n) as usize].clone();
    if sim.dice.roll(Fault::AgentPaused) {
        let id = pick(sim);
        if !lock(&sim.ledger).deleted.contains(&id) {
            // Counted as paused whatever the answer: a failure may have come after
            // the pause took effect.
            lock(&sim.ledger).paused.insert(id.clone());
            let _ = sim.lifecycle.pause(&id).await;
            let later = sim.clone();
            let wait = sim
                .dice
                .between(Duration::from_secs(1200), Duration::from_secs(7200));
            tokio::task::spawn_local(async move {
                tokio::time::sleep(wait).await;
                if later.lifecycle.resume(&id).await.is_ok() {
                    lock(&later.ledger).paused.remove(&id);
                }
            });
        }
    }
    if sim.dice.roll(Fault::AgentUpdated) {
        let id = pick(sim);
        let minutes = [10, 15, 20][sim.dice.below(3) as usize];
        let changes = AgentChanges {
            interval: Interval::new(SignedDuration::from_mins(minutes)).ok(),
            ..AgentChanges::default()
        };
        let _ = sim.lifecycle.update(&id, &changes).await;
    }
    if sim.dice.roll(Fault::ApprovalParked) {
        crate::approvals::park_one(sim).await;
    }
    if sim.dice.roll(Fault::AgentDeleted) {
        let id = pick(sim);
        // Counted as deleted from the first attempt: a failed delete may have
        // removed part of it.
        lock(&sim.ledger).deleted.insert(id.clone());
        for _ in 0..5 {
            if sim.lifecycle.delete(&id, true).await.is_ok() {
                break;
            }
        }
    }
}
