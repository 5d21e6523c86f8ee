//! One simulated run: the fleet and its outside world set up on a fresh embedded store,
//! the real sweeper, workers and hook dispatcher driven on virtual time with the user's
//! traffic and the operator's changes, faults injected throughout; then a quiet drain,
//! and the invariants checked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use pulse_shared::adapters::sqlite::{Db, SqliteHookQueue, SqliteQueue, SqliteStore};
use pulse_shared::app::{Connected, Services};
use pulse_shared::domain::{
    AgentChanges, AgentId, EventId, EventType, Hook, HookTarget, HookType, Interval, NewAgent,
    NewEvent, Signal, SignalId, SignalMeta, Subscription, SubscriptionId, Tool, ToolName,
};
use pulse_shared::engine::{
    DispatchSettings, Dispatcher, EngineSettings, Lifecycle, Sweeper, Worker, intake,
};
use pulse_shared::ports::{Clock, HookQueue, SessionQueue, Store};
use tokio::task::JoinHandle;

use crate::faults::{Dice, Fault, Mix, lock};
use crate::queue::{Role, SimHookQueue, SimPolicy, SimQueue};
use crate::report::Report;
use crate::store::FaultyStore;
use crate::world::{PING, SimDiscord, SimHooks, SimLlm, SimTools, TOOL, TOOL_TIMEOUT, World};

/// Every agent's heartbeat interval.
pub const INTERVAL: SignedDuration = SignedDuration::from_mins(15);
/// How often the sweeper runs (EventBridge's rate in the deployment).
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Workers taking jobs from the sessions queue at once.
const WORKERS: usize = 3;
/// How long a received message stays hidden before it is delivered again.
const VISIBILITY: Duration = Duration::from_secs(300);
/// Events each agent's webhook receives per hour, on average.
const EVENTS_PER_AGENT_HOUR: f64 = 0.25;
/// Messages each chatting user sends per hour, on average.
const MESSAGES_PER_CHATTER_HOUR: f64 = 0.5;
/// One agent in this many has a hook (AFTER_HEARTBEAT).
const HOOKED_ONE_IN: usize = 10;
/// One agent in this many chats with its user.
const CHATTING_ONE_IN: usize = 20;
/// How often the operator may pause, change or delete agents: each time, one chance of
/// each per thousand agents.
const OPERATOR_EVERY: Duration = Duration::from_secs(600);
/// After the simulated duration, how long the system runs with no faults and no new
/// traffic before the invariants are checked: two intervals and the lease, so every
/// event has been reached and every held lease has expired.
const DRAIN: Duration = Duration::from_secs(2 * 15 * 60 + 15 * 60);
/// The virtual start of every run.
const START: &str = "2026-01-05T00:00:00Z";

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Options {
    /// Agents in the fleet.
    pub agents: usize,
    /// Simulated time, before the drain.
    pub duration: Duration,
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// The faults and their rates.
    pub mix: Mix,
    /// Where to keep the run's database for inspection with the other `pulse` commands
    /// (`PULSE_DB=FILE`; a fleet in several shards keeps shard N's in `FILE.shardN`); in
    /// memory when `None`.
    pub keep: Option<std::path::PathBuf>,
    /// The most agents one shard holds: [`SHARD_AGENTS`], unless testing the split.
    pub shard_agents: usize,
}

/// Why a run could not be made (not an invariant violation: those are in the report).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SimError(pub String);

fn fail(what: &str) -> impl Fn(&dyn std::fmt::Display) -> SimError + '_ {
    move |e| SimError(format!("{what}: {e}"))
}

/// The virtual clock: tokio's paused time, from a fixed start.
struct SimClock {
    start: Timestamp,
    base: tokio::time::Instant,
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let d = SignedDuration::try_from(self.base.elapsed()).unwrap_or(SignedDuration::MAX);
        self.start.saturating_add(d).unwrap_or(self.start)
    }
}

