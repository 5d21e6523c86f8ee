//! The messages API: any program talks to an agent as its user does.
//!
//! - `POST /v1/agents/{agent_id}/messages` queues a message on the agent's session (the
//!   one FIFO every channel goes through, so it is batched with and interrupts what the
//!   others send) and answers `202` with the id of the turn that will answer it.
//! - `GET /v1/turns/{turn_id}?wait=30s` reads that turn, waiting up to `wait` for it.
//!
//! Each request shows an API token (`Authorization: Bearer pt_….…`, made with
//! `pulse tokens create`) that speaks to one agent. A missing, unknown, expired or
//! revoked token is 401 and a token for another agent 403, before the body is read;
//! nothing is queued. Each token may make [`ApiRate`](crate::config::ApiRate) requests a
//! minute (429 with `Retry-After`, the seconds to the next minute, past that), counted
//! in the store, so that every receiver sharing it — warm Lambda instances, `serve`
//! processes — shares the one limit.
//!
//! A message's turn id is `tn_` + its own ULID. When the agent answers several messages
//! at once (a second message arrived while it thought about the first), the turn that
//! answered them carries the first one's id: `answered_by` says which.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::SignedDuration;
use serde::Deserialize;
use serde_json::json;

use super::{Inbound, Json, StreamSlot, error_response, store_failure};
use crate::domain::{
    AgentId, ApiToken, ContentBlock, MAX_SIGNAL_TEXT, Signal, SignalId, SignalMeta, TokenRefusal,
    Turn, TurnId, TurnStatus, parse_duration,
};
use crate::engine::intake;

/// The largest message body read: 64 KiB.
pub const MAX_MESSAGE_BODY: usize = 64 * 1024;
/// Most image URLs one message may carry.
pub const MAX_IMAGES: usize = 4;
/// The longest a `GET /v1/turns/{id}` waits.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// How often a waiting read looks again, where the store cannot tell it of writes.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// How often a waiting read the store wakes looks again all the same.
const LOOK_ANYWAY: Duration = Duration::from_secs(5);
/// How long after its message a turn no one has answered yet is still `queued`; past
/// that, the id is unknown (never sent, or removed by retention).
const QUEUED_FOR: SignedDuration = SignedDuration::from_hours(24);

/// Requests one API token may make a minute on the messages API (default 60), counted
/// in the store by the minute: `PULSE_API_RATE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRate(pub u32);

impl Default for ApiRate {
    fn default() -> Self {
        Self(60)
    }
}

/// A request's token, checked and counted: the token, or the answer to give.
pub(super) async fn admitted(inbound: &Inbound, headers: &HeaderMap) -> Result<ApiToken, Response> {
    let refuse = |r: TokenRefusal| {
        let mut resp = error_response(StatusCode::UNAUTHORIZED, r.to_string());
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"pulse\""),
        );
        resp
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| refuse(TokenRefusal::Missing))?;
    let (id, secret) = ApiToken::split(presented).map_err(refuse)?;
    let now = inbound.clock.now();
    let token = match inbound.store.get_token(&id).await {
        Ok(Some(t)) => t,
        Ok(None) => return Err(refuse(TokenRefusal::Invalid)),
        Err(e) => return Err(store_failure("read the API token", &e)),
    };
    token.admit(secret, now).map_err(refuse)?;
    let counted = inbound
        .store
        .count_api_request(&token.id, now, inbound.config.api_rate.0.max(1))
        .await
        .map_err(|e| store_failure("count the request", &e))?;
    if !counted {
        // Until the next minute, when the count starts again.
        let wait = (60 - now.as_second().rem_euclid(60)).max(1) as u64;
        let mut r = error_response(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "over this token's limit of {} requests a minute; retry after {wait} s",
                inbound.config.api_rate.0
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
        return Err(r);
    }
    Ok(token)
}

/// The body of `POST /v1/agents/{agent_id}/messages`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMessage {
    text: String,
    #[serde(default)]
    images: Vec<String>,
    #[serde(default)]
    user: Option<String>,
}

