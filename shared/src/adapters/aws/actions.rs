//! The action log on DynamoDB.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{Action, ActionId, AgentId, Event, EventCursor};
use crate::error::StoreError;
use crate::ports::{ActionLog, Writer};

#[async_trait]
impl ActionLog for DynamoStore {
    async fn start_action(&self, action: &Action) -> Result<Option<Action>, StoreError> {
        self.put_new("start action", action_item(action))
            .await?
            .map(|i| read_doc(&i))
            .transpose()
    }

    async fn restart_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(action, expected_attempt, "=", "RUNNING", "restart action")
            .await
    }

    async fn retry_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(action, expected_attempt, "<>", "RUNNING", "retry action")
            .await
    }

    async fn settle_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(action, expected_attempt, "=", "UNKNOWN", "settle action")
            .await
    }

    async fn finish_action(
        &self,
        action: &Action,
        new_events: &[Event],
        writer: Writer,
    ) -> Result<(), StoreError> {
        let conflict = || {
            StoreError::Conflict(format!(
                "action {} is no longer RUNNING at attempt {}; another run took it over",
                action.id, action.attempt
            ))
        };
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(action_item(action)))
            .condition_expression("#status = :running AND attempt = :attempt")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":running", s("RUNNING"))
            .expression_attribute_values(":attempt", n(action.attempt))
            .build()
            .map_err(backend("build transaction"))?;
        let mut items = vec![TransactWriteItem::builder().put(put).build()];
        for e in new_events {
            items.push(self.put(event_item(e), None)?);
        }
        match self.transact_events("finish action", items, writer).await? {
            Ok(()) => Ok(()),
            Err(reasons) if is_ccf(reasons.first()) => Err(conflict()),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "finish action",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn get_action(
        &self,
        agent: &AgentId,
        id: &ActionId,
    ) -> Result<Option<Action>, StoreError> {
        // Filed by (event, tool), not by id: the newest first, a page at a time.
        let found = self
            .query_range(
                "find action",
                &agent_pk(agent),
                "AC#"..="AC#~",
                true,
                1,
                1_000,
                |item| {
                    let action: Action = read_doc(&item)?;
                    Ok((action.id == *id).then_some(action))
                },
            )
            .await?;
        Ok(found.into_iter().next())
    }

    async fn list_actions(&self, agent: &AgentId, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.query_prefix("list actions", &agent_pk(agent), "AC#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }

    async fn actions_between(
        &self,
        agent: &AgentId,
        after: &EventCursor,
        through: &EventCursor,
        limit: usize,
    ) -> Result<Vec<Action>, StoreError> {
        // Action keys are `AC#<event id>#<tool>`: from just past the lower cursor to past
        // every tool of the upper one (`#` < any tool name's characters < `~`).
        let lo = format!("AC#{}#~", after.as_str());
        let hi = format!("AC#{}#~", through.as_str());
        self.query_between(
            "list actions",
            &agent_pk(agent),
            lo.as_str()..=hi.as_str(),
            false,
            limit,
            |a: &Action| after.is_before(&a.event_id) && through.covers(&a.event_id),
        )
        .await
    }
}

impl DynamoStore {
    /// Writes `action` over the stored one if that is at `expected_attempt` and its
    /// status passes `status` (`#status = :running`, or `<>`); false otherwise.
    async fn replace_action(
        &self,
        action: &Action,
        expected_attempt: u32,
        compare: &str,
        status: &str,
        op: &'static str,
    ) -> Result<bool, StoreError> {
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(action_item(action)))
            .condition_expression(format!("#status {compare} :status AND attempt = :expected"))
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":status", s(status))
            .expression_attribute_values(":expected", n(expected_attempt))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }
}
