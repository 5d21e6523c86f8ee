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

/// `agent`'s approval `id` decided by `d` now, through the rig's store and queue.
async fn decide(
    r: &Rig,
    agent: &pulse_shared::domain::Agent,
    id: &pulse_shared::domain::ApprovalId,
    d: &Decision,
) -> Result<pulse_shared::domain::Approval, DecideError> {
    approvals::decide(
        r.b.store.as_ref(),
        r.b.queue.as_ref(),
        agent,
        id,
        d,
        r.b.now(),
    )
    .await
}

/// Changes the stored `cal` server with `change`.
async fn edit_cal(r: &Rig, change: impl FnOnce(&mut pulse_shared::domain::McpServer)) {
    let mut registry = r.b.store.load_registry().await.unwrap();
    let cal = registry
        .tools
        .iter_mut()
        .find(|t| t.name.as_str() == "cal")
        .unwrap();
    if let pulse_shared::domain::ToolKind::Mcp(s) = &mut cal.kind {
        change(s);
    }
    r.b.store.update_tool(cal).await.unwrap();
}

fn decision(approve: bool, by: &str, reason: Option<&str>) -> Decision {
    Decision {
        approve,
        by: by.to_owned(),
        reason: reason.map(str::to_owned),
        always: false,
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
    let decided = decide(&r, &agent, &a.id, &decision(true, "cli", None))
        .await
        .unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    let again = decide(&r, &agent, &a.id, &decision(false, "dashboard", Some("no")))
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
    decide(
        &r,
        &agent,
        &a.id,
        &decision(false, "dashboard", Some("too early for sums")),
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
    let late = decide(&r, &agent, &a.id, &decision(true, "cli", None))
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
    edit_cal(&r, |s| {
        s.policies.insert("note".into(), ToolPolicy::Deny);
    })
    .await;
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

/// The Discord interaction a press of `custom_id` by `user` makes, signed with `signer`
/// at `at`: the receiver's answer.
async fn press(
    base: &str,
    signer: &pulse_signatures::discord::DiscordSigner,
    at: i64,
    custom_id: &str,
    user: &str,
) -> Value {
    let body = json!({
        "id": "1300000000000000077",
        "application_id": "1",
        "type": 3,
        "token": "interaction-token",
        "channel_id": "555",
        "user": {"id": user, "username": "ada"},
        "message": {"id": "9", "content": "**scout** asks to call `cal/add`."},
        "data": {"custom_id": custom_id, "component_type": 2},
    })
    .to_string();
    let mut req = reqwest::Client::new()
        .post(format!("{base}/discord/interactions"))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in signer.sign(at, body.as_bytes()) {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

on_both_backends!(
    the_owner_is_asked_on_discord_and_decides_with_a_signed_button_through_the_receiver,
    on_discord
);
async fn on_discord(kind: Kind) {
    use pulse_shared::config::InboundConfig;
    use pulse_shared::domain::AgentChanges;
    let r = rig(kind).await;
    r.register_with(Duration::from_secs(5), None).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let lifecycle = r.b.connected().lifecycle(r.b.clock.clone(), &settings());
    let agent = lifecycle
        .update(
            &agent.id,
            &AgentChanges {
                discord_users: Some(vec!["4242".into()]),
                ..AgentChanges::default()
            },
        )
        .await
        .unwrap()
        .agent;
    r.llm.script([
        Scripted::Answer {
            text: Some("For the invoice.".into()),
            tools: vec![("cal__add".into(), json!({"a": 2, "b": 3}))],
        },
        Scripted::text("Asked."),
    ]);
    r.turn(&agent, "add 2 and 3").await;
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    // Asked once, in the owner's direct messages, with its two buttons.
    let cards: Vec<Value> = r
        .discord
        .requests()
        .into_iter()
        .filter(|q| q.body.get("components").is_some())
        .map(|q| q.body)
        .collect();
    assert_eq!(cards.len(), 1, "{cards:?}");
    let buttons = &cards[0]["components"][0]["components"];
    assert_eq!(buttons[0]["custom_id"], a.button(true));
    assert_eq!(buttons[1]["custom_id"], a.button(false));
    let content = cards[0]["content"].as_str().unwrap();
    for want in [
        "**scout** asks to call `cal/add`",
        "For the invoice.",
        "\"a\": 2",
    ] {
        assert!(content.contains(want), "{want}: {content}");
    }
    assert_eq!(a.asked_at, Some(r.b.now()), "marked asked");
    // A heartbeat does not ask again.
    assert_eq!(r.tools.ask_waiting(&agent).await, 0);

    // The button's interaction arrives signed, through the receiver.
    let signer = pulse_signatures::discord::DiscordSigner::from_seed([7; 32]);
    let base = pulse_tests::serve_inbound(std::sync::Arc::new(pulse_shared::http::Inbound::new(
        r.b.store.clone(),
        r.b.queue.clone(),
        r.b.clock.clone(),
        InboundConfig {
            discord_public_key: Some(signer.public_key_hex()),
            ..InboundConfig::default()
        },
    )))
    .await;
    let at = r.b.now().as_second();
    // Someone the agent does not let in: told so, only them; nothing decided.
    let stranger = press(&base, &signer, at, &a.button(true), "999").await;
    assert_eq!(stranger["type"], 4, "{stranger}");
    assert_eq!(stranger["data"]["flags"], 64, "only they see it");
    assert!(
        stranger["data"]["content"]
            .as_str()
            .unwrap()
            .contains("Only scout's owner"),
        "{stranger}"
    );
    assert!(
        r.b.store
            .get_approval(&agent.id, &a.id)
            .await
            .unwrap()
            .unwrap()
            .is_pending()
    );
    // A signature from another key is refused before anything is read.
    let forged = pulse_signatures::discord::DiscordSigner::from_seed([9; 32]);
    let body = json!({"type": 3, "data": {"custom_id": a.button(true)}}).to_string();
    let mut req = reqwest::Client::new()
        .post(format!("{base}/discord/interactions"))
        .body(body.clone());
    for (k, v) in forged.sign(at, body.as_bytes()) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 401);
    // The owner approves: the message says so, its buttons gone.
    let owner = press(&base, &signer, at, &a.button(true), "4242").await;
    assert_eq!(owner["type"], 7, "{owner}");
    assert_eq!(owner["data"]["components"], json!([]));
    let said = owner["data"]["content"].as_str().unwrap();
    assert!(said.contains("Approved by <@4242>"), "{said}");
    assert!(
        said.starts_with("**scout** asks"),
        "the message is kept: {said}"
    );
    let decided =
        r.b.store
            .get_approval(&agent.id, &a.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(decided.decided_by.as_deref(), Some("discord 4242"));
    // Pressed again (Deny, this time): the first decision stands.
    let again = press(&base, &signer, at, &a.button(false), "4242").await;
    assert!(
        again["data"]["content"]
            .as_str()
            .unwrap()
            .contains("approved by discord 4242"),
        "{again}"
    );
    r.llm.script([Scripted::text("Done: 5.")]);
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 1, "sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snoozed_agents_owner_is_asked_on_discord_when_it_wakes_not_before() {
    use pulse_shared::domain::AgentChanges;
    let r = rig(Kind::Sqlite).await;
    r.register_with(Duration::from_secs(5), None).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let lifecycle = r.b.connected().lifecycle(r.b.clock.clone(), &settings());
    lifecycle
        .update(
            &agent.id,
            &AgentChanges {
                discord_channel: Some(Some("1300000000000000001".into())),
                ..AgentChanges::default()
            },
        )
        .await
        .unwrap();
    lifecycle
        .snooze(&agent.id, SignedDuration::from_hours(2))
        .await
        .unwrap();
    let agent = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 1, "b": 1})),
        Scripted::text("Asked."),
    ]);
    r.turn(&agent, "add one and one").await;
    let cards = || {
        r.discord
            .requests()
            .into_iter()
            .filter(|q| q.body.get("components").is_some())
            .count()
    };
    assert_eq!(
        cards(),
        0,
        "snoozed: the record is there, the message waits"
    );
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    assert!(a.is_pending() && a.asked_at.is_none());
    // Awake again: its next heartbeat asks, once.
    r.b.advance(SignedDuration::from_hours(3));
    r.llm.script([Scripted::text("nothing new")]);
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.claimed >= 1, "{swept:?}");
    r.b.drain(&r.worker).await;
    assert_eq!(cards(), 1, "asked when it woke");
    let channel_card = r
        .discord
        .requests()
        .into_iter()
        .find(|q| q.body.get("components").is_some())
        .unwrap();
    assert!(
        channel_card.path.contains("1300000000000000001"),
        "in its channel: {}",
        channel_card.path
    );
    r.b.advance(SignedDuration::from_hours(1));
    r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    r.b.drain(&r.worker).await;
    assert_eq!(cards(), 1, "asked once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_always_grants_that_tool_to_that_agent_only_until_revoked() {
    let (r, agent) = parked(Kind::Sqlite).await;
    let a = r.b.store.approvals(&agent.id, 1).await.unwrap().remove(0);
    let mut always = decision(true, "cli", None);
    always.always = true;
    decide(&r, &agent, &a.id, &always).await.unwrap();
    r.llm.script([Scripted::text("Done.")]);
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 1);
    let granted = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(granted.granted.len(), 1);
    assert_eq!(
        (
            granted.granted[0].server.as_str(),
            granted.granted[0].tool.as_str()
        ),
        ("cal", "add")
    );
    assert_eq!(granted.granted[0].approval_id, a.id);
    // The same tool again: sent at once, nothing parked. Another of its tools: asked.
    r.llm.script([
        Scripted::Answer {
            text: None,
            tools: vec![
                ("cal__add".into(), json!({"a": 4, "b": 4})),
                ("cal__note".into(), json!({"text": "hi"})),
            ],
        },
        Scripted::text("ok"),
    ]);
    r.turn(&granted, "add 4 and 4, and note it").await;
    let names: Vec<String> = r.mcp.calls().iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["add", "add"], "add granted, note asked");
    let pending: Vec<_> =
        r.b.store
            .approvals(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.is_pending())
            .map(|a| a.tool)
            .collect();
    assert_eq!(pending, ["note"]);
    // Another agent given the same server is still asked.
    let other = r.agent("other", "mcp:cal").await;
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 1, "b": 1})),
        Scripted::text("asked"),
    ]);
    r.turn(&other, "add one and one").await;
    assert_eq!(r.mcp.calls().len(), 2, "never wider than that agent");
    // Revoked: asked again.
    let cal = pulse_shared::domain::ToolName::parse("cal").unwrap();
    assert!(
        approvals::revoke(r.b.store.as_ref(), &agent.id, &cal, "add")
            .await
            .unwrap()
    );
    assert!(
        !approvals::revoke(r.b.store.as_ref(), &agent.id, &cal, "add")
            .await
            .unwrap()
    );
    let revoked = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 5, "b": 5})),
        Scripted::text("asked"),
    ]);
    r.turn(&revoked, "add 5 and 5").await;
    assert_eq!(r.mcp.calls().len(), 2, "asked again once revoked");
    // A deny policy wins over a grant.
    let mut again = decision(true, "cli", None);
    again.always = true;
    let parked_add =
        r.b.store
            .approvals(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.is_pending() && a.tool == "add")
            .unwrap();
    decide(&r, &revoked, &parked_add.id, &again).await.unwrap();
    edit_cal(&r, |s| {
        s.policies.insert("add".into(), ToolPolicy::Deny);
    })
    .await;
    r.llm.script([
        Scripted::text("The approved call was set to deny since."),
        Scripted::tool("cal__add", json!({"a": 6, "b": 6})),
        Scripted::text("denied"),
    ]);
    r.b.drain(&r.worker).await;
    let regranted = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert!(regranted.is_granted(&cal, "add"));
    r.turn(&regranted, "add 6 and 6").await;
    assert_eq!(r.mcp.calls().len(), 2, "deny wins over the grant");
    let approved =
        r.b.store
            .get_approval(&agent.id, &parked_add.id)
            .await
            .unwrap()
            .unwrap();
    let outcome = approved.outcome.unwrap();
    assert!(!outcome.sent, "re-checked before it ran: {outcome:?}");
    assert!(outcome.summary.contains("set to deny"), "{outcome:?}");
}

