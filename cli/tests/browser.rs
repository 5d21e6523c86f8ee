//! The dashboard in a real browser: Chromium driven over WebDriver (chromedriver) against
//! a `pulse serve` on a free loopback port. `scripts/test.sh` installs Debian's `chromium`
//! and `chromium-driver` when they are missing. With `PULSE_SCREENSHOTS=DIR` the
//! screenshots of the main pages are written there (the book's, in docs/src/screenshots, come from this test).

mod common;
mod webdriver;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Running, free_port, json, ok};
use webdriver::{Client, Locator};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Waits until `port` on loopback accepts connections.
fn wait_for_port(what: &str, port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what} did not start listening"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `pulse args`, running until dropped, once it listens on `port`.
fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)], port: u16) -> Running {
    let mut cmd = common::command(dir, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pulse starts");
    let running = Running(child);
    wait_for_port(args[0], port);
    running
}

/// `pulse serve` with `env` on loopback `port`, running until dropped.
fn serve(dir: &Path, port: u16, env: &[(&str, &str)]) -> Running {
    let listen = format!("127.0.0.1:{port}");
    spawn(
        dir,
        &["serve", "--listen", &listen, "--tick", "200ms"],
        env,
        port,
    )
}

/// A browser open at `agent`'s Chat tab on the `pulse serve` at `port`.
async fn open_chat(port: u16, agent: &str) -> (Running, Client) {
    let (driver, c) = browser().await;
    c.goto(&format!("http://127.0.0.1:{port}/ui/agents/{agent}/chat"))
        .await
        .unwrap();
    (driver, c)
}

async fn browser() -> (Running, Client) {
    assert!(
        Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
        "the browser test needs Chromium and chromedriver: run ./scripts/test.sh (it installs them), or apt-get install -y chromium chromium-driver"
    );
    let port = free_port();
    let driver = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Running(driver);
    wait_for_port("chromedriver", port);
    let caps = serde_json::json!({
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"],
        },
    });
    let client = Client::connect(&format!("http://127.0.0.1:{port}"), caps)
        .await
        .expect("a WebDriver session");
    (driver, client)
}

/// Where screenshots go: `PULSE_SCREENSHOTS`, or the test's own directory.
fn shots(dir: &Path) -> PathBuf {
    std::env::var_os("PULSE_SCREENSHOTS").map_or_else(|| dir.join("shots"), PathBuf::from)
}

async fn screenshot(c: &Client, dir: &Path, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "{name}: not a picture"
    );
    let out = shots(dir);
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(format!("{name}.png")), png).unwrap();
}

/// Sets a mark on the page that a reload would lose.
async fn mark_page(c: &Client) {
    c.execute("document.body.dataset.mark = 'kept'; return null;", vec![])
        .await
        .unwrap();
}

/// The mark [`mark_page`] set is still there: the page was updated in place.
async fn assert_not_reloaded(c: &Client) {
    let mark = c
        .execute("return document.body.dataset.mark || '';", vec![])
        .await
        .unwrap();
    assert_eq!(mark, "kept", "the page was reloaded, not updated");
}

async fn click(c: &Client, at: Locator<'_>) {
    c.find(at).await.unwrap().click().await.unwrap();
}

async fn type_into(c: &Client, at: Locator<'_>, text: &str) {
    c.find(at).await.unwrap().send_keys(text).await.unwrap();
}

/// How long a page may take to show what a step expects. Generous: on a busy 2-core CI
/// machine two Chromiums share the cores (one CI run saw a form's result page show only
/// after 30 s), and the wait ends as soon as the text shows.
const PAGE_LIMIT: Duration = Duration::from_secs(90);

