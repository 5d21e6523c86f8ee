//! Setting a shard up: the run's options and constants, the fleet and its outside world
//! on a fresh embedded store with faults around its ports, and the engine over them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use pulse_shared::adapters::sqlite::{Db, SqliteHookQueue, SqliteQueue, SqliteStore};
use pulse_shared::app::{Connected, Services};
use pulse_shared::config::InboundConfig;
use pulse_shared::domain::{
    AgentId, EventId, EventType, Hook, HookTarget, HookType, Interval, NewAgent, SignalId,
    Subscription, SubscriptionId, Tool, ToolName, Webhook, WebhookId, WebhookScheme,
};
use pulse_shared::engine::{
    DispatchSettings, Dispatcher, EngineSettings, Lifecycle, Sweeper, Worker,
};
use pulse_shared::ports::{Clock, HookQueue, SessionQueue, Store};

use crate::aws::{Emulated, Visibility};
use crate::faults::{Dice, Mix};
use crate::queue::{SimHookQueue, SimPolicy, SimQueue};
use crate::report::Invariant;
use crate::store::FaultyStore;
use crate::world::{PING, SimDiscord, SimHooks, SimLlm, SimTools, TOOL, TOOL_TIMEOUT, World};

/// Every agent's heartbeat interval.
pub const INTERVAL: SignedDuration = SignedDuration::from_mins(15);
/// How often the sweeper runs (EventBridge's rate in the deployment).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Workers taking jobs from the sessions queue at once.
pub(crate) const WORKERS: usize = 3;
/// How long a received message stays hidden before it is delivered again.
pub(crate) const VISIBILITY: Duration = Duration::from_secs(300);
/// Events each agent's webhook receives per hour, on average.
pub(crate) const EVENTS_PER_AGENT_HOUR: f64 = 0.25;
/// Messages each chatting user sends per hour, on average.
pub(crate) const MESSAGES_PER_CHATTER_HOUR: f64 = 0.5;
/// One agent in this many has a hook (AFTER_HEARTBEAT).
pub(crate) const HOOKED_ONE_IN: usize = 10;
/// One agent in this many chats with its user.
pub(crate) const CHATTING_ONE_IN: usize = 20;
/// How often the operator may pause, change or delete agents: each time, one chance of
/// each per thousand agents.
pub(crate) const OPERATOR_EVERY: Duration = Duration::from_secs(600);
/// After the simulated duration, how long the system runs with no faults and no new
/// traffic before the invariants are checked: two intervals and the lease, so every
/// event has been reached and every held lease has expired.
pub(crate) const DRAIN: Duration = Duration::from_secs(2 * 15 * 60 + 15 * 60);
/// The virtual start of every run.
pub(crate) const START: &str = "2026-01-05T00:00:00Z";
/// Every agent's webhook accepts this many deliveries a clock hour: low, so a sender's
/// burst goes past it.
pub(crate) const WEBHOOK_LIMIT: u32 = 12;
/// The seed of the simulated Discord application's signing key.
pub(crate) const DISCORD_SEED: [u8; 32] = [7; 32];
/// The simulated Discord bot's user id: channel messages mention it.
pub(crate) const BOT: &str = "1300000000000000000";
/// Every agent's webhook secret (Standard Webhooks), which its sender signs with.
pub(crate) const WEBHOOK_SECRET: &str = "whsec_c2ltdWxhdGVkIHdlYmhvb2sgc2VjcmV0IQ==";

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
    /// The most agents one shard holds: [`crate::SHARD_AGENTS`], unless testing the split.
    pub shard_agents: usize,
    /// Where the run keeps its state.
    pub backend: SimBackend,
}

