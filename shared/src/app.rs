//! Wiring: the one place that turns configuration into an engine. The Lambda mains, the
//! CLI, the benches and the tests all build their sweepers, workers and dispatchers here,
//! from a [`Connected`] backend (made by [`connect`], or put together from injected
//! stores and queues in tests) and the [`Services`] the workers talk to.

use std::sync::Arc;

use pulse_egress::Egress;

use crate::adapters::{aws, sqlite};
use crate::config::{Backend, Config};
use crate::engine::agent_tools::AgentTools;
use crate::engine::memory::Memories;
use crate::engine::{
    Conversation, ConversationSettings, DispatchSettings, Dispatcher, EngineSettings,
    HeartbeatRunner, HookEmitter, Lifecycle, Sweeper, Worker,
};
use crate::error::StoreError;
use crate::outbound::HookClient;
use crate::ports::{
    Clock, DiscordApi, EventBus, HookQueue, LlmSelector, SessionQueue, Store, ToolRunner,
    event_write_timeout,
};
use crate::tools::{HeartbeatAgent, McpClients, Tools};

/// How long fetching one image a user sent may take.
const IMAGE_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// The outside services a worker talks to.
#[derive(Clone)]
pub struct Services {
    /// Picks each agent's model.
    pub llm: Arc<dyn LlmSelector>,
    /// Discord, when configured; replies are stored only otherwise.
    pub discord: Option<Arc<dyn DiscordApi>>,
    /// Other chat platforms set up (Telegram, Slack), each once.
    pub chats: Vec<Arc<dyn crate::ports::Channel>>,
    /// Outbound HTTP to user-given URLs (HTTP tools, hooks), behind the SSRF guard.
    pub egress: Egress,
    /// Fetches the images users send, from their hosts only.
    pub images: Arc<dyn crate::ports::ImageFetcher>,
    /// Embeds memories, so they are recalled by meaning.
    pub embedder: Arc<dyn crate::ports::Embedder>,
}

impl Services {
    /// The chat platforms set up, as the engine speaks on them.
    pub fn channels(&self) -> crate::ports::Channels {
        crate::ports::Channels::new(
            self.discord
                .iter()
                .map(|d| {
                    Arc::new(crate::discord::DiscordChannel::new(d.clone()))
                        as Arc<dyn crate::ports::Channel>
                })
                .chain(self.chats.iter().cloned()),
        )
    }

    /// The offline model and no Discord, with outbound HTTP through `egress`: what the
    /// benches and tests run the heartbeat agent with, never reaching a provider.
    pub fn offline(egress: Egress) -> Self {
        Self {
            llm: Arc::new(crate::llm::Router::new(
                crate::llm::LlmConfig::offline(),
                egress.clone(),
            )),
            discord: None,
            chats: Vec::new(),
            egress,
            images: images(crate::llm::ImageHosts::default()),
            embedder: Arc::new(crate::embed::OfflineEmbedder),
        }
    }
}

/// A connected backend.
#[derive(Clone)]
pub struct Connected {
    /// The records.
    pub store: Arc<dyn Store>,
    /// The sessions queue.
    pub queue: Arc<dyn SessionQueue>,
    /// The hooks queue; `None` when hooks are not configured (AWS without
    /// `PULSE_HOOKS_QUEUE_URL`): nothing is emitted then.
    pub hooks: Option<Arc<dyn HookQueue>>,
    /// EventBridge, for hooks with an `eventbridge://` target (AWS backend).
    pub bus: Option<Arc<dyn EventBus>>,
    /// For the AWS backend, the request counter of its clients.
    pub aws_requests: Option<aws::RequestCounter>,
    /// For SQLite, what takes back the claims of processes that stopped on the file.
    pub orphans: Option<sqlite::OrphanedClaims>,
    /// For SQLite, set when the database holds sealed secrets and no key opens them:
    /// `pulse serve` refuses to start with it; the CLI goes on, to fix it.
    pub keys_missing: Option<sqlite::KeysMissing>,
}

