//! Operating agents: update (re-planning the pending heartbeat), pause and resume,
//! delete with everything the agent owns — the store ports on each backend, and the
//! engine end to end with a fake model, Discord and hook receiver.

use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{
    Agent, AgentChanges, EventType, Filter, HeartbeatId, HeartbeatStatus, Hook, HookTarget,
    HookType, Memory, NewAgent, NewEvent, Subscription, SubscriptionId, ToolName, Webhook,
    WebhookScheme,
};
use pulse_shared::engine::{
    EngineSettings, Lifecycle, LifecycleError, Refused, Toggled, Verdict, WebhookIntake, Worker,
};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{Finish, FinishOutcome, Reschedule, Store, Writer};
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_hooks::FakeReceiver;
use pulse_tests::fake_llm::FakeLlm;
use pulse_tests::{Backend, FakeTool, Kind, on_both_backends, settings};
use serde_json::json;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A backend with a fake model and Discord, a worker whose heartbeats emit hooks, and
/// the operator's operations (shared with the budget tests).
pub(crate) struct World {
    pub(crate) b: Backend,
    pub(crate) llm: FakeLlm,
    pub(crate) discord: FakeDiscord,
    pub(crate) worker: Worker,
    pub(crate) ops: Lifecycle,
}

pub(crate) async fn world(kind: Kind) -> World {
    world_with(kind, settings()).await
}

pub(crate) async fn world_with(kind: Kind, settings: EngineSettings) -> World {
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    let connected = b.connected();
    let worker = connected.worker(b.clock.clone(), &settings, &services);
    let ops = connected.lifecycle(b.clock.clone(), &settings);
    World {
        b,
        llm,
        discord,
        worker,
        ops,
    }
}

impl World {
    pub(crate) async fn agent(&self, interval: &str, channel: &str) -> Agent {
        // Names are held by one agent each: the first is scout, the next scout-2, …
        let mut new = NewAgent::named(self.b.next_name("scout").await);
        new.interval = interval.parse().unwrap();
        new.discord_channel = Some(channel.into());
        // These tests script the heartbeat agent's model on every beat.
        new.think = pulse_shared::domain::ThinkPolicy::Always;
        let (agent, first) = new.create(self.b.now()).unwrap();
        self.b.store.create_agent(&agent, &first).await.unwrap();
        agent
    }

    /// Sweeps once and runs what it queued; returns how many heartbeats it claimed.
    pub(crate) async fn beat(&self) -> usize {
        let swept = self.b.sweeper(settings()).sweep_once(self.b.now()).await;
        assert!(swept.errors.is_empty(), "{:?}", swept.errors);
        self.b.drain(&self.worker).await;
        swept.claimed
    }

    pub(crate) async fn latest(&self, agent: &Agent) -> pulse_shared::domain::Heartbeat {
        self.b
            .store
            .list_heartbeats(&agent.id, 1)
            .await
            .unwrap()
            .pop()
            .unwrap()
    }

    /// The newest of `agent`'s heartbeats that finished: the latest, or the one before
    /// it when the latest is the next one, pending.
    pub(crate) async fn finished(&self, agent: &Agent) -> pulse_shared::domain::Heartbeat {
        let newest = self.b.store.list_heartbeats(&agent.id, 2).await.unwrap();
        newest
            .into_iter()
            .find(|h| h.status.is_final())
            .expect("a finished heartbeat among the newest two")
    }

    pub(crate) async fn hook(&self, agent: &Agent, hook_type: &str, url: &str) -> Hook {
        let h = Hook::new(
            agent.id.clone(),
            HookType::parse(hook_type).unwrap(),
            HookTarget::parse(url).unwrap(),
            &pulse_signatures::inbound::generate_secret(),
            self.b.now(),
        );
        self.b.store.create_hook(&h).await.unwrap();
        h
    }

    /// Sends every queued hook delivery; returns how many attempts were made.
    pub(crate) async fn dispatch(&self) -> usize {
        let d = self.b.dispatcher();
        let mut attempts = 0;
        for _ in 0..4 {
            attempts += d
                .poll_once(10, Duration::from_secs(60))
                .await
                .unwrap()
                .attempts;
        }
        attempts
    }
}

async fn all_due(b: &Backend) -> Vec<HeartbeatId> {
    let mut out = Vec::new();
    for shard in 0..b.store.due_shards() {
        out.extend(b.store.due(shard, b.now(), None, 1000).await.unwrap().ids);
    }
    out
}

