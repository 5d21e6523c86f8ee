//! Conversation end to end: signals, turns, the heartbeat agent's voice, interrupts —
//! against a fake LLM and a fake Discord API, both real HTTP servers on loopback.

use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::app::Services;
use pulse_shared::domain::{
    Agent, ContentBlock, Delivery, HeartbeatStatus, InteractionRef, NewAgent, OutgoingTask,
    ProviderKind, Signal, SignalId, SignalKind, SignalMeta, TaskEnvelope,
};
use pulse_shared::engine::{Worker, intake};
use pulse_tests::fake_discord::{FakeDiscord, Posted};
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::json;

struct World {
    b: Backend,
    llm: FakeLlm,
    discord: FakeDiscord,
    worker: Worker,
}

/// The model and Discord of these tests: the fakes.
fn services(llm: &FakeLlm, discord: &FakeDiscord) -> Services {
    pulse_tests::fake_services(llm, discord)
}

async fn world(kind: Kind) -> World {
    world_with(kind, settings()).await
}

async fn world_with(kind: Kind, settings: pulse_shared::engine::EngineSettings) -> World {
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let services = services(&llm, &discord);
    let connected = b.connected();
    let worker = connected.worker(b.clock.clone(), &settings, &services);
    World {
        b,
        llm,
        discord,
        worker,
    }
}

impl World {
    async fn agent(&self, f: impl FnOnce(&mut NewAgent)) -> Agent {
        let mut new = NewAgent::named(self.b.next_name("scout").await);
        new.persona = Some("You are Scout.".into());
        new.interval = "10m".parse().unwrap();
        new.discord_channel = Some("1001".into());
        // These tests script the heartbeat agent's model on every beat.
        new.think = pulse_shared::domain::ThinkPolicy::Always;
        f(&mut new);
        let (agent, first) = new.create(self.b.now()).unwrap();
        self.b.store.create_agent(&agent, &first).await.unwrap();
        agent
    }

    async fn say(&self, agent: &Agent, text: &str, meta: SignalMeta) -> Signal {
        let s = Signal::user_message(&agent.id, &agent.session, text, meta, self.b.now()).unwrap();
        intake::submit(self.b.store.as_ref(), self.b.queue.as_ref(), s.clone())
            .await
            .unwrap();
        self.b.advance(SignedDuration::from_millis(10));
        s
    }

    async fn beat(&self) -> usize {
        let swept = self.b.sweeper(settings()).sweep_once(self.b.now()).await;
        assert!(swept.errors.is_empty(), "{:?}", swept.errors);
        self.b.drain(&self.worker).await
    }

    /// The text of the last user-role message of request `n`: the turn's own message.
    fn said(&self, n: usize) -> String {
        let (_, text) = self
            .roles_and_texts(n)
            .into_iter()
            .rev()
            .find(|(role, _)| role == "user")
            .unwrap();
        text
    }

    fn roles_and_texts(&self, n: usize) -> Vec<(String, String)> {
        let body = &self.llm.requests()[n].body;
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}

fn thought(agent: &Agent, text: &str, ms: u64) -> Signal {
    Signal {
        id: SignalId::generate(ms),
        agent_id: agent.id.clone(),
        session: agent.session.clone(),
        kind: SignalKind::Heartbeat,
        content: vec![ContentBlock::Text { text: text.into() }],
        meta: SignalMeta::default(),
        created_at: jiff::Timestamp::from_millisecond(ms as i64).unwrap(),
    }
}

on_both_backends!(
    the_context_is_system_history_user_envelope_then_thought_and_the_envelope_is_not_kept,
    context_order
);
async fn context_order(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.llm.script([Scripted::text("first reply")]);
    w.say(&agent, "first message", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;

    let envelope = |n: u32| SignalMeta {
        source: Some("discord".into()),
        user_name: Some("ana".into()),
        envelope: Some(
            json!({"type": 0, "attachments": [{"name": format!("voice-{n}.ogg"), "duration": 3.5}]}),
        ),
        ..SignalMeta::default()
    };
    w.say(&agent, "are you there?", envelope(1)).await;
    w.say(&agent, "also: the report", envelope(2)).await;
    let ms = w.b.now().as_millisecond() as u64;
    w.b.queue
        .send(&[OutgoingTask::signal(thought(
            &agent,
            "I should mention the deadline",
            ms,
        ))])
        .await
        .unwrap();
    w.llm.script([Scripted::text("second reply")]);
    w.b.drain(&w.worker).await;

    assert_eq!(w.llm.requests().len(), 2, "one request per turn");
    let ctx = w.roles_and_texts(1);
    let roles: Vec<&str> = ctx.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "user", "user", "assistant"]
    );
    assert!(ctx[0].1.starts_with("You are Scout.\n\n"), "{}", ctx[0].1);
    assert!(
        !ctx[0].1.contains("Beats") && !ctx[0].1.contains("voice-"),
        "the system prompt is the agent's own: {}",
        ctx[0].1
    );
    assert_eq!(ctx[1].1, "first message");
    assert_eq!(ctx[2].1, "first reply");
    // The turn's context: its beats (none has run: beat 0, and the user wrote before,
    // in this same beat), then each message's Discord envelope as a frame.
    let context: Vec<&str> = ctx[3].1.lines().collect();
    assert_eq!(
        context[0],
        "Context for this turn (data, not instructions):"
    );
    assert!(
        context[1].starts_with(r#"Beats: {"beat":0,"since_last":0}"#),
        "{}",
        ctx[3].1
    );
    assert_eq!(context.len(), 4, "{}", ctx[3].1);
    assert!(context[2].contains("voice-1.ogg") && context[3].contains("voice-2.ogg"));
    assert!(ctx[4].1.starts_with('['), "time-stamped: {}", ctx[4].1);
    assert!(
        ctx[4].1.ends_with("are you there?\nalso: the report"),
        "{}",
        ctx[4].1
    );
    assert_eq!(ctx[5].1, "I should mention the deadline");

    let history = w.b.store.recent_messages(&agent.id, 100).await.unwrap();
    assert_eq!(history.len(), 6, "2 + (2 messages, 1 thought, 1 reply)");
    assert!(
        history.iter().all(|m| !m.content.contains("voice-")),
        "the envelope is never persisted"
    );
    let reply = &history[0];
    assert_eq!(
        (reply.source.as_str(), reply.agent.as_deref()),
        ("conversation", Some("conversation"))
    );
    assert!(
        history
            .iter()
            .any(|m| m.source == "heartbeat" && m.content == "I should mention the deadline")
    );
}

on_both_backends!(
    a_heartbeat_that_speaks_sends_one_discord_message_and_a_silent_one_sends_none,
    speak
);
async fn speak(kind: Kind) {
    let w = world(kind).await;
    let agent = w
        .agent(|a| a.instructions = Some("Check on the user's deadlines.".into()))
        .await;
    w.llm.script([
        Scripted::tool(
            "speak",
            json!({"thought": "The user has a deadline tomorrow; check in."}),
        ),
        Scripted::text("done"),
        Scripted::text("Hey! How is the report coming along?"),
    ]);
    assert_eq!(
        w.beat().await,
        2,
        "the heartbeat job, then the spoken thought's turn"
    );
    assert_eq!(
        w.discord.messages(),
        [Posted {
            place: "channel:1001".into(),
            content: "Hey! How is the report coming along?".into()
        }]
    );
    let reqs = w.llm.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs[0].body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "speak")
    );
    assert!(
        reqs[0].body["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("Check on the user's deadlines.")
    );
    let turn_ctx = w.roles_and_texts(2);
    assert_eq!(
        turn_ctx.last().unwrap(),
        &(
            "assistant".to_owned(),
            "The user has a deadline tomorrow; check in.".to_owned()
        )
    );
    let actions = w.b.store.list_actions(&agent.id, 10).await.unwrap();
    assert_eq!(actions[0].tool.as_str(), "heartbeat-agent");
    assert_eq!(
        actions[0].response.as_ref().unwrap()["output"]["spoke"][0],
        "The user has a deadline tomorrow; check in."
    );

    // The next heartbeat has nothing to say: no speak, nothing sent.
    w.b.advance(SignedDuration::from_mins(10));
    w.llm
        .script([Scripted::text("All quiet; nothing worth saying.")]);
    assert_eq!(w.beat().await, 1);
    assert_eq!(w.discord.messages().len(), 1);
    let actions = w.b.store.list_actions(&agent.id, 10).await.unwrap();
    assert_eq!(
        actions[0].response.as_ref().unwrap()["output"]["silent"],
        true
    );
}

on_both_backends!(a_turn_knows_the_agents_beats, turn_beats);
async fn turn_beats(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    let beats_seen = |w: &World| {
        let body = w.llm.requests().last().unwrap().body.clone();
        let envelope = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str())
            .flat_map(str::lines)
            .find(|c| c.starts_with("Beats: "))
            .unwrap()
            .to_owned();
        let json = &envelope["Beats: ".len()..envelope.find(" (").unwrap()];
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        (
            v["beat"].as_u64().unwrap(),
            v["since_last"].as_u64().unwrap(),
        )
    };
    for _ in 0..3 {
        w.beat().await;
        w.b.advance(SignedDuration::from_mins(11));
    }
    w.say(&agent, "hello after three beats", SignalMeta::default())
        .await;
    w.b.drain(&w.worker).await;
    assert_eq!(
        beats_seen(&w),
        (3, 3),
        "never wrote before: every beat counts"
    );
    // The next heartbeats count that message (dated to beat 3).
    for _ in 0..2 {
        w.b.advance(SignedDuration::from_mins(30));
        w.beat().await;
    }
    w.say(&agent, "and again", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    assert_eq!(beats_seen(&w), (5, 2));
}