impl Connected {
    /// A sweeper over this backend.
    pub fn sweeper(&self, settings: &EngineSettings) -> Sweeper {
        Sweeper::new(self.store.clone(), self.queue.clone(), settings.clone())
    }

    /// A worker over this backend: heartbeat jobs with every tool (the heartbeat agent
    /// included), and conversation turns.
    pub fn worker(
        &self,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        services: &Services,
    ) -> Worker {
        // One set of MCP sessions for the heartbeat agent and the conversation.
        let agent_tools = self.agent_tools(clock.clone(), services);
        self.worker_with(clock, settings, services, agent_tools)
    }

    /// A worker whose agents call their MCP tools through `agent_tools` (sessions shared
    /// with whoever else holds them).
    pub fn worker_with(
        &self,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        services: &Services,
        agent_tools: Arc<AgentTools>,
    ) -> Worker {
        // One cache of recall indexes for the heartbeat agent and the conversation.
        let memories = self.memories(services);
        let tools = self.tools(
            clock.clone(),
            settings,
            services,
            memories.clone(),
            agent_tools.clone(),
        );
        let runner = self
            .runner(clock.clone(), settings, tools)
            .with_health(agent_tools.health())
            .with_agent_tools(agent_tools.clone());
        Worker::new(Arc::new(runner)).with_conversation(Arc::new(
            self.conversation(clock, settings, services, memories)
                .with_agent_tools(agent_tools),
        ))
    }

    /// The agents' MCP tools, called through the services' egress guard.
    pub fn agent_tools(&self, clock: Arc<dyn Clock>, services: &Services) -> Arc<AgentTools> {
        self.agent_tools_with(clock, services, false)
    }

    /// [`Self::agent_tools`], starting local MCP servers (programs) when `local` is set:
    /// `pulse serve` with `PULSE_MCP_STDIO=on`, never a Lambda function.
    pub fn agent_tools_with(
        &self,
        clock: Arc<dyn Clock>,
        services: &Services,
        local: bool,
    ) -> Arc<AgentTools> {
        let tools = AgentTools::new(
            self.store.clone(),
            McpClients::new(services.egress.clone()).with_local_servers(local),
            clock.clone(),
        )
        .with_channels(services.channels());
        Arc::new(match self.emitter(clock) {
            Some(emitter) => tools.with_hooks(emitter),
            None => tools,
        })
    }

    /// The agents' memories, embedded by the services' embedder, with a cache of recall
    /// indexes of their own.
    pub fn memories(&self, services: &Services) -> Arc<Memories> {
        Arc::new(
            Memories::new(self.store.clone(), services.embedder.clone()).with_cache(memory_cache()),
        )
    }

    /// Every tool: HTTP tools through the egress guard, and the heartbeat agent (keeping
    /// and recalling `memories`, calling the agents' MCP tools).
    pub fn tools(
        &self,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        services: &Services,
        memories: Arc<Memories>,
        agent_tools: Arc<AgentTools>,
    ) -> Arc<dyn ToolRunner> {
        let clock_for_hooks = clock.clone();
        let agent = HeartbeatAgent::new(
            self.store.clone(),
            self.queue.clone(),
            services.llm.clone(),
            clock,
            memories,
        )
        .with_schedule_limits(settings.schedules)
        .with_dollars(settings.prices.clone(), self.emitter(clock_for_hooks))
        .with_agent_tools(agent_tools);
        Arc::new(Tools::with_heartbeat_agent(agent, services.egress.clone()))
    }

    /// A heartbeat runner calling `tools`, emitting hooks if a hooks queue is configured.
    pub fn runner(
        &self,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        tools: Arc<dyn ToolRunner>,
    ) -> HeartbeatRunner {
        let runner =
            HeartbeatRunner::new(self.store.clone(), tools, clock.clone(), settings.clone());
        match self.emitter(clock) {
            Some(emitter) => runner.with_hooks(emitter),
            None => runner,
        }
    }

