//! Slack as a channel: signed events and interactions through the real receiver, replies
//! through the real client and worker against a fake Web API on loopback, on both
//! backends.

use std::sync::Arc;

use jiff::SignedDuration;
use pulse_shared::app::Services;
use pulse_shared::domain::{Agent, NewAgent, UndeliveredState};
use pulse_shared::engine::Worker;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::fake_slack::{FakeSlack, Next, TOKEN};
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};

/// The app's signing secret in these tests.
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

struct World {
    b: Backend,
    llm: FakeLlm,
    slack: FakeSlack,
    worker: Worker,
    base: String,
}

async fn world(kind: Kind) -> World {
    let b = Backend::new(kind).await;
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let slack = FakeSlack::start().await;
    let services = Services {
        chats: vec![Arc::new(slack.client())],
        ..pulse_tests::fake_services(&llm, &discord)
    };
    let worker = b
        .connected()
        .worker(b.clock.clone(), &settings(), &services);
    let inbound = pulse_shared::http::Inbound::new(
        b.store.clone(),
        b.queue.clone(),
        b.clock.clone(),
        pulse_shared::config::InboundConfig {
            slack_signing_secret: Some(pulse_shared::domain::Secret::new(SIGNING_SECRET)),
            delivery_memory: pulse_shared::config::InboundConfig::DEFAULT_DELIVERY_MEMORY,
            ..Default::default()
        },
    );
    let base = pulse_tests::serve_inbound(Arc::new(inbound)).await;
    World {
        b,
        llm,
        slack,
        worker,
        base,
    }
}

impl World {
    async fn agent(&self, f: impl FnOnce(&mut NewAgent)) -> Agent {
        let mut new = NewAgent::named(self.b.next_name("wren").await);
        new.interval = "10m".parse().unwrap();
        new.slack.users = vec!["U777".into()];
        f(&mut new);
        let (agent, first) = new.create(self.b.now()).unwrap();
        self.b.store.create_agent(&agent, &first).await.unwrap();
        agent
    }

    /// Posts `body` to `path`, signed at `at` (seconds from the receiver's clock) with
    /// `secret`, with `extra` headers: the status and the answer.
    async fn send(
        &self,
        path: &str,
        body: Vec<u8>,
        secret: &str,
        at: i64,
        extra: &[(&str, &str)],
    ) -> (u16, Value) {
        let ts = self.b.now().as_second() + at;
        let mut req = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .headers(pulse_signatures::slack::sign_slack(secret, ts, &body))
            .body(body);
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or_default())
    }

    async fn event(&self, event: Value, extra: &[(&str, &str)]) -> (u16, Value) {
        let body =
            json!({"type": "event_callback", "team_id": "T1", "event_id": "Ev1", "event": event});
        self.send(
            "/slack/events",
            serde_json::to_vec(&body).unwrap(),
            SIGNING_SECRET,
            0,
            extra,
        )
        .await
    }
}

/// A direct message from `user`: message `ts` in D123.
fn dm(user: &str, ts: &str, text: &str) -> Value {
    json!({"type": "message", "channel_type": "im", "channel": "D123", "user": user, "text": text, "ts": ts, "event_ts": ts})
}

