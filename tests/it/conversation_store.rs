//! Conformance of the conversation, memory and deferral ports, on every backend.

use jiff::SignedDuration;
use pulse_shared::domain::{
    ClaimRequest, ConversationMessage, EventCursor, HeartbeatStatus, Memory, MemoryId, ReplyTarget,
    Role, Seen, SignalId, Turn, TurnId, TurnStatus, Usage,
};
use pulse_shared::engine::mark_seen;
use pulse_shared::error::StoreError;
use pulse_shared::ports::TurnStart;
use pulse_tests::{Backend, Kind, on_both_backends};

fn turn(b: &Backend, agent: &pulse_shared::domain::Agent, signals: &[SignalId]) -> Turn {
    Turn {
        id: TurnId::for_signal(&signals[0]),
        agent_id: agent.id.clone(),
        session: agent.session.clone(),
        signals: signals.to_vec(),
        status: TurnStatus::Delivering,
        parts: vec!["hello".into()],
        delivered: 0,
        target: ReplyTarget::None,
        discord_message_ids: Vec::new(),
        provider: "offline".into(),
        model: "offline".into(),
        usage: Usage::default(),
        cost_usd: None,
        steps: Vec::new(),
        error: None,
        created_at: b.now(),
        completed_at: None,
        requests: None,
        spoken_by: None,
        trace_id: None,
        seen: None,
    }
}

/// The turn without the requests its writes counted on it.
fn bare(mut t: Turn) -> Turn {
    t.requests = None;
    t
}

fn message(t: &Turn, n: usize, role: Role, text: &str) -> ConversationMessage {
    ConversationMessage {
        id: format!("{}.{n:02}", t.id),
        agent_id: t.agent_id.clone(),
        turn_id: t.id.clone(),
        role,
        source: "cli".into(),
        agent: None,
        author: None,
        content: text.into(),
        created_at: t.created_at,
        waiting: false,
    }
}

fn signal_id(b: &Backend, n: u64) -> SignalId {
    SignalId::generate(b.now().as_millisecond() as u64 + n)
}

