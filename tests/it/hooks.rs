//! Outbound hooks end to end: a heartbeat emits, the dispatcher delivers to a recording
//! receiver on loopback (allow-listed), retries by re-enqueueing with a delay (injected
//! clock), disables on 410, dead-letters when exhausted, and never follows a redirect or
//! reaches a non-public address.

use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{
    Agent, AttemptStatus, DeliveryStatus, Hook, HookDelivery, HookId, HookTarget, HookType,
    RetrySchedule,
};
use pulse_shared::engine::Handled;
use pulse_signatures::inbound::{Scheme, standard_signature, verify};
use pulse_tests::fake_hooks::{Answer, FakeReceiver};
use pulse_tests::{Backend, FakeTool, Kind, RecordingHookQueue, on_both_backends, settings};
use serde_json::json;

/// Adds a hook of `hook_type` posting to `url`.
async fn hook(b: &Backend, agent: &Agent, hook_type: &str, url: &str) -> Hook {
    let h = Hook::new(
        agent.id.clone(),
        HookType::parse(hook_type).unwrap(),
        HookTarget::parse(url).unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        b.now(),
    );
    b.store.create_hook(&h).await.unwrap();
    h
}

/// Emits one AFTER_HEARTBEAT-like delivery for the agent's hooks of `hook_type`.
async fn emit(b: &Backend, agent: &Agent, hook_type: &str) -> usize {
    b.emit_hook(agent, hook_type).await
}

async fn deliveries(b: &Backend, h: &HookId) -> Vec<HookDelivery> {
    b.store.list_deliveries(h, 100).await.unwrap()
}

on_both_backends!(
    a_heartbeat_delivers_signed_before_after_and_tool_hooks,
    heartbeat_hooks
);
async fn heartbeat_hooks(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("SnipCreate", &tool.url(), "HEARTBEAT").await;
    let (agent, _) = b.agent("scout", "15m").await;
    let before = hook(&b, &agent, "BEFORE_HEARTBEAT", &receiver.url()).await;
    let after = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    let tool_hook = hook(&b, &agent, "AFTER_SNIP_CREATE", &receiver.url()).await;
    // A hook on another type does not fire.
    hook(&b, &agent, "ACTION_FAILED", &receiver.url()).await;
    b.advance(SignedDuration::from_mins(16));
    let report = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(report.claimed, 1);
    assert_eq!(b.drain(&b.worker_with_hooks(settings())).await, 1);
    assert_eq!(
        tool.requests().len(),
        1,
        "the tool ran for the HEARTBEAT event"
    );

    let d = b.dispatcher();
    let mut attempts = 0;
    for _ in 0..5 {
        attempts += d
            .poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .attempts;
    }
    assert_eq!(attempts, 3);
    let got = receiver.received();
    assert_eq!(got.len(), 3);
    let secret_of = |t: &str| {
        [&before, &after, &tool_hook]
            .into_iter()
            .find(|h| h.hook_type.as_str() == t)
            .unwrap()
            .secret
            .expose()
            .to_owned()
    };
    let mut types = Vec::new();
    for r in &got {
        let t = r.header("x-pulse-hook-type");
        let body = r.json();
        assert_eq!(body["hook_type"], t.as_str());
        assert_eq!(r.header("x-pulse-agent-id"), agent.id.as_str());
        assert_eq!(body["agent"]["id"], agent.id.as_str());
        assert_eq!(body["agent"]["name"], "scout");
        assert!(r.header("webhook-id").starts_with("msg_"));
        // The Standard Webhooks algorithm, with the hook's secret, accepts it …
        let v = verify(
            Scheme::Standard,
            &[&secret_of(&t)],
            &r.headers,
            &r.body,
            b.now().as_second(),
        )
        .unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(
            v.delivery_id.as_deref(),
            Some(r.header("webhook-id").as_str())
        );
        // … and another hook's secret does not.
        let other = if t == "BEFORE_HEARTBEAT" {
            "AFTER_HEARTBEAT"
        } else {
            "BEFORE_HEARTBEAT"
        };
        assert!(
            verify(
                Scheme::Standard,
                &[&secret_of(other)],
                &r.headers,
                &r.body,
                b.now().as_second()
            )
            .is_err()
        );
        assert!(body["heartbeat_id"].as_str().unwrap().starts_with("hb_"));
        match t.as_str() {
            "BEFORE_HEARTBEAT" => {
                assert_eq!(body["data"]["beat"], 1);
                assert_eq!(body["context"]["triggered_by"], "SCHEDULE");
            }
            "AFTER_HEARTBEAT" => {
                assert_eq!(body["data"]["status"], "COMPLETED");
                assert_eq!(body["data"]["actions_triggered"], 1);
                assert!(body["data"]["events_processed"].as_u64().unwrap() >= 1);
            }
            "AFTER_SNIP_CREATE" => {
                assert!(body["action_id"].as_str().unwrap().starts_with("act_"));
                assert_eq!(body["data"]["tool_name"], "SnipCreate");
                assert_eq!(body["data"]["status"], "COMPLETED");
                assert_eq!(body["context"]["triggered_by"], "HEARTBEAT");
            }
            other => panic!("unexpected hook type {other}"),
        }
        types.push(t);
    }
    types.sort();
    assert_eq!(
        types,
        ["AFTER_HEARTBEAT", "AFTER_SNIP_CREATE", "BEFORE_HEARTBEAT"]
    );
    for h in [&before, &after, &tool_hook] {
        let ds = deliveries(&b, &h.id).await;
        assert_eq!(ds.len(), 1, "{}", h.hook_type);
        assert_eq!(ds[0].status, DeliveryStatus::Succeeded);
        let attempts = b.store.list_attempts(&ds[0].id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].status, AttemptStatus::Success);
        assert_eq!(attempts[0].http_status, Some(200));
    }
}

