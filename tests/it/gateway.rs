//! The Discord gateway end to end: a fake v10 gateway (a WebSocket server on loopback)
//! sends what people write; the gateway queues it; the worker answers through the fake
//! Discord API with the fake model — all real connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_gateway::{DISCORD_REACTION, Gateway, GatewayError, GatewaySettings};
use pulse_shared::discord::{DiscordClient, DiscordConfig};
use pulse_shared::domain::{Agent, DiscordListen, NewAgent, Secret, Seen, ThinkPolicy};
use pulse_shared::engine::Worker;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_gateway::{BOT_ID, FakeGateway, message, snowflake};
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::faults::FaultyStore;
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The user the agents let in.
const FRIEND: &str = "2000000000000000001";
/// Someone no agent lets in.
const STRANGER: &str = "2000000000000000666";
/// The direct-message channel with the friend.
const DM: &str = "4000000000000000001";
/// A guild channel bound to the agent, and its guild.
const ROOM: &str = "3000000000000000001";
const GUILD: &str = "5000000000000000001";

struct World {
    b: Backend,
    llm: FakeLlm,
    discord: FakeDiscord,
    fake: FakeGateway,
    worker: Worker,
    gateway: Arc<Gateway>,
    stop: watch::Sender<bool>,
    running: Option<tokio::task::JoinHandle<Result<(), GatewayError>>>,
}

async fn world(kind: Kind) -> World {
    world_with_faults(kind).await.0
}

/// A world whose gateway reaches the store through faults the test can inject.
async fn world_with_faults(kind: Kind) -> (World, Arc<FaultyStore>) {
    let b = Backend::new(kind).await;
    let faulty = Arc::new(pulse_tests::faults::faulty(b.store.clone()));
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let fake = FakeGateway::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    let worker = b
        .connected()
        .worker(b.clock.clone(), &settings(), &services);
    let client = DiscordClient::new(DiscordConfig {
        api_base: discord.api_base().parse().unwrap(),
        bot_token: Some(Secret::new("bot-token")),
        ..DiscordConfig::unconfigured()
    });
    let gateway = Arc::new(Gateway::new(
        faulty.clone(),
        b.queue.clone(),
        b.clock.clone(),
        client,
        gateway_settings(&fake),
    ));
    let (stop, _) = watch::channel(false);
    let w = World {
        b,
        llm,
        discord,
        fake,
        worker,
        gateway,
        stop,
        running: None,
    };
    (w, faulty)
}

/// The gateway's settings in these tests: a short lease, so a standby takes over fast.
fn gateway_settings(fake: &FakeGateway) -> GatewaySettings {
    GatewaySettings {
        token: Secret::new("bot-token"),
        url: Some(fake.url()),
        default_agent: None,
        lease: Duration::from_millis(600),
    }
}

/// Polls `done` for up to 20 s (the gateway works over real sockets).
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl World {
    async fn agent(&self, f: impl FnOnce(&mut NewAgent)) -> Agent {
        let mut new = NewAgent::named("scout");
        new.interval = "10m".parse().unwrap();
        new.think = ThinkPolicy::Always;
        new.discord.users = vec![FRIEND.into()];
        f(&mut new);
        let (agent, first) = new.create(self.b.now()).unwrap();
        self.b.store.create_agent(&agent, &first).await.unwrap();
        agent
    }

    /// Starts the gateway and waits until it is identified.
    async fn connect(&mut self) {
        let (g, stop) = (self.gateway.clone(), self.stop.subscribe());
        self.running = Some(tokio::spawn(async move { g.run(stop).await }));
        let fake = self.fake.clone();
        until("the gateway is live", async || fake.is_live()).await;
    }

    /// Runs the worker until `n` messages were posted to Discord in all.
    async fn answered(&self, n: usize) {
        let (b, worker, discord) = (&self.b, &self.worker, &self.discord);
        until(&format!("{n} messages are posted"), async || {
            b.drain(worker).await;
            discord.messages().len() >= n
        })
        .await;
    }

    /// Waits until the gateway has dealt with `n` messages in all (any outcome).
    async fn handled(&self, n: u64) {
        let g = self.gateway.clone();
        until(&format!("{n} messages are handled"), async || {
            let s = g.status();
            s.accepted + s.strangers + s.ignored + s.rate_limited >= n
        })
        .await;
    }

    /// A second process's gateway for the same bot, on the same store and queue.
    fn another_gateway(&self) -> Arc<Gateway> {
        Arc::new(Gateway::new(
            self.b.store.clone(),
            self.b.queue.clone(),
            self.b.clock.clone(),
            DiscordClient::new(DiscordConfig {
                api_base: self.discord.api_base().parse().unwrap(),
                bot_token: Some(Secret::new("bot-token")),
                ..DiscordConfig::unconfigured()
            }),
            gateway_settings(&self.fake),
        ))
    }

    fn posts(&self) -> Vec<Value> {
        self.discord
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/messages") && r.method == "POST")
            .map(|r| json!({"path": r.path, "body": r.body}))
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(r) = self.running.take() {
            r.await.unwrap().unwrap();
        }
    }
}

