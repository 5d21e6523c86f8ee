//! Operating a deployment from the terminal: every update and remove verb, and its
//! refusals (exit 2, nothing written).

#[macro_use]
mod common;

use std::path::Path;

use common::{Backend, bad, command, dir_on, json, ok, pulse};
use serde_json::Value;

fn find<'a>(list: &'a Value, key: &str, id: &str) -> Option<&'a Value> {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v[key].as_str() == Some(id))
}

both!(
    agents_are_updated_paused_resumed_and_deleted,
    agents_are_updated_paused_resumed_and_deleted_on
);
fn agents_are_updated_paused_resumed_and_deleted_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "scout", "--interval", "2s"],
    );
    let other = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "critic",
            "--discord-channel",
            "77",
        ],
    );

    ok(
        d,
        &[
            "agents",
            "update",
            &agent,
            "--interval",
            "1h",
            "--name",
            "scout-2",
        ],
    );
    let shown = json(d, &["agents", "show", &agent]);
    assert_eq!(shown["agent"]["interval"], "1h");
    assert_eq!(shown["agent"]["name"], "scout-2");
    assert_eq!(shown["max_beats_per_hour"], 60, "the breaker's default");
    assert_eq!(shown["tokens_today"], 0);
    // Spending limits: set, shown, and removed again.
    ok(
        d,
        &[
            "agents",
            "update",
            &agent,
            "--daily-tokens",
            "20000",
            "--max-beats-per-hour",
            "4",
        ],
    );
    let text = ok(d, &["agents", "show", &agent]);
    assert!(text.contains("0 of 20000 (daily budget)"), "{text}");
    assert!(text.contains("4 heartbeats an hour"), "{text}");
    assert!(ok(d, &["agents", "list"]).contains("0/20000"));
    assert!(
        bad(
            d,
            &["agents", "update", &agent, "--max-beats-per-hour", "0"]
        )
        .contains("(1 an hour)")
    );
    assert!(bad(d, &["agents", "update", &agent, "--daily-tokens", "lots"]).contains("off"));
    ok(
        d,
        &[
            "agents",
            "update",
            &agent,
            "--daily-tokens",
            "off",
            "--max-beats-per-hour",
            "default",
        ],
    );
    let shown = json(d, &["agents", "show", &agent]);
    assert!(shown["agent"]["budgets"].get("daily_tokens").is_none());
    assert_eq!(shown["max_beats_per_hour"], 60);
    // Dollars: a day's and a month's, shown, refused when not an amount, removed.
    ok(
        d,
        &[
            "agents",
            "update",
            &agent,
            "--budget-usd-day",
            "2.50",
            "--budget-usd-month",
            "$40",
            "--max-calls-per-minute",
            "6",
        ],
    );
    let text = ok(d, &["agents", "show", &agent]);
    assert!(text.contains("at most 6"), "{text}");
    assert!(text.contains("at most $2.50"), "{text}");
    assert!(text.contains("at most $40.00"), "{text}");
    assert_eq!(
        json(d, &["agents", "show", &agent])["agent"]["budgets"]["usd_day"],
        2.5
    );
    assert!(
        bad(d, &["agents", "update", &agent, "--budget-usd-day", "lots"])
            .contains("give dollars, e.g. 2.50")
    );
    assert!(
        bad(d, &["agents", "update", &agent, "--budget-usd-month", "0"]).contains("more than 0")
    );
    ok(
        d,
        &[
            "agents",
            "update",
            &agent,
            "--budget-usd-day",
            "off",
            "--budget-usd-month",
            "off",
            "--max-calls-per-minute",
            "off",
        ],
    );
    let shown = json(d, &["agents", "show", &agent]);
    assert!(shown["agent"]["budgets"].get("usd_day").is_none());
    assert!(
        shown["agent"]["budgets"]
            .get("max_calls_per_minute")
            .is_none()
    );
    // What each run and turn cost: none yet.
    assert_eq!(json(d, &["usage", "--by", "action"]), serde_json::json!([]));
    // Images to the model: by the model unless said.
    assert!(ok(d, &["agents", "show", &agent]).contains("vision            auto"));
    ok(d, &["agents", "update", &agent, "--vision", "off"]);
    assert_eq!(
        json(d, &["agents", "show", &agent])["agent"]["llm"]["vision"],
        false
    );
    ok(d, &["agents", "update", &agent, "--vision", "auto"]);
    assert!(
        json(d, &["agents", "show", &agent])["agent"]["llm"]
            .get("vision")
            .is_none()
    );
    assert!(bad(d, &["agents", "update", &agent, "--vision", "maybe"]).contains("on, off or auto"));
    // Refusals: validated as on create, nothing written.
    assert!(bad(d, &["agents", "update", &agent]).contains("nothing to change"));
    assert!(bad(d, &["agents", "update", &agent, "--interval", "soon"]).contains("interval"));
    assert!(bad(d, &["agents", "update", &agent, "--name", " "]).contains("name"));
    assert!(bad(d, &["agents", "update", &agent, "--discord-channel", "77"]).contains("77"));
    assert_eq!(
        json(d, &["agents", "show", &agent])["agent"],
        shown["agent"]
    );

    let paused = String::from_utf8(common::pulse(d, &["agents", "pause", &agent]).stderr).unwrap();
    assert!(paused.contains("still answered"), "{paused}");
    let status = |d: &Path| {
        json(d, &["heartbeats", "list", "--agent", &agent])[0]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(status(d), "PAUSED");
    assert!(ok(d, &["agents", "list"]).contains("paused"));
    ok(d, &["agents", "resume", &agent]);
    assert_eq!(status(d), "PENDING");
    let types: Vec<String> = json(d, &["events", "list", "--agent", &agent])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["AGENT_PAUSED", "AGENT_RESUMED"]);

    // Without --yes: what would go, exit 2, nothing deleted.
    let out = common::pulse(d, &["agents", "delete", &agent]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains("would remove") && said.contains("1 heartbeat"),
        "{said}"
    );
    assert!(find(&json(d, &["agents", "list"]), "id", &agent).is_some());
    ok(d, &["agents", "delete", &agent, "--yes"]);
    let left = json(d, &["agents", "list"]);
    assert!(find(&left, "id", &agent).is_none());
    assert!(find(&left, "id", &other).is_some());
    assert!(bad(d, &["agents", "delete", &agent, "--yes"]).contains("not found"));
    assert!(bad(d, &["agents", "pause", &agent]).contains("not found"));
}

both!(
    tools_and_subscriptions_are_changed_and_removed,
    tools_and_subscriptions_are_changed_and_removed_on
);
fn tools_and_subscriptions_are_changed_and_removed_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    ok(
        d,
        &[
            "tools",
            "add",
            "--name",
            "echo",
            "--url",
            "http://127.0.0.1:9/x",
        ],
    );
    let sub = ok(
        d,
        &[
            "subscriptions",
            "add",
            "--tool",
            "echo",
            "--event",
            "NOTE",
            "--agent",
            &agent,
        ],
    );

    ok(
        d,
        &[
            "tools",
            "update",
            "echo",
            "--timeout",
            "3s",
            "--description",
            "echoes",
        ],
    );
    let tools = json(d, &["tools", "list"]);
    let echo = find(&tools, "name", "echo").unwrap();
    assert_eq!(echo["kind"]["timeout_ms"], 3000);
    assert_eq!(echo["description"], "echoes");
    assert!(bad(d, &["tools", "update", "echo"]).contains("nothing to change"));
    assert!(bad(d, &["tools", "update", "echo", "--url", "ftp://x"]).contains("http"));
    assert!(
        bad(
            d,
            &["tools", "update", "heartbeat-agent", "--timeout", "1s"]
        )
        .contains("built in")
    );
    assert!(bad(d, &["tools", "update", "nope", "--timeout", "1s"]).contains("not found"));
    assert_eq!(json(d, &["tools", "list"]), tools, "refusals wrote nothing");

    // A tool still subscribed to is not removed.
    assert!(bad(d, &["tools", "remove", "echo"]).contains(&sub));
    ok(d, &["subscriptions", "remove", &sub]);
    assert!(find(&json(d, &["subscriptions", "list"]), "id", &sub).is_none());
    assert!(bad(d, &["subscriptions", "remove", &sub]).contains("not found"));
    let builtin = json(d, &["subscriptions", "list"])[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(bad(d, &["subscriptions", "remove", &builtin]).contains("disable it instead"));
    ok(d, &["tools", "remove", "echo"]);
    assert!(find(&json(d, &["tools", "list"]), "name", "echo").is_none());
    assert!(bad(d, &["tools", "remove", "heartbeat-agent"]).contains("built in"));
}

