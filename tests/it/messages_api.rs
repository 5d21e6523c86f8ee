//! The messages API on both backends, over real HTTP on loopback: a program queues a
//! message with an API token and long-polls the reply; every refusal leaves the queue
//! empty; the OpenAPI document served matches the routes.

use std::sync::Arc;

use jiff::SignedDuration;
use pulse_shared::config::{ApiRate, InboundConfig};
use pulse_shared::domain::{Agent, ApiToken, NewAgent};
use pulse_shared::engine::Worker;
use pulse_shared::http::Inbound;
use pulse_tests::fake_discord::FakeDiscord;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::{Backend, Kind, on_both_backends, settings};
use serde_json::{Value, json};

struct Api {
    b: Backend,
    llm: FakeLlm,
    discord: FakeDiscord,
    worker: Worker,
    agent: Agent,
    base: String,
    http: reqwest::Client,
}

async fn api(kind: Kind, rate: u32) -> Api {
    api_over(Backend::new(kind).await, rate, None).await
}

/// [`api`] over `b`, its worker answering with `services` (the fake model's by default).
async fn api_over(b: Backend, rate: u32, services: Option<pulse_shared::app::Services>) -> Api {
    let llm = FakeLlm::start().await;
    let discord = FakeDiscord::start().await;
    let services = services.unwrap_or_else(|| pulse_tests::fake_services(&llm, &discord));
    let worker = b
        .connected()
        .worker(b.clock.clone(), &settings(), &services);
    let mut new = NewAgent::named("scout");
    // The agent has a Discord channel: a message sent over the API is still answered
    // over the API, not in the channel.
    new.discord_channel = Some("1001".into());
    let (agent, first) = new.create(b.now()).unwrap();
    b.store.create_agent(&agent, &first).await.unwrap();
    let base = receiver(&b, rate).await;
    Api {
        b,
        llm,
        discord,
        worker,
        agent,
        base,
        http: reqwest::Client::new(),
    }
}

/// A receiver of its own (as a second Lambda instance or `serve` process would be) over
/// `b`'s store and queue; its base URL.
async fn receiver(b: &Backend, rate: u32) -> String {
    let config = InboundConfig {
        delivery_memory: InboundConfig::DEFAULT_DELIVERY_MEMORY,
        api_rate: ApiRate(rate),
        ..InboundConfig::default()
    };
    let inbound = Arc::new(Inbound::new(
        b.store.clone(),
        b.queue.clone(),
        b.clock.clone(),
        config,
    ));
    pulse_tests::serve_inbound(inbound).await
}

impl Api {
    /// A token for `agent`, living a day.
    async fn token(&self, agent: &Agent) -> (ApiToken, String) {
        let (t, secret) = ApiToken::issue(
            &agent.id,
            "test",
            Some(SignedDuration::from_hours(24)),
            self.b.now(),
        )
        .unwrap();
        self.b.store.put_token(&t).await.unwrap();
        (t, secret)
    }

    async fn send(
        &self,
        token: Option<&str>,
        agent: &str,
        body: Vec<u8>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        self.send_to(&self.base, token, agent, body).await
    }

