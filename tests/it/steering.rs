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
    let ran =
        w.b.store
            .list_heartbeats(&agent.id, 2)
            .await
            .unwrap()
            .pop()
            .unwrap();
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
    assert!(
        !w.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .is_paused()
    );

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
