//! Reminders: schedules beside the interval wake the agent through the same due index
//! and claim, with a SCHEDULED event carrying the note; on both backends, with the
//! injected clock.

use jiff::SignedDuration;
use pulse_shared::domain::{ScheduleRule, TimeZoneName};
use pulse_shared::engine::reminders::ScheduleLimits;
use pulse_shared::engine::{EngineSettings, LifecycleError};
use pulse_tests::fake_llm::Scripted;
use pulse_tests::{Kind, on_both_backends};
use serde_json::json;

use crate::lifecycle::{World, world_with};

async fn world(kind: Kind) -> World {
    world_with(kind, pulse_tests::settings()).await
}

/// The SCHEDULED events in the agent's log, with their notes.
async fn wakes(w: &World, agent: &pulse_shared::domain::Agent) -> Vec<String> {
    w.b.store
        .list_events(&agent.id, 100)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.event_type.as_str() == "SCHEDULED")
        .map(|e| e.payload["note"].as_str().unwrap_or("").to_owned())
        .collect()
}

on_both_backends!(
    a_one_time_reminder_makes_one_heartbeat_with_its_scheduled_event,
    once
);
async fn once(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1h", "2001").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    let next = w.latest(&agent).await;
    // Three seconds ahead, with the next heartbeat an hour away.
    let at = w.b.now() + SignedDuration::from_secs(3);
    let made = w
        .ops
        .schedule(&agent.id, ScheduleRule::Once { at }, Some("stretch".into()))
        .await
        .unwrap();
    assert_eq!(
        made.pulled,
        Some(at),
        "the pending heartbeat is pulled forward"
    );
    assert_eq!(w.latest(&agent).await.scheduled_at, at);
    assert_eq!(w.latest(&agent).await.beat, next.beat);
    // Not before its time.
    w.b.advance(SignedDuration::from_secs(2));
    assert_eq!(w.beat().await, 0);
    w.b.advance(SignedDuration::from_secs(1));
    assert_eq!(w.beat().await, 1, "one heartbeat at the wake");
    assert_eq!(wakes(&w, &agent).await, ["stretch"]);
    // The model saw the event; the schedule is gone; the next heartbeat is back on the
    // interval.
    let prompt = w.llm.requests().last().unwrap().body.to_string();
    assert!(
        prompt.contains("SCHEDULED") && prompt.contains("stretch"),
        "{prompt}"
    );
    assert!(w.ops.schedules(&agent.id).await.unwrap().is_empty());
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.next_wake, None);
    let after = w.latest(&agent).await;
    assert_eq!(
        after.scheduled_at,
        w.b.now() + SignedDuration::from_hours(1)
    );
    // Nothing more: an hour of sweeps makes the one interval heartbeat.
    w.b.advance(SignedDuration::from_hours(1));
    assert_eq!(w.beat().await, 1);
    assert_eq!(wakes(&w, &agent).await.len(), 1, "it woke once");
}

