//! The sessions queue's conformance suite: FIFO per group, the group lock, deduplication
//! and redelivery, on SQS FIFO (moto) and on the embedded queue.

use std::collections::HashMap;
use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::adapters::sqlite::{Db, SqliteQueue};
use pulse_shared::domain::{
    AgentId, EventCursor, Heartbeat, HeartbeatStatus, NewAgent, OutgoingTask, Receipt, SessionId,
    SessionTask, TaskEnvelope,
};
use pulse_shared::ports::{Clock, SessionQueue, Settle};
use pulse_tests::{Backend, Kind, on_both_backends, test_clock};

/// A task in `group` whose beat number tells messages apart.
fn task(group: &str, beat: u64) -> OutgoingTask {
    let (agent, _) = NewAgent::named("q")
        .create(jiff::Timestamp::UNIX_EPOCH)
        .unwrap();
    let mut hb = Heartbeat::pending(
        &agent,
        beat,
        jiff::Timestamp::UNIX_EPOCH,
        EventCursor::origin(),
        0,
        None,
        0,
    );
    hb.session = SessionId::parse(group).unwrap();
    hb.status = HeartbeatStatus::Executing;
    hb.claim = 1;
    OutgoingTask::heartbeat(hb, None, None)
}

fn beat_of(body: &str) -> u64 {
    match TaskEnvelope::decode(body).unwrap().task {
        SessionTask::Heartbeat(j) => j.heartbeat.beat,
        other => panic!("expected a heartbeat job, got {other:?}"),
    }
}

const VIS: Duration = Duration::from_secs(60);

on_both_backends!(
    messages_of_a_group_come_in_order_while_groups_interleave,
    order
);
async fn order(kind: Kind) {
    let b = Backend::new(kind).await;
    let tasks = vec![
        task("a", 1),
        task("b", 1),
        task("a", 2),
        task("b", 2),
        task("a", 3),
        task("c", 1),
    ];
    assert!(b.queue.send(&tasks).await.unwrap().failed.is_empty());
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for _ in 0..20 {
        let batch = b.queue.receive(10, VIS).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for d in batch {
            seen.entry(d.group.clone())
                .or_default()
                .push(beat_of(&d.body));
            b.queue.ack(&d.receipt).await.unwrap();
        }
    }
    assert_eq!(seen["a"], vec![1, 2, 3]);
    assert_eq!(seen["b"], vec![1, 2]);
    assert_eq!(seen["c"], vec![1]);
}

on_both_backends!(
    a_group_is_locked_while_one_of_its_messages_is_in_flight,
    lock
);
async fn lock(kind: Kind) {
    let b = Backend::new(kind).await;
    b.queue.send(&[task("a", 1), task("a", 2)]).await.unwrap();
    b.queue.send(&[task("b", 1)]).await.unwrap();
    // Take a1 alone (one message per receive).
    let first = loop {
        let got = b.queue.receive(1, VIS).await.unwrap();
        let d = got.into_iter().next().expect("a message");
        if d.group == "a" {
            break d;
        }
        b.queue.ack(&d.receipt).await.unwrap();
    };
    assert_eq!(beat_of(&first.body), 1);
    // While a1 is in flight nothing more of group a is delivered; b is.
    let mut others = Vec::new();
    for _ in 0..3 {
        for d in b.queue.receive(10, VIS).await.unwrap() {
            others.push((d.group.clone(), beat_of(&d.body)));
            b.queue.ack(&d.receipt).await.unwrap();
        }
    }
    assert!(
        others.iter().all(|(g, _)| g != "a"),
        "group a leaked while locked: {others:?}"
    );
    b.queue.ack(&first.receipt).await.unwrap();
    let next = b.queue.receive(10, VIS).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!((next[0].group.as_str(), beat_of(&next[0].body)), ("a", 2));
}

on_both_backends!(a_repeated_deduplication_id_is_not_delivered_twice, dedup);
async fn dedup(kind: Kind) {
    let b = Backend::new(kind).await;
    let t = task("a", 7);
    b.queue.send(std::slice::from_ref(&t)).await.unwrap();
    b.queue.send(std::slice::from_ref(&t)).await.unwrap();
    let got = b.queue.receive(10, VIS).await.unwrap();
    assert_eq!(got.len(), 1);
    b.queue.ack(&got[0].receipt).await.unwrap();
    assert!(b.queue.receive(10, VIS).await.unwrap().is_empty());
}