on_both_backends!(
    a_friend_s_direct_message_is_answered_once_as_a_reply_and_strangers_and_bots_get_nothing,
    a_friend_s_direct_message_is_answered_once_as_a_reply_and_strangers_and_bots_get_nothing
);
async fn a_friend_s_direct_message_is_answered_once_as_a_reply_and_strangers_and_bots_get_nothing(
    kind: Kind,
) {
    let mut w = world(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;

    let first = snowflake(1);
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&first, DM, None, FRIEND, "hello there"),
    );
    w.answered(1).await;

    // One reply, in the DM, as a reply to the message, after "typing…" there.
    let requests = w.discord.requests();
    let typing = requests
        .iter()
        .position(|r| r.path == format!("/api/v10/channels/{DM}/typing"))
        .expect("typing was shown");
    let posted = requests
        .iter()
        .position(|r| r.path == format!("/api/v10/channels/{DM}/messages"))
        .expect("the reply was posted");
    assert!(typing < posted, "typing comes before the reply");
    assert_eq!(
        requests[posted].body["message_reference"]["message_id"],
        first.as_str()
    );
    let asked = w.llm.requests();
    assert_eq!(asked.len(), 1);
    let said = asked[0].body["messages"].to_string();
    assert!(said.contains("hello there"), "{said}");

    // A stranger's DM, a bot's DM and the agent's own message: no answer, no model call.
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(2), DM, None, STRANGER, "let me in"),
    );
    let mut bot = message(&snowflake(3), DM, None, "2000000000000000777", "beep");
    bot["author"]["bot"] = json!(true);
    w.fake.dispatch("MESSAGE_CREATE", bot);
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(4), DM, None, BOT_ID, "ok"),
    );
    w.handled(4).await;
    w.b.drain(&w.worker).await;
    assert_eq!(w.discord.messages().len(), 1, "{:?}", w.posts());
    assert_eq!(w.llm.requests().len(), 1);
    let s = w.gateway.status();
    assert_eq!((s.accepted, s.strangers, s.ignored), (1, 1, 2), "{s:?}");
    assert_eq!(s.state, "connected");
    w.stop().await;
}

on_both_backends!(
    in_a_channel_the_agent_answers_when_mentioned_or_always_when_it_listens_to_all,
    in_a_channel_the_agent_answers_when_mentioned_or_always_when_it_listens_to_all
);
async fn in_a_channel_the_agent_answers_when_mentioned_or_always_when_it_listens_to_all(
    kind: Kind,
) {
    let mut w = world(kind).await;
    let agent = w
        .agent(|a| {
            a.discord_channel = Some(ROOM.into());
            a.discord.users.clear();
        })
        .await;
    w.connect().await;

    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(
            &snowflake(1),
            ROOM,
            Some(GUILD),
            FRIEND,
            "talking among ourselves",
        ),
    );
    w.handled(1).await;
    let mut mention = message(
        &snowflake(2),
        ROOM,
        Some(GUILD),
        FRIEND,
        &format!("<@{BOT_ID}> what do you think?"),
    );
    mention["mentions"] =
        json!([{"id": BOT_ID, "username": "pulse", "discriminator": "0", "public_flags": 0}]);
    w.fake.dispatch("MESSAGE_CREATE", mention);
    w.answered(1).await;
    let messages = &w.llm.requests()[0].body["messages"];
    let said = messages.to_string();
    assert!(!said.contains("talking among ourselves"));
    let user = messages
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .to_string();
    assert!(user.contains("what do you think?"), "{user}");
    assert!(
        !user.contains(&format!("<@{BOT_ID}>")),
        "the mention is taken out of the words: {user}"
    );
    assert_eq!(
        w.posts()[0]["path"],
        format!("/api/v10/channels/{ROOM}/messages")
    );

    // With `--discord-listen all`, every message.
    let mut changed = agent.clone();
    changed.discord.listen = DiscordListen::All;
    w.b.store.update_agent(&changed, &agent).await.unwrap();
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(3), ROOM, Some(GUILD), FRIEND, "and now?"),
    );
    w.answered(2).await;
    assert_eq!(w.gateway.status().ignored, 1);
    w.stop().await;
}

