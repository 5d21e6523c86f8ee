//! The four Lambda functions as built binaries, each under a stand-in for the Lambda
//! service (its runtime API on loopback), against a moto server that enforces IAM: each
//! function signs its requests as a user whose policy is its role in
//! `infra/template.yaml`, so a call its role does not allow is refused here as on AWS,
//! and fails the test with the function, the action, the resource and the path. Each
//! is invoked with the event shapes Lambda really sends (fixtures in
//! `tests/fixtures/`), configured only by environment variables and secrets in SSM
//! Parameter Store, as the SAM template configures them. The effects are read back
//! from DynamoDB and SQS, and from loopback stand-ins for Discord, the LLM API and a
//! hook receiver.
//!
//! Needs `PULSE_TEST_MOTO_IAM_URL`, `PULSE_TEST_MOTO_IAM_DENIALS` and
//! `PULSE_TEST_PYTHON` (see `pulse_tests::iam`); `scripts/test.sh` sets them, and
//! builds the function binaries first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use jiff::Timestamp;
use pulse_shared::adapters::aws::{
    AwsClients, DynamoStore, create_hooks_queue, create_sessions_queue, create_table,
};
use pulse_shared::domain::{
    Agent, AgentId, DeliveryStatus, EventType, Filter, Heartbeat, HeartbeatStatus, Hook,
    HookTarget, HookType, Memory, MemoryId, NewAgent, ReplyTarget, RetrySchedule, Schedule,
    ScheduleRule, SessionTask, SignalId, Subscription, SubscriptionId, TaskEnvelope, TimeZoneName,
    Tool, ToolName, Turn, TurnId, TurnStatus, Usage, Webhook, WebhookScheme,
};
use pulse_shared::engine::Lifecycle;
use pulse_shared::ports::{Store, SystemClock};
use pulse_signatures::discord::DiscordSigner;
use pulse_signatures::inbound::{Scheme, generate_secret, sign, verify};
use pulse_tests::FakeTool;
use pulse_tests::fake_discord::{FakeDiscord, Posted};
use pulse_tests::fake_gateway::{FakeGateway, message, snowflake};
use pulse_tests::fake_hooks::FakeReceiver;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::iam::{Users, moto_iam_url, resolve};
use pulse_tests::lambda_runtime::{Function, built};
use pulse_tests::unique;
use serde_json::{Value, json};

const CHANNEL: &str = "1300000000000000001";
const APPLICATION: &str = "1200000000000000000";
const OPENAI_KEY: &str = "sk-from-ssm-7f3a";
const BOT_TOKEN: &str = "bot-token-from-ssm";
const FRIEND: &str = "2000000000000000001";
const DM: &str = "4000000000000000001";

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The four functions, each under its own runtime API stand-in and credentials.
struct Stack {
    functions: Vec<(&'static str, Function)>,
    users: Arc<Users>,
}

const FUNCTIONS: [&str; 4] = [
    "heartbeat-sweeper",
    "conversation-worker",
    "webhook-receiver",
    "hook-dispatcher",
];

impl Stack {
    /// Starts each function with what of `env` the template gives it, and its own
    /// role's keys. With
    /// `PULSE_TEST_AWS_ACTIONS_DIR` set, each records the IAM actions it sent there (for
    /// `scripts/roles.py check-actions`).
    async fn start(env: &[(String, String)], users: Arc<Users>, dir: &Path) -> Self {
        let mut functions = Vec::new();
        for name in FUNCTIONS {
            let mut env = users.environment_of(name, env);
            if let Ok(d) = std::env::var("PULSE_TEST_AWS_ACTIONS_DIR") {
                env.push(("PULSE_AWS_ACTIONS_DIR".into(), d));
            }
            let f = Function::start(name, &built(name), &[], &env, dir).await;
            functions.push((name, f));
        }
        Self { functions, users }
    }

    fn function(&self, name: &str) -> &Function {
        &self.functions.iter().find(|(n, _)| *n == name).unwrap().1
    }

    /// Every function's log so far, one after another.
    fn log(&self) -> String {
        self.functions
            .iter()
            .map(|(n, f)| format!("==> {n}\n{}", f.log()))
            .collect()
    }

    /// Invokes `function` with `event` as Lambda's service does, on the user's `path`
    /// (named in a refusal); fails if IAM refused any call meanwhile.
    async fn invoke(&self, function: &str, event: &Value, path: &str) -> Value {
        let resp = self.function(function).invoke(event).await;
        let denied = self.users.new_denials();
        assert!(
            denied.is_empty(),
            "IAM refused, on the path \"{path}\" (invoking {function}):\n  {}\n\
             the role in infra/template.yaml lacks the action; the log:\n{}",
            denied.join("\n  "),
            self.log()
        );
        resp
    }
}

/// A Function URL request (API Gateway v2 payload) for `path` with `body` and `headers`.
fn function_url_request(path: &str, body: &[u8], headers: &[(String, String)]) -> Value {
    let mut e = fixture("function-url-request.json");
    e["rawPath"] = json!(path);
    e["requestContext"]["http"]["path"] = json!(path);
    e["requestContext"]["timeEpoch"] = json!(Timestamp::now().as_millisecond());
    e["body"] = json!(std::str::from_utf8(body).unwrap());
    for (k, v) in headers {
        e["headers"][k.to_ascii_lowercase()] = json!(v);
    }
    e
}

/// A Function URL GET of `path` with `query` (the raw query string, "" for none).
fn function_url_get(path: &str, query: &str, headers: &[(String, String)]) -> Value {
    let mut e = function_url_request(path, b"", headers);
    e["requestContext"]["http"]["method"] = json!("GET");
    if !query.is_empty() {
        e["rawQueryString"] = json!(query);
    }
    e
}

fn header_pairs(pairs: Vec<(http::HeaderName, http::HeaderValue)>) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect()
}

/// SQS clients signed as the functions whose queues they read, as the event source
/// mappings are.
struct Mappings {
    worker: aws_sdk_sqs::Client,
    dispatcher: aws_sdk_sqs::Client,
}

fn signed_as(moto: &str, users: &Users, function: &str) -> aws_sdk_sqs::Client {
    let keys = users.of(function);
    (*AwsClients::for_emulator_as(moto, &keys.id, &keys.secret).sqs).clone()
}

/// Receives every message on `url` (waiting up to `wait` for the first), with the
/// attributes Lambda's event source mapping passes on, reading the queue's attributes
/// first as the mapping does.
async fn receive(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    wait: i32,
) -> Vec<aws_sdk_sqs::types::Message> {
    sqs.get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)));
    let mut all = Vec::new();
    let mut wait = wait;
    loop {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait)
            .visibility_timeout(600)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)));
        let got = out.messages.unwrap_or_default();
        if got.is_empty() {
            return all;
        }
        all.extend(got);
        wait = 0;
    }
}

