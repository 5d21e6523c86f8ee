//! Deciding calls parked for a person's approval, from anywhere: the CLI, the dashboard,
//! the messages API, a chat platform's button; and expiring those nobody decided.
//!
//! A decision is one conditional write: the first is the only one, and any later one is
//! refused with who decided and when. It then queues a signal on the agent's session,
//! and the conversation worker carries it out there (sends an approved call, or not) and
//! tells the agent in a turn, so the person hears what happened. Nothing is sent on the
//! path that decides: a receiver answers at once.
//!
//! A decision whose signal was lost (the process stopped between the write and the
//! queue) is found by the sweep, which queues its signal again until the worker has
//! settled it: the signal's id derives from the approval, so a second copy is one.

use jiff::{SignedDuration, Timestamp};
use tracing::{info, warn};

use super::hooks::{Emission, HookEmitter};
use super::intake;
use crate::domain::{
    Agent, AgentId, Approval, ApprovalId, ContentBlock, Decision, HookType, Signal, SignalId,
    SignalKind, SignalMeta,
};
use crate::error::{StoreError, chain};
use crate::ports::{SessionQueue, Store};

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// No such approval of the agent.
    #[error("no approval {0} of this agent")]
    NotFound(ApprovalId),
    /// Decided already: the first decision stands.
    #[error("approval {} was {} already; the first decision stands", .0.id, .0.who_decided())]
    Decided(Box<Approval>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How long a decision may wait to be carried out before the sweep queues it again.
const CARRY_OUT_WITHIN: SignedDuration = SignedDuration::from_mins(2);

/// Most open approvals one sweep looks at.
const OPEN_A_SWEEP: usize = 200;

/// Decides `agent`'s approval `id` by `decision` at `now`, and queues it to be carried
/// out in the agent's session. The decided approval.
pub async fn decide(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    agent: &Agent,
    id: &ApprovalId,
    decision: &Decision,
    now: Timestamp,
) -> Result<Approval, DecideError> {
    let Some(stored) = store.get_approval(&agent.id, id).await? else {
        return Err(DecideError::NotFound(id.clone()));
    };
    if !stored.is_pending() {
        return Err(DecideError::Decided(Box::new(stored)));
    }
    let decided = if stored.is_due(now) {
        // Past its expiry: it expires now, whatever was asked of it.
        stored.expired(now)
    } else {
        stored.decided(decision, now)
    };
    if let Some(first) = store.decide_approval(&decided).await? {
        return Err(DecideError::Decided(Box::new(first)));
    }
    if decided.status == crate::domain::ApprovalStatus::Expired {
        queue_outcome(store, queue, agent, &decided).await;
        return Err(DecideError::Decided(Box::new(decided)));
    }
    info!(approval_id = %id, decided = %decided.who_decided(), "approval decided");
    if decision.approve && decision.always {
        grant(store, &decided).await?;
    }
    queue_outcome(store, queue, agent, &decided).await;
    Ok(decided)
}

/// Grants the approved call's tool to its agent from now on (once: a grant it holds is
/// kept as it is).
async fn grant(store: &dyn Store, approved: &Approval) -> Result<(), StoreError> {
    let Some(agent) = store.get_agent(&approved.agent_id).await? else {
        return Ok(());
    };
    if agent.is_granted(&approved.server, &approved.tool) {
        return Ok(());
    }
    let mut next = agent.clone();
    next.granted.push(crate::domain::ToolGrant {
        server: approved.server.clone(),
        tool: approved.tool.clone(),
        by: approved.decided_by.clone().unwrap_or_default(),
        at: approved.decided_at.unwrap_or(approved.requested_at),
        approval_id: approved.id.clone(),
    });
    store.update_agent(&next, &agent).await?;
    info!(agent_id = %agent.id, server = %approved.server, tool = %approved.tool, "the tool is granted to the agent: its calls are not asked about any more");
    Ok(())
}

/// Takes back a grant of `server`'s `tool` from `agent`: its calls are asked about again.
/// Whether it held one.
pub async fn revoke(
    store: &dyn Store,
    agent: &AgentId,
    server: &crate::domain::ToolName,
    tool: &str,
) -> Result<bool, StoreError> {
    let Some(current) = store.get_agent(agent).await? else {
        return Err(StoreError::NotFound(format!("agent {agent}")));
    };
    if !current.is_granted(server, tool) {
        return Ok(false);
    }
    let mut next = current.clone();
    next.granted
        .retain(|g| !(g.server == *server && g.tool == tool));
    store.update_agent(&next, &current).await?;
    info!(agent_id = %agent, %server, tool, "grant revoked: the tool's calls are asked about again");
    Ok(true)
}

/// What one pass over the open approvals did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Expiry {
    /// Pending approvals past their expiry, expired now.
    pub expired: usize,
    /// Decisions not carried out in time, queued again.
    pub requeued: usize,
}

