//! `pulse status`'s read on each backend, with an injected clock: a heartbeat overdue
//! while the sweeper is stopped and not once it runs again, a failing agent, a failing
//! hook with its dead letter, a disabled one, a refusing webhook, today's tokens.

use jiff::SignedDuration;
use pulse_shared::domain::{
    HookTarget, HookType, RequestStatus, RetrySchedule, Spend, Webhook, WebhookRequest,
    WebhookScheme,
};
use pulse_shared::engine::{Status, budget, status};
use pulse_tests::fake_hooks::{Answer, FakeReceiver};
use pulse_tests::{Backend, FakeTool, Kind, on_both_backends, settings};
use serde_json::json;

async fn read(b: &Backend) -> Status {
    read_every(b, SignedDuration::from_mins(1)).await
}

/// The status as a sweeper running every `sweep_interval` would have it.
async fn read_every(b: &Backend, sweep_interval: SignedDuration) -> Status {
    status(
        b.store.as_ref(),
        b.queue.as_ref(),
        Some(b.hooks.as_ref()),
        b.now(),
        sweep_interval,
        "is the sweeper running?",
    )
    .await
    .unwrap()
}

fn whats(s: &Status) -> Vec<&str> {
    s.findings.iter().map(|f| f.what.as_str()).collect()
}

async fn reads_what_needs_attention(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("recorder", &tool.url(), "JOB").await;
    let (agent, first) = b.agent("scout", "10m").await;
    let (idle, _) = b.agent("idle", "1h").await;
    b.connected()
        .lifecycle(b.clock.clone(), &settings())
        .pause(&idle.id)
        .await
        .unwrap();

    // Just created: due now, nothing overdue, nothing to say.
    let s = read(&b).await;
    assert_eq!((s.agents.active, s.agents.paused, s.overdue), (1, 1, 0));
    assert!(s.findings.is_empty(), "{:?}", s.findings);

    // The sweeper is stopped: a minute on, the heartbeat is late but within two sweep
    // intervals; three minutes on, it is overdue.
    b.advance(SignedDuration::from_mins(1));
    assert_eq!(read(&b).await.overdue, 0);
    b.advance(SignedDuration::from_mins(2));
    let s = read(&b).await;
    assert_eq!(s.overdue, 1);
    assert_eq!(s.oldest_overdue, Some(first.scheduled_at));
    assert_eq!(s.overdue_after_ms, 120_000);
    assert_eq!(
        whats(&s),
        [format!(
            "1 heartbeat overdue: due more than 2m ago and not claimed; the oldest was due at {}",
            first.scheduled_at
        )]
    );
    assert!(
        s.findings[0].look.contains(agent.id.as_str()),
        "{:?}",
        s.findings
    );

    // The sweeper runs again; the heartbeat fails (storage refuses its action): nothing
    // is overdue, and the agent is failing.
    b.emit(&agent, "JOB", json!({})).await;
    b.advance(SignedDuration::from_secs(5));
    let (_, worker) = b.worker_failing("start_action");
    assert_eq!(b.sweeper(settings()).sweep_once(b.now()).await.claimed, 1);
    b.drain(&worker).await;
    let s = read(&b).await;
    assert_eq!((s.overdue, s.agents.failing), (0, 1));
    assert_eq!(whats(&s), ["agent scout: its last heartbeat failed"]);
    assert_eq!(
        s.findings[0].look,
        format!("pulse heartbeats list --agent {} --status FAILED", agent.id)
    );

    // A hook whose receiver answers 503, with no retries: its attempt fails, the
    // delivery is dead-lettered, and the hook is failing. A hook a user disabled is no finding; one
    // disabled for failing is.
    let receiver = FakeReceiver::start().await;
    receiver.script(vec![Answer::status(503)]);
    let mut failing = pulse_shared::domain::Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse(&receiver.url()).unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        b.now(),
    );
    failing.retry = RetrySchedule::none();
    b.store.create_hook(&failing).await.unwrap();
    for (n, reason) in [
        (1, Some("disabled by a user")),
        (2, Some("the receiver answered 410 Gone")),
    ] {
        let mut h = pulse_shared::domain::Hook::new(
            agent.id.clone(),
            HookType::parse("AGENT_PAUSED").unwrap(),
            HookTarget::parse(&format!("{}/{n}", receiver.url())).unwrap(),
            &pulse_signatures::inbound::generate_secret(),
            b.now(),
        );
        h.active = false;
        h.disabled_reason = reason.map(str::to_owned);
        b.store.create_hook(&h).await.unwrap();
    }
    assert_eq!(b.emit_hook(&agent, "AFTER_HEARTBEAT").await, 1);
    let polled = b
        .dispatcher()
        .poll_once(10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(polled.attempts, 1);

    // A webhook whose sender signs with the wrong secret, and one that sends well.
    let secret = pulse_signatures::inbound::generate_secret();
    let refusing = Webhook::new(agent.id.clone(), WebhookScheme::Pulse, &secret, b.now()).unwrap();
    let fine = Webhook::new(agent.id.clone(), WebhookScheme::Pulse, &secret, b.now()).unwrap();
    for (w, status, code) in [
        (&refusing, RequestStatus::InvalidSignature, 401),
        (&refusing, RequestStatus::InvalidSignature, 401),
        (&fine, RequestStatus::InvalidSignature, 401),
        (&fine, RequestStatus::Accepted, 200),
    ] {
        b.store.create_webhook(w).await.ok();
        b.advance(SignedDuration::from_secs(1));
        let mut r = WebhookRequest::arrived(w, b.now(), b"{}", None);
        r.status = status;
        r.http_status = code;
        r.reason = (code != 200).then(|| "invalid signature: no signature matches".to_owned());
        b.store.log_request(&r).await.unwrap();
    }

    // Tokens spent today, by both agents.
    for (a, tokens) in [(&agent, 1_200), (&idle, 34)] {
        let spend = Spend {
            day: budget::day_of(a, b.now()),
            source: "turn-1".into(),
            tokens,
            at: b.now(),
        };
        b.store.record_spend(&a.id, &spend).await.unwrap();
    }

    let s = read(&b).await;
    assert_eq!(s.tokens_today, 1_234);
    assert_eq!(
        s.hooks_queue.and_then(|q| q.dead),
        Some(1),
        "{:?}",
        s.hooks_queue
    );
    // The emulator's sessions queue has no dead-letter queue (the stack's has: see below).
    let expected_dead = (kind == Kind::Sqlite).then_some(0);
    assert_eq!(s.sessions_queue.dead, expected_dead);
    let found = whats(&s);
    assert_eq!(found.len(), 5, "{found:#?}");
    assert_eq!(found[0], "agent scout: its last heartbeat failed");
    let failing_hook = found
        .iter()
        .find(|w| w.starts_with(&format!("hook {} ", failing.id)))
        .unwrap_or_else(|| panic!("{found:#?}"));
    assert!(failing_hook.contains("has failed since"), "{failing_hook}");
    assert!(
        found
            .iter()
            .any(|w| w.ends_with("was disabled: the receiver answered 410 Gone")),
        "{found:#?}"
    );
    assert!(
        !found.iter().any(|w| w.contains("disabled by a user")),
        "{found:#?}"
    );
    assert!(
        found.contains(
            &format!(
                "webhook {} (agent scout): its last 2 requests were refused (401 invalid signature: no signature matches, latest at {})",
                refusing.id,
                b.now() - SignedDuration::from_secs(2)
            )
            .as_str()
        ),
        "{found:#?}"
    );
    assert!(
        found.contains(
            &"1 message in the hooks dead-letter queue: deliveries whose retries ran out"
        ),
        "{found:#?}"
    );
}

