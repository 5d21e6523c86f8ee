//! The dashboard's handlers over a real loopback listener, on both backends: every page
//! and form, CSRF refusals, the login off loopback, and no secret on any page.

use std::time::Duration;

use jiff::SignedDuration;
use pulse_shared::domain::{Hook, HookTarget, HookType, Webhook, WebhookScheme};
use pulse_shared::http::{self, ServeLimits};
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use pulse_ui::{Access, Dashboard};
use reqwest::header::{CONTENT_TYPE, COOKIE, HOST, LOCATION, SET_COOKIE};

struct Ui {
    b: Backend,
    base: String,
    http: reqwest::Client,
}

struct Answer {
    status: u16,
    body: String,
    location: String,
    cookie: String,
}

async fn ui(kind: Kind, access: Access) -> Ui {
    ui_within(kind, access, ServeLimits::default()).await
}

async fn ui_within(kind: Kind, access: Access, limits: ServeLimits) -> Ui {
    let b = Backend::new(kind).await;
    let dashboard = Dashboard::new(
        &b.connected(),
        b.clock.clone(),
        &settings(),
        &pulse_tests::offline_services(),
        access,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(http::serve_app(
        listener,
        dashboard.router(),
        limits,
        std::future::pending(),
    ));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    Ui { b, base, http }
}

impl Ui {
    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let r = req.send().await.unwrap();
        let header = |name| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (location, cookie) = (header(LOCATION), header(SET_COOKIE));
        Answer {
            status: r.status().as_u16(),
            location,
            cookie,
            body: r.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body),
        )
        .await
    }

    /// The CSRF token the pages carry.
    async fn csrf(&self) -> String {
        let page = self.get("/ui/").await.body;
        let at = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
        page[at..at + 64].to_owned()
    }
}

