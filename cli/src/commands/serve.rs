//! `pulse serve` and `pulse sweep`: the engine's two steps (`sweep_once`, `poll_once`) in
//! loops, on whichever backend the configuration names, beside the HTTP receiver and the
//! hook dispatcher.

use std::net::SocketAddr;

use clap::Args;
use pulse_shared::domain::parse_duration;
use std::sync::Arc;
use std::time::Duration;

use pulse_shared::app::{Connected, Services};
use pulse_shared::config::{Backend, Config};
use pulse_shared::engine::{
    DispatchReport, DispatchSettings, Dispatcher, HOOK_BATCH, PollReport, Sweeper, Worker,
};
use pulse_shared::error::chain;
use pulse_shared::http::{self, Inbound, ServeLimits};
use pulse_shared::ports::Clock;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use super::listen::listen_addr;
use super::{Ctx, input};
use crate::Failure;
use crate::output::{Out, count};

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// How often to sweep for due heartbeats.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    tick: String,
    /// Where the HTTP receiver (Discord interactions, webhooks, health) listens; `off`
    /// for none.
    #[arg(
        long,
        env = "PULSE_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    listen: String,
    /// How long a client may take to send a request's headers (an idle connection is
    /// closed after it).
    #[arg(
        long,
        env = "PULSE_HTTP_HEADER_TIMEOUT",
        default_value = "5s",
        value_name = "DURATION"
    )]
    header_timeout: String,
    /// How long one request may take, its body included (408 after it).
    #[arg(
        long,
        env = "PULSE_HTTP_REQUEST_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION"
    )]
    request_timeout: String,
    /// Most HTTP connections open at once. At the cap, the longest idle one (waiting for
    /// a request's headers) is closed to make room; when every one is busy, a new one is
    /// refused.
    #[arg(
        long,
        env = "PULSE_HTTP_MAX_CONNECTIONS",
        default_value_t = 512,
        value_name = "N"
    )]
    max_connections: usize,
    /// Most HTTP connections one address (an IPv6 /64) holds at once, an eighth of
    /// which may be reading request bodies (raise it when many clients share one
    /// address, behind a NAT or a proxy).
    #[arg(
        long,
        env = "PULSE_HTTP_MAX_PER_ADDRESS",
        default_value_t = 64,
        value_name = "N"
    )]
    max_per_address: usize,
    /// Most long-lived streams (the dashboard's live updates) open at once, beside the
    /// connections; each lasts at most five minutes before its page opens another.
    #[arg(
        long,
        env = "PULSE_HTTP_MAX_STREAMS",
        default_value_t = 128,
        value_name = "N"
    )]
    max_streams: usize,
    /// On Ctrl-C or SIGTERM: how long to finish the work in hand (queued jobs, requests
    /// in flight) before stopping; heartbeats claimed but not started by then are
    /// released.
    #[arg(
        long,
        env = "PULSE_SHUTDOWN_GRACE",
        default_value = "10s",
        value_name = "DURATION"
    )]
    shutdown_grace: String,
    /// The dashboard's login token (/ui/ on the listener). Without it the dashboard is
    /// served only on a loopback listener.
    #[arg(long, env = "PULSE_DASHBOARD_TOKEN", hide_env_values = true)]
    dashboard_token: Option<String>,
    /// Start even when another `pulse serve` runs on this database. Two sweep and run
    /// the same agents (their claims keep each heartbeat to one of them), each serves
    /// its own dashboard, and each runs the hourly retention and the memories'
    /// consolidation: for a deliberate hand-over only.
    #[arg(long)]
    allow_second: bool,
}

/// A validated `serve` or `sweep`.
pub(crate) enum ServePlan {
    Serve {
        tick: Duration,
        listen: Option<SocketAddr>,
        limits: ServeLimits,
        dashboard_token: Option<String>,
        allow_second: bool,
    },
    Sweep,
}

