//! MCP servers as agent tools, against a real MCP server (the SDK's server side, over
//! streamable HTTP on loopback) and the fake model: listed, offered to the attached
//! agents only, called with their arguments, their answers and failures given back to
//! the model; expired sessions, changed lists, lost answers and refused URLs.

use std::time::Duration;

use pulse_shared::domain::{
    AgentChanges, AgentTool, McpHeader, McpServer, Tool, ToolName, ToolPolicy,
};
use pulse_shared::engine::Worker;
use pulse_shared::engine::agent_tools::AgentTools;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::fake_mcp::FakeMcp;
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};

pub(crate) struct Rig {
    pub(crate) b: Backend,
    pub(crate) llm: FakeLlm,
    pub(crate) discord: FakeDiscord,
    pub(crate) mcp: FakeMcp,
    pub(crate) tools: std::sync::Arc<AgentTools>,
    pub(crate) worker: Worker,
}

pub(crate) async fn rig(kind: Kind) -> Rig {
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let mcp = FakeMcp::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    let connected = b.connected();
    let tools = connected.agent_tools(b.clock.clone(), &services);
    let worker = connected.worker_with(b.clock.clone(), &settings(), &services, tools.clone());
    Rig {
        b,
        llm,
        discord,
        mcp,
        tools,
        worker,
    }
}

impl Rig {
    /// Registers the fake as `cal`, with `timeout`, every tool allowed without asking,
    /// and lists its tools.
    async fn register(&self, timeout: Duration) -> Tool {
        self.register_with(timeout, Some(ToolPolicy::Allow)).await
    }

    /// Registers the fake as `cal`, with `timeout` and `policy` for all its tools (none:
    /// each tool's marks decide), and lists its tools.
    pub(crate) async fn register_with(
        &self,
        timeout: Duration,
        policy: Option<ToolPolicy>,
    ) -> Tool {
        let mut server = McpServer::new(
            &self.mcp.url(),
            vec![McpHeader::parse("Authorization: Bearer s3cret").unwrap()],
            Vec::new(),
            timeout,
        )
        .unwrap();
        server.policy = policy;
        let tool = Tool::mcp(ToolName::parse("cal").unwrap(), server, self.b.now());
        self.b.store.add_tool(&tool).await.unwrap();
        self.tools.refresh(&tool).await.unwrap().0
    }

    /// An agent, given `tools`.
    pub(crate) async fn agent(&self, name: &str, tools: &str) -> pulse_shared::domain::Agent {
        let (agent, _) = self.b.agent(name, "10m").await;
        if tools.is_empty() {
            return agent;
        }
        let lifecycle = self
            .b
            .connected()
            .lifecycle(self.b.clock.clone(), &settings());
        let changes = AgentChanges {
            tools: Some(AgentTool::parse_list(tools).unwrap()),
            ..AgentChanges::default()
        };
        lifecycle.update(&agent.id, &changes).await.unwrap().agent
    }

    /// The user says `text` and the worker answers.
    pub(crate) async fn turn(&self, agent: &pulse_shared::domain::Agent, text: &str) {
        self.b.say(agent, text).await;
        self.b.drain(&self.worker).await;
    }

    /// The names of the tools request `n` offered.
    fn offered(&self, n: usize) -> Vec<String> {
        self.llm.requests()[n].body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// The tool results request `n` gives back to the model.
    pub(crate) fn results(&self, n: usize) -> Vec<String> {
        self.llm.requests()[n].body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

on_both_backends!(
    an_attached_mcp_servers_tools_reach_the_model_and_its_calls_reach_the_server,
    attached
);
async fn attached(kind: Kind) {
    let r = rig(kind).await;
    let tool = r.register(Duration::from_secs(5)).await;
    // Listed through its pages of two, and kept with the server.
    let server = tool.mcp_server().unwrap();
    let names: Vec<&str> = server.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add", "note", "fail", "slow", "picture", "lookup"]);
    let read_only: Vec<&str> = server
        .tools
        .iter()
        .filter(|t| t.read_only)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(read_only, ["lookup"], "readOnlyHint is kept");
    assert!(server.listed_at.is_some());
    let stored = r.b.store.load_registry().await.unwrap();
    let stored = stored
        .tools
        .iter()
        .find(|t| t.name.as_str() == "cal")
        .unwrap();
    let stored = stored.mcp_server().unwrap();
    assert_eq!(
        stored.tools.len(),
        6,
        "a cold worker offers them without listing"
    );
    assert_eq!(
        stored.headers[0].value.expose(),
        "Bearer s3cret",
        "opened as read"
    );

    let given = r.agent("scout", "mcp:cal").await;
    let other = r.agent("other", "").await;
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 2, "b": 3})),
        Scripted::text("It is 5."),
    ]);
    r.turn(&given, "what is 2 + 3?").await;
    let offered = r.offered(0);
    for t in [
        "cal__add",
        "cal__note",
        "cal__fail",
        "cal__slow",
        "cal__picture",
    ] {
        assert!(offered.iter().any(|o| o == t), "{t} offered: {offered:?}");
    }
    assert!(offered.iter().any(|o| o == "remember"), "Pulse's own stay");
    let calls = r.mcp.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "add");
    assert_eq!(calls[0].arguments, json!({"a": 2, "b": 3}));
    let key = calls[0]
        .idempotency_key
        .clone()
        .expect("an Idempotency-Key");
    let turn = r.b.store.list_turns(&given.id, 1).await.unwrap().remove(0);
    assert!(
        key.starts_with(turn.id.as_str()),
        "{key} comes from the turn"
    );
    let results = r.results(1);
    assert_eq!(results.len(), 1);
    let result: Value = serde_json::from_str(&results[0]).unwrap();
    assert_eq!(result["content"][0], "5");
    assert_eq!(result["structured"]["sum"], 5);

    // An agent not given the server is not offered its tools.
    r.llm.script([Scripted::text("hello")]);
    r.turn(&other, "hi").await;
    let offered = r.offered(2);
    assert!(
        !offered.iter().any(|o| o.starts_with("cal__")),
        "{offered:?}"
    );
    // Taken away, they are gone for the first agent too.
    let lifecycle = r.b.connected().lifecycle(r.b.clock.clone(), &settings());
    let detach = AgentChanges {
        tools: Some(Vec::new()),
        ..AgentChanges::default()
    };
    lifecycle.update(&given.id, &detach).await.unwrap();
    r.llm.script([Scripted::text("ok")]);
    r.turn(&given, "again").await;
    assert!(!r.offered(3).iter().any(|o| o.starts_with("cal__")));
    assert_eq!(r.mcp.calls().len(), 1, "no call made since");
}

