//! The store ports' conformance suite: one set of tests, run against every backend.

use std::collections::HashSet;

use jiff::SignedDuration;
use pulse_shared::domain::{
    Action, ActionId, ActionStatus, AgentId, AgentStates, Cascade, ClaimRequest, EventCursor,
    EventType, Filter, HeartbeatId, HeartbeatStatus, NewEvent, Requests, Tool, ToolName,
};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{Finish, FinishOutcome, Writer};
use pulse_tests::{Backend, Kind, on_both_backends};
use serde_json::json;

fn claim_req(b: &Backend) -> ClaimRequest {
    ClaimRequest {
        now: b.now(),
        lease: SignedDuration::from_mins(10),
        window_end: EventCursor::through(
            b.now()
                .saturating_sub(SignedDuration::from_secs(2))
                .unwrap(),
        ),
    }
}

/// A RUNNING first attempt of `tool` on `event`, in `heartbeat`.
fn running_action(
    b: &Backend,
    heartbeat: &pulse_shared::domain::Heartbeat,
    event: &pulse_shared::domain::Event,
    tool: &ToolName,
    request: serde_json::Value,
) -> Action {
    Action {
        id: ActionId::for_event(&event.id, tool),
        agent_id: heartbeat.agent_id.clone(),
        heartbeat_id: heartbeat.id(),
        event_id: event.id.clone(),
        tool: tool.clone(),
        status: ActionStatus::Running,
        attempt: 1,
        depth: 0,
        request,
        response: None,
        error: None,
        started_at: b.now(),
        completed_at: None,
        duration_ms: None,
        new_events: vec![],
        call: None,
    }
}

async fn all_due(b: &Backend) -> Vec<HeartbeatId> {
    let mut out = Vec::new();
    for shard in 0..b.store.due_shards() {
        let mut page = None;
        loop {
            let p = b.store.due(shard, b.now(), page, 1000).await.unwrap();
            out.extend(p.ids);
            match p.next {
                Some(n) => page = Some(n),
                None => break,
            }
        }
    }
    out
}

on_both_backends!(agents_are_created_read_and_listed, agents);
async fn agents(kind: Kind) {
    let b = Backend::new(kind).await;
    let (a1, first) = b.agent("scout", "15m").await;
    b.advance(SignedDuration::from_secs(1));
    let (a2, _) = b.agent("critic", "2s").await;
    assert_eq!(b.store.get_agent(&a1.id).await.unwrap().unwrap(), a1);
    let listed: Vec<AgentId> = b
        .store
        .list_agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(listed, vec![a1.id.clone(), a2.id.clone()]);
    assert!(
        b.store
            .get_agent(&AgentId::generate())
            .await
            .unwrap()
            .is_none()
    );
    let again = b.store.create_agent(&a1, &first).await.unwrap_err();
    assert!(matches!(again, StoreError::AlreadyExists(_)), "{again}");

    // Interactions only move forward.
    let t = b.now();
    b.store.record_interaction(&a1.id, t).await.unwrap();
    b.store
        .record_interaction(
            &a1.id,
            t.saturating_sub(SignedDuration::from_secs(60)).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        b.store
            .get_agent(&a1.id)
            .await
            .unwrap()
            .unwrap()
            .last_interaction_at,
        Some(t)
    );
    let missing = b
        .store
        .record_interaction(&AgentId::generate(), t)
        .await
        .unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(_)), "{missing}");
}

on_both_backends!(a_name_is_held_by_one_agent, unique_names);
/// A name (ignoring ASCII case) is held by one agent: a second create or a rename to it
/// is refused naming the holder, of two racing creates one wins, and a rename or a
/// delete gives the name up.
async fn unique_names(kind: Kind) {
    let b = Backend::new(kind).await;
    let (scout, _) = b.agent("scout", "15m").await;
    let (dup, dup_first) = pulse_shared::domain::NewAgent::named("Scout")
        .create(b.now())
        .unwrap();
    let refused = b.store.create_agent(&dup, &dup_first).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::AlreadyExists(w) if w.contains(scout.id.as_str())),
        "{refused}"
    );
    assert!(
        b.store.get_agent(&dup.id).await.unwrap().is_none(),
        "nothing of it was written"
    );
    // Two creates of one name at once: one wins.
    let racers: Vec<_> = (0..2)
        .map(|_| {
            pulse_shared::domain::NewAgent::named("ranger")
                .create(b.now())
                .unwrap()
        })
        .collect();
    let (x, y) = tokio::join!(
        b.store.create_agent(&racers[0].0, &racers[0].1),
        b.store.create_agent(&racers[1].0, &racers[1].1)
    );
    assert_eq!(u8::from(x.is_ok()) + u8::from(y.is_ok()), 1, "{x:?} {y:?}");
    let ranger = if x.is_ok() {
        &racers[0].0
    } else {
        &racers[1].0
    };
    // A rename to a held name is refused; a rename gives up the old name.
    let mut renamed = ranger.clone();
    renamed.name = "SCOUT".into();
    let refused = b.store.update_agent(&renamed, ranger).await.unwrap_err();
    assert!(matches!(refused, StoreError::AlreadyExists(_)), "{refused}");
    assert_eq!(
        b.store.get_agent(&ranger.id).await.unwrap().unwrap().name,
        "ranger"
    );
    let mut moved = scout.clone();
    moved.name = "pathfinder".into();
    b.store.update_agent(&moved, &scout).await.unwrap();
    b.store.create_agent(&dup, &dup_first).await.unwrap();
    // A rename in case only keeps the name.
    let mut cased = moved.clone();
    cased.name = "PathFinder".into();
    b.store.update_agent(&cased, &moved).await.unwrap();
    // Deleting an agent frees its name.
    b.store.purge_agent(&ranger.id, true).await.unwrap();
    let (again, again_first) = pulse_shared::domain::NewAgent::named("Ranger")
        .create(b.now())
        .unwrap();
    b.store.create_agent(&again, &again_first).await.unwrap();
}

on_both_backends!(
    a_page_of_agents_comes_with_the_count_of_every_state,
    agents_page
);
async fn agents_page(kind: Kind) {
    let b = Backend::new(kind).await;
    let empty = b.store.agents_page(0, 3).await.unwrap();
    assert_eq!((empty.states.total(), empty.agents.len()), (0, 0));
    let mut made = Vec::new();
    for i in 0..7 {
        made.push(b.agent(&format!("agent {i}"), "15m").await.0);
        b.advance(SignedDuration::from_secs(1));
    }
    // 1 snoozed; 2 auto-paused and snoozed (the auto-pause wins); 3 paused, auto-paused
    // and snoozed (the pause wins); 4 paused.
    let t = b.now();
    let later = Some(t + SignedDuration::from_hours(2));
    for (i, auto, paused) in [
        (1, false, false),
        (2, true, false),
        (3, true, true),
        (4, false, true),
    ] {
        let mut next = made[i].clone();
        next.snoozed_until = (i != 4).then_some(later).flatten();
        next.auto_paused_since = auto.then_some(t);
        b.store.update_agent(&next, &made[i]).await.unwrap();
        if paused {
            let event = NewEvent::new("AGENT_PAUSED", json!({}), None)
                .unwrap()
                .into_event(next.id.clone(), "operator", t);
            assert!(
                b.store
                    .set_paused(&next.id, Some(t), &event, Writer::Outside)
                    .await
                    .unwrap()
            );
        }
    }
    let all = b.store.list_agents().await.unwrap();
    let mut expected = AgentStates::default();
    for a in &all {
        expected.add(a.state());
    }
    assert_eq!(
        expected,
        AgentStates {
            active: 3,
            snoozed: 1,
            auto_paused: 1,
            paused: 2
        }
    );
    // Pages in creation order, the counts always of all agents.
    let ids = |p: &pulse_shared::ports::AgentsPage| -> Vec<AgentId> {
        p.agents.iter().map(|a| a.id.clone()).collect()
    };
    let first = b.store.agents_page(0, 3).await.unwrap();
    assert_eq!(first.states, expected);
    assert_eq!(
        first.agents,
        all[..3].to_vec(),
        "the page's agents are whole"
    );
    let middle = b.store.agents_page(3, 3).await.unwrap();
    assert_eq!(
        ids(&middle),
        all[3..6].iter().map(|a| a.id.clone()).collect::<Vec<_>>()
    );
    assert_eq!(middle.states, expected);
    let last = b.store.agents_page(6, 3).await.unwrap();
    assert_eq!(ids(&last), vec![all[6].id.clone()]);
    let past = b.store.agents_page(9, 3).await.unwrap();
    assert!(past.agents.is_empty());
    assert_eq!(past.states, expected);
    assert_eq!(
        ids(&b.store.agents_page(0, 100).await.unwrap()),
        made.iter().map(|a| a.id.clone()).collect::<Vec<_>>()
    );
}