#[test]
fn signing_follows_the_standard_webhooks_published_vector() {
    // https://github.com/standard-webhooks/standard-webhooks (spec test vector).
    let sig = standard_signature(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1_614_265_330,
        br#"{"test": 2432232314}"#,
    )
    .unwrap();
    assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    // The dispatcher's headers carry exactly that algorithm's output.
    let mut h = Hook::new(
        pulse_shared::domain::AgentId::generate(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse("https://example.com/h").unwrap(),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        jiff::Timestamp::UNIX_EPOCH,
    );
    h.auth_header = Some(pulse_shared::domain::Secret::new("Bearer t0k"));
    let task = pulse_shared::domain::HookTask {
        v: 1,
        delivery_id: pulse_shared::domain::HookDeliveryId::generate(1),
        hook_id: h.id.clone(),
        agent_id: h.agent_id.clone(),
        hook_type: h.hook_type.clone(),
        attempt: 1,
        not_before: jiff::Timestamp::UNIX_EPOCH,
        body: r#"{"test": 2432232314}"#.into(),
        emitted_at: jiff::Timestamp::UNIX_EPOCH,
    };
    let d = task.new_delivery(jiff::Timestamp::UNIX_EPOCH);
    let headers = pulse_shared::outbound::signed_headers(&h, &d, 1_614_265_330).unwrap();
    assert_eq!(
        headers["webhook-signature"],
        standard_signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            d.id.as_str(),
            1_614_265_330,
            d.body.as_bytes()
        )
        .unwrap()
        .as_str()
    );
    assert_eq!(headers["webhook-timestamp"], "1614265330");
    assert_eq!(headers["authorization"], "Bearer t0k");
    assert!(headers["authorization"].is_sensitive());
}