/// SQS messages as Lambda's event source mapping hands them over, on the record fixture.
fn sqs_event(record_fixture: &str, messages: &[aws_sdk_sqs::types::Message]) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut r = fixture(record_fixture);
            r["messageId"] = json!(m.message_id());
            r["receiptHandle"] = json!(m.receipt_handle());
            r["body"] = json!(m.body());
            r["md5OfBody"] = json!(m.md5_of_body());
            for (k, v) in m.attributes().into_iter().flatten() {
                r["attributes"][k.as_str()] = json!(v);
            }
            r
        })
        .collect();
    json!({ "Records": records })
}

fn failures(response: &Value) -> Vec<String> {
    response["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("not a partial batch response: {response}"))
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

/// What Lambda's event source mapping does after a batch: deletes every message but the
/// failed ones (which come back after the visibility timeout).
async fn settle(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    batch: &[aws_sdk_sqs::types::Message],
    failed: &[String],
) {
    for m in batch {
        if !failed.iter().any(|f| Some(f.as_str()) == m.message_id()) {
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap_or_else(|e| panic!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)));
        }
    }
}

fn task_of(m: &aws_sdk_sqs::types::Message) -> SessionTask {
    TaskEnvelope::decode(m.body().unwrap()).unwrap().task
}

/// Serialises the tests of this file: each makes its run's IAM users, whose set-up lets a
/// few requests through unchecked, and the emulator serves one of them at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Each function's user, holding its role's statements with the template's references
/// resolved to this process's resources (named as [`unique`] names them, so each test
/// has its own); the tests themselves work as an administrator. Made once: making them
/// takes seconds.
fn users(moto: &str) -> Arc<Users> {
    static USERS: std::sync::OnceLock<Arc<Users>> = std::sync::OnceLock::new();
    USERS
        .get_or_init(|| {
            let run = std::process::id();
            Arc::new(Users::create(
                moto,
                &resolve(
                    &format!("e2e-{run}-*"),
                    &format!("e2e-sessions-{run}-*.fifo"),
                    &format!("e2e-hooks-{run}-*"),
                    &format!("e2e-hooks-dlq-{run}-*"),
                    &format!("/pulse-e2e-{run}-*"),
                ),
            ))
        })
        .clone()
}

