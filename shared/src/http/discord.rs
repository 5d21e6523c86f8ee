//! `POST /discord/interactions`: Discord's interactions endpoint.
//!
//! Every request is checked first: Ed25519 over `X-Signature-Timestamp` + the raw body with
//! the application's public key, the timestamp within ±5 minutes. A request that fails is
//! answered 401 and nothing is stored (Discord sends bad signatures on purpose and drops
//! endpoints that accept them). Then:
//!
//! - PING → `{"type": 1}` (PONG);
//! - the `/ask` slash command and the message context-menu command → `{"type": 5}` (a
//!   deferred reply, sent at once, well inside Discord's 3 seconds) after queueing a
//!   `message` signal on the session of the agent that answers in the channel (or the
//!   default agent). The conversation worker answers by editing the deferred reply.
//!
//! - a button of an approval's message (a message component) → `{"type": 7}`: the
//!   message updated to say who decided, its buttons gone, after the decision is
//!   written (see [`crate::engine::approvals`]). Only a Discord user the agent lets in
//!   may decide; anyone else is told so, only them, and nothing is decided.
//!
//! The signal carries the text, image attachments as image blocks, and in
//! `metadata.discord` the message's envelope — type, flags, timestamps, author,
//! content, attachments (name, content type, size, duration, waveform, width, height,
//! description), embeds, stickers, reference, poll — so the agent knows a voice message or
//! a file arrived even when there is no text. The envelope is built from the raw JSON, so
//! nothing Discord sends is lost to a typed model; the command's data is read with
//! twilight-model's types.
//!
//! The signal's id is derived from the interaction's id, so the same interaction
//! delivered twice is one queued signal (the queue drops the duplicate id) and one turn
//! (a turn never answers a signal twice).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use serde_json::{Value, json};
use tracing::{info, warn};
use twilight_model::application::command::CommandType;
use twilight_model::application::interaction::application_command::{
    CommandData, CommandOptionValue,
};

use super::{Inbound, Json, error_response, read_body, store_failure};
use crate::discord::envelope::{
    attachment, attachments, describe, display_name, image_block, message_envelope, person,
};
use crate::domain::{AgentId, ContentBlock, InteractionRef, Signal, SignalId, SignalMeta, from_ms};
use crate::engine::intake;

/// Discord's epoch (2015-01-01) in Unix milliseconds: snowflakes count from it.
const DISCORD_EPOCH_MS: i64 = 1_420_070_400_000;

/// When a snowflake id was minted.
pub fn snowflake_time(id: &str) -> Option<Timestamp> {
    let n: u64 = id.parse().ok()?;
    Some(from_ms((n >> 22) as i64 + DISCORD_EPOCH_MS))
}

/// Reads an interaction's id as Discord mints them: a snowflake, in its one canonical
/// form (decimal digits, no sign, no leading zero, within 64 bits), minted no later than
/// the signature tolerance ahead of `now`. Returns when it was minted.
///
/// The id is the interaction's identity (its signal id is derived from it, so a resend is
/// one signal): an id that is not a snowflake, or one from the future, would give a
/// resend a new identity, so it is refused.
pub fn interaction_time(id: &str, now: Timestamp) -> Result<Timestamp, InteractionIdError> {
    let canonical = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && (id == "0" || !id.starts_with('0'));
    let minted = canonical
        .then(|| snowflake_time(id))
        .flatten()
        .ok_or_else(|| InteractionIdError::NotSnowflake(crate::domain::quote_input(id)))?;
    let latest = now
        .saturating_add(jiff::SignedDuration::from_secs(
            pulse_signatures::TOLERANCE_SECS,
        ))
        .unwrap_or(now);
    if minted > latest {
        return Err(InteractionIdError::FromTheFuture {
            id: id.to_owned(),
            minted,
            now,
        });
    }
    Ok(minted)
}

/// The signal a command interaction becomes, from its id (minted at `minted`) alone:
/// the same interaction sent again is the same signal.
pub fn interaction_signal_id(interaction_id: &str, minted: Timestamp) -> SignalId {
    SignalId::derived(
        minted.as_millisecond().max(0) as u64,
        &["discord", interaction_id],
    )
}

