//! Tools and subscriptions on DynamoDB.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{Registry, Subscription, SubscriptionId, Tool, ToolName};
use crate::error::StoreError;
use crate::ports::ToolRegistry;

#[async_trait]
impl ToolRegistry for DynamoStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), format!("T#{}", tool.name), tool);
        item.insert("active".to_owned(), AttributeValue::Bool(tool.active));
        match self.put_new("add tool", item).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::AlreadyExists(format!("tool {}", tool.name))),
        }
    }

    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        self.set_active(
            "update tool",
            key(REGISTRY_PK, format!("T#{name}")),
            active,
            format!("tool {name}"),
        )
        .await
    }

    async fn update_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), format!("T#{}", tool.name), tool);
        item.insert("active".to_owned(), AttributeValue::Bool(tool.active));
        match self
            .transact(
                "update tool",
                vec![self.put(item, Some("attribute_exists(pk)"))?],
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(_) => Err(StoreError::NotFound(format!("tool {}", tool.name))),
        }
    }

    async fn remove_tool(&self, name: &ToolName) -> Result<(), StoreError> {
        self.delete_existing(
            "remove tool",
            key(REGISTRY_PK, format!("T#{name}")),
            format!("tool {name}"),
        )
        .await
    }

    async fn remove_subscription(&self, id: &SubscriptionId) -> Result<(), StoreError> {
        self.delete_existing(
            "remove subscription",
            key(REGISTRY_PK, format!("S#{id}")),
            format!("subscription {id}"),
        )
        .await
    }

    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), format!("S#{}", sub.id), sub);
        item.insert("active".to_owned(), AttributeValue::Bool(sub.active));
        match self.put_new("add subscription", item).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::AlreadyExists(format!(
                "subscription {} ({} -> {})",
                sub.id, sub.event_type, sub.tool
            ))),
        }
    }

    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        self.set_active(
            "update subscription",
            key(REGISTRY_PK, format!("S#{id}")),
            active,
            format!("subscription {id}"),
        )
        .await
    }

    async fn load_registry(&self) -> Result<Registry, StoreError> {
        let mut registry = Registry::default();
        for item in self
            .query_prefix("load registry", REGISTRY_PK, "", false, None)
            .await?
        {
            let sk = item
                .get("sk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            if sk.starts_with("T#") {
                let mut t: Tool = read_doc(&item)?;
                t.active = active_flag(&item).unwrap_or(t.active);
                registry.tools.push(t);
            } else if sk.starts_with("S#") {
                let mut sub: Subscription = read_doc(&item)?;
                sub.active = active_flag(&item).unwrap_or(sub.active);
                registry.subscriptions.push(sub);
            }
        }
        Ok(registry)
    }
}
