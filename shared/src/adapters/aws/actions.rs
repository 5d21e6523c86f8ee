//! The action log on DynamoDB.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{
    Action, ActionId, AgentId, COUNT_DAYS, CountChange, Event, EventCursor, EventId, ToolCount,
    ToolName, hour_of,
};
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
        self.replace_action(
            action,
            expected_attempt,
            "=",
            "RUNNING",
            "restart action",
            None,
        )
        .await
    }

    async fn retry_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(
            action,
            expected_attempt,
            "<>",
            "RUNNING",
            "retry action",
            None,
        )
        .await
    }

    async fn settle_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.replace_action(
            action,
            expected_attempt,
            "=",
            "UNKNOWN",
            "settle action",
            CountChange::settled(action),
        )
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
        if let Some(change) = CountChange::finished(action) {
            items.push(self.add_count(&change)?);
        }
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

    async fn action_on(
        &self,
        agent: &AgentId,
        event: &EventId,
        tool: &ToolName,
    ) -> Result<Option<Action>, StoreError> {
        self.get(
            "read action",
            key(agent_pk(agent), format!("AC#{event}#{tool}")),
        )
        .await?
        .as_ref()
        .map(read_doc)
        .transpose()
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

    async fn tool_counts(
        &self,
        from: jiff::Timestamp,
        through: jiff::Timestamp,
        agent: Option<&AgentId>,
    ) -> Result<Vec<ToolCount>, StoreError> {
        let (mut from, through) = (hour_of(from), hour_of(through));
        // Nothing older than the counts' TTL is read (nor, mostly, kept).
        from = from.max(through - (COUNT_DAYS + 1) * 24);
        let prefix = agent.map_or(String::new(), |a| format!("{a}#"));
        let mut out = Vec::new();
        let mut day = from.div_euclid(24) * 24;
        while day <= through {
            let pk = tool_count_pk(day);
            for item in self
                .query_prefix("read tool counts", &pk, &prefix, false, None)
                .await?
            {
                let count = read_count(&pk, &item)?;
                if (from..=through).contains(&count.hour) {
                    out.push(count);
                }
            }
            day += 24;
        }
        Ok(out)
    }
}

/// One hour's counts as filed by [`DynamoStore::add_count`].
fn read_count(pk: &str, item: &Item) -> Result<ToolCount, StoreError> {
    let sk = item.get("sk").and_then(|v| v.as_s().ok()).map_or("", |s| s);
    let corrupt = || {
        StoreError::corrupt(
            format!("{pk}/{sk}"),
            "a tool count not keyed <agent>#<hour>#<tool>",
        )
    };
    let mut parts = sk.splitn(3, '#');
    let (Some(agent), Some(hour), Some(tool)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(corrupt());
    };
    let number = |k: &str| {
        item.get(k)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    Ok(ToolCount {
        hour: hour.parse().map_err(|_| corrupt())?,
        agent_id: AgentId::parse(agent)
            .map_err(|e| StoreError::corrupt(format!("{pk}/{sk}"), e))?,
        tool: tool.to_owned(),
        succeeded: number("succeeded"),
        failed: number("failed"),
        unknown: number("unknown"),
        times: item
            .keys()
            .filter_map(|k| k.strip_prefix(TIME_PREFIX)?.parse::<u8>().ok())
            .map(|b| (b, number(&format!("{TIME_PREFIX}{b}"))))
            .collect(),
    })
}

/// A count's calls by time are attributes `ms<bucket>`, one per bucket that has calls.
const TIME_PREFIX: &str = "ms";

impl DynamoStore {
    /// The update that adds one write's change to its tool's hourly counts, and moves
    /// their expiry [`COUNT_DAYS`] past the hour.
    fn add_count(&self, c: &CountChange) -> Result<TransactWriteItem, StoreError> {
        let mut expr =
            "SET #expires = :expires ADD succeeded :s, failed :f, #unknown :u".to_owned();
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(
                tool_count_pk(c.hour),
                tool_count_sk(&c.agent_id, c.hour, &c.tool),
            )))
            .expression_attribute_names("#expires", super::TTL_ATTRIBUTE)
            .expression_attribute_names("#unknown", "unknown")
            .expression_attribute_values(":expires", n((c.hour + 1) * 3600 + COUNT_DAYS * 86_400))
            .expression_attribute_values(":s", n(c.succeeded))
            .expression_attribute_values(":f", n(c.failed))
            .expression_attribute_values(":u", n(c.unknown));
        if let Some(b) = c.time {
            expr.push_str(&format!(", {TIME_PREFIX}{b} :one"));
            update = update.expression_attribute_values(":one", n(1));
        }
        let update = update
            .update_expression(expr)
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Writes `action` over the stored one if that is at `expected_attempt` and its
    /// status passes `status` (`#status = :running`, or `<>`), and adds `change` to its
    /// tool's counts in the same transaction; false otherwise.
    async fn replace_action(
        &self,
        action: &Action,
        expected_attempt: u32,
        compare: &str,
        status: &str,
        op: &'static str,
        change: Option<CountChange>,
    ) -> Result<bool, StoreError> {
        let condition = format!("#status {compare} :status AND attempt = :expected");
        if let Some(change) = change {
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(action_item(action)))
                .condition_expression(condition)
                .expression_attribute_names("#status", "status")
                .expression_attribute_values(":status", s(status))
                .expression_attribute_values(":expected", n(expected_attempt))
                .build()
                .map_err(backend("build transaction"))?;
            let items = vec![
                TransactWriteItem::builder().put(put).build(),
                self.add_count(&change)?,
            ];
            // No events in it: the writer's deadline does not apply.
            return match self.transact_events(op, items, Writer::Session).await? {
                Ok(()) => Ok(true),
                Err(reasons) if is_ccf(reasons.first()) => Ok(false),
                Err(reasons) => Err(StoreError::backend(
                    "dynamodb",
                    op,
                    format!("transaction cancelled: {}", reasons.join(", ")),
                )),
            };
        }
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(action_item(action)))
            .condition_expression(condition)
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