on_both_backends!(
    tokens_are_kept_as_digests_listed_by_agent_and_revoked_once,
    tokens
);
async fn tokens(kind: Kind) {
    use pulse_shared::domain::{AgentId, ApiToken, TokenId};
    let b = Backend::new(kind).await;
    let now = b.now();
    let (one, two) = (AgentId::generate(), AgentId::generate());
    let (t1, presented) =
        ApiToken::issue(&one, "ci", Some(SignedDuration::from_hours(24)), now).unwrap();
    let (t2, _) = ApiToken::issue(&two, "", None, now).unwrap();
    let (t3, _) = ApiToken::issue(&one, "phone", None, now).unwrap();
    for t in [&t1, &t2, &t3] {
        b.store.put_token(t).await.unwrap();
    }
    let read = b.store.get_token(&t1.id).await.unwrap().unwrap();
    assert_eq!(read, t1);
    let (_, secret) = ApiToken::split(&presented).unwrap();
    assert_eq!(read.admit(secret, now), Ok(()));
    assert!(!read.digest.contains(secret), "only the digest is stored");
    assert_eq!(b.store.get_token(&TokenId::generate()).await.unwrap(), None);
    let mine: Vec<_> = b
        .store
        .list_tokens(Some(&one))
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    let mut expected = vec![t1.id.clone(), t3.id.clone()];
    // Ids made in the same millisecond sort by their random part.
    expected.sort();
    assert_eq!(mine, expected);
    let all = b.store.list_tokens(None).await.unwrap();
    assert!(all.iter().any(|t| t.id == t2.id) && all.len() >= 3);
    b.store.revoke_token(&t1.id, now).await.unwrap();
    let later = now.checked_add(SignedDuration::from_secs(60)).unwrap();
    b.store.revoke_token(&t1.id, later).await.unwrap();
    let revoked = b.store.get_token(&t1.id).await.unwrap().unwrap();
    assert_eq!(
        revoked.revoked_at,
        Some(now),
        "the first revocation's time is kept"
    );
    assert!(revoked.admit(secret, now).is_err());
    assert!(matches!(
        b.store.revoke_token(&TokenId::generate(), now).await,
        Err(pulse_shared::error::StoreError::NotFound(_))
    ));
}

on_both_backends!(
    a_lease_has_one_holder_until_it_runs_out_or_is_given_up,
    leases
);
async fn leases(kind: Kind) {
    let b = Backend::new(kind).await;
    let name = pulse_tests::unique("gateway");
    let now = b.now();
    let later = |s: i64| now.checked_add(SignedDuration::from_secs(s)).unwrap();
    assert_eq!(b.store.get_lease(&name).await.unwrap(), None);
    let a = json!({"session": "s-1", "seq": 4});
    assert!(
        b.store
            .hold_lease(&name, "A", now, later(30), &a)
            .await
            .unwrap()
    );
    // B cannot take it while it runs; A renews it and saves a new state.
    assert!(
        !b.store
            .hold_lease(&name, "B", now, later(30), &json!({}))
            .await
            .unwrap()
    );
    let a2 = json!({"session": "s-1", "seq": 9});
    assert!(
        b.store
            .hold_lease(&name, "A", later(10), later(40), &a2)
            .await
            .unwrap()
    );
    let held = b.store.get_lease(&name).await.unwrap().unwrap();
    assert_eq!(
        (held.holder.as_str(), held.until, &held.state),
        ("A", later(40), &a2)
    );
    // Run out: B takes it.
    assert!(
        !b.store
            .hold_lease(&name, "B", later(39), later(69), &json!({}))
            .await
            .unwrap()
    );
    assert!(
        b.store
            .hold_lease(&name, "B", later(40), later(70), &json!({"b": 1}))
            .await
            .unwrap()
    );
    assert!(
        !b.store
            .hold_lease(&name, "A", later(41), later(71), &a2)
            .await
            .unwrap()
    );
    // Given up: A may take it at once, and finds what B left.
    b.store
        .release_lease(&name, "A", later(42), &json!({"stale": true}))
        .await
        .unwrap();
    assert_eq!(
        b.store.get_lease(&name).await.unwrap().unwrap().state,
        json!({"b": 1}),
        "A gives up nothing it does not hold"
    );
    b.store
        .release_lease(&name, "B", later(42), &json!({"seq": 12}))
        .await
        .unwrap();
    let left = b.store.get_lease(&name).await.unwrap().unwrap();
    assert_eq!((left.until, &left.state), (later(42), &json!({"seq": 12})));
    assert!(
        b.store
            .hold_lease(&name, "A", later(42), later(72), &left.state)
            .await
            .unwrap()
    );
}

on_both_backends!(
    schedules_are_kept_listed_replaced_deleted_and_purged_with_their_agent,
    schedules
);
async fn schedules(kind: Kind) {
    use pulse_shared::domain::{Schedule, ScheduleRule, TimeZoneName};
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("reminded", "15m").await;
    let (other, _) = b.agent("other", "15m").await;
    assert!(b.store.schedules(&agent.id).await.unwrap().is_empty());
    let once = Schedule::new(
        &agent.id,
        ScheduleRule::Once {
            at: b.now() + SignedDuration::from_hours(2),
        },
        Some("call the dentist".into()),
        b.now(),
    )
    .unwrap();
    let cron = Schedule::new(
        &agent.id,
        ScheduleRule::cron(
            "0 9 * * MON-FRI",
            TimeZoneName::parse("Europe/Paris").unwrap(),
        )
        .unwrap(),
        None,
        b.now(),
    )
    .unwrap();
    b.store.put_schedule(&once).await.unwrap();
    b.store.put_schedule(&cron).await.unwrap();
    let listed = b.store.schedules(&agent.id).await.unwrap();
    assert_eq!(listed, vec![once.clone(), cron.clone()], "oldest first");
    assert!(b.store.schedules(&other.id).await.unwrap().is_empty());
    // Replaced by id: the wake moved on.
    let mut moved = cron.clone();
    moved.wakes = 1;
    moved.next_at = moved.rule.next_after(cron.next_at.unwrap());
    b.store.put_schedule(&moved).await.unwrap();
    assert_eq!(b.store.schedules(&agent.id).await.unwrap()[1], moved);
    // Deleted once; the other agent cannot delete it.
    assert!(!b.store.delete_schedule(&other.id, &once.id).await.unwrap());
    assert!(b.store.delete_schedule(&agent.id, &once.id).await.unwrap());
    assert!(!b.store.delete_schedule(&agent.id, &once.id).await.unwrap());
    assert_eq!(b.store.schedules(&agent.id).await.unwrap(), vec![moved]);
    // The agent's next wake: set on its own, kept by a settings update, cleared.
    let wake = b.now() + SignedDuration::from_hours(2);
    b.store.set_next_wake(&agent.id, Some(wake)).await.unwrap();
    let stored = b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.next_wake, Some(wake));
    let mut renamed = stored.clone();
    renamed.name = "reminded-2".into();
    renamed.next_wake = None;
    b.store.update_agent(&renamed, &stored).await.unwrap();
    let stored = b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.name.as_str(), stored.next_wake),
        ("reminded-2", Some(wake))
    );
    b.store.set_next_wake(&agent.id, None).await.unwrap();
    assert_eq!(
        b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .next_wake,
        None
    );
    assert!(matches!(
        b.store
            .set_next_wake(&AgentId::generate(), Some(wake))
            .await,
        Err(StoreError::NotFound(_))
    ));
    // Purged with the agent.
    let footprint = b.store.purge_agent(&agent.id, false).await.unwrap();
    assert_eq!(footprint.schedules, 1);
    b.store.purge_agent(&agent.id, true).await.unwrap();
    assert!(b.store.schedules(&agent.id).await.unwrap().is_empty());
}

on_both_backends!(
    the_spend_ledger_keeps_one_entry_per_day_and_source_and_the_breaker_count_is_stored,
    spend_ledger
);
async fn spend_ledger(kind: Kind) {
    use pulse_shared::domain::{NewAgent, Spend};
    let b = Backend::new(kind).await;
    let (agent, first) = NewAgent::named("frugal").create(b.now()).unwrap();
    let hour_from = b.now();
    let first = first.counted((hour_from, 4));
    b.store.create_agent(&agent, &first).await.unwrap();
    let stored = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(
        (stored.hour_from, stored.beats_in_hour),
        (Some(hour_from), 4)
    );

    let day = |d: &str| d.parse::<jiff::civil::Date>().unwrap();
    let entry = |d: &str, source: &str, tokens| Spend {
        day: day(d),
        source: source.into(),
        tokens,
        at: b.now(),
    };
    for e in [
        entry("2026-03-02", "ac_1", 100),
        entry("2026-03-02", "tn_1", 50),
        entry("2026-03-02", Spend::NOTICE, 0),
        entry("2026-03-03", "ac_2", 7),
    ] {
        b.store.record_spend(&agent.id, &e).await.unwrap();
    }
    // The same day and source again replaces the entry (a rerun records once).
    b.store
        .record_spend(&agent.id, &entry("2026-03-02", "ac_1", 120))
        .await
        .unwrap();
    let mut got = b
        .store
        .spend_of_day(&agent.id, day("2026-03-02"))
        .await
        .unwrap();
    got.sort_by(|a, b| a.source.cmp(&b.source));
    let sources: Vec<(&str, u64)> = got.iter().map(|e| (e.source.as_str(), e.tokens)).collect();
    assert_eq!(sources, [(Spend::NOTICE, 0), ("ac_1", 120), ("tn_1", 50)]);
    assert_eq!(got[0].at, b.now());
    let other = b
        .store
        .spend_of_day(&agent.id, day("2026-03-03"))
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert!(
        b.store
            .spend_of_day(&AgentId::generate(), day("2026-03-02"))
            .await
            .unwrap()
            .is_empty(),
        "per agent"
    );
    // Deleting the agent counts and removes its ledger.
    let footprint = b.store.purge_agent(&agent.id, true).await.unwrap();
    assert_eq!(footprint.usage, 4);
    assert!(
        b.store
            .spend_of_day(&agent.id, day("2026-03-02"))
            .await
            .unwrap()
            .is_empty()
    );
}