pub(crate) fn plan_serve(a: ServeArgs) -> Result<ServePlan, Failure> {
    let tick = parse_duration("tick", &a.tick).map_err(input)?;
    if tick < jiff::SignedDuration::from_millis(100) {
        return Err(Failure::Input("invalid tick: use at least 100ms".into()));
    }
    let listen = match a.listen.trim() {
        "off" | "none" => None,
        addr => Some(listen_addr(addr)?),
    };
    let positive = |name: &'static str, v: &str| -> Result<Duration, Failure> {
        let d = parse_duration(name, v).map_err(input)?;
        if d <= jiff::SignedDuration::ZERO {
            return Err(Failure::Input(format!(
                "invalid {name} {v:?}: use more than 0s"
            )));
        }
        Ok(d.unsigned_abs())
    };
    for (flag, n) in [
        ("--max-connections", a.max_connections),
        ("--max-per-address", a.max_per_address),
        ("--max-streams", a.max_streams),
    ] {
        if n == 0 {
            return Err(Failure::Input(format!("invalid {flag} 0: use at least 1")));
        }
    }
    let limits = ServeLimits {
        header_timeout: positive("header timeout", &a.header_timeout)?,
        request_timeout: positive("request timeout", &a.request_timeout)?,
        max_connections: a.max_connections,
        max_per_address: a.max_per_address,
        // One address may have an eighth of its connections reading bodies (8 of the
        // default 64; more behind a proxy that raises its share).
        max_reading_per_address: (a.max_per_address / 8).max(1),
        max_streams: a.max_streams,
        max_streams_per_address: ServeLimits::default()
            .max_streams_per_address
            .min(a.max_streams),
        shutdown_grace: positive("shutdown grace", &a.shutdown_grace)?,
        ..ServeLimits::default()
    };
    Ok(ServePlan::Serve {
        tick: tick.unsigned_abs(),
        listen,
        limits,
        dashboard_token: a.dashboard_token,
        allow_second: a.allow_second,
    })
}

pub(crate) async fn execute(plan: ServePlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        ServePlan::Serve {
            tick,
            listen,
            limits,
            dashboard_token,
            allow_second,
        } => {
            if !allow_second {
                alone(cx.b)?;
            }
            let serving = Serving {
                tick,
                listen,
                limits,
                dashboard_token,
            };
            serve(cx.config, cx.b, cx.clock.clone(), serving).await
        }
        ServePlan::Sweep => sweep_and_drain(cx.config, cx.b, cx.clock.clone(), cx.out).await,
    }
}

/// How long a received hook message stays hidden: longer than the longest hook timeout
/// (60 s), so a message is not handed to a second loop while its attempt runs.
const HOOK_VISIBILITY: Duration = Duration::from_secs(120);

/// The hook dispatcher; `pulse sweep`'s (`helper`) leaves what it may not send for
/// `pulse serve`.
fn dispatcher(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    helper: bool,
) -> Option<Dispatcher> {
    let settings = DispatchSettings {
        leave_unsendable: helper,
        ..DispatchSettings::default()
    };
    b.dispatcher(clock, &pulse_shared::app::egress(config), settings)
}

/// The sweeper and the worker; the worker starts local MCP servers if they are on. A
/// long-running process (`serving`) also loads a local embeddings model at once and
/// re-embeds, in the background, memories kept under another model.
fn engine(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    serving: bool,
) -> Result<(Sweeper, Worker), Failure> {
    let services = Services::from_config(config);
    if serving {
        let local = matches!(
            config.embed.source,
            pulse_shared::config::EmbedSource::Local { .. }
        );
        tokio::spawn(embed_in_background(
            b.store.clone(),
            b.memories(&services),
            local,
        ));
    }
    let local = super::mcp::local_switch(config)?;
    if local {
        tracing::warn!(
            "PULSE_MCP_STDIO=on: local MCP servers run as programs with this user's rights"
        );
    }
    let tools = b.agent_tools_with(clock.clone(), &services, local);
    let worker = b.worker_with(clock, &config.engine, &services, tools);
    Ok((b.sweeper(&config.engine), worker))
}

fn describe(backend: &Backend) -> String {
    match backend {
        Backend::Sqlite { path } => format!("sqlite {}", path.display()),
        Backend::Aws(a) => format!("aws table {} queue {}", a.table, a.sessions_queue_url),
    }
}

