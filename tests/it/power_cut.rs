//! Power cuts under `pulse serve`'s embedded store, at every point of a run of signed
//! webhooks and chat messages over real HTTP: whatever was answered 2xx is in the
//! database every cut leaves, and the database opens whole. And a disk whose syncs fail
//! gets the sender a 503, never a 200, until it syncs again.
//!
//! The store's files go through `pulse_sqlite_log::faults`, which records every write
//! and sync as the disk is asked for them, and builds the files a power cut at each point
//! would have left (see that module).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use jiff::SignedDuration;
use pulse_shared::adapters::sqlite::faults::{Fault, File, Image, Recording};
use pulse_shared::adapters::sqlite::{Db, SqliteQueue, SqliteStore};
use pulse_shared::config::{ApiRate, Durability, InboundConfig};
use pulse_shared::domain::{ApiToken, Webhook, WebhookScheme};
use pulse_shared::http::Inbound;
use pulse_shared::ports::{Clock, TokenStore};
use serde_json::{Value, json};

use crate::inbound::{SECRET, body_for, signed};

/// A receiver over a database opened through the recording file system in `dir`: its
/// base URL, the webhook, the agent's id and a token for its messages.
struct Rig {
    base: String,
    webhook: Webhook,
    agent: String,
    token: String,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
}

async fn rig(dir: &Path) -> Rig {
    rig_with(dir, Durability::Synced).await
}

async fn rig_with(dir: &Path, durability: Durability) -> Rig {
    let db = Db::open_with_faults(&dir.join("pulse.db"))
        .unwrap()
        .with_durability(durability)
        .unwrap();
    let clock = pulse_tests::test_clock();
    let store = Arc::new(SqliteStore::new(db.clone()).with_keys(pulse_tests::test_keys()));
    let queue = Arc::new(SqliteQueue::new(db, clock.clone()));
    let webhook = crate::inbound::unlimited_webhook(store.as_ref(), clock.now()).await;
    let agent = webhook.agent_id.clone();
    let (t, token) = ApiToken::issue(
        &agent,
        "test",
        Some(SignedDuration::from_hours(24)),
        clock.now(),
    )
    .unwrap();
    store.put_token(&t).await.unwrap();
    let inbound = Arc::new(Inbound::new(
        store,
        queue,
        clock.clone(),
        InboundConfig {
            // The run says more than a minute's worth of messages.
            api_rate: ApiRate(10_000),
            ..InboundConfig::default()
        },
    ));
    let base = pulse_tests::serve_inbound(inbound).await;
    Rig {
        base,
        webhook,
        agent: agent.to_string(),
        token,
        http: reqwest::Client::new(),
        clock,
    }
}

