//! API tokens on SQLite: one row per token, its record as JSON beside the agent it
//! speaks to.

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};

use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{AgentId, ApiToken, TokenId};
use crate::error::StoreError;
use crate::ports::TokenStore;

fn read(doc: &str) -> Result<ApiToken, StoreError> {
    serde_json::from_str(doc).map_err(|e| StoreError::corrupt("api_tokens", e))
}

#[async_trait]
impl TokenStore for SqliteStore {
    async fn put_token(&self, token: &ApiToken) -> Result<(), StoreError> {
        let (id, agent) = (token.id.to_string(), token.agent_id.to_string());
        let doc = serde_json::to_string(token).map_err(|e| StoreError::corrupt("api_tokens", e))?;
        self.db
            .call("save token", move |conn| {
                conn.exec(
                    "INSERT INTO api_tokens (id, agent_id, doc) VALUES (?1, ?2, ?3)",
                    params![id, agent, doc],
                )
                .map_err(sqlite_err("save token"))?;
                Ok(())
            })
            .await
    }

    async fn get_token(&self, id: &TokenId) -> Result<Option<ApiToken>, StoreError> {
        let id = id.to_string();
        self.db
            .call("read token", move |conn| {
                let doc: Option<String> = conn
                    .prepare_cached("SELECT doc FROM api_tokens WHERE id = ?1")
                    .and_then(|mut st| st.query_row([&id], |r| r.get(0)).optional())
                    .map_err(sqlite_err("read token"))?;
                doc.as_deref().map(read).transpose()
            })
            .await
    }

    async fn count_api_request(
        &self,
        token: &TokenId,
        now: Timestamp,
        limit: u32,
    ) -> Result<bool, StoreError> {
        let (id, minute) = (token.to_string(), now.as_second().div_euclid(60));
        self.db
            .call("count API request", move |conn| {
                let op = sqlite_err("count API request");
                let count: Option<i64> = conn
                    .prepare_cached(
                        "INSERT INTO api_counts (token_id, minute, count) VALUES (?1, ?2, 1) \
                         ON CONFLICT (token_id, minute) DO UPDATE SET count = count + 1 \
                         WHERE count < ?3 RETURNING count",
                    )
                    .and_then(|mut st| {
                        st.query_row(params![id, minute, limit], |r| r.get(0))
                            .optional()
                    })
                    .map_err(&op)?;
                // The minute's first request: the token's past minutes go.
                if count == Some(1) {
                    conn.exec(
                        "DELETE FROM api_counts WHERE token_id = ?1 AND minute < ?2",
                        params![id, minute],
                    )
                    .map_err(&op)?;
                }
                Ok(count.is_some())
            })
            .await
    }

    async fn list_tokens(&self, agent: Option<&AgentId>) -> Result<Vec<ApiToken>, StoreError> {
        let agent = agent.map(ToString::to_string);
        self.db
            .call("list tokens", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT doc FROM api_tokens WHERE ?1 IS NULL OR agent_id = ?1 ORDER BY id",
                    )
                    .map_err(sqlite_err("list tokens"))?;
                let docs = st
                    .query_map([&agent], |r| r.get::<_, String>(0))
                    .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                    .map_err(sqlite_err("list tokens"))?;
                docs.iter().map(|d| read(d)).collect()
            })
            .await
    }

    async fn revoke_token(&self, id: &TokenId, at: Timestamp) -> Result<(), StoreError> {
        let Some(mut token) = self.get_token(id).await? else {
            return Err(StoreError::NotFound(format!("token {id}")));
        };
        if token.revoked_at.is_some() {
            return Ok(());
        }
        token.revoked_at = Some(at);
        let doc =
            serde_json::to_string(&token).map_err(|e| StoreError::corrupt("api_tokens", e))?;
        let id = id.to_string();
        self.db
            .call("revoke token", move |conn| {
                conn.exec(
                    "UPDATE api_tokens SET doc = ?2 WHERE id = ?1",
                    params![id, doc],
                )
                .map_err(sqlite_err("revoke token"))?;
                Ok(())
            })
            .await
    }
}
