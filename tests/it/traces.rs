//! Traces, as an operator's collector receives them: a real OTLP/HTTP receiver decoding
//! the exports with the official protobuf definitions. A heartbeat that calls an MCP
//! tool and speaks is one trace — `invoke_agent` → `chat` → `execute_tool` → `chat` —
//! named and attributed by the GenAI semantic conventions, with Pulse's ids; messages'
//! text only when asked for; and with no exporter, nothing is sent.

use std::time::Duration;

use pulse_shared::domain::ToolPolicy;
use pulse_shared::traces::{self, Exporting};
use pulse_tests::fake_collector::{FakeCollector, Received};
use pulse_tests::fake_llm::Scripted;
use pulse_tests::{Kind, settings};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

use crate::mcp::rig;

/// The dashboard's page at `path`, its tracing UI set to a Jaeger's.
async fn dashboard_page(b: &pulse_tests::Backend, path: &str) -> String {
    let dashboard = pulse_ui::Dashboard::new(
        &b.connected(),
        b.clock.clone(),
        &pulse_shared::engine::EngineSettings {
            trace_url: Some("http://jaeger.test/trace/{trace_id}".into()),
            ..settings()
        },
        &pulse_tests::offline_services(),
        pulse_ui::Access::Open,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(pulse_shared::http::serve_app(
        listener,
        dashboard.router(),
        pulse_shared::http::ServeLimits::default(),
        std::future::pending(),
    ));
    let answer = reqwest::get(format!("{base}{path}")).await.unwrap();
    assert_eq!(answer.status(), 200, "{path}");
    answer.text().await.unwrap()
}

/// The spans of `root`'s trace from `root` on (not what came before it in the trace, as
/// the claim that queued a heartbeat), in the order they started.
fn trace_of<'a>(spans: &'a [Received], root: &Received) -> Vec<&'a Received> {
    let mut of: Vec<_> = spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id && s.start >= root.start)
        .collect();
    of.sort_by_key(|s| s.start);
    of
}

/// Whether `ancestor` is above `span` in `spans`.
fn is_under(spans: &[&Received], span: &Received, ancestor: &Received) -> bool {
    let mut parent = span.parent_id.clone();
    while !parent.is_empty() {
        if parent == ancestor.span_id {
            return true;
        }
        parent = spans
            .iter()
            .find(|s| s.span_id == parent)
            .map(|s| s.parent_id.clone())
            .unwrap_or_default();
    }
    false
}

/// The test's name, as the test binary takes it to run it alone.
const ALONE: &str = "traces::a_heartbeat_is_one_trace_by_the_genai_conventions_and_a_webhook_and_a_hook_each_another";

/// One test, run in a process of its own, on one thread: spans go to the subscriber of
/// the thread that makes them, and whether a span site is on is kept for the whole
/// process, so other tests making the same spans at once on threads without a
/// subscriber could leave some of this test's spans off.
#[test]
fn a_heartbeat_is_one_trace_by_the_genai_conventions_and_a_webhook_and_a_hook_each_another() {
    if std::env::var_os("PULSE_TEST_TRACES_ALONE").is_none() {
        let ran = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", ALONE, "--test-threads", "1"])
            .env("PULSE_TEST_TRACES_ALONE", "1")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&ran.stdout);
        let err = String::from_utf8_lossy(&ran.stderr);
        assert!(ran.status.success(), "run alone, it failed:\n{out}\n{err}");
        assert!(out.contains("1 passed"), "it ran, alone:\n{out}");
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(traced());
    runtime.block_on(inbound_and_outbound());
}