on_both_backends!(
    a_voice_note_reaches_the_model_as_its_envelope_and_a_picture_as_an_image,
    a_voice_note_reaches_the_model_as_its_envelope_and_a_picture_as_an_image
);
async fn a_voice_note_reaches_the_model_as_its_envelope_and_a_picture_as_an_image(kind: Kind) {
    let mut w = world(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;

    let mut voice = message(&snowflake(1), DM, None, FRIEND, "");
    voice["flags"] = json!(8192);
    voice["attachments"] = json!([{
        "id": "6000000000000000001", "filename": "voice-message.ogg", "content_type": "audio/ogg",
        "size": 18_000, "url": "https://cdn.discordapp.com/attachments/1/2/voice-message.ogg",
        "proxy_url": "https://media.discordapp.net/attachments/1/2/voice-message.ogg",
        "duration_secs": 3.2, "waveform": "AAAAAAAA"
    }]);
    w.fake.dispatch("MESSAGE_CREATE", voice);
    w.answered(1).await;
    let said = w.llm.requests()[0].body["messages"].to_string();
    assert!(
        said.contains("(no text; 1 attachment: voice-message.ogg (audio/ogg, 3.2 s))"),
        "{said}"
    );
    assert!(
        said.contains("waveform"),
        "the envelope reaches the model: {said}"
    );
    assert!(
        said.contains("IS_VOICE_MESSAGE"),
        "its flags, named: {said}"
    );

    let mut picture = message(&snowflake(2), DM, None, FRIEND, "what is this?");
    picture["attachments"] = json!([{
        "id": "6000000000000000002", "filename": "dog.jpg", "content_type": "image/jpeg",
        "size": 1000, "url": "https://example.com/dog.jpg", "proxy_url": "https://example.com/dog.jpg",
        "width": 64, "height": 48
    }]);
    w.fake.dispatch("MESSAGE_CREATE", picture);
    w.answered(2).await;
    let body = &w.llm.requests()[1].body;
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    let parts = user["content"].as_array().expect("parts, not a string");
    assert!(
        parts
            .iter()
            .any(|p| p["image_url"]["url"] == "https://example.com/dog.jpg"),
        "{parts:?}"
    );
    w.stop().await;
}

on_both_backends!(
    a_dropped_connection_is_resumed_and_a_replayed_message_answered_once,
    a_dropped_connection_is_resumed_and_a_replayed_message_answered_once
);
async fn a_dropped_connection_is_resumed_and_a_replayed_message_answered_once(kind: Kind) {
    let mut w = world(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;

    let a = snowflake(1);
    w.fake
        .dispatch("MESSAGE_CREATE", message(&a, DM, None, FRIEND, "first"));
    w.answered(1).await;

    // The connection drops; a message arrives meanwhile; the resume replays it, and the
    // one already answered as well.
    w.fake.replay_from_before(1);
    w.fake.drop_connection();
    let b = snowflake(2);
    w.fake
        .dispatch("MESSAGE_CREATE", message(&b, DM, None, FRIEND, "second"));
    let fake = w.fake.clone();
    until("the session is resumed", async || {
        !fake.resumes().is_empty() && fake.is_live()
    })
    .await;
    w.answered(2).await;
    w.handled(3).await;
    w.b.drain(&w.worker).await;

    let replies: Vec<Value> = w
        .posts()
        .iter()
        .map(|p| p["body"]["message_reference"]["message_id"].clone())
        .collect();
    assert_eq!(replies, [json!(a), json!(b)], "each message answered once");
    assert_eq!(w.fake.identifies(), 1, "resumed, not identified again");
    assert_eq!(w.llm.requests().len(), 2);

    // RECONNECT (op 7): the gateway resumes again.
    w.fake.reconnect();
    until("the session is resumed again", async || {
        fake.resumes().len() == 2
    })
    .await;
    w.stop().await;
}

on_both_backends!(
    a_reaction_to_the_agent_s_message_is_an_event_in_its_next_heartbeat,
    a_reaction_to_the_agent_s_message_is_an_event_in_its_next_heartbeat
);
async fn a_reaction_to_the_agent_s_message_is_an_event_in_its_next_heartbeat(kind: Kind) {
    let mut w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.connect().await;
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "remind me of the dentist"),
    );
    w.answered(1).await;
    let theirs = snowflake(2);
    // Reactions to someone else's message say nothing to the agent.
    w.fake.dispatch(
        "MESSAGE_REACTION_ADD",
        json!({"user_id": FRIEND, "channel_id": DM, "message_id": theirs,
               "message_author_id": FRIEND, "emoji": {"id": null, "name": "👀"}}),
    );
    let reply_id = "1001"; // the fake API's first message id
    let reaction = json!({"user_id": FRIEND, "channel_id": DM, "message_id": reply_id,
                          "message_author_id": BOT_ID, "emoji": {"id": null, "name": "👍"}});
    w.fake.dispatch("MESSAGE_REACTION_ADD", reaction);
    let g = w.gateway.clone();
    until("the reaction is recorded", async || {
        g.status().reactions >= 1
    })
    .await;
    // Replayed by a resume a moment later: still one event.
    w.b.advance(jiff::SignedDuration::from_secs(5));
    w.fake.replay_from_before(1);
    w.fake.drop_connection();
    let fake = w.fake.clone();
    until("the session is resumed", async || {
        !fake.resumes().is_empty() && fake.is_live()
    })
    .await;
    // Read in order: once this message is answered, the replay was read.
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(3), DM, None, FRIEND, "thanks"),
    );
    w.answered(2).await;
    assert_eq!(g.status().reactions, 1, "the replay is not recorded again");

    let events =
        w.b.store
            .events_page(&agent.id, None, None, 50)
            .await
            .unwrap();
    let reactions: Vec<_> = events
        .iter()
        .filter(|e| e.event_type.as_str() == DISCORD_REACTION)
        .collect();
    assert_eq!(reactions.len(), 1, "{events:?}");
    assert_eq!(reactions[0].payload["emoji"], "👍");
    assert_eq!(reactions[0].payload["message_id"], reply_id);

    // The next heartbeat reads it.
    w.b.advance(jiff::SignedDuration::from_secs(3600));
    let before = w.llm.requests().len();
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    w.b.drain(&w.worker).await;
    let heartbeat = w.llm.requests()[before..]
        .iter()
        .map(|r| r.body["messages"].to_string())
        .collect::<String>();
    assert!(heartbeat.contains(DISCORD_REACTION), "{heartbeat}");
    w.stop().await;
}

