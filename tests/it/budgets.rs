//! What an agent may spend: the daily token budget (`--daily-tokens`) and the hourly
//! breaker (`--max-beats-per-hour`), end to end with a fake model, Discord and hook
//! receiver, on an injected clock.

use jiff::SignedDuration;
use pulse_shared::domain::{ActionStatus, Agent, AgentChanges, HeartbeatStatus, Spend, TurnStatus};
use pulse_shared::engine::{Toggled, budget};
use pulse_tests::fake_hooks::FakeReceiver;
use pulse_tests::{Kind, on_both_backends, settings};
use serde_json::json;

use crate::lifecycle::{World, world_with};

impl World {
    async fn change(&self, agent: &Agent, changes: AgentChanges) -> Agent {
        self.ops.update(&agent.id, &changes).await.unwrap().agent
    }

    async fn say(&self, agent: &Agent, text: &str) {
        self.b.say(agent, text).await;
        self.b.drain(&self.worker).await;
    }

    async fn events_of(&self, agent: &Agent, ty: &str) -> usize {
        self.b
            .store
            .list_events(&agent.id, 500)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.event_type.as_str() == ty)
            .count()
    }

    fn calls(&self) -> usize {
        self.llm.requests().len()
    }
}

on_both_backends!(
    a_spent_budget_holds_when_what_the_tools_found_makes_the_agent_think,
    budget_after_the_tools
);
/// A past defect: the budget was read before the tools ran, and only when the window
/// alone made the agent think; an inbox tool's events then made it think with the
/// budget unread, and the model was called every beat past the budget.
async fn budget_after_the_tools(kind: Kind) {
    use pulse_shared::domain::ThinkPolicy;
    use pulse_tests::{FakeTool, Reply};
    let w = world_with(kind, settings()).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "81").await;
    // 120 tokens a call: one call spends it.
    let agent = w
        .change(
            &agent,
            AgentChanges {
                daily_tokens: Some(Some(100)),
                think: Some(ThinkPolicy::Events),
                ..AgentChanges::default()
            },
        )
        .await;
    w.hook(&agent, "BUDGET_EXHAUSTED", &receiver.url()).await;
    // An inbox read on every heartbeat, which always has something new.
    let inbox = FakeTool::answering(|_| {
        Reply::Json(
            200,
            json!({"success": true, "output": {"unread": 1},
                   "new_events": [{"type": "NEW_MAIL", "payload": {"subject": "lunch?"}}]}),
        )
    })
    .await;
    w.b.tool("inbox", &inbox.url(), "HEARTBEAT").await;
    for _ in 0..4 {
        assert_eq!(w.beat().await, 1);
        w.b.advance(SignedDuration::from_mins(10) + SignedDuration::from_secs(5));
    }
    assert_eq!(inbox.requests().len(), 4, "the inbox ran every beat");
    assert_eq!(w.calls(), 1, "the first call spent the budget; none after");
    assert_eq!(w.events_of(&agent, "BUDGET_EXHAUSTED").await, 1);
    assert_eq!(w.dispatch().await, 1, "the hook fired once");
    assert_eq!(receiver.hook_types(), ["BUDGET_EXHAUSTED"]);
}