    /// The conversation engine, emitting hooks if a hooks queue is configured, fetching
    /// images through the egress client.
    pub fn conversation(
        &self,
        clock: Arc<dyn Clock>,
        settings: &EngineSettings,
        services: &Services,
        memories: Arc<Memories>,
    ) -> Conversation {
        let conversation = Conversation::new(
            self.store.clone(),
            services.llm.clone(),
            services.channels(),
            clock.clone(),
            ConversationSettings {
                schedules: settings.schedules,
                patience: settings.turn_patience,
                prices: settings.prices.clone(),
                ..ConversationSettings::default()
            },
            memories,
        )
        // Only images on their hosts are passed on or fetched, through a guard of their
        // own.
        .with_images(services.images.clone())
        .with_lifecycle(Arc::new(self.lifecycle(clock.clone(), settings)));
        match self.emitter(clock) {
            Some(emitter) => conversation.with_hooks(emitter),
            None => conversation,
        }
    }

    /// Agent lifecycle operations (update, pause, resume, delete), emitting hooks if a
    /// hooks queue is configured.
    pub fn lifecycle(&self, clock: Arc<dyn Clock>, settings: &EngineSettings) -> Lifecycle {
        Lifecycle::new(
            self.store.clone(),
            clock.clone(),
            settings.clone(),
            self.emitter(clock),
        )
    }

    /// What emits hooks, if a hooks queue is configured.
    pub fn emitter(&self, clock: Arc<dyn Clock>) -> Option<HookEmitter> {
        self.hooks
            .as_ref()
            .map(|q| HookEmitter::new(self.store.clone(), q.clone(), clock))
    }

    /// The hook dispatcher over this backend, sending through `egress` (and this
    /// backend's EventBridge), if a hooks queue is configured.
    pub fn dispatcher(
        &self,
        clock: Arc<dyn Clock>,
        egress: &Egress,
        settings: DispatchSettings,
    ) -> Option<Dispatcher> {
        let queue = self.hooks.clone()?;
        Some(Dispatcher::new(
            self.store.clone(),
            queue,
            Arc::new(HookClient::new(egress.clone(), self.bus.clone())),
            clock,
            settings,
        ))
    }
}

/// The fetcher of the images users send, from `hosts` only.
pub fn images(hosts: crate::llm::ImageHosts) -> Arc<dyn crate::ports::ImageFetcher> {
    Arc::new(crate::llm::EgressImages::new(hosts, IMAGE_FETCH_TIMEOUT))
}

/// The outbound client for user-given URLs (HTTP tools, hooks, agents' own model URLs):
/// the SSRF guard with `PULSE_HOOKS_ALLOW`'s exceptions.
pub fn egress(config: &Config) -> Egress {
    Egress::new(config.hooks.allow.clone())
}

impl Services {
    /// The services the configuration names: the model router, and Discord if a token
    /// or application id is set.
    pub fn from_config(config: &Config) -> Self {
        let egress = egress(config);
        Self {
            llm: Arc::new(crate::llm::Router::new(config.llm.clone(), egress.clone())),
            discord: config.discord.is_configured().then(|| {
                Arc::new(crate::discord::DiscordClient::new(config.discord.clone()))
                    as Arc<dyn DiscordApi>
            }),
            chats: config
                .telegram
                .is_configured()
                .then(|| {
                    Arc::new(crate::telegram::TelegramClient::new(
                        config.telegram.clone(),
                    )) as Arc<dyn crate::ports::Channel>
                })
                .into_iter()
                .chain(config.slack.is_configured().then(|| {
                    Arc::new(crate::slack::SlackClient::new(config.slack.clone()))
                        as Arc<dyn crate::ports::Channel>
                }))
                .collect(),
            egress,
            images: images(config.hooks.image_hosts.clone()),
            embedder: crate::embed::from_config(&config.embed),
        }
    }
}