/// How the reply that wrote Discord message `id` was seen, if it was.
async fn seen_of(b: &Backend, agent: &Agent, id: &str) -> Option<Seen> {
    let turns = b.store.list_turns(&agent.id, 50).await.unwrap();
    turns
        .into_iter()
        .find(|t| t.discord_message_ids.iter().any(|m| m == id))
        .expect("a turn wrote the message")
        .seen
}

on_both_backends!(
    a_reaction_or_a_reply_to_the_agent_s_message_marks_its_reply_seen,
    a_reaction_or_a_reply_to_the_agent_s_message_marks_its_reply_seen
);
/// A reaction to the agent's message marks the reply that wrote it seen, by that
/// reaction; a second reaction keeps the first mark; a Discord reply to another of its
/// messages marks that reply seen, by the reply; a reaction to a message no turn wrote
/// marks nothing.
async fn a_reaction_or_a_reply_to_the_agent_s_message_marks_its_reply_seen(kind: Kind) {
    let mut w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.connect().await;
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "book the dentist"),
    );
    w.answered(1).await;
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(2), DM, None, FRIEND, "and the car service"),
    );
    w.answered(2).await;
    // The fake API's message ids, in order.
    let (booked, serviced) = ("1001", "1002");
    assert_eq!(seen_of(&w.b, &agent, booked).await, None);

    let reacted_at = w.b.now();
    let reaction = |message_id: &str, emoji: &str| {
        json!({"user_id": FRIEND, "channel_id": DM, "message_id": message_id,
               "message_author_id": BOT_ID, "emoji": {"id": null, "name": emoji}})
    };
    w.fake
        .dispatch("MESSAGE_REACTION_ADD", reaction(booked, "👍"));
    let b = &w.b;
    until("the reaction marks the reply seen", async || {
        seen_of(b, &agent, booked).await.is_some()
    })
    .await;
    let first = Seen {
        at: reacted_at,
        by: "reaction 👍".to_owned(),
    };
    assert_eq!(seen_of(&w.b, &agent, booked).await, Some(first.clone()));
    assert_eq!(
        seen_of(&w.b, &agent, serviced).await,
        None,
        "only that reply"
    );

    // Another reaction a minute later: the first mark is kept.
    w.b.advance(jiff::SignedDuration::from_secs(60));
    w.fake
        .dispatch("MESSAGE_REACTION_ADD", reaction(booked, "🎉"));
    // A Discord reply to the other message marks that one, by the reply. (Read in
    // order: once it is marked, the second reaction was read.)
    let mut reply = message(&snowflake(3), DM, None, FRIEND, "done, thanks");
    reply["type"] = json!(19);
    reply["message_reference"] = json!({"type": 0, "message_id": serviced, "channel_id": DM});
    reply["referenced_message"] = message(serviced, DM, None, BOT_ID, "Noted.");
    w.fake.dispatch("MESSAGE_CREATE", reply);
    let b = &w.b;
    until("the reply marks the other reply seen", async || {
        seen_of(b, &agent, serviced).await.is_some()
    })
    .await;
    let by_reply = seen_of(&w.b, &agent, serviced).await.unwrap();
    assert_eq!((by_reply.by.as_str(), by_reply.at), ("reply", w.b.now()));
    assert_eq!(
        seen_of(&w.b, &agent, booked).await,
        Some(first),
        "the first reaction's mark is kept"
    );

    // A reaction to a message no turn wrote marks nothing. (Read in order: once the
    // next message is handled, the reaction was.)
    w.fake
        .dispatch("MESSAGE_REACTION_ADD", reaction("999", "👀"));
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(4), DM, None, FRIEND, "one more thing"),
    );
    w.handled(4).await;
    let turns = w.b.store.list_turns(&agent.id, 50).await.unwrap();
    let marked: Vec<_> = turns
        .iter()
        .filter(|t| t.seen.is_some())
        .flat_map(|t| t.discord_message_ids.clone())
        .collect();
    assert_eq!(marked.len(), 2, "{marked:?}");
    assert!(
        marked.iter().all(|m| m == booked || m == serviced),
        "{marked:?}"
    );
    assert_eq!(
        w.gateway.status().reactions,
        3,
        "each reaction is still an event"
    );
    w.stop().await;
}

