//! Deleting an agent and everything that is its own: paginated reads of its partition
//! and of the items that point at it, then batched deletes.

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, EventId, HookId, Subscription};
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
        let mut action_hours = std::collections::BTreeSet::new();
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
                "AC" => {
                    if let Some(event) = sk.split('#').nth(1).and_then(|e| EventId::parse(e).ok()) {
                        action_hours.insert((event.timestamp_ms() / 3_600_000) as i64);
                    }
                    &mut f.actions
                }
                "TN" | "MS" | "SG" => &mut f.conversation,
                "ME" => &mut f.memories,
                "SP" | "USD" | "CPM" => &mut f.usage,
                "SC" => &mut f.schedules,
                "AP" => &mut f.approvals,
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
        let agent = self.get_agent(id).await?;
        if let Some(channel) = agent.as_ref().and_then(|a| a.discord_channel.clone())
            && self.agent_for_channel(&channel).await?.as_ref() == Some(id)
        {
            doomed.first.push(key(format!("CH#{channel}"), "CH"));
            f.channel = Some(channel);
        }
        // Its name, when it holds it.
        if let Some(agent) = &agent
            && self
                .get_id(
                    "find name's agent",
                    super::agents::name_key(&agent.name),
                    "agent_id",
                    AgentId::parse,
                )
                .await?
                .as_ref()
                == Some(id)
        {
            doomed.first.push(super::agents::name_key(&agent.name));
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
        // Its tool call counts, filed by the day a call started: the days of the
        // actions it still has and the next (a call starts within a day of its event
        // unless its agent was paused), one Query each, so that deleting an agent costs
        // in proportion to what it kept. Counts of days whose actions retention has
        // already pruned (or of a call started after a long pause) are left to their
        // TTL, at most COUNT_DAYS days: numbers and tool names, no content.
        let days: std::collections::BTreeSet<i64> = action_hours
            .iter()
            .flat_map(|h| [h.div_euclid(24), h.div_euclid(24) + 1])
            .collect();
        let prefix = format!("{id}#");
        for day in days {
            let pk = tool_count_pk(day * 24);
            for item in self.query_prefix(op, &pk, &prefix, false, None).await? {
                if let Some(sk) = item.get("sk").and_then(|v| v.as_s().ok()) {
                    doomed.rest.push(key(pk.clone(), sk.clone()));
                }
            }
        }
        // Its pending approvals' entries in the pending index (the approvals themselves
        // are in its partition).
        for item in self
            .query_prefix(op, super::approvals::PENDING_PK, "", false, None)
            .await?
        {
            let a: crate::domain::Approval = read_doc(&item)?;
            if a.agent_id == *id {
                doomed.first.push(key(
                    super::approvals::PENDING_PK,
                    super::approvals::pending_sk(&a),
                ));
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
