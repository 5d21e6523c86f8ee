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
    let telegram = FakeTelegram::start().await;
    let client = telegram.client();
    let (agent, _) = NewAgent::named("wren")
        .create(jiff::Timestamp::now())
        .unwrap();
    let approval = parked(&agent, jiff::Timestamp::now());
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

/// The webhook's secret token in these tests.
const SECRET: &str = "a-webhook-secret_0123456789";

impl World {
    /// The receiver of this world, taking Telegram's updates with [`SECRET`]: its base.
    async fn receiver(&self) -> String {
        let inbound = pulse_shared::http::Inbound::new(
            self.b.store.clone(),
            self.b.queue.clone(),
            self.b.clock.clone(),
            pulse_shared::config::InboundConfig {
                telegram_secret: Some(pulse_shared::domain::Secret::new(SECRET)),
                delivery_memory: pulse_shared::config::InboundConfig::DEFAULT_DELIVERY_MEMORY,
                ..Default::default()
            },
        );
        pulse_tests::serve_inbound(Arc::new(inbound)).await
    }
}

/// Posts `update` to the receiver at `base` with `secret`: the status and the answer.
async fn push(
    base: &str,
    secret: Option<&str>,
    update: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/telegram/webhook"))
        .json(update);
    if let Some(s) = secret {
        req = req.header("X-Telegram-Bot-Api-Secret-Token", s);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// An update as Telegram sends it: message `id` in `chat` from `user` saying `text`.
fn update(
    update_id: i64,
    chat: i64,
    kind: &str,
    user: i64,
    id: i64,
    text: &str,
) -> serde_json::Value {
    serde_json::json!({
        "update_id": update_id,
        "message": {
            "message_id": id,
            "from": {"id": user, "is_bot": false, "first_name": "Ana", "username": "ana"},
            "chat": {"id": chat, "type": kind},
            "date": 1_700_000_000,
            "text": text,
        }
    })
}

on_both_backends!(
    a_telegram_update_is_answered_once_in_its_chat_and_a_wrong_secret_or_a_stranger_gets_nothing,
    webhook
);
async fn webhook(kind: Kind) {
    let w = world(kind).await;
    w.agent(|_| {}).await;
    let base = w.receiver().await;
    let hello = update(1, 777, "private", 777, 10, "hello there");

    // Without the secret, or with another one: refused, nothing queued.
    for secret in [None, Some("another-secret")] {
        let (status, answer) = push(&base, secret, &hello).await;
        assert_eq!(status, 401, "{answer}");
        assert!(answer["error"].as_str().unwrap().contains("secret token"));
    }
    assert_eq!(w.b.drain(&w.worker).await, 0);

    // Sent twice (Telegram did not see the first answer): answered once.
    w.llm.script([Scripted::text("Hello, Ana.")]);
    for _ in 0..2 {
        let (status, _) = push(&base, Some(SECRET), &hello).await;
        assert_eq!(status, 200);
    }
    w.b.drain(&w.worker).await;
    let sent = w.telegram.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!((sent[0].chat.as_str(), sent[0].reply_to), ("777", Some(10)));
    assert_eq!(sent[0].text, "Hello, Ana.");
    assert_eq!(w.llm.requests().len(), 1);

    // A stranger, and a group no agent is in: taken, never answered.
    let (status, _) = push(
        &base,
        Some(SECRET),
        &update(2, 555, "private", 555, 11, "hi"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = push(
        &base,
        Some(SECRET),
        &update(3, -100, "supergroup", 777, 12, "hi"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(w.b.drain(&w.worker).await, 0);
    assert_eq!(w.telegram.sent().len(), 1);

    // A voice note with no text: the agent is told what arrived, and reads the envelope.
    let voice = voice_note(4, 13);
    w.llm.script([Scripted::text("I cannot listen yet.")]);
    push(&base, Some(SECRET), &voice).await;
    w.b.drain(&w.worker).await;
    let said: String = w.llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(said.contains("(no text; a voice note of 7 s)"), "{said}");
    assert!(
        said.contains("telegram envelope") && said.contains("audio/ogg"),
        "{said}"
    );
}

on_both_backends!(
    in_a_group_the_agent_answers_when_addressed_and_only_its_users_steer_it,
    group
);
async fn group(kind: Kind) {
    let w = world(kind).await;
    let agent = w.agent(|a| a.telegram.chat = Some("-1009".into())).await;
    let base = w.receiver().await;
    // Not addressed: not answered. Addressed (a mention of the bot): answered there.
    push(
        &base,
        Some(SECRET),
        &update(1, -1009, "supergroup", 888, 20, "lunch?"),
    )
    .await;
    assert_eq!(w.b.drain(&w.worker).await, 0);
    w.llm.script([Scripted::text("All quiet.")]);
    push(&base, Some(SECRET), &mention(2, 21)).await;
    w.b.drain(&w.worker).await;
    assert_eq!(w.telegram.sent().last().unwrap().chat, "-1009");

    // A steering command from someone it does not let in: refused, nothing changes.
    let mut command = snooze(3, 22);
    push(&base, Some(SECRET), &command).await;
    w.b.drain(&w.worker).await;
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert!(stored.snoozed_until.is_none());
    assert!(
        w.telegram.sent().last().unwrap().text.contains("owner"),
        "{:?}",
        w.telegram.sent()
    );
    // From its user: done.
    command["message"]["from"]["id"] = serde_json::json!(777);
    command["message"]["message_id"] = serde_json::json!(23);
    push(&base, Some(SECRET), &command).await;
    w.b.drain(&w.worker).await;
    let stored = w.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert!(stored.snoozed_until.is_some(), "{:?}", w.telegram.sent());
    assert_eq!(
        w.llm.requests().len(),
        1,
        "commands are answered without the model"
    );
}

/// A call of `agent`'s parked for approval at `now`, open for a day.
pub(crate) fn parked(agent: &Agent, now: jiff::Timestamp) -> pulse_shared::domain::Approval {
    use pulse_shared::domain::{Approval, ApprovalId, ApprovalStatus, ToolName, schema_digest};
    Approval {
        id: ApprovalId::derived(now.as_millisecond() as u64, "k"),
        agent_id: agent.id.clone(),
        server: ToolName::parse("cal").unwrap(),
        tool: "send_mail".into(),
        model_name: "cal__send_mail".into(),
        arguments: serde_json::json!({"to": "ana@example.com", "body": "*not* <markup>"}),
        key: "k".into(),
        at_ms: now.as_millisecond() as u64,
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
    }
}

on_both_backends!(
    an_approval_button_pressed_on_telegram_decides_it_once_and_only_for_its_users,
    press
);
async fn press(kind: Kind) {
    use pulse_shared::domain::ApprovalStatus;
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    let approval = parked(&agent, w.b.now());
    w.b.store.park_approval(&approval).await.unwrap();
    let base = w.receiver().await;
    let status = || async {
        w.b.store
            .get_approval(&agent.id, &approval.id)
            .await
            .unwrap()
            .unwrap()
            .status
    };
    // A stranger's press: refused, in the webhook's answer to the press.
    let (code, answer) = push(&base, Some(SECRET), &tap(555, approval.short_button(true))).await;
    assert_eq!(code, 200);
    assert_eq!(answer["method"], "answerCallbackQuery");
    assert_eq!(answer["callback_query_id"], "cb555");
    assert!(
        answer["text"].as_str().unwrap().contains("owner"),
        "{answer}"
    );
    assert_eq!(status().await, ApprovalStatus::Pending);
    // Its user denies; a later approve does not undo it.
    let (_, answer) = push(&base, Some(SECRET), &tap(777, approval.short_button(false))).await;
    assert!(
        answer["text"].as_str().unwrap().starts_with("Denied"),
        "{answer}"
    );
    assert_eq!(status().await, ApprovalStatus::Denied);
    let (_, answer) = push(&base, Some(SECRET), &tap(777, approval.short_button(true))).await;
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("first decision stands"),
        "{answer}"
    );
    let decided =
        w.b.store
            .get_approval(&agent.id, &approval.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(decided.status, ApprovalStatus::Denied);
    assert_eq!(decided.decided_by.as_deref(), Some("telegram 777"));
}

/// A voice note with no text from user 777, privately.
fn voice_note(update_id: i64, id: i64) -> serde_json::Value {
    let mut voice = update(update_id, 777, "private", 777, id, "");
    let m = voice["message"].as_object_mut().unwrap();
    m.remove("text");
    m.insert(
        "voice".into(),
        serde_json::json!({"duration": 7, "mime_type": "audio/ogg", "file_id": "AwAD", "file_unique_id": "u", "file_size": 9000}),
    );
    voice
}

/// User 888 mentioning the bot in group -1009.
fn mention(update_id: i64, id: i64) -> serde_json::Value {
    let mut u = update(
        update_id,
        -1009,
        "supergroup",
        888,
        id,
        "@pulse_bot what's up?",
    );
    u["message"]["entities"] = serde_json::json!([{"type": "mention", "offset": 0, "length": 10}]);
    u
}

/// User 888's `/snooze@pulse_bot 2h` in group -1009.
fn snooze(update_id: i64, id: i64) -> serde_json::Value {
    let mut u = update(
        update_id,
        -1009,
        "supergroup",
        888,
        id,
        "/snooze@pulse_bot 2h",
    );
    u["message"]["entities"] =
        serde_json::json!([{"type": "bot_command", "offset": 0, "length": 17}]);
    u
}

/// `user`'s press of a button carrying `data`.
fn tap(user: i64, data: String) -> serde_json::Value {
    serde_json::json!({"update_id": 9, "callback_query": {
        "id": format!("cb{user}"),
        "from": {"id": user, "is_bot": false, "first_name": "X"},
        "chat_instance": "1",
        "data": data,
        "message": {"message_id": 1, "chat": {"id": 777, "type": "private"}, "date": 1_700_000_000},
    }})
}

/// The updates these tests send are Telegram's own: python-telegram-bot reads each
/// whole; and the check fails on one that is not.
#[test]
fn the_updates_these_tests_send_are_telegrams_own() {
    let check = |updates: &[serde_json::Value]| {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), serde_json::to_vec(updates).unwrap()).unwrap();
        pulse_tests::python_script("check_telegram.py", &[file.path()])
    };
    let updates = [
        update(1, 777, "private", 777, 10, "hello there"),
        voice_note(2, 11),
        mention(3, 12),
        snooze(4, 13),
        tap(777, "a:y:01ABC:01DEF".into()),
    ];
    let out = check(&updates);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.starts_with("5 updates"), "{said}");
    let mut wrong = update(5, 777, "private", 777, 14, "hi");
    wrong["message"]["txt"] = serde_json::json!("a key Telegram does not send");
    let out = check(&[wrong]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("txt"));
}