on_both_backends!(
    the_heartbeat_agent_calls_mcp_tools_like_the_chat_does,
    heartbeat
);
async fn heartbeat(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let mut agent = r.agent("scout", "mcp:cal").await;
    agent.think = pulse_shared::domain::ThinkPolicy::Always;
    let before = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.b.store.update_agent(&agent, &before).await.unwrap();
    r.llm.script([
        Scripted::tool("cal__note", json!({"text": "water the plants"})),
        Scripted::text("done"),
    ]);
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    r.b.drain(&r.worker).await;
    assert!(r.offered(0).iter().any(|o| o == "cal__note"));
    let calls = r.mcp.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].arguments, json!({"text": "water the plants"}));
    let actions = r.b.store.list_actions(&agent.id, 10).await.unwrap();
    let thought = actions
        .iter()
        .find(|a| a.tool.as_str() == pulse_shared::domain::HEARTBEAT_AGENT)
        .expect("the heartbeat agent's action");
    let key = calls[0].idempotency_key.as_deref().unwrap_or_default();
    assert!(
        key.starts_with(&format!("{}.0.", thought.id)),
        "the key comes from the heartbeat agent's action {}: {key}",
        thought.id
    );
    assert!(r.results(1)[0].contains("noted"));
    // The call is an action of the heartbeat, filed under the heartbeat agent's event.
    let call = actions
        .iter()
        .find(|a| a.call.is_some())
        .expect("the call's action");
    assert_eq!(call.label(), "cal/note");
    assert_eq!(call.heartbeat_id, thought.heartbeat_id);
    assert_eq!(
        call.call.as_ref().unwrap().event_id.as_ref(),
        Some(&thought.event_id)
    );
    assert_eq!(call.status, pulse_shared::domain::ActionStatus::Completed);
}

on_both_backends!(
    failures_reach_the_model_as_failed_calls_and_nothing_is_done_twice_blindly,
    failures_reach_the_model_as_failed_calls_and_nothing_is_done_twice_blindly
);
async fn failures_reach_the_model_as_failed_calls_and_nothing_is_done_twice_blindly(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_millis(400)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    r.llm.script([
        // The server says it failed.
        Scripted::tool("cal__fail", json!({})),
        // Arguments that do not fit the schema are never sent.
        Scripted::tool("cal__add", json!({"a": "two"})),
        // A tool the server does not have under that name.
        Scripted::tool("cal__nope", json!({})),
        // Timed out after it arrived: not known, and not made again.
        Scripted::tool("cal__slow", json!({"ms": 1500})),
        Scripted::text("sorry"),
    ]);
    let mut a = agent.clone();
    a.budgets.max_steps = 6;
    r.b.store.update_agent(&a, &agent).await.unwrap();
    r.turn(&a, "try everything").await;
    let results = r.results(4);
    assert_eq!(results.len(), 4, "{results:?}");
    assert!(
        results[0].contains("the calendar is locked"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("do not fit") && results[1].contains("nothing was sent"));
    assert!(results[2].contains("there is no tool"), "{}", results[2]);
    assert!(
        results[3].contains("may or may not have been done"),
        "{}",
        results[3]
    );
    let names: Vec<String> = r.mcp.calls().into_iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        ["fail", "slow"],
        "the slow call went out once, never again"
    );
}

on_both_backends!(
    an_expired_session_is_opened_again_and_the_call_sent_with_the_same_key,
    an_expired_session_is_opened_again_and_the_call_sent_with_the_same_key
);
async fn an_expired_session_is_opened_again_and_the_call_sent_with_the_same_key(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 1, "b": 1})),
        Scripted::text("two"),
    ]);
    r.turn(&agent, "warm up").await;
    let sessions = r.mcp.sessions();
    r.mcp.expire_next();
    r.llm.script([
        Scripted::tool("cal__note", json!({"text": "once"})),
        Scripted::text("noted"),
    ]);
    r.turn(&agent, "note it").await;
    assert_eq!(r.mcp.expired(), 1);
    assert_eq!(r.mcp.sessions(), sessions + 1, "a new session");
    let notes: Vec<_> = r
        .mcp
        .calls()
        .into_iter()
        .filter(|c| c.name == "note")
        .collect();
    assert_eq!(
        notes.len(),
        2,
        "sent, refused as expired, sent again: {notes:?}"
    );
    assert_eq!(notes[0].idempotency_key, notes[1].idempotency_key);
    assert!(notes[0].idempotency_key.is_some());
    assert!(r.results(3)[0].contains("noted"));
}

