//! `POST /telegram/webhook`: the updates Telegram's Bot API pushes. Each carries the
//! secret token `pulse telegram set-webhook` registered (`X-Telegram-Bot-Api-Secret-Token`),
//! compared in constant time; an update without it is 401 and nothing is stored.
//!
//! A message (or an edit of one) from someone an agent lets in becomes a signal of that
//! agent, answered by the conversation worker where it came from. Its id is derived from
//! the chat and the message (an edit's, from its edit time too), so an update Telegram
//! sends again is the same signal and is answered once. A press of an approval's button
//! decides the approval, answered in the webhook's own reply (`answerCallbackQuery`), so
//! the receiver needs no bot token. Everything else is taken (200) and left: Telegram
//! sends an update again until it is taken.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::{Inbound, error_response, read_body, store_failure};
use crate::domain::{Agent, ChannelKind, DiscordListen, Signal, SignalId, SignalMeta};
use crate::engine::intake;

/// The header Telegram sends the secret token in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

fn taken(what: &'static str) -> Response {
    Json(json!({ "ok": true, "taken": what })).into_response()
}

/// Whether `given` is `expected`, in time that does not depend on where they differ.
fn same_secret(given: &[u8], expected: &str) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

pub(super) async fn update(State(app): State<Arc<Inbound>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match read_body(body, &parts.headers, super::MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(secret) = &app.config.telegram_secret else {
        return error_response(
            StatusCode::UNAUTHORIZED,
            "Telegram updates are not taken here: set TELEGRAM_WEBHOOK_SECRET, then register this address with `pulse telegram set-webhook`",
        );
    };
    let given = parts
        .headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same_secret(given, secret.expose()) {
        warn!("a Telegram update without the secret token refused");
        return error_response(
            StatusCode::UNAUTHORIZED,
            "the secret token is missing or wrong: register this address again with `pulse telegram set-webhook`",
        );
    }
    let update: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    let now = app.clock.now();
    if let Some(m) = update.get("message") {
        message(&app, m, false, now).await
    } else if let Some(m) = update.get("edited_message") {
        message(&app, m, true, now).await
    } else if let Some(q) = update.get("callback_query") {
        press(&app, q, now).await
    } else {
        taken("an update Pulse does not act on")
    }
}

/// An id as Telegram writes it (a number), as text.
fn id_of(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => n.as_i64().map(|i| i.to_string()),
        Value::String(s) if s.parse::<i64>().is_ok() => Some(s.clone()),
        _ => None,
    }
}

