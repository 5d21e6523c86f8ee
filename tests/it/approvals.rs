//! A person's yes before a risky tool call, against a real MCP server (the SDK's server
//! side on loopback) and the scripted model: parked and not sent, approved (sent once,
//! with the key it was parked with, its answer told to the agent), denied (never sent,
//! the agent told why), expired on the injected clock by the sweep, decided twice (the
//! second refused), and carried across a restart.

use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{ApprovalStatus, Decision, ToolPolicy};
use pulse_shared::engine::approvals::{self, DecideError};
use pulse_tests::fake_hooks::FakeReceiver;
use pulse_tests::fake_llm::Scripted;
use pulse_tests::{Kind, on_both_backends, settings};
use serde_json::{Value, json};

use crate::mcp::{Rig, rig};

fn decision(approve: bool, by: &str, reason: Option<&str>) -> Decision {
    Decision {
        approve,
        by: by.to_owned(),
        reason: reason.map(str::to_owned),
    }
}

/// The text of the last user message of request `n`: what the agent was told.
fn told(r: &Rig, n: usize) -> String {
    r.llm.requests()[n].body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .next_back()
        .unwrap_or_default()
        .to_owned()
}

/// A rig with `cal` registered (its tools asked, but `lookup`, which is read-only) and an
/// agent given it, whose model has just made `add` in a chat turn, saying why.
async fn parked(kind: Kind) -> (Rig, pulse_shared::domain::Agent) {
    parked_hooked(kind, None).await
}

/// [`parked`], the agent's hooks of `hooks` (types, and where they go) made first.
async fn parked_hooked(
    kind: Kind,
    hooks: Option<(&[&str], &FakeReceiver)>,
) -> (Rig, pulse_shared::domain::Agent) {
    let r = rig(kind).await;
    r.register_with(Duration::from_secs(5), None).await;
    let agent = r.agent("scout", "mcp:cal").await;
    if let Some((types, receiver)) = hooks {
        r.b.hooks_to(&agent, &receiver.url(), types).await;
    }
    r.llm.script([
        Scripted::Answer {
            text: Some("Adding them for you.".into()),
            tools: vec![("cal__add".into(), json!({"a": 2, "b": 3}))],
        },
        Scripted::text("I have asked for your approval."),
    ]);
    r.turn(&agent, "add 2 and 3").await;
    (r, agent)
}

on_both_backends!(
    a_call_that_needs_a_yes_is_parked_then_approved_once_and_its_answer_reaches_the_agent,
    approved
);
async fn approved(kind: Kind) {
    let receiver = FakeReceiver::start().await;
    let types = ["APPROVAL_REQUESTED", "APPROVAL_DECIDED", "ACTION_COMPLETED"];
    let (r, agent) = parked_hooked(kind, Some((&types, &receiver))).await;
    // Not sent; the model told at once, and the turn finished.
    assert!(r.mcp.calls().is_empty(), "parked, not sent");
    let result: Value = serde_json::from_str(&r.results(1)[0]).unwrap();
    assert_eq!(result["status"], "awaiting_approval");
    assert!(
        result["note"].as_str().unwrap().contains("NOT made"),
        "{result}"
    );
    let turn = r.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    assert_eq!(turn.parts, ["I have asked for your approval."]);
    let listed = r.b.store.approvals(&agent.id, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    let a = &listed[0];
    assert_eq!(a.status, ApprovalStatus::Pending);
    assert_eq!((a.server.as_str(), a.tool.as_str()), ("cal", "add"));
    assert_eq!(a.arguments, json!({"a": 2, "b": 3}));
    assert_eq!(a.reason.as_deref(), Some("Adding them for you."));
    assert_eq!(a.turn_id.as_ref(), Some(&turn.id));
    assert_eq!(a.expires_at, r.b.now() + SignedDuration::from_hours(24));
    assert_eq!(
        r.b.store.list_actions(&agent.id, 10).await.unwrap().len(),
        0
    );

    // Approved: queued to the agent's session; a second decision is refused.
    let decided = approvals::decide(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        &agent,
        &a.id,
        &decision(true, "cli", None),
        r.b.now(),
    )
    .await
    .unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    let again = approvals::decide(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        &agent,
        &a.id,
        &decision(false, "dashboard", Some("no")),
        r.b.now(),
    )
    .await
    .unwrap_err();
    let DecideError::Decided(first) = &again else {
        panic!("{again}")
    };
    assert_eq!(first.decided_by.as_deref(), Some("cli"));
    assert!(again.to_string().contains("approved by cli"), "{again}");
    assert!(
        r.mcp.calls().is_empty(),
        "the decision sends nothing itself"
    );

    // The worker sends it once, with the key it was parked with, and tells the agent.
    r.llm.script([Scripted::text("Done: it is 5.")]);
    r.b.drain(&r.worker).await;
    let calls = r.mcp.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].arguments, json!({"a": 2, "b": 3}));
    assert_eq!(calls[0].idempotency_key.as_deref(), Some(a.key.as_str()));
    let said = told(&r, 2);
    assert!(said.contains("approved (approved by cli"), "{said}");
    assert!(said.contains("The tool answered"), "{said}");
    assert!(said.contains('5'), "{said}");
    let settled =
        r.b.store
            .get_approval(&agent.id, &a.id)
            .await
            .unwrap()
            .unwrap();
    let outcome = settled.outcome.clone().expect("settled");
    assert!(outcome.sent && !outcome.failed, "{outcome:?}");
    let actions = r.b.store.list_actions(&agent.id, 10).await.unwrap();
    assert_eq!(actions.len(), 1);
    assert_eq!(Some(&actions[0].id), outcome.action_id.as_ref());
    assert_eq!(
        actions[0].status,
        pulse_shared::domain::ActionStatus::Completed
    );
    assert!(
        r.b.store.open_approvals(10).await.unwrap().is_empty(),
        "settled: closed"
    );

    // Its signal delivered again (a lost acknowledgement): nothing is sent twice.
    pulse_shared::engine::intake::submit(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        approvals::outcome_signal(&agent, &decided),
    )
    .await
    .unwrap();
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 1, "sent once");

    // A hook for each step.
    r.b.dispatch_all().await;
    let types = receiver.hook_types();
    for t in ["APPROVAL_REQUESTED", "APPROVAL_DECIDED", "ACTION_COMPLETED"] {
        assert_eq!(
            types.iter().filter(|x| *x == t).count(),
            1,
            "{t} once: {types:?}"
        );
    }
}