/// What every path starts from, on its own table, queues and secrets: the four functions
/// under their roles, configured as the template configures them; an agent with a
/// Discord channel, an inbound webhook, and two outbound hooks (`AFTER_HEARTBEAT`,
/// `MESSAGE_SENT`) to a receiver on loopback; loopback stand-ins for the LLM API and
/// Discord.
struct World {
    moto: String,
    table: String,
    sessions: String,
    hooks: String,
    hooks_dlq: String,
    users: Arc<Users>,
    clients: AwsClients,
    mapping: Mappings,
    store: Arc<dyn Store>,
    discord_signer: DiscordSigner,
    llm: FakeLlm,
    discord: FakeDiscord,
    receiver: FakeReceiver,
    now: Timestamp,
    agent: Agent,
    first: Heartbeat,
    webhook: Webhook,
    webhook_secret: String,
    /// Each hook's type and secret.
    hook_secrets: Vec<(&'static str, String)>,
    dir: tempfile::TempDir,
    watch: Stack,
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

impl World {
    /// The world with the agent's first heartbeat due (ten seconds ago).
    async fn new() -> Self {
        Self::with_first_beat_at(Timestamp::now() - jiff::SignedDuration::from_secs(10)).await
    }

    /// The world with the agent made at `created`, when its first heartbeat is due.
    async fn with_first_beat_at(created: Timestamp) -> Self {
        let _one_at_a_time = ONE_AT_A_TIME.lock().await;
        let moto = moto_iam_url();
        let table = unique("e2e");
        let sessions_name = format!("{}.fifo", unique("e2e-sessions"));
        let hooks_name = unique("e2e-hooks");
        let dlq_name = unique("e2e-hooks-dlq");
        let secrets_path = format!("/{}", unique("pulse-e2e"));
        let users = users(&moto);
        // What an earlier test left in the emulator's refusals is not this one's.
        users.new_denials();
        let clients = AwsClients::for_emulator_as(&moto, &users.admin.id, &users.admin.secret);
        create_table(&clients.dynamodb, &table).await.unwrap();
        let sessions = create_sessions_queue(&clients.sqs, &sessions_name)
            .await
            .unwrap();
        let hooks = create_hooks_queue(&clients.sqs, &hooks_name).await.unwrap();
        let hooks_dlq = create_hooks_queue(&clients.sqs, &dlq_name).await.unwrap();
        // Lambda's event source mappings receive and delete with the function's own role:
        // the test plays them with the same keys.
        let mapping = Mappings {
            worker: signed_as(&moto, &users, "conversation-worker"),
            dispatcher: signed_as(&moto, &users, "hook-dispatcher"),
        };
        // Secrets at rest are sealed with the deployment's key, which the functions read
        // from SSM with the other secrets.
        let encryption_key = pulse_shared::sealing::EncryptionKeys::new_key();
        let store: Arc<dyn Store> = Arc::new(
            DynamoStore::new(clients.dynamodb.clone(), &table, Duration::from_secs(20)).with_keys(
                pulse_shared::sealing::EncryptionKeys::parse(&encryption_key, None).unwrap(),
            ),
        );

        // Secrets live in SSM Parameter Store, as the template expects.
        let discord_signer = DiscordSigner::from_seed([9; 32]);
        let ssm = aws_sdk_ssm::Client::from_conf(
            aws_sdk_ssm::config::Builder::new()
                .behavior_version(aws_sdk_ssm::config::BehaviorVersion::latest())
                .endpoint_url(&moto)
                .region(aws_sdk_ssm::config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_ssm::config::Credentials::new(
                    &users.admin.id,
                    &users.admin.secret,
                    None,
                    None,
                    "e2e",
                ))
                .build(),
        );
        for (name, value) in [
            ("DISCORD_PUBLIC_KEY", discord_signer.public_key_hex()),
            ("DISCORD_BOT_TOKEN", BOT_TOKEN.to_owned()),
            ("OPENAI_API_KEY", OPENAI_KEY.to_owned()),
            ("PULSE_ENCRYPTION_KEY", encryption_key.clone()),
        ] {
            ssm.put_parameter()
                .name(format!("{secrets_path}/{name}"))
                .value(value)
                .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
                .send()
                .await
                .unwrap();
        }

        let llm = FakeLlm::start().await;
        let discord = FakeDiscord::start().await;
        let receiver = FakeReceiver::start().await;

        // The agent, its inbound webhook and its outbound hooks, as the CLI would create them.
        let now = Timestamp::now();
        let mut new = NewAgent::named("scout");
        new.discord_channel = Some(CHANNEL.to_owned());
        new.instructions = Some("Tell the user when a deploy finishes.".to_owned());
        let (agent, first) = new.create(created).unwrap();
        store.create_agent(&agent, &first).await.unwrap();
        let webhook_secret = generate_secret();
        let webhook = Webhook::new(
            agent.id.clone(),
            WebhookScheme::Standard,
            &webhook_secret,
            now,
        )
        .unwrap();
        store.create_webhook(&webhook).await.unwrap();
        let mut hook_secrets = Vec::new();
        for t in ["AFTER_HEARTBEAT", "MESSAGE_SENT"] {
            let h = Hook::new(
                agent.id.clone(),
                HookType::parse(t).unwrap(),
                HookTarget::parse(&receiver.url()).unwrap(),
                &generate_secret(),
                now,
            );
            store.create_hook(&h).await.unwrap();
            hook_secrets.push((t, h.secret.expose().to_owned()));
        }

        let dir = tempfile::tempdir().unwrap();
        let env: Vec<(String, String)> = [
            ("PULSE_TABLE", table.clone()),
            ("PULSE_SESSIONS_QUEUE_URL", sessions.clone()),
            ("PULSE_HOOKS_QUEUE_URL", hooks.clone()),
            ("PULSE_HOOKS_DLQ_URL", hooks_dlq.clone()),
            ("PULSE_SECRETS_PATH", secrets_path.clone()),
            ("PULSE_LLM_PROVIDER", "openai".to_owned()),
            ("PULSE_LLM_BASE_URL", llm.url()),
            ("DISCORD_API_BASE", discord.api_base()),
            ("DISCORD_APPLICATION_ID", APPLICATION.to_owned()),
            ("PULSE_HOOKS_ALLOW", "127.0.0.1/32".to_owned()),
            ("AWS_ENDPOINT_URL", moto.clone()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let watch = Stack::start(&env, users.clone(), dir.path()).await;
        Self {
            moto,
            table,
            sessions,
            hooks,
            hooks_dlq,
            users,
            clients,
            mapping,
            store,
            discord_signer,
            llm,
            discord,
            receiver,
            now,
            agent,
            first,
            webhook,
            webhook_secret,
            hook_secrets,
            dir,
            watch,
            _one_at_a_time,
        }
    }

    /// The header of a new API token of the agent's.
    async fn bearer(&self) -> [(String, String); 1] {
        let (token, presented) =
            pulse_shared::domain::ApiToken::issue(&self.agent.id, "e2e", None, self.now).unwrap();
        self.store.put_token(&token).await.unwrap();
        [("authorization".to_owned(), format!("Bearer {presented}"))]
    }
}

/// moto's IAM is basic: first, a call a role lacks really is refused (the receiver
/// may not delete), and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_a_role_lacks_is_refused_and_named() {
    let w = World::new().await;
    let receiver_keys = w.users.of("webhook-receiver");
    let refused = AwsClients::for_emulator_as(&w.moto, &receiver_keys.id, &receiver_keys.secret)
        .dynamodb
        .delete_item()
        .table_name(&w.table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("AG#x".into()),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S("AGENT".into()),
        )
        .send()
        .await
        .expect_err("the receiver's role has no dynamodb:DeleteItem");
    let refused = aws_sdk_dynamodb::error::DisplayErrorContext(refused).to_string();
    assert!(
        refused.contains("not authorized to perform: dynamodb:DeleteItem"),
        "{refused}"
    );
    assert_eq!(
        w.users.new_denials(),
        [format!(
            "webhook-receiver: dynamodb:DeleteItem on arn:aws:dynamodb:us-east-1:123456789012:table/{}",
            w.table
        )]
    );
}

/// The webhook receiver takes a signed webhook into the log; the sweeper claims the due
/// heartbeat; the worker runs it (the agent speaks) and the thought's turn posts to
/// Discord; the dispatcher delivers the hooks, signed; every function's metrics add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_wakes_a_heartbeat_that_speaks_on_discord_and_fires_signed_hooks() {
    let w = World::new().await;
    // Webhook receiver, Function URL: a signed external webhook → an event in the log.
    let body =
        json!({"event_type": "DEPLOY_FINISHED", "priority": 2, "payload": {"service": "api"}})
            .to_string();
    let headers = header_pairs(
        sign(
            WebhookScheme::Standard.signing(),
            &w.webhook_secret,
            body.as_bytes(),
            Timestamp::now().as_second(),
            "msg_e2e_deploy_1",
        )
        .unwrap(),
    );
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &function_url_request(
                &format!("/webhooks/{}", w.webhook.id),
                body.as_bytes(),
                &headers,
            ),
            "a signed webhook, accepted",
        )
        .await;
    assert_eq!(resp["statusCode"], 200, "{resp}\n{}", w.watch.log());
    let accepted: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    assert_eq!(accepted["status"], "accepted");
    let events = w.store.list_events(&w.agent.id, 10).await.unwrap();
    assert!(
        events.iter().any(
            |e| e.event_type == EventType::parse("DEPLOY_FINISHED").unwrap()
                && e.payload["service"] == "api"
        ),
        "{events:?}"
    );

    // Heartbeat sweeper, EventBridge scheduled event → the heartbeat claimed, its job
    // on the sessions queue in the agent's message group.
    let resp = w
        .watch
        .invoke(
            "heartbeat-sweeper",
            &fixture("eventbridge-scheduled.json"),
            "a sweep claims a due heartbeat",
        )
        .await;
    assert_eq!(resp["claimed"], 1, "{resp}\n{}", w.watch.log());
    let hb = w.store.get_heartbeat(&w.first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Executing);
    let jobs = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(jobs.len(), 1);
    assert!(matches!(task_of(&jobs[0]), SessionTask::Heartbeat(_)));
    assert_eq!(
        jobs[0].attributes().unwrap()[&MessageSystemAttributeName::MessageGroupId],
        w.agent.session.as_str()
    );

    // Conversation worker, SQS FIFO batch: the heartbeat agent speaks (fake LLM,
    // keyed by the secret read from SSM) → the heartbeat completes, a thought is queued.
    w.llm.script([
        Scripted::tool(
            "speak",
            json!({"thought": "The api deploy finished; tell the user."}),
        ),
        Scripted::text("done"),
    ]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &jobs),
            "a heartbeat job: the heartbeat agent speaks",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &jobs, &[]).await;
    let hb = w.store.get_heartbeat(&w.first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Completed, "{}", w.watch.log());
    let reqs = w.llm.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].headers["authorization"],
        format!("Bearer {OPENAI_KEY}"),
        "the LLM key comes from SSM"
    );
    let thoughts = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(thoughts.len(), 1);
    assert!(matches!(task_of(&thoughts[0]), SessionTask::Signal(_)));

    // The thought's turn → one message in the agent's channel on (fake) Discord,
    // posted with the bot token from SSM.
    w.llm
        .script([Scripted::text("Heads up: the api deploy just finished.")]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &thoughts),
            "the thought's turn, posted to Discord",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new());
    settle(&w.mapping.worker, &w.sessions, &thoughts, &[]).await;
    assert_eq!(
        w.discord.messages(),
        [Posted {
            place: format!("channel:{CHANNEL}"),
            content: "Heads up: the api deploy just finished.".into()
        }]
    );
    assert!(
        w.discord
            .requests()
            .iter()
            .all(|r| r.headers["authorization"] == format!("Bot {BOT_TOKEN}"))
    );

    // Hook dispatcher, SQS batch from the hooks queue → signed deliveries to the
    // receiver: AFTER_HEARTBEAT, and MESSAGE_SENT for the thought's message.
    let deliveries = receive(&w.mapping.dispatcher, &w.hooks, 2).await;
    assert_eq!(deliveries.len(), 2, "{}", w.watch.log());
    let resp = w
        .watch
        .invoke(
            "hook-dispatcher",
            &sqs_event("sqs-hooks-record.json", &deliveries),
            "hooks delivered",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.dispatcher, &w.hooks, &deliveries, &[]).await;
    let got = w.receiver.received();
    assert_eq!(got.len(), 2);
    let mut types: Vec<String> = Vec::new();
    for r in &got {
        let t = r.header("x-pulse-hook-type");
        let secret = &w.hook_secrets.iter().find(|(ty, _)| *ty == t).unwrap().1;
        verify(
            Scheme::Standard,
            &[secret],
            &r.headers,
            &r.body,
            Timestamp::now().as_second(),
        )
        .unwrap_or_else(|e| panic!("{t}: the signature does not verify: {e}"));
        assert_eq!(r.json()["agent"]["id"], w.agent.id.as_str());
        types.push(t);
    }
    types.sort();
    assert_eq!(types, ["AFTER_HEARTBEAT", "MESSAGE_SENT"]);

    // Each function printed its invocations' metrics as Embedded Metric Format lines:
    // every one a valid EMF document, adding up to what the invocations did.
    let log = w.watch.log();
    let docs = emf_documents(&log);
    assert!(!docs.is_empty(), "no EMF lines in the log:\n{log}");
    for doc in &docs {
        if let Err(why) = check_emf(doc) {
            panic!("not a valid EMF document ({why}): {doc}");
        }
    }
    let sum = |function: &str, metric: &str, labels: &[(&str, &str)]| {
        emf_values(&docs, function, metric, labels)
            .iter()
            .sum::<f64>()
    };
    let accepted = [("outcome", "accepted")];
    assert_eq!(
        sum("receiver", "pulse_webhook_requests_total", &accepted),
        1.0
    );
    assert_eq!(sum("sweeper", "pulse_heartbeats_claimed_total", &[]), 1.0);
    let lateness = emf_values(
        &docs,
        "sweeper",
        "pulse_heartbeat_lateness_max_seconds",
        &[],
    );
    assert_eq!(lateness.len(), 1, "one sweep, one gauge value");
    assert!(
        (0.0..120.0).contains(&lateness[0]),
        "the heartbeat was due at most moments before the sweep: {lateness:?}"
    );
    let completed = [("outcome", "completed")];
    assert_eq!(sum("worker", "pulse_heartbeats_total", &completed), 1.0);
    let answered = [("outcome", "answered")];
    assert_eq!(sum("worker", "pulse_turns_total", &answered), 1.0);
    assert_eq!(
        emf_values(&docs, "worker", "pulse_turn_latency_seconds", &[]).len(),
        1,
        "a latency per turn"
    );
    // Three model calls (two steps of the heartbeat agent, the thought's turn), 100 + 20
    // each.
    let tokens = |kind| {
        sum(
            "worker",
            "pulse_model_tokens_total",
            &[("kind", kind), ("provider", "openai")],
        )
    };
    assert_eq!((tokens("input"), tokens("output")), (300.0, 60.0));
    let succeeded = [("outcome", "succeeded")];
    assert_eq!(
        sum("dispatcher", "pulse_hook_deliveries_total", &succeeded),
        2.0
    );
}