both!(
    webhooks_and_hooks_are_changed_and_deleted,
    webhooks_and_hooks_are_changed_and_deleted_on
);
fn webhooks_and_hooks_are_changed_and_deleted_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    let webhook = ok(d, &["webhooks", "create", "--agent", &agent])
        .lines()
        .next()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    ok(
        d,
        &[
            "webhooks",
            "update",
            &webhook,
            "--allow",
            "PUSH,ISSUE",
            "--rate-limit",
            "10/h",
            "--wake",
            "yes",
        ],
    );
    let listed = json(d, &["webhooks", "list"]);
    let w = find(&listed, "id", &webhook).unwrap();
    assert_eq!(w["allowed_types"], serde_json::json!(["PUSH", "ISSUE"]));
    assert_eq!(
        (w["rate_limit"].as_str(), w["wake"].as_bool()),
        (Some("10/h"), Some(true))
    );
    assert!(bad(d, &["webhooks", "update", &webhook, "--wake", "maybe"]).contains("yes or no"));
    assert!(bad(d, &["webhooks", "update", &webhook, "--allow", "a b"]).contains("event type"));
    assert!(bad(d, &["webhooks", "update", &webhook]).contains("nothing to change"));
    assert_eq!(
        json(d, &["webhooks", "list"]),
        listed,
        "refusals wrote nothing"
    );
    ok(d, &["webhooks", "update", &webhook, "--allow", "any"]);
    assert_eq!(
        json(d, &["webhooks", "list"])[0]["allowed_types"],
        serde_json::json!([])
    );
    ok(d, &["webhooks", "delete", &webhook]);
    assert_eq!(json(d, &["webhooks", "list"]), serde_json::json!([]));
    assert!(bad(d, &["webhooks", "delete", &webhook]).contains("not found"));

    let hook = ok(
        d,
        &[
            "hooks",
            "add",
            "--agent",
            &agent,
            "--type",
            "AFTER_HEARTBEAT",
            "--url",
            "https://example.com/h",
        ],
    )
    .lines()
    .next()
    .unwrap()
    .to_owned();
    ok(
        d,
        &[
            "hooks",
            "update",
            &hook,
            "--timeout",
            "5s",
            "--retry-schedule",
            "1s,2s",
            "--auth-header",
            "Bearer t",
        ],
    );
    let listed = json(d, &["hooks", "list"]);
    let h = find(&listed, "id", &hook).unwrap();
    assert_eq!(
        (h["timeout"].as_str(), h["retry"].as_str()),
        (Some("5s"), Some("1s,2s"))
    );
    assert_eq!(h["has_auth_header"], true);
    if backend == Backend::Sqlite {
        // (On AWS there is a bus: the update would be taken.)
        assert!(
            bad(d, &["hooks", "update", &hook, "--url", "eventbridge://bus"])
                .contains("AWS backend")
        );
    }
    assert!(bad(d, &["hooks", "update", &hook, "--timeout", "2h"]).contains("timeout"));
    assert!(bad(d, &["hooks", "update", &hook]).contains("nothing to change"));
    assert_eq!(
        json(d, &["hooks", "list"]),
        listed,
        "refusals wrote nothing"
    );
    ok(d, &["hooks", "update", &hook, "--auth-header", ""]);
    assert_eq!(json(d, &["hooks", "list"])[0]["has_auth_header"], false);
    ok(d, &["hooks", "delete", &hook]);
    assert_eq!(json(d, &["hooks", "list"]), serde_json::json!([]));
    assert!(bad(d, &["hooks", "delete", &hook]).contains("not found"));
}