/// What came of `a`, as settled.
async fn outcome(
    r: &Rig,
    a: &pulse_shared::domain::Approval,
) -> pulse_shared::domain::ApprovalOutcome {
    r.b.store
        .get_approval(&a.agent_id, &a.id)
        .await
        .unwrap()
        .unwrap()
        .outcome
        .expect("settled")
}

on_both_backends!(
    a_call_parked_by_a_heartbeat_is_checked_again_before_it_is_sent_and_kept_unsent_when_things_changed,
    rechecked
);
async fn rechecked(kind: Kind) {
    use pulse_shared::domain::{AgentChanges, AgentTool};
    let r = rig(kind).await;
    r.register_with(Duration::from_secs(5), None).await;
    let mut agent = r.agent("scout", "mcp:cal").await;
    agent.think = pulse_shared::domain::ThinkPolicy::Always;
    let before = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.b.store.update_agent(&agent, &before).await.unwrap();
    // Its heartbeat agent makes three calls that need a yes.
    r.llm.script([
        Scripted::Answer {
            text: Some("Three chores.".into()),
            tools: vec![
                ("cal__note".into(), json!({"text": "water the plants"})),
                ("cal__add".into(), json!({"a": 1, "b": 2})),
                ("cal__picture".into(), json!({})),
            ],
        },
        Scripted::text("done"),
    ]);
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    r.b.drain(&r.worker).await;
    assert!(r.mcp.calls().is_empty(), "parked, not sent");
    let parked = r.b.store.approvals(&agent.id, 10).await.unwrap();
    assert_eq!(parked.len(), 3);
    for a in &parked {
        assert!(a.heartbeat_id.is_some() && a.event_id.is_some(), "{a:?}");
        assert!(a.turn_id.is_none());
        assert_eq!(a.reason.as_deref(), Some("Three chores."));
    }
    let by_tool = |t: &str| parked.iter().find(|a| a.tool == t).unwrap().clone();
    let (note, add, picture) = (by_tool("note"), by_tool("add"), by_tool("picture"));
    // Meanwhile: add's schema changes (the server lists it anew), and all three are
    // approved; the agent is then paused before its worker carries them out.
    edit_cal(&r, |s| {
        let add = s.tools.iter_mut().find(|t| t.name == "add").unwrap();
        add.input_schema["properties"]["c"] = json!({"type": "integer"});
    })
    .await;
    for a in [&note, &add, &picture] {
        decide(&r, &agent, &a.id, &decision(true, "cli", None))
            .await
            .unwrap();
    }
    r.llm.script([Scripted::text("None was made.")]);
    // Then the server is taken from the agent before its worker carries them out.
    let lifecycle = r.b.connected().lifecycle(r.b.clock.clone(), &settings());
    let detach = AgentChanges {
        tools: Some(Vec::<AgentTool>::new()),
        ..AgentChanges::default()
    };
    lifecycle.update(&agent.id, &detach).await.unwrap();
    r.b.drain(&r.worker).await;
    assert!(
        r.mcp.calls().is_empty(),
        "nothing sent: {:?}",
        r.mcp.calls()
    );
    for a in [&note, &add, &picture] {
        let o = outcome(&r, a).await;
        assert!(!o.sent, "{o:?}");
        assert!(
            o.summary.contains("no longer has the MCP server cal"),
            "{o:?}"
        );
    }
    // Given back: a schema that changed since is not sent either; one that did not is.
    let regive = AgentChanges {
        tools: Some(AgentTool::parse_list("mcp:cal").unwrap()),
        ..AgentChanges::default()
    };
    let agent = lifecycle.update(&agent.id, &regive).await.unwrap().agent;
    r.llm.script([
        Scripted::Answer {
            text: None,
            tools: vec![
                ("cal__add".into(), json!({"a": 1, "b": 2})),
                ("cal__note".into(), json!({"text": "again"})),
            ],
        },
        Scripted::text("asked"),
    ]);
    r.turn(&agent, "try again").await;
    let fresh = r.b.store.approvals(&agent.id, 10).await.unwrap();
    let pending: Vec<_> = fresh.iter().filter(|a| a.is_pending()).collect();
    assert_eq!(pending.len(), 2);
    let new_add = pending.iter().find(|a| a.tool == "add").unwrap();
    let new_note = pending.iter().find(|a| a.tool == "note").unwrap();
    edit_cal(&r, |s| {
        let add = s.tools.iter_mut().find(|t| t.name == "add").unwrap();
        add.input_schema["properties"]["d"] = json!({"type": "integer"});
    })
    .await;
    for a in [new_add, new_note] {
        decide(&r, &agent, &a.id, &decision(true, "cli", None))
            .await
            .unwrap();
    }
    r.llm.script([Scripted::text("One made, one not.")]);
    r.b.drain(&r.worker).await;
    let names: Vec<String> = r.mcp.calls().iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["note"], "the changed schema's call is not sent");
    let o = outcome(&r, new_add).await;
    assert!(o.summary.contains("changed its arguments' schema"), "{o:?}");
    // Paused: an approved call waits for nothing and is not sent.
    r.llm.script([
        Scripted::tool("cal__note", json!({"text": "third"})),
        Scripted::text("asked"),
    ]);
    r.turn(&agent, "note a third").await;
    let third =
        r.b.store
            .approvals(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.is_pending())
            .unwrap();
    lifecycle.pause(&agent.id).await.unwrap();
    decide(&r, &agent, &third.id, &decision(true, "cli", None))
        .await
        .unwrap();
    r.llm.script([Scripted::text("Paused, so not made.")]);
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 1, "paused: not sent");
    let o = outcome(&r, &third).await;
    assert!(o.summary.contains("the agent was paused"), "{o:?}");
}