/// Polls until a message is handled, moving nothing: delayed messages stay hidden.
async fn poll(b: &Backend) -> usize {
    b.dispatcher()
        .poll_once(10, Duration::from_secs(60))
        .await
        .unwrap()
        .attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_at_the_scheduled_delays_until_one_succeeds() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![
        Answer::status(500),
        Answer::status(500),
        Answer::status(200),
    ]);
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    assert_eq!(emit(&b, &agent, "AFTER_HEARTBEAT").await, 1);

    let t0 = b.now();
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Pending, 1));
    let next = d.next_attempt_at.unwrap();
    // 5 s ± 20 %.
    assert!(
        next >= t0 + SignedDuration::from_secs(4) && next <= t0 + SignedDuration::from_secs(6),
        "{next}"
    );
    assert_eq!(poll(&b).await, 0, "the retry waits for its delay");
    assert_eq!(
        b.store
            .get_hook(&h.id)
            .await
            .unwrap()
            .unwrap()
            .failing_since,
        Some(t0)
    );

    b.advance(SignedDuration::from_secs(6));
    let t1 = b.now();
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    let next = d.next_attempt_at.unwrap();
    // 5 min ± 20 %.
    assert!(
        next >= t1 + SignedDuration::from_mins(4) && next <= t1 + SignedDuration::from_mins(6),
        "{next}"
    );
    b.advance(SignedDuration::from_mins(3));
    assert_eq!(poll(&b).await, 0);
    b.advance(SignedDuration::from_mins(3));
    assert_eq!(poll(&b).await, 1);

    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Succeeded, 3));
    let attempts = b.store.list_attempts(&d.id).await.unwrap();
    let summary: Vec<_> = attempts
        .iter()
        .map(|a| (a.attempt, a.status, a.http_status))
        .collect();
    assert_eq!(
        summary,
        [
            (1, AttemptStatus::Failed, Some(500)),
            (2, AttemptStatus::Failed, Some(500)),
            (3, AttemptStatus::Success, Some(200)),
        ]
    );
    assert_eq!(attempts[0].response_body.as_deref(), Some("status 500"));
    // One webhook-id across all attempts, as receivers deduplicate on it.
    let ids: Vec<_> = receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id"))
        .collect();
    assert_eq!(ids, vec![d.id.to_string(); 3]);
    assert_eq!(
        b.store
            .get_hook(&h.id)
            .await
            .unwrap()
            .unwrap()
            .failing_since,
        None,
        "a success ends the streak"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_disables_the_hook_and_emits_hook_disabled() {
    let b = Backend::new(Kind::Sqlite).await;
    let gone = FakeReceiver::start().await;
    gone.script(vec![Answer::status(410)]);
    let watcher = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &gone.url()).await;
    hook(&b, &agent, "HOOK_DISABLED", &watcher.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(poll(&b).await, 1);

    let stored = b.store.get_hook(&h.id).await.unwrap().unwrap();
    assert!(!stored.active);
    assert!(stored.disabled_reason.unwrap().contains("410"));
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(d.status, DeliveryStatus::Cancelled);
    assert_eq!(d.next_attempt_at, None, "no retry after 410");
    let events = b.store.list_events(&agent.id, 10).await.unwrap();
    let disabled = events
        .iter()
        .find(|e| e.event_type.as_str() == "HOOK_DISABLED")
        .unwrap();
    assert_eq!(disabled.payload["hook_id"], h.id.as_str());
    // The agent's HOOK_DISABLED hook hears of it.
    assert_eq!(poll(&b).await, 1);
    let got = watcher.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["data"]["hook_id"], h.id.as_str());
    // Emitting again sends nothing to the disabled hook.
    assert_eq!(emit(&b, &agent, "AFTER_HEARTBEAT").await, 0);
    assert_eq!(gone.received().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_for_longer_than_disable_after_disables_the_hook() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(500)]);
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    h.failing_since = Some(b.now() - SignedDuration::from_hours(5 * 24));
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(poll(&b).await, 1);
    let stored = b.store.get_hook(&h.id).await.unwrap().unwrap();
    assert!(!stored.active);
    assert!(
        stored
            .disabled_reason
            .unwrap()
            .contains("failed without a success")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_lengthens_the_wait() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(429).header("retry-after", "120")]);
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let t0 = b.now();
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(d.next_attempt_at, Some(t0 + SignedDuration::from_secs(120)));
    b.advance(SignedDuration::from_secs(100));
    assert_eq!(poll(&b).await, 0, "not before Retry-After");
    b.advance(SignedDuration::from_secs(21));
    assert_eq!(poll(&b).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_delivery_is_dead_lettered_and_can_be_replayed() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(503)]);
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    h.retry = RetrySchedule::parse("10s").unwrap();
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(poll(&b).await, 1);
    b.advance(SignedDuration::from_secs(13));
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Exhausted, 2));
    assert_eq!(b.dead_hooks().await, 1);
    b.advance(SignedDuration::from_hours(1));
    assert_eq!(poll(&b).await, 0, "nothing more is attempted");

    receiver.script(vec![Answer::status(204)]);
    let (d, a) = b.dispatcher().replay(&d.id).await.unwrap();
    assert_eq!((a.attempt, a.status), (3, AttemptStatus::Success));
    assert_eq!(d.status, DeliveryStatus::Succeeded);
    let ids: Vec<_> = receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id"))
        .collect();
    assert_eq!(ids, vec![d.id.to_string(); 3]);
    assert!(
        b.dispatcher().replay(&d.id).await.is_err(),
        "a succeeded delivery is not replayed"
    );
}