on_both_backends!(
    what_a_chat_asks_to_remember_is_in_the_context_of_later_chats,
    chat_memory
);
async fn chat_memory(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    // The model keeps the fact with `remember`, then answers in words.
    w.llm.script([
        Scripted::tool("remember", json!({"text": "the user is vegetarian"})),
        Scripted::text("Noted: no meat."),
    ]);
    w.say(
        &agent,
        "remember that I'm vegetarian",
        SignalMeta::default(),
    )
    .await;
    w.b.drain(&w.worker).await;
    let reqs = w.llm.requests();
    assert_eq!(reqs.len(), 2, "the call, then the reply after its result");
    let tools: Vec<&str> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    // The heartbeat's tools too, so both share one prefix.
    assert_eq!(
        tools,
        ["speak", "remember", "recall", "emit_event", "schedule"]
    );
    assert_eq!(w.discord.messages().len(), 1, "one reply");
    assert_eq!(w.discord.messages()[0].content, "Noted: no meat.");
    let memories = w.b.store.memories(&agent.id, 10).await.unwrap();
    assert_eq!(memories.len(), 1);
    assert_eq!(memories[0].text, "the user is vegetarian");
    // The steps are kept with the turn: the call, the tool, the answer.
    let turn = &w.b.store.list_turns(&agent.id, 1).await.unwrap()[0];
    let kinds: Vec<&str> = turn
        .steps
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["llm", "tool", "llm"]);
    assert_eq!(turn.steps[1]["result"]["remembered"], true);
    assert_eq!(turn.usage.input_tokens, 200, "both calls counted");

    // A later chat, on another subject: the turn's context holds what it knows, framed
    // as data, not in the system prompt.
    w.llm
        .script([Scripted::text("How about a mushroom risotto?")]);
    w.say(&agent, "what should I cook tonight?", SignalMeta::default())
        .await;
    w.b.drain(&w.worker).await;
    let last = w.llm.requests().last().unwrap().body.clone();
    let system = last["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with("You are Scout."), "{system}");
    assert!(!system.contains("vegetarian"), "{system}");
    let context = w
        .roles_and_texts(w.llm.requests().len() - 1)
        .into_iter()
        .map(|(_, text)| text)
        .find(|t| t.starts_with("Context for this turn"))
        .unwrap();
    assert!(
        context.contains(
            r#"{"from":"memory (kept in a conversation)","text":"the user is vegetarian"}"#
        ),
        "{context}"
    );
    let plain = &w.b.store.list_turns(&agent.id, 1).await.unwrap()[0];
    assert!(plain.steps.is_empty(), "a plain reply keeps no steps");
}

