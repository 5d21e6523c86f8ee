//! Is the deployment healthy? One read of everything an operator would look at first —
//! agents, overdue heartbeats, the queues and their dead letters, hooks, webhooks,
//! today's tokens — and the findings that need attention, each with the command that
//! looks closer. `pulse status` prints it.

use futures::{StreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use super::budget;
use crate::domain::{Agent, HeartbeatStatus, RequestStatus, WebhookRequest};
use crate::error::StoreError;
use crate::ports::{Backlog, HookQueue, SessionQueue, Store};

/// Agents read at once.
const CONCURRENCY: usize = 8;
/// Overdue heartbeats counted at most (the count says "at least" beyond).
const OVERDUE_SCAN: usize = 1_000;
/// An agent's latest actions looked through for ones whose outcome is not known.
const ACTIONS_SCAN: usize = 200;
/// A webhook's latest requests looked at.
const REQUESTS_SCAN: usize = 20;
/// A heartbeat running longer than this is reported as perhaps stuck (a run with many
/// model steps takes minutes; a worker that stopped leaves it running until its lease
/// ends).
const STUCK_AFTER: SignedDuration = SignedDuration::from_mins(5);

/// How recent an agent's latest run must be for its start to count in the status.
const LATE_LOOKS_BACK: SignedDuration = SignedDuration::from_hours(1);

/// What `pulse status` reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// When it was read.
    pub at: Timestamp,
    /// Agents, by state.
    pub agents: AgentCounts,
    /// Heartbeats due more than two sweep intervals ago and not claimed (counted up to
    /// 1,000), and the oldest due time among them.
    pub overdue: usize,
    /// The oldest due time of the overdue heartbeats.
    pub oldest_overdue: Option<Timestamp>,
    /// How long past due counts as overdue, in milliseconds; a run that starts later
    /// than this after its due time started late.
    pub overdue_after_ms: i64,
    /// Agents whose latest heartbeat run started late: more than
    /// [`Status::overdue_after_ms`] after it was due (claimed, then waiting on the
    /// sessions queue for a worker).
    pub late_starts: usize,
    /// From due time to the start of its run, of each agent's latest run (when it
    /// started within the hour): the 99th percentile and the largest, in milliseconds.
    pub start_delay_p99_ms: u64,
    /// The largest.
    pub start_delay_max_ms: u64,
    /// The sessions queue.
    pub sessions_queue: Backlog,
    /// The hooks queue, when hooks are configured.
    pub hooks_queue: Option<Backlog>,
    /// Model tokens spent today (each agent's day, in its time zone).
    pub tokens_today: u64,
    /// Conversation turns waiting on a model that does not answer (see `WaitingTurn`).
    pub turns_waiting: usize,
    /// The Discord gateway, when a bot token is configured and a gateway ever ran: its
    /// state, counts and last error, and until when its holder's lease runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discord_gateway: Option<GatewayReport>,
    /// What the embedded store's acknowledgements promise (`PULSE_DURABILITY`): the
    /// running `pulse serve`'s, or this process's own when none runs; none on AWS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Whose [`Status::durability`] that is: "pulse serve, pid N", or "this process's
    /// PULSE_DURABILITY: no pulse serve runs on this database".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability_of: Option<String>,
    /// What needs attention.
    pub findings: Vec<Finding>,
}

/// The Discord gateway as its lease says.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayReport {
    /// What its holder saved: state, counts, last error.
    #[serde(flatten)]
    pub record: crate::discord::GatewayRecord,
    /// Until when the lease runs; past it, no process reads the gateway.
    pub held_until: Timestamp,
}

