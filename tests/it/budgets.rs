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
    // The two heartbeats past the budget ended skipped, saying why.
    let ended: Vec<_> =
        w.b.store
            .list_heartbeats(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|h| h.outcome)
            .filter(|o| o.kind == pulse_shared::domain::OutcomeKind::Skipped)
            .collect();
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(
        ended
            .iter()
            .all(|o| o.reason.contains("daily token budget spent")),
        "{ended:?}"
    );
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

/// An answer of the fake model (OpenAI's wire) whose prompt was `prompt` tokens.
fn answer(text: &str, prompt: u64) -> pulse_tests::fake_llm::Scripted {
    pulse_tests::fake_llm::Scripted::Raw(json!({
        "id": "chatcmpl_priced", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5}
    }))
}

on_both_backends!(
    a_dollar_budget_holds_each_calls_worst_case_tells_its_thresholds_once_and_answers_past_it_without_the_model,
    dollar_budget
);
/// Prices where a thousand prompt tokens cost a dollar and answers nothing: each of
/// this test's turns costs $1.10 (1,100 tokens, as the fake model says), and its worst
/// case — the prompt as Pulse estimates it, with margins — about $1.40.
async fn dollar_budget(kind: Kind) {
    use pulse_shared::domain::Usd;
    use pulse_shared::engine::{Prices, dollars};
    let mut s = settings();
    s.prices = std::sync::Arc::new(
        Prices::with_overrides(r#"{"models": {"gpt-4o-mini": {"input": 1000, "output": 0}}}"#)
            .unwrap(),
    );
    let w = world_with(kind, s).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "81").await;
    let agent = w
        .change(
            &agent,
            AgentChanges {
                usd_day: Some(Some(Usd::parse_budget("2.60").unwrap())),
                ..AgentChanges::default()
            },
        )
        .await;
    w.hook(&agent, "BUDGET_THRESHOLD", &receiver.url()).await;
    let day = dollars::limits(&agent, w.b.now())[0].period.clone();
    let spent = || {
        let (store, id, day) = (w.b.store.clone(), agent.id.clone(), day.clone());
        async move { store.usd_tallies(&id, &[day]).await.unwrap().remove(0) }
    };

    w.llm.script([answer("one", 1_100), answer("two", 1_100)]);
    w.say(&agent, "first").await;
    let t = spent().await;
    assert_eq!((t.spent, t.held), (Usd::from_micros(1_100_000), Usd::ZERO));
    assert_eq!(
        w.events_of(&agent, "BUDGET_THRESHOLD").await,
        0,
        "42 %: none yet"
    );
    w.b.advance(SignedDuration::from_secs(5));
    w.say(&agent, "second").await;
    assert_eq!(w.calls(), 2);
    assert_eq!(spent().await.spent, Usd::from_micros(2_200_000));
    assert_eq!(
        w.events_of(&agent, "BUDGET_THRESHOLD").await,
        2,
        "85 %: 50 and 80 at once"
    );
    // $0.40 left, and the next call's worst case is more: it is not made, the person is
    // told in a fixed line when the model answers again, and 100 % is told.
    w.b.advance(SignedDuration::from_secs(5));
    w.say(&agent, "third").await;
    assert_eq!(w.calls(), 2, "no model call");
    let posted = w.discord.messages();
    let line = &posted.last().unwrap().content;
    assert!(
        line.contains("today's budget of $2.60") && line.contains("at midnight"),
        "{line}"
    );
    let turn = &w.b.store.list_turns(&agent.id, 1).await.unwrap()[0];
    assert_eq!(
        (turn.provider.as_str(), turn.model.as_str()),
        ("pulse", "none")
    );
    assert_eq!(turn.status, TurnStatus::Done, "answered, by Pulse");
    // Again: the same line, and no threshold told twice.
    w.b.advance(SignedDuration::from_secs(5));
    w.say(&agent, "fourth").await;
    assert_eq!(w.calls(), 2);
    assert_eq!(w.events_of(&agent, "BUDGET_THRESHOLD").await, 3);
    assert_eq!(w.dispatch().await, 3, "50, 80, 100: each once");
    let mut percents: Vec<u64> = receiver
        .received()
        .iter()
        .map(|r| r.json()["data"]["percent"].as_u64().unwrap())
        .collect();
    percents.sort();
    assert_eq!(percents, [50, 80, 100]);
    // A heartbeat past the budget makes no call either: its action is SKIPPED, why said.
    w.b.advance(SignedDuration::from_mins(11));
    assert_eq!(w.beat().await, 1);
    assert_eq!(w.calls(), 2);
    let skipped =
        w.b.store
            .list_actions(&agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.tool.as_str() == "heartbeat-agent")
            .unwrap();
    assert_eq!(skipped.status, ActionStatus::Skipped);
    assert!(
        skipped
            .error
            .as_deref()
            .unwrap()
            .contains("dollar budget spent: $2.20 of today's $2.60"),
        "{:?}",
        skipped.error
    );
    // Past two thirds, the model reads what is left (raised to $3.20: $1.00 left).
    let raised = w
        .change(
            &agent,
            AgentChanges {
                usd_day: Some(Some(Usd::parse_budget("3.20").unwrap())),
                ..AgentChanges::default()
            },
        )
        .await;
    let line = dollars::left_line(w.b.store.as_ref(), &raised, w.b.now())
        .await
        .unwrap()
        .unwrap();
    assert!(
        line.starts_with("Budget: $1.00 of today's $3.20 is left"),
        "{line}"
    );
    // A new day, a new budget.
    let midnight = budget::next_midnight(&agent, w.b.now());
    w.b.advance(midnight.duration_since(w.b.now()) + SignedDuration::from_mins(1));
    w.llm.script([answer("morning", 1_100)]);
    w.say(&raised, "good morning").await;
    assert_eq!(w.calls(), 3);
}