    async fn send_to(
        &self,
        base: &str,
        token: Option<&str>,
        agent: &str,
        body: Vec<u8>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut r = self
            .http
            .post(format!("{base}/v1/agents/{agent}/messages"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, r.json().await.unwrap(), headers)
    }

    /// The OpenAPI document the receiver serves.
    async fn openapi(&self) -> Value {
        let r = self.http.get(format!("{}/v1/openapi.json", self.base));
        r.send().await.unwrap().json().await.unwrap()
    }

    async fn turn(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }
}

fn text(t: &str) -> Vec<u8> {
    json!({ "text": t }).to_string().into_bytes()
}

on_both_backends!(
    a_program_sends_a_message_and_long_polls_the_reply,
    sends_and_waits
);
async fn sends_and_waits(kind: Kind) {
    let a = api(kind, 60).await;
    let (_, token) = a.token(&a.agent).await;
    a.llm.script([Scripted::text("Hello from Scout.")]);
    let body =
        json!({"text": "hi there", "user": "Ada", "images": ["https://cdn.example/cat.png"]});
    let (status, queued, _) = a
        .send(
            Some(&token),
            a.agent.id.as_str(),
            body.to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(queued["status"], "queued");
    let turn_id = queued["turn_id"].as_str().unwrap().to_owned();
    let poll = queued["poll"].as_str().unwrap().to_owned();
    assert_eq!(poll, format!("/v1/turns/{turn_id}?wait=30s"));
    // Nothing answered yet: a read without waiting says so.
    let (s, now) = a.turn(&token, &format!("/v1/turns/{turn_id}")).await;
    assert_eq!((s, now["status"].as_str()), (200, Some("queued")), "{now}");
    // A long poll is answered as soon as the worker has answered.
    let waiting = {
        let (http, url, token) = (a.http.clone(), format!("{}{poll}", a.base), token.clone());
        tokio::spawn(async move {
            let r = http.get(url).bearer_auth(token).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    assert_eq!(a.b.drain(&a.worker).await, 1);
    let (s, turn) = waiting.await.unwrap();
    assert_eq!(s, 200, "{turn}");
    assert_eq!(turn["status"], "done", "{turn}");
    assert_eq!(turn["reply"], "Hello from Scout.");
    assert_eq!(turn["answered_by"], turn_id.as_str());
    // The model read the text and the picture.
    let asked = a.llm.requests().last().unwrap().body.to_string();
    assert!(asked.contains("hi there"), "{asked}");
    assert!(asked.contains("cdn.example/cat.png"), "{asked}");
    // Answered over the API only: nothing went to the agent's Discord channel.
    assert!(
        a.discord.messages().is_empty(),
        "{:?}",
        a.discord.messages()
    );
}

on_both_backends!(
    the_api_names_the_agent_by_id_name_or_alias,
    named_in_the_url
);
async fn named_in_the_url(kind: Kind) {
    let a = api(kind, 600).await;
    let mut new = NewAgent::named("Ranger");
    new.alias = Some("@rng".into());
    let (agent, first) = new.create(a.b.now()).unwrap();
    a.b.store.create_agent(&agent, &first).await.unwrap();
    let (_, token) = a.token(&agent).await;
    for named in [agent.id.as_str(), "ranger", "Ranger", "rng", "@rng"] {
        let (s, body, _) = a.send(Some(&token), named, text("hi")).await;
        assert_eq!(s, 202, "{named}: {body}");
    }
    assert_eq!(a.b.queued_messages().await, 5);
    // Another agent's name or id is still refused with this token.
    for named in [a.agent.name.as_str(), a.agent.id.as_str(), "nobody"] {
        let (s, body, _) = a.send(Some(&token), named, text("hi")).await;
        assert_eq!(s, 403, "{named}: {body}");
        let e = body["error"].as_str().unwrap_or_default();
        assert!(e.contains("by its id, name or alias"), "{e}");
    }
    assert_eq!(a.b.queued_messages().await, 5);
}

on_both_backends!(
    the_api_refuses_bad_tokens_and_bad_bodies_and_queues_nothing,
    refusals
);
async fn refusals(kind: Kind) {
    let a = api(kind, 600).await;
    let (mine, token) = a.token(&a.agent).await;
    let id = a.agent.id.as_str();
    let expect = |status: u16, want: u16, body: &Value, says: &str| {
        assert_eq!(status, want, "{body}");
        let e = body["error"].as_str().unwrap_or_default();
        assert!(e.contains(says), "{want}: {e:?} should say {says:?}");
    };
    let (s, body, headers) = a.send(None, id, text("hi")).await;
    expect(s, 401, &body, "Authorization: Bearer");
    assert!(headers.contains_key("www-authenticate"));
    let forged = format!("{}.{}", mine.id, "A".repeat(43));
    let (s, body, _) = a.send(Some(&forged), id, text("hi")).await;
    expect(s, 401, &body, "not valid");
    let (s, body, _) = a.send(Some("nonsense"), id, text("hi")).await;
    expect(s, 401, &body, "not valid");
    // Another agent's token.
    let (other, first) = NewAgent::named("other").create(a.b.now()).unwrap();
    a.b.store.create_agent(&other, &first).await.unwrap();
    let (_, theirs) = a.token(&other).await;
    let (s, body, _) = a.send(Some(&theirs), id, text("hi")).await;
    expect(s, 403, &body, "speaks to agent");
    // Bodies: too big, text too long, empty, not JSON, a bad image.
    let (s, body, _) = a.send(Some(&token), id, vec![b' '; 65 * 1024]).await;
    expect(s, 413, &body, "64 KiB");
    let (s, body, _) = a.send(Some(&token), id, text(&"x".repeat(16_001))).await;
    expect(s, 413, &body, "16000 characters");
    let (s, body, _) = a.send(Some(&token), id, text("   ")).await;
    expect(s, 400, &body, "empty");
    let (s, body, _) = a.send(Some(&token), id, b"hello".to_vec()).await;
    expect(s, 400, &body, "{\"text\"");
    let bad_image = json!({"text": "look", "images": ["file:///etc/passwd"]});
    let (s, body, _) = a
        .send(Some(&token), id, bad_image.to_string().into_bytes())
        .await;
    expect(s, 400, &body, "http(s) URL");
    // Revoked, then expired.
    let (t2, revoked) = a.token(&a.agent).await;
    a.b.store.revoke_token(&t2.id, a.b.now()).await.unwrap();
    let (s, body, _) = a.send(Some(&revoked), id, text("hi")).await;
    expect(s, 401, &body, "revoked");
    a.b.advance(SignedDuration::from_hours(25));
    let (s, body, _) = a.send(Some(&token), id, text("hi")).await;
    expect(s, 401, &body, "expired");
    assert_eq!(a.b.queued_messages().await, 0, "a refusal queues nothing");
    // An unknown turn id, and a bad wait.
    let (_, fresh) = a.token(&a.agent).await;
    let (s, body) = a.turn(&fresh, "/v1/turns/tn_nope").await;
    expect(s, 404, &body, "no turn");
    let old = pulse_shared::domain::first_id_at("tn_", a.b.now() - SignedDuration::from_hours(48));
    let (s, body) = a.turn(&fresh, &format!("/v1/turns/{old}")).await;
    expect(s, 404, &body, "no turn");
    let (s, body) = a.turn(&fresh, &format!("/v1/turns/{old}?wait=5m")).await;
    expect(s, 400, &body, "0s to 60s");
}

on_both_backends!(
    a_token_over_its_rate_is_told_when_to_come_back,
    rate_limited
);
/// A past defect: each receiver counted a token's requests alone, so the limit grew
/// with the number of warm Lambda instances (or `serve` processes).
async fn rate_limited(kind: Kind) {
    // 3 a minute, counted in the store: two receivers share them.
    let a = api(kind, 3).await;
    let other = receiver(&a.b, 3).await;
    let (_, token) = a.token(&a.agent).await;
    let id = a.agent.id.as_str();
    // At the start of a minute, so that all four fall in it.
    let into = a.b.now().as_second().rem_euclid(60);
    a.b.advance(SignedDuration::from_secs(60 - into));
    a.b.advance(SignedDuration::from_secs(5));
    for (base, said) in [(&a.base, "one"), (&other, "two"), (&a.base, "three")] {
        let (s, body, _) = a.send_to(base, Some(&token), id, text(said)).await;
        assert_eq!(s, 202, "{said}: {body}");
    }
    let (s, body, headers) = a.send_to(&other, Some(&token), id, text("four")).await;
    assert_eq!(
        s, 429,
        "the other receiver counts the first's requests: {body}"
    );
    assert_eq!(
        headers["retry-after"], "55",
        "the seconds to the next minute"
    );
    assert_eq!(
        a.b.queued_messages().await,
        3,
        "only the first three were queued"
    );
    a.b.advance(SignedDuration::from_secs(55));
    let (s, _, _) = a.send_to(&other, Some(&token), id, text("five")).await;
    assert_eq!(s, 202, "a new minute, a new count");
}

#[tokio::test]
async fn the_openapi_document_describes_the_routes_the_receiver_serves() {
    let a = api(Kind::Sqlite, 600).await;
    let doc = a.openapi().await;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert_eq!(paths.len(), 5, "{:?}", paths.keys().collect::<Vec<_>>());
    for (path, ops) in paths {
        let concrete = path
            .replace("{agent_id}", a.agent.id.as_str())
            .replace("{turn_id}", "tn_01JAAAAAAAAAAAAAAAAAAAAAAA")
            .replace("{approval_id}", "ap_01JAAAAAAAAAAAAAAAAAAAAAAA");
        for method in ["get", "post", "put", "delete", "patch"] {
            let r = a
                .http
                .request(
                    method.to_uppercase().parse().unwrap(),
                    format!("{}{concrete}", a.base),
                )
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            match ops.get(method) {
                // Documented: served, and the status is one the document lists.
                Some(op) => {
                    let listed = op["responses"].as_object().unwrap();
                    assert!(
                        listed.contains_key(&status.to_string()),
                        "{method} {path} answered {status}, not in {:?}",
                        listed.keys().collect::<Vec<_>>()
                    );
                }
                // Not documented: the router does not serve it either.
                None => assert_eq!(status, 405, "{method} {path} is served but not documented"),
            }
        }
    }
}

/// The schema the OpenAPI document gives `path`'s `method` for a request body (`None`)
/// or for the answer of `status`, compiled with the document's components so its `$ref`s
/// resolve: JSON Schema 2020-12, as OpenAPI 3.1 uses, formats checked.
fn documented(doc: &Value, path: &str, method: &str, status: Option<u16>) -> jsonschema::Validator {
    let op = &doc["paths"][path][method];
    let mut part = match status {
        None => op["requestBody"].clone(),
        Some(s) => op["responses"][s.to_string()].clone(),
    };
    if let Some(r) = part["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        part = doc["components"]["responses"][name].clone();
    }
    let schema = &part["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} {status:?}: no JSON schema documented"
    );
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    });
    jsonschema::options()
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("{method} {path} {status:?}: the schema does not compile: {e}"))
}

/// Checks `body` against what the document says, naming every mismatch.
fn conforms(doc: &Value, path: &str, method: &str, status: Option<u16>, body: &Value) {
    let v = documented(doc, path, method, status);
    let errors: Vec<String> = v
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status:?}: {body} is not what the document says: {errors:?}"
    );
}

