//! `pulse dashboard`: the dashboard alone, against the configured backend (SQLite, or
//! DynamoDB and SQS with the operator's own credentials); and the dashboard routes
//! `pulse serve` mounts beside its receiver.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use clap::Args;
use pulse_shared::app::Connected;
use pulse_shared::config::Config;
use pulse_shared::http::{self, ServeLimits};
use pulse_shared::ports::Clock;
use pulse_ui::{Access, Dashboard};
use tracing::{info, warn};

use super::Ctx;
use super::listen::listen_addr;
use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct DashboardArgs {
    /// Where it listens. Beyond loopback it needs PULSE_DASHBOARD_TOKEN.
    #[arg(long, default_value = "127.0.0.1:8081", value_name = "ADDR")]
    listen: String,
    /// The login token, required off loopback (at least 16 random characters).
    #[arg(long, env = "PULSE_DASHBOARD_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// A validated `pulse dashboard`.
pub(crate) struct DashboardPlan {
    listen: SocketAddr,
    access: Access,
}

pub(crate) fn plan(a: DashboardArgs) -> Result<DashboardPlan, Failure> {
    let listen = listen_addr(a.listen.trim())?;
    let access = Access::for_listener(listen, a.token.as_deref())
        .map_err(|e| Failure::Input(e.to_string()))?;
    Ok(DashboardPlan { listen, access })
}

pub(crate) async fn execute(plan: DashboardPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(plan.listen)
        .await
        .map_err(|e| Failure::Input(format!("cannot listen on {}: {e}", plan.listen)))?;
    let addr = listener.local_addr()?;
    let dashboard = Dashboard::new(
        cx.b,
        cx.clock.clone(),
        &cx.config.engine,
        &pulse_shared::app::Services::from_config(cx.config),
        plan.access,
    );
    eprintln!("dashboard at http://{addr}/ui/ (Ctrl-C stops it)");
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    http::serve_app(listener, dashboard.router(), ServeLimits::default(), stop).await?;
    Ok(())
}

/// The dashboard routes for `pulse serve`'s listener on `addr`; `None`, saying why in
/// the log, when that listener is reachable from other machines and has no token.
pub(crate) fn beside_receiver(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    addr: SocketAddr,
    token: Option<&str>,
) -> Option<Router> {
    match Access::for_listener(addr, token) {
        Ok(access) => {
            info!(url = %format!("http://{addr}/ui/"), "dashboard");
            let services = pulse_shared::app::Services::from_config(config);
            Some(Dashboard::new(b, clock, &config.engine, &services, access).router())
        }
        Err(why) => {
            warn!("the dashboard is not served on this listener: {why}");
            None
        }
    }
}
