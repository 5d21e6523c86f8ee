//! Agents' memories on DynamoDB: one item per memory in the agent's partition
//! (`ME#<id>`, time-ordered), its vector in the item as a binary attribute (quantized
//! bytes, `vec`, and the model, `vm`), and the agent's memory version (`MV`). Words are
//! scored by the worker's recall index: DynamoDB keeps no word index.
//!
//! A memory's weighing — weight `wt`, the beat it was weighed at `wb`, its last recall
//! `ra` and its recall count `rc` — is kept beside its doc and read over it, so a
//! recall's reinforcement updates those four and nothing else, on the condition that the
//! memory exists and its count is the one the recall read: a forget or a fold landing
//! meanwhile stands, and two recalls never overwrite each other's weights. The memory a
//! memory is folded into is kept beside the doc too (`fi`), so that consolidation and
//! restore can write a memory on the condition that its fold is still the one they read.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use futures::StreamExt;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Embedding, Memory, MemoryChange, MemoryId};
use crate::error::StoreError;
use crate::ports::{MAX_CHANGES, MemoryStore};

/// The sort key of an agent's memory version.
const VERSION_SK: &str = "MV";

fn memory_sk(id: &MemoryId) -> String {
    format!("ME#{id}")
}

fn memory_item(m: &Memory) -> Item {
    let mut item = doc_item(agent_pk(&m.agent_id), memory_sk(&m.id), m);
    item.extend(weighing(m));
    if let Some(into) = &m.folded_into {
        item.insert("fi".to_owned(), s(into.to_string()));
    }
    if let Some(e) = &m.embedding {
        item.insert(
            "vec".to_owned(),
            AttributeValue::B(Blob::new(
                e.values.iter().map(|v| *v as u8).collect::<Vec<u8>>(),
            )),
        );
        item.insert("vm".to_owned(), s(e.model.clone()));
    }
    item
}

/// The weighing attributes of `m`.
fn weighing(m: &Memory) -> Vec<(String, AttributeValue)> {
    let mut out = vec![
        ("wt".to_owned(), n(m.weight)),
        ("wb".to_owned(), n(m.weighed_beat)),
        ("rc".to_owned(), n(m.recalls)),
    ];
    if let Some(at) = m.recalled_at {
        out.push(("ra".to_owned(), s(at.to_string())));
    }
    out
}

fn read_memory(item: &Item) -> Result<Memory, StoreError> {
    let mut m: Memory = read_doc(item)?;
    let num = |k: &str| item.get(k).and_then(|v| v.as_n().ok());
    if let Some(w) = num("wt").and_then(|v| v.parse().ok()) {
        m.weight = w;
    }
    if let Some(b) = num("wb").and_then(|v| v.parse().ok()) {
        m.weighed_beat = b;
    }
    if let Some(c) = num("rc").and_then(|v| v.parse().ok()) {
        m.recalls = c;
    }
    if let Some(at) = item.get("ra").and_then(|v| v.as_s().ok()) {
        m.recalled_at =
            Some(at.parse().map_err(|e| {
                StoreError::corrupt(format!("memory {}", m.id), format!("ra: {e}"))
            })?);
    }
    m.embedding = match (item.get("vec"), item.get("vm")) {
        (Some(AttributeValue::B(bytes)), Some(AttributeValue::S(model))) => Some(Embedding {
            model: model.clone(),
            values: bytes.as_ref().iter().map(|b| *b as i8).collect(),
        }),
        _ => None,
    };
    Ok(m)
}