both_async!(
    heartbeats_and_actions_are_filtered_and_one_action_is_shown,
    heartbeats_and_actions_are_filtered_and_one_action_is_shown_on
);
async fn heartbeats_and_actions_are_filtered_and_one_action_is_shown_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path().to_owned();
    let tool = pulse_tests::FakeTool::start().await;
    let url = tool.url();
    let (agent, listed) = tokio::task::spawn_blocking(move || {
        let d = d.as_path();
        let agent = ok(
            d,
            &["agents", "create", "--name", "scout", "--interval", "1h"],
        );
        ok(d, &["tools", "add", "--name", "echo", "--url", &url]);
        ok(
            d,
            &[
                "subscriptions",
                "add",
                "--tool",
                "echo",
                "--event",
                "HEARTBEAT",
            ],
        );
        ok(d, &["sweep"]);
        let beats = |args: &[&str]| -> Vec<u64> {
            let mut all = vec!["heartbeats", "list", "--agent", agent.as_str()];
            all.extend_from_slice(args);
            json(d, &all)
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["beat"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(beats(&[]), [2, 1]);
        assert_eq!(beats(&["--status", "pending"]), [2]);
        assert_eq!(beats(&["--status", "COMPLETED,FAILED"]), [1]);
        assert_eq!(beats(&["--before", "2"]), [1]);
        assert_eq!(beats(&["--limit", "1"]), [2]);
        assert_eq!(beats(&["--since", "1h"]), [2, 1]);
        assert!(beats(&["--since", "2099-01-01T00:00:00Z"]).is_empty());
        // The first beat ran the tool: it acted, and says what did.
        assert_eq!(beats(&["--outcome", "acted"]), [1]);
        assert!(beats(&["--outcome", "nothing_to_do,failed"]).is_empty());
        assert_eq!(
            json(
                d,
                &["heartbeats", "list", "--agent", &agent, "--before", "2"]
            )[0]["outcome"],
            serde_json::json!({"kind": "acted", "reason": "echo"})
        );
        assert!(
            bad(
                d,
                &["heartbeats", "list", "--agent", &agent, "--outcome", "done"]
            )
            .contains("nothing_to_do")
        );
        assert!(
            bad(
                d,
                &["heartbeats", "list", "--agent", &agent, "--status", "DONE"]
            )
            .contains("PAUSED")
        );

        let actions = |args: &[&str]| -> Value {
            let mut all = vec!["actions", "list", "--agent", agent.as_str()];
            all.extend_from_slice(args);
            json(d, &all)
        };
        let all = actions(&[]);
        let tools: Vec<&str> = all
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["tool"].as_str().unwrap())
            .collect();
        assert!(
            tools.contains(&"echo") && tools.contains(&"heartbeat-agent"),
            "{tools:?}"
        );
        assert_eq!(actions(&["--tool", "echo"]).as_array().unwrap().len(), 1);
        assert!(
            actions(&["--status", "FAILED"])
                .as_array()
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            actions(&["--since", "1h", "--tool", "echo"])
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let echo = actions(&["--tool", "echo"]);
        (agent, echo)
    })
    .await
    .unwrap();
    let d = dir.path();
    let id = listed[0]["id"].as_str().unwrap();
    let shown = ok(d, &["actions", "show", id, "--agent", &agent]);
    for part in [
        "tool        echo",
        "status      COMPLETED",
        "attempts    1",
        "request:",
        "response:",
    ] {
        assert!(shown.contains(part), "{part:?} in:\n{shown}");
    }
    assert_eq!(
        json(d, &["actions", "show", id, "--agent", &agent])["id"],
        id
    );
    assert_eq!(tool.requests().len(), 1);
    let other = "act_0123456789abcdef0123456789abcdef";
    assert!(bad(d, &["actions", "show", other, "--agent", &agent]).contains("not found"));
}

both!(
    schedules_are_added_listed_and_deleted,
    schedules_are_added_listed_and_deleted_on
);
fn schedules_are_added_listed_and_deleted_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "reminded", "--interval", "1h"],
    );
    let once = ok(
        d,
        &[
            "schedules",
            "add",
            "--agent",
            &agent,
            "--in",
            "2h",
            "--note",
            "stretch",
        ],
    );
    assert!(once.starts_with("sch_"), "{once}");
    let cron = json(
        d,
        &[
            "schedules",
            "add",
            "--agent",
            "reminded",
            "--cron",
            "0 9 * * MON-FRI",
            "--timezone",
            "Europe/Paris",
        ],
    );
    assert_eq!(cron["rule"]["pattern"], "0 9 * * MON-FRI");
    let listed = json(d, &["schedules", "list", "--agent", &agent]);
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["note"], "stretch");
    let text = ok(d, &["schedules", "list", "--agent", &agent]);
    assert!(
        text.contains("cron 0 9 * * MON-FRI (Europe/Paris)"),
        "{text}"
    );
    // The agent's next wake is the earlier of the two (which one depends on the time of
    // day the test runs: the cron's 09:00 in Paris may come within the next two hours).
    let at = |v: &Value| v.as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
    let earliest = at(&listed[0]["next_at"]).min(at(&listed[1]["next_at"]));
    assert_eq!(
        at(&json(d, &["agents", "show", &agent])["agent"]["next_wake"]),
        earliest
    );
    // Refusals, nothing written.
    assert!(
        bad(
            d,
            &["schedules", "add", "--agent", &agent, "--cron", "0 9 * *"]
        )
        .contains("5")
    );
    assert!(
        bad(
            d,
            &["schedules", "add", "--agent", &agent, "--cron", "* * * * *"]
        )
        .contains("breaker")
    );
    assert!(
        bad(
            d,
            &[
                "schedules",
                "add",
                "--agent",
                &agent,
                "--at",
                "2020-01-01T00:00:00Z"
            ]
        )
        .contains("never wake")
    );
    assert!(bad(d, &["schedules", "add", "--agent", &agent]).contains("--at"));
    assert_eq!(
        json(d, &["schedules", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    ok(d, &["schedules", "delete", "--agent", &agent, &once]);
    assert!(bad(d, &["schedules", "delete", "--agent", &agent, &once]).contains("no schedule"));
    assert_eq!(
        json(d, &["schedules", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

both!(
    retention_is_set_per_agent_and_prune_counts_before_it_removes,
    retention_is_set_per_agent_and_prune_counts_before_it_removes_on
);
fn retention_is_set_per_agent_and_prune_counts_before_it_removes_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "keeper", "--retention", "90d"],
    );
    assert_eq!(
        json(d, &["agents", "show", &agent])["agent"]["retention"],
        "90d"
    );
    let shown = ok(d, &["agents", "show", &agent]);
    assert!(shown.contains("retention         90d"), "{shown}");
    ok(d, &["agents", "update", &agent, "--retention", ""]);
    assert!(json(d, &["agents", "show", &agent])["agent"]["retention"].is_null());
    let shown = ok(d, &["agents", "show", &agent]);
    assert!(shown.contains("30d (PULSE_RETENTION)"), "{shown}");
    let err = bad(d, &["agents", "update", &agent, "--retention", "2h"]);
    assert!(err.contains("between 1d and 3650d"), "{err}");

    let dry = json(d, &["prune", "--dry-run"]);
    assert_eq!(dry["agents"], 1);
    assert_eq!(dry["pruned"]["heartbeats"], 0, "{dry}");
    assert!(
        dry.get("reclaimed").is_none(),
        "a dry run gives nothing back: {dry}"
    );
    let done = json(d, &["prune"]);
    assert_eq!(done["pruned"], dry["pruned"]);
    let text = ok(d, &["prune"]);
    assert!(text.contains("finished heartbeats"), "{text}");
    match backend {
        Backend::Sqlite => {
            assert_eq!(
                done["reclaimed"]["shrinks"], true,
                "a new file has auto-vacuum"
            );
            assert!(text.contains("database "), "{text}");
            ok(d, &["prune", "--vacuum"]);
        }
        Backend::Aws => {
            let err = bad(d, &["prune", "--vacuum"]);
            assert!(err.contains("DynamoDB"), "{err}");
        }
    }
    let err = bad(d, &["prune", "--dry-run", "--vacuum"]);
    assert!(err.contains("cannot be used with"), "{err}");
}

both!(
    status_says_what_needs_attention_and_exits_1_for_an_overdue_heartbeat,
    status_says_what_needs_attention_and_exits_1_for_an_overdue_heartbeat_on
);
fn status_says_what_needs_attention_and_exits_1_for_an_overdue_heartbeat_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "watched"]);
    // Due now; overdue only two sweep intervals (2 minutes by default) on.
    let text = ok(d, &["status"]);
    assert!(
        text.contains("agents     1 active, 0 paused, 0 failing"),
        "{text}"
    );
    assert!(text.contains("nothing needs attention"), "{text}");

    // No sweeper runs here: held to a 100 ms sweep, the heartbeat is overdue once
    // 200 ms have passed, which the status says as soon as it is so.
    let mut out = pulse(d, &["status", "--sweep-interval", "100ms"]);
    common::wait_until(
        "the heartbeat is overdue",
        std::time::Duration::from_secs(10),
        || {
            out = pulse(d, &["status", "--sweep-interval", "100ms"]);
            out.status.code() == Some(1)
        },
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("! 1 heartbeat overdue: due more than 200ms ago and not claimed"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "pulse heartbeats list --agent {agent} shows the oldest"
        )),
        "{text}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "1 thing needs attention"
    );
    let out = pulse(d, &["status", "--sweep-interval", "100ms", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["overdue"], 1, "{s}");
    assert_eq!(s["agents"]["active"], 1);
    assert_eq!(s["findings"].as_array().unwrap().len(), 1, "{s}");

    // A sweep claims and runs it: nothing is overdue, but it started over 300 ms after
    // it was due, late for a 100 ms sweep and not for the default minute.
    ok(d, &["sweep"]);
    let out = pulse(d, &["status", "--sweep-interval", "100ms"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("! 1 agent's latest heartbeat started more than 200ms after it was due"),
        "{text}"
    );
    assert!(!text.contains("overdue: due more than"), "{text}");
    let text = ok(d, &["status"]);
    assert!(text.contains("0 late"), "{text}");
    let err = bad(d, &["status", "--sweep-interval", "0s"]);
    assert!(err.contains("positive duration"), "{err}");
}

both_async!(
    a_newcomers_first_hour_names_agents_reads_files_and_stdin_and_recovers_hooks,
    first_hour_on
);
async fn first_hour_on(backend: Backend) {
    use pulse_tests::fake_hooks::{Answer, FakeReceiver};
    use std::io::Write;
    let dir = dir_on(backend);
    let d = dir.path();

    // An agent is named by its id, its name (any case) or its alias.
    let id = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "Scout",
            "--alias",
            "@sc",
            "--interval",
            "1h",
        ],
    );
    for name in ["scout", "Scout", "@sc", "sc", id.as_str()] {
        assert_eq!(
            json(d, &["agents", "show", name])["agent"]["id"],
            id,
            "{name}"
        );
    }
    // Names are unique (ignoring case), named with the agent that holds it.
    let twin = bad(d, &["agents", "create", "--name", "SCOUT"]);
    assert!(
        twin.contains(&format!("an agent named \"SCOUT\" already exists ({id}")),
        "{twin}"
    );
    // A name another agent has as its alias is ambiguous: both are listed, with the fix.
    let twin = ok(
        d,
        &["agents", "create", "--name", "Ranger", "--alias", "scout"],
    );
    let both = bad(d, &["agents", "show", "scout"]);
    assert!(
        both.contains("names 2 agents")
            && both.contains(&id)
            && both.contains(&twin)
            && both.contains("pulse agents update ID --name NEW"),
        "{both}"
    );
    // Renaming to another agent's alias is refused too, naming it.
    let renamed = bad(d, &["agents", "update", &twin, "--name", "SC"]);
    assert!(
        renamed.contains("an agent named \"SC\"") && renamed.contains(&id),
        "{renamed}"
    );
    assert!(bad(d, &["agents", "show", "nobody"]).contains("no agent has the id, name or alias"));
    ok(d, &["agents", "delete", &twin, "--yes"]);

    // Heartbeat instructions from a file, read again on update.
    for text in ["check the inbox", "check the calendar"] {
        std::fs::write(d.join("HEARTBEAT.md"), format!("{text}\n")).unwrap();
        let update = [
            "agents",
            "update",
            "sc",
            "--instructions-file",
            "HEARTBEAT.md",
        ];
        ok(d, &update);
        assert_eq!(
            json(d, &["agents", "show", "sc"])["agent"]["instructions"],
            text
        );
    }
    assert!(
        bad(
            d,
            &["agents", "update", "sc", "--instructions-file", "nope.md"]
        )
        .contains("nope.md")
    );
    // A task heading whose cadence is wrong is refused with what to write, and the
    // instructions stay as they were.
    std::fs::write(
        d.join("HEARTBEAT.md"),
        "Be brief.\n\n## Inbox (every often)\nLook at the inbox.\n",
    )
    .unwrap();
    let wrong = bad(
        d,
        &[
            "agents",
            "update",
            "sc",
            "--instructions-file",
            "HEARTBEAT.md",
        ],
    );
    assert!(
        wrong.contains("## Inbox (every often)") && wrong.contains("e.g. (every 4h)"),
        "{wrong}"
    );
    assert_eq!(
        json(d, &["agents", "show", "sc"])["agent"]["instructions"],
        "check the calendar"
    );

    // A reminder `--in 0s` says what to give, not that a time has passed.
    let zero = bad(d, &["schedules", "add", "--agent", "sc", "--in", "0s"]);
    assert!(
        zero.contains("more than 0s") && !zero.contains("has passed"),
        "{zero}"
    );

    // One hook for two types, one secret; its receiver fails everything for now.
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(500); 20]);
    let added = json(
        d,
        &[
            "hooks",
            "add",
            "--agent",
            "scout",
            "--type",
            "AFTER_HEARTBEAT,HEARTBEAT_FAILED",
            "--url",
            &receiver.url(),
            "--retry-schedule",
            "none",
        ],
    );
    let hooks = added["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2, "{added}");
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let after = hooks
        .iter()
        .find(|h| h["hook_type"] == "AFTER_HEARTBEAT")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A failing test delivery does not make the hook a finding of `pulse status`.
    assert_eq!(pulse(d, &["hooks", "test", &after]).status.code(), Some(1));
    let status = pulse(d, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        !status.to_string().contains("has failed since"),
        "a test is not the hook's failure: {status}"
    );

    // A heartbeat runs (its heartbeat agent thinks about the instructions): its action
    // is shown by id alone, and its AFTER_HEARTBEAT delivery fails for good.
    ok(d, &["sweep"]);
    let actions = json(d, &["actions", "list", "--agent", "sc"]);
    let action = actions[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        json(d, &["actions", "show", &action])["id"],
        action.as_str()
    );
    let deliveries = json(d, &["hooks", "deliveries", "--hook", &after]);
    assert!(
        deliveries
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["id"] == r["delivery"]["id"]),
        "each row has its id on top: {deliveries}"
    );
    assert!(
        deliveries
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["delivery"]["status"] == "EXHAUSTED"),
        "{deliveries}"
    );
    let hooks_dead = || {
        let out = pulse(d, &["status", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["hooks_queue"]["dead"].clone()
    };
    assert_eq!(hooks_dead(), 1);
    // Redriven while the receiver still fails: sent, failed, kept, exit 1.
    let out = pulse(d, &["hooks", "redrive"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("FAILED  500")
            && err.contains("0 sent and succeeded, 0 removed with nothing to send, 1 left in it"),
        "{out:?}"
    );
    assert_eq!(hooks_dead(), 1);
    // The receiver is fixed: everything that failed in the last hour goes again.
    receiver.script(vec![Answer::status(200); 20]);
    let recovered = json(
        d,
        &["hooks", "recover", "--since", "1h", "--agent", "scout"],
    );
    let replayed = recovered["replayed"].as_array().unwrap();
    assert_eq!(
        replayed.len(),
        1,
        "the real delivery, not the test: {recovered}"
    );
    assert_eq!(replayed[0]["attempt"]["status"], "SUCCESS");
    // Its dead letter has nothing left to send: the redrive removes it.
    let redriven = json(d, &["hooks", "redrive"]);
    assert_eq!(redriven["left"], 0, "{redriven}");
    assert!(
        redriven["dropped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("succeeded already"),
        "{redriven}"
    );
    assert_eq!(hooks_dead(), 0);

    // `say -` reads the message from standard input.
    let mut say = common::command(d, &["say", "--agent", "scout", "-", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    say.stdin
        .take()
        .unwrap()
        .write_all(b"a message from a pipe\n")
        .unwrap();
    let out = say.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("a message from a pipe"), "{said}");

    // A model whose key this process does not have: a warning at once, not at the first
    // reply.
    let out = common::command(
        d,
        &[
            "agents",
            "create",
            "--name",
            "keyless",
            "--llm-provider",
            "anthropic",
        ],
    )
    .env_remove("ANTHROPIC_API_KEY")
    .output()
    .unwrap();
    assert!(out.status.success());
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(
        warned.contains("warning: agent keyless cannot reach its model")
            && warned.contains("ANTHROPIC_API_KEY"),
        "{warned}"
    );
}

both!(
    memories_are_added_recalled_consolidated_restored_and_forgotten,
    memories_on
);
fn memories_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    ok(
        d,
        &["agents", "create", "--name", "ada", "--interval", "1h"],
    );
    let veg = ok(
        d,
        &[
            "memories",
            "add",
            "ada",
            "The user is vegetarian and never eats meat",
            "--kind",
            "preference",
            "--importance",
            "0.9",
        ],
    );
    assert!(veg.starts_with("mem_"), "{veg}");
    // The agent by --agent, as every command takes it, or first, as before.
    let walk = ok(
        d,
        &[
            "memories",
            "add",
            "--agent",
            "ada",
            "The user walks the dog at dawn",
        ],
    );
    let again = ok(
        d,
        &["memories", "add", "ada", "the user walks the DOG at dawn!"],
    );
    for i in 0..6 {
        ok(d, &["memories", "add", "ada", &format!("fact number {i}")]);
    }
    let bad_importance = bad(d, &["memories", "add", "ada", "x", "--importance", "2"]);
    assert!(bad_importance.contains("importance"), "{bad_importance}");
    let bad_kind = bad(d, &["memories", "add", "ada", "x", "--kind", "rumour"]);
    assert!(bad_kind.contains("fact"), "{bad_kind}");
    let twice = bad(d, &["memories", "add", "--agent", "ada", "ada", "x"]);
    assert!(twice.contains("given twice"), "{twice}");
    let none = bad(d, &["memories", "add", "x"]);
    assert!(none.contains("which agent? give --agent"), "{none}");

    // A look does not reinforce; --reinforce does, as the agent's own recall.
    let found = json(
        d,
        &[
            "memories",
            "recall",
            "--agent",
            "ada",
            "eats vegetarian meat",
        ],
    );
    assert_eq!(found[0]["memory"]["id"], veg, "{found}");
    assert_eq!(found[0]["state"], "active");
    assert_eq!(
        found[0]["title"], "The user is vegetarian and never eats meat",
        "{found}"
    );
    assert_eq!(found[0]["last_recalled_ago"], "never", "{found}");
    let table = ok(
        d,
        &[
            "memories",
            "recall",
            "--agent",
            "ada",
            "eats vegetarian meat",
        ],
    );
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("ID") && header.contains("RECALLED") && header.ends_with("TITLE"),
        "{table}"
    );
    // One memory whole, by id alone (its agent is found), reinforcing nothing.
    let one = ok(d, &["memories", "recall", "--id", &veg]);
    assert!(
        one.contains(&format!("id: {veg}"))
            && one.contains("kind: preference")
            && one.contains("last recalled: never"),
        "{one}"
    );
    assert!(
        one.ends_with("The user is vegetarian and never eats meat"),
        "{one}"
    );
    let both = bad(
        d,
        &["memories", "recall", "--agent", "ada", "meat", "--id", &veg],
    );
    assert!(both.contains("--id"), "{both}");
    let listed = json(d, &["memories", "list", "--agent", "ada"]);
    assert_eq!(find(&listed, "id", &veg).unwrap()["recalls"], 0);
    json(
        d,
        &["memories", "recall", "ada", "vegetarian", "--reinforce"],
    );
    let listed = json(
        d,
        &["memories", "list", "--agent", "ada", "--kind", "preference"],
    );
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["recalls"], 1, "{listed}");

    // Nine active memories: the gate allows 2 folds; one duplicate is folded.
    let done = json(d, &["memories", "consolidate", "--agent", "ada"]);
    assert_eq!(
        (done["active"].as_u64(), done["merged"].as_u64()),
        (Some(9), Some(1)),
        "{done}"
    );
    let folded = json(
        d,
        &["memories", "list", "--agent", "ada", "--status", "folded"],
    );
    assert_eq!(folded.as_array().unwrap().len(), 1, "{folded}");
    assert_eq!(folded[0]["id"], again);
    assert_eq!(folded[0]["folded_into"], walk);
    let back = ok(d, &["memories", "restore", &walk]);
    assert!(back.contains("1 memory back"), "{back}");
    let folded = json(
        d,
        &["memories", "list", "--agent", "ada", "--status", "folded"],
    );
    assert!(folded.as_array().unwrap().is_empty(), "{folded}");

    // Forgotten by id alone; a second time there is nothing to forget.
    ok(d, &["memories", "forget", &veg]);
    let listed = json(d, &["memories", "list", "--agent", "ada"]);
    assert!(find(&listed, "id", &veg).is_none());
    let gone = bad(d, &["memories", "forget", &veg]);
    assert!(gone.contains("no agent has a memory"), "{gone}");
    let reindexed = ok(d, &["memories", "reindex"]);
    assert!(
        reindexed.contains("ada: 0 memories embedded"),
        "{reindexed}"
    );

    // What could reorder or hide text on a terminal is shown escaped.
    ok(
        d,
        &[
            "memories",
            "add",
            "ada",
            "the invoice is invoice\u{202e}fdp.exe",
        ],
    );
    let table = ok(d, &["memories", "list", "--agent", "ada"]);
    assert!(table.contains("invoice\\u{202e}fdp.exe"), "{table}");
    assert!(!table.contains('\u{202e}'), "{table}");
    // As JSON, JSON's own escape: the text reads back as it was.
    let listed = json(d, &["memories", "list", "--agent", "ada"]);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["text"] == "the invoice is invoice\u{202e}fdp.exe"),
        "{listed}"
    );
}

