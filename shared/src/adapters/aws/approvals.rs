//! Calls parked for a person's approval on DynamoDB.
//!
//! Each approval is an `AP#<id>` document in its agent's partition (listed newest first,
//! deleted with the agent), with its status beside the document for the decision's
//! condition. Until it is settled (open) a copy is filed in the `APPROVALS` partition
//! under `<expires ms>#<id>`, so the sweep finds the open approvals of every agent,
//! soonest to expire first, with one query. Parking writes both in one transaction; the
//! decision — conditional on the status still being pending — updates both in one
//! transaction; settling writes the outcome and removes the copy in one.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Approval, ApprovalId, to_ms};
use crate::error::StoreError;
use crate::ports::ApprovalStore;

/// The partition of the open approvals of every agent.
pub(super) const PENDING_PK: &str = "APPROVALS";

/// Beside an approval's document once its owner was asked on Discord.
const ASKED: &str = "asked";

fn approval_sk(id: &ApprovalId) -> String {
    format!("AP#{id}")
}

/// An open approval's key in [`PENDING_PK`]: by when it expires, then its id.
pub(super) fn pending_sk(a: &Approval) -> String {
    format!("{:013}#{}", to_ms(a.expires_at).max(0), a.id)
}

fn approval_item(a: &Approval) -> Item {
    let mut item = doc_item(agent_pk(&a.agent_id), approval_sk(&a.id), a);
    item.insert("status".to_owned(), s(a.status.as_str()));
    item
}

impl DynamoStore {
    async fn read_approval(
        &self,
        op: &'static str,
        agent: &AgentId,
        id: &ApprovalId,
    ) -> Result<Option<Approval>, StoreError> {
        self.get(op, key(agent_pk(agent), approval_sk(id)))
            .await?
            .as_ref()
            .map(read_doc)
            .transpose()
    }
}