on_both_backends!(
    dollars_are_held_in_every_period_or_none_and_one_cent_left_goes_to_one_worker_and_calls_a_minute_are_counted_so,
    dollars
);
async fn dollars(kind: Kind) {
    use pulse_shared::domain::{Limit, NewAgent, Usd};
    let b = Backend::new(kind).await;
    let (agent, first) = NewAgent::named("frugal").create(b.now()).unwrap();
    b.store.create_agent(&agent, &first).await.unwrap();
    let usd = |cents: u64| Usd::from_micros(cents * 10_000);
    let limits = |day: u64, month: u64| {
        vec![
            Limit {
                period: "2026-03-02".into(),
                limit: usd(day),
            },
            Limit {
                period: "2026-03".into(),
                limit: usd(month),
            },
        ]
    };
    let periods = vec!["2026-03-02".to_owned(), "2026-03".to_owned()];
    let tallies = |b: &Backend| {
        let (store, agent, periods) = (b.store.clone(), agent.id.clone(), periods.clone());
        async move { store.usd_tallies(&agent, &periods).await.unwrap() }
    };
    assert_eq!(tallies(&b).await[0].committed(), Usd::ZERO, "nothing yet");
    // 30 cents held in both, then settled at 12.
    let held = b
        .store
        .hold_usd(&agent.id, &limits(100, 200), usd(30), b.now())
        .await;
    assert_eq!(held.unwrap(), Ok(()));
    let t = tallies(&b).await;
    assert_eq!(
        (t[0].spent, t[0].held, t[1].held),
        (Usd::ZERO, usd(30), usd(30))
    );
    let after = b
        .store
        .settle_usd(&agent.id, &periods, usd(30), usd(12), b.now())
        .await
        .unwrap();
    assert_eq!((after[0].spent, after[0].held), (usd(12), Usd::ZERO));
    assert_eq!((after[1].spent, after[1].held), (usd(12), Usd::ZERO));
    // The month has 8 cents of room and the day 88: a 10-cent hold fits the day, not
    // the month, and is held in neither.
    let refused = b
        .store
        .hold_usd(&agent.id, &limits(100, 20), usd(10), b.now())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.period, "2026-03");
    assert_eq!(refused.spent, usd(12));
    let t = tallies(&b).await;
    assert_eq!(
        (t[0].held, t[1].held),
        (Usd::ZERO, Usd::ZERO),
        "all or none"
    );
    // More than the whole budget is refused without a write.
    assert!(
        b.store
            .hold_usd(&agent.id, &limits(5, 200), usd(6), b.now())
            .await
            .unwrap()
            .is_err()
    );
    // One cent left in the day, and eight workers each want one: one gets it.
    let day_only = vec![Limit {
        period: "2026-03-02".into(),
        limit: usd(13),
    }];
    let tries = (0..8).map(|_| {
        let (store, agent, limits) = (b.store.clone(), agent.id.clone(), day_only.clone());
        let now = b.now();
        tokio::spawn(async move { store.hold_usd(&agent, &limits, usd(1), now).await })
    });
    let won = futures::future::join_all(tries)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(Ok(())))))
        .count();
    assert_eq!(won, 1, "one cent, one call");
    // A threshold is marked once per period.
    let mark = |period: &'static str, percent: u64| {
        let (store, agent, now) = (b.store.clone(), agent.id.clone(), b.now());
        async move { store.mark_usd(&agent, period, percent, now).await.unwrap() }
    };
    assert!(mark("2026-03", 50).await);
    assert!(!mark("2026-03", 50).await, "once");
    assert!(mark("2026-03", 80).await);
    assert!(mark("2026-03", 100).await);
    assert!(!mark("2026-03", 100).await);
    assert!(mark("2026-04", 50).await, "another period");
    assert!(
        mark("2026-03-02", 10).await,
        "a share not a prefix of another"
    );
    assert!(mark("2026-03-02", 100).await);
    assert_eq!(
        tallies(&b).await[0].spent,
        usd(12),
        "a mark leaves the tally as it was"
    );
    // Model calls a minute: two, then none, and two again the next minute; eight
    // workers at once in a fresh minute get two between them.
    let take = |minute: &'static str| {
        let (store, agent, now) = (b.store.clone(), agent.id.clone(), b.now());
        async move { store.take_call(&agent, minute, 2, now).await.unwrap() }
    };
    assert!(take("2026-03-02T10:15").await);
    assert!(take("2026-03-02T10:15").await);
    assert!(!take("2026-03-02T10:15").await, "the minute is full");
    assert!(take("2026-03-02T10:16").await);
    let tries = (0..8).map(|_| {
        let (store, agent, now) = (b.store.clone(), agent.id.clone(), b.now());
        tokio::spawn(async move { store.take_call(&agent, "2026-03-02T10:17", 2, now).await })
    });
    let counted = futures::future::join_all(tries)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(true))))
        .count();
    assert_eq!(counted, 2);
    // Deleting the agent removes its tallies.
    b.store.purge_agent(&agent.id, true).await.unwrap();
    assert_eq!(tallies(&b).await[1].committed(), Usd::ZERO);
}

on_both_backends!(
    a_new_agents_first_heartbeat_is_due_at_once_and_claimed_once,
    first_claim
);
async fn first_claim(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, first) = b.agent("scout", "15m").await;
    assert_eq!(first.status, HeartbeatStatus::Pending);
    assert_eq!(all_due(&b).await, vec![first.id()]);

    let claimed = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.status, HeartbeatStatus::Executing);
    assert_eq!(claimed.claim, 1);
    assert_eq!(claimed.started_at, Some(b.now()));
    assert_eq!(claimed.window_end, Some(claim_req(&b).window_end));
    assert_eq!(claimed.session, agent.session);
    // Claimed under a lease: no longer due, and a second claim loses.
    assert!(all_due(&b).await.is_empty());
    assert!(
        b.store
            .claim(&first.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_none()
    );
}

on_both_backends!(
    an_expired_lease_is_due_again_and_reclaimed_with_the_same_window,
    reclaim
);
async fn reclaim(kind: Kind) {
    let b = Backend::new(kind).await;
    let (_, first) = b.agent("scout", "15m").await;
    let c1 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    b.advance(SignedDuration::from_mins(9));
    assert!(all_due(&b).await.is_empty());
    assert!(
        b.store
            .claim(&first.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_none()
    );
    b.advance(SignedDuration::from_mins(2));
    assert_eq!(all_due(&b).await, vec![first.id()]);
    let c2 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c2.claim, 2);
    assert_eq!(c2.started_at, c1.started_at, "the first start is kept");
    assert_eq!(
        c2.window_end, c1.window_end,
        "the window is fixed at the first claim"
    );
    assert_eq!(
        c2.lease_until,
        Some(
            b.now()
                .saturating_add(SignedDuration::from_mins(10))
                .unwrap()
        )
    );
}

on_both_backends!(a_claim_is_renewed_only_while_it_is_held, renew);
async fn renew(kind: Kind) {
    let b = Backend::new(kind).await;
    let (_, first) = b.agent("scout", "15m").await;
    let c1 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    b.advance(SignedDuration::from_mins(9));
    let until = b
        .now()
        .saturating_add(SignedDuration::from_mins(10))
        .unwrap();
    assert!(b.store.renew(&c1, until).await.unwrap());
    let stored = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(stored.lease_until, Some(until));
    assert_eq!(stored.claim, 1, "renewing is not a new claim");
    // Past the first lease, but inside the renewed one: not due, not claimable.
    b.advance(SignedDuration::from_mins(2));
    assert!(all_due(&b).await.is_empty());
    assert!(
        b.store
            .claim(&first.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_none()
    );
    // Once a later claim holds it, the old one cannot renew.
    b.advance(SignedDuration::from_mins(9));
    let c2 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c2.claim, 2);
    assert!(!b.store.renew(&c1, until).await.unwrap());
    assert!(b.store.renew(&c2, until).await.unwrap());
    // Nor once it is pending again.
    assert!(b.store.defer(&c2, b.now()).await.unwrap());
    assert!(!b.store.renew(&c2, until).await.unwrap());
}

on_both_backends!(a_heartbeat_that_is_not_yet_due_cannot_be_claimed, not_due);
async fn not_due(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, first) = b.agent("scout", "15m").await;
    let c = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    let mut done = c.clone();
    done.status = HeartbeatStatus::Completed;
    done.completed_at = Some(b.now());
    let later = b
        .now()
        .saturating_add(SignedDuration::from_mins(15))
        .unwrap();
    let next = pulse_shared::domain::Heartbeat::pending(
        &agent,
        2,
        later,
        c.window_end.clone().unwrap(),
        0,
        None,
        0,
    );
    b.store
        .finish(&Finish {
            heartbeat: done,
            next: Some(next.clone()),
            heartbeat_event: None,
        })
        .await
        .unwrap();
    assert!(all_due(&b).await.is_empty());
    assert!(
        b.store
            .claim(&next.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_none()
    );
    b.advance(SignedDuration::from_mins(15));
    assert_eq!(all_due(&b).await, vec![next.id()]);
    assert!(
        b.store
            .claim(&next.id(), &claim_req(&b))
            .await
            .unwrap()
            .is_some()
    );
}

