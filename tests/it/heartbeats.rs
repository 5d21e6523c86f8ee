//! The heartbeat path end to end, on both backends: sweep → queue → worker → tools over
//! HTTP on loopback → finish and schedule.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{
    ActionStatus, Agent, Delivery, EventType, Filter, HeartbeatId, HeartbeatStatus, SessionTask,
    TaskEnvelope, ToolName,
};
use pulse_shared::engine::{EngineSettings, RunOutcome, Worker};
use pulse_tests::{
    Backend, FakeTool, Kind, Reply, closed_port_url, ok_with_events, on_both_backends, settings,
};
use serde_json::json;

/// Sweeps now, then runs every queued job.
async fn beat(b: &Backend) -> usize {
    let report = b.sweeper(settings()).sweep_once(b.now()).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    b.drain(&b.worker(settings())).await
}

fn job_of(d: &Delivery) -> pulse_shared::domain::Heartbeat {
    match TaskEnvelope::decode(&d.body).unwrap().task {
        SessionTask::Heartbeat(j) => j.heartbeat,
        other => panic!("expected a heartbeat job, got {other:?}"),
    }
}

on_both_backends!(
    a_worker_that_dies_mid_heartbeat_is_replaced_without_losing_or_repeating_events,
    dead_worker
);
async fn dead_worker(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("worker-tool", &tool.url(), "WORK").await;
    // It keys its work by the action id: the run after the dead one may call it again
    // (a tool that is not idempotent is left UNKNOWN instead: tests/it/side_effects.rs).
    let name = pulse_shared::domain::ToolName::parse("worker-tool").unwrap();
    let mut registered = b.store.load_registry().await.unwrap().tools;
    registered.retain(|t| t.name == name);
    registered[0].idempotent = true;
    b.store.update_tool(&registered[0]).await.unwrap();
    let (agent, first) = b.agent("scout", "15m").await;
    let e1 = b.emit(&agent, "WORK", json!({"n": 1})).await;
    let e2 = b.emit(&agent, "WORK", json!({"n": 2})).await;
    b.advance(SignedDuration::from_secs(10));

    // The tool answers e1 and hangs on e2: the worker is killed while waiting.
    let hang_on = e2.id.to_string();
    tool.set(move |req| {
        if req["event"]["id"] == hang_on.as_str() {
            Reply::Hang
        } else {
            ok_with_events(json!([]))
        }
    });
    b.sweeper(settings()).sweep_once(b.now()).await;
    let job1 = b
        .queue
        .receive(10, Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let runner = b.runner(settings());
    let hb = job_of(&job1);
    let dying = tokio::spawn(async move { runner.run(&hb).await });
    tool.wait_for(2).await;
    dying.abort();
    let _ = dying.await;

    // The lease expires; a sweep reclaims the heartbeat under a new claim.
    b.advance(SignedDuration::from_mins(11));
    let report = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!((report.claimed, report.queued), (1, 1));
    // The dead worker's message becomes visible again (its visibility timeout passes).
    b.queue
        .release(&job1.receipt, Duration::ZERO)
        .await
        .unwrap();
    tool.set(|_| ok_with_events(json!([])));
    assert_eq!(
        b.drain(&b.worker(settings())).await,
        2,
        "the stale job and the reclaim's job"
    );

    let done = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Completed);
    assert_eq!(done.claim, 2);
    let actions = b.store.list_actions(&agent.id, 100).await.unwrap();
    assert_eq!(actions.len(), 2, "one action per event");
    assert!(
        actions.iter().all(|a| a.status == ActionStatus::Completed),
        "{actions:#?}"
    );
    let calls: Vec<String> = tool.event_ids();
    assert_eq!(
        calls.iter().filter(|id| **id == e1.id.as_str()).count(),
        1,
        "e1's finished action was reused"
    );
    // e2's tool call was in flight when the worker died: retried once, same action id.
    let e2_calls: Vec<_> = tool
        .requests()
        .into_iter()
        .filter(|r| r["event"]["id"] == e2.id.as_str())
        .collect();
    assert_eq!(e2_calls.len(), 2);
    assert_eq!(e2_calls[0]["action_id"], e2_calls[1]["action_id"]);
    assert_eq!(
        (
            e2_calls[0]["attempt"].as_u64(),
            e2_calls[1]["attempt"].as_u64()
        ),
        (Some(1), Some(2))
    );

    // The next heartbeat sees neither event again.
    b.advance(SignedDuration::from_mins(16));
    assert_eq!(beat(&b).await, 1);
    assert_eq!(tool.requests().len(), 3);
    assert_eq!(
        b.heartbeats(&agent.id).await[1].status,
        HeartbeatStatus::Completed
    );
}