both!(
    tokens_are_made_listed_and_revoked_and_agents_snoozed_and_woken,
    tokens_and_steering_on
);
fn tokens_and_steering_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "scout", "--interval", "1h"],
    );
    // Bad input: exit 2, nothing written.
    assert!(
        bad(
            d,
            &["tokens", "create", "--agent", "scout", "--expires", "0s"]
        )
        .contains("a minute to a year")
    );
    assert!(
        bad(
            d,
            &["tokens", "create", "--agent", "scout", "--expires", "2y"]
        )
        .contains("--expires")
    );
    assert!(bad(d, &["tokens", "revoke", "nope"]).contains("token id"));
    assert_eq!(json(d, &["tokens", "list"]), serde_json::json!([]));
    let token = ok(
        d,
        &[
            "tokens",
            "create",
            "--agent",
            "scout",
            "--expires",
            "30d",
            "--label",
            "ci",
        ],
    );
    let (id, secret) = token.split_once('.').expect("pt_<id>.<secret>");
    assert!(id.starts_with("pt_") && secret.len() >= 40, "{token}");
    let listed = json(d, &["tokens", "list", "--agent", &agent]);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["state"], "active");
    assert_eq!(listed[0]["label"], "ci");
    let table = String::from_utf8(pulse(d, &["tokens", "list"]).stdout).unwrap();
    assert!(table.contains(id) && !table.contains(secret), "{table}");
    ok(d, &["tokens", "revoke", &token]);
    assert_eq!(json(d, &["tokens", "list"])[0]["state"], "revoked");
    let unknown = format!("pt_{}", "0".repeat(26));
    assert!(bad(d, &["tokens", "revoke", &unknown]).contains("no token"));

    // Snooze: bad lengths refused; a good one shown.
    for length in ["0s", "400d", "soon"] {
        bad(d, &["agents", "snooze", "scout", length]);
    }
    ok(d, &["agents", "snooze", "scout", "2h"]);
    let shown = json(d, &["agents", "show", &agent]);
    assert!(shown["agent"]["snoozed_until"].is_string(), "{shown}");
    let listed = String::from_utf8(pulse(d, &["agents", "list"]).stdout).unwrap();
    assert!(listed.contains("snoozed"), "{listed}");
    // Woken: the snooze ends and a heartbeat is due; a second wake makes none.
    let first = String::from_utf8(pulse(d, &["heartbeats", "trigger", "scout"]).stderr).unwrap();
    assert!(first.contains("due now"), "{first}");
    let second = String::from_utf8(pulse(d, &["heartbeats", "trigger", "scout"]).stderr).unwrap();
    assert!(second.contains("due already"), "{second}");
    assert!(json(d, &["agents", "show", &agent])["agent"]["snoozed_until"].is_null());
    // Cancelling or retrying what is not there is bad input.
    assert!(bad(d, &["heartbeats", "cancel", "nope"]).contains("heartbeat"));
    assert!(bad(d, &["actions", "retry", "nope"]).contains("action"));
}

