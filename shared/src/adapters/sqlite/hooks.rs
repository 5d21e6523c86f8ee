//! Outbound hooks on SQLite: the hooks, their deliveries and attempt log. Deliveries past
//! their agent's retention are removed by the retention pass (`retention.rs`; DynamoDB
//! expires them by TTL).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::codec::{delete_with, read_docs, read_sealed, to_doc};
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{
    AgentId, Hook, HookAttempt, HookDelivery, HookDeliveryId, HookId, HookRoute, to_ms,
};
use crate::error::StoreError;
use crate::ports::HookStore;

pub(super) fn stored_version(
    conn: &Connection,
    table: &'static str,
    id: &str,
) -> Result<Option<u64>, StoreError> {
    let sql = format!("SELECT version FROM {table} WHERE id = ?1");
    conn.row(&sql, [id], |r| r.get::<_, i64>(0))
        .optional()
        .map(|v| v.map(|v| v as u64))
        .map_err(sqlite_err("read version"))
}

#[async_trait]
impl HookStore for SqliteStore {
    async fn create_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        let h = self.keys.seal_hook(hook)?;
        self.db
            .call("create hook", move |conn| {
                let n = conn
                    .exec(
                        "INSERT INTO hooks (id, agent_id, version, doc) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                        params![h.id.as_str(), h.agent_id.as_str(), h.version as i64, to_doc(&h)],
                    )
                    .map_err(sqlite_err("create hook"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("hook {}", h.id)));
                }
                Ok(())
            })
            .await
    }

    async fn get_hook(&self, id: &HookId) -> Result<Option<Hook>, StoreError> {
        let id = id.clone();
        let keys = self.keys.clone();
        self.db
            .call("get hook", move |conn| {
                Ok(read_sealed(
                    conn,
                    "get hook",
                    "hooks",
                    "SELECT id, doc FROM hooks WHERE id = ?1",
                    [id.as_str()],
                    &keys,
                    true,
                )?
                .pop())
            })
            .await
    }

    async fn list_hooks(&self, agent: &AgentId) -> Result<Vec<Hook>, StoreError> {
        let agent = agent.clone();
        let keys = self.keys.clone();
        self.db
            .call("list hooks", move |conn| {
                read_sealed(
                    conn,
                    "list hooks",
                    "hooks",
                    "SELECT id, doc FROM hooks WHERE agent_id = ?1 ORDER BY id",
                    [agent.as_str()],
                    &keys,
                    false,
                )
            })
            .await
    }

    async fn hook_routes(&self, agent: &AgentId) -> Result<Vec<HookRoute>, StoreError> {
        // Routes need no secret: the documents are read without opening them.
        let agent = agent.clone();
        self.db
            .call("read hook routes", move |conn| {
                let hooks: Vec<Hook> = read_docs(
                    conn,
                    "read hook routes",
                    "SELECT id, doc FROM hooks WHERE agent_id = ?1 ORDER BY id",
                    [agent.as_str()],
                )?;
                Ok(hooks.iter().map(Hook::route).collect())
            })
            .await
    }

    async fn update_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        let h = self.keys.seal_hook(hook)?;
        self.db
            .call("update hook", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE hooks SET version = ?2, doc = ?3 WHERE id = ?1 AND version = ?4",
                        params![
                            h.id.as_str(),
                            h.version as i64,
                            to_doc(&h),
                            h.version as i64 - 1
                        ],
                    )
                    .map_err(sqlite_err("update hook"))?;
                if n == 1 {
                    return Ok(());
                }
                match stored_version(conn, "hooks", h.id.as_str())? {
                    None => Err(StoreError::NotFound(format!("hook {}", h.id))),
                    Some(v) => Err(StoreError::Conflict(format!(
                        "hook {} changed meanwhile (version {v}, expected {})",
                        h.id,
                        h.version - 1
                    ))),
                }
            })
            .await
    }

    async fn delete_hook(&self, id: &HookId) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("delete hook", move |conn| {
                delete_with(
                    conn,
                    "delete hook",
                    "DELETE FROM hooks WHERE id = ?1",
                    &[
                        "DELETE FROM hook_attempts WHERE delivery_id IN (SELECT id FROM hook_deliveries WHERE hook_id = ?1)",
                        "DELETE FROM hook_deliveries WHERE hook_id = ?1",
                    ],
                    id.as_str(),
                    format!("hook {id}"),
                )
            })
            .await
    }

    async fn get_delivery(&self, id: &HookDeliveryId) -> Result<Option<HookDelivery>, StoreError> {
        let id = id.clone();
        self.db
            .call("get delivery", move |conn| {
                Ok(read_docs(
                    conn,
                    "get delivery",
                    "SELECT id, doc FROM hook_deliveries WHERE id = ?1",
                    [id.as_str()],
                )?
                .pop())
            })
            .await
    }

    async fn save_delivery(
        &self,
        delivery: &HookDelivery,
        attempt: Option<&HookAttempt>,
    ) -> Result<(), StoreError> {
        let d = delivery.clone();
        let a = attempt.cloned();
        self.db
            .call("save delivery", move |conn| {
                let op = sqlite_err("save delivery");
                let tx = super::begin(conn)
                    .map_err(&op)?;
                let expected = d.version.saturating_sub(1);
                let stored = stored_version(&tx, "hook_deliveries", d.id.as_str())?;
                if stored.unwrap_or(0) != expected || (stored.is_some() && expected == 0) {
                    return Err(StoreError::Conflict(format!(
                        "delivery {} changed meanwhile (version {}, expected {expected})",
                        d.id,
                        stored.map_or_else(|| "none".to_owned(), |v| v.to_string())
                    )));
                }
                let created = to_ms(d.created_at);
                tx.exec(
                    "INSERT INTO hook_deliveries (id, hook_id, version, created_ms, doc) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (id) DO UPDATE SET version = excluded.version, doc = excluded.doc",
                    params![d.id.as_str(), d.hook_id.as_str(), d.version as i64, created, to_doc(&d)],
                )
                .map_err(&op)?;
                if let Some(a) = &a {
                    tx.exec(
                        "INSERT OR REPLACE INTO hook_attempts (delivery_id, attempt, doc) VALUES (?1, ?2, ?3)",
                        params![a.delivery_id.as_str(), a.attempt, to_doc(a)],
                    )
                    .map_err(&op)?;
                }
                tx.commit().map_err(&op)?;
                Ok(())
            })
            .await
    }

    async fn list_deliveries(
        &self,
        hook: &HookId,
        limit: usize,
    ) -> Result<Vec<HookDelivery>, StoreError> {
        let hook = hook.clone();
        self.db
            .call("list deliveries", move |conn| {
                read_docs(
                    conn,
                    "list deliveries",
                    "SELECT id, doc FROM hook_deliveries WHERE hook_id = ?1 \
                     ORDER BY created_ms DESC, id DESC LIMIT ?2",
                    params![hook.as_str(), limit as i64],
                )
            })
            .await
    }

    async fn list_attempts(
        &self,
        delivery: &HookDeliveryId,
    ) -> Result<Vec<HookAttempt>, StoreError> {
        let id = delivery.clone();
        self.db
            .call("list attempts", move |conn| {
                read_docs(
                    conn,
                    "list attempts",
                    "SELECT delivery_id, doc FROM hook_attempts WHERE delivery_id = ?1 ORDER BY attempt",
                    [id.as_str()],
                )
            })
            .await
    }
}