on_both_backends!(every_page_renders_and_its_forms_steer_the_agent, pages);
async fn pages(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let empty = u.get("/ui/").await;
    assert_eq!(empty.status, 200);
    assert!(
        empty.body.contains("No agents yet"),
        "an empty state says what to do"
    );
    assert_eq!(u.get("/").await.location, "/ui/");
    let csrf = u.csrf().await;
    let made = u
        .post(
            "/ui/agents",
            &[
                ("csrf", &csrf),
                ("name", "scout"),
                ("interval", "10m"),
                ("instructions", ""),
            ],
        )
        .await;
    assert_eq!(made.status, 303, "{}", made.body);
    let agent = u.b.store.list_agents().await.unwrap().pop().unwrap();
    assert_eq!(made.location, format!("/ui/agents/{}/heartbeats", agent.id));
    assert_eq!(agent.interval.to_string(), "10m");
    let swept = u.b.sweeper(settings()).sweep_once(u.b.now()).await;
    assert_eq!(swept.claimed, 1);
    u.b.drain(&u.b.worker(settings())).await;

    let base = format!("/ui/agents/{}", agent.id);
    for (path, shows) in [
        ("/ui/".to_owned(), "scout"),
        (format!("{base}/heartbeats"), "#1"),
        (format!("{base}/heartbeats/1"), "Heartbeat #1"),
        (format!("{base}/events?type=HEARTBEAT"), "HEARTBEAT"),
        (format!("{base}/actions"), "No actions yet"),
        (format!("{base}/settings"), "Type the agent"),
        (format!("{base}/heartbeats?partial=1"), "id=\"heartbeats\""),
    ] {
        let page = u.get(&path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(page.body.contains(shows), "{path} shows {shows:?}");
    }
    // The first beat ran nothing (this world has no heartbeat agent, and no tool is
    // subscribed): its outcome, with why, in the list and its trace.
    let listed = u.get(&format!("{base}/heartbeats")).await.body;
    assert!(
        listed.contains(r#"<span class="status nothing_to_do">nothing_to_do</span>"#)
            && listed.contains("no tool runs on its events"),
        "{listed}"
    );
    // On AWS the trace shows the requests the heartbeat made.
    let trace = u.get(&format!("{base}/heartbeats/1")).await.body;
    assert!(trace.contains("Outcome: "), "{trace}");
    assert_eq!(
        trace.contains("AWS requests: 4 (2 <code>DynamoDB.Query</code>"),
        kind == Kind::Aws,
        "{trace}"
    );
    assert_eq!(u.get(&format!("{base}/heartbeats/99")).await.status, 404);
    assert_eq!(u.get("/ui/agents/ag_nope/heartbeats").await.status, 404);
    assert_eq!(
        u.get(&format!("{base}/events?type=bad%20type"))
            .await
            .status,
        400
    );

    let back = format!("{base}/settings");
    let paused = u
        .post(
            &format!("{base}/pause"),
            &[("csrf", &csrf), ("back", &back)],
        )
        .await;
    assert_eq!(
        (paused.status, paused.location.as_str()),
        (303, back.as_str())
    );
    assert!(
        u.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .is_paused()
    );
    assert!(u.get("/ui/").await.body.contains("Resume"));
    u.post(
        &format!("{base}/resume"),
        &[("csrf", &csrf), ("back", "https://evil.example/")],
    )
    .await;
    assert!(
        !u.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .is_paused()
    );

    let update = |interval: &'static str, hours: &'static str| {
        [
            ("csrf", csrf.clone()),
            ("name", "scout-2".to_owned()),
            ("interval", interval.to_owned()),
            ("active_hours", hours.to_owned()),
            ("timezone", "Europe/Paris".to_owned()),
            ("instructions", "look around".to_owned()),
        ]
    };
    let form = |f: &[(&'static str, String); 6]| {
        f.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>()
    };
    let pairs = form(&update("1h", "09:00-18:00"));
    let borrowed: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        u.post(&format!("{base}/update"), &borrowed).await.status,
        303
    );
    let stored = u.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(
        (
            stored.name.as_str(),
            stored.interval.to_string(),
            stored.instructions.as_deref()
        ),
        ("scout-2", "1h".to_owned(), Some("look around"))
    );
    // The spending limits, and tokens today on the agents page.
    let limits = u
        .post(
            &format!("{base}/update"),
            &[
                ("csrf", &csrf),
                ("name", "scout-2"),
                ("interval", "1h"),
                ("timezone", "Europe/Paris"),
                ("daily_tokens", "5000"),
                ("max_beats_per_hour", ""),
                ("vision", "off"),
                ("usd_day", "2.50"),
                ("usd_month", ""),
            ],
        )
        .await;
    assert_eq!(limits.status, 303, "{}", limits.body);
    let stored = u.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(stored.budgets.daily_tokens, Some(5000));
    assert_eq!(
        stored.budgets.usd_day,
        Some(pulse_shared::domain::Usd::from_micros(2_500_000))
    );
    assert_eq!(stored.budgets.usd_month, None);
    assert_eq!(stored.budgets.max_beats_per_hour, None);
    assert_eq!(stored.llm.vision, Some(false));
    let page = u.get(&format!("{base}/settings")).await.body;
    assert!(page.contains("value=\"5000\""));
    assert!(page.contains("value=\"2.50\""), "{page}");
    assert!(
        page.contains("No model calls in the last 7 days."),
        "{page}"
    );
    assert!(page.contains("<option value=\"off\" selected>"), "{page}");
    // A turn whose prompt the provider's cache mostly read: its cost, the share read
    // and what that saved (7,040 tokens in, 6,000 of them read and 1,000 written, 9 out:
    // $0.005805, saving $0.01545 at Sonnet's list prices).
    let signal = pulse_shared::domain::SignalId::parse("sg_01JAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
    let mut turn = pulse_shared::domain::Turn {
        id: pulse_shared::domain::TurnId::for_signal(&signal),
        agent_id: agent.id.clone(),
        session: agent.session.clone(),
        signals: vec![signal],
        status: pulse_shared::domain::TurnStatus::Delivering,
        parts: vec!["hello".into()],
        delivered: 0,
        target: pulse_shared::domain::ReplyTarget::None,
        discord_message_ids: Vec::new(),
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        usage: pulse_shared::domain::Usage {
            input_tokens: 7_040,
            output_tokens: 9,
            cache_read_tokens: 6_000,
            cache_write_tokens: 1_000,
            ..Default::default()
        },
        cost_usd: None,
        steps: Vec::new(),
        error: None,
        created_at: u.b.now(),
        completed_at: None,
        requests: None,
        spoken_by: None,
        trace_id: None,
        seen: None,
    };
    u.b.store.begin_turn(&turn, &[]).await.unwrap();
    turn.status = pulse_shared::domain::TurnStatus::Done;
    turn.completed_at = Some(u.b.now());
    u.b.store.update_turn(&turn).await.unwrap();
    let page = u.get(&format!("{base}/settings")).await.body;
    assert!(
        page.contains("Last 7 days: 1 model call, <strong>$0.0058</strong>."),
        "{page}"
    );
    assert!(
        page.contains(
            "85 % of prompt tokens read from the provider&#39;s cache, saving about $0.02."
        ) || page
            .contains("85 % of prompt tokens read from the provider's cache, saving about $0.02."),
        "{page}"
    );
    // The persona is read and changed here, within the CLI's limit; a form without it
    // (as above) leaves it as it was.
    let (u, base) = (&u, &base);
    let with_persona = |persona: String| {
        let csrf = csrf.clone();
        async move {
            u.post(
                &format!("{base}/update"),
                &[
                    ("csrf", csrf.as_str()),
                    ("name", "scout-2"),
                    ("interval", "1h"),
                    ("timezone", "Europe/Paris"),
                    ("persona", persona.as_str()),
                ],
            )
            .await
        }
    };
    assert_eq!(
        with_persona("You are Scout, terse and kind.".into())
            .await
            .status,
        303
    );
    let page = u.get(&format!("{base}/settings")).await.body;
    assert!(
        page.contains("name=\"persona\"") && page.contains("You are Scout, terse and kind."),
        "{page}"
    );
    let long = with_persona("x".repeat(pulse_shared::domain::MAX_PROMPT_TEXT + 1)).await;
    assert_eq!(long.status, 400, "{}", long.body);
    assert!(long.body.contains("at most 16000"), "{}", long.body);
    let stored = u.b.store.get_agent(&agent.id).await.unwrap().unwrap();
    assert_eq!(
        stored.persona.as_deref(),
        Some("You are Scout, terse and kind.")
    );
    assert_eq!(with_persona(String::new()).await.status, 303);
    assert_eq!(
        u.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .persona,
        None
    );
    let spend = pulse_shared::domain::Spend {
        day: pulse_shared::engine::budget::day_of(&stored, u.b.now()),
        source: "tn_test".into(),
        tokens: 1234,
        at: u.b.now(),
    };
    u.b.store.record_spend(&agent.id, &spend).await.unwrap();
    let listed = u.get("/ui/").await.body;
    assert!(listed.contains("Tokens today"), "{listed}");
    assert!(
        listed.contains("1234<span class=\"muted\"> / 5000</span>"),
        "{listed}"
    );

    let pairs = form(&update("soon", ""));
    let borrowed: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let refused = u.post(&format!("{base}/update"), &borrowed).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("interval"), "{}", refused.body);
    assert_eq!(
        u.b.store
            .get_agent(&agent.id)
            .await
            .unwrap()
            .unwrap()
            .interval
            .to_string(),
        "1h"
    );

    let wrong = u
        .post(
            &format!("{base}/delete"),
            &[("csrf", &csrf), ("confirm", "scout")],
        )
        .await;
    assert_eq!(wrong.status, 400, "the name is scout-2 now");
    assert!(u.b.store.get_agent(&agent.id).await.unwrap().is_some());
    let gone = u
        .post(
            &format!("{base}/delete"),
            &[("csrf", &csrf), ("confirm", "scout-2")],
        )
        .await;
    assert_eq!((gone.status, gone.location.as_str()), (303, "/ui/"));
    assert!(u.b.store.get_agent(&agent.id).await.unwrap().is_none());
}

on_both_backends!(
    a_form_without_its_csrf_token_is_refused_and_writes_nothing,
    csrf
);
async fn csrf(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    for form in [
        vec![("name", "scout"), ("interval", "10m")],
        vec![("csrf", "0000"), ("name", "scout"), ("interval", "10m")],
    ] {
        let r = u.post("/ui/agents", &form).await;
        assert_eq!(r.status, 403, "{}", r.body);
    }
    assert!(
        u.b.store.list_agents().await.unwrap().is_empty(),
        "nothing was written"
    );
    // Every page is hardened.
    let page = u.get("/ui/").await;
    let r = u.http.get(format!("{}/ui/", u.base)).send().await.unwrap();
    let h = r.headers();
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["referrer-policy"], "same-origin");
    assert!(!page.body.contains("<script>"), "no inline script");
}

on_both_backends!(off_loopback_a_token_and_a_login_are_required, login);
async fn login(kind: Kind) {
    let anywhere: std::net::SocketAddr = "0.0.0.0:8081".parse().unwrap();
    assert!(
        Access::for_listener(anywhere, None)
            .unwrap_err()
            .to_string()
            .contains("PULSE_DASHBOARD_TOKEN")
    );
    assert!(Access::for_listener(anywhere, Some("short")).is_err());
    assert!(matches!(
        Access::for_listener("127.0.0.1:8081".parse().unwrap(), None),
        Ok(Access::Open)
    ));
    let token = "a-long-random-dashboard-token";
    let u = ui(kind, Access::for_listener(anywhere, Some(token)).unwrap()).await;
    let r = u.get("/ui/").await;
    assert_eq!((r.status, r.location.as_str()), (303, "/ui/login"));
    // A past defect: the login page handed every visitor the CSRF token, every
    // login got the same cookie, and nothing checked where a form came from.
    let login = u.get("/ui/login").await.body;
    assert!(!login.contains("name=\"csrf\""), "no token before a login");
    let r = u
        .post("/ui/agents", &[("name", "x"), ("interval", "1m")])
        .await;
    assert_eq!(r.status, 401);
    let r = u.post("/ui/login", &[("token", "guess-guess-guess")]).await;
    assert_eq!(r.status, 401);
    assert!(r.cookie.is_empty());
    // Each login opens a session of its own.
    let sign_in = |https: bool| {
        let mut req = u
            .http
            .post(format!("{}/ui/login", u.base))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("token={token}"));
        if https {
            req = req.header("x-forwarded-proto", "https");
        }
        u.send(req)
    };
    let first = sign_in(false).await;
    assert_eq!((first.status, first.location.as_str()), (303, "/ui/"));
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=43200"] {
        assert!(first.cookie.contains(attribute), "{}", first.cookie);
    }
    assert!(!first.cookie.contains("Secure"), "served over http");
    let second = sign_in(true).await;
    assert!(second.cookie.contains("; Secure"), "{}", second.cookie);
    let a = first.cookie.split(';').next().unwrap().to_owned();
    let b = second.cookie.split(';').next().unwrap().to_owned();
    assert_ne!(a, b, "a session per login");
    let with = |cookie: &str, path: &str| {
        u.send(
            u.http
                .get(format!("{}{path}", u.base))
                .header(COOKIE, cookie),
        )
    };
    let token_of = |page: &str| {
        let at = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
        page[at..at + 64].to_owned()
    };
    let page_a = with(&a, "/ui/").await;
    assert_eq!(page_a.status, 200);
    assert!(page_a.body.contains("action=\"/ui/logout\""), "a way out");
    let csrf_a = token_of(&page_a.body);
    let csrf_b = token_of(&with(&b, "/ui/").await.body);
    assert_ne!(csrf_a, csrf_b, "a CSRF token per session");
    let host = u.base.trim_start_matches("http://").to_owned();
    let create = |cookie: &str, csrf: &str, extra: &[(&str, String)]| {
        let mut req = u
            .http
            .post(format!("{}/ui/agents", u.base))
            .header(COOKIE, cookie)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("csrf={csrf}&name=made{}&interval=1m", extra.len()));
        for (k, v) in extra {
            req = req.header(*k, v);
        }
        u.send(req)
    };
    // Another session's token, another site's page: refused, nothing written.
    assert_eq!(create(&a, &csrf_b, &[]).await.status, 403);
    let evil = [("origin", "http://evil.example".to_owned())];
    assert_eq!(create(&a, &csrf_a, &evil).await.status, 403);
    let evil_but_same = [
        ("origin", "http://evil.example".to_owned()),
        ("sec-fetch-site", "cross-site".to_owned()),
    ];
    assert_eq!(create(&a, &csrf_a, &evil_but_same).await.status, 403);
    let cross = [("sec-fetch-site", "cross-site".to_owned())];
    assert_eq!(create(&a, &csrf_a, &cross).await.status, 403);
    let same_site = [("sec-fetch-site", "same-site".to_owned())];
    assert_eq!(create(&a, &csrf_a, &same_site).await.status, 403);
    assert!(u.b.store.list_agents().await.unwrap().is_empty());
    // The `null` origin (a sandboxed frame, a data: page) is another site's.
    let null = [("origin", "null".to_owned())];
    assert_eq!(create(&a, &csrf_a, &null).await.status, 403);
    // From its own page: made.
    let own = [
        ("origin", format!("http://{host}")),
        ("sec-fetch-site", "same-origin".to_owned()),
    ];
    assert_eq!(create(&a, &csrf_a, &own).await.status, 303);
    // An older browser sends only its origin: this host's is taken.
    let origin_only = [("origin", format!("http://{host}"))];
    assert_eq!(create(&a, &csrf_a, &origin_only).await.status, 303);
    assert_eq!(u.b.store.list_agents().await.unwrap().len(), 2);
    let forged = with("pulse_session=0123", "/ui/").await;
    assert_eq!(forged.status, 303);

    // Signing out ends that session only.
    let out = u
        .send(
            u.http
                .post(format!("{}/ui/logout", u.base))
                .header(COOKIE, &a)
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(format!("csrf={csrf_a}")),
        )
        .await;
    assert_eq!((out.status, out.location.as_str()), (303, "/ui/login"));
    assert!(out.cookie.contains("Max-Age=0"), "{}", out.cookie);
    assert_eq!(with(&a, "/ui/").await.status, 303);
    assert_eq!(with(&b, "/ui/").await.status, 200);
    // A session ends 12 hours after its login.
    u.b.advance(SignedDuration::from_hours(12));
    assert_eq!(with(&b, "/ui/").await.status, 303);

    // Five wrong tokens from an address, and it waits, the right token too.
    for _ in 0..5 {
        let r = u.post("/ui/login", &[("token", "guess-guess-guess")]).await;
        assert_eq!(r.status, 401);
    }
    let r = sign_in(false).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.cookie.is_empty());
    // The owner, from another address, gets in all the same: however many wrong tokens
    // come from elsewhere (a hundred from twenty more addresses), nobody else waits.
    let from = |last: u8| {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .local_address(std::net::IpAddr::from([127, 0, 0, last]))
            .build()
            .unwrap()
    };
    for last in 10..30u8 {
        let guesser = from(last);
        for _ in 0..5 {
            let r = u
                .send(
                    guesser
                        .post(format!("{}/ui/login", u.base))
                        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                        .body("token=guess-guess-guess"),
                )
                .await;
            assert_eq!(r.status, 401);
        }
    }
    let owner = u
        .send(
            from(2)
                .post(format!("{}/ui/login", u.base))
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(format!("token={token}")),
        )
        .await;
    assert_eq!(owner.status, 303, "{}", owner.body);
    u.b.advance(SignedDuration::from_mins(15));
    assert_eq!(sign_in(false).await.status, 303, "the window ended");
}