on_both_backends!(
    a_dead_lettered_message_is_redriven_behind_its_group_and_received_afresh,
    redrive
);
async fn redrive(kind: Kind) {
    let b = Backend::new(kind).await;
    // A queue that dead-letters after two receives, as a deployment's does after five.
    let queue: std::sync::Arc<dyn SessionQueue> = match kind {
        Kind::Sqlite => std::sync::Arc::new(
            SqliteQueue::new(
                Db::open(b.sqlite_file().unwrap()).unwrap(),
                b.clock.clone() as std::sync::Arc<dyn Clock>,
            )
            .with_max_receives(2),
        ),
        Kind::Aws => {
            use aws_sdk_sqs::types::QueueAttributeName as A;
            let sqs = &b.aws.as_ref().unwrap().sqs;
            let name = format!("dead-{}", pulse_shared::entropy::ulid());
            let dlq = sqs
                .create_queue()
                .queue_name(format!("{name}-dlq.fifo"))
                .attributes(A::FifoQueue, "true")
                .send()
                .await
                .unwrap();
            let arn = sqs
                .get_queue_attributes()
                .queue_url(dlq.queue_url().unwrap())
                .attribute_names(A::QueueArn)
                .send()
                .await
                .unwrap()
                .attributes()
                .unwrap()[&A::QueueArn]
                .clone();
            let main = sqs
                .create_queue()
                .queue_name(format!("{name}.fifo"))
                .attributes(A::FifoQueue, "true")
                .attributes(A::ContentBasedDeduplication, "false")
                .attributes(
                    A::RedrivePolicy,
                    serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 2})
                        .to_string(),
                )
                .send()
                .await
                .unwrap();
            std::sync::Arc::new(pulse_shared::adapters::aws::SqsQueue::new(
                sqs.clone(),
                main.queue_url().unwrap(),
            ))
        }
    };
    queue.send(&[task("a", 1), task("a", 2)]).await.unwrap();
    for n in 1..=2 {
        let got = queue.receive(1, VIS).await.unwrap();
        assert_eq!((beat_of(&got[0].body), got[0].receive_count), (1, n));
        queue
            .release(&got[0].receipt, Duration::ZERO)
            .await
            .unwrap();
    }
    // Its receives spent, 1 goes to the dead letters and 2 comes.
    let got = queue.receive(10, VIS).await.unwrap();
    assert_eq!(
        got.iter().map(|d| beat_of(&d.body)).collect::<Vec<_>>(),
        [2]
    );
    queue.ack(&got[0].receipt).await.unwrap();
    assert_eq!(queue.backlog().await.unwrap().dead, Some(1));
    assert_eq!(queue.redrive(10).await.unwrap(), 1);
    assert_eq!(queue.backlog().await.unwrap().dead, Some(0));
    let got = queue.receive(10, VIS).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((beat_of(&got[0].body), got[0].receive_count), (1, 1));
    queue.ack(&got[0].receipt).await.unwrap();
    assert_eq!(
        queue.redrive(10).await.unwrap(),
        0,
        "nothing left to redrive"
    );
}

on_both_backends!(
    a_released_message_comes_back_first_with_its_receive_count,
    release
);
async fn release(kind: Kind) {
    let b = Backend::new(kind).await;
    b.queue.send(&[task("a", 1), task("a", 2)]).await.unwrap();
    let got = b.queue.receive(1, VIS).await.unwrap();
    assert_eq!(got[0].receive_count, 1);
    b.queue
        .release(&got[0].receipt, Duration::ZERO)
        .await
        .unwrap();
    let again = b.queue.receive(10, VIS).await.unwrap();
    assert_eq!(beat_of(&again[0].body), 1);
    assert_eq!(again[0].receive_count, 2);
    assert_eq!(again[0].message_id, got[0].message_id);
}