/// The Discord gateway of the lease `lease` (see [`crate::discord::lease_name`]): a
/// report, and a finding when it failed for good or nobody holds it.
pub async fn gateway_status(
    store: &dyn Store,
    lease: &str,
    now: Timestamp,
    s: &mut Status,
) -> Result<(), StoreError> {
    let Some(l) = store.get_lease(lease).await? else {
        return Ok(());
    };
    let record: crate::discord::GatewayRecord =
        serde_json::from_value(l.state.clone()).unwrap_or_default();
    let look = "its log (pulse serve's, or pulse gateway's) says more; the book's Discord chapter (docs/src/discord.md) says how to run it";
    if record.state == "failed" {
        s.findings.push(Finding {
            what: format!(
                "the Discord gateway stopped: {}",
                record
                    .last_error
                    .as_deref()
                    .unwrap_or("no reason was saved")
            ),
            look: format!("fix that and start pulse gateway (or pulse serve) again; {look}"),
        });
    } else if l.until < now {
        s.findings.push(Finding {
            what: format!(
                "no process has read the Discord gateway since {}: direct and channel messages are not answered",
                l.until
            ),
            look: format!("start pulse gateway, or pulse serve with DISCORD_BOT_TOKEN; {look}"),
        });
    }
    s.discord_gateway = Some(GatewayReport {
        record,
        held_until: l.until,
    });
    Ok(())
}

/// Agents, by state.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AgentCounts {
    /// Not paused.
    pub active: usize,
    /// Paused.
    pub paused: usize,
    /// Whose latest heartbeats failed (their live heartbeat follows failures).
    pub failing: usize,
}

/// Something that needs attention.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What is wrong.
    pub what: String,
    /// The command that looks closer.
    pub look: String,
}

/// Reads the status at `now`: overdue means due more than two `sweep_interval`s ago.
/// `sweeper_hint` says where the sweeper runs (the finding's advice).
pub async fn status(
    store: &dyn Store,
    sessions: &dyn SessionQueue,
    hooks: Option<&dyn HookQueue>,
    now: Timestamp,
    sweep_interval: SignedDuration,
    sweeper_hint: &str,
) -> Result<Status, StoreError> {
    let overdue_after = sweep_interval * 2;
    let mut s = Status {
        at: now,
        overdue_after_ms: overdue_after.as_millis() as i64,
        ..Status::default()
    };
    overdue(store, now, overdue_after, sweeper_hint, &mut s).await?;
    let agents = store.list_agents().await?;
    agents_status(store, &agents, now, &mut s).await?;
    webhooks_status(store, &agents, now, &mut s).await?;
    for t in store.load_registry().await?.tools {
        if let Some(why) = t.mcp_server().and_then(|m| m.unreadable.as_ref()) {
            s.findings.push(Finding {
                what: format!("MCP server {}: {why}; its tools are not called", t.name),
                look: format!(
                    "restore that key (PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_OLD_KEYS), or add the server again with its headers: pulse tools remove {} && pulse tools add-mcp {} ...",
                    t.name, t.name
                ),
            });
        }
    }
    queues_status(sessions, hooks, &mut s).await?;
    waiting_status(store, now, &mut s).await?;
    Ok(s)
}

/// Overdue heartbeats: the due index as a sweep at `now - overdue_after` would read it.
async fn overdue(
    store: &dyn Store,
    now: Timestamp,
    overdue_after: SignedDuration,
    sweeper_hint: &str,
    s: &mut Status,
) -> Result<(), StoreError> {
    let cutoff = now.checked_sub(overdue_after).unwrap_or(now);
    let mut overdue = Vec::new();
    // Each shard lists by due time: its first is its oldest.
    let mut firsts = Vec::new();
    for shard in 0..store.due_shards().max(1) {
        let mut page = None;
        loop {
            let first_page = page.is_none();
            let due = store.due(shard, cutoff, page, 100).await?;
            if first_page && let Some(first) = due.ids.first() {
                firsts.push(first.clone());
            }
            overdue.extend(due.ids);
            page = due.next;
            if page.is_none() || overdue.len() >= OVERDUE_SCAN {
                break;
            }
        }
    }
    s.overdue = overdue.len();
    if overdue.is_empty() {
        return Ok(());
    }
    let mut oldest: Option<crate::domain::Heartbeat> = None;
    for id in &firsts {
        if let Some(hb) = store.get_heartbeat(id).await?
            && oldest
                .as_ref()
                .is_none_or(|o| hb.scheduled_at < o.scheduled_at)
        {
            oldest = Some(hb);
        }
    }
    s.oldest_overdue = oldest.as_ref().map(|h| h.scheduled_at);
    let look = match &oldest {
        Some(h) => format!(
            "{sweeper_hint}; pulse heartbeats list --agent {} shows the oldest",
            h.agent_id
        ),
        None => sweeper_hint.to_owned(),
    };
    let oldest = s
        .oldest_overdue
        .map(|t| format!("; the oldest was due at {t}"))
        .unwrap_or_default();
    s.findings.push(Finding {
        what: format!(
            "{}{} overdue: due more than {overdue_after:#} ago and not claimed{oldest}",
            if s.overdue >= OVERDUE_SCAN {
                "at least "
            } else {
                ""
            },
            plural(s.overdue, "heartbeat"),
        ),
        look,
    });
    Ok(())
}