on_both_backends!(
    a_cron_reminder_wakes_at_its_local_times_across_a_dst_change_until_deleted,
    cron
);
async fn cron(kind: Kind) {
    let w = world(kind).await;
    // Every three days: the weekday wakes come between its heartbeats.
    let agent = w.agent("3d", "2002").await;
    // Friday 2026-03-27 06:00 UTC: before Paris moves to summer time on Sunday.
    let friday: jiff::Timestamp = "2026-03-27T06:00:00Z".parse().unwrap();
    w.b.advance(friday.duration_since(w.b.now()));
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    let rule = ScheduleRule::cron(
        "0 9 * * MON-FRI",
        TimeZoneName::parse("Europe/Paris").unwrap(),
    )
    .unwrap();
    let made = w
        .ops
        .schedule(&agent.id, rule, Some("standup".into()))
        .await
        .unwrap();
    let nine_cet: jiff::Timestamp = "2026-03-27T08:00:00Z".parse().unwrap();
    assert_eq!(made.schedule.next_at, Some(nine_cet));
    assert_eq!(made.pulled, Some(nine_cet));
    // Each wake, then the next one filed: Friday 09:00 CET, Monday 09:00 CEST.
    let nine_cest: jiff::Timestamp = "2026-03-30T07:00:00Z".parse().unwrap();
    for (wake, then) in [(nine_cet, nine_cest)] {
        w.b.advance(wake.duration_since(w.b.now()));
        assert_eq!(w.beat().await, 1);
        let next = w.latest(&agent).await;
        assert_eq!(
            next.scheduled_at, then,
            "the next wake comes before the day's interval"
        );
    }
    w.b.advance(nine_cest.duration_since(w.b.now()));
    assert_eq!(w.beat().await, 1);
    assert_eq!(wakes(&w, &agent).await, ["standup", "standup"]);
    // Deleted: the agent goes back to its interval.
    let id = w.ops.schedules(&agent.id).await.unwrap()[0].id.clone();
    assert!(w.ops.unschedule(&agent.id, &id).await.unwrap());
    assert!(!w.ops.unschedule(&agent.id, &id).await.unwrap());
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.next_wake, None);
    let tuesday: jiff::Timestamp = "2026-03-31T07:00:00Z".parse().unwrap();
    w.b.advance(tuesday.duration_since(w.b.now()));
    w.beat().await;
    assert_eq!(wakes(&w, &agent).await.len(), 2, "no wake after the delete");
}

on_both_backends!(
    a_schedule_past_the_breaker_or_in_the_past_is_refused,
    refused
);
async fn refused(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1h", "2003").await;
    let every_minute = ScheduleRule::cron("* * * * *", TimeZoneName::utc()).unwrap();
    let err = w
        .ops
        .schedule(&agent.id, every_minute, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LifecycleError::Invalid(e) if e.to_string().contains("breaker")),
        "{err}"
    );
    let past = ScheduleRule::Once {
        at: w.b.now() - SignedDuration::from_secs(1),
    };
    assert!(matches!(
        w.ops.schedule(&agent.id, past, None).await,
        Err(LifecycleError::Invalid(_))
    ));
    assert!(w.ops.schedules(&agent.id).await.unwrap().is_empty());
}