/// Real requests and answers of the messages API, each validated against the schema the
/// OpenAPI document gives it: a message queued (202), its turn while queued and when
/// done (200), the errors' bodies (400, 401, 403, 404, 413), the approvals listed (200);
/// and the validator refuses what the document rules out (a reply of the wrong type, an
/// unknown field in a message), so it is not a check that cannot fail.
#[tokio::test]
async fn the_messages_api_s_bodies_are_what_its_openapi_document_says() {
    let a = api(Kind::Sqlite, 600).await;
    let doc = a.openapi().await;
    let messages = "/v1/agents/{agent_id}/messages";
    let turns = "/v1/turns/{turn_id}";
    let (_, token) = a.token(&a.agent).await;
    let id = a.agent.id.as_str();

    let sent = json!({"text": "what's on today?", "user": "ada"});
    conforms(&doc, messages, "post", None, &sent);
    let (s, queued, _) = a
        .send(Some(&token), id, serde_json::to_vec(&sent).unwrap())
        .await;
    assert_eq!(s, 202, "{queued}");
    conforms(&doc, messages, "post", Some(202), &queued);
    // Read at once (the document's `poll` waits for the reply).
    let poll = format!("/v1/turns/{}", queued["turn_id"].as_str().unwrap());
    let (s, waiting) = a.turn(&token, &poll).await;
    assert_eq!(s, 200);
    assert_eq!(waiting["status"], "queued", "{waiting}");
    conforms(&doc, turns, "get", Some(200), &waiting);
    a.llm.script([Scripted::text("A quiet day.")]);
    a.b.drain(&a.worker).await;
    let (s, done) = a.turn(&token, &poll).await;
    assert_eq!((s, done["status"].as_str()), (200, Some("done")), "{done}");
    conforms(&doc, turns, "get", Some(200), &done);

    // Errors: each status with the body the document gives it.
    let (s, empty, _) = a.send(Some(&token), id, text("  ")).await;
    assert_eq!(s, 400);
    conforms(&doc, messages, "post", Some(400), &empty);
    let (s, nobody, _) = a.send(None, id, text("hi")).await;
    assert_eq!(s, 401);
    conforms(&doc, messages, "post", Some(401), &nobody);
    let mut other = NewAgent::named("other");
    other.discord_channel = None;
    let (other, first) = other.create(a.b.now()).unwrap();
    a.b.store.create_agent(&other, &first).await.unwrap();
    let (s, elsewhere, _) = a.send(Some(&token), other.id.as_str(), text("hi")).await;
    assert_eq!(s, 403);
    conforms(&doc, messages, "post", Some(403), &elsewhere);
    let (s, huge, _) = a.send(Some(&token), id, text(&"x".repeat(16_001))).await;
    assert_eq!(s, 413);
    conforms(&doc, messages, "post", Some(413), &huge);
    let (s, unknown) = a
        .turn(&token, "/v1/turns/tn_01JAAAAAAAAAAAAAAAAAAAAAAA")
        .await;
    assert_eq!(s, 404);
    conforms(&doc, turns, "get", Some(404), &unknown);
    let (s, listed) = a.turn(&token, "/v1/approvals").await;
    assert_eq!(s, 200);
    conforms(&doc, "/v1/approvals", "get", Some(200), &listed);

    // The check can fail.
    let mut wrong = done.clone();
    wrong["reply"] = json!(42);
    let v = documented(&doc, turns, "get", Some(200));
    assert!(!v.is_valid(&wrong), "a numeric reply passed");
    let v = documented(&doc, messages, "post", None);
    assert!(!v.is_valid(&json!({"text": "hi", "colour": "red"})));
}

