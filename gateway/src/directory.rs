//! Which agent a direct message is for: the agent whose allowed users
//! (`--discord-users`) include its author.
//!
//! The agents are read in full (one list, fine for the hundreds of agents one bot
//! serves) and kept for [`FRESH_FOR`]; a user nobody lets in reads them again, at most
//! every [`RECHECK_AFTER`], so an agent created a moment ago answers its user's first
//! message, while a stranger writing in a loop costs one read every few seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_shared::domain::Agent;
use pulse_shared::error::StoreError;
use pulse_shared::ports::Store;
use tokio::sync::Mutex;

/// How long a read of the agents is used as is.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// The least time between two reads on behalf of unknown users.
const RECHECK_AFTER: Duration = Duration::from_secs(2);

/// The agents, by who may talk to them directly.
pub struct Directory {
    store: Arc<dyn Store>,
    read: Mutex<Option<(Instant, Vec<Agent>)>>,
}

impl Directory {
    /// A directory over `store`'s agents, read when first asked.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            read: Mutex::new(None),
        }
    }

    /// The agent that lets `user` talk to it directly (the oldest, if several do).
    pub async fn agent_for_user(&self, user: &str) -> Result<Option<Agent>, StoreError> {
        let mut read = self.read.lock().await;
        let age = read.as_ref().map(|(at, _)| at.elapsed());
        if age.is_none_or(|a| a >= FRESH_FOR) {
            *read = Some((Instant::now(), self.load().await?));
        }
        if let Some(a) = find(read.as_ref(), user) {
            return Ok(Some(a));
        }
        if age.is_some_and(|a| a >= RECHECK_AFTER && a < FRESH_FOR) {
            *read = Some((Instant::now(), self.load().await?));
            return Ok(find(read.as_ref(), user));
        }
        Ok(None)
    }

    async fn load(&self) -> Result<Vec<Agent>, StoreError> {
        let mut agents = self.store.list_agents().await?;
        agents.retain(|a| !a.discord.users.is_empty());
        agents.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(agents)
    }
}

fn find(read: Option<&(Instant, Vec<Agent>)>, user: &str) -> Option<Agent> {
    read.and_then(|(_, agents)| agents.iter().find(|a| a.discord.allows(user)).cloned())
}
