//! The AWS backend: DynamoDB for the records, SQS FIFO for the sessions queue, a standard
//! SQS queue for hook deliveries, EventBridge for hooks that target a bus.
//!
//! SDK clients are built once per process ([`AwsClients::new`]) and shared: DynamoDB's
//! at once, SQS's and EventBridge's on their first use ([`LazyClient`]). Every request
//! goes through a [`RequestCounter`], so benchmarks can report AWS requests per heartbeat
//! cycle by operation — the number a user prices a fleet with.
//!
//! ## Layout
//!
//! One file per port, with the same names as in `adapters/sqlite`: `agents`,
//! `heartbeats`, `events`, `actions`, `registry` (tools, subscriptions),
//! `conversations`, `memories`, `schedules`, `webhooks`, `hooks` on DynamoDB, `session_queue` (SQS
//! FIFO) and `hook_queue` (SQS standard); beside them `keys` (the table's key layout,
//! which it documents), `codec` (items to and from records), `table` (the store and the
//! table operations its ports share), `purge` (deleting an agent and all it owns),
//! `eventbridge`, `secrets` (SSM), `provision` (creating the table and queues), `init`
//! (`pulse init`), `setup` (the check before a command, a stack's outputs, errors with
//! their fix),
//! `metrics` (the request counter), `limits` (AWS's service limits, checked on every
//! request before it is sent) and `actions_log` (the IAM actions a process's requests
//! needed, for the test suite's check of the template's roles).

mod actions;
mod actions_log;
mod agents;
mod approvals;
mod codec;
mod conversations;
mod eventbridge;
mod events;
#[cfg(feature = "faults")]
pub mod faults;
mod heartbeats;
mod hook_queue;
mod hooks;
mod init;
mod keys;
mod leases;
mod limits;
#[cfg(feature = "faults")]
pub mod lockstep;
mod memories;
mod metrics;
mod provision;
mod purge;
mod reachable;
mod registry;
mod retention;
mod schedules;
mod secrets;
mod session_queue;
mod setup;
mod table;
mod tokens;
mod webhooks;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::shared::IntoShared;

pub use eventbridge::{EVENT_SOURCE, EventBridgeBus};
pub use hook_queue::SqsHookQueue;
pub use init::{Names, Provisioned, TTL_ATTRIBUTE, init, table_differences};
pub use keys::{DUE_INDEX, DUE_SHARDS};
pub use metrics::{Capacity, RequestCounter};
pub use provision::{create_hooks_queue, create_sessions_queue, create_table};
pub use secrets::{SecretParameters, SecretsError};
pub use session_queue::SqsQueue;
pub use setup::{STACK_VARIABLES, SetupError, check, explain, region, stack_outputs};
pub use table::DynamoStore;

/// How long opening a connection to an AWS endpoint may take: within a region it takes
/// milliseconds, so a second means the endpoint or the network is in trouble and a
/// new attempt does better than waiting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How one service's client retries and how long it waits: decisions, not the SDK's
/// defaults, made for a Lambda function's time budget (the worker has 120 s for a job,
/// the receiver must answer a webhook in seconds) and shown to keep every invariant by
/// the fault tests (`tests/it/aws_faults.rs`).
///
/// Standard retry mode: throttling, 5xx, timeouts and broken connections are retried
/// with jittered exponential backoff from `backoff` up to 2 s, within a token bucket
/// that stops retrying when most requests fail (a retry storm would only deepen an
/// outage). A request the SDK sends again is the same request, so the adapters treat
/// a second arrival of their own write as theirs (claim and put tokens, the
/// transactions' client request token, the FIFO deduplication id).
struct Decision {
    /// Attempts in all, the first included.
    attempts: u32,
    /// The first retry's backoff (before jitter).
    backoff: Duration,
    /// How long one attempt may take, from sending to the whole answer.
    attempt: Duration,
    /// How long the call may take with its retries.
    operation: Duration,
}

impl Decision {
    fn retry(&self) -> aws_config::retry::RetryConfig {
        aws_config::retry::RetryConfig::standard()
            .with_max_attempts(self.attempts)
            .with_initial_backoff(self.backoff)
            .with_max_backoff(Duration::from_secs(2))
    }

