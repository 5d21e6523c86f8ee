//! The live stream of an agent's page: server-sent events named `heartbeats` and `events`
//! when they change. It polls the store (one heartbeat read and one event read a second),
//! the same on SQLite and on DynamoDB, where nothing pushes changes.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use pulse_shared::domain::AgentId;

use super::Dashboard;
use crate::Problem;

/// How often the stream looks.
const EVERY: Duration = Duration::from_secs(1);

/// What the page last saw.
#[derive(Clone, Default, PartialEq)]
struct Seen {
    heartbeat: Option<(u64, String)>,
    event: Option<String>,
}

async fn look(d: &Dashboard, agent: &AgentId) -> Seen {
    let heartbeat =
        d.0.store
            .list_heartbeats(agent, 1)
            .await
            .ok()
            .and_then(|mut h| h.pop())
            .map(|h| (h.beat, h.status.as_str().to_owned()));
    let event =
        d.0.store
            .list_events(agent, 1)
            .await
            .ok()
            .and_then(|mut e| e.pop())
            .map(|e| e.id.to_string());
    Seen { heartbeat, event }
}

/// `GET /ui/agents/{id}/live`.
pub(crate) async fn stream(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let agent = super::pages::agent_of(&d, &id).await?.id;
    let first = look(&d, &agent).await;
    let events = futures::stream::unfold((d, agent, first), |(d, agent, seen)| async move {
        loop {
            tokio::time::sleep(EVERY).await;
            let now = look(&d, &agent).await;
            // One change a message: a new event is told on the next turn.
            let (name, seen) = if now.heartbeat != seen.heartbeat {
                let told = Seen {
                    heartbeat: now.heartbeat,
                    event: seen.event,
                };
                ("heartbeats", told)
            } else if now.event != seen.event {
                ("events", now)
            } else {
                continue;
            };
            let event = Event::default().event(name).data("changed");
            return Some((Ok(event), (d, agent, seen)));
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