on_both_backends!(
    a_loopback_dashboard_answers_only_its_own_machine,
    loopback_only
);
async fn loopback_only(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
        ("cf-connecting-ip", "203.0.113.9"),
    ] {
        let r = u
            .send(u.http.get(format!("{}/ui/", u.base)).header(name, value))
            .await;
        assert_eq!(r.status, 403, "{name}");
    }
    let rebound = u
        .send(
            u.http
                .get(format!("{}/ui/", u.base))
                .header(HOST, "evil.example:8080"),
        )
        .await;
    assert_eq!(rebound.status, 403);
    let local = u
        .send(
            u.http
                .get(format!("{}/ui/", u.base))
                .header(HOST, "localhost:8080"),
        )
        .await;
    assert_eq!(local.status, 200);
}

on_both_backends!(no_secret_is_shown_on_any_page, no_secrets);
async fn no_secrets(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let webhook =
        Webhook::new(agent.id.clone(), WebhookScheme::Standard, secret, u.b.now()).unwrap();
    u.b.store.create_webhook(&webhook).await.unwrap();
    let mut hook = Hook::new(
        agent.id.clone(),
        HookType::parse("AFTER_HEARTBEAT").unwrap(),
        HookTarget::parse("https://example.com/h").unwrap(),
        "whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
        u.b.now(),
    );
    hook.auth_header = Some(pulse_shared::domain::Secret::new("Bearer very-private"));
    u.b.store.create_hook(&hook).await.unwrap();
    u.b.sweeper(settings()).sweep_once(u.b.now()).await;
    u.b.drain(&u.b.worker_with_hooks(settings())).await;
    let base = format!("/ui/agents/{}", agent.id);
    for path in [
        "/ui/".to_owned(),
        format!("{base}/heartbeats"),
        format!("{base}/heartbeats/1"),
        format!("{base}/events"),
        format!("{base}/actions"),
        format!("{base}/settings"),
    ] {
        let page = u.get(&path).await;
        assert_eq!(page.status, 200, "{path}");
        for s in [secret, "c2VjcmV0c2VjcmV0c2VjcmV0", "very-private"] {
            assert!(!page.body.contains(s), "{path} shows a secret");
        }
    }
}