/// How long a received job stays hidden: the claim's lease (`PULSE_LEASE`). A job whose
/// process dies comes back when its lease runs out, so a crash delays the agent by at
/// most the lease and one tick (the job then renews its claim, or finds it reclaimed and
/// steps aside for the newer job).
fn visibility(config: &Config) -> Duration {
    config.engine.lease.unsigned_abs()
}

/// Sweeps every `tick` and runs queued jobs as they come, until Ctrl-C or SIGTERM. Then
/// it stops claiming, runs the jobs already queued and finishes requests in flight for
/// up to `limits.shutdown_grace`, and releases the heartbeats still claimed but not
/// started (PENDING again) instead of leaving them EXECUTING.
pub(crate) async fn serve(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    serving: Serving,
) -> Result<(), Failure> {
    let Serving {
        tick,
        listen,
        limits,
        dashboard_token,
    } = serving;
    // Recording starts before any work, so the first sweep is counted.
    crate::scrape::install();
    let (sweeper, worker) = engine(config, b, clock.clone(), true)?;
    // Set when the sweeper has stopped: nothing is claimed after it.
    let (swept_tx, swept_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Bind first: a port in use is a start-up error, not a warning in the log later.
    let listener = bind(listen).await?;
    let loops = Loops {
        config,
        b,
        clock,
        tick,
        dashboard_token,
        stop: stop_rx,
        wake: Notify::new(),
    };
    announce(config, tick);
    tell_others(
        config,
        b,
        listener.as_ref().and_then(|l| l.local_addr().ok()),
    );

    let signals = async {
        super::shutdown::shutdown_signal().await;
        info!(grace = ?limits.shutdown_grace, "stopping: finishing the work in hand");
        let _ = stop_tx.send(true);
    };
    // The work in hand gets the grace after the stop signal, no more: what is still
    // running then is dropped, as a crash would drop it, and its lease brings it back.
    let grace_over = async {
        let mut stop = loops.stop.clone();
        let _ = stop.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(limits.shutdown_grace).await;
    };
    tokio::select! {
        _ = async {
            tokio::join!(
                loops.sweep(&sweeper, &swept_tx),
                loops.work(&worker, &swept_rx),
                loops.dispatch(),
                loops.prune(),
                loops.receive(listener, limits),
                super::gateway::beside_serve(config, b, loops.clock.clone(), loops.stop.clone()),
                signals,
            )
        } => {}
        () = grace_over => {
            warn!(grace = ?limits.shutdown_grace, "the shutdown grace ran out with work in hand: it is left to its lease");
        }
    }
    release_queued(&worker, b).await;
    info!("pulse serve stopped");
    Ok(())
}

/// Refuses to start beside another live `pulse serve` on the same database (as its claim
/// lock file says; see `OrphanedClaims::announced`), naming it.
fn alone(b: &Connected) -> Result<(), Failure> {
    let Some(orphans) = &b.orphans else {
        return Ok(());
    };
    let Some(other) = orphans
        .announced()
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .find(|v| v["program"] == "pulse serve")
    else {
        return Ok(());
    };
    let listen = other["listen"].as_str().unwrap_or("no listener");
    Err(Failure::Input(format!(
        "another pulse serve (pid {}, listening on {listen}) runs on this database: two would both sweep and run its agents, serve two dashboards, and run retention and consolidation twice. Stop it first, or start this one with --allow-second for a deliberate hand-over",
        other["pid"]
    )))
}

/// Says, for `pulse status` and a second `pulse serve` to read while this process
/// lives, what it runs with (in its claim lock file beside the database; see
/// `OrphanedClaims::announce`).
fn tell_others(config: &Config, b: &Connected, listen: Option<SocketAddr>) {
    let Some(orphans) = &b.orphans else { return };
    let about = serde_json::json!({
        "program": "pulse serve",
        "pid": std::process::id(),
        "durability": config.durability.as_str(),
        "listen": listen.map(|a| a.to_string()),
    });
    if let Err(e) = orphans.announce(&about.to_string()) {
        warn!(error = %e, "cannot tell other processes what this one runs with: `pulse status` shows its own PULSE_DURABILITY instead");
    }
}

/// Binds the HTTP receiver's address, if it has one.
async fn bind(listen: Option<SocketAddr>) -> Result<Option<TcpListener>, Failure> {
    Ok(match listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
            Failure::Input(format!(
                "cannot listen on {addr}: {e}; choose another with --listen (PULSE_LISTEN), or --listen off"
            ))
        })?),
        None => None,
    })
}

