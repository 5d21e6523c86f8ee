//! Steering in a word: wake now (one heartbeat however often asked, through the quiet
//! period), snooze (kept back until its end, which comes on time), and the same said in
//! the conversation by the agent's owner — on both backends, with the manual clock.

use jiff::SignedDuration;
use pulse_shared::domain::{EventType, HeartbeatStatus, SignalMeta, WAKE_REQUESTED};
use pulse_shared::engine::steering::Woken;
use pulse_shared::engine::{LifecycleError, Toggled};
use pulse_tests::{Kind, on_both_backends};

use crate::lifecycle::world;

on_both_backends!(
    a_wake_asked_twice_makes_one_heartbeat_and_runs_through_the_quiet_period,
    wake_once
);
async fn wake_once(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1h", "1001").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    // The user just talked: the quiet period would hold a heartbeat back.
    w.b.say(&agent, "hello").await;
    w.b.drain(&w.worker).await;
    w.b.advance(SignedDuration::from_mins(1));
    let first = w.ops.wake(&agent.id).await.unwrap();
    assert_eq!(first, Woken::Due(w.b.now()));
    assert!(matches!(
        w.ops.wake(&agent.id).await.unwrap(),
        Woken::AlreadyDue(_)
    ));
    assert_eq!(w.beat().await, 1, "one heartbeat for two wakes");
    let ran = w.finished(&agent).await;
    assert_eq!(ran.status, HeartbeatStatus::Completed, "{ran:?}");
    let events = w.b.store.list_events(&agent.id, 50).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.event_type == EventType::parse(WAKE_REQUESTED).unwrap()),
        "the heartbeat read why it woke"
    );
    assert_eq!(w.beat().await, 0, "and nothing more is due");
}

on_both_backends!(
    a_snooze_holds_heartbeats_back_until_its_end_and_resume_ends_it,
    snooze
);
async fn snooze(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("30m", "1001").await;
    assert_eq!(w.beat().await, 1);
    for bad in [SignedDuration::ZERO, SignedDuration::from_hours(400 * 24)] {
        let e = w.ops.snooze(&agent.id, bad).await.unwrap_err();
        assert!(
            matches!(&e, LifecycleError::Invalid(v) if v.message.contains("a minute to 30 days")),
            "{e}"
        );
    }
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(
        stored.snoozed_until, None,
        "a refused snooze changes nothing"
    );
    let until = w
        .ops
        .snooze(&agent.id, SignedDuration::from_hours(2))
        .await
        .unwrap();
    assert_eq!(until, w.b.now() + SignedDuration::from_hours(2));
    assert_eq!(w.latest(&agent).await.scheduled_at, until);
    w.b.advance(SignedDuration::from_mins(90));
    assert_eq!(w.beat().await, 0, "snoozed");
    w.b.advance(SignedDuration::from_mins(31));
    assert_eq!(w.beat().await, 1, "the snooze ended on time");
    // Snoozed again, then resumed: due at once.
    w.ops
        .snooze(&agent.id, SignedDuration::from_hours(5))
        .await
        .unwrap();
    let resumed = w.ops.resume(&agent.id).await.unwrap();
    assert!(
        matches!(resumed, Toggled::Done { next_heartbeat_at: Some(at), .. } if at == w.b.now())
    );
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.snoozed_until, None);
    assert_eq!(w.beat().await, 1);
}

