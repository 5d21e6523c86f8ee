//! Side effects are never done twice blindly: every HTTP tool call carries an
//! `Idempotency-Key` (its action's id, the same on every attempt); a call whose answer
//! was lost after it was sent ends UNKNOWN and is not made again, unless the tool is
//! idempotent; a run that stopped during a call leaves it UNKNOWN rather than calling
//! again; an operator settles it by retrying or resolving, and `pulse status` says so.

use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{Action, ActionStatus, Agent, Filter, ToolName};
use pulse_tests::fake_hooks::{Answer, FakeReceiver};
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::json;

/// The tool's answer: success, after `delay`.
fn ok_after(delay: Duration) -> Answer {
    Answer {
        body: json!({"success": true, "output": {"sent": true}}).to_string(),
        ..Answer::status(200).after(delay)
    }
}

async fn mailer_action(b: &Backend, agent: &Agent) -> Action {
    b.store
        .list_actions(&agent.id, 20)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.tool.as_str() == "mailer")
        .expect("the mailer's action")
}

/// A heartbeat for the agent's newest event, now.
async fn beat(b: &Backend) {
    b.advance(SignedDuration::from_mins(16));
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    b.drain(&b.worker(settings())).await;
}

on_both_backends!(
    a_call_that_timed_out_after_it_was_sent_is_unknown_and_never_repeated_blindly,
    timed_out
);
async fn timed_out(kind: Kind) {
    let b = Backend::new(kind).await;
    let mail = FakeReceiver::start().await;
    mail.script(vec![ok_after(Duration::from_millis(1_500))]);
    b.tool_with(
        "mailer",
        &mail.url(),
        Duration::from_millis(300),
        "SEND",
        0,
        Filter::default(),
    )
    .await;
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "SEND", json!({"to": "ana"})).await;
    beat(&b).await;
    let action = mailer_action(&b, &agent).await;
    assert_eq!(action.status, ActionStatus::Unknown, "{action:?}");
    let why = action.error.clone().unwrap();
    assert!(why.contains("may have done its work"), "{why}");
    assert!(why.contains("pulse actions resolve"), "{why}");
    mail.wait_for(1).await;
    assert_eq!(
        mail.received()[0].header("idempotency-key"),
        action.id.as_str()
    );

    // The next heartbeat does not send it again.
    b.emit(&agent, "OTHER", json!({})).await;
    beat(&b).await;
    assert_eq!(mail.received().len(), 1, "not repeated");
    // `pulse status` says so, with what to do.
    let status = status_of(&b).await;
    let finding = status
        .findings
        .iter()
        .find(|f| f.what.contains("not known"))
        .expect("a finding");
    assert!(finding.look.contains("--status UNKNOWN"), "{finding:?}");

    // Retried by its operator: the same key goes out again.
    mail.script(vec![ok_after(Duration::ZERO)]);
    let done = b
        .runner(settings())
        .retry_action(&agent.id, &action.id)
        .await
        .unwrap();
    assert_eq!((done.status, done.attempt), (ActionStatus::Completed, 2));
    assert_eq!(mail.received().len(), 2);
    assert_eq!(
        mail.received()[1].header("idempotency-key"),
        action.id.as_str()
    );
    assert!(
        status_of(&b)
            .await
            .findings
            .iter()
            .all(|f| !f.what.contains("not known"))
    );
}