/// Logs what `serve` runs on.
fn announce(config: &Config, tick: Duration) {
    info!(backend = %describe(&config.backend), tick = ?tick, "pulse serve started; Ctrl-C stops it");
    if matches!(config.backend, pulse_shared::config::Backend::Sqlite { .. }) {
        info!(
            durability = config.durability.as_str(),
            "PULSE_DURABILITY: {}",
            config.durability.promise()
        );
    }
    info!(llm = %config.llm.describe(), "language model");
    info!("{}", pulse_shared::embed::describe(&config.embed));
    if !config.discord.is_configured() {
        info!(
            "Discord is not configured (DISCORD_BOT_TOKEN, DISCORD_APPLICATION_ID): replies are stored only; `pulse conversation show` reads them"
        );
    }
    match (
        config.telegram.is_configured(),
        config.inbound.telegram_secret.is_some(),
    ) {
        (true, true) => info!("Telegram: replies on; updates taken at POST /telegram/webhook"),
        (true, false) => info!(
            "Telegram: replies on; updates are refused until TELEGRAM_WEBHOOK_SECRET is set (`pulse telegram set-webhook` makes one)"
        ),
        (false, true) => info!(
            "Telegram: updates taken at POST /telegram/webhook, but TELEGRAM_BOT_TOKEN is not set: replies there are stored only"
        ),
        (false, false) => {}
    }
    match (
        config.slack.is_configured(),
        config.inbound.slack_signing_secret.is_some(),
    ) {
        (true, true) => info!(
            "Slack: replies on; events taken at POST /slack/events and POST /slack/interactions"
        ),
        (true, false) => {
            info!("Slack: replies on; events are refused until SLACK_SIGNING_SECRET is set")
        }
        (false, true) => info!(
            "Slack: events taken at POST /slack/events, but SLACK_BOT_TOKEN is not set: replies there are stored only"
        ),
        (false, false) => {}
    }
}

/// At start: loads a `local` model (so one that cannot be loaded is said now, and the
/// first memory does not wait for it), then gives every agent's memories kept under
/// another model (or none) a vector of this one, agent by agent, logging the progress.
/// Until then those are recalled by their words, and each recall embeds a few.
async fn embed_in_background(
    store: Arc<dyn pulse_shared::ports::Store>,
    memories: Arc<pulse_shared::engine::memory::Memories>,
    local: bool,
) {
    if local {
        let started = std::time::Instant::now();
        match memories.embedder().embed(&["Pulse".to_owned()]).await {
            Ok(_) => info!(
                ms = started.elapsed().as_millis() as u64,
                "the local embeddings model is loaded"
            ),
            Err(e) => {
                tracing::error!(error = %e, "the local embeddings model cannot be used: memories are recalled by their words until it is mended (PULSE_EMBED_MODEL)");
                return;
            }
        }
    }
    let agents = match store.list_agents().await {
        Ok(agents) => agents,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the agents to re-embed their memories; `pulse memories reindex` does it");
            return;
        }
    };
    let model = memories.model().to_owned();
    for agent in agents {
        let mut told = 0;
        let result = memories
            .reindex(&agent, |done, total| {
                // A line when it starts, and at each further tenth.
                if total > 0 && (done == 0 || done * 10 / total > told) {
                    told = done * 10 / total;
                    info!(agent = %agent.name, done, total, model = %model, "re-embedding memories kept under another model");
                }
            })
            .await;
        match result {
            Ok((0, 0)) => {}
            Ok((done, 0)) => {
                info!(agent = %agent.name, memories = done, model = %model, "memories re-embedded")
            }
            Ok((done, left)) => {
                tracing::warn!(agent = %agent.name, done, left, model = %model, "some memories could not be re-embedded: they are recalled by their words, and each recall tries a few again")
            }
            Err(e) => {
                tracing::warn!(agent = %agent.name, error = %e, "cannot re-embed memories; `pulse memories reindex` does it")
            }
        }
    }
}