on_both_backends!(
    a_refused_token_stops_the_gateway_with_what_to_do,
    a_refused_token_stops_the_gateway_with_what_to_do
);
async fn a_refused_token_stops_the_gateway_with_what_to_do(kind: Kind) {
    let w = world(kind).await;
    w.fake.refuse_with(4004);
    let (_tx, stop) = watch::channel(false);
    let outcome = tokio::time::timeout(Duration::from_secs(20), w.gateway.run(stop))
        .await
        .expect("the gateway gives up at once");
    let err = outcome.unwrap_err();
    assert!(matches!(err, GatewayError::TokenRefused), "{err}");
    let s = w.gateway.status();
    assert_eq!(s.state, "failed");
    assert!(
        s.last_error.unwrap().contains("DISCORD_BOT_TOKEN"),
        "the status says what to do"
    );
    // `pulse status` reads it from the lease, given up with the failure.
    let mut status = pulse_shared::engine::Status::default();
    let lease = pulse_shared::discord::lease_name(&Secret::new("bot-token"));
    pulse_shared::engine::gateway_status(w.b.store.as_ref(), &lease, w.b.now(), &mut status)
        .await
        .unwrap();
    assert_eq!(status.findings.len(), 1, "{:?}", status.findings);
    assert!(status.findings[0].what.contains("DISCORD_BOT_TOKEN"));
}

