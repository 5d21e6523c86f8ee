//! Telegram as a channel: replies through the real client against a fake Bot API on
//! loopback, driven by the real worker over both backends.

use std::sync::Arc;

use jiff::SignedDuration;
use pulse_shared::app::Services;
use pulse_shared::domain::{
    Agent, NewAgent, ReplyTarget, Signal, SignalMeta, TurnId, TurnStatus, UndeliveredState,
};
use pulse_shared::engine::{Worker, intake};
use pulse_shared::ports::Channel;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::fake_telegram::{FakeTelegram, TOKEN};
use pulse_tests::{Backend, Kind, on_both_backends, settings};

struct World {
    b: Backend,
    llm: FakeLlm,
    discord: FakeDiscord,
    telegram: FakeTelegram,
    worker: Worker,
}

async fn world(kind: Kind) -> World {
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let telegram = FakeTelegram::start().await;
    let services = Services {
        chats: vec![Arc::new(telegram.client())],
        ..pulse_tests::fake_services(&llm, &discord)
    };
    let worker = b
        .connected()
        .worker(b.clock.clone(), &settings(), &services);
    World {
        b,
        llm,
        discord,
        telegram,
        worker,
    }
}

impl World {
    async fn agent(&self, f: impl FnOnce(&mut NewAgent)) -> Agent {
        let mut new = NewAgent::named(self.b.next_name("wren").await);
        new.interval = "10m".parse().unwrap();
        new.telegram.users = vec!["777".into()];
        f(&mut new);
        let (agent, first) = new.create(self.b.now()).unwrap();
        self.b.store.create_agent(&agent, &first).await.unwrap();
        agent
    }

    /// A message from Telegram user 777 in `chat`, message 10 of that chat.
    async fn telegram_says(&self, agent: &Agent, chat: &str, thread: Option<&str>) -> Signal {
        let meta = SignalMeta {
            source: Some("telegram".into()),
            user_id: Some("777".into()),
            user_name: Some("ana".into()),
            channel_id: Some(chat.into()),
            message_id: Some("10".into()),
            thread: thread.map(str::to_owned),
            ..SignalMeta::default()
        };
        let s =
            Signal::user_message(&agent.id, &agent.session, "hello", meta, self.b.now()).unwrap();
        intake::submit(self.b.store.as_ref(), self.b.queue.as_ref(), s.clone())
            .await
            .unwrap();
        self.b.advance(SignedDuration::from_millis(10));
        s
    }

    async fn turn(&self, agent: &Agent, s: &Signal) -> pulse_shared::domain::Turn {
        self.b
            .store
            .get_turn(&agent.id, &TurnId::for_signal(&s.id))
            .await
            .unwrap()
            .unwrap()
    }
}