/// The signal a channel or direct message from the gateway becomes, from its id
/// (minted at `minted`) alone: the same message replayed after a resume is the same
/// signal.
pub fn message_signal_id(message_id: &str, minted: Timestamp) -> SignalId {
    SignalId::derived(
        minted.as_millisecond().max(0) as u64,
        &["discord-message", message_id],
    )
}

/// Why an interaction's id is refused as its identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InteractionIdError {
    /// Not a snowflake in its canonical form (the id, quoted).
    #[error("the interaction id {0} is not a snowflake (a decimal 64-bit id)")]
    NotSnowflake(String),
    /// Minted after the receiver's clock (past the signature tolerance).
    #[error("the interaction id {id} was minted at {minted}, after this receiver's clock ({now})")]
    FromTheFuture {
        /// The id.
        id: String,
        /// When it says it was minted.
        minted: Timestamp,
        /// The receiver's time.
        now: Timestamp,
    },
}

/// Ephemeral message flag: only the invoking user sees the reply.
const EPHEMERAL: u64 = 1 << 6;

fn bad_request(message: impl Into<String>) -> Response {
    error_response(StatusCode::BAD_REQUEST, message)
}

/// An immediate reply only the user sees (for problems the user can fix).
fn tell_user(content: String) -> Response {
    Json(json!({"type": 4, "data": {"content": content, "flags": EPHEMERAL, "allowed_mentions": {"parse": []}}}))
        .into_response()
}