on_both_backends!(
    two_gateways_with_one_token_one_answers_and_the_other_takes_over_by_resuming,
    two_gateways
);
async fn two_gateways(kind: Kind) {
    let (mut w, _) = world_with_faults(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;
    let second = w.another_gateway();
    let (stop_second, stop) = watch::channel(false);
    let running = {
        let g = second.clone();
        tokio::spawn(async move { g.run(stop).await })
    };
    until("the second stands by", async || {
        second.status().state == "standby"
    })
    .await;

    // One connection, one answer, whoever reads.
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "who is there?"),
    );
    w.answered(1).await;
    assert_eq!(w.fake.connections(), 1);

    // The first stops (SIGTERM): the second takes over by resuming the session.
    let _ = w.stop.send(true);
    w.running.take().unwrap().await.unwrap().unwrap();
    let fake = w.fake.clone();
    until("the second resumes", async || {
        fake.resumes().len() == 1 && fake.is_live()
    })
    .await;
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(2), DM, None, FRIEND, "still there?"),
    );
    w.answered(2).await;
    assert_eq!(w.fake.identifies(), 1, "resumed, not identified again");
    assert_eq!(second.status().accepted, 1);
    // It knows who it is with no READY of its own: its own message is not answered.
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(3), DM, None, BOT_ID, "ok"),
    );
    let g = second.clone();
    until("the bot's own message is ignored", async || {
        g.status().ignored == 1
    })
    .await;
    assert_eq!(w.posts().len(), 2);

    // The second dies without a word: a third takes over once its lease runs out.
    running.abort();
    let _ = running.await;
    drop(stop_second);
    let third = w.another_gateway();
    let (_stop_third, stop) = watch::channel(false);
    let g = third.clone();
    let running = tokio::spawn(async move { g.run(stop).await });
    until("the third stands by", async || {
        third.status().state == "standby"
    })
    .await;
    w.b.advance(jiff::SignedDuration::from_secs(1));
    until("the third resumes", async || {
        fake.resumes().len() == 2 && fake.is_live()
    })
    .await;
    assert_eq!(w.fake.identifies(), 1);
    running.abort();
}

on_both_backends!(
    a_message_is_kept_while_the_store_is_down_and_answered_once_it_is_back,
    a_message_is_kept_while_the_store_is_down_and_answered_once_it_is_back
);
async fn a_message_is_kept_while_the_store_is_down_and_answered_once_it_is_back(kind: Kind) {
    let (mut w, faults) = world_with_faults(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;
    // Who the message is for cannot be read, then it cannot be queued.
    faults.policy().fail_times("list_agents", 2);
    faults.policy().fail_times("record_interaction", 2);
    let m = snowflake(1);
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&m, DM, None, FRIEND, "are you up?"),
    );
    w.answered(1).await;
    assert_eq!(faults.policy().failed("list_agents"), 2);
    assert_eq!(faults.policy().failed("record_interaction"), 2);
    assert_eq!(w.posts().len(), 1);
    assert_eq!(w.gateway.status().accepted, 1);
    w.stop().await;
}

/// A past defect: a message whose agent was deleted between the gateway finding it and
/// queueing its signal was kept and tried again for good (every try answered "not
/// found"), and the gateway read nothing else meanwhile.
async fn message_to_a_deleted_agent(kind: Kind) {
    let (mut w, faults) = world_with_faults(kind).await;
    let agent = w.agent(|_| {}).await;
    w.connect().await;
    // Three failed tries: 200 + 400 + 800 ms for the agent to be deleted meanwhile.
    faults.policy().fail_times("record_interaction", 3);
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "still there?"),
    );
    let f = faults.clone();
    until("the first try failed", async || {
        f.policy().failed("record_interaction") >= 1
    })
    .await;
    w.b.store.purge_agent(&agent.id, true).await.unwrap();
    w.handled(1).await;
    let s = w.gateway.status();
    assert_eq!((s.accepted, s.ignored), (0, 1), "{s:?}");
    assert_eq!(faults.policy().failed("record_interaction"), 3);
    // It reads on: the next message is dealt with (from a stranger, now).
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(2), DM, None, FRIEND, "hello?"),
    );
    w.handled(2).await;
    assert_eq!(w.gateway.status().strangers, 1);
    assert_eq!(w.b.queue.backlog().await.unwrap().waiting, 0);
    w.stop().await;
}