on_both_backends!(
    a_denied_call_is_never_sent_and_the_agent_is_told_why,
    denied
);
async fn denied(kind: Kind) {
    let (r, agent) = parked(kind).await;
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    approvals::decide(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        &agent,
        &a.id,
        &decision(false, "dashboard", Some("too early for sums")),
        r.b.now(),
    )
    .await
    .unwrap();
    r.llm
        .script([Scripted::text("Understood, I did not add them.")]);
    r.b.drain(&r.worker).await;
    assert!(r.mcp.calls().is_empty(), "denied: never sent");
    let said = told(&r, 2);
    assert!(said.contains("denied by dashboard"), "{said}");
    assert!(said.contains("too early for sums"), "{said}");
    assert!(said.contains("It was not made"), "{said}");
    let settled = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    assert_eq!(settled.status, ApprovalStatus::Denied);
    assert!(!settled.outcome.unwrap().sent);
    assert!(
        r.b.store
            .list_actions(&agent.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

on_both_backends!(
    an_approval_nobody_decides_expires_by_the_sweep_on_the_clock_and_is_never_sent,
    expired
);
async fn expired(kind: Kind) {
    let (r, agent) = parked(kind).await;
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    // Not yet: a sweep before its expiry leaves it.
    r.b.advance(SignedDuration::from_hours(23));
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert_eq!(swept.approvals.expired, 0);
    r.b.advance(SignedDuration::from_hours(2));
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    assert_eq!(swept.approvals.expired, 1);
    let again = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert_eq!(again.approvals.expired, 0, "expired once");
    // A decision after it expired is refused.
    let late = approvals::decide(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        &agent,
        &a.id,
        &decision(true, "cli", None),
        r.b.now(),
    )
    .await
    .unwrap_err();
    assert!(late.to_string().contains("expired by expiry"), "{late}");
    r.llm.script([
        Scripted::text("Nobody approved it, so I did not add them."),
        Scripted::text("heartbeat"),
        Scripted::text("heartbeat"),
    ]);
    r.b.drain(&r.worker).await;
    assert!(r.mcp.calls().is_empty(), "expired: never sent");
    let said = r
        .llm
        .requests()
        .iter()
        .skip(2)
        .map(|q| q.body["messages"].to_string())
        .find(|m| m.contains(a.id.as_str()))
        .expect("the agent is told");
    assert!(said.contains("nobody decided before it expired"), "{said}");
    let settled =
        r.b.store
            .get_approval(&agent.id, &a.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(settled.status, ApprovalStatus::Expired);
    assert_eq!(settled.decided_by.as_deref(), Some("expiry"));
    assert!(r.b.store.open_approvals(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_park_and_approve_loses_nothing_and_policies_hold() {
    let (r, agent) = parked(Kind::Sqlite).await;
    // Another process (the CLI, after a restart) sees the parked call and decides it.
    let (store, queue) = r.b.connect_again();
    let a = store.approvals(&agent.id, 1).await.unwrap().remove(0);
    assert_eq!(a.status, ApprovalStatus::Pending);
    let (found_agent, found) = approvals::find(store.as_ref(), &a.id)
        .await
        .unwrap()
        .expect("found by id alone");
    assert_eq!(
        (found_agent, found.id.clone()),
        (agent.id.clone(), a.id.clone())
    );
    approvals::decide(
        store.as_ref(),
        queue.as_ref(),
        &agent,
        &a.id,
        &decision(true, "cli", None),
        r.b.now(),
    )
    .await
    .unwrap();
    r.llm.script([Scripted::text("Done.")]);
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 1, "sent after the restart");

    // `lookup` is read-only: allowed without asking. A tool set to deny is never sent.
    let mut registry = r.b.store.load_registry().await.unwrap();
    let cal = registry
        .tools
        .iter_mut()
        .find(|t| t.name.as_str() == "cal")
        .unwrap();
    if let pulse_shared::domain::ToolKind::Mcp(s) = &mut cal.kind {
        s.policies.insert("note".into(), ToolPolicy::Deny);
    }
    r.b.store.update_tool(cal).await.unwrap();
    r.llm.script([
        Scripted::Answer {
            text: None,
            tools: vec![
                ("cal__lookup".into(), json!({"ms": 1})),
                ("cal__note".into(), json!({"text": "hi"})),
            ],
        },
        Scripted::text("ok"),
    ]);
    r.turn(&agent, "look it up and note it").await;
    let names: Vec<String> = r.mcp.calls().iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["add", "lookup"], "note is denied");
    let n = r.llm.requests().len();
    let results = r.results(n - 1);
    assert!(results[1].contains("its policy is deny"), "{results:?}");
    assert_eq!(
        r.b.store.approvals(&agent.id, 10).await.unwrap().len(),
        1,
        "neither was parked"
    );
}

on_both_backends!(
    the_api_lists_and_decides_the_tokens_own_agents_approvals_once_and_refuses_another_agents_token,
    over_the_api
);
async fn over_the_api(kind: Kind) {
    use pulse_shared::config::InboundConfig;
    use pulse_shared::domain::ApiToken;
    let (r, agent) = parked(kind).await;
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    let (other, _) = r.b.agent("other", "10m").await;
    let token = |agent: &pulse_shared::domain::Agent| {
        let (t, secret) = ApiToken::issue(
            &agent.id,
            "test",
            Some(SignedDuration::from_hours(24)),
            r.b.now(),
        )
        .unwrap();
        (t, secret)
    };
    let (own, own_secret) = token(&agent);
    let (theirs, their_secret) = token(&other);
    r.b.store.put_token(&own).await.unwrap();
    r.b.store.put_token(&theirs).await.unwrap();
    let base = pulse_tests::serve_inbound(std::sync::Arc::new(pulse_shared::http::Inbound::new(
        r.b.store.clone(),
        r.b.queue.clone(),
        r.b.clock.clone(),
        InboundConfig::default(),
    )))
    .await;
    let http = reqwest::Client::new();
    let get = |secret: &str, query: &str| {
        http.get(format!("{base}/v1/approvals{query}"))
            .bearer_auth(secret.to_owned())
            .send()
    };
    let decide = |secret: Option<&str>, body: Value| {
        let mut req = http
            .post(format!("{base}/v1/approvals/{}", a.id))
            .json(&body);
        if let Some(s) = secret {
            req = req.bearer_auth(s.to_owned());
        }
        req.send()
    };
    // Listed for its own agent's token only.
    let listed: Value = get(&own_secret, "?status=pending")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["approvals"][0]["id"], a.id.as_str(), "{listed}");
    assert_eq!(listed["approvals"][0]["status"], "pending");
    let theirs_listed: Value = get(&their_secret, "").await.unwrap().json().await.unwrap();
    assert_eq!(theirs_listed["approvals"], json!([]), "{theirs_listed}");
    assert_eq!(
        get(&own_secret, "?status=maybe").await.unwrap().status(),
        400
    );
    // Refused: no token, another agent's token, a body that is not a decision.
    assert_eq!(
        decide(None, json!({"decision": "approve"}))
            .await
            .unwrap()
            .status(),
        401
    );
    let refused = decide(Some(&their_secret), json!({"decision": "approve"}))
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        404,
        "another agent's approval is not shown"
    );
    assert_eq!(
        decide(Some(&own_secret), json!({"decision": "maybe"}))
            .await
            .unwrap()
            .status(),
        400
    );
    assert!(
        r.b.store
            .get_approval(&agent.id, &a.id)
            .await
            .unwrap()
            .unwrap()
            .is_pending(),
        "nothing refused decided it"
    );
    // Decided once; the second is a conflict naming the first.
    let ok = decide(
        Some(&own_secret),
        json!({"decision": "deny", "reason": "not now"}),
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.unwrap();
    assert_eq!(body["approval"]["status"], "denied", "{body}");
    assert_eq!(
        body["approval"]["decided_by"],
        format!("api {}", own.id),
        "{body}"
    );
    let again = decide(Some(&own_secret), json!({"decision": "approve"}))
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    let why: Value = again.json().await.unwrap();
    assert!(
        why["error"].as_str().unwrap().contains("denied by api"),
        "{why}"
    );
    r.llm.script([Scripted::text("Not done, as you said.")]);
    r.b.drain(&r.worker).await;
    assert!(r.mcp.calls().is_empty(), "denied over the API: never sent");
}
