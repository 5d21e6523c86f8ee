//! The invariants, checked after the drain from the store and from what the outside
//! world received. Each is named in the report with what it checked and its first
//! violation.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use pulse_shared::domain::{
    ActionId, ActionStatus, AgentId, ConversationMessage, EventCursor, Heartbeat, HeartbeatStatus,
    Role, SessionTask, SignalId, TaskEnvelope, ToolName, window_links,
};
use pulse_shared::error::StoreError;

use crate::faults::lock;
use crate::report::{Counts, Invariant, Report};
use crate::setup::{Ledger, Shard, Sim, SimError};
use crate::world::{STARTED, TOOL};

/// The invariants read from the store, agent by agent.
struct StoreInvariants {
    lost: Invariant,
    windows: Invariant,
    next: Invariant,
    answered: Invariant,
    yielded: Invariant,
}

impl StoreInvariants {
    fn new() -> Self {
        Self {
            lost: Invariant::new(
                "no_event_lost",
                "every event a completed window covers reached the subscribed tool, as a completed or failed action",
            ),
            windows: Invariant::new(
                "windows_contiguous",
                "each completed heartbeat's window starts where the previous one's ended",
            ),
            next: Invariant::new(
                "one_next_heartbeat",
                "every live agent has exactly one unfinished heartbeat, and none is held past its lease",
            ),
            answered: Invariant::new(
                "message_answered_once",
                "every user message queued was answered by exactly one turn, or parked (in the dead-letter queue, or waiting on the model)",
            ),
            yielded: Invariant::new(
                "interrupted_heartbeat_silent",
                "no heartbeat's spoken thought reached the conversation after a user message that arrived while that heartbeat ran",
            ),
        }
    }
}

/// What the checks read once: the run's ledger, the time, the tool's name, and the
/// user messages parked in the dead-letter queue.
struct Seen {
    ledger: Ledger,
    now: Timestamp,
    tool: ToolName,
    /// Dead-lettered messages' sequence numbers, and the signals among them.
    dead_seqs: BTreeSet<i64>,
    parked: BTreeSet<SignalId>,
    dead_letters: u64,
}

fn store_failed(what: &'static str) -> impl Fn(StoreError) -> SimError {
    move |e| SimError(format!("{what}: {e}"))
}

/// Checks every invariant and counts what happened.
pub(crate) async fn check(sim: &Sim, shard: &Shard) -> Result<Report, SimError> {
    let options = &shard.options;
    let seen = read(sim).await?;
    let mut counts = Counts::default();
    let mut inv = StoreInvariants::new();
    let live: Vec<&AgentId> = sim
        .agents
        .iter()
        .filter(|a| !seen.ledger.deleted.contains(*a))
        .collect();
    for agent in live {
        check_agent(sim, agent, &seen, &mut counts, &mut inv).await?;
    }
    counts.queued_at_end = sim.queue.depth().await.map_err(store_failed("the queue"))?;
    counts.dead_letters = seen.dead_letters;
    counts.agents_deleted = seen.ledger.deleted.len() as u64;
    let [tool_once, discord_once, hook_once] = outside_world(sim, &mut counts);
    let order = session_order(sim, &seen.dead_seqs);
    let mut invariants = vec![
        lock(&sim.inbound).clone(),
        lock(&sim.limits).clone(),
        lock(&sim.interactions).clone(),
        inv.lost,
        tool_once,
        inv.windows,
        inv.next,
        order,
        inv.answered,
        inv.yielded,
        discord_once,
        hook_once,
    ];
    invariants.extend(
        crate::approvals::check(sim, &seen.ledger.approvals, &seen.ledger.deleted, seen.now).await,
    );
    if let Some(power) = &sim.power {
        let mut cuts = Invariant::new(
            "acknowledged_survives_power_cut",
            "a power cut just after an acknowledgement leaves a database that opens whole and holds every webhook event accepted and user message queued before it",
        );
        power
            .check(options.seed, &seen.ledger.deleted, |broke| {
                cuts.checked(broke.is_none(), || broke.unwrap_or_default());
            })
            .map_err(SimError)?;
        invariants.push(cuts);
    }
    Ok(Report {
        seed: options.seed,
        agents: options.agents,
        shards: 1,
        shard_agents: options.shard_agents,
        simulated_seconds: options.duration.as_secs(),
        faults: sim.dice.mix().name.to_owned(),
        backend: match &options.backend {
            crate::setup::SimBackend::Embedded => "sqlite".into(),
            crate::setup::SimBackend::Aws { .. } => "aws".into(),
        },
        endpoint: match &options.backend {
            crate::setup::SimBackend::Embedded => None,
            crate::setup::SimBackend::Aws { endpoint } => Some(endpoint.clone()),
        },
        counts,
        injected: injected(sim),
        requests: sim
            .aws
            .as_ref()
            .map(|aws| aws.emulated.plan.seen_all())
            .unwrap_or_default(),
        invariants,
        wall_seconds: 0.0,
    })
}