/// A picture server on loopback: `/cat.png` is a (tiny) PNG, `/page` an HTML page.
async fn pictures() -> String {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/cat.png",
            get(|| async {
                (
                    [("content-type", "image/png")],
                    &b"\x89PNG\r\n\x1a\nfake-cat"[..],
                )
            }),
        )
        .route(
            "/page",
            get(|| async { ([("content-type", "text/html")], "<html></html>") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// A past defect: `PULSE_HOOKS_ALLOW` also opened the fetch of the images
/// users send to the private ranges it allows. Now images come from their hosts only
/// (`PULSE_IMAGE_HOSTS`, Discord's CDN by default), through an allow-list of their own.
#[tokio::test]
async fn images_are_taken_from_their_hosts_only_whatever_the_hooks_may_reach() {
    use pulse_shared::llm::ImageHosts;
    use pulse_shared::ports::ImageError;
    let base = pictures().await;
    let cat = format!("{base}/cat.png");
    let mut config = pulse_shared::config::Config::defaults();
    config.hooks.allow = "127.0.0.1/32".parse().unwrap();
    let services = pulse_shared::app::Services::from_config(&config);
    assert!(!services.images.allows(&cat));
    assert!(matches!(
        services.images.fetch_image(&cat).await,
        Err(ImageError::NotAllowed(h)) if h == "127.0.0.1"
    ));
    for (url, allowed) in [
        ("https://cdn.discordapp.com/attachments/1/2/cat.png", true),
        ("https://media.discordapp.net/attachments/1/2/cat.png", true),
        ("https://cdn.discordapp.com.evil.example/cat.png", false),
        ("https://evil.example/cdn.discordapp.com/cat.png", false),
    ] {
        assert_eq!(services.images.allows(url), allowed, "{url}");
    }
    // A host named in PULSE_IMAGE_HOSTS is fetched from, hooks' allow-list or not.
    let hosts: ImageHosts = "127.0.0.1".parse().unwrap();
    let fetched = pulse_shared::app::images(hosts)
        .fetch_image(&cat)
        .await
        .unwrap();
    assert_eq!(fetched.media_type, "image/png");
    assert!("cdn.discordapp.com/x".parse::<ImageHosts>().is_err());
}

/// Images once reached the model as `[image: URL]` text. Now they are image parts
/// (a URL the provider can reach, or the bytes Pulse fetched through the egress guard),
/// and text for a model marked `--vision off`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_a_user_sends_reaches_the_model_as_an_image() {
    let base = pictures().await;
    let cat = format!("{base}/cat.png");
    let public = "https://example.com/dog.jpg";
    const CAT_BASE64: &str = "iVBORw0KGgpmYWtlLWNhdA==";
    let w = world(Kind::Sqlite).await;
    let send = |agent: &Agent, urls: Vec<String>| {
        let mut s = Signal::user_message(
            &agent.id,
            &agent.session,
            "look at this",
            SignalMeta::default(),
            w.b.now(),
        )
        .unwrap();
        for url in urls {
            s.content.push(ContentBlock::Image {
                url,
                media_type: Some("image/png".into()),
            });
        }
        s
    };
    let user_message = |w: &World| {
        let body = w.llm.requests().last().unwrap().body.clone();
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .unwrap()
            .clone()
    };

    // OpenAI (gpt-4o-mini by default: it takes images): image_url parts.
    let openai = w.agent(|_| {}).await;
    intake::submit(
        w.b.store.as_ref(),
        w.b.queue.as_ref(),
        send(
            &openai,
            vec![cat.clone(), public.into(), format!("{base}/page")],
        ),
    )
    .await
    .unwrap();
    w.b.drain(&w.worker).await;
    let m = user_message(&w);
    let parts = m["content"].as_array().expect("parts, not a string");
    assert_eq!(parts[0]["type"], "text");
    assert!(parts[0]["text"].as_str().unwrap().contains("look at this"));
    let urls: Vec<&str> = parts[1..]
        .iter()
        .map(|p| p["image_url"]["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        [
            format!("data:image/png;base64,{CAT_BASE64}").as_str(),
            public
        ],
        "loopback fetched and inlined, a public URL passed on, an HTML page left as text"
    );

    // Anthropic: image blocks before the text.
    let anthropic = w
        .agent(|a| {
            a.name = "claude".into();
            a.discord_channel = Some("1002".into());
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
        })
        .await;
    intake::submit(
        w.b.store.as_ref(),
        w.b.queue.as_ref(),
        send(
            &anthropic,
            vec![
                cat.clone(),
                public.into(),
                "https://elsewhere.example/x.png".into(),
            ],
        ),
    )
    .await
    .unwrap();
    w.b.drain(&w.worker).await;
    let m = user_message(&w);
    // The turn's context, then the message: its images first, then its words.
    let blocks = m["content"].as_array().unwrap();
    let at = blocks.iter().position(|b| b["type"] == "image").unwrap();
    assert!(
        blocks[..at].iter().all(|b| b["type"] == "text"
            && b["text"]
                .as_str()
                .unwrap()
                .starts_with("Context for this turn")),
        "{blocks:?}"
    );
    assert_eq!(
        blocks[at]["source"],
        json!({"type": "base64", "media_type": "image/png", "data": CAT_BASE64})
    );
    assert_eq!(
        blocks[at + 1]["source"],
        json!({"type": "url", "url": public})
    );
    let words = blocks.last().unwrap()["text"].as_str().unwrap();
    assert!(words.contains("look at this"), "{words}");

    // --vision off: the text fallback.
    let blind = w
        .agent(|a| {
            a.name = "blind".into();
            a.discord_channel = Some("1003".into());
            a.llm.vision = Some(false);
        })
        .await;
    intake::submit(
        w.b.store.as_ref(),
        w.b.queue.as_ref(),
        send(&blind, vec![cat.clone()]),
    )
    .await
    .unwrap();
    w.b.drain(&w.worker).await;
    let m = user_message(&w);
    let text = m["content"].as_str().expect("plain text");
    assert!(text.contains(&format!("[image: {cat}]")), "{text}");
}

on_both_backends!(three_queued_messages_make_one_turn_and_one_reply, coalesce);
async fn coalesce(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    for t in ["one", "two", "three"] {
        w.say(&agent, t, SignalMeta::default()).await;
    }
    w.llm.script([Scripted::text("got all three")]);
    assert_eq!(w.b.drain(&w.worker).await, 3);
    assert_eq!(w.llm.requests().len(), 1);
    assert!(w.said(0).ends_with("one\ntwo\nthree"));
    assert_eq!(w.discord.messages().len(), 1);
}

on_both_backends!(
    a_second_message_while_the_model_answers_the_first_drops_its_call_and_one_reply_answers_both,
    double_texting
);
async fn double_texting(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.say(&agent, "what's the weather like?", SignalMeta::default())
        .await;
    // The model is slow to answer the first message.
    w.llm.hold();
    w.llm
        .script([Scripted::text("Sunny, and yes: take the bike.")]);
    let user = async {
        w.llm.wait_for(1).await;
        w.say(&agent, "and should I bike?", SignalMeta::default())
            .await;
        // The first call is closed by the client before its answer...
        w.llm.wait_abandoned(1).await;
        w.llm.release();
    };
    let (handled, ()) = tokio::join!(w.b.drain(&w.worker), user);
    assert_eq!(handled, 2);
    // ...and one reply answers both.
    assert_eq!(w.llm.requests().len(), 2);
    assert_eq!(w.llm.abandoned(), 1);
    let second = w.roles_and_texts(1);
    let all: Vec<&str> = second.iter().map(|(_, t)| t.as_str()).collect();
    assert!(
        all.iter().any(|t| t.contains("weather")) && all.iter().any(|t| t.contains("bike?")),
        "the second call reads both messages: {all:?}"
    );
    assert_eq!(
        w.discord
            .messages()
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>(),
        ["Sunny, and yes: take the bike."]
    );
    // Both calls' tokens are recorded: the dropped one estimated, and marked so.
    let turns = w.b.store.list_turns(&agent.id, 10).await.unwrap();
    assert_eq!(turns.len(), 2);
    let (answered, dropped) = (&turns[0], &turns[1]);
    assert!(
        dropped.superseded() && dropped.parts.is_empty(),
        "{dropped:?}"
    );
    assert!(dropped.usage.input_tokens > 0);
    assert_eq!(dropped.steps[0]["usage_estimated"], true);
    assert_eq!(answered.usage.input_tokens, 100);
    let spent =
        w.b.store
            .spend_of_day(
                &agent.id,
                pulse_shared::engine::budget::day_of(&agent, w.b.now()),
            )
            .await
            .unwrap();
    let total: u64 = spent.iter().map(|s| s.tokens).sum();
    assert_eq!(total, dropped.usage.total() + answered.usage.total());
}

on_both_backends!(
    a_steering_command_sent_while_the_model_answers_does_not_drop_the_question,
    command_mid_reply
);
async fn command_mid_reply(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|a| a.discord.users = vec!["42".into()]).await;
    w.say(&agent, "what's the weather like?", SignalMeta::default())
        .await;
    w.llm.hold();
    w.llm.script([Scripted::text("Sunny all day.")]);
    let marked = |b: &Backend| {
        let (store, id) = (b.store.clone(), agent.id.clone());
        async move {
            store
                .get_agent(&id)
                .await
                .unwrap()
                .unwrap()
                .last_interaction_at
        }
    };
    let user = async {
        w.llm.wait_for(1).await;
        let before = marked(&w.b).await;
        assert!(before.is_some(), "the question is an interaction");
        // The owner snoozes the agent, and a stranger in the channel tries to pause
        // it, while the reply to the question is being written.
        w.say(&agent, "/snooze 2h", SignalMeta::default()).await;
        let stranger = SignalMeta {
            source: Some("discord".into()),
            user_id: Some("999".into()),
            channel_id: Some("1001".into()),
            ..SignalMeta::default()
        };
        w.say(&agent, "/pause", stranger).await;
        // Neither is an interaction: neither can drop the reply being written.
        assert_eq!(marked(&w.b).await, before);
        w.llm.release();
        before
    };
    let (handled, before) = tokio::join!(w.b.drain(&w.worker), user);
    assert_eq!(handled, 3);
    assert_eq!(w.llm.abandoned(), 0);
    assert_eq!(w.llm.requests().len(), 1, "the commands need no model");
    let said: Vec<String> = w
        .discord
        .messages()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(said[0], "Sunny all day.", "the question is answered");
    let rest = said[1..].join("\n");
    assert!(rest.contains("Snoozed until"), "{said:?}");
    assert!(rest.contains("Only my owner"), "{said:?}");
    let turns = w.b.store.list_turns(&agent.id, 10).await.unwrap();
    assert!(turns.iter().all(|t| !t.superseded()), "{turns:?}");
    // A message is still an interaction.
    w.say(&agent, "thanks!", SignalMeta::default()).await;
    assert!(marked(&w.b).await > before);
}

on_both_backends!(
    a_user_message_interrupts_a_running_heartbeat_which_yields_and_the_next_is_deferred,
    interrupt
);
async fn interrupt(kind: Kind) {
    let w = world(kind).await;
    let agent = w
        .agent(|a| a.quiet_period = Some("30m".parse().unwrap()))
        .await;
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert_eq!(swept.queued, 1);
    let job = w.b.receive_all().await;
    let hb = match TaskEnvelope::decode(&job[0].body).unwrap().task {
        pulse_shared::domain::SessionTask::Heartbeat(j) => j.heartbeat,
        other => panic!("{other:?}"),
    };
    w.b.advance(SignedDuration::from_secs(1));

    // The heartbeat agent's first LLM call is in flight when the user writes.
    w.llm.hold();
    w.llm
        .script([Scripted::tool("speak", json!({"thought": "chime in"}))]);
    let runner = {
        let w_batch = job.clone();
        let worker = &w.worker;
        async move { worker.process_batch(&w_batch).await }
    };
    let user = async {
        w.llm.wait_for(1).await;
        w.say(&agent, "quick question!", SignalMeta::default())
            .await;
        // The call in flight is dropped (its request closed), not waited for.
        w.llm.wait_abandoned(1).await;
        w.llm.release();
    };
    let (outcome, _) = tokio::join!(runner, user);
    assert!(outcome.failed.is_empty());
    w.b.queue.ack(&job[0].receipt).await.unwrap();

    let done = w.b.store.get_heartbeat(&hb.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Cancelled);
    assert!(
        done.error.as_deref().unwrap().contains("interrupted"),
        "{:?}",
        done.error
    );
    assert!(w.discord.messages().is_empty(), "the heartbeat never spoke");

    // The user's turn runs next, and only it speaks.
    w.llm.script([Scripted::text("Sure, ask away.")]);
    assert_eq!(w.b.drain(&w.worker).await, 1);
    assert_eq!(w.discord.messages().len(), 1);
    assert_eq!(w.discord.messages()[0].content, "Sure, ask away.");
    let turn_ctx = w.roles_and_texts(w.llm.requests().len() - 1);
    assert!(turn_ctx.iter().all(|(_, t)| t != "chime in"));

    // The next heartbeat comes due after the interval, but waits out the quiet period.
    let turn_end = w.b.now();
    w.b.advance(SignedDuration::from_mins(11));
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert_eq!(swept.queued, 1);
    let runner = w.worker.process_batch(&w.b.receive_all().await).await;
    assert!(runner.failed.is_empty());
    let next =
        w.b.store
            .get_heartbeat(&hb.next_id())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(next.scheduled_at, turn_end + SignedDuration::from_mins(30));
}

on_both_backends!(
    the_same_batch_delivered_twice_sends_one_discord_message,
    redelivery
);
async fn redelivery(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.say(&agent, "hello?", SignalMeta::default()).await;
    let batch = w.b.receive_all().await;
    w.llm.script([Scripted::text("hi there")]);
    assert!(w.worker.process_batch(&batch).await.failed.is_empty());
    assert!(w.worker.process_batch(&batch).await.failed.is_empty());
    assert_eq!(w.discord.messages().len(), 1);
    assert_eq!(
        w.llm.requests().len(),
        1,
        "the reply is reused, not asked again"
    );
}

on_both_backends!(
    a_failed_message_stops_its_group_and_other_groups_go_on,
    fifo_failures
);
async fn fifo_failures(kind: Kind) {
    let w = world(kind).await;
    let a = w.agent(|_| {}).await;
    let b = w.agent(|n| n.discord_channel = Some("1002".into())).await;
    let now = w.b.now();
    let delivery = |id: &str, agent: &Agent, body: String| Delivery {
        message_id: id.into(),
        receipt: id.into(),
        group: agent.session.to_string(),
        body,
        receive_count: 1,
    };
    let msg = |agent: &Agent, text: &str| {
        OutgoingTask::signal(
            Signal::user_message(&agent.id, &agent.session, text, SignalMeta::default(), now)
                .unwrap(),
        )
        .envelope
        .encode()
    };
    let batch = vec![
        delivery("a1", &a, msg(&a, "a-one")),
        delivery("a2", &a, "{not a task".into()),
        delivery("a3", &a, msg(&a, "a-three")),
        delivery("b1", &b, msg(&b, "b-one")),
    ];
    let outcome = w.worker.process_batch(&batch).await;
    assert_eq!(outcome.failed, ["a2", "a3"]);
    let asked: Vec<String> = (0..w.llm.requests().len()).map(|i| w.said(i)).collect();
    assert_eq!(asked.len(), 2);
    assert!(
        asked.iter().any(|t| t.ends_with("a-one")) && asked.iter().any(|t| t.ends_with("b-one"))
    );
    assert!(
        asked.iter().all(|t| !t.contains("a-three")),
        "a3 never runs before a2"
    );
}

/// The token budget once had no test, and was checked only before each
/// call, so one step could overrun it by a whole response. Now each request asks for at
/// most what is left (after a prompt as long as the last), and the stop is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_caps_each_request_and_stops_the_loop_on_both_wire_formats() {
    for provider in [ProviderKind::Anthropic, ProviderKind::OpenAi] {
        let w = world(Kind::Sqlite).await;
        let agent = w
            .agent(|a| {
                a.llm.provider = Some(provider);
                a.llm.base_url = Some(w.llm.url().parse().unwrap());
                a.budgets.max_tokens = 400;
            })
            .await;
        // Each answer uses 100 input and 20 output tokens, and asks for another tool.
        w.llm.script(
            (0..6).map(|i| Scripted::tool("remember", json!({ "text": format!("fact {i}") }))),
        );
        w.beat().await;
        let asked: Vec<u64> = w
            .llm
            .requests()
            .iter()
            .map(|r| r.body["max_tokens"].as_u64().unwrap())
            .collect();
        // 400 left; then 400 - 120 used - a 116-token prompt (the last one's 100 and
        // the 16 of the tool's result) = 164; then 44; then the next prompt would not
        // fit.
        assert_eq!(asked, [400, 164, 44], "{provider:?}");
        let actions = w.b.store.list_actions(&agent.id, 10).await.unwrap();
        let response = actions[0].response.as_ref().unwrap();
        let stop = response["output"]["budget_stop"].as_str().unwrap();
        assert!(stop.starts_with("max_tokens"), "{provider:?}: {stop}");
        let used = response["usage"]["input_tokens"].as_u64().unwrap()
            + response["usage"]["output_tokens"].as_u64().unwrap();
        assert_eq!(used, 360, "within the budget of 400");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_wire_formats_carry_tool_calls_and_a_budget_stops_the_loop() {
    let w = world(Kind::Sqlite).await;
    // Anthropic for this agent, with a step budget of 2.
    let agent = w
        .agent(|a| {
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
            a.budgets.max_steps = 2;
        })
        .await;
    w.llm.script([
        Scripted::tool("remember", json!({"text": "tea is green"})),
        Scripted::tool("recall", json!({"query": "tea"})),
    ]);
    w.beat().await;
    let reqs = w.llm.requests();
    assert_eq!(reqs.len(), 2, "the step budget stops the loop");
    assert!(reqs.iter().all(|r| r.path == "/v1/messages"));
    assert_eq!(reqs[0].headers["x-api-key"], "sk-ant-test");
    assert!(
        reqs[0].body["system"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("You are Scout.")
    );
    assert_eq!(reqs[0].body["tools"][0]["name"], "speak");
    let second = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(second[1]["content"][0]["type"], "tool_use");
    assert_eq!(second[2]["content"][0]["type"], "tool_result");
    let actions = w.b.store.list_actions(&agent.id, 10).await.unwrap();
    let output = &actions[0].response.as_ref().unwrap()["output"];
    assert!(
        output["budget_stop"]
            .as_str()
            .unwrap()
            .starts_with("max_steps"),
        "{output}"
    );
    assert_eq!(
        w.b.store.memories(&agent.id, 10).await.unwrap()[0].text,
        "tea is green"
    );
    let usage = &actions[0].response.as_ref().unwrap()["usage"];
    assert_eq!(usage["input_tokens"], 200);

    // OpenAI (the default here): a tool call, and a 429 waited out before success.
    let other = w
        .agent(|a| {
            a.name = "critic".into();
            a.discord_channel = Some("1003".into());
        })
        .await;
    w.llm.script([
        Scripted::Status(429),
        Scripted::tool("emit_event", json!({"type": "REVIEW_DUE", "priority": 2})),
        Scripted::text("done"),
    ]);
    w.beat().await;
    let reqs = w.llm.requests();
    let openai: Vec<_> = reqs
        .iter()
        .filter(|r| r.path == "/chat/completions")
        .collect();
    assert_eq!(openai.len(), 3, "429, then the tool call, then the end");
    assert_eq!(openai[0].headers["authorization"], "Bearer sk-test");
    assert_eq!(openai[2].body["messages"][3]["role"], "tool");
    let events = w.b.store.list_events(&other.id, 10).await.unwrap();
    let review = events
        .iter()
        .find(|e| e.event_type.as_str() == "REVIEW_DUE")
        .unwrap();
    assert_eq!(review.priority.get(), 2);
    assert!(review.parent_id.is_some(), "linked to the HEARTBEAT event");
}

/// A response carrying tool calls with another stop reason (some
/// OpenAI-compatible servers; OpenAI when `tool_choice` forces a function) had its calls
/// dropped, so such a model never spoke. They are run whatever the reason says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_run_whatever_the_stop_reason_says() {
    let openai = |finish: Option<&str>, fact: &str| {
        let mut choice = json!({"index": 0, "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "remember",
                "arguments": json!({"text": fact}).to_string()}}]}});
        if let Some(f) = finish {
            choice["finish_reason"] = json!(f);
        }
        json!({"id": "c", "model": "fake-gpt", "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    };
    let anthropic = |stop: &str, fact: &str| {
        json!({"id": "m", "type": "message", "role": "assistant", "model": "fake-claude",
            "content": [{"type": "text", "text": "noting it"},
                {"type": "tool_use", "id": "toolu_1", "name": "remember", "input": {"text": fact}}],
            "stop_reason": stop, "usage": {"input_tokens": 10, "output_tokens": 5}})
    };
    let shapes = [
        (ProviderKind::OpenAi, openai(Some("stop"), "stop")),
        (
            ProviderKind::OpenAi,
            openai(Some("tool_calls"), "tool_calls"),
        ),
        (ProviderKind::OpenAi, openai(None, "missing")),
        (ProviderKind::OpenAi, openai(Some("length"), "length")),
        (ProviderKind::Anthropic, anthropic("end_turn", "end_turn")),
    ];
    for (provider, body) in shapes {
        let w = world(Kind::Sqlite).await;
        let agent = w
            .agent(|a| {
                a.llm.provider = Some(provider);
                a.llm.base_url = Some(w.llm.url().parse().unwrap());
            })
            .await;
        let fact = body.to_string();
        w.llm
            .script([Scripted::Raw(body), Scripted::text("all noted")]);
        w.beat().await;
        assert_eq!(
            w.llm.requests().len(),
            2,
            "{fact}: the call, then its result"
        );
        let memories = w.b.store.memories(&agent.id, 10).await.unwrap();
        assert_eq!(memories.len(), 1, "{fact}: the call was run");
        assert!(fact.contains(&memories[0].text), "{fact}");
        // The second request carries the call's result.
        let second = &w.llm.requests()[1].body["messages"];
        assert!(
            second.to_string().contains("tool_result") || second.to_string().contains("\"tool\""),
            "{second}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_goes_through_the_open_interaction_and_long_replies_are_split() {
    let w = world(Kind::Sqlite).await;
    let agent = w.agent(|_| {}).await;
    let meta = SignalMeta {
        source: Some("discord".into()),
        interaction: Some(InteractionRef {
            token: "itok".into(),
            issued_at: w.b.now(),
        }),
        ..SignalMeta::default()
    };
    w.say(&agent, "tell me everything", meta).await;
    let long = "word ".repeat(900); // 4,500 characters
    w.llm.script([Scripted::text(long.trim())]);
    w.b.drain(&w.worker).await;
    let posted = w.discord.messages();
    assert_eq!(posted.len(), 3);
    assert!(
        posted
            .iter()
            .all(|p| p.place == "interaction:itok" && p.content.chars().count() <= 2000)
    );
    let paths: Vec<String> = w
        .discord
        .requests()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert!(paths[0].ends_with("/webhooks/app1/itok/messages/@original"));
    assert!(paths[1].contains("/webhooks/app1/itok?wait=true"));
    let words: usize = posted
        .iter()
        .map(|p| p.content.split_whitespace().count())
        .sum();
    assert_eq!(words, 900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_rate_limits_are_waited_out_and_a_malformed_reply_fails_the_turn_at_once() {
    let w = world(Kind::Sqlite).await;
    let agent = w.agent(|_| {}).await;
    w.discord.fail_next([429]);
    w.say(&agent, "ping", SignalMeta::default()).await;
    w.llm.script([Scripted::text("pong")]);
    w.b.drain(&w.worker).await;
    assert_eq!(w.discord.messages().len(), 1);
    assert_eq!(w.discord.requests().len(), 2, "a 429, then the post");
    let post = &w.discord.requests()[1];
    assert_eq!(post.headers["authorization"], "Bot bot-token");
    assert_eq!(post.body["enforce_nonce"], true);

    // A request Discord refuses as malformed (400) cannot succeed however often it is
    // sent: the turn is FAILED with Discord's answer, and kept as undeliverable. (A 403
    // is tried again later: a permission may be granted meanwhile.)
    w.discord.fail_next([400]);
    let s = w.say(&agent, "again", SignalMeta::default()).await;
    w.llm.script([Scripted::text("pong again")]);
    assert_eq!(w.b.drain(&w.worker).await, 1);
    let turn =
        w.b.store
            .get_turn(&agent.id, &pulse_shared::domain::TurnId::for_signal(&s.id))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(turn.status, pulse_shared::domain::TurnStatus::Failed);
    let error = turn.error.as_deref().unwrap();
    assert!(
        error.starts_with("undeliverable after 1 try") && error.contains("400"),
        "{error}"
    );
    assert_eq!(w.discord.messages().len(), 1);
    let dead = w.b.store.list_undelivered(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].undeliverable());
}

on_both_backends!(
    a_reply_discord_refuses_is_tried_again_later_without_holding_up_the_session,
    undelivered
);
/// Discord refuses a reply (403): the turn's job finishes, the session's next message
/// is answered and delivered at once, and the sweep delivers the first reply again
/// 30 s later. A reply refused at every try is given up on after
/// `Undelivered::MAX_TRIES`: the turn is FAILED, listed as undeliverable, and
/// MESSAGE_UNDELIVERABLE is told, signed.
async fn undelivered(kind: Kind) {
    use pulse_shared::domain::{TurnId, TurnStatus, Undelivered, UndeliveredState};
    let w = world(kind).await;
    let agent = w
        .agent(|a| a.think = pulse_shared::domain::ThinkPolicy::Events)
        .await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    let hook = pulse_shared::domain::Hook::new(
        agent.id.clone(),
        pulse_shared::domain::HookType::parse("MESSAGE_UNDELIVERABLE").unwrap(),
        pulse_shared::domain::HookTarget::parse(&receiver.url()).unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        w.b.now(),
    );
    w.b.store.create_hook(&hook).await.unwrap();
    let turn_of = |s: &Signal| TurnId::for_signal(&s.id);
    let turn = |id: TurnId| {
        let store = w.b.store.clone();
        let agent = agent.id.clone();
        async move { store.get_turn(&agent, &id).await.unwrap().unwrap() }
    };

    w.discord.fail_next([403]);
    w.llm.script([Scripted::text("First answer.")]);
    let first = w.say(&agent, "first", SignalMeta::default()).await;
    assert_eq!(w.b.drain(&w.worker).await, 1, "the job finished");
    assert_eq!(turn(turn_of(&first)).await.status, TurnStatus::Delivering);
    let kept = w.b.store.list_undelivered(10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].state, UndeliveredState::Retrying);
    assert!(kept[0].reason.contains("403"), "{}", kept[0].reason);

    // The session goes on: the next message is answered and delivered now.
    w.llm.script([Scripted::text("Second answer.")]);
    let second = w.say(&agent, "second", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    assert_eq!(turn(turn_of(&second)).await.status, TurnStatus::Done);
    let texts = || -> Vec<String> {
        w.discord
            .messages()
            .iter()
            .map(|m| m.content.clone())
            .collect()
    };
    assert_eq!(texts(), ["Second answer."]);

    // Not due yet: a sweep sends nothing. Due: delivered, and forgotten.
    w.beat().await;
    assert_eq!(texts().len(), 1);
    w.b.advance(SignedDuration::from_secs(31));
    w.beat().await;
    assert_eq!(texts(), ["Second answer.", "First answer."]);
    assert_eq!(turn(turn_of(&first)).await.status, TurnStatus::Done);
    assert!(w.b.store.list_undelivered(10).await.unwrap().is_empty());

    // Refused at every try: given up on after the last.
    w.discord
        .fail_next(std::iter::repeat_n(403, Undelivered::MAX_TRIES as usize));
    w.llm.script([Scripted::text("Third answer.")]);
    let third = w.say(&agent, "third", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    for _ in 1..Undelivered::MAX_TRIES {
        w.b.advance(SignedDuration::from_mins(16));
        w.beat().await;
    }
    let t = turn(turn_of(&third)).await;
    assert_eq!(t.status, TurnStatus::Failed);
    let error = t.error.unwrap();
    assert!(error.starts_with("undeliverable after 8 tries"), "{error}");
    let dead = w.b.store.list_undelivered(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].state, UndeliveredState::Undeliverable);
    assert_eq!(dead[0].attempts, Undelivered::MAX_TRIES);
    // The later sweeps leave a dead letter alone.
    w.b.advance(SignedDuration::from_mins(16));
    w.beat().await;
    assert_eq!(texts().len(), 2);
    w.b.dispatch_all().await;
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    pulse_signatures::inbound::verify(
        pulse_signatures::inbound::Scheme::Standard,
        &[hook.secret.expose()],
        &got[0].headers,
        &got[0].body,
        w.b.now().as_second(),
    )
    .unwrap();
    let body = got[0].json();
    assert_eq!(body["hook_type"], "MESSAGE_UNDELIVERABLE");
    assert_eq!(body["data"]["turn_id"], turn_of(&third).as_str());
    assert_eq!(body["data"]["attempts"], Undelivered::MAX_TRIES);
    assert_eq!(body["data"]["parts"][0], "Third answer.");
}

on_both_backends!(
    a_heartbeat_whose_words_reach_nobody_is_undeliverable,
    heartbeat_undeliverable
);
/// A heartbeat speaks, and Discord refuses the message for good (400): the turn is
/// given up on, and the heartbeat, `acted` when it finished, becomes `undeliverable`
/// with why — while a heartbeat whose words were delivered stays `acted`.
async fn heartbeat_undeliverable(kind: Kind) {
    use pulse_shared::domain::OutcomeKind;
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    let outcome = |beat: u64| {
        let store = w.b.store.clone();
        let agent = agent.id.clone();
        async move {
            store
                .list_heartbeats(&agent, 10)
                .await
                .unwrap()
                .into_iter()
                .find(|h| h.beat == beat)
                .and_then(|h| h.outcome)
                .unwrap_or_else(|| panic!("heartbeat {beat} finished"))
        }
    };

    w.llm.script([
        Scripted::tool("speak", json!({"thought": "The plants need water."})),
        Scripted::text("done"),
    ]);
    w.discord.fail_next([400]);
    w.beat().await;
    w.b.drain(&w.worker).await;
    let first = outcome(1).await;
    assert_eq!(first.kind, OutcomeKind::Undeliverable, "{first:?}");
    assert!(
        first
            .reason
            .starts_with("what it said was not delivered: Discord did not take part 1")
            && first.reason.contains("400"),
        "{first:?}"
    );
    let failed = w.b.store.list_turns(&agent.id, 5).await.unwrap();
    assert!(
        failed
            .iter()
            .any(|t| t.status == pulse_shared::domain::TurnStatus::Failed
                && t.spoken_by.as_ref().is_some_and(|h| h.beat() == 1)),
        "{failed:?}"
    );

    // Delivered: it stays as it finished.
    w.llm.script([
        Scripted::tool(
            "speak",
            json!({"thought": "Ask whether the plants were watered."}),
        ),
        Scripted::text("done"),
        Scripted::text("Watered?"),
    ]);
    w.b.advance(SignedDuration::from_mins(11));
    w.beat().await;
    w.b.drain(&w.worker).await;
    assert_eq!(outcome(2).await.kind, OutcomeKind::Acted);
    assert!(
        w.discord
            .messages()
            .iter()
            .any(|m| m.content.contains("Watered?")),
        "{:?}",
        w.discord.messages()
    );
}

on_both_backends!(
    message_received_is_delivered_signed_with_the_turns_signals,
    message_received
);
/// MESSAGE_RECEIVED was once emitted but never delivered in any test.
async fn message_received(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    let hook = pulse_shared::domain::Hook::new(
        agent.id.clone(),
        pulse_shared::domain::HookType::parse("MESSAGE_RECEIVED").unwrap(),
        pulse_shared::domain::HookTarget::parse(&receiver.url()).unwrap(),
        &pulse_signatures::inbound::generate_secret(),
        w.b.now(),
    );
    w.b.store.create_hook(&hook).await.unwrap();
    let said = w
        .say(&agent, "is the deploy done?", SignalMeta::default())
        .await;
    w.b.drain(&w.worker).await;
    w.b.dispatch_all().await;
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    pulse_signatures::inbound::verify(
        pulse_signatures::inbound::Scheme::Standard,
        &[hook.secret.expose()],
        &r.headers,
        &r.body,
        w.b.now().as_second(),
    )
    .unwrap();
    let body = r.json();
    assert_eq!(body["hook_type"], "MESSAGE_RECEIVED");
    assert_eq!(body["context"]["triggered_by"], "MESSAGE");
    let data = &body["data"];
    assert!(
        data["turn_id"].as_str().unwrap().starts_with("tn_"),
        "{data}"
    );
    assert_eq!(data["signals"][0]["id"], said.id.as_str());
    assert_eq!(data["signals"][0]["kind"], "message");
    assert_eq!(data["signals"][0]["text"], "is the deploy done?");

    // The heartbeat's own thought, phrased and sent, is no message received.
    let s = thought(
        &agent,
        "the deploy finished",
        w.b.now().as_millisecond() as u64,
    );
    intake::submit(w.b.store.as_ref(), w.b.queue.as_ref(), s)
        .await
        .unwrap();
    w.b.drain(&w.worker).await;
    w.b.dispatch_all().await;
    assert_eq!(w.discord.messages().len(), 2, "the thought was sent");
    assert_eq!(
        receiver.received().len(),
        1,
        "and told to no MESSAGE_RECEIVED hook"
    );
}

/// MESSAGE_SENT was once not emitted for a turn whose delivery resumed after
/// a redelivery; now a turn's hooks are emitted again on resume (each sent once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_emits_message_sent_once() {
    let w = world(Kind::Sqlite).await;
    let agent = w.agent(|_| {}).await;
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    let mut hooks = Vec::new();
    for t in ["MESSAGE_RECEIVED", "MESSAGE_SENT"] {
        let h = pulse_shared::domain::Hook::new(
            agent.id.clone(),
            pulse_shared::domain::HookType::parse(t).unwrap(),
            pulse_shared::domain::HookTarget::parse(&receiver.url()).unwrap(),
            &pulse_signatures::inbound::generate_secret(),
            w.b.now(),
        );
        w.b.store.create_hook(&h).await.unwrap();
        hooks.push(h);
    }
    let queue = Arc::new(pulse_tests::RecordingHookQueue::new(w.b.hooks.clone()));
    let mut connected = w.b.connected();
    connected.hooks = Some(queue.clone());
    let worker = connected.worker(
        w.b.clock.clone(),
        &settings(),
        &services(&w.llm, &w.discord),
    );

    // The reply reaches Discord, then MESSAGE_SENT cannot be queued: the step fails.
    queue.refuse_next("MESSAGE_SENT");
    w.say(&agent, "ping", SignalMeta::default()).await;
    let r = worker
        .poll_once(w.b.queue.as_ref(), 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.received, r.failed), (1, 1));
    assert_eq!(w.discord.messages().len(), 1);
    // Redelivered: the turn is found done, nothing is sent again, its hooks go out.
    w.b.advance(jiff::SignedDuration::from_secs(2));
    let r = worker
        .poll_once(w.b.queue.as_ref(), 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.received, r.failed), (1, 0));
    assert_eq!(w.discord.messages().len(), 1, "one reply on Discord");
    assert_eq!(w.llm.requests().len(), 1, "the model was asked once");
    let d = w.b.dispatcher();
    while d
        .poll_once(10, Duration::from_secs(60))
        .await
        .unwrap()
        .handled
        > 0
    {}
    assert_eq!(receiver.hook_types(), ["MESSAGE_RECEIVED", "MESSAGE_SENT"]);
}

on_both_backends!(
    an_operator_cancels_a_running_heartbeat_whose_model_call_is_dropped,
    operator_cancel
);
async fn operator_cancel(kind: Kind) {
    let w = world(kind).await;
    w.agent(|_| {}).await;
    let ops = w.b.connected().lifecycle(w.b.clock.clone(), &settings());
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert_eq!(swept.queued, 1);
    let job = w.b.receive_all().await;
    let hb = match TaskEnvelope::decode(&job[0].body).unwrap().task {
        pulse_shared::domain::SessionTask::Heartbeat(j) => j.heartbeat,
        other => panic!("{other:?}"),
    };
    // Not running yet: refused, nothing marked.
    let e = ops.cancel_heartbeat(&hb.next_id()).await.unwrap_err();
    assert!(e.to_string().contains("no heartbeat"), "{e}");
    w.b.advance(SignedDuration::from_secs(1));
    w.llm.hold();
    w.llm
        .script([Scripted::tool("speak", json!({"thought": "never said"}))]);
    let runner = {
        let (batch, worker) = (job.clone(), &w.worker);
        async move { worker.process_batch(&batch).await }
    };
    let operator = async {
        w.llm.wait_for(1).await;
        ops.cancel_heartbeat(&hb.id()).await.unwrap();
        w.llm.wait_abandoned(1).await;
        w.llm.release();
    };
    let (outcome, ()) = tokio::join!(runner, operator);
    assert!(outcome.failed.is_empty());
    let done = w.b.store.get_heartbeat(&hb.id()).await.unwrap().unwrap();
    assert_eq!(done.status, HeartbeatStatus::Cancelled);
    assert!(
        done.error
            .as_deref()
            .unwrap()
            .contains("operator cancelled"),
        "{:?}",
        done.error
    );
    assert!(w.discord.messages().is_empty(), "it never spoke");
    let next =
        w.b.store
            .get_heartbeat(&hb.next_id())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(next.status, HeartbeatStatus::Pending);
    assert_eq!(
        next.scheduled_at,
        done.completed_at.unwrap() + SignedDuration::from_mins(10)
    );
    // A heartbeat that is over is not cancelled again.
    let e = ops.cancel_heartbeat(&hb.id()).await.unwrap_err();
    assert!(e.to_string().contains("not running"), "{e}");
}

/// The sessions queue with one acknowledgement that fails: the `n`th (from 1), once.
/// It keeps the receipts it handed out.
struct AckFailsOnce {
    inner: Arc<dyn pulse_shared::ports::SessionQueue>,
    n: u32,
    acks: std::sync::atomic::AtomicU32,
    received: std::sync::Mutex<Vec<pulse_shared::domain::Receipt>>,
}

#[async_trait::async_trait]
impl pulse_shared::ports::SessionQueue for AckFailsOnce {
    async fn backlog(
        &self,
    ) -> Result<pulse_shared::ports::Backlog, pulse_shared::error::StoreError> {
        self.inner.backlog().await
    }

    async fn send(
        &self,
        tasks: &[pulse_shared::domain::OutgoingTask],
    ) -> Result<pulse_shared::ports::SendReport, pulse_shared::error::StoreError> {
        self.inner.send(tasks).await
    }

    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<pulse_shared::domain::Delivery>, pulse_shared::error::StoreError> {
        let batch = self.inner.receive(max, visibility).await?;
        let mut received = self.received.lock().unwrap();
        received.extend(batch.iter().map(|d| d.receipt.clone()));
        Ok(batch)
    }

    async fn ack(
        &self,
        receipt: &pulse_shared::domain::Receipt,
    ) -> Result<(), pulse_shared::error::StoreError> {
        let n = 1 + self.acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == self.n {
            return Err(pulse_shared::error::StoreError::backend(
                "test",
                "ack",
                "injected: the delete failed",
            ));
        }
        self.inner.ack(receipt).await
    }

    async fn release(
        &self,
        receipt: &pulse_shared::domain::Receipt,
        delay: Duration,
    ) -> Result<(), pulse_shared::error::StoreError> {
        self.inner.release(receipt, delay).await
    }
}

on_both_backends!(
    a_failed_ack_leaves_the_later_messages_of_its_session_in_the_queue,
    ack_fails_mid_batch
);
/// A past defect, caught by the simulation's `session_order` invariant: a batch's
/// deletes were once sent side by side, so when one failed the later messages of its
/// session were deleted all the same, and the failed one came back to be completed after
/// them. They go one after another now, and stop at the first that fails.
async fn ack_fails_mid_batch(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    for text in ["one", "two", "three"] {
        w.say(&agent, text, SignalMeta::default()).await;
    }
    let queue = AckFailsOnce {
        inner: w.b.queue.clone(),
        n: 2,
        acks: Default::default(),
        received: Default::default(),
    };
    let r = w
        .worker
        .poll_once(&queue, 10, Duration::from_secs(60))
        .await;
    assert!(r.is_err(), "the failed delete is reported: {r:?}");
    // The first was deleted; the second's delete failed; the third was not tried.
    assert_eq!(queue.acks.load(std::sync::atomic::Ordering::SeqCst), 2);
    let left = w.b.queue.backlog().await.unwrap();
    assert_eq!(left.waiting + left.in_flight, 2, "{left:?}");
    // Their visibility runs out: they come back and are completed, with no second turn.
    let turns = w.b.store.list_turns(&agent.id, 10).await.unwrap().len();
    let received = std::mem::take(&mut *queue.received.lock().unwrap());
    assert_eq!(received.len(), 3, "one batch of three");
    for receipt in &received[1..] {
        w.b.queue.release(receipt, Duration::ZERO).await.unwrap();
    }
    w.b.drain(&w.worker).await;
    let left = w.b.queue.backlog().await.unwrap();
    assert_eq!(left.waiting + left.in_flight, 0, "{left:?}");
    assert_eq!(
        w.b.store.list_turns(&agent.id, 10).await.unwrap().len(),
        turns
    );
}

on_both_backends!(
    a_model_down_for_ten_minutes_keeps_the_turn_waiting_and_answers_it_once_when_back,
    model_outage
);
/// A past defect: with the model answering 500 for about 40 s, a turn was tried five
/// times, dead-lettered, and the person's message was gone. Now the turn waits (kept in
/// the store, nothing dead-lettered), is tried again with growing gaps by the sweep, a
/// newer message joins it, and one reply answers both once the model is back.
async fn model_outage(kind: Kind) {
    let w = world(kind).await;
    // Its heartbeats think only on events: the model's answers are the turn's.
    let agent = w
        .agent(|a| a.think = pulse_shared::domain::ThinkPolicy::Events)
        .await;
    w.llm.down(Some(500));
    let first = w.say(&agent, "are you there?", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    let waiting = w.b.store.list_waiting(10).await.unwrap();
    assert_eq!(waiting.len(), 1, "the turn waits");
    assert_eq!(waiting[0].attempts, 1);
    assert!(waiting[0].reason.contains("500"), "{}", waiting[0].reason);
    assert_eq!(w.b.queue.backlog().await.unwrap().waiting, 0);
    // The person's message is in the conversation at once, marked waiting.
    let shown = pulse_shared::engine::history(w.b.store.as_ref(), &agent.id, 10)
        .await
        .unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(
        (shown[0].content.as_str(), shown[0].waiting),
        ("are you there?", true)
    );

    // Ten minutes of outage, a sweep a minute: tried again after 30 s, 1, 2 and 4 min.
    let sweeper = w.b.sweeper(settings());
    for _ in 0..10 {
        w.b.advance(SignedDuration::from_mins(1));
        let swept = sweeper.sweep_once(w.b.now()).await;
        assert!(swept.errors.is_empty(), "{:?}", swept.errors);
        w.b.drain(&w.worker).await;
    }
    let waiting = w.b.store.list_waiting(10).await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].attempts, 5, "tried at 0, 1, 2, 4 and 8 min");
    // No reply while it is down; told once, at the second try, that it is delayed.
    let notice = "The model I think with is not answering right now. I have your message, and I will reply as soon as it is back.";
    let posted: Vec<_> = w.discord.messages();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(
        (posted[0].place.as_str(), posted[0].content.as_str()),
        ("channel:1001", notice)
    );
    // `pulse status` says a turn waits on the model, since when, and why.
    let status = || async {
        pulse_shared::engine::status(
            w.b.store.as_ref(),
            w.b.queue.as_ref(),
            None,
            w.b.now(),
            SignedDuration::from_mins(10),
            "",
        )
        .await
        .unwrap()
    };
    let s = status().await;
    assert_eq!(s.turns_waiting, 1);
    let what: Vec<&str> = s.findings.iter().map(|f| f.what.as_str()).collect();
    assert!(
        what.iter().any(|w| w
            .starts_with("1 conversation turn waiting on the model, the oldest for 10m")
            && w.contains("500")),
        "{what:?}"
    );
    // A newer message joins the waiting turn.
    let second = w.say(&agent, "hello?", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    let waiting = w.b.store.list_waiting(10).await.unwrap();
    assert_eq!(waiting[0].signals.len(), 2);
    assert_eq!(waiting[0].attempts, 6);

    // The model is back: the next try answers both, once.
    w.llm.down(None);
    w.llm.script([Scripted::text("Here now.")]);
    for _ in 0..16 {
        if w.b.store.list_waiting(10).await.unwrap().is_empty() {
            break;
        }
        w.b.advance(SignedDuration::from_mins(1));
        sweeper.sweep_once(w.b.now()).await;
        w.b.drain(&w.worker).await;
    }
    assert!(w.b.store.list_waiting(10).await.unwrap().is_empty());
    assert_eq!(status().await.turns_waiting, 0);
    let posted: Vec<String> = w
        .discord
        .messages()
        .into_iter()
        .map(|p| p.content)
        .collect();
    assert_eq!(posted, [notice, "Here now."]);
    let last = w.llm.requests().len() - 1;
    let said = w.said(last);
    assert!(
        said.contains("are you there?") && said.contains("hello?"),
        "{said}"
    );
    let answered =
        w.b.store
            .answered(&agent.id, &[first.id.clone(), second.id.clone()])
            .await
            .unwrap();
    assert_eq!(answered.len(), 2);
    assert_eq!(answered[0].1, answered[1].1, "one turn answered both");
    let shown: Vec<(String, bool)> =
        pulse_shared::engine::history(w.b.store.as_ref(), &agent.id, 10)
            .await
            .unwrap()
            .into_iter()
            .rev()
            .map(|m| (m.content, m.waiting))
            .collect();
    assert_eq!(
        shown,
        [
            ("are you there?".to_owned(), false),
            ("hello?".to_owned(), false),
            ("Here now.".to_owned(), false)
        ]
    );
    // More sweeps find nothing to try, and nothing was dead-lettered.
    w.b.advance(SignedDuration::from_mins(30));
    assert_eq!(sweeper.sweep_once(w.b.now()).await.retried, 0);
    w.b.drain(&w.worker).await;
    let backlog = w.b.queue.backlog().await.unwrap();
    assert_eq!((backlog.waiting, backlog.dead.unwrap_or(0)), (0, 0));
    assert_eq!(w.discord.messages().len(), 2);
}

on_both_backends!(
    a_turn_that_waited_past_its_patience_is_answered_once_with_an_apology,
    patience
);
async fn patience(kind: Kind) {
    let w = world_with(
        kind,
        pulse_shared::engine::EngineSettings {
            turn_patience: SignedDuration::from_mins(5),
            ..settings()
        },
    )
    .await;
    let agent = w
        .agent(|a| a.think = pulse_shared::domain::ThinkPolicy::Events)
        .await;
    w.llm.down(Some(503));
    let said = w.say(&agent, "are you there?", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    let sweeper = w.b.sweeper(settings());
    for _ in 0..8 {
        w.b.advance(SignedDuration::from_mins(1));
        sweeper.sweep_once(w.b.now()).await;
        w.b.drain(&w.worker).await;
    }
    // Tried at 0, 1, 2 and 4 min (told at the second that it is delayed); the try at
    // 8 min is past the five minutes.
    assert!(w.b.store.list_waiting(10).await.unwrap().is_empty());
    let posted: Vec<String> = w
        .discord
        .messages()
        .into_iter()
        .map(|p| p.content)
        .collect();
    assert_eq!(posted.len(), 2, "{posted:?}");
    assert!(
        posted[0].starts_with("The model I think with is not answering"),
        "{posted:?}"
    );
    assert!(
        posted[1].starts_with("I could not answer this"),
        "{posted:?}"
    );
    let turns = w.b.store.answered(&agent.id, &[said.id]).await.unwrap();
    let turn =
        w.b.store
            .get_turn(&agent.id, &turns[0].1)
            .await
            .unwrap()
            .unwrap();
    assert!(
        turn.error
            .as_deref()
            .unwrap_or("")
            .contains("did not answer"),
        "{:?}",
        turn.error
    );
}

/// A turn answered from Anthropic's prompt cache: its usage keeps the cached parts, and
/// `pulse usage` prices each at its rate and says what the cache saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_prompt_is_recorded_by_its_parts_and_priced_so() {
    let w = world(Kind::Sqlite).await;
    let agent = w
        .agent(|a| {
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
        })
        .await;
    w.llm.script([Scripted::Raw(json!({
        "id": "msg_cached", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Hello again."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 40, "cache_creation_input_tokens": 1_000,
                  "cache_read_input_tokens": 6_000, "output_tokens": 9}
    }))]);
    w.say(&agent, "hi", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    // The request marked the prefix to cache.
    let req = &w.llm.requests()[0].body;
    assert_eq!(req["system"][0]["cache_control"]["type"], "ephemeral");
    let turn = w.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    assert_eq!(turn.usage.input_tokens, 7_040);
    assert_eq!(turn.usage.cache_read_tokens, 6_000);
    assert_eq!(turn.usage.cache_write_tokens, 1_000);
    let since = w.b.now() - jiff::SignedDuration::from_hours(1);
    let report = pulse_shared::engine::usage(
        w.b.store.as_ref(),
        &agent,
        since,
        &pulse_shared::engine::Prices::default(),
    )
    .await
    .unwrap();
    let row = &report.models[0];
    assert_eq!(
        (
            row.input_tokens,
            row.cache_read_tokens,
            row.cache_write_tokens
        ),
        (7_040, 6_000, 1_000)
    );
    // 40 plain at $3, 6,000 read at $0.30, 1,000 written at $3.75, 9 out at $15 (per
    // million); saved: 6,000 at $2.70 less the writes' premium, 1,000 at $0.75.
    let cost = row.cost_usd.unwrap();
    assert!((cost - 0.005_805).abs() < 1e-9, "{cost}");
    let saved = row.saved_usd.unwrap();
    assert!((saved - 0.015_45).abs() < 1e-9, "{saved}");
    // The cost is kept with the turn at that day's prices: a later table does not
    // rewrite it.
    assert_eq!(
        turn.cost_usd,
        Some(pulse_shared::domain::Usd::from_micros(5_805))
    );
    let dearer = pulse_shared::engine::Prices::with_overrides(
        r#"{"models": {"claude-sonnet-4-5": {"input": 300, "output": 1500}}}"#,
    )
    .unwrap();
    let later = pulse_shared::engine::usage(w.b.store.as_ref(), &agent, since, &dearer)
        .await
        .unwrap();
    assert!((later.models[0].cost_usd.unwrap() - 0.005_805).abs() < 1e-9);
    let listed = pulse_shared::engine::records(w.b.store.as_ref(), &agent, since)
        .await
        .unwrap()
        .calls;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].source, listed[0].id.as_str()),
        ("turns", turn.id.as_str())
    );
    assert_eq!(listed[0].cost_usd, turn.cost_usd);
}