on_both_backends!(
    a_telegram_message_is_answered_in_its_chat_and_thread_and_a_long_reply_split_to_fit,
    answered_in_its_chat
);
async fn answered_in_its_chat(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    // 5,000 characters, a third of them emoji (two UTF-16 code units each).
    let long: String = "🙂 ab".repeat(1_250);
    w.llm.script([Scripted::text(&long)]);
    let s = w.telegram_says(&agent, "-1001", Some("5")).await;
    w.b.drain(&w.worker).await;

    let sent = w.telegram.sent();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(
        sent.iter()
            .all(|m| m.chat == "-1001" && m.thread == Some(5))
    );
    assert_eq!(
        sent[0].reply_to,
        Some(10),
        "the first part answers the message"
    );
    assert!(sent[1..].iter().all(|m| m.reply_to.is_none()));
    let words = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(
        words(
            &sent
                .iter()
                .map(|m| m.text.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        ),
        words(&long),
        "nothing lost at the cuts"
    );
    let t = w.turn(&agent, &s).await;
    assert_eq!(t.status, TurnStatus::Done);
    assert_eq!(t.discord_message_ids, ["-1001/1", "-1001/2", "-1001/3"]);
    match &t.target {
        ReplyTarget::Chat(c) => {
            assert_eq!((c.chat.as_str(), c.thread.as_deref()), ("-1001", Some("5")))
        }
        other => panic!("{other:?}"),
    }
    assert!(w.discord.messages().is_empty(), "nothing went to Discord");
    // Every call carried the bot's token, and "typing…" showed in the thread first.
    let requests = w.telegram.requests();
    assert!(requests.iter().all(|r| r.token == TOKEN));
    assert_eq!(requests[0].method, "sendChatAction");
    assert_eq!(requests[0].body["message_thread_id"], 5);
}

on_both_backends!(
    a_message_from_elsewhere_goes_to_the_agents_telegram_home_when_it_has_no_discord_one,
    telegram_home
);
async fn telegram_home(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|a| a.telegram.chat = Some("-100500".into())).await;
    w.llm
        .script([Scripted::text("From the CLI, to the group.")]);
    let meta = SignalMeta {
        source: Some("cli".into()),
        ..SignalMeta::default()
    };
    let s = Signal::user_message(&agent.id, &agent.session, "hi", meta, w.b.now()).unwrap();
    intake::submit(w.b.store.as_ref(), w.b.queue.as_ref(), s.clone())
        .await
        .unwrap();
    w.b.drain(&w.worker).await;
    let sent = w.telegram.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat, "-100500");
    assert_eq!(sent[0].reply_to, None);

    // Without a chat, its first user's private chat; with a Discord home, Discord.
    let quiet = w.agent(|_| {}).await;
    w.llm.script([Scripted::text("To you privately.")]);
    let meta = SignalMeta {
        source: Some("cli".into()),
        ..SignalMeta::default()
    };
    let s = Signal::user_message(&quiet.id, &quiet.session, "hi", meta, w.b.now()).unwrap();
    intake::submit(w.b.store.as_ref(), w.b.queue.as_ref(), s)
        .await
        .unwrap();
    w.b.drain(&w.worker).await;
    assert_eq!(w.telegram.sent()[1].chat, "777");
    let both = w.agent(|a| a.discord_channel = Some("1001".into())).await;
    w.llm.script([Scripted::text("Discord first.")]);
    let s = Signal::user_message(
        &both.id,
        &both.session,
        "hi",
        SignalMeta::default(),
        w.b.now(),
    )
    .unwrap();
    intake::submit(w.b.store.as_ref(), w.b.queue.as_ref(), s)
        .await
        .unwrap();
    w.b.drain(&w.worker).await;
    assert_eq!(w.telegram.sent().len(), 2);
    assert_eq!(w.discord.messages().len(), 1);
}

on_both_backends!(
    telegram_rate_limits_are_waited_out_and_a_refusal_kept_with_its_reason_never_the_token,
    refusals
);
async fn refusals(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    w.telegram.fail_next([429]);
    w.llm.script([Scripted::text("After the wait.")]);
    let s = w.telegram_says(&agent, "777", None).await;
    w.b.drain(&w.worker).await;
    assert_eq!(w.turn(&agent, &s).await.status, TurnStatus::Done);
    assert_eq!(w.telegram.sent().len(), 1);

    // Blocked by the user: kept, tried again later, and the session goes on.
    w.telegram.fail_next([403]);
    w.llm.script([Scripted::text("Blocked.")]);
    let s = w.telegram_says(&agent, "777", None).await;
    w.b.drain(&w.worker).await;
    assert_eq!(w.turn(&agent, &s).await.status, TurnStatus::Delivering);
    let kept = w.b.store.list_undelivered(10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].state, UndeliveredState::Retrying);
    assert_eq!(
        kept[0].reason,
        "Telegram did not take part 1: Telegram answered HTTP 403: Forbidden: bot was blocked by the user"
    );

    // A chat Telegram does not know: given up on at once.
    w.telegram.fail_next([400]);
    w.llm.script([Scripted::text("Nowhere.")]);
    let s = w.telegram_says(&agent, "999", None).await;
    w.b.drain(&w.worker).await;
    let t = w.turn(&agent, &s).await;
    assert_eq!(t.status, TurnStatus::Failed);
    assert!(
        t.error.as_deref().unwrap().contains("chat not found"),
        "{:?}",
        t.error
    );
    for u in w.b.store.list_undelivered(10).await.unwrap() {
        assert!(!u.reason.contains(TOKEN), "{}", u.reason);
    }
}

