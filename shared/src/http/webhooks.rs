//! `POST /webhooks/{webhook_id}`: signed events from external systems. The use case is
//! the engine's [`WebhookIntake`](crate::engine::WebhookIntake); this handler reads the
//! body and answers its [`Verdict`] with a status and a JSON body.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::{Inbound, MAX_BODY, client_ip, error_response, json_body, read_body, store_failure};
use crate::domain::EventId;
use crate::engine::{Refused, Verdict};

pub(super) async fn receive(
    State(app): State<Arc<Inbound>>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let ip = client_ip(&req);
    let (mut parts, body) = req.into_parts();
    let id = id.map(|Path(id)| id).unwrap_or_default();
    // No body is read for a webhook that does not exist.
    if let Err(refused) = app.webhooks.precheck(&id).await {
        return respond(refused);
    }
    let body = match read_body(body, &parts.headers, MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    // The request's parts and body are slices of the connection's read buffer: the
    // intake lets go of them before it waits for the store, so that the connection
    // reads its next request into the same buffer rather than a new one. Only the
    // headers go on; the rest is dropped here.
    let headers = std::mem::take(&mut parts.headers);
    drop(parts);
    respond(app.webhooks.receive(&id, headers, body, ip).await)
}

/// The answer to a verdict: a status and a JSON body.
fn respond(verdict: Verdict) -> Response {
    match verdict {
        Verdict::Accepted(event_id) => answer(&event_id, "accepted"),
        Verdict::Duplicate(event_id) => answer(&event_id, "duplicate"),
        Verdict::Refused(why, reason) => error_response(
            match why {
                Refused::NotFound | Refused::Disabled => StatusCode::NOT_FOUND,
                Refused::BadSignature => StatusCode::UNAUTHORIZED,
                Refused::BadBody => StatusCode::BAD_REQUEST,
                Refused::NotAllowed => StatusCode::FORBIDDEN,
                Refused::SeenAndRefused => StatusCode::CONFLICT,
            },
            reason,
        ),
        Verdict::RateLimited { limit, retry_after } => {
            let mut r = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "over this webhook's limit of {}; retry after {retry_after} s",
                    limit.map_or_else(String::new, |l| l.to_string())
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
            r
        }
        Verdict::Unavailable(what, e) => store_failure(what, &e),
        Verdict::SecretUnreadable => {
            let mut r = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "this webhook cannot take requests right now; retry later",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            r
        }
    }
}

/// `{"event_id": …, "status": …}`, written straight from its two fields (every accepted
/// request is answered with it, so no JSON tree is built for it).
fn answer(event_id: &EventId, status: &str) -> Response {
    #[derive(serde::Serialize)]
    struct Answer<'a> {
        event_id: &'a EventId,
        status: &'a str,
    }
    json_body(serde_json::to_vec(&Answer { event_id, status }).unwrap_or_default())
}