on_both_backends!(
    events_emitted_while_a_heartbeat_runs_are_processed_by_the_next_one_exactly_once,
    events_during_run
);
async fn events_during_run(kind: Kind) {
    let b = Backend::new(kind).await;
    // A tool on HEARTBEAT holds the first heartbeat open until the test lets it go; a
    // recorder sees NOTEs.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let slow = FakeTool::answering(move |_| {
        Reply::After(held.clone(), Box::new(ok_with_events(json!([]))))
    })
    .await;
    let notes = FakeTool::start().await;
    b.tool("slow", &slow.url(), "HEARTBEAT").await;
    b.tool("notes", &notes.url(), "NOTE").await;
    let (agent, _) = b.agent("scout", "1m").await;
    let early = b.emit(&agent, "NOTE", json!({"n": "early"})).await;
    b.advance(SignedDuration::from_secs(10));
    // Stamped inside the settle margin before the claim: it belongs to the next window.
    let racing = b.emit(&agent, "NOTE", json!({"n": "racing"})).await;
    b.advance(SignedDuration::from_secs(1));

    b.sweeper(settings()).sweep_once(b.now()).await;
    let worker = Arc::new(b.worker(settings()));
    let queue = b.queue.clone();
    let running = {
        let worker = worker.clone();
        tokio::spawn(async move {
            worker
                .poll_once(queue.as_ref(), 10, Duration::from_secs(60))
                .await
        })
    };
    slow.wait_for(1).await;
    let mut during = Vec::new();
    for i in 0..3 {
        during.push(b.emit(&agent, "NOTE", json!({"n": i})).await);
    }
    gate.add_permits(1);
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(report.received, 1);

    let first_round: Vec<String> = notes.event_ids();
    assert_eq!(
        first_round,
        vec![early.id.to_string()],
        "only the event before the window end"
    );

    b.advance(SignedDuration::from_mins(2));
    gate.add_permits(10);
    assert_eq!(beat(&b).await, 1);
    let mut second_round: Vec<String> = notes.event_ids()[1..].to_vec();
    second_round.sort();
    let mut want: Vec<String> = during
        .iter()
        .map(|e| e.id.to_string())
        .chain([racing.id.to_string()])
        .collect();
    want.sort();
    assert_eq!(
        second_round, want,
        "the racing event and the three emitted during the run"
    );

    b.advance(SignedDuration::from_mins(2));
    assert_eq!(beat(&b).await, 1);
    assert_eq!(notes.requests().len(), 5, "nothing processed twice");
    let hbs = b.heartbeats(&agent.id).await;
    assert_eq!(
        hbs.iter()
            .filter(|h| h.status == HeartbeatStatus::Completed)
            .count(),
        3
    );
}

on_both_backends!(
    a_cascade_runs_within_one_heartbeat_and_a_loop_stops_at_the_depth_cap,
    cascades
);
async fn cascades(kind: Kind) {
    let b = Backend::new(kind).await;
    let a_to_b =
        FakeTool::answering(|_| ok_with_events(json!([{"type": "B", "payload": {"from": "a"}}])))
            .await;
    let b_to_c =
        FakeTool::answering(|_| ok_with_events(json!([{"event_type": "C", "priority": 2}]))).await;
    let c_sink = FakeTool::start().await;
    let looper = FakeTool::answering(|_| ok_with_events(json!([{"type": "LOOP"}]))).await;
    b.tool("a-to-b", &a_to_b.url(), "A").await;
    b.tool("b-to-c", &b_to_c.url(), "B").await;
    b.tool("c-sink", &c_sink.url(), "C").await;
    b.tool("looper", &looper.url(), "LOOP").await;
    let (agent, first) = b.agent("scout", "15m").await;
    let a = b.emit(&agent, "A", json!({})).await;
    let l = b.emit(&agent, "LOOP", json!({})).await;
    b.advance(SignedDuration::from_secs(5));
    assert_eq!(beat(&b).await, 1);

    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Completed);
    // A, B, C; LOOP at depths 0..=3; HEARTBEAT.
    assert_eq!(hb.events_processed, 3 + 4 + 1);
    assert_eq!(hb.actions_triggered, 3 + 4);
    assert_eq!(hb.cascade_capped, 1);
    assert_eq!(
        looper.requests().len(),
        4,
        "the loop ran to the cap and stopped"
    );

    let c_event = &c_sink.requests()[0]["event"];
    assert_eq!(c_event["priority"], 2);
    let events = b.store.list_events(&agent.id, 100).await.unwrap();
    let by_id: HashMap<String, &pulse_shared::domain::Event> =
        events.iter().map(|e| (e.id.to_string(), e)).collect();
    let c = by_id[c_event["id"].as_str().unwrap()];
    let b_ev = by_id[c.parent_id.as_ref().unwrap().as_str()];
    assert_eq!(b_ev.event_type.as_str(), "B");
    assert_eq!(b_ev.parent_id.as_ref(), Some(&a.id));
    assert_eq!(c.cascade.as_ref().unwrap().heartbeat_id, first.id());
    assert_eq!(c.cascade.as_ref().unwrap().depth, 2);
    assert_eq!(c.source, "tool:b-to-c");
    let capped: Vec<_> = events
        .iter()
        .filter(|e| e.cascade.as_ref().is_some_and(|c| c.capped))
        .collect();
    assert_eq!(capped.len(), 1);
    assert_eq!(capped[0].cascade.as_ref().unwrap().depth, 4);
    let mut chain = capped[0].clone();
    while let Some(p) = chain.parent_id.clone() {
        chain = by_id[p.as_str()].clone();
    }
    assert_eq!(
        chain.id, l.id,
        "the capped event traces back to the first LOOP"
    );

    // Nothing of the cascade is processed again.
    b.advance(SignedDuration::from_mins(16));
    assert_eq!(beat(&b).await, 1);
    assert_eq!(looper.requests().len(), 4);
    assert_eq!(c_sink.requests().len(), 1);
}