/// How often `pulse serve` looks for processes that stopped on its database file
/// holding claims (and once at start).
const ORPHANS_EVERY: Duration = Duration::from_secs(60);

/// Takes back what processes that stopped on this SQLite file held (see
/// [`pulse_shared::adapters::sqlite::OrphanedClaims`]): their jobs run again now instead of
/// after their leases. Logs what it did; a failure is logged and left to the leases.
async fn take_back_orphans(b: &Connected, now: jiff::Timestamp) {
    let Some(orphans) = &b.orphans else { return };
    match orphans.take_back(now).await {
        Ok(t) if t.messages > 0 || !t.heartbeats.is_empty() => {
            info!(
                processes = t.processes,
                jobs = t.messages,
                reclaimable = t.heartbeats.len(),
                "took back the work of a process that stopped on this database: its heartbeats and turns run again now instead of when their leases run out"
            );
            for id in &t.heartbeats {
                info!(heartbeat_id = %id, "claimed by a stopped process before its job was queued: due again now");
            }
        }
        Ok(_) => {}
        Err(e) => {
            warn!(error = %chain(&e), "could not look for the claims of stopped processes; their leases bring them back")
        }
    }
}

/// Gives back the heartbeats of jobs still queued: claimed but never started.
async fn release_queued(worker: &Worker, b: &Connected) {
    match worker.release_queued(b.queue.as_ref()).await {
        Ok(0) => {}
        Ok(n) => info!(
            heartbeats = n,
            "released heartbeats claimed but not started: PENDING again"
        ),
        Err(e) => {
            error!(error = %chain(&e), "could not release the heartbeats still queued; their leases will bring them back")
        }
    }
}

/// How `pulse serve` runs.
pub(crate) struct Serving {
    pub(crate) tick: Duration,
    pub(crate) listen: Option<SocketAddr>,
    pub(crate) limits: ServeLimits,
    pub(crate) dashboard_token: Option<String>,
}

/// How often `pulse serve` runs the retention pass.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// What the loops of `serve` share.
struct Loops<'a> {
    config: &'a Config,
    b: &'a Connected,
    clock: Arc<dyn Clock>,
    tick: Duration,
    /// The dashboard's login token, if one is set.
    dashboard_token: Option<String>,
    /// Set on Ctrl-C or SIGTERM.
    stop: watch::Receiver<bool>,
    /// Notified when a sweep queued jobs, so the worker polls at once.
    wake: Notify,
}