/// Expires the pending approvals past their expiry at `now` (each is queued to be told
/// to its agent), and queues again the decisions not carried out within two minutes.
pub async fn sweep(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    now: Timestamp,
) -> Result<Expiry, StoreError> {
    let mut done = Expiry::default();
    for a in store.open_approvals(OPEN_A_SWEEP).await? {
        let late = a
            .decided_at
            .is_some_and(|at| now.duration_since(at) >= CARRY_OUT_WITHIN);
        if !a.is_due(now) && !late {
            continue;
        }
        let Some(agent) = store.get_agent(&a.agent_id).await? else {
            continue;
        };
        if a.is_pending() {
            let expired = a.expired(now);
            if store.decide_approval(&expired).await?.is_none() {
                info!(approval_id = %a.id, agent_id = %a.agent_id, "an approval expired with no decision; its call is not sent");
                done.expired += 1;
                queue_outcome(store, queue, &agent, &expired).await;
            }
        } else {
            warn!(approval_id = %a.id, agent_id = %a.agent_id, "a decision was not carried out in time: queued again");
            done.requeued += 1;
            queue_outcome(store, queue, &agent, &a).await;
        }
    }
    Ok(done)
}

/// The signal that carries `decided` to its agent's session.
pub fn outcome_signal(agent: &Agent, decided: &Approval) -> Signal {
    let at = decided.decided_at.unwrap_or(decided.requested_at);
    Signal {
        id: SignalId::derived(
            at.as_millisecond().max(0) as u64,
            &["approval", decided.id.as_str()],
        ),
        agent_id: agent.id.clone(),
        session: agent.session.clone(),
        kind: SignalKind::Approval,
        content: vec![ContentBlock::Text {
            text: format!(
                "approval {} of {}: {}",
                decided.id,
                decided.summary(200),
                decided.who_decided()
            ),
        }],
        meta: SignalMeta {
            source: Some(decided.id.to_string()),
            ..SignalMeta::default()
        },
        created_at: at,
    }
}

/// Queues `decided` to be carried out. A queue that refuses it is logged: the sweep
/// queues it again.
async fn queue_outcome(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    agent: &Agent,
    decided: &Approval,
) {
    if let Err(e) = intake::submit(store, queue, outcome_signal(agent, decided)).await {
        warn!(approval_id = %decided.id, error = %chain(&e), "a decided approval could not be queued; the sweep queues it again");
    }
}

/// The approval a signal of kind approval carries, by its id.
pub(crate) fn carried(signal: &Signal) -> Option<ApprovalId> {
    if signal.kind != SignalKind::Approval {
        return None;
    }
    ApprovalId::parse(signal.meta.source.as_deref()?).ok()
}

/// The emission of `hook_type` for `approval`: one delivery per hook, whatever reruns.
pub(crate) fn emission(approval: &Approval, hook_type: &'static str) -> Emission {
    Emission {
        hook_type: HookType::of(hook_type),
        heartbeat_id: approval.heartbeat_id.clone(),
        action_id: approval.outcome.as_ref().and_then(|o| o.action_id.clone()),
        data: approval_data(approval),
        triggered_by: "APPROVAL".to_owned(),
        key_ms: approval.at_ms,
        key: vec![approval.id.to_string(), hook_type.to_owned()],
    }
}

/// Emits `hook_type` for `agent`'s `approval` through `hooks` (reading its routes); a
/// failure is logged: the approval stands.
pub(crate) async fn announce(
    hooks: &HookEmitter,
    agent: &Agent,
    approval: &Approval,
    hook_type: &'static str,
) {
    let routes = match hooks.routes(&agent.id).await {
        Ok(r) => r,
        Err(e) => {
            warn!(approval_id = %approval.id, error = %e, "the agent's hooks could not be read; the approval's hook is not sent");
            return;
        }
    };
    if let Err(e) = hooks
        .emit(&routes, agent, emission(approval, hook_type))
        .await
    {
        warn!(approval_id = %approval.id, error = %e, "an approval's hook was not queued");
    }
}

