//! An agent's Chat tab: its conversation — the user's messages, its replies, and the
//! heartbeat thoughts a reply came from, marked as such — and a box to talk to it.
//!
//! A message sent here goes through the same session queue as one from Discord or the
//! messages API (one FIFO per session: batched with what else is pending, interrupting a
//! heartbeat, superseding a reply still being written), from `dashboard`; its reply is
//! read here, never posted to Discord. The page shows the message at once with
//! "thinking…" until the turn that answers it is written; the live stream (a `chat`
//! event when the newest turn or the waiting turn changes) swaps the conversation in
//! place. While the model does not answer, the messages its turn holds are shown marked
//! waiting, with why and when it is tried next. A reply the person reacted to, or
//! replied to, on Discord says so (`seen · reaction 👍 · 3m ago`); opening this page
//! marks nothing.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::Redirect;
use maud::{Markup, html};
use pulse_shared::domain::{
    ConversationMessage, Role, Signal, SignalId, SignalMeta, Turn, WaitingTurn,
};
use pulse_shared::engine::intake;
use serde::Deserialize;

use super::agent_of;
use crate::layout::{Tab, agent_page, ago, csrf, empty, live_part, short, trace_link};
use crate::{Dashboard, Problem};

/// Messages shown.
const ROWS: usize = 100;
/// Tool calls named under a reply; the others are counted.
const USED_SHOWN: usize = 8;
/// The most characters of one tool call shown (its name and input).
const USED_CHARS: usize = 200;

/// `?sent=<signal id>&said=<its text>`: a message just sent, shown until answered.
#[derive(Deserialize, Default)]
pub(crate) struct ChatView {
    #[serde(default)]
    partial: Option<u8>,
    #[serde(default)]
    sent: Option<String>,
    #[serde(default)]
    said: Option<String>,
    /// An older page: the messages before this message id.
    #[serde(default)]
    before: Option<String>,
}

/// `GET /ui/agents/{id}/conversation`: the Chat tab's old address.
pub(crate) async fn old_address(Path(id): Path<String>) -> Result<Redirect, Problem> {
    let id = pulse_shared::domain::AgentId::parse(&id)
        .map_err(|_| Problem::NotFound(format!("agent {}", id.escape_debug())))?;
    Ok(Redirect::permanent(&format!("/ui/agents/{id}/chat")))
}

/// `GET /ui/agents/{id}/chat`.
pub(crate) async fn show(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(view): Query<ChatView>,
) -> Result<Markup, Problem> {
    let agent = agent_of(&d, &id).await?;
    let now = d.0.clock.now();
    // The newest page (with the messages a waiting turn holds), or an older one.
    let before = view.before.as_deref().filter(|b| !b.is_empty());
    let mut messages = match before {
        Some(b) => d.0.store.messages_before(&agent.id, b, ROWS).await?,
        None => pulse_shared::engine::history(d.0.store.as_ref(), &agent.id, ROWS).await?,
    };
    messages.reverse();
    let older = (messages.len() == ROWS).then(|| messages[0].id.clone());
    let turns = d.0.store.list_turns(&agent.id, ROWS).await?;
    let held = match before {
        None => d.0.store.get_waiting(&agent.id, &agent.session).await?,
        Some(_) => None,
    };
    // A message sent from this page and not answered yet is shown, thinking, until the
    // turn that holds it waits on the model (then it is among the messages).
    let waiting = match view.sent.as_deref().map(SignalId::parse) {
        Some(Ok(sent)) => {
            !held
                .as_ref()
                .is_some_and(|w| w.signals.iter().any(|s| s.id == sent))
                && d.0
                    .store
                    .answered(&agent.id, std::slice::from_ref(&sent))
                    .await?
                    .is_empty()
        }
        _ => false,
    };
    let mut url = format!("/ui/agents/{}/chat?partial=1", agent.id);
    if let Some(b) = before {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("before", b)
            .finish();
        url.push('&');
        url.push_str(&q);
    }
    if waiting {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("sent", view.sent.as_deref().unwrap_or_default())
            .append_pair("said", view.said.as_deref().unwrap_or_default())
            .finish();
        url.push('&');
        url.push_str(&q);
    }
    let part = live_part(
        "chat",
        &url,
        "chat",
        html! {
            div.chat {
                @if let Some(o) = &older {
                    p.muted.pages { a href={"/ui/agents/" (agent.id) "/chat?before=" (o)} { "Older messages" } }
                }
                @if before.is_some() {
                    p.muted.pages { "Older messages, up to " (ROWS) " a page. " a href={"/ui/agents/" (agent.id) "/chat"} { "Back to the newest" } }
                }
                @if messages.is_empty() && !waiting {
                    (empty("No conversation yet: say something below, or from a terminal with", &format!("pulse say --agent {} \"hello\"", agent.id)))
                }
                @for m in &messages { (message(m, &turns, now, d.0.trace_url.as_deref())) }
                @if let Some(w) = &held { (waiting_on_the_model(w, now)) }
                @if waiting {
                    div.card.said.user {
                        p.muted { strong { "you" } " · just now" }
                        p { (short(view.said.as_deref().unwrap_or_default(), 2_000)) }
                    }
                    div.card.thinking { p.muted { "thinking…" } }
                }
            }
        },
    );
    if view.partial.is_some() {
        return Ok(part);
    }
    let form = html! {
        form.chat-box method="post" action={"/ui/agents/" (agent.id) "/chat"} {
            (csrf(&d))
            label for="text" { "Message" }
            textarea id="text" name="text" rows="3" maxlength="16000" required placeholder="Say something — or /heartbeat, /snooze 2h, /pause, /resume, /quiet 22:00-07:00" {}
            button type="submit" { "Send" }
        }
    };
    Ok(agent_page(
        &agent,
        Tab::Conversation,
        html! { (part) (form) },
    ))
}

