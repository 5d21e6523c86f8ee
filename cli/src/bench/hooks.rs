//! `pulse bench hooks`: hook deliveries per second through the embedded hooks queue to a
//! receiver on loopback, against its floor measured in the same run — a bare loop of
//! POSTs of the same size to the same receiver, as many in flight as the dispatcher
//! sends, through the same egress client — and the latency the queue and dispatcher add
//! to one delivery beside a bare POST.

use crate::output::outln;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use pulse_shared::app::{Connected, Services};
use pulse_shared::domain::{Agent, Hook, HookRoute, HookTarget, HookType};
use pulse_shared::engine::{DispatchSettings, Dispatcher, Emission, HOOK_BATCH, HookEmitter};
use pulse_shared::ports::{Clock, SystemClock};
use serde_json::json;

use crate::Failure;
use crate::output::Out;

/// The `p` quantile (0 to 1) of sorted samples, nearest rank; 0 when there are none.
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) async fn hooks(deliveries: usize, samples: usize, out: &Out) -> Result<(), Failure> {
    if deliveries == 0 || samples == 0 {
        return Err(Failure::Input(
            "invalid counts: give at least 1 delivery and 1 sample".into(),
        ));
    }
    let bench = Bench::start().await?;
    let throughput = bench.throughput(deliveries).await?;
    let floor = bench.bare_throughput(deliveries).await?;
    let through = bench.queued_latency(deliveries, samples).await?;
    let bare = bench.bare_latency(samples).await?;
    bench.server.abort();
    report(out, deliveries, &throughput, floor, through, bare);
    Ok(())
}

/// The bench's running parts: a loopback receiver, a temporary store with one agent and
/// its hook to the receiver, and both ends of the hooks queue.
struct Bench {
    server: tokio::task::JoinHandle<()>,
    url: String,
    /// Holds the store; removed when the bench ends.
    _dir: tempfile::TempDir,
    clock: Arc<dyn Clock>,
    backend: Connected,
    agent: Agent,
    hook: Hook,
    services: Services,
    dispatcher: Dispatcher,
    emitter: HookEmitter,
    routes: Vec<HookRoute>,
}

/// How the backlog drained.
struct Throughput {
    attempts: usize,
    drain: Duration,
    delivered: usize,
}

/// Deliveries through the queue, as a share of the bare loop's.
const GOAL: f64 = 0.5;

/// How long a received hook message stays hidden.
const VISIBILITY: Duration = Duration::from_secs(120);

