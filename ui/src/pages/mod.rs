//! The pages, one module each.

pub(crate) mod agent;
pub(crate) mod agents;
pub(crate) mod hooks;
pub(crate) mod login;
pub(crate) mod mind;
pub(crate) mod trace;
pub(crate) mod webhooks;

use pulse_shared::domain::{Agent, AgentId};

use crate::{Dashboard, Problem};

/// The agent a URL names, or 404.
pub(crate) async fn agent_of(d: &Dashboard, id: &str) -> Result<Agent, Problem> {
    let not_found = || Problem::NotFound(format!("agent {id}"));
    let id = AgentId::parse(id).map_err(|_| not_found())?;
    d.0.store.get_agent(&id).await?.ok_or_else(not_found)
}
