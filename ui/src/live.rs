//! The live stream of an agent's page: server-sent events named `heartbeats`, `events`,
//! `chat` (the newest conversation turn, or the turn waiting on the model) and (on the
//! Hooks tab) `deliveries` when they change. It polls the store once a second — one
//! heartbeat read, one event read, one turn read and one waiting-turn read, plus the hooks
//! and each hook's newest delivery when the page shows them —
//! the same on SQLite and on DynamoDB, where nothing pushes changes.
//!
//! A stream opens after its page was drawn (and again after each lifetime), so what
//! changed in between would be missed if the stream began from what it first saw: it
//! begins from nothing instead, telling at once every kind that has anything, and the
//! page fetches those parts once more. One extra fetch per part and connection is the
//! price of never leaving a reply behind "thinking…".

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use pulse_shared::domain::{AgentId, SessionId};
use pulse_shared::http::StreamSlot;
use serde::Deserialize;

use super::Dashboard;
use crate::Problem;

/// How often the stream looks.
const EVERY: Duration = Duration::from_secs(1);

/// `?deliveries=1`: the page shows hook deliveries, so watch them too.
#[derive(Deserialize, Default)]
pub(crate) struct Watch {
    #[serde(default)]
    deliveries: Option<u8>,
}

/// What the page last saw.
#[derive(Clone, Default, PartialEq)]
struct Seen {
    heartbeat: Option<(u64, String)>,
    event: Option<String>,
    /// The newest turn: its id, and its status with whether the person saw it (the Chat
    /// tab).
    turn: Option<(String, String)>,
    /// The session's turn waiting on the model: its tries and messages (the Chat tab).
    waiting: Option<(u32, usize)>,
    /// Each hook's newest delivery: its id, status and attempts.
    deliveries: Vec<(String, String, u32)>,
}

impl Seen {
    /// The kinds that differ from `before`, in the order the page is told.
    fn changed(&self, before: &Seen) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        if self.heartbeat != before.heartbeat {
            kinds.push("heartbeats");
        }
        if self.event != before.event {
            kinds.push("events");
        }
        if self.turn != before.turn || self.waiting != before.waiting {
            kinds.push("chat");
        }
        if self.deliveries != before.deliveries {
            kinds.push("deliveries");
        }
        kinds
    }
}

async fn look(d: &Dashboard, agent: &AgentId, session: &SessionId, deliveries: bool) -> Seen {
    let store = &d.0.store;
    let waiting = store
        .get_waiting(agent, session)
        .await
        .ok()
        .flatten()
        .map(|w| (w.attempts, w.signals.len()));
    let heartbeat = store
        .list_heartbeats(agent, 1)
        .await
        .ok()
        .and_then(|mut h| h.pop())
        .map(|h| (h.beat, h.status.as_str().to_owned()));
    let event = store
        .list_events(agent, 1)
        .await
        .ok()
        .and_then(|mut e| e.pop())
        .map(|e| e.id.to_string());
    let turn = store
        .list_turns(agent, 1)
        .await
        .ok()
        .and_then(|mut t| t.pop())
        .map(|t| {
            let seen = if t.seen.is_some() { " seen" } else { "" };
            (t.id.to_string(), format!("{:?}{seen}", t.status))
        });
    let mut newest = Vec::new();
    if deliveries {
        for hook in store.list_hooks(agent).await.unwrap_or_default() {
            if let Some(del) = store
                .list_deliveries(&hook.id, 1)
                .await
                .ok()
                .and_then(|mut d| d.pop())
            {
                newest.push((
                    del.id.to_string(),
                    del.status.as_str().to_owned(),
                    del.attempts,
                ));
            }
        }
    }
    Seen {
        heartbeat,
        turn,
        waiting,
        event,
        deliveries: newest,
    }
}

/// `GET /ui/agents/{id}/live[?deliveries=1]`. Under `pulse serve` it takes a place in
/// the listener's budget of streams (503 when it is spent), and ends after the stream
/// lifetime; the page's event source opens another.
pub(crate) async fn stream(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(watch): Query<Watch>,
    slot: Option<Extension<StreamSlot>>,
) -> Result<Response, Problem> {
    let agent = super::pages::agent_of(&d, &id).await?;
    let session = agent.session;
    let agent = agent.id;
    let place = match slot.map(|Extension(s)| s.open()).transpose() {
        Ok(place) => place,
        Err(full) => return Ok(full.into_response()),
    };
    let deliveries = watch.deliveries.is_some();
    let first = look(&d, &agent, &session, deliveries).await;
    let told = VecDeque::from(first.changed(&Seen::default()));
    let state = (d, agent, session, first, told);
    let events = futures::stream::unfold(
        state,
        move |(d, agent, session, mut seen, mut told)| async move {
            loop {
                if let Some(kind) = told.pop_front() {
                    let event = Event::default().event(kind).data("changed");
                    return Some((Ok::<_, Infallible>(event), (d, agent, session, seen, told)));
                }
                tokio::time::sleep(EVERY).await;
                let now = look(&d, &agent, &session, deliveries).await;
                told.extend(now.changed(&seen));
                seen = now;
            }
        },
    );
    // The place is held as long as the stream runs, and given back when it ends.
    let lifetime = place.as_ref().map(|p| p.lifetime);
    let ends = async move {
        match lifetime {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let events = events.take_until(ends).map(move |e| {
        let _held = &place;
        e
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn every_changed_kind_is_told_in_order() {
        let before = Seen::default();
        let after = Seen {
            heartbeat: Some((1, "COMPLETED".into())),
            event: None,
            turn: Some(("tn_1".into(), "Done".into())),
            waiting: None,
            deliveries: vec![("d1".into(), "SUCCEEDED".into(), 1)],
        };
        assert_eq!(after.changed(&before), ["heartbeats", "chat", "deliveries"]);
        assert!(after.changed(&after).is_empty());
        let retried = Seen {
            deliveries: vec![("d1".into(), "SUCCEEDED".into(), 2)],
            ..after.clone()
        };
        assert_eq!(retried.changed(&after), ["deliveries"]);
        // A turn that starts waiting on the model, or is tried again, changes the chat.
        let waits = Seen {
            waiting: Some((1, 1)),
            ..after.clone()
        };
        assert_eq!(waits.changed(&after), ["chat"]);
        let again = Seen {
            waiting: Some((2, 1)),
            ..waits.clone()
        };
        assert_eq!(again.changed(&waits), ["chat"]);
    }
}