on_both_backends!(
    the_dead_letter_queue_is_emptied_by_redrive_and_keeps_what_cannot_be_sent,
    redrive
);
async fn redrive(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(503)]);
    // Three hooks whose one try fails: three dead letters.
    let mut hooks = Vec::new();
    for name in ["one", "two", "three"] {
        let (agent, _) = b.agent(name, "15m").await;
        let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
        h.retry = RetrySchedule::none();
        h.version += 1;
        b.store.update_hook(&h).await.unwrap();
        emit(&b, &agent, "AFTER_HEARTBEAT").await;
        hooks.push(h);
    }
    assert_eq!(poll(&b).await, 3);
    let dead = async || b.hooks.backlog().await.unwrap().dead;
    assert_eq!(dead().await, Some(3));
    let delivery = async |h: &Hook| deliveries(&b, &h.id).await.remove(0);
    // Meanwhile the second hook was turned off, and the third's delivery was sent again
    // by hand and succeeded.
    pulse_shared::engine::set_hook_active(b.store.as_ref(), &hooks[1].id, false)
        .await
        .unwrap();
    receiver.script(vec![Answer::status(204)]);
    let third = delivery(&hooks[2]).await;
    b.dispatcher().replay(&third.id).await.unwrap();
    assert_eq!(receiver.received().len(), 4);

    // The first is sent and succeeds, the third leaves with nothing to send, the
    // second stays: its hook is off.
    let done = b.dispatcher().redrive(100).await.unwrap();
    let first = delivery(&hooks[0]).await;
    assert_eq!(
        done.sent
            .iter()
            .map(|(d, a)| (d.id.clone(), a.status))
            .collect::<Vec<_>>(),
        [(first.id.clone(), AttemptStatus::Success)]
    );
    assert_eq!(first.status, DeliveryStatus::Succeeded);
    assert_eq!(done.dropped.len(), 1);
    assert_eq!(done.dropped[0].0, third.id.to_string());
    assert!(done.dropped[0].1.contains("succeeded already"), "{done:?}");
    assert_eq!(done.kept.len(), 1);
    assert!(done.kept[0].1.contains("disabled"), "{done:?}");
    assert_eq!(done.left(), 1);
    assert_eq!(dead().await, Some(1));
    assert_eq!(
        receiver.received().len(),
        5,
        "nothing sent for the other two"
    );

    // Turned on again, its receiver still failing: sent, failed, and still there, at
    // once visible to the next redrive.
    pulse_shared::engine::set_hook_active(b.store.as_ref(), &hooks[1].id, true)
        .await
        .unwrap();
    receiver.script(vec![Answer::status(503)]);
    let done = b.dispatcher().redrive(100).await.unwrap();
    assert_eq!(done.sent.len(), 1);
    assert_eq!(done.sent[0].1.status, AttemptStatus::Failed);
    assert_eq!((done.left(), dead().await), (1, Some(1)));
    receiver.script(vec![Answer::status(204)]);
    let done = b.dispatcher().redrive(100).await.unwrap();
    assert_eq!(done.sent.len(), 1);
    assert_eq!(done.sent[0].1.status, AttemptStatus::Success);
    assert_eq!((done.left(), dead().await), (0, Some(0)));
    // Each try went out under its delivery's own id.
    let second = delivery(&hooks[1]).await;
    assert_eq!(second.status, DeliveryStatus::Succeeded);
    assert_eq!(
        receiver
            .received()
            .iter()
            .filter(|r| r.header("webhook-id") == second.id.as_str())
            .count(),
        3
    );
    let done = b.dispatcher().redrive(100).await.unwrap();
    assert_eq!(
        (done.sent.len(), done.dropped.len(), done.kept.len()),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_is_a_timeout_and_is_retried() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![
        Answer::status(200).after(Duration::from_secs(5)),
        Answer::status(200),
    ]);
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    h.timeout = SignedDuration::from_millis(300);
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    let a = b.store.list_attempts(&d.id).await.unwrap().remove(0);
    assert_eq!(a.status, AttemptStatus::Timeout);
    assert!(d.next_attempt_at.is_some(), "a timeout is retried");
    b.advance(SignedDuration::from_secs(7));
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(d.status, DeliveryStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_internal_address_is_not_followed() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    let (hits, port) = tripwire().await;
    receiver.script(vec![Answer::status(302).header(
        "location",
        format!("http://127.0.0.2:{port}/latest/meta-data/"),
    )]);
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let d = b.dispatcher_with(pulse_tests::test_egress());
    assert_eq!(
        d.poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .attempts,
        1
    );
    let del = deliveries(&b, &h.id).await.remove(0);
    let a = b.store.list_attempts(&del.id).await.unwrap().remove(0);
    assert_eq!(
        (a.status, a.http_status),
        (AttemptStatus::Failed, Some(302))
    );
    assert!(a.error.unwrap().contains("redirects are not followed"));
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the redirect's target was never reached"
    );
}

/// A listener on 127.0.0.2 (a loopback address the tests' allow-list does not cover,
/// standing in for an internal service) counting the connections that reach it; its
/// port.
async fn tripwire() -> (Arc<std::sync::atomic::AtomicUsize>, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while l.accept().await.is_ok() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (hits, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_target_is_rejected_before_any_connection_and_logged() {
    let b = Backend::new(Kind::Sqlite).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let (hits, port) = tripwire().await;
    let internal = format!("http://127.0.0.2:{port}/");
    let targets = [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "https://[fd00:ec2::254]/",
        internal.as_str(),
    ];
    let mut hooks = Vec::new();
    for t in targets {
        hooks.push(hook(&b, &agent, "AFTER_HEARTBEAT", t).await);
    }
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let d = b.dispatcher_with(pulse_tests::test_egress());
    assert_eq!(
        d.poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .attempts,
        4
    );
    for h in &hooks {
        let del = deliveries(&b, &h.id).await.remove(0);
        let a = b.store.list_attempts(&del.id).await.unwrap().remove(0);
        assert_eq!(a.status, AttemptStatus::RejectedSsrf, "{}", h.target);
        assert!(a.error.unwrap().contains("not a public address"));
    }
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no connection reached the internal address"
    );
}

on_both_backends!(the_same_message_consumed_twice_posts_once, consumed_twice);
async fn consumed_twice(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let batch = b.hooks.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(batch.len(), 1);
    // The queue delivered it twice (at-least-once), to two dispatchers at once.
    let twice = vec![batch[0].clone(), batch[0].clone()];
    let report = b.dispatcher().process_batch(&twice).await;
    assert!(report.failed.is_empty());
    assert_eq!(report.attempts, 1);
    // And once more later, after it succeeded.
    let task = pulse_shared::domain::HookTask::decode(&batch[0].body).unwrap();
    match b.dispatcher().handle(&task).await.unwrap() {
        Handled::Skipped(why) => assert!(why.contains("SUCCEEDED"), "{why}"),
        other => panic!("expected a skip, got {other:?}"),
    }
    assert_eq!(receiver.received().len(), 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Succeeded, 1));
}