/// `POST /v1/agents/{agent_id}/messages`.
pub(crate) async fn post(
    State(inbound): State<Arc<Inbound>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let token = match admitted(&inbound, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    // The URL names the agent by id, name or alias; the token's own agent only.
    if agent != token.agent_id.as_str() {
        let own = match inbound.store.get_agent(&token.agent_id).await {
            Ok(a) => a,
            Err(e) => return store_failure("read the agent", &e),
        };
        if !own.is_some_and(|a| a.is_named(&agent)) {
            return error_response(
                StatusCode::FORBIDDEN,
                format!(
                    "this token speaks to agent {} only; name it in the URL by its id, name or alias, or use a token made for {agent} (`pulse tokens create --agent {agent}`)",
                    token.agent_id
                ),
            );
        }
    }
    let body = match super::read_body(body, &headers, MAX_MESSAGE_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let message: NewMessage = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body is not a message ({e}); send {{\"text\": \"...\"}} with optional \"images\": [URL] and \"user\""
                ),
            );
        }
    };
    let signal = match signal_of(&inbound, &token.agent_id, message).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(e) = intake::submit(
        inbound.store.as_ref(),
        inbound.queue.as_ref(),
        signal.clone(),
    )
    .await
    {
        return store_failure("queue the message", &e);
    }
    let turn = TurnId::for_signal(&signal.id);
    let mut r = Json(json!({
        "turn_id": turn,
        "message_id": signal.id,
        "status": "queued",
        "poll": format!("/v1/turns/{turn}?wait=30s"),
    }))
    .into_response();
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

fn too_large(what: String) -> Response {
    error_response(StatusCode::PAYLOAD_TOO_LARGE, format!("{what}; send less"))
}

/// The signal a message makes, validated: a text within bounds, a few http(s) image
/// URLs, an agent that exists.
async fn signal_of(
    inbound: &Inbound,
    agent_id: &AgentId,
    message: NewMessage,
) -> Result<Signal, Response> {
    if message.text.chars().count() > MAX_SIGNAL_TEXT {
        return Err(too_large(format!(
            "the text is longer than {MAX_SIGNAL_TEXT} characters"
        )));
    }
    if message.images.len() > MAX_IMAGES {
        return Err(error_response(
            StatusCode::BAD_REQUEST,
            format!("a message carries at most {MAX_IMAGES} images"),
        ));
    }
    for url in &message.images {
        let ok = url.len() <= 2048
            && url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "https" | "http"));
        if !ok {
            return Err(error_response(
                StatusCode::BAD_REQUEST,
                format!(
                    "{:?} is not an http(s) URL of at most 2,048 characters",
                    truncate(url)
                ),
            ));
        }
    }
    let user = message
        .user
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty());
    if user.is_some_and(|u| u.chars().count() > 100 || u.chars().any(char::is_control)) {
        return Err(error_response(
            StatusCode::BAD_REQUEST,
            "\"user\" is a name of at most 100 characters, without control characters",
        ));
    }
    let agent = match inbound.store.get_agent(agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(error_response(
                StatusCode::NOT_FOUND,
                format!(
                    "agent {agent_id} no longer exists; revoke its tokens with `pulse tokens revoke`"
                ),
            ));
        }
        Err(e) => return Err(store_failure("read the agent", &e)),
    };
    let meta = SignalMeta {
        source: Some("api".into()),
        user_name: Some(user.unwrap_or("api").to_owned()),
        ..SignalMeta::default()
    };
    let mut signal = Signal::user_message(
        &agent.id,
        &agent.session,
        &message.text,
        meta,
        inbound.clock.now(),
    )
    .map_err(|e| {
        error_response(
            StatusCode::BAD_REQUEST,
            format!("{}; send some text", e.message),
        )
    })?;
    signal
        .content
        .extend(message.images.into_iter().map(|url| ContentBlock::Image {
            url,
            media_type: None,
        }));
    Ok(signal)
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// `GET /v1/turns/{turn_id}[?wait=30s]`.
pub(crate) async fn get(
    State(inbound): State<Arc<Inbound>>,
    Path(turn): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    slot: Option<Extension<StreamSlot>>,
) -> Response {
    let token = match admitted(&inbound, &headers).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let unknown = || {
        error_response(
            StatusCode::NOT_FOUND,
            format!(
                "no turn {turn:?} of agent {}; a turn id is what POST /v1/agents/{{agent_id}}/messages answered",
                token.agent_id
            ),
        )
    };
    let Ok(id) = TurnId::parse(&turn) else {
        return unknown();
    };
    let wait_arg = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "wait")
        .map(|(_, v)| v.into_owned());
    let wait = match wait_arg.as_deref().map(|w| parse_duration("wait", w)) {
        None => Duration::ZERO,
        Some(Ok(w))
            if !w.is_negative() && w <= SignedDuration::try_from(MAX_WAIT).unwrap_or_default() =>
        {
            w.unsigned_abs()
        }
        Some(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!(
                    "wait is a duration from 0s to {}s (e.g. 30s)",
                    MAX_WAIT.as_secs()
                ),
            );
        }
    };
    let signal =
        SignalId::parse(&format!("sg_{}", &id.as_str()[3..])).expect("a turn's ULID is a signal's");
    let sent = jiff::Timestamp::from_millisecond(
        ulid::Ulid::from_string(&id.as_str()[3..]).map_or(0, |u| u.timestamp_ms() as i64),
    )
    .unwrap_or_default();
    // Under `pulse serve` a long wait holds one of the listener's stream places, not a
    // connection place, and ends before the listener's request timeout would cut it off.
    let wait = slot
        .as_ref()
        .map_or(wait, |Extension(s)| wait.min(s.longest_wait()));
    let _place = if wait > Duration::ZERO {
        match slot.map(|Extension(s)| s.open()).transpose() {
            Ok(p) => p,
            Err(full) => return full.into_response(),
        }
    } else {
        None
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut written = inbound.store.turns_written();
    loop {
        // Seen before the look: a turn written during it wakes the wait after it.
        if let Some(w) = written.as_mut() {
            w.borrow_and_update();
        }
        match look(&inbound, &token.agent_id, &signal).await {
            Err(r) => return r,
            Ok(Some(t))
                if t.status != TurnStatus::Delivering
                    || tokio::time::Instant::now() >= deadline =>
            {
                return Json(describe(&id, &t)).into_response();
            }
            Ok(None) if tokio::time::Instant::now() >= deadline => {
                if let Some(w) = waiting_on(&inbound, &token.agent_id, &signal).await {
                    return Json(json!({
                        "turn_id": id,
                        "status": "waiting",
                        "reply": null,
                        "waiting": {
                            "since": w.since,
                            "tries": w.attempts,
                            "next_try_at": w.next_at,
                            "reason": w.reason,
                        },
                    }))
                    .into_response();
                }
                let now = inbound.clock.now();
                if sent > now + SignedDuration::from_mins(5)
                    || now.duration_since(sent) > QUEUED_FOR
                {
                    return unknown();
                }
                return Json(json!({"turn_id": id, "status": "queued", "reply": null}))
                    .into_response();
            }
            Ok(_) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match written.as_mut() {
                    // Woken by the next turn written (or at the deadline, or after a
                    // while in case a write came through another process).
                    Some(w) => {
                        let _ = tokio::time::timeout(left.min(LOOK_ANYWAY), w.changed()).await;
                    }
                    None => tokio::time::sleep(LOOK_EVERY.min(left)).await,
                }
            }
        }
    }
}