/// Where a run keeps its state: the two sets of adapters `pulse serve` and the Lambda
/// functions run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimBackend {
    /// The embedded store and its queues (SQLite), in memory or in the file to keep.
    Embedded,
    /// The AWS adapters (DynamoDB and SQS) over the emulator at `endpoint` (moto), each
    /// shard on a table and queues of its own, deleted after the run; faults are also
    /// injected beneath the SDK (see the `aws` module).
    Aws {
        /// The emulator's URL, e.g. `http://127.0.0.1:5000`.
        endpoint: String,
    },
}

impl SimBackend {
    /// How long a worker or the dispatcher waits after finding its queue empty: a
    /// second on the embedded store; on the emulator, where each look is a request,
    /// until a message is sent or comes back (as Lambda's event source mapping invokes
    /// a function), or a minute at most.
    pub(crate) fn idle(&self) -> Duration {
        match self {
            Self::Embedded => Duration::from_secs(1),
            Self::Aws { .. } => Duration::from_secs(60),
        }
    }
}

/// Why a run could not be made (not an invariant violation: those are in the report).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SimError(pub String);

pub(crate) fn fail(what: &str) -> impl Fn(&dyn std::fmt::Display) -> SimError + '_ {
    move |e| SimError(format!("{what}: {e}"))
}

/// The virtual clock: tokio's paused time, from a fixed start.
pub(crate) struct SimClock {
    /// When the run starts, in virtual time.
    pub(crate) start: Timestamp,
    /// The paused runtime's instant it started at.
    pub(crate) base: tokio::time::Instant,
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
    /// Calls parked for approval, with the decisions their deciders were told they made.
    pub approvals: BTreeMap<pulse_shared::domain::ApprovalId, Parked>,
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
    pub queue: Checks,
    /// On the AWS backend: the emulator's resources and the queues' virtual clock.
    pub aws: Option<AwsRun>,
    /// With the power-cut fault: the recorded store and the cuts chosen.
    pub power: Option<crate::power::PowerCuts>,
    /// How long a worker or the dispatcher waits after finding its queue empty.
    pub idle: Duration,
    /// Each agent's webhook.
    pub webhooks: BTreeMap<AgentId, WebhookId>,
    /// The receiver's router (`POST /webhooks/{id}` and the rest), over the store with
    /// no faults, as the receiver's side is.
    pub receiver: axum::Router,
    /// Webhook deliveries: each fresh one accepted, none sent again making a second
    /// event. Checked as the receiver answers.
    pub inbound: Mutex<Invariant>,
    /// The Discord application's signing key: the users' slash commands are signed with
    /// it, and the receiver checks them with its public half.
    pub discord: pulse_signatures::discord::DiscordSigner,
    /// Discord interactions: each fresh one taken, one delivered again never taken
    /// twice, one replayed past the tolerance refused. Checked as the receiver answers.
    pub interactions: Mutex<Invariant>,
    /// The last interaction id's sequence number, for the low bits of the next.
    pub interaction_seq: std::sync::atomic::AtomicU64,
    /// The Discord gateway's handling of what arrives over its connection: the users'
    /// channel messages come in through it (over the store with no faults, queueing
    /// through the sessions queue with them).
    pub gateway: pulse_gateway::Gateway,
    /// Fresh deliveries accepted, by webhook and clock hour.
    pub hourly: Mutex<BTreeMap<(String, i64), u32>>,
    /// Webhook rate limits: deliveries accepted up to the hourly limit, refused 429 with
    /// `Retry-After` past it. Checked as the receiver answers.
    pub limits: Mutex<Invariant>,
}

impl Sim {
    /// A webhook delivery to `agent` was answered accepted as `event`.
    pub(crate) fn accepted_event(&self, agent: &AgentId, event: EventId) {
        if let Some(power) = &self.power {
            power.acknowledged(
                &self.dice,
                crate::power::Acked::Event(agent.clone(), event.clone()),
            );
        }
        crate::faults::lock(&self.ledger)
            .events
            .entry(agent.clone())
            .or_default()
            .push(event);
    }

