//! `pulse bench receive`: the HTTP receiver of `pulse serve`, driven over loopback by a
//! concurrent client with signed webhooks, beside a bare axum endpoint in the same run.
//!
//! The receiver is the real one (`pulse_shared::http::serve`) on a fresh SQLite file;
//! every request is a distinct delivery, signed with the Pulse scheme, so each one is
//! verified, deduplicated, counted and stored. Bodies are signed before the clock starts,
//! so the client's HMACs are not counted. At the end the stored events are counted: an
//! accepted request is one durably stored event. The bare endpoint reads the body and
//! answers `{}`; client and servers share the machine in both runs, so the ratio is fair.
//! With `--rounds N` the requests are sent in N slices that take turns, bare then Pulse,
//! and each endpoint's figures are summed over its slices: a minute when the shared
//! machine runs slower falls on both endpoints rather than on one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use futures::StreamExt;
use pulse_shared::adapters::sqlite::{ACCEPT_THREAD, WriteCounts, write_counts};
use pulse_shared::app::Connected;
use pulse_shared::config::Durability;
use pulse_shared::domain::{Agent, Webhook, WebhookScheme};
use pulse_shared::http::{self, Inbound};
use pulse_shared::ports::{Clock, SystemClock};
use pulse_signatures::inbound::{Scheme, generate_secret, sign};
use serde_json::json;
use tokio::sync::watch;

use super::percentile_ms;
use crate::Failure;
use crate::output::{Out, figure};

struct Run {
    requests: usize,
    ok: usize,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// The process's CPU time (all threads, the client's included) a request, in µs.
    cpu_us: Option<f64>,
    /// The CPU time of the store's acceptance thread (every webhook's SQLite work but
    /// the reads) a request, in µs.
    writer_us: Option<f64>,
    /// What the store wrote during the run (the Pulse run only).
    writes: Option<Writes>,
}

/// The store's commits during a run: how many acceptances each held, and how many pages
/// (frames of the write-ahead log) each appended.
#[derive(Clone, Copy, Default)]
struct Writes {
    commits: u64,
    acceptances: u64,
    frames: u64,
    log_writes: u64,
}

impl Writes {
    fn between(before: WriteCounts, after: WriteCounts) -> Self {
        Self {
            commits: after.acceptance_commits - before.acceptance_commits,
            acceptances: after.acceptances - before.acceptances,
            frames: after.log_frames - before.log_frames,
            log_writes: after.log_writes - before.log_writes,
        }
    }
    fn add(&mut self, more: Self) {
        self.commits += more.commits;
        self.acceptances += more.acceptances;
        self.frames += more.frames;
        self.log_writes += more.log_writes;
    }
    fn per_commit(&self, n: u64) -> f64 {
        n as f64 / self.commits.max(1) as f64
    }
    fn frames_per_acceptance(&self) -> f64 {
        self.frames as f64 / self.acceptances.max(1) as f64
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "commits": self.commits,
            "acceptances": self.acceptances,
            "log_frames": self.frames,
            "acceptances_per_commit": self.per_commit(self.acceptances),
            "log_frames_per_commit": self.per_commit(self.frames),
            "log_frames_per_acceptance": self.frames_per_acceptance(),
            "log_writes": self.log_writes,
            "log_writes_per_commit": self.per_commit(self.log_writes),
        })
    }
}

/// One endpoint's part of one round: what [`Run`] is made of.
struct Slice {
    ok: usize,
    seconds: f64,
    /// Each request's time, answered or not.
    latencies: Vec<Duration>,
    /// The process's CPU time during the slice, in seconds.
    cpu_seconds: Option<f64>,
    /// The acceptance thread's CPU time during the slice, in seconds.
    writer_seconds: Option<f64>,
}

/// Requests answered `2xx` per second, of a [`Slice`] or of a whole [`Run`].
trait Throughput {
    /// The requests answered `2xx` and the seconds they took.
    fn answered(&self) -> (usize, f64);