/// The webhook receiver takes a signed Discord slash command and defers; the worker
/// answers it beside a broken message of another session, which alone is reported failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_slash_command_is_answered_beside_a_broken_message_of_another_session() {
    let w = World::new().await;
    // Webhook receiver, Function URL: a signed Discord slash command (public key from
    // SSM) → a deferred reply, and the user's message on the sessions queue.
    let minted = Timestamp::now().as_millisecond() - 1_000 - 1_420_070_400_000;
    let interaction_id = ((minted as u64) << 22).to_string();
    let command = json!({
        "id": interaction_id,
        "application_id": APPLICATION,
        "type": 2,
        "token": "interaction-token-e2e",
        "version": 1,
        "channel": {"id": CHANNEL, "type": 0},
        "channel_id": CHANNEL,
        "guild_id": "1100000000000000000",
        "member": {"user": {"id": "1000000000000000001", "username": "ada", "global_name": "Ada"},
                   "nick": null, "roles": [], "joined_at": "2026-01-01T00:00:00+00:00",
                   "deaf": false, "mute": false},
        "data": {"id": "1250000000000000000", "name": "ask", "type": 1,
                 "options": [{"name": "text", "type": 3, "value": "which service was it?"}]}
    })
    .to_string();
    let headers = header_pairs(
        w.discord_signer
            .sign(Timestamp::now().as_second(), command.as_bytes()),
    );
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &function_url_request("/discord/interactions", command.as_bytes(), &headers),
            "a Discord slash command",
        )
        .await;
    assert_eq!(resp["statusCode"], 200, "{resp}\n{}", w.watch.log());
    let reply: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    assert_eq!(reply, json!({"type": 5}), "a deferred reply");
    let mut batch = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(batch.len(), 1);

    // Conversation worker: the user's turn, beside a broken message of another
    // session → the reply edits the interaction's original response; the partial batch
    // response names the broken message only.
    let other = AgentId::generate();
    w.clients
        .sqs
        .send_message()
        .queue_url(&w.sessions)
        .message_body("not a task")
        .message_group_id(format!("ss_{}", other.as_str()))
        .message_deduplication_id("broken-1")
        .send()
        .await
        .unwrap();
    batch.extend(receive(&w.mapping.worker, &w.sessions, 1).await);
    assert_eq!(batch.len(), 2);
    let broken = batch
        .iter()
        .find(|m| m.body() == Some("not a task"))
        .unwrap()
        .message_id()
        .unwrap()
        .to_owned();
    w.llm.script([Scripted::text("It was the api service.")]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &batch),
            "a chat turn beside a broken message",
        )
        .await;
    assert_eq!(failures(&resp), vec![broken.clone()], "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &batch, &[broken]).await;
    assert_eq!(
        w.discord.messages(),
        [Posted {
            place: "interaction:interaction-token-e2e".into(),
            content: "It was the api service.".into()
        }]
    );
}

