//! Tools and subscriptions on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::codec::{delete_with, read_docs, to_doc, update_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{Registry, Subscription, SubscriptionId, Tool, ToolName};
use crate::error::StoreError;
use crate::ports::ToolRegistry;

#[async_trait]
impl ToolRegistry for SqliteStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let tool = self.keys.seal_tool(tool)?;
        self.db
            .call("add tool", move |conn| {
                let n = conn
                    .exec(
                        "INSERT INTO tools (name, doc) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                        params![tool.name.as_str(), to_doc(&tool)],
                    )
                    .map_err(sqlite_err("add tool"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("tool {}", tool.name)));
                }
                Ok(())
            })
            .await
    }

    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        let name = name.clone();
        self.db
            .call("update tool", move |conn| {
                update_doc(
                    conn,
                    "update tool",
                    "tools",
                    "name",
                    name.as_str(),
                    format!("tool {name}"),
                    |t: &mut Tool| t.active = active,
                )
            })
            .await
    }

    async fn update_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let tool = self.keys.seal_tool(tool)?;
        self.db
            .call("update tool", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE tools SET doc = ?2 WHERE name = ?1",
                        params![tool.name.as_str(), to_doc(&tool)],
                    )
                    .map_err(sqlite_err("update tool"))?;
                if n == 0 {
                    return Err(StoreError::NotFound(format!("tool {}", tool.name)));
                }
                Ok(())
            })
            .await
    }

    async fn remove_tool(&self, name: &ToolName) -> Result<(), StoreError> {
        let name = name.clone();
        self.db
            .call("remove tool", move |conn| {
                delete_with(
                    conn,
                    "remove tool",
                    "DELETE FROM tools WHERE name = ?1",
                    &[],
                    name.as_str(),
                    format!("tool {name}"),
                )
            })
            .await
    }

    async fn remove_subscription(&self, id: &SubscriptionId) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("remove subscription", move |conn| {
                delete_with(
                    conn,
                    "remove subscription",
                    "DELETE FROM subscriptions WHERE id = ?1",
                    &[],
                    id.as_str(),
                    format!("subscription {id}"),
                )
            })
            .await
    }

    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let sub = sub.clone();
        self.db
            .call("add subscription", move |conn| {
                let n = conn
                    .exec(
                        "INSERT INTO subscriptions (id, doc) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                        params![sub.id.as_str(), to_doc(&sub)],
                    )
                    .map_err(sqlite_err("add subscription"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!(
                        "subscription {} ({} -> {})",
                        sub.id, sub.event_type, sub.tool
                    )));
                }
                Ok(())
            })
            .await
    }

    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("update subscription", move |conn| {
                update_doc(
                    conn,
                    "update subscription",
                    "subscriptions",
                    "id",
                    id.as_str(),
                    format!("subscription {id}"),
                    |s: &mut Subscription| s.active = active,
                )
            })
            .await
    }

    async fn load_registry(&self) -> Result<Registry, StoreError> {
        let mut registry: Registry = self
            .db
            .call("load registry", |conn| {
                let tx = super::begin_deferred(conn).map_err(sqlite_err("load registry"))?;
                let tools = read_docs(
                    &tx,
                    "load registry",
                    "SELECT name, doc FROM tools ORDER BY name",
                    [],
                )?;
                let subscriptions = read_docs(
                    &tx,
                    "load registry",
                    "SELECT id, doc FROM subscriptions ORDER BY id",
                    [],
                )?;
                let version = read_version(&tx)?;
                Ok(Registry {
                    tools,
                    subscriptions,
                    version,
                })
            })
            .await?;
        for t in &mut registry.tools {
            self.keys.open_tool(t);
        }
        Ok(registry)
    }

    async fn registry_version(&self) -> Result<u64, StoreError> {
        self.db
            .call("read registry version", |conn| read_version(conn))
            .await
    }
}

/// The registry version (schema 9 keeps it in one row, moved by triggers).
fn read_version(conn: &rusqlite::Connection) -> Result<u64, StoreError> {
    conn.prepare_cached("SELECT version FROM registry_version WHERE id = 1")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|v| v.max(0) as u64)
        .map_err(sqlite_err("read registry version"))
}