both_async!(
    an_mcp_server_is_added_listed_given_to_an_agent_refreshed_and_removed,
    an_mcp_server_is_added_listed_given_to_an_agent_refreshed_and_removed_on
);
async fn an_mcp_server_is_added_listed_given_to_an_agent_refreshed_and_removed_on(
    backend: Backend,
) {
    let server = pulse_tests::fake_mcp::FakeMcp::start().await;
    let dir = dir_on(backend);
    let d = dir.path();
    let agent = ok(d, &["agents", "create", "--name", "scout"]);
    // Bad input: refused, nothing stored.
    let metadata = bad(
        d,
        &[
            "tools",
            "add-mcp",
            "meta",
            "--url",
            "http://169.254.169.254/mcp",
        ],
    );
    assert!(metadata.contains("not reachable from Pulse"), "{metadata}");
    let header = bad(
        d,
        &[
            "tools",
            "add-mcp",
            "cal",
            "--url",
            &server.url(),
            "--header",
            "nocolon",
        ],
    );
    assert!(header.contains("Name: value"), "{header}");
    let allow = bad(
        d,
        &[
            "tools",
            "add-mcp",
            "cal",
            "--url",
            &server.url(),
            "--allow",
            "add,ghost",
        ],
    );
    assert!(
        allow.contains("ghost") && allow.contains("it lists add"),
        "{allow}"
    );
    let unknown = bad(d, &["agents", "update", &agent, "--tools", "mcp:cal"]);
    assert!(unknown.contains("pulse tools add-mcp cal"), "{unknown}");
    let bare = bad(d, &["agents", "update", &agent, "--tools", "cal"]);
    assert!(bare.contains("mcp:NAME"), "{bare}");
    // A local program: only with PULSE_MCP_STDIO=on, on the embedded database.
    let local = [
        "tools",
        "add-mcp",
        "loc",
        "--command",
        "no-such-mcp-server --stdio",
    ];
    let off = bad(d, &local);
    assert!(off.contains("PULSE_MCP_STDIO=on"), "{off}");
    let on = common::command(d, &local)
        .env("PULSE_MCP_STDIO", "on")
        .output()
        .unwrap();
    assert_eq!(on.status.code(), Some(2));
    let why = String::from_utf8_lossy(&on.stderr);
    match backend {
        Backend::Sqlite => assert!(why.contains("could not be started"), "{why}"),
        Backend::Aws => assert!(
            why.contains("Lambda functions never start programs"),
            "{why}"
        ),
    }
    assert!(!json(d, &["tools", "list"]).to_string().contains("\"cal\""));

    // Added: its tools listed at once, the header never shown again.
    let added = said(
        d,
        &[
            "tools",
            "add-mcp",
            "cal",
            "--url",
            &server.url(),
            "--header",
            "Authorization: Bearer s3cr3t",
            "--allow",
            "add,note",
        ],
    );
    assert!(added.contains("2 tools (add ask, note ask)"), "{added}");
    assert!(added.contains("--tools mcp:cal"), "{added}");
    let listed = ok(d, &["tools", "list"]);
    assert!(listed.contains("cal") && listed.contains("mcp"), "{listed}");
    let listed = json(d, &["tools", "list"]).to_string();
    assert!(!listed.contains("s3cr3t"), "{listed}");
    assert!(listed.contains("***"), "{listed}");

    // Given to the agent, and taken away.
    ok(d, &["agents", "update", &agent, "--tools", "mcp:cal"]);
    let shown = json(d, &["agents", "show", &agent]);
    assert_eq!(
        shown["agent"]["tools"],
        serde_json::json!(["mcp:cal"]),
        "{shown}"
    );
    let busy = bad(d, &["tools", "remove", "cal"]);
    assert!(busy.contains("scout"), "{busy}");

    // Refreshed: the server's new tool is listed (the allow-list still applies).
    server.add_tool("weather", "Today's weather.").await;
    let refreshed = said(d, &["tools", "refresh", "cal"]);
    assert!(
        refreshed.contains("2 tools (add ask, note ask)"),
        "{refreshed}"
    );
    let stored = json(d, &["tools", "list"]);
    let cal = find(&stored, "name", "cal").unwrap();
    assert_eq!(cal["kind"]["tools"].as_array().unwrap().len(), 7, "{cal}");
    let http = bad(d, &["tools", "update", "cal", "--timeout", "5s"]);
    assert!(http.contains("is an MCP server"), "{http}");

    ok(d, &["agents", "update", &agent, "--tools", ""]);
    ok(d, &["tools", "remove", "cal"]);
    let maybe = bad(
        d,
        &[
            "actions",
            "resolve",
            &format!("act_{}", "0".repeat(32)),
            "--as",
            "maybe",
        ],
    );
    assert!(maybe.contains("say succeeded"), "{maybe}");
    let since = bad(d, &["tools", "stats", "--since", "lately"]);
    assert!(since.contains("invalid --since"), "{since}");
    assert!(json(d, &["tools", "stats", "--since", "1d"]).is_array());
    assert!(!json(d, &["tools", "list"]).to_string().contains("\"cal\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_call_is_listed_shown_approved_once_from_the_cli_and_then_sent() {
    use pulse_tests::fake_llm::{FakeLlm, Scripted};
    let server = pulse_tests::fake_mcp::FakeMcp::start().await;
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The model is the fake, reached as the deployment's Anthropic.
    let with_model = |args: &[&str]| {
        let out = common::command(d, args)
            .env("PULSE_LLM_PROVIDER", "anthropic")
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .env("PULSE_LLM_BASE_URL", llm.url())
            .output()
            .unwrap();
        assert!(out.status.success(), "pulse {args:?}: {out:?}");
    };
    let agent = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "scout",
            "--approval-expiry",
            "2h",
        ],
    );
    let short = bad(d, &["agents", "update", &agent, "--approval-expiry", "5s"]);
    assert!(short.contains("1m..30d"), "{short}");
    // Its tools' policies: by their marks, then set.
    let added = said(d, &["tools", "add-mcp", "cal", "--url", &server.url()]);
    assert!(
        added.contains("add ask") && added.contains("lookup allow"),
        "read-only tools are allowed, the others asked: {added}"
    );
    let set = said(d, &["tools", "policy", "cal", "note", "deny"]);
    assert!(set.contains("policy of cal/note: deny"), "{set}");
    assert!(set.contains("note deny"), "{set}");
    let ghost = bad(d, &["tools", "policy", "cal", "ghost", "allow"]);
    assert!(ghost.contains("lists no tool \"ghost\""), "{ghost}");
    let maybe = bad(d, &["tools", "policy", "cal", "maybe"]);
    assert!(maybe.contains("allow, ask, deny or default"), "{maybe}");
    ok(d, &["agents", "update", &agent, "--tools", "mcp:cal"]);

    // The model makes `add`: parked, not sent.
    llm.script([
        Scripted::Answer {
            text: Some("Adding them.".into()),
            tools: vec![("cal__add".into(), serde_json::json!({"a": 2, "b": 3}))],
        },
        Scripted::text("I asked you first."),
    ]);
    with_model(&["say", "--agent", "scout", "add 2 and 3"]);
    with_model(&["sweep"]);
    assert!(server.calls().is_empty(), "parked, not sent");
    let listed = json(d, &["approvals", "list"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["status"], "pending");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let table = ok(d, &["approvals", "list", "--agent", "scout"]);
    assert!(table.contains(&id) && table.contains("cal/add"), "{table}");
    let shown = ok(d, &["approvals", "show", &id]);
    for want in ["cal/add", "Adding them.", "pending", "\"a\": 2"] {
        assert!(shown.contains(want), "{want}: {shown}");
    }

    // Approved once; the second decision is refused, naming the first.
    let approved = said(d, &["approvals", "approve", &id, "--always"]);
    assert!(approved.contains("approved"), "{approved}");
    assert!(approved.contains("granted to scout"), "{approved}");
    let grants = ok(d, &["approvals", "grants"]);
    assert!(
        grants.contains("scout") && grants.contains("cal/add") && grants.contains(&id),
        "{grants}"
    );
    let again = bad(
        d,
        &["approvals", "deny", &id, "--reason", "changed my mind"],
    );
    assert!(again.contains("approved by cli"), "{again}");
    llm.script([Scripted::text("It is 5.")]);
    with_model(&["sweep"]);
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "sent once: {calls:?}");
    assert_eq!(calls[0].arguments, serde_json::json!({"a": 2, "b": 3}));
    let shown = ok(d, &["approvals", "show", &id]);
    assert!(shown.contains("outcome    sent (action"), "{shown}");
    let revoked = said(d, &["approvals", "revoke", "--agent", "scout", "cal/add"]);
    assert!(revoked.contains("asked about again"), "{revoked}");
    let none = bad(d, &["approvals", "revoke", "--agent", "scout", "cal/add"]);
    assert!(none.contains("holds no grant"), "{none}");
    let shape = bad(d, &["approvals", "revoke", "--agent", "scout", "add"]);
    assert!(shape.contains("SERVER/TOOL"), "{shape}");
    assert_eq!(json(d, &["approvals", "grants"]), serde_json::json!([]));
    let unknown = bad(d, &["approvals", "show", "ap_01JABCDEFGHJKMNPQRSTVWXYZ0"]);
    assert!(unknown.contains("no approval"), "{unknown}");
    let malformed = bad(d, &["approvals", "approve", "nope"]);
    assert!(malformed.contains("approval id"), "{malformed}");
}