pub(super) async fn interaction(State(app): State<Arc<Inbound>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match read_body(body, &parts.headers, super::MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(key) = &app.discord_key else {
        return error_response(
            StatusCode::UNAUTHORIZED,
            "Discord interactions are not configured here: set DISCORD_PUBLIC_KEY to the application's public key (Developer Portal, General Information)",
        );
    };
    let now = app.clock.now();
    if let Err(e) =
        pulse_signatures::discord::verify_discord(key, &parts.headers, &body, now.as_second())
    {
        warn!(reason = %e, "Discord interaction refused");
        return error_response(
            StatusCode::UNAUTHORIZED,
            format!("invalid request signature: {e}"),
        );
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body is not JSON: {e}")),
    };
    match raw.get("type").and_then(Value::as_u64) {
        Some(1) => Json(json!({"type": 1})).into_response(),
        Some(2) => command(&app, &raw, now).await,
        Some(3) => button(&app, &raw, now).await,
        // Autocomplete: Pulse's commands have none; answer with no choices.
        Some(4) => Json(json!({"type": 8, "data": {"choices": []}})).into_response(),
        Some(t) => bad_request(format!(
            "interaction type {t} is not handled; Pulse answers PING, application commands and its approval buttons"
        )),
        None => bad_request("the interaction has no type"),
    }
}

/// A press of an approval's Approve or Deny button: decided, and its message updated.
async fn button(app: &Inbound, raw: &Value, now: Timestamp) -> Response {
    let Some(custom_id) = raw.pointer("/data/custom_id").and_then(Value::as_str) else {
        return bad_request("the component has no custom_id");
    };
    let Some((approve, agent_id, id)) = crate::domain::parse_button(custom_id) else {
        return tell_user("This button is not one Pulse knows.".to_owned());
    };
    let user = raw
        .pointer("/member/user/id")
        .or_else(|| raw.pointer("/user/id"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let agent = match app.store.get_agent(&agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => return tell_user(format!("The agent {agent_id} no longer exists.")),
        Err(e) => return store_failure("reading the agent", &e),
    };
    if user.is_empty() || !agent.discord.users.iter().any(|u| u == user) {
        info!(approval_id = %id, user, "an approval button pressed by someone the agent does not let in: refused");
        return tell_user(format!(
            "Only {}'s owner can decide this (the Discord users it answers in direct messages).",
            agent.name
        ));
    }
    let decision = crate::domain::Decision {
        approve,
        by: format!("discord {user}"),
        reason: None,
        always: false,
    };
    let content = raw
        .pointer("/message/content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let said = match crate::engine::approvals::decide(
        app.store.as_ref(),
        app.queue.as_ref(),
        &agent,
        &id,
        &decision,
        now,
    )
    .await
    {
        Ok(_) if approve => format!(
            "✅ Approved by <@{user}>: {} makes the call and tells you what came of it.",
            agent.name
        ),
        Ok(_) => format!("⛔ Denied by <@{user}>: the call is not made. (`{}`)", id),
        Err(crate::engine::approvals::DecideError::Decided(first)) => {
            format!(
                "This was {} already; the first decision stands.",
                first.who_decided()
            )
        }
        Err(crate::engine::approvals::DecideError::NotFound(_)) => {
            return tell_user(format!(
                "There is no approval {id} of {} any more.",
                agent.name
            ));
        }
        Err(crate::engine::approvals::DecideError::Store(e)) => {
            return store_failure("deciding the approval", &e);
        }
    };
    // The message, its buttons gone, says who decided; no one is pinged by it.
    let mut text = format!("{content}\n\n{said}");
    if text.chars().count() > crate::domain::MESSAGE_LIMIT {
        text = said;
    }
    Json(json!({"type": 7, "data": {"content": text, "components": [], "allowed_mentions": {"parse": []}}}))
        .into_response()
}

async fn command(app: &Inbound, raw: &Value, now: Timestamp) -> Response {
    let data: CommandData = match raw.get("data").cloned().map(serde_json::from_value) {
        Some(Ok(d)) => d,
        Some(Err(e)) => return bad_request(format!("the command data is malformed: {e}")),
        None => return bad_request("the command has no data"),
    };
    let (Some(interaction_id), Some(token)) = (
        raw.get("id").and_then(Value::as_str),
        raw.get("token").and_then(Value::as_str),
    ) else {
        return bad_request("the interaction has no id or token");
    };
    let Some(channel) = raw
        .pointer("/channel/id")
        .or_else(|| raw.get("channel_id"))
        .and_then(Value::as_str)
    else {
        return bad_request("the interaction names no channel");
    };
    let user = raw
        .pointer("/member/user")
        .or_else(|| raw.get("user"))
        .cloned()
        .unwrap_or(Value::Null);
    let user_name = display_name(&user, raw.pointer("/member/nick"));

    let agent_id = match agent_for(app, channel).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return tell_user(format!(
                "No agent answers in this channel. Create one with `pulse agents create --name ... --discord-channel {channel}`, or set PULSE_DISCORD_DEFAULT_AGENT."
            ));
        }
        Err(r) => return r,
    };
    let agent = match app.store.get_agent(&agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return tell_user(format!(
                "The agent {agent_id} set for this channel no longer exists."
            ));
        }
        Err(e) => return store_failure("reading the agent", &e),
    };

    let minted = match interaction_time(interaction_id, now) {
        Ok(t) => t,
        Err(why) => return bad_request(why.to_string()),
    };
    // A few seconds ahead at most (clock skew): the turn is dated no later than now.
    let issued_at = minted.min(now);
    let message = match data.kind {
        CommandType::ChatInput => slash(&data, raw, &user, issued_at),
        CommandType::Message => context_menu(&data, raw, &user),
        _ => {
            return tell_user(format!(
                "The command {} is not one Pulse answers; run `pulse discord register-commands`.",
                data.name
            ));
        }
    };
    let message = match message {
        Ok(m) => m,
        Err(why) => return bad_request(why),
    };

    let meta = SignalMeta {
        source: Some("discord".to_owned()),
        user_id: user.get("id").and_then(Value::as_str).map(str::to_owned),
        user_name: user_name.clone(),
        channel_id: Some(channel.to_owned()),
        message_id: None,
        thread: None,
        envelope: Some(message.envelope),
        interaction: Some(InteractionRef {
            token: token.to_owned(),
            issued_at,
        }),
        heartbeat_id: None,
    };
    let mut signal =
        match Signal::user_message(&agent.id, &agent.session, &message.text, meta, issued_at) {
            Ok(s) => s,
            Err(e) => return tell_user(format!("Pulse cannot take this message: {e}")),
        };
    signal.id = interaction_signal_id(interaction_id, minted);
    signal.content.extend(message.images);
    let signal_id = signal.id.clone();
    if let Err(e) = intake::submit(app.store.as_ref(), app.queue.as_ref(), signal).await {
        return store_failure("queueing the message", &e);
    }
    info!(agent_id = %agent.id, signal_id = %signal_id, command = %data.name, "Discord command queued");
    Json(json!({"type": 5})).into_response()
}