    fn per_second(&self) -> f64 {
        let (ok, seconds) = self.answered();
        ok as f64 / seconds
    }
}

impl Throughput for Slice {
    fn answered(&self) -> (usize, f64) {
        (self.ok, self.seconds)
    }
}

impl Throughput for Run {
    fn answered(&self) -> (usize, f64) {
        (self.ok, self.seconds)
    }
}

impl Run {
    /// One endpoint's figures over its slices: their requests, answers, times and CPU
    /// summed, the percentiles of all their latencies together.
    fn of(slices: &[Slice]) -> Self {
        let mut lat: Vec<Duration> = slices
            .iter()
            .flat_map(|s| s.latencies.iter().copied())
            .collect();
        lat.sort_unstable();
        let requests = lat.len();
        // A CPU figure counts only when every slice has one.
        let per_request = |part: fn(&Slice) -> Option<f64>| {
            slices
                .iter()
                .map(part)
                .sum::<Option<f64>>()
                .map(|s| s * 1e6 / requests.max(1) as f64)
        };
        Run {
            requests,
            ok: slices.iter().map(|s| s.ok).sum(),
            seconds: slices.iter().map(|s| s.seconds).sum(),
            p50_ms: percentile_ms(&lat, 0.50),
            p99_ms: percentile_ms(&lat, 0.99),
            max_ms: percentile_ms(&lat, 1.0),
            cpu_us: per_request(|s| s.cpu_seconds),
            writer_us: per_request(|s| s.writer_seconds),
            writes: None,
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "requests": self.requests,
            "ok": self.ok,
            "seconds": self.seconds,
            "requests_per_second": self.per_second(),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "cpu_us_per_request": self.cpu_us,
            "writer_cpu_us_per_request": self.writer_us,
            "store_writes": self.writes.map(|w| w.json()),
        })
    }
}

type Prepared = Vec<(reqwest::header::HeaderMap, Vec<u8>)>;

/// `requests` cut into `rounds` slices in order, their sizes differing by one at most.
fn slices(mut requests: Prepared, rounds: usize) -> Vec<Prepared> {
    let (base, extra) = (requests.len() / rounds, requests.len() % rounds);
    let mut out = Vec::with_capacity(rounds);
    for round in (0..rounds).rev() {
        let size = base + usize::from(round < extra);
        out.push(requests.split_off(requests.len() - size));
    }
    out.reverse();
    out
}

/// Both endpoints' figures over the whole run.
struct Measured {
    bare: Run,
    pulse: Run,
    /// Pulse's rate over bare's in each round.
    by_round: Vec<f64>,
    /// Events the Pulse run stored.
    stored: usize,
}

/// Sends every prepared request to `url` with `concurrency` in flight.
async fn drive(url: &str, requests: Prepared, concurrency: usize) -> Result<Slice, Failure> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let cpu_before = cpu_seconds();
    let writer_before = thread_cpu_seconds(ACCEPT_THREAD);
    let started = Instant::now();
    let results: Vec<(bool, Duration)> = futures::stream::iter(requests)
        .map(|(headers, body)| {
            let client = client.clone();
            async move {
                let t = Instant::now();
                let ok = match client.post(url).headers(headers).body(body).send().await {
                    Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                (ok, t.elapsed())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let spent = |(before, after): (f64, f64)| after - before;
    let cpu_seconds = cpu_before.zip(cpu_seconds()).map(spent);
    let writer_seconds = writer_before
        .zip(thread_cpu_seconds(ACCEPT_THREAD))
        .map(spent);
    Ok(Slice {
        ok: results.iter().filter(|r| r.0).count(),
        seconds,
        latencies: results.into_iter().map(|r| r.1).collect(),
        cpu_seconds,
        writer_seconds,
    })
}

/// The CPU time this process has used, all threads, in seconds (Linux's `/proc`; `None`
/// elsewhere). It counts in ticks of 10 ms: a run of a second on two cores is read to
/// within a per cent.
fn cpu_seconds() -> Option<f64> {
    stat_cpu_seconds(std::path::Path::new("/proc/self"))
}

/// The CPU time of this process's thread named `name`, in seconds (`None` when there is
/// none, or off Linux).
fn thread_cpu_seconds(name: &str) -> Option<f64> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == name)
        })
        .and_then(|task| stat_cpu_seconds(&task.path()))
}