/// What a successful `pulse args` said, on both of its streams.
fn said(d: &Path, args: &[&str]) -> String {
    let out = pulse(d, args);
    assert!(out.status.success(), "pulse {args:?}: {out:?}");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_dead_lettered_turn_is_found_by_status_and_redriven_onto_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "kept", "--interval", "1h"],
    );
    // A message whose turn failed five times: queued by `say`, then moved to the dead
    // letters as the queue moves it after its fifth receive.
    ok(
        d,
        &["say", "--agent", &agent, "--user", "ana", "still there?"],
    );
    let db = rusqlite::Connection::open(d.join("pulse.db")).unwrap();
    db.execute_batch(
        "INSERT INTO queue_dead (seq, message_id, group_id, body, sent_ms, receive_count, dead_ms) \
         SELECT seq, message_id, group_id, body, sent_ms, 5, sent_ms FROM queue_messages; \
         DELETE FROM queue_messages;",
    )
    .unwrap();
    let status = || {
        let out = pulse(d, &["status", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let (code, v) = status();
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["sessions_queue"]["dead"], 1, "{v}");
    let finding = &v["findings"][0];
    assert!(
        finding["look"]
            .as_str()
            .unwrap()
            .contains("pulse sessions redrive"),
        "{v}"
    );

    assert!(bad(d, &["sessions", "redrive", "--limit", "0"]).contains("--limit"));
    let said = ok(d, &["sessions", "redrive"]);
    assert_eq!(said, "1 dead letter moved back onto the sessions queue");
    let (code, v) = status();
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["sessions_queue"]["dead"], 0, "{v}");
    assert_eq!(v["sessions_queue"]["waiting"], 1, "{v}");
    let body: String = db
        .query_row("SELECT body FROM queue_messages", [], |r| r.get(0))
        .unwrap();
    assert!(body.contains("still there?"), "{body}");
    assert_eq!(
        json(d, &["sessions", "redrive"])["redriven"],
        0,
        "nothing left"
    );
}

#[test]
fn an_agent_is_given_a_model_for_its_heartbeats_and_back_to_its_chat_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &[
            "agents",
            "create",
            "--name",
            "frugal",
            "--llm-model",
            "claude-sonnet-4-5",
            "--heartbeat-model",
            "claude-haiku-4-5",
        ],
    );
    let shown = json(d, &["agents", "show", &agent]);
    assert_eq!(shown["agent"]["llm"]["heartbeat_model"], "claude-haiku-4-5");
    assert_eq!(shown["agent"]["llm"]["model"], "claude-sonnet-4-5");
    ok(d, &["agents", "update", &agent, "--heartbeat-model", ""]);
    let shown = json(d, &["agents", "show", &agent]);
    assert!(
        shown["agent"]["llm"]["heartbeat_model"].is_null(),
        "{shown}"
    );
    assert_eq!(shown["agent"]["llm"]["model"], "claude-sonnet-4-5");
}

#[test]
fn an_agent_is_told_what_each_heartbeat_must_do_and_when_to_raise_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "herald", "--expect", "speak"],
    );
    let expect = |d: &Path| json(d, &["agents", "show", &agent])["agent"]["expect"].clone();
    assert_eq!(
        expect(d),
        serde_json::json!({"must": "speak", "alert_after": 3}),
        "three in a row unless told"
    );
    assert!(ok(d, &["agents", "show", &agent]).contains("HEARTBEAT_INCOMPLETE after 3"));
    ok(d, &["agents", "update", &agent, "--alert-after", "5"]);
    assert_eq!(expect(d)["alert_after"], 5);
    ok(d, &["agents", "update", &agent, "--expect", "act"]);
    assert_eq!(
        expect(d),
        serde_json::json!({"must": "act", "alert_after": 5}),
        "a new expectation keeps the count"
    );
    assert!(bad(d, &["agents", "update", &agent, "--alert-after", "0"]).contains("1 to 100"));
    assert!(bad(d, &["agents", "update", &agent, "--expect", "shout"]).contains("speak or act"));
    ok(d, &["agents", "update", &agent, "--expect", "none"]);
    assert!(expect(d).is_null());
    assert!(
        bad(d, &["agents", "update", &agent, "--alert-after", "2"]).contains("--expect"),
        "a count with nothing expected says what to give"
    );
}