on_both_backends!(the_live_stream_says_when_a_heartbeat_changes, live);
async fn live(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let r = u
        .http
        .get(format!("{}/ui/agents/{}/live", u.base, agent.id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()[CONTENT_TYPE], "text/event-stream");
    u.b.advance(SignedDuration::from_secs(1));
    u.b.sweeper(settings()).sweep_once(u.b.now()).await;
    told(r, "heartbeats")
        .await
        .unwrap_or_else(|seen| panic!("no heartbeats event: {seen:?}"));
}

/// Reads a live stream until it names `event`, for at most ten seconds.
async fn told(mut r: reqwest::Response, event: &str) -> Result<(), String> {
    let mut seen = String::new();
    let wanted = format!("event: {event}");
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = r.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains(&wanted) {
                return;
            }
        }
    })
    .await
    .map_err(|_| seen.clone())
}

on_both_backends!(
    on_the_hooks_tab_the_live_stream_says_when_a_delivery_changes,
    live_deliveries
);
async fn live_deliveries(kind: Kind) {
    use pulse_tests::fake_hooks::FakeReceiver;
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let receiver = FakeReceiver::start().await;
    let csrf = u.csrf().await;
    let base = format!("/ui/agents/{}/hooks", agent.id);
    let added = u
        .post(
            &base,
            &[
                ("csrf", &csrf),
                ("hook_type", "AFTER_HEARTBEAT"),
                ("url", &receiver.url()),
            ],
        )
        .await;
    assert_eq!(added.status, 200, "{}", added.body);
    let page = u.get(&base).await.body;
    assert!(
        page.contains(&format!(
            "data-live=\"/ui/agents/{}/live?deliveries=1\"",
            agent.id
        )),
        "the Hooks tab watches deliveries"
    );
    let hook = u.b.store.list_hooks(&agent.id).await.unwrap().remove(0);
    let r = u
        .http
        .get(format!(
            "{}/ui/agents/{}/live?deliveries=1",
            u.base, agent.id
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let tested = u
        .post(&format!("{base}/{}/test", hook.id), &[("csrf", &csrf)])
        .await;
    assert_eq!(tested.status, 200, "{}", tested.body);
    told(r, "deliveries")
        .await
        .unwrap_or_else(|seen| panic!("no deliveries event: {seen:?}"));
    // What the page fetches then: the hooks alone, with the new delivery.
    let delivery =
        u.b.store
            .list_deliveries(&hook.id, 1)
            .await
            .unwrap()
            .remove(0);
    let part = u.get(&format!("{base}?partial=1")).await.body;
    assert!(part.starts_with("<div id=\"hooks\""), "{part}");
    assert!(part.contains(delivery.id.as_str()) && !part.contains("<nav"));
}

/// The secret a page shows once, in its `.secret` block.
fn shown_secret(page: &str) -> Option<String> {
    let at = page.find("<div class=\"secret\">")?;
    let pre = page[at..].find("<pre>")? + at + 5;
    let end = page[pre..].find("</pre>")? + pre;
    Some(page[pre..end].to_owned())
}

on_both_backends!(
    the_hooks_tab_adds_tests_switches_replays_and_deletes,
    hooks_tab
);
async fn hooks_tab(kind: Kind) {
    use pulse_tests::fake_hooks::{Answer, FakeReceiver};
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let base = format!("/ui/agents/{}/hooks", agent.id);
    let empty = u.get(&base).await;
    assert!(empty.body.contains("No hooks"), "an empty state");
    assert!(
        empty.body.contains("AGENT_PAUSED"),
        "the types, with what they report"
    );
    let csrf = u.csrf().await;
    let receiver = FakeReceiver::start().await;
    let added = u
        .post(
            &base,
            &[
                ("csrf", &csrf),
                ("hook_type", "AFTER_HEARTBEAT"),
                ("url", &receiver.url()),
                ("auth_header", "Bearer t0k"),
            ],
        )
        .await;
    assert_eq!(added.status, 200, "{}", added.body);
    let secret = shown_secret(&added.body).expect("the new secret, once");
    let hook =
        u.b.store
            .list_hooks(&agent.id)
            .await
            .unwrap()
            .pop()
            .unwrap();
    assert_eq!(hook.secret.expose(), secret);
    let again = u.get(&base).await.body;
    assert!(
        !again.contains(&secret) && !again.contains("t0k"),
        "never shown again"
    );
    let refused = u
        .post(
            &base,
            &[
                ("csrf", &csrf),
                ("hook_type", "AFTER_NOTHING"),
                ("url", "https://example.com/h"),
            ],
        )
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(u.b.store.list_hooks(&agent.id).await.unwrap().len(), 1);

    let hook_base = format!("{base}/{}", hook.id);
    let tested = u
        .post(&format!("{hook_base}/test"), &[("csrf", &csrf)])
        .await;
    assert!(tested.body.contains("SUCCESS"), "{}", tested.body);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(receiver.received()[0].header("authorization"), "Bearer t0k");

    u.post(&format!("{hook_base}/disable"), &[("csrf", &csrf)])
        .await;
    assert!(!u.b.store.get_hook(&hook.id).await.unwrap().unwrap().active);
    u.post(&format!("{hook_base}/enable"), &[("csrf", &csrf)])
        .await;
    assert!(u.b.store.get_hook(&hook.id).await.unwrap().unwrap().active);

    // A failed test can be replayed from the delivery log.
    receiver.script(vec![Answer::status(500), Answer::status(200)]);
    let failed = u
        .post(&format!("{hook_base}/test"), &[("csrf", &csrf)])
        .await;
    assert!(failed.body.contains("FAILED"), "{}", failed.body);
    let log = u.get(&base).await.body;
    assert!(
        log.contains("Replay"),
        "an exhausted delivery offers a replay"
    );
    let delivery =
        u.b.store
            .list_deliveries(&hook.id, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|d| d.status == pulse_shared::domain::DeliveryStatus::Exhausted)
            .unwrap();
    let replayed = u
        .post(
            &format!("{hook_base}/deliveries/{}/replay", delivery.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert!(replayed.body.contains("SUCCESS"), "{}", replayed.body);
    assert_eq!(receiver.received().len(), 3);

    let gone = u
        .post(&format!("{hook_base}/delete"), &[("csrf", &csrf)])
        .await;
    assert_eq!(gone.status, 303);
    assert!(u.b.store.list_hooks(&agent.id).await.unwrap().is_empty());
}

on_both_backends!(
    the_webhooks_tab_creates_edits_rotates_and_deletes,
    webhooks_tab
);
async fn webhooks_tab(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let base = format!("/ui/agents/{}/webhooks", agent.id);
    assert!(u.get(&base).await.body.contains("No webhooks"));
    let csrf = u.csrf().await;
    let made = u
        .post(
            &base,
            &[("csrf", &csrf), ("scheme", "standard"), ("allow", "NOTE")],
        )
        .await;
    assert_eq!(made.status, 200, "{}", made.body);
    let secret = shown_secret(&made.body).expect("the secret, once");
    let w = u.b.store.list_webhooks().await.unwrap().pop().unwrap();
    assert_eq!(w.secrets_at(u.b.now())[0], secret);
    let listed = u.get(&base).await.body;
    assert!(!listed.contains(&secret), "never shown again");
    assert!(listed.contains(&format!("/webhooks/{}", w.id)), "its URL");

    let edit = format!("{base}/{}/update", w.id);
    u.post(
        &edit,
        &[
            ("csrf", &csrf),
            ("allow", "PUSH,ISSUE"),
            ("rate_limit", "10/h"),
            ("wake", "yes"),
        ],
    )
    .await;
    let stored = u.b.store.get_webhook(&w.id).await.unwrap().unwrap();
    assert_eq!(stored.allowed_types.len(), 2);
    assert!(stored.wake && stored.rate_limit.is_some());
    let bad = u
        .post(
            &edit,
            &[
                ("csrf", &csrf),
                ("allow", "a b"),
                ("rate_limit", "10/h"),
                ("wake", "no"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(
        u.b.store.get_webhook(&w.id).await.unwrap().unwrap().wake,
        "nothing written"
    );

    let rotated = u
        .post(&format!("{base}/{}/rotate", w.id), &[("csrf", &csrf)])
        .await;
    let new_secret = shown_secret(&rotated.body).expect("the new secret, once");
    assert_ne!(new_secret, secret);
    let rotated_webhook = u.b.store.get_webhook(&w.id).await.unwrap().unwrap();
    assert_eq!(
        rotated_webhook.secrets_at(u.b.now()).len(),
        2,
        "the old one works through the grace period"
    );
    assert!(!u.get(&base).await.body.contains(&new_secret));

    let gone = u
        .post(&format!("{base}/{}/delete", w.id), &[("csrf", &csrf)])
        .await;
    assert_eq!(gone.status, 303);
    assert!(u.b.store.get_webhook(&w.id).await.unwrap().is_none());
}

on_both_backends!(the_agents_page_shows_a_hundred_at_a_time, paging);
async fn paging(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let fleet: Vec<_> = (0..150)
        .map(|i| {
            u.b.advance(SignedDuration::from_millis(1));
            pulse_shared::domain::NewAgent::named(format!("agent-{i:03}"))
                .create(u.b.now())
                .unwrap()
        })
        .collect();
    u.b.store.import_agents(&fleet).await.unwrap();
    let first = u.get("/ui/").await.body;
    assert!(first.contains("agent-000") && first.contains("agent-099"));
    assert!(!first.contains("agent-100"));
    assert!(first.contains("page 1 of 2 (150 agents)"));
    let second = u.get("/ui/?page=2").await.body;
    assert!(second.contains("agent-100") && second.contains("agent-149"));
    assert!(!second.contains("agent-099"));
    assert!(u.get("/ui/?page=9").await.body.contains("page 2 of 2"));
}

/// 60 exchanges (120 messages): the Chat tab shows the newest 100, and a link to the
/// older ones, whose page links back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_tab_pages_a_long_conversation() {
    let u = ui(Kind::Sqlite, Access::Open).await;
    let (agent, _) = u.b.agent("talker", "1h").await;
    let services = pulse_tests::offline_services();
    let worker =
        u.b.connected()
            .worker(u.b.clock.clone(), &settings(), &services);
    for i in 0..60 {
        u.b.advance(SignedDuration::from_secs(1));
        u.b.say(&agent, &format!("note {i:03}")).await;
        u.b.drain(&worker).await;
    }
    let base = format!("/ui/agents/{}/chat", agent.id);
    let newest = u.get(&base).await.body;
    // The newest 100 messages: the user's notes 010 to 059 and their replies.
    assert!(
        newest.contains("note 059") && newest.contains("note 010"),
        "{newest}"
    );
    assert!(!newest.contains("note 009"));
    let link = newest
        .split("href=\"")
        .map(|s| s.split('"').next().unwrap_or_default())
        .find(|h| h.contains("chat?before="))
        .expect("a link to the older messages")
        .replace("&amp;", "&");
    let older = u.get(&link).await.body;
    assert!(
        older.contains("note 000") && older.contains("note 009"),
        "{older}"
    );
    assert!(!older.contains("note 010"), "only what is older");
    assert!(older.contains("Back to the newest"));
    assert!(
        !older.contains("chat?before="),
        "nothing older than the first page"
    );
}

on_both_backends!(
    the_conversation_memories_and_tools_tabs_show_what_the_agent_heard_kept_and_runs,
    mind_tabs
);
async fn mind_tabs(kind: Kind) {
    use pulse_shared::domain::{Memory, MemoryId};
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let base = format!("/ui/agents/{}", agent.id);
    let old = u.get(&format!("{base}/conversation")).await;
    assert_eq!(
        (old.status, old.location.as_str()),
        (308, format!("{base}/chat").as_str())
    );
    assert!(
        u.get(&format!("{base}/chat"))
            .await
            .body
            .contains("No conversation yet")
    );
    assert!(
        u.get(&format!("{base}/memories"))
            .await
            .body
            .contains("No memories yet")
    );
    u.b.say(&agent, "hello there").await;
    let services = pulse_tests::offline_services();
    let worker =
        u.b.connected()
            .worker(u.b.clock.clone(), &settings(), &services);
    u.b.drain(&worker).await;
    u.b.store
        .remember(&[Memory::new(
            MemoryId::derived(1, &["tea"]),
            &agent.id,
            "likes green tea",
            0,
            u.b.now(),
        )
        .unwrap()])
        .await
        .unwrap();
    // The reply's turn used a tool: the page says so under the reply.
    let mut turn = u.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    turn.steps = vec![
        serde_json::json!({"kind": "llm", "step": 0}),
        serde_json::json!({"kind": "tool", "name": "remember", "input": {"text": "likes green tea"}}),
    ];
    u.b.store.update_turn(&turn).await.unwrap();
    let talk = u.get(&format!("{base}/chat")).await;
    assert_eq!(talk.status, 200);
    assert!(
        talk.body.contains("hello there") && talk.body.contains("reply"),
        "{}",
        talk.body
    );
    assert!(
        talk.body
            .contains("used <code>remember {&quot;text&quot;:&quot;likes green tea&quot;}</code>"),
        "{}",
        talk.body
    );
    u.b.store
        .remember(&[Memory::new(
            MemoryId::derived(2, &["dog"]),
            &agent.id,
            "walks the dog at dawn",
            0,
            u.b.now(),
        )
        .unwrap()])
        .await
        .unwrap();
    let kept = u.get(&format!("{base}/memories")).await.body;
    assert!(kept.contains("likes green tea") && kept.contains("2 memories, newest first"));
    assert!(
        kept.contains(r#"<span class="status active">active</span>"#)
            && kept.contains("<td>fact</td>")
            && kept.contains(r#"value="1.00""#),
        "kind, state and weight: {kept}"
    );
    // The search runs the agent's recall: what matches first, with its score; a look
    // reinforces nothing.
    let found = u.get(&format!("{base}/memories?q=green+tea")).await;
    assert_eq!(found.status, 200);
    let (tea, dog) = (
        found.body.find("likes green tea").unwrap(),
        found.body.find("walks the dog").unwrap_or(usize::MAX),
    );
    assert!(tea < dog, "{}", found.body);
    assert!(found.body.contains("<th>Match</th>"), "{}", found.body);
    assert!(
        u.b.store
            .all_memories(&agent.id)
            .await
            .unwrap()
            .iter()
            .all(|m| m.recalls == 0)
    );
    let none = u
        .get(&format!("{base}/memories?q=&state=suspended&kind=fact"))
        .await;
    assert!(none.body.contains("Nothing matches."), "{}", none.body);
    assert_eq!(
        u.get(&format!("{base}/memories?state=asleep")).await.status,
        400
    );
    let tools = u.get(&format!("{base}/tools")).await;
    assert!(tools.body.contains("heartbeat-agent") && tools.body.contains("HEARTBEAT"));

    // Switching the built-in tool and its subscription off and on from the page.
    let csrf = u.csrf().await;
    let off = u
        .post(
            &format!("{base}/tools/heartbeat-agent/disable"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(off.status, 303);
    let registry = u.b.store.load_registry().await.unwrap();
    assert!(
        registry
            .tools
            .iter()
            .any(|t| t.name.as_str() == "heartbeat-agent" && !t.active)
    );
    let sub = pulse_shared::domain::Subscription::heartbeat_agent().id;
    u.post(
        &format!("{base}/subscriptions/{sub}/disable"),
        &[("csrf", &csrf)],
    )
    .await;
    let registry = u.b.store.load_registry().await.unwrap();
    assert!(
        registry
            .subscriptions
            .iter()
            .any(|s| s.id == sub && !s.active)
    );
    u.post(
        &format!("{base}/tools/heartbeat-agent/enable"),
        &[("csrf", &csrf)],
    )
    .await;
    let registry = u.b.store.load_registry().await.unwrap();
    assert!(
        registry
            .tools
            .iter()
            .any(|t| t.name.as_str() == "heartbeat-agent" && t.active)
    );
    let missing = u
        .post(
            &format!("{base}/tools/no-such-tool/enable"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(missing.status, 404, "{}", missing.body);
}

on_both_backends!(
    a_page_that_is_not_there_is_the_dashboard_s_own_404_with_the_way_back,
    no_page
);
async fn no_page(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let home = u.get(&format!("/ui/agents/{}", agent.id)).await;
    assert_eq!(home.status, 303, "the agent's page opens its first tab");
    assert_eq!(home.location, format!("/ui/agents/{}/heartbeats", agent.id));
    for path in [
        format!("/ui/agents/{}/", agent.id),
        format!("/ui/agents/{}/nonsense", agent.id),
    ] {
        let a = u.get(&path).await;
        assert_eq!(a.status, 404, "{path}");
        assert!(a.body.contains("No such page"), "{}", a.body);
        assert!(
            a.body
                .contains(&format!("href=\"/ui/agents/{}/heartbeats\"", agent.id)),
            "the agent's tabs are linked: {}",
            a.body
        );
    }
    let elsewhere = u.get("/ui/nowhere").await;
    assert_eq!(elsewhere.status, 404);
    assert!(
        elsewhere.body.contains("href=\"/ui/\""),
        "{}",
        elsewhere.body
    );
    assert!(!elsewhere.body.starts_with('{'), "HTML, not JSON");

    // A past defect: a CR/LF in the path was put in a redirect's Location
    // and answered a bare 500. It names no agent: 404, the dashboard's own page.
    for path in [
        "/ui/agents/%0D%0ASet-Cookie:%20x=1",
        "/ui/agents/agt_x%0D%0A",
        "/ui/agents/%0A/heartbeats",
    ] {
        let a = u.get(path).await;
        assert_eq!(a.status, 404, "{path}: {}", a.body);
        assert!(a.cookie.is_empty() && a.location.is_empty(), "{path}");
        assert!(
            a.body.contains("not found") || a.body.contains("No such page"),
            "{}",
            a.body
        );
    }
    // A form's way back with a CR/LF in it goes to the default instead.
    let csrf = u.csrf().await;
    let r = u
        .post(
            &format!("/ui/agents/{}/pause", agent.id),
            &[("csrf", &csrf), ("back", "/ui/\r\nSet-Cookie: x=1")],
        )
        .await;
    assert_eq!((r.status, r.location.as_str()), (303, "/ui/"), "{}", r.body);
    assert!(r.cookie.is_empty());
}

/// A past defect: server-sent event streams held a connection place for as
/// long as their clients kept them open, and 600 of them kept health and webhooks from
/// being answered. Now they have a budget of their own and a lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_have_their_own_budget_and_lifetime_and_never_take_the_pages_places() {
    let limits = ServeLimits {
        max_connections: 4,
        max_streams: 3,
        max_streams_per_address: 3,
        stream_lifetime: Duration::from_secs(2),
        ..ServeLimits::default()
    };
    let u = ui_within(Kind::Sqlite, Access::Open, limits).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let live = format!("{}/ui/agents/{}/live", u.base, agent.id);
    // Streams that are never read beyond their headers, on connections of their own.
    let mut streams = Vec::new();
    for _ in 0..limits.max_streams {
        let r = reqwest::Client::new().get(&live).send().await.unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let over = reqwest::Client::new().get(&live).send().await.unwrap();
    assert_eq!(over.status(), 503, "the streams' budget is spent");
    assert!(over.headers().contains_key("retry-after"));
    // Pages are served beside them, more of them than the connection places: the
    // streams hold none.
    for _ in 0..limits.max_connections + 2 {
        let page = reqwest::Client::new()
            .get(format!("{}/ui/", u.base))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
    }
    // A stream ends after its lifetime and gives its place back.
    let started = std::time::Instant::now();
    let mut first = streams.remove(0);
    while first.chunk().await.unwrap().is_some() {}
    assert!(started.elapsed() <= limits.stream_lifetime + Duration::from_secs(2));
    drop(first);
    // The place comes back when the server has seen the stream end: asked until then,
    // the answer is the budget's 503, and then a stream.
    let freed = std::time::Instant::now();
    loop {
        let again = reqwest::Client::new().get(&live).send().await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert_eq!(again.status(), 503, "while the place is still taken");
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "the ended stream's place was not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_both_backends!(
    the_chat_tab_sends_through_the_session_queue_and_shows_the_reply,
    chat_tab
);
async fn chat_tab(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let base = format!("/ui/agents/{}", agent.id);
    let csrf = u.csrf().await;
    // Nothing to send: 400, nothing queued.
    let empty = u
        .post(&format!("{base}/chat"), &[("csrf", &csrf), ("text", "  ")])
        .await;
    assert_eq!(empty.status, 400, "{}", empty.body);
    assert!(empty.body.contains("write something"), "{}", empty.body);
    assert_eq!(u.b.queued_messages().await, 0);
    // Without the CSRF token: refused, nothing queued.
    let forged = u.post(&format!("{base}/chat"), &[("text", "hi")]).await;
    assert_eq!(forged.status, 403);
    assert_eq!(u.b.queued_messages().await, 0);

    let sent = u
        .post(
            &format!("{base}/chat"),
            &[("csrf", &csrf), ("text", "what's up?")],
        )
        .await;
    assert_eq!(sent.status, 303, "{}", sent.body);
    assert!(
        sent.location.starts_with(&format!("{base}/chat?sent=sg_")),
        "{}",
        sent.location
    );
    let thinking = u.get(&sent.location).await.body;
    assert!(
        thinking.contains("thinking") && thinking.contains("what&#39;s up?")
            || thinking.contains("what's up?"),
        "{thinking}"
    );
    let signals = u.b.receive_all().await;
    assert_eq!(signals.len(), 1, "one message on the session queue");
    for d in &signals {
        u.b.queue
            .release(&d.receipt, std::time::Duration::ZERO)
            .await
            .unwrap();
    }
    let services = pulse_tests::offline_services();
    let worker =
        u.b.connected()
            .worker(u.b.clock.clone(), &settings(), &services);
    assert_eq!(u.b.drain(&worker).await, 1);
    let answered = u.get(&sent.location).await.body;
    assert!(!answered.contains("thinking…"), "{answered}");
    assert!(answered.contains("you · dashboard"), "{answered}");
    let turn = u.b.store.list_turns(&agent.id, 1).await.unwrap().remove(0);
    assert!(!turn.parts.is_empty());
    assert_eq!(
        turn.target,
        pulse_shared::domain::ReplyTarget::None,
        "read here, not on Discord"
    );
    // A stream opened after the reply was written (the page drawn while thinking, its
    // event source connecting a moment later) still tells the page at once.
    let late = u
        .http
        .get(format!("{}{base}/live", u.base))
        .send()
        .await
        .unwrap();
    told(late, "chat")
        .await
        .unwrap_or_else(|seen| panic!("a late stream missed the reply: {seen:?}"));

    // Wake now, and a snooze that is too long.
    let woke = u
        .post(
            &format!("{base}/wake"),
            &[("csrf", &csrf), ("back", &format!("{base}/settings"))],
        )
        .await;
    assert_eq!(woke.status, 303, "{}", woke.body);
    let long = u
        .post(
            &format!("{base}/snooze"),
            &[("csrf", &csrf), ("length", "400d")],
        )
        .await;
    assert_eq!(long.status, 400, "{}", long.body);
    assert!(long.body.contains("a minute to 30 days"), "{}", long.body);
    let snoozed = u
        .post(
            &format!("{base}/snooze"),
            &[("csrf", &csrf), ("length", "2h")],
        )
        .await;
    assert_eq!(snoozed.status, 303);
    let settings_page = u.get(&format!("{base}/settings")).await.body;
    assert!(settings_page.contains("Snoozed"), "{settings_page}");
    // Stopping a heartbeat that is not running says so.
    let stop = u
        .post(&format!("{base}/heartbeats/1/cancel"), &[("csrf", &csrf)])
        .await;
    assert_eq!(stop.status, 400, "{}", stop.body);
    assert!(stop.body.contains("not running"), "{}", stop.body);
}

on_both_backends!(
    the_charts_data_counts_heartbeats_by_outcome_and_agents_by_state,
    charts_data
);
async fn charts_data(kind: Kind) {
    let u = ui(kind, Access::Open).await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    let (other, _) = u.b.agent("idle", "15m").await;
    let services = pulse_tests::offline_services();
    let worker =
        u.b.connected()
            .worker(u.b.clock.clone(), &settings(), &services);
    // Three heartbeats: with nothing new to think about, each skips its model.
    for _ in 0..3 {
        let swept = u.b.sweeper(settings()).sweep_once(u.b.now()).await;
        assert!(swept.errors.is_empty());
        u.b.drain(&worker).await;
        u.b.advance(jiff::SignedDuration::from_mins(16));
    }
    // A chat turn spends tokens today; a memory is kept, and recalled.
    u.b.say(&agent, "hello").await;
    u.b.drain(&worker).await;
    let mut kept = pulse_shared::domain::Memory::new(
        pulse_shared::domain::MemoryId::derived(1, &["tea"]),
        &agent.id,
        "likes green tea",
        0,
        u.b.now(),
    )
    .unwrap();
    u.b.store
        .remember(std::slice::from_ref(&kept))
        .await
        .unwrap();
    kept.recalled_at = Some(u.b.now());
    kept.recalls = 1;
    u.b.store.reinforce(&[kept]).await.unwrap();
    let days: serde_json::Value = serde_json::from_str(
        &u.get(&format!("/ui/agents/{}/charts.json", agent.id))
            .await
            .body,
    )
    .unwrap();
    assert_eq!(days["days"].as_array().unwrap().len(), 14);
    let today = days["tokens"].as_array().unwrap().last().unwrap();
    assert!(today.as_f64().unwrap() > 0.0, "{days}");
    let series = |name: &str| -> f64 {
        days["heartbeats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum()
    };
    // Nothing new to think about: three heartbeats with nothing to do.
    assert_eq!(series("nothing to do"), 3.0, "{days}");
    let memory = |name: &str| -> f64 {
        days["memory"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum()
    };
    assert_eq!((memory("kept"), memory("recalled")), (1.0, 1.0), "{days}");
    assert_eq!(
        series("failed") + series("acted") + series("skipped"),
        0.0,
        "{days}"
    );
    // The page draws them.
    let page = u
        .get(&format!("/ui/agents/{}/heartbeats", agent.id))
        .await
        .body;
    assert!(
        page.contains("Heartbeats a day") && page.contains("nothing to do 3"),
        "{page}"
    );
    // The fleet: by state.
    u.b.connected()
        .lifecycle(u.b.clock.clone(), &settings())
        .pause(&other.id)
        .await
        .unwrap();
    let fleet: serde_json::Value =
        serde_json::from_str(&u.get("/ui/charts.json").await.body).unwrap();
    assert_eq!(fleet["states"]["active"], 1, "{fleet}");
    assert_eq!(fleet["states"]["paused"], 1, "{fleet}");
    assert!(u.get("/ui/").await.body.contains("Agents by state"));
}

on_both_backends!(
    the_actions_tab_runs_a_failed_action_again,
    retry_from_the_tab
);
async fn retry_from_the_tab(kind: Kind) {
    use pulse_shared::domain::ActionStatus;
    use pulse_tests::{FakeTool, Reply, ok_with_events};
    let u = ui(kind, Access::Open).await;
    let tool =
        FakeTool::answering(|_| Reply::Json(500, serde_json::json!({"error": "down"}))).await;
    u.b.tool("mailer", &tool.url(), "ORDER").await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    u.b.emit(&agent, "ORDER", serde_json::json!({"n": 1})).await;
    u.b.advance(jiff::SignedDuration::from_secs(10));
    u.b.sweeper(settings()).sweep_once(u.b.now()).await;
    let worker = u.b.connected().worker(
        u.b.clock.clone(),
        &settings(),
        &pulse_tests::offline_services(),
    );
    u.b.drain(&worker).await;
    let failed = u.b.store.list_actions(&agent.id, 10).await.unwrap();
    let failed = failed
        .iter()
        .find(|a| a.tool.as_str() == "mailer")
        .unwrap()
        .clone();
    assert_eq!(failed.status, ActionStatus::Failed);
    let base = format!("/ui/agents/{}", agent.id);
    let page = u.get(&format!("{base}/actions")).await.body;
    assert!(
        page.contains(&format!("/actions/{}/retry", failed.id)),
        "{page}"
    );
    tool.set(|_| ok_with_events(serde_json::json!([])));
    let csrf = u.csrf().await;
    let done = u
        .post(
            &format!("{base}/actions/{}/retry", failed.id),
            &[("csrf", &csrf), ("back", &format!("{base}/actions"))],
        )
        .await;
    assert_eq!(
        (done.status, done.location.as_str()),
        (303, format!("{base}/actions").as_str()),
        "{}",
        done.body
    );
    let stored =
        u.b.store
            .get_action(&agent.id, &failed.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        (stored.status, stored.attempt),
        (ActionStatus::Completed, 2)
    );
    // The Tools tab counts it in the agent's tool health: each attempt is a call, the
    // first failed and the second succeeded.
    let tools = u.get(&format!("{base}/tools")).await.body;
    let at = tools.find("id=\"tool-stats\"").expect("a health table");
    let row = &tools[at..];
    let row = &row[row.find("<td>mailer</td>").expect("a row for the mailer")..];
    assert!(
        row.starts_with("<td>mailer</td><td>2</td><td>1</td>"),
        "{row}"
    );
}

on_both_backends!(
    the_actions_tab_settles_an_unknown_action,
    resolve_from_the_tab
);
async fn resolve_from_the_tab(kind: Kind) {
    use pulse_shared::domain::{ActionStatus, Filter};
    use pulse_tests::fake_hooks::{Answer as Slow, FakeReceiver};
    let u = ui(kind, Access::Open).await;
    let mail = FakeReceiver::start().await;
    mail.script(vec![
        Slow::status(200).after(std::time::Duration::from_millis(1_500)),
    ]);
    u.b.tool_with(
        "mailer",
        &mail.url(),
        std::time::Duration::from_millis(300),
        "ORDER",
        0,
        Filter::default(),
    )
    .await;
    let (agent, _) = u.b.agent("scout", "15m").await;
    u.b.emit(&agent, "ORDER", serde_json::json!({"n": 1})).await;
    u.b.advance(jiff::SignedDuration::from_secs(10));
    u.b.sweeper(settings()).sweep_once(u.b.now()).await;
    u.b.drain(&u.b.worker(settings())).await;
    let actions = u.b.store.list_actions(&agent.id, 10).await.unwrap();
    let lost = actions
        .iter()
        .find(|a| a.tool.as_str() == "mailer")
        .unwrap();
    assert_eq!(lost.status, ActionStatus::Unknown);
    let base = format!("/ui/agents/{}", agent.id);
    let page = u.get(&format!("{base}/actions")).await.body;
    let resolve = format!("{base}/actions/{}/resolve/failed", lost.id);
    assert!(page.contains(&resolve), "{page}");
    assert!(page.contains("It was done"), "{page}");
    let csrf = u.csrf().await;
    let done = u
        .post(
            &resolve,
            &[("csrf", &csrf), ("back", &format!("{base}/actions"))],
        )
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let stored =
        u.b.store
            .get_action(&agent.id, &lost.id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(stored.status, ActionStatus::Failed);
    // Settled once: a second word is refused, saying why.
    let again = u
        .post(
            &resolve,
            &[("csrf", &csrf), ("back", &format!("{base}/actions"))],
        )
        .await;
    assert_eq!(again.status, 400, "{}", again.body);
    assert!(again.body.contains("not UNKNOWN"), "{}", again.body);
}
