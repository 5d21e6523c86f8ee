//! `pulse bench hooks`: hook deliveries per second through the embedded hooks queue to a
//! receiver on loopback, and the latency the queue and dispatcher add to one delivery
//! beside a bare POST to the same receiver, in the same run.

use crate::output::outln;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use pulse_shared::app::Services;
use pulse_shared::domain::{Hook, HookTarget, HookType};
use pulse_shared::engine::{DispatchSettings, Emission};
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let app = Router::new().route("/hook", post(|| async { "ok" }));
        let _ = axum::serve(listener, app).await;
    });
    let url = format!("http://{addr}/hook");

    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (mut config, backend, agent) = super::sweep::bench_agent(dir.path(), clock.clone()).await?;
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
    let emission = |i: usize| Emission {
        hook_type: HookType::of(HookType::AFTER_HEARTBEAT),
        heartbeat_id: None,
        action_id: None,
        data: json!({ "events_processed": 3, "actions_triggered": 1, "i": i }),
        triggered_by: "BENCH".into(),
        key_ms: clock.now().as_millisecond() as u64,
        key: vec![format!("bench-{i}")],
    };
    let visibility = Duration::from_secs(120);

    // Throughput: a backlog of deliveries, drained by the dispatcher's loop.
    eprintln!("queueing {deliveries} deliveries …");
    for i in 0..deliveries {
        emitter
            .emit(&routes, &agent, emission(i))
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
    }
    let began = Instant::now();
    let attempts = dispatcher.drain(16, visibility).await?;
    let drain = began.elapsed();
    let delivered = backend
        .store
        .list_deliveries(&hook.id, deliveries.min(10_000))
        .await?
        .iter()
        .filter(|d| d.status == pulse_shared::domain::DeliveryStatus::Succeeded)
        .count();

    // Latency: one delivery at a time, emit → dispatched → answered, beside a bare POST
    // of the same body to the same receiver through the same egress client.
    let mut through = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        emitter
            .emit(&routes, &agent, emission(deliveries + i))
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
        let r = dispatcher.poll_once(16, visibility).await?;
        if r.attempts != 1 {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "a sample made {} attempts",
                r.attempts
            )));
        }
        through.push(ms(t.elapsed()));
    }
    let target: url::Url = url.parse()?;
    let body = bytes::Bytes::from(serde_json::to_vec(&json!({ "events_processed": 3 }))?);
    let mut bare = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        services
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
    server.abort();
    through.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    let per_sec = attempts as f64 / drain.as_secs_f64();
    let added = pct(&through, 0.5) - pct(&bare, 0.5);
    if out.json {
        out.json_value(&json!({
            "deliveries": deliveries,
            "attempts": attempts,
            "succeeded": delivered,
            "deliveries_per_sec": per_sec,
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
            "one delivery, emit → answered: p50 {:.2} ms, p99 {:.2} ms; bare POST: p50 {:.2} ms, p99 {:.2} ms; added p50 {added:.2} ms",
            pct(&through, 0.5),
            pct(&through, 0.99),
            pct(&bare, 0.5),
            pct(&bare, 0.99)
        );
    }
    Ok(())
}