/// Waits for an element whose text contains `text`; fails with the page's address and
/// text, so a failure says what the browser showed instead.
async fn expect_text(c: &Client, css: &str, text: &str) {
    if wait_for_text(c, css, text, PAGE_LIMIT).await {
        return;
    }
    let url = c
        .current_url()
        .await
        .map(|u| u.to_string())
        .unwrap_or_default();
    let body = match c.find(Locator::Css("body")).await {
        Ok(b) => b.text().await.unwrap_or_default(),
        Err(e) => format!("(no body: {e})"),
    };
    let body: String = body.chars().take(600).collect();
    panic!("no `{css}` showing {text:?} within {PAGE_LIMIT:?} on {url}; the page reads:\n{body}");
}

/// Waits for an element whose text contains `text`.
async fn wait_for_text(c: &Client, css: &str, text: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(els) = c.find_all(Locator::Css(css)).await {
            for e in els {
                if e.text().await.is_ok_and(|t| t.contains(text)) {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_creates_watches_traces_and_pauses_an_agent_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let port = free_port();
    // A tool on every heartbeat, for the Tools tab's figures.
    let echo = pulse_tests::FakeTool::start().await;
    ok(
        &d,
        &["tools", "add", "--name", "echo", "--url", &echo.url()],
    );
    ok(
        &d,
        &[
            "subscriptions",
            "add",
            "--tool",
            "echo",
            "--event",
            "HEARTBEAT",
        ],
    );
    let _serve = serve(&d, port, &[]);
    let (_driver, c) = browser().await;
    let base = format!("http://127.0.0.1:{port}");

    c.goto(&format!("{base}/ui/")).await.unwrap();
    expect_text(&c, ".empty", "No agents yet").await;
    type_into(&c, Locator::Css("#name"), "scout").await;
    let interval = c.find(Locator::Css("#interval")).await.unwrap();
    interval.clear().await.unwrap();
    interval.send_keys("2s").await.unwrap();
    click(&c, Locator::Css("form[action='/ui/agents'] button")).await;
    expect_text(&c, "nav.tabs a.on", "Heartbeats").await;
    let url = c.current_url().await.unwrap().to_string();
    let agent = url.split('/').nth(5).unwrap().to_owned();

    // New heartbeats appear without a reload: the page keeps a mark set now. Beat 3 is
    // written when beat 2 ends, two seconds after the first one ended, so well after
    // the page was loaded.
    mark_page(&c).await;
    assert!(
        !wait_for_text(&c, "#heartbeats a", "#3", Duration::from_millis(10)).await,
        "beat 3 was there already"
    );
    expect_text(&c, "#heartbeats a", "#3").await;
    assert_not_reloaded(&c).await;
    // The charts above the timeline draw the agent's days, kept current as well.
    expect_text(&c, "figure.chart figcaption", "Heartbeats a day").await;
    let drawn = "return document.querySelector('#charts figure p.legend').textContent;";
    let start = Instant::now();
    loop {
        let legend = c.execute(drawn, vec![]).await.unwrap();
        let counted: u64 = legend
            .as_str()
            .unwrap_or_default()
            .split(|ch: char| !ch.is_ascii_digit())
            .filter_map(|w| w.parse::<u64>().ok())
            .sum();
        if counted >= 2 {
            break;
        }
        assert!(
            start.elapsed() < PAGE_LIMIT,
            "the heartbeats chart still counts {counted}: {legend}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    screenshot(&c, &d, "heartbeats").await;

    // Its trace.
    click(&c, Locator::LinkText("#1")).await;
    expect_text(&c, "h2", "Heartbeat #1").await;
    expect_text(&c, ".card", "heartbeat-agent").await;
    screenshot(&c, &d, "trace").await;

    // Chat: type, send, and the reply appears (the offline model answers).
    click(&c, Locator::LinkText("Chat")).await;
    type_into(&c, Locator::Css("#text"), "hello from the browser").await;
    click(&c, Locator::Css("form.chat-box button")).await;
    expect_text(&c, ".chat .said.user", "hello from the browser").await;
    expect_text(&c, ".chat .said.reply", "You said").await;
    screenshot(&c, &d, "chat").await;

    // Paused: no new heartbeat while an agent beside it, at the same interval, beats
    // twice (the server sweeps all along, so the paused one's would have run).
    let control = ok(
        &d,
        &["agents", "create", "--name", "control", "--interval", "2s"],
    );
    c.goto(&format!("{base}/ui/agents/{agent}/settings"))
        .await
        .unwrap();
    click(&c, Locator::XPath("//button[text()='Pause']")).await;
    expect_text(&c, ".card", "Paused").await;
    let latest = |d: &Path, of: &str| {
        let hbs = json(d, &["heartbeats", "list", "--agent", of]);
        (
            hbs[0]["beat"].as_u64().unwrap(),
            hbs[0]["status"].as_str().unwrap().to_owned(),
        )
    };
    let before = latest(&d, &agent);
    assert_eq!(before.1, "PAUSED");
    let (from, _) = latest(&d, &control);
    let start = Instant::now();
    while latest(&d, &control).0 < from + 2 {
        assert!(
            start.elapsed() < PAGE_LIMIT,
            "the control agent did not beat"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        latest(&d, &agent),
        before,
        "a heartbeat ran while the agent was paused"
    );
    ok(&d, &["agents", "delete", &control, "--yes"]);

    // A hook, added and tested from its tab.
    let receiver = pulse_tests::fake_hooks::FakeReceiver::start().await;
    c.goto(&format!("{base}/ui/agents/{agent}/hooks"))
        .await
        .unwrap();
    type_into(&c, Locator::Css("#url"), &receiver.url()).await;
    click(&c, Locator::Css("form[action$='/hooks'] button")).await;
    expect_text(&c, ".secret", "shown this once").await;
    click(&c, Locator::XPath("//button[text()='Test']")).await;
    expect_text(&c, ".notice", "SUCCESS").await;
    assert_eq!(receiver.received().len(), 1, "the test delivery arrived");
    assert!(
        c.find(Locator::Css(".secret")).await.is_err(),
        "the secret is not shown again"
    );
    // A delivery made elsewhere (here by the CLI) appears on the open page without a
    // reload.
    let hook = json(&d, &["hooks", "list", "--agent", &agent])[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    mark_page(&c).await;
    let rows = "return document.querySelectorAll('#hooks tbody tr').length;";
    assert_eq!(c.execute(rows, vec![]).await.unwrap(), 1);
    common::ok(&d, &["hooks", "test", &hook]);
    let start = Instant::now();
    while c.execute(rows, vec![]).await.unwrap() != 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the new delivery did not appear"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_not_reloaded(&c).await;
    screenshot(&c, &d, "hooks").await;

    // A webhook's secret, rotated and seen once.
    c.goto(&format!("{base}/ui/agents/{agent}/webhooks"))
        .await
        .unwrap();
    click(&c, Locator::Css("form[action$='/webhooks'] button")).await;
    expect_text(&c, ".secret", "shown this once").await;
    let first = c
        .find(Locator::Css(".secret pre"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    c.goto(&format!("{base}/ui/agents/{agent}/webhooks"))
        .await
        .unwrap();
    assert!(c.find(Locator::Css(".secret")).await.is_err());
    assert!(!c.source().await.unwrap().contains(&first));
    click(&c, Locator::XPath("//button[text()='Rotate secret']")).await;
    c.accept_alert().await.unwrap();
    expect_text(&c, ".secret", "shown this once").await;
    let second = c
        .find(Locator::Css(".secret pre"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_ne!(first, second);
    c.goto(&format!("{base}/ui/agents/{agent}/webhooks"))
        .await
        .unwrap();
    assert!(!c.source().await.unwrap().contains(&second));

    // Settings: images to the model chosen from a list, and saved.
    c.goto(&format!("{base}/ui/agents/{agent}/settings"))
        .await
        .unwrap();
    c.find(Locator::Css("#vision option[value='off']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(&c, Locator::Css("form[action$='/update'] button")).await;
    expect_text(&c, "#vision option[selected]", "off").await;
    // What its model calls cost this week (the offline model's: nothing).
    expect_text(&c, "#costs", "model call, $0.00").await;
    screenshot(&c, &d, "settings").await;
    c.execute(
        "document.getElementById('costs').scrollIntoView(); return null;",
        vec![],
    )
    .await
    .unwrap();
    screenshot(&c, &d, "settings-costs").await;
    assert_eq!(
        json(&d, &["agents", "show", &agent])["agent"]["llm"]["vision"],
        false
    );

    // An agent kept as files says so where it is edited: a change made here is drift.
    let files = d.join("agents/keeper");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("agent.toml"), "name = \"keeper\"\n").unwrap();
    ok(
        &d,
        &["apply", "--yes", "--source", "abc123", "agents/keeper"],
    );
    let keeper = json(&d, &["agents", "show", "keeper"])["agent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    c.goto(&format!("{base}/ui/agents/{keeper}/settings"))
        .await
        .unwrap();
    expect_text(&c, ".applied", "Kept as files in agents/keeper").await;
    expect_text(&c, ".applied", "abc123").await;
    expect_text(&c, ".applied", "pulse apply --check agents/keeper").await;
    screenshot(&c, &d, "settings-applied").await;

    // Memories: given from the terminal, searched from the Memories tab as the agent
    // recalls.
    for (text, kind) in [
        ("The user is vegetarian and never eats meat", "preference"),
        ("The user walks the dog at dawn", "fact"),
        ("Lunch with Ana on Friday went well", "episode"),
    ] {
        ok(&d, &["memories", "add", &agent, text, "--kind", kind]);
    }
    c.goto(&format!("{base}/ui/agents/{agent}/memories"))
        .await
        .unwrap();
    expect_text(&c, "table.memories", "walks the dog").await;
    type_into(&c, Locator::Css("#q"), "what does the user eat?").await;
    click(&c, Locator::Css("form.search button")).await;
    expect_text(&c, "p.muted", "What a recall of").await;
    expect_text(&c, "table.memories tbody tr:first-child", "vegetarian").await;
    screenshot(&c, &d, "memories").await;

    // The Tools tab: how the agent's tools fared today.
    c.goto(&format!("{base}/ui/agents/{agent}/tools"))
        .await
        .unwrap();
    expect_text(&c, "#tool-stats", "echo").await;
    screenshot(&c, &d, "tools").await;

    c.goto(&format!("{base}/ui/")).await.unwrap();
    expect_text(&c, "td", "paused").await;
    screenshot(&c, &d, "agents").await;
    // On a phone-width screen nothing spills sideways out of the page.
    c.set_window_size(390, 844).await.unwrap();
    let fits = c
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        fits,
        serde_json::json!(true),
        "the agents page is wider than a phone"
    );
    screenshot(&c, &d, "agents-phone").await;
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_model_cannot_answer_is_shown_waiting_in_the_chat_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &["agents", "create", "--name", "kept", "--interval", "1h"],
    );
    // A model nothing answers at.
    let down = format!("http://127.0.0.1:{}/v1", free_port());
    let port = free_port();
    let _serve = serve(
        &d,
        port,
        &[
            ("PULSE_LLM_PROVIDER", "openai"),
            ("PULSE_LLM_BASE_URL", &down),
            ("OPENAI_API_KEY", "sk-test"),
            ("PULSE_LLM_MAX_ATTEMPTS", "1"),
        ],
    );
    let (_driver, c) = open_chat(port, &agent).await;
    type_into(&c, Locator::Css("#text"), "are you there?").await;
    click(&c, Locator::Css("form.chat-box button")).await;
    expect_text(&c, ".chat .said.user", "are you there?").await;
    // The turn fails on the model and waits: the page swaps "thinking…" for the message
    // marked waiting, with why and when it is tried next, without a reload.
    mark_page(&c).await;
    expect_text(&c, ".chat .said.user.waiting", "waiting on the model").await;
    expect_text(&c, ".chat .thinking.waiting", "Waiting on the model").await;
    expect_text(&c, ".chat .thinking.waiting", "next try in").await;
    assert_not_reloaded(&c).await;
    let said = c
        .find_all(Locator::Css(".chat .said.user"))
        .await
        .unwrap()
        .len();
    assert_eq!(said, 1, "the message is shown once, not also as thinking");
    assert!(
        !wait_for_text(&c, ".chat", "thinking…", Duration::from_millis(10)).await,
        "nothing is left thinking"
    );
    screenshot(&c, &d, "chat-waiting").await;
    c.close().await.unwrap();
}

/// A long chat opens at its newest message with the message box in view, follows new
/// messages while the person is at the bottom, and stays where they are once they have
/// scrolled up; the persona is read and changed in Settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_opens_at_the_newest_message_and_follows_unless_scrolled_up_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &[
            "agents",
            "create",
            "--name",
            "talker",
            "--interval",
            "1h",
            "--persona",
            "You are Talker.",
        ],
    );
    let port = free_port();
    let _serve = serve(&d, port, &[]);
    // Twelve exchanges, each answered before the next is sent: 24 messages.
    for i in 0..12 {
        ok(
            &d,
            &[
                "say",
                "--agent",
                "talker",
                &format!("message number {i}, with words enough to fill a line or two of the page"),
            ],
        );
        let answered = Instant::now();
        while json(&d, &["conversation", "show", "--agent", "talker"])
            .as_array()
            .map_or(0, Vec::len)
            < 2 * (i + 1)
        {
            assert!(
                answered.elapsed() < PAGE_LIMIT,
                "message {i} was not answered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (_driver, c) = open_chat(port, &agent).await;
    expect_text(&c, ".chat", "message number 11").await;
    let bottom =
        "return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 4;";
    let tall = "return document.documentElement.scrollHeight > window.innerHeight * 1.5;";
    assert_eq!(
        c.execute(tall, vec![]).await.unwrap(),
        serde_json::json!(true),
        "a chat longer than the window"
    );
    assert_eq!(
        c.execute(bottom, vec![]).await.unwrap(),
        serde_json::json!(true),
        "opened at the bottom"
    );
    let in_view = "var r = document.querySelector('#text').getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight;";
    assert_eq!(
        c.execute(in_view, vec![]).await.unwrap(),
        serde_json::json!(true),
        "the message box is in view"
    );
    screenshot(&c, &d, "chat-long").await;
    // A new exchange while at the bottom: the page follows it.
    ok(&d, &["say", "--agent", "talker", "one more at the bottom"]);
    let replies = "return document.querySelectorAll('.chat .said.reply').length;";
    let followed = Instant::now();
    while c.execute(replies, vec![]).await.unwrap() != serde_json::json!(13)
        || c.execute(bottom, vec![]).await.unwrap() != serde_json::json!(true)
    {
        assert!(
            followed.elapsed() < PAGE_LIMIT,
            "the page did not show and follow the new reply"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Scrolled up to read: a new exchange does not move the page.
    // The page decides whether to follow when htmx settles a swap; a listener added after
    // the page's own runs after it, so once it has counted the swap that brought the
    // fourteenth reply (the answer to this message), the page has had every chance to move.
    c.execute(
        "window.scrollTo(0, 0); window.settledSwaps = 0; \
         document.addEventListener('htmx:afterSettle', function () { \
           if (document.querySelectorAll('.chat .said.reply').length >= 14) \
             window.settledSwaps++; });",
        vec![],
    )
    .await
    .unwrap();
    ok(&d, &["say", "--agent", "talker", "one more while reading"]);
    expect_text(&c, ".chat", "one more while reading").await;
    let settled = Instant::now();
    while c
        .execute("return window.settledSwaps;", vec![])
        .await
        .unwrap()
        == serde_json::json!(0)
    {
        assert!(
            settled.elapsed() < PAGE_LIMIT,
            "the swap that brought the reply to the message never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let top = c.execute("return window.scrollY;", vec![]).await.unwrap();
    assert_eq!(top.as_f64(), Some(0.0), "the reader's place is kept");

    // The persona in Settings.
    c.goto(&format!(
        "http://127.0.0.1:{port}/ui/agents/{agent}/settings"
    ))
    .await
    .unwrap();
    let value = "return document.querySelector('#persona').value;";
    assert_eq!(
        c.execute(value, vec![]).await.unwrap(),
        serde_json::json!("You are Talker.")
    );
    let persona = c.find(Locator::Css("#persona")).await.unwrap();
    persona.clear().await.unwrap();
    persona
        .send_keys("You are Talker, brief and warm.")
        .await
        .unwrap();
    click(
        &c,
        Locator::Css("form[action$='/update'] button[type=submit]"),
    )
    .await;
    expect_text(&c, "nav.tabs a.on", "Settings").await;
    let shown = json(&d, &["agents", "show", "talker"]);
    assert_eq!(
        shown["agent"]["persona"], "You are Talker, brief and warm.",
        "{shown}"
    );
    screenshot(&c, &d, "settings-persona").await;
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_dashboard_asks_for_it_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    // Off loopback, no token: it refuses to start.
    let refused = common::bad(&d, &["dashboard", "--listen", "0.0.0.0:0"]);
    assert!(refused.contains("PULSE_DASHBOARD_TOKEN"), "{refused}");
    // With a token, a login is asked for wherever it listens (here on loopback, as tests
    // must).
    let token = "browser-test-token-0123456789";
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _dashboard = spawn(
        &d,
        &["dashboard", "--listen", &listen],
        &[("PULSE_DASHBOARD_TOKEN", token)],
        port,
    );
    let (_driver, c) = browser().await;
    let base = format!("http://127.0.0.1:{port}");

    c.goto(&format!("{base}/ui/")).await.unwrap();
    expect_text(&c, "h1", "Sign in").await;
    assert!(c.current_url().await.unwrap().path().ends_with("/ui/login"));
    type_into(&c, Locator::Css("#token"), "not-the-token-at-all").await;
    click(&c, Locator::Css("form[action='/ui/login'] button")).await;
    expect_text(&c, ".error", "not the token").await;
    screenshot(&c, &d, "login").await;

    type_into(&c, Locator::Css("#token"), token).await;
    click(&c, Locator::Css("form[action='/ui/login'] button")).await;
    expect_text(&c, ".empty", "No agents yet").await;
    // The session cookie is HttpOnly: no script on the page can read it.
    let cookie = c.execute("return document.cookie;", vec![]).await.unwrap();
    assert_eq!(cookie, serde_json::json!(""));
    // Signed in, a form works.
    type_into(&c, Locator::Css("#name"), "behind-a-login").await;
    click(&c, Locator::Css("form[action='/ui/agents'] button")).await;
    expect_text(&c, "nav.tabs a.on", "Heartbeats").await;
    assert_eq!(json(&d, &["agents", "list"])[0]["name"], "behind-a-login");
    screenshot(&c, &d, "signed-in").await;
    // Signing out ends the session: the pages ask again.
    click(&c, Locator::Css("form[action='/ui/logout'] button")).await;
    expect_text(&c, "h1", "Sign in").await;
    c.goto(&format!("{base}/ui/")).await.unwrap();
    expect_text(&c, "h1", "Sign in").await;
    // A new browser session (no cookie) is asked again.
    c.delete_all_cookies().await.unwrap();
    c.goto(&format!("{base}/ui/")).await.unwrap();
    expect_text(&c, "h1", "Sign in").await;
    c.close().await.unwrap();
}

/// A call parked for approval shows as a card on the dashboard, counted in the header;
/// Approve sends it once (the serve's worker carries it out) and the card goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_call_is_a_card_approved_from_the_dashboard_in_a_browser() {
    use pulse_tests::fake_llm::{FakeLlm, Scripted};
    let mcp = pulse_tests::fake_mcp::FakeMcp::start().await;
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &["agents", "create", "--name", "scout", "--interval", "1h"],
    );
    ok(&d, &["tools", "add-mcp", "cal", "--url", &mcp.url()]);
    ok(&d, &["agents", "update", &agent, "--tools", "mcp:cal"]);
    llm.script([
        Scripted::Answer {
            text: Some("I will add them for the invoice.".into()),
            tools: vec![("cal__add".into(), serde_json::json!({"a": 2, "b": 3}))],
        },
        Scripted::text("I asked you first."),
        Scripted::text("It is 5."),
    ]);
    let base = llm.url();
    let port = free_port();
    let _serve = serve(
        &d,
        port,
        &[
            ("PULSE_LLM_PROVIDER", "anthropic"),
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("PULSE_LLM_BASE_URL", &base),
        ],
    );
    ok(&d, &["say", "--agent", "scout", "add 2 and 3"]);
    let (_driver, c) = browser().await;
    c.goto(&format!(
        "http://127.0.0.1:{port}/ui/agents/{agent}/heartbeats"
    ))
    .await
    .unwrap();
    // The header counts it (the turn parks it within a tick or two).
    let start = Instant::now();
    while !wait_for_text(&c, "header", "Approvals 1", Duration::from_secs(2)).await {
        assert!(start.elapsed() < PAGE_LIMIT, "the header never counted it");
        c.goto(&format!(
            "http://127.0.0.1:{port}/ui/agents/{agent}/heartbeats"
        ))
        .await
        .unwrap();
    }
    assert!(mcp.calls().is_empty(), "parked, not sent");
    click(&c, Locator::Css("header .approvals-count")).await;
    expect_text(&c, ".approval", "scout wants to call cal/add").await;
    expect_text(&c, ".approval", "I will add them for the invoice.").await;
    expect_text(&c, ".approval pre.arguments", "\"a\": 2").await;
    screenshot(&c, &d, "approval-card").await;
    click(&c, Locator::Css(".approval button.approve")).await;
    expect_text(&c, "main", "No call waits for your approval.").await;
    // Sent once, by the serve's worker, in the agent's session.
    let start = Instant::now();
    while mcp.calls().is_empty() {
        assert!(
            start.elapsed() < PAGE_LIMIT,
            "the approved call was never sent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shown = json(&d, &["approvals", "list", "--agent", "scout"]);
    assert_eq!(shown[0]["status"], "approved", "{shown}");
    assert_eq!(shown[0]["decided_by"], "dashboard", "{shown}");
    assert_eq!(mcp.calls().len(), 1);
    c.close().await.unwrap();
}

/// A reply Discord refuses is kept in the dashboard's conversation all the same, marked
/// with why it did not reach Discord: the person finds there what the agent said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_discord_refuses_is_kept_in_the_chat_and_says_why_in_a_browser() {
    let discord = pulse_tests::fake_discord::FakeDiscord::start().await;
    discord.fail_next(std::iter::repeat_n(403, 64));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let agent = ok(
        &d,
        &[
            "agents",
            "create",
            "--name",
            "kept",
            "--interval",
            "1h",
            "--discord-channel",
            "1001",
            "--instructions",
            "speak: the report is due at noon",
        ],
    );
    let api = discord.api_base();
    let port = free_port();
    let _serve = serve(
        &d,
        port,
        &[
            ("DISCORD_BOT_TOKEN", "bot-token"),
            ("DISCORD_API_BASE", &api),
            ("PULSE_DISCORD_GATEWAY", "off"),
        ],
    );
    let (_driver, c) = open_chat(port, &agent).await;
    // The first heartbeat speaks; Discord refuses the reply; the page shows it, marked,
    // without a reload.
    expect_text(
        &c,
        ".chat .said.reply .undelivered",
        "not delivered to Discord",
    )
    .await;
    expect_text(&c, ".chat .said.thought", "the report is due at noon").await;
    screenshot(&c, &d, "chat-undelivered").await;
    c.close().await.unwrap();
}
