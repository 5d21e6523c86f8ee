//! The AWS adapters under faults injected beneath the real SDK clients (throttling,
//! server errors, resets, and answers lost after the request was done), on the
//! emulator. Each test is a case the adapters must keep correct; the first written
//! failed before its fix.

use jiff::SignedDuration;
use pulse_shared::adapters::aws::faults::{Fault, FaultPlan};
use pulse_shared::domain::{ClaimRequest, EventCursor};
use pulse_tests::{Backend, Kind};

fn claim_req(b: &Backend) -> ClaimRequest {
    ClaimRequest {
        now: b.now(),
        lease: SignedDuration::from_mins(10),
        window_end: EventCursor::through(b.now()),
    }
}

/// A claim is a conditional write: sent again after its answer was lost, it fails its
/// own condition. Taken for another claimer's, the heartbeat was left claimed by no one
/// until its lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_still_its_claimers() {
    let b = Backend::new(Kind::Aws).await;
    let (_, first) = b.agent("scout", "15m").await;
    let plan = FaultPlan::new();
    let (store, _) = b.with_faults(plan.clone());
    plan.next("UpdateItem", Fault::LostAnswer);
    let claimed = store.claim(&first.id(), &claim_req(&b)).await.unwrap();
    assert_eq!(plan.met().get(&Fault::LostAnswer), Some(&1));
    assert!(plan.seen("UpdateItem") >= 2, "the SDK sent it again");
    let claimed = claimed.expect("the claim that was done is this claimer's");
    assert_eq!(claimed.claim, 1);
    // Anyone else still loses it.
    assert!(
        b.store
            .claim(&first.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_none()
    );
}

/// Throttling, server errors and resets are retried by the SDK: the claim goes through
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_meeting_throttling_errors_and_resets_goes_through_once() {
    let b = Backend::new(Kind::Aws).await;
    let (_, first) = b.agent("scout", "15m").await;
    let plan = FaultPlan::new();
    let (store, _) = b.with_faults(plan.clone());
    plan.next("UpdateItem", Fault::Throttled);
    plan.next("UpdateItem", Fault::ServerError);
    let claimed = store.claim(&first.id(), &claim_req(&b)).await.unwrap();
    assert_eq!(claimed.expect("claimed").claim, 1);
    plan.next("GetItem", Fault::Reset);
    let read = store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(read.claim, 1, "claimed once");
    assert_eq!(plan.met().values().sum::<u64>(), 3);
}

/// A job sent again after its answer was lost is queued once: the sessions queue is
/// FIFO with a deduplication id per job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sent_again_after_its_answer_was_lost_is_queued_once() {
    let b = Backend::new(Kind::Aws).await;
    b.agent("scout", "15m").await;
    let plan = FaultPlan::new();
    let (store, queue) = b.with_faults(plan.clone());
    plan.next("SendMessageBatch", Fault::LostAnswer);
    let sweeper = pulse_shared::engine::Sweeper::new(store, queue, pulse_tests::settings());
    let swept = sweeper.sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    assert_eq!(plan.met().get(&Fault::LostAnswer), Some(&1));
    assert_eq!(b.receive_all().await.len(), 1, "queued once");
}

/// A heartbeat's finish is one transaction: sent again after its answer was lost, its
/// conditions fail on what it wrote itself. The run must see it finished, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_whose_answer_was_lost_is_finished_once() {
    use pulse_shared::domain::HeartbeatStatus;
    let b = Backend::new(Kind::Aws).await;
    let (agent, first) = b.agent("scout", "15m").await;
    let swept = b.sweeper(pulse_tests::settings()).sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    let plan = FaultPlan::new();
    let (store, _) = b.with_faults(plan.clone());
    let runner = b.runner_with(
        store,
        std::sync::Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        pulse_tests::settings(),
    );
    plan.next("TransactWriteItems", Fault::LostAnswer);
    let worker = pulse_shared::engine::Worker::new(runner);
    let ran = worker
        .poll_once(b.queue.as_ref(), 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(plan.met().get(&Fault::LostAnswer), Some(&1));
    assert_eq!((ran.received, ran.failed), (1, 0), "the run saw its finish");
    let done = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Completed);
    let next = b
        .store
        .get_heartbeat(&first.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    let beats = b
        .store
        .query_events(&agent.id, &pulse_shared::ports::EventQuery::latest(100))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type.as_str() == "HEARTBEAT")
        .count();
    assert_eq!(beats, 1, "one HEARTBEAT event");
}

/// An action is recorded RUNNING (a conditional put) before its tool is called. Sent
/// again after its answer was lost, the put finds the record it made itself: taken for
/// a run that stopped mid-call, a tool that was never called was recorded UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_whose_start_was_answered_late_still_runs_its_tool_once() {
    use pulse_shared::domain::{ActionStatus, Filter};
    let b = Backend::new(Kind::Aws).await;
    let tool = pulse_tests::FakeTool::start().await;
    b.tool_with(
        "mailer",
        &tool.url(),
        std::time::Duration::from_secs(5),
        "SEND",
        0,
        Filter::default(),
    )
    .await;
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "SEND", serde_json::json!({"to": "ana"}))
        .await;
    b.advance(SignedDuration::from_mins(16));
    let swept = b.sweeper(pulse_tests::settings()).sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    let plan = FaultPlan::new();
    let (store, _) = b.with_faults(plan.clone());
    let runner = b.runner_with(
        store,
        std::sync::Arc::new(pulse_shared::tools::Tools::new(pulse_tests::test_egress())),
        pulse_tests::settings(),
    );
    plan.next("PutItem", Fault::LostAnswer);
    b.drain(&pulse_shared::engine::Worker::new(runner)).await;
    assert_eq!(plan.met().get(&Fault::LostAnswer), Some(&1));
    let actions = b.store.list_actions(&agent.id, 10).await.unwrap();
    let mail = actions
        .iter()
        .find(|a| a.tool.as_str() == "mailer")
        .unwrap();
    assert_eq!(mail.status, ActionStatus::Completed, "{mail:?}");
    assert_eq!(tool.requests().len(), 1, "called once");
}

/// A throttling storm: the client's retries (four attempts, from 50 ms) ride out three
/// throttled answers in a row; a fourth makes the call fail, saying why, rather than
/// wait on — the claim is then simply left for the next sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_storm_is_ridden_out_within_the_retry_budget_and_then_reported() {
    let b = Backend::new(Kind::Aws).await;
    let (_, first) = b.agent("scout", "15m").await;
    let plan = FaultPlan::new();
    let (store, _) = b.with_faults(plan.clone());
    for _ in 0..3 {
        plan.next("UpdateItem", Fault::Throttled);
    }
    let claimed = store.claim(&first.id(), &claim_req(&b)).await.unwrap();
    assert_eq!(
        claimed
            .expect("claimed after three throttled answers")
            .claim,
        1
    );
    assert_eq!(plan.seen("UpdateItem"), 4);

    let (_, second) = b.agent("other", "15m").await;
    for _ in 0..4 {
        plan.next("UpdateItem", Fault::Throttled);
    }
    let why = pulse_shared::error::chain(
        &store
            .claim(&second.id(), &claim_req(&b))
            .await
            .expect_err("four throttled answers spend the retries"),
    );
    assert!(why.contains("ProvisionedThroughputExceeded"), "{why}");
    assert_eq!(plan.seen("UpdateItem"), 8);
    // Nothing was claimed: the next sweep finds it due.
    assert!(
        b.store
            .claim(&second.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_some()
    );
}