on_both_backends!(
    a_spent_daily_budget_stops_the_model_tells_the_user_once_and_renews_at_midnight,
    daily_budget
);
async fn daily_budget(kind: Kind) {
    let w = world_with(kind, settings()).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "81").await;
    let agent = w
        .change(
            &agent,
            AgentChanges {
                daily_tokens: Some(Some(300)),
                ..AgentChanges::default()
            },
        )
        .await;
    w.hook(&agent, "BUDGET_EXHAUSTED", &receiver.url()).await;

    // The fake model uses 120 tokens a call: the third call passes 300, then none.
    for _ in 0..5 {
        assert_eq!(w.beat().await, 1);
        w.b.advance(SignedDuration::from_mins(10) + SignedDuration::from_secs(5));
    }
    assert_eq!(w.calls(), 3, "calls stop once the budget is spent");
    let today = budget::spent_today(w.b.store.as_ref(), &agent, w.b.now())
        .await
        .unwrap();
    assert_eq!(today.spent, 360, "the ledger holds every call's tokens");
    let runs: Vec<_> =
        w.b.store
            .list_actions(&agent.id, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.tool.as_str() == "heartbeat-agent")
            .collect();
    let skipped: Vec<_> = runs
        .iter()
        .filter(|a| a.status == ActionStatus::Skipped)
        .collect();
    assert_eq!(skipped.len(), 2, "{runs:?}");
    for a in &skipped {
        let why = a.error.as_deref().unwrap();
        assert!(
            why.contains("daily token budget spent: 360 of 300"),
            "{why}"
        );
    }
    assert_eq!(
        w.events_of(&agent, "BUDGET_EXHAUSTED").await,
        1,
        "once a day"
    );

    // A user message gets one short notice, without a model call; the next, nothing.
    w.say(&agent, "are you there?").await;
    assert_eq!(w.calls(), 3);
    let posted = w.discord.messages();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(
        posted[0].content.contains("budget of 300 tokens"),
        "{:?}",
        posted[0]
    );
    w.b.advance(SignedDuration::from_secs(1));
    w.say(&agent, "hello?").await;
    assert_eq!(w.calls(), 3);
    assert_eq!(w.discord.messages().len(), 1, "one notice a day");
    let turns = w.b.store.list_turns(&agent.id, 10).await.unwrap();
    assert_eq!(turns.len(), 2, "both messages are answered turns");
    assert_eq!(turns[0].status, TurnStatus::Done);
    assert!(turns[0].parts.is_empty(), "the second has nothing to send");
    assert!(turns[0].error.as_deref().unwrap().contains("not answered"));
    let history = w.b.store.recent_messages(&agent.id, 10).await.unwrap();
    assert!(
        history.iter().any(|m| m.content == "hello?"),
        "what the user said is kept"
    );
    assert_eq!(w.events_of(&agent, "BUDGET_EXHAUSTED").await, 1);
    assert_eq!(w.dispatch().await, 1, "the hook fired once");
    assert_eq!(receiver.hook_types(), ["BUDGET_EXHAUSTED"]);

    // After midnight in the agent's zone, the model is called again.
    let midnight = budget::next_midnight(&agent, w.b.now());
    w.b.advance(midnight.duration_since(w.b.now()) + SignedDuration::from_mins(1));
    assert_eq!(w.beat().await, 1);
    assert_eq!(w.calls(), 4, "a new day, a new budget");
    let today = budget::spent_today(w.b.store.as_ref(), &agent, w.b.now())
        .await
        .unwrap();
    assert_eq!(today.spent, 120);
    assert!(!today.marked(Spend::EXHAUSTED));
}

on_both_backends!(
    the_breaker_pauses_an_agent_pulled_past_its_hourly_cap_and_resume_lifts_it,
    breaker
);
async fn breaker(kind: Kind) {
    // One event per window: a backlog makes every next heartbeat due at once.
    let mut s = settings();
    s.max_window_events = 1;
    let w = world_with(kind, s).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "82").await;
    let agent = w
        .change(
            &agent,
            AgentChanges {
                max_beats_per_hour: Some(Some(6)),
                ..AgentChanges::default()
            },
        )
        .await;
    w.hook(&agent, "BREAKER_TRIPPED", &receiver.url()).await;
    w.hook(&agent, "AGENT_PAUSED", &receiver.url()).await;
    for i in 0..20 {
        w.b.emit(&agent, "TICKET", json!({"n": i})).await;
    }
    w.b.advance(SignedDuration::from_secs(5));

    let mut claimed = 0;
    for _ in 0..12 {
        claimed += w.beat().await;
        w.b.advance(SignedDuration::from_secs(1));
    }
    assert_eq!(
        claimed, 7,
        "six heartbeats run, the seventh trips the breaker"
    );
    let hbs = w.b.store.list_heartbeats(&agent.id, 20).await.unwrap();
    let completed = hbs
        .iter()
        .filter(|h| h.status == HeartbeatStatus::Completed)
        .count();
    assert_eq!(completed, 6);
    let tripped = hbs.iter().find(|h| h.beat == 7).unwrap();
    assert_eq!(tripped.status, HeartbeatStatus::Cancelled);
    assert!(
        tripped
            .error
            .as_deref()
            .unwrap()
            .contains("breaker tripped: 7 heartbeats started within an hour"),
        "{tripped:?}"
    );
    assert_eq!(tripped.actions_triggered, 0, "it ran nothing");
    assert!(
        w.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .is_paused()
    );
    let next = w.latest(&agent).await;
    assert_eq!((next.beat, next.status), (8, HeartbeatStatus::Paused));
    assert_eq!(
        next.window_start, tripped.window_start,
        "its window is handed on"
    );
    assert_eq!(w.events_of(&agent, "BREAKER_TRIPPED").await, 1);
    assert_eq!(w.dispatch().await, 2);
    assert_eq!(receiver.hook_types(), ["AGENT_PAUSED", "BREAKER_TRIPPED"]);

    // Resumed, it runs again with a fresh hour, and reads what the tripped one left.
    assert!(matches!(
        w.ops.resume(&agent.id).await.unwrap(),
        Toggled::Done { .. }
    ));
    assert_eq!(w.beat().await, 1);
    let resumed = w.b.store.get_heartbeat(&next.id()).await.unwrap().unwrap();
    assert_eq!(resumed.status, HeartbeatStatus::Completed);
    assert_eq!(
        resumed.events_processed, 2,
        "one window event and its HEARTBEAT"
    );
}
