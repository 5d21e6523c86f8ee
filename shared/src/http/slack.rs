//! `POST /slack/events` and `POST /slack/interactions`: what Slack's Events API and
//! interactivity push. Every request is signed with the app's signing secret
//! (`SLACK_SIGNING_SECRET`, checked by `pulse-signatures`: `v0` HMAC-SHA256 over the
//! timestamp and the raw body, the timestamp within 5 minutes, so a replay is refused);
//! an unsigned or stale one is 401 and nothing is stored.
//!
//! A direct message (`message.im`) from someone an agent lets in, or a mention of the
//! app (`app_mention`) in an agent's channel, becomes a signal of that agent, answered
//! in its thread. Its id is derived from the channel and the message's `ts`, so Slack's
//! retries (`X-Slack-Retry-Num`) are the same signal and are answered once. A press of
//! an approval's button (`block_actions`) decides the approval, when the person is one
//! the agent lets in; the first decision stands.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::{Inbound, error_response, read_body, store_failure};
use crate::domain::{Agent, ChannelKind, DiscordListen, Signal, SignalId, SignalMeta};
use crate::engine::intake;

fn taken(what: &'static str) -> Response {
    Json(json!({ "ok": true, "taken": what })).into_response()
}

/// The request's body once its signature is checked, or the 401 to answer.
async fn verified(app: &Inbound, req: Request) -> Result<bytes::Bytes, Response> {
    let (parts, body) = req.into_parts();
    let body = read_body(body, &parts.headers, super::MAX_BODY).await?;
    let Some(secret) = &app.config.slack_signing_secret else {
        return Err(error_response(
            StatusCode::UNAUTHORIZED,
            "Slack requests are not taken here: set SLACK_SIGNING_SECRET to the app's signing secret (Basic Information, App Credentials)",
        ));
    };
    let now = app.clock.now().as_second();
    if let Err(e) =
        pulse_signatures::slack::verify_slack(secret.expose(), &parts.headers, &body, now)
    {
        warn!(reason = %e, "a Slack request refused");
        return Err(error_response(
            StatusCode::UNAUTHORIZED,
            format!("invalid request signature: {e}"),
        ));
    }
    Ok(body)
}

