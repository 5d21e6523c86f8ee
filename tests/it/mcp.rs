//! MCP servers as agent tools, against a real MCP server (the SDK's server side, over
//! streamable HTTP on loopback) and the fake model: listed, offered to the attached
//! agents only, called with their arguments, their answers and failures given back to
//! the model; expired sessions, changed lists, lost answers and refused URLs.

use std::time::Duration;

use pulse_shared::domain::{AgentChanges, AgentTool, McpHeader, McpServer, Tool, ToolName};
use pulse_shared::engine::Worker;
use pulse_shared::engine::agent_tools::AgentTools;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::fake_mcp::FakeMcp;
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};

struct Rig {
    b: Backend,
    llm: FakeLlm,
    _discord: FakeDiscord,
    mcp: FakeMcp,
    tools: std::sync::Arc<AgentTools>,
    worker: Worker,
}

async fn rig(kind: Kind) -> Rig {
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
        _discord: discord,
        mcp,
        tools,
        worker,
    }
}

impl Rig {
    /// Registers the fake as `cal`, with `timeout`, and lists its tools.
    async fn register(&self, timeout: Duration) -> Tool {
        let server = McpServer::new(
            &self.mcp.url(),
            vec![McpHeader::parse("Authorization: Bearer s3cret").unwrap()],
            Vec::new(),
            timeout,
        )
        .unwrap();
        let tool = Tool::mcp(ToolName::parse("cal").unwrap(), server, self.b.now());
        self.b.store.add_tool(&tool).await.unwrap();
        self.tools.refresh(&tool).await.unwrap().0
    }

    /// An agent, given `tools`.
    async fn agent(&self, name: &str, tools: &str) -> pulse_shared::domain::Agent {
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
    async fn turn(&self, agent: &pulse_shared::domain::Agent, text: &str) {
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
    fn results(&self, n: usize) -> Vec<String> {
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
    assert_eq!(names, ["add", "note", "fail", "slow", "picture"]);
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
        5,
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_reach_the_model_as_failed_calls_and_nothing_is_done_twice_blindly() {
    let r = rig(Kind::Sqlite).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_opened_again_and_the_call_sent_with_the_same_key() {
    let r = rig(Kind::Sqlite).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tools_list_is_listed_again_before_the_next_turn() {
    let r = rig(Kind::Sqlite).await;
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
    r.llm.script([Scripted::text("sunny")]);
    r.turn(&agent, "weather?").await;
    let offered = r.offered(2);
    assert!(offered.iter().any(|o| o == "cal__weather"), "{offered:?}");
    let stored = r.b.store.load_registry().await.unwrap();
    let tools = &stored.tools.iter().find(|t| t.name == name).unwrap();
    assert_eq!(
        tools.mcp_server().unwrap().tools.len(),
        6,
        "the new list is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_the_egress_guard_refuses_and_servers_that_are_not_mcp_are_refused() {
    let r = rig(Kind::Sqlite).await;
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