on_both_backends!(
    a_changed_tools_list_is_listed_again_before_the_next_turn,
    a_changed_tools_list_is_listed_again_before_the_next_turn
);
async fn a_changed_tools_list_is_listed_again_before_the_next_turn(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 1, "b": 2})),
        Scripted::text("three"),
    ]);
    r.turn(&agent, "open a session").await;
    r.mcp.add_tool("weather", "Today's weather.").await;
    let name = ToolName::parse("cal").unwrap();
    let start = std::time::Instant::now();
    while !r.tools.clients().changed(&name) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the list_changed notification never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Listed a moment ago: a notice within the minute is not followed yet.
    r.llm.script([Scripted::text("not yet")]);
    r.turn(&agent, "weather?").await;
    assert!(!r.offered(2).iter().any(|o| o == "cal__weather"));
    r.b.advance(jiff::SignedDuration::from_mins(1));
    r.llm.script([Scripted::text("sunny")]);
    r.turn(&agent, "weather?").await;
    let offered = r.offered(3);
    assert!(offered.iter().any(|o| o == "cal__weather"), "{offered:?}");
    let stored = r.b.store.load_registry().await.unwrap();
    let tools = &stored.tools.iter().find(|t| t.name == name).unwrap();
    assert_eq!(
        tools.mcp_server().unwrap().tools.len(),
        7,
        "the new list is kept"
    );
}

