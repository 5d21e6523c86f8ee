//! API tokens on DynamoDB: one item per token in the `TOKENS` partition (sort key: its
//! id), its record as a JSON document. A request reads its token with one GetItem.

use async_trait::async_trait;
use jiff::Timestamp;

use super::DynamoStore;
use super::codec::*;
use crate::domain::{AgentId, ApiToken, TokenId};
use crate::error::StoreError;
use crate::ports::TokenStore;

const TOKENS_PK: &str = "TOKENS";

/// The partition of a token's request counts: one item a minute, `<minute>`, expiring
/// two minutes after its own.
fn counts_pk(token: &TokenId) -> String {
    format!("TR#{token}")
}

#[async_trait]
impl TokenStore for DynamoStore {
    async fn put_token(&self, token: &ApiToken) -> Result<(), StoreError> {
        let item = doc_item(TOKENS_PK.to_owned(), token.id.to_string(), token);
        match self.put_new("save token", item).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::Conflict(format!("token {} exists", token.id))),
        }
    }

    async fn get_token(&self, id: &TokenId) -> Result<Option<ApiToken>, StoreError> {
        self.get("read token", key(TOKENS_PK, id.to_string()))
            .await?
            .map(|item| read_doc(&item))
            .transpose()
    }

    async fn count_api_request(
        &self,
        token: &TokenId,
        now: Timestamp,
        limit: u32,
    ) -> Result<bool, StoreError> {
        let minute = now.as_second().div_euclid(60);
        let at = key(counts_pk(token), minute.to_string());
        self.count_up("count API request", at, limit, (minute + 3) * 60)
            .await
    }

    async fn list_tokens(&self, agent: Option<&AgentId>) -> Result<Vec<ApiToken>, StoreError> {
        let mut tokens = Vec::new();
        for item in self
            .query_prefix("list tokens", TOKENS_PK, "", false, None)
            .await?
        {
            let token: ApiToken = read_doc(&item)?;
            if agent.is_none_or(|a| *a == token.agent_id) {
                tokens.push(token);
            }
        }
        Ok(tokens)
    }

    async fn revoke_token(&self, id: &TokenId, at: Timestamp) -> Result<(), StoreError> {
        let Some(mut token) = self.get_token(id).await? else {
            return Err(StoreError::NotFound(format!("token {id}")));
        };
        if token.revoked_at.is_some() {
            return Ok(());
        }
        token.revoked_at = Some(at);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(doc_item(TOKENS_PK.to_owned(), id.to_string(), &token)))
            .send()
            .await
            .map_err(backend("revoke token"))?;
        Ok(())
    }
}