/// Finds an approval by id alone: in the open ones first, then each agent's (a CLI
/// that was given no agent). With the agent it belongs to.
pub async fn find(
    store: &dyn Store,
    id: &ApprovalId,
) -> Result<Option<(AgentId, Approval)>, StoreError> {
    if let Some(a) = store
        .open_approvals(10_000)
        .await?
        .into_iter()
        .find(|a| a.id == *id)
    {
        return Ok(Some((a.agent_id.clone(), a)));
    }
    for agent in store.list_agents().await? {
        if let Some(a) = store.get_approval(&agent.id, id).await? {
            return Ok(Some((agent.id, a)));
        }
    }
    Ok(None)
}

/// Whether `agent`'s owner is not to be asked now: it is paused or snoozed, or outside
/// its active hours. Its approvals wait, and are asked about when it wakes.
pub(crate) fn quiet(agent: &Agent, now: Timestamp) -> bool {
    agent.is_paused() || agent.snoozed_until.is_some_and(|u| u > now) || !agent.is_active_at(now)
}

/// Asks `agent`'s owner about `approval` where the agent speaks first (its first home
/// on a platform that is set up: on Discord its channel or a direct message to its
/// first user, then on Telegram its chat), unless it was asked already, is decided, or
/// the agent is [`quiet`] (then it is asked when the agent wakes). Whether it was asked
/// now. A failure to post is logged: the approval stands, and is asked about again at
/// the agent's next heartbeat.
pub async fn ask(
    store: &dyn Store,
    channels: &crate::ports::Channels,
    agent: &Agent,
    approval: &Approval,
    now: Timestamp,
) -> bool {
    if !approval.is_pending() || approval.asked_at.is_some() || approval.is_due(now) {
        return false;
    }
    let Some((channel, home)) = agent
        .homes()
        .into_iter()
        .find_map(|h| Some((channels.for_target(&h)?.clone(), h)))
    else {
        return false;
    };
    if quiet(agent, now) {
        info!(approval_id = %approval.id, "the agent is paused, snoozed or outside its active hours: its owner is asked on {} when it wakes", channel.kind());
        return false;
    }
    let posted = match channel.ask_approval(agent, &home, approval).await {
        Ok(id) => id,
        Err(e) => {
            warn!(approval_id = %approval.id, error = %e, "the approval could not be posted on {}; asked again at the next heartbeat", channel.kind());
            return false;
        }
    };
    let mut asked = approval.clone();
    asked.asked_at = Some(now);
    match store.mark_asked(&asked).await {
        Ok(_) => {}
        Err(e) => {
            warn!(approval_id = %approval.id, error = %chain(&e), "the approval was posted, but could not be marked asked")
        }
    }
    info!(approval_id = %approval.id, message = %posted, "owner asked on {}", channel.kind());
    true
}

/// Asks about `agent`'s pending approvals its owner was not asked about yet (see
/// [`ask`]); how many were asked.
pub async fn ask_waiting(
    store: &dyn Store,
    channels: &crate::ports::Channels,
    agent: &Agent,
    now: Timestamp,
) -> usize {
    let listed = match store.approvals(&agent.id, 20).await {
        Ok(l) => l,
        Err(e) => {
            warn!(agent_id = %agent.id, error = %chain(&e), "the agent's approvals could not be read; they are asked about at its next heartbeat");
            return 0;
        }
    };
    let mut n = 0;
    for a in listed
        .iter()
        .filter(|a| a.is_pending() && a.asked_at.is_none())
    {
        n += usize::from(ask(store, channels, agent, a, now).await);
    }
    n
}

/// What a hook of an approval carries.
pub fn approval_data(a: &Approval) -> serde_json::Value {
    serde_json::json!({
        "approval_id": a.id,
        "status": a.status.as_str(),
        "tool_name": a.server,
        "mcp_tool": a.tool,
        "arguments": a.arguments,
        "reason": a.reason,
        "requested_at": a.requested_at,
        "expires_at": a.expires_at,
        "decided_by": a.decided_by,
        "decided_at": a.decided_at,
        "decision_reason": a.decision_reason,
        "turn_id": a.turn_id,
        "outcome": a.outcome,
    })
}
