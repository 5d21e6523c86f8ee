//! The largest records a user can make fit AWS's limits: a tool's answer of most of a
//! megabyte is kept clipped on its action, an event at the bound travels through a
//! cascade whole, one past it is refused with what to do, and a record that got past
//! every check anyway is refused by the AWS clients before it is sent (the emulator
//! would take some of them: a real table would not).

use jiff::SignedDuration;
use pulse_shared::domain::{Action, ActionStatus, Agent, HookPayload, MAX_EVENT_BYTES, NewEvent};
use pulse_tests::fake_hooks::FakeReceiver;
use pulse_tests::{Backend, FakeTool, Kind, Reply, on_both_backends, settings};
use serde_json::{Value, json};

async fn beat(b: &Backend) {
    b.advance(SignedDuration::from_mins(16));
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    b.drain(&b.worker(settings())).await;
}

async fn action_of(b: &Backend, agent: &Agent, tool: &str) -> Action {
    b.store
        .list_actions(&agent.id, 20)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.tool.as_str() == tool)
        .unwrap_or_else(|| panic!("{tool}'s action"))
}

/// A payload whose JSON is exactly `bytes` long: `{"text":"yyy…"}`.
fn payload_of(bytes: usize) -> Value {
    json!({"text": "y".repeat(bytes - r#"{"text":""}"#.len())})
}

on_both_backends!(
    a_tool_answer_of_most_of_a_megabyte_is_kept_clipped_and_an_event_at_the_bound_travels_whole,
    at_the_bound
);
async fn at_the_bound(kind: Kind) {
    let b = Backend::new(kind).await;
    // 700 KB of output, and an event whose payload is as large as an event may be.
    let fetcher = FakeTool::answering(|_| {
        Reply::Json(
            200,
            json!({
                "success": true,
                "output": "x".repeat(700_000),
                "usage": {"input_tokens": 7},
                "new_events": [{"type": "FETCHED", "payload": payload_of(MAX_EVENT_BYTES)}],
            }),
        )
    })
    .await;
    let reader = FakeTool::start().await;
    b.tool("fetcher", &fetcher.url(), "FETCH").await;
    b.tool("reader", &reader.url(), "FETCHED").await;
    let (agent, _) = b.agent("scout", "15m").await;
    let hooks = FakeReceiver::start().await;
    b.hooks_to(&agent, &hooks.url(), &["ACTION_STARTED"]).await;
    b.emit(&agent, "FETCH", json!({"url": "https://example.com/big"}))
        .await;
    b.advance(SignedDuration::from_mins(16));
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    b.drain(&b.worker_with_hooks(settings())).await;

    let fetched = action_of(&b, &agent, "fetcher").await;
    assert_eq!(
        fetched.status,
        ActionStatus::Completed,
        "{:?}",
        fetched.error
    );
    let kept = fetched.response.expect("the answer, kept");
    assert!(kept.to_string().len() <= Action::KEPT_RESPONSE);
    let output = kept["output"].as_str().unwrap();
    assert!(output.starts_with("xxxx"), "{output:.40}");
    assert!(output.ends_with("more bytes]"), "the cut is marked");
    assert_eq!(kept["success"], json!(true), "its shape is kept");
    assert_eq!(
        kept["usage"],
        json!({"input_tokens": 7}),
        "costs still count"
    );

    // The event was appended whole, and the tool subscribed to it was sent it whole,
    // its action (with that request kept whole) recorded.
    reader.wait_for(1).await;
    let sent = &reader.requests()[0]["event"];
    assert_eq!(sent["type"], json!("FETCHED"));
    assert_eq!(sent["payload"], payload_of(MAX_EVENT_BYTES));
    let read = action_of(&b, &agent, "reader").await;
    assert_eq!(read.status, ActionStatus::Completed, "{:?}", read.error);
    assert_eq!(
        read.request["event"]["payload"],
        payload_of(MAX_EVENT_BYTES)
    );

    // The hook told of that action carries the event cut to fit a queue message, and
    // says so.
    b.dispatch_all().await;
    let started: Vec<Value> = hooks.received().iter().map(|r| r.json()).collect();
    assert_eq!(started.len(), 2, "one ACTION_STARTED per action");
    let to_reader = started
        .iter()
        .find(|h| h["data"]["tool_name"] == "reader")
        .expect("the reader's ACTION_STARTED");
    let cut = to_reader["data"]["event"]["payload"]["text"]
        .as_str()
        .unwrap();
    assert!(cut.ends_with("more bytes]"), "{}", &cut[cut.len() - 60..]);
    assert!(to_reader["data"].to_string().len() <= HookPayload::MAX_DATA);
    assert_eq!(to_reader["data"]["event"]["type"], json!("FETCHED"));
}

on_both_backends!(
    an_event_one_byte_past_the_bound_is_refused_with_what_to_do,
    past_the_bound
);
async fn past_the_bound(kind: Kind) {
    let b = Backend::new(kind).await;
    let fetcher = FakeTool::answering(|_| {
        Reply::Json(
            200,
            json!({"success": true, "new_events": [
                {"type": "FETCHED", "payload": payload_of(MAX_EVENT_BYTES + 1)}
            ]}),
        )
    })
    .await;
    b.tool("fetcher", &fetcher.url(), "FETCH").await;
    let (agent, _) = b.agent("scout", "15m").await;
    b.emit(&agent, "FETCH", json!({})).await;
    beat(&b).await;
    let failed = action_of(&b, &agent, "fetcher").await;
    assert_eq!(failed.status, ActionStatus::Failed);
    let why = failed.error.unwrap();
    assert!(why.contains("new_events[0]"), "{why}");
    assert!(why.contains("at most 256 KiB"), "{why}");
    assert!(why.contains("send a link"), "{why}");
    assert!(failed.new_events.is_empty());
    // The heartbeat finished: the next one reads on from after it.
    b.emit(&agent, "FETCH", json!({})).await;
    beat(&b).await;
    assert_eq!(fetcher.requests().len(), 2);

    // The same bound holds for an event given from outside.
    let why = NewEvent::new("BIG", payload_of(MAX_EVENT_BYTES + 1), None).unwrap_err();
    assert!(why.to_string().contains("262145 bytes"), "{why}");
    assert!(NewEvent::new("BIG", payload_of(MAX_EVENT_BYTES), None).is_ok());
}

/// A record larger than a DynamoDB item, made without the checks above, is refused by
/// the client before it is sent: the error names the request, its size and the limit,
/// and no request went out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_past_400_kb_is_refused_before_it_is_sent() {
    let b = Backend::new(Kind::Aws).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let huge = NewEvent::with_payload("BIG", payload_of(500_000), Value::Null, None)
        .unwrap()
        .into_event(agent.id.clone(), "test", b.now());
    let counter = b.aws.as_ref().unwrap().counter.clone();
    counter.reset();
    let why = pulse_shared::error::chain(&b.store.append(&huge).await.unwrap_err());
    assert!(why.contains("refused before sending DynamoDB."), "{why}");
    assert!(why.contains("past AWS's limit of 409600 bytes"), "{why}");
    assert_eq!(
        counter.snapshot().values().sum::<u64>(),
        0,
        "nothing was sent"
    );
    // A small one still goes.
    let small = NewEvent::new("SMALL", json!({}), None).unwrap().into_event(
        agent.id.clone(),
        "test",
        b.now(),
    );
    b.store.append(&small).await.unwrap();
    assert!(counter.snapshot().values().sum::<u64>() >= 1);
}