/// Agents: their live heartbeat, hooks and today's tokens.
async fn agents_status(
    store: &dyn Store,
    agents: &[Agent],
    now: Timestamp,
    s: &mut Status,
) -> Result<(), StoreError> {
    let read: Vec<Result<AgentStatus, StoreError>> = stream::iter(agents.iter())
        .map(|a| agent_status(store, a, now))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let mut delays = Vec::new();
    let mut latest: Option<(SignedDuration, &Agent)> = None;
    let late_after = SignedDuration::from_millis(s.overdue_after_ms);
    for (agent, r) in agents.iter().zip(read) {
        let a = r?;
        if let Some(d) = a.start_delay {
            delays.push(d.unsigned_abs());
            if d > late_after {
                s.late_starts += 1;
            }
            if latest.is_none_or(|(l, _)| d > l) {
                latest = Some((d, agent));
            }
        }
        if agent.is_paused() {
            s.agents.paused += 1;
        } else {
            s.agents.active += 1;
        }
        s.tokens_today += a.tokens_today;
        if a.failures > 0 {
            s.agents.failing += 1;
            let last = match a.failures {
                1 => "heartbeat".to_owned(),
                n => format!("{n} heartbeats"),
            };
            s.findings.push(Finding {
                what: format!("agent {}: its last {last} failed", agent.name),
                look: format!("pulse heartbeats list --agent {} --status FAILED", agent.id),
            });
        }
        s.findings.extend(a.findings);
    }
    let (max, p99) = crate::meter::max_and_p99(&delays);
    s.start_delay_max_ms = max.as_millis() as u64;
    s.start_delay_p99_ms = p99.as_millis() as u64;
    if s.late_starts > 0
        && let Some((d, agent)) = latest
    {
        s.findings.push(Finding {
            what: format!(
                "{} started more than {late_after:#} after {} due (due time to the start of its run; the latest, agent {}, {:#} late): the workers do not keep up with the agents' intervals",
                if s.late_starts == 1 {
                    "1 agent's latest heartbeat".to_owned()
                } else {
                    format!("{} agents' latest heartbeats", s.late_starts)
                },
                if s.late_starts == 1 { "it was" } else { "they were" },
                agent.name,
                d.round(jiff::Unit::Millisecond).unwrap_or(d),
            ),
            look: format!(
                "pulse heartbeats list --agent {} (due and started times); give agents longer intervals, or the workers more room (on AWS, the WorkerMaximumConcurrency parameter)",
                agent.id
            ),
        });
    }
    Ok(())
}