impl Bench {
    /// Starts the receiver, and sets up the store, the agent's hook and the queue's ends.
    async fn start() -> Result<Self, Failure> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let app = Router::new().route("/hook", post(|| async { "ok" }));
            let _ = axum::serve(listener, app).await;
        });
        let url = format!("http://{addr}/hook");

        let dir = tempfile::tempdir()?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (mut config, backend, agent) =
            super::sweep::bench_agent(dir.path(), clock.clone()).await?;
        config.hooks.allow = "127.0.0.1/32"
            .parse()
            .map_err(|e: pulse_egress::AllowListError| Failure::Input(e.to_string()))?;
        let hook = Hook::new(
            agent.id.clone(),
            HookType::of(HookType::AFTER_HEARTBEAT),
            HookTarget::parse(&url)?,
            &pulse_signatures::inbound::generate_secret(),
            clock.now(),
        );
        backend.store.create_hook(&hook).await?;
        let services = Services::from_config(&config);
        let dispatcher = backend
            .dispatcher(clock.clone(), &services.egress, DispatchSettings::default())
            .ok_or_else(|| Failure::Input("no hooks queue".into()))?;
        let emitter = backend
            .emitter(clock.clone())
            .ok_or_else(|| Failure::Input("no hooks queue".into()))?;
        let routes = emitter
            .routes(&agent.id)
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
        Ok(Self {
            server,
            url,
            _dir: dir,
            clock,
            backend,
            agent,
            hook,
            services,
            dispatcher,
            emitter,
            routes,
        })
    }

    /// The `i`th delivery's emission, keyed apart from every other.
    fn emission(&self, i: usize) -> Emission {
        Emission {
            hook_type: HookType::of(HookType::AFTER_HEARTBEAT),
            heartbeat_id: None,
            action_id: None,
            data: json!({ "events_processed": 3, "actions_triggered": 1, "i": i }),
            triggered_by: "BENCH".into(),
            key_ms: self.clock.now().as_millisecond() as u64,
            key: vec![format!("bench-{i}")],
        }
    }

    /// Emits the `i`th delivery.
    async fn emit(&self, i: usize) -> Result<(), Failure> {
        self.emitter
            .emit(&self.routes, &self.agent, self.emission(i))
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
        Ok(())
    }

    /// Throughput: a backlog of deliveries, drained by the dispatcher's loop.
    async fn throughput(&self, deliveries: usize) -> Result<Throughput, Failure> {
        eprintln!("queueing {deliveries} deliveries …");
        for i in 0..deliveries {
            self.emit(i).await?;
        }
        let began = Instant::now();
        let attempts = self.dispatcher.drain(HOOK_BATCH, VISIBILITY).await?;
        let drain = began.elapsed();
        let delivered = self
            .backend
            .store
            .list_deliveries(&self.hook.id, deliveries.min(10_000))
            .await?
            .iter()
            .filter(|d| d.status == pulse_shared::domain::DeliveryStatus::Succeeded)
            .count();
        Ok(Throughput {
            attempts,
            drain,
            delivered,
        })
    }

    /// The floor: `deliveries` POSTs of a delivery's size to the same receiver through
    /// the same egress client, [`HOOK_BATCH`] in flight as the dispatcher sends them,
    /// and nothing else; deliveries a second.
    async fn bare_throughput(&self, deliveries: usize) -> Result<f64, Failure> {
        use futures::StreamExt;
        let target: url::Url = self.url.parse()?;
        let body = bytes::Bytes::from(serde_json::to_vec(&json!({
            "hook_type": "AFTER_HEARTBEAT",
            "agent": { "id": self.agent.id.as_str(), "name": self.agent.name },
            "data": self.emission(0).data,
            "triggered_by": "BENCH",
        }))?);
        let began = Instant::now();
        let answered = futures::stream::iter(0..deliveries)
            .map(|_| {
                self.services.egress.post(
                    &target,
                    http::HeaderMap::new(),
                    body.clone(),
                    Duration::from_secs(5),
                    1024,
                )
            })
            .buffer_unordered(HOOK_BATCH)
            .filter(|r| std::future::ready(r.is_ok()))
            .count()
            .await;
        let secs = began.elapsed().as_secs_f64();
        if answered != deliveries {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "the bare loop's receiver answered {answered} of {deliveries} POSTs"
            )));
        }
        Ok(deliveries as f64 / secs)
    }

    /// Latency: one delivery at a time, emit → dispatched → answered; the samples in ms.
    async fn queued_latency(&self, deliveries: usize, samples: usize) -> Result<Vec<f64>, Failure> {
        let mut through = Vec::with_capacity(samples);
        for i in 0..samples {
            let t = Instant::now();
            self.emit(deliveries + i).await?;
            let r = self.dispatcher.poll_once(HOOK_BATCH, VISIBILITY).await?;
            if r.attempts != 1 {
                return Err(Failure::Runtime(anyhow::anyhow!(
                    "a sample made {} attempts",
                    r.attempts
                )));
            }
            through.push(ms(t.elapsed()));
        }
        Ok(through)
    }

    /// Beside it: a bare POST of the same body to the same receiver through the same
    /// egress client; the samples in ms.
    async fn bare_latency(&self, samples: usize) -> Result<Vec<f64>, Failure> {
        let target: url::Url = self.url.parse()?;
        let body = bytes::Bytes::from(serde_json::to_vec(&json!({ "events_processed": 3 }))?);
        let mut bare = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            self.services
                .egress
                .post(
                    &target,
                    http::HeaderMap::new(),
                    body.clone(),
                    Duration::from_secs(5),
                    1024,
                )
                .await
                .map_err(|e| Failure::Runtime(e.into()))?;
            bare.push(ms(t.elapsed()));
        }
        Ok(bare)
    }
}

/// Prints the figures (or their JSON).
fn report(
    out: &Out,
    deliveries: usize,
    t: &Throughput,
    floor: f64,
    mut through: Vec<f64>,
    mut bare: Vec<f64>,
) {
    let (attempts, drain, delivered) = (t.attempts, t.drain, t.delivered);
    through.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    let per_sec = attempts as f64 / drain.as_secs_f64();
    let ratio = per_sec / floor;
    let added = pct(&through, 0.5) - pct(&bare, 0.5);
    if out.json {
        out.json_value(&json!({
            "deliveries": deliveries,
            "attempts": attempts,
            "succeeded": delivered,
            "deliveries_per_sec": per_sec,
            "floor_per_sec": floor,
            "ratio": ratio,
            "goal_ratio": GOAL,
            "queued_p50_ms": pct(&through, 0.5),
            "queued_p99_ms": pct(&through, 0.99),
            "bare_p50_ms": pct(&bare, 0.5),
            "bare_p99_ms": pct(&bare, 0.99),
            "added_p50_ms": added,
        }));
    } else {
        outln!(
            "hooks through the embedded queue: {per_sec:.0} deliveries/s ({attempts} attempts, {delivered} succeeded, in {:.2} s)",
            drain.as_secs_f64()
        );
        outln!(
            "floor, a bare loop of POSTs ({HOOK_BATCH} in flight, the same client and receiver): {floor:.0}/s; \
             hooks at {:.0} % of it (goal >= {:.0} %: {})",
            ratio * 100.0,
            GOAL * 100.0,
            if ratio >= GOAL { "met" } else { "not met" }
        );
        outln!(
            "one delivery, emit → answered: p50 {:.2} ms, p99 {:.2} ms; bare POST: p50 {:.2} ms, p99 {:.2} ms; added p50 {added:.2} ms",
            pct(&through, 0.5),
            pct(&through, 0.99),
            pct(&bare, 0.5),
            pct(&bare, 0.99)
        );
    }
}