/// One message, with who said it; a reply shows the tools its turn used.
fn message(
    m: &ConversationMessage,
    turns: &[Turn],
    now: jiff::Timestamp,
    trace_url: Option<&str>,
) -> Markup {
    let (class, who) = match (m.role, m.source.as_str()) {
        (Role::User, _) => (
            "user",
            format!(
                "{}{}",
                m.author.as_deref().unwrap_or("user"),
                match m.source.as_str() {
                    "discord" | "dashboard" | "api" | "cli" => format!(" · {}", m.source),
                    _ => String::new(),
                }
            ),
        ),
        (_, "heartbeat") => (
            "thought",
            "heartbeat thought (what led to the reply below)".to_owned(),
        ),
        _ => (
            "reply",
            m.agent
                .as_deref()
                .map_or("agent".to_owned(), |a| format!("{a} reply")),
        ),
    };
    let turn = turns.iter().find(|t| t.id == m.turn_id);
    let used: Vec<&serde_json::Value> = match (m.role, turn) {
        (Role::Assistant, Some(t)) if m.source != "heartbeat" => {
            t.steps.iter().filter(|s| s["kind"] == "tool").collect()
        }
        _ => Vec::new(),
    };
    // A turn may have made many calls: the first few are named, the rest counted.
    let more = used.len().saturating_sub(USED_SHOWN);
    let used = used.iter().take(USED_SHOWN).map(|s| {
        short(
            &format!("{} {}", s["name"].as_str().unwrap_or("?"), s["input"]),
            USED_CHARS,
        )
    });
    let superseded = m.role == Role::User && turn.is_some_and(Turn::superseded);
    let reply = turn.filter(|_| m.role == Role::Assistant && m.source != "heartbeat");
    let undelivered = reply.and_then(undelivered);
    // The person's sign on Discord that they saw the reply (the dashboard's own view is
    // not one).
    let seen = reply.and_then(|t| t.seen.as_ref());
    // A link to the turn's trace where the tracing UI is known.
    let traced = reply.and_then(|t| t.trace_id.as_deref()).zip(trace_url);
    html! {
        div class={"card said " (class) @if m.waiting { " waiting" }} {
            p.muted { strong { (who) } " · " (ago(now, Some(m.created_at))) }
            p { (m.content) }
            @if superseded { p.muted { "answered with the next message" } }
            @if m.waiting { p.muted { "waiting on the model" } }
            @if let Some(u) = undelivered { p.muted.undelivered { (u) } }
            @if let Some(s) = seen { p.muted.seen { "seen · " (s.by) " · " (ago(now, Some(s.at))) } }
            @for u in used { p.muted { "used " code { (u) } } }
            @if let Some((id, url)) = traced { p.muted { (trace_link(Some(url), id)) } }
            @if more > 0 {
                p.muted { "and " (more) " more tool " (if more == 1 { "call" } else { "calls" }) " in turn " code { (m.turn_id) } }
            }
        }
    }
}