on_both_backends!(
    a_first_attempt_claimed_by_a_dispatcher_that_stopped_is_made_once_its_lease_ends,
    stopped_claimer
);
async fn stopped_claimer(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let batch = b.hooks.receive(10, Duration::from_secs(60)).await.unwrap();
    let task = pulse_shared::domain::HookTask::decode(&batch[0].body).unwrap();
    // Another dispatcher claimed the first attempt, then stopped before making it.
    let mut claimed = task.new_delivery(b.now());
    claimed.attempts = 1;
    claimed.lease_until = Some(b.now() + SignedDuration::from_mins(2));
    claimed.version = 1;
    b.store.save_delivery(&claimed, None).await.unwrap();
    match b.dispatcher().handle(&task).await.unwrap() {
        Handled::Skipped(why) => assert!(why.contains("in flight elsewhere"), "{why}"),
        other => panic!("expected a skip while the claim holds, got {other:?}"),
    }
    assert!(receiver.received().is_empty());
    b.advance(SignedDuration::from_mins(3));
    match b.dispatcher().handle(&task).await.unwrap() {
        Handled::Attempted(a) => assert_eq!(a.status, AttemptStatus::Success),
        other => panic!("expected the attempt once the lease ended, got {other:?}"),
    }
    assert_eq!(receiver.received().len(), 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Succeeded, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_hook_cancels_its_queued_deliveries() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    h.active = false;
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    assert_eq!(poll(&b).await, 0);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(d.status, DeliveryStatus::Cancelled);
    assert!(receiver.received().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventbridge_target_puts_the_payload_on_the_bus() {
    let b = Backend::new(Kind::Aws).await;
    let clients = b.aws.clone().unwrap();
    // Built on its first use, not with the other clients.
    assert!(!clients.eventbridge.is_built());
    let bus = pulse_tests::unique("bus");
    clients
        .eventbridge
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .unwrap();
    let target = pulse_shared::adapters::aws::create_hooks_queue(
        &clients.sqs,
        &pulse_tests::unique("eb-target"),
    )
    .await
    .unwrap();
    let arn = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&target)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    clients
        .eventbridge
        .put_rule()
        .name("pulse-hooks")
        .event_bus_name(&bus)
        .event_pattern(r#"{"source": ["pulse"]}"#)
        .send()
        .await
        .unwrap();
    clients
        .eventbridge
        .put_targets()
        .rule("pulse-hooks")
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("q")
                .arn(arn)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();

    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(
        &b,
        &agent,
        "AFTER_HEARTBEAT",
        &format!("eventbridge://{bus}"),
    )
    .await;
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    let dispatcher = pulse_shared::engine::Dispatcher::new(
        b.store.clone(),
        b.hooks.clone(),
        Arc::new(pulse_shared::outbound::HookClient::new(
            pulse_tests::test_egress(),
            Some(Arc::new(pulse_shared::adapters::aws::EventBridgeBus::new(
                clients.eventbridge.clone(),
            ))),
        )),
        b.clock.clone(),
        Default::default(),
    );
    assert_eq!(
        dispatcher
            .poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .attempts,
        1
    );
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(d.status, DeliveryStatus::Succeeded);

    let got = clients
        .sqs
        .receive_message()
        .queue_url(&target)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    let msg = &got.messages()[0];
    let event: serde_json::Value = serde_json::from_str(msg.body().unwrap()).unwrap();
    assert_eq!(event["source"], "pulse");
    assert_eq!(event["detail-type"], "AFTER_HEARTBEAT");
    let detail: serde_json::Value = serde_json::from_str(&d.body).unwrap();
    assert_eq!(event["detail"], detail);
    assert_eq!(event["detail"]["agent"]["id"], agent.id.as_str());
}

// Six hook types were once emitted but never delivered in any test. Each
// test below makes the lifecycle point happen, delivers through the dispatcher to the
// recording receiver, checks the signature with the hook's secret and the documented
// `data` fields.

/// The one delivery of `hook` the receiver got, checked: signed with the hook's secret
/// (Standard Webhooks), of its type, for its agent, with each of `fields` in `data`.
fn delivered(
    b: &Backend,
    receiver: &FakeReceiver,
    hook: &Hook,
    fields: &[&str],
) -> serde_json::Value {
    let got: Vec<_> = receiver
        .received()
        .into_iter()
        .filter(|r| r.header("x-pulse-hook-type") == hook.hook_type.as_str())
        .collect();
    assert_eq!(got.len(), 1, "{}: {} deliveries", hook.hook_type, got.len());
    let r = &got[0];
    verify(
        Scheme::Standard,
        &[hook.secret.expose()],
        &r.headers,
        &r.body,
        b.now().as_second(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", hook.hook_type));
    let body = r.json();
    assert_eq!(body["hook_type"], hook.hook_type.as_str());
    assert_eq!(body["agent"]["id"], hook.agent_id.as_str());
    for f in fields {
        assert!(
            body["data"].get(*f).is_some(),
            "{}: no data.{f} in {}",
            hook.hook_type,
            body["data"]
        );
    }
    body["data"].clone()
}

/// A heartbeat in which `SnipCreate` (answers) and `Broken` (500) run on HEARTBEAT, with a
/// hook of `hook_type`; returns the hook and the receiver once delivered.
async fn action_point(b: &Backend, hook_type: &str) -> (Hook, FakeReceiver) {
    let receiver = FakeReceiver::start().await;
    let ok = FakeTool::start().await;
    let broken = FakeTool::answering(|_| pulse_tests::Reply::Raw(500, "down")).await;
    b.tool("SnipCreate", &ok.url(), "HEARTBEAT").await;
    b.tool("Broken", &broken.url(), "HEARTBEAT").await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(b, &agent, hook_type, &receiver.url()).await;
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker_with_hooks(settings())).await;
    b.dispatch_all().await;
    // The receivers must outlive the run: keep the tools alive until here.
    drop((ok, broken));
    (h, receiver)
}

const BEFORE_FIELDS: &[&str] = &["tool_name", "attempt", "event"];
const AFTER_FIELDS: &[&str] = &[
    "tool_name",
    "status",
    "response",
    "error_message",
    "new_events",
    "execution_time_ms",
];

on_both_backends!(action_started_is_delivered, action_started);
async fn action_started(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("SnipCreate", &tool.url(), "HEARTBEAT").await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "ACTION_STARTED", &receiver.url()).await;
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker_with_hooks(settings())).await;
    b.dispatch_all().await;
    let data = delivered(&b, &receiver, &h, BEFORE_FIELDS);
    assert_eq!(data["tool_name"], "SnipCreate");
    assert_eq!(data["event"]["type"], "HEARTBEAT");
}

on_both_backends!(before_a_tool_is_delivered, before_tool);
async fn before_tool(kind: Kind) {
    let b = Backend::new(kind).await;
    let (h, receiver) = action_point(&b, "BEFORE_SNIP_CREATE").await;
    let data = delivered(&b, &receiver, &h, BEFORE_FIELDS);
    assert_eq!(data["tool_name"], "SnipCreate");
    assert_eq!(data["attempt"], 1);
}

on_both_backends!(action_completed_is_delivered, action_completed);
async fn action_completed(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("SnipCreate", &tool.url(), "HEARTBEAT").await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "ACTION_COMPLETED", &receiver.url()).await;
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker_with_hooks(settings())).await;
    b.dispatch_all().await;
    let data = delivered(&b, &receiver, &h, AFTER_FIELDS);
    assert_eq!(data["status"], "COMPLETED");
    assert_eq!(data["response"]["output"], json!({"ok": true}));
}