on_both_backends!(
    a_failing_tool_fails_its_action_and_the_heartbeat_still_completes,
    failing_tools
);
async fn failing_tools(kind: Kind) {
    let b = Backend::new(kind).await;
    let hang = FakeTool::answering(|_| Reply::Hang).await;
    let error = FakeTool::answering(|_| Reply::Raw(500, "database on fire")).await;
    let garbage = FakeTool::answering(|_| Reply::Raw(200, "<html>hi</html>")).await;
    let zero = FakeTool::answering(|_| ok_with_events(json!([{"type": "X", "priority": 0}]))).await;
    let refuses = FakeTool::answering(|_| {
        Reply::Json(200, json!({"success": false, "error": "quota exceeded"}))
    })
    .await;
    let fine = FakeTool::start().await;
    let closed = closed_port_url().await;
    let add = |name: &'static str, url: String, timeout: Duration| {
        let b = &b;
        async move {
            b.tool_with(name, &url, timeout, "JOB", 0, Filter::default())
                .await
        }
    };
    add("down", closed, Duration::from_secs(5)).await;
    add("hangs", hang.url(), Duration::from_millis(300)).await;
    add("errors", error.url(), Duration::from_secs(5)).await;
    add("garbage", garbage.url(), Duration::from_secs(5)).await;
    add("zero", zero.url(), Duration::from_secs(5)).await;
    add("refuses", refuses.url(), Duration::from_secs(5)).await;
    add("fine", fine.url(), Duration::from_secs(5)).await;
    let (agent, first) = b.agent("scout", "15m").await;
    b.emit(&agent, "JOB", json!({})).await;
    b.advance(SignedDuration::from_secs(5));
    assert_eq!(beat(&b).await, 1);

    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Completed);
    assert_eq!((hb.actions_triggered, hb.actions_failed), (7, 6));
    let actions = b.store.list_actions(&agent.id, 100).await.unwrap();
    let error_of = |tool: &str| {
        let a = actions.iter().find(|a| a.tool.as_str() == tool).unwrap();
        assert_eq!(
            a.status,
            match tool {
                "fine" => ActionStatus::Completed,
                // Sent, and no answer: it may have done its work.
                "hangs" => ActionStatus::Unknown,
                _ => ActionStatus::Failed,
            }
        );
        a.error.clone().unwrap_or_default()
    };
    assert!(
        error_of("down").contains("unreachable"),
        "{}",
        error_of("down")
    );
    assert!(
        error_of("hangs").contains("did not answer within"),
        "{}",
        error_of("hangs")
    );
    assert!(
        error_of("errors").contains("HTTP 500") && error_of("errors").contains("database on fire")
    );
    assert!(
        error_of("garbage").contains("not JSON"),
        "{}",
        error_of("garbage")
    );
    assert!(
        error_of("zero").contains("priority"),
        "{}",
        error_of("zero")
    );
    assert_eq!(error_of("refuses"), "quota exceeded");
    assert_eq!(error_of("fine"), "");
    let errors_action = actions
        .iter()
        .find(|a| a.tool.as_str() == "errors")
        .unwrap();
    assert_eq!(errors_action.response.as_ref().unwrap()["status"], 500);
    // The malformed tool's event was not appended.
    assert!(
        b.store
            .list_events(&agent.id, 100)
            .await
            .unwrap()
            .iter()
            .all(|e| e.event_type.as_str() != "X")
    );

    let next = b
        .store
        .get_heartbeat(&first.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(
        next.scheduled_at,
        hb.completed_at
            .unwrap()
            .saturating_add(SignedDuration::from_mins(15))
            .unwrap()
    );
    assert_eq!(next.consecutive_failures, 0);
}