impl Loops<'_> {
    /// Sweeps every tick until stopped; then sets `swept`.
    async fn sweep(&self, sweeper: &Sweeper, swept: &watch::Sender<bool>) {
        let mut stop = self.stop.clone();
        let mut interval = tokio::time::interval(self.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut orphans_looked = None;
        while !*stop.borrow() {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stop.changed() => break,
            }
            if orphans_looked.is_none_or(|at: std::time::Instant| at.elapsed() >= ORPHANS_EVERY) {
                take_back_orphans(self.b, self.clock.now()).await;
                orphans_looked = Some(std::time::Instant::now());
            }
            let report = sweeper.sweep_once(self.clock.now()).await;
            for e in &report.errors {
                warn!(error = %e, "sweep problem");
            }
            if report.queued > 0 {
                self.wake.notify_one();
            }
        }
        let _ = swept.send(true);
    }

    /// Runs queued jobs as they come until stopped; then, once the sweeper is done
    /// (`swept`), the jobs it already queued.
    async fn work(&self, worker: &Worker, swept: &watch::Receiver<bool>) {
        let (b, tick, visibility) = (self.b, self.tick, visibility(self.config));
        let mut stop = self.stop.clone();
        while !*stop.borrow() {
            match worker.poll_once(b.queue.as_ref(), 10, visibility).await {
                Ok(PollReport { received, .. }) if received > 0 => continue,
                Ok(_) => {}
                Err(e) => error!(error = %chain(&e), "cannot read the queue; retrying"),
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => {}
            }
        }
        // Stopping. Once the sweeper has stopped claiming, run what it already queued
        // (the shutdown grace bounds this, in `serve`).
        let mut swept = swept.clone();
        let _ = swept.wait_for(|done| *done).await;
        let mut ran = 0;
        while let Ok(PollReport { received, .. }) =
            worker.poll_once(b.queue.as_ref(), 10, visibility).await
        {
            if received == 0 {
                break;
            }
            ran += received;
        }
        if ran > 0 {
            info!(jobs = ran, "ran the jobs queued before stopping");
        }
    }

    /// Delivers hooks until stopped, if this backend has a hooks queue.
    async fn dispatch(&self) {
        let config = self.config;
        let Some(dispatcher) = dispatcher(config, self.b, self.clock.clone(), false) else {
            info!("no hooks queue: hooks are not delivered by this process");
            return;
        };
        if !config.hooks.allow.is_empty() {
            warn!(allow = %config.hooks.allow, "PULSE_HOOKS_ALLOW lets hooks and HTTP tools reach these non-public addresses: for local development only");
        }
        let mut stop = self.stop.clone();
        while !*stop.borrow() {
            match dispatcher.poll_once(HOOK_BATCH, HOOK_VISIBILITY).await {
                Ok(r) if r.handled > 0 => continue,
                Ok(_) => {}
                Err(e) => error!(error = %chain(&e), "cannot read the hooks queue; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.tick.min(Duration::from_secs(1))) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Hourly from the start until stopped: the retention pass (see
    /// [`pulse_shared::engine::prune`]) removes what is past its agent's retention, in batches of a few
    /// hundred rows each its own transaction, so receivers and workers wait a moment at
    /// most; then the file gives the freed pages back. At the start and every 24 hours it
    /// queues the agents' memory consolidations first.
    async fn prune(&self) {
        let mut stop = self.stop.clone();
        let mut interval = tokio::time::interval(PRUNE_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut hours = 0u64;
        while !*stop.borrow() {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stop.changed() => break,
            }
            if hours.is_multiple_of(24) {
                self.queue_consolidations().await;
            }
            hours += 1;
            let pass = pulse_shared::engine::prune(
                self.b.store.as_ref(),
                self.config.retention,
                self.clock.now(),
                true,
            );
            // What went is logged by the pass, each agent it could not prune too.
            if let Err(e) = pass.await {
                warn!(error = %chain(&e), "the retention pass failed; trying again in an hour");
            }
        }
    }

    /// Queues each agent's consolidation of its memories (at the start, then daily); the
    /// worker runs them in the agents' sessions.
    async fn queue_consolidations(&self) {
        let queued = pulse_shared::engine::memory::queue_consolidations(
            self.b.store.as_ref(),
            self.b.queue.as_ref(),
            self.clock.now(),
        );
        match queued.await {
            Ok(n) => info!(agents = n, "queued the daily consolidation of memories"),
            Err(e) => {
                warn!(error = %chain(&e), "cannot queue the daily consolidation of memories; trying again tomorrow");
            }
        }
    }

    /// Runs the HTTP receiver on `listener`, if there is one, until stopped.
    async fn receive(&self, listener: Option<TcpListener>, limits: ServeLimits) {
        let Some(listener) = listener else { return };
        let config = self.config;
        let inbound = Arc::new(Inbound::new(
            self.b.store.clone(),
            self.b.queue.clone(),
            self.clock.clone(),
            config.inbound.clone(),
        ));
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        info!(%addr, "HTTP receiver listening: POST /discord/interactions, POST /telegram/webhook, POST /slack/events, POST /slack/interactions, POST /webhooks/{{id}}, GET /healthz");
        if config.inbound.discord_public_key.is_none() {
            info!("DISCORD_PUBLIC_KEY is not set: Discord interactions are refused (401)");
        }
        let mut stop = self.stop.clone();
        let shutdown = async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        };
        let mut app = http::router(inbound);
        if let Ok(local) = listener.local_addr() {
            let token = self.dashboard_token.as_deref();
            if let Some(ui) =
                super::dashboard::beside_receiver(config, self.b, self.clock.clone(), local, token)
            {
                app = app.merge(ui);
            }
            if let Some(metrics) = crate::scrape::route(local, token) {
                app = app.merge(metrics);
            }
        }
        if let Err(e) = http::serve_app(listener, app, limits, shutdown).await {
            error!(error = %e, "the HTTP receiver stopped");
        }
    }
}

/// One sweep, then every job that is ready now.
pub(crate) async fn sweep_and_drain(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    out: &Out,
) -> Result<(), Failure> {
    let (sweeper, worker) = engine(config, b, clock.clone(), false)?;
    take_back_orphans(b, clock.now()).await;
    let report = sweeper.sweep_once(clock.now()).await;
    let (mut ran, mut failed) = (0, 0);
    loop {
        let r = worker
            .poll_once(b.queue.as_ref(), 10, visibility(config))
            .await?;
        if r.received == 0 {
            break;
        }
        ran += r.received;
        failed += r.failed;
    }
    // Deliver the hooks those jobs emitted that are due now (retries wait for serve).
    // Run beside `pulse serve` (perhaps without its PULSE_HOOKS_ALLOW), it leaves the
    // deliveries it may not send to the server rather than failing them.
    let hooks = match dispatcher(config, b, clock.clone(), true) {
        Some(d) => d.drain_report(HOOK_BATCH, HOOK_VISIBILITY).await?,
        None => DispatchReport::default(),
    };
    if out.json {
        out.json_value(
            &serde_json::json!({ "sweep": report, "jobs_run": ran, "jobs_failed": failed, "hook_attempts": hooks.attempts, "hooks_left": hooks.left }),
        );
    } else {
        eprintln!(
            "swept: {} due, {} claimed, {} skipped; ran {} ({failed} to retry); {}",
            report.due,
            report.claimed,
            report.skipped,
            count(ran, "job"),
            count(hooks.attempts, "hook attempt")
        );
        if hooks.left > 0 {
            eprintln!(
                "left {} queued for `pulse serve`: their targets are outside this process's PULSE_HOOKS_ALLOW",
                count(hooks.left, "hook delivery")
            );
        }
    }
    match sweep_failure(&report.errors, failed) {
        None => Ok(()),
        Some(why) => Err(Failure::Runtime(anyhow::anyhow!(why))),
    }
}

/// What went wrong in a `pulse sweep`, in one sentence: the sweep's own problems, and
/// the jobs that failed and go back to the queue; `None` when nothing did.
fn sweep_failure(problems: &[pulse_shared::engine::SweepProblem], failed: usize) -> Option<String> {
    let jobs = (failed > 0).then(|| {
        format!(
            "{} failed and will be retried (the log above says why; `pulse status` shows what is left)",
            count(failed, "job")
        )
    });
    let sweep = (!problems.is_empty()).then(|| {
        format!(
            "the sweep met {}: {}",
            count(problems.len(), "problem"),
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    });
    match (sweep, jobs) {
        (None, None) => None,
        (Some(s), Some(j)) => Some(format!("{s}; {j}")),
        (Some(one), None) | (None, Some(one)) => Some(one),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sweep_says_what_failed_and_nothing_about_what_did_not() {
        assert_eq!(sweep_failure(&[], 0), None);
        let jobs = sweep_failure(&[], 2).unwrap();
        assert!(
            jobs.starts_with("2 jobs failed and will be retried"),
            "{jobs}"
        );
        assert!(
            !jobs.contains("problem") && !jobs.contains("(none)"),
            "{jobs}"
        );
        let problem = pulse_shared::engine::SweepProblem::DueQuery {
            shard: 0,
            message: "disk I/O error".into(),
        };
        let both = sweep_failure(std::slice::from_ref(&problem), 1).unwrap();
        assert_eq!(
            both,
            "the sweep met 1 problem: due query of shard 0: disk I/O error; 1 job failed and will be retried (the log above says why; `pulse status` shows what is left)"
        );
    }
}