#[async_trait]
impl ApprovalStore for DynamoStore {
    async fn park_approval(&self, approval: &Approval) -> Result<Option<Approval>, StoreError> {
        let op = "park approval";
        let mut items = vec![self.put(approval_item(approval), Some("attribute_not_exists(pk)"))?];
        if approval.outcome.is_none() {
            items.push(self.put(
                doc_item(PENDING_PK.to_owned(), pending_sk(approval), approval),
                None,
            )?);
        }
        match self.transact(op, items).await? {
            Ok(()) => Ok(None),
            Err(reasons) if is_ccf(reasons.first()) => {
                match self
                    .read_approval(op, &approval.agent_id, &approval.id)
                    .await?
                {
                    Some(stored) => Ok(Some(stored)),
                    None => Err(StoreError::backend(
                        "dynamodb",
                        op,
                        format!("approval {} was refused but is not stored", approval.id),
                    )),
                }
            }
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                op,
                format!("transaction cancelled: {reasons:?}"),
            )),
        }
    }

    async fn get_approval(
        &self,
        agent: &AgentId,
        id: &ApprovalId,
    ) -> Result<Option<Approval>, StoreError> {
        self.read_approval("read approval", agent, id).await
    }

    async fn approvals(&self, agent: &AgentId, limit: usize) -> Result<Vec<Approval>, StoreError> {
        self.query_between(
            "read approvals",
            &agent_pk(agent),
            "AP#"..="AP#~",
            true,
            limit,
            |_: &Approval| true,
        )
        .await
    }

    async fn open_approvals(&self, limit: usize) -> Result<Vec<Approval>, StoreError> {
        self.query_between(
            "read open approvals",
            PENDING_PK,
            "0"..="9~",
            false,
            limit,
            |_: &Approval| true,
        )
        .await
    }

    async fn decide_approval(&self, decided: &Approval) -> Result<Option<Approval>, StoreError> {
        let op = "decide approval";
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(
                agent_pk(&decided.agent_id),
                approval_sk(&decided.id),
            )))
            .update_expression("SET #doc = :doc, #status = :status")
            .condition_expression("#status = :pending")
            .expression_attribute_names("#doc", "doc")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(
                ":doc",
                s(serde_json::to_string(decided).unwrap_or_default()),
            )
            .expression_attribute_values(":status", s(decided.status.as_str()))
            .expression_attribute_values(":pending", s("pending"))
            .build()
            .map_err(backend("build transaction"))?;
        // The open copy is updated, not put: the sweeper expires approvals with the
        // UpdateItem its role holds for its claims, and no PutItem.
        let copy = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(PENDING_PK, pending_sk(decided))))
            .update_expression("SET #doc = :doc")
            .expression_attribute_names("#doc", "doc")
            .expression_attribute_values(
                ":doc",
                s(serde_json::to_string(decided).unwrap_or_default()),
            )
            .build()
            .map_err(backend("build transaction"))?;
        let items = vec![
            TransactWriteItem::builder().update(update).build(),
            TransactWriteItem::builder().update(copy).build(),
        ];
        match self.transact(op, items).await? {
            Ok(()) => Ok(None),
            Err(reasons) if is_ccf(reasons.first()) => {
                match self
                    .read_approval(op, &decided.agent_id, &decided.id)
                    .await?
                {
                    Some(stored) => Ok(Some(stored)),
                    None => Err(StoreError::NotFound(format!("approval {}", decided.id))),
                }
            }
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                op,
                format!("transaction cancelled: {reasons:?}"),
            )),
        }
    }

    async fn settle_approval(&self, settled: &Approval) -> Result<(), StoreError> {
        let op = "settle approval";
        let Some(mut stored) = self
            .read_approval(op, &settled.agent_id, &settled.id)
            .await?
        else {
            return Err(StoreError::NotFound(format!("approval {}", settled.id)));
        };
        if stored.is_pending() {
            return Err(StoreError::Conflict(format!(
                "approval {} is still pending: decide it before settling it",
                settled.id
            )));
        }
        stored.outcome = settled.outcome.clone();
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(approval_item(&stored)))
            .condition_expression("#status = :status")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":status", s(stored.status.as_str()))
            .build()
            .map_err(backend("build transaction"))?;
        let delete = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(key(PENDING_PK, pending_sk(&stored))))
            .build()
            .map_err(backend("build transaction"))?;
        let items = vec![
            TransactWriteItem::builder().put(put).build(),
            TransactWriteItem::builder().delete(delete).build(),
        ];
        match self.transact(op, items).await? {
            Ok(()) => Ok(()),
            Err(_) => Err(StoreError::Conflict(format!(
                "approval {} changed while it was settled",
                settled.id
            ))),
        }
    }

    async fn mark_asked(&self, asked: &Approval) -> Result<bool, StoreError> {
        let op = "mark approval asked";
        let Some(mut stored) = self.read_approval(op, &asked.agent_id, &asked.id).await? else {
            return Err(StoreError::NotFound(format!("approval {}", asked.id)));
        };
        if !stored.is_pending() || stored.asked_at.is_some() {
            return Ok(false);
        }
        stored.asked_at = asked.asked_at;
        // Still pending and not asked by anyone else (marked beside the document), and its
        // copy in the open partition with it.
        let mut item = approval_item(&stored);
        item.insert(ASKED.to_owned(), s("1"));
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("#status = :pending AND attribute_not_exists(#asked)")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#asked", ASKED)
            .expression_attribute_values(":pending", s("pending"))
            .build()
            .map_err(backend("build transaction"))?;
        let items = vec![
            TransactWriteItem::builder().put(put).build(),
            self.put(
                doc_item(PENDING_PK.to_owned(), pending_sk(&stored), &stored),
                None,
            )?,
        ];
        match self.transact(op, items).await? {
            Ok(()) => Ok(true),
            Err(reasons) if is_ccf(reasons.first()) => Ok(false),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                op,
                format!("transaction cancelled: {reasons:?}"),
            )),
        }
    }
}