/// The messages API through the receiver's Function URL: a message answered, and a turn
/// superseded by a second message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_api_answers_and_a_second_message_supersedes_the_first() {
    let w = World::new().await;
    // The messages API through the receiver's Function URL: a message with an API
    // token → 202 and the user's message on the sessions queue; the worker answers it;
    // the turn, read back through the Function URL, holds the reply (not posted to
    // Discord: it was asked over the API).
    let bearer = w.bearer().await;
    let body = json!({"text": "what happened today?"}).to_string();
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &function_url_request(
                &format!("/v1/agents/{}/messages", w.agent.id),
                body.as_bytes(),
                &bearer,
            ),
            "POST /v1/agents/{id}/messages",
        )
        .await;
    assert_eq!(resp["statusCode"], 202, "{resp}\n{}", w.watch.log());
    let queued: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    let turn_id = queued["turn_id"].as_str().unwrap().to_owned();
    let asked = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(asked.len(), 1);
    w.llm.script([Scripted::text("One deploy, of the api.")]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &asked),
            "the API message's turn",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &asked, &[]).await;
    let get = function_url_get(&format!("/v1/turns/{turn_id}"), "wait=5s", &bearer);
    let resp = w
        .watch
        .invoke("webhook-receiver", &get, "GET /v1/turns/{id}?wait=5s")
        .await;
    assert_eq!(resp["statusCode"], 200, "{resp}\n{}", w.watch.log());
    let turn: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        (turn["status"].as_str(), turn["reply"].as_str()),
        (Some("done"), Some("One deploy, of the api.")),
        "{turn}"
    );
    assert_eq!(
        w.discord.messages().len(),
        0,
        "the API's reply is not posted to Discord"
    );

    // Double texting through the API: a second message while the model answers
    // the first drops that call; the first message's turn is superseded, and polling it
    // returns the turn that answered both (read from the agent's latest turns).
    let post = |text: &str| {
        function_url_request(
            &format!("/v1/agents/{}/messages", w.agent.id),
            json!({ "text": text }).to_string().as_bytes(),
            &bearer,
        )
    };
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &post("is the api up?"),
            "POST /v1/agents/{id}/messages (a first message)",
        )
        .await;
    let first_turn: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    let first_turn = first_turn["turn_id"].as_str().unwrap().to_owned();
    let first_asked = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(first_asked.len(), 1);
    w.llm.hold();
    w.llm.script([Scripted::text("Yes, and the web one too.")]);
    let calls = w.llm.requests().len();
    let first_batch = sqs_event("sqs-fifo-record.json", &first_asked);
    let (resp, ()) = tokio::join!(
        w.watch.invoke(
            "conversation-worker",
            &first_batch,
            "a turn a second message supersedes",
        ),
        async {
            w.llm.wait_for(calls + 1).await;
            let resp = w
                .watch
                .invoke(
                    "webhook-receiver",
                    &post("and the web one?"),
                    "POST /v1/agents/{id}/messages (a second message, while the first is answered)",
                )
                .await;
            assert_eq!(resp["statusCode"], 202, "{resp}");
            w.llm.wait_abandoned(1).await;
            w.llm.release();
        }
    );
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &first_asked, &[]).await;
    let second_asked = receive(&w.mapping.worker, &w.sessions, 1).await;
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &second_asked),
            "the turn that answers both messages",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &second_asked, &[]).await;
    let get = function_url_get(&format!("/v1/turns/{first_turn}"), "", &bearer);
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &get,
            "GET /v1/turns/{id} (a superseded turn)",
        )
        .await;
    let turn: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    assert_eq!(turn["reply"], "Yes, and the web one too.", "{turn}");
    assert_ne!(turn["answered_by"], json!(first_turn), "{turn}");
    // The hooks the two turns emitted are not this test's.
    let _ = receive(&w.mapping.dispatcher, &w.hooks, 0).await;
}

/// A webhook signed with another secret is refused and appends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_webhook_is_refused_and_appends_nothing() {
    let w = World::new().await;
    // A webhook signed with another secret is refused and appends nothing.
    let events_before = w.store.list_events(&w.agent.id, 100).await.unwrap().len();
    let body = json!({"event_type": "DEPLOY_FINISHED", "payload": {"service": "web"}}).to_string();
    let forged = header_pairs(
        sign(
            WebhookScheme::Standard.signing(),
            &generate_secret(),
            body.as_bytes(),
            Timestamp::now().as_second(),
            "msg_e2e_forged_1",
        )
        .unwrap(),
    );
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &function_url_request(
                &format!("/webhooks/{}", w.webhook.id),
                body.as_bytes(),
                &forged,
            ),
            "a forged webhook, refused",
        )
        .await;
    assert_eq!(resp["statusCode"], 401, "{resp}");
    assert_eq!(
        w.store.list_events(&w.agent.id, 100).await.unwrap().len(),
        events_before
    );
}