fn marker(agent: &Agent, b: &Backend, name: &str) -> pulse_shared::domain::Event {
    NewEvent::new(name, json!({}), None)
        .unwrap()
        .into_event(agent.id.clone(), "operator", b.now())
}

on_both_backends!(
    the_store_updates_pauses_resumes_and_refiles_heartbeats,
    store_ports
);
async fn store_ports(kind: Kind) {
    let w = world(kind).await;
    let b = &w.b;
    let a = w.agent("15m", "42").await;
    let other = w.agent("15m", "43").await;
    let t = b.now();
    b.store.record_interaction(&a.id, t).await.unwrap();

    // The channel stays unique; a refused update writes nothing.
    let mut taken = a.clone();
    taken.discord_channel = Some("43".into());
    match b.store.update_agent(&taken, &a).await {
        Err(StoreError::AlreadyExists(what)) => assert!(what.contains("43"), "{what}"),
        r => panic!("took another agent's channel: {r:?}"),
    }
    assert_eq!(
        b.store.agent_for_channel("42").await.unwrap(),
        Some(a.id.clone())
    );
    assert_eq!(
        b.store
            .get_agent(&a.id)
            .await
            .unwrap()
            .unwrap()
            .discord_channel
            .as_deref(),
        Some("42")
    );
    // A move: the old channel is free, the new one is the agent's; the last
    // interaction (its own write) is kept.
    let mut moved = a.clone();
    moved.discord_channel = Some("44".into());
    moved.name = "renamed".into();
    b.store.update_agent(&moved, &a).await.unwrap();
    let stored = b.store.get_agent(&a.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.name.as_str(), stored.last_interaction_at),
        ("renamed", Some(t))
    );
    assert_eq!(b.store.agent_for_channel("42").await.unwrap(), None);
    assert_eq!(
        b.store.agent_for_channel("44").await.unwrap(),
        Some(a.id.clone())
    );
    assert_eq!(
        b.store.agent_for_channel("43").await.unwrap(),
        Some(other.id.clone())
    );
    let mut ghost = moved.clone();
    ghost.id = pulse_shared::domain::AgentId::generate();
    assert!(matches!(
        b.store.update_agent(&ghost, &ghost).await,
        Err(StoreError::NotFound(_))
    ));

    // Pausing is one write with its event; twice is a no-op.
    let paused = marker(&a, b, "AGENT_PAUSED");
    assert!(
        b.store
            .set_paused(&a.id, Some(t), &paused, Writer::Outside)
            .await
            .unwrap()
    );
    assert!(
        !b.store
            .set_paused(&a.id, Some(t), &paused, Writer::Outside)
            .await
            .unwrap()
    );
    assert_eq!(
        b.store.get_agent(&a.id).await.unwrap().unwrap().paused_at,
        Some(t)
    );
    let events = b.store.list_events(&a.id, 10).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type.as_str() == "AGENT_PAUSED")
            .count(),
        1
    );
    // An update keeps the pause.
    b.store.update_agent(&moved, &stored).await.unwrap();
    assert!(b.store.get_agent(&a.id).await.unwrap().unwrap().is_paused());

    // The pending heartbeat leaves the due index and cannot be claimed.
    let first = HeartbeatId::new(a.id.clone(), 1);
    assert!(all_due(b).await.contains(&first));
    let hb = b
        .store
        .reschedule(&first, Reschedule::Pause)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hb.status, HeartbeatStatus::Paused);
    assert!(!all_due(b).await.contains(&first));
    let req = claim_req(b);
    assert!(b.store.claim(&first, &req).await.unwrap().is_none());
    // Moves that do not apply write nothing.
    assert!(
        b.store
            .reschedule(&first, Reschedule::Pause)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        b.store
            .reschedule(&first, Reschedule::Due(t))
            .await
            .unwrap()
            .is_none()
    );
    // Resumed: due at the given time, claimable.
    let later = t.saturating_add(SignedDuration::from_mins(1)).unwrap();
    let hb = b
        .store
        .reschedule(&first, Reschedule::Resume(later))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (hb.status, hb.scheduled_at),
        (HeartbeatStatus::Pending, later)
    );
    b.advance(SignedDuration::from_mins(2));
    assert!(all_due(b).await.contains(&first));

    // A heartbeat that finishes while its agent is paused (and it marked so) files its
    // successor PAUSED.
    let claimed = b.store.claim(&first, &claim_req(b)).await.unwrap().unwrap();
    let mark = Reschedule::Running { pause_next: true };
    assert!(b.store.reschedule(&first, mark).await.unwrap().is_some());
    let mut done = claimed.clone();
    done.status = HeartbeatStatus::Completed;
    done.completed_at = Some(b.now());
    let next = pulse_shared::domain::Heartbeat::pending(
        &a,
        2,
        b.now(),
        claimed.window_end.clone().unwrap(),
        0,
        None,
        0,
    );
    let finish = Finish {
        heartbeat: done,
        next: Some(next),
        heartbeat_event: None,
    };
    assert_eq!(
        b.store.finish(&finish).await.unwrap(),
        FinishOutcome::Finished
    );
    let second = b
        .store
        .get_heartbeat(&HeartbeatId::new(a.id.clone(), 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.status, HeartbeatStatus::Paused);
    assert!(
        b.store.reschedule(&first, mark).await.unwrap().is_none(),
        "only a running heartbeat is marked"
    );
    assert!(!all_due(b).await.contains(&second.id()));

    // Once the agent is deleted, a late finish of its heartbeat is Gone.
    let resumed = marker(&a, b, "AGENT_RESUMED");
    assert!(
        b.store
            .set_paused(&a.id, None, &resumed, Writer::Outside)
            .await
            .unwrap()
    );
    b.store
        .reschedule(&second.id(), Reschedule::Resume(b.now()))
        .await
        .unwrap()
        .unwrap();
    let claimed = b
        .store
        .claim(&second.id(), &claim_req(b))
        .await
        .unwrap()
        .unwrap();
    b.store.purge_agent(&a.id, true).await.unwrap();
    let mut done = claimed.clone();
    done.status = HeartbeatStatus::Completed;
    done.completed_at = Some(b.now());
    let finish = Finish {
        heartbeat: done,
        next: Some(pulse_shared::domain::Heartbeat::pending(
            &a,
            3,
            b.now(),
            claimed.window_end.clone().unwrap(),
            0,
            None,
            0,
        )),
        heartbeat_event: None,
    };
    assert_eq!(b.store.finish(&finish).await.unwrap(), FinishOutcome::Gone);
    assert!(
        b.store
            .get_heartbeat(&HeartbeatId::new(a.id.clone(), 3))
            .await
            .unwrap()
            .is_none(),
        "no next heartbeat is left behind for a deleted agent"
    );
    assert!(
        b.store.get_agent(&other.id).await.unwrap().is_some(),
        "the other agent is untouched"
    );
}