/// The user and system CPU time in `dir`'s `stat` (a process's or a thread's), in
/// seconds.
fn stat_cpu_seconds(dir: &std::path::Path) -> Option<f64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // The fields after the command's name, which is in parentheses and may hold spaces:
    // utime and stime are the 14th and 15th of the line, the 12th and 13th after it.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / CLOCK_TICKS)
}

/// Linux's `USER_HZ`, the unit of `/proc`'s CPU times: 100 on every architecture Linux
/// runs on today.
const CLOCK_TICKS: f64 = 100.0;

pub(crate) async fn receive(
    requests: usize,
    concurrency: usize,
    rounds: usize,
    (durability, slower): (Durability, Option<Duration>),
    out: &Out,
) -> Result<(), Failure> {
    if !(100..=1_000_000).contains(&requests) || !(1..=1024).contains(&concurrency) {
        return Err(Failure::Input(
            "invalid size: use --requests 100 to 1000000 and --concurrency 1 to 1024".into(),
        ));
    }
    if !(1..=100).contains(&rounds) || requests / rounds < 100 {
        return Err(Failure::Input(format!(
            "invalid --rounds {rounds}: use 1 to 100, with at least 100 requests a round \
             ({requests} requests allow {} rounds)",
            (requests / 100).min(100)
        )));
    }
    let bench = Bench::start(durability, slower).await?;
    let measured = bench.measure(requests, concurrency, rounds).await?;
    report(out, requests, concurrency, (durability, slower), &measured);
    let (pulse_run, stored) = (&measured.pulse, measured.stored);
    if stored != pulse_run.ok {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} requests were accepted but {stored} events are stored",
            pulse_run.ok
        )));
    }
    Ok(())
}

/// The bench's running parts: a temporary store with one agent and its webhook, the
/// Pulse receiver and the bare endpoint, both stopped by `stop`.
struct Bench {
    /// Holds the store; removed when the bench ends.
    _dir: tempfile::TempDir,
    /// With `--sync-delay-ms`: what slows the store's syncs, while it lives.
    _slower: Option<pulse_shared::adapters::sqlite::faults::SlowDisk>,
    clock: Arc<dyn Clock>,
    backend: Connected,
    agent: Agent,
    /// The webhook's signing secret.
    secret: String,
    pulse_url: String,
    bare_url: String,
    stop: watch::Sender<()>,
}

impl Bench {
    /// Creates the store, the agent and its webhook (no rate limit), and starts both
    /// servers.
    async fn start(durability: Durability, slower: Option<Duration>) -> Result<Self, Failure> {
        let dir = tempfile::tempdir()?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let slow_disk = slower
            .map(|delay| pulse_shared::adapters::sqlite::faults::SlowDisk::start(dir.path(), delay))
            .transpose()?;
        let (config, backend, agent) = super::sweep::bench_agent_with(
            dir.path(),
            clock.clone(),
            durability,
            slow_disk.is_some(),
        )
        .await?;
        let secret = generate_secret();
        let mut webhook =
            Webhook::new(agent.id.clone(), WebhookScheme::Pulse, &secret, clock.now())
                .map_err(|e| Failure::Input(e.to_string()))?;
        webhook.rate_limit = None;
        backend.store.create_webhook(&webhook).await?;

        let inbound = Arc::new(Inbound::new(
            backend.store.clone(),
            backend.queue.clone(),
            clock.clone(),
            config.inbound.clone(),
        ));
        let (stop, stop_rx) = watch::channel(());
        let pulse_url = serve_pulse(inbound, &webhook, &stop_rx).await?;
        let bare_url = serve_bare(&stop_rx).await?;
        Ok(Self {
            _dir: dir,
            _slower: slow_disk,
            clock,
            backend,
            agent,
            secret,
            pulse_url,
            bare_url,
            stop,
        })
    }

