//! Tests at scale, in their own binary: cargo runs test binaries one after another, so
//! these (which keep the emulator busy for a while) never slow the functional suite down.

use std::collections::{BTreeMap, HashSet};

use jiff::SignedDuration;
use pulse_shared::domain::{HeartbeatId, HeartbeatStatus, NewAgent};
use pulse_shared::engine::{EngineSettings, Sweeper};
use pulse_tests::{Backend, Kind, on_both_backends, settings};

/// How many heartbeats the sweepers race for: a thousand, except on the emulator in the
/// default run, where a thousand take two minutes of its single thread (eight thousand
/// conditional writes) and 250 race on every heartbeat just the same. `./scripts/test.sh
/// --long` (`PULSE_TEST_LONG=1`) runs the thousand everywhere.
fn fleet_size(kind: Kind) -> usize {
    let long = std::env::var_os("PULSE_TEST_LONG").is_some_and(|v| v == "1");
    if kind == Kind::Aws && !long {
        250
    } else {
        1000
    }
}

on_both_backends!(
    eight_concurrent_sweepers_claim_each_heartbeat_exactly_once,
    concurrent_sweepers
);
async fn concurrent_sweepers(kind: Kind) {
    let b = Backend::new(kind).await;
    let n = fleet_size(kind);
    let fleet: Vec<_> = (0..n)
        .map(|i| {
            NewAgent::named(format!("agent-{i}"))
                .create(b.now())
                .unwrap()
        })
        .collect();
    b.store.import_agents(&fleet).await.unwrap();
    let now = b.now();
    let sweeps: Vec<_> = (0..8)
        .map(|_| {
            // Each sweeper has its own connection, as separate Lambda instances would.
            let (store, queue) = b.connect_again();
            // 8 × 4 claims in flight still race on every heartbeat; more would only
            // overflow the single-process emulator's connection backlog.
            let s = EngineSettings {
                claim_concurrency: 4,
                ..settings()
            };
            tokio::spawn(async move { Sweeper::new(store, queue, s).sweep_once(now).await })
        })
        .collect();
    let mut claimed = 0;
    let mut queued = 0;
    for s in sweeps {
        let r = s.await.unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        claimed += r.claimed;
        queued += r.queued;
    }
    assert_eq!(claimed, n, "the sweepers' wins add up to one per heartbeat");
    assert_eq!(queued, n);
    assert_eq!(b.queued_messages().await, n as u64);
    // Each heartbeat was claimed once: a second claim would have raised its claim number.
    for (_, first) in &fleet {
        let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
        assert_eq!(
            (hb.status, hb.claim),
            (HeartbeatStatus::Executing, 1),
            "{}",
            first.id()
        );
    }
    // A later sweep finds nothing: all are leased.
    assert_eq!(b.sweeper(settings()).sweep_once(b.now()).await.claimed, 0);
}

/// Requests per idle heartbeat cycle on AWS, counted by operation: the cost a user
/// prices. As deployed: a hooks queue, and the heartbeat agent on (the offline model),
/// which finds nothing to think about; a tenth of the agents have a hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_cycle_on_aws_costs_one_claim_one_window_read_and_two_one_unit_writes() {
    use pulse_shared::domain::{ActionStatus, Hook, HookTarget, HookType};
    let b = Backend::new(Kind::Aws).await;
    let n = 200;
    let hooked = 20;
    let fleet: Vec<_> = (0..n)
        .map(|i| NewAgent::named(format!("a{i}")).create(b.now()).unwrap())
        .collect();
    b.store.import_agents(&fleet).await.unwrap();
    for (agent, _) in fleet.iter().take(hooked) {
        let hook = Hook::new(
            agent.id.clone(),
            HookType::parse("HOOK_DISABLED").unwrap(),
            HookTarget::parse("https://example.com/pulse").unwrap(),
            "whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
            b.now(),
        );
        b.store.create_hook(&hook).await.unwrap();
    }
    b.advance(SignedDuration::from_secs(5));
    let counter = b.aws.as_ref().unwrap().counter.clone();
    let per = |ops: &BTreeMap<String, u64>, k: &str| *ops.get(k).unwrap_or(&0) as f64 / n as f64;

    counter.reset();
    let report = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(report.claimed, n);
    let sweep = counter.snapshot();
    assert_eq!(
        per(&sweep, "DynamoDB.UpdateItem"),
        1.0,
        "one claim each: {sweep:?}"
    );
    assert!(
        per(&sweep, "DynamoDB.Query") <= 0.1,
        "due-index queries amortised: {sweep:?}"
    );
    assert!(
        per(&sweep, "SQS.SendMessageBatch") <= 0.1,
        "sends amortised: {sweep:?}"
    );

    let jobs = b.receive_all().await;
    assert_eq!(jobs.len(), n);
    let worker = b.connected().worker(
        b.clock.clone(),
        &settings(),
        &pulse_tests::offline_services(),
    );
    counter.reset();
    let outcome = worker.process_batch(&jobs).await;
    assert!(outcome.failed.is_empty());
    let run = counter.snapshot();
    // One window read each, a routes read for each agent with a hook, plus one registry
    // read shared by the whole batch.
    assert_eq!(
        run.get("DynamoDB.Query").copied(),
        Some((n + hooked) as u64 + 1),
        "{run:?}"
    );
    // The heartbeat agent's SKIPPED run rides on the finished heartbeat: no write of its
    // own, and no HEARTBEAT event. The completion is the next heartbeat put and the
    // record updated, one unit each, with no transaction.
    assert_eq!(
        per(&run, "DynamoDB.PutItem"),
        1.0,
        "one next heartbeat each: {run:?}"
    );
    assert_eq!(
        per(&run, "DynamoDB.UpdateItem"),
        1.0,
        "one completed record each: {run:?}"
    );
    assert_eq!(run.len(), 3, "nothing else: {run:?}");
    let (agent, _) = &fleet[n - 1];
    let actions = pulse_shared::engine::actions::recent(b.store.as_ref(), &agent.id, 10)
        .await
        .unwrap();
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(
        (actions[0].tool.as_str(), actions[0].status),
        ("heartbeat-agent", ActionStatus::Skipped)
    );
    let done: HashSet<HeartbeatId> = fleet.iter().map(|(_, h)| h.id()).collect();
    for id in done {
        assert_eq!(
            b.store.get_heartbeat(&id).await.unwrap().unwrap().status,
            HeartbeatStatus::Completed
        );
    }
}
