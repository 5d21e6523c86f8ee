//! Inbound webhooks on DynamoDB.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | webhook | `WH#<id>` | `WH` |
//! | webhook directory entry | `WEBHOOKS` | `<id>` |
//! | request log entry | `WH#<id>` | `RQ#<request id>` (time-ordered; TTL) |
//! | a minute's count of refused requests (its SUPPRESSED entry) | `WH#<id>` | `RQ#<id derived from the minute>` (TTL); `n` counts them |
//! | remembered replay key (a signed delivery id, or `sha256:` + the signed content's digest) | `WH#<id>` | `DL#<key>` (TTL); `event_id` is empty for a request refused |
//! | hourly counter | `WH#<id>` | `RL#<hour>` (TTL) |
//!
//! A request reads its webhook from the webhook's own partition, not the directory, so
//! traffic to many webhooks spreads over many keys. The counter is one UpdateItem with
//! `ADD` and a condition (never a count over the log); the event, its log entry and the
//! delivery id are one transaction conditional on the delivery id being new.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;

use super::DynamoStore;
use super::codec::*;
use crate::domain::{AcceptOutcome, Acceptance, AgentId};
use crate::domain::{
    EventId, REFUSED_LOG_BUDGET, RateLimit, RequestStatus, Webhook, WebhookId, WebhookRequest,
};
use crate::error::StoreError;
use crate::ports::{WebhookStore, Writer};

const DIRECTORY_PK: &str = "WEBHOOKS";
const WEBHOOK_SK: &str = "WH";

fn webhook_pk(id: &WebhookId) -> String {
    format!("WH#{id}")
}

fn with_ttl(mut item: Item, expires_at_secs: i64) -> Item {
    item.insert("expires_at".to_owned(), n(expires_at_secs));
    item
}

/// A request log entry, expiring (DynamoDB TTL on `expires_at`) `PULSE_RETENTION`
/// after it was received.
fn log_item(r: &WebhookRequest, store: &DynamoStore) -> Item {
    with_ttl(
        doc_item(webhook_pk(&r.webhook_id), format!("RQ#{}", r.id), r),
        store.expires_at(r.received_at),
    )
}

