//! Outbound hooks on DynamoDB.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | hook | `HK#<id>` | `HK` |
//! | hook route (type, active) | `AG#<agent>` | `HR#<hook id>` |
//! | delivery | `HD#<id>` | `HD` (TTL) |
//! | delivery, as listed under its hook | `HK#<hook id>` | `D#<delivery id>` (TTL) |
//! | attempt | `HD#<delivery id>` | `A#<attempt, 4 digits>` (TTL) |
//!
//! The engine reads an agent's routes with one Query of its partition; the dispatcher
//! reads a hook and a delivery by key. Hooks and deliveries carry `ver`: every write is a
//! transaction conditional on the version read, with the copies it keeps in step.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Hook, HookAttempt, HookDelivery, HookDeliveryId, HookId, HookRoute};
use crate::error::StoreError;
use crate::ports::HookStore;

const HOOK_SK: &str = "HK";
const DELIVERY_SK: &str = "HD";

fn hook_pk(id: &HookId) -> String {
    format!("HK#{id}")
}

fn delivery_pk(id: &HookDeliveryId) -> String {
    format!("HD#{id}")
}

fn route_item(h: &Hook) -> Item {
    doc_item(agent_pk(&h.agent_id), format!("HR#{}", h.id), &h.route())
}

fn versioned(mut item: Item, version: u64) -> Item {
    item.insert("ver".to_owned(), n(version));
    item
}

/// Deliveries and attempts expire (TTL on `expires_at`) `PULSE_RETENTION` after the
/// delivery was made.
fn expiring(mut item: Item, d: &HookDelivery, store: &DynamoStore) -> Item {
    item.insert("expires_at".to_owned(), n(store.expires_at(d.created_at)));
    item
}

impl DynamoStore {
    /// Every key that is hook `id`'s (of agent `agent`): its record and route, its
    /// delivery listing, each delivery and its attempts; with how many delivery records
    /// (deliveries and attempts) there are.
    pub(super) async fn hook_keys(
        &self,
        id: &HookId,
        agent: &AgentId,
    ) -> Result<(Vec<Item>, u64), StoreError> {
        let mut keys = vec![
            key(hook_pk(id), HOOK_SK),
            key(agent_pk(agent), format!("HR#{id}")),
        ];
        let mut deliveries = 0;
        for k in self
            .partition_keys("list hook records", &hook_pk(id))
            .await?
        {
            let sk = k.get("sk").and_then(|v| v.as_s().ok()).cloned();
            if let Some(d) = sk.as_deref().and_then(|sk| sk.strip_prefix("D#")) {
                let records = self
                    .partition_keys("list hook records", &format!("HD#{d}"))
                    .await?;
                deliveries += records.len() as u64;
                keys.extend(records);
            }
            if sk.as_deref() != Some(HOOK_SK) {
                keys.push(k);
            }
        }
        Ok((keys, deliveries))
    }

    /// A Put conditional on the stored `ver` being `prev` (on absence when `prev` is 0).
    fn put_at_version(&self, item: Item, prev: u64) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder().table_name(&self.table).set_item(Some(item));
        let put = if prev == 0 {
            put.condition_expression("attribute_not_exists(pk)")
        } else {
            put.condition_expression("ver = :prev")
                .expression_attribute_values(":prev", n(prev))
        };
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(backend("build transaction"))?)
            .build())
    }

    /// Why a versioned write failed: the record is gone, or it changed meanwhile.
    async fn version_conflict(&self, what: String, k: Item) -> Result<StoreError, StoreError> {
        Ok(match self.get("read version", k).await? {
            None => StoreError::NotFound(what),
            Some(_) => StoreError::Conflict(format!("{what} changed meanwhile")),
        })
    }
}