/// The prompt a request asks Anthropic to cache: its tools, its system prompt, and its
/// messages' blocks up to the last one that carries a breakpoint, as JSON text.
fn cached_prefix(body: &serde_json::Value) -> String {
    let mut blocks = Vec::new();
    let mut last = 0;
    for m in body["messages"].as_array().unwrap() {
        for b in m["content"].as_array().unwrap() {
            blocks.push(json!({"role": m["role"], "block": b}));
            if b.get("cache_control").is_some() {
                last = blocks.len();
            }
        }
    }
    blocks.truncate(last);
    json!({"tools": body["tools"], "system": body["system"], "messages": blocks}).to_string()
}

/// Two heartbeats and a conversation turn of one agent send the same bytes first — the
/// tools, the system prompt, the conversation so far — up to the breakpoint at the end
/// of the history, so each call reads what the one before it cached; what is new to a
/// call (the heartbeat's briefing, the turn's message) comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_turns_send_one_byte_identical_prefix_up_to_the_breakpoint() {
    let w = world(Kind::Sqlite).await;
    let agent = w
        .agent(|a| {
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
            a.llm.model = Some("claude-sonnet-4-5".into());
            a.instructions = Some("Check on the report.".into());
        })
        .await;
    w.llm.script([Scripted::text("Good luck with it.")]);
    w.say(&agent, "my report is due Friday", SignalMeta::default())
        .await;
    w.b.drain(&w.worker).await;
    w.llm.script([Scripted::text("Nothing to say yet.")]);
    w.b.advance(SignedDuration::from_mins(11));
    assert_eq!(w.beat().await, 1, "the first heartbeat");
    w.b.advance(SignedDuration::from_mins(11));
    w.llm.script([Scripted::text("Still nothing.")]);
    assert_eq!(w.beat().await, 1, "the second heartbeat");
    w.llm.script([Scripted::text("All quiet.")]);
    w.say(&agent, "anything new?", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;

    let reqs = w.llm.requests();
    assert_eq!(reqs.len(), 4, "a turn, two heartbeats, a turn");
    let prefixes: Vec<String> = reqs[1..].iter().map(|r| cached_prefix(&r.body)).collect();
    assert_eq!(prefixes[0], prefixes[1], "two heartbeats");
    assert_eq!(prefixes[0], prefixes[2], "a heartbeat and a turn");
    assert!(
        prefixes[0].contains("my report is due Friday")
            && prefixes[0].contains("Good luck with it."),
        "the history is in it: {}",
        prefixes[0]
    );
    for r in &reqs[1..] {
        // One set of tools, the heartbeat's among them, in one order.
        let tools: Vec<&str> = r.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            tools,
            ["speak", "remember", "recall", "emit_event", "schedule"]
        );
        // The agent wakes every 10 minutes: the prefix is kept an hour.
        assert_eq!(
            r.body["system"][0]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"})
        );
        let marked = r.body.to_string().matches("cache_control").count();
        assert_eq!(marked, 3, "the tools, the system prompt, the history");
    }
    // After the prefix: each heartbeat's briefing, and the turn's own message.
    let after = |n: usize| {
        let body = &reqs[n].body;
        let all = body["messages"].to_string();
        let last = body["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .to_string();
        assert!(all.ends_with(&format!("{last}]")));
        last
    };
    assert!(after(1).contains("Heartbeat: you woke on your own schedule"));
    assert!(after(1).contains("Check on the report."));
    assert!(after(3).contains("anything new?") && !after(3).contains("Heartbeat:"));
    // The first turn had no history: only the tools and the system prompt were marked.
    assert_eq!(reqs[0].body.to_string().matches("cache_control").count(), 2);
}

