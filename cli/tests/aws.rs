//! The AWS side from a person's terminal, on the moto server (`PULSE_TEST_MOTO_URL`):
//! `pulse init`, the errors met first (each one line with its fix), `PULSE_STACK`
//! against a stack made in the emulator, and a signed webhook through `pulse serve`.
//! The scenarios of `cli.rs` and `operate.rs` run on both backends beside these.

#[macro_use]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use common::{Backend, dir_on, json, ok};
use pulse_shared::adapters::aws::{AwsClients, table_differences};
use pulse_tests::{moto_url, unique};

/// An emulator user's settings: static keys, a region, the endpoint.
fn emulator(cmd: &mut Command) -> &mut Command {
    cmd.envs(common::emulator_env())
}

/// `pulse args` on the AWS backend with `vars`.
fn pulse_aws(dir: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = common::command(dir, args);
    emulator(&mut cmd).env("PULSE_BACKEND", "aws");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn name() -> String {
    unique("init").replace('.', "-")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_makes_what_the_template_declares_once_and_checks_what_it_finds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let name = name();
    let n = name.clone();
    let (first, second) = tokio::task::spawn_blocking(move || {
        (
            pulse_aws(&d, &["init", "--name", &n], &[]),
            pulse_aws(&d, &["init", "--name", &n], &[]),
        )
    })
    .await
    .unwrap();
    assert!(first.status.success(), "{}", text(&first.stderr));
    let said = text(&first.stderr);
    assert_eq!(said.matches(": created").count(), 5, "{said}");
    let exports = text(&first.stdout);
    assert!(
        exports.contains(&format!("export PULSE_TABLE='{name}'")),
        "{exports}"
    );
    assert!(exports.contains("export PULSE_BACKEND='aws'"));
    assert!(
        exports.contains(&format!("{name}-sessions.fifo'")),
        "{exports}"
    );
    assert!(exports.contains(&format!("{name}-hooks-dlq'")), "{exports}");
    // Idempotent: the second run reuses all five.
    assert!(second.status.success(), "{}", text(&second.stderr));
    let again = text(&second.stderr);
    assert_eq!(again.matches("exists, reused").count(), 5, "{again}");
    assert!(!again.contains("created"), "{again}");
    assert_eq!(text(&second.stdout), exports, "the same exports");

    // What it made is what infra/template.yaml declares.
    let clients = AwsClients::for_emulator(&moto_url());
    let table = clients
        .dynamodb
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    assert!(table_differences(&table).is_empty());
    let ttl = clients
        .dynamodb
        .describe_time_to_live()
        .table_name(&name)
        .send()
        .await
        .unwrap()
        .time_to_live_description
        .unwrap();
    assert_eq!(ttl.attribute_name(), Some("expires_at"));
    let url = exports
        .lines()
        .find_map(|l| l.strip_prefix("export PULSE_SESSIONS_QUEUE_URL="))
        .unwrap()
        .trim_matches('\'')
        .to_owned();
    let attrs = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs_attr("All"))
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let get = |k: &str| attrs.get(&aws_sdk_sqs_attr(k)).cloned().unwrap_or_default();
    assert_eq!(get("FifoQueue"), "true");
    assert_eq!(get("VisibilityTimeout"), "720");
    let redrive = get("RedrivePolicy");
    assert!(
        redrive.contains(&format!("{name}-sessions-dlq.fifo")) && redrive.contains('5'),
        "{redrive}"
    );

    // The exports work as printed.
    let d = dir.path();
    let vars: Vec<(String, String)> = exports
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect();
    let borrowed: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (&**k, &**v)).collect();
    let created = pulse_aws(d, &["agents", "create", "--name", "after-init"], &borrowed);
    assert!(created.status.success(), "{}", text(&created.stderr));

    // A table of another shape is named, not used.
    let other = name + "-other";
    clients
        .dynamodb
        .create_table()
        .table_name(&other)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let refused = pulse_aws(d, &["init", "--name", &other], &[]);
    assert_eq!(refused.status.code(), Some(1));
    let why = text(&refused.stderr);
    assert!(
        why.contains("its keys are id/- (Pulse needs pk/sk)") && why.contains("no `due` index"),
        "{why}"
    );
}

fn aws_sdk_sqs_attr(name: &str) -> aws_sdk_sqs::types::QueueAttributeName {
    aws_sdk_sqs::types::QueueAttributeName::from(name)
}

/// One `error:` line on stderr, exit 1.
fn one_error(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    lines[0].to_owned()
}