    /// A user message to `agent` was queued as `signal`.
    pub(crate) fn queued_message(&self, agent: &AgentId, signal: SignalId) {
        if let Some(power) = &self.power {
            power.acknowledged(
                &self.dice,
                crate::power::Acked::Message(agent.clone(), signal.clone()),
            );
        }
        crate::faults::lock(&self.ledger)
            .messages
            .entry(agent.clone())
            .or_default()
            .push(signal);
    }
}

/// What the run knows of one parked call: its agent, and the decisions the deciders were
/// told they made (approve true, deny false).
pub(crate) type Parked = (pulse_shared::domain::AgentId, Vec<bool>);

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

/// The store and queues of one shard, with faults around them.
struct Backend {
    /// The store with no faults: the receiver's side, the set-up and the checks.
    inner: Arc<dyn Store>,
    policy: Arc<SimPolicy>,
    connected: Connected,
    hooks: Arc<dyn HookQueue>,
    /// The sessions queue without faults, for the checks.
    queue: Checks,
    aws: Option<AwsRun>,
    power: Option<crate::power::PowerCuts>,
}

/// A shard's run on the AWS backend.
pub(crate) struct AwsRun {
    pub emulated: Emulated,
    pub visibility: Arc<Visibility>,
}

/// The sessions queue without faults: the receiver sends to it, and the checks read it.
pub(crate) enum Checks {
    Embedded(SqliteQueue),
    Aws(Arc<crate::aws::VirtualSessions>),
}

impl Checks {
    /// The queue as the receiver sends to it.
    fn sending(&self) -> Arc<dyn SessionQueue> {
        match self {
            Self::Embedded(q) => Arc::new(q.clone()),
            Self::Aws(q) => q.clone(),
        }
    }

    /// Messages left in the queue, received or not.
    pub(crate) async fn depth(&self) -> Result<u64, pulse_shared::error::StoreError> {
        match self {
            Self::Embedded(q) => q.depth().await,
            Self::Aws(q) => q.backlog().await.map(|b| b.waiting + b.in_flight),
        }
    }

    /// The dead-lettered messages: sequence number and body. The run's SQS queue has no
    /// dead-letter queue (a message is tried until it is done), so none there.
    pub(crate) async fn dead_lettered(
        &self,
    ) -> Result<Vec<(i64, String)>, pulse_shared::error::StoreError> {
        match self {
            Self::Embedded(q) => q.dead_lettered().await,
            Self::Aws(_) => Ok(Vec::new()),
        }
    }
}

/// The agents of one shard, and which of them chat with their users.
struct Fleet {
    agents: Vec<AgentId>,
    chatting: Vec<AgentId>,
    /// Chatting agents by name, for the simulated Discord.
    chatters: BTreeMap<String, AgentId>,
    /// Each agent's webhook.
    webhooks: BTreeMap<AgentId, WebhookId>,
}

/// Sets a shard up: its store and queues (faults around them), its fleet with the tool,
/// subscription and hooks it uses, and the engine over them.
pub(crate) async fn set_up(shard: &Shard, clock: Arc<dyn Clock>) -> Result<Sim, SimError> {
    let options = &shard.options;
    let dice = Arc::new(Dice::new(options.seed, options.mix.clone()));
    let backend = match &options.backend {
        SimBackend::Embedded => open(options, &dice, &clock)?,
        SimBackend::Aws { .. } if options.mix.rate(crate::faults::Fault::PowerCut) > 0.0 => {
            return Err(SimError(
                "the power-cut fault is of the embedded store's files: run it on the sqlite backend, or choose another mix".into(),
            ));
        }
        SimBackend::Aws { endpoint } => open_aws(shard, endpoint, &dice, &clock).await?,
    };
    let fleet = seed(shard, backend.inner.as_ref(), &dice, clock.now()).await?;
    let sim = engine(backend, fleet, dice, clock, options.backend.idle());
    // The connection is up: the gateway knows the bot's own id, which messages mention.
    let ready = serde_json::json!({"op": 0, "t": "READY", "s": 0, "d": {"user": {"id": BOT}}});
    sim.gateway.on_payload(&ready.to_string()).await;
    Ok(sim)
}