fn claim_req(b: &Backend) -> pulse_shared::domain::ClaimRequest {
    pulse_shared::domain::ClaimRequest {
        now: b.now(),
        lease: SignedDuration::from_mins(10),
        window_end: pulse_shared::domain::EventCursor::through(
            b.now()
                .saturating_sub(SignedDuration::from_secs(2))
                .unwrap(),
        ),
    }
}

on_both_backends!(
    an_update_re_plans_the_pending_heartbeat_at_once,
    update_replans
);
async fn update_replans(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("1h", "51").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat runs at once");
    let ended = w.latest(&agent).await;
    let completed =
        w.b.store
            .get_heartbeat(&HeartbeatId::new(agent.id.clone(), 1))
            .await
            .unwrap()
            .unwrap()
            .completed_at
            .unwrap();
    assert_eq!(
        ended.scheduled_at,
        completed + SignedDuration::from_hours(1)
    );

    let changes = AgentChanges {
        interval: Some("5m".parse().unwrap()),
        ..AgentChanges::default()
    };
    let done = w.ops.update(&agent.id, &changes).await.unwrap();
    let due = completed + SignedDuration::from_mins(5);
    assert_eq!(done.replanned, Some(due));
    assert_eq!(w.latest(&agent).await.scheduled_at, due);
    w.b.advance(SignedDuration::from_mins(5));
    assert_eq!(
        w.beat().await,
        1,
        "due after the new interval, not the old one"
    );

    // Validated as on create, and nothing is written when refused.
    let bad = AgentChanges {
        name: Some("  ".into()),
        ..AgentChanges::default()
    };
    assert!(matches!(
        w.ops.update(&agent.id, &bad).await,
        Err(LifecycleError::Invalid(_))
    ));
    assert_eq!(
        w.b.store.get_agent(&agent.id).await.unwrap().unwrap().name,
        "scout"
    );
    // The channel binding stays unique.
    let second = w.agent("1h", "52").await;
    let steal = AgentChanges {
        discord_channel: Some(Some("51".into())),
        ..AgentChanges::default()
    };
    assert!(matches!(
        w.ops.update(&second.id, &steal).await,
        Err(LifecycleError::Store(StoreError::AlreadyExists(_)))
    ));
}