impl Rig {
    /// Sends webhook `n` (delivery id `d-n`): its status.
    async fn webhook(&self, n: u32) -> u16 {
        let body = body_for(WebhookScheme::Pulse, "NOTE", n);
        let headers = signed(
            WebhookScheme::Pulse,
            SECRET,
            self.clock.now().as_second(),
            &format!("d-{n}"),
            &body,
        );
        self.http
            .post(format!("{}/webhooks/{}", self.base, self.webhook.id))
            .headers(headers)
            .body(body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// Says `said-n` to the agent through the messages API: its status.
    async fn say(&self, n: u32) -> u16 {
        self.http
            .post(format!("{}/v1/agents/{}/messages", self.base, self.agent))
            .bearer_auth(&self.token)
            .json(&json!({ "text": format!("said-{n}") }))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    async fn health(&self) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}/healthz", self.base))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }
}

/// Marks for the recording: webhooks are their number, messages their number past this.
const SAID: u64 = 1_000_000;

/// What the files of an image hold: `Err` says what a cut broke.
fn verify(image: &Image, dir: &Path) -> Result<(), String> {
    image.write_to(dir).map_err(|e| e.to_string())?;
    let c = rusqlite::Connection::open(dir.join("pulse.db")).map_err(|e| e.to_string())?;
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("integrity_check: {ok}"));
    }
    if image.acknowledged().is_empty() {
        return Ok(());
    }
    let strings = |sql: &str| -> Result<HashSet<String>, String> {
        let mut st = c.prepare(sql).map_err(|e| e.to_string())?;
        st.query_map([], |r| r.get(0))
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())
    };
    // A delivery id is kept with the event it became, in the same transaction.
    let delivered = strings(
        "SELECT d.delivery_id FROM webhook_deliveries d \
         JOIN events e ON e.id = d.event_id",
    )?;
    let queued = strings("SELECT body FROM queue_messages")?
        .into_iter()
        .collect::<Vec<_>>();
    for &id in image.acknowledged() {
        let kept = if id >= SAID {
            let said = format!("said-{}\"", id - SAID);
            queued.iter().any(|b| b.contains(&said))
        } else {
            delivered.contains(&format!("d-{id}"))
        };
        if !kept {
            let what = if id >= SAID {
                format!("message said-{}", id - SAID)
            } else {
                format!("webhook d-{id}")
            };
            return Err(format!("{what} was acknowledged and is lost"));
        }
    }
    Ok(())
}

fn replay(rec: &Recording, seed: u64) -> (usize, Vec<String>) {
    // The images are written and read thousands of times: in memory where there is one.
    let shm = Path::new("/dev/shm");
    let out = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mut failures = Vec::new();
    let checked = rec.replay(seed, |image| {
        if let Err(why) = verify(image, out.path()) {
            failures.push(format!("at {} ({:?}): {why}", image.point, image.cut));
        }
    });
    (checked, failures)
}