on_both_backends!(action_failed_is_delivered, action_failed);
async fn action_failed(kind: Kind) {
    let b = Backend::new(kind).await;
    let (h, receiver) = action_point(&b, "ACTION_FAILED").await;
    let data = delivered(&b, &receiver, &h, AFTER_FIELDS);
    assert_eq!(data["tool_name"], "Broken");
    assert_eq!(data["status"], "FAILED");
    assert!(
        data["error_message"].as_str().unwrap().contains("500"),
        "{data}"
    );
}

on_both_backends!(heartbeat_failed_is_delivered, heartbeat_failed);
async fn heartbeat_failed(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("recorder", &tool.url(), "HEARTBEAT").await;
    let (agent, first) = b.agent("scout", "10m").await;
    let h = hook(&b, &agent, "HEARTBEAT_FAILED", &receiver.url()).await;
    // Storage fails mid-run: the engine records the heartbeat FAILED.
    let faulty = Arc::new(pulse_tests::faults::faulty(b.store.clone()));
    faulty.policy().fail("start_action");
    let runner = pulse_shared::engine::HeartbeatRunner::new(
        faulty,
        Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        b.clock.clone(),
        settings(),
    )
    .with_hooks(b.emitter());
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&pulse_shared::engine::Worker::new(Arc::new(runner)))
        .await;
    b.dispatch_all().await;
    let data = delivered(
        &b,
        &receiver,
        &h,
        &["beat", "error_message", "consecutive_failures", "next_at"],
    );
    assert_eq!(data["beat"], first.beat);
    assert_eq!(data["consecutive_failures"], 1);
    assert!(
        data["error_message"].as_str().unwrap().contains("injected"),
        "{data}"
    );
}