on_both_backends!(
    a_message_the_model_cannot_answer_yet_reads_as_waiting_with_why_and_then_done,
    waiting_turn
);
async fn waiting_turn(kind: Kind) {
    let a = api(kind, 60).await;
    let (_, token) = a.token(&a.agent).await;
    a.llm.down(Some(500));
    let (status, queued, _) = a
        .send(Some(&token), a.agent.id.as_str(), text("still there?"))
        .await;
    assert_eq!(status, 202, "{queued}");
    let turn = format!("/v1/turns/{}", queued["turn_id"].as_str().unwrap());
    a.b.drain(&a.worker).await;
    let (s, v) = a.turn(&token, &turn).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("waiting")), "{v}");
    assert_eq!(v["waiting"]["tries"], 1, "{v}");
    assert!(
        v["waiting"]["reason"].as_str().unwrap().contains("500"),
        "{v}"
    );
    assert!(v["reply"].is_null());
    // The model is back: the sweep tries it again once its gap has passed.
    a.llm.down(None);
    a.llm.script([Scripted::text("Here.")]);
    a.b.advance(jiff::SignedDuration::from_secs(31));
    let swept = a.b.sweeper(settings()).sweep_once(a.b.now()).await;
    assert_eq!(swept.retried, 1);
    a.b.drain(&a.worker).await;
    let (s, v) = a.turn(&token, &turn).await;
    assert_eq!(
        (s, v["status"].as_str(), v["reply"].as_str()),
        (200, Some("done"), Some("Here.")),
        "{v}"
    );
}