    /// Warms both servers, then drives `requests` to each, in `rounds` slices that take
    /// turns, and stops them.
    async fn measure(
        &self,
        requests: usize,
        concurrency: usize,
        rounds: usize,
    ) -> Result<Measured, Failure> {
        let now = self.clock.now().as_second();
        let prepare = |n: usize, prefix: &str| signed_requests(&self.secret, now, n, prefix);
        // Warm both servers and the connection pools.
        drive(
            &self.bare_url,
            prepare(concurrency * 4, "warm")?,
            concurrency,
        )
        .await?;
        drive(
            &self.pulse_url,
            prepare(concurrency * 4, "warm")?,
            concurrency,
        )
        .await?;
        let before = self.events(requests).await?;
        let bare_requests = slices(prepare(requests, "bench")?, rounds);
        let pulse_requests = slices(prepare(requests, "bench")?, rounds);
        let (mut bare, mut pulse) = (Vec::new(), Vec::new());
        let mut writes = Writes::default();
        for (b, p) in bare_requests.into_iter().zip(pulse_requests) {
            bare.push(drive(&self.bare_url, b, concurrency).await?);
            let written_before = write_counts();
            pulse.push(drive(&self.pulse_url, p, concurrency).await?);
            writes.add(Writes::between(written_before, write_counts()));
        }
        let _ = self.stop.send(());
        let stored = self.events(requests).await? - before;
        let mut pulse_run = Run::of(&pulse);
        pulse_run.writes = Some(writes);
        Ok(Measured {
            bare: Run::of(&bare),
            pulse: pulse_run,
            by_round: bare
                .iter()
                .zip(&pulse)
                .map(|(b, p)| p.per_second() / b.per_second())
                .collect(),
            stored,
        })
    }

    /// How many events the agent has (counting up to twice `requests`).
    async fn events(&self, requests: usize) -> Result<usize, Failure> {
        Ok(self
            .backend
            .store
            .list_events(&self.agent.id, requests * 2)
            .await?
            .len())
    }
}

/// Starts the real receiver on loopback until `stop` changes; returns the webhook's URL.
async fn serve_pulse(
    inbound: Arc<Inbound>,
    webhook: &Webhook,
    stop: &watch::Receiver<()>,
) -> Result<String, Failure> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let pulse_url = format!("http://{}/webhooks/{}", listener.local_addr()?, webhook.id);
    let mut stop = stop.clone();
    tokio::spawn(http::serve(
        listener,
        inbound,
        http::ServeLimits::default(),
        async move {
            let _ = stop.changed().await;
        },
    ));
    Ok(pulse_url)
}

/// Starts a bare axum endpoint that reads the body and answers `{}`, until `stop`
/// changes; returns its URL.
async fn serve_bare(stop: &watch::Receiver<()>) -> Result<String, Failure> {
    let bare = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let bare_url = format!("http://{}/bare", bare.local_addr()?);
    let app = axum::Router::new().route(
        "/bare",
        post(|body: axum::body::Bytes| async move {
            std::hint::black_box(body);
            axum::Json(json!({}))
        }),
    );
    let mut stop = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(bare, app)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await;
    });
    Ok(bare_url)
}