on_both_backends!(
    a_paused_agent_is_never_claimed_but_still_answers_and_resumes_at_once,
    pause_resume
);
async fn pause_resume(kind: Kind) {
    let w = world(kind).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "61").await;
    w.hook(&agent, "AGENT_PAUSED", &receiver.url()).await;
    w.hook(&agent, "AGENT_RESUMED", &receiver.url()).await;
    assert_eq!(w.beat().await, 1);

    assert!(matches!(
        w.ops.pause(&agent.id).await.unwrap(),
        Toggled::Done { running: false, .. }
    ));
    assert_eq!(w.ops.pause(&agent.id).await.unwrap(), Toggled::Already);
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Paused);
    let model_calls = w.llm.requests().len();
    for _ in 0..3 {
        w.b.advance(SignedDuration::from_mins(10));
        assert_eq!(
            w.beat().await,
            0,
            "a paused agent's heartbeat is never claimed"
        );
    }
    // Its user is still answered.
    w.b.say(&agent, "are you there?").await;
    w.b.drain(&w.worker).await;
    assert_eq!(
        w.llm.requests().len(),
        model_calls + 1,
        "one model call: the reply"
    );
    assert_eq!(w.discord.messages().len(), 1, "the reply reached Discord");
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Paused);

    let resumed = w.ops.resume(&agent.id).await.unwrap();
    assert_eq!(
        resumed,
        Toggled::Done {
            next_heartbeat_at: Some(w.b.now()),
            running: false
        }
    );
    assert_eq!(w.beat().await, 1, "resumed: a heartbeat at once");

    let types: Vec<String> =
        w.b.store
            .list_events(&agent.id, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type.to_string())
            .filter(|t| t.starts_with("AGENT_"))
            .collect();
    assert_eq!(types, ["AGENT_PAUSED", "AGENT_RESUMED"]);
    assert_eq!(w.dispatch().await, 2);
    assert_eq!(receiver.hook_types(), ["AGENT_PAUSED", "AGENT_RESUMED"]);
}

on_both_backends!(
    a_heartbeat_running_when_its_agent_is_paused_finishes_and_files_the_next_paused,
    pause_while_running
);
async fn pause_while_running(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("10m", "71").await;
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert_eq!(swept.claimed, 1);
    assert!(matches!(
        w.ops.pause(&agent.id).await.unwrap(),
        Toggled::Done { running: true, .. }
    ));
    w.b.drain(&w.worker).await;
    let first =
        w.b.store
            .get_heartbeat(&HeartbeatId::new(agent.id.clone(), 1))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(first.status, HeartbeatStatus::Completed, "it finished");
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Paused);
    w.b.advance(SignedDuration::from_mins(30));
    assert_eq!(w.beat().await, 0);
}

on_both_backends!(
    a_pause_and_resume_during_a_run_leave_the_next_pending_and_a_raced_one_is_parked,
    pause_races
);
async fn pause_races(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("10m", "72").await;
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert_eq!(swept.claimed, 1);
    // Paused and resumed while it ran: its finish files the next one PENDING.
    assert!(matches!(
        w.ops.pause(&agent.id).await.unwrap(),
        Toggled::Done { running: true, .. }
    ));
    w.b.advance(SignedDuration::from_secs(1));
    assert!(matches!(
        w.ops.resume(&agent.id).await.unwrap(),
        Toggled::Done { running: true, .. }
    ));
    w.b.drain(&w.worker).await;
    let next = w.latest(&agent).await;
    assert_eq!((next.beat, next.status), (2, HeartbeatStatus::Pending));

    // A next heartbeat left PENDING by a finish that raced a pause (the agent paused at
    // the store alone here) is parked when claimed, not run.
    w.b.advance(SignedDuration::from_secs(1));
    let paused = marker(&agent, &w.b, "AGENT_PAUSED");
    assert!(
        w.b.store
            .set_paused(&agent.id, Some(w.b.now()), &paused, Writer::Outside)
            .await
            .unwrap()
    );
    w.b.advance(SignedDuration::from_mins(10));
    let calls = w.llm.requests().len();
    assert_eq!(w.beat().await, 1, "claimed");
    let parked = w.latest(&agent).await;
    assert_eq!((parked.beat, parked.status), (2, HeartbeatStatus::Paused));
    assert_eq!(w.llm.requests().len(), calls, "and not run");
    w.b.advance(SignedDuration::from_mins(30));
    assert_eq!(w.beat().await, 0);
}

