//! `pulse bench siege`: signed webhooks answered while slowloris clients and idle
//! live streams hold on, over loopback, against `pulse serve`'s listener (receiver and
//! dashboard on one port, default limits).
//!
//! The legitimate sender posts from 127.0.0.1, one new connection a request, as webhook
//! senders do. The attackers come from other loopback addresses (127.0.1.x for the
//! slowloris clients, 127.0.2.x for the streams), spread so no address passes its
//! per-address cap — the harder case than one address, which the cap alone stops:
//! - each slowloris client opens a request (`POST /webhooks/…`, never finished) and sends
//!   one more header line every 2 s; when the listener closes it, it connects again;
//! - each stream opens the dashboard's live updates (server-sent events) and never
//!   reads past the status line;
//! - each slow body (`--slow-bodies`, from 127.0.3.x, 64 an address as a few machines
//!   would) posts to the real webhook with signature headers that look right, announces
//!   a 256 KiB body and sends one byte of it every 2 s; when the listener answers or
//!   closes it, it connects again.
//!
//! First the sender's requests are timed back to back with nothing else going on, then
//! again spread over `--hold` while the siege holds (so it outlasts several header
//! timeouts and slowloris rounds); the figures are the two p50/p99, how many requests
//! were answered 2xx, how many slowloris connections the listener closed, and how many
//! streams it took or refused (503). The goal: p99 under a second while besieged.
//! Bounded in time: the siege ends 30 s after `--hold` at the latest.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pulse_shared::domain::{Webhook, WebhookScheme};
use pulse_shared::http::{self, Inbound, ServeLimits};
use pulse_shared::ports::{Clock, SystemClock};
use pulse_signatures::inbound::{Scheme, generate_secret, sign};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

use crate::Failure;
use crate::output::{Out, figure};

/// The shape of one siege.
pub(crate) struct Siege {
    pub(crate) slowloris: usize,
    pub(crate) streams: usize,
    pub(crate) slow_bodies: usize,
    pub(crate) requests: usize,
    /// How long the besieged run is spread over.
    pub(crate) hold: Duration,
}

/// What the attackers saw.
#[derive(Default)]
struct Tally {
    /// Slowloris connections open now.
    holding: AtomicUsize,
    /// The most open at once.
    most: AtomicUsize,
    /// Slowloris connections the listener closed (each then connected again).
    shed: AtomicUsize,
    /// Streams answered 200 (and held).
    streams_open: AtomicUsize,
    /// Streams answered 503, or closed before an answer.
    streams_refused: AtomicUsize,
    /// Slow bodies open now, as the clients count (headers sent, body trickling or
    /// about to be refused).
    bodies_sending: AtomicUsize,
    /// The most at once.
    bodies_most: AtomicUsize,
    /// Slow bodies answered 408 (too slow), 503 (no reading place) or closed unanswered.
    bodies_timed_out: AtomicUsize,
    /// Answered 503.
    bodies_refused: AtomicUsize,
    /// Closed with no answer.
    bodies_closed: AtomicUsize,
}

/// One sender's timed requests.
struct Timed {
    sent: usize,
    ok: usize,
    p50_ms: f64,
    p99_ms: f64,
    worst_ms: f64,
}

impl Timed {
    fn json(&self) -> serde_json::Value {
        json!({"sent": self.sent, "ok": self.ok, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "worst_ms": self.worst_ms})
    }
}