on_both_backends!(
    a_signed_slack_message_is_answered_once_in_its_thread_despite_a_retry,
    answered
);
async fn answered(kind: Kind) {
    let w = world(kind).await;
    w.agent(|a| a.slack.chat = Some("C900".into())).await;
    // Slack's own check first: the endpoint echoes the challenge, signed.
    let verify = json!({"type": "url_verification", "token": "t", "challenge": "3eZbrw1a"});
    let (status, answer) = w
        .send(
            "/slack/events",
            serde_json::to_vec(&verify).unwrap(),
            SIGNING_SECRET,
            0,
            &[],
        )
        .await;
    assert_eq!((status, answer), (200, json!({"challenge": "3eZbrw1a"})));

    // A direct message, and Slack's retry of it 3 s later: answered once, in the DM.
    w.llm.script([Scripted::text("Hello from Pulse.")]);
    let hello = dm("U777", "1700000000.000200", "hello");
    assert_eq!(w.event(hello.clone(), &[]).await.0, 200);
    let retry = [
        ("X-Slack-Retry-Num", "1"),
        ("X-Slack-Retry-Reason", "http_timeout"),
    ];
    assert_eq!(w.event(hello, &retry).await.0, 200);
    w.b.drain(&w.worker).await;
    let posted = w.slack.posted();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(
        (posted[0].channel.as_str(), posted[0].thread_ts.as_deref()),
        ("D123", None)
    );
    assert_eq!(w.llm.requests().len(), 1);
    assert_eq!(
        w.slack.requests()[0].authorization,
        format!("Bearer {TOKEN}")
    );

    // A mention in its channel: answered in a thread started at the message; the
    // app's mention is not part of what the agent reads.
    w.llm.script([Scripted::text("In the thread.")]);
    let mention = json!({"type": "app_mention", "channel": "C900", "user": "U555",
        "text": "<@UBOT> what's new?", "ts": "1700000001.000300", "event_ts": "1700000001.000300"});
    w.event(mention, &[]).await;
    w.b.drain(&w.worker).await;
    let last = w.slack.posted().last().cloned().unwrap();
    assert_eq!(
        (last.channel.as_str(), last.thread_ts.as_deref()),
        ("C900", Some("1700000001.000300"))
    );
    let messages = w.llm.requests()[1].body["messages"].clone();
    let said = messages.as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(said.ends_with("]\nwhat's new?"), "{said}");

    // A stranger's DM, a bot's message, an edit: taken, never answered.
    w.event(dm("U555", "1700000002.000100", "hi"), &[]).await;
    let mut bot = dm("U777", "1700000003.000100", "echo");
    bot["bot_id"] = json!("B1");
    w.event(bot, &[]).await;
    let mut edit = dm("U777", "1700000004.000100", "edited");
    edit["subtype"] = json!("message_changed");
    w.event(edit, &[]).await;
    assert_eq!(w.b.drain(&w.worker).await, 0);
}

on_both_backends!(
    an_unsigned_forged_or_replayed_slack_request_is_refused_and_nothing_kept,
    refused
);
async fn refused(kind: Kind) {
    let w = world(kind).await;
    w.agent(|_| {}).await;
    let body = serde_json::to_vec(
        &json!({"type": "event_callback", "event": dm("U777", "1700000000.000200", "hi")}),
    )
    .unwrap();
    for (what, secret, at) in [
        ("another app's secret", "not-the-secret", 0),
        ("a replay 6 minutes late", SIGNING_SECRET, -360),
        ("a timestamp from the future", SIGNING_SECRET, 360),
    ] {
        let (status, answer) = w.send("/slack/events", body.clone(), secret, at, &[]).await;
        assert_eq!(status, 401, "{what}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("signature"),
            "{what}: {answer}"
        );
    }
    // Unsigned.
    let r = reqwest::Client::new()
        .post(format!("{}/slack/events", w.base))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(w.b.drain(&w.worker).await, 0);
}

on_both_backends!(
    slack_refusals_are_kept_with_slacks_code_and_a_rate_limit_waited_out,
    refusals
);
async fn refusals(kind: Kind) {
    let w = world(kind).await;
    w.agent(|_| {}).await;
    w.slack.fail_next([Next::Status(429)]);
    w.llm.script([Scripted::text("After the wait.")]);
    w.event(dm("U777", "1700000000.000200", "one"), &[]).await;
    w.b.drain(&w.worker).await;
    assert_eq!(w.slack.posted().len(), 1);

    w.slack.fail_next([Next::Error("not_in_channel")]);
    w.llm.script([Scripted::text("Kept.")]);
    w.event(dm("U777", "1700000001.000200", "two"), &[]).await;
    w.b.drain(&w.worker).await;
    let kept = w.b.store.list_undelivered(10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].state, UndeliveredState::Retrying);
    assert_eq!(
        kept[0].reason,
        "Slack did not take part 1: Slack refused the request: not_in_channel"
    );
    // Delivered at the next try, once Slack takes it.
    w.b.advance(SignedDuration::from_secs(31));
    let swept = w.b.sweeper(settings()).sweep_once(w.b.now()).await;
    assert!(swept.errors.is_empty());
    w.b.drain(&w.worker).await;
    assert_eq!(w.slack.posted().last().unwrap().text, "Kept.");
    assert!(w.b.store.list_undelivered(10).await.unwrap().is_empty());
}