impl DynamoStore {
    /// Reinforces one memory (see [`MemoryStore::reinforce`]): its id when not written.
    async fn reinforce_one(&self, m: &Memory) -> Result<Option<MemoryId>, StoreError> {
        let mut set = "SET wt = :wt, wb = :wb, rc = :rc".to_owned();
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&m.agent_id), memory_sk(&m.id))))
            // An item written before the weighing was kept beside the doc has no count.
            .condition_expression(
                "attribute_exists(pk) AND (rc = :read OR attribute_not_exists(rc))",
            )
            .expression_attribute_values(":wt", n(m.weight))
            .expression_attribute_values(":wb", n(m.weighed_beat))
            .expression_attribute_values(":rc", n(m.recalls))
            .expression_attribute_values(":read", n(m.recalls.saturating_sub(1)));
        if let Some(at) = m.recalled_at {
            set.push_str(", ra = :ra");
            req = req.expression_attribute_values(":ra", s(at.to_string()));
        }
        match req.update_expression(set).send().await {
            Ok(_) => Ok(None),
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(Some(m.id.clone())),
                other => Err(StoreError::backend("dynamodb", "reinforce memory", other)),
            },
        }
    }

    /// One conditional change (see [`MemoryChange`]) as a transaction item.
    fn change_item(&self, c: &MemoryChange) -> Result<TransactWriteItem, StoreError> {
        let m = &c.memory;
        let Some(read) = &c.read else {
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(memory_item(m)))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .map_err(backend("build transaction"))?;
            return Ok(TransactWriteItem::builder().put(put).build());
        };
        // The record and its weighing; the vector stays as stored. An item written
        // before the count and the fold were kept beside the doc has neither.
        let mut set = "SET doc = :doc, wt = :wt, wb = :wb, rc = :rc".to_owned();
        let mut condition =
            "attribute_exists(pk) AND (rc = :read OR attribute_not_exists(rc))".to_owned();
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&m.agent_id), memory_sk(&m.id))))
            .expression_attribute_values(
                ":doc",
                s(serde_json::to_string(m).map_err(backend("encode memory"))?),
            )
            .expression_attribute_values(":wt", n(m.weight))
            .expression_attribute_values(":wb", n(m.weighed_beat))
            .expression_attribute_values(":rc", n(m.recalls))
            .expression_attribute_values(":read", n(read.recalls));
        if let Some(at) = m.recalled_at {
            set.push_str(", ra = :ra");
            update = update.expression_attribute_values(":ra", s(at.to_string()));
        }
        if let Some(into) = &m.folded_into {
            set.push_str(", fi = :fi");
            update = update.expression_attribute_values(":fi", s(into.to_string()));
        } else {
            set.push_str(" REMOVE fi");
        }
        match &read.folded_into {
            None => condition.push_str(" AND attribute_not_exists(fi)"),
            Some(into) => {
                condition.push_str(" AND (fi = :wasfi OR attribute_not_exists(fi))");
                update = update.expression_attribute_values(":wasfi", s(into.to_string()));
            }
        }
        let update = update
            .update_expression(set)
            .condition_expression(condition)
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Stores one memory's vector if the memory exists: its id when it does not.
    async fn set_vector(&self, m: &Memory) -> Result<Option<MemoryId>, StoreError> {
        let Some(e) = &m.embedding else {
            return Ok(None);
        };
        let written = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&m.agent_id), memory_sk(&m.id))))
            .condition_expression("attribute_exists(pk)")
            .update_expression("SET vec = :vec, vm = :vm")
            .expression_attribute_values(
                ":vec",
                AttributeValue::B(Blob::new(
                    e.values.iter().map(|v| *v as u8).collect::<Vec<u8>>(),
                )),
            )
            .expression_attribute_values(":vm", s(e.model.clone()))
            .send()
            .await;
        match written {
            Ok(_) => Ok(None),
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(Some(m.id.clone())),
                other => Err(StoreError::backend("dynamodb", "store vector", other)),
            },
        }
    }

    fn bump_memory_version(&self, agent: &AgentId) -> Result<TransactWriteItem, StoreError> {
        let bump = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(agent), VERSION_SK.to_owned())))
            .update_expression("ADD v :one")
            .expression_attribute_values(":one", n(1))
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().update(bump).build())
    }

    async fn write_with_bump(
        &self,
        op: &'static str,
        agent: &AgentId,
        mut items: Vec<TransactWriteItem>,
    ) -> Result<(), StoreError> {
        items.push(self.bump_memory_version(agent)?);
        match self.transact(op, items).await? {
            Ok(()) => Ok(()),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                op,
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }
}