/// A turn shows the model a matching memory, keeps a new one and recalls; a hook that
/// cannot be reached is dead-lettered, one that fails is retried, one goes to EventBridge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_recalls_and_keeps_memories_and_an_unreachable_hook_is_dead_lettered() {
    let w = World::new().await;
    let bearer = w.bearer().await;
    // Memory: the agent holds a memory the user's next message matches. The turn
    // shows it to the model (reinforcing it: a batch write), and the model keeps a new
    // one (`remember`) and searches (`recall`). A hook that cannot be reached and has no
    // retries is dead-lettered by the dispatcher.
    let kept = Memory::new(
        MemoryId::derived(w.now.as_millisecond() as u64, &["e2e", "friday"]),
        &w.agent.id,
        "The api service deploys every Friday afternoon",
        0,
        w.now,
    )
    .unwrap();
    w.store.remember(std::slice::from_ref(&kept)).await.unwrap();
    let mut dead = Hook::new(
        w.agent.id.clone(),
        HookType::parse("MESSAGE_SENT").unwrap(),
        HookTarget::parse(&format!("http://127.0.0.1:{}/", closed_port())).unwrap(),
        &generate_secret(),
        w.now,
    );
    dead.retry = RetrySchedule::none();
    w.store.create_hook(&dead).await.unwrap();
    // One that fails and is retried (re-queued with its delay), and one onto the
    // account's default event bus.
    let flaky = Hook::new(
        w.agent.id.clone(),
        HookType::parse("MESSAGE_SENT").unwrap(),
        HookTarget::parse(&format!("http://127.0.0.1:{}/", closed_port())).unwrap(),
        &generate_secret(),
        w.now,
    );
    w.store.create_hook(&flaky).await.unwrap();
    let bus = Hook::new(
        w.agent.id.clone(),
        HookType::parse("MESSAGE_SENT").unwrap(),
        HookTarget::parse("eventbridge://default").unwrap(),
        &generate_secret(),
        w.now,
    );
    w.store.create_hook(&bus).await.unwrap();
    let body = json!({"text": "when does the api service deploy?"}).to_string();
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &function_url_request(
                &format!("/v1/agents/{}/messages", w.agent.id),
                body.as_bytes(),
                &bearer,
            ),
            "POST /v1/agents/{id}/messages (a question a memory answers)",
        )
        .await;
    assert_eq!(resp["statusCode"], 202, "{resp}");
    let queued: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    let turn_id = queued["turn_id"].as_str().unwrap().to_owned();
    let asked = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(asked.len(), 1);
    w.llm.script([
        Scripted::tool(
            "remember",
            json!({"text": "The user follows the api service's deploys", "kind": "fact"}),
        ),
        Scripted::tool("recall", json!({"query": "api deploy friday"})),
        Scripted::text("Every Friday afternoon."),
    ]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &asked),
            "a chat turn with a matching memory, remember and recall",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &asked, &[]).await;
    let prompt = w.llm.requests()[w.llm.requests().len() - 3]
        .body
        .to_string();
    assert!(prompt.contains("deploys every Friday"), "{prompt}");
    let reinforced = w
        .store
        .get_memory(&w.agent.id, &kept.id)
        .await
        .unwrap()
        .unwrap();
    assert!(reinforced.recalls > kept.recalls, "{reinforced:?}");
    let all = w.store.all_memories(&w.agent.id).await.unwrap();
    assert!(
        all.iter()
            .any(|m| m.text == "The user follows the api service's deploys"),
        "{all:?}"
    );
    let get = function_url_get(&format!("/v1/turns/{turn_id}"), "wait=5s", &bearer);
    let resp = w
        .watch
        .invoke(
            "webhook-receiver",
            &get,
            "GET /v1/turns/{id} (the memory's answer)",
        )
        .await;
    let turn: Value = serde_json::from_str(resp["body"].as_str().unwrap()).unwrap();
    assert_eq!(turn["reply"], "Every Friday afternoon.", "{turn}");
    let deliveries = receive(&w.mapping.dispatcher, &w.hooks, 2).await;
    let resp = w
        .watch
        .invoke(
            "hook-dispatcher",
            &sqs_event("sqs-hooks-record.json", &deliveries),
            "hooks delivered, one dead-lettered",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.dispatcher, &w.hooks, &deliveries, &[]).await;
    let dead_lettered = receive(&w.clients.sqs, &w.hooks_dlq, 2).await;
    assert_eq!(dead_lettered.len(), 1, "{}", w.watch.log());
    let status = |id| {
        let store = w.store.clone();
        async move { store.list_deliveries(&id, 1).await.unwrap()[0].status }
    };
    assert_eq!(status(bus.id.clone()).await, DeliveryStatus::Succeeded);
    assert_eq!(status(flaky.id.clone()).await, DeliveryStatus::Pending);
    assert_eq!(status(dead.id.clone()).await, DeliveryStatus::Exhausted);
}

/// Reminders: a one-time reminder pulls the next heartbeat forward, a cron one is due at
/// the same beat; the worker runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_pulls_the_heartbeat_forward_and_the_worker_runs_it_with_a_cron_one() {
    let w = World::with_first_beat_at(Timestamp::now() + jiff::SignedDuration::from_hours(1)).await;
    // Reminders: a one-time reminder two seconds ahead pulls the next heartbeat
    // forward; a cron reminder is due at the same beat. The sweep claims it, the worker
    // runs it (a tool subscribed to SCHEDULED runs on each): the one-time reminder is
    // deleted, the cron one filed for its next minute.
    let tool = FakeTool::start().await;
    let tool_name = ToolName::parse("stretcher").unwrap();
    w.store
        .add_tool(
            &Tool::http(
                tool_name.clone(),
                &tool.url(),
                Duration::from_secs(10),
                w.now,
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let scheduled = EventType::parse("SCHEDULED").unwrap();
    w.store
        .add_subscription(&Subscription {
            id: SubscriptionId::for_route(&tool_name, &scheduled, None),
            tool: tool_name.clone(),
            event_type: scheduled,
            agent_id: None,
            filter: Filter::default(),
            order: 0,
            active: true,
            created_at: w.now,
        })
        .await
        .unwrap();
    let ops = Lifecycle::new(
        w.store.clone(),
        Arc::new(SystemClock),
        pulse_tests::settings(),
        None,
    );
    // (Stored times are kept to the millisecond.)
    let at = Timestamp::from_millisecond(Timestamp::now().as_millisecond() + 2_000).unwrap();
    let once = ops
        .schedule(
            &w.agent.id,
            ScheduleRule::Once { at },
            Some("stretch".into()),
        )
        .await
        .unwrap();
    assert_eq!(once.pulled, Some(at));
    let cron = Schedule::new(
        &w.agent.id,
        ScheduleRule::cron("* * * * *", TimeZoneName::parse("UTC").unwrap()).unwrap(),
        Some("standup".into()),
        Timestamp::now() - jiff::SignedDuration::from_secs(61),
    )
    .unwrap();
    w.store.put_schedule(&cron).await.unwrap();
    let due_in = at.duration_since(Timestamp::now());
    tokio::time::sleep(Duration::try_from(due_in).unwrap_or_default() + Duration::from_millis(50))
        .await;
    let resp = w
        .watch
        .invoke(
            "heartbeat-sweeper",
            &fixture("eventbridge-scheduled.json"),
            "a sweep claims the reminders' heartbeat",
        )
        .await;
    assert_eq!(resp["claimed"], 1, "{resp}\n{}", w.watch.log());
    let jobs = receive(&w.mapping.worker, &w.sessions, 1).await;
    assert_eq!(jobs.len(), 1);
    w.llm.script([Scripted::text("done")]);
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &jobs),
            "the reminders' heartbeat: a tool on each, the one-time one deleted",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &jobs, &[]).await;
    assert_eq!(tool.requests().len(), 2, "{}", w.watch.log());
    let left = w.store.schedules(&w.agent.id).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, cron.id);
    assert!(left[0].next_at > cron.next_at, "{left:?}");
    // Whatever else the beat queued (a thought, hooks) is not this test's.
    let _ = receive(&w.mapping.worker, &w.sessions, 0).await;
}