pub(super) async fn events(State(app): State<Arc<Inbound>>, req: Request) -> Response {
    let body = match verified(&app, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    match payload["type"].as_str() {
        Some("url_verification") => {
            Json(json!({ "challenge": payload["challenge"] })).into_response()
        }
        Some("event_callback") => event(&app, &payload["event"], app.clock.now()).await,
        _ => taken("a request Pulse does not act on"),
    }
}

/// The agent a message is for: in a direct message, the one that lets its author in;
/// in a channel, the one whose channel it is, when it mentions the app (`app_mention`)
/// or the agent listens to all (channel messages arrive with `message.channels`). The
/// oldest, if several would take it.
fn addressee(agents: &[Agent], e: &Value, author: &str, channel: &str) -> Option<Agent> {
    let direct = e["channel_type"].as_str() == Some("im");
    let mention = e["type"].as_str() == Some("app_mention");
    let mut candidates: Vec<&Agent> = agents
        .iter()
        .filter(|a| {
            if direct {
                a.lets_in(ChannelKind::Slack, author)
            } else {
                a.slack.chat.as_deref() == Some(channel)
                    && (mention || a.slack.listen == DiscordListen::All)
            }
        })
        .collect();
    candidates.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    candidates.first().map(|a| (*a).clone())
}

/// The message's text for the model: the app's mention taken off, files in words
/// ([`super::chat_text`]).
fn text_of(e: &Value) -> String {
    let mut text = e["text"].as_str().unwrap_or("").trim().to_owned();
    if e["type"].as_str() == Some("app_mention")
        && text.starts_with("<@")
        && let Some(end) = text.find('>')
    {
        text = text[end + 1..].trim().to_owned();
    }
    let files: Vec<String> = e["files"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .map(|f| {
                    format!(
                        "a file \"{}\" ({})",
                        f["name"].as_str().unwrap_or("unnamed"),
                        f["mimetype"].as_str().unwrap_or("of unknown type")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    super::chat_text(text, &files)
}

async fn event(app: &Inbound, e: &Value, now: Timestamp) -> Response {
    let kind = e["type"].as_str().unwrap_or_default();
    if kind != "message" && kind != "app_mention" {
        return taken("an event Pulse does not act on");
    }
    // A bot's message (the agent's own among them) and a change to a message (an edit,
    // a deletion: subtypes) are not answered; a file shared with words is.
    if e.get("bot_id").is_some() || e["subtype"].as_str().is_some_and(|s| s != "file_share") {
        return taken("a bot's message, or a change to one");
    }
    let (Some(channel), Some(ts), Some(author)) =
        (e["channel"].as_str(), e["ts"].as_str(), e["user"].as_str())
    else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "the event has no channel, ts or user",
        );
    };
    let agents = match app.store.list_agents().await {
        Ok(a) => a,
        Err(e) => return store_failure("finding the message's agent", &e),
    };
    let Some(agent) = addressee(&agents, e, author, channel) else {
        info!(
            channel,
            user_id = author,
            "a Slack message no agent takes (a stranger, or not addressed to the app): not answered"
        );
        return taken("a message no agent takes");
    };
    let minted = ts
        .split('.')
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now);
    let meta = SignalMeta {
        source: Some(ChannelKind::Slack.as_str().to_owned()),
        user_id: Some(author.to_owned()),
        user_name: None,
        channel_id: Some(channel.to_owned()),
        message_id: Some(ts.to_owned()),
        thread: e["thread_ts"].as_str().map(str::to_owned),
        envelope: Some(e.clone()),
        interaction: None,
        heartbeat_id: None,
    };
    let mut signal = match Signal::user_message(&agent.id, &agent.session, &text_of(e), meta, now) {
        Ok(s) => s,
        Err(e) => {
            info!(error = %e, "a Slack message Pulse cannot take: not answered");
            return taken("a message Pulse cannot take");
        }
    };
    // A mention in a channel the agent also reads whole arrives twice (app_mention and
    // message): the same signal.
    signal.id = SignalId::derived(
        minted.as_millisecond().max(0) as u64,
        &["slack", channel, ts],
    );
    let signal_id = signal.id.clone();
    if let Err(e) = intake::submit(app.store.as_ref(), app.queue.as_ref(), signal).await {
        return store_failure("queueing the message", &e);
    }
    info!(agent_id = %agent.id, signal_id = %signal_id, "Slack message queued");
    taken("a message, queued")
}

pub(super) async fn interactions(State(app): State<Arc<Inbound>>, req: Request) -> Response {
    let body = match verified(&app, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let payload = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == "payload")
        .and_then(|(_, v)| serde_json::from_str::<Value>(&v).ok());
    let Some(payload) = payload else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "the body has no JSON payload field",
        );
    };
    if payload["type"].as_str() != Some("block_actions") {
        return taken("an interaction Pulse does not act on");
    }
    let Some((approve, agent_id, id)) = payload
        .pointer("/actions/0/value")
        .and_then(Value::as_str)
        .and_then(crate::domain::parse_button)
    else {
        return taken("a button Pulse does not know");
    };
    let user = payload
        .pointer("/user/id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let agent = match app.store.get_agent(&agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => return taken("a button of an agent that no longer exists"),
        Err(e) => return store_failure("reading the agent", &e),
    };
    if !agent.lets_in(ChannelKind::Slack, user) {
        info!(approval_id = %id, user, "an approval button pressed on Slack by someone the agent does not let in: refused");
        return taken("a press by someone the agent does not let in");
    }
    let decision = crate::domain::Decision {
        approve,
        by: format!("slack {user}"),
        reason: None,
        always: false,
    };
    match crate::engine::approvals::decide(
        app.store.as_ref(),
        app.queue.as_ref(),
        &agent,
        &id,
        &decision,
        app.clock.now(),
    )
    .await
    {
        Ok(_) => taken("a decision"),
        Err(crate::engine::approvals::DecideError::Decided(_)) => {
            taken("a press after the decision: the first stands")
        }
        Err(crate::engine::approvals::DecideError::NotFound(_)) => taken("a press of no approval"),
        Err(crate::engine::approvals::DecideError::Store(e)) => {
            store_failure("deciding the approval", &e)
        }
    }
}
