//! The pages, one module each.

pub(crate) mod agent;
pub(crate) mod agents;
pub(crate) mod approvals;
pub(crate) mod chat;
pub(crate) mod hooks;
pub(crate) mod login;
pub(crate) mod mind;
pub(crate) mod trace;
pub(crate) mod webhooks;

use pulse_shared::domain::{Agent, AgentId};

use crate::{Dashboard, Problem};

/// Any `/ui/…` path no page answers: the dashboard's own 404 page, with the way back —
/// to the agents, and, for a path under an agent that exists, to each of its tabs.
pub(crate) async fn no_page(
    axum::extract::State(d): axum::extract::State<Dashboard>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let path = uri.path();
    let agent = match path
        .strip_prefix("/ui/agents/")
        .and_then(|rest| rest.split('/').next())
    {
        Some(id) => agent_of(&d, id).await.ok(),
        None => None,
    };
    let body = crate::layout::page(
        "Not found",
        None,
        maud::html! {
            h1 { "No such page" }
            p.error { "Nothing is at " code { (path) } "." }
            @if let Some(a) = &agent {
                p { "Agent " (a.name) "'s pages:" }
                ul { @for (tab, title) in crate::layout::Tab::all() {
                    li { a href={"/ui/agents/" (a.id) "/" (tab)} { (title) } }
                } }
            }
            p { a href="/ui/" { "Back to the agents" } }
        },
    );
    (axum::http::StatusCode::NOT_FOUND, body).into_response()
}

/// The agent a URL names, or 404.
pub(crate) async fn agent_of(d: &Dashboard, id: &str) -> Result<Agent, Problem> {
    let not_found = || Problem::NotFound(format!("agent {id}"));
    let id = AgentId::parse(id).map_err(|_| not_found())?;
    d.0.store.get_agent(&id).await?.ok_or_else(not_found)
}