/// What a reply's delivery came to, when it did not reach its channel: not yet (tried
/// again later), or never (given up on, with why).
fn undelivered(t: &Turn) -> Option<String> {
    use pulse_shared::domain::{ReplyTarget, TurnStatus};
    if t.target == ReplyTarget::None || t.delivered as usize >= t.parts.len() {
        return None;
    }
    match t.status {
        TurnStatus::Delivering => {
            Some("not delivered to Discord yet: it is tried again shortly".to_owned())
        }
        TurnStatus::Failed => Some(format!(
            "not delivered to Discord: {}",
            short(t.error.as_deref().unwrap_or("given up on"), 200)
        )),
        TurnStatus::Done => None,
    }
}

/// A turn that waits on the model: why, how often it was tried, and when next.
fn waiting_on_the_model(w: &WaitingTurn, now: jiff::Timestamp) -> Markup {
    html! {
        div.card.thinking.waiting {
            p {
                strong { "Waiting on the model" }
                @if w.attempts == 1 {
                    " · tried once " (ago(now, Some(w.since)))
                } @else {
                    " · tried " (w.attempts) " times, first " (ago(now, Some(w.since)))
                }
                " · next try " (ago(now, Some(w.next_at)))
            }
            p.muted { (short(&w.reason, 300)) }
            @if w.told { p.muted { "The person was told the answer is delayed." } }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct Said {
    #[serde(default)]
    text: String,
}

/// `POST /ui/agents/{id}/chat`: queues the message, as the dashboard's user.
pub(crate) async fn send(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<Said>,
) -> Result<Redirect, Problem> {
    let agent = agent_of(&d, &id).await?;
    let meta = SignalMeta {
        source: Some("dashboard".into()),
        user_name: Some("you".into()),
        ..SignalMeta::default()
    };
    let signal = Signal::user_message(&agent.id, &agent.session, &f.text, meta, d.0.clock.now())
        .map_err(|e| Problem::Invalid(format!("{}; write something to send", e.message)))?;
    intake::submit(d.0.store.as_ref(), d.0.queue.as_ref(), signal.clone()).await?;
    let q = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("sent", signal.id.as_str())
        .append_pair("said", &short(&f.text, 500))
        .finish();
    Ok(Redirect::to(&format!("/ui/agents/{}/chat?{q}", agent.id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reply_names_a_few_of_its_tool_calls_and_counts_the_rest() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let turn_id = "tn_01jq0000000000000000000000";
        let steps: Vec<serde_json::Value> = (0..1_000)
            .map(|i| json!({"kind": "tool", "name": "remember", "input": {"text": format!("{i} {}", "x".repeat(5_000))}}))
            .collect();
        let turn: Turn = serde_json::from_value(json!({
            "id": turn_id, "agent_id": "ag_01jq0000000000000000000000", "session": "main",
            "signals": [], "status": "DONE", "parts": ["ok"], "delivered": 1,
            "target": {"type": "none"}, "provider": "fake", "model": "m",
            "usage": {"input_tokens": 1, "output_tokens": 1}, "steps": steps,
            "created_at": now,
        }))
        .unwrap();
        let m: ConversationMessage = serde_json::from_value(json!({
            "id": "m1", "agent_id": "ag_01jq0000000000000000000000", "turn_id": turn_id,
            "role": "assistant", "source": "discord", "content": "kept them", "created_at": now,
        }))
        .unwrap();
        let html = message(&m, &[turn], now, None).into_string();
        assert_eq!(html.matches("used ").count(), USED_SHOWN);
        assert!(html.contains("and 992 more tool calls in turn"), "{html}");
        assert!(html.len() < 4_000, "{} bytes", html.len());
    }

    #[test]
    fn a_reply_discord_did_not_take_says_so_and_why() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let turn_id = "tn_01jq0000000000000000000000";
        let turn = |status: &str, delivered: u32, error: Option<&str>| -> Turn {
            serde_json::from_value(json!({
                "id": turn_id, "agent_id": "ag_01jq0000000000000000000000", "session": "main",
                "signals": [], "status": status, "parts": ["ok"], "delivered": delivered,
                "target": {"type": "channel", "channel_id": "1001"}, "provider": "fake",
                "model": "m", "usage": {"input_tokens": 1, "output_tokens": 1},
                "error": error, "created_at": now,
            }))
            .unwrap()
        };
        let m: ConversationMessage = serde_json::from_value(json!({
            "id": "m1", "agent_id": "ag_01jq0000000000000000000000", "turn_id": turn_id,
            "role": "assistant", "source": "conversation", "content": "ok", "created_at": now,
        }))
        .unwrap();
        let shown = |t: Turn| message(&m, &[t], now, None).into_string();
        assert!(shown(turn("DELIVERING", 0, None)).contains("not delivered to Discord yet"));
        let dead = shown(turn(
            "FAILED",
            0,
            Some("undeliverable after 8 tries: Discord did not take part 1: 403"),
        ));
        assert!(
            dead.contains("not delivered to Discord: undeliverable after 8 tries"),
            "{dead}"
        );
        assert!(!shown(turn("DONE", 1, None)).contains("not delivered"));
    }

    #[test]
    fn a_reply_links_to_its_trace_where_the_tracing_ui_is_known() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let turn_id = "tn_01jq0000000000000000000000";
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let turn: Turn = serde_json::from_value(json!({
            "id": turn_id, "agent_id": "ag_01jq0000000000000000000000", "session": "main",
            "signals": [], "status": "DONE", "parts": ["ok"], "delivered": 1,
            "target": {"type": "none"}, "provider": "fake", "model": "m",
            "usage": {"input_tokens": 1, "output_tokens": 1}, "created_at": now,
            "trace_id": trace,
        }))
        .unwrap();
        let said = |role: &str| -> ConversationMessage {
            serde_json::from_value(json!({
                "id": "m1", "agent_id": "ag_01jq0000000000000000000000", "turn_id": turn_id,
                "role": role, "source": "dashboard", "content": "ok", "created_at": now,
            }))
            .unwrap()
        };
        let jaeger = Some("http://localhost:16686/trace/{trace_id}");
        let html =
            message(&said("assistant"), std::slice::from_ref(&turn), now, jaeger).into_string();
        assert!(
            html.contains(&format!(r#"href="http://localhost:16686/trace/{trace}""#)),
            "{html}"
        );
        let unlinked = message(&said("assistant"), std::slice::from_ref(&turn), now, None);
        assert!(!unlinked.into_string().contains(trace), "no UI to link to");
        let asked = message(&said("user"), &[turn], now, jaeger).into_string();
        assert!(
            !asked.contains(trace),
            "the reply carries the link: {asked}"
        );
    }

    #[test]
    fn a_reply_the_person_saw_says_how_and_when() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let turn_id = "tn_01jq0000000000000000000000";
        let turn = |seen: serde_json::Value| -> Turn {
            serde_json::from_value(json!({
                "id": turn_id, "agent_id": "ag_01jq0000000000000000000000", "session": "main",
                "signals": [], "status": "DONE", "parts": ["ok"], "delivered": 1,
                "target": {"type": "channel", "channel_id": "1001"}, "provider": "fake",
                "model": "m", "usage": {"input_tokens": 1, "output_tokens": 1},
                "discord_message_ids": ["1002"], "created_at": now, "seen": seen,
            }))
            .unwrap()
        };
        let said = |role: &str| -> ConversationMessage {
            serde_json::from_value(json!({
                "id": "m1", "agent_id": "ag_01jq0000000000000000000000", "turn_id": turn_id,
                "role": role, "source": "conversation", "content": "ok", "created_at": now,
            }))
            .unwrap()
        };
        let three_minutes_ago = now - jiff::SignedDuration::from_mins(3);
        let seen = turn(json!({"at": three_minutes_ago, "by": "reaction 👍"}));
        let html = message(&said("assistant"), std::slice::from_ref(&seen), now, None);
        let html = html.into_string();
        assert!(html.contains("seen · reaction 👍 · "), "{html}");
        assert!(html.contains("3m ago"), "{html}");
        let asked = message(&said("user"), &[seen], now, None).into_string();
        assert!(
            !asked.contains("seen ·"),
            "the reply carries the mark: {asked}"
        );
        let unseen = message(&said("assistant"), &[turn(json!(null))], now, None);
        assert!(!unseen.into_string().contains("seen ·"));
    }
}