/// Sends `n` webhooks and messages, eight at a time, marking each answered 2xx; every
/// one must be.
async fn send_all(r: Arc<Rig>, rec: &Arc<Recording>, n: u32) {
    let answered: Vec<(u64, u16)> = futures::stream::iter(1..=n)
        .map(|n| {
            let (r, rec) = (r.clone(), rec.clone());
            async move {
                let (id, status) = if n % 4 == 0 {
                    (SAID + u64::from(n), r.say(n).await)
                } else {
                    (u64::from(n), r.webhook(n).await)
                };
                if (200..300).contains(&status) {
                    rec.mark(id);
                }
                (id, status)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let refused: Vec<_> = answered
        .iter()
        .filter(|(_, s)| !(200..300).contains(s))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_webhook_and_message_answered_2xx_survives_a_power_cut_at_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recording::start(dir.path()).unwrap());
    // Eight senders at once, so acceptances share commits (and syncs), and messages
    // between them.
    send_all(Arc::new(rig(dir.path()).await), &rec, 480).await;
    let (writes, syncs) = rec.writes_and_syncs();
    let (checked, failures) = replay(&rec, 3);
    eprintln!("480 answered 2xx: {writes} writes, {syncs} syncs, {checked} cuts checked");
    // How many commits the 480 make depends on how the host schedules the senders (a
    // loaded host groups more of them into one commit), so the bounds are what any
    // grouping must reach: at most eight acceptances a commit, each commit a write.
    assert!(writes >= 60 && syncs > 20, "{writes} writes, {syncs} syncs");
    // Each point after a write is cut four ways (lost, a prefix, a subset, torn), and
    // each acceptance marked is a point of its own.
    assert!(
        checked >= 4 * writes + 480,
        "{checked} cuts of {writes} writes"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} cuts: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_durability_loses_what_was_answered_to_a_power_cut_and_nothing_more() {
    // What `PULSE_DURABILITY=relaxed` gives up, shown: the log is synced only when it is
    // copied or has grown by 4 MB, so a cut loses the acknowledged items since.
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recording::start(dir.path()).unwrap());
    send_all(
        Arc::new(rig_with(dir.path(), Durability::Relaxed).await),
        &rec,
        120,
    )
    .await;
    let (_, syncs) = rec.writes_and_syncs();
    let (checked, failures) = replay(&rec, 3);
    eprintln!(
        "relaxed, 120 answered 2xx: {syncs} syncs, {} of {checked} cuts lost some",
        failures.len()
    );
    assert!(
        failures.len() > checked / 2,
        "{} of {checked}",
        failures.len()
    );
    // A cut loses items, never the database's integrity.
    let broken: Vec<_> = failures.iter().filter(|f| !f.contains("is lost")).collect();
    assert!(broken.is_empty(), "{broken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_whose_syncs_fail_gets_the_sender_a_503_and_health_says_why_until_it_syncs_again() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recording::start(dir.path()).unwrap();
    let r = rig(dir.path()).await;
    for n in 1..=5 {
        assert_eq!(r.webhook(n).await, 200);
        rec.mark(u64::from(n));
    }
    // The batch's commit fails at its sync, and so does its commit again one by one;
    // and the probe's write, which health tries while it is degraded.
    rec.inject(Fault::FailedSync { file: File::Log });
    rec.inject(Fault::FailedSync { file: File::Log });
    rec.inject(Fault::FailedSync { file: File::Log });
    assert_eq!(
        r.webhook(6).await,
        503,
        "a webhook answered before it was synced"
    );
    assert_eq!(rec.faults_met(), 2);
    let (status, v) = r.health().await;
    assert_eq!(
        rec.faults_met(),
        3,
        "health tried a write, which failed too"
    );
    assert_eq!(
        (status, v["status"].as_str()),
        (503, Some("degraded")),
        "{v}"
    );
    assert!(v["reason"].as_str().unwrap().contains("I/O"), "{v}");
    // A message meets the same disk: 503, not 202 (a group's commit that fails is
    // tried again call by call, so it takes two failures here too).
    rec.inject(Fault::FailedSync { file: File::Log });
    rec.inject(Fault::FailedSync { file: File::Log });
    assert_eq!(r.say(7).await, 503);
    assert_eq!(rec.faults_met(), 5);
    // The disk syncs again: the sender's retry of 6 is taken, once, and health is ok.
    assert_eq!(r.webhook(6).await, 200);
    rec.mark(6);
    assert_eq!(r.say(7).await, 202);
    rec.mark(SAID + 7);
    let (status, v) = r.health().await;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")), "{v}");
    // The failed syncs lost what they were to make durable; every cut still holds what
    // was answered 2xx.
    let (checked, failures) = replay(&rec, 5);
    assert!(checked > 50, "{checked}");
    assert!(
        failures.is_empty(),
        "{:?}",
        &failures[..failures.len().min(5)]
    );
}

/// What the engine acknowledged, to itself or to a person: each must survive a cut, or
/// it is done twice (a heartbeat's tool called again, a hook sent again) or lost (a
/// token shown once and gone).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kept {
    /// A heartbeat finished (COMPLETED): its tools are not called again.
    Finished(String, u64),
    /// A hook delivery recorded as delivered: not sent again.
    Delivered(String),
    /// An API token made and shown.
    Token(String),
}

fn holds(c: &rusqlite::Connection, kept: &Kept) -> Result<bool, String> {
    let one = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> Result<Option<String>, String> {
        match c.query_row(sql, p, |r| r.get::<_, String>(0)) {
            Ok(v) => Ok(Some(v)),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    };
    Ok(match kept {
        Kept::Finished(agent, beat) => {
            one(
                "SELECT status FROM heartbeats WHERE agent_id = ?1 AND beat = ?2",
                &[agent, &(*beat as i64)],
            )?
            .as_deref()
                == Some("COMPLETED")
        }
        Kept::Delivered(id) => one(
            "SELECT json_extract(doc, '$.status') FROM hook_deliveries WHERE id = ?1",
            &[id],
        )?
        .is_some_and(|s| s == "SUCCEEDED"),
        Kept::Token(id) => one("SELECT id FROM api_tokens WHERE id = ?1", &[id])?.is_some(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_finished_heartbeat_delivered_hook_and_token_survives_a_power_cut_at_every_point() {
    use pulse_shared::domain::{DeliveryStatus, HeartbeatStatus};
    use pulse_tests::fake_hooks::FakeReceiver;
    use pulse_tests::{Backend, FakeTool, settings};

    let (b, rec) = Backend::sqlite_recorded();
    let receiver = FakeReceiver::start().await;
    let tool = FakeTool::start().await;
    b.tool("SnipCreate", &tool.url(), "HEARTBEAT").await;
    let mut agents = Vec::new();
    for name in ["ana", "ben", "cy"] {
        let (agent, _) = b.agent(name, "15m").await;
        b.hooks_to(&agent, &receiver.url(), &["AFTER_HEARTBEAT"])
            .await;
        agents.push(agent);
    }
    let mut kept: Vec<Kept> = Vec::new();
    let mark = |k: Kept, kept: &mut Vec<Kept>| {
        if !kept.contains(&k) {
            kept.push(k);
            rec.mark(kept.len() as u64 - 1);
        }
    };
    let worker = b.worker_with_hooks(settings());
    for round in 0..8 {
        b.advance(SignedDuration::from_mins(16));
        b.sweeper(settings()).sweep_once(b.now()).await;
        b.drain(&worker).await;
        for a in &agents {
            for h in b.heartbeats(&a.id).await {
                if h.status == HeartbeatStatus::Completed {
                    mark(Kept::Finished(a.id.to_string(), h.beat), &mut kept);
                }
            }
        }
        b.dispatch_all().await;
        for a in &agents {
            for hook in b.store.list_hooks(&a.id).await.unwrap() {
                for d in b.store.list_deliveries(&hook.id, 100).await.unwrap() {
                    if d.status == DeliveryStatus::Succeeded {
                        mark(Kept::Delivered(d.id.to_string()), &mut kept);
                    }
                }
            }
        }
        let (t, _) = ApiToken::issue(&agents[round % 3].id, "cut", None, b.now()).unwrap();
        b.store.put_token(&t).await.unwrap();
        mark(Kept::Token(t.id.to_string()), &mut kept);
    }
    let finished = kept
        .iter()
        .filter(|k| matches!(k, Kept::Finished(..)))
        .count();
    let delivered = kept
        .iter()
        .filter(|k| matches!(k, Kept::Delivered(_)))
        .count();
    assert_eq!((finished, delivered), (24, 24), "{kept:?}");
    assert_eq!(tool.requests().len(), 24);

    let out = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .unwrap();
    let mut failures = Vec::new();
    let checked = rec.replay(9, |image| {
        let found = image
            .write_to(out.path())
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let c = rusqlite::Connection::open(out.path().join("pulse.db"))
                    .map_err(|e| e.to_string())?;
                let ok: String = c
                    .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                    .map_err(|e| e.to_string())?;
                if ok != "ok" {
                    return Err(format!("integrity_check: {ok}"));
                }
                for &i in image.acknowledged() {
                    if !holds(&c, &kept[i as usize])? {
                        return Err(format!(
                            "{:?} was acknowledged and is lost",
                            kept[i as usize]
                        ));
                    }
                }
                Ok(())
            });
        if let Err(why) = found {
            failures.push(format!("at {} ({:?}): {why}", image.point, image.cut));
        }
    });
    let (writes, syncs) = rec.writes_and_syncs();
    eprintln!(
        "24 heartbeats, 24 deliveries, 8 tokens: {writes} writes, {syncs} syncs, {checked} cuts checked"
    );
    assert!(checked > 600, "{checked}");
    assert!(
        failures.is_empty(),
        "{} of {checked}: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}
