//! The approvals API: a program (a phone app, a script, a chat bridge) decides the calls
//! an agent parked for its owner's yes, with the agent's API token.
//!
//! - `GET /v1/approvals?status=pending` lists the token's agent's approvals, newest
//!   first (pending ones only with `status=pending`).
//! - `POST /v1/approvals/{approval_id}` with `{"decision": "approve"|"deny", "reason":
//!   "…", "always": true}` decides one (`always`: approved, and the tool granted to the
//!   agent from then on): the first decision is the only one (409 after, naming it). The
//!   call is sent, or not, in the agent's session, not on this request.
//!
//! A token sees and decides its own agent's approvals only: another agent's id is 404,
//! as one that does not exist.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::messages::admitted;
use super::{Inbound, Json, error_response, store_failure};
use crate::domain::{ApprovalId, Decision};
use crate::engine::approvals::{self, DecideError};

/// The largest decision body read.
const MAX_DECISION_BODY: usize = 8 * 1024;

/// Most approvals one listing gives.
const LISTED: usize = 100;

/// `GET /v1/approvals`.
pub(crate) async fn list(
    State(inbound): State<Arc<Inbound>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let token = match admitted(&inbound, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let pending_only = match query.as_deref().unwrap_or_default() {
        "" | "status=all" => false,
        "status=pending" => true,
        other => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("unknown query {other:?}: give status=pending, status=all or nothing"),
            );
        }
    };
    let listed = match inbound.store.approvals(&token.agent_id, LISTED).await {
        Ok(l) => l,
        Err(e) => return store_failure("read the approvals", &e),
    };
    let approvals: Vec<_> = listed
        .into_iter()
        .filter(|a| !pending_only || a.is_pending())
        .collect();
    Json(json!({ "approvals": approvals })).into_response()
}

/// The body of `POST /v1/approvals/{approval_id}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewDecision {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    always: bool,
}

/// `POST /v1/approvals/{approval_id}`.
pub(crate) async fn decide(
    State(inbound): State<Arc<Inbound>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let token = match admitted(&inbound, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let not_found = || {
        error_response(
            StatusCode::NOT_FOUND,
            format!(
                "no approval {id} of agent {}; GET /v1/approvals lists them",
                token.agent_id
            ),
        )
    };
    let Ok(id) = ApprovalId::parse(&id) else {
        return not_found();
    };
    let body = match super::read_body(body, &headers, MAX_DECISION_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let bad = |why: String| {
        error_response(
            StatusCode::BAD_REQUEST,
            format!(
                "{why}; send {{\"decision\": \"approve\"}} or {{\"decision\": \"deny\", \"reason\": \"...\"}}"
            ),
        )
    };
    let asked: NewDecision = match serde_json::from_slice(&body) {
        Ok(d) => d,
        Err(e) => return bad(format!("the body is not a decision ({e})")),
    };
    let approve = match asked.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => return bad(format!("{other:?} is not a decision")),
    };
    let agent = match inbound.store.get_agent(&token.agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => return not_found(),
        Err(e) => return store_failure("read the agent", &e),
    };
    let decision = Decision {
        approve,
        by: format!("api {}", token.id),
        reason: asked.reason,
        always: approve && asked.always,
    };
    match approvals::decide(
        inbound.store.as_ref(),
        inbound.queue.as_ref(),
        &agent,
        &id,
        &decision,
        inbound.clock.now(),
    )
    .await
    {
        Ok(decided) => Json(json!({ "approval": decided })).into_response(),
        Err(DecideError::NotFound(_)) => not_found(),
        Err(e @ DecideError::Decided(_)) => error_response(StatusCode::CONFLICT, e.to_string()),
        Err(DecideError::Store(e)) => store_failure("decide the approval", &e),
    }
}
