//! Agents' memories on DynamoDB.

use async_trait::async_trait;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Memory};
use crate::error::StoreError;
use crate::ports::MemoryStore;

#[async_trait]
impl MemoryStore for DynamoStore {
    async fn remember(&self, memory: &Memory) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(doc_item(
                agent_pk(&memory.agent_id),
                format!("ME#{}", memory.id),
                memory,
            )))
            .send()
            .await
            .map_err(backend("write memory"))?;
        Ok(())
    }

    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.query_prefix("read memories", &agent_pk(agent), "ME#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }
}