/// A fresh embedded store (in memory, or in the file to keep) and its queues, each
/// behind the run's fault policy.
fn open(options: &Options, dice: &Arc<Dice>, clock: &Arc<dyn Clock>) -> Result<Backend, SimError> {
    if let Some(p) = options.keep.as_ref().filter(|p| p.exists()) {
        return Err(SimError(format!(
            "{} exists: give a new file to keep the run's database in",
            p.display()
        )));
    }
    // Events are held to the write deadline `pulse serve` keeps, on the run's clock.
    let deadline = pulse_shared::ports::event_write_timeout(EngineSettings::default().event_settle);
    let (db, power) = if options.mix.rate(crate::faults::Fault::PowerCut) > 0.0 {
        if options.keep.is_some() {
            return Err(SimError(
                "the power-cut fault keeps the run's database in a recorded file of its own: run it without --keep".into(),
            ));
        }
        let (db, power) = crate::power::PowerCuts::open().map_err(SimError)?;
        (db, Some(power))
    } else {
        let db =
            Db::open_simulated(options.keep.as_deref()).map_err(|e| fail("the database")(&e))?;
        (db, None)
    };
    let db = db.with_event_deadline(clock.clone(), deadline);
    let inner: Arc<dyn Store> = Arc::new(SqliteStore::new(db.clone()).with_keys(keys()?));
    let policy = Arc::new(SimPolicy::new(dice.clone()));
    let session_queue = SqliteQueue::new(db.clone(), clock.clone());
    let (connected, hooks) = under_policy(
        inner.clone(),
        Arc::new(session_queue.clone()),
        Arc::new(SqliteHookQueue::new(db, clock.clone())),
        &policy,
    );
    Ok(Backend {
        inner,
        policy,
        connected,
        hooks,
        queue: Checks::Embedded(session_queue),
        aws: None,
        power,
    })
}

/// The engine's side of a backend: its store and queues, each asking the run's policy
/// around every call.
fn under_policy(
    store: Arc<dyn Store>,
    sessions: Arc<dyn SessionQueue>,
    hooks: Arc<dyn HookQueue>,
    policy: &Arc<SimPolicy>,
) -> (Connected, Arc<dyn HookQueue>) {
    let hooks: Arc<dyn HookQueue> = Arc::new(SimHookQueue {
        inner: hooks,
        policy: policy.clone(),
    });
    let connected = Connected {
        store: Arc::new(FaultyStore::new(store, policy.clone())),
        queue: Arc::new(SimQueue {
            inner: sessions,
            policy: policy.clone(),
        }),
        hooks: Some(hooks.clone()),
        bus: None,
        aws_requests: None,
        orphans: None,
        keys_missing: None,
    };
    (connected, hooks)
}

/// A fresh key to seal webhook and hook secrets with.
fn keys() -> Result<pulse_shared::sealing::EncryptionKeys, SimError> {
    pulse_shared::sealing::EncryptionKeys::parse(
        &pulse_shared::sealing::EncryptionKeys::new_key(),
        None,
    )
    .map_err(|e| fail("the encryption key")(&e))
}