#[async_trait]
impl HookStore for DynamoStore {
    async fn create_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        let hook = &self.keys.seal_hook(hook)?;
        let items = vec![
            self.put_at_version(
                versioned(
                    doc_item(hook_pk(&hook.id), HOOK_SK.to_owned(), hook),
                    hook.version,
                ),
                0,
            )?,
            self.put(route_item(hook), None)?,
            // The agent's record says it has hooks, so heartbeats read its routes.
            TransactWriteItem::builder()
                .update(
                    Update::builder()
                        .table_name(&self.table)
                        .set_key(Some(key(agent_pk(&hook.agent_id), AGENT_SK)))
                        .update_expression("SET #has_hooks = :t")
                        .condition_expression("attribute_exists(pk)")
                        .expression_attribute_names("#has_hooks", HAS_HOOKS)
                        .expression_attribute_values(":t", AttributeValue::Bool(true))
                        .build()
                        .map_err(backend("build transaction"))?,
                )
                .build(),
        ];
        match self.transact("create hook", items).await? {
            Ok(()) => Ok(()),
            Err(reasons) if is_ccf(reasons.get(2)) => {
                Err(StoreError::NotFound(format!("agent {}", hook.agent_id)))
            }
            Err(_) => Err(StoreError::AlreadyExists(format!("hook {}", hook.id))),
        }
    }

    async fn get_hook(&self, id: &HookId) -> Result<Option<Hook>, StoreError> {
        let Some(item) = self.get("get hook", key(hook_pk(id), HOOK_SK)).await? else {
            return Ok(None);
        };
        self.open_sealed(item, true).await.map(Some)
    }

    async fn list_hooks(&self, agent: &AgentId) -> Result<Vec<Hook>, StoreError> {
        let routes = self.hook_routes(agent).await?;
        let mut hooks = Vec::with_capacity(routes.len());
        for r in routes {
            // A route whose hook is gone (a crash between writes cannot cause one: they
            // are one transaction) is skipped rather than failing the listing.
            if let Some(h) = self.get_hook(&r.id).await? {
                hooks.push(h);
            }
        }
        Ok(hooks)
    }

    async fn hook_routes(&self, agent: &AgentId) -> Result<Vec<HookRoute>, StoreError> {
        self.query_prefix("read hook routes", &agent_pk(agent), "HR#", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }

    async fn update_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        let hook = &self.keys.seal_hook(hook)?;
        let items = vec![
            self.put_at_version(
                versioned(
                    doc_item(hook_pk(&hook.id), HOOK_SK.to_owned(), hook),
                    hook.version,
                ),
                hook.version.saturating_sub(1).max(1),
            )?,
            self.put(route_item(hook), None)?,
        ];
        match self.transact("update hook", items).await? {
            Ok(()) => Ok(()),
            Err(_) => Err(self
                .version_conflict(format!("hook {}", hook.id), key(hook_pk(&hook.id), HOOK_SK))
                .await?),
        }
    }

    async fn delete_hook(&self, id: &HookId) -> Result<(), StoreError> {
        let Some(hook) = self.get_hook(id).await? else {
            return Err(StoreError::NotFound(format!("hook {id}")));
        };
        let (keys, _) = self.hook_keys(id, &hook.agent_id).await?;
        // The record and its route lead the first batch. Once they are gone the engine no
        // longer routes to the hook, and the dispatcher drops its queued messages.
        self.batch_delete("delete hook", keys).await
    }

    async fn get_delivery(&self, id: &HookDeliveryId) -> Result<Option<HookDelivery>, StoreError> {
        self.get("get delivery", key(delivery_pk(id), DELIVERY_SK))
            .await?
            .map(|i| read_doc(&i))
            .transpose()
    }

    async fn save_delivery(
        &self,
        d: &HookDelivery,
        attempt: Option<&HookAttempt>,
    ) -> Result<(), StoreError> {
        let mut items = vec![
            self.put_at_version(
                expiring(
                    versioned(
                        doc_item(delivery_pk(&d.id), DELIVERY_SK.to_owned(), d),
                        d.version,
                    ),
                    d,
                    self,
                ),
                d.version.saturating_sub(1),
            )?,
            self.put(
                expiring(
                    doc_item(hook_pk(&d.hook_id), format!("D#{}", d.id), d),
                    d,
                    self,
                ),
                None,
            )?,
        ];
        if let Some(a) = attempt {
            items.push(self.put(
                expiring(
                    doc_item(delivery_pk(&d.id), format!("A#{:04}", a.attempt), a),
                    d,
                    self,
                ),
                None,
            )?);
        }
        match self.transact("save delivery", items).await? {
            Ok(()) => Ok(()),
            Err(codes) if codes.first().is_some_and(|c| is_ccf(Some(c))) => {
                Err(StoreError::Conflict(format!(
                    "delivery {} changed meanwhile (expected version {})",
                    d.id,
                    d.version.saturating_sub(1)
                )))
            }
            Err(codes) => Err(StoreError::backend(
                "dynamodb",
                "save delivery",
                format!("transaction cancelled: {codes:?}"),
            )),
        }
    }

    async fn list_deliveries(
        &self,
        hook: &HookId,
        limit: usize,
    ) -> Result<Vec<HookDelivery>, StoreError> {
        self.query_prefix("list deliveries", &hook_pk(hook), "D#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }

    async fn list_attempts(
        &self,
        delivery: &HookDeliveryId,
    ) -> Result<Vec<HookAttempt>, StoreError> {
        self.query_prefix("list attempts", &delivery_pk(delivery), "A#", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }
}