on_both_backends!(
    status_reads_overdue_heartbeats_failures_hooks_webhooks_and_tokens,
    reads_what_needs_attention
);

/// On SQS the dead letters are counted in the queue the redrive policy names, as the
/// stack's sessions queue has one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_backlog_counts_the_dead_letter_queue_its_redrive_policy_names() {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    use pulse_shared::adapters::aws::{AwsClients, SqsQueue, create_sessions_queue};
    use pulse_shared::ports::SessionQueue;
    let sqs = AwsClients::for_emulator(&pulse_tests::moto_url()).sqs;
    let dlq = create_sessions_queue(&sqs, &format!("{}.fifo", pulse_tests::unique("dlq")))
        .await
        .unwrap();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(&dlq)
        .attribute_names(A::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&A::QueueArn]
        .clone();
    let url = create_sessions_queue(&sqs, &format!("{}.fifo", pulse_tests::unique("q")))
        .await
        .unwrap();
    sqs.set_queue_attributes()
        .queue_url(&url)
        .attributes(
            A::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )
        .send()
        .await
        .unwrap();
    for (queue, n) in [(&url, 3), (&dlq, 2)] {
        for i in 0..n {
            sqs.send_message()
                .queue_url(queue)
                .message_body("{}")
                .message_group_id("g")
                .message_deduplication_id(format!("m{i}"))
                .send()
                .await
                .unwrap();
        }
    }
    let backlog = SqsQueue::new(sqs.clone(), &url).backlog().await.unwrap();
    assert_eq!(
        (backlog.waiting, backlog.in_flight, backlog.dead),
        (3, 0, Some(2))
    );
}