/// The daily retention pass removes an old turn, keeps today's, and queues the memory
/// consolidation the worker runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_pass_removes_old_turns_and_queues_a_consolidation() {
    let w = World::new().await;
    // Retention: the daily pass removes a conversation turn from forty days ago, and
    // keeps today's.
    let answered_at = |at: Timestamp, text: &str| {
        let signal = SignalId::generate(at.as_millisecond() as u64);
        Turn {
            id: TurnId::for_signal(&signal),
            agent_id: w.agent.id.clone(),
            session: w.agent.session.clone(),
            signals: vec![signal],
            status: TurnStatus::Done,
            parts: vec![text.into()],
            delivered: 1,
            target: ReplyTarget::None,
            discord_message_ids: Vec::new(),
            provider: "offline".into(),
            model: "offline".into(),
            usage: Usage::default(),
            cost_usd: None,
            steps: Vec::new(),
            error: None,
            created_at: at,
            completed_at: Some(at),
            requests: None,
            spoken_by: None,
            trace_id: None,
            seen: None,
        }
    };
    let old_turn = answered_at(
        w.now - jiff::SignedDuration::from_hours(40 * 24),
        "an old answer",
    );
    let todays = answered_at(w.now, "today's answer");
    for t in [&old_turn, &todays] {
        w.store.begin_turn(t, &[]).await.unwrap();
    }
    let mut retention = fixture("eventbridge-scheduled.json");
    retention["detail-type"] = json!("Pulse Retention");
    let resp = w
        .watch
        .invoke("heartbeat-sweeper", &retention, "the daily retention pass")
        .await;
    assert!(resp.get("errorType").is_none(), "{resp}\n{}", w.watch.log());
    assert_eq!(
        w.store.get_turn(&w.agent.id, &old_turn.id).await.unwrap(),
        None,
        "{resp}"
    );
    assert!(
        w.store
            .get_turn(&w.agent.id, &todays.id)
            .await
            .unwrap()
            .is_some(),
        "today's turn is kept"
    );
    // The pass queued the agent's memory consolidation; the worker runs it.
    let consolidations = receive(&w.mapping.worker, &w.sessions, 2).await;
    assert_eq!(consolidations.len(), 1, "{}", w.watch.log());
    let resp = w
        .watch
        .invoke(
            "conversation-worker",
            &sqs_event("sqs-fifo-record.json", &consolidations),
            "a memory consolidation the retention pass queued",
        )
        .await;
    assert_eq!(failures(&resp), Vec::<String>::new(), "{}", w.watch.log());
    settle(&w.mapping.worker, &w.sessions, &consolidations, &[]).await;
}

