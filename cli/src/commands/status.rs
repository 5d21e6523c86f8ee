//! `pulse status`: is the deployment healthy? Agents, overdue heartbeats, the queues and
//! their dead letters, hooks, webhooks and today's tokens, then one line for each thing
//! that needs attention with the command that looks closer. Exits 1 when there is one.

use clap::Args;
use pulse_shared::config::Backend;
use pulse_shared::domain::parse_duration;
use pulse_shared::engine::{Status, gateway_status, status};
use pulse_shared::ports::Backlog;

use super::Ctx;
use crate::Failure;
use crate::output::{count, outln};

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// How often the sweeper runs: a heartbeat due more than two of these ago and not
    /// claimed is overdue. The AWS schedule sweeps every minute; give `pulse serve`'s
    /// `--tick` here to hold it to that.
    #[arg(long, default_value = "1m", value_name = "DURATION")]
    sweep_interval: String,
}

/// A validated `pulse status`.
pub(crate) struct StatusPlan {
    sweep_interval: jiff::SignedDuration,
}

pub(crate) fn plan(a: StatusArgs) -> Result<StatusPlan, Failure> {
    let sweep_interval = parse_duration("sweep-interval", &a.sweep_interval)
        .map_err(|e| Failure::Input(e.to_string()))?;
    if sweep_interval <= jiff::SignedDuration::ZERO {
        return Err(Failure::Input(
            "invalid --sweep-interval: use a positive duration, e.g. 1m or 1s".into(),
        ));
    }
    Ok(StatusPlan { sweep_interval })
}

pub(crate) async fn execute(plan: StatusPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let hint = match &cx.config.backend {
        Backend::Sqlite { .. } => {
            "is `pulse serve` running on this database? Its log says why a sweep failed"
        }
        Backend::Aws(_) => {
            "the sweeper's schedule (enabled? its dead-letter queue?), its Errors and its log in CloudWatch; HeartbeatLatenessAlarm watches this"
        }
    };
    let mut s = status(
        cx.b.store.as_ref(),
        cx.b.queue.as_ref(),
        cx.b.hooks.as_deref(),
        cx.clock.now(),
        plan.sweep_interval,
        hint,
    )
    .await?;
    if matches!(cx.config.backend, Backend::Sqlite { .. }) {
        durability(cx, &mut s);
    }
    if let Some(token) = &cx.config.discord.bot_token {
        let lease = pulse_shared::discord::lease_name(token);
        gateway_status(cx.b.store.as_ref(), &lease, cx.clock.now(), &mut s).await?;
    }
    if cx.out.json {
        cx.out.json_value(&s);
    } else {
        print(&s);
    }
    match s.findings.len() {
        0 => Ok(()),
        n => Err(Failure::Attention(format!(
            "{} {} attention",
            count(n, "thing"),
            if n == 1 { "needs" } else { "need" }
        ))),
    }
}

/// What acknowledgements promise: as the running `pulse serve` said at start-up (in its
/// claim lock file), else as this process's environment says.
fn durability(cx: &Ctx<'_>, s: &mut Status) {
    let serve = cx.b.orphans.as_ref().and_then(|o| {
        o.announced()
            .iter()
            .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
            .find(|v| v["program"] == "pulse serve")
    });
    let (durability, of) = match serve
        .as_ref()
        .and_then(|v| Some((v["durability"].as_str()?, &v["pid"])))
    {
        Some((d, pid)) => (d.to_owned(), format!("pulse serve, pid {pid}")),
        None => (
            cx.config.durability.as_str().to_owned(),
            "this process's PULSE_DURABILITY: no pulse serve runs on this database".to_owned(),
        ),
    };
    s.durability = Some(durability);
    s.durability_of = Some(of);
}

fn queue(b: &Backlog) -> String {
    let dead = b.dead.map_or_else(
        || "no dead-letter queue known".to_owned(),
        |d| format!("{d} dead-lettered"),
    );
    format!("{} waiting, {} in flight, {dead}", b.waiting, b.in_flight)
}

fn print(s: &Status) {
    let a = &s.agents;
    outln!(
        "agents     {} active, {} paused, {} failing",
        a.active,
        a.paused,
        a.failing
    );
    outln!(
        "overdue    {} (due more than {:#} ago, not claimed)",
        count(s.overdue, "heartbeat"),
        jiff::SignedDuration::from_millis(s.overdue_after_ms)
    );
    let ms = |n: u64| jiff::SignedDuration::from_millis(n as i64);
    outln!(
        "started    p99 {:#}, max {:#} after due (each agent's latest run); {} late",
        ms(s.start_delay_p99_ms),
        ms(s.start_delay_max_ms),
        s.late_starts
    );
    outln!("sessions   {}", queue(&s.sessions_queue));
    match &s.hooks_queue {
        Some(h) => outln!("hooks      {}", queue(h)),
        None => outln!("hooks      not configured (PULSE_HOOKS_QUEUE_URL)"),
    }
    outln!("tokens     {} today", s.tokens_today);
    if let (Some(d), Some(of)) = (&s.durability, &s.durability_of) {
        outln!("durability {d} ({of})");
    }
    if let Some(g) = &s.discord_gateway {
        let r = &g.record;
        outln!(
            "discord    gateway {}, {} accepted, {} from strangers, {} past a person's rate, {} reactions, lease until {}",
            r.state,
            r.accepted,
            r.strangers,
            r.rate_limited,
            r.reactions,
            g.held_until
        );
    }
    if s.findings.is_empty() {
        outln!("nothing needs attention");
        return;
    }
    outln!();
    for f in &s.findings {
        outln!("! {}", f.what);
        outln!("    {}", f.look);
    }
}