on_both_backends!(
    a_server_that_pages_its_tools_forever_is_refused_and_the_stored_list_kept,
    endless_pager
);
/// A past defect: the tools list was followed page after page with no bound (a server
/// that always named a next page grew `pulse serve` to 2.5 GB in 30 s), and a server
/// that said its tools changed was listed again on every run.
async fn endless_pager(kind: Kind) {
    let r = rig(kind).await;
    let tool = r.register(Duration::from_secs(5)).await;
    let kept = tool.mcp_server().unwrap().tools.len();
    let agent = r.agent("scout", "mcp:cal").await;
    // The server starts paging forever, and says its tools changed.
    r.mcp.page_forever();
    r.mcp.say_tools_changed().await;
    let name = ToolName::parse("cal").unwrap();
    let start = std::time::Instant::now();
    while !r.tools.clients().changed(&name) {
        assert!(start.elapsed() < Duration::from_secs(10), "no notice came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the minute, the next run lists it again: followed to the bound and no
    // further, refused, and the list stored before is what the agent is offered.
    r.b.advance(jiff::SignedDuration::from_mins(1));
    let before = r.mcp.pages();
    for n in 0..3 {
        r.llm.script([Scripted::text("ok")]);
        r.turn(&agent, &format!("turn {n}")).await;
    }
    assert_eq!(
        r.mcp.pages() - before,
        32,
        "one listing of 32 pages in three turns"
    );
    for n in 0..3 {
        let offered = r.offered(n);
        assert_eq!(
            offered.iter().filter(|o| o.starts_with("cal__")).count(),
            kept,
            "{offered:?}"
        );
    }
    // Listed by hand, it is refused with why.
    let before = r.mcp.pages();
    let why = r.tools.refresh(&tool).await.unwrap_err();
    assert!(why.contains("more than 32 pages"), "{why}");
    assert_eq!(r.mcp.pages() - before, 32);
}

on_both_backends!(
    urls_the_egress_guard_refuses_and_servers_that_are_not_mcp_are_refused,
    urls_the_egress_guard_refuses_and_servers_that_are_not_mcp_are_refused
);
async fn urls_the_egress_guard_refuses_and_servers_that_are_not_mcp_are_refused(kind: Kind) {
    let r = rig(kind).await;
    let name = ToolName::parse("x").unwrap();
    let to = Duration::from_secs(5);
    let metadata = McpServer::new("http://169.254.169.254/mcp", vec![], vec![], to).unwrap();
    let why = r.tools.clients().list(&name, &metadata).await.unwrap_err();
    assert!(why.contains("not reachable from Pulse"), "{why}");
    // The fake model answers HTTP, but not MCP.
    let not_mcp = McpServer::new(&r.llm.url(), vec![], vec![], to).unwrap();
    let why = r.tools.clients().list(&name, &not_mcp).await.unwrap_err();
    assert!(why.contains("did not open a session"), "{why}");
    // Giving an agent a server that is not there is refused.
    let (agent, _) = r.b.agent("scout", "10m").await;
    let lifecycle = r.b.connected().lifecycle(r.b.clock.clone(), &settings());
    let changes = AgentChanges {
        tools: Some(AgentTool::parse_list("mcp:ghost").unwrap()),
        ..AgentChanges::default()
    };
    let refused = lifecycle.update(&agent.id, &changes).await.unwrap_err();
    assert!(refused.to_string().contains("tools add-mcp"), "{refused}");
}

on_both_backends!(
    every_mcp_call_is_an_action_with_its_hooks_and_in_the_tool_stats,
    recorded
);
async fn recorded(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    r.b.hooks_to(
        &agent,
        &receiver.url(),
        &["BEFORE_CAL", "AFTER_CAL", "ACTION_COMPLETED"],
    )
    .await;
    r.llm.script([
        Scripted::tool("cal__add", json!({"a": 2, "b": 3})),
        Scripted::text("It is 5."),
    ]);
    r.turn(&agent, "what is 2 + 3?").await;
    let turn = r.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    let actions = r.b.store.list_actions(&agent.id, 10).await.unwrap();
    assert_eq!(actions.len(), 1, "{actions:?}");
    let a = &actions[0];
    assert_eq!(a.tool.as_str(), "cal");
    assert_eq!(a.label(), "cal/add");
    assert_eq!(a.status, pulse_shared::domain::ActionStatus::Completed);
    assert_eq!(
        a.heartbeat_id.beat(),
        0,
        "a chat turn's call is in no heartbeat"
    );
    assert_eq!(a.request["arguments"], json!({"a": 2, "b": 3}));
    assert_eq!(a.response.as_ref().unwrap()["result"]["content"][0], "5");
    assert!(a.duration_ms.is_some());
    let call = a.call.as_ref().expect("a model's call");
    assert_eq!(call.turn_id.as_ref(), Some(&turn.id));
    assert_eq!(
        Some(call.key.clone()),
        r.mcp.calls()[0].idempotency_key,
        "the recorded key is the one sent"
    );
    // Its hooks went out, with the MCP tool named.
    r.b.dispatch_all().await;
    assert_eq!(
        receiver.hook_types(),
        ["ACTION_COMPLETED", "AFTER_CAL", "BEFORE_CAL"]
    );
    let done = receiver
        .received()
        .into_iter()
        .find(|d| d.header("x-pulse-hook-type") == "ACTION_COMPLETED")
        .unwrap();
    let body: Value = serde_json::from_slice(&done.body).unwrap();
    assert_eq!(body["data"]["mcp_tool"], "add");
    assert_eq!(body["action_id"], a.id.as_str());
    // The stats count it under the server and its tool.
    let since = r.b.now() - jiff::SignedDuration::from_hours(1);
    let stats = pulse_shared::engine::actions::tool_stats(r.b.store.as_ref(), since, r.b.now())
        .await
        .unwrap();
    let row = stats.iter().find(|s| s.tool == "cal/add").expect("a row");
    assert_eq!((row.calls, row.succeeded, row.failed), (1, 1, 0));
}

on_both_backends!(
    a_call_made_before_a_crash_is_answered_from_the_log_and_never_sent_twice,
    rerun
);
async fn rerun(kind: Kind) {
    use pulse_shared::domain::{ActionId, ActionStatus, EventId, HeartbeatId, ToolUse};
    use pulse_shared::engine::agent_tools::{Site, idempotency_key};
    let r = rig(kind).await;
    r.register(Duration::from_millis(400)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let offer = r.tools.offer(&agent, &[]).await;
    let at_ms = r.b.now().as_millisecond() as u64;
    let site = |index| Site {
        agent: &agent,
        heartbeat_id: HeartbeatId::new(agent.id.clone(), 0),
        event: None,
        turn_id: None,
        run: "tn_run",
        index,
        at_ms,
        race: None,
        said: None,
    };
    let add = ToolUse {
        id: "c1".into(),
        name: "cal__add".into(),
        input: json!({"a": 1, "b": 2}),
    };
    // The same call of the same run, made again (a rerun after a crash): answered from
    // the log, not sent.
    let first = r.tools.run(&offer, &add, &site(0)).await.unwrap().unwrap();
    let again = r.tools.run(&offer, &add, &site(0)).await.unwrap().unwrap();
    assert_eq!(first, again);
    assert_eq!(r.mcp.calls().len(), 1);
    // A lost answer is UNKNOWN, and a rerun does not send it again either.
    let slow = ToolUse {
        id: "c2".into(),
        name: "cal__slow".into(),
        input: json!({"ms": 1500}),
    };
    for _ in 0..2 {
        let why = r
            .tools
            .run(&offer, &slow, &site(1))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            why.as_str().contains("may or may not have been done"),
            "{why}"
        );
    }
    assert_eq!(r.mcp.calls().len(), 2, "the slow call went out once");
    // A call a crashed run left RUNNING is not sent again: the server is not idempotent.
    let note = ToolUse {
        id: "c3".into(),
        name: "cal__note".into(),
        input: json!({"text": "once"}),
    };
    let key = idempotency_key("tn_run.2", &note);
    let event_id = EventId::derived(at_ms, &[&key]);
    let cal = ToolName::parse("cal").unwrap();
    let mut left =
        r.b.store
            .list_actions(&agent.id, 1)
            .await
            .unwrap()
            .remove(0);
    left.id = ActionId::for_event(&event_id, &cal);
    left.event_id = event_id;
    left.status = ActionStatus::Running;
    left.completed_at = None;
    left.error = None;
    left.call.as_mut().unwrap().key = key;
    assert!(r.b.store.start_action(&left).await.unwrap().is_none());
    let why = r
        .tools
        .run(&offer, &note, &site(2))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        why.as_str().contains("may or may not have been done"),
        "{why}"
    );
    assert_eq!(r.mcp.calls().len(), 2, "nothing more was sent");
    let stored =
        r.b.store
            .get_action(&agent.id, &left.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(stored.status, ActionStatus::Unknown);
    assert!(stored.error.unwrap().contains("pulse actions resolve"));
}

on_both_backends!(
    a_failing_mcp_tool_tells_its_hooks_once_that_it_is_degraded,
    a_failing_mcp_tool_tells_its_hooks_once_that_it_is_degraded
);
async fn a_failing_mcp_tool_tells_its_hooks_once_that_it_is_degraded(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    r.b.hooks_to(
        &agent,
        &receiver.url(),
        &["TOOL_DEGRADED", "TOOL_RECOVERED"],
    )
    .await;
    let mut a = agent.clone();
    a.budgets.max_steps = 8;
    r.b.store.update_agent(&a, &agent).await.unwrap();
    let mut script: Vec<Scripted> = (0..6)
        .map(|i| Scripted::tool("cal__fail", json!({"n": i})))
        .collect();
    script.push(Scripted::text("it is broken"));
    r.llm.script(script);
    r.turn(&a, "try it six times").await;
    assert_eq!(r.mcp.calls().len(), 6);
    r.b.dispatch_all().await;
    assert_eq!(receiver.hook_types(), ["TOOL_DEGRADED"], "told once");
    let body: Value = serde_json::from_slice(&receiver.received()[0].body).unwrap();
    assert_eq!(body["data"]["tool_name"], "cal");
    assert_eq!(
        (
            body["data"]["calls"].as_u64(),
            body["data"]["failed"].as_u64()
        ),
        (Some(5), Some(5))
    );
    // A later window of successes recovers it.
    r.b.advance(jiff::SignedDuration::from_mins(11));
    let script: Vec<Scripted> = (0..5)
        .map(|i| Scripted::tool("cal__add", json!({"a": i, "b": 1})))
        .chain([Scripted::text("fixed")])
        .collect();
    r.llm.script(script);
    r.turn(&a, "and now?").await;
    r.b.dispatch_all().await;
    assert_eq!(receiver.hook_types(), ["TOOL_DEGRADED", "TOOL_RECOVERED"]);
}

on_both_backends!(
    a_local_mcp_program_is_started_only_when_allowed_and_given_only_its_variables,
    a_local_mcp_program_is_started_only_when_allowed_and_given_only_its_variables
);
async fn a_local_mcp_program_is_started_only_when_allowed_and_given_only_its_variables(kind: Kind) {
    use pulse_shared::domain::ToolKind;
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    let mut server = McpServer::local(
        vec![env!("CARGO_BIN_EXE_fake-mcp-stdio").to_owned()],
        vec!["CARGO_MANIFEST_DIR".to_owned()],
        Vec::new(),
        Duration::from_secs(10),
    )
    .unwrap();
    server.policy = Some(ToolPolicy::Allow);
    let name = ToolName::parse("local").unwrap();
    // Off (as on Lambda): never started.
    let off = b.connected().agent_tools(b.clock.clone(), &services);
    let why = off.clients().list(&name, &server).await.unwrap_err();
    assert!(why.contains("PULSE_MCP_STDIO=on"), "{why}");
    // On: started, listed, called.
    let tools = b
        .connected()
        .agent_tools_with(b.clock.clone(), &services, true);
    let tool = Tool::mcp(name.clone(), server, b.now());
    b.store.add_tool(&tool).await.unwrap();
    let tool = tools.refresh(&tool).await.unwrap().0;
    let ToolKind::Mcp(listed) = &tool.kind else {
        unreachable!()
    };
    assert_eq!(listed.tools.len(), 7, "{:?}", listed.tools);
    let worker = b
        .connected()
        .worker_with(b.clock.clone(), &settings(), &services, tools.clone());
    let (agent, _) = b.agent("scout", "10m").await;
    let lifecycle = b.connected().lifecycle(b.clock.clone(), &settings());
    let changes = AgentChanges {
        tools: Some(AgentTool::parse_list("mcp:local").unwrap()),
        ..AgentChanges::default()
    };
    lifecycle.update(&agent.id, &changes).await.unwrap();
    llm.script([
        Scripted::tool("local__add", json!({"a": 2, "b": 3})),
        Scripted::tool("local__env", json!({})),
        Scripted::text("done"),
    ]);
    b.say(&agent, "add and look around").await;
    b.drain(&worker).await;
    let results: Vec<String> = llm.requests()[2].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("\"5\""), "{}", results[0]);
    let names: Value = serde_json::from_str(&results[1]).unwrap();
    let names = names["content"][0].as_str().unwrap().to_owned();
    let names: Vec<&str> = names.split(',').collect();
    assert!(names.contains(&"CARGO_MANIFEST_DIR"), "{names:?}");
    assert!(names.contains(&"PATH"), "{names:?}");
    for secret in ["PULSE_TEST_MOTO_URL", "CARGO", "RUST_BACKTRACE"] {
        if std::env::var_os(secret).is_some() {
            assert!(!names.contains(&secret), "{secret} was passed: {names:?}");
        }
    }
}

on_both_backends!(
    a_tools_images_reach_a_model_that_sees_images_and_a_note_reaches_one_that_does_not,
    a_tools_images_reach_a_model_that_sees_images_and_a_note_reaches_one_that_does_not
);
async fn a_tools_images_reach_a_model_that_sees_images_and_a_note_reaches_one_that_does_not(
    kind: Kind,
) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    for (n, vision) in [(0, true), (2, false)] {
        let mut a = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
        let before = a.clone();
        a.llm.vision = Some(vision);
        r.b.store.update_agent(&a, &before).await.unwrap();
        r.llm.script([
            Scripted::tool("cal__picture", json!({})),
            Scripted::text("a red dot"),
        ]);
        r.turn(&a, "draw").await;
        let messages = r.llm.requests()[n + 1].body["messages"].clone();
        let images: Vec<&Value> = messages
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user" && m["content"].is_array())
            .flat_map(|m| m["content"].as_array().unwrap())
            .filter(|p| p["type"] == "image_url")
            .collect();
        let result = r.results(n + 1).pop().unwrap();
        assert!(
            result.contains("a red dot") && result.contains("[image"),
            "{result}"
        );
        assert!(
            !result.contains("aGVsbG8="),
            "the image is not in the text: {result}"
        );
        if vision {
            assert_eq!(images.len(), 1, "{messages}");
            assert_eq!(
                images[0]["image_url"]["url"],
                "data:image/png;base64,aGVsbG8="
            );
        } else {
            assert!(images.is_empty(), "{messages}");
        }
    }
    // The log keeps the answer without the image's bytes.
    let actions = r.b.store.list_actions(&agent.id, 5).await.unwrap();
    assert!(
        actions.iter().all(|a| !a
            .response
            .as_ref()
            .unwrap()
            .to_string()
            .contains("aGVsbG8=")),
        "{actions:?}"
    );
}