/// What arrived besides text, in words, so a voice note or a file is never dropped.
fn attachments(m: &Value) -> Vec<String> {
    let secs = |v: &Value| {
        v["duration"]
            .as_u64()
            .map(|d| format!(" of {d} s"))
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    if let Some(v) = m.get("voice") {
        out.push(format!("a voice note{}", secs(v)));
    }
    if let Some(v) = m.get("audio") {
        let title = v["title"]
            .as_str()
            .or(v["file_name"].as_str())
            .unwrap_or("audio");
        out.push(format!("an audio file \"{title}\"{}", secs(v)));
    }
    if let Some(v) = m.get("video").or(m.get("video_note")) {
        out.push(format!("a video{}", secs(v)));
    }
    if let Some(sizes) = m.get("photo").and_then(Value::as_array) {
        let largest = sizes.last().cloned().unwrap_or_default();
        out.push(format!(
            "a photo ({}×{}; the agent is told it arrived, not what it shows)",
            largest["width"], largest["height"]
        ));
    }
    if let Some(d) = m.get("document") {
        out.push(format!(
            "a file \"{}\" ({})",
            d["file_name"].as_str().unwrap_or("unnamed"),
            d["mime_type"].as_str().unwrap_or("of unknown type")
        ));
    }
    if let Some(s) = m.get("sticker") {
        out.push(format!("a sticker {}", s["emoji"].as_str().unwrap_or("")));
    }
    if m.get("location").is_some() {
        out.push("a location".to_owned());
    }
    if m.get("contact").is_some() {
        out.push("a contact".to_owned());
    }
    if m.get("poll").is_some() {
        out.push("a poll".to_owned());
    }
    out
}

/// The message's text for the model: its text or caption, a command's `@bot` taken
/// off (`/snooze@pulse_bot 2h` is `/snooze 2h`), what else arrived in words, an edit
/// said to be one ([`super::chat_text`]).
fn text_of(m: &Value, edited: bool) -> String {
    let mut text = m["text"]
        .as_str()
        .or(m["caption"].as_str())
        .unwrap_or("")
        .trim()
        .to_owned();
    if text.starts_with('/')
        && let Some((word, rest)) = text.split_once(char::is_whitespace).or(Some((&text, "")))
        && let Some((command, _bot)) = word.split_once('@')
    {
        text = format!("{command} {rest}").trim().to_owned();
    }
    let mut text = super::chat_text(text, &attachments(m));
    if edited {
        text = format!("(edited their message; it reads now:) {text}");
    }
    text
}

/// Whether a message in a group is for the bot: a mention of a bot (a bot's username
/// ends in "bot"), a command, or a reply to a bot's message.
fn addressed(m: &Value) -> bool {
    let text = m["text"].as_str().or(m["caption"].as_str()).unwrap_or("");
    let entities = m["entities"]
        .as_array()
        .or(m["caption_entities"].as_array())
        .cloned()
        .unwrap_or_default();
    let utf16: Vec<u16> = text.encode_utf16().collect();
    let mentions_a_bot = entities.iter().any(|e| match e["type"].as_str() {
        Some("bot_command") => true,
        Some("mention") => {
            let (o, l) = (
                e["offset"].as_u64().unwrap_or(0) as usize,
                e["length"].as_u64().unwrap_or(0) as usize,
            );
            utf16
                .get(o..o.saturating_add(l))
                .map(String::from_utf16_lossy)
                .is_some_and(|name| name.to_ascii_lowercase().ends_with("bot"))
        }
        _ => false,
    });
    mentions_a_bot || m.pointer("/reply_to_message/from/is_bot") == Some(&Value::Bool(true))
}

/// The agent a message is for: in a private chat, the one that lets its author in;
/// in a group, the one whose chat it is, when the message is addressed to the bot or
/// the agent listens to all. The oldest, if several would take it.
fn addressee(agents: &[Agent], m: &Value, author: &str, chat: &str) -> Option<Agent> {
    let private = m.pointer("/chat/type").and_then(Value::as_str) == Some("private");
    let mut candidates: Vec<&Agent> = agents
        .iter()
        .filter(|a| {
            if private {
                a.lets_in(ChannelKind::Telegram, author)
            } else {
                a.telegram.chat.as_deref() == Some(chat)
                    && (a.telegram.listen == DiscordListen::All || addressed(m))
            }
        })
        .collect();
    candidates.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    candidates.first().map(|a| (*a).clone())
}

async fn message(app: &Inbound, m: &Value, edited: bool, now: Timestamp) -> Response {
    let (Some(chat), Some(message_id)) = (
        m.pointer("/chat/id").and_then(id_of),
        m.get("message_id").and_then(id_of),
    ) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "the message has no chat id or message id",
        );
    };
    let from = m.get("from").cloned().unwrap_or_default();
    if from["is_bot"].as_bool() == Some(true) {
        return taken("a bot's message");
    }
    let Some(author) = from.get("id").and_then(id_of) else {
        return taken("a message with no author (a channel post)");
    };
    let agents = match app.store.list_agents().await {
        Ok(a) => a,
        Err(e) => return store_failure("finding the message's agent", &e),
    };
    let Some(agent) = addressee(&agents, m, &author, &chat) else {
        info!(
            chat,
            user_id = author,
            "a Telegram message no agent takes (a stranger, or not addressed to the bot): not answered"
        );
        return taken("a message no agent takes");
    };
    let sent_at = m["date"].as_i64().unwrap_or(now.as_second());
    let edit_at = m["edit_date"].as_i64();
    let minted = Timestamp::from_second(edit_at.unwrap_or(sent_at)).unwrap_or(now);
    let key: Vec<String> = match edit_at.filter(|_| edited) {
        Some(at) => vec![
            "telegram-edit".into(),
            chat.clone(),
            message_id.clone(),
            at.to_string(),
        ],
        None => vec!["telegram".into(), chat.clone(), message_id.clone()],
    };
    let key: Vec<&str> = key.iter().map(String::as_str).collect();
    let thread = m["is_topic_message"]
        .as_bool()
        .filter(|t| *t)
        .and_then(|_| m.get("message_thread_id"))
        .and_then(id_of);
    let name = [from["first_name"].as_str(), from["last_name"].as_str()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    let meta = SignalMeta {
        source: Some(ChannelKind::Telegram.as_str().to_owned()),
        user_id: Some(author.clone()),
        user_name: Some(name)
            .filter(|n| !n.is_empty())
            .or(from["username"].as_str().map(str::to_owned)),
        channel_id: Some(chat.clone()),
        message_id: Some(message_id),
        thread,
        envelope: Some(m.clone()),
        interaction: None,
        heartbeat_id: None,
    };
    let mut signal =
        match Signal::user_message(&agent.id, &agent.session, &text_of(m, edited), meta, now) {
            Ok(s) => s,
            Err(e) => {
                info!(error = %e, "a Telegram message Pulse cannot take: not answered");
                return taken("a message Pulse cannot take");
            }
        };
    signal.id = SignalId::derived(minted.as_millisecond().max(0) as u64, &key);
    let signal_id = signal.id.clone();
    if let Err(e) = intake::submit(app.store.as_ref(), app.queue.as_ref(), signal).await {
        return store_failure("queueing the message", &e);
    }
    info!(agent_id = %agent.id, signal_id = %signal_id, "Telegram message queued");
    taken("a message, queued")
}