on_both_backends!(
    a_chat_lists_and_cancels_a_reminder_with_the_schedule_tool,
    cancel_in_chat
);
/// "Cancel that reminder" in one turn: the model lists the reminders, then cancels the
/// one whose note matches; it is gone, and the agent's next wake is the other one's.
async fn cancel_in_chat(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1d", "2004").await;
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    let run = |input: serde_json::Value| {
        let (w, stored) = (&w, stored.clone());
        async move {
            pulse_shared::engine::reminders::run_tool(
                w.b.store.as_ref(),
                &stored,
                &input,
                w.b.now(),
                ScheduleLimits::default(),
            )
            .await
        }
    };
    run(json!({"in": "2h", "note": "Call the dentist"}))
        .await
        .unwrap();
    run(json!({"in": "5h", "note": "water the plants"}))
        .await
        .unwrap();
    let dentist = w.b.now() + SignedDuration::from_hours(2);
    let plants = w.b.now() + SignedDuration::from_hours(5);
    assert_eq!(
        w.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .next_wake,
        Some(dentist)
    );

    w.llm.script([
        Scripted::tool("schedule", json!({"action": "list"})),
        Scripted::tool("schedule", json!({"action": "cancel", "note": "dentist"})),
        Scripted::text("Cancelled the dentist reminder."),
    ]);
    w.b.say(&agent, "cancel the dentist reminder").await;
    w.b.drain(&w.worker).await;
    // The list the model read named both, with their ids and notes.
    let asked = w.llm.requests();
    let listed = asked[1].body["messages"].to_string();
    assert!(
        listed.contains("Call the dentist") && listed.contains("water the plants"),
        "{listed}"
    );
    let left = w.ops.schedules(&agent.id).await.unwrap();
    let notes: Vec<_> = left.iter().filter_map(|s| s.note.as_deref()).collect();
    assert_eq!(notes, ["water the plants"]);
    assert_eq!(
        w.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .next_wake,
        Some(plants),
        "the next wake is the one left"
    );
    assert!(asked[2].body["messages"].to_string().contains("cancelled"));

    // Refusals say what to do: nothing matches, several match, nothing named.
    let none = run(json!({"action": "cancel", "note": "gym"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        none.contains("no reminder matches the note \"gym\""),
        "{none}"
    );
    run(json!({"in": "6h", "note": "water the garden plants"}))
        .await
        .unwrap();
    let several = run(json!({"action": "cancel", "note": "plants"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(several.contains("2 reminders match"), "{several}");
    let unnamed = run(json!({"action": "cancel"}))
        .await
        .unwrap_err()
        .to_string();
    assert!(unnamed.contains("schedule_id"), "{unnamed}");
    let by_id = left[0].id.to_string();
    let done = run(json!({"action": "cancel", "schedule_id": by_id}))
        .await
        .unwrap();
    assert_eq!(done.1["cancelled"], true);
    assert_eq!(w.ops.schedules(&agent.id).await.unwrap().len(), 1);
}

on_both_backends!(
    the_heartbeat_agent_and_a_chat_make_wakes_with_the_schedule_tool,
    tool
);
async fn tool(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1d", "2004").await;
    // The heartbeat agent decides to look again in 90 minutes.
    w.llm.script([
        Scripted::tool("schedule", json!({"in": "90m", "note": "check the oven"})),
        Scripted::text("done"),
    ]);
    let started = w.b.now();
    assert_eq!(w.beat().await, 1);
    let made = w.ops.schedules(&agent.id).await.unwrap();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].note.as_deref(), Some("check the oven"));
    let wake = made[0].next_at.unwrap();
    assert_eq!(wake, started + SignedDuration::from_mins(90));
    // Its own finish filed the next heartbeat at the wake, not a day later.
    assert_eq!(w.latest(&agent).await.scheduled_at, wake);
    w.b.advance(SignedDuration::from_mins(90));
    w.llm.script([Scripted::text("checked")]);
    assert_eq!(w.beat().await, 1);
    assert_eq!(wakes(&w, &agent).await, ["check the oven"]);

    // A user asks in a chat: the pending heartbeat is pulled forward to the time.
    let nine = w.b.now() + SignedDuration::from_hours(3);
    w.llm.script([
        Scripted::tool(
            "schedule",
            json!({"at": nine.to_string(), "note": "remind them about the call"}),
        ),
        Scripted::text("I will remind you."),
    ]);
    w.b.say(&agent, "remind me about the call at nine").await;
    w.b.drain(&w.worker).await;
    assert_eq!(
        w.discord.messages().last().unwrap().content,
        "I will remind you."
    );
    let notes: Vec<_> = w
        .ops
        .schedules(&agent.id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|s| s.note)
        .collect();
    assert_eq!(notes, ["remind them about the call"]);
    assert_eq!(w.latest(&agent).await.scheduled_at, nine);
    // A bad request is the model's to fix: an error result, nothing made.
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    let err = pulse_shared::engine::reminders::run_tool(
        w.b.store.as_ref(),
        &stored,
        &json!({"in": "2h", "cron": "0 9 * * *"}),
        w.b.now(),
        ScheduleLimits::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("exactly one"), "{err}");
}

on_both_backends!(
    a_reminder_fires_at_its_time_through_the_quiet_period_after_a_user_message,
    through_quiet
);
async fn through_quiet(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1h", "2005").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    // The reminder first, then the user talks 6 s before it is due: the quiet period
    // (half the interval) would push an ordinary heartbeat 30 minutes out.
    let at = w.b.now() + SignedDuration::from_secs(60);
    w.ops
        .schedule(&agent.id, ScheduleRule::Once { at }, Some("stretch".into()))
        .await
        .unwrap();
    w.b.advance(SignedDuration::from_secs(54));
    w.b.say(&agent, "still there?").await;
    w.b.drain(&w.worker).await;
    w.b.advance(SignedDuration::from_secs(6));
    assert_eq!(
        w.beat().await,
        1,
        "the reminder's heartbeat runs at its time"
    );
    assert_eq!(wakes(&w, &agent).await, ["stretch"]);
    assert_eq!(
        w.latest(&agent).await.beat,
        3,
        "it ran: a next heartbeat is filed"
    );

    // The user talks first, then a reminder due within the quiet period is made.
    w.b.say(&agent, "remind me in 20 seconds").await;
    w.b.drain(&w.worker).await;
    let at = w.b.now() + SignedDuration::from_secs(20);
    w.ops
        .schedule(&agent.id, ScheduleRule::Once { at }, Some("tea".into()))
        .await
        .unwrap();
    w.b.advance(SignedDuration::from_secs(20));
    assert_eq!(w.beat().await, 1);
    assert_eq!(wakes(&w, &agent).await, ["stretch", "tea"]);
}

on_both_backends!(
    a_reminder_fires_at_its_time_outside_the_active_hours,
    outside_hours
);
async fn outside_hours(kind: Kind) {
    let w = world(kind).await;
    // Active 08:00-22:00 UTC; it is 21:00.
    let nine_pm: jiff::Timestamp = "2026-05-01T21:00:00Z".parse().unwrap();
    w.b.advance(nine_pm.duration_since(w.b.now()));
    let mut new = pulse_shared::domain::NewAgent::named("night");
    new.interval = "2h".parse().unwrap();
    new.active_hours = Some("08:00-22:00".parse().unwrap());
    let (agent, first) = new.create(w.b.now()).unwrap();
    w.b.store.create_agent(&agent, &first).await.unwrap();
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    // Its next heartbeat is planned for 08:00; the user wants a reminder at 23:30.
    let half_past_eleven: jiff::Timestamp = "2026-05-01T23:30:00Z".parse().unwrap();
    let made = w
        .ops
        .schedule(
            &agent.id,
            ScheduleRule::Once {
                at: half_past_eleven,
            },
            Some("lock the door".into()),
        )
        .await
        .unwrap();
    assert_eq!(made.pulled, Some(half_past_eleven), "not moved to 08:00");
    w.b.advance(half_past_eleven.duration_since(w.b.now()));
    assert_eq!(w.beat().await, 1, "it runs at 23:30");
    assert_eq!(wakes(&w, &agent).await, ["lock the door"]);
    // The agent's own next heartbeat goes back inside its hours.
    assert_eq!(
        w.latest(&agent).await.scheduled_at,
        "2026-05-02T08:00:00Z".parse::<jiff::Timestamp>().unwrap()
    );
}

on_both_backends!(
    schedules_are_bounded_together_in_number_and_in_time,
    bounded
);
async fn bounded(kind: Kind) {
    let settings = EngineSettings {
        schedules: ScheduleLimits {
            max_per_agent: 4,
            ..ScheduleLimits::default()
        },
        ..pulse_tests::settings()
    };
    let w = world_with(kind, settings).await;
    let agent = w.agent("1h", "2006").await;
    let utc = TimeZoneName::utc;
    // Four patterns of 15 wakes an hour each pass the breaker (60 an hour) only
    // together: the first three are made, the fourth refused.
    for offset in 0..3 {
        let rule = ScheduleRule::cron(&format!("{offset}-59/4 * * * *"), utc()).unwrap();
        w.ops.schedule(&agent.id, rule, None).await.unwrap();
    }
    let fourth = ScheduleRule::cron("3-59/4 * * * *", utc()).unwrap();
    let err = w.ops.schedule(&agent.id, fourth, None).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("other 3 schedules") && text.contains("60 times"),
        "{text}"
    );
    // The model gets the same refusal as its tool's error, and nothing is made.
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    let err = pulse_shared::engine::reminders::run_tool(
        w.b.store.as_ref(),
        &stored,
        &json!({"cron": "3-59/4 * * * *"}),
        w.b.now(),
        ScheduleLimits::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("breaker"), "{err}");
    assert_eq!(w.ops.schedules(&agent.id).await.unwrap().len(), 3);

    // More than ten years ahead is refused; a leap day four years out is fine.
    let far = ScheduleRule::Once {
        at: w.b.now() + SignedDuration::from_hours(24 * 3660),
    };
    let err = w.ops.schedule(&agent.id, far, None).await.unwrap_err();
    assert!(err.to_string().contains("ten years"), "{err}");
    let leap = ScheduleRule::cron("0 12 29 2 *", utc()).unwrap();
    w.ops.schedule(&agent.id, leap, None).await.unwrap();
    // The fifth is past the count.
    let daily = ScheduleRule::cron("0 9 * * *", utc()).unwrap();
    let err = w.ops.schedule(&agent.id, daily, None).await.unwrap_err();
    assert!(err.to_string().contains("PULSE_MAX_SCHEDULES"), "{err}");
    assert_eq!(w.ops.schedules(&agent.id).await.unwrap().len(), 4);
}

/// The SCHEDULE_MISSED events in the agent's log: (missed, first missed at).
async fn missed(w: &World, agent: &pulse_shared::domain::Agent) -> Vec<(u64, String)> {
    w.b.store
        .list_events(&agent.id, 100)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.event_type.as_str() == "SCHEDULE_MISSED")
        .map(|e| {
            (
                e.payload["missed"].as_u64().unwrap(),
                e.payload["first_missed_at"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

on_both_backends!(
    after_downtime_a_schedule_runs_once_and_records_what_it_missed,
    downtime
);
async fn downtime(kind: Kind) {
    let w = world(kind).await;
    let start: jiff::Timestamp = "2026-06-01T08:10:00Z".parse().unwrap();
    w.b.advance(start.duration_since(w.b.now()));
    let agent = w.agent("1d", "2007").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    let hourly = ScheduleRule::cron("0 * * * *", TimeZoneName::utc()).unwrap();
    w.ops
        .schedule(&agent.id, hourly, Some("drink water".into()))
        .await
        .unwrap();
    // Nothing sweeps from 08:10 to 13:20: the wakes of 09:00 to 13:00 pass.
    let back: jiff::Timestamp = "2026-06-01T13:20:00Z".parse().unwrap();
    w.b.advance(back.duration_since(w.b.now()));
    assert_eq!(w.beat().await, 1, "one heartbeat, not five");
    assert_eq!(wakes(&w, &agent).await, ["drink water"], "13:00 runs once");
    assert_eq!(
        missed(&w, &agent).await,
        [(4, "2026-06-01T09:00:00Z".to_owned())],
        "09:00 to 12:00 are recorded as missed"
    );
    let due: Vec<String> =
        w.b.store
            .list_events(&agent.id, 100)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.event_type.as_str() == "SCHEDULED")
            .map(|e| e.payload["due_at"].as_str().unwrap().to_owned())
            .collect();
    assert_eq!(due, ["2026-06-01T13:00:00Z"]);
    // It goes on at 14:00.
    let next = w.ops.schedules(&agent.id).await.unwrap()[0]
        .next_at
        .unwrap();
    assert_eq!(
        next,
        "2026-06-01T14:00:00Z".parse::<jiff::Timestamp>().unwrap()
    );
    let id = w.ops.schedules(&agent.id).await.unwrap()[0].id.clone();
    w.ops.unschedule(&agent.id, &id).await.unwrap();

    // A one-time reminder three hours late is past the grace: recorded, not run.
    let at = w.b.now() + SignedDuration::from_mins(1);
    w.ops
        .schedule(
            &agent.id,
            ScheduleRule::Once { at },
            Some("call mum".into()),
        )
        .await
        .unwrap();
    w.b.advance(SignedDuration::from_mins(1) + SignedDuration::from_hours(3));
    assert_eq!(w.beat().await, 1);
    assert_eq!(
        wakes(&w, &agent).await,
        ["drink water"],
        "call mum did not run"
    );
    let all = missed(&w, &agent).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1], (1, at.to_string()));
    assert!(w.ops.schedules(&agent.id).await.unwrap().is_empty());
}
