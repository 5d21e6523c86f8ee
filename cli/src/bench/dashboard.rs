//! `pulse bench dashboard`: the server time of the dashboard's busiest pages on SQLite
//! with a fleet behind them — the agents page (every agent's latest heartbeats), an
//! agent's Heartbeats tab (100 rows) and its Events tab, and the data the charts of the
//! agents page and of an agent's page draw — over loopback, one request at a time, so
//! each figure is one page's own time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::SignedDuration;
use pulse_shared::app::connect;
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{EventCursor, Heartbeat, HeartbeatStatus, NewEvent};
use pulse_shared::http::{self, ServeLimits};
use pulse_shared::ports::{Clock, SystemClock};
use pulse_ui::{Access, Dashboard};
use serde_json::json;

use super::percentile_ms;
use crate::Failure;
use crate::output::{Out, figure};

/// Heartbeats written for the agent whose tab is measured.
const BEATS: u64 = 200;

pub(crate) async fn dashboard(
    agents: usize,
    events: usize,
    requests: usize,
    out: &Out,
) -> Result<(), Failure> {
    if !(1..=100_000).contains(&agents)
        || events > 10_000_000
        || !(10..=100_000).contains(&requests)
    {
        return Err(Failure::Input(
            "invalid size: use --agents 1 to 100000, --events up to 10000000, --requests 10 to 100000".into(),
        ));
    }
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = Config {
        backend: Backend::Sqlite {
            path: dir.path().join("bench.db"),
        },
        ..Config::defaults()
    };
    let b = connect(&config, clock.clone()).await?;
    let (watched, seeding) = seed(&b, clock.as_ref(), agents, events).await?;
    let ui = Dashboard::new(
        &b,
        clock.clone(),
        &config.engine,
        &pulse_shared::app::Services::offline(pulse_shared::app::egress(&config)),
        Access::Open,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve_app(
        listener,
        ui.router(),
        ServeLimits::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let pages = [
        ("agents page", "/ui/".to_owned()),
        (
            "heartbeats tab",
            format!("/ui/agents/{}/heartbeats", watched.id),
        ),
        ("events tab", format!("/ui/agents/{}/events", watched.id)),
        ("agents charts", "/ui/charts.json".to_owned()),
        (
            "agent charts",
            format!("/ui/agents/{}/charts.json", watched.id),
        ),
    ];
    let results = time_pages(&base, &pages, requests).await?;
    let _ = stop.send(());
    let _ = server.await;
    if out.json {
        out.json_value(&json!({
            "agents": agents,
            "events": events,
            "requests_per_page": requests,
            "pages": results.iter().map(|(n, p50, p99, max)| json!({"page": n, "p50_ms": p50, "p99_ms": p99, "max_ms": max})).collect::<Vec<_>>(),
        }));
    }
    figure!(
        out,
        "dashboard on SQLite: {agents} agents, {events} events ({BEATS} heartbeats on the watched agent), seeded in {:.1} s; {requests} sequential requests per page over loopback",
        seeding.as_secs_f64()
    );
    for (name, p50, p99, max) in &results {
        figure!(
            out,
            "  {name:<15} p50 {p50:>6.2} ms   p99 {p99:>6.2} ms   max {max:>6.2} ms"
        );
    }
    Ok(())
}

/// A fleet of `agents`, the first with [`BEATS`] finished heartbeats, and `events`
/// events spread over them: the watched agent, and how long seeding took.
async fn seed(
    b: &pulse_shared::app::Connected,
    clock: &dyn Clock,
    agents: usize,
    events: usize,
) -> Result<(pulse_shared::domain::Agent, Duration), Failure> {
    let fleet = super::sweep::fleet(agents, clock);
    b.store.import_agents(&fleet).await?;
    let watched = fleet[0].0.clone();
    // The watched agent's past: finished heartbeats, each with its record.
    let now = clock.now();
    let past: Vec<_> = (1..=BEATS)
        .map(|beat| {
            let at = now
                .checked_sub(SignedDuration::from_mins(15 * (BEATS - beat + 1) as i64))
                .unwrap_or(now);
            let mut hb = Heartbeat::pending(&watched, beat, at, EventCursor::origin(), 0, None, 0);
            hb.status = HeartbeatStatus::Completed;
            hb.started_at = Some(at);
            hb.completed_at = Some(at);
            (watched.clone(), hb)
        })
        .collect();
    b.store.import_agents(&past).await?;
    let written = Instant::now();
    let appended: Vec<Result<(), pulse_shared::error::StoreError>> =
        futures::stream::iter(0..events)
            .map(|i| {
                let (agent, _) = &fleet[i % agents];
                let event = NewEvent::new("NOTE", json!({ "i": i }), None)
                    .expect("a valid event")
                    .into_event(agent.id.clone(), "bench", clock.now());
                let store = b.store.clone();
                async move { store.append(&event).await }
            })
            .buffer_unordered(8)
            .collect()
            .await;
    appended.into_iter().collect::<Result<Vec<()>, _>>()?;
    let seeding = written.elapsed();

    Ok((watched, seeding))
}

/// Each page's p50, p99 and max in milliseconds over `requests` sequential GETs (after
/// five that warm the caches and the connection).
async fn time_pages<'a>(
    base: &str,
    pages: &'a [(&'a str, String)],
    requests: usize,
) -> Result<Vec<(&'a str, f64, f64, f64)>, Failure> {
    let client = reqwest::Client::new();
    let mut results = Vec::new();
    for (name, path) in pages {
        let url = format!("{base}{path}");
        let mut times = Vec::with_capacity(requests);
        for i in 0..requests + 5 {
            let t = Instant::now();
            let r = client.get(&url).send().await?;
            let ok = r.status().is_success();
            r.bytes().await?;
            if !ok {
                return Err(Failure::Runtime(anyhow::anyhow!("GET {path} failed")));
            }
            // The first five warm the caches and the connection.
            if i >= 5 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        let ms = |p: f64| percentile_ms(&times, p);
        results.push((*name, ms(0.5), ms(0.99), ms(1.0)));
    }
    Ok(results)
}
