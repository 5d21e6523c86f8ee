//! `GET /metrics` on `pulse serve`'s listener: the counters of [`pulse_shared::meter`]
//! in Prometheus text format, from the `metrics` crate's Prometheus recorder.
//!
//! Who may read it follows the dashboard: on a loopback listener without
//! `PULSE_DASHBOARD_TOKEN`, requests made on this machine; with the token, requests
//! that send it as `Authorization: Bearer <token>`; on any other listener without a
//! token, the route is not served.

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use pulse_ui::Access;
use tracing::{info, warn};

/// The process's Prometheus recorder, installed on first use. Another recorder installed
/// first (none is, in `pulse`) leaves metrics unrecorded: `None`.
fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            match PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(pulse_shared::meter::TURN_LATENCY.to_owned()),
                    &pulse_shared::meter::TURN_LATENCY_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(pulse_shared::meter::START_DELAY.to_owned()),
                        &pulse_shared::meter::START_DELAY_BUCKETS,
                    )
                })
                .and_then(PrometheusBuilder::install_recorder)
            {
                Ok(handle) => {
                    pulse_shared::meter::describe();
                    Some(handle)
                }
                Err(e) => {
                    warn!(error = %e, "metrics are not recorded: another recorder is installed");
                    None
                }
            }
        })
        .as_ref()
}

/// Starts recording: called once `pulse serve` starts, before any work.
pub(crate) fn install() {
    let _ = handle();
}

#[derive(Clone)]
struct Scrape {
    handle: &'static PrometheusHandle,
    access: std::sync::Arc<Access>,
}

/// The `/metrics` route for the listener on `addr`; `None`, saying why in the log, when
/// that listener is reachable from other machines and has no token.
pub(crate) fn route(addr: SocketAddr, token: Option<&str>) -> Option<Router> {
    let handle = handle()?;
    match Access::for_listener(addr, token) {
        Ok(access) => {
            info!(url = %format!("http://{addr}/metrics"), "Prometheus metrics");
            let state = Scrape {
                handle,
                access: std::sync::Arc::new(access),
            };
            Some(
                Router::new()
                    .route("/metrics", get(metrics))
                    .with_state(state),
            )
        }
        Err(why) => {
            warn!("GET /metrics is not served on this listener: {why}");
            None
        }
    }
}

async fn metrics(State(s): State<Scrape>, headers: HeaderMap) -> Response {
    if !s.access.admits_bearer(&headers) {
        let why = match *s.access {
            Access::Open => {
                "this listener has no token, so /metrics answers only requests made on its own machine to a loopback address: set PULSE_DASHBOARD_TOKEN and send it as `Authorization: Bearer <token>` to scrape from elsewhere"
            }
            Access::Token(_) => {
                "send PULSE_DASHBOARD_TOKEN as `Authorization: Bearer <token>` (Prometheus: `authorization: {credentials: ...}` in the scrape config)"
            }
        };
        return (StatusCode::UNAUTHORIZED, why).into_response();
    }
    // Recency and histogram upkeep happen on scrape rather than on a timer.
    s.handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.handle.render(),
    )
        .into_response()
}