pub(crate) async fn siege(s: Siege, out: &Out) -> Result<(), Failure> {
    if s.slowloris > 5_000
        || s.streams > 5_000
        || s.slow_bodies > 5_000
        || !(10..=100_000).contains(&s.requests)
    {
        return Err(Failure::Input(
            "invalid size: use --slowloris, --streams and --slow-bodies up to 5000, --requests 10 to 100000"
                .into(),
        ));
    }
    raise_file_limit(s.slowloris + s.streams + s.slow_bodies);
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (config, backend, agent) = super::sweep::bench_agent(dir.path(), clock.clone()).await?;
    let secret = generate_secret();
    let mut webhook = Webhook::new(agent.id.clone(), WebhookScheme::Pulse, &secret, clock.now())
        .map_err(|e| Failure::Input(e.to_string()))?;
    webhook.rate_limit = None;
    backend.store.create_webhook(&webhook).await?;
    let inbound = Arc::new(Inbound::new(
        backend.store.clone(),
        backend.queue.clone(),
        clock.clone(),
        config.inbound.clone(),
    ));
    let ui = pulse_ui::Dashboard::new(
        &backend,
        clock.clone(),
        &config.engine,
        &pulse_shared::app::Services::offline(pulse_shared::app::egress(&config)),
        pulse_ui::Access::Open,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let mut shutdown = stop_rx.clone();
    tokio::spawn(http::serve_app(
        listener,
        http::router(inbound).merge(ui.router()),
        ServeLimits::default(),
        async move {
            let _ = shutdown.changed().await;
        },
    ));
    let path = format!("/webhooks/{}", webhook.id);
    let live = format!("/ui/agents/{}/live", agent.id);
    let now = clock.now().as_second();

    let calm = send_all(
        addr,
        &path,
        &secret,
        now,
        s.requests,
        "calm",
        Duration::ZERO,
    )
    .await?;
    let tally = Arc::new(Tally::default());
    let attackers = besiege(addr, &s, &path, &live, &tally, &stop_rx);
    // In place: every stream answered, and the slowloris clients holding what they can
    // (at most the listener's places), or 30 s.
    let placed = Instant::now();
    let wanted = s.slowloris.min(ServeLimits::default().max_connections / 2);
    // Slow bodies past the reading budget are refused at once: wait for them to have
    // tried, each at least once.
    let bodies_tried = || {
        tally.bodies_most.load(Ordering::Relaxed)
            + tally.bodies_refused.load(Ordering::Relaxed)
            + tally.bodies_closed.load(Ordering::Relaxed)
    };
    while (tally.most.load(Ordering::Relaxed) < wanted
        || bodies_tried() < s.slow_bodies
        || tally.streams_open.load(Ordering::Relaxed)
            + tally.streams_refused.load(Ordering::Relaxed)
            < s.streams)
        && placed.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let setup = placed.elapsed();
    // Spread over the hold, so the siege outlasts several header timeouts (5 s) and
    // slowloris rounds (2 s) while the sender is timed.
    let pace = s.hold / s.requests as u32;
    let besieging = Instant::now();
    let besieged = tokio::time::timeout(
        s.hold + Duration::from_secs(30),
        send_all(addr, &path, &secret, now, s.requests, "siege", pace),
    )
    .await
    .map_err(|_| {
        Failure::Runtime(anyhow::anyhow!(
            "the sender's {} requests were not all answered within 30 s of --hold {:?}",
            s.requests,
            s.hold
        ))
    })??;
    let lasted = besieging.elapsed();
    let _ = stop.send(true);
    for a in attackers {
        a.abort();
    }
    report(out, &s, &calm, &besieged, &tally, (setup, lasted));
    if besieged.ok < besieged.sent {
        return Err(Failure::Attention(format!(
            "{} of the sender's {} requests were not answered 2xx while besieged",
            besieged.sent - besieged.ok,
            besieged.sent
        )));
    }
    Ok(())
}

/// Starts the slowloris clients and the streams.
fn besiege(
    addr: SocketAddr,
    s: &Siege,
    path: &str,
    live: &str,
    tally: &Arc<Tally>,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut attackers = Vec::new();
    // Each kind from its own 127.0.N.x: slowloris clients 50 an address (under the
    // per-address cap of 64), streams 15 (under the cap of 16 streams), slow bodies 64.
    let kinds: [(usize, usize, &str, Attack); 3] = [
        (s.slowloris, 50, path, |a, f, p, t, s| {
            tokio::spawn(slowloris(a, f, p, t, s))
        }),
        (s.streams, 15, live, |a, f, p, t, s| {
            tokio::spawn(stream(a, f, p, t, s))
        }),
        (s.slow_bodies, 64, path, |a, f, p, t, s| {
            tokio::spawn(slow_body(a, f, p, t, s))
        }),
    ];
    for (subnet, (n, per_address, target, attack)) in (1u8..).zip(kinds) {
        for i in 0..n {
            let block = i / (250 * per_address);
            let from = [
                127,
                0,
                subnet + block as u8 * 3,
                (i / per_address % 250) as u8 + 1,
            ];
            attackers.push(attack(
                addr,
                from,
                target.to_owned(),
                tally.clone(),
                stop.clone(),
            ));
        }
    }
    attackers
}

/// Starts one attacker from an address at a target path.
type Attack = fn(
    SocketAddr,
    [u8; 4],
    String,
    Arc<Tally>,
    watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()>;

/// A slow body: a webhook request with signature headers that look right (signed with
/// a secret that is not the webhook's), 256 KiB announced, one byte every 2 s; again
/// when answered or closed.
async fn slow_body(
    addr: SocketAddr,
    from: [u8; 4],
    path: String,
    tally: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    const ANNOUNCED: usize = 256 * 1024;
    let forged = generate_secret();
    let mut n = 0u64;
    while !*stop.borrow() {
        n += 1;
        let Ok(mut s) = connect_from(from, addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let now = jiff::Timestamp::now().as_second();
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: pulse\r\nContent-Type: application/json\r\nContent-Length: {ANNOUNCED}\r\n"
        );
        let id = format!("slow-{}-{n}", u32::from_be_bytes(from));
        for (k, v) in sign(Scheme::Pulse, &forged, b"{}", now, &id).unwrap_or_default() {
            head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap_or_default()));
        }
        head.push_str("\r\n");
        if s.write_all(head.as_bytes()).await.is_err() {
            tally.bodies_closed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let now = tally.bodies_sending.fetch_add(1, Ordering::Relaxed) + 1;
        tally.bodies_most.fetch_max(now, Ordering::Relaxed);
        let mut buf = [0u8; 64];
        let answered = loop {
            tokio::select! {
                read = s.read(&mut buf) => break match read {
                    Ok(n) if n >= 12 => Some(buf[9..12].to_vec()),
                    _ => None,
                },
                () = tokio::time::sleep(Duration::from_secs(2)) => {
                    if s.write_all(b"{").await.is_err() { break None }
                }
            }
        };
        tally.bodies_sending.fetch_sub(1, Ordering::Relaxed);
        match answered.as_deref() {
            Some(b"408") => tally.bodies_timed_out.fetch_add(1, Ordering::Relaxed),
            Some(b"503") => tally.bodies_refused.fetch_add(1, Ordering::Relaxed),
            _ => tally.bodies_closed.fetch_add(1, Ordering::Relaxed),
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Raises the soft limit on open files toward the hard one: each attacker and its
/// server side take a descriptor.
fn raise_file_limit(sockets: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let want = (sockets as u64 * 2 + 1_024).min(limit.maximum.unwrap_or(u64::MAX));
    if limit.current.is_some_and(|c| c < want) {
        limit.current = Some(want);
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// A new connection from `from` (a loopback address).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket.connect(addr).await
}

/// `n` signed webhooks, each on a new connection from 127.0.0.1, four at a time, the
/// i-th started no sooner than i × `pace`.
async fn send_all(
    addr: SocketAddr,
    path: &str,
    secret: &str,
    now: i64,
    n: usize,
    prefix: &str,
    pace: Duration,
) -> Result<Timed, Failure> {
    use futures::StreamExt;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = format!("http://{addr}{path}");
    let mut requests = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({"event_type": "ORDER_PLACED", "payload": {"order": i}})
            .to_string()
            .into_bytes();
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in sign(Scheme::Pulse, secret, &body, now, &format!("{prefix}-{i}"))
            .map_err(|e| Failure::Runtime(e.into()))?
        {
            headers.insert(k, v);
        }
        requests.push((headers, body));
    }
    let start = tokio::time::Instant::now();
    let results: Vec<(bool, Duration)> = futures::stream::iter(requests.into_iter().enumerate())
        .map(|(i, (headers, body))| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                tokio::time::sleep_until(start + pace * i as u32).await;
                let t = Instant::now();
                let ok = match client.post(&url).headers(headers).body(body).send().await {
                    Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                (ok, t.elapsed())
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    let mut ms: Vec<f64> = results.iter().map(|r| r.1.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let rank = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok(Timed {
        sent: n,
        ok: results.iter().filter(|r| r.0).count(),
        p50_ms: rank(0.50),
        p99_ms: rank(0.99),
        worst_ms: ms.last().copied().unwrap_or_default(),
    })
}

/// A slowloris client: an unfinished request, a header line every 2 s, again when closed.
async fn slowloris(
    addr: SocketAddr,
    from: [u8; 4],
    path: String,
    tally: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let Ok(mut s) = connect_from(from, addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let open =
            format!("POST {path} HTTP/1.1\r\nHost: pulse\r\nContent-Type: application/json\r\n");
        if s.write_all(open.as_bytes()).await.is_err() {
            tally.shed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let now = tally.holding.fetch_add(1, Ordering::Relaxed) + 1;
        tally.most.fetch_max(now, Ordering::Relaxed);
        let mut buf = [0u8; 256];
        loop {
            tokio::select! {
                // The listener closed it (or answered it: a 408).
                _ = s.read(&mut buf) => break,
                () = tokio::time::sleep(Duration::from_secs(2)) => {
                    if s.write_all(b"X-Slow: 1\r\n").await.is_err() { break }
                }
            }
        }
        tally.holding.fetch_sub(1, Ordering::Relaxed);
        tally.shed.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An idle stream: the dashboard's live updates, never read past the status line.
async fn stream(
    addr: SocketAddr,
    from: [u8; 4],
    path: String,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let opened = async {
        let mut s = connect_from(from, addr).await.ok()?;
        let ask =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n");
        s.write_all(ask.as_bytes()).await.ok()?;
        let mut line = [0u8; 12];
        s.read_exact(&mut line).await.ok()?;
        Some((s, line.ends_with(b"200")))
    };
    match opened.await {
        Some((s, true)) => {
            tally.streams_open.fetch_add(1, Ordering::Relaxed);
            // Held, unread, until the siege ends.
            let _ = stop.changed().await;
            drop(s);
        }
        _ => {
            tally.streams_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn report(
    out: &Out,
    s: &Siege,
    calm: &Timed,
    besieged: &Timed,
    tally: &Tally,
    (setup, lasted): (Duration, Duration),
) {
    let shed = tally.shed.load(Ordering::Relaxed);
    let most = tally.most.load(Ordering::Relaxed);
    let (open, refused) = (
        tally.streams_open.load(Ordering::Relaxed),
        tally.streams_refused.load(Ordering::Relaxed),
    );
    figure!(
        out,
        "siege: {} signed webhooks from 127.0.0.1 (a new connection each), loopback, SQLite, default listener limits; calm back to back, besieged spread over {:.1} s",
        s.requests,
        lasted.as_secs_f64()
    );
    for (name, t) in [("calm", calm), ("besieged", besieged)] {
        figure!(
            out,
            "  {name:<9} p50 {:.1} ms  p99 {:.1} ms  worst {:.1} ms  ({} of {} answered 2xx)",
            t.p50_ms,
            t.p99_ms,
            t.worst_ms,
            t.ok,
            t.sent
        );
    }
    figure!(
        out,
        "  besieged by {} slowloris clients (at most {most} connected at once as they count, {shed} closed by the listener and reconnected) and {} idle live streams ({open} held, {refused} refused 503); in place after {:.1} s",
        s.slowloris,
        s.streams,
        setup.as_secs_f64()
    );
    let bodies = (
        tally.bodies_most.load(Ordering::Relaxed),
        tally.bodies_timed_out.load(Ordering::Relaxed),
        tally.bodies_refused.load(Ordering::Relaxed),
        tally.bodies_closed.load(Ordering::Relaxed),
    );
    if s.slow_bodies > 0 {
        figure!(
            out,
            "  and by {} slow bodies (64 an address, a byte every 2 s): at most {} open at once as they count, {} answered 408 for their pace, {} refused 503 (no reading place), {} closed unanswered",
            s.slow_bodies,
            bodies.0,
            bodies.1,
            bodies.2,
            bodies.3
        );
    }
    figure!(
        out,
        "  goal: besieged p99 < 1000 ms: {}",
        if besieged.p99_ms < 1000.0 && besieged.ok == besieged.sent {
            "met"
        } else {
            "NOT met"
        }
    );
    if out.json {
        out.json_value(&json!({
            "requests": s.requests,
            "slowloris": s.slowloris,
            "streams": s.streams,
            "calm": calm.json(),
            "besieged": besieged.json(),
            "slowloris_most_held": most,
            "slowloris_shed": shed,
            "streams_held": open,
            "streams_refused": refused,
            "slow_bodies": s.slow_bodies,
            "slow_bodies_most_open": bodies.0,
            "slow_bodies_timed_out": bodies.1,
            "slow_bodies_refused": bodies.2,
            "slow_bodies_closed": bodies.3,
        }));
    }
}