on_both_backends!(
    a_message_whose_agent_is_deleted_while_it_waits_is_let_go,
    message_to_a_deleted_agent
);

on_both_backends!(
    an_agent_with_no_channel_speaks_first_in_its_first_user_s_direct_messages,
    an_agent_with_no_channel_speaks_first_in_its_first_user_s_direct_messages
);
async fn an_agent_with_no_channel_speaks_first_in_its_first_user_s_direct_messages(kind: Kind) {
    let w = world(kind).await;
    w.agent(|a| {
        a.instructions = Some("Check on the user's deadlines.".into());
        a.discord.users = vec![FRIEND.into(), STRANGER.into()];
    })
    .await;
    w.llm.script([
        Scripted::tool("speak", json!({"thought": "A deadline is near; check in."})),
        Scripted::text("done"),
        Scripted::text("How is the report going?"),
    ]);
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert!(swept.errors.is_empty(), "{:?}", swept.errors);
    w.b.drain(&w.worker).await;
    let opened = w
        .discord
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v10/users/@me/channels")
        .expect("the DM channel was opened");
    assert_eq!(opened.body["recipient_id"], FRIEND);
    let posted = w.discord.messages();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0].place, format!("channel:9{FRIEND}"));
    assert_eq!(posted[0].content, "How is the report going?");
}

on_both_backends!(
    malformed_payloads_are_skipped_and_an_invalid_session_starts_a_new_one,
    malformed_payloads_are_skipped_and_an_invalid_session_starts_a_new_one
);
async fn malformed_payloads_are_skipped_and_an_invalid_session_starts_a_new_one(kind: Kind) {
    let mut w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.connect().await;
    // No id, no channel, not an object, an unknown event, a payload past 1 MiB:
    // skipped, nothing crashes.
    w.fake.dispatch(
        "MESSAGE_CREATE",
        json!({"content": "no id", "author": {"id": FRIEND}}),
    );
    w.fake.dispatch("MESSAGE_CREATE", json!("nonsense"));
    w.fake.dispatch("SOMETHING_NEW", json!({"x": 1}));
    let huge = "a".repeat(2 << 20);
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(9), DM, None, FRIEND, &huge),
    );
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(1), DM, None, FRIEND, "still here?"),
    );
    w.answered(1).await;
    assert_eq!(w.posts().len(), 1);
    let said = w.b.store.recent_messages(&agent.id, 10).await.unwrap();
    assert!(
        said.iter().all(|m| m.content.len() < 1_000),
        "the huge message was not taken"
    );

    // INVALID_SESSION, not resumable: a new session (a second IDENTIFY), then on as before.
    w.fake.invalid_session(false);
    let fake = w.fake.clone();
    until("a new session is identified", async || {
        fake.identifies() == 2 && fake.is_live()
    })
    .await;
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(2), DM, None, FRIEND, "and now?"),
    );
    w.answered(2).await;
    w.stop().await;
}