/// A Bot API that cannot be reached: the error says so without the URL, which holds
/// the token.
#[tokio::test]
async fn a_transport_error_never_shows_the_token() {
    use pulse_shared::telegram::{TelegramClient, TelegramConfig};
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let client = TelegramClient::new(TelegramConfig {
        api_base: base.parse().unwrap(),
        bot_token: Some(pulse_shared::domain::Secret::new(TOKEN)),
        max_attempts: 1,
        ..TelegramConfig::unconfigured()
    });
    let e = client
        .call(
            "sendMessage",
            serde_json::json!({"chat_id": 1, "text": "x"}),
        )
        .await
        .unwrap_err();
    let said = pulse_shared::error::chain(&e);
    assert!(
        said.starts_with("Telegram request failed: sendMessage: "),
        "{said}"
    );
    assert!(!said.contains("telegram-test-token"), "{said}");
    assert!(!e.hopeless(), "an outage passes");
    // A token Telegram refuses.
    let wrong = TelegramClient::new(TelegramConfig {
        bot_token: Some(pulse_shared::domain::Secret::new("1:wrong")),
        ..TelegramConfig {
            api_base: FakeTelegram::start().await.api_base().parse().unwrap(),
            ..TelegramConfig::unconfigured()
        }
    });
    let e = wrong
        .call(
            "sendMessage",
            serde_json::json!({"chat_id": 1, "text": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "Telegram answered HTTP 401: Unauthorized");
}

/// An approval asked on Telegram: its buttons' data fit Telegram's 64 bytes and name
/// the decision, the agent and the approval.
#[tokio::test]
async fn an_approval_is_asked_with_buttons_telegram_takes() {
    use pulse_shared::domain::{Approval, ApprovalId, ApprovalStatus, ToolName, schema_digest};
    let telegram = FakeTelegram::start().await;
    let client = telegram.client();
    let now = jiff::Timestamp::now();
    let (agent, _) = NewAgent::named("wren").create(now).unwrap();
    let approval = Approval {
        id: ApprovalId::derived(1_000, "k"),
        agent_id: agent.id.clone(),
        server: ToolName::parse("cal").unwrap(),
        tool: "send_mail".into(),
        model_name: "cal__send_mail".into(),
        arguments: serde_json::json!({"to": "ana@example.com", "body": "*not* <markup>"}),
        key: "k".into(),
        at_ms: 1_000,
        heartbeat_id: None,
        event_id: None,
        turn_id: None,
        step: 0,
        reason: Some("the user asked".into()),
        schema: schema_digest(&serde_json::json!({"type": "object"})),
        requested_at: now,
        expires_at: now + SignedDuration::from_hours(24),
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        decision_reason: None,
        outcome: None,
        asked_at: None,
    };
    let home = ReplyTarget::Chat(pulse_shared::domain::ChatTarget {
        channel: pulse_shared::domain::ChannelKind::Telegram,
        chat: "777".into(),
        thread: None,
        reply_to: None,
    });
    let id = client.ask_approval(&agent, &home, &approval).await.unwrap();
    assert_eq!(id, "777/1");
    let request = &telegram.requests()[0];
    assert!(request.body.get("parse_mode").is_none(), "plain text");
    let text = request.body["text"].as_str().unwrap();
    assert!(
        text.contains("cal/send_mail") && text.contains("*not* <markup>"),
        "{text}"
    );
    let row = &request.body["reply_markup"]["inline_keyboard"][0];
    for (button, approve) in [(&row[0], true), (&row[1], false)] {
        let data = button["callback_data"].as_str().unwrap();
        assert!(data.len() <= 64, "{data}");
        assert_eq!(
            pulse_shared::domain::parse_button(data),
            Some((approve, agent.id.clone(), approval.id.clone()))
        );
    }
}
