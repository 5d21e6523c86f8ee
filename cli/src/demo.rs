//! `pulse demo`: the whole system once, offline, in a few seconds, on a temporary
//! embedded store. Everything on the way is the real thing — the HTTP router that
//! `pulse serve` runs, signature checks, the sessions and hooks queues, the sweeper,
//! the worker with the heartbeat agent, the conversation, the hook dispatcher behind
//! the SSRF guard — except the far ends: the model is the offline provider, Discord is a
//! loopback stand-in that records what it is sent, and the hook receiver is a loopback
//! server that checks each delivery's signature.
//!
//! The engine runs on a manual clock started at the present, so two heartbeats a
//! quarter of an hour apart take no time; requests are signed on that clock.

use crate::output::outln;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{patch, post};
use jiff::{SignedDuration, Timestamp};
use pulse_shared::app::{Connected, Services, connect};
use pulse_shared::config::{Backend, Config};
use pulse_shared::discord::{DiscordClient, DiscordConfig};
use pulse_shared::domain::{
    Agent, Hook, HookTarget, HookType, NewAgent, Secret, Webhook, WebhookScheme,
};
use pulse_shared::engine::{DispatchSettings, Dispatcher, Sweeper, Worker};
use pulse_shared::http::{self, Inbound};
use pulse_shared::llm::{LlmConfig, Router as LlmRouter};
use pulse_shared::ports::{Clock, ManualClock};
use pulse_signatures::discord::DiscordSigner;
use pulse_signatures::inbound::{Scheme, generate_secret, sign, verify};
use serde_json::{Value, json};

use crate::Failure;

const CHANNEL: &str = "1300000000000000001";
const APPLICATION: &str = "1200000000000000000";
const VISIBILITY: Duration = Duration::from_secs(300);

/// What the Discord stand-in was sent: (where, content).
type Posts = Arc<Mutex<Vec<(String, String)>>>;
/// What the hook receiver got: (headers, body).
type Deliveries = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

