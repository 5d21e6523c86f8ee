//! Approvals: the tool calls agents parked for a person's yes, as cards — the call, its
//! arguments, why the agent made it, when it expires — each with Approve and Deny (and a
//! reason). The header of every page shows how many wait, linking here.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::Redirect;
use maud::{Markup, html};
use pulse_shared::domain::{Approval, ApprovalId, Decision};
use pulse_shared::engine::approvals::{self, DecideError};
use serde::Deserialize;

use crate::layout::{ago, badge, csrf, empty, page, short};
use crate::{Dashboard, Problem};

/// Most cards shown.
const SHOWN: usize = 100;

/// `GET /ui/approvals`: the pending approvals of every agent, soonest to expire first,
/// then the latest decided.
pub(crate) async fn list(State(d): State<Dashboard>) -> Result<Markup, Problem> {
    let now = d.0.clock.now();
    let pending: Vec<Approval> =
        d.0.store
            .open_approvals(SHOWN)
            .await?
            .into_iter()
            .filter(Approval::is_pending)
            .collect();
    let agents = d.0.store.list_agents().await?;
    let name = |a: &Approval| {
        agents
            .iter()
            .find(|x| x.id == a.agent_id)
            .map_or_else(|| a.agent_id.to_string(), |x| x.name.clone())
    };
    Ok(page(
        "Approvals",
        None,
        html! {
            h1 { a href="/ui/" { "Agents" } " / Approvals" }
            p.muted { "Calls of tools whose policy is " code { "ask" } ", parked until you decide. Approved, a call is sent once in the agent's session and the agent tells you what came of it; denied or expired, it is never sent." }
            @if pending.is_empty() {
                (empty("No call waits for your approval.", "pulse tools policy SERVER [TOOL] ask"))
            }
            div.approvals {
                @for a in &pending {
                    (card(&d, a, &name(a), now))
                }
            }
        },
    ))
}

/// One pending approval as a card.
fn card(d: &Dashboard, a: &Approval, agent: &str, now: jiff::Timestamp) -> Markup {
    let args = serde_json::to_string_pretty(&a.arguments).unwrap_or_default();
    let action = format!("/ui/approvals/{}/{}", a.agent_id, a.id);
    html! {
        div.card.approval id=(a.id) {
            div {
                strong { (agent) } " wants to call " code { (a.server) "/" (a.tool) } " "
                (badge(a.status.as_str()))
            }
            @if let Some(r) = &a.reason {
                p { span.muted { "It said: " } (short(r, 400)) }
            }
            pre.arguments { (args) }
            p.muted {
                "Asked " (ago(now, Some(a.requested_at))) "; expires " (ago(now, Some(a.expires_at)))
                @if let Some(t) = &a.turn_id { " · chat turn " code { (t) } }
                @if let Some(h) = &a.heartbeat_id { " · heartbeat " code { (h) } }
            }
            form.inline method="post" action={(action) "/approve"} {
                (csrf(d))
                button.approve type="submit" { "Approve" }
            }
            form.inline method="post" action={(action) "/always"} {
                (csrf(d))
                button.quiet type="submit" title={"Approve, and let " (agent) " call " (a.server) "/" (a.tool) " from now on without asking"} { "Always allow" }
            }
            form.inline method="post" action={(action) "/deny"} {
                (csrf(d))
                input name="reason" placeholder="why not (optional)" maxlength="1000";
                button.danger type="submit" { "Deny" }
            }
        }
    }
}

/// A decision's form.
#[derive(Deserialize)]
pub(crate) struct DecisionForm {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /ui/approvals/{agent}/{id}/{approve|always|deny}` (`always`: approved, and the
/// tool granted to the agent from now on).
pub(crate) async fn decide(
    State(d): State<Dashboard>,
    Path((agent, id, verb)): Path<(String, String, String)>,
    Form(form): Form<DecisionForm>,
) -> Result<Redirect, Problem> {
    let agent = super::agent_of(&d, &agent).await?;
    let id = ApprovalId::parse(&id).map_err(|_| Problem::NotFound(format!("approval {id}")))?;
    let (approve, always) = match verb.as_str() {
        "approve" => (true, false),
        "always" => (true, true),
        "deny" => (false, false),
        other => return Err(Problem::NotFound(format!("decision {other}"))),
    };
    let decision = Decision {
        approve,
        by: "dashboard".to_owned(),
        reason: form.reason.filter(|r| !r.trim().is_empty()),
        always,
    };
    match approvals::decide(
        d.0.store.as_ref(),
        d.0.queue.as_ref(),
        &agent,
        &id,
        &decision,
        d.0.clock.now(),
    )
    .await
    {
        Ok(_) => Ok(Redirect::to("/ui/approvals")),
        Err(DecideError::NotFound(_)) => Err(Problem::NotFound(format!("approval {id}"))),
        Err(e @ DecideError::Decided(_)) => Err(Problem::Conflict(e.to_string())),
        Err(DecideError::Store(e)) => Err(e.into()),
    }
}

/// `GET /ui/approvals/count`: the header's link, with how many wait (nothing when none).
pub(crate) async fn count(State(d): State<Dashboard>) -> Result<Markup, Problem> {
    let n =
        d.0.store
            .open_approvals(1_000)
            .await?
            .iter()
            .filter(|a| a.is_pending())
            .count();
    Ok(html! {
        @if n > 0 {
            a.approvals-count href="/ui/approvals" title="Calls waiting for your approval" {
                "Approvals " span.count { (n) }
            }
        }
    })
}