// The AWS hook path past the happy case.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_delivery_is_sent_to_the_sqs_dead_letter_queue() {
    let b = Backend::new(Kind::Aws).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(503)]);
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    h.retry = RetrySchedule::none();
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(poll(&b).await, 1);
    let d = deliveries(&b, &h.id).await.remove(0);
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Exhausted, 1));
    let dead = b
        .aws
        .as_ref()
        .unwrap()
        .sqs
        .receive_message()
        .queue_url(b.hooks_dlq_url.as_ref().unwrap())
        .message_attribute_names("All")
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    let messages = dead.messages();
    assert_eq!(messages.len(), 1, "one message on the DLQ");
    let task = pulse_shared::domain::HookTask::decode(messages[0].body().unwrap()).unwrap();
    assert_eq!(task.delivery_id, d.id);
    assert_eq!(task.hook_id, h.id);
    let reason = messages[0].message_attributes().unwrap()["reason"]
        .string_value()
        .unwrap();
    assert!(reason.contains("503"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_fifteen_minutes_is_chained_through_sqs_messages() {
    let b = Backend::new(Kind::Aws).await;
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(503), Answer::status(204)]);
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    h.retry = RetrySchedule::parse("1h").unwrap();
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    let queue = Arc::new(RecordingHookQueue::new(b.hooks.clone()));
    let d = pulse_shared::engine::Dispatcher::new(
        b.store.clone(),
        queue.clone(),
        Arc::new(pulse_shared::outbound::HookClient::new(
            pulse_tests::test_egress(),
            None,
        )),
        b.clock.clone(),
        pulse_shared::engine::DispatchSettings::default(),
    );
    emit(&b, &agent, "AFTER_HEARTBEAT").await;
    assert_eq!(
        d.poll_once(10, Duration::from_secs(60))
            .await
            .unwrap()
            .attempts,
        1
    );
    // The retry is due in an hour (±20 %): SQS holds a message at most 15 minutes.
    let first_retry = queue.sent().last().cloned().unwrap();
    let due = first_retry.task.not_before;
    let wait = due.duration_since(b.now());
    assert!(
        wait >= SignedDuration::from_mins(48) && wait <= SignedDuration::from_mins(72),
        "{wait:?}"
    );
    assert_eq!(first_retry.delay, Duration::from_secs(900));

    // Each time SQS hands the message over (as the Lambda event source would, after 15
    // minutes), it is sent on with what remains, until the hour is up.
    let mut task = first_retry.task;
    let mut hops = 0;
    loop {
        b.advance(SignedDuration::from_mins(15));
        match d.handle(&task).await.unwrap() {
            Handled::Deferred(at) => {
                assert_eq!(at, due);
                hops += 1;
                let next = queue.sent().last().cloned().unwrap();
                assert!(next.delay <= Duration::from_secs(900));
                assert_eq!(next.task.attempt, 2);
                assert_eq!(next.task.not_before, due);
                task = next.task;
            }
            Handled::Attempted(a) => {
                // SQS delays are whole seconds: what remains under one is not waited.
                assert!(
                    due.duration_since(b.now()) < SignedDuration::from_secs(1),
                    "attempted early"
                );
                assert_eq!(a.status, AttemptStatus::Success);
                break;
            }
            Handled::Skipped(why) | Handled::Left(why) => panic!("skipped: {why}"),
        }
        assert!(hops < 10);
    }
    // Attempted at the first hand-over less than a second before the time.
    assert_eq!(
        hops,
        ((wait.as_secs_f64() - 1.0) / 900.0).ceil() as usize - 1,
        "one hop per 15 minutes"
    );
    assert_eq!(receiver.received().len(), 2);
    let done = deliveries(&b, &h.id).await.remove(0);
    assert_eq!(done.status, DeliveryStatus::Succeeded);
}

// Emissions that were lost.

/// Runs queued jobs once with `worker`; returns (received, failed).
async fn poll_jobs(b: &Backend, worker: &pulse_shared::engine::Worker) -> (usize, usize) {
    let r = worker
        .poll_once(b.queue.as_ref(), 10, Duration::from_secs(60))
        .await
        .unwrap();
    (r.received, r.failed)
}