    fn timeouts(&self, timed: bool) -> aws_config::timeout::TimeoutConfig {
        let b = aws_config::timeout::TimeoutConfig::builder();
        if !timed {
            return b.connect_timeout(CONNECT_TIMEOUT * 5).build();
        }
        b.connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }
}

/// DynamoDB answers in milliseconds; a partition that is too busy answers
/// `ProvisionedThroughputExceeded` and recovers within a second or two. Four attempts
/// from 50 ms ride that out; an attempt that takes 3 s is stuck, not slow; 10 s bounds
/// a call well inside any function's budget.
const DYNAMODB: Decision = Decision {
    attempts: 4,
    backoff: Duration::from_millis(50),
    attempt: Duration::from_secs(3),
    operation: Duration::from_secs(10),
};

/// SQS sends and deletes (receives do not wait: the event source mapping long-polls).
/// A little more room per attempt than DynamoDB: a batch of ten is one request.
const SQS: Decision = Decision {
    attempts: 4,
    backoff: Duration::from_millis(100),
    attempt: Duration::from_secs(5),
    operation: Duration::from_secs(15),
};

/// EventBridge `PutEvents`, from the hook dispatcher, whose deliveries have their own
/// retry schedule: fewer attempts here, since a failed delivery is tried again later.
const EVENTBRIDGE: Decision = Decision {
    attempts: 3,
    backoff: Duration::from_millis(100),
    attempt: Duration::from_secs(5),
    operation: Duration::from_secs(10),
};

/// The SDK clients, with a shared request counter.
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// SQS, built on its first use (see [`LazyClient`]).
    pub sqs: LazyClient<aws_sdk_sqs::Client>,
    /// EventBridge, built on its first use.
    pub eventbridge: LazyClient<aws_sdk_eventbridge::Client>,
    /// Requests sent so far, by operation.
    pub counter: RequestCounter,
}

/// The SDK's default HTTPS client (hyper, rustls with aws-lc, a proxy from the
/// environment), except that the platform's root certificates are read when the first
/// request opens a connection, not when a service client is built. The SDK reads them
/// at client construction on purpose (a TLS warm-up); in a Lambda init it was the
/// largest cost (`pulse bench coldstart`), and nothing runs beside it there that it
/// could overlap: read on the first request instead, it costs the same once.
#[derive(Debug)]
struct LazyRoots(SharedHttpClient);

impl HttpClient for LazyRoots {
    // `validate_base_client_config` is where the SDK builds a connector early: left as
    // the trait's no-op. Connectors are built (and cached) on the first request.
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(
        &self,
    ) -> Option<aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// The HTTPS client every SDK client of the process uses (see [`LazyRoots`]).
fn https_client() -> SharedHttpClient {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let inner =
        aws_smithy_http_client::Builder::new().build_with_connector_fn(|settings, components| {
            let mut builder = aws_smithy_http_client::Connector::builder()
                .tls_provider(Provider::Rustls(CryptoMode::AwsLc));
            builder.set_connector_settings(settings.cloned());
            if let Some(components) = components {
                builder.set_sleep_impl(components.sleep_impl());
            }
            builder.set_proxy_config(Some(ProxyConfig::from_env()));
            builder.build()
        });
    LazyRoots(inner).into_shared()
}

/// The SDK configuration from the environment (region, credentials; in Lambda from the
/// execution role), with `endpoint_url` over AWS's endpoints. No network calls and no
/// file reads for TLS are made here. Loaded once per process and endpoint: a function
/// that reads its secrets first (`PULSE_SECRETS_PATH`) builds its clients on the same
/// configuration, credential cache and HTTPS client.
pub(crate) async fn sdk_config(endpoint_url: Option<&str>) -> aws_config::SdkConfig {
    type Loaded = Vec<(Option<String>, aws_config::SdkConfig)>;
    static LOADED: std::sync::Mutex<Loaded> = std::sync::Mutex::new(Vec::new());
    let endpoint = endpoint_url.map(str::to_owned);
    let cached = |loaded: &Loaded| {
        loaded
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map(|(_, c)| c.clone())
    };
    if let Some(c) = cached(&LOADED.lock().unwrap_or_else(|e| e.into_inner())) {
        return c;
    }
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    // A blank variable counts as unset, as the SDK's own providers read it.
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    // Lambda gives a function its role's credentials and its region as variables. The
    // default chains look there first and would find them, but building the chains
    // (profile files, web identity with its STS client, the container and instance
    // metadata clients) was a tenth of a function's init. Where the variables are set,
    // they are taken directly: the same credentials and region as the chains would give.
    if var("AWS_ACCESS_KEY_ID").is_some() && var("AWS_SECRET_ACCESS_KEY").is_some() {
        loader = loader.credentials_provider(
            aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
        );
    }
    if let Some(region) = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")) {
        loader = loader.region(aws_config::Region::new(region));
    }
    let config = loader.load().await;
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    // Two first callers at once both load; the first stored is the one used.
    match cached(&loaded) {
        Some(c) => c,
        None => {
            loaded.push((endpoint, config.clone()));
            config
        }
    }
}