on_both_backends!(
    deleting_an_agent_leaves_nothing_of_it_and_its_queued_job_is_acked_once,
    delete
);
async fn delete(kind: Kind) {
    let w = world(kind).await;
    let b = &w.b;
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("echo", &tool.url(), "NOTE").await;
    let agent = w.agent("10m", "81").await;
    let keep = w.agent("10m", "82").await;
    // A subscription of its own, a webhook with a request, a hook with a delivery, a
    // turn, a memory, heartbeats, events and actions.
    let own = Subscription {
        id: SubscriptionId::for_route(
            &ToolName::parse("echo").unwrap(),
            &EventType::parse("TICK").unwrap(),
            Some(&agent.id),
        ),
        tool: ToolName::parse("echo").unwrap(),
        event_type: EventType::parse("TICK").unwrap(),
        agent_id: Some(agent.id.clone()),
        filter: Filter::default(),
        order: 0,
        active: true,
        created_at: b.now(),
    };
    b.store.add_subscription(&own).await.unwrap();
    let mut webhook =
        Webhook::new(agent.id.clone(), WebhookScheme::Standard, SECRET, b.now()).unwrap();
    webhook.rate_limit = Some(pulse_shared::domain::RateLimit { per_hour: 100 });
    b.store.create_webhook(&webhook).await.unwrap();
    let intake_ = WebhookIntake::new(
        b.store.clone(),
        b.queue.clone(),
        b.clock.clone(),
        SignedDuration::from_hours(24),
    );
    let post = |n: u32| {
        let body = json!({"event_type": "NOTE", "payload": {"n": n}}).to_string();
        let headers = crate::inbound::signed(
            webhook.scheme,
            SECRET,
            b.now().as_second(),
            &format!("msg_{n}"),
            body.as_bytes(),
        );
        (headers, body)
    };
    let (headers, body) = post(1);
    let verdict = intake_
        .receive(
            webhook.id.as_str(),
            headers.clone(),
            body.as_bytes().to_vec().into(),
            None,
        )
        .await;
    assert!(matches!(verdict, Verdict::Accepted(_)), "{verdict:?}");
    let hook = w.hook(&agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    b.advance(SignedDuration::from_secs(5));
    assert_eq!(w.beat().await, 2, "both agents' first heartbeats");
    assert!(w.dispatch().await >= 1);
    b.say(&agent, "hello").await;
    b.drain(&w.worker).await;
    b.store
        .remember(&[Memory::new(
            pulse_shared::domain::MemoryId::derived(1, &["tea"]),
            &agent.id,
            "likes tea",
            0,
            b.now(),
        )
        .unwrap()])
        .await
        .unwrap();
    // Its next heartbeat is claimed and its job queued, not yet run.
    b.advance(SignedDuration::from_mins(11));
    let swept = b.sweeper(settings()).sweep_once(b.now()).await;
    assert_eq!(swept.queued, 2);

    let ids = [agent.id.as_str(), webhook.id.as_str(), hook.id.as_str()];
    let footprint = w.ops.delete(&agent.id, false).await.unwrap();
    assert!(footprint.agent);
    assert_eq!(footprint.webhooks, 1);
    assert_eq!(footprint.hooks, 1);
    assert_eq!(footprint.subscriptions, 1);
    assert_eq!(footprint.memories, 1);
    assert_eq!(footprint.channel.as_deref(), Some("81"));
    assert!(footprint.heartbeats >= 2 && footprint.events >= 2 && footprint.actions >= 1);
    assert!(
        footprint.conversation >= 2
            && footprint.webhook_records >= 2
            && footprint.hook_deliveries >= 2,
        "{footprint:?}"
    );
    assert!(
        !b.stored_mentions(&ids).await.is_empty(),
        "a dry run deletes nothing"
    );

    let deleted = w.ops.delete(&agent.id, true).await.unwrap();
    assert_eq!(deleted, footprint);
    let left = b.stored_mentions(&ids).await;
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(matches!(
        w.ops.delete(&agent.id, true).await,
        Err(LifecycleError::NotFound(_))
    ));
    assert_eq!(b.store.agent_for_channel("81").await.unwrap(), None);

    // Its webhook answers 404 (once the receiver's two-second cache has passed).
    b.advance(SignedDuration::from_secs(3));
    let (headers, body) = post(2);
    let verdict = intake_
        .receive(
            webhook.id.as_str(),
            headers.clone(),
            body.as_bytes().to_vec().into(),
            None,
        )
        .await;
    assert!(
        matches!(verdict, Verdict::Refused(Refused::NotFound, _)),
        "{verdict:?}"
    );

    // Its queued job is acknowledged once and leaves nothing behind.
    assert_eq!(b.drain(&w.worker).await, 2);
    assert_eq!(b.queued_messages().await, 0);
    assert_eq!(b.drain(&w.worker).await, 0);
    let left = b.stored_mentions(&ids).await;
    assert!(left.is_empty(), "left behind by the job: {left:#?}");
    assert!(b.store.get_agent(&keep.id).await.unwrap().is_some());
    assert!(!b.stored_mentions(&[keep.id.as_str()]).await.is_empty());
}

on_both_backends!(
    registry_webhook_and_hook_records_are_changed_and_removed,
    removals
);
async fn removals(kind: Kind) {
    use pulse_shared::domain::Tool;
    let w = world(kind).await;
    let b = &w.b;
    let agent = w.agent("15m", "91").await;
    let name = ToolName::parse("echo").unwrap();
    let mut tool = Tool::http(
        name.clone(),
        "http://127.0.0.1:9/a",
        Duration::from_secs(5),
        b.now(),
    )
    .unwrap();
    b.store.add_tool(&tool).await.unwrap();
    tool.description = Some("changed".into());
    b.store.update_tool(&tool).await.unwrap();
    let registry = b.store.load_registry().await.unwrap();
    assert_eq!(registry.tools, vec![tool.clone()]);
    let sub = b.subscribe(&name, "NOTE", 0, Filter::default()).await;
    b.store.remove_subscription(&sub).await.unwrap();
    assert!(matches!(
        b.store.remove_subscription(&sub).await,
        Err(StoreError::NotFound(_))
    ));
    b.store.remove_tool(&name).await.unwrap();
    assert!(matches!(
        b.store.remove_tool(&name).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        b.store.update_tool(&tool).await,
        Err(StoreError::NotFound(_))
    ));
    let registry = b.store.load_registry().await.unwrap();
    assert!(registry.tools.is_empty() && registry.subscriptions.is_empty());

    let webhook = Webhook::new(agent.id.clone(), WebhookScheme::Standard, SECRET, b.now()).unwrap();
    b.store.create_webhook(&webhook).await.unwrap();
    b.store
        .log_request(&pulse_shared::domain::WebhookRequest::arrived(
            &webhook,
            b.now(),
            b"{}",
            None,
        ))
        .await
        .unwrap();
    b.store.delete_webhook(&webhook.id).await.unwrap();
    assert!(b.store.get_webhook(&webhook.id).await.unwrap().is_none());
    assert!(b.store.list_webhooks().await.unwrap().is_empty());
    assert!(
        b.store
            .list_requests(&webhook.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        b.store.delete_webhook(&webhook.id).await,
        Err(StoreError::NotFound(_))
    ));

    let receiver = FakeReceiver::start().await;
    let hook = w.hook(&agent, "AFTER_HEARTBEAT", &receiver.url()).await;
    assert_eq!(w.beat().await, 1);
    assert_eq!(w.dispatch().await, 1);
    assert_eq!(
        b.store.list_deliveries(&hook.id, 10).await.unwrap().len(),
        1
    );
    b.store.delete_hook(&hook.id).await.unwrap();
    assert!(b.store.get_hook(&hook.id).await.unwrap().is_none());
    assert!(b.store.hook_routes(&agent.id).await.unwrap().is_empty());
    assert!(
        b.store
            .list_deliveries(&hook.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        b.store.delete_hook(&hook.id).await,
        Err(StoreError::NotFound(_))
    ));
    let left = b
        .stored_mentions(&[webhook.id.as_str(), hook.id.as_str()])
        .await;
    assert!(left.is_empty(), "{left:#?}");

    // Heartbeats page back by beat; an action is found by id, for its agent only.
    b.advance(SignedDuration::from_mins(16));
    assert_eq!(w.beat().await, 1);
    let id = &agent.id;
    let page = |before| async move {
        b.store
            .heartbeats_page(id, before, 10)
            .await
            .unwrap()
            .iter()
            .map(|h| h.beat)
            .collect::<Vec<u64>>()
    };
    assert_eq!(page(None).await, [3, 2, 1]);
    assert_eq!(page(Some(3)).await, [2, 1]);
    assert!(page(Some(1)).await.is_empty());
    let actions = b.store.list_actions(&agent.id, 10).await.unwrap();
    assert!(!actions.is_empty());
    for a in &actions {
        assert_eq!(
            b.store.get_action(&agent.id, &a.id).await.unwrap().as_ref(),
            Some(a)
        );
    }
    let stranger = w.agent("15m", "92").await;
    assert!(
        b.store
            .get_action(&stranger.id, &actions[0].id)
            .await
            .unwrap()
            .is_none()
    );
}

on_both_backends!(
    a_resume_or_pause_that_failed_between_its_writes_is_completed_by_the_next,
    interrupted_toggles
);
/// Found by `pulse simulate --agents 200 --duration 6h --seed 7 --faults heavy`: a resume
/// whose heartbeat move failed left the agent active with its heartbeat parked, and a
/// second resume answered "already" without moving it: the agent never beat again.
async fn interrupted_toggles(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent("10m", "81").await;
    let faulty = Arc::new(pulse_tests::faults::faulty(w.b.store.clone()));
    let store: Arc<dyn Store> = faulty.clone();
    let ops = Lifecycle::new(store, w.b.clock.clone(), settings(), None);

    // The pause's state is written; moving its pending heartbeat out of the due index fails.
    faulty.policy().fail_times("reschedule", 1);
    assert!(ops.pause(&agent.id).await.is_err());
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Pending);
    // Pausing again reports the agent as already paused, and parks the heartbeat.
    assert_eq!(ops.pause(&agent.id).await.unwrap(), Toggled::Already);
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Paused);
    assert_eq!(w.beat().await, 0, "parked: never claimed");

    // The same for a resume: state written, the heartbeat's move failed.
    faulty.policy().fail_times("reschedule", 1);
    assert!(ops.resume(&agent.id).await.is_err());
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Paused);
    assert_eq!(ops.resume(&agent.id).await.unwrap(), Toggled::Already);
    assert_eq!(w.latest(&agent).await.status, HeartbeatStatus::Pending);
    assert_eq!(w.beat().await, 1, "filed again: it beats");
    assert_eq!(faulty.policy().failed("reschedule"), 2);
}

