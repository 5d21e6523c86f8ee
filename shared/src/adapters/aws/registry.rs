//! Tools and subscriptions on DynamoDB.
//!
//! Every change is one transaction with an `ADD 1` on the registry's version item
//! (`REG`, [`VERSION_SK`]), so the version moves with the change and a sweeper that reads
//! it after its claims knows whether a worker's cached registry is current. The version
//! item sorts before the tools (`T#…`) and subscriptions (`S#…`), so the consistent Query
//! that loads the registry reads it first: a version read is never newer than the items
//! read after it.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, TransactWriteItem, Update};

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{Registry, Subscription, SubscriptionId, Tool, ToolName};
use crate::error::StoreError;
use crate::ports::ToolRegistry;

/// The sort key of the registry's version item.
const VERSION_SK: &str = "!VERSION";

impl DynamoStore {
    /// Runs `change` with the version's increment in one transaction; `refused` when the
    /// change's condition failed.
    async fn change_registry(
        &self,
        op: &'static str,
        change: TransactWriteItem,
        refused: StoreError,
    ) -> Result<(), StoreError> {
        let bump = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(REGISTRY_PK, VERSION_SK.to_owned())))
            .update_expression("ADD v :one")
            .expression_attribute_values(":one", n(1))
            .build()
            .map_err(backend("build transaction"))?;
        let items = vec![change, TransactWriteItem::builder().update(bump).build()];
        match self.transact(op, items).await? {
            Ok(()) => Ok(()),
            Err(reasons) if is_ccf(reasons.first()) => Err(refused),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                op,
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    /// A registry item put, conditional on the key being new (`attribute_not_exists`) or
    /// present (`attribute_exists`).
    fn registry_put<T: serde::Serialize>(
        &self,
        sk: String,
        doc: &T,
        active: bool,
        condition: &str,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), sk, doc);
        item.insert("active".to_owned(), AttributeValue::Bool(active));
        self.put(item, Some(condition))
    }

    /// Sets `active` on an existing registry item.
    fn registry_switch(&self, sk: String, active: bool) -> Result<TransactWriteItem, StoreError> {
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(REGISTRY_PK, sk)))
            .update_expression("SET active = :a")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":a", AttributeValue::Bool(active))
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Deletes an existing registry item.
    fn registry_delete(&self, sk: String) -> Result<TransactWriteItem, StoreError> {
        let delete = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(key(REGISTRY_PK, sk)))
            .condition_expression("attribute_exists(pk)")
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().delete(delete).build())
    }
}

/// The version an item of the registry's partition carries, if it is the version item.
fn version_of(item: &Item) -> Option<u64> {
    (item
        .get("sk")
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
        == Some(VERSION_SK))
    .then(|| {
        item.get("v")
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

#[async_trait]
impl ToolRegistry for DynamoStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let tool = &self.keys.seal_tool(tool)?;
        let put = self.registry_put(
            format!("T#{}", tool.name),
            tool,
            tool.active,
            "attribute_not_exists(pk)",
        )?;
        self.change_registry(
            "add tool",
            put,
            StoreError::AlreadyExists(format!("tool {}", tool.name)),
        )
        .await
    }

    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        let switch = self.registry_switch(format!("T#{name}"), active)?;
        self.change_registry(
            "update tool",
            switch,
            StoreError::NotFound(format!("tool {name}")),
        )
        .await
    }

    async fn update_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let tool = &self.keys.seal_tool(tool)?;
        let put = self.registry_put(
            format!("T#{}", tool.name),
            tool,
            tool.active,
            "attribute_exists(pk)",
        )?;
        self.change_registry(
            "update tool",
            put,
            StoreError::NotFound(format!("tool {}", tool.name)),
        )
        .await
    }

    async fn remove_tool(&self, name: &ToolName) -> Result<(), StoreError> {
        let delete = self.registry_delete(format!("T#{name}"))?;
        self.change_registry(
            "remove tool",
            delete,
            StoreError::NotFound(format!("tool {name}")),
        )
        .await
    }

    async fn remove_subscription(&self, id: &SubscriptionId) -> Result<(), StoreError> {
        let delete = self.registry_delete(format!("S#{id}"))?;
        self.change_registry(
            "remove subscription",
            delete,
            StoreError::NotFound(format!("subscription {id}")),
        )
        .await
    }

    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let put = self.registry_put(
            format!("S#{}", sub.id),
            sub,
            sub.active,
            "attribute_not_exists(pk)",
        )?;
        self.change_registry(
            "add subscription",
            put,
            StoreError::AlreadyExists(format!(
                "subscription {} ({} -> {})",
                sub.id, sub.event_type, sub.tool
            )),
        )
        .await
    }

    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        let switch = self.registry_switch(format!("S#{id}"), active)?;
        self.change_registry(
            "update subscription",
            switch,
            StoreError::NotFound(format!("subscription {id}")),
        )
        .await
    }

    async fn load_registry(&self) -> Result<Registry, StoreError> {
        let mut registry = Registry::default();
        for item in self
            .query_partition_consistently("load registry", REGISTRY_PK)
            .await?
        {
            let sk = item
                .get("sk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            if let Some(v) = version_of(&item) {
                registry.version = v;
            } else if sk.starts_with("T#") {
                let mut t: Tool = read_doc(&item)?;
                t.active = active_flag(&item).unwrap_or(t.active);
                self.keys.open_tool(&mut t);
                registry.tools.push(t);
            } else if sk.starts_with("S#") {
                let mut sub: Subscription = read_doc(&item)?;
                sub.active = active_flag(&item).unwrap_or(sub.active);
                registry.subscriptions.push(sub);
            }
        }
        Ok(registry)
    }

    async fn registry_version(&self) -> Result<u64, StoreError> {
        let item = self
            .get(
                "read registry version",
                key(REGISTRY_PK, VERSION_SK.to_owned()),
            )
            .await?;
        Ok(item.as_ref().and_then(version_of).unwrap_or(0))
    }
}