on_both_backends!(
    an_engine_failure_fails_the_heartbeat_and_the_next_one_retries_its_window,
    engine_failure
);
async fn engine_failure(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("recorder", &tool.url(), "JOB").await;
    let (agent, first) = b.agent("scout", "10m").await;
    let job = b.emit(&agent, "JOB", json!({})).await;
    b.advance(SignedDuration::from_secs(5));

    let (faulty, worker) = b.worker_failing("start_action");

    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    let failed = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(failed.status, HeartbeatStatus::Failed);
    assert!(
        failed.error.as_deref().unwrap().contains("injected"),
        "{:?}",
        failed.error
    );
    let next = b
        .store
        .get_heartbeat(&first.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(next.consecutive_failures, 1);
    assert_eq!(
        next.window_start, failed.window_start,
        "the window is handed on unprocessed"
    );
    assert_eq!(
        next.scheduled_at,
        failed
            .completed_at
            .unwrap()
            .saturating_add(SignedDuration::from_mins(10))
            .unwrap()
    );

    // A second failure in a row backs off: twice the interval.
    b.advance(SignedDuration::from_mins(10));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    let second = b.store.get_heartbeat(&next.id()).await.unwrap().unwrap();
    assert_eq!(second.status, HeartbeatStatus::Failed);
    let third = b
        .store
        .get_heartbeat(&next.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.consecutive_failures, 2);
    assert_eq!(
        third.scheduled_at,
        second
            .completed_at
            .unwrap()
            .saturating_add(SignedDuration::from_mins(20))
            .unwrap()
    );

    // Recovered: the event is processed once, and the beat goes on normally.
    faulty.policy().heal("start_action");
    b.advance(SignedDuration::from_mins(20));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    assert_eq!(tool.event_ids(), vec![job.id.to_string()]);
    let ok = b.store.get_heartbeat(&third.id()).await.unwrap().unwrap();
    assert_eq!(ok.status, HeartbeatStatus::Completed);
    assert_eq!(
        b.store
            .get_heartbeat(&third.next_id())
            .await
            .unwrap()
            .unwrap()
            .consecutive_failures,
        0
    );
}

on_both_backends!(
    a_job_delivered_twice_creates_no_duplicate_actions,
    duplicate_delivery
);
async fn duplicate_delivery(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("recorder", &tool.url(), "JOB").await;
    b.tool("on-beat", &tool.url(), "HEARTBEAT").await;
    let (agent, first) = b.agent("scout", "15m").await;
    b.emit(&agent, "JOB", json!({})).await;
    b.advance(SignedDuration::from_secs(5));
    b.sweeper(settings()).sweep_once(b.now()).await;
    let delivery = b
        .queue
        .receive(10, Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let worker = b.worker(settings());

    // The same message twice in one batch, then once more later.
    let outcome = worker
        .process_batch(&[delivery.clone(), delivery.clone()])
        .await;
    assert!(outcome.failed.is_empty());
    let outcome = worker.process_batch(std::slice::from_ref(&delivery)).await;
    assert!(outcome.failed.is_empty());
    let runner = b.runner(settings());
    assert_eq!(
        runner.run(&job_of(&delivery)).await.unwrap(),
        RunOutcome::AlreadyFinished
    );

    assert_eq!(tool.requests().len(), 2, "JOB and HEARTBEAT, once each");
    let actions = b.store.list_actions(&agent.id, 100).await.unwrap();
    assert_eq!(actions.len(), 2);
    let hbs = b.heartbeats(&agent.id).await;
    assert_eq!(hbs.len(), 2, "one completed heartbeat and one next");
    assert_eq!(hbs[0].id(), first.id());
    assert_eq!(hbs[0].actions_triggered, 2);
}

on_both_backends!(
    beats_count_heartbeats_and_the_beats_since_the_user_last_interacted,
    beats
);
async fn beats(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("on-beat", &tool.url(), "HEARTBEAT").await;
    let (agent, _) = b.agent("scout", "5m").await;
    for _ in 0..2 {
        assert_eq!(beat(&b).await, 1);
        b.advance(SignedDuration::from_mins(5));
    }
    b.store
        .record_interaction(&agent.id, b.now())
        .await
        .unwrap();
    // Past the quiet period (half the interval) that follows a user interaction.
    b.advance(SignedDuration::from_mins(3));
    for _ in 0..2 {
        assert_eq!(beat(&b).await, 1);
        b.advance(SignedDuration::from_mins(5));
    }
    let beats: Vec<(u64, u64)> = tool
        .requests()
        .iter()
        .map(|r| {
            let beats = &r["heartbeat"]["beats"];
            (
                beats["beat"].as_u64().unwrap(),
                beats["since_last"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(beats, vec![(1, 1), (2, 2), (3, 1), (4, 2)]);
    assert_eq!(tool.requests()[0]["event"]["type"], EventType::HEARTBEAT);
    assert_eq!(tool.requests()[0]["agent"]["name"], "scout");
    let hbs = b.heartbeats(&agent.id).await;
    assert_eq!(
        hbs.iter().map(|h| h.since_last).collect::<Vec<_>>()[..4],
        [Some(1), Some(2), Some(1), Some(2)]
    );
}

on_both_backends!(
    subscriptions_fire_only_when_active_and_their_filter_passes,
    filters
);
async fn filters(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    let urgent =
        Filter::parse(r#"{"min_priority": 3, "payload": {"repo.name": "pulse"}}"#).unwrap();
    b.tool_with(
        "urgent",
        &tool.url(),
        Duration::from_secs(5),
        "ISSUE",
        2,
        urgent,
    )
    .await;
    b.tool_with(
        "all-first",
        &tool.url(),
        Duration::from_secs(5),
        "ISSUE",
        1,
        Filter::default(),
    )
    .await;
    b.tool("disabled-tool", &tool.url(), "ISSUE").await;
    b.store
        .set_tool_active(&ToolName::parse("disabled-tool").unwrap(), false)
        .await
        .unwrap();
    b.tool("disabled-sub", &tool.url(), "OTHER").await;
    let sub = b
        .subscribe(
            &ToolName::parse("disabled-sub").unwrap(),
            "ISSUE",
            0,
            Filter::default(),
        )
        .await;
    b.store.set_subscription_active(&sub, false).await.unwrap();

    let (agent, _) = b.agent("scout", "15m").await;
    let emit = |priority: i64, repo: &'static str| {
        let b = &b;
        let agent = &agent;
        async move {
            let e = pulse_shared::domain::NewEvent::new(
                "ISSUE",
                json!({"repo": {"name": repo}}),
                Some(priority),
            )
            .unwrap()
            .into_event(agent.id.clone(), "test", b.now());
            b.store.append(&e).await.unwrap();
            e.id.to_string()
        }
    };
    let hit = emit(2, "pulse").await;
    let low = emit(7, "pulse").await;
    let elsewhere = emit(1, "other").await;
    b.advance(SignedDuration::from_secs(5));
    beat(&b).await;

    let mut calls: Vec<(String, String)> = b
        .store
        .list_actions(&agent.id, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.event_id.to_string(), a.tool.to_string()))
        .collect();
    calls.sort();
    let mut want = vec![
        (hit.clone(), "all-first".to_owned()),
        (hit.clone(), "urgent".to_owned()),
        (low, "all-first".to_owned()),
        (elsewhere, "all-first".to_owned()),
    ];
    want.sort();
    assert_eq!(calls, want);
    // Execution order: lower order first.
    let order: Vec<String> = tool
        .requests()
        .iter()
        .filter(|r| r["event"]["id"] == hit.as_str())
        .map(|r| r["action_id"].as_str().unwrap().to_owned())
        .collect();
    let first_tool = b
        .store
        .list_actions(&agent.id, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.id.as_str() == order[0])
        .unwrap()
        .tool;
    assert_eq!(first_tool.as_str(), "all-first");
}

on_both_backends!(
    a_failed_message_stops_its_group_but_not_other_groups,
    partial_batch
);
async fn partial_batch(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent_a, first_a) = b.agent("a", "15m").await;
    let (_agent_c, first_c) = b.agent("c", "15m").await;
    let (_agent_b, first_b) = b.agent("b", "15m").await;
    b.advance(SignedDuration::from_secs(5));
    b.sweeper(settings()).sweep_once(b.now()).await;
    let jobs = b.receive_all().await;
    let find = |id: &HeartbeatId| jobs.iter().find(|d| job_of(d).id() == *id).unwrap().clone();
    let a1 = find(&first_a.id());
    let mut a2 = a1.clone();
    a2.message_id = "a2".into();
    a2.body = "{\"v\": 1, \"kind\": \"no-such-task\"}".to_owned();
    let mut a3 = find(&first_c.id());
    a3.message_id = "a3".into();
    a3.group = a1.group.clone();
    let b1 = find(&first_b.id());

    let outcome = b
        .worker(settings())
        .process_batch(&[a1.clone(), a2, a3, b1])
        .await;
    assert_eq!(outcome.failed, vec!["a2".to_owned(), "a3".to_owned()]);
    let status = |id: HeartbeatId| {
        let b = &b;
        async move { b.store.get_heartbeat(&id).await.unwrap().unwrap().status }
    };
    assert_eq!(status(first_a.id()).await, HeartbeatStatus::Completed);
    assert_eq!(
        status(first_c.id()).await,
        HeartbeatStatus::Executing,
        "a3 never ran before a2"
    );
    assert_eq!(status(first_b.id()).await, HeartbeatStatus::Completed);
    let _ = agent_a;
}

/// A dead worker: under `pulse serve` its job once stayed hidden for a fixed
/// 300 s whatever the lease, and every expired lease queued another job behind it (15–16
/// superseded runs per recovery). Now a job is hidden for the lease, a reclaim queues one
/// job, and a job that waited renews its claim or steps aside without running anything.
async fn a_dead_workers_heartbeat_recovers_within_a_lease_and_a_tick_and_runs_once(kind: Kind) {
    let b = Backend::new(kind).await;
    let tool = FakeTool::start().await;
    b.tool("echo", &tool.url(), "HEARTBEAT").await;
    let (agent, first) = b.agent("scout", "1h").await;
    let s = settings();
    let lease = s.lease;
    let tick = SignedDuration::from_secs(1);
    let sweeper = b.sweeper(s.clone());
    let worker = b.worker(s.clone());
    let t0 = b.now();

    // Case 1: the sweeper reclaims before the dead job's message comes back.
    assert_eq!(sweeper.sweep_once(t0).await.queued, 1);
    let dead = b.queue.receive(10, lease.unsigned_abs()).await.unwrap();
    assert_eq!(dead.len(), 1, "a worker took the job, then died");
    b.advance(lease - SignedDuration::from_secs(1));
    assert_eq!(
        sweeper.sweep_once(b.now()).await.claimed,
        0,
        "the lease holds"
    );
    b.advance(SignedDuration::from_secs(1) + tick);
    assert_eq!(sweeper.sweep_once(b.now()).await.claimed, 1, "reclaimed");
    b.advance(tick);
    assert_eq!(
        sweeper.sweep_once(b.now()).await.claimed,
        0,
        "the new claim's lease is fresh: no second job"
    );
    assert_eq!(
        b.queued_messages().await,
        2,
        "one job behind the stuck one, not a pile"
    );
    // The dead job's message comes back (its visibility is the lease).
    b.queue
        .release(&dead[0].receipt, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(b.drain(&worker).await, 2);
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Completed);
    assert_eq!(hb.claim, 2);
    let recovered = hb.completed_at.unwrap().duration_since(t0);
    assert!(recovered <= lease + tick * 2, "{recovered:?}");
    assert_eq!(tool.requests().len(), 1, "the stale job stepped aside");
    assert_eq!(b.queued_messages().await, 0);

    // Case 2: the dead job's message comes back first: it renews its claim and runs;
    // the sweeper then has nothing to reclaim.
    b.advance(SignedDuration::from_hours(1));
    let t1 = b.now();
    assert_eq!(sweeper.sweep_once(t1).await.claimed, 1);
    let dead = b.queue.receive(10, lease.unsigned_abs()).await.unwrap();
    b.advance(lease + tick);
    b.queue
        .release(&dead[0].receipt, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(b.drain(&worker).await, 1);
    assert_eq!(sweeper.sweep_once(b.now()).await.claimed, 0);
    let hbs = b.heartbeats(&agent.id).await;
    let second = &hbs[1];
    assert_eq!(
        (second.status, second.claim),
        (HeartbeatStatus::Completed, 1)
    );
    assert!(second.completed_at.unwrap().duration_since(t1) <= lease + tick * 2);
    assert_eq!(tool.requests().len(), 2, "one run per heartbeat");
}
on_both_backends!(
    a_dead_workers_heartbeat_recovers_within_a_lease_and_a_tick_and_runs_once,
    a_dead_workers_heartbeat_recovers_within_a_lease_and_a_tick_and_runs_once
);

/// A worker that stops gives back the heartbeats whose jobs it never started.
async fn a_stopping_worker_releases_the_heartbeats_it_did_not_start(kind: Kind) {
    let b = Backend::new(kind).await;
    let (a, first_a) = b.agent("a", "1h").await;
    let (_, first_b) = b.agent("b", "1h").await;
    let sweeper = b.sweeper(settings());
    assert_eq!(sweeper.sweep_once(b.now()).await.queued, 2);
    // A user message queued too: it must stay for the next start.
    let signal = pulse_shared::domain::Signal::user_message(
        &a.id,
        &a.session,
        "hi",
        Default::default(),
        b.now(),
    )
    .unwrap();
    b.queue
        .send(&[pulse_shared::domain::OutgoingTask::signal(signal)])
        .await
        .unwrap();
    let released = b
        .worker(settings())
        .release_queued(b.queue.as_ref())
        .await
        .unwrap();
    assert_eq!(released, 2);
    for id in [first_a.id(), first_b.id()] {
        let hb = b.store.get_heartbeat(&id).await.unwrap().unwrap();
        assert_eq!(hb.status, HeartbeatStatus::Pending, "{id}");
        assert!(hb.lease_until.is_none());
    }
    assert_eq!(b.queued_messages().await, 1, "the signal is still queued");
    let left = b.receive_all().await;
    assert_eq!(left.len(), 1);
    assert!(matches!(
        TaskEnvelope::decode(&left[0].body).unwrap().task,
        SessionTask::Signal(_)
    ));
    // The next sweep claims them again at once.
    assert_eq!(sweeper.sweep_once(b.now()).await.claimed, 2);
}
on_both_backends!(
    a_stopping_worker_releases_the_heartbeats_it_did_not_start,
    a_stopping_worker_releases_the_heartbeats_it_did_not_start
);

/// An agent with active `hours` (UTC), a 1 h interval and an HTTP tool on HEARTBEAT.
async fn in_hours_agent(
    b: &Backend,
    hours: &str,
) -> (Agent, pulse_shared::domain::Heartbeat, FakeTool) {
    let tool = FakeTool::start().await;
    b.tool("clocked", &tool.url(), "HEARTBEAT").await;
    let mut new = pulse_shared::domain::NewAgent::named("office");
    new.interval = "1h".parse().unwrap();
    new.active_hours = Some(hours.parse().unwrap());
    let (agent, first) = new.create(b.now()).unwrap();
    b.store.create_agent(&agent, &first).await.unwrap();
    (agent, first, tool)
}

fn at(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

/// Active hours were once applied only after a completed heartbeat.
async fn every_due_time_falls_inside_the_active_hours(kind: Kind) {
    // A new agent, created after hours: its first heartbeat waits for the morning.
    let b = Backend::new(kind).await;
    b.clock.set(at("2026-03-02T23:00:00Z"));
    let (agent, first, tool) = in_hours_agent(&b, "08:00-22:00").await;
    assert_eq!(first.scheduled_at, at("2026-03-03T08:00:00Z"));
    assert_eq!(beat(&b).await, 0, "nothing due at night");

    // A backlog run that ends after hours: the rest waits for the morning too.
    b.clock.set(at("2026-03-03T08:00:00Z"));
    assert_eq!(beat(&b).await, 1);
    b.clock.set(at("2026-03-03T21:58:00Z"));
    for i in 0..3 {
        b.emit(&agent, "NOTE", json!({ "i": i })).await;
    }
    b.clock.set(at("2026-03-03T21:59:00Z"));
    let s = EngineSettings {
        max_window_events: 2,
        event_settle: SignedDuration::ZERO,
        ..settings()
    };
    let slow = b.runner(s.clone());
    // The tool takes two minutes: the run ends at 22:01.
    let clock = b.clock.clone();
    tool.set(move |_| {
        clock.advance(SignedDuration::from_mins(2));
        ok_with_events(json!([]))
    });
    assert_eq!(b.sweeper(s.clone()).sweep_once(b.now()).await.claimed, 1);
    b.drain(&Worker::new(slow)).await;
    let hbs = b.heartbeats(&agent.id).await;
    let next = hbs.last().unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(
        next.scheduled_at,
        at("2026-03-04T08:00:00Z"),
        "the backlog is due at once, but not outside the hours"
    );

    // The user talks at 21:50 with a 30-minute quiet period: not 22:20, but 08:00.
    let b = Backend::new(kind).await;
    b.clock.set(at("2026-03-02T21:40:00Z"));
    let (agent, first, tool) = in_hours_agent(&b, "08:00-22:00").await;
    assert_eq!(first.scheduled_at, at("2026-03-02T21:40:00Z"));
    b.store
        .record_interaction(&agent.id, at("2026-03-02T21:30:00Z"))
        .await
        .unwrap();
    beat(&b).await;
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(
        (hb.status, hb.scheduled_at),
        (HeartbeatStatus::Pending, at("2026-03-03T08:00:00Z"))
    );
    assert!(tool.requests().is_empty());

    // A heartbeat claimed late, after hours (the sweeper was down): it waits too.
    let b = Backend::new(kind).await;
    b.clock.set(at("2026-03-02T21:59:00Z"));
    let (_, first, tool) = in_hours_agent(&b, "22:00-06:00").await;
    assert_eq!(
        first.scheduled_at,
        at("2026-03-02T22:00:00Z"),
        "a window across midnight opens at 22:00"
    );
    b.clock.set(at("2026-03-03T07:30:00Z"));
    beat(&b).await;
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(
        (hb.status, hb.scheduled_at),
        (HeartbeatStatus::Pending, at("2026-03-03T22:00:00Z"))
    );
    assert!(tool.requests().is_empty(), "no tool runs outside the hours");
    b.clock.set(at("2026-03-03T22:00:00Z"));
    beat(&b).await;
    assert_eq!(tool.requests().len(), 1);
}
on_both_backends!(
    every_due_time_falls_inside_the_active_hours,
    every_due_time_falls_inside_the_active_hours
);

#[test]
fn a_new_agents_first_heartbeat_follows_its_time_zone_across_a_dst_change() {
    let mut new = pulse_shared::domain::NewAgent::named("berlin");
    new.active_hours = Some("08:00-22:00".parse().unwrap());
    new.timezone = pulse_shared::domain::TimeZoneName::parse("Europe/Berlin").unwrap();
    // 23:30 CET on the night the clocks go forward: 08:00 CEST is 06:00 UTC.
    let (_, first) = new.create(at("2026-03-28T22:30:00Z")).unwrap();
    assert_eq!(first.scheduled_at, at("2026-03-29T06:00:00Z"));
}

on_both_backends!(
    a_subscription_added_while_the_worker_runs_sees_the_next_event,
    new_subscription
);
async fn new_subscription(kind: Kind) {
    let b = Backend::new(kind).await;
    // One worker for the whole test: it caches the registry it reads.
    let worker = b.worker(settings());
    let beat = || async {
        let report = b.sweeper(settings()).sweep_once(b.now()).await;
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        b.drain(&worker).await
    };
    let (agent, _) = b.agent("scout", "1m").await;
    assert_eq!(
        beat().await,
        1,
        "a first heartbeat reads and caches the registry"
    );

    // A tool and its subscription arrive while the worker runs, then an event for it.
    let tool = FakeTool::start().await;
    b.tool("late-comer", &tool.url(), "NOTE").await;
    let note = b.emit(&agent, "NOTE", json!({"text": "hello"})).await;
    b.advance(SignedDuration::from_mins(1));
    assert_eq!(beat().await, 1);
    assert_eq!(
        tool.event_ids(),
        [note.id.to_string()],
        "the next heartbeat ran the new tool for the event"
    );

    // Switched off again: the next event is not sent to it.
    b.store
        .set_tool_active(&ToolName::parse("late-comer").unwrap(), false)
        .await
        .unwrap();
    b.emit(&agent, "NOTE", json!({"text": "again"})).await;
    b.advance(SignedDuration::from_mins(1));
    assert_eq!(beat().await, 1);
    assert_eq!(tool.event_ids().len(), 1, "a disabled tool is not called");
}

/// An agent whose tool `mailer` failed its action on an ORDER event: the tool (still
/// failing until told otherwise), the agent and the FAILED action.
async fn failed_mailer_action(
    b: &Backend,
) -> (
    FakeTool,
    pulse_shared::domain::Agent,
    pulse_shared::domain::Action,
) {
    let tool = FakeTool::answering(|_| Reply::Json(500, json!({"error": "down"}))).await;
    b.tool("mailer", &tool.url(), "ORDER").await;
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "ORDER", json!({"n": 1})).await;
    b.advance(SignedDuration::from_secs(10));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker(settings())).await;
    let failed = b.store.list_actions(&agent.id, 10).await.unwrap();
    let failed = failed
        .iter()
        .find(|a| a.tool.as_str() == "mailer")
        .unwrap()
        .clone();
    (tool, agent, failed)
}

/// The agent's next heartbeat reads `event`: a tool subscribed to its type is sent it.
async fn read_by_the_next_heartbeat(b: &Backend, event: &pulse_shared::domain::Event) {
    let logger = FakeTool::start().await;
    b.tool("logger", &logger.url(), event.event_type.as_str())
        .await;
    b.advance(SignedDuration::from_mins(16));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&b.worker(settings())).await;
    assert_eq!(logger.event_ids(), vec![event.id.to_string()]);
}

on_both_backends!(
    a_failed_action_is_retried_as_its_next_attempt_and_its_events_are_read_next,
    retry
);
async fn retry(kind: Kind) {
    let b = Backend::new(kind).await;
    let (tool, agent, failed) = failed_mailer_action(&b).await;
    assert_eq!((failed.status, failed.attempt), (ActionStatus::Failed, 1));

    // The tool is back: the retry is attempt 2 of the same action, with the same event.
    tool.set(|_| ok_with_events(json!([{"event_type": "SENT", "payload": {"to": "ana"}}])));
    let runner = b.runner(settings());
    let done = runner.retry_action(&agent.id, &failed.id).await.unwrap();
    assert_eq!(
        (done.id.clone(), done.status, done.attempt),
        (failed.id.clone(), ActionStatus::Completed, 2)
    );
    let asked = tool.requests();
    let last = asked.last().unwrap();
    assert_eq!(last["attempt"], 2);
    assert_eq!(
        last["event"]["id"], asked[0]["event"]["id"],
        "the request it was given"
    );
    let stored = b
        .store
        .get_action(&agent.id, &failed.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.status, stored.attempt, stored.new_events.len()),
        (ActionStatus::Completed, 2, 1)
    );
    let sent = b
        .store
        .get_events(&agent.id, &stored.new_events)
        .await
        .unwrap();
    assert_eq!(sent[0].event_type.as_str(), "SENT");
    assert_eq!(sent[0].parent_id.as_ref(), Some(&failed.event_id));
    // The next heartbeat reads what the retry returned: a tool on SENT runs.
    read_by_the_next_heartbeat(&b, &sent[0]).await;

    // A heartbeat agent's run is not retried this way, nor an unknown action.
    let unknown =
        pulse_shared::domain::ActionId::for_event(&failed.event_id, &"nope".parse().unwrap());
    let e = runner.retry_action(&agent.id, &unknown).await.unwrap_err();
    assert!(e.to_string().contains("has no action"), "{e}");
}

/// A retried action's outcome is written from outside the agent's session, so its
/// events keep the write deadline. When the write waits past it (here the clock moves
/// three seconds while the write waits for the store), nothing is written and the
/// outcome is written again with its events dated anew, instead of leaving the action
/// RUNNING where no retry could take it again; the next heartbeat reads the events.
#[tokio::test]
async fn a_retried_actions_outcome_that_came_too_late_is_dated_again_and_written() {
    use std::sync::atomic::{AtomicBool, Ordering};
    struct Stall {
        clock: Arc<pulse_shared::ports::ManualClock>,
        once: AtomicBool,
    }
    #[async_trait::async_trait]
    impl pulse_sim::StorePolicy for Stall {
        async fn before(&self, op: &'static str) -> Result<(), pulse_shared::error::StoreError> {
            if op == "finish_action" && self.once.swap(false, Ordering::SeqCst) {
                self.clock.advance(SignedDuration::from_secs(3));
            }
            Ok(())
        }
    }
    let b = Backend::new(Kind::Sqlite).await;
    let (tool, agent, failed) = failed_mailer_action(&b).await;

    tool.set(|_| ok_with_events(json!([{"event_type": "SENT", "payload": {}}])));
    let stalling = Arc::new(pulse_sim::FaultyStore::new(
        b.store.clone(),
        Arc::new(Stall {
            clock: b.clock.clone(),
            once: AtomicBool::new(true),
        }),
    ));
    let runner = b.runner_with(
        stalling,
        Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        settings(),
    );
    let before = b.now();
    let done = runner.retry_action(&agent.id, &failed.id).await.unwrap();
    assert_eq!((done.status, done.attempt), (ActionStatus::Completed, 2));
    let stored = b
        .store
        .get_action(&agent.id, &failed.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.status, stored.new_events.len()),
        (ActionStatus::Completed, 1)
    );
    let sent = b
        .store
        .get_events(&agent.id, &stored.new_events)
        .await
        .unwrap();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].id.timestamp_ms() as i64
            >= (before + SignedDuration::from_secs(3)).as_millisecond(),
        "dated after the stall, not before it"
    );
    // The next heartbeat reads it.
    read_by_the_next_heartbeat(&b, &sent[0]).await;
}