/// A heartbeat claimed, its lease run out and claimed again: the backend, its agent, the
/// heartbeat as filed, and the first and second claims.
async fn reclaimed(
    kind: Kind,
) -> (
    Backend,
    pulse_shared::domain::Agent,
    pulse_shared::domain::Heartbeat,
    pulse_shared::domain::Heartbeat,
    pulse_shared::domain::Heartbeat,
) {
    let b = Backend::new(kind).await;
    let (agent, first) = b.agent("scout", "15m").await;
    let c1 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    b.advance(SignedDuration::from_mins(11));
    let c2 = b
        .store
        .claim(&first.id(), &claim_req(&b))
        .await
        .unwrap()
        .unwrap();
    (b, agent, first, c1, c2)
}

on_both_backends!(
    an_idle_finish_is_fenced_by_the_claim_and_files_one_next_heartbeat,
    idle_finish
);
/// A finish with no event to write (an idle beat's): a stale run's finish is refused,
/// and the run that holds the claim files exactly one next heartbeat, whichever of the
/// two got to write it (DynamoDB writes the next before the record it completes).
async fn idle_finish(kind: Kind) {
    let (b, agent, first, c1, c2) = reclaimed(kind).await;
    let due = b
        .now()
        .saturating_add(SignedDuration::from_mins(15))
        .unwrap();
    let finished = |claimed: &pulse_shared::domain::Heartbeat, skipped: &str| {
        let mut done = claimed.clone();
        done.status = HeartbeatStatus::Completed;
        done.completed_at = Some(b.now());
        done.skipped = Some(skipped.to_owned());
        // Traces on: the run's trace is kept on the record, within its write unit.
        done.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
        Finish {
            heartbeat: done,
            next: Some(pulse_shared::domain::Heartbeat::pending(
                &agent,
                2,
                due,
                claimed.window_end.clone().unwrap(),
                0,
                None,
                0,
            )),
            heartbeat_event: None,
        }
    };
    assert_eq!(
        b.store.finish(&finished(&c1, "stale")).await.unwrap(),
        FinishOutcome::Superseded {
            claim: 2,
            status: HeartbeatStatus::Executing
        }
    );
    let current = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(
        (current.status, current.claim),
        (HeartbeatStatus::Executing, 2)
    );
    // In a unit of work's tally, as a worker runs it: the record counts every write.
    let finish = finished(&c2, "idle");
    let outcome = pulse_shared::tally::scope(b.store.finish(&finish)).await;
    assert_eq!(outcome.unwrap(), FinishOutcome::Finished);
    assert_eq!(
        b.store.finish(&finished(&c2, "idle")).await.unwrap(),
        FinishOutcome::AlreadyFinished
    );
    let done = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Completed);
    assert_eq!(done.skipped.as_deref(), Some("idle"));
    assert_eq!(
        done.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    let listed = b.store.list_heartbeats(&agent.id, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|h| (h.beat, h.status))
            .collect::<Vec<_>>(),
        vec![
            (2, HeartbeatStatus::Pending),
            (1, HeartbeatStatus::Completed)
        ]
    );
    assert!(all_due(&b).await.is_empty());
    b.advance(SignedDuration::from_mins(15));
    assert_eq!(all_due(&b).await, vec![first.next_id()]);
    if kind == Kind::Aws {
        // Two writes of a unit each (the next, then the record) where a transaction
        // bills four; the claim's one before them.
        let kept = done.requests.clone().unwrap();
        assert_eq!(kept.ops["DynamoDB.PutItem"], 1, "{kept:?}");
        assert_eq!(kept.ops["DynamoDB.UpdateItem"], 2, "{kept:?}");
        assert!(!kept.ops.contains_key("DynamoDB.TransactWriteItems"));
        assert_eq!(kept.wru, 3.0, "{kept:?}");
    }
}

on_both_backends!(
    finishing_is_atomic_idempotent_and_fenced_by_the_claim,
    finish
);
async fn finish(kind: Kind) {
    let (b, agent, first, c1, c2) = reclaimed(kind).await;

    let hb_event = NewEvent::new("X", json!({}), None).unwrap().into_event(
        agent.id.clone(),
        "system",
        b.now(),
    );
    let mut hb_event = hb_event;
    hb_event.event_type = EventType::heartbeat();
    hb_event.cascade = Some(Cascade {
        heartbeat_id: first.id(),
        depth: 0,
        capped: false,
    });
    // The requests its run counted, which the record keeps.
    let mut given = Requests::default();
    given.count("Test.Op", 1.5);
    given.count("Test.Op", 0.0);
    let finished = |claimed: &pulse_shared::domain::Heartbeat| {
        let mut done = claimed.clone();
        done.status = HeartbeatStatus::Completed;
        done.completed_at = Some(b.now());
        done.events_processed = 3;
        done.actions_triggered = 2;
        done.since_last = Some(1);
        done.requests = Some(given.clone());
        done.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
        Finish {
            heartbeat: done,
            next: Some(pulse_shared::domain::Heartbeat::pending(
                &agent,
                2,
                b.now()
                    .saturating_add(SignedDuration::from_mins(15))
                    .unwrap(),
                claimed.window_end.clone().unwrap(),
                0,
                None,
                0,
            )),
            heartbeat_event: Some(hb_event.clone()),
        }
    };

    // The first claim's run is stale: it may not finish the heartbeat.
    let stale = b.store.finish(&finished(&c1)).await.unwrap();
    assert_eq!(
        stale,
        FinishOutcome::Superseded {
            claim: 2,
            status: HeartbeatStatus::Executing
        }
    );
    assert!(
        b.store
            .get_heartbeat(&first.next_id())
            .await
            .unwrap()
            .is_none()
    );

    assert_eq!(
        b.store.finish(&finished(&c2)).await.unwrap(),
        FinishOutcome::Finished
    );
    assert_eq!(
        b.store.finish(&finished(&c2)).await.unwrap(),
        FinishOutcome::AlreadyFinished
    );

    let done = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Completed);
    assert_eq!(
        done.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(
        (
            done.events_processed,
            done.actions_triggered,
            done.since_last
        ),
        (3, 2, Some(1))
    );
    let kept = done.requests.clone().unwrap();
    match kind {
        Kind::Sqlite => {
            assert_eq!(kept, given);
            assert_eq!(c2.requests, None, "the embedded store sends no requests");
        }
        Kind::Aws => {
            // The claim counts itself on the record it returns, the finish on the
            // record it writes.
            let claimed = c2.requests.clone().unwrap();
            assert_eq!(claimed.ops["DynamoDB.UpdateItem"], 1);
            assert_eq!(claimed.wru, 1.0);
            assert_eq!(kept.ops["Test.Op"], 2);
            assert_eq!(kept.ops["DynamoDB.TransactWriteItems"], 1);
            assert_eq!(
                kept.wru,
                1.5 + 2.0 * 3.0,
                "the update, the next heartbeat, the event"
            );
        }
    }
    let next = b
        .store
        .get_heartbeat(&first.next_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(next.window_start, c2.window_end.clone().unwrap());
    let listed = b.store.list_heartbeats(&agent.id, 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|h| h.beat).collect::<Vec<_>>(),
        vec![2, 1]
    );
    // The HEARTBEAT event went in with the finish, and is not part of any window.
    let events = b.store.list_events(&agent.id, 10).await.unwrap();
    assert_eq!(events, vec![hb_event]);
    let window = b
        .store
        .read_window(
            &agent.id,
            &EventCursor::origin(),
            &EventCursor::through(b.now()),
            10,
        )
        .await
        .unwrap();
    assert!(window.events.is_empty());
    // Nothing is due until the next heartbeat's time.
    assert!(all_due(&b).await.is_empty());
}