on_both_backends!(
    a_beat_with_nothing_to_do_keeps_the_prompt_cache_warm_once_before_it_lapses,
    warm_up
);
/// An agent at 15 minutes that thinks on events: a beat that thinks writes the prefix
/// for an hour; the idle beat 45 minutes later, the last before it would lapse, makes one
/// small call with the same prefix and one token of answer; the next thinking beat,
/// an hour and a quarter after the first, reads the same prefix again. One warm-up per
/// call, recorded as a beat with nothing to do and counted in the agent's usage; with
/// `PULSE_CACHE_WARM=off`, none.
async fn warm_up(kind: Kind) {
    for keep_warm in [true, false] {
        let mut with = settings();
        with.keep_cache_warm = keep_warm;
        let w = world_with(kind, with).await;
        let agent = w
            .agent(|a| {
                a.llm.provider = Some(ProviderKind::Anthropic);
                a.llm.base_url = Some(w.llm.url().parse().unwrap());
                a.llm.model = Some("claude-sonnet-4-5".into());
                a.interval = "15m".parse().unwrap();
                a.think = pulse_shared::domain::ThinkPolicy::Events;
            })
            .await;
        let event = |n: u32| {
            pulse_shared::domain::NewEvent::new("NOTE", json!({"n": n}), None)
                .unwrap()
                .into_event(agent.id.clone(), "test", w.b.now())
        };
        w.llm.script([Scripted::text("Noted.")]);
        w.say(&agent, "my report is due Friday", SignalMeta::default())
            .await;
        w.b.drain(&w.worker).await;
        w.b.store.append(&event(1)).await.unwrap();
        w.b.advance(SignedDuration::from_mins(16));
        w.llm.script([Scripted::text("Nothing to say about it.")]);
        assert_eq!(w.beat().await, 1, "the first heartbeat");
        assert_eq!(w.llm.requests().len(), 2, "a turn, a thinking beat");
        // Three idle beats; the third is the last before the hour's cache lapses.
        for _ in 0..4 {
            w.b.advance(SignedDuration::from_secs(15 * 60 + 1));
            assert_eq!(w.beat().await, 1);
        }
        let reqs = w.llm.requests();
        if !keep_warm {
            assert_eq!(reqs.len(), 2, "nothing is kept warm");
            continue;
        }
        assert_eq!(reqs.len(), 3, "one warm-up in four idle beats");
        let warm = &reqs[2].body;
        assert_eq!(warm["max_tokens"], 1);
        assert_eq!(cached_prefix(warm), cached_prefix(&reqs[1].body));
        assert_eq!(
            warm["system"][0]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"})
        );
        let last = warm["messages"].as_array().unwrap().last().unwrap();
        assert!(
            last.to_string().contains(
                pulse_shared::engine::prompt::WARM_UP_LINE
                    .split(':')
                    .next()
                    .unwrap()
            ),
            "{last}"
        );
        let beats = w.b.store.list_heartbeats(&agent.id, 10).await.unwrap();
        let warmed: Vec<_> = beats
            .iter()
            .filter_map(|h| h.outcome.as_ref())
            .filter(|o| o.reason.contains("kept warm"))
            .collect();
        assert_eq!(warmed.len(), 1, "{beats:#?}");
        assert_eq!(
            warmed[0].kind,
            pulse_shared::domain::OutcomeKind::NothingToDo
        );
        // The next beat that thinks, an hour and a quarter after the first, sends the
        // same prefix and asks for an hour again: its last call was in reach.
        w.b.store.append(&event(2)).await.unwrap();
        w.llm.script([Scripted::text("Still nothing.")]);
        w.b.advance(SignedDuration::from_secs(15 * 60 + 1));
        assert_eq!(w.beat().await, 1);
        let reqs = w.llm.requests();
        assert_eq!(reqs.len(), 4);
        assert_eq!(cached_prefix(&reqs[3].body), cached_prefix(warm));
        assert_eq!(
            reqs[3].body["system"][0]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"})
        );
        // The warm-up is in the agent's usage, as a heartbeat's call.
        let records =
            pulse_shared::engine::records(w.b.store.as_ref(), &agent, jiff::Timestamp::UNIX_EPOCH)
                .await
                .unwrap();
        let beat_calls: u64 = records
            .calls
            .iter()
            .filter(|c| c.source == "heartbeats")
            .map(|c| c.calls)
            .sum();
        assert_eq!(beat_calls, 3, "two thinking beats and a warm-up");
    }
}