/// What the run keeps track of besides the store.
#[derive(Default)]
pub(crate) struct Ledger {
    /// The events the agents' webhooks took in, by agent.
    pub events: BTreeMap<AgentId, Vec<EventId>>,
    /// The user messages queued, by agent.
    pub messages: BTreeMap<AgentId, Vec<SignalId>>,
    /// Agents deleted by the operator.
    pub deleted: BTreeSet<AgentId>,
    /// Agents paused now.
    pub paused: BTreeSet<AgentId>,
}

/// Everything a running simulation shares.
pub(crate) struct Sim {
    pub dice: Arc<Dice>,
    pub clock: Arc<dyn Clock>,
    pub policy: Arc<SimPolicy>,
    pub world: Arc<World>,
    /// The store with no faults: the receiver's side, the set-up and the checks.
    pub inner: Arc<dyn Store>,
    pub connected: Connected,
    pub sweeper: Sweeper,
    pub worker: Arc<Worker>,
    pub dispatcher: Arc<Dispatcher>,
    pub lifecycle: Lifecycle,
    pub agents: Vec<AgentId>,
    pub chatting: Vec<AgentId>,
    pub ledger: Mutex<Ledger>,
    /// The sessions queue without faults, for the checks.
    pub queue: SqliteQueue,
}

/// The most agents one simulated deployment holds, unless [`Options::shard_agents`] says
/// otherwise. A larger fleet is simulated as shards of near-equal size, each a deployment
/// of its own (store, sweeper, workers, dispatcher, outside world) driven by a seed drawn
/// from the run's, run side by side on the machine's cores; the report sums them. The
/// split follows from the options alone, never from the machine, so a seed replays the
/// same run on any machine.
pub const SHARD_AGENTS: usize = 5_000;

/// One shard of a run: which of the fleet's agents it holds, and its own seed.
#[derive(Clone, Debug)]
pub(crate) struct Shard {
    /// Its place among the shards, from 0.
    pub index: usize,
    /// The fleet number of its first agent (agent names and roles follow the fleet's
    /// numbering, so a fleet plays the same parts however it is split).
    pub first: usize,
    /// Its options: its agents, its seed, its database file.
    pub options: Options,
}

/// How a run is split: shard 0 keeps the run's seed (a fleet of one shard is simulated
/// exactly as it would be unsplit); each other shard's seed is mixed from the run's seed
/// and its index.
pub(crate) fn shards(options: &Options) -> Vec<Shard> {
    let size = options.shard_agents.max(1);
    let n = options.agents.div_ceil(size).max(1);
    let (base, extra) = (options.agents / n, options.agents % n);
    let mut first = 0;
    (0..n)
        .map(|index| {
            let agents = base + usize::from(index < extra);
            let seed = if index == 0 {
                options.seed
            } else {
                fastrand::Rng::with_seed(options.seed ^ (index as u64).rotate_left(32)).u64(..)
            };
            let keep = options.keep.as_ref().map(|p| {
                if index == 0 {
                    p.clone()
                } else {
                    let mut name = p.as_os_str().to_owned();
                    name.push(format!(".shard{index}"));
                    name.into()
                }
            });
            let shard = Shard {
                index,
                first,
                options: Options {
                    agents,
                    seed,
                    keep,
                    ..options.clone()
                },
            };
            first += agents;
            shard
        })
        .collect()
}

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

    sim.dice.arm(true);
    let mut tasks = Tasks::default();
    tasks.start(&sim);
    let traffic = vec![
        tokio::task::spawn_local(events(sim.clone())),
        tokio::task::spawn_local(messages(sim.clone())),
        tokio::task::spawn_local(operator(sim.clone())),
    ];
    supervise(&sim, &mut tasks, options.duration).await;

    // The quiet drain: no faults, no new traffic, paused agents resumed.
    sim.dice.arm(false);
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

    crate::check::check(&sim, shard).await
}