on_both_backends!(
    a_heartbeat_running_for_minutes_is_reported_with_when_it_is_retried,
    stuck
);
async fn stuck(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("slowpoke", "1h").await;
    // Claimed (its job queued, never run: a worker that stopped).
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(swept.claimed, 1);
    let running = b.store.list_heartbeats(&agent.id, 1).await.unwrap()[0].clone();
    let until = running.lease_until.unwrap();
    b.advance(SignedDuration::from_mins(4));
    assert!(
        read(&b).await.findings.is_empty(),
        "four minutes is not stuck"
    );
    b.advance(SignedDuration::from_mins(2));
    let s = read(&b).await;
    assert_eq!(
        whats(&s),
        [format!(
            "agent slowpoke: heartbeat 1 has run since {} (over 5m); if its worker stopped, it is retried when its lease ends at {until}",
            running.started_at.unwrap()
        )]
    );
    assert_eq!(
        s.findings[0].look,
        format!("pulse heartbeats show {}", running.id())
    );
}

on_both_backends!(
    heartbeats_that_wait_for_a_worker_are_reported_late_and_a_held_back_one_is_not,
    late_starts
);
/// Seven agents due at once and one worker that takes a second a job (an injected
/// clock): each heartbeat is claimed on time — the sweep's lateness reads 0 — but starts
/// a second later than the one before. The status counts those that started more than
/// two sweep intervals after due; the heartbeat of the agent its user just talked to,
/// held back to the end of its quiet period, is not late.
async fn late_starts(kind: Kind) {
    let b = Backend::new(kind).await;
    let mut agents = Vec::new();
    for i in 0..6 {
        agents.push(b.agent(&format!("busy{i}"), "1m").await.0);
    }
    // The user just talked to this one: its heartbeat, claimed with the others, is
    // held back to the end of its quiet period when its run begins.
    let (sleepy, _) = b.agent("sleepy", "1m").await;
    b.store
        .record_interaction(&sleepy.id, b.now())
        .await
        .unwrap();
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(swept.claimed, 7);
    assert_eq!(swept.lateness_max_ms, 0, "claimed when due");
    let worker = b.worker(settings());
    let mut ran = 0;
    while ran < 7 {
        b.advance(SignedDuration::from_secs(1));
        let r = worker
            .poll_once(b.queue.as_ref(), 1, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert!(r.received > 0, "a job for each of the seven");
        ran += r.received;
    }
    // Each ran agent's record says how late it started: 1 s to 7 s, one of them the
    // held back agent's slot (no start).
    let mut delays = Vec::new();
    for a in &agents {
        let hb = b.store.list_heartbeats(&a.id, 5).await.unwrap();
        let first = hb.iter().find(|h| h.beat == 1).unwrap();
        let ran = first.ran_at.expect("its run started");
        delays.push(ran.duration_since(first.scheduled_at).as_secs());
    }
    let held = b.store.list_heartbeats(&sleepy.id, 5).await.unwrap();
    assert!(held.iter().all(|h| h.ran_at.is_none()), "{held:?}");
    assert!(
        held.iter().any(|h| h.scheduled_at > b.now()),
        "deferred to the quiet period's end: {held:?}"
    );
    delays.sort_unstable();
    let late = delays.iter().filter(|d| **d > 2).count();
    assert!(late >= 4, "{delays:?}");
    let s = read_every(&b, SignedDuration::from_secs(1)).await;
    assert_eq!(s.late_starts, late, "{delays:?}");
    assert_eq!(s.start_delay_max_ms as i64, delays[5] * 1_000);
    let finding = whats(&s)
        .into_iter()
        .find(|w| w.contains("started more than 2s after"))
        .unwrap_or_else(|| panic!("{:?}", s.findings));
    assert!(
        finding.starts_with(&format!("{late} agents' latest heartbeats")),
        "{finding}"
    );
    assert!(
        finding.contains(&format!("{}s late", delays[5])),
        "{finding}"
    );
    // The same agents with a one-minute sweep: within two sweep intervals, no finding.
    let s = read(&b).await;
    assert_eq!(s.late_starts, 0);
    assert!(!whats(&s).iter().any(|w| w.contains("started more than")));
    // An hour on, with nothing run since, those starts are history: not reported.
    b.advance(SignedDuration::from_mins(61));
    let s = read_every(&b, SignedDuration::from_secs(1)).await;
    assert_eq!((s.late_starts, s.start_delay_max_ms), (0, 0));
}