async fn status_of(b: &Backend) -> pulse_shared::engine::Status {
    pulse_shared::engine::status(
        b.store.as_ref(),
        b.queue.as_ref(),
        None,
        b.now(),
        SignedDuration::from_secs(30),
        "the sweeper",
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_tool_that_timed_out_is_a_plain_failure_and_an_unknown_one_is_settled() {
    let b = Backend::new(Kind::Sqlite).await;
    let mail = FakeReceiver::start().await;
    mail.script(vec![ok_after(Duration::from_millis(1_500))]);
    b.tool_with(
        "mailer",
        &mail.url(),
        Duration::from_millis(300),
        "SEND",
        0,
        Filter::default(),
    )
    .await;
    let name = ToolName::parse("mailer").unwrap();
    let registry = b.store.load_registry().await.unwrap();
    let mut tool = registry.tools.into_iter().find(|t| t.name == name).unwrap();
    tool.idempotent = true;
    b.store.update_tool(&tool).await.unwrap();
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "SEND", json!({})).await;
    beat(&b).await;
    assert_eq!(mailer_action(&b, &agent).await.status, ActionStatus::Failed);

    // Not idempotent: UNKNOWN, then settled by hand — once.
    tool.idempotent = false;
    b.store.update_tool(&tool).await.unwrap();
    mail.script(vec![ok_after(Duration::from_millis(1_500))]);
    let (other, _) = b.agent("other", "15m").await;
    b.emit(&other, "SEND", json!({})).await;
    beat(&b).await;
    let unknown = mailer_action(&b, &other).await;
    assert_eq!(unknown.status, ActionStatus::Unknown);
    // `pulse tools stats` counts them by outcome, with their times.
    let mailer = || async {
        let (since, now) = (jiff::Timestamp::UNIX_EPOCH, b.now());
        pulse_shared::engine::actions::tool_stats(b.store.as_ref(), since, now)
            .await
            .unwrap()
            .into_iter()
            .find(|s| s.tool == "mailer")
            .unwrap()
    };
    let stats = mailer().await;
    assert_eq!(
        (stats.calls, stats.succeeded, stats.failed, stats.unknown),
        (2, 0, 1, 1)
    );
    // The calls timed out at 300 ms; a time is read back from its bucket, within 10 %.
    assert!(stats.p50_ms.is_some_and(|ms| ms >= 270), "{stats:?}");
    assert!(stats.p95_ms >= stats.p50_ms);
    let settled = pulse_shared::engine::actions::settle(b.store.as_ref(), &unknown, true, b.now())
        .await
        .unwrap();
    assert_eq!(settled.status, ActionStatus::Completed);
    assert_eq!(mailer_action(&b, &other).await, settled);
    let stats = mailer().await;
    assert_eq!((stats.succeeded, stats.unknown), (1, 0));
    let again = pulse_shared::engine::actions::settle(b.store.as_ref(), &settled, false, b.now())
        .await
        .unwrap_err();
    assert!(again.to_string().contains("not UNKNOWN"), "{again}");
}

on_both_backends!(
    a_run_that_stopped_during_a_call_leaves_it_unknown_instead_of_calling_again,
    stopped
);
async fn stopped(kind: Kind) {
    let b = Backend::new(kind).await;
    let mail = FakeReceiver::start().await;
    b.tool("mailer", &mail.url(), "SEND").await;
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "SEND", json!({})).await;
    // A worker that fails at the finish leaves the action RUNNING, as one killed during
    // the call would: the tool was called once.
    let (_, failing) = b.worker_failing("finish_action");
    b.advance(SignedDuration::from_mins(16));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&failing).await;
    mail.wait_for(1).await;
    assert_eq!(
        mailer_action(&b, &agent).await.status,
        ActionStatus::Running
    );
    // The heartbeat runs again once its lease is over: the action is not called again.
    b.advance(SignedDuration::from_mins(30));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker(settings())).await;
    let action = mailer_action(&b, &agent).await;
    assert_eq!(action.status, ActionStatus::Unknown, "{action:?}");
    assert!(
        action
            .error
            .as_deref()
            .is_some_and(|e| e.contains("an earlier run stopped")),
        "{action:?}"
    );
    assert_eq!(mail.received().len(), 1, "called once, never again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_tool_failing_most_calls_is_told_to_the_hooks_once_as_degraded() {
    let b = Backend::new(Kind::Sqlite).await;
    let mail = FakeReceiver::start().await;
    mail.script((0..6).map(|_| Answer::status(500)).collect());
    b.tool_with(
        "mailer",
        &mail.url(),
        Duration::from_secs(5),
        "SEND",
        0,
        Filter::default(),
    )
    .await;
    let (agent, _) = b.agent("scout", "15m").await;
    let told = FakeReceiver::start().await;
    b.hooks_to(&agent, &told.url(), &["TOOL_DEGRADED", "TOOL_RECOVERED"])
        .await;
    for n in 0..6 {
        b.emit(&agent, "SEND", json!({"n": n})).await;
    }
    b.advance(SignedDuration::from_mins(16));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker_with_hooks(settings())).await;
    assert_eq!(mail.received().len(), 6, "six calls, each failed");
    b.dispatch_all().await;
    assert_eq!(told.hook_types(), ["TOOL_DEGRADED"], "told once");
}