async fn agent_for(app: &Inbound, channel: &str) -> Result<Option<AgentId>, Response> {
    match app.store.agent_for_channel(channel).await {
        Ok(Some(a)) => Ok(Some(a)),
        Ok(None) => Ok(app.config.default_agent.clone()),
        Err(e) => Err(store_failure("finding the channel's agent", &e)),
    }
}

/// What a command brings: the text for the model, images, and the envelope.
struct Incoming {
    text: String,
    images: Vec<ContentBlock>,
    envelope: Value,
}

/// `/ask text:<...> [file:<attachment>]`.
fn slash(data: &CommandData, raw: &Value, user: &Value, at: Timestamp) -> Result<Incoming, String> {
    let mut text = String::new();
    let mut files = Vec::new();
    for o in &data.options {
        match &o.value {
            CommandOptionValue::String(s) if o.name == "text" => text = s.clone(),
            CommandOptionValue::Attachment(id) => {
                let a = raw
                    .pointer(&format!("/data/resolved/attachments/{id}"))
                    .cloned()
                    .ok_or_else(|| format!("attachment {id} is not among the resolved data"))?;
                files.push(a);
            }
            _ => {}
        }
    }
    if text.trim().is_empty() {
        text = describe(&files);
    }
    // A steering command reaches the conversation as its words (`/snooze 2h`).
    if data.name != crate::discord::ASK_COMMAND {
        let arg = data.options.iter().find_map(|o| match &o.value {
            CommandOptionValue::String(s) => Some(s.trim().to_owned()),
            _ => None,
        });
        text = format!("/{} {}", data.name, arg.unwrap_or_default())
            .trim_end()
            .to_owned();
    }
    let envelope = json!({
        "interaction": {"kind": "slash_command", "command": data.name},
        "type": null,
        "flags": 0,
        "created_at": at,
        "edited_at": null,
        "pinned": false,
        "tts": false,
        "author": person(user),
        "content": text,
        "attachments": files.iter().map(attachment).collect::<Vec<_>>(),
        "embeds": [],
        "stickers": [],
        "reference": null,
        "poll": null,
    });
    Ok(Incoming {
        images: files.iter().filter_map(image_block).collect(),
        text,
        envelope,
    })
}

/// The message context-menu command ("Ask <agent>") on any message.
fn context_menu(data: &CommandData, raw: &Value, user: &Value) -> Result<Incoming, String> {
    let target = data
        .target_id
        .ok_or("the context-menu command names no target message")?;
    let m = raw
        .pointer(&format!("/data/resolved/messages/{target}"))
        .ok_or_else(|| format!("message {target} is not among the resolved data"))?;
    let files = attachments(m);
    let author = m.get("author").cloned().unwrap_or(Value::Null);
    let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
    let body = if content.trim().is_empty() {
        describe(&files)
    } else {
        content.to_owned()
    };
    let text = format!(
        "About this message from {}:\n{body}",
        display_name(&author, None).unwrap_or_else(|| "someone".to_owned())
    );
    let mut envelope = message_envelope(m);
    envelope["interaction"] =
        json!({"kind": "message_command", "command": data.name, "invoked_by": person(user)});
    Ok(Incoming {
        images: files.iter().filter_map(image_block).collect(),
        text,
        envelope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snowflake_gives_its_time() {
        // Discord's documented example: 175928847299117063 → 2016-04-30 11:18:25.796 UTC.
        let t = snowflake_time("175928847299117063").unwrap();
        assert_eq!(t.as_millisecond(), 1_462_015_105_796);
        assert!(snowflake_time("not a number").is_none());
    }

    #[test]
    fn only_canonical_snowflakes_up_to_the_tolerance_ahead_are_interaction_ids() {
        let now = snowflake_time("175928847299117063").unwrap();
        assert_eq!(interaction_time("175928847299117063", now), Ok(now));
        for bad in [
            "",
            "abc",
            "-1",
            "+175928847299117063",
            "0175928847299117063",
            "1.5",
            "99999999999999999999",
        ] {
            assert!(interaction_time(bad, now).is_err(), "{bad:?}");
        }
        let ahead = |secs: i64| {
            let ms = now.as_millisecond() + secs * 1000 - DISCORD_EPOCH_MS;
            ((ms as u64) << 22).to_string()
        };
        assert!(interaction_time(&ahead(300), now).is_ok());
        assert!(interaction_time(&ahead(301), now).is_err());
    }
}