on_both_backends!(
    a_window_holds_the_events_between_its_cursors_in_order,
    window
);
async fn window(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let (other, _) = b.agent("other", "15m").await;
    let before = b.emit(&agent, "A", json!({"n": 0})).await;
    let start = EventCursor::through(b.now());
    b.advance(SignedDuration::from_secs(1));
    let e1 = b.emit(&agent, "A", json!({"n": 1})).await;
    let e2 = b.emit(&agent, "B", json!({"n": 2})).await;
    b.emit(&other, "A", json!({"n": 9})).await;
    // An event the heartbeat made for itself is never part of a window.
    let mut own = NewEvent::new("C", json!({}), None).unwrap().into_event(
        agent.id.clone(),
        "tool:x",
        b.now(),
    );
    own.cascade = Some(Cascade {
        heartbeat_id: HeartbeatId::new(agent.id.clone(), 1),
        depth: 1,
        capped: false,
    });
    b.store.append(&own).await.unwrap();
    let end = EventCursor::through(b.now());
    b.advance(SignedDuration::from_secs(1));
    let after = b.emit(&agent, "A", json!({"n": 3})).await;

    let w = b
        .store
        .read_window(&agent.id, &start, &end, 100)
        .await
        .unwrap();
    assert_eq!(w.agent.as_ref().map(|a| &a.id), Some(&agent.id));
    let ids: Vec<_> = w.events.iter().map(|e| e.id.clone()).collect();
    let mut expected = vec![e1.id.clone(), e2.id.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    assert!(!w.truncated);
    assert_eq!(w.events.iter().find(|e| e.id == e1.id).unwrap(), &e1);

    // Truncation at the limit, resumable from the last event read.
    let w1 = b
        .store
        .read_window(&agent.id, &EventCursor::origin(), &end, 2)
        .await
        .unwrap();
    assert!(w1.truncated);
    assert_eq!(w1.events.len(), 2);
    assert!(w1.agent.is_some());
    let w2 = b
        .store
        .read_window(
            &agent.id,
            &EventCursor::after(&w1.events[1].id),
            &EventCursor::through(b.now()),
            10,
        )
        .await
        .unwrap();
    let mut all: Vec<_> = w1
        .events
        .iter()
        .chain(w2.events.iter())
        .map(|e| e.id.clone())
        .collect();
    all.sort();
    let mut want = vec![before.id, e1.id, e2.id.clone(), after.id];
    want.sort();
    assert_eq!(all, want);

    let gone = b
        .store
        .read_window(&AgentId::generate(), &start, &end, 10)
        .await
        .unwrap();
    assert!(gone.agent.is_none() && gone.events.is_empty());

    let got = b
        .store
        .get_events(&agent.id, &[e2.id.clone(), own.id.clone()])
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
}

on_both_backends!(
    actions_are_created_once_and_finished_with_their_events,
    actions
);
async fn actions(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, first) = b.agent("scout", "15m").await;
    let event = b.emit(&agent, "A", json!({})).await;
    let tool = ToolName::parse("echo").unwrap();
    let action = running_action(&b, &first, &event, &tool, json!({"hello": 1}));
    assert!(b.store.start_action(&action).await.unwrap().is_none());
    assert_eq!(
        b.store.start_action(&action).await.unwrap(),
        Some(action.clone())
    );

    // A dead worker's RUNNING action is taken over once.
    let mut second = action.clone();
    second.attempt = 2;
    assert!(b.store.restart_action(&second, 1).await.unwrap());
    assert!(!b.store.restart_action(&second, 1).await.unwrap());

    // The first attempt can no longer finish it.
    let mut stale = action.clone();
    stale.status = ActionStatus::Completed;
    assert!(matches!(
        b.store.finish_action(&stale, &[], Writer::Session).await,
        Err(StoreError::Conflict(_))
    ));

    let mut out = NewEvent::new("B", json!({"from": "echo"}), Some(2))
        .unwrap()
        .into_event(agent.id.clone(), "tool:echo", b.now());
    out.parent_id = Some(event.id.clone());
    out.cascade = Some(Cascade {
        heartbeat_id: first.id(),
        depth: 1,
        capped: false,
    });
    let mut done = second.clone();
    done.status = ActionStatus::Completed;
    done.response = Some(json!({"success": true}));
    done.new_events = vec![out.id.clone()];
    b.store
        .finish_action(&done, std::slice::from_ref(&out), Writer::Session)
        .await
        .unwrap();
    assert_eq!(
        b.store.start_action(&action).await.unwrap(),
        Some(done.clone())
    );
    assert_eq!(
        b.store
            .get_events(&agent.id, &[out.id.clone()])
            .await
            .unwrap(),
        vec![out]
    );
    assert_eq!(
        b.store.list_actions(&agent.id, 10).await.unwrap(),
        vec![done.clone()]
    );

    // Its operator retries the finished action: once, at the attempt read; a running
    // action is not retried.
    let mut third = done.clone();
    third.status = ActionStatus::Running;
    third.attempt = 3;
    assert!(
        !b.store.retry_action(&third, 1).await.unwrap(),
        "a stale attempt"
    );
    assert!(b.store.retry_action(&third, 2).await.unwrap());
    assert!(!b.store.retry_action(&third, 2).await.unwrap(), "once");
    let mut fourth = third.clone();
    fourth.attempt = 4;
    assert!(
        !b.store.retry_action(&fourth, 3).await.unwrap(),
        "it is running"
    );
    assert_eq!(
        b.store
            .get_action(&agent.id, &done.id)
            .await
            .unwrap()
            .unwrap()
            .attempt,
        3
    );
    // An UNKNOWN outcome is settled once, and only while it is UNKNOWN.
    let mut unknown = third.clone();
    unknown.status = ActionStatus::Unknown;
    b.store
        .finish_action(&unknown, &[], Writer::Session)
        .await
        .unwrap();
    let mut settled = unknown.clone();
    settled.status = ActionStatus::Completed;
    assert!(
        !b.store.settle_action(&settled, 2).await.unwrap(),
        "a stale attempt"
    );
    assert!(b.store.settle_action(&settled, 3).await.unwrap());
    assert!(!b.store.settle_action(&settled, 3).await.unwrap(), "once");
    assert_eq!(
        b.store
            .get_action(&agent.id, &done.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        ActionStatus::Completed
    );
}

on_both_backends!(
    each_finished_call_is_counted_by_its_hour_and_settling_moves_it,
    tool_counts
);
async fn tool_counts(kind: Kind) {
    use pulse_shared::domain::{ToolCount, bucket_of, hour_of};
    let b = Backend::new(kind).await;
    let (scout, first) = b.agent("scout", "15m").await;
    let (other, other_beat) = b.agent("other", "15m").await;
    let start = b.now();
    // Finishes one call of `tool` by `agent` with `status`, taking `ms`.
    async fn call(
        b: &Backend,
        agent: &pulse_shared::domain::Agent,
        beat: &pulse_shared::domain::Heartbeat,
        status: ActionStatus,
        ms: Option<u64>,
    ) -> Action {
        let event = b.emit(agent, "A", json!({})).await;
        let tool = ToolName::parse("alpha").unwrap();
        let mut action = running_action(b, beat, &event, &tool, json!({}));
        assert!(b.store.start_action(&action).await.unwrap().is_none());
        action.status = status;
        action.duration_ms = ms;
        b.store
            .finish_action(&action, &[], Writer::Session)
            .await
            .unwrap();
        action
    }
    call(&b, &scout, &first, ActionStatus::Completed, Some(100)).await;
    call(&b, &scout, &first, ActionStatus::Failed, Some(2_000)).await;
    let unknown = call(&b, &scout, &first, ActionStatus::Unknown, None).await;
    // A cancelled run made no call.
    call(&b, &scout, &first, ActionStatus::Cancelled, Some(5)).await;
    call(&b, &other, &other_beat, ActionStatus::Completed, Some(100)).await;
    // A day and an hour later (another day's partition on DynamoDB).
    b.advance(SignedDuration::from_hours(25));
    call(&b, &scout, &first, ActionStatus::Completed, Some(100)).await;

    let read = |from, agent: Option<AgentId>| {
        let b = &b;
        async move {
            let mut got = b
                .store
                .tool_counts(from, b.now(), agent.as_ref())
                .await
                .unwrap();
            got.sort_by(|x, y| (x.hour, &x.agent_id).cmp(&(y.hour, &y.agent_id)));
            got
        }
    };
    let outcomes = |c: &ToolCount| (c.agent_id.clone(), c.hour, c.succeeded, c.failed, c.unknown);
    let h0 = hour_of(start);
    let mut want = vec![
        (scout.id.clone(), h0, 1, 1, 1),
        (other.id.clone(), h0, 1, 0, 0),
        (scout.id.clone(), h0 + 25, 1, 0, 0),
    ];
    want[..2].sort_by(|x, y| x.0.cmp(&y.0));
    let all = read(start, None).await;
    assert_eq!(all.iter().map(outcomes).collect::<Vec<_>>(), want);
    let first_hour = all.iter().find(|c| c.agent_id == scout.id).unwrap();
    assert_eq!(first_hour.tool, "alpha");
    assert_eq!(
        first_hour.times,
        [(bucket_of(100), 1), (bucket_of(2_000), 1)].into()
    );
    // A window from the next hour holds only the later call; an agent only its own.
    let later = read(
        start + SignedDuration::from_hours(1),
        Some(scout.id.clone()),
    )
    .await;
    assert_eq!(
        later.iter().map(outcomes).collect::<Vec<_>>(),
        vec![(scout.id.clone(), h0 + 25, 1, 0, 0)]
    );
    let theirs = read(start, Some(other.id.clone())).await;
    assert_eq!(
        theirs.iter().map(outcomes).collect::<Vec<_>>(),
        vec![(other.id.clone(), h0, 1, 0, 0)]
    );

    // Settled, the unknown call moves to its outcome in its own hour; only once.
    let mut settled = unknown.clone();
    settled.status = ActionStatus::Completed;
    assert!(b.store.settle_action(&settled, 1).await.unwrap());
    assert!(!b.store.settle_action(&settled, 1).await.unwrap());
    let scout_first = |all: Vec<ToolCount>| {
        all.into_iter()
            .find(|c| c.agent_id == scout.id && c.hour == h0)
            .map(|c| (c.succeeded, c.failed, c.unknown))
    };
    assert_eq!(scout_first(read(start, None).await), Some((2, 1, 0)));

    // Deleting an agent deletes its counts, not another's.
    b.store.purge_agent(&scout.id, true).await.unwrap();
    assert_eq!(
        read(start, None)
            .await
            .iter()
            .map(outcomes)
            .collect::<Vec<_>>(),
        vec![(other.id.clone(), h0, 1, 0, 0)]
    );
}

/// A pause, or an action's outcome, written from outside the agent's session (an
/// operator's verb) that reaches the database later than the write deadline after its
/// event's stamp is refused with nothing written, as a single event from outside is: a
/// heartbeat may already have read past the stamp. Written by the agent's own session,
/// the same late events are taken (its windows are read by its later jobs). SQLite
/// checks inside the transaction; DynamoDB bounds the request with the same timeout, which
/// a local emulator cannot be made to exceed.
#[tokio::test]
async fn events_written_with_a_pause_or_an_outcome_from_outside_keep_the_write_deadline() {
    let b = Backend::new(Kind::Sqlite).await;
    let (agent, first) = b.agent("scout", "15m").await;
    // Stamped three seconds ago: as if the write had waited that long for the file.
    let late = |name: &str| {
        NewEvent::new(name, json!({}), None).unwrap().into_event(
            agent.id.clone(),
            "operator",
            b.now() - SignedDuration::from_secs(3),
        )
    };
    let paused = late("AGENT_PAUSED");
    let refused = b
        .store
        .set_paused(&agent.id, Some(b.now()), &paused, Writer::Outside)
        .await
        .unwrap_err();
    let why = pulse_shared::error::chain(&refused);
    assert!(why.contains("send it again"), "{why}");
    assert_eq!(
        b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .paused_at,
        None
    );
    assert!(
        b.store
            .get_events(&agent.id, std::slice::from_ref(&paused.id))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        b.store
            .set_paused(&agent.id, Some(b.now()), &paused, Writer::Session)
            .await
            .unwrap()
    );
    assert_eq!(
        b.store
            .get_events(&agent.id, std::slice::from_ref(&paused.id))
            .await
            .unwrap()
            .len(),
        1
    );

    let event = b.emit(&agent, "A", json!({})).await;
    let tool = ToolName::parse("echo").unwrap();
    let action = running_action(&b, &first, &event, &tool, json!({}));
    assert!(b.store.start_action(&action).await.unwrap().is_none());
    let out = late("B");
    let mut done = action.clone();
    done.status = ActionStatus::Completed;
    done.new_events = vec![out.id.clone()];
    let refused = b
        .store
        .finish_action(&done, std::slice::from_ref(&out), Writer::Outside)
        .await
        .unwrap_err();
    let why = pulse_shared::error::chain(&refused);
    assert!(why.contains("send it again"), "{why}");
    assert_eq!(
        b.store
            .start_action(&action)
            .await
            .unwrap()
            .map(|a| a.status),
        Some(ActionStatus::Running),
        "the outcome was not written either"
    );
    b.store
        .finish_action(&done, std::slice::from_ref(&out), Writer::Session)
        .await
        .unwrap();
    assert_eq!(
        b.store
            .get_events(&agent.id, std::slice::from_ref(&out.id))
            .await
            .unwrap(),
        vec![out]
    );
}

on_both_backends!(
    tools_and_subscriptions_are_registered_once_and_switchable,
    registry
);
async fn registry(kind: Kind) {
    let b = Backend::new(kind).await;
    let name = ToolName::parse("FeedReader").unwrap();
    let tool = Tool::http(
        name.clone(),
        "http://127.0.0.1:9/",
        std::time::Duration::from_secs(3),
        b.now(),
    )
    .unwrap();
    b.store.add_tool(&tool).await.unwrap();
    assert!(matches!(
        b.store.add_tool(&tool).await,
        Err(StoreError::AlreadyExists(_))
    ));
    let sub = b
        .subscribe(
            &name,
            "HEARTBEAT",
            1,
            Filter::parse(r#"{"min_priority": 3}"#).unwrap(),
        )
        .await;
    let dup = pulse_shared::domain::Subscription {
        id: sub.clone(),
        tool: name.clone(),
        event_type: EventType::heartbeat(),
        agent_id: None,
        filter: Filter::default(),
        order: 0,
        active: true,
        created_at: b.now(),
    };
    assert!(matches!(
        b.store.add_subscription(&dup).await,
        Err(StoreError::AlreadyExists(_))
    ));

    b.store.set_tool_active(&name, false).await.unwrap();
    b.store.set_subscription_active(&sub, false).await.unwrap();
    let r = b.store.load_registry().await.unwrap();
    assert_eq!(r.tools.len(), 1);
    assert!(!r.tools[0].active);
    assert_eq!(r.subscriptions.len(), 1);
    assert!(!r.subscriptions[0].active);
    assert_eq!(
        r.subscriptions[0].filter.min_priority.map(|p| p.get()),
        Some(3)
    );

    let missing = ToolName::parse("nope").unwrap();
    assert!(matches!(
        b.store.set_tool_active(&missing, true).await,
        Err(StoreError::NotFound(_))
    ));
    let missing_sub =
        pulse_shared::domain::SubscriptionId::for_route(&missing, &EventType::heartbeat(), None);
    assert!(matches!(
        b.store.set_subscription_active(&missing_sub, true).await,
        Err(StoreError::NotFound(_))
    ));
}

on_both_backends!(
    every_change_to_tools_and_subscriptions_moves_the_registry_version_and_a_refused_one_does_not,
    registry_version
);
async fn registry_version(kind: Kind) {
    let b = Backend::new(kind).await;
    let version = || async { b.store.registry_version().await.unwrap() };
    assert_eq!(version().await, 0, "a new store");
    assert_eq!(b.store.load_registry().await.unwrap().version, 0);
    let name = ToolName::parse("Mailer").unwrap();
    let tool = Tool::http(
        name.clone(),
        "http://127.0.0.1:9/",
        std::time::Duration::from_secs(3),
        b.now(),
    )
    .unwrap();
    b.store.add_tool(&tool).await.unwrap();
    assert_eq!(version().await, 1);
    assert!(b.store.add_tool(&tool).await.is_err());
    assert_eq!(version().await, 1, "a refused add changes nothing");
    b.store.update_tool(&tool).await.unwrap();
    b.store.set_tool_active(&name, false).await.unwrap();
    assert_eq!(version().await, 3);
    let sub = b.subscribe(&name, "NOTE", 0, Filter::default()).await;
    b.store.set_subscription_active(&sub, false).await.unwrap();
    assert_eq!(version().await, 5);
    let loaded = b.store.load_registry().await.unwrap();
    assert_eq!(
        loaded.version, 5,
        "the registry carries the version it was read at"
    );
    assert_eq!(loaded.subscriptions.len(), 1);
    b.store.remove_subscription(&sub).await.unwrap();
    assert!(b.store.remove_subscription(&sub).await.is_err());
    b.store.remove_tool(&name).await.unwrap();
    assert!(b.store.set_tool_active(&name, true).await.is_err());
    assert_eq!(version().await, 7);
}

on_both_backends!(the_due_index_pages_through_every_due_heartbeat_once, paging);
async fn paging(kind: Kind) {
    let b = Backend::new(kind).await;
    let mut want = HashSet::new();
    for i in 0..25 {
        let (_, first) = b.agent(&format!("a{i}"), "15m").await;
        want.insert(first.id());
    }
    let mut seen = Vec::new();
    for shard in 0..b.store.due_shards() {
        let mut page = None;
        loop {
            let p = b.store.due(shard, b.now(), page, 3).await.unwrap();
            assert!(p.ids.len() <= 3);
            seen.extend(p.ids);
            match p.next {
                Some(n) => page = Some(n),
                None => break,
            }
        }
    }
    assert_eq!(seen.len(), 25, "no heartbeat listed twice");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), want);
}