on_both_backends!(
    the_owner_steers_from_the_conversation_and_a_stranger_cannot,
    chat_commands
);
async fn chat_commands(kind: Kind) {
    let w = world(kind).await;
    let mut agent = w.agent("30m", "1001").await;
    assert_eq!(w.beat().await, 1);
    let asked_before = w.llm.requests().len();
    w.b.say(&agent, "/snooze 2h").await;
    w.b.drain(&w.worker).await;
    let said = w.discord.messages();
    assert!(
        said.last().unwrap().content.starts_with("Snoozed until"),
        "{said:?}"
    );
    assert_eq!(
        w.llm.requests().len(),
        asked_before,
        "no model call for a command"
    );
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(
        stored.snoozed_until,
        Some(w.b.now() + SignedDuration::from_hours(2))
    );

    // A stranger on Discord cannot pause it.
    agent.discord.users = vec!["42".into()];
    let before = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    w.b.store.update_agent(&agent, &before).await.unwrap();
    let quiet_from = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    // Later than the owner's last word: a command taken as one would move it.
    w.b.advance(SignedDuration::from_mins(5));
    let stranger = SignalMeta {
        source: Some("discord".into()),
        user_id: Some("999".into()),
        channel_id: Some("1001".into()),
        ..SignalMeta::default()
    };
    let s = pulse_shared::domain::Signal::user_message(
        &agent.id,
        &agent.session,
        "/pause",
        stranger,
        w.b.now(),
    )
    .unwrap();
    pulse_shared::engine::intake::submit(w.b.store.as_ref(), w.b.queue.as_ref(), s)
        .await
        .unwrap();
    w.b.drain(&w.worker).await;
    assert!(
        w.discord
            .messages()
            .last()
            .unwrap()
            .content
            .starts_with("Only my owner")
    );
    let after = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert!(!after.is_paused());
    // A stranger's command is no interaction, at intake nor at the turn's end: the
    // owner's quiet period still counts from their own last word.
    assert_eq!(after.last_interaction_at, quiet_from.last_interaction_at);

    // The owner sets quiet hours, and wakes it (which ends the snooze).
    w.b.say(&agent, "/quiet 22:00-07:00").await;
    w.b.say(&agent, "/heartbeat").await;
    w.b.drain(&w.worker).await;
    let reply = w.discord.messages().last().unwrap().content.clone();
    assert!(
        reply.contains("Quiet hours set") && reply.contains("Waking up now"),
        "{reply}"
    );
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.active_hours.unwrap().to_string(), "07:00-22:00");
    assert_eq!(stored.snoozed_until, None);
    // A command with a bad argument says how to write it.
    w.b.say(&agent, "/snooze whenever").await;
    w.b.drain(&w.worker).await;
    assert!(
        w.discord
            .messages()
            .last()
            .unwrap()
            .content
            .contains("/snooze 2h")
    );
}

on_both_backends!(
    an_agent_whose_user_is_silent_stops_beating_keeps_its_reminders_and_wakes_when_they_write,
    auto_pause
);
async fn auto_pause(kind: Kind) {
    use pulse_shared::domain::{AgentChanges, ScheduleRule};
    let w = world(kind).await;
    let agent = w.agent("1d", "1001").await;
    let changes = AgentChanges {
        auto_pause_after: Some(Some("14d".parse().unwrap())),
        ..AgentChanges::default()
    };
    w.ops.update(&agent.id, &changes).await.unwrap();
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    w.hook(&agent, "AGENT_AUTO_PAUSED", &receiver.url()).await;
    w.hook(&agent, "AGENT_RESUMED", &receiver.url()).await;
    assert_eq!(w.beat().await, 1);
    w.b.say(&agent, "see you in a while").await;
    w.b.drain(&w.worker).await;
    let last_word = w.b.now();
    // A heartbeat a day while the user is quiet, until the silence reaches 14 days.
    for _ in 0..15 {
        w.b.advance(SignedDuration::from_hours(24));
        w.beat().await;
    }
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    let since = stored.auto_paused_since.expect("auto-paused");
    assert!(
        since.duration_since(last_word).abs() < SignedDuration::from_mins(1),
        "{since} vs {last_word}"
    );
    assert_eq!(w.dispatch().await, 1, "AGENT_AUTO_PAUSED, once");
    assert!(w.latest(&agent).await.scheduled_at > w.b.now() + SignedDuration::from_hours(300 * 24));
    w.b.advance(SignedDuration::from_hours(48));
    assert_eq!(w.beat().await, 0, "no heartbeats of its own");

    // A reminder the user set still fires.
    let at = w.b.now() + SignedDuration::from_hours(1);
    w.ops
        .schedule(
            &agent.id,
            ScheduleRule::Once { at },
            Some("water the plants".into()),
        )
        .await
        .unwrap();
    w.b.advance(SignedDuration::from_mins(61));
    assert_eq!(w.beat().await, 1, "the reminder's heartbeat");
    let events = w.b.store.list_events(&agent.id, 50).await.unwrap();
    assert!(events.iter().any(|e| e.event_type.as_str() == "SCHEDULED"));
    w.b.advance(SignedDuration::from_hours(25));
    w.beat().await;
    assert_eq!(w.dispatch().await, 0, "still auto-paused, not marked twice");

    // The user writes: it is back, and beats again after the quiet period.
    w.b.say(&agent, "I'm back").await;
    w.b.drain(&w.worker).await;
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.auto_paused_since, None);
    assert_eq!(w.dispatch().await, 1, "AGENT_RESUMED");
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.header("x-pulse-hook-type"))
        .collect();
    assert_eq!(types, ["AGENT_AUTO_PAUSED", "AGENT_RESUMED"]);
    w.b.advance(SignedDuration::from_hours(13));
    assert_eq!(w.beat().await, 1, "beating again");
    assert_eq!(
        w.b.store.list_heartbeats(&agent.id, 2).await.unwrap()[1].status,
        HeartbeatStatus::Completed
    );
}