/// The faults injected, by kind: the dice's, and on the AWS backend those met beneath
/// the SDK and the messages whose visibility ran out before they were deleted.
fn injected(sim: &Sim) -> std::collections::BTreeMap<String, u64> {
    let mut all: std::collections::BTreeMap<String, u64> = sim
        .dice
        .injected()
        .into_iter()
        .map(|(f, n)| (f.name(), n))
        .collect();
    if let Some(aws) = &sim.aws {
        use pulse_shared::adapters::aws::faults::Fault as Sdk;
        let met = aws.emulated.plan.met();
        for (f, name) in [
            (Sdk::Throttled, "aws_throttled"),
            (Sdk::ServerError, "aws_server_error"),
            (Sdk::Reset, "aws_connection_reset"),
            (Sdk::LostAnswer, "aws_answer_lost"),
        ] {
            all.insert(name.into(), met.get(&f).copied().unwrap_or(0));
        }
        let expired = aws
            .visibility
            .expired
            .load(std::sync::atomic::Ordering::Relaxed);
        all.insert("sqs_visibility_expired".into(), expired);
    }
    all
}

/// The ledger (taken from the run), and the dead letters: messages parked after their
/// last receive are not lost (an operator redrives them), nor answered either.
async fn read(sim: &Sim) -> Result<Seen, SimError> {
    let ledger = std::mem::take(&mut *lock(&sim.ledger));
    let tool = ToolName::parse(TOOL).map_err(|e| SimError(e.to_string()))?;
    let dead = sim
        .queue
        .dead_lettered()
        .await
        .map_err(store_failed("the dead letters"))?;
    let dead_seqs = dead.iter().map(|(seq, _)| *seq).collect();
    let mut parked: BTreeSet<SignalId> = dead
        .iter()
        .filter_map(|(_, body)| match TaskEnvelope::decode(body).ok()?.task {
            SessionTask::Signal(job) => Some(job.signal.id),
            SessionTask::Heartbeat(_)
            | SessionTask::Consolidate(_)
            | SessionTask::Retry(_)
            | SessionTask::Redeliver(_) => None,
        })
        .collect();
    // A message whose turn still waits on the model at the end is kept, to be answered
    // when the model answers again: parked, as a dead letter is.
    let waiting = sim
        .inner
        .list_waiting(usize::MAX)
        .await
        .map_err(store_failed("the waiting turns"))?;
    parked.extend(
        waiting
            .iter()
            .flat_map(|w| w.signals.iter().map(|s| s.id.clone())),
    );
    Ok(Seen {
        ledger,
        now: sim.clock.now(),
        tool,
        dead_seqs,
        parked,
        dead_letters: dead.len() as u64,
    })
}

/// One live agent: its heartbeats, the events its windows covered, its conversation's
/// thoughts, and its users' messages.
async fn check_agent(
    sim: &Sim,
    agent: &AgentId,
    seen: &Seen,
    counts: &mut Counts,
    inv: &mut StoreInvariants,
) -> Result<(), SimError> {
    let store = sim.inner.as_ref();
    let beats = store
        .heartbeats_page(agent, None, usize::MAX >> 1)
        .await
        .map_err(store_failed("reading heartbeats"))?;
    // Events after the last completed window wait for a heartbeat still to come (one
    // backing off after failures may be due hours later): not yet owed.
    let reached = check_heartbeats(
        agent,
        beats,
        seen.now,
        counts,
        &mut inv.windows,
        &mut inv.next,
    );
    for event in seen.ledger.events.get(agent).into_iter().flatten() {
        if reached
            .as_ref()
            .is_none_or(|end| event.as_str() > end.as_str())
        {
            counts.events_waiting += 1;
            continue;
        }
        let id = ActionId::for_event(event, &seen.tool);
        let action = store
            .get_action(agent, &id)
            .await
            .map_err(store_failed("reading an action"))?;
        counts.actions += 1;
        let ok = action
            .as_ref()
            .is_some_and(|a| matches!(a.status, ActionStatus::Completed | ActionStatus::Failed));
        inv.lost.checked(ok, || match action {
            None => format!("agent {agent}: event {event} has no action of {TOOL}"),
            Some(a) => format!(
                "agent {agent}: event {event}'s action {} is {}",
                a.id,
                a.status.as_str()
            ),
        });
    }
    if sim.world.chatting.contains(agent) {
        let said = store
            .recent_messages(agent, usize::MAX >> 1)
            .await
            .map_err(store_failed("reading the conversation"))?;
        check_thoughts(agent, &said, &mut inv.yielded);
    }
    let messages = seen.ledger.messages.get(agent).cloned().unwrap_or_default();
    if messages.is_empty() {
        return Ok(());
    }
    let turns = store
        .answered(agent, &messages)
        .await
        .map_err(store_failed("reading turns"))?;
    let mut by_signal: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for (signal, turn) in turns {
        by_signal.entry(signal).or_default().push(turn);
    }
    for m in &messages {
        let n = by_signal.get(m).map_or(0, Vec::len);
        counts.messages += 1;
        if n == 0 && seen.parked.contains(m) {
            counts.messages_dead_lettered += 1;
            continue;
        }
        inv.answered.checked(n == 1, || {
            format!("agent {agent}: message {m} was answered by {n} turns")
        });
    }
    Ok(())
}