#[test]
fn the_first_errors_say_what_to_do_in_one_line() {
    let dir = dir_on(Backend::Aws);
    let d = dir.path();
    // No region anywhere.
    let mut cmd = common::command(d, &["agents", "list"]);
    emulator(&mut cmd)
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", d.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", d.join("no-credentials"));
    let e = one_error(&cmd.output().unwrap());
    assert!(
        e.contains("no AWS region") && e.contains("AWS_REGION"),
        "{e}"
    );

    // No credentials anywhere (and no instance metadata).
    let mut cmd = common::command(d, &["agents", "list"]);
    emulator(&mut cmd)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env("AWS_CONFIG_FILE", d.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", d.join("no-credentials"))
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let e = one_error(&cmd.output().unwrap());
    assert!(
        e.contains("no AWS credentials") && e.contains("AWS_ACCESS_KEY_ID=test"),
        "{e}"
    );

    // A table that is not there, named.
    let e = one_error(&pulse_aws(
        d,
        &["agents", "list"],
        &[("PULSE_TABLE", "no-such-table")],
    ));
    assert!(
        e.contains("DynamoDB table `no-such-table` does not exist")
            && e.contains("run `pulse init`")
            && e.contains(&moto_url()),
        "{e}"
    );

    // A queue that is not there: refused before anything is written.
    let missing = format!("{}/123456789012/no-such-queue.fifo", moto_url());
    let e = one_error(&pulse_aws(
        d,
        &["agents", "create", "--name", "half"],
        &[("PULSE_SESSIONS_QUEUE_URL", &missing)],
    ));
    assert!(
        e.contains(&format!("SQS sessions queue {missing} does not exist")),
        "{e}"
    );
    assert_eq!(json(d, &["agents", "list"]), serde_json::json!([]));

    // An endpoint nobody answers on.
    let port = common::free_port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let e = one_error(&pulse_aws(
        d,
        &["agents", "list"],
        &[("AWS_ENDPOINT_URL", &nowhere)],
    ));
    assert!(
        e.contains(&format!("cannot reach DynamoDB at {nowhere}")),
        "{e}"
    );
}