on_both_backends!(
    a_call_made_by_a_turn_a_newer_message_dropped_is_not_made_again_by_the_turn_answering_both,
    taken_over
);
async fn taken_over(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let book = json!({"text": "a table for two at 8"});
    r.llm.hold();
    r.llm.script([
        Scripted::tool("cal__note", book.clone()),
        // The turn answering both messages asks for the same call...
        Scripted::tool("cal__note", book.clone()),
        Scripted::text("Booked a table for two at 8, and asked for a high chair."),
    ]);
    r.b.say(&agent, "book us a table for two at 8").await;
    let user = async {
        // The first step calls the tool; the second is being written when...
        r.llm.wait_for(1).await;
        r.llm.release_one();
        r.llm.wait_for(2).await;
        assert_eq!(r.mcp.calls().len(), 1);
        // ...a second message arrives: that step is dropped.
        r.b.advance(jiff::SignedDuration::from_millis(10));
        r.b.say(&agent, "and a high chair please").await;
        r.llm.wait_abandoned(1).await;
        r.llm.release();
    };
    let (handled, ()) = tokio::join!(r.b.drain(&r.worker), user);
    assert_eq!(handled, 2);
    // ...and is answered from the call made, not sent again.
    assert_eq!(r.mcp.calls().len(), 1, "booked once");
    // The turn answering both was told what the dropped one had done, after both
    // messages.
    let third = &r.llm.requests()[2].body["messages"];
    let texts = third.to_string();
    assert!(texts.contains("high chair please"), "{texts}");
    let messages = third.as_array().unwrap();
    let called = messages
        .iter()
        .position(|m| {
            m["role"] == "assistant" && m["tool_calls"][0]["function"]["name"] == "cal__note"
        })
        .expect("the dropped turn's call, in the context");
    assert_eq!(messages[called + 1]["role"], "tool");
    assert!(
        messages[called + 1]["content"]
            .as_str()
            .unwrap()
            .contains("noted")
    );
    let turns = r.b.store.list_turns(&agent.id, 5).await.unwrap();
    assert_eq!(turns.len(), 2);
    assert!(turns[1].superseded());
    assert_eq!(
        turns[0].parts,
        ["Booked a table for two at 8, and asked for a high chair."]
    );
    // The answer the turn's model got for its own call is the one the server gave.
    assert_eq!(r.results(3).len(), 2, "{:?}", r.results(3));
    assert!(r.results(3).iter().all(|res| res.contains("noted")));

    // Asked again in a later turn, the call is made: only a turn taken over is reused.
    r.llm.script([
        Scripted::tool("cal__note", book.clone()),
        Scripted::text("Booked another."),
    ]);
    r.turn(&agent, "book the same again for tomorrow").await;
    assert_eq!(r.mcp.calls().len(), 2);
}