on_both_backends!(
    an_approval_button_pressed_on_slack_decides_it_once_and_only_for_its_users,
    press
);
async fn press(kind: Kind) {
    use pulse_shared::domain::ApprovalStatus;
    let w = world(kind).await;
    let agent = w.agent(|_| {}).await;
    let approval = crate::telegram::parked(&agent, w.b.now());
    w.b.store.park_approval(&approval).await.unwrap();
    let press = |user: &str, approve: bool| {
        let payload = json!({"type": "block_actions", "user": {"id": user},
            "actions": [{"action_id": if approve {"approve"} else {"deny"}, "block_id": "approval",
                "value": approval.short_button(approve), "type": "button"}]});
        format!(
            "payload={}",
            url::form_urlencoded::byte_serialize(payload.to_string().as_bytes())
                .collect::<String>()
        )
        .into_bytes()
    };
    let status = || async {
        w.b.store
            .get_approval(&agent.id, &approval.id)
            .await
            .unwrap()
            .unwrap()
    };
    let (code, _) = w
        .send(
            "/slack/interactions",
            press("U555", true),
            SIGNING_SECRET,
            0,
            &[],
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        status().await.status,
        ApprovalStatus::Pending,
        "a stranger cannot decide"
    );
    w.send(
        "/slack/interactions",
        press("U777", true),
        SIGNING_SECRET,
        0,
        &[],
    )
    .await;
    w.send(
        "/slack/interactions",
        press("U777", false),
        SIGNING_SECRET,
        0,
        &[],
    )
    .await;
    let decided = status().await;
    assert_eq!(
        decided.status,
        ApprovalStatus::Approved,
        "the first decision stands"
    );
    assert_eq!(decided.decided_by.as_deref(), Some("slack U777"));

    // Asked on Slack: a message with Block Kit buttons carrying the decision.
    let home = pulse_shared::domain::ReplyTarget::Chat(pulse_shared::domain::ChatTarget {
        channel: pulse_shared::domain::ChannelKind::Slack,
        chat: "D123".into(),
        thread: None,
        reply_to: None,
    });
    use pulse_shared::ports::Channel;
    let id = w
        .slack
        .client()
        .ask_approval(&agent, &home, &approval)
        .await
        .unwrap();
    assert!(id.starts_with("D123/"));
    let body = w.slack.requests().last().unwrap().body.clone();
    let buttons = body["blocks"][1]["elements"].as_array().unwrap();
    assert_eq!(
        pulse_shared::domain::parse_button(buttons[1]["value"].as_str().unwrap()),
        Some((false, agent.id.clone(), approval.id.clone()))
    );
}

/// The signatures these tests make are the ones Slack's own SDK checks: slack_sdk's
/// `SignatureVerifier` takes them, and refuses a changed body.
#[test]
fn slack_s_sdk_takes_the_signatures() {
    let body = br#"{"type":"event_callback","event":{"type":"message","text":"hi"}}"#;
    let ts = jiff::Timestamp::now().as_second();
    let headers = pulse_signatures::slack::sign_slack(SIGNING_SECRET, ts, body);
    let file = tempfile::NamedTempFile::new().unwrap();
    let case = |body: &[u8]| {
        json!({
            "secret": SIGNING_SECRET,
            "timestamp": headers["x-slack-request-timestamp"].to_str().unwrap(),
            "signature": headers["x-slack-signature"].to_str().unwrap(),
            "body": String::from_utf8_lossy(body),
        })
    };
    std::fs::write(
        file.path(),
        serde_json::to_vec(&json!([case(body), case(b"{}")])).unwrap(),
    )
    .unwrap();
    let out = pulse_tests::python_script("check_slack.py", &[file.path()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "valid\ninvalid"
    );
}