impl DynamoStore {
    /// Every key that is webhook `id`'s: its record and directory entry, then its request
    /// log, replay keys and counters, with how many of those there are.
    pub(super) async fn webhook_keys(
        &self,
        id: &WebhookId,
    ) -> Result<(Vec<Item>, u64), StoreError> {
        let mut keys = vec![
            key(webhook_pk(id), WEBHOOK_SK),
            key(DIRECTORY_PK, id.to_string()),
        ];
        let records: Vec<Item> = self
            .partition_keys("list webhook records", &webhook_pk(id))
            .await?
            .into_iter()
            .filter(|k| {
                k.get("sk")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|sk| sk != WEBHOOK_SK)
            })
            .collect();
        let n = records.len() as u64;
        keys.extend(records);
        Ok((keys, n))
    }

    /// The ids of agent `agent`'s webhooks, from the directory.
    pub(super) async fn webhooks_of(&self, agent: &AgentId) -> Result<Vec<WebhookId>, StoreError> {
        let mut ids = Vec::new();
        for item in self
            .query_prefix("list webhooks", DIRECTORY_PK, "", false, None)
            .await?
        {
            let doc: serde_json::Value = read_doc(&item)?;
            if doc.get("agent_id").and_then(|a| a.as_str()) == Some(agent.as_str())
                && let Some(id) = doc.get("id").and_then(|i| i.as_str())
            {
                ids.push(
                    WebhookId::parse(id)
                        .map_err(|e| StoreError::corrupt("webhook directory", e))?,
                );
            }
        }
        Ok(ids)
    }

    /// What became of a remembered replay key: its event, or `Some(None)` for a request
    /// that was refused.
    async fn remembered(
        &self,
        hook: &WebhookId,
        replay_key: &str,
    ) -> Result<Option<Option<EventId>>, StoreError> {
        self.get_id(
            "read replay key",
            key(webhook_pk(hook), format!("DL#{replay_key}")),
            "event_id",
            |id| match id {
                "" => Ok(None),
                id => EventId::parse(id).map(Some),
            },
        )
        .await
    }

    fn remember_item(&self, a: &Acceptance, event_id: &str) -> Item {
        let mut item = key(
            webhook_pk(&a.log.webhook_id),
            format!("DL#{}", a.replay_key),
        );
        item.insert("event_id".to_owned(), s(event_id));
        with_ttl(item, a.remember_until.as_second())
    }

    async fn answer_duplicate(
        &self,
        a: &Acceptance,
        first: Option<EventId>,
    ) -> Result<AcceptOutcome, StoreError> {
        let outcome = match first {
            Some(first) => AcceptOutcome::Duplicate(first),
            None => AcceptOutcome::RefusedBefore,
        };
        self.log_refused(&a.log_for(&outcome)).await?;
        Ok(outcome)
    }

    async fn write_log(&self, log: &WebhookRequest) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(log_item(log, self)))
            .send()
            .await
            .map_err(backend("log webhook request"))?;
        Ok(())
    }

    /// Logs a request that was not accepted, within the budget: one counter per webhook
    /// and minute, which is also that minute's SUPPRESSED entry, takes one `ADD`; the
    /// first [`REFUSED_LOG_BUDGET`] requests of the minute are also logged in full. A
    /// flood of refused requests then costs one write each and no storage.
    async fn log_refused(&self, r: &WebhookRequest) -> Result<(), StoreError> {
        let summary = WebhookRequest::suppressed(&r.webhook_id, &r.agent_id, r.minute(), 0);
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(
                webhook_pk(&r.webhook_id),
                format!("RQ#{}", summary.id),
            )))
            .update_expression(
                "ADD #n :one SET #doc = if_not_exists(#doc, :doc), expires_at = :exp",
            )
            .expression_attribute_names("#n", "n")
            .expression_attribute_names("#doc", "doc")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(
                ":doc",
                s(serde_json::to_string(&summary).unwrap_or_default()),
            )
            .expression_attribute_values(":exp", n(self.expires_at(summary.received_at)))
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(backend("count refused webhook requests"))?;
        let count = out
            .attributes()
            .and_then(|a| a.get("n"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if count <= REFUSED_LOG_BUDGET {
            self.write_log(r).await?;
        }
        Ok(())
    }

    /// Adds one to the hour's counter unless it has reached the limit.
    async fn count(&self, a: &Acceptance, limit: RateLimit) -> Result<bool, StoreError> {
        let window = RateLimit::window(a.log.received_at);
        let at = key(webhook_pk(&a.log.webhook_id), format!("RL#{window}"));
        self.count_up(
            "count webhook request",
            at,
            limit.per_hour,
            (window + 2) * 3600,
        )
        .await
    }

    /// Adds one to the counter item at `at` unless it has reached `limit`, and sets it
    /// to expire at `expires` (seconds since 1970): false when it had. One conditional
    /// UpdateItem, so every process counting on the table shares the count.
    pub(super) async fn count_up(
        &self,
        op: &'static str,
        at: Item,
        limit: u32,
        expires: i64,
    ) -> Result<bool, StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(at))
            .update_expression("ADD #c :one SET #exp = :exp")
            .condition_expression("attribute_not_exists(#c) OR #c < :limit")
            .expression_attribute_names("#c", "count")
            .expression_attribute_names("#exp", super::TTL_ATTRIBUTE)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":limit", n(limit))
            .expression_attribute_values(":exp", n(expires))
            .return_values(ReturnValue::None)
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }
}