/// The webhook's reply that answers a button press with `text` (shown to the person
/// who pressed it).
fn answer_press(query_id: &str, text: &str) -> Response {
    Json(json!({
        "method": "answerCallbackQuery",
        "callback_query_id": query_id,
        "text": text.chars().take(200).collect::<String>(),
        "show_alert": true,
    }))
    .into_response()
}

/// A press of an approval's Approve or Deny button: decided when the person is one the
/// agent lets in; the first decision stands.
async fn press(app: &Inbound, q: &Value, now: Timestamp) -> Response {
    let Some(query_id) = q["id"].as_str() else {
        return error_response(StatusCode::BAD_REQUEST, "the callback query has no id");
    };
    let Some((approve, agent_id, id)) = q["data"].as_str().and_then(crate::domain::parse_button)
    else {
        return answer_press(query_id, "This button is not one Pulse knows.");
    };
    let user = q.pointer("/from/id").and_then(id_of).unwrap_or_default();
    let agent = match app.store.get_agent(&agent_id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return answer_press(query_id, &format!("The agent {agent_id} no longer exists."));
        }
        Err(e) => return store_failure("reading the agent", &e),
    };
    if !agent.lets_in(ChannelKind::Telegram, &user) {
        info!(approval_id = %id, user, "an approval button pressed on Telegram by someone the agent does not let in: refused");
        return answer_press(
            query_id,
            &format!(
                "Only {}'s owner can decide this (the Telegram users it lets in).",
                agent.name
            ),
        );
    }
    let decision = crate::domain::Decision {
        approve,
        by: format!("telegram {user}"),
        reason: None,
        always: false,
    };
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
            "Approved: {} makes the call and tells you what came of it.",
            agent.name
        ),
        Ok(_) => "Denied: the call is not made.".to_owned(),
        Err(crate::engine::approvals::DecideError::Decided(first)) => format!(
            "This was {} already; the first decision stands.",
            first.who_decided()
        ),
        Err(crate::engine::approvals::DecideError::NotFound(_)) => {
            format!("There is no approval {id} of {} any more.", agent.name)
        }
        Err(crate::engine::approvals::DecideError::Store(e)) => {
            return store_failure("deciding the approval", &e);
        }
    };
    answer_press(query_id, &said)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_for_the_bot_loses_its_name_and_an_attachment_is_told() {
        let m = json!({"text": "/snooze@pulse_bot 2h"});
        assert_eq!(text_of(&m, false), "/snooze 2h");
        let m = json!({"voice": {"duration": 4, "file_id": "x"}});
        assert_eq!(text_of(&m, false), "(no text; a voice note of 4 s)");
        let m = json!({"caption": "look", "photo": [{"width": 90, "height": 60}, {"width": 1280, "height": 720}]});
        assert!(
            text_of(&m, true)
                .starts_with("(edited their message; it reads now:) look\n(with a photo (1280×720")
        );
    }

    #[test]
    fn in_a_group_a_message_is_for_the_bot_when_it_names_a_bot_or_answers_one() {
        let mention = |name: &str| json!({"text": format!("hey 🙂 {name} look"), "entities": [{"type": "mention", "offset": 7, "length": name.encode_utf16().count()}]});
        assert!(addressed(&mention("@pulse_bot")));
        assert!(addressed(&mention("@PulseBot")));
        assert!(!addressed(&mention("@ana")));
        assert!(addressed(
            &json!({"text": "/wake", "entities": [{"type": "bot_command", "offset": 0, "length": 5}]})
        ));
        assert!(addressed(
            &json!({"text": "yes", "reply_to_message": {"from": {"is_bot": true}}})
        ));
        assert!(!addressed(
            &json!({"text": "yes", "reply_to_message": {"from": {"is_bot": false}}})
        ));
    }

    #[test]
    fn the_secret_must_be_the_same_bytes() {
        assert!(same_secret(b"s3cret-token", "s3cret-token"));
        assert!(!same_secret(b"s3cret-toke", "s3cret-token"));
        assert!(!same_secret(b"", "s3cret-token"));
    }
}
