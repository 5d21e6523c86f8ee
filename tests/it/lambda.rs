//! The Lambda handlers with the payloads Lambda really sends: an EventBridge scheduled
//! event (fixture) and an SQS FIFO batch, and the partial batch response they return.

use jiff::SignedDuration;
use pulse_shared::domain::{Delivery, HeartbeatId, HeartbeatStatus, SessionTask, TaskEnvelope};
use pulse_shared::lambda;
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};

/// An SQS record as Lambda's event source mapping delivers it from a FIFO queue.
fn sqs_record(d: &Delivery, id: &str, group: &str) -> Value {
    json!({
        "messageId": id,
        "receiptHandle": d.receipt,
        "body": d.body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1772442000000",
            "SequenceNumber": "18849496460467696128",
            "MessageGroupId": group,
            "SenderId": "AIDAIO23YVJENQZJOL4VO",
            "MessageDeduplicationId": "dedup",
            "ApproximateFirstReceiveTimestamp": "1772442000001"
        },
        "messageAttributes": {},
        "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:pulse-sessions.fifo",
        "awsRegion": "us-east-1"
    })
}

on_both_backends!(a_scheduled_event_sweeps_due_heartbeats, scheduled);
async fn scheduled(kind: Kind) {
    let b = Backend::new(kind).await;
    let (_, first) = b.agent("scout", "15m").await;
    let event =
        serde_json::from_str(include_str!("../fixtures/eventbridge-scheduled.json")).unwrap();
    let report = lambda::sweep(&b.sweeper(settings()), event, b.now())
        .await
        .unwrap();
    assert_eq!((report.claimed, report.queued), (1, 1));
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Executing);
}

on_both_backends!(
    the_daily_scheduled_event_runs_the_retention_pass,
    daily_retention
);
async fn daily_retention(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    // A month without a word from its user would auto-pause it: not what this is about.
    let mut kept_on = agent.clone();
    kept_on.auto_pause_after = Some(pulse_shared::domain::AutoPause::Off);
    b.store.update_agent(&kept_on, &agent).await.unwrap();
    let worker = b.worker(settings());
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    b.advance(SignedDuration::from_hours(31 * 24));
    b.sweeper(settings()).sweep_once(b.now()).await;
    b.drain(&worker).await;
    // The template's daily event: the sweep's, with its own detail-type.
    let mut event: Value =
        serde_json::from_str(include_str!("../fixtures/eventbridge-scheduled.json")).unwrap();
    let sweep = serde_json::from_value(event.clone()).unwrap();
    assert!(!lambda::is_retention(&sweep));
    event["detail-type"] = json!(lambda::RETENTION_DETAIL_TYPE);
    assert!(lambda::is_retention(
        &serde_json::from_value(event).unwrap()
    ));
    let report = lambda::retention(
        b.store.as_ref(),
        b.queue.as_ref(),
        "30d".parse().unwrap(),
        b.now(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            report.retention.agents,
            report.retention.pruned.heartbeats,
            report.consolidations_queued
        ),
        (1, 1, 1),
        "{report:?}"
    );
    let left = b.store.list_heartbeats(&agent.id, 10).await.unwrap();
    assert_eq!(
        left.len(),
        2,
        "the second heartbeat and the pending third: {left:?}"
    );
}

on_both_backends!(
    an_sqs_batch_reports_the_failed_message_and_the_rest_of_its_group,
    sqs_batch
);
async fn sqs_batch(kind: Kind) {
    let b = Backend::new(kind).await;
    let (_, first_a) = b.agent("a", "15m").await;
    let (_, first_b) = b.agent("b", "15m").await;
    b.advance(SignedDuration::from_secs(5));
    b.sweeper(settings()).sweep_once(b.now()).await;
    let jobs = b
        .queue
        .receive(10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let job = |id: HeartbeatId| {
        jobs.iter()
            .find(|d| match TaskEnvelope::decode(&d.body).unwrap().task {
                SessionTask::Heartbeat(j) => j.heartbeat.id() == id,
                _ => false,
            })
            .unwrap()
            .clone()
    };
    let (a1, b1) = (job(first_a.id()), job(first_b.id()));
    let mut poison = a1.clone();
    poison.body = "not json".into();
    let event = json!({ "Records": [
        sqs_record(&poison, "a-poison", &a1.group),
        sqs_record(&a1, "a-1", &a1.group),
        sqs_record(&b1, "b-1", &b1.group),
    ]});
    let response = lambda::sessions_batch(
        &b.worker(settings()),
        serde_json::from_value(event).unwrap(),
    )
    .await;
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({ "batchItemFailures": [{ "itemIdentifier": "a-poison" }, { "itemIdentifier": "a-1" }] })
    );
    let status = |id| {
        let b = &b;
        async move { b.store.get_heartbeat(&id).await.unwrap().unwrap().status }
    };
    assert_eq!(
        status(first_a.id()).await,
        HeartbeatStatus::Executing,
        "a-1 waits behind the poison message"
    );
    assert_eq!(status(first_b.id()).await, HeartbeatStatus::Completed);
}