on_both_backends!(
    a_turn_is_written_once_with_its_messages_and_marks_its_signals_answered,
    turns
);
async fn turns(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let (s1, s2, s3) = (signal_id(&b, 1), signal_id(&b, 2), signal_id(&b, 3));
    let t = turn(&b, &agent, &[s1.clone(), s2.clone()]);
    let msgs = vec![
        message(&t, 0, Role::User, "one"),
        message(&t, 1, Role::User, "two"),
        message(&t, 2, Role::Assistant, "reply"),
    ];
    assert!(
        b.store
            .answered(&agent.id, &[s1.clone(), s2.clone(), s3.clone()])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        b.store.begin_turn(&t, &msgs).await.unwrap(),
        TurnStart::Created
    );
    let answered = b
        .store
        .answered(&agent.id, &[s1.clone(), s2.clone(), s3.clone()])
        .await
        .unwrap();
    assert_eq!(
        answered,
        vec![(s1.clone(), t.id.clone()), (s2.clone(), t.id.clone())]
    );

    // Writing it again returns the stored turn, unchanged.
    let mut again = t.clone();
    again.parts = vec!["a different reply".into()];
    match b.store.begin_turn(&again, &msgs).await.unwrap() {
        TurnStart::Exists(existing) => assert_eq!(bare(*existing), t),
        other => panic!("expected Exists, got {other:?}"),
    }
    // A different turn cannot claim an answered signal.
    let mut other = turn(&b, &agent, &[s3.clone(), s2.clone()]);
    other.id = TurnId::for_signal(&s3);
    assert!(matches!(
        b.store.begin_turn(&other, &[]).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(
        b.store.answered(&agent.id, &[s3]).await.unwrap().is_empty(),
        "a rejected turn leaves nothing behind"
    );

    let mut done = t.clone();
    done.delivered = 1;
    done.status = TurnStatus::Done;
    done.discord_message_ids = vec!["123".into()];
    b.store.update_turn(&done).await.unwrap();
    let stored = b.store.get_turn(&agent.id, &t.id).await.unwrap().unwrap();
    // On DynamoDB each write counts itself on the turn it writes (the engine adds the
    // requests before it): here a put of a small item, one write unit.
    match b.kind {
        Kind::Sqlite => assert_eq!(stored.requests, None),
        Kind::Aws => {
            let r = stored.requests.clone().unwrap();
            assert_eq!((r.ops["DynamoDB.PutItem"], r.total(), r.wru), (1, 1, 1.0));
        }
    }
    assert_eq!(bare(stored), done);

    let recent = b.store.recent_messages(&agent.id, 2).await.unwrap();
    let texts: Vec<_> = recent.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["reply", "two"], "newest first, limited");
    // The page before the oldest of those: what is older, newest first.
    let older = b
        .store
        .messages_before(&agent.id, &recent[1].id, 10)
        .await
        .unwrap();
    let texts: Vec<_> = older.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["one"], "older only, the given one left out");
    let first = b
        .store
        .messages_before(&agent.id, &recent[0].id, 1)
        .await
        .unwrap();
    assert_eq!(first[0].content, "two", "limited");
    assert!(
        b.store
            .messages_before(&agent.id, &older[0].id, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Turns are listed newest first, as updated, up to the limit.
    b.advance(SignedDuration::from_secs(1));
    let later = turn(&b, &agent, &[signal_id(&b, 4)]);
    b.store.begin_turn(&later, &[]).await.unwrap();
    let listed = b.store.list_turns(&agent.id, 10).await.unwrap();
    assert_eq!(
        listed.into_iter().map(bare).collect::<Vec<_>>(),
        vec![later.clone(), done]
    );
    let newest = b.store.list_turns(&agent.id, 1).await.unwrap();
    assert_eq!(
        newest.into_iter().map(bare).collect::<Vec<_>>(),
        vec![later]
    );
    let (stranger, _) = b.agent("other", "15m").await;
    assert!(
        b.store
            .list_turns(&stranger.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

on_both_backends!(
    a_reply_is_marked_seen_once_by_the_discord_message_it_wrote,
    seen
);
/// `mark_seen` marks the delivered turn that wrote a Discord message, once (the first
/// sign is kept); never a turn still being delivered, a message no turn wrote, nor
/// another agent's turn.
async fn seen(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let (stranger, _) = b.agent("other", "15m").await;
    let store = b.store.as_ref();
    let mut t = turn(&b, &agent, &[signal_id(&b, 1)]);
    t.discord_message_ids = vec!["501".into()];
    b.store.begin_turn(&t, &[]).await.unwrap();
    let at = b.now();
    let marked = mark_seen(store, &agent.id, "501", "reaction 👍", at).await;
    assert_eq!(marked.unwrap(), None, "still being delivered");

    t.status = TurnStatus::Done;
    t.delivered = 1;
    b.store.update_turn(&t).await.unwrap();
    let marked = mark_seen(store, &agent.id, "501", "reaction 👍", at).await;
    assert_eq!(marked.unwrap(), Some(t.id.clone()));
    let later = at + SignedDuration::from_secs(60);
    let again = mark_seen(store, &agent.id, "501", "reply", later).await;
    assert_eq!(again.unwrap(), None, "the first sign is kept");
    let stored = b.store.get_turn(&agent.id, &t.id).await.unwrap().unwrap();
    let first = Seen {
        at,
        by: "reaction 👍".into(),
    };
    assert_eq!(stored.seen, Some(first));
    assert_eq!(
        stored.status,
        TurnStatus::Done,
        "the rest of the turn as it was"
    );

    let unknown = mark_seen(store, &agent.id, "502", "reply", later).await;
    assert_eq!(unknown.unwrap(), None, "no turn wrote it");
    let elsewhere = mark_seen(store, &stranger.id, "501", "reply", later).await;
    assert_eq!(elsewhere.unwrap(), None, "another agent's message");
}

on_both_backends!(
    memories_keep_their_vectors_and_a_version_that_reinforcement_leaves_alone,
    memories
);
async fn memories(kind: Kind) {
    use pulse_shared::domain::{Embedding, MemoryKind, MemorySource};
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("scout", "15m").await;
    let ms = b.now().as_millisecond() as u64;
    let memory = |i: u64, text: &str| {
        Memory::new(
            MemoryId::derived(ms + i, &[text]),
            &agent.id,
            text,
            7,
            b.now(),
        )
        .unwrap()
    };
    assert_eq!(b.store.memory_version(&agent.id).await.unwrap(), 0);
    let mut first = memory(0, "first: the user is vegetarian");
    first.kind = MemoryKind::Preference;
    first.importance = 0.9;
    first.source = MemorySource::Event;
    first.source_ids = vec!["evt_1".into()];
    first.embedding = Some(Embedding::quantize("m/4", &[0.1, -0.5, 0.25, 1.0]));
    b.store
        .remember(&[first.clone(), memory(1, "second"), memory(2, "third")])
        .await
        .unwrap();
    assert_eq!(
        b.store.memory_version(&agent.id).await.unwrap(),
        1,
        "one bump a write"
    );
    let got: Vec<String> = b
        .store
        .memories(&agent.id, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(got, ["third", "second"], "newest first");
    let all = b.store.all_memories(&agent.id).await.unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(
        all[0], first,
        "every field, the vector included, comes back"
    );
    assert_eq!(
        b.store.get_memory(&agent.id, &first.id).await.unwrap(),
        Some(first.clone())
    );
    // A recall's reinforcement is written without a bump.
    let mut reinforced = first.clone();
    reinforced.reinforce(100, 2880, 0.1, b.now());
    b.store.reinforce(&[reinforced.clone()]).await.unwrap();
    assert_eq!(b.store.memory_version(&agent.id).await.unwrap(), 1);
    let back = b
        .store
        .get_memory(&agent.id, &first.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, reinforced, "the vector is kept");
    // The same id is replaced; forgetting bumps.
    let mut again = memory(1, "second, said again");
    again.id = all[1].id.clone();
    b.store.remember(&[again]).await.unwrap();
    assert_eq!(b.store.all_memories(&agent.id).await.unwrap().len(), 3);
    assert!(b.store.forget(&agent.id, &all[2].id).await.unwrap());
    assert!(!b.store.forget(&agent.id, &all[2].id).await.unwrap());
    assert_eq!(b.store.memory_version(&agent.id).await.unwrap(), 3);
    // Deleting the agent takes them all.
    b.store.purge_agent(&agent.id, true).await.unwrap();
    assert!(b.store.all_memories(&agent.id).await.unwrap().is_empty());
    assert_eq!(b.store.memory_version(&agent.id).await.unwrap(), 0);
}

on_both_backends!(
    a_deferred_heartbeat_is_pending_again_and_claimed_with_a_fresh_window,
    deferral
);
async fn deferral(kind: Kind) {
    let b = Backend::new(kind).await;
    let (_, first) = b.agent("scout", "15m").await;
    let req = |b: &Backend| ClaimRequest {
        now: b.now(),
        lease: SignedDuration::from_mins(10),
        window_end: EventCursor::through(b.now()),
    };
    let claimed = b.store.claim(&first.id(), &req(&b)).await.unwrap().unwrap();
    let until = b.now() + SignedDuration::from_mins(5);
    let mut stale = claimed.clone();
    stale.claim += 1;
    assert!(
        !b.store.defer(&stale, until).await.unwrap(),
        "only the current claim defers"
    );
    assert!(b.store.defer(&claimed, until).await.unwrap());
    let hb = b.store.get_heartbeat(&first.id()).await.unwrap().unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Pending);
    assert_eq!(hb.scheduled_at, until);
    assert_eq!(hb.window_end, None);
    assert!(
        b.store
            .claim(&first.id(), &req(&b))
            .await
            .unwrap()
            .is_none(),
        "not due yet"
    );
    b.advance(SignedDuration::from_mins(5));
    let again = b.store.claim(&first.id(), &req(&b)).await.unwrap().unwrap();
    assert_eq!(again.claim, claimed.claim + 1);
    assert_eq!(again.window_end, Some(EventCursor::through(b.now())));
}

on_both_backends!(
    a_waiting_turn_is_kept_per_session_replaced_listed_soonest_first_and_forgotten,
    waiting_turns
);
async fn waiting_turns(kind: Kind) {
    use pulse_shared::domain::{NewAgent, Signal, SignalMeta, WaitingTurn};
    let b = Backend::new(kind).await;
    let mut sessions = Vec::new();
    for name in ["ana", "ben"] {
        let (agent, first) = NewAgent::named(name).create(b.now()).unwrap();
        b.store.create_agent(&agent, &first).await.unwrap();
        sessions.push(agent);
    }
    let said = |a: &pulse_shared::domain::Agent, text: &str| {
        Signal::user_message(&a.id, &a.session, text, SignalMeta::default(), b.now()).unwrap()
    };
    assert!(b.store.list_waiting(10).await.unwrap().is_empty());
    let (ana, ben) = (&sessions[0], &sessions[1]);
    let w_ana = WaitingTurn::first(vec![said(ana, "one")], "down".into(), b.now()).unwrap();
    b.store.put_waiting(&w_ana).await.unwrap();
    b.advance(SignedDuration::from_secs(5));
    let w_ben = WaitingTurn::first(vec![said(ben, "two")], "down".into(), b.now()).unwrap();
    b.store.put_waiting(&w_ben).await.unwrap();
    let got = b
        .store
        .get_waiting(&ana.id, &ana.session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, w_ana);
    // Tried again: replaced in place, now due after ben's.
    let again = got.failed_again(
        vec![said(ana, "one"), said(ana, "three")],
        "still down".into(),
        b.now(),
    );
    b.store.put_waiting(&again).await.unwrap();
    let listed: Vec<_> = b.store.list_waiting(10).await.unwrap();
    assert_eq!(listed, [w_ben.clone(), again.clone()]);
    assert_eq!(
        b.store.list_waiting(1).await.unwrap(),
        std::slice::from_ref(&w_ben)
    );
    b.store.delete_waiting(&ana.id, &ana.session).await.unwrap();
    assert_eq!(
        b.store.get_waiting(&ana.id, &ana.session).await.unwrap(),
        None
    );
    assert_eq!(b.store.list_waiting(10).await.unwrap(), [w_ben]);
    // Forgetting one that is not there is no error.
    b.store.delete_waiting(&ana.id, &ana.session).await.unwrap();
}

on_both_backends!(
    an_undelivered_reply_is_kept_per_turn_replaced_listed_retrying_first_and_forgotten,
    undelivered_replies
);
async fn undelivered_replies(kind: Kind) {
    use pulse_shared::domain::{NewAgent, TurnId, Undelivered, UndeliveredState};
    let b = Backend::new(kind).await;
    let (agent, first) = NewAgent::named("ana").create(b.now()).unwrap();
    b.store.create_agent(&agent, &first).await.unwrap();
    let turn = |n: u8| TurnId::parse(&format!("tn_01J0000000000000000000000{n}")).unwrap();
    let ids = |n: u8| (agent.id.clone(), agent.session.clone(), turn(n));
    assert!(b.store.list_undelivered(10).await.unwrap().is_empty());
    let one = Undelivered::first(ids(1), "503".into(), false, b.now());
    b.store.put_undelivered(&one).await.unwrap();
    b.advance(SignedDuration::from_secs(5));
    let two = Undelivered::first(ids(2), "400".into(), true, b.now());
    assert_eq!(two.state, UndeliveredState::Undeliverable);
    b.store.put_undelivered(&two).await.unwrap();
    b.advance(SignedDuration::from_secs(5));
    let three = Undelivered::first(ids(3), "403".into(), false, b.now());
    b.store.put_undelivered(&three).await.unwrap();
    assert_eq!(
        b.store.get_undelivered(&agent.id, &turn(1)).await.unwrap(),
        Some(one.clone())
    );
    // Retrying ones first, soonest due first; then the dead letters.
    assert_eq!(
        b.store.list_undelivered(10).await.unwrap(),
        [one.clone(), three.clone(), two.clone()]
    );
    // Tried again: replaced in place, now due after the third.
    let again = one.failed_again("503 again".into(), false, b.now());
    b.store.put_undelivered(&again).await.unwrap();
    assert_eq!(
        b.store.list_undelivered(2).await.unwrap(),
        [three.clone(), again.clone()]
    );
    b.store
        .delete_undelivered(&agent.id, &turn(1))
        .await
        .unwrap();
    assert_eq!(
        b.store.get_undelivered(&agent.id, &turn(1)).await.unwrap(),
        None
    );
    assert_eq!(b.store.list_undelivered(10).await.unwrap(), [three, two]);
    // Forgetting one that is not there is no error.
    b.store
        .delete_undelivered(&agent.id, &turn(1))
        .await
        .unwrap();
}