on_both_backends!(
    a_dropped_turns_reminder_and_memory_are_made_once_and_its_failed_call_is_tried_again,
    taken_over_built_ins
);
async fn taken_over_built_ins(kind: Kind) {
    let r = rig(kind).await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    let calls = Scripted::Answer {
        text: None,
        tools: vec![
            (
                "schedule".to_owned(),
                json!({"in": "90m", "note": "call mum"}),
            ),
            (
                "remember".to_owned(),
                json!({"text": "mum's birthday is on Sunday"}),
            ),
            ("cal__fail".to_owned(), json!({})),
        ],
    };
    r.llm.hold();
    // The turn answering both messages asks for the same three calls.
    r.llm
        .script([calls.clone(), calls, Scripted::text("All set.")]);
    r.b.say(
        &agent,
        "remind me to call mum in 90 minutes; her birthday is Sunday",
    )
    .await;
    let user = async {
        r.llm.wait_for(1).await;
        r.llm.release_one();
        // The three calls are made; the next step is being written when...
        r.llm.wait_for(2).await;
        assert_eq!(r.mcp.calls().len(), 1);
        // ...a second message arrives, and that step is dropped.
        r.b.advance(jiff::SignedDuration::from_millis(10));
        r.b.say(&agent, "and put it in the calendar").await;
        r.llm.wait_abandoned(1).await;
        r.llm.release();
    };
    let (handled, ()) = tokio::join!(r.b.drain(&r.worker), user);
    assert_eq!(handled, 2);
    let turns = r.b.store.list_turns(&agent.id, 5).await.unwrap();
    assert!(turns[1].superseded(), "{turns:?}");
    assert_eq!(turns[0].parts, ["All set."]);
    // One reminder, one memory: what the dropped turn did is not done again...
    let schedules = r.b.store.schedules(&agent.id).await.unwrap();
    assert_eq!(schedules.len(), 1, "{schedules:?}");
    let memories = r.b.store.all_memories(&agent.id).await.unwrap();
    assert_eq!(memories.len(), 1, "{memories:?}");
    // ...but the call that failed is tried again.
    let sent: Vec<String> = r.mcp.calls().into_iter().map(|c| c.name).collect();
    assert_eq!(sent, ["fail", "fail"]);
    // The model was told what the dropped turn's calls answered.
    let results = r.results(3);
    assert_eq!(results.len(), 6, "{results:?}");
    assert_eq!(results[3], results[0], "the reminder's answer, reused");
    assert_eq!(results[4], results[1], "the memory's answer, reused");
    assert!(results[5].contains("the calendar is locked"), "{results:?}");
}