/// The Discord gateway's forwarder under its task role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulse_gateway_forwards_a_direct_message_under_its_task_role() {
    let w = World::new().await;
    // The Discord gateway's forwarder (`pulse gateway`, the optional ECS task) under
    // its task role: a direct message from the agent's user is queued for the worker.
    let before = w.store.get_agent(&w.agent.id).await.unwrap().unwrap();
    let mut befriended = before.clone();
    befriended.discord.users = vec![FRIEND.to_owned()];
    w.store.update_agent(&befriended, &before).await.unwrap();
    let gateway = FakeGateway::start().await;
    let mut gateway_env: Vec<(String, String)> = [
        ("PULSE_BACKEND", "aws".to_owned()),
        ("PULSE_TABLE", w.table.clone()),
        ("PULSE_SESSIONS_QUEUE_URL", w.sessions.clone()),
        ("DISCORD_BOT_TOKEN", BOT_TOKEN.to_owned()),
        ("DISCORD_API_BASE", w.discord.api_base()),
        ("DISCORD_GATEWAY_URL", gateway.url()),
        ("AWS_ENDPOINT_URL", w.moto.clone()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("RUST_LOG", "info".to_owned()),
        ("PULSE_AWS_ACTIONS_AS", "gateway".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Ok(d) = std::env::var("PULSE_TEST_AWS_ACTIONS_DIR") {
        gateway_env.push(("PULSE_AWS_ACTIONS_DIR".into(), d));
    }
    let gateway_env = w.users.environment_of("gateway", &gateway_env);
    let log_path = w.dir.path().join("gateway.log");
    let mut forwarder = std::process::Command::new(built("pulse"))
        .arg("gateway")
        .env_clear()
        .envs(gateway_env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let gateway_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let started = std::time::Instant::now();
    while !gateway.is_live() {
        if let Some(status) = forwarder.try_wait().unwrap() {
            panic!("pulse gateway exited ({status}):\n{}", gateway_log());
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pulse gateway did not connect in 30 s:\n{}",
            gateway_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "hello from Discord"),
    );
    // Polled without a long wait: moto serves one request at a time, so a long poll
    // would hold up the forwarder's send.
    let started = std::time::Instant::now();
    let mut forwarded = Vec::new();
    while forwarded.is_empty() && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        forwarded = receive(&w.mapping.worker, &w.sessions, 0).await;
    }
    // Stopped as ECS stops a task: SIGTERM, and it gives up its lease.
    std::process::Command::new("kill")
        .args(["-TERM", &forwarder.id().to_string()])
        .status()
        .unwrap();
    let stopped = forwarder.wait().unwrap();
    assert!(stopped.success(), "{stopped}\n{}", gateway_log());
    let denied = w.users.new_denials();
    assert!(
        denied.is_empty(),
        "IAM refused, on the path \"a direct message forwarded by pulse gateway\":\n  {}\n{}",
        denied.join("\n  "),
        gateway_log()
    );
    assert_eq!(forwarded.len(), 1, "{}", gateway_log());
    assert!(
        matches!(task_of(&forwarded[0]), SessionTask::Signal(_)),
        "{:?}",
        forwarded[0].body()
    );
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The EMF documents in a log: the lines that are JSON objects with an `_aws` member.
fn emf_documents(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| line.find('{').map(|i| &line[i..]))
        .filter_map(|json| serde_json::from_str::<Value>(json).ok())
        .filter(|v| v.get("_aws").is_some())
        .collect()
}

/// Checks one document against the Embedded Metric Format specification: a timestamp
/// in milliseconds, directives naming a namespace, dimension sets of at most 30 keys
/// that are string members of the root, and at most 100 metrics, each a root member
/// holding a number or an array of at most 100 numbers, with a CloudWatch unit.
fn check_emf(doc: &Value) -> Result<(), String> {
    const UNITS: &[&str] = &[
        "Seconds",
        "Microseconds",
        "Milliseconds",
        "Bytes",
        "Kilobytes",
        "Megabytes",
        "Gigabytes",
        "Terabytes",
        "Bits",
        "Kilobits",
        "Megabits",
        "Gigabits",
        "Terabits",
        "Percent",
        "Count",
        "Bytes/Second",
        "Kilobytes/Second",
        "Megabytes/Second",
        "Gigabytes/Second",
        "Terabytes/Second",
        "Bits/Second",
        "Kilobits/Second",
        "Megabits/Second",
        "Gigabits/Second",
        "Terabits/Second",
        "Count/Second",
        "None",
    ];
    let aws = doc["_aws"].as_object().ok_or("_aws is not an object")?;
    let ts = aws
        .get("Timestamp")
        .and_then(Value::as_u64)
        .ok_or("no Timestamp")?;
    if ts < 1_600_000_000_000 {
        return Err(format!("Timestamp {ts} is not in milliseconds"));
    }
    let directives = aws
        .get("CloudWatchMetrics")
        .and_then(Value::as_array)
        .ok_or("no CloudWatchMetrics array")?;
    if directives.is_empty() {
        return Err("CloudWatchMetrics is empty".into());
    }
    for d in directives {
        let ns = d["Namespace"].as_str().ok_or("no Namespace")?;
        if ns.trim().is_empty() || ns.len() > 1024 {
            return Err(format!("Namespace {ns:?}"));
        }
        let sets = d["Dimensions"].as_array().ok_or("no Dimensions array")?;
        for set in sets {
            let keys = set.as_array().ok_or("a dimension set is not an array")?;
            if keys.len() > 30 {
                return Err("more than 30 dimensions".into());
            }
            for k in keys {
                let k = k.as_str().ok_or("a dimension key is not a string")?;
                if !doc[k].is_string() {
                    return Err(format!("dimension {k} has no string value at the root"));
                }
            }
        }
        let metrics = d["Metrics"].as_array().ok_or("no Metrics array")?;
        if metrics.is_empty() || metrics.len() > 100 {
            return Err(format!("{} metrics in a directive", metrics.len()));
        }
        for m in metrics {
            let name = m["Name"].as_str().ok_or("a metric without a Name")?;
            if let Some(unit) = m.get("Unit") {
                let unit = unit.as_str().unwrap_or_default();
                if !UNITS.contains(&unit) {
                    return Err(format!("{name}: unit {unit:?}"));
                }
            }
            match &doc[name] {
                Value::Number(_) => {}
                Value::Array(vs) if vs.len() <= 100 && vs.iter().all(Value::is_number) => {}
                other => return Err(format!("{name} holds {other}")),
            }
        }
    }
    Ok(())
}

/// The values of `metric` in the documents of `function` whose labels are `labels`
/// (and no others besides the function).
fn emf_values(docs: &[Value], function: &str, metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    docs.iter()
        .filter(|d| d["function"] == function)
        .filter(|d| {
            let dims = d["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
                .as_array()
                .map_or(0, Vec::len);
            dims == labels.len() + 1 && labels.iter().all(|(k, v)| d[*k] == *v)
        })
        .flat_map(|d| match &d[metric] {
            Value::Number(n) => n.as_f64().into_iter().collect(),
            Value::Array(vs) => vs.iter().filter_map(Value::as_f64).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// The arm64 builds as the deploy makes them (`cargo lambda build --release --arm64`,
/// cross-compiled with zig), each started under qemu-user against the runtime API
/// stand-in for one invocation, on the emulator: the sweeper's scheduled event, the
/// worker's and the dispatcher's batch with one message they cannot read (the worker
/// reports it failed, by id; the dispatcher drops it), the receiver's health check. The test command's arm64 stage runs it
/// after that build: `PULSE_TEST_ARM64_DIR` is the build's `lambda/` directory (each
/// function's `bootstrap`, unzipped), `PULSE_TEST_QEMU` the emulator and its sysroot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the arm64 build: ./scripts/test.sh builds it and runs this with --ignored"]
async fn the_arm64_builds_start_under_qemu_and_answer_an_invocation_each() {
    let dir_of = |name| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: ./scripts/test.sh sets it for its arm64 stage")
        })
    };
    let builds = PathBuf::from(dir_of("PULSE_TEST_ARM64_DIR"));
    let runner: Vec<String> = dir_of("PULSE_TEST_QEMU")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let moto = pulse_tests::moto_url();
    let clients = AwsClients::for_emulator(&moto);
    let table = unique("arm64");
    create_table(&clients.dynamodb, &table).await.unwrap();
    let sessions = create_sessions_queue(&clients.sqs, &format!("{}.fifo", unique("arm64")))
        .await
        .unwrap();
    let hooks = create_hooks_queue(&clients.sqs, &unique("arm64-hooks"))
        .await
        .unwrap();
    let env: Vec<(String, String)> = [
        ("PULSE_BACKEND", "aws".to_owned()),
        ("PULSE_TABLE", table),
        ("PULSE_SESSIONS_QUEUE_URL", sessions),
        ("PULSE_HOOKS_QUEUE_URL", hooks),
        ("AWS_ENDPOINT_URL", moto.clone()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let dir = tempfile::tempdir().unwrap();
    let broken = |record: &str| {
        let mut r = fixture(record);
        r["messageId"] = json!("unreadable-1");
        r["body"] = json!("not a task");
        json!({ "Records": [r] })
    };
    let health = function_url_get("/healthz", "", &[]);
    for (name, event) in [
        ("heartbeat-sweeper", fixture("eventbridge-scheduled.json")),
        ("conversation-worker", broken("sqs-fifo-record.json")),
        ("hook-dispatcher", broken("sqs-hooks-record.json")),
        ("webhook-receiver", health.clone()),
    ] {
        let bootstrap = builds.join(name).join("bootstrap");
        let kind =
            std::fs::read(&bootstrap).unwrap_or_else(|e| panic!("{}: {e}", bootstrap.display()));
        // ELF, 64-bit, machine 183 (AArch64).
        assert_eq!(
            &kind[..5],
            b"\x7fELF\x02",
            "{} is not a 64-bit ELF",
            bootstrap.display()
        );
        assert_eq!(
            u16::from_le_bytes([kind[18], kind[19]]),
            183,
            "{} is not aarch64",
            bootstrap.display()
        );
        let f = Function::start(name, &bootstrap, &runner, &env, dir.path()).await;
        let resp = f.invoke(&event).await;
        match name {
            "heartbeat-sweeper" => assert_eq!(resp["claimed"], 0, "{resp}\n{}", f.log()),
            "webhook-receiver" => assert_eq!(resp["statusCode"], 200, "{resp}\n{}", f.log()),
            // The worker hands an unreadable message back (its redrive dead-letters
            // it); the dispatcher drops an unreadable hook task, saying so.
            "conversation-worker" => assert_eq!(failures(&resp), ["unreadable-1"], "{}", f.log()),
            _ => {
                assert_eq!(failures(&resp), Vec::<String>::new(), "{}", f.log());
                assert!(f.log().contains("not a hook task; dropped"), "{}", f.log());
            }
        }
    }
}