on_both_backends!(
    one_person_s_flood_is_read_at_twenty_a_minute_and_told_once,
    one_person_s_flood_is_read_at_twenty_a_minute_and_told_once
);
/// 25 messages from one person within a minute: 20 are queued for the agent, 5 are not,
/// and the person is told once; the next minute they are read again. The minute is the
/// injected clock's.
async fn one_person_s_flood_is_read_at_twenty_a_minute_and_told_once(kind: Kind) {
    let mut w = world(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;
    let per_minute = pulse_gateway::USER_MESSAGES_PER_MINUTE as usize;
    let ids: Vec<String> = (0..per_minute + 5)
        .map(|n| snowflake(10 + n as u64))
        .collect();
    for (n, id) in ids.iter().enumerate() {
        w.fake.dispatch(
            "MESSAGE_CREATE",
            message(id, DM, None, FRIEND, &format!("message {n}")),
        );
    }
    w.handled(25).await;
    let s = w.gateway.status();
    assert_eq!((s.accepted, s.rate_limited), (20, 5), "{s:?}");
    assert_eq!(
        w.b.queued_messages().await,
        20,
        "only the twenty are queued"
    );
    // Told once, in the DM, as a reply to the first message past the rate.
    until("the note is posted", async || {
        !w.discord.messages().is_empty()
    })
    .await;
    let notes = w.discord.messages();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].content, pulse_gateway::SLOW_DOWN);
    assert_eq!(notes[0].place, format!("channel:{DM}"));
    let post = w.posts().remove(0);
    assert_eq!(
        post["body"]["message_reference"]["message_id"],
        ids[per_minute].as_str()
    );
    // A minute on, the person is read again.
    w.b.advance(jiff::SignedDuration::from_mins(1));
    w.fake.dispatch(
        "MESSAGE_CREATE",
        message(&snowflake(99), DM, None, FRIEND, "still there?"),
    );
    w.handled(26).await;
    assert_eq!(w.gateway.status().accepted, 21);
    assert_eq!(w.b.queued_messages().await, 21);
    w.stop().await;
}

on_both_backends!(
    an_edited_message_reaches_the_agent_as_an_edit_with_what_it_read_before,
    an_edited_message_reaches_the_agent_as_an_edit_with_what_it_read_before
);
/// An edited message (`MESSAGE_UPDATE` with its `edited_timestamp`): after the reply, the
/// next turn reads it as an edit, with what the message read before; before the reply,
/// the turn that answers reads both; an update that is not an edit (an embed unfurled)
/// and the bot's own edits queue nothing.
async fn an_edited_message_reaches_the_agent_as_an_edit_with_what_it_read_before(kind: Kind) {
    let mut w = world(kind).await;
    w.agent(|_| {}).await;
    w.connect().await;
    let edit = |m: &Value, text: &str, at: &str| {
        let mut e = m.clone();
        e["content"] = json!(text);
        e["edited_timestamp"] = json!(at);
        e
    };
    // After the reply.
    let first = message(&snowflake(1), DM, None, FRIEND, "meet at 5pm");
    w.llm.script([Scripted::text("See you at 5.")]);
    w.fake.dispatch("MESSAGE_CREATE", first.clone());
    w.answered(1).await;
    w.llm.script([Scripted::text("Noted, 6pm then.")]);
    w.fake.dispatch(
        "MESSAGE_UPDATE",
        edit(&first, "meet at 6pm", "2026-12-06T12:00:00.000000+00:00"),
    );
    w.answered(2).await;
    let asked = w.llm.requests()[1].body["messages"].to_string();
    assert!(
        asked.contains("edited their message")
            && asked.contains("meet at 5pm")
            && asked.contains("meet at 6pm"),
        "{asked}"
    );
    // An update that is not an edit, and the bot editing its own message: nothing.
    let mut unfurled = first.clone();
    unfurled["embeds"] = json!([{"type": "link", "url": "https://example.com"}]);
    w.fake.dispatch("MESSAGE_UPDATE", unfurled);
    let mut own = message(&snowflake(2), DM, None, BOT_ID, "typing the reply");
    own["author"]["bot"] = json!(true);
    w.fake.dispatch(
        "MESSAGE_UPDATE",
        edit(&own, "the reply", "2026-12-06T12:00:01.000000+00:00"),
    );
    // Before the reply: the message and its edit, answered in one turn that reads both.
    w.llm.script([Scripted::text("Tea it is.")]);
    let second = message(&snowflake(3), DM, None, FRIEND, "coffee?");
    w.fake.dispatch("MESSAGE_CREATE", second.clone());
    w.fake.dispatch(
        "MESSAGE_UPDATE",
        edit(&second, "tea?", "2026-12-06T12:00:02.000000+00:00"),
    );
    w.handled(4).await;
    w.answered(3).await;
    assert_eq!(
        w.llm.requests().len(),
        3,
        "one turn for the message and its edit"
    );
    let asked = w.llm.requests()[2].body["messages"].to_string();
    assert!(
        asked.contains("coffee?") && asked.contains("reads now:) tea?"),
        "{asked}"
    );
    w.stop().await;
}
