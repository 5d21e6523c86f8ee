//! The DynamoDB store and the table operations its ports share: reads, conditional
//! puts, transactions, batches, prefix queries, sealed records.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, Put, PutRequest, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, WriteRequest,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::codec::*;
use super::keys::*;
use crate::domain::Heartbeat;
use crate::error::StoreError;
use crate::ports::Writer;
use crate::sealing::{EncryptionKeys, SealError, SealedRecord, Stored, open_or_mark};

/// Pulse's records in one DynamoDB table.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    pub(super) client: aws_sdk_dynamodb::Client,
    pub(super) table: String,
    pub(super) event_write_timeout: Duration,
    /// Seals the secrets of webhooks and hooks.
    pub(super) keys: EncryptionKeys,
    /// `PULSE_RETENTION`: the TTL written with hook deliveries and webhook request logs.
    pub(super) retention: crate::domain::Retention,
    /// Whether DynamoDB answered the last attempt: what `/healthz` reports.
    pub(super) reachable: super::reachable::Reachability,
}

impl DynamoStore {
    /// The store in `table`. Event appends give up after `event_write_timeout`, which
    /// must stay below the engine's event settle time: an event that became visible
    /// later than that could land behind a window that was already read.
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: impl Into<String>,
        event_write_timeout: Duration,
    ) -> Self {
        // The client as given, watched by what `/healthz` reads.
        let reachable = super::reachable::Reachability::default();
        let client = aws_sdk_dynamodb::Client::from_conf(
            client
                .config()
                .to_builder()
                .interceptor(reachable.clone())
                .build(),
        );
        Self {
            client,
            table: table.into(),
            event_write_timeout,
            keys: EncryptionKeys::none(),
            retention: crate::domain::Retention::DEFAULT,
            reachable,
        }
    }

    /// Seals secrets with `keys` (without, writing a secret fails, saying so).
    pub fn with_keys(mut self, keys: EncryptionKeys) -> Self {
        self.keys = keys;
        self
    }

    /// Writes hook deliveries and webhook request logs to expire `retention` after they
    /// were made (DynamoDB's TTL removes them at no cost).
    pub fn with_retention(mut self, retention: crate::domain::Retention) -> Self {
        self.retention = retention;
        self
    }

    /// When something made at `t` expires, in seconds (what the TTL attribute holds).
    pub(super) fn expires_at(&self, t: jiff::Timestamp) -> i64 {
        t.as_second() + self.retention.duration().as_secs()
    }

    /// Applies `update` to a heartbeat if it is still EXECUTING under `hb`'s claim; false
    /// if the claim was lost.
    pub(super) async fn update_held_claim<const N: usize>(
        &self,
        hb: &Heartbeat,
        op: &'static str,
        update: &str,
        values: [(&str, AttributeValue); N],
    ) -> Result<bool, StoreError> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&hb.agent_id), heartbeat_sk(hb.beat))))
            .update_expression(update)
            .condition_expression("#status = :executing AND #claim = :claim")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#claim", "claim")
            .expression_attribute_values(":executing", s("EXECUTING"))
            .expression_attribute_values(":claim", n(hb.claim));
        for (name, value) in values {
            req = req.expression_attribute_values(name, value);
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    /// Opens a record whose secrets are sealed (one no configured key opens is read
    /// marked unreadable: [`open_or_mark`]). With `reseal`, one stored stale (plain,
    /// or under an old key) is sealed with the current key and put back, conditional on
    /// its document being unchanged (a lost race leaves the other writer's version).
    pub(super) async fn open_sealed<T: Serialize + for<'de> Deserialize<'de> + SealedRecord>(
        &self,
        item: Item,
        reseal: bool,
    ) -> Result<T, StoreError> {
        let (record, state) = open_or_mark(&self.keys, read_doc::<T>(&item)?);
        if state == Stored::Stale && reseal {
            let sealed = match record.sealed(&self.keys) {
                Ok(s) => s,
                Err(SealError::NoKey) => return Ok(record),
                Err(e) => return Err(e.into()),
            };
            let old = item.get("doc").cloned().unwrap_or_else(|| s(""));
            let mut new = item;
            new.insert(
                "doc".to_owned(),
                s(serde_json::to_string(&sealed).unwrap_or_default()),
            );
            let r = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(new))
                .condition_expression("doc = :old")
                .expression_attribute_values(":old", old)
                .send()
                .await;
            if let Err(e) = r {
                match e.into_service_error() {
                    aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(_) => {}
                    other => return Err(StoreError::backend("dynamodb", "seal a stored secret", other)),
                }
            }
        }
        Ok(record)
    }

    pub(super) async fn get(
        &self,
        op: &'static str,
        key: Item,
    ) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend(op))?;
        Ok(out.item)
    }

    /// The id stored in attribute `attr` of the item at `key`, if the item exists.
    pub(super) async fn get_id<T>(
        &self,
        op: &'static str,
        key: Item,
        attr: &str,
        parse: fn(&str) -> Result<T, crate::error::ValidationError>,
    ) -> Result<Option<T>, StoreError> {
        let at = || {
            format!(
                "{}/{}",
                key.get("pk").and_then(|v| v.as_s().ok()).map_or("?", |v| v),
                key.get("sk").and_then(|v| v.as_s().ok()).map_or("?", |v| v)
            )
        };
        let Some(item) = self.get(op, key.clone()).await? else {
            return Ok(None);
        };
        let id = item
            .get(attr)
            .and_then(|v| v.as_s().ok())
            .ok_or_else(|| StoreError::corrupt(at(), format!("no {attr}")))?;
        parse(id)
            .map(Some)
            .map_err(|e| StoreError::corrupt(at(), e))
    }

    /// At most `limit` documents of a partition with sort keys in `keys`, in key order
    /// (reversed when `newest_first`), that pass `keep`: the bounds a key condition can
    /// express, refined by `keep` for what it cannot (exclusive ends, key suffixes).
    pub(super) async fn query_between<T: serde::de::DeserializeOwned>(
        &self,
        op: &'static str,
        pk: &str,
        keys: std::ops::RangeInclusive<&str>,
        newest_first: bool,
        limit: usize,
        keep: impl Fn(&T) -> bool,
    ) -> Result<Vec<T>, StoreError> {
        self.query_range(op, pk, keys, newest_first, limit, limit, |item| {
            let doc: T = read_doc(&item)?;
            Ok(keep(&doc).then_some(doc))
        })
        .await
    }

    /// At most `limit` items of a partition with sort keys in `keys`, read consistently
    /// `page` at a time (at most 1,000), as `decode` makes them (it skips those it gives
    /// `None` for).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn query_range<T>(
        &self,
        op: &'static str,
        pk: &str,
        keys: std::ops::RangeInclusive<&str>,
        newest_first: bool,
        limit: usize,
        page: usize,
        decode: impl Fn(Item) -> Result<Option<T>, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut found = Vec::new();
        let mut start_key = None;
        while found.len() < limit {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND sk BETWEEN :lo AND :hi")
                .expression_attribute_values(":pk", s(pk))
                .expression_attribute_values(":lo", s(*keys.start()))
                .expression_attribute_values(":hi", s(*keys.end()))
                .scan_index_forward(!newest_first)
                .consistent_read(true)
                .limit((limit - found.len()).max(page).clamp(1, 1_000) as i32)
                .set_exclusive_start_key(start_key)
                .send()
                .await
                .map_err(backend(op))?;
            for item in out.items.unwrap_or_default() {
                found.extend(decode(item)?);
            }
            start_key = out.last_evaluated_key;
            if start_key.is_none() {
                break;
            }
        }
        found.truncate(limit);
        Ok(found)
    }

    /// All items of a partition whose sort key begins with `prefix`, in key order.
    pub(super) async fn query_prefix(
        &self,
        op: &'static str,
        pk: &str,
        prefix: &str,
        newest_first: bool,
        limit: Option<usize>,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let mut q = self
                .client
                .query()
                .table_name(&self.table)
                .expression_attribute_values(":pk", s(pk));
            // DynamoDB rejects an empty begins_with operand: a whole partition is `pk =`.
            q = if prefix.is_empty() {
                q.key_condition_expression("pk = :pk")
            } else {
                q.key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                    .expression_attribute_values(":prefix", s(prefix))
            };
            let out = q
                .scan_index_forward(!newest_first)
                .set_limit(limit.map(|l| (l - items.len()).min(i32::MAX as usize) as i32))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(backend(op))?;
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() || limit.is_some_and(|l| items.len() >= l) {
                return Ok(items);
            }
        }
    }

    /// Puts `item` if no item has its key; returns the existing item otherwise.
    ///
    /// Each put carries a mark of its own (`put_token`). When its answer is lost the SDK
    /// sends it again, and the item it then finds is the one it wrote: the mark tells
    /// that apart from an item someone else wrote first, so the caller is told it
    /// created it.
    pub(super) async fn put_new(
        &self,
        op: &'static str,
        mut item: Item,
    ) -> Result<Option<Item>, StoreError> {
        let token = ulid::Ulid::new().to_string();
        item.insert("put_token".to_owned(), AttributeValue::S(token.clone()));
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match r {
            Ok(_) => Ok(None),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    let found = c.item.unwrap_or_default();
                    if found.get("put_token").and_then(|t| t.as_s().ok()) == Some(&token) {
                        tracing::info!(op, "a put's answer was lost and it was sent again: the item is the one it wrote");
                        return Ok(None);
                    }
                    Ok(Some(found))
                }
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    /// The override that bounds a request writing events from outside the agent's
    /// session by the event write timeout.
    pub(super) fn event_write_config(&self) -> aws_sdk_dynamodb::config::Builder {
        let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .operation_timeout(self.event_write_timeout)
            .build();
        aws_sdk_dynamodb::config::Builder::default().timeout_config(timeouts)
    }

    /// Runs a transaction; returns the cancellation reason codes if it was cancelled.
    pub(super) async fn transact(
        &self,
        op: &'static str,
        items: Vec<TransactWriteItem>,
    ) -> Result<Result<(), Vec<String>>, StoreError> {
        self.transact_events(op, items, Writer::Session).await
    }

    /// [`Self::transact`] for a transaction that appends events `writer` wrote: from
    /// outside the agent's session it gives up after the event write timeout, as
    /// `append` does, so that its events are visible within the settle time or not at
    /// all.
    pub(super) async fn transact_events(
        &self,
        op: &'static str,
        items: Vec<TransactWriteItem>,
        writer: Writer,
    ) -> Result<Result<(), Vec<String>>, StoreError> {
        let mut call = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .customize();
        if writer == Writer::Outside {
            call = call.config_override(self.event_write_config());
        }
        let r = call.send().await;
        match r {
            Ok(_) => Ok(Ok(())),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c) => {
                    Ok(Err(c
                        .cancellation_reasons()
                        .iter()
                        .map(|r| r.code().unwrap_or("None").to_owned())
                        .collect()))
                }
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    /// Writes up to 25 items, resubmitting what DynamoDB leaves unprocessed (throttling)
    /// with a growing pause.
    pub(super) async fn batch_put(&self, batch: Vec<Item>) -> Result<(), StoreError> {
        let requests: Vec<WriteRequest> = batch
            .into_iter()
            .map(|item| {
                PutRequest::builder()
                    .set_item(Some(item))
                    .build()
                    .map(|p| WriteRequest::builder().put_request(p).build())
                    .map_err(backend("batch write"))
            })
            .collect::<Result<_, _>>()?;
        self.batch_write("batch write", requests).await
    }

    /// Deletes the items with these keys, 25 per request, a few requests at once.
    pub(super) async fn batch_delete(
        &self,
        op: &'static str,
        keys: Vec<Item>,
    ) -> Result<(), StoreError> {
        let batches: Vec<Vec<WriteRequest>> = keys
            .chunks(25)
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|k| {
                        DeleteRequest::builder()
                            .set_key(Some(k.clone()))
                            .build()
                            .map(|d| WriteRequest::builder().delete_request(d).build())
                            .map_err(backend(op))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()?;
        let results: Vec<Result<(), StoreError>> = futures::stream::iter(batches)
            .map(|batch| self.batch_write(op, batch))
            .buffer_unordered(4)
            .collect()
            .await;
        results.into_iter().collect()
    }

    async fn batch_write(
        &self,
        op: &'static str,
        mut requests: Vec<WriteRequest>,
    ) -> Result<(), StoreError> {
        for attempt in 0..10u32 {
            let out = self
                .client
                .batch_write_item()
                .request_items(&self.table, requests)
                .send()
                .await
                .map_err(backend(op))?;
            requests = out
                .unprocessed_items
                .and_then(|mut m| m.remove(&self.table))
                .unwrap_or_default();
            if requests.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
        }
        Err(StoreError::backend(
            "dynamodb",
            op,
            format!(
                "{} items still unprocessed after 10 attempts; run it again",
                requests.len()
            ),
        ))
    }

    /// The keys (`pk`, `sk`) of every item of a partition, read consistently.
    pub(super) async fn partition_keys(
        &self,
        op: &'static str,
        pk: &str,
    ) -> Result<Vec<Item>, StoreError> {
        self.read_partition(op, pk, Some("pk, sk")).await
    }

    /// Every item of a partition, in key order, read consistently.
    pub(super) async fn query_partition_consistently(
        &self,
        op: &'static str,
        pk: &str,
    ) -> Result<Vec<Item>, StoreError> {
        self.read_partition(op, pk, None).await
    }

    async fn read_partition(
        &self,
        op: &'static str,
        pk: &str,
        projection: Option<&str>,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", s(pk))
                .set_projection_expression(projection.map(str::to_owned))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(backend(op))?;
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(items);
            }
        }
    }

    /// Deletes the item with `key`, `NotFound` (naming `what`) if there is none.
    pub(super) async fn delete_existing(
        &self,
        op: &'static str,
        key: Item,
        what: String,
    ) -> Result<(), StoreError> {
        let r = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .condition_expression("attribute_exists(pk)")
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(_) => {
                    Err(StoreError::NotFound(what))
                }
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    pub(super) fn put(
        &self,
        item: Item,
        condition: Option<&str>,
    ) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .set_condition_expression(condition.map(str::to_owned))
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}