/// What the outside world received: no tool call, Discord post or hook request after
/// its record said it was done; and its counts.
fn outside_world(sim: &Sim, counts: &mut Counts) -> [Invariant; 3] {
    let seen = sim.world.seen();
    let mut tool_once = Invariant::new(
        "tool_not_called_after_finish",
        "no tool call for an action already recorded as finished (a retry after a crash keeps the action id)",
    );
    tool_once.checked_all(seen.tool_calls, &seen.tool_after_finish);
    let mut discord_once = Invariant::new(
        "discord_not_posted_after_record",
        "no reply part was posted after its turn recorded it delivered",
    );
    discord_once.checked_all(seen.discord_turns_found, &seen.discord_after_record);
    let mut hook_once = Invariant::new(
        "hook_not_sent_after_success",
        "no hook request for a delivery already recorded as succeeded",
    );
    hook_once.checked_all(seen.hook_requests, &seen.hook_after_success);
    counts.tool_calls = seen.tool_calls;
    counts.llm_requests = seen.llm_requests;
    counts.discord_posts = seen.discord_posts.values().map(|p| p.len() as u64).sum();
    counts.discord_repeats = counts.discord_posts - seen.discord_posts.len() as u64;
    counts.hook_requests = seen.hook_requests;
    counts.hook_deliveries = seen.hook_successes.len() as u64;
    counts.tool_repeats = seen.tool_successes.values().map(|n| u64::from(n - 1)).sum();
    counts.hook_repeats = seen.hook_successes.values().map(|n| u64::from(n - 1)).sum();
    [tool_once, discord_once, hook_once]
}

/// Each session's messages were completed in the order they were sent. A dead-lettered
/// message's late acknowledgement (a delivery that outlived its visibility) deletes
/// nothing: it was not completed.
fn session_order(sim: &Sim, dead_seqs: &BTreeSet<i64>) -> Invariant {
    let mut order = Invariant::new(
        "session_order",
        "each session's messages were completed in the order they were sent (dead letters aside)",
    );
    for (group, seqs) in lock(&sim.policy.completed).iter() {
        let seqs: Vec<i64> = seqs
            .iter()
            .copied()
            .filter(|s| !dead_seqs.contains(s))
            .collect();
        let in_order = seqs.windows(2).all(|w| w[0] < w[1]);
        order.checked(in_order, || {
            let at = seqs.windows(2).position(|w| w[0] >= w[1]).unwrap_or(0);
            format!(
                "session {group}: message {} was completed after message {}",
                seqs[at + 1],
                seqs[at]
            )
        });
    }
    order
}

/// A thought the heartbeat agent spoke names the start of its heartbeat (the fake model
/// writes it in); a user message that arrived after that start and before the thought
/// should have stopped the heartbeat before it spoke. Strictly after and strictly before:
/// a message in the same millisecond as either is not told apart.
fn check_thoughts(agent: &AgentId, said: &[ConversationMessage], yielded: &mut Invariant) {
    let users: Vec<Timestamp> = said
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.created_at)
        .collect();
    for thought in said.iter().filter(|m| m.source == "heartbeat") {
        let started = thought
            .content
            .split_once(STARTED)
            .and_then(|(_, at)| at.trim().parse::<Timestamp>().ok());
        let Some(started) = started else {
            yielded.checked(false, || {
                format!(
                    "agent {agent}: thought {:?} does not say when its heartbeat started",
                    thought.content
                )
            });
            continue;
        };
        let after = users
            .iter()
            .find(|at| **at > started && **at < thought.created_at);
        yielded.checked(after.is_none(), || {
            format!(
                "agent {agent}: a heartbeat started at {started} spoke at {} after a user message at {}",
                thought.created_at,
                after.map(ToString::to_string).unwrap_or_default()
            )
        });
    }
}