async fn traced() {
    let collector = FakeCollector::start().await;
    let r = rig(Kind::Sqlite).await;
    r.register_with(Duration::from_secs(5), Some(ToolPolicy::Allow))
        .await;
    let mut agent = r.agent("scout", "mcp:cal").await;
    agent.think = pulse_shared::domain::ThinkPolicy::Always;
    let before = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.b.store.update_agent(&agent, &before).await.unwrap();

    let (layer, exporter) = traces::layer(&Exporting {
        endpoint: Some(collector.traces_url()),
        service: "pulse-test".into(),
        capture_content: false,
    })
    .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    let guard = tracing::subscriber::set_default(subscriber);

    r.llm.script([
        Scripted::tool("cal__note", json!({"text": "water the plants"})),
        Scripted::tool("speak", json!({"thought": "I noted the plants."})),
        Scripted::text("done"),
    ]);
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    r.b.drain(&r.worker).await;
    exporter.flushed().await;

    let spans = collector.spans();
    let heartbeat = r.b.store.list_heartbeats(&agent.id, 5).await.unwrap();
    let heartbeat = heartbeat
        .iter()
        .find(|h| h.outcome.is_some())
        .expect("the heartbeat that ran");
    let root = spans
        .iter()
        .find(|s| {
            s.name.starts_with("invoke_agent")
                && s.text("pulse.heartbeat.id") == heartbeat.id().to_string()
        })
        .unwrap_or_else(|| panic!("the heartbeat's span among {spans:#?}"));
    assert_eq!(root.name, "invoke_agent scout");
    // The sweep's claim began the trace; the job carried it to the run.
    let claim = spans
        .iter()
        .find(|s| s.span_id == root.parent_id)
        .unwrap_or_else(|| panic!("the heartbeat's parent among {spans:#?}"));
    assert_eq!(claim.name, "pulse.claim");
    assert!(claim.parent_id.is_empty(), "the claim is its trace's root");
    assert_eq!(claim.trace_id, root.trace_id);
    assert_eq!(claim.kind, 4, "a producer span: {claim:#?}");
    assert_eq!(claim.text("pulse.heartbeat.id"), heartbeat.id().to_string());
    assert_eq!(claim.number("pulse.claim"), Some(1));
    assert_eq!(root.text("gen_ai.operation.name"), "invoke_agent");
    assert_eq!(root.text("gen_ai.agent.id"), agent.id.to_string());
    assert_eq!(root.text("gen_ai.agent.name"), "scout");
    assert_eq!(
        root.text("gen_ai.conversation.id"),
        agent.session.to_string()
    );
    assert_eq!(root.text("pulse.outcome"), "acted");
    assert_eq!(
        heartbeat.trace_id.as_deref(),
        Some(root.trace_id.as_str()),
        "the record names its trace, for the dashboard's link"
    );
    let page = dashboard_page(
        &r.b,
        &format!("/ui/agents/{}/heartbeats/{}", agent.id, heartbeat.beat),
    )
    .await;
    assert!(
        page.contains(&format!(
            r#"href="http://jaeger.test/trace/{}""#,
            root.trace_id
        )),
        "the heartbeat's page links to its trace: {page}"
    );
    assert_eq!(root.service, "pulse-test");
    assert_eq!(
        root.scope,
        ("pulse".to_owned(), traces::SCHEMA_URL.to_owned())
    );

    let trace = trace_of(&spans, root);
    let named: Vec<&str> = trace
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| n.starts_with("chat ") || n.starts_with("execute_tool "))
        .collect();
    let model = r.llm.requests()[0].body["model"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = format!("chat {model}");
    assert_eq!(
        named,
        [
            chat.as_str(),
            "execute_tool cal__note",
            chat.as_str(),
            "execute_tool speak",
            chat.as_str()
        ],
        "{trace:#?}\nthe model calls received (trace, parent, span): {:?}",
        spans
            .iter()
            .filter(|s| s.name.starts_with("chat "))
            .map(|s| (&s.trace_id, &s.parent_id, &s.span_id))
            .collect::<Vec<_>>()
    );
    // The prompt's memories were searched for: a retrieval, its query's text kept back.
    let searched = trace
        .iter()
        .find(|s| s.name == "retrieval memories")
        .unwrap_or_else(|| panic!("a memory search in {trace:#?}"));
    assert_eq!(searched.text("gen_ai.operation.name"), "retrieval");
    assert_eq!(searched.text("gen_ai.data_source.id"), "memories");
    assert!(searched.number("pulse.memories.found").is_some());
    assert!(
        !searched
            .attributes
            .contains_key("gen_ai.retrieval.query.text")
    );
    for span in &trace[1..] {
        assert!(
            is_under(&trace, span, root),
            "{span:#?} is under the heartbeat"
        );
    }
    let calls: Vec<_> = trace.iter().filter(|s| s.name == chat).collect();
    for (n, call) in calls.iter().enumerate() {
        assert_eq!(call.kind, 3, "a model call is a client span");
        assert_eq!(call.text("gen_ai.operation.name"), "chat");
        assert_eq!(call.text("gen_ai.provider.name"), "openai");
        assert_eq!(call.text("gen_ai.request.model"), model);
        assert!(
            call.number("gen_ai.usage.input_tokens")
                .is_some_and(|n| n > 0),
            "{call:#?}"
        );
        assert!(call.number("gen_ai.usage.output_tokens").is_some());
        assert!(
            call.attributes
                .contains_key("gen_ai.usage.cache_read.input_tokens")
        );
        let finish = if n < 2 { "tool_call" } else { "stop" };
        assert_eq!(
            call.attributes["gen_ai.response.finish_reasons"],
            json!([finish])
        );
        assert!(
            !call.attributes.contains_key("thread.id")
                && !call.attributes.contains_key("code.file.path"),
            "only the conventions' attributes and Pulse's: {call:#?}"
        );
        assert!(
            !call.attributes.contains_key("gen_ai.input.messages")
                && !call.attributes.contains_key("gen_ai.output.messages"),
            "no text unless asked for: {call:#?}"
        );
    }
    let tool = trace
        .iter()
        .find(|s| s.name == "execute_tool cal__note")
        .unwrap();
    assert_eq!(tool.text("gen_ai.operation.name"), "execute_tool");
    assert_eq!(tool.text("gen_ai.tool.name"), "cal__note");
    assert_eq!(tool.text("gen_ai.tool.type"), "function");
    let call_id = r.llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["tool_call_id"].as_str())
        .unwrap()
        .to_owned();
    assert_eq!(tool.text("gen_ai.tool.call.id"), call_id);
    let window = trace
        .iter()
        .find(|s| s.name == "pulse.window")
        .unwrap_or_else(|| panic!("the window's span among {trace:#?}"));
    assert_eq!(window.parent_id, root.span_id);
    // Nothing was sent in before this first beat: its window is empty.
    assert_eq!(window.number("pulse.window.events"), Some(0), "{window:#?}");
    assert_eq!(window.attributes["pulse.window.truncated"], json!(false));
    let thinking = trace
        .iter()
        .find(|s| s.name == "pulse.action heartbeat-agent")
        .unwrap_or_else(|| panic!("the thinking action among {trace:#?}"));
    assert!(is_under(&trace, tool, thinking) && is_under(&trace, thinking, root));
    assert!(!thinking.text("pulse.action.id").is_empty());

    // What it said is delivered by a conversation turn: a trace of its own.
    let turn = spans
        .iter()
        .find(|s| s.name == "invoke_agent scout" && !s.text("pulse.turn.id").is_empty())
        .unwrap_or_else(|| {
            let roots: Vec<_> = spans
                .iter()
                .filter(|s| s.parent_id.is_empty())
                .map(|s| (&s.name, &s.attributes))
                .collect();
            panic!("the turn's span among the roots {roots:#?}")
        });
    assert_ne!(turn.trace_id, root.trace_id);
    assert_eq!(
        turn.text("gen_ai.conversation.id"),
        agent.session.to_string()
    );
    assert_eq!(turn.text("pulse.outcome"), "answered");
    let turn_id = pulse_shared::domain::TurnId::parse(&turn.text("pulse.turn.id")).unwrap();
    let written =
        r.b.store
            .get_turn(&agent.id, &turn_id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(written.trace_id.as_deref(), Some(turn.trace_id.as_str()));
    let tab = dashboard_page(&r.b, &format!("/ui/agents/{}/chat", agent.id)).await;
    assert!(
        tab.contains(&format!(
            r#"href="http://jaeger.test/trace/{}""#,
            turn.trace_id
        )),
        "the reply links to its turn's trace: {tab}"
    );

    // Messages' text, when the operator asks for it: a user's turn shows what was sent
    // and said.
    drop(guard);
    let (layer, exporter) = traces::layer(&Exporting {
        endpoint: Some(collector.traces_url()),
        service: "pulse-test".into(),
        capture_content: true,
    })
    .unwrap();
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    r.llm.script([Scripted::text("Watered at nine.")]);
    r.turn(&agent, "when did you water them?").await;
    exporter.flushed().await;
    let spans = collector.spans();
    let answered = spans
        .iter()
        .filter(|s| s.name == chat)
        .find(|s| {
            s.text("gen_ai.output.messages")
                .contains("Watered at nine.")
        })
        .unwrap_or_else(|| panic!("the turn's model call among {spans:#?}"));
    assert!(
        answered
            .text("gen_ai.input.messages")
            .contains("when did you water them?")
    );
    assert!(!answered.text("gen_ai.system_instructions").is_empty());
    let asked = spans
        .iter()
        .filter(|s| s.trace_id == answered.trace_id && s.name == "retrieval memories")
        .map(|s| s.text("gen_ai.retrieval.query.text"))
        .collect::<Vec<_>>();
    assert!(
        asked.iter().any(|q| q.contains("when did you water them?")),
        "the turn's memory search, with its query: {asked:?}"
    );
    drop(guard);

    // No exporter: nothing is sent.
    let received = collector.spans().len();
    let exports = collector.exports().len();
    r.llm.script([Scripted::text("Still nine.")]);
    r.turn(&agent, "and today?").await;
    exporter.flushed().await;
    assert_eq!(collector.spans().len(), received);
    assert_eq!(collector.exports().len(), exports);
    let turns = r.b.store.list_turns(&agent.id, 10).await.unwrap();
    let untraced = turns
        .iter()
        .find(|t| t.parts == ["Still nine."])
        .expect("the last turn");
    assert_eq!(untraced.trace_id, None, "no trace, no id");
}