on_both_backends!(
    a_slow_tool_never_holds_the_persons_turn_a_read_only_call_is_dropped_another_finishes_behind,
    slow_calls
);
async fn slow_calls(kind: Kind) {
    use pulse_shared::domain::ActionStatus;
    let r = rig(kind).await;
    r.register(Duration::from_secs(30)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    async fn called(r: &Rig, n: usize) {
        while r.mcp.calls().len() < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    async fn status(
        r: &Rig,
        agent: &pulse_shared::domain::Agent,
        tool: &str,
    ) -> Option<ActionStatus> {
        r.b.store
            .list_actions(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.call.as_ref().is_some_and(|c| c.tool == tool))
            .map(|a| a.status)
    }

    // A read-only lookup that takes 20 s, and the person writes again meanwhile.
    r.llm.script([
        Scripted::tool("cal__lookup", json!({"ms": 20_000})),
        Scripted::text("Never mind the lookup: it is 9 o'clock."),
    ]);
    r.b.say(&agent, "look up the opening hours").await;
    let user = async {
        called(&r, 1).await;
        r.b.advance(jiff::SignedDuration::from_millis(10));
        r.b.say(&agent, "never mind, what time is it?").await;
    };
    let (handled, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(r.b.drain(&r.worker), user)
    })
    .await
    .expect("the person waited for the 20 s call");
    assert_eq!(handled, 2);
    let turns = r.b.store.list_turns(&agent.id, 5).await.unwrap();
    assert!(turns[1].superseded(), "{turns:?}");
    assert_eq!(turns[0].parts, ["Never mind the lookup: it is 9 o'clock."]);
    assert_eq!(
        status(&r, &agent, "lookup").await,
        Some(ActionStatus::Cancelled)
    );

    // A call that is not safe to make again (no annotation, the server not marked
    // idempotent) goes on behind the answer, and its outcome is recorded.
    r.b.advance(jiff::SignedDuration::from_secs(60));
    r.llm.script([
        Scripted::tool("cal__slow", json!({"ms": 3_000})),
        Scripted::text("Booking it; ask me anything meanwhile."),
    ]);
    r.b.say(&agent, "book the usual table").await;
    let user = async {
        called(&r, 2).await;
        r.b.advance(jiff::SignedDuration::from_millis(10));
        r.b.say(&agent, "and is it sunny?").await;
    };
    let (handled, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(r.b.drain(&r.worker), user)
    })
    .await
    .unwrap();
    assert_eq!(handled, 2);
    let told = r.results(3);
    assert!(
        told.iter().any(|t| t.contains("still being made")),
        "{told:?}"
    );
    for _ in 0..200 {
        if status(&r, &agent, "slow").await == Some(ActionStatus::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status(&r, &agent, "slow").await,
        Some(ActionStatus::Completed),
        "finished behind"
    );
    let sent: Vec<String> = r.mcp.calls().into_iter().map(|c| c.name).collect();
    assert_eq!(sent, ["lookup", "slow"], "made once each");
}

on_both_backends!(
    a_long_tool_answer_reaches_the_model_and_the_records_clipped,
    long_answer
);
async fn long_answer(kind: Kind) {
    let r = rig(kind).await;
    r.mcp.add_tool("big", "Answers at length.").await;
    r.register(Duration::from_secs(5)).await;
    let agent = r.agent("scout", "mcp:cal").await;
    r.llm.script([
        Scripted::tool("cal__big", json!({"bytes": 900_000})),
        Scripted::text("It said a lot."),
    ]);
    r.turn(&agent, "read it all").await;
    let limit = pulse_shared::engine::transcript::RESULT_BYTES;
    // The model is given the start of it, and how much was left out.
    let results = r.results(1);
    assert_eq!(results.len(), 1);
    assert!(results[0].len() <= limit, "{} bytes", results[0].len());
    assert!(
        results[0].starts_with("{\"content\":[\"bbbb"),
        "{}",
        &results[0][..40]
    );
    assert!(results[0].contains("more bytes]"), "the cut is marked");
    let whole = serde_json::to_string(&r.llm.requests()[1].body)
        .unwrap()
        .len();
    assert!(whole < 64 * 1024, "the second request is {whole} bytes");
    // The turn keeps it clipped, and so does the action log.
    let turn = r.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    let step = turn.steps.iter().find(|s| s["kind"] == "tool").unwrap();
    assert!(step["result"].to_string().len() <= limit);
    let actions = r.b.store.list_actions(&agent.id, 10).await.unwrap();
    let call = actions.iter().find(|a| a.call.is_some()).unwrap();
    assert!(call.response.as_ref().unwrap().to_string().len() <= limit + 64);
}

on_both_backends!(
    one_answer_makes_at_most_sixteen_tool_calls,
    one_answer_makes_at_most_sixteen_tool_calls
);
/// One answer asking for 1,000 `remember` calls makes 16 of them; each of the rest is
/// answered "not made", and nothing is kept for it.
async fn one_answer_makes_at_most_sixteen_tool_calls(kind: Kind) {
    let r = rig(kind).await;
    let agent = r.agent("scout", "").await;
    let calls = (0..1_000)
        .map(|i| ("remember".to_owned(), json!({"text": format!("fact {i}")})))
        .collect();
    r.llm.script([
        Scripted::Answer {
            text: None,
            tools: calls,
        },
        Scripted::text("Kept some."),
    ]);
    r.turn(&agent, "remember a thousand things").await;
    let kept = r.b.store.memories(&agent.id, 2_000).await.unwrap();
    let cap = pulse_shared::engine::transcript::CALLS_PER_ANSWER;
    assert_eq!(kept.len(), cap, "{} memories", kept.len());
    let results = r.results(1);
    assert_eq!(results.len(), 1_000, "every call is answered");
    let refused = results.iter().filter(|r| r.contains("not made")).count();
    assert_eq!(refused, 1_000 - cap);
    assert!(
        results[cap].contains("at most 16 tool calls"),
        "{}",
        results[cap]
    );
    assert!(!results[0].contains("not made"));
    // The turn keeps its steps as steps, within what a turn holds.
    let turn = r.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    let size = serde_json::to_string(&turn.steps).unwrap().len();
    assert!(size <= pulse_shared::domain::Turn::KEPT_STEPS, "{size}");
    assert_eq!(turn.steps[0]["kind"], "llm");
    assert_eq!(turn.steps[1]["kind"], "tool");
    assert_eq!(turn.steps[1]["name"], "remember");
}

on_both_backends!(
    a_step_whose_prompt_the_results_pushed_past_the_budget_is_not_made,
    a_step_whose_prompt_the_results_pushed_past_the_budget_is_not_made
);
/// The heartbeat agent does not send a prompt its results have pushed past the token
/// budget: sixteen 16 KiB answers (about 65,000 tokens) end the run after one step.
async fn a_step_whose_prompt_the_results_pushed_past_the_budget_is_not_made(kind: Kind) {
    let r = rig(kind).await;
    r.mcp.add_tool("big", "Answers at length.").await;
    r.register(Duration::from_secs(5)).await;
    let mut agent = r.agent("scout", "mcp:cal").await;
    agent.think = pulse_shared::domain::ThinkPolicy::Always;
    agent.budgets.max_tokens = 50_000;
    let before = r.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    r.b.store.update_agent(&agent, &before).await.unwrap();
    let calls = (0..16)
        .map(|_| ("cal__big".to_owned(), json!({"bytes": 900_000})))
        .collect();
    r.llm.script([
        Scripted::Answer {
            text: None,
            tools: calls,
        },
        Scripted::text("never asked"),
    ]);
    let swept = r.b.sweeper(settings()).sweep_once(r.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    r.b.drain(&r.worker).await;
    assert_eq!(r.mcp.calls().len(), 16);
    assert_eq!(r.llm.requests().len(), 1, "the second step was not sent");
    let actions = r.b.store.list_actions(&agent.id, 30).await.unwrap();
    let thought = actions
        .iter()
        .find(|a| a.tool.as_str() == pulse_shared::domain::HEARTBEAT_AGENT)
        .unwrap();
    let stop = thought.response.as_ref().unwrap()["output"]["budget_stop"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(stop.starts_with("max_tokens"), "{stop}");
    let needs: u64 = stop
        .split("next prompt needs about ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
    assert!(needs > 60_000, "{stop}");
}

on_both_backends!(
    the_tool_definitions_of_one_request_stay_within_their_budget,
    the_tool_definitions_of_one_request_stay_within_their_budget
);
/// A server of 64 tools with large schemas (about 1 MB of definitions) is kept as far as
/// 256 KiB of definitions (a DynamoDB item holds 400 KB: the whole list was refused
/// there), each tool left out said, and offered only as far as 64 KiB a request.
async fn the_tool_definitions_of_one_request_stay_within_their_budget(kind: Kind) {
    let r = rig(kind).await;
    r.mcp.add_wide_tools(58).await;
    let tool = r.register(Duration::from_secs(5)).await;
    let kept = &tool.mcp_server().unwrap().tools;
    let bytes: usize = kept.iter().map(|t| t.definition_bytes()).sum();
    assert!(
        bytes <= pulse_shared::domain::MAX_KEPT_BYTES && bytes > 200 * 1024,
        "{bytes} bytes kept"
    );
    assert!(kept.len() > 12 && kept.len() < 64, "{} kept", kept.len());
    let (again, left_out) = r.tools.refresh(&tool).await.unwrap();
    assert_eq!(again.mcp_server().unwrap().tools.len(), kept.len());
    assert_eq!(
        left_out.len(),
        64 - kept.len(),
        "each tool left out is said"
    );
    assert!(left_out[0].contains("256 KiB"), "{left_out:?}");
    assert!(
        !kept.iter().any(|t| t.name == "wide57"),
        "the last is past the bound"
    );
    // A tool an allow-list names is kept however late the server lists it.
    let allowing = McpServer::new(
        &r.mcp.url(),
        vec![McpHeader::parse("Authorization: Bearer s3cret").unwrap()],
        vec!["wide57".into(), "add".into()],
        Duration::from_secs(5),
    )
    .unwrap();
    let named = Tool::mcp(ToolName::parse("named").unwrap(), allowing, r.b.now());
    r.b.store.add_tool(&named).await.unwrap();
    let (named, _) = r.tools.refresh(&named).await.unwrap();
    let kept: Vec<&str> = named
        .mcp_server()
        .unwrap()
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        kept.contains(&"wide57") && kept.contains(&"add"),
        "{kept:?}"
    );
    assert!(named.mcp_server().unwrap().missing_allowed().is_empty());
    let agent = r.agent("scout", "mcp:cal").await;
    r.llm.script([Scripted::text("hello")]);
    r.turn(&agent, "hi").await;
    let tools = r.llm.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .clone();
    let mcp: Vec<&Value> = tools
        .iter()
        .filter(|t| t["function"]["name"].as_str().unwrap().starts_with("cal__"))
        .collect();
    let bytes: usize = mcp.iter().map(|t| t.to_string().len()).sum();
    assert!(bytes <= 66 * 1024, "{bytes} bytes of definitions");
    let names: Vec<&str> = mcp
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    // The small ones listed first are all offered, and as many wide ones as fit.
    for n in [
        "cal__add",
        "cal__note",
        "cal__lookup",
        "cal__wide0",
        "cal__wide1",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    assert!(names.len() < 12, "{names:?}");
    assert!(tools.iter().any(|t| t["function"]["name"] == "remember"));
}