fn check_heartbeats(
    agent: &AgentId,
    mut beats: Vec<Heartbeat>,
    now: jiff::Timestamp,
    counts: &mut Counts,
    windows: &mut Invariant,
    next: &mut Invariant,
) -> Option<EventCursor> {
    beats.sort_by_key(|h| h.beat);
    for link in window_links(&beats) {
        windows.checked(link.joined(), || {
            format!(
                "agent {agent}: beat {} starts its window at {:?}, the previous completed one ended at {:?}",
                link.after.beat, link.after.window_start, link.before.window_end
            )
        });
    }
    let mut last_end: Option<&EventCursor> = None;
    let mut unfinished = 0;
    for h in &beats {
        match h.status {
            HeartbeatStatus::Completed => {
                counts.heartbeats_completed += 1;
                last_end = h.window_end.as_ref();
            }
            HeartbeatStatus::Failed => counts.heartbeats_failed += 1,
            HeartbeatStatus::Cancelled => counts.heartbeats_cancelled += 1,
            HeartbeatStatus::Pending | HeartbeatStatus::Paused => unfinished += 1,
            HeartbeatStatus::Executing => {
                unfinished += 1;
                let held = h.lease_until.is_some_and(|l| l > now);
                next.checked(held, || {
                    format!(
                        "agent {agent}: beat {} is EXECUTING with its lease ended at {:?}",
                        h.beat, h.lease_until
                    )
                });
            }
        }
    }
    next.checked(unfinished == 1, || {
        format!("agent {agent} has {unfinished} unfinished heartbeats")
    });
    last_end.cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulse_shared::domain::NewAgent;

    fn history() -> (AgentId, Vec<Heartbeat>) {
        let now: jiff::Timestamp = "2026-01-05T00:00:00Z".parse().unwrap();
        let (agent, _) = NewAgent::named("a").create(now).unwrap();
        let cursor = |m: i64| EventCursor::through(now + jiff::SignedDuration::from_mins(m));
        let mut out = Vec::new();
        let mut start = EventCursor::origin();
        for beat in 1..=3 {
            let mut h = Heartbeat::pending(&agent, beat, now, start.clone(), 0, None, 0);
            h.status = HeartbeatStatus::Completed;
            h.window_end = Some(cursor(beat as i64 * 15));
            start = cursor(beat as i64 * 15);
            out.push(h);
        }
        out.push(Heartbeat::pending(&agent, 4, now, start, 0, None, 0));
        (agent.id, out)
    }

    fn run(beats: Vec<Heartbeat>, agent: &AgentId) -> (Invariant, Invariant, Option<EventCursor>) {
        let now: jiff::Timestamp = "2026-01-05T01:00:00Z".parse().unwrap();
        let mut windows = Invariant::new("windows", "");
        let mut next = Invariant::new("next", "");
        let end = check_heartbeats(
            agent,
            beats,
            now,
            &mut Counts::default(),
            &mut windows,
            &mut next,
        );
        (windows, next, end)
    }

    #[test]
    fn contiguous_windows_and_one_pending_heartbeat_hold() {
        let (agent, beats) = history();
        let (windows, next, end) = run(beats.clone(), &agent);
        assert!(windows.held() && next.held(), "{windows:?} {next:?}");
        assert_eq!(end, beats[2].window_end);
    }

    #[test]
    fn a_gap_between_windows_or_a_second_unfinished_heartbeat_is_a_violation() {
        let (agent, mut beats) = history();
        beats[2].window_start = EventCursor::origin();
        let (windows, _, _) = run(beats, &agent);
        assert_eq!(windows.violations, 1);
        assert!(windows.first.unwrap().contains("beat 3"));

        let (agent, mut beats) = history();
        beats[2].status = HeartbeatStatus::Executing;
        beats[2].lease_until = Some("2026-01-05T00:30:00Z".parse().unwrap());
        let (_, next, _) = run(beats, &agent);
        assert_eq!(
            next.violations, 2,
            "held past its lease, and two unfinished"
        );
    }
}