#[test]
fn before_init_a_command_says_to_run_init_or_set_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    let out = pulse_aws(dir.path(), &["agents", "list"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert!(
        e.contains("PULSE_TABLE")
            && e.contains("eval \"$(pulse init)\"")
            && e.contains("PULSE_STACK"),
        "{e}"
    );
}

#[test]
fn init_keeps_the_key_in_one_file_every_shell_finds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = name();
    let first = pulse_aws(d, &["init", "--name", &n, "--json"], &[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let exports: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let file = exports["PULSE_ENCRYPTION_KEY_FILE"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(Path::new(&file), d.join(format!("{n}.key")));
    let key = std::fs::read_to_string(&file).unwrap();
    // A second shell runs init again: the same file, the same key.
    let second = pulse_aws(d, &["init", "--name", &n, "--json"], &[]);
    let again: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(again["PULSE_ENCRYPTION_KEY_FILE"], file.as_str());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), key);
    // With its exports, one shell seals a webhook's secret and another reads it back.
    let vars: Vec<(String, String)> = exports
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let agent = pulse_aws(d, &["agents", "create", "--name", "keyed"], &vars);
    assert!(agent.status.success(), "{}", text(&agent.stderr));
    let agent = text(&agent.stdout).trim().to_owned();
    let made = pulse_aws(d, &["webhooks", "create", "--agent", &agent], &vars);
    assert!(made.status.success(), "{}", text(&made.stderr));
    let listed = pulse_aws(d, &["webhooks", "list", "--json"], &vars);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    // With the key set explicitly as well, the two ways conflict and it says so.
    let both = pulse_aws(
        d,
        &["agents", "list"],
        &[vars.as_slice(), &[("PULSE_ENCRYPTION_KEY", key.trim())]].concat(),
    );
    assert_eq!(both.status.code(), Some(2));
    assert!(
        text(&both.stderr).contains("unset one of them"),
        "{}",
        text(&both.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulse_stack_finds_the_table_queues_receiver_and_secrets_of_a_deployment() {
    let stack = unique("stack").replace('.', "-");
    let sdk = aws_sdk_cloudformation::Config::builder()
        .behavior_version(aws_sdk_cloudformation::config::BehaviorVersion::latest())
        .endpoint_url(moto_url())
        .region(aws_sdk_cloudformation::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_cloudformation::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .build();
    let template = include_str!("../../tests/fixtures/pulse-stack.json");
    aws_sdk_cloudformation::Client::from_conf(sdk)
        .create_stack()
        .stack_name(&stack)
        .template_body(template)
        .send()
        .await
        .unwrap();
    // The functions' secrets under the stack's path, as a deployment keeps them.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let key = json(&d, &["secrets", "new-key"])["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let ssm = aws_sdk_ssm::Client::from_conf(
        aws_sdk_ssm::Config::builder()
            .behavior_version(aws_sdk_ssm::config::BehaviorVersion::latest())
            .endpoint_url(moto_url())
            .region(aws_sdk_ssm::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_ssm::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .build(),
    );
    ssm.put_parameter()
        .name(format!("/{stack}/PULSE_ENCRYPTION_KEY"))
        .value(&key)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();

    tokio::task::spawn_blocking(move || {
        let with_stack = |args: &[&str], vars: &[(&str, &str)]| {
            let mut cmd = common::command(&d, args);
            emulator(&mut cmd).env("PULSE_STACK", &stack);
            for (k, v) in vars {
                cmd.env(k, v);
            }
            cmd.output().unwrap()
        };
        // Nothing but PULSE_STACK: every command talks to the stack's resources.
        let out = with_stack(&["agents", "create", "--name", "deployed"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let agent = text(&out.stdout).trim().to_owned();
        // Webhooks need the encryption key: read from the stack's secrets. The URL is
        // the stack's receiver.
        let out = with_stack(&["webhooks", "create", "--agent", &agent, "--json"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = created["webhook"]["id"].as_str().unwrap();
        assert_eq!(
            created["url"],
            format!("https://abcdefgh.lambda-url.us-east-1.on.aws/webhooks/{id}")
        );
        // --stack works as the variable does.
        let mut cmd = common::command(&d, &["agents", "list", "--json", "--stack", &stack]);
        emulator(&mut cmd);
        let listed: serde_json::Value =
            serde_json::from_slice(&cmd.output().unwrap().stdout).unwrap();
        assert_eq!(listed[0]["id"], agent.as_str());
        // Variables set explicitly win over the stack's outputs.
        let e = one_error(&with_stack(
            &["agents", "list"],
            &[("PULSE_TABLE", "explicit-table")],
        ));
        assert!(e.contains("`explicit-table`"), "{e}");
        // A stack that is not there.
        let mut cmd = common::command(&d, &["agents", "list"]);
        emulator(&mut cmd).env("PULSE_STACK", "no-such-stack");
        let e = one_error(&cmd.output().unwrap());
        assert!(
            e.contains("no CloudFormation stack `no-such-stack` in us-east-1"),
            "{e}"
        );
    })
    .await
    .unwrap();
}

#[test]
fn the_test_stack_has_the_deployment_s_output_names() {
    let template = include_str!("../../infra/template.yaml");
    let outputs = &template[template.find("\nOutputs:").expect("an Outputs section")..];
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/pulse-stack.json")).unwrap();
    for (output, _) in pulse_shared::adapters::aws::STACK_VARIABLES
        .iter()
        .chain(&[("SecretsPath", "")])
    {
        assert!(
            outputs.contains(&format!("\n  {output}:")),
            "infra/template.yaml has no output {output}"
        );
        assert!(
            fixture["Outputs"].get(*output).is_some(),
            "the test stack has no output {output}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_reaches_the_agent_through_pulse_serve_on_aws() {
    let dir = dir_on(Backend::Aws);
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &["agents", "create", "--name", "hooked", "--interval", "1h"],
    );
    let created = json(&d, &["webhooks", "create", "--agent", &agent]);
    let secret = created["secret"].as_str().unwrap().to_owned();
    let id = created["webhook"]["id"].as_str().unwrap().to_owned();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = common::command(&d, &["serve", "--listen", &listen, "--tick", "200ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "serve did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = br#"{"event_type":"DEPLOY_FINISHED","payload":{"service":"api"},"priority":2}"#;
    let headers = pulse_signatures::inbound::sign(
        pulse_signatures::inbound::Scheme::Pulse,
        &secret,
        body,
        jiff::Timestamp::now().as_second(),
        "dlv_1",
    )
    .unwrap();
    let mut req = reqwest::Client::new()
        .post(format!("http://{listen}/webhooks/{id}"))
        .body(body.to_vec());
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let answer = req.send().await.unwrap();
    let status = answer.status();
    let said = answer.text().await.unwrap_or_default();
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(status.is_success(), "{status}: {said}");
    let events = json(
        &d,
        &[
            "events",
            "list",
            "--agent",
            &agent,
            "--type",
            "DEPLOY_FINISHED",
        ],
    );
    assert_eq!(events.as_array().unwrap().len(), 1, "{events}");
    assert_eq!(events[0]["payload"]["service"], "api");
    let requests = json(&d, &["webhooks", "requests", "--webhook", &id]);
    assert_eq!(requests.as_array().unwrap().len(), 1, "{requests}");

    // Each heartbeat records the AWS requests it made, and `pulse usage` prices them. (A
    // new agent: serve may have been stopped while the first one's heartbeat ran.)
    let counted = ok(
        &d,
        &["agents", "create", "--name", "counted", "--interval", "1h"],
    );
    ok(&d, &["sweep"]);
    let usage = json(&d, &["usage", "--agent", &counted]);
    let aws = usage["aws"].as_array().unwrap();
    assert_eq!(aws.len(), 1, "{usage}");
    assert_eq!(aws[0]["source"], "heartbeats");
    assert!(aws[0]["records"].as_u64().unwrap() >= 1, "{usage}");
    let requests = &aws[0]["requests"];
    // An idle beat: its claim and its completion's record are updates, its next a put.
    assert!(
        requests["ops"]["DynamoDB.UpdateItem"].as_u64().unwrap() >= 2,
        "{requests}"
    );
    assert!(
        requests["ops"]["DynamoDB.PutItem"].as_u64().unwrap() >= 1,
        "{requests}"
    );
    assert!(requests["wru"].as_f64().unwrap() >= 3.0, "{usage}");
    assert!(aws[0]["cost_usd"].as_f64().unwrap() > 0.0);
    let text = ok(&d, &["usage"]);
    assert!(text.contains("AWS requests"), "{text}");
    assert!(text.contains("counted  heartbeats"), "{text}");
}

/// The Benchmarks chapter's table of what a heartbeat cycle costs on AWS is what
/// `pulse bench sweep --aws-endpoint` measures now, in both phases: each operation a
/// cycle makes, the capacity, and what the heartbeats recorded. A change to the
/// requests of a cycle fails here until the book says so.
#[test]
fn the_book_s_cost_of_a_cycle_on_aws_is_what_the_bench_measures() {
    let dir = tempfile::tempdir().unwrap();
    let moto = pulse_tests::moto_url();
    let out = common::command(
        dir.path(),
        &[
            "bench",
            "sweep",
            "--heartbeats",
            "200",
            "--aws-endpoint",
            &moto,
            "--json",
        ],
    )
    .envs(common::emulator_env())
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let measured: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let book = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/benchmarks.md"),
    )
    .unwrap();
    // A table row's cells after its label.
    let row = |label: &str| -> Vec<String> {
        let line = book
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("the cost table has no {label} row"));
        line.split(" | ").skip(1).map(str::to_owned).collect()
    };
    // "N Operation" for each operation of `part` in `phase`, as the table writes them.
    let ops = |phase: &str, part: &str| -> Vec<String> {
        measured["aws"][phase]["requests"][part]
            .as_object()
            .unwrap()
            .iter()
            .map(|(op, n)| format!("{} {}", n.as_f64().unwrap(), op.split_once('.').unwrap().1))
            .collect()
    };
    let (sweeper, worker) = (row("sweeper"), row("worker"));
    for (phase, cell) in [("idle", 0), ("one_event", 1)] {
        for op in ops(phase, "sweep") {
            assert!(
                sweeper[0].contains(&op),
                "{phase}: the sweeper row lacks {op:?}: {sweeper:?}"
            );
        }
        for op in ops(phase, "worker") {
            assert!(
                worker[cell].contains(&op),
                "{phase}: the worker row lacks {op:?}: {worker:?}"
            );
        }
    }
    let f = |phase: &str, k: &str| measured["aws"][phase][k].as_f64().unwrap();
    let capacity = format!("{:.1} WRU, {:.2} RRU", f("idle", "wru"), f("idle", "rru"));
    let capacity_event = format!(
        "{:.1} WRU, {:.2} RRU",
        f("one_event", "wru"),
        f("one_event", "rru")
    );
    assert_eq!(
        row("DynamoDB capacity")[..2],
        [capacity, format!("{capacity_event} |")],
        "the capacity row"
    );
    let prose = book.split_whitespace().collect::<Vec<_>>().join(" ");
    for (word, phase) in [("idle", "idle"), ("event", "one_event")] {
        let r = &measured["aws"][phase]["recorded"];
        let said = format!(
            "{word} {:.2} requests, {:.2} WRU and {:.2} RRU",
            r["requests"].as_f64().unwrap(),
            r["wru"].as_f64().unwrap(),
            r["rru"].as_f64().unwrap()
        );
        assert!(prose.contains(&said), "the book does not say {said:?}");
    }
}