#[async_trait]
impl WebhookStore for DynamoStore {
    async fn create_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        let webhook = &self.keys.seal_webhook(webhook)?;
        let items = vec![
            self.put(
                doc_item(webhook_pk(&webhook.id), WEBHOOK_SK.to_owned(), webhook),
                Some("attribute_not_exists(pk)"),
            )?,
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), webhook.id.to_string(), webhook),
                None,
            )?,
        ];
        match self.transact("create webhook", items).await? {
            Ok(()) => Ok(()),
            Err(_) => Err(StoreError::AlreadyExists(format!("webhook {}", webhook.id))),
        }
    }

    async fn get_webhook(&self, id: &WebhookId) -> Result<Option<Webhook>, StoreError> {
        let Some(item) = self
            .get("get webhook", key(webhook_pk(id), WEBHOOK_SK))
            .await?
        else {
            return Ok(None);
        };
        self.open_sealed(item, true).await.map(Some)
    }

    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .query_prefix("list webhooks", DIRECTORY_PK, "", false, None)
            .await?
        {
            out.push(self.open_sealed(item, false).await?);
        }
        Ok(out)
    }

    async fn update_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        let webhook = &self.keys.seal_webhook(webhook)?;
        let items = vec![
            self.put(
                doc_item(webhook_pk(&webhook.id), WEBHOOK_SK.to_owned(), webhook),
                Some("attribute_exists(pk)"),
            )?,
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), webhook.id.to_string(), webhook),
                None,
            )?,
        ];
        match self.transact("update webhook", items).await? {
            Ok(()) => Ok(()),
            Err(_) => Err(StoreError::NotFound(format!("webhook {}", webhook.id))),
        }
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<(), StoreError> {
        // The record first, so its URL answers 404 at once; then what hangs from it.
        self.delete_existing(
            "delete webhook",
            key(webhook_pk(id), WEBHOOK_SK),
            format!("webhook {id}"),
        )
        .await?;
        let (keys, _) = self.webhook_keys(id).await?;
        self.batch_delete("delete webhook", keys).await
    }

    async fn accept_webhook(&self, a: Arc<Acceptance>) -> Result<AcceptOutcome, StoreError> {
        let a = a.as_ref();
        let hook = &a.log.webhook_id;
        if let Some(first) = self.remembered(hook, &a.replay_key).await? {
            return self.answer_duplicate(a, first).await;
        }
        let (outcome, mut items) = if a.refusal.is_some() {
            (AcceptOutcome::Refused, Vec::new())
        } else {
            if let Some(limit) = a.rate_limit
                && !self.count(a, limit).await?
            {
                let outcome = AcceptOutcome::RateLimited;
                self.log_refused(&a.log_for(&outcome)).await?;
                return Ok(outcome);
            }
            (
                AcceptOutcome::Accepted,
                vec![self.put(event_item(&a.event), None)?],
            )
        };
        let event_id = match outcome {
            AcceptOutcome::Accepted => a.event.id.as_str(),
            _ => "",
        };
        items.push(self.put(log_item(&a.log_for(&outcome), self), None)?);
        items.push(self.put(
            self.remember_item(a, event_id),
            Some("attribute_not_exists(pk)"),
        )?);
        // The event must be visible within the settle time or not at all, as `append`.
        match self
            .transact_events("accept webhook request", items, Writer::Outside)
            .await?
        {
            Ok(()) => Ok(outcome),
            Err(reasons) if reasons.iter().any(|r| is_ccf(Some(r))) => {
                // Another request with this key won the race: answer as it was.
                let first = self.remembered(hook, &a.replay_key).await?.ok_or_else(|| {
                    StoreError::Conflict(format!(
                        "request {} of webhook {hook} is being accepted by another request",
                        a.replay_key
                    ))
                })?;
                self.answer_duplicate(a, first).await
            }
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "accept webhook request",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn log_request(&self, request: &WebhookRequest) -> Result<(), StoreError> {
        self.log_refused(request).await
    }

    async fn list_requests(
        &self,
        id: &WebhookId,
        limit: usize,
    ) -> Result<Vec<WebhookRequest>, StoreError> {
        let items = self
            .query_prefix(
                "list webhook requests",
                &webhook_pk(id),
                "RQ#",
                true,
                Some(limit),
            )
            .await?;
        let mut out = Vec::with_capacity(items.len());
        for item in &items {
            let mut r: WebhookRequest = read_doc(item)?;
            if r.status == RequestStatus::Suppressed {
                // A minute's counter: an entry only once it counts past the budget.
                let count = item
                    .get("n")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if count <= REFUSED_LOG_BUDGET {
                    continue;
                }
                r.count = Some(count - REFUSED_LOG_BUDGET);
            }
            out.push(r);
        }
        Ok(out)
    }
}