on_both_backends!(
    past_its_calls_a_minute_a_heartbeat_yields_its_window_and_a_turn_waits_its_turn,
    calls_per_minute
);
async fn calls_per_minute(kind: Kind) {
    use pulse_shared::domain::HeartbeatStatus;
    use pulse_tests::fake_llm::Scripted;
    let w = world_with(kind, settings()).await;
    let agent = w.agent("10m", "81").await;
    let agent = w
        .change(
            &agent,
            AgentChanges {
                max_calls_per_minute: Some(Some(1)),
                ..AgentChanges::default()
            },
        )
        .await;
    // The heartbeat's model asks for a tool: its second call would be the minute's
    // second, so the heartbeat yields, CANCELLED, and its window goes to the next.
    w.llm.script([
        Scripted::tool("recall", json!({"query": "tea"})),
        Scripted::text("hello"),
    ]);
    assert_eq!(w.beat().await, 1);
    assert_eq!(w.calls(), 1, "one call in the minute");
    let hb = w.latest(&agent).await;
    let first =
        w.b.store
            .heartbeats_page(&agent.id, None, 2)
            .await
            .unwrap()
            .into_iter()
            .find(|h| h.beat == hb.beat - 1)
            .unwrap();
    assert_eq!(first.status, HeartbeatStatus::Cancelled, "{first:?}");
    assert!(
        first
            .error
            .as_deref()
            .unwrap_or("")
            .contains("calls per minute"),
        "{:?}",
        first.error
    );
    assert_eq!(
        hb.window_start, first.window_start,
        "the window is handed on"
    );
    // A message in the same minute: its turn waits, kept, and is tried again.
    w.say(&agent, "hello").await;
    assert_eq!(w.calls(), 1, "no second call in the minute");
    let waiting = w.b.store.list_waiting(10).await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert!(
        waiting[0].reason.contains("calls per minute"),
        "{}",
        waiting[0].reason
    );
    // The next minute, the sweep tries it again and it is answered.
    w.b.advance(SignedDuration::from_secs(61));
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    w.b.drain(&w.worker).await;
    assert_eq!(w.calls(), 2);
    assert!(w.b.store.list_waiting(10).await.unwrap().is_empty());
    assert_eq!(w.discord.messages().last().unwrap().content, "hello");
}