async fn set_up(shard: &Shard, clock: Arc<dyn Clock>) -> Result<Sim, SimError> {
    let options = &shard.options;
    let dice = Arc::new(Dice::new(options.seed, options.mix.clone()));
    if let Some(p) = options.keep.as_ref().filter(|p| p.exists()) {
        return Err(SimError(format!(
            "{} exists: give a new file to keep the run's database in",
            p.display()
        )));
    }
    let db = Db::open_simulated(options.keep.as_deref()).map_err(|e| fail("the database")(&e))?;
    let keys = pulse_shared::sealing::EncryptionKeys::parse(
        &pulse_shared::sealing::EncryptionKeys::new_key(),
        None,
    )
    .map_err(|e| fail("the encryption key")(&e))?;
    let inner: Arc<dyn Store> = Arc::new(SqliteStore::new(db.clone()).with_keys(keys));
    let policy = Arc::new(SimPolicy::new(dice.clone()));
    let store: Arc<dyn Store> = Arc::new(FaultyStore::new(inner.clone(), policy.clone()));
    let session_queue = SqliteQueue::new(db.clone(), clock.clone());
    let hook_queue = SqliteHookQueue::new(db, clock.clone());
    let queue: Arc<dyn SessionQueue> = Arc::new(SimQueue {
        inner: Arc::new(session_queue.clone()),
        policy: policy.clone(),
    });
    let hooks: Arc<dyn HookQueue> = Arc::new(SimHookQueue {
        inner: Arc::new(hook_queue),
        policy: policy.clone(),
    });
    let connected = Connected {
        store: store.clone(),
        queue,
        hooks: Some(hooks.clone()),
        bus: None,
        aws_requests: None,
        orphans: None,
    };

    // The fleet: every agent on the same interval, first heartbeats spread over it.
    let now = clock.now();
    let mut fleet = Vec::with_capacity(options.agents);
    let mut chatting = Vec::new();
    let mut chatters = BTreeMap::new();
    for i in shard.first..shard.first + options.agents {
        let mut new = NewAgent::named(format!("sim-{i}"));
        new.interval = Interval::new(INTERVAL).map_err(|e| fail("the interval")(&e))?;
        if i % CHATTING_ONE_IN == 0 {
            new.discord_channel = Some(format!("{}", 100_000_000_000_000_000u64 + i as u64));
        }
        let (agent, mut first) = new.create(now).map_err(|e| fail("an agent")(&e))?;
        let offset = dice.between(Duration::ZERO, INTERVAL.unsigned_abs());
        first.scheduled_at = now
            .saturating_add(SignedDuration::try_from(offset).unwrap_or_default())
            .unwrap_or(now);
        if i % CHATTING_ONE_IN == 0 {
            chatting.push(agent.id.clone());
            chatters.insert(agent.name.clone(), agent.id.clone());
        }
        fleet.push((agent, first));
    }
    for chunk in fleet.chunks(1000) {
        inner
            .import_agents(chunk)
            .await
            .map_err(|e| fail("importing agents")(&e))?;
    }
    let tool_name = ToolName::parse(TOOL).map_err(|e| fail("the tool")(&e))?;
    let tool = Tool::http(
        tool_name.clone(),
        "https://tool.sim.example/echo",
        TOOL_TIMEOUT,
        now,
    )
    .map_err(|e| fail("the tool")(&e))?;
    inner
        .add_tool(&tool)
        .await
        .map_err(|e| fail("the tool")(&e))?;
    let event_type = EventType::parse(PING).map_err(|e| fail("the event type")(&e))?;
    inner
        .add_subscription(&Subscription {
            id: SubscriptionId::for_route(&tool_name, &event_type, None),
            tool: tool_name,
            event_type,
            agent_id: None,
            filter: Default::default(),
            order: 0,
            active: true,
            created_at: now,
        })
        .await
        .map_err(|e| fail("the subscription")(&e))?;
    let hook_type =
        HookType::parse(HookType::AFTER_HEARTBEAT).map_err(|e| fail("the hook type")(&e))?;
    let target =
        HookTarget::parse("https://hooks.sim.example/pulse").map_err(|e| fail("the hook")(&e))?;
    let hooked = fleet
        .iter()
        .zip(shard.first..)
        .filter(|(_, i)| i % HOOKED_ONE_IN == 0);
    for ((agent, _), _) in hooked {
        let hook = Hook::new(
            agent.id.clone(),
            hook_type.clone(),
            target.clone(),
            "whsec_c2ltdWxhdGVkIHNlY3JldCBvZiAzMiBieXRlcyE=",
            now,
        );
        inner
            .create_hook(&hook)
            .await
            .map_err(|e| fail("a hook")(&e))?;
    }

    let world = Arc::new(World::new(
        dice.clone(),
        clock.clone(),
        inner.clone(),
        chatters,
    ));
    let services = Services {
        llm: Arc::new(SimLlm {
            world: world.clone(),
        }),
        discord: Some(Arc::new(SimDiscord {
            world: world.clone(),
        })),
        egress: pulse_egress::Egress::new(pulse_egress::AllowList::default()),
    };
    let settings = EngineSettings::default();
    let tools = Arc::new(SimTools {
        world: world.clone(),
        builtin: connected.tools(clock.clone(), &services),
    });
    let runner = connected.runner(clock.clone(), &settings, tools);
    let worker = Worker::new(Arc::new(runner))
        .with_conversation(Arc::new(connected.conversation(clock.clone(), &services)));
    let dispatcher = Dispatcher::new(
        store,
        hooks,
        Arc::new(SimHooks {
            world: world.clone(),
        }),
        clock.clone(),
        DispatchSettings::default(),
    );
    Ok(Sim {
        sweeper: connected.sweeper(&settings),
        lifecycle: connected.lifecycle(clock.clone(), &settings),
        worker: Arc::new(worker),
        dispatcher: Arc::new(dispatcher),
        agents: fleet.into_iter().map(|(a, _)| a.id).collect(),
        chatting,
        dice,
        clock,
        policy,
        world,
        inner,
        connected,
        ledger: Mutex::default(),
        queue: session_queue,
    })
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

async fn work(sim: Arc<Sim>) {
    loop {
        let queue = sim.connected.queue.clone();
        match sim.worker.poll_once(queue.as_ref(), 10, VISIBILITY).await {
            Ok(r) if r.received > 0 => {}
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

async fn dispatch(sim: Arc<Sim>) {
    loop {
        match sim.dispatcher.poll_once(10, VISIBILITY).await {
            Ok(r) if r.handled > 0 => {}
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The agents' webhooks: events arrive as a Poisson process over the whole fleet.
async fn events(sim: Arc<Sim>) {
    let n = sim.agents.len().max(1);
    let mean = Duration::from_secs_f64(3600.0 / (n as f64 * EVENTS_PER_AGENT_HOUR));
    loop {
        tokio::time::sleep(sim.dice.exponential(mean)).await;
        let agent = sim.agents[sim.dice.below(n as u64) as usize].clone();
        if lock(&sim.ledger).deleted.contains(&agent) {
            continue;
        }
        let Ok(new) = NewEvent::new(PING, serde_json::json!({"n": 1}), None) else {
            continue;
        };
        let event = new.into_event(agent.clone(), "webhook", sim.clock.now());
        // The receiver's write: it answers 2xx only once this is stored.
        if sim.inner.append(&event).await.is_ok() {
            lock(&sim.ledger)
                .events
                .entry(agent)
                .or_default()
                .push(event.id);
        }
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

/// A user message to `agent`, queued as the receiver queues one.
async fn say(sim: &Sim, agent: &AgentId) {
    if lock(&sim.ledger).deleted.contains(agent) {
        return;
    }
    let Ok(Some(a)) = sim.inner.get_agent(agent).await else {
        return;
    };
    let Ok(signal) = Signal::user_message(
        &a.id,
        &a.session,
        "how is it going?",
        SignalMeta::default(),
        sim.clock.now(),
    ) else {
        return;
    };
    let id = signal.id.clone();
    let (store, queue) = (sim.inner.clone(), sim.connected.queue.clone());
    // The receiver retries until the message is queued: it answered the user.
    for _ in 0..10 {
        if intake::submit(store.as_ref(), queue.as_ref(), signal.clone())
            .await
            .is_ok()
        {
            lock(&sim.ledger)
                .messages
                .entry(agent.clone())
                .or_default()
                .push(id);
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