on_both_backends!(
    a_settled_batch_deletes_and_releases_each_message_as_told,
    settle
);
async fn settle(kind: Kind) {
    let b = Backend::new(kind).await;
    b.queue
        .send(&[task("a", 1), task("b", 1), task("c", 1), task("a", 2)])
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.extend(b.queue.receive(10, VIS).await.unwrap());
        if got.len() >= 4 {
            break;
        }
    }
    let mut groups: Vec<(&str, u64)> = got
        .iter()
        .map(|d| (d.group.as_str(), beat_of(&d.body)))
        .collect();
    groups.sort();
    assert_eq!(groups, vec![("a", 1), ("a", 2), ("b", 1), ("c", 1)]);
    let told: Vec<(Receipt, Settle)> = got
        .iter()
        .map(|d| {
            let settle = if d.group == "b" {
                Settle::Release(Duration::ZERO)
            } else {
                Settle::Delete
            };
            (d.receipt.clone(), settle)
        })
        .collect();
    b.queue.settle(&told).await.unwrap();
    // Only b1 is back, with a second receive; the others are gone.
    let mut next = Vec::new();
    for _ in 0..3 {
        next.extend(b.queue.receive(10, VIS).await.unwrap());
    }
    let after: Vec<(&str, u64, u32)> = next
        .iter()
        .map(|d| (d.group.as_str(), beat_of(&d.body), d.receive_count))
        .collect();
    assert_eq!(after, vec![("b", 1, 2)]);
    b.queue
        .settle(&[(next[0].receipt.clone(), Settle::Delete)])
        .await
        .unwrap();
    assert!(b.queue.settle(&[]).await.is_ok());
    assert!(b.queue.receive(10, VIS).await.unwrap().is_empty());
}

/// The embedded queue's own timing (SQS's is AWS's): with the injected clock.
#[tokio::test]
async fn an_unacknowledged_embedded_message_reappears_after_its_visibility_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let q = SqliteQueue::new(
        Db::open(&dir.path().join("q.db")).unwrap(),
        clock.clone() as std::sync::Arc<dyn Clock>,
    );
    q.send(&[task("a", 1), task("a", 2)]).await.unwrap();
    let first = q.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        first.len(),
        2,
        "both messages of the group come in one batch, in order"
    );
    clock.advance(SignedDuration::from_secs(29));
    assert!(
        q.receive(10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );
    clock.advance(SignedDuration::from_secs(2));
    let again = q.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        again.iter().map(|d| beat_of(&d.body)).collect::<Vec<_>>(),
        vec![1, 2]
    );
    // The old receipt no longer deletes anything.
    q.ack(&first[0].receipt).await.unwrap();
    assert_eq!(q.depth().await.unwrap(), 2);
}

#[tokio::test]
async fn an_embedded_message_received_too_often_is_dead_lettered_and_unblocks_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let q = SqliteQueue::new(
        Db::open(&dir.path().join("q.db")).unwrap(),
        clock.clone() as std::sync::Arc<dyn Clock>,
    )
    .with_max_receives(2);
    q.send(&[task("a", 1), task("a", 2)]).await.unwrap();
    for _ in 0..2 {
        let got = q.receive(1, Duration::from_secs(10)).await.unwrap();
        assert_eq!(beat_of(&got[0].body), 1);
        clock.advance(SignedDuration::from_secs(11));
    }
    let got = q.receive(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(beat_of(&got[0].body), 2);
    assert_eq!(q.dead_letters().await.unwrap(), 1);
}

#[tokio::test]
async fn the_embedded_dedup_window_is_five_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let q = SqliteQueue::new(
        Db::open(&dir.path().join("q.db")).unwrap(),
        clock.clone() as std::sync::Arc<dyn Clock>,
    );
    let t = task("a", 1);
    q.send(std::slice::from_ref(&t)).await.unwrap();
    clock.advance(SignedDuration::from_mins(4));
    q.send(std::slice::from_ref(&t)).await.unwrap();
    assert_eq!(q.depth().await.unwrap(), 1);
    clock.advance(SignedDuration::from_mins(2));
    q.send(std::slice::from_ref(&t)).await.unwrap();
    assert_eq!(q.depth().await.unwrap(), 2);
    let _ = AgentId::generate();
}

#[test]
fn a_database_syncs_every_commit_unless_it_is_told_to_relax() {
    use pulse_shared::config::Durability;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("d.db")).unwrap();
    assert_eq!(db.durability().unwrap(), Durability::Synced);
    let db = db.with_durability(Durability::Relaxed).unwrap();
    assert_eq!(db.durability().unwrap(), Durability::Relaxed);
    let db = db.with_durability(Durability::Synced).unwrap();
    assert_eq!(db.durability().unwrap(), Durability::Synced);
}
