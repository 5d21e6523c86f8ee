//! Calls that need a person's yes: parked instead of sent, and carried out once decided.
//!
//! A call of a tool whose policy is `ask` is recorded as a pending
//! [`Approval`](crate::domain::Approval) — the tool, the arguments, the run and step it
//! came from, what the model said beside it, the key it will be sent with — and the model
//! is told at once that it awaits its owner's approval: the run goes on and ends as any
//! run does. A run made again finds the approval it parked (its id derives from the
//! call's key) and parks nothing new.
//!
//! Once decided, the conversation worker carries the decision out in the agent's
//! session: an approved call is checked again (the agent not paused, the server still
//! attached, the tool still listed and not set to `deny`, its input schema unchanged) and
//! sent with the key it was parked with, as an action like any other call, so a crash
//! between sending and recording is settled as any call's is; a denied or expired one is
//! never sent.

use crate::engine::transcript::{Refusal, ToolAnswer};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::calls::Begun;
use super::{AgentTools, Offer, Site};
use crate::domain::{
    Agent, Approval, ApprovalId, ApprovalOutcome, ApprovalStatus, HeartbeatId, HookType,
    MAX_PARKED_ARGUMENTS, OfferedTool, ToolPolicy, ToolUse, clip_reason, schema_digest,
};
use crate::error::chain;
use crate::tools::McpCall;

/// Most bytes of a sent call's answer an approval's outcome keeps (and the agent is
/// told).
const OUTCOME_BYTES: usize = 8 * 1024;

impl AgentTools {
    /// Parks `call` (offered as `offered`) for its owner's approval: what the model is
    /// told.
    pub(super) async fn park(
        &self,
        offer: &Offer,
        call: &ToolUse,
        site: &Site<'_>,
        offered: &OfferedTool,
    ) -> ToolAnswer {
        let size = call.input.to_string().len();
        if size > MAX_PARKED_ARGUMENTS {
            return Err(format!(
                "{} needs its owner's approval, and its arguments ({size} bytes) are too long to ask about (at most {} KiB); nothing was sent",
                call.name,
                MAX_PARKED_ARGUMENTS / 1024
            ).into());
        }
        let key = site.key(call);
        let now = self.clock.now();
        let approval = Approval {
            id: ApprovalId::derived(site.at_ms, &key),
            agent_id: site.agent.id.clone(),
            server: offered.server.clone(),
            tool: offered.tool.clone(),
            model_name: call.name.clone(),
            arguments: call.input.clone(),
            key,
            at_ms: site.at_ms,
            heartbeat_id: site.in_heartbeat(),
            event_id: site.event.map(|e| e.id.clone()),
            turn_id: site.turn_id.cloned(),
            step: site.index,
            reason: site.said.map(clip_reason),
            schema: schema_digest(&offered.spec.parameters),
            requested_at: now,
            expires_at: now.checked_add(site.agent.approval_expiry()).unwrap_or(now),
            status: ApprovalStatus::Pending,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            outcome: None,
            asked_at: None,
        };
        match self.store.park_approval(&approval).await {
            Err(e) => Err(format!(
                "{} needs its owner's approval, and it could not be parked ({}); nothing was sent",
                call.name,
                chain(&e)
            )
            .into()),
            Ok(Some(earlier)) => {
                info!(approval_id = %earlier.id, status = earlier.status.as_str(), "a call parked by an earlier run of this one: nothing parked again");
                Ok(parked_answer(&earlier))
            }
            Ok(None) => {
                info!(approval_id = %approval.id, tool = %call.name, expires_at = %approval.expires_at, "a call parked for its owner's approval; not sent");
                self.emit_approval(offer, site.agent, &approval, HookType::APPROVAL_REQUESTED)
                    .await;
                crate::engine::approvals::ask(
                    self.store.as_ref(),
                    &self.channels,
                    site.agent,
                    &approval,
                    now,
                )
                .await;
                Ok(parked_answer(&approval))
            }
        }
    }

    /// Carries out a decided approval of `agent`'s: an approved call, checked again, is
    /// sent; a denied or expired one is not. What came of it, to be settled on the
    /// approval.
    pub async fn carry_out(&self, agent: &Agent, approval: &Approval) -> ApprovalOutcome {
        let now = self.clock.now();
        if let Some(outcome) = not_sent(approval, now) {
            return outcome;
        }
        let not_sent = |why: String| ApprovalOutcome {
            sent: false,
            action_id: None,
            summary: why,
            failed: false,
            at: now,
        };
        let offer = self.offer(agent, &[]).await;
        let (offered, server, idempotent) = match self.recheck(agent, approval, &offer) {
            Ok(found) => found,
            Err(why) => {
                info!(approval_id = %approval.id, reason = %why, "an approved call is not sent");
                return not_sent(format!("approved, but not sent: {why}"));
            }
        };
        let call = ToolUse {
            id: approval.id.to_string(),
            name: offered.model_name.clone(),
            input: approval.arguments.clone(),
        };
        let heartbeat_id = approval
            .heartbeat_id
            .clone()
            .unwrap_or_else(|| HeartbeatId::new(agent.id.clone(), 0));
        let site = Site {
            agent,
            heartbeat_id,
            event: None,
            turn_id: approval.turn_id.as_ref(),
            run: approval.id.as_str(),
            index: approval.step,
            at_ms: approval.at_ms,
            race: None,
            said: None,
        };
        let mut action = self.action(
            &site,
            &offered.server,
            &offered.tool,
            &call,
            approval.key.clone(),
        );
        if let Some(c) = &mut action.call {
            c.event_id = approval.event_id.clone();
        }
        let sent = |answer: ToolAnswer, action_id| {
            let (summary, failed) = match answer {
                Ok(v) => (crate::domain::clipped(v, OUTCOME_BYTES).to_string(), false),
                Err(Refusal(why)) => (why, true),
            };
            ApprovalOutcome {
                sent: true,
                action_id: Some(action_id),
                summary,
                failed,
                at: now,
            }
        };
        match self.begin(&mut action, idempotent).await {
            Err(why) => return not_sent(format!("approved, but not sent: {why}")),
            Ok(Begun::Done(done)) => {
                info!(action_id = %done.id, "an approved call already made: its recorded answer is used");
                return sent(super::answer_of(&done), done.id.clone());
            }
            Ok(Begun::Send) => {}
        }
        self.start_hooks(&offer, &site, &action).await;
        let started = std::time::Instant::now();
        let outcome: McpCall = self
            .clients
            .call(
                &offered.server,
                &server,
                &offered.tool,
                &approval.arguments,
                &approval.key,
            )
            .await;
        let id = action.id.clone();
        let answer = self
            .finished(
                &offer,
                &site,
                action,
                outcome,
                &offered.model_name,
                idempotent,
                started,
            )
            .await;
        info!(approval_id = %approval.id, action_id = %id, failed = answer.is_err(), "an approved call was sent");
        sent(answer, id)
    }