#[async_trait]
impl MemoryStore for DynamoStore {
    async fn remember(&self, memories: &[Memory]) -> Result<(), StoreError> {
        let Some(first) = memories.first() else {
            return Ok(());
        };
        // A transaction holds 100 items: 99 memories and the version each.
        for chunk in memories.chunks(99) {
            let items = chunk
                .iter()
                .map(|m| self.put(memory_item(m), None))
                .collect::<Result<Vec<_>, _>>()?;
            self.write_with_bump("write memories", &first.agent_id, items)
                .await?;
        }
        Ok(())
    }

    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.query_prefix("read memories", &agent_pk(agent), "ME#", true, Some(limit))
            .await?
            .iter()
            .map(read_memory)
            .collect()
    }

    async fn all_memories(&self, agent: &AgentId) -> Result<Vec<Memory>, StoreError> {
        self.query_prefix("read memories", &agent_pk(agent), "ME#", false, None)
            .await?
            .iter()
            .map(read_memory)
            .collect()
    }

    async fn get_memory(
        &self,
        agent: &AgentId,
        id: &MemoryId,
    ) -> Result<Option<Memory>, StoreError> {
        self.get("read memory", key(agent_pk(agent), memory_sk(id)))
            .await?
            .as_ref()
            .map(read_memory)
            .transpose()
    }

    async fn memory_version(&self, agent: &AgentId) -> Result<u64, StoreError> {
        let item = self
            .get(
                "read memory version",
                key(agent_pk(agent), VERSION_SK.to_owned()),
            )
            .await?;
        Ok(item
            .as_ref()
            .and_then(|i| i.get("v"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    async fn reinforce(&self, memories: &[Memory]) -> Result<Vec<MemoryId>, StoreError> {
        let calls: Vec<_> = memories.iter().map(|m| self.reinforce_one(m)).collect();
        let written: Vec<Result<Option<MemoryId>, StoreError>> = futures::stream::iter(calls)
            .buffer_unordered(8)
            .collect()
            .await;
        written.into_iter().filter_map(Result::transpose).collect()
    }

    async fn change(&self, agent: &AgentId, changes: &[MemoryChange]) -> Result<bool, StoreError> {
        if changes.is_empty() {
            return Ok(true);
        }
        if changes.len() > MAX_CHANGES {
            return Err(crate::ports::too_many_changes("dynamodb", changes.len()));
        }
        let mut items = changes
            .iter()
            .map(|c| self.change_item(c))
            .collect::<Result<Vec<_>, _>>()?;
        items.push(self.bump_memory_version(agent)?);
        match self.transact("change memories", items).await? {
            Ok(()) => Ok(true),
            Err(reasons) if reasons.iter().any(|r| is_ccf(Some(r))) => Ok(false),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "change memories",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn set_vectors(
        &self,
        agent: &AgentId,
        memories: &[Memory],
    ) -> Result<Vec<MemoryId>, StoreError> {
        let calls: Vec<_> = memories.iter().map(|m| self.set_vector(m)).collect();
        let written: Vec<Result<Option<MemoryId>, StoreError>> = futures::stream::iter(calls)
            .buffer_unordered(8)
            .collect()
            .await;
        let missed = written
            .into_iter()
            .filter_map(Result::transpose)
            .collect::<Result<Vec<_>, _>>()?;
        if missed.len() < memories.len() {
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(agent_pk(agent), VERSION_SK.to_owned())))
                .update_expression("ADD v :one")
                .expression_attribute_values(":one", n(1))
                .send()
                .await
                .map_err(|e| {
                    StoreError::backend("dynamodb", "bump memory version", e.into_service_error())
                })?;
        }
        Ok(missed)
    }

    async fn forget(&self, agent: &AgentId, id: &MemoryId) -> Result<bool, StoreError> {
        let delete = aws_sdk_dynamodb::types::Delete::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(agent), memory_sk(id))))
            .condition_expression("attribute_exists(pk)")
            .build()
            .map_err(backend("build transaction"))?;
        let items = vec![
            TransactWriteItem::builder().delete(delete).build(),
            self.bump_memory_version(agent)?,
        ];
        match self.transact("forget memory", items).await? {
            Ok(()) => Ok(true),
            Err(reasons) if is_ccf(reasons.first()) => Ok(false),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "forget memory",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }
}