async fn discord_stand_in(posts: Posts) -> Result<String, Failure> {
    async fn record(posts: &Posts, place: String, body: &Value) -> axum::Json<Value> {
        let content = body["content"].as_str().unwrap_or_default().to_owned();
        let mut p = posts.lock().unwrap_or_else(|e| e.into_inner());
        p.push((place, content.clone()));
        axum::Json(json!({
            "id": (1_400_000_000_000_000_000u64 + p.len() as u64).to_string(),
            "channel_id": CHANNEL,
            "content": content,
        }))
    }
    let app = Router::new()
        .route(
            "/api/v10/channels/{channel}/messages",
            post(
                |State(p): State<Posts>,
                 Path(c): Path<String>,
                 axum::Json(b): axum::Json<Value>| async move {
                    record(&p, format!("#{c}"), &b).await
                },
            ),
        )
        .route(
            "/api/v10/webhooks/{app}/{token}/messages/@original",
            patch(
                |State(p): State<Posts>,
                 Path((_, t)): Path<(String, String)>,
                 axum::Json(b): axum::Json<Value>| async move {
                    record(&p, format!("reply to interaction {t}"), &b).await
                },
            ),
        )
        .route(
            "/api/v10/webhooks/{app}/{token}",
            post(
                |State(p): State<Posts>,
                 Path((_, t)): Path<(String, String)>,
                 axum::Json(b): axum::Json<Value>| async move {
                    record(&p, format!("follow-up to interaction {t}"), &b).await
                },
            ),
        )
        .with_state(posts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/api/v10", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

async fn hook_receiver(got: Deliveries) -> Result<String, Failure> {
    let app = Router::new()
        .route(
            "/hooks",
            post(
                |State(g): State<Deliveries>, headers: HeaderMap, body: bytes::Bytes| async move {
                    g.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((headers, body.to_vec()));
                    "ok"
                },
            ),
        )
        .with_state(got);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hooks", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

fn section(title: &str) {
    outln!("\n== {title}");
}

fn header(h: &HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Runs the demo and prints its transcript.
pub(crate) async fn demo() -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let demo = Demo::start().await?;
    demo.introduce();
    let cast = demo.set_up().await?;
    demo.signed_webhook(&cast).await?;
    demo.heartbeat(&cast).await?;
    demo.quiet_heartbeat().await?;
    demo.slash_command().await?;
    demo.discord_received();
    let (delivered, verified) = demo.hook_deliveries(&cast).await?;
    finish(started, delivered, verified)
}

/// The running demo: the store, the engine on its manual clock, the HTTP receiver, the
/// two far-end stand-ins and a client.
struct Demo {
    /// Holds the store; removed when the demo ends.
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    posts: Posts,
    deliveries: Deliveries,
    discord_base: String,
    hook_url: String,
    signer: DiscordSigner,
    backend: Connected,
    sweeper: Sweeper,
    worker: Worker,
    dispatcher: Dispatcher,
    /// The HTTP receiver's address.
    base: String,
    client: reqwest::Client,
}

/// What the set-up created: the agent, its webhook (and secret) and its hooks.
struct Cast {
    agent: Agent,
    webhook: Webhook,
    webhook_secret: String,
    hooks: Vec<Hook>,
}

/// The demo's configuration: the store in `dir`, Discord at the stand-in, signed by
/// `signer`, and hooks allowed to reach loopback.
fn demo_config(
    dir: &std::path::Path,
    signer: &DiscordSigner,
    discord_base: &str,
) -> Result<Config, Failure> {
    let mut config = Config {
        backend: Backend::Sqlite {
            path: dir.join("demo.db"),
        },
        ..Config::defaults()
    };
    config.inbound.discord_public_key = Some(signer.public_key_hex());
    config.hooks.allow = "127.0.0.1/32"
        .parse()
        .map_err(|e: pulse_egress::AllowListError| Failure::Input(e.to_string()))?;
    config.discord = DiscordConfig {
        api_base: discord_base.parse()?,
        bot_token: Some(Secret::new("demo-bot-token")),
        application_id: Some(APPLICATION.to_owned()),
        ..DiscordConfig::unconfigured()
    };
    Ok(config)
}

/// Starts the HTTP receiver of `pulse serve` on loopback; returns its address.
async fn start_receiver(
    backend: &Connected,
    clock: Arc<dyn Clock>,
    config: &Config,
) -> Result<String, Failure> {
    let inbound = Arc::new(Inbound::new(
        backend.store.clone(),
        backend.queue.clone(),
        clock,
        config.inbound.clone(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(http::serve(
        listener,
        inbound,
        http::ServeLimits::default(),
        std::future::pending(),
    ));
    Ok(base)
}

impl Demo {
    /// Starts the stand-ins, the store, the engine and the HTTP receiver.
    async fn start() -> Result<Self, Failure> {
        let dir = tempfile::tempdir()?;
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let posts: Posts = Arc::default();
        let deliveries: Deliveries = Arc::default();
        let discord_base = discord_stand_in(posts.clone()).await?;
        let hook_url = hook_receiver(deliveries.clone()).await?;
        let signer = DiscordSigner::from_seed(rand_seed());
        let config = demo_config(dir.path(), &signer, &discord_base)?;
        let egress = pulse_egress::Egress::new(config.hooks.allow.clone());
        let services = Services {
            llm: Arc::new(LlmRouter::new(LlmConfig::offline(), egress.clone())),
            discord: Some(Arc::new(DiscordClient::new(config.discord.clone()))),
            chats: Vec::new(),
            egress,
            images: pulse_shared::app::images(config.hooks.image_hosts.clone()),
            embedder: pulse_shared::embed::from_config(&config.embed),
        };
        let backend = connect(&config, clock.clone()).await?;
        let sweeper = backend.sweeper(&config.engine);
        let worker = backend.worker(clock.clone(), &config.engine, &services);
        let dispatcher = backend
            .dispatcher(clock.clone(), &services.egress, DispatchSettings::default())
            .ok_or_else(|| {
                Failure::Runtime(anyhow::anyhow!("the embedded store has no hooks queue"))
            })?;
        let base = start_receiver(&backend, clock.clone(), &config).await?;
        Ok(Self {
            dir,
            clock,
            posts,
            deliveries,
            discord_base,
            hook_url,
            signer,
            backend,
            sweeper,
            worker,
            dispatcher,
            base,
            client: reqwest::Client::new(),
        })
    }

    /// Says where everything runs.
    fn introduce(&self) {
        outln!(
            "Pulse demo: offline, on a temporary store ({}).",
            self.dir.path().display()
        );
        outln!(
            "HTTP receiver {}; Discord stand-in {}; hook receiver {}.",
            self.base,
            self.discord_base,
            self.hook_url
        );
    }

    /// Scene 1: creates the agent, its inbound webhook and its outbound hooks.
    async fn set_up(&self) -> Result<Cast, Failure> {
        let (clock, store, base, hook_url) =
            (&self.clock, &self.backend.store, &self.base, &self.hook_url);
        section("1. Set-up: an agent, its inbound webhook and its outbound hooks");
        let mut new = NewAgent::named("Scout");
        new.discord_channel = Some(CHANNEL.to_owned());
        new.instructions = Some(
            "Watch the deploy pipeline. Tell the user when something they care about changes."
                .into(),
        );
        let (agent, first) = new.create(clock.now())?;
        store.create_agent(&agent, &first).await?;
        outln!(
            "agent {} ({}), Discord channel {CHANNEL}, heartbeat every {}",
            agent.id,
            agent.name,
            agent.interval
        );
        let webhook_secret = generate_secret();
        let webhook = Webhook::new(
            agent.id.clone(),
            WebhookScheme::Standard,
            &webhook_secret,
            clock.now(),
        )?;
        store.create_webhook(&webhook).await?;
        outln!(
            "webhook {} (Standard Webhooks signatures): POST {base}/webhooks/{}",
            webhook.id,
            webhook.id
        );
        let mut hooks = Vec::new();
        for t in [
            HookType::AFTER_HEARTBEAT,
            HookType::MESSAGE_RECEIVED,
            HookType::MESSAGE_SENT,
        ] {
            let h = Hook::new(
                agent.id.clone(),
                HookType::of(t),
                HookTarget::parse(hook_url)?,
                &generate_secret(),
                clock.now(),
            );
            store.create_hook(&h).await?;
            outln!("hook {} on {} → {hook_url}", h.id, h.hook_type);
            hooks.push(h);
        }
        Ok(Cast {
            agent,
            webhook,
            webhook_secret,
            hooks,
        })
    }

    /// Scene 2: an external system posts a signed webhook to the receiver.
    async fn signed_webhook(&self, cast: &Cast) -> Result<(), Failure> {
        let (clock, webhook) = (&self.clock, &cast.webhook);
        section("2. An external system sends a signed webhook");
        clock.advance(SignedDuration::from_secs(30));
        let body = json!({
            "event_type": "DEPLOY_FINISHED",
            "priority": 2,
            "payload": {"service": "api", "version": "2.4.1",
                        "summary": "speak: The api deploy (v2.4.1) finished; the user asked to hear about deploys."}
        })
        .to_string();
        let mut req = self
            .client
            .post(format!("{}/webhooks/{}", self.base, webhook.id))
            .body(body.clone());
        for (k, v) in sign(
            WebhookScheme::Standard.signing(),
            &cast.webhook_secret,
            body.as_bytes(),
            clock.now().as_second(),
            "msg_demo_deploy_1",
        )? {
            req = req.header(k, v);
        }
        let resp = req
            .header("content-type", "application/json")
            .send()
            .await?;
        outln!(
            "POST /webhooks/{} → {} {}",
            webhook.id,
            resp.status().as_u16(),
            resp.text().await?
        );
        Ok(())
    }

    /// Scene 3: a sweep and the worker run the heartbeat; prints its events, actions,
    /// thoughts and heartbeats.
    async fn heartbeat(&self, cast: &Cast) -> Result<(), Failure> {
        let (clock, store, agent) = (&self.clock, &self.backend.store, &cast.agent);
        section("3. Heartbeat: the agent wakes, reads its events, and speaks");
        clock.advance(SignedDuration::from_mins(1));
        let swept = self.sweeper.sweep_once(clock.now()).await;
        outln!(
            "sweep: {} due, {} claimed, {} queued",
            swept.due,
            swept.claimed,
            swept.queued
        );
        let ran = drain(&self.worker, &self.backend).await?;
        outln!(
            "worker: {ran} session tasks run (the heartbeat job, then the turn its thought started)"
        );
        let mut events = store.list_events(&agent.id, 20).await?;
        events.sort_by_key(|e| e.created_at);
        for e in &events {
            outln!(
                "event {} {} from {}: {}",
                e.id,
                e.event_type,
                e.source,
                e.payload
            );
        }
        let actions = pulse_shared::engine::actions::recent(store.as_ref(), &agent.id, 20).await?;
        for a in actions.iter().rev() {
            outln!(
                "action {} {} {} (for event {})",
                a.id,
                a.tool,
                a.status.as_str(),
                a.event_id
            );
            if let Some(out) = a.response.as_ref().map(|r| &r["output"]) {
                for t in out["spoke"].as_array().into_iter().flatten() {
                    outln!("heartbeat thought: {}", t.as_str().unwrap_or_default());
                }
            }
        }
        for hb in store.list_heartbeats(&agent.id, 5).await?.iter().rev() {
            outln!("heartbeat {} {}", hb.id(), hb.status.as_str());
        }
        Ok(())
    }

    /// Scene 4: the next heartbeat finds nothing new and says nothing.
    async fn quiet_heartbeat(&self) -> Result<(), Failure> {
        section("4. A quiet heartbeat: nothing new, nothing said");
        self.clock.advance(SignedDuration::from_mins(16));
        let before = self.posts.lock().unwrap_or_else(|e| e.into_inner()).len();
        let swept = self.sweeper.sweep_once(self.clock.now()).await;
        let ran = drain(&self.worker, &self.backend).await?;
        let after = self.posts.lock().unwrap_or_else(|e| e.into_inner()).len();
        outln!(
            "sweep claimed {}; worker ran {ran}; Discord messages sent: {}",
            swept.claimed,
            after - before
        );
        Ok(())
    }

    /// Scene 5: the user asks with a signed `/ask` interaction, and the worker runs the
    /// turn.
    async fn slash_command(&self) -> Result<(), Failure> {
        let clock = &self.clock;
        section("5. The user asks with a signed Discord slash command");
        clock.advance(SignedDuration::from_mins(2));
        let minted = clock.now().as_millisecond() - 1_000 - 1_420_070_400_000;
        let command = json!({
            "id": ((minted as u64) << 22).to_string(),
            "application_id": APPLICATION,
            "type": 2,
            "token": "demo-interaction-token",
            "version": 1,
            "channel": {"id": CHANNEL, "type": 0},
            "channel_id": CHANNEL,
            "member": {"user": {"id": "1000000000000000001", "username": "ada", "global_name": "Ada"},
                       "roles": [], "joined_at": "2026-01-01T00:00:00+00:00", "deaf": false, "mute": false},
            "guild_id": "1100000000000000000",
            "data": {"id": "1250000000000000000", "name": "ask", "type": 1,
                     "options": [{"name": "text", "type": 3, "value": "Which version went out?"}]}
        })
        .to_string();
        let mut req = self
            .client
            .post(format!("{}/discord/interactions", self.base))
            .body(command.clone());
        for (k, v) in self
            .signer
            .sign(clock.now().as_second(), command.as_bytes())
        {
            req = req.header(k, v);
        }
        let resp = req
            .header("content-type", "application/json")
            .send()
            .await?;
        outln!(
            "/ask \"Which version went out?\" → {} {}",
            resp.status().as_u16(),
            resp.text().await?
        );
        let ran = drain(&self.worker, &self.backend).await?;
        outln!("worker: {ran} session task run (the user's turn)");
        Ok(())
    }

    /// Scene 6: prints what the Discord stand-in was sent.
    fn discord_received(&self) {
        section("6. What Discord received");
        for (place, content) in self.posts.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            outln!("{place}: {content}");
        }
    }

    /// Scene 7: delivers the queued hooks and checks each delivery's signature with its
    /// hook's secret; returns (delivered, verified).
    async fn hook_deliveries(&self, cast: &Cast) -> Result<(usize, usize), Failure> {
        section("7. Hook deliveries, signatures checked with each hook's secret");
        let attempts = self.dispatcher.drain(16, VISIBILITY).await?;
        let mut got = self
            .deliveries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // In the order they were emitted (delivery ids are time-ordered).
        got.sort_by_key(|(h, _)| header(h, "webhook-id"));
        let mut verified = 0;
        for (headers, body) in &got {
            let t = header(headers, "x-pulse-hook-type");
            let secret = cast
                .hooks
                .iter()
                .find(|h| h.hook_type.as_str() == t)
                .map(|h| h.secret.expose().to_owned())
                .unwrap_or_default();
            let check = verify(
                Scheme::Standard,
                &[&secret],
                headers,
                body,
                self.clock.now().as_second(),
            );
            let summary = delivery_summary(&t, body);
            match check {
                Ok(_) => {
                    verified += 1;
                    outln!(
                        "{t} {}: signature verified; {summary}",
                        header(headers, "webhook-id")
                    );
                }
                Err(e) => outln!(
                    "{t} {}: SIGNATURE REJECTED ({e})",
                    header(headers, "webhook-id")
                ),
            }
        }
        outln!(
            "{attempts} attempts, {} delivered, {verified} verified",
            got.len()
        );
        Ok((got.len(), verified))
    }
}

/// One line on what a hook delivery of type `t` carried.
fn delivery_summary(t: &str, body: &[u8]) -> String {
    let payload: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match t {
        "AFTER_HEARTBEAT" => format!(
            "events processed {}, actions {}",
            payload["data"]["events_processed"], payload["data"]["actions_triggered"]
        ),
        "MESSAGE_RECEIVED" => format!("received {}", payload["data"]["signals"][0]["text"]),
        "MESSAGE_SENT" => format!("sent {}", payload["data"]["parts"][0]),
        _ => payload["data"].to_string(),
    }
}

/// Prints the closing lines; fails unless every hook delivery (and at least one) was
/// verified.
fn finish(started: std::time::Instant, delivered: usize, verified: usize) -> Result<(), Failure> {
    section("Done");
    outln!(
        "in {:.1} s. Run it for real with `pulse serve`; see docs/src/getting-started.md.",
        started.elapsed().as_secs_f64()
    );
    if verified != delivered || delivered == 0 {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} of {} hook deliveries failed their signature check",
            delivered - verified,
            delivered
        )));
    }
    Ok(())
}

/// Runs queued session tasks until the queue is empty; returns how many ran.
async fn drain(
    worker: &pulse_shared::engine::Worker,
    backend: &pulse_shared::app::Connected,
) -> Result<usize, Failure> {
    let mut ran = 0;
    loop {
        let r = worker
            .poll_once(backend.queue.as_ref(), 10, VISIBILITY)
            .await?;
        if r.received == 0 {
            return Ok(ran);
        }
        if r.failed > 0 {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "{} session tasks failed; run with RUST_LOG=info to see why",
                r.failed
            )));
        }
        ran += r.received;
    }
}

fn rand_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    let id = ulid::Ulid::new().0.to_le_bytes();
    seed[..16].copy_from_slice(&id);
    seed[16..].copy_from_slice(&ulid::Ulid::new().0.to_le_bytes());
    seed
}