    /// The offered tool an approved call goes to, its server and whether the server is
    /// idempotent; why it must not be sent otherwise.
    fn recheck(
        &self,
        agent: &Agent,
        approval: &Approval,
        offer: &Offer,
    ) -> Result<(OfferedTool, crate::domain::McpServer, bool), String> {
        if let Some(at) = agent.paused_at {
            return Err(format!("the agent was paused at {at}"));
        }
        if !agent.tools.iter().any(|t| t.server == approval.server) {
            return Err(format!(
                "the agent no longer has the MCP server {}",
                approval.server
            ));
        }
        let Some((server, idempotent)) = offer.servers.get(&approval.server) else {
            return Err(format!(
                "the MCP server {} is removed or inactive",
                approval.server
            ));
        };
        let Some(offered) = offer
            .tools
            .iter()
            .find(|t| t.server == approval.server && t.tool == approval.tool)
        else {
            return Err(format!(
                "{} no longer lists (or allows) the tool {}",
                approval.server, approval.tool
            ));
        };
        if server.policy_of(&approval.tool).0 == ToolPolicy::Deny {
            return Err(format!(
                "{}/{} was set to deny since it was asked",
                approval.server, approval.tool
            ));
        }
        if schema_digest(&offered.spec.parameters) != approval.schema {
            return Err(format!(
                "{}/{} changed its arguments' schema since it was asked; the model has to make the call again",
                approval.server, approval.tool
            ));
        }
        Ok((offered.clone(), server.clone(), *idempotent))
    }

    /// Emits one of an approval's hooks (`hook_type`) to `agent`'s routes in `offer`; a
    /// queue that refuses it is logged.
    pub(super) async fn emit_approval(
        &self,
        offer: &Offer,
        agent: &Agent,
        approval: &Approval,
        hook_type: &'static str,
    ) {
        let Some(hooks) = &self.hooks else {
            return;
        };
        let emission = crate::engine::approvals::emission(approval, hook_type);
        if let Err(e) = hooks.emit(&offer.routes, agent, emission).await {
            warn!(approval_id = %approval.id, error = %e, "an approval's hook was not queued");
        }
    }
}

/// What came of `approval` at `now` when it is not approved: never sent, and why.
pub fn not_sent(approval: &Approval, now: jiff::Timestamp) -> Option<ApprovalOutcome> {
    let summary = match approval.status {
        ApprovalStatus::Approved => return None,
        ApprovalStatus::Pending => "not decided yet".to_owned(),
        ApprovalStatus::Denied => format!(
            "not sent: {}{}",
            approval.who_decided(),
            approval
                .decision_reason
                .as_deref()
                .map_or_else(String::new, |r| format!(", saying: {r}"))
        ),
        ApprovalStatus::Expired => format!(
            "not sent: nobody decided before it expired at {}",
            approval.expires_at
        ),
    };
    Some(ApprovalOutcome {
        sent: false,
        action_id: None,
        summary,
        failed: false,
        at: now,
    })
}

/// What the model is told of a call it made that is parked (or, on a run made again,
/// was parked and maybe decided since).
fn parked_answer(a: &Approval) -> Value {
    let note = match a.status {
        ApprovalStatus::Pending => format!(
            "This call was NOT made: it needs your owner's approval. They have been asked, and have until {} to decide; you will be told what came of it in a later message. Do not make the call again, and do not say it was done.",
            a.expires_at
        ),
        _ => format!(
            "This call was parked for your owner's approval and is {} now; you are told what came of it in a separate message. Do not make it again.",
            a.who_decided()
        ),
    };
    json!({
        "status": "awaiting_approval",
        "approval_id": a.id,
        "expires_at": a.expires_at,
        "note": note,
    })
}

/// What the agent is told of a decided approval, in the signal that carries it.
pub fn told(a: &Approval, outcome: &ApprovalOutcome) -> String {
    let what = a.summary(400);
    let head = format!("Your call {what} (approval {})", a.id);
    match (a.status, outcome.sent) {
        (ApprovalStatus::Approved, true) if outcome.failed => format!(
            "{head} was approved ({}) and made, and it failed: {}",
            a.who_decided(),
            outcome.summary
        ),
        (ApprovalStatus::Approved, true) => format!(
            "{head} was approved ({}) and made. The tool answered: {}",
            a.who_decided(),
            outcome.summary
        ),
        _ => format!("{head}: {}. It was not made.", outcome.summary),
    }
}