/// Webhooks whose secrets no configured key opens, and those whose latest requests
/// within a day were refused.
async fn webhooks_status(
    store: &dyn Store,
    agents: &[Agent],
    now: Timestamp,
    s: &mut Status,
) -> Result<(), StoreError> {
    let webhooks = store.list_webhooks().await?;
    let name_of = |w: &crate::domain::Webhook| {
        agents
            .iter()
            .find(|a| a.id == w.agent_id)
            .map_or(w.agent_id.to_string(), |a| a.name.clone())
    };
    for w in &webhooks {
        if let Some(why) = &w.unreadable {
            s.findings.push(Finding {
                what: format!(
                    "webhook {} (agent {}): {why}; its requests are answered 503",
                    w.id,
                    name_of(w)
                ),
                look: format!(
                    "restore key {} (PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_OLD_KEYS), or give it a new secret: pulse webhooks rotate {} (and give the sender the new one)",
                    why.key_id, w.id
                ),
            });
        }
    }
    for w in webhooks
        .iter()
        .filter(|w| w.active && w.unreadable.is_none())
    {
        let requests = store.list_requests(&w.id, REQUESTS_SCAN).await?;
        let Some(latest) = requests.first() else {
            continue;
        };
        let refused = |r: &&WebhookRequest| {
            !matches!(r.status, RequestStatus::Accepted | RequestStatus::Duplicate)
        };
        if !refused(&latest)
            || now.duration_since(latest.received_at) > SignedDuration::from_hours(24)
        {
            continue;
        }
        let in_a_row = requests.iter().take_while(refused).count();
        let name = name_of(w);
        let were = if in_a_row == 1 {
            "request was"
        } else {
            "requests were"
        };
        s.findings.push(Finding {
            what: format!(
                "webhook {} (agent {name}): its last {in_a_row} {were} refused ({} {}, latest at {})",
                w.id,
                latest.http_status,
                latest.reason.as_deref().unwrap_or("refused"),
                latest.received_at,
            ),
            look: format!("pulse webhooks requests --webhook {}", w.id),
        });
    }
    Ok(())
}

/// The conversation turns waiting on the model: a finding while any waits, with the
/// oldest and why the last try failed.
async fn waiting_status(
    store: &dyn Store,
    now: Timestamp,
    s: &mut Status,
) -> Result<(), StoreError> {
    let waiting = store.list_waiting(1_000).await?;
    s.turns_waiting = waiting.len();
    let Some(oldest) = waiting.iter().min_by_key(|w| w.since) else {
        return Ok(());
    };
    let latest = waiting.iter().max_by_key(|w| w.next_at).unwrap_or(oldest);
    s.findings.push(Finding {
        what: format!(
            "{} waiting on the model, the oldest for {:#} (last try: {}); the people who wrote are answered when it answers again",
            plural(waiting.len(), "conversation turn"),
            jiff::SignedDuration::from_secs(now.duration_since(oldest.since).as_secs()),
            latest.reason
        ),
        look: "the model provider's status and the key (PULSE_LLM_PROVIDER, its API key); the turns are tried again every 15 min at most, by the sweep".into(),
    });
    Ok(())
}

/// The queues and their dead letters.
async fn queues_status(
    sessions: &dyn SessionQueue,
    hooks: Option<&dyn HookQueue>,
    s: &mut Status,
) -> Result<(), StoreError> {
    s.sessions_queue = sessions.backlog().await?;
    if let Some(dead) = s.sessions_queue.dead.filter(|d| *d > 0) {
        s.findings.push(Finding {
            what: format!(
                "{} in the sessions dead-letter queue: heartbeat jobs or turns that failed five times",
                plural(dead as usize, "message")
            ),
            look: "the worker's log names each failure by message id; fix the cause, then pulse sessions redrive".into(),
        });
    }
    if let Some(hooks) = hooks {
        let backlog = hooks.backlog().await?;
        if let Some(dead) = backlog.dead.filter(|d| *d > 0) {
            s.findings.push(Finding {
                what: format!(
                    "{} in the hooks dead-letter queue: deliveries whose retries ran out",
                    plural(dead as usize, "message")
                ),
                look: "pulse hooks deliveries --hook ID shows why; fix the receiver, then pulse hooks redrive"
                    .into(),
            });
        }
        s.hooks_queue = Some(backlog);
    }
    Ok(())
}