/// A table and queues of the shard's own on the emulator, the engine's side reaching
/// them through clients that meet injected faults, on the run's virtual time (see the
/// `aws` module), with the run's policy around the ports as on the embedded store.
async fn open_aws(
    shard: &Shard,
    endpoint: &str,
    dice: &Arc<Dice>,
    clock: &Arc<dyn Clock>,
) -> Result<Backend, SimError> {
    let emulated = Emulated::create(endpoint, shard.options.seed, shard.index)
        .await
        .map_err(SimError)?;
    let keys = keys()?;
    let inner: Arc<dyn Store> = Arc::new(emulated.store(&emulated.clean, keys.clone()));
    let policy = Arc::new(SimPolicy::new(dice.clone()));
    let (visibility, sessions, hook_queue) = emulated.queues(clock.clone());
    let (connected, hooks) = under_policy(
        Arc::new(emulated.store(&emulated.faulty, keys)),
        Arc::new(sessions),
        Arc::new(hook_queue),
        &policy,
    );
    Ok(Backend {
        inner,
        policy,
        connected,
        hooks,
        queue: Checks::Aws(Arc::new(emulated.clean_sessions(visibility.clone()))),
        aws: Some(AwsRun {
            emulated,
            visibility,
        }),
        power: None,
    })
}

/// The fleet: every agent on the same interval, first heartbeats spread over it; one in
/// [`CHATTING_ONE_IN`] with a Discord channel; the tool every agent's PING events go to;
/// an AFTER_HEARTBEAT hook on one agent in [`HOOKED_ONE_IN`].
async fn seed(
    shard: &Shard,
    store: &dyn Store,
    dice: &Dice,
    now: Timestamp,
) -> Result<Fleet, SimError> {
    let options = &shard.options;
    let mut agents = Vec::with_capacity(options.agents);
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
        agents.push((agent, first));
    }
    for chunk in agents.chunks(1000) {
        store
            .import_agents(chunk)
            .await
            .map_err(|e| fail("importing agents")(&e))?;
    }
    add_tool(store, now).await?;
    let hook_type =
        HookType::parse(HookType::AFTER_HEARTBEAT).map_err(|e| fail("the hook type")(&e))?;
    let target =
        HookTarget::parse("https://hooks.sim.example/pulse").map_err(|e| fail("the hook")(&e))?;
    let hooked = agents
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
        store
            .create_hook(&hook)
            .await
            .map_err(|e| fail("a hook")(&e))?;
    }
    let mut webhooks = BTreeMap::new();
    for (agent, _) in &agents {
        let mut webhook = Webhook::new(
            agent.id.clone(),
            WebhookScheme::Standard,
            WEBHOOK_SECRET,
            now,
        )
        .map_err(|e| fail("a webhook")(&e))?;
        webhook.rate_limit = Some(pulse_shared::domain::RateLimit {
            per_hour: WEBHOOK_LIMIT,
        });
        store
            .create_webhook(&webhook)
            .await
            .map_err(|e| fail("a webhook")(&e))?;
        webhooks.insert(agent.id.clone(), webhook.id);
    }
    Ok(Fleet {
        agents: agents.into_iter().map(|(a, _)| a.id).collect(),
        chatting,
        chatters,
        webhooks,
    })
}

/// The one HTTP tool, subscribed to every agent's PING events.
async fn add_tool(store: &dyn Store, now: Timestamp) -> Result<(), SimError> {
    let tool_name = ToolName::parse(TOOL).map_err(|e| fail("the tool")(&e))?;
    let mut tool = Tool::http(
        tool_name.clone(),
        "https://tool.sim.example/echo",
        TOOL_TIMEOUT,
        now,
    )
    .map_err(|e| fail("the tool")(&e))?;
    // It keys its work by the action id, so a run that crashed during a call calls it
    // again (the world checks it never sees a finished action again).
    tool.idempotent = true;
    store
        .add_tool(&tool)
        .await
        .map_err(|e| fail("the tool")(&e))?;
    let event_type = EventType::parse(PING).map_err(|e| fail("the event type")(&e))?;
    store
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
        .map_err(|e| fail("the subscription")(&e))
}