/// A worker whose hooks go through `queue`.
fn worker_via(b: &Backend, queue: Arc<RecordingHookQueue>) -> pulse_shared::engine::Worker {
    let runner = pulse_shared::engine::HeartbeatRunner::new(
        b.store.clone(),
        Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        b.clock.clone(),
        settings(),
    )
    .with_hooks(pulse_shared::engine::HookEmitter::new(
        b.store.clone(),
        queue,
        b.clock.clone(),
    ));
    pulse_shared::engine::Worker::new(Arc::new(runner))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_the_queue_refused_fails_the_job_and_its_rerun_emits_it_once() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("SnipCreate", &tool.url(), "HEARTBEAT").await;
    let (agent, first) = b.agent("scout", "15m").await;
    let completed = hook(&b, &agent, "ACTION_COMPLETED", &receiver.url()).await;
    let after = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    let queue = Arc::new(RecordingHookQueue::new(b.hooks.clone()));
    let worker = worker_via(&b, queue.clone());

    // The action finishes, then its ACTION_COMPLETED cannot be queued: the job fails
    // (it was logged and lost before) and the heartbeat is not recorded FAILED.
    queue.refuse_next("ACTION_COMPLETED");
    b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(poll_jobs(&b, &worker).await, (1, 1));
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, pulse_shared::domain::HeartbeatStatus::Executing);
    // The rerun reuses the finished action (the tool is not called again) and emits its
    // hooks; then AFTER_HEARTBEAT is refused after the heartbeat was finished.
    queue.refuse_next("AFTER_HEARTBEAT");
    b.advance(SignedDuration::from_secs(2));
    assert_eq!(poll_jobs(&b, &worker).await, (1, 1));
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, pulse_shared::domain::HeartbeatStatus::Completed);
    // The next run finds the heartbeat finished and emits its end hooks again.
    b.advance(SignedDuration::from_secs(4));
    assert_eq!(poll_jobs(&b, &worker).await, (1, 0));
    assert_eq!(tool.requests().len(), 1, "the tool ran once");

    b.dispatch_all().await;
    let data = delivered(
        &b,
        &receiver,
        &completed,
        &["tool_name", "status", "response"],
    );
    assert_eq!(data["status"], "COMPLETED");
    let data = delivered(&b, &receiver, &after, &["status", "beat", "next_at"]);
    assert_eq!(data["status"], "COMPLETED");
    let next = b
        .store
        .get_heartbeat(&first.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        data["next_at"],
        serde_json::to_value(next.scheduled_at).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_reused_by_a_later_heartbeat_delivers_its_hooks_once() {
    let b = Backend::new(Kind::Sqlite).await;
    let receiver = FakeReceiver::start().await;
    let faulty = Arc::new(pulse_tests::faults::faulty(b.store.clone()));
    // The first tool's run breaks the store for the second: the heartbeat fails after
    // the first action finished, and the next heartbeat reads the same window.
    let breaks = faulty.clone();
    let first_tool = FakeTool::answering(move |_| {
        breaks.policy().fail("start_action");
        pulse_tests::ok_with_events(json!([]))
    })
    .await;
    let second_tool = FakeTool::start().await;
    b.tool_with(
        "First",
        &first_tool.url(),
        Duration::from_secs(10),
        "NOTE",
        0,
        Default::default(),
    )
    .await;
    b.tool_with(
        "Second",
        &second_tool.url(),
        Duration::from_secs(10),
        "NOTE",
        1,
        Default::default(),
    )
    .await;
    let (agent, first) = b.agent("scout", "15m").await;
    let completed = hook(&b, &agent, "AFTER_FIRST", &receiver.url()).await;
    b.emit(&agent, "NOTE", json!({})).await;
    b.advance(SignedDuration::from_secs(5));
    let runner = pulse_shared::engine::HeartbeatRunner::new(
        faulty.clone(),
        Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        b.clock.clone(),
        settings(),
    )
    .with_hooks(b.emitter());
    let worker = pulse_shared::engine::Worker::new(Arc::new(runner));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    let failed = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(failed.status, pulse_shared::domain::HeartbeatStatus::Failed);
    faulty.policy().heal("start_action");
    b.advance(SignedDuration::from_mins(16));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    assert_eq!(first_tool.requests().len(), 1, "reused, not run again");
    assert_eq!(second_tool.requests().len(), 1);
    b.dispatch_all().await;
    // Both heartbeats emitted AFTER_FIRST for the one action: one delivery.
    delivered(&b, &receiver, &completed, &["status", "tool_name"]);
}

on_both_backends!(
    a_dispatcher_beside_the_server_leaves_what_it_may_not_send,
    leave_unsendable
);
async fn leave_unsendable(kind: Kind) {
    let b = Backend::new(kind).await;
    let receiver = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    assert_eq!(emit(&b, &agent, "AFTER_HEARTBEAT").await, 1);
    // `pulse sweep` without the server's PULSE_HOOKS_ALLOW: loopback is refused to it.
    let queue = Arc::new(RecordingHookQueue::new(b.hooks.clone()));
    let helper = pulse_shared::engine::Dispatcher::new(
        b.store.clone(),
        queue.clone(),
        Arc::new(pulse_shared::outbound::HookClient::new(
            pulse_egress::Egress::new(pulse_egress::AllowList::default()),
            None,
        )),
        b.clock.clone(),
        pulse_shared::engine::DispatchSettings {
            leave_unsendable: true,
            ..Default::default()
        },
    );
    let report = helper.poll_once(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!((report.attempts, report.left), (0, 1));
    assert!(receiver.received().is_empty());
    assert!(
        deliveries(&b, &h.id).await.is_empty(),
        "nothing was recorded: the delivery is as it was"
    );
    let left = queue.sent().last().cloned().unwrap();
    assert_eq!(left.delay, Duration::from_secs(30));
    // The server, allowed to, delivers it when it comes up again.
    b.advance(SignedDuration::from_secs(31));
    match b.dispatcher().handle(&left.task).await.unwrap() {
        Handled::Attempted(a) => assert_eq!(a.status, AttemptStatus::Success),
        other => panic!("{other:?}"),
    }
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(
        deliveries(&b, &h.id).await[0].status,
        DeliveryStatus::Succeeded
    );
}

/// A batch of deliveries to one hook reads the hook once, not once per delivery, claims
/// first attempts without reading them, and deletes every message it handled: on
/// DynamoDB one `GetItem` (the hook's), and one `DeleteMessage` per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reads_its_hook_once() {
    let b = Backend::new(Kind::Aws).await;
    let receiver = FakeReceiver::start().await;
    let (agent, _) = b.agent("scout", "15m").await;
    let h = hook(&b, &agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    for _ in 0..5 {
        assert_eq!(emit(&b, &agent, "AFTER_HEARTBEAT").await, 1);
        b.advance(SignedDuration::from_secs(1));
    }
    let counter = b.aws.as_ref().unwrap().counter.clone();
    counter.reset();
    assert_eq!(poll(&b).await, 5);
    let sent = counter.snapshot();
    assert_eq!(sent.get("DynamoDB.GetItem"), Some(&1), "{sent:?}");
    assert_eq!(sent.get("SQS.DeleteMessage"), Some(&5), "{sent:?}");
    assert_eq!(receiver.received().len(), 5);
    assert!(
        deliveries(&b, &h.id)
            .await
            .iter()
            .all(|d| d.status == DeliveryStatus::Succeeded)
    );
    assert_eq!(poll(&b).await, 0, "every handled message was deleted");
}