/// What one agent contributes.
struct AgentStatus {
    /// Failed heartbeats in a row before its live one.
    failures: u32,
    /// From due time to the start of its latest run.
    start_delay: Option<SignedDuration>,
    tokens_today: u64,
    findings: Vec<Finding>,
}

async fn agent_status(
    store: &dyn Store,
    agent: &Agent,
    now: Timestamp,
) -> Result<AgentStatus, StoreError> {
    // The live heartbeat, and the one before: the latest run that started, if it started
    // within the hour (an agent paused for a week is not late now).
    let live = store.heartbeats_page(&agent.id, None, 2).await?;
    let failures = live.first().map_or(0, |h| h.consecutive_failures);
    let start_delay = live
        .iter()
        .find_map(|h| h.ran_at.map(|r| (r, h.scheduled_at)))
        .filter(|(ran, _)| now.duration_since(*ran) < LATE_LOOKS_BACK)
        .map(|(ran, due)| ran.duration_since(due));
    let tokens_today = budget::spent_today(store, agent, now).await?.spent;
    let mut findings = Vec::new();
    if let Some(h) = live.first()
        && h.status == HeartbeatStatus::Executing
        && let (Some(started), Some(until)) = (h.started_at, h.lease_until)
        && now.duration_since(started) > STUCK_AFTER
    {
        findings.push(Finding {
            what: format!(
                "agent {}: heartbeat {} has run since {started} (over {STUCK_AFTER:#}); if its worker stopped, it is retried when its lease ends at {until}",
                agent.name, h.beat
            ),
            look: format!("pulse heartbeats show {}", h.id()),
        });
    }
    let unknown: Vec<_> = store
        .list_actions(&agent.id, ACTIONS_SCAN)
        .await?
        .into_iter()
        .filter(|a| a.status == crate::domain::ActionStatus::Unknown)
        .collect();
    if let Some(first) = unknown.first() {
        findings.push(Finding {
            what: format!(
                "agent {}: {} whose outcome is not known (the request went out and no answer came back; the tool may have done its work), e.g. {} ({})",
                agent.name,
                plural(unknown.len(), "action"),
                first.id,
                first.tool
            ),
            look: format!(
                "pulse actions list --agent {} --status UNKNOWN; then pulse actions retry ID or pulse actions resolve ID --as succeeded|failed",
                agent.id
            ),
        });
    }
    for h in store.list_hooks(&agent.id).await? {
        let target = h.target.to_string();
        if let Some(why) = &h.unreadable {
            findings.push(Finding {
                what: format!(
                    "hook {} (agent {}, {} → {target}): {why}; its deliveries are not sent",
                    h.id, agent.name, h.hook_type
                ),
                look: format!(
                    "restore key {} (PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_OLD_KEYS), or give it a new secret: pulse hooks rotate {} (and give the receiver the new one)",
                    why.key_id, h.id
                ),
            });
        } else if !h.active {
            // Disabled by a person: their choice, not a problem.
            let Some(why) = h
                .disabled_reason
                .as_deref()
                .filter(|r| !r.contains("by a user"))
            else {
                continue;
            };
            findings.push(Finding {
                what: format!(
                    "hook {} (agent {}, {} → {target}) was disabled: {why}",
                    h.id, agent.name, h.hook_type
                ),
                look: format!(
                    "pulse hooks deliveries --hook {}; once the receiver is fixed, pulse hooks enable {}",
                    h.id, h.id
                ),
            });
        } else if let Some(since) = h.failing_since {
            findings.push(Finding {
                what: format!(
                    "hook {} (agent {}, {} → {target}) has failed since {since}; it is disabled after {:#} of failures",
                    h.id, agent.name, h.hook_type, h.disable_after
                ),
                look: format!("pulse hooks deliveries --hook {}", h.id),
            });
        }
    }
    Ok(AgentStatus {
        failures,
        start_delay,
        tokens_today,
        findings,
    })
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}