/// The store faults the tests inject (`pulse_tests::faults`) fail the named call, for as
/// many calls as they are told or until healed, and count what they failed.
#[test]
fn a_fault_fails_the_named_call_for_as_long_as_it_is_told() {
    let f = pulse_tests::faults::Faults::default();
    assert!(f.check("claim").is_ok());
    f.fail_times("claim", 2);
    assert!(f.check("start_action").is_ok(), "only the named call fails");
    let err = f.check("claim").unwrap_err();
    assert!(err.to_string().contains("claim"), "{err}");
    assert!(f.check("claim").is_err());
    assert!(f.check("claim").is_ok(), "two calls, then it recovers");
    assert_eq!(f.failed("claim"), 2);

    f.fail("finish");
    for _ in 0..5 {
        assert!(f.check("finish").is_err());
    }
    f.heal("finish");
    assert!(f.check("finish").is_ok());
    assert_eq!(f.failed("finish"), 5);
}

on_both_backends!(
    a_heartbeat_that_does_not_do_what_is_expected_is_incomplete_and_a_streak_is_told_once,
    expectations
);
/// An agent that must speak every heartbeat: each that does not ends `incomplete` with
/// why; the second in a row (`--alert-after 2`) fires HEARTBEAT_INCOMPLETE, the third
/// fires nothing more; one that speaks ends the streak, and the next streak is told again.
async fn expectations(kind: Kind) {
    use pulse_shared::domain::{AgentChanges, Must, OutcomeKind};
    use pulse_tests::fake_llm::Scripted;
    let w = world(kind).await;
    let receiver = FakeReceiver::start().await;
    let agent = w.agent("10m", "81").await;
    let agent = w
        .ops
        .update(
            &agent.id,
            &AgentChanges {
                expect: Some(Some(Must::Speak)),
                alert_after: Some(2),
                ..AgentChanges::default()
            },
        )
        .await
        .unwrap()
        .agent;
    w.hook(&agent, "HEARTBEAT_INCOMPLETE", &receiver.url())
        .await;
    let next = || {
        w.b.advance(SignedDuration::from_mins(10) + SignedDuration::from_secs(5))
    };
    let mut kinds = Vec::new();
    for beat in 0..6 {
        if beat == 3 {
            w.llm.script([
                Scripted::tool("speak", json!({"thought": "Time for a stretch."})),
                Scripted::text("Said it."),
            ]);
        } else {
            w.llm.script([Scripted::text("Nothing worth saying.")]);
        }
        assert_eq!(w.beat().await, 1);
        let done = w.finished(&agent).await;
        kinds.push(done.outcome.clone().unwrap());
        next();
    }
    let got: Vec<OutcomeKind> = kinds.iter().map(|o| o.kind).collect();
    use OutcomeKind::{Acted, Incomplete};
    assert_eq!(
        got,
        [
            Incomplete, Incomplete, Incomplete, Acted, Incomplete, Incomplete
        ],
        "{kinds:?}"
    );
    assert_eq!(
        kinds[0].reason,
        "expected to speak, it did not (nothing_to_do: Nothing worth saying.)"
    );
    w.dispatch().await;
    assert_eq!(
        receiver.hook_types(),
        ["HEARTBEAT_INCOMPLETE", "HEARTBEAT_INCOMPLETE"],
        "once for each streak of two"
    );
    let told = receiver.received()[0].json();
    assert_eq!(told["data"]["expect"], "speak");
    assert_eq!(told["data"]["in_a_row"], 2);
}