/// The outside world and the engine over the backend: the sweeper, a worker whose tools
/// and model are the world's, the hook dispatcher sending to the world's receivers.
fn engine(
    backend: Backend,
    fleet: Fleet,
    dice: Arc<Dice>,
    clock: Arc<dyn Clock>,
    idle: Duration,
) -> Sim {
    let Backend {
        inner,
        policy,
        connected,
        hooks,
        queue,
        aws,
        power,
    } = backend;
    let world = Arc::new(World::new(
        dice.clone(),
        clock.clone(),
        inner.clone(),
        fleet.chatters,
    ));
    let services = Services {
        llm: Arc::new(SimLlm {
            world: world.clone(),
        }),
        discord: Some(Arc::new(SimDiscord {
            world: world.clone(),
        })),
        chats: Vec::new(),
        egress: pulse_egress::Egress::new(pulse_egress::AllowList::default()),
        images: pulse_shared::app::images(Default::default()),
        embedder: Arc::new(pulse_shared::embed::OfflineEmbedder),
    };
    let settings = EngineSettings::default();
    let memories = connected.memories(&services);
    let tools = Arc::new(SimTools {
        world: world.clone(),
        builtin: connected.tools(
            clock.clone(),
            &settings,
            &services,
            memories.clone(),
            connected.agent_tools(clock.clone(), &services),
        ),
    });
    let runner = connected.runner(clock.clone(), &settings, tools);
    let worker = Worker::new(Arc::new(runner)).with_conversation(Arc::new(connected.conversation(
        clock.clone(),
        &settings,
        &services,
        memories,
    )));
    let discord = pulse_signatures::discord::DiscordSigner::from_seed(DISCORD_SEED);
    let inbound = pulse_shared::http::Inbound::new(
        inner.clone(),
        queue.sending(),
        clock.clone(),
        InboundConfig {
            delivery_memory: InboundConfig::DEFAULT_DELIVERY_MEMORY,
            discord_public_key: Some(discord.public_key_hex()),
            ..InboundConfig::default()
        },
    );
    let dispatcher = Dispatcher::new(
        connected.store.clone(),
        hooks,
        Arc::new(SimHooks {
            world: world.clone(),
        }),
        clock.clone(),
        DispatchSettings::default(),
    );
    let gateway = pulse_gateway::Gateway::new(
        inner.clone(),
        connected.queue.clone(),
        clock.clone(),
        pulse_shared::discord::DiscordClient::new(pulse_shared::discord::DiscordConfig {
            bot_token: Some(pulse_shared::domain::Secret::new("sim-bot-token")),
            ..pulse_shared::discord::DiscordConfig::unconfigured()
        }),
        pulse_gateway::GatewaySettings {
            token: pulse_shared::domain::Secret::new("sim-bot-token"),
            url: None,
            default_agent: None,
            lease: pulse_gateway::LEASE,
        },
    );
    Sim {
        gateway,
        sweeper: connected.sweeper(&settings),
        lifecycle: connected.lifecycle(clock.clone(), &settings),
        worker: Arc::new(worker),
        dispatcher: Arc::new(dispatcher),
        agents: fleet.agents,
        chatting: fleet.chatting,
        dice,
        clock,
        policy,
        world,
        inner,
        connected,
        ledger: Mutex::default(),
        queue,
        aws,
        power,
        idle,
        webhooks: fleet.webhooks,
        receiver: pulse_shared::http::router(Arc::new(inbound)),
        inbound: Mutex::new(Invariant::new(
            "webhook_delivered_once",
            "every fresh signed webhook delivery was stored and answered 2xx; one sent again (a retry, or replayed past the signature's tolerance) never made a second event",
        )),
        discord,
        interactions: Mutex::new(Invariant::new(
            "interaction_taken_once",
            "every fresh signed Discord slash command was answered as deferred and queued as the user's message; one delivered again was the same message, and one replayed past the signature's tolerance was refused",
        )),
        interaction_seq: std::sync::atomic::AtomicU64::new(0),
        hourly: Mutex::default(),
        limits: Mutex::new(Invariant::new(
            "webhook_rate_limited",
            "each webhook accepted fresh deliveries up to its hourly limit and refused the rest of the clock hour with 429 and a Retry-After",
        )),
    }
}