#[test]
fn a_schedule_says_what_the_heartbeat_it_wakes_must_do_and_when_to_raise_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = ok(
        d,
        &["agents", "create", "--name", "reporter", "--interval", "1h"],
    );
    let made = json(
        d,
        &schedule_add(
            &agent,
            &[
                "--cron",
                "0 9 * * *",
                "--expect",
                "speak",
                "--alert-after",
                "2",
            ],
        ),
    );
    assert_eq!(
        made["expect"],
        serde_json::json!({"must": "speak", "alert_after": 2})
    );
    ok(d, &schedule_add(&agent, &["--in", "2h", "--expect", "act"]));
    ok(d, &schedule_add(&agent, &["--in", "3h", "--note", "plain"]));
    let text = ok(d, &["schedules", "list", "--agent", &agent]);
    for part in ["EXPECT", "speak after 2", " act ", " - "] {
        assert!(text.contains(part), "{part:?} in:\n{text}");
    }
    let listed = json(d, &["schedules", "list", "--agent", &agent]);
    assert_eq!(
        listed[1]["expect"]["alert_after"], 3,
        "three in a row unless told"
    );
    assert!(listed[2].get("expect").is_none(), "{listed}");
    // Refusals, nothing written.
    let alone = bad(
        d,
        &schedule_add(&agent, &["--in", "1h", "--alert-after", "2"]),
    );
    assert!(alone.contains("--expect"), "{alone}");
    let zero = bad(
        d,
        &schedule_add(
            &agent,
            &["--in", "1h", "--expect", "speak", "--alert-after", "0"],
        ),
    );
    assert!(zero.contains("1 to 100 runs in a row"), "{zero}");
    let shout = bad(
        d,
        &schedule_add(&agent, &["--in", "1h", "--expect", "shout"]),
    );
    assert!(shout.contains("speak or act"), "{shout}");
    assert_eq!(
        json(d, &["schedules", "list", "--agent", &agent])
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

/// `pulse schedules add --agent <agent>` and `extra`.
fn schedule_add<'a>(agent: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["schedules", "add", "--agent", agent];
    args.extend_from_slice(extra);
    args
}

#[test]
fn replies_discord_did_not_take_are_listed_retrying_first_and_by_agent() {
    use pulse_shared::domain::{AgentId, TurnId, Undelivered};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ana = ok(
        d,
        &["agents", "create", "--name", "ana", "--interval", "1h"],
    );
    let ben = ok(
        d,
        &["agents", "create", "--name", "ben", "--interval", "1h"],
    );
    assert_eq!(json(d, &["deliveries", "list"]), serde_json::json!([]));
    // One reply still tried again (a 503), one given up on (a 400).
    let now = jiff::Timestamp::now();
    let turn = |n: u8| TurnId::parse(&format!("tn_01J0000000000000000000000{n}")).unwrap();
    let kept = |agent: &str, n: u8, why: &str, hopeless: bool| {
        let agent = AgentId::parse(agent).unwrap();
        let session = pulse_shared::domain::SessionId::for_agent(&agent);
        Undelivered::first((agent, session, turn(n)), why.into(), hopeless, now)
    };
    let db = rusqlite::Connection::open(d.join("pulse.db")).unwrap();
    for u in [
        kept(&ana, 1, "Discord did not take part 1: 503", false),
        kept(
            &ben,
            2,
            "Discord did not take part 1: 400 Bad Request",
            true,
        ),
    ] {
        db.execute(
            "INSERT INTO undelivered (agent_id, turn_id, state, next_ms, doc) VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![
                u.agent_id.as_str(),
                u.turn_id.as_str(),
                u.state.as_str(),
                u.next_at.as_millisecond(),
                serde_json::to_string(&u).unwrap()
            ],
        )
        .unwrap();
    }
    let listed = json(d, &["deliveries", "list"]);
    let states: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["retrying", "undeliverable"], "{listed}");
    let dead = json(d, &["deliveries", "list", "--undeliverable"]);
    assert_eq!(dead.as_array().unwrap().len(), 1, "{dead}");
    assert_eq!(dead[0]["agent_id"], ben.as_str());
    let of_ana = json(d, &["deliveries", "list", "--agent", "ana"]);
    assert_eq!(of_ana.as_array().unwrap().len(), 1);
    assert_eq!(of_ana[0]["turn_id"], turn(1).as_str());
    let table = said(d, &["deliveries", "list"]);
    assert!(
        table.contains("STATE") && table.contains("undeliverable") && table.contains("400"),
        "{table}"
    );
    assert!(bad(d, &["deliveries", "list", "--agent", "nobody"]).contains("nobody"));
}