/// An SDK client built on its first use, then shared by every clone of this handle; it
/// dereferences to the client, as [`std::sync::LazyLock`] does to its value.
///
/// Building an SDK client parses its service's endpoint rules (AWS's partitions, their
/// region patterns compiled) and touches its code for the first time: 0.2 ms of a
/// function's init for SQS (`pulse bench coldstart`). A client that most invocations
/// never use is therefore not built at init: SQS is used by the receiver only for
/// Discord, the messages API and webhooks that wake their agent, by the worker only when
/// a hook matches, by the dispatcher only to retry a delivery, by the sweeper when
/// heartbeats are due; EventBridge only by hooks with an `eventbridge://` target, which
/// most deployments have none of. The DynamoDB client, which every invocation uses, is
/// built at init: deferring it would only move its cost to the first request.
pub struct LazyClient<C> {
    build: Arc<dyn Fn() -> C + Send + Sync>,
    client: Arc<OnceLock<C>>,
}

impl<C> LazyClient<C> {
    /// A client `build` makes when it is first used.
    pub fn new(build: impl Fn() -> C + Send + Sync + 'static) -> Self {
        Self {
            build: Arc::new(build),
            client: Arc::new(OnceLock::new()),
        }
    }

    /// Whether the client has been built yet.
    pub fn is_built(&self) -> bool {
        self.client.get().is_some()
    }
}

impl<C> Clone for LazyClient<C> {
    fn clone(&self) -> Self {
        Self {
            build: self.build.clone(),
            client: self.client.clone(),
        }
    }
}

impl<C> std::ops::Deref for LazyClient<C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.client.get_or_init(|| (self.build)())
    }
}

impl<C> std::fmt::Debug for LazyClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyClient")
            .field("service", &std::any::type_name::<C>())
            .field("built", &self.is_built())
            .finish()
    }
}

impl AwsClients {
    /// Loads the SDK configuration from the environment (see [`sdk_config`]) and builds
    /// the clients. No network calls are made here.
    pub async fn new(endpoint_url: Option<&str>) -> Self {
        // An endpoint of one's own is an emulator: the same attempts, no time limits.
        Self::from_sdk_config(&sdk_config(endpoint_url).await, endpoint_url.is_none())
    }

    /// Clients for a local emulator: fixed test credentials and region, no lookups.
    pub fn for_emulator(endpoint_url: &str) -> Self {
        Self::for_emulator_over(endpoint_url, https_client())
    }

    /// [`Self::for_emulator`], with faults injected under the SDK by `plan` (see
    /// [`faults`]).
    #[cfg(feature = "faults")]
    pub fn for_emulator_with_faults(
        endpoint_url: &str,
        plan: std::sync::Arc<faults::FaultPlan>,
    ) -> Self {
        Self::for_emulator_over(
            endpoint_url,
            faults::FaultyHttp::shared(https_client(), plan),
        )
    }