on_both_backends!(
    a_schedule_holds_the_heartbeats_it_wakes_to_what_it_expects_and_counts_its_own_runs,
    schedule_expectations
);
/// An agent that expects nothing of its beats, with an hourly schedule whose heartbeats
/// must speak (`--alert-after 2`): the ordinary beats between its wakes stay
/// `nothing_to_do`; each of its runs that does not speak ends `incomplete`, naming the
/// schedule; the second in a row fires HEARTBEAT_INCOMPLETE with the schedule's id, the
/// third nothing more; and a run that speaks sets the schedule's count back to 0.
async fn schedule_expectations(kind: Kind) {
    use pulse_shared::domain::{Expectation, Must, OutcomeKind, ScheduleRule, TimeZoneName};
    use pulse_tests::fake_llm::Scripted;
    let w = world(kind).await;
    let receiver = FakeReceiver::start().await;
    // Every 20 minutes from 09:00: two ordinary beats between the hourly wakes.
    let agent = w.agent("20m", "81").await;
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    w.hook(&agent, "HEARTBEAT_INCOMPLETE", &receiver.url())
        .await;
    let hourly = ScheduleRule::cron("0 * * * *", TimeZoneName::utc()).unwrap();
    let speak = Expectation {
        must: Must::Speak,
        alert_after: 2,
    };
    let schedule = w
        .ops
        .schedule_expecting(&agent.id, hourly, Some("report".into()), Some(speak))
        .await
        .unwrap()
        .schedule;
    assert_eq!(schedule.expect, Some(speak));
    let (mut beats, mut runs, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..20 {
        if runs.len() == 4 {
            break;
        }
        let due = w.latest(&agent).await.scheduled_at;
        w.b.advance(due.duration_since(w.b.now()));
        let wake = due.as_second() % 3600 == 0;
        if wake && runs.len() == 3 {
            w.llm.script([
                Scripted::tool("speak", json!({"thought": "The hourly report."})),
                Scripted::text("Reported."),
            ]);
        } else {
            w.llm.script([Scripted::text("Nothing worth saying.")]);
        }
        assert_eq!(w.beat().await, 1);
        let done = w.finished(&agent).await;
        if wake {
            counts.push(w.ops.schedules(&agent.id).await.unwrap()[0].incomplete_runs);
            runs.push(done);
        } else {
            beats.push(done.outcome.unwrap().kind);
        }
    }
    assert_eq!(beats, [OutcomeKind::NothingToDo; 8], "beats between wakes");
    let kinds: Vec<OutcomeKind> = runs
        .iter()
        .map(|h| h.outcome.as_ref().unwrap().kind)
        .collect();
    use OutcomeKind::{Acted, Incomplete};
    assert_eq!(kinds, [Incomplete, Incomplete, Incomplete, Acted]);
    assert_eq!(
        runs[0].outcome.as_ref().unwrap().reason,
        format!(
            "schedule {} expected it to speak, it did not (nothing_to_do: Nothing worth saying.)",
            schedule.id
        )
    );
    assert_eq!(counts, [1, 2, 3, 0], "the schedule counts its own runs");
    let woke: Vec<serde_json::Value> =
        w.b.store
            .list_events(&agent.id, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.event_type.as_str() == "SCHEDULED")
            .map(|e| e.payload)
            .collect();
    assert_eq!(woke.len(), 4);
    assert!(woke.iter().all(|p| p["expect"] == "speak"), "{woke:?}");
    w.dispatch().await;
    assert_eq!(
        receiver.hook_types(),
        ["HEARTBEAT_INCOMPLETE"],
        "once, on the second run in a row"
    );
    let told = receiver.received()[0].json();
    assert_eq!(told["data"]["schedule_id"], schedule.id.as_str());
    assert_eq!(told["data"]["beat"], runs[1].beat);
    assert_eq!(told["data"]["in_a_row"], 2);
    assert_eq!(told["data"]["expect"], "speak");
    assert_eq!(told["data"]["note"], "report");
}