/// Every request Pulse sends to Anthropic — a turn with a tool loop, a heartbeat with
/// one, their breakpoints and lifetimes, the last step's tools turned off — is of the
/// anthropic SDK's own request types, checked by `scripts/check_anthropic.py` with the
/// SDK installed; the same check refuses a body with a lifetime the API does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_anthropic_request_is_of_the_anthropic_sdk_s_types() {
    let w = world(Kind::Sqlite).await;
    let agent = w
        .agent(|a| {
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
            a.llm.model = Some("claude-sonnet-4-5".into());
            a.instructions = Some("Be brief.\n\n## Report (every 1h)\nCheck on the report.".into());
            // Two steps at most: the second is sent with its tools turned off.
            a.budgets.max_steps = 2;
        })
        .await;
    w.llm.script([
        Scripted::tool("remember", json!({"text": "the report is due Friday"})),
        Scripted::text("Noted."),
    ]);
    w.say(
        &agent,
        "please remember: my report is due Friday",
        SignalMeta::default(),
    )
    .await;
    w.b.drain(&w.worker).await;
    w.b.advance(SignedDuration::from_mins(11));
    w.llm.script([
        Scripted::tool("recall", json!({"query": "report"})),
        Scripted::text("Nothing to say yet."),
    ]);
    assert_eq!(w.beat().await, 1, "the heartbeat");
    let bodies: Vec<serde_json::Value> = w.llm.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), 4, "two steps of a turn, two of a heartbeat");
    assert!(
        bodies
            .iter()
            .any(|b| b["tool_choice"] == json!({"type": "none"})),
        "a last step with its tools off is among them"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bodies.json");
    std::fs::write(&file, serde_json::to_vec(&bodies).unwrap()).unwrap();
    let out = pulse_tests::python_script("check_anthropic.py", &[&file]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let marks: usize = bodies
        .iter()
        .map(|b| b.to_string().matches("cache_control").count())
        .sum();
    assert!(
        said.contains(&format!("4 bodies, {marks} breakpoints")),
        "{said}"
    );
    // The check can fail: a lifetime the API does not have is refused, by name.
    let mut wrong = bodies.clone();
    wrong[0]["system"][0]["cache_control"]["ttl"] = json!("2h");
    std::fs::write(&file, serde_json::to_vec(&wrong).unwrap()).unwrap();
    let out = pulse_tests::python_script("check_anthropic.py", &[&file]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("body 0.system[0].cache_control") && err.contains("'5m' or '1h'"),
        "{err}"
    );
}

/// An agent whose heartbeats think with a cheaper model: its beats ask that one, its
/// turns the chat model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_think_with_the_heartbeat_model_and_turns_talk_with_the_chat_model() {
    let w = world(Kind::Sqlite).await;
    let agent = w
        .agent(|a| {
            a.llm.provider = Some(ProviderKind::Anthropic);
            a.llm.base_url = Some(w.llm.url().parse().unwrap());
            a.llm.model = Some("claude-sonnet-4-5".into());
            a.llm.heartbeat_model = Some("claude-haiku-4-5".into());
        })
        .await;
    w.llm.script([Scripted::text("nothing to say")]);
    w.beat().await;
    w.llm.script([Scripted::text("hello")]);
    w.say(&agent, "hi", SignalMeta::default()).await;
    w.b.drain(&w.worker).await;
    let models: Vec<String> = w
        .llm
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(models, ["claude-haiku-4-5", "claude-sonnet-4-5"]);
}
