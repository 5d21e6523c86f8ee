//! Calls parked for a person's approval, in the simulation: the operator's rounds park
//! one now and then (`approval_parked`, one round in two by default) (as an agent's model would, calling a tool whose policy is `ask`),
//! and its fate is drawn — decided late (maybe after it expired), decided twice at once
//! (an approve racing a deny, as the CLI and a Discord button would), or never. The
//! decisions go through the store and queue under faults; the sweep expires what nobody
//! decided and queues again what was decided but not carried out; the worker carries
//! each out in the agent's session.
//!
//! The invariants, checked after the drain: each approval was decided exactly once
//! (pending at the end is a violation; at most one decider was told it won, and the
//! record says what that one decided), and each was carried out and settled — never
//! sent unless approved, an expired one recorded as expired by the expiry.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use pulse_shared::domain::{
    AgentId, Approval, ApprovalId, ApprovalStatus, Decision, ToolName, schema_digest,
};
use pulse_shared::engine::approvals;
use serde_json::json;

use crate::faults::lock;
use crate::report::Invariant;
use crate::setup::{Parked, Sim};

/// Parks a call for a live agent picked by the dice, and sets its fate going.
pub(crate) async fn park_one(sim: &Arc<Sim>) {
    let n = sim.agents.len() as u64;
    let agent_id = sim.agents[sim.dice.below(n) as usize].clone();
    if lock(&sim.ledger).deleted.contains(&agent_id) {
        return;
    }
    let Ok(Some(agent)) = sim.inner.get_agent(&agent_id).await else {
        return;
    };
    let now = sim.clock.now();
    let key = format!("sim.{}.{}", agent_id, sim.dice.below(u64::MAX));
    let at_ms = now.as_millisecond().max(0) as u64;
    // Short enough to expire within the quiet drain.
    let expiry = sim
        .dice
        .between(Duration::from_secs(5 * 60), Duration::from_secs(30 * 60));
    let approval = Approval {
        id: ApprovalId::derived(at_ms, &key),
        agent_id: agent_id.clone(),
        server: ToolName::parse("mail").expect("a tool name"),
        tool: "send".into(),
        model_name: "mail__send".into(),
        arguments: json!({"to": "ada@example.com"}),
        key,
        at_ms,
        heartbeat_id: None,
        event_id: None,
        turn_id: None,
        step: 0,
        reason: Some("the simulation asks".into()),
        schema: schema_digest(&json!({"type": "object"})),
        requested_at: now,
        expires_at: now + SignedDuration::try_from(expiry).unwrap_or(SignedDuration::ZERO),
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        decision_reason: None,
        outcome: None,
        asked_at: None,
    };
    // Parked as the worker parks it; what is under test is what follows.
    if sim.inner.park_approval(&approval).await.is_err() {
        return;
    }
    lock(&sim.ledger)
        .approvals
        .insert(approval.id.clone(), (agent_id, Vec::new()));
    let fate = sim.dice.below(3);
    if fate == 0 {
        // Never decided: the sweep expires it.
        return;
    }
    let later = sim.clone();
    let wait = match fate {
        // Late: maybe after it expired.
        1 => sim
            .dice
            .between(Duration::from_secs(60), Duration::from_secs(40 * 60)),
        // Twice at once, while it waits.
        _ => sim
            .dice
            .between(Duration::from_secs(10), Duration::from_secs(4 * 60)),
    };
    tokio::task::spawn_local(async move {
        tokio::time::sleep(wait).await;
        let sim = later;
        if fate == 1 {
            decide(&sim, &agent, &approval.id, true, "late").await;
        } else {
            let (a, b) = (sim.clone(), sim.clone());
            let (agent_a, agent_b) = (agent.clone(), agent.clone());
            let (id_a, id_b) = (approval.id.clone(), approval.id.clone());
            let first = tokio::task::spawn_local(async move {
                decide(&a, &agent_a, &id_a, true, "cli").await;
            });
            let second = tokio::task::spawn_local(async move {
                decide(&b, &agent_b, &id_b, false, "discord").await;
            });
            let _ = first.await;
            let _ = second.await;
        }
    });
}

/// One decider's decision, through the store and queue under faults; a win is counted.
async fn decide(
    sim: &Sim,
    agent: &pulse_shared::domain::Agent,
    id: &ApprovalId,
    approve: bool,
    by: &str,
) {
    let decision = Decision {
        approve,
        by: by.to_owned(),
        reason: None,
        always: false,
    };
    let decided = approvals::decide(
        sim.connected.store.as_ref(),
        sim.connected.queue.as_ref(),
        agent,
        id,
        &decision,
        sim.clock.now(),
    )
    .await;
    if decided.is_ok()
        && let Some((_, wins)) = lock(&sim.ledger).approvals.get_mut(id)
    {
        wins.push(approve);
    }
}

/// Checks every parked call of a live agent after the drain.
pub(crate) async fn check(
    sim: &Sim,
    parked: &std::collections::BTreeMap<ApprovalId, Parked>,
    deleted: &std::collections::BTreeSet<AgentId>,
    now: Timestamp,
) -> [Invariant; 2] {
    let mut once = Invariant::new(
        "approval_decided_once",
        "every parked call was decided exactly once — approved, denied, or expired by the sweep when nobody decided in time — and at most one decider was told it decided, the record saying what that one decided",
    );
    let mut settled = Invariant::new(
        "approval_carried_out",
        "every decided call was carried out in its agent's session and settled, never sent unless approved; an expired one recorded as expired by the expiry",
    );
    for (id, (agent, wins)) in parked {
        if deleted.contains(agent) {
            continue;
        }
        let stored = sim.inner.get_approval(agent, id).await.ok().flatten();
        let Some(a) = stored else {
            once.checked(false, || format!("approval {id} of {agent} is gone"));
            continue;
        };
        let status = a.status;
        once.checked(
            status != ApprovalStatus::Pending
                && wins.len() <= 1
                && wins.first().is_none_or(|approve| {
                    status
                        == if *approve {
                            ApprovalStatus::Approved
                        } else {
                            ApprovalStatus::Denied
                        }
                }),
            || {
                format!(
                    "approval {id}: {} at {now}, deciders told they won: {wins:?}",
                    a.who_decided()
                )
            },
        );
        let expired_right =
            status != ApprovalStatus::Expired || a.decided_by.as_deref() == Some("expiry");
        settled.checked(
            a.outcome
                .as_ref()
                .is_some_and(|o| !o.sent || status == ApprovalStatus::Approved)
                && expired_right,
            || {
                format!(
                    "approval {id}: {}, outcome {:?}",
                    a.who_decided(),
                    a.outcome
                )
            },
        );
    }
    [once, settled]
}