/// The bytes the recall indexes may take: 40 % of a Lambda function's memory (as Lambda
/// says it in `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, in MB), else
/// [`crate::engine::memory::CACHE_BYTES`].
fn memory_cache() -> usize {
    std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
        .ok()
        .and_then(|mb| mb.parse::<usize>().ok())
        .map_or(crate::engine::memory::CACHE_BYTES, |mb| (mb << 20) / 10 * 4)
}

/// Connects the backend the configuration names. Opening SQLite creates and migrates the
/// file (mode 0600) and, without `PULSE_ENCRYPTION_KEY`, reads or makes the key file
/// beside it; building AWS clients makes no network call.
pub async fn connect(config: &Config, clock: Arc<dyn Clock>) -> Result<Connected, StoreError> {
    match &config.backend {
        Backend::Sqlite { path } => {
            let path = path.clone();
            connect_sqlite(config, clock, move || sqlite::Db::open(&path)).await
        }
        Backend::Aws(_) => connect_aws(config).await,
    }
}

/// [`connect`] on the embedded store that `open` opens (the configured file, or for a
/// benchmark the same file through a slower disk), with the configuration's durability,
/// event deadline and keys.
pub async fn connect_sqlite(
    config: &Config,
    clock: Arc<dyn Clock>,
    open: impl FnOnce() -> Result<sqlite::Db, StoreError> + Send + 'static,
) -> Result<Connected, StoreError> {
    let durability = config.durability;
    let configured = config.encryption.clone();
    let deadline = event_write_timeout(config.engine.event_settle);
    let stamps = clock.clone();
    let (db, (keys, keys_missing)) = tokio::task::spawn_blocking(move || {
        let db = open()?
            .with_durability(durability)?
            .with_event_deadline(stamps, deadline);
        let keys = sqlite::keys_for(&db, configured)?;
        Ok::<_, StoreError>((db, keys))
    })
    .await
    .map_err(|e| StoreError::backend("sqlite", "open database", e))??;
    Ok(Connected {
        store: Arc::new(sqlite::SqliteStore::new(db.clone()).with_keys(keys)),
        queue: Arc::new(sqlite::SqliteQueue::new(db.clone(), clock.clone())),
        orphans: Some(db.orphaned_claims()),
        keys_missing,
        hooks: Some(Arc::new(sqlite::SqliteHookQueue::new(db, clock))),
        bus: None,
        aws_requests: None,
    })
}

/// Connects DynamoDB and SQS, which the configuration must name: what the Lambda
/// functions run on. Calling this rather than [`connect`] keeps the embedded database
/// (SQLite's code and its adapters) out of their binaries.
pub async fn connect_aws(config: &Config) -> Result<Connected, StoreError> {
    let Backend::Aws(settings) = &config.backend else {
        return Err(StoreError::backend(
            "aws",
            "connect",
            "this configuration names the embedded store; the Lambda functions run on DynamoDB and SQS only (set PULSE_TABLE and PULSE_SESSIONS_QUEUE_URL)",
        ));
    };
    let clients = aws::AwsClients::new(settings.endpoint_url.as_deref()).await;
    Ok(Connected {
        // Without PULSE_ENCRYPTION_KEY, webhooks and hooks cannot be written (or read,
        // once sealed), and say so; everything else works.
        store: Arc::new(
            aws::DynamoStore::new(
                clients.dynamodb.clone(),
                &settings.table,
                event_write_timeout(config.engine.event_settle),
            )
            .with_keys(config.encryption.clone().unwrap_or_default())
            .with_retention(config.retention),
        ),
        queue: Arc::new(aws::SqsQueue::new(
            clients.sqs.clone(),
            &settings.sessions_queue_url,
        )),
        hooks: settings.hooks_queue_url.as_ref().map(|url| {
            Arc::new(aws::SqsHookQueue::new(
                clients.sqs.clone(),
                url,
                settings.hooks_dlq_url.clone(),
            )) as Arc<dyn HookQueue>
        }),
        bus: Some(Arc::new(aws::EventBridgeBus::new(
            clients.eventbridge.clone(),
        ))),
        aws_requests: Some(clients.counter),
        orphans: None,
        keys_missing: None,
    })
}