both!(
    agents_kept_as_files_are_applied_with_a_plan_exported_and_checked_for_drift,
    agent_files_on
);
/// The example directory applied as CI would: a dry run that plans and exits 2, a
/// refusal without --yes, the apply, a second one that changes nothing; an oversized
/// SOUL.md refused with its size; an edit made with the CLI seen by --check (exit 1);
/// an export that --check finds the same as the store.
fn agent_files_on(backend: Backend) {
    let dir = dir_on(backend);
    let d = dir.path();
    let files = d.join("agents/scout");
    std::fs::create_dir_all(&files).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/scout");
    for f in [
        "agent.toml",
        "SOUL.md",
        "HEARTBEAT.md",
        "schedules.toml",
        "hooks.toml",
        "webhooks.toml",
        "tools.toml",
        "memories.md",
    ] {
        std::fs::copy(example.join(f), files.join(f)).unwrap();
    }
    let dry = pulse(d, &["apply", "--dry-run", "agents/scout"]);
    let plan = String::from_utf8_lossy(&dry.stdout);
    assert_eq!(dry.status.code(), Some(2), "{plan}");
    assert!(plan.contains("scout (agents/scout): create"), "{plan}");
    assert!(plan.contains("  + interval = 30m"), "{plan}");
    assert!(plan.contains("  + timezone = Europe/Paris"), "{plan}");
    assert!(
        plan.contains("  + schedule morning: cron 0 8 * * MON-FRI (Europe/Paris), note \"Plan the day: what is due, what is late.\", expect speak after 3"),
        "{plan}"
    );
    assert!(plan.contains("  + SOUL.md = 149 characters"), "{plan}");
    assert!(
        plan.contains("sizes: SOUL.md 149 of 16000 characters, about 42 tokens"),
        "{plan}"
    );
    assert!(
        plan.contains(
            "counted by an estimate at 4 characters a token (the offline provider has no tokenizer)"
        ),
        "{plan}"
    );
    // With an OpenAI model, the texts are counted by its tokenizer, against tokens.
    let counted = command(d, &["apply", "--dry-run", "agents/scout"])
        .env("PULSE_LLM_PROVIDER", "openai")
        .env("OPENAI_API_KEY", "sk-never-sent")
        .env("PULSE_LLM_MODEL", "gpt-4o-mini")
        .output()
        .unwrap();
    let counted = String::from_utf8_lossy(&counted.stdout);
    let tokens = counted
        .split("SOUL.md 149 of 16000 characters, ")
        .nth(1)
        .and_then(|rest| rest.split(" of 4000 tokens").next())
        .and_then(|n| n.parse::<usize>().ok());
    assert!(tokens.is_some_and(|n| n > 20 && n < 60), "{counted}");
    assert!(
        counted.contains("counted by gpt-4o-mini's tokenizer (o200k_base)"),
        "{counted}"
    );
    assert!(String::from_utf8_lossy(&dry.stderr).contains("nothing applied (--dry-run)"));
    assert!(
        plan.contains("  every heartbeat's prompt starts with about "),
        "{plan}"
    );
    assert_eq!(json(d, &["agents", "list"]).as_array().unwrap().len(), 0);

    assert!(
        plan.contains("  + tool mail-triage: https://tools.example.com/triage"),
        "{plan}"
    );
    assert!(
        plan.contains("  + subscription mail-triage EMAIL_RECEIVED: order 0"),
        "{plan}"
    );
    let asked = bad(d, &["apply", "agents/scout"]);
    assert!(asked.contains("run again with --yes"), "{asked}");
    assert!(
        plan.contains("  + hook on-call HEARTBEAT_INCOMPLETE: https://hooks.example.com/pulse"),
        "{plan}"
    );
    let applied = ok(d, &["apply", "--yes", "--source", "abc123", "agents/scout"]);
    assert!(applied.contains("applied: 1 agent created"), "{applied}");
    let memories = json(d, &["memories", "list", "--agent", "scout"]);
    assert_eq!(memories.as_array().unwrap().len(), 2, "{memories}");
    // The hook's secret, shown once; never in a plan or an export.
    assert!(
        applied.contains("hook on-call of scout signs with whsec_"),
        "{applied}"
    );
    assert_eq!(
        applied.matches("whsec_").count(),
        2,
        "the hook's and the webhook's, once each: {applied}"
    );
    assert!(
        applied.contains("webhook inbox of scout: http://127.0.0.1:8080/webhooks/wh_"),
        "{applied}"
    );
    assert!(
        applied.contains("(shown this once: give both to the sender)"),
        "{applied}"
    );
    let agent = json(d, &["agents", "show", "scout"]);
    assert_eq!(agent["agent"]["interval"], "30m", "{agent}");
    let schedules = json(d, &["schedules", "list", "--agent", "scout"]);
    assert_eq!(schedules[0]["name"], "morning", "{schedules}");
    let again = pulse(d, &["apply", "--yes", "agents/scout"]);
    assert!(again.status.success());
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(said.contains("scout (agents/scout): no changes"), "{said}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to change"));
    let dry = json(d, &["apply", "--dry-run", "agents/scout"]);
    assert_eq!(dry["changes"], 0, "{dry}");
    assert_eq!(dry["plan"]["agents"][0]["verb"], "same", "{dry}");
    assert_eq!(dry["applied"], Value::Null, "{dry}");
    let events = json(
        d,
        &["events", "list", "--agent", "scout", "--type", "APPLIED"],
    );
    assert_eq!(events.as_array().unwrap().len(), 1, "{events}");
    assert_eq!(events[0]["payload"]["source"], "abc123");

    // Too long a persona is refused whole, with its size: never cut.
    std::fs::write(files.join("SOUL.md"), "x".repeat(16_500)).unwrap();
    let long = bad(d, &["apply", "--yes", "agents/scout"]);
    assert!(
        long.contains("agents/scout/SOUL.md: 16500 characters (about 4129 tokens); the budget is 16000 characters"),
        "{long}"
    );
    std::fs::copy(example.join("SOUL.md"), files.join("SOUL.md")).unwrap();

    // An edit made elsewhere is drift.
    ok(d, &["agents", "update", "scout", "--interval", "2h"]);
    let check = pulse(d, &["apply", "--check", "agents/scout"]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(out.contains("  ~ interval: 2h -> 30m"), "{out}");
    assert!(
        String::from_utf8_lossy(&check.stderr)
            .contains("the store differs from the files (1 difference)")
    );

    // The store written out as files is what the store holds.
    let written = pulse(d, &["export", "scout", "exported"]);
    let said = String::from_utf8_lossy(&written.stderr);
    assert!(written.status.success(), "{said}");
    assert!(
        said.contains(
            "to exported: agent.toml, SOUL.md, HEARTBEAT.md, schedules.toml, webhooks.toml, tools.toml, memories.md, hooks.toml"
        ),
        "{said}"
    );
    for f in std::fs::read_dir(d.join("exported")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains("whsec_"), "{text}");
    }
    let toml = std::fs::read_to_string(d.join("exported/agent.toml")).unwrap();
    assert!(toml.contains("interval = \"2h\""), "{toml}");
    let same = pulse(d, &["apply", "--check", "exported"]);
    assert!(same.status.success());
    assert!(String::from_utf8_lossy(&same.stderr).contains("the store matches the files"));
    let twice = bad(d, &["export", "scout", "exported"]);
    assert!(
        twice.contains("already there; nothing written (--force"),
        "{twice}"
    );
    ok(d, &["export", "scout", "exported", "--force"]);

    // Secrets named by variables are never printed: not when applied, checked, planned
    // as JSON or exported (the CLI writes no log outside `serve`, `dashboard` and
    // `gateway`).
    let keeper = d.join("agents/keeper");
    std::fs::create_dir_all(&keeper).unwrap();
    for (file, text) in [
        ("agent.toml", "name = \"keeper\"\n"),
        (
            "tools.toml",
            "[[tool]]\nname = \"vault\"\nurl = \"https://tools.example.com/vault\"\nconfig_env = { api_key = \"KEEPER_VAULT_KEY\" }\n",
        ),
        (
            "hooks.toml",
            "[[hook]]\nname = \"audit\"\ntypes = [\"AFTER_HEARTBEAT\"]\nurl = \"https://hooks.example.com/audit\"\nauth_header_env = \"KEEPER_AUDIT_AUTH\"\n",
        ),
    ] {
        std::fs::write(keeper.join(file), text).unwrap();
    }
    for args in [
        &["apply", "--yes", "agents/keeper"][..],
        &["apply", "--check", "agents/keeper"],
        &["apply", "--dry-run", "--json", "agents/keeper"],
        &["export", "keeper", "kept"],
    ] {
        let out = command(d, args)
            .env("KEEPER_VAULT_KEY", "vault-s3cret-1")
            .env("KEEPER_AUDIT_AUTH", "Bearer audit-s3cret-2")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {all}");
        assert!(!all.contains("s3cret"), "{args:?}: {all}");
    }
    let kept = std::fs::read_to_string(d.join("kept/tools.toml")).unwrap();
    assert!(kept.contains("api_key = \"KEEPER_VAULT_KEY\""), "{kept}");
}

/// The requests a tool received: its URL and body.
type Calls = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A tool kept as files with a secret in its config and one in its URL's query runs on
/// its agent's event under `pulse serve`, logging at debug: the tool gets both, and the
/// log never holds either — not even when the tool answers an error echoing its request.
#[test]
fn a_tools_secrets_from_files_reach_the_tool_and_never_the_serve_log() {
    use std::process::Stdio;
    use std::sync::Arc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let got: Calls = Arc::default();
    let app = axum::Router::new()
        .route(
            "/vault",
            axum::routing::post(
                |axum::extract::State(got): axum::extract::State<Calls>,
                 uri: axum::http::Uri,
                 body: String| async move {
                    got.lock().unwrap().push((uri.to_string(), body.clone()));
                    // The unkind tool: an error that repeats what it was sent.
                    (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "cannot triage {uri} with key {}: {body}",
                            serde_json::from_str::<Value>(&body).unwrap()["tool_config"]["api_key"]
                        ),
                    )
                },
            ),
        )
        .with_state(got.clone());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/vault", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });

    let dir = dir_on(Backend::Sqlite);
    let d = dir.path();
    let keeper = d.join("agents/keeper");
    std::fs::create_dir_all(&keeper).unwrap();
    std::fs::write(
        keeper.join("agent.toml"),
        "name = \"keeper\"\ninterval = \"1h\"\n",
    )
    .unwrap();
    std::fs::write(
        keeper.join("tools.toml"),
        format!(
            "[[tool]]\nname = \"vault\"\nurl = \"{url}?token=query-s3cret-3\"\nconfig_env = {{ api_key = \"KEEPER_VAULT_KEY\" }}\n\n[[subscription]]\ntool = \"vault\"\nevent = \"PING\"\n"
        ),
    )
    .unwrap();
    let applied = command(d, &["apply", "--yes", "agents/keeper"])
        .env("KEEPER_VAULT_KEY", "vault-s3cret-1")
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );
    assert!(applied.status.success(), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
    ok(
        d,
        &["events", "emit", "--agent", "keeper", "--type", "PING"],
    );

    let serve = command(d, &["serve", "--listen", "off", "--tick", "100ms"])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until(
        "the tool is called",
        std::time::Duration::from_secs(60),
        || !got.lock().unwrap().is_empty(),
    );
    common::wait_until(
        "the heartbeat ends",
        std::time::Duration::from_secs(60),
        || {
            json(d, &["heartbeats", "list", "--agent", "keeper"])
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["status"] != "RUNNING" && h["status"] != "PENDING")
        },
    );
    let out = common::terminate(serve);
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (uri, body) = got.lock().unwrap()[0].clone();
    assert!(
        uri.contains("token=query-s3cret-3"),
        "the tool gets its URL: {uri}"
    );
    assert!(body.contains("vault-s3cret-1"), "and its config: {body}");
    assert!(
        log.contains("cannot triage /vault?token=*** with key \"***\""),
        "the log tells of the tool's answer, its secrets hidden: {log}"
    );
    for secret in ["vault-s3cret-1", "query-s3cret-3"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}
