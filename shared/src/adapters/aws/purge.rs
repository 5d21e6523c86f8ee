//! Deleting an agent and everything that is its own: paginated reads of its partition
//! and of the items that point at it, then batched deletes.

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, HookId, Subscription};
use crate::error::StoreError;
use crate::ports::{AgentStore, Footprint};

/// The keys to delete, in the order they go.
#[derive(Default)]
struct Doomed {
    /// What makes the agent unreachable: its channel binding, webhooks, hooks and
    /// subscriptions, its directory entry and its record.
    first: Vec<Item>,
    /// The rest of its partition.
    rest: Vec<Item>,
}

impl DynamoStore {
    pub(super) async fn purge(&self, id: &AgentId, apply: bool) -> Result<Footprint, StoreError> {
        let op = "delete agent";
        let pk = agent_pk(id);
        let mut f = Footprint::default();
        let mut doomed = Doomed::default();
        let mut hooks = Vec::new();
        let mut other = 0;
        for k in self.partition_keys(op, &pk).await? {
            let sk = k
                .get("sk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            let count = match sk.split_once('#').map_or(sk.as_str(), |(kind, _)| kind) {
                "EV~" => &mut other,
                "EV" => &mut f.events,
                "HB" => &mut f.heartbeats,
                "AC" => &mut f.actions,
                "TN" | "MS" | "SG" => &mut f.conversation,
                "ME" => &mut f.memories,
                "SP" => &mut f.usage,
                "SC" => &mut f.schedules,
                "HR" => {
                    // Deleted with its hook.
                    if let Some(h) = sk.strip_prefix("HR#").and_then(|h| HookId::parse(h).ok()) {
                        hooks.push(h);
                    }
                    continue;
                }
                _ => &mut other,
            };
            *count += 1;
            if sk == AGENT_SK {
                f.agent = true;
            } else {
                doomed.rest.push(k);
            }
        }
        if let Some(agent) = self.get_agent(id).await?
            && let Some(channel) = agent.discord_channel
            && self.agent_for_channel(&channel).await?.as_ref() == Some(id)
        {
            doomed.first.push(key(format!("CH#{channel}"), "CH"));
            f.channel = Some(channel);
        }
        for webhook in self.webhooks_of(id).await? {
            let (keys, records) = self.webhook_keys(&webhook).await?;
            f.webhooks += 1;
            f.webhook_records += records;
            doomed.first.extend(keys);
        }
        for hook in hooks {
            let (keys, deliveries) = self.hook_keys(&hook, id).await?;
            f.hooks += 1;
            f.hook_deliveries += deliveries;
            doomed.first.extend(keys);
        }
        for item in self
            .query_prefix("list subscriptions", REGISTRY_PK, "S#", false, None)
            .await?
        {
            let sub: Subscription = read_doc(&item)?;
            if sub.agent_id.as_ref() == Some(id) {
                f.subscriptions += 1;
                doomed.first.push(key(REGISTRY_PK, format!("S#{}", sub.id)));
            }
        }
        doomed.first.push(key(DIRECTORY_PK, id.to_string()));
        doomed.first.push(key(pk.clone(), AGENT_SK));
        if apply {
            self.batch_delete(op, doomed.first).await?;
            self.batch_delete(op, doomed.rest).await?;
            // A heartbeat that was running may have written after the read above; with
            // the record gone nothing more is scheduled, so one more pass ends it.
            let stragglers = self.partition_keys(op, &pk).await?;
            self.batch_delete(op, stragglers).await?;
        }
        Ok(f)
    }
}