/// The turn waiting on the model that holds `signal`, if one does: there are some only
/// while a model does not answer, so they are all read. A failure to read them is
/// answered as the message being queued.
async fn waiting_on(
    inbound: &Inbound,
    agent: &AgentId,
    signal: &SignalId,
) -> Option<crate::domain::WaitingTurn> {
    let all = inbound.store.list_waiting(10_000).await.ok()?;
    all.into_iter()
        .find(|w| w.agent_id == *agent && w.signals.iter().any(|s| s.id == *signal))
}

/// The turn that answered `signal`, if one did.
async fn look(
    inbound: &Inbound,
    agent: &AgentId,
    signal: &SignalId,
) -> Result<Option<Turn>, Response> {
    let answered = inbound
        .store
        .answered(agent, std::slice::from_ref(signal))
        .await
        .map_err(|e| store_failure("read the turn", &e))?;
    let Some((_, turn)) = answered.into_iter().next() else {
        return Ok(None);
    };
    let turn = inbound
        .store
        .get_turn(agent, &turn)
        .await
        .map_err(|e| store_failure("read the turn", &e))?;
    match turn {
        // Superseded by a newer message: the turn after it answers this one too.
        Some(t) if t.superseded() => {
            let newer = inbound
                .store
                .list_turns(agent, 20)
                .await
                .map_err(|e| store_failure("read the turns", &e))?;
            Ok(newer
                .into_iter()
                .filter(|n| n.id > t.id && !n.superseded())
                .min_by(|a, b| a.id.cmp(&b.id)))
        }
        other => Ok(other),
    }
}

fn describe(asked: &TurnId, t: &Turn) -> serde_json::Value {
    let status = match t.status {
        TurnStatus::Delivering => "delivering",
        TurnStatus::Done => "done",
        TurnStatus::Failed => "failed",
    };
    let reply = (!t.parts.is_empty()).then(|| t.parts.join("\n"));
    json!({
        "turn_id": asked,
        "answered_by": t.id,
        "status": status,
        "reply": reply,
        "error": t.error,
        "model": t.model,
        "usage": {"input_tokens": t.usage.input_tokens, "output_tokens": t.usage.output_tokens},
        "created_at": t.created_at,
        "completed_at": t.completed_at,
    })
}

/// `GET /v1/openapi.json`: the messages API described.
pub(crate) async fn openapi() -> Response {
    super::json_body(OPENAPI)
}

/// The OpenAPI 3.1 document of the messages API.
pub const OPENAPI: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_is_json() {
        assert!(serde_json::from_str::<serde_json::Value>(OPENAPI).is_ok());
    }
}