    /// Clients for a local emulator whose requests run in lockstep with a simulated
    /// clock on `io`'s thread, meeting the faults of `plan` when one is given (see
    /// [`lockstep`] and [`faults`]). A request then takes no time on the caller's
    /// clock, so the time limits made for AWS apply as they would there: an attempt's
    /// and a call's limit run out only through the retries' backoff.
    #[cfg(feature = "faults")]
    pub fn for_emulator_in_lockstep(
        endpoint_url: &str,
        io: &lockstep::LockstepIo,
        plan: Option<std::sync::Arc<faults::FaultPlan>>,
    ) -> Self {
        let http = match plan {
            Some(plan) => faults::FaultyHttp::shared(https_client(), plan),
            None => https_client(),
        };
        Self::for_emulator_timed(endpoint_url, io.wrap(http), true)
    }

    fn for_emulator_over(endpoint_url: &str, http: SharedHttpClient) -> Self {
        Self::for_emulator_timed(endpoint_url, http, false)
    }

    fn for_emulator_timed(endpoint_url: &str, http: SharedHttpClient, timed: bool) -> Self {
        Self::for_emulator_signed(endpoint_url, http, timed, ("test", "test"))
    }

    /// Clients for a local emulator that checks IAM, signing as the user whose access
    /// key is `(id, secret)`.
    pub fn for_emulator_as(endpoint_url: &str, id: &str, secret: &str) -> Self {
        Self::for_emulator_signed(endpoint_url, https_client(), false, (id, secret))
    }

    fn for_emulator_signed(
        endpoint_url: &str,
        http: SharedHttpClient,
        timed: bool,
        (id, secret): (&str, &str),
    ) -> Self {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(http)
            .endpoint_url(endpoint_url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
                aws_sdk_dynamodb::config::Credentials::new(
                    id,
                    secret,
                    None,
                    None,
                    "pulse-emulator",
                ),
            ))
            .build();
        Self::from_sdk_config(&sdk, timed)
    }

    /// The clients over `sdk`, each with its service's [`Decision`]: its attempts and
    /// backoff always, its time limits against AWS (`timed`). An emulator serves one
    /// request at a time, so a test that sends two hundred at once waits longer for the
    /// last than any AWS budget allows: against it only opening a connection is bounded
    /// (5 s).
    fn from_sdk_config(sdk: &aws_config::SdkConfig, timed: bool) -> Self {
        let counter = RequestCounter::default();
        // One service's client over `sdk`: its decision, the shared request counter.
        macro_rules! client {
            ($service:ident, $decision:expr, $sdk:expr, $counter:expr) => {
                $service::Client::from_conf(
                    $service::config::Builder::from($sdk)
                        .retry_config($decision.retry())
                        .timeout_config($decision.timeouts(timed))
                        .interceptor(limits::LimitsGuard)
                        .interceptor($counter.clone())
                        .interceptor(actions_log::ActionsLog)
                        .build(),
                )
            };
        }
        let dynamodb = client!(aws_sdk_dynamodb, DYNAMODB, sdk, counter);
        let (conf, c) = (sdk.clone(), counter.clone());
        let sqs = LazyClient::new(move || client!(aws_sdk_sqs, SQS, &conf, c));
        let (conf, c) = (sdk.clone(), counter.clone());
        let eventbridge =
            LazyClient::new(move || client!(aws_sdk_eventbridge, EVENTBRIDGE, &conf, c));
        Self {
            dynamodb,
            sqs,
            eventbridge,
            counter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seldom_used_clients_are_built_on_first_use_and_shared_by_clones() {
        let clients = AwsClients::for_emulator("http://127.0.0.1:9");
        // Handing the clients to their adapters builds nothing.
        let _sessions = SqsQueue::new(clients.sqs.clone(), "http://127.0.0.1:9/q.fifo");
        let _hooks = SqsHookQueue::new(clients.sqs.clone(), "http://127.0.0.1:9/h", None);
        let _bus = EventBridgeBus::new(clients.eventbridge.clone());
        assert!(!clients.sqs.is_built());
        assert!(!clients.eventbridge.is_built());

        // The first use builds the client once, for every clone of the handle.
        let region = clients.sqs.config().region().map(|r| r.to_string());
        assert_eq!(region.as_deref(), Some("us-east-1"));
        assert!(clients.sqs.is_built());
        let again = clients.sqs.clone();
        assert!(std::ptr::eq(&*again, &*clients.sqs));
        assert!(!clients.eventbridge.is_built());
    }
}