/// A webhook taken in and a hook delivered are traces of their own.
async fn inbound_and_outbound() {
    use pulse_shared::domain::{Hook, HookTarget, HookType, Webhook, WebhookScheme};
    use pulse_shared::engine::{Verdict, WebhookIntake};
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    let collector = FakeCollector::start().await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    let b = pulse_tests::Backend::new(Kind::Sqlite).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let webhook = Webhook::new(agent.id.clone(), WebhookScheme::Standard, SECRET, b.now()).unwrap();
    b.store.create_webhook(&webhook).await.unwrap();
    let hook = Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse(&receiver.url()).unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        b.now(),
    );
    b.store.create_hook(&hook).await.unwrap();

    let (layer, exporter) = traces::layer(&Exporting {
        endpoint: Some(collector.traces_url()),
        service: "pulse-test".into(),
        capture_content: false,
    })
    .unwrap();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let intake = WebhookIntake::new(
        b.store.clone(),
        b.queue.clone(),
        b.clock.clone(),
        jiff::SignedDuration::from_hours(24),
    );
    let body = json!({"event_type": "NOTE", "payload": {"n": 1}}).to_string();
    let headers = crate::inbound::signed(
        webhook.scheme,
        SECRET,
        b.now().as_second(),
        "msg_1",
        body.as_bytes(),
    );
    let verdict = intake
        .receive(webhook.id.as_str(), headers, body.into_bytes().into(), None)
        .await;
    let Verdict::Accepted(event) = verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(b.emit_hook(&agent, "AFTER_HEARTBEAT").await, 1);
    let attempts = b
        .dispatcher()
        .poll_once(10, Duration::from_secs(60))
        .await
        .unwrap()
        .attempts;
    assert_eq!(attempts, 1);
    exporter.flushed().await;

    let spans = collector.spans();
    let took = spans
        .iter()
        .find(|s| s.name == "pulse.webhook")
        .unwrap_or_else(|| panic!("the webhook's span among {spans:#?}"));
    assert!(took.parent_id.is_empty(), "a trace of its own");
    assert_eq!(took.kind, 2, "a server span");
    assert_eq!(took.text("pulse.webhook.id"), webhook.id.as_str());
    assert_eq!(took.text("pulse.verdict"), "accepted");
    assert_eq!(took.text("pulse.event.id"), event.to_string());
    let sent = spans
        .iter()
        .find(|s| s.name == "pulse.hook AFTER_HEARTBEAT")
        .unwrap_or_else(|| panic!("the hook's span among {spans:#?}"));
    assert!(sent.parent_id.is_empty(), "a trace of its own");
    assert_ne!(sent.trace_id, took.trace_id);
    assert_eq!(sent.kind, 3, "a client span");
    assert_eq!(sent.text("pulse.hook.id"), hook.id.as_str());
    assert_eq!(sent.number("pulse.hook.attempt"), Some(1));
    assert_eq!(sent.text("pulse.hook.result"), "SUCCESS");
    assert_eq!(sent.number("http.response.status_code"), Some(200));
    assert_ne!(sent.status, 2, "not an error");
}