/// An event stamped before a window's end but committed after the window was read would
/// land behind it, read by no heartbeat. On SQLite nothing bounds how long a write waits
/// for the file (a stalled disk, another process holding it), so an event from outside
/// the agent's session is refused when its commit comes later than the write deadline
/// after its stamp; sent again, it is stamped anew and read by the next heartbeat.
/// (On AWS the same bound is the event writes' operation timeout, on real time.)
#[tokio::test]
async fn an_event_committed_after_a_window_passed_its_stamp_is_refused_not_lost() {
    use pulse_shared::adapters::sqlite::{Db, SqliteStore};
    use pulse_shared::domain::NewEvent;
    use pulse_shared::ports::EventLog;
    let b = Backend::new(Kind::Sqlite).await;
    let tool = FakeTool::start().await;
    b.tool("reader", &tool.url(), "NOTE").await;
    let (agent, _) = b.agent("scout", "5m").await;
    let note = |n: u32| {
        NewEvent::new("NOTE", json!({"n": n}), None)
            .unwrap()
            .into_event(agent.id.clone(), "test", b.now())
    };
    // Stamped now, held up on its way to the file while a heartbeat comes and goes.
    let stalled = note(1);
    b.advance(SignedDuration::from_mins(5));
    assert_eq!(beat(&b).await, 1);
    let why = pulse_shared::error::chain(&b.store.append(&stalled).await.unwrap_err());
    assert!(
        why.contains("waited 300.0s") && why.contains("send it again"),
        "{why}"
    );
    // What the deadline prevents: written all the same (a store without one), the
    // event sits behind a window already read, and no heartbeat ever reads it.
    let unbounded = SqliteStore::new(Db::open(b.sqlite_file().unwrap()).unwrap());
    unbounded.append(&stalled).await.unwrap();
    for _ in 0..2 {
        b.advance(SignedDuration::from_mins(5));
        assert_eq!(beat(&b).await, 1);
    }
    assert!(tool.event_ids().is_empty(), "{:?}", tool.event_ids());
    // Written again by a store with the deadline, it is there already: not refused.
    b.store.append(&stalled).await.unwrap();
    // Sent again, stamped anew: the next heartbeat reads it.
    let again = note(1);
    b.store.append(&again).await.unwrap();
    b.advance(SignedDuration::from_mins(5));
    assert_eq!(beat(&b).await, 1);
    assert_eq!(tool.event_ids(), vec![again.id.to_string()]);
    // In its own session, a heartbeat's reminders are dated back into its window:
    // written however late, since that heartbeat reads them after writing them.
    let dated_back = note(2);
    b.advance(SignedDuration::from_mins(1));
    b.store.append_in_session(&dated_back).await.unwrap();
}
