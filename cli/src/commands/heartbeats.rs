//! `pulse heartbeats …`: an agent's heartbeats.

use clap::Subcommand;
use pulse_shared::domain::{AgentId, Heartbeat, HeartbeatId, HeartbeatStatus, OutcomeKind};

use super::events::Since;
use super::{AgentRef, Ctx, agent_ref, input, limit};
use crate::Failure;
use crate::output::{Out, short, when};
use pulse_shared::engine::steering::Woken;

#[derive(Subcommand, Debug)]
pub(crate) enum HeartbeatsCmd {
    /// List an agent's latest heartbeats, newest first, filtered and paged.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// Only these statuses (comma-separated), e.g. FAILED,CANCELLED.
        #[arg(long, value_name = "STATUS,...", value_delimiter = ',')]
        status: Vec<String>,
        /// Only these outcomes (comma-separated): acted, nothing_to_do, skipped, failed,
        /// incomplete.
        #[arg(long, value_name = "OUTCOME,...", value_delimiter = ',')]
        outcome: Vec<String>,
        /// Only heartbeats scheduled since then: a duration back from now (10m, 2h) or a
        /// time (2026-11-23T09:00:00Z).
        #[arg(long, value_name = "10m|TIMESTAMP")]
        since: Option<String>,
        /// Only beats before this one: pass the last beat of a listing to page back.
        #[arg(long, value_name = "BEAT")]
        before: Option<u64>,
        /// How many: the newest that match.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One heartbeat's whole story: its window and the events it read, each action (with
    /// the heartbeat agent's thought, tool calls and tokens), the events it created, the
    /// hooks it emitted, and the next heartbeat.
    Show {
        /// The heartbeat's id (hb_…); or give --agent and --beat.
        #[arg(required_unless_present = "beat")]
        id: Option<String>,
        /// The agent's id, with --beat.
        #[arg(long, requires = "beat")]
        agent: Option<String>,
        /// The beat number, with --agent.
        #[arg(long, requires = "agent", conflicts_with = "id")]
        beat: Option<u64>,
    },
    /// Wake an agent now: its next heartbeat is due at once, through its quiet period and
    /// active hours. Asking again while one is due or running makes no second.
    Trigger {
        /// The agent: its id, name or alias.
        agent: String,
    },
    /// Stop a running heartbeat: its model call in flight is dropped, what it did stays,
    /// and the next heartbeat is planned as usual.
    Cancel {
        /// The heartbeat's id (hb_…).
        id: String,
    },
}

/// A validated heartbeats command.
pub(crate) enum HeartbeatsPlan {
    List(Box<Listing>),
    Show(HeartbeatId),
    /// `--agent` and `--beat`.
    ShowBeat(AgentRef, u64),
    Trigger(AgentRef),
    Cancel(HeartbeatId),
}

/// Which heartbeats to list.
pub(crate) struct Listing {
    agent: AgentRef,
    statuses: Vec<HeartbeatStatus>,
    outcomes: Vec<OutcomeKind>,
    since: Option<Since>,
    before: Option<u64>,
    limit: usize,
}