on_both_backends!(
    imported_agents_are_stored_with_their_first_heartbeats_due,
    import
);
async fn import(kind: Kind) {
    let b = Backend::new(kind).await;
    let fleet: Vec<_> = (0..60)
        .map(|i| {
            pulse_shared::domain::NewAgent::named(format!("a{i}"))
                .create(b.now())
                .unwrap()
        })
        .collect();
    b.store.import_agents(&fleet).await.unwrap();
    // Idempotent: importing again changes nothing.
    b.store.import_agents(&fleet).await.unwrap();
    assert_eq!(b.store.list_agents().await.unwrap().len(), 60);
    let due: HashSet<_> = all_due(&b).await.into_iter().collect();
    assert_eq!(
        due,
        fleet.iter().map(|(_, h)| h.id()).collect::<HashSet<_>>()
    );
    let (agent, first) = &fleet[7];
    assert_eq!(
        b.store.get_agent(&agent.id).await.unwrap().as_ref(),
        Some(agent)
    );
    assert_eq!(
        b.store.get_heartbeat(&first.id()).await.unwrap().as_ref(),
        Some(first)
    );
}

on_both_backends!(
    one_agent_answers_a_discord_channel_and_webhooks_are_stored_without_loss,
    channels_and_webhooks
);
async fn channels_and_webhooks(kind: Kind) {
    use pulse_shared::domain::{NewAgent, RateLimit, Webhook, WebhookId, WebhookScheme};

    let b = Backend::new(kind).await;
    let mut new = NewAgent::named("a");
    new.discord_channel = Some("42".into());
    let (a, first) = new.clone().create(b.now()).unwrap();
    b.store.create_agent(&a, &first).await.unwrap();
    assert_eq!(
        b.store.agent_for_channel("42").await.unwrap(),
        Some(a.id.clone())
    );
    assert_eq!(b.store.agent_for_channel("43").await.unwrap(), None);
    new.name = "b".into();
    let (other, first) = new.create(b.now()).unwrap();
    match b.store.create_agent(&other, &first).await {
        Err(StoreError::AlreadyExists(what)) => assert!(what.contains("channel 42"), "{what}"),
        r => panic!("a second agent for one channel: {r:?}"),
    }
    assert!(
        b.store.get_agent(&other.id).await.unwrap().is_none(),
        "nothing of it was written"
    );

    let mut w = Webhook::new(a.id.clone(), WebhookScheme::Github, "secret-one", b.now()).unwrap();
    w.allowed_types = vec![EventType::parse("GITHUB_PUSH").unwrap()];
    w.rate_limit = Some(RateLimit { per_hour: 7 });
    b.store.create_webhook(&w).await.unwrap();
    assert!(matches!(
        b.store.create_webhook(&w).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(b.store.get_webhook(&w.id).await.unwrap(), Some(w.clone()));
    w.rotate("secret-two", SignedDuration::from_hours(1), b.now())
        .unwrap();
    w.active = false;
    b.store.update_webhook(&w).await.unwrap();
    assert_eq!(b.store.get_webhook(&w.id).await.unwrap(), Some(w.clone()));
    assert_eq!(b.store.list_webhooks().await.unwrap(), vec![w.clone()]);
    let mut ghost = w.clone();
    ghost.id = WebhookId::generate();
    assert!(matches!(
        b.store.update_webhook(&ghost).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(b.store.get_webhook(&ghost.id).await.unwrap().is_none());
}

on_both_backends!(
    hooks_and_deliveries_are_written_only_over_the_version_read,
    hook_versions
);
async fn hook_versions(kind: Kind) {
    use pulse_shared::domain::{
        AttemptStatus, DeliveryStatus, Hook, HookAttempt, HookDeliveryId, HookTarget, HookTask,
        HookType,
    };
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let mut h = Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse("https://example.com/h").unwrap(),
        "whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
        b.now(),
    );
    b.store.create_hook(&h).await.unwrap();
    assert!(matches!(
        b.store.create_hook(&h).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(b.store.get_hook(&h.id).await.unwrap().unwrap(), h);
    let routes = b.store.hook_routes(&agent.id).await.unwrap();
    assert_eq!(routes, vec![h.route()]);

    // A write over the version read succeeds; a second writer that read the same
    // version conflicts; the route follows the hook.
    let mut stale = h.clone();
    h.active = false;
    h.version += 1;
    b.store.update_hook(&h).await.unwrap();
    stale.description = Some("late".into());
    stale.version += 1;
    assert!(matches!(
        b.store.update_hook(&stale).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(!b.store.hook_routes(&agent.id).await.unwrap()[0].active);
    assert_eq!(
        b.store.list_hooks(&agent.id).await.unwrap(),
        vec![h.clone()]
    );
    let mut gone = h.clone();
    gone.id = pulse_shared::domain::HookId::generate();
    gone.version += 1;
    assert!(matches!(
        b.store.update_hook(&gone).await,
        Err(StoreError::NotFound(_))
    ));

    let task = HookTask {
        v: HookTask::VERSION,
        delivery_id: HookDeliveryId::generate(b.now().as_millisecond() as u64),
        hook_id: h.id.clone(),
        agent_id: agent.id.clone(),
        hook_type: h.hook_type.clone(),
        attempt: 1,
        not_before: b.now(),
        body: "{}".into(),
        emitted_at: b.now(),
    };
    let mut d = task.new_delivery(b.now());
    d.attempts = 1;
    d.version = 1;
    b.store.save_delivery(&d, None).await.unwrap();
    // Two claims of the same attempt: only one is written.
    assert!(matches!(
        b.store.save_delivery(&d, None).await,
        Err(StoreError::Conflict(_))
    ));
    let attempt = HookAttempt {
        delivery_id: d.id.clone(),
        hook_id: h.id.clone(),
        attempt: 1,
        status: AttemptStatus::Success,
        http_status: Some(200),
        response_body: None,
        error: None,
        duration_ms: 3,
        at: b.now(),
        next_attempt_at: None,
    };
    d.status = DeliveryStatus::Succeeded;
    d.version = 2;
    b.store.save_delivery(&d, Some(&attempt)).await.unwrap();
    assert_eq!(b.store.get_delivery(&d.id).await.unwrap().unwrap(), d);
    assert_eq!(
        b.store.list_deliveries(&h.id, 10).await.unwrap(),
        vec![d.clone()]
    );
    assert_eq!(b.store.list_attempts(&d.id).await.unwrap(), vec![attempt]);
}

on_both_backends!(
    an_event_listing_filters_by_type_and_time_and_pages_back,
    event_listing
);
async fn event_listing(kind: Kind) {
    use pulse_shared::ports::EventQuery;
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let (other, _) = b.agent("critic", "15m").await;
    // 30 events a second apart, alternating NOTE and ALERT; one for another agent.
    let mut all = Vec::new();
    for i in 0..30 {
        let ty = if i % 2 == 0 { "NOTE" } else { "ALERT" };
        all.push(b.emit(&agent, ty, json!({ "i": i })).await);
        b.advance(SignedDuration::from_secs(1));
    }
    b.emit(&other, "NOTE", json!({})).await;
    let ids = |events: &[pulse_shared::domain::Event]| -> Vec<i64> {
        events
            .iter()
            .map(|e| e.payload["i"].as_i64().unwrap())
            .collect()
    };

    let latest = b.store.list_events(&agent.id, 5).await.unwrap();
    assert_eq!(
        ids(&latest),
        vec![25, 26, 27, 28, 29],
        "newest 5, oldest first"
    );

    let alerts = EventQuery {
        types: vec![EventType::parse("ALERT").unwrap()],
        limit: 4,
        ..EventQuery::default()
    };
    let page = b.store.query_events(&agent.id, &alerts).await.unwrap();
    assert_eq!(ids(&page), vec![23, 25, 27, 29]);
    // The next page back starts before the oldest of this one.
    let back = EventQuery {
        before: Some(page[0].id.clone()),
        ..alerts.clone()
    };
    let page2 = b.store.query_events(&agent.id, &back).await.unwrap();
    assert_eq!(ids(&page2), vec![15, 17, 19, 21]);

    // Since a time: events created at or after the 26th second.
    let since = all[26].created_at;
    let recent = EventQuery {
        after: Some(EventCursor::through(
            since
                .saturating_sub(SignedDuration::from_millis(1))
                .unwrap(),
        )),
        limit: 100,
        ..EventQuery::default()
    };
    let got = b.store.query_events(&agent.id, &recent).await.unwrap();
    assert_eq!(ids(&got), vec![26, 27, 28, 29]);
    // After an event: strictly newer than it.
    let after = EventQuery {
        after: Some(EventCursor::after(&all[27].id)),
        limit: 100,
        ..EventQuery::default()
    };
    let got = b.store.query_events(&agent.id, &after).await.unwrap();
    assert_eq!(ids(&got), vec![28, 29]);
    // A type nobody emitted, and types across the whole log.
    let none = EventQuery {
        types: vec![EventType::parse("NOPE").unwrap()],
        limit: 10,
        ..EventQuery::default()
    };
    assert!(
        b.store
            .query_events(&agent.id, &none)
            .await
            .unwrap()
            .is_empty()
    );
    let both = EventQuery {
        types: vec![
            EventType::parse("NOTE").unwrap(),
            EventType::parse("ALERT").unwrap(),
        ],
        limit: 1_000,
        ..EventQuery::default()
    };
    assert_eq!(
        b.store.query_events(&agent.id, &both).await.unwrap().len(),
        30,
        "the other agent's event is not listed"
    );
}

on_both_backends!(
    actions_are_listed_by_the_range_of_their_events,
    actions_by_range
);
async fn actions_by_range(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, first) = b.agent("scout", "15m").await;
    let mut events = Vec::new();
    for i in 0..4 {
        events.push(b.emit(&agent, "NOTE", json!({ "i": i })).await);
        b.advance(SignedDuration::from_secs(1));
    }
    for event in &events {
        for tool in ["alpha", "zeta-tool"] {
            let tool = ToolName::parse(tool).unwrap();
            let action = running_action(&b, &first, event, &tool, json!({}));
            assert!(b.store.start_action(&action).await.unwrap().is_none());
        }
    }
    // (after event 0, through event 2]: both tools' actions on events 1 and 2, in order.
    let got = b
        .store
        .actions_between(
            &agent.id,
            &EventCursor::after(&events[0].id),
            &EventCursor::after(&events[2].id),
            100,
        )
        .await
        .unwrap();
    let seen: Vec<(String, String)> = got
        .iter()
        .map(|a| (a.event_id.to_string(), a.tool.to_string()))
        .collect();
    let want: Vec<(String, String)> = [1, 2]
        .iter()
        .flat_map(|&i| ["alpha", "zeta-tool"].map(|t| (events[i].id.to_string(), t.to_owned())))
        .collect();
    assert_eq!(seen, want);
    // From the origin through a time, and a limit.
    let all = b
        .store
        .actions_between(
            &agent.id,
            &EventCursor::origin(),
            &EventCursor::through(b.now()),
            3,
        )
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].event_id, events[0].id);
}

on_both_backends!(a_window_says_whether_its_agent_has_hooks, window_has_hooks);
/// The window read may spare the heartbeat its read of the routes, but never for an agent
/// that has hooks: `Some(false)` only when it has none. SQLite always knows.
async fn window_has_hooks(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let read = || async {
        b.store
            .read_window(
                &agent.id,
                &EventCursor::origin(),
                &EventCursor::through(b.now()),
                10,
            )
            .await
            .unwrap()
            .has_hooks
    };
    let without = read().await;
    assert_ne!(without, Some(true));
    let hook = pulse_shared::domain::Hook::new(
        agent.id.clone(),
        pulse_shared::domain::HookType::parse("AFTER_HEARTBEAT").unwrap(),
        pulse_shared::domain::HookTarget::parse("https://hooks.example.com/in").unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        b.now(),
    );
    b.store.create_hook(&hook).await.unwrap();
    let with = read().await;
    assert_ne!(
        with,
        Some(false),
        "an agent with a hook must have its routes read"
    );
    if kind == Kind::Sqlite {
        assert_eq!((without, with), (Some(false), Some(true)));
    }
}

/// A pending approval of `agent`'s call `key`, parked now and expiring after `expiry`.
fn parked(
    b: &Backend,
    agent: &AgentId,
    key: &str,
    expiry: SignedDuration,
) -> pulse_shared::domain::Approval {
    use pulse_shared::domain::{Approval, ApprovalId, ApprovalStatus, schema_digest};
    let at_ms = b.now().as_millisecond() as u64;
    Approval {
        id: ApprovalId::derived(at_ms, key),
        agent_id: agent.clone(),
        server: ToolName::parse("mail").unwrap(),
        tool: "send".into(),
        model_name: "mail__send".into(),
        arguments: json!({"to": "ada@example.com", "key": key}),
        key: key.into(),
        at_ms,
        heartbeat_id: None,
        event_id: None,
        turn_id: None,
        step: 0,
        reason: Some("the user asked for it".into()),
        schema: schema_digest(&json!({"type": "object"})),
        requested_at: b.now(),
        expires_at: b.now() + expiry,
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        decision_reason: None,
        outcome: None,
        asked_at: None,
    }
}

on_both_backends!(
    a_parked_call_is_decided_once_listed_by_expiry_settled_and_purged,
    approvals
);
async fn approvals(kind: Kind) {
    use pulse_shared::domain::{ApprovalOutcome, ApprovalStatus, Decision};
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("asker", "15m").await;
    let (other, _) = b.agent("other", "15m").await;
    let late = parked(&b, &agent.id, "late", SignedDuration::from_hours(2));
    let soon = parked(&b, &agent.id, "soon", SignedDuration::from_mins(10));
    let others = parked(&b, &other.id, "theirs", SignedDuration::from_hours(1));
    for a in [&late, &soon, &others] {
        assert_eq!(b.store.park_approval(a).await.unwrap(), None, "parked");
    }
    // Parked again (a run made again): the stored one comes back, nothing is written.
    let mut again = late.clone();
    again.reason = Some("changed".into());
    assert_eq!(
        b.store.park_approval(&again).await.unwrap(),
        Some(late.clone())
    );
    assert_eq!(
        b.store.get_approval(&agent.id, &late.id).await.unwrap(),
        Some(late.clone())
    );
    assert_eq!(
        b.store.get_approval(&other.id, &late.id).await.unwrap(),
        None,
        "another agent's id is not found"
    );
    let pending: Vec<_> = b
        .store
        .open_approvals(10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(
        pending,
        [soon.id.clone(), others.id.clone(), late.id.clone()],
        "soonest to expire first, across agents"
    );
    assert_eq!(b.store.open_approvals(1).await.unwrap().len(), 1);
    // Its owner asked once: the first mark is written, a second (a race) is not.
    let mut asked = soon.clone();
    asked.asked_at = Some(b.now());
    assert!(b.store.mark_asked(&asked).await.unwrap());
    assert!(!b.store.mark_asked(&asked).await.unwrap(), "asked once");
    let open = b.store.open_approvals(1).await.unwrap().remove(0);
    assert_eq!(open.asked_at, Some(b.now()), "the open copy says so too");
    let soon = asked;
    // Settling a pending one is refused: it has to be decided first.
    assert!(matches!(
        b.store.settle_approval(&late).await,
        Err(StoreError::Conflict(_))
    ));
    // Eight deciders at once: one decision is written, seven are given it.
    let mut racing = Vec::new();
    for n in 0..8 {
        let (store, decided) = (
            b.store.clone(),
            late.decided(
                &Decision {
                    approve: n % 2 == 0,
                    by: format!("decider {n}"),
                    reason: None,
                    always: false,
                },
                b.now(),
            ),
        );
        racing.push(tokio::spawn(async move {
            store.decide_approval(&decided).await.unwrap()
        }));
    }
    let mut written = 0;
    let mut refusals = Vec::new();
    for r in racing {
        match r.await.unwrap() {
            None => written += 1,
            Some(stored) => refusals.push(stored),
        }
    }
    assert_eq!(written, 1, "the first decision is the only one");
    let stored = b
        .store
        .get_approval(&agent.id, &late.id)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(stored.status, ApprovalStatus::Pending);
    assert_eq!(refusals.len(), 7);
    for r in &refusals {
        assert_eq!(r, &stored, "a refused decider is told who decided");
    }
    // Open, decided, until it is settled.
    let open: Vec<_> = b
        .store
        .open_approvals(10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.id, a.status))
        .collect();
    assert_eq!(
        open,
        [
            (soon.id.clone(), ApprovalStatus::Pending),
            (others.id.clone(), ApprovalStatus::Pending),
            (late.id.clone(), stored.status)
        ]
    );
    // Expired by the sweep the same way, once.
    let expired = soon.expired(b.now());
    assert_eq!(b.store.decide_approval(&expired).await.unwrap(), None);
    assert_eq!(
        b.store
            .decide_approval(&soon.expired(b.now()))
            .await
            .unwrap()
            .map(|a| a.status),
        Some(ApprovalStatus::Expired)
    );
    // Settled: its outcome recorded, its decision unchanged.
    let mut settled = stored.clone();
    settled.outcome = Some(ApprovalOutcome {
        sent: true,
        action_id: None,
        summary: "sent".into(),
        failed: false,
        at: b.now(),
    });
    settled.decided_by = Some("someone else".into());
    b.store.settle_approval(&settled).await.unwrap();
    let read = b
        .store
        .get_approval(&agent.id, &late.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.outcome, settled.outcome);
    assert_eq!(
        read.decided_by, stored.decided_by,
        "only the outcome is written"
    );
    // Listed newest first (ids are stamped alike here, so by id).
    let listed = b.store.approvals(&agent.id, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed[0].id > listed[1].id);
    assert_eq!(b.store.approvals(&agent.id, 1).await.unwrap().len(), 1);
    // Unknown ones are not found.
    let ghost = parked(&b, &agent.id, "ghost", SignedDuration::from_hours(1));
    assert!(matches!(
        b.store.decide_approval(&ghost.expired(b.now())).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        b.store.settle_approval(&ghost).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        b.store.mark_asked(&ghost).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(
        !b.store.mark_asked(&stored).await.unwrap(),
        "a decided one is not asked about"
    );
    // Purged with the agent, its open entries too.
    let footprint = b.store.purge_agent(&other.id, false).await.unwrap();
    assert_eq!(footprint.approvals, 1);
    b.store.purge_agent(&other.id, true).await.unwrap();
    let open: Vec<_> = b
        .store
        .open_approvals(10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(open, vec![soon.id], "the expired one waits to be settled");
    assert!(b.store.approvals(&other.id, 10).await.unwrap().is_empty());
}

on_both_backends!(
    retention_removes_settled_approvals_past_the_horizon_and_keeps_open_ones,
    approvals_pruned
);
async fn approvals_pruned(kind: Kind) {
    use pulse_shared::domain::ApprovalOutcome;
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("asker", "15m").await;
    let old_settled = parked(&b, &agent.id, "settled", SignedDuration::from_mins(10));
    let old_open = parked(&b, &agent.id, "open", SignedDuration::from_hours(20 * 24));
    for a in [&old_settled, &old_open] {
        b.store.park_approval(a).await.unwrap();
    }
    let mut done = old_settled.expired(b.now());
    b.store.decide_approval(&done).await.unwrap();
    done.outcome = Some(ApprovalOutcome {
        sent: false,
        action_id: None,
        summary: "expired".into(),
        failed: false,
        at: b.now(),
    });
    b.store.settle_approval(&done).await.unwrap();
    b.advance(SignedDuration::from_hours(10 * 24));
    let recent = parked(&b, &agent.id, "recent", SignedDuration::from_hours(1));
    b.store.park_approval(&recent).await.unwrap();
    // The horizon a week back: the old settled one goes, the old open one stays.
    let horizon = b.now() - SignedDuration::from_hours(7 * 24);
    let counted = b
        .store
        .prune_agent(&agent.id, horizon, b.now(), false)
        .await
        .unwrap();
    assert_eq!(counted.approvals, 1, "{counted:?}");
    assert_eq!(
        b.store.approvals(&agent.id, 10).await.unwrap().len(),
        3,
        "a dry run keeps them"
    );
    let pruned = b
        .store
        .prune_agent(&agent.id, horizon, b.now(), true)
        .await
        .unwrap();
    assert_eq!(pruned.approvals, 1);
    let left: Vec<_> = b
        .store
        .approvals(&agent.id, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(left, [recent.id.clone(), old_open.id.clone()]);
}