/// `n` webhook requests, each a distinct delivery (`prefix-i`) signed with the Pulse
/// scheme at `now`.
fn signed_requests(secret: &str, now: i64, n: usize, prefix: &str) -> Result<Prepared, Failure> {
    (0..n)
        .map(|i| {
            let body = json!({
                "event_type": "ORDER_PLACED",
                "payload": {"order": i, "items": [{"sku": "A-1", "qty": 2}], "total": 19.5}
            })
            .to_string()
            .into_bytes();
            let mut headers = reqwest::header::HeaderMap::new();
            for (k, v) in sign(Scheme::Pulse, secret, &body, now, &format!("{prefix}-{i}"))
                .map_err(|e| Failure::Runtime(e.into()))?
            {
                headers.insert(k, v);
            }
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/json"),
            );
            Ok((headers, body))
        })
        .collect()
}

/// Prints both runs side by side (and their JSON).
fn report(
    out: &Out,
    requests: usize,
    concurrency: usize,
    (durability, slower): (Durability, Option<Duration>),
    measured: &Measured,
) {
    let (bare_run, pulse_run, stored) = (&measured.bare, &measured.pulse, measured.stored);
    let ratio = pulse_run.per_second() / bare_run.per_second();
    figure!(
        out,
        "receive: {requests} signed webhooks (pulse scheme, each a new delivery), {concurrency} in flight, loopback, SQLite (WAL), durability {}: {}",
        durability.as_str(),
        durability.promise()
    );
    if let Some(d) = slower {
        figure!(
            out,
            "  a slower disk: every sync of the store's files made {} ms slower (through the file system that slows it{})",
            d.as_millis(),
            if d.is_zero() {
                "; not slowed: the floor"
            } else {
                ""
            }
        );
    }
    for (name, r) in [("bare axum", bare_run), ("pulse serve", pulse_run)] {
        figure!(
            out,
            "  {name:<12} {:>8.0} req/s  p50 {:.2} ms  p99 {:.2} ms  max {:.1} ms  ({} of {} answered 2xx in {:.2} s)",
            r.per_second(),
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.ok,
            r.requests,
            r.seconds
        );
    }
    figure!(
        out,
        "  pulse/bare: {:.0} %  (goals: >= 50 % of bare, p99 <= 10 ms)",
        ratio * 100.0
    );
    if measured.by_round.len() > 1 {
        let low = measured
            .by_round
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let high = measured.by_round.iter().copied().fold(0.0, f64::max);
        figure!(
            out,
            "  pulse/bare by round: {:.0} – {:.0} % over {} rounds",
            low * 100.0,
            high * 100.0,
            measured.by_round.len()
        );
    }
    if let (Some(bare), Some(pulse)) = (bare_run.cpu_us, pulse_run.cpu_us) {
        figure!(
            out,
            "  CPU a request (the whole process, client included): bare {bare:.0} µs, pulse {pulse:.0} µs ({:.2} ×)",
            pulse / bare
        );
    }
    if let Some(writer) = pulse_run.writer_us {
        figure!(
            out,
            "  the store's acceptance thread (its statements, commits and log copies): {writer:.1} µs a request"
        );
    }
    if let Some(w) = pulse_run.writes
        && durability == Durability::Synced
    {
        figure!(
            out,
            "  syncs of the log: one a commit, {:.0} a second, {:.1} acceptances a sync",
            w.commits as f64 / pulse_run.seconds,
            w.per_commit(w.acceptances)
        );
    }
    if let Some(w) = pulse_run.writes {
        figure!(
            out,
            "  its commits: {} for {} acceptances, {:.1} a commit; {:.1} pages of log a commit, {:.2} an acceptance, in {:.2} writes a commit",
            w.commits,
            w.acceptances,
            w.per_commit(w.acceptances),
            w.per_commit(w.frames),
            w.frames_per_acceptance(),
            w.per_commit(w.log_writes)
        );
    }
    figure!(
        out,
        "  events stored: {stored} (accepted: {})",
        pulse_run.ok
    );
    if out.json {
        out.json_value(&json!({
            "requests": requests,
            "concurrency": concurrency,
            "rounds": measured.by_round.len(),
            "ratio_by_round": measured.by_round,
            "bare": bare_run.json(),
            "pulse": pulse_run.json(),
            "ratio": ratio,
            "durability": durability.as_str(),
            "sync_delay_ms": slower.map(|d| d.as_millis() as u64),
            "events_stored": stored,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests are cut into rounds in order, none lost or repeated, the rounds' sizes
    /// differing by one at most.
    #[test]
    fn requests_are_cut_into_rounds_in_order() {
        let prepared = |n: usize| -> Prepared {
            (0..n)
                .map(|i| {
                    (
                        reqwest::header::HeaderMap::new(),
                        i.to_string().into_bytes(),
                    )
                })
                .collect()
        };
        let bodies = |slices: &[Prepared]| -> Vec<Vec<String>> {
            slices
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|(_, b)| String::from_utf8(b.clone()).unwrap())
                        .collect()
                })
                .collect()
        };
        assert_eq!(
            bodies(&slices(prepared(7), 3)),
            [vec!["0", "1", "2"], vec!["3", "4"], vec!["5", "6"]]
        );
        assert_eq!(bodies(&slices(prepared(4), 1)), [vec!["0", "1", "2", "3"]]);
        let sizes: Vec<usize> = slices(prepared(150_000), 7).iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 150_000);
        assert!(
            sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
            "{sizes:?}"
        );
    }

    /// An endpoint's run over its slices: requests, answers, seconds and CPU summed,
    /// percentiles over every latency together; a CPU figure only when every slice has
    /// one.
    #[test]
    fn a_run_sums_its_slices() {
        let ms = Duration::from_millis;
        let slice = |ok, seconds, lat: &[u64], cpu: Option<f64>| Slice {
            ok,
            seconds,
            latencies: lat.iter().map(|m| ms(*m)).collect(),
            cpu_seconds: cpu,
            writer_seconds: None,
        };
        let run = Run::of(&[
            slice(2, 1.0, &[1, 9], Some(0.5)),
            slice(3, 2.0, &[2, 3, 4], Some(1.0)),
        ]);
        assert_eq!((run.requests, run.ok), (5, 5));
        assert!((run.seconds - 3.0).abs() < 1e-9);
        assert!((run.per_second() - 5.0 / 3.0).abs() < 1e-9);
        assert!((run.p50_ms - 3.0).abs() < 1e-9, "{}", run.p50_ms);
        assert!((run.max_ms - 9.0).abs() < 1e-9, "{}", run.max_ms);
        assert!((run.cpu_us.unwrap() - 1.5e6 / 5.0).abs() < 1e-6);
        assert_eq!(run.writer_us, None);
        let partial = Run::of(&[slice(1, 1.0, &[1], Some(0.5)), slice(1, 1.0, &[1], None)]);
        assert_eq!(partial.cpu_us, None);
    }

    /// A thread is found by its name and its CPU time read; a name no thread has is
    /// none.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_threads_cpu_time_is_read_by_its_name() {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let (busy, ready) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-cpu-probe".into())
            .spawn(move || {
                // Spins until its own stat shows 30 ms of CPU (three of /proc's ticks),
                // read through its task's directory, then waits.
                let own = format!("/proc/self/task/{}", own_tid());
                let mut x = 0u64;
                while stat_cpu_seconds(std::path::Path::new(&own)).unwrap_or(0.0) < 0.03 {
                    for _ in 0..100_000 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                }
                busy.send(()).unwrap();
                let _ = wait.recv();
            })
            .unwrap();
        ready.recv().unwrap();
        let spent = thread_cpu_seconds("bench-cpu-probe").expect("the thread is found");
        assert!((0.03..10.0).contains(&spent), "{spent} s");
        assert_eq!(thread_cpu_seconds("no-such-thread"), None);
        done.send(()).unwrap();
        thread.join().unwrap();
    }

    /// The calling thread's id, as `/proc/self/task` names it.
    #[cfg(target_os = "linux")]
    fn own_tid() -> i64 {
        std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .expect("/proc/thread-self names the thread")
    }
}