pub(crate) fn plan(cmd: HeartbeatsCmd) -> Result<HeartbeatsPlan, Failure> {
    Ok(match cmd {
        HeartbeatsCmd::List {
            agent,
            status,
            outcome,
            since,
            before,
            limit: n,
        } => HeartbeatsPlan::List(Box::new(Listing {
            agent: agent_ref(&agent)?,
            statuses: status
                .iter()
                .map(|s| {
                    HeartbeatStatus::parse(&s.trim().to_ascii_uppercase()).ok_or_else(|| {
                        Failure::Input(format!(
                            "invalid --status {s:?}: use PENDING, EXECUTING, COMPLETED, FAILED, CANCELLED or PAUSED"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            outcomes: outcome
                .iter()
                .map(|o| {
                    OutcomeKind::parse(&o.trim().to_ascii_lowercase()).ok_or_else(|| {
                        Failure::Input(format!(
                            "invalid --outcome {o:?}: use acted, nothing_to_do, skipped, failed or incomplete"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            since: since.as_deref().map(Since::parse).transpose()?,
            before,
            limit: limit(n)?,
        })),
        HeartbeatsCmd::Trigger { agent } => HeartbeatsPlan::Trigger(agent_ref(&agent)?),
        HeartbeatsCmd::Cancel { id } => HeartbeatsPlan::Cancel(HeartbeatId::parse(&id).map_err(input)?),
        HeartbeatsCmd::Show { id, agent, beat } => match (id, agent, beat) {
            (Some(id), _, _) => HeartbeatsPlan::Show(HeartbeatId::parse(&id).map_err(input)?),
            (None, Some(agent), Some(beat)) => HeartbeatsPlan::ShowBeat(agent_ref(&agent)?, beat),
            _ => {
                return Err(Failure::Input(
                    "give a heartbeat id, or --agent and --beat".into(),
                ));
            }
        },
    })
}

pub(crate) async fn execute(plan: HeartbeatsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    match plan {
        HeartbeatsPlan::List(l) => {
            let agent = l.agent.find(cx.b).await?.id;
            let hbs = list(cx, &agent, &l).await?;
            heartbeat_table(cx.out, &hbs);
        }
        HeartbeatsPlan::Show(id) => super::story::show(cx, &id).await?,
        HeartbeatsPlan::ShowBeat(agent, beat) => {
            let id = HeartbeatId::new(agent.id(cx.b).await?, beat);
            super::story::show(cx, &id).await?
        }
        HeartbeatsPlan::Cancel(id) => {
            let ops = cx.b.lifecycle(
                cx.clock.clone(),
                &pulse_shared::engine::EngineSettings::default(),
            );
            ops.cancel_heartbeat(&id)
                .await
                .map_err(super::agents::lifecycle_failure)?;
            cx.out.done(&format!(
                "asked heartbeat {id} to stop: it ends CANCELLED at its next step or model call (within a second; a tool running now finishes first), and the next heartbeat is planned as usual"
            ));
        }
        HeartbeatsPlan::Trigger(agent) => {
            let id = agent.id(cx.b).await?;
            let ops = cx.b.lifecycle(
                cx.clock.clone(),
                &pulse_shared::engine::EngineSettings::default(),
            );
            let woken = ops
                .wake(&id)
                .await
                .map_err(super::agents::lifecycle_failure)?;
            cx.out.done(&match woken {
                Woken::Due(_) => format!(
                    "a heartbeat of {id} is due now; `pulse serve` (or `pulse sweep`) runs it"
                ),
                Woken::AlreadyDue(at) => format!(
                    "a heartbeat of {id} was due already (since {}); no second one",
                    when(Some(at))
                ),
                Woken::Running => {
                    format!("a heartbeat of {id} is running now; no second one")
                }
            });
        }
    }
    Ok(())
}

/// The newest `limit` heartbeats that match, read a page at a time, back to `since`.
async fn list(cx: &Ctx<'_>, agent: &AgentId, l: &Listing) -> Result<Vec<Heartbeat>, Failure> {
    let since = l.since.as_ref().map(|s| s.at(cx.clock.now()));
    let page = if l.statuses.is_empty() && l.outcomes.is_empty() {
        l.limit
    } else {
        200
    };
    let mut found = Vec::new();
    let mut before = l.before;
    loop {
        let hbs = cx.b.store.heartbeats_page(agent, before, page).await?;
        let last = hbs.len() < page;
        before = hbs.last().map(|h| h.beat);
        for h in hbs {
            // Beats are scheduled in order: past `since`, the rest are older still.
            if since.is_some_and(|t| h.scheduled_at < t) {
                return Ok(found);
            }
            let outcome = h.outcome.as_ref().map(|o| o.kind);
            if (l.statuses.is_empty() || l.statuses.contains(&h.status))
                && (l.outcomes.is_empty() || outcome.is_some_and(|k| l.outcomes.contains(&k)))
            {
                found.push(h);
                if found.len() == l.limit {
                    return Ok(found);
                }
            }
        }
        if last || before.is_none() {
            return Ok(found);
        }
    }
}

/// Heartbeats as a table.
pub(crate) fn heartbeat_table(out: &Out, hbs: &[Heartbeat]) {
    out.table(
        hbs,
        &[
            "BEAT",
            "STATUS",
            "SCHEDULED",
            "STARTED",
            "LATE",
            "COMPLETED",
            "EVENTS",
            "ACTIONS",
            "FAILED",
            "OUTCOME",
            "THINKING",
            "ERROR",
        ],
        |h| {
            vec![
                h.beat.to_string(),
                h.status.as_str().to_owned(),
                when(Some(h.scheduled_at)),
                when(h.started_at),
                // Due time to the start of its run's work (after its wait on the queue).
                h.ran_at.map_or("-".into(), |r| {
                    let late = r.duration_since(h.scheduled_at);
                    format!("{:#}", late.round(jiff::Unit::Millisecond).unwrap_or(late))
                }),
                when(h.completed_at),
                h.events_processed.to_string(),
                h.actions_triggered.to_string(),
                h.actions_failed.to_string(),
                h.outcome.as_ref().map_or("-".into(), |o| {
                    short(&format!("{}: {}", o.kind, o.reason), 60)
                }),
                h.thinking().map_or("-".into(), |t| short(&t, 60)),
                h.error.as_deref().map_or("-".into(), |e| short(e, 60)),
            ]
        },
    );
}