/// A past defect: a long poll looked again every 200 ms (three reads each for a turn a
/// newer message superseded: 16 such polls took one to two cores). On the embedded store
/// a poll now waits for a turn to be written, and is answered the moment it is.
#[tokio::test(start_paused = true)]
async fn a_long_poll_is_answered_the_moment_its_turn_is_written() {
    use tokio::time::{Duration, Instant};
    let a = api_over(
        Backend::sqlite_inline(),
        60,
        Some(pulse_tests::offline_services()),
    )
    .await;
    let (_, token) = a.token(&a.agent).await;
    let (status, queued, _) = a
        .send(Some(&token), a.agent.id.as_str(), text("are you there?"))
        .await;
    assert_eq!(status, 202, "{queued}");
    let path = format!("/v1/turns/{}?wait=30s", queued["turn_id"].as_str().unwrap());
    let start = Instant::now();
    let ((v, answered), written) = tokio::join!(
        async {
            let (_, v) = a.turn(&token, &path).await;
            (v, Instant::now())
        },
        async {
            // Written between what would have been two looks 200 ms apart.
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            let written = Instant::now();
            assert_eq!(a.b.drain(&a.worker).await, 1);
            written
        }
    );
    assert_eq!(v["status"], "done", "{v}");
    assert!(
        answered.duration_since(written) < Duration::from_millis(50),
        "answered {:?} after the write, {:?} after the poll began",
        answered.duration_since(written),
        answered.duration_since(start)
    );
}
