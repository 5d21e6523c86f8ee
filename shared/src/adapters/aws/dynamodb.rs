//! The store ports on one DynamoDB table.
//!
//! ## Keys
//!
//! | item | pk | sk |
//! |---|---|---|
//! | event | `AG#<agent>` | `EV#<event id>` (time-ordered) |
//! | agent (live record) | `AG#<agent>` | `EV~` |
//! | heartbeat | `AG#<agent>` | `HB#<beat, 12 digits>` |
//! | action | `AG#<agent>` | `AC#<event id>#<tool>` |
//! | agent directory entry | `AGENTS` | `<agent>` |
//! | tool / subscription | `REG` | `T#<name>` / `S#<id>` |
//! | conversation turn | `AG#<agent>` | `TN#<turn id>` |
//! | conversation message | `AG#<agent>` | `MS#<turn id>.<n>` (time-ordered) |
//! | signal answered by a turn | `AG#<agent>` | `SG#<signal id>` |
//! | memory | `AG#<agent>` | `ME#<memory id>` (time-ordered) |
//! | Discord channel's agent | `CH#<channel id>` | `CH` |
//!
//! Webhooks, their request logs, delivery ids and counters: see [`webhooks`]. Outbound
//! hooks, their deliveries and attempts: see [`hooks`].
//!
//! `EV~` sorts after every `EV#…` key, so the one Query that reads a heartbeat's event
//! window also returns the agent's live record at its end: a heartbeat cycle costs one
//! read, not two.
//!
//! ## The due index
//!
//! A sparse GSI (`due_shard`, `due_at`), keys only. Only live heartbeats carry its keys:
//! PENDING ones with `due_at` = when scheduled, EXECUTING ones with `due_at` = when the
//! lease ends (so an expired lease shows up as due again). Finishing removes them. Agents
//! spread over [`DUE_SHARDS`] partition keys by a hash of their id, so no one key takes the
//! whole fleet's writes. GSIs lag, so every claim re-checks its condition on the item.

mod hooks;
mod webhooks;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, Put, PutRequest, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update, WriteRequest,
};
use futures::StreamExt;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::domain::{
    Action, ActionStatus, Agent, AgentId, ClaimRequest, ConversationMessage, Event, EventCursor,
    EventId, Heartbeat, HeartbeatId, HeartbeatStatus, Memory, Registry, SessionId, SignalId,
    Subscription, SubscriptionId, Tool, ToolName, Turn, TurnId, from_ms, to_ms,
};
use crate::error::StoreError;
use crate::ports::{
    ActionLog, AgentStore, ConversationStore, DuePage, EventLog, Finish, FinishOutcome,
    HeartbeatStore, MemoryStore, PageToken, ToolRegistry, TurnStart, Window,
};
use crate::sealing::{EncryptionKeys, SealError, SealedRecord, Stored};

/// The due index's name.
pub const DUE_INDEX: &str = "due";
/// How many partition keys the due index is spread over. Changing it would strand the
/// heartbeats filed under the old shards, so it is fixed.
pub const DUE_SHARDS: u16 = 16;

const AGENT_SK: &str = "EV~";
const DIRECTORY_PK: &str = "AGENTS";
const REGISTRY_PK: &str = "REG";

type Item = HashMap<String, AttributeValue>;

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn agent_pk(id: &AgentId) -> String {
    format!("AG#{id}")
}

fn event_sk(id: &EventId) -> String {
    format!("EV#{id}")
}

fn heartbeat_sk(beat: u64) -> String {
    format!("HB#{beat:012}")
}

fn action_sk(a: &Action) -> String {
    format!("AC#{}#{}", a.event_id, a.tool)
}

fn due_shard(agent: &AgentId) -> String {
    format!("{:02}", agent.stable_hash() % DUE_SHARDS)
}

fn key(pk: impl Into<String>, sk: impl Into<String>) -> Item {
    HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))])
}

fn backend<E>(op: &'static str) -> impl Fn(E) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| StoreError::backend("dynamodb", op, e)
}

fn doc_item<T: Serialize>(pk: String, sk: String, value: &T) -> Item {
    let mut item = key(pk, sk);
    item.insert(
        "doc".to_owned(),
        s(serde_json::to_string(value).unwrap_or_default()),
    );
    item
}

fn read_doc<T: for<'de> Deserialize<'de>>(item: &Item) -> Result<T, StoreError> {
    let where_ = || {
        format!(
            "{}/{}",
            item.get("pk")
                .and_then(|v| v.as_s().ok())
                .map_or("?", |v| v),
            item.get("sk")
                .and_then(|v| v.as_s().ok())
                .map_or("?", |v| v)
        )
    };
    let doc = item
        .get("doc")
        .and_then(|v| v.as_s().ok())
        .ok_or_else(|| StoreError::corrupt(where_(), "no doc attribute"))?;
    serde_json::from_str(doc).map_err(|e| StoreError::corrupt(where_(), e))
}

fn read_agent(item: &Item) -> Result<Agent, StoreError> {
    let mut agent: Agent = read_doc(item)?;
    // The live record keeps the last interaction beside its doc, updated atomically.
    if let Some(ms) = item.get("last_interaction_at").and_then(|v| v.as_n().ok()) {
        agent.last_interaction_at = ms.parse::<i64>().ok().map(from_ms);
    }
    Ok(agent)
}

fn active_flag(item: &Item) -> Option<bool> {
    item.get("active").and_then(|v| v.as_bool().ok()).copied()
}

fn event_item(e: &Event) -> Item {
    let mut item = doc_item(agent_pk(&e.agent_id), event_sk(&e.id), e);
    if e.cascade.is_some() {
        item.insert("own".to_owned(), AttributeValue::Bool(true));
    }
    item
}

fn action_item(a: &Action) -> Item {
    let mut item = doc_item(agent_pk(&a.agent_id), action_sk(a), a);
    item.insert("status".to_owned(), s(action_status(a.status)));
    item.insert("attempt".to_owned(), n(a.attempt));
    item
}

fn action_status(st: ActionStatus) -> &'static str {
    match st {
        ActionStatus::Running => "RUNNING",
        ActionStatus::Completed => "COMPLETED",
        ActionStatus::Failed => "FAILED",
        ActionStatus::Cancelled => "CANCELLED",
    }
}

/// A heartbeat as stored: plain attributes, since claims and finishes update fields.
#[derive(Serialize, Deserialize)]
struct HeartbeatItem {
    pk: String,
    sk: String,
    agent_id: String,
    beat: u64,
    session: String,
    status: String,
    scheduled_at: i64,
    claim: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed_at: Option<i64>,
    window_start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_end: Option<String>,
    last_interaction_beat: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interaction_seen_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    since_last: Option<u64>,
    consecutive_failures: u32,
    events_processed: u32,
    actions_triggered: u32,
    actions_failed: u32,
    cascade_capped: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_shard: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_at: Option<i64>,
}

impl HeartbeatItem {
    fn from_heartbeat(hb: &Heartbeat) -> Self {
        let due_at = hb.due_at().map(to_ms);
        Self {
            pk: agent_pk(&hb.agent_id),
            sk: heartbeat_sk(hb.beat),
            agent_id: hb.agent_id.to_string(),
            beat: hb.beat,
            session: hb.session.to_string(),
            status: hb.status.as_str().to_owned(),
            scheduled_at: to_ms(hb.scheduled_at),
            claim: hb.claim,
            lease_until: hb.lease_until.map(to_ms),
            started_at: hb.started_at.map(to_ms),
            completed_at: hb.completed_at.map(to_ms),
            window_start: hb.window_start.as_str().to_owned(),
            window_end: hb.window_end.as_ref().map(|c| c.as_str().to_owned()),
            last_interaction_beat: hb.last_interaction_beat,
            interaction_seen_at: hb.interaction_seen_at.map(to_ms),
            since_last: hb.since_last,
            consecutive_failures: hb.consecutive_failures,
            events_processed: hb.events_processed,
            actions_triggered: hb.actions_triggered,
            actions_failed: hb.actions_failed,
            cascade_capped: hb.cascade_capped,
            error: hb.error.clone(),
            due_shard: due_at.map(|_| due_shard(&hb.agent_id)),
            due_at,
        }
    }

    fn into_heartbeat(self) -> Result<Heartbeat, StoreError> {
        let key = format!("{}/{}", self.pk, self.sk);
        Ok(Heartbeat {
            agent_id: AgentId::parse(&self.agent_id).map_err(|e| StoreError::corrupt(&key, e))?,
            beat: self.beat,
            session: SessionId::parse(&self.session).map_err(|e| StoreError::corrupt(&key, e))?,
            status: HeartbeatStatus::parse(&self.status).ok_or_else(|| {
                StoreError::corrupt(&key, format!("unknown status {}", self.status))
            })?,
            scheduled_at: from_ms(self.scheduled_at),
            claim: self.claim,
            lease_until: self.lease_until.map(from_ms),
            started_at: self.started_at.map(from_ms),
            completed_at: self.completed_at.map(from_ms),
            window_start: EventCursor::from_stored(self.window_start),
            window_end: self.window_end.map(EventCursor::from_stored),
            last_interaction_beat: self.last_interaction_beat,
            interaction_seen_at: self.interaction_seen_at.map(from_ms),
            since_last: self.since_last,
            consecutive_failures: self.consecutive_failures,
            events_processed: self.events_processed,
            actions_triggered: self.actions_triggered,
            actions_failed: self.actions_failed,
            cascade_capped: self.cascade_capped,
            error: self.error,
        })
    }
}

fn heartbeat_item(hb: &Heartbeat) -> Result<Item, StoreError> {
    serde_dynamo::to_item(HeartbeatItem::from_heartbeat(hb))
        .map_err(|e| StoreError::corrupt(hb.id().to_string(), e))
}

fn read_heartbeat(item: Item) -> Result<Heartbeat, StoreError> {
    let hb: HeartbeatItem =
        serde_dynamo::from_item(item).map_err(|e| StoreError::corrupt("heartbeat item", e))?;
    hb.into_heartbeat()
}

/// Pulse's records in one DynamoDB table.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
    event_write_timeout: Duration,
    /// Seals the secrets of webhooks and hooks.
    keys: EncryptionKeys,
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
        Self {
            client,
            table: table.into(),
            event_write_timeout,
            keys: EncryptionKeys::none(),
        }
    }

    /// Seals secrets with `keys` (without, writing a secret fails, saying so).
    pub fn with_keys(mut self, keys: EncryptionKeys) -> Self {
        self.keys = keys;
        self
    }

    /// Applies `update` to a heartbeat if it is still EXECUTING under `hb`'s claim; false
    /// if the claim was lost.
    async fn update_held_claim<const N: usize>(
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

    /// Opens a record whose secrets are sealed. With `reseal`, one stored stale (plain,
    /// or under an old key) is sealed with the current key and put back, conditional on
    /// its document being unchanged (a lost race leaves the other writer's version).
    async fn open_sealed<T: Serialize + for<'de> Deserialize<'de> + SealedRecord>(
        &self,
        item: Item,
        reseal: bool,
    ) -> Result<T, StoreError> {
        let mut record: T = read_doc(&item)?;
        if record.open(&self.keys)? == Stored::Stale && reseal {
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

    async fn get(&self, op: &'static str, key: Item) -> Result<Option<Item>, StoreError> {
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
    async fn get_id<T>(
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

    /// All items of a partition whose sort key begins with `prefix`, in key order.
    async fn query_prefix(
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
    async fn put_new(&self, op: &'static str, item: Item) -> Result<Option<Item>, StoreError> {
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
                    Ok(Some(c.item.unwrap_or_default()))
                }
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    /// Sets a boolean `active` attribute on an existing item.
    async fn set_active(
        &self,
        op: &'static str,
        key: Item,
        active: bool,
        what: String,
    ) -> Result<(), StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .update_expression("SET active = :a")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":a", AttributeValue::Bool(active))
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => {
                    Err(StoreError::NotFound(what))
                }
                other => Err(StoreError::backend("dynamodb", op, other)),
            },
        }
    }

    /// Runs a transaction; returns the cancellation reason codes if it was cancelled.
    async fn transact(
        &self,
        op: &'static str,
        items: Vec<TransactWriteItem>,
    ) -> Result<Result<(), Vec<String>>, StoreError> {
        let r = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
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
    async fn batch_put(&self, batch: Vec<Item>) -> Result<(), StoreError> {
        let mut requests: Vec<WriteRequest> = batch
            .into_iter()
            .map(|item| {
                PutRequest::builder()
                    .set_item(Some(item))
                    .build()
                    .map(|p| WriteRequest::builder().put_request(p).build())
                    .map_err(backend("batch write"))
            })
            .collect::<Result<_, _>>()?;
        for attempt in 0..10u32 {
            let out = self
                .client
                .batch_write_item()
                .request_items(&self.table, requests)
                .send()
                .await
                .map_err(backend("batch write"))?;
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
            "batch write",
            format!(
                "{} items still unprocessed after 10 attempts; run the import again",
                requests.len()
            ),
        ))
    }

    fn put(&self, item: Item, condition: Option<&str>) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .set_condition_expression(condition.map(str::to_owned))
            .build()
            .map_err(backend("build transaction"))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

fn encode_page(key: &Item) -> PageToken {
    let map: HashMap<&str, (&str, &str)> = key
        .iter()
        .filter_map(|(k, v)| match v {
            AttributeValue::S(x) => Some((k.as_str(), ("S", x.as_str()))),
            AttributeValue::N(x) => Some((k.as_str(), ("N", x.as_str()))),
            _ => None,
        })
        .collect();
    PageToken(serde_json::to_string(&map).unwrap_or_default())
}

fn decode_page(token: &PageToken) -> Result<Item, StoreError> {
    let map: HashMap<String, (String, String)> =
        serde_json::from_str(&token.0).map_err(|e| StoreError::corrupt("page token", e))?;
    Ok(map
        .into_iter()
        .map(|(k, (t, v))| {
            (
                k,
                if t == "N" {
                    AttributeValue::N(v)
                } else {
                    AttributeValue::S(v)
                },
            )
        })
        .collect())
}

fn is_ccf(code: Option<&String>) -> bool {
    code.is_some_and(|c| c == "ConditionalCheckFailed")
}

fn channel_item(channel: &str, agent: &AgentId) -> Item {
    let mut item = key(format!("CH#{channel}"), "CH");
    item.insert("agent_id".to_owned(), s(agent.as_str()));
    item
}

#[async_trait]
impl AgentStore for DynamoStore {
    async fn agent_for_channel(&self, channel_id: &str) -> Result<Option<AgentId>, StoreError> {
        self.get_id(
            "find channel's agent",
            key(format!("CH#{channel_id}"), "CH"),
            "agent_id",
            AgentId::parse,
        )
        .await
    }

    async fn create_agent(&self, agent: &Agent, first: &Heartbeat) -> Result<(), StoreError> {
        let mut items = vec![
            self.put(
                doc_item(agent_pk(&agent.id), AGENT_SK.to_owned(), agent),
                Some("attribute_not_exists(pk)"),
            )?,
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), agent.id.to_string(), agent),
                None,
            )?,
            self.put(heartbeat_item(first)?, Some("attribute_not_exists(pk)"))?,
        ];
        if let Some(channel) = &agent.discord_channel {
            items.push(self.put(
                channel_item(channel, &agent.id),
                Some("attribute_not_exists(pk)"),
            )?);
        }
        match self.transact("create agent", items).await? {
            Ok(()) => Ok(()),
            Err(reasons) => {
                if agent.discord_channel.is_some()
                    && reasons
                        .get(3)
                        .is_some_and(|r| r == "ConditionalCheckFailed")
                {
                    let channel = agent.discord_channel.as_deref().unwrap_or_default();
                    let other = self.agent_for_channel(channel).await?;
                    return Err(StoreError::AlreadyExists(format!(
                        "an agent for Discord channel {channel} ({})",
                        other.map_or_else(|| "?".to_owned(), |a| a.to_string())
                    )));
                }
                Err(StoreError::AlreadyExists(format!("agent {}", agent.id)))
            }
        }
    }

    async fn import_agents(&self, agents: &[(Agent, Heartbeat)]) -> Result<(), StoreError> {
        let mut items = Vec::with_capacity(agents.len() * 3);
        for (agent, first) in agents {
            items.push(doc_item(agent_pk(&agent.id), AGENT_SK.to_owned(), agent));
            items.push(doc_item(
                DIRECTORY_PK.to_owned(),
                agent.id.to_string(),
                agent,
            ));
            items.push(heartbeat_item(first)?);
            if let Some(channel) = &agent.discord_channel {
                items.push(channel_item(channel, &agent.id));
            }
        }
        let batches: Vec<Vec<Item>> = items.chunks(25).map(<[Item]>::to_vec).collect();
        let results: Vec<Result<(), StoreError>> = futures::stream::iter(batches)
            .map(|batch| self.batch_put(batch))
            .buffer_unordered(4)
            .collect()
            .await;
        results.into_iter().collect()
    }

    async fn get_agent(&self, id: &AgentId) -> Result<Option<Agent>, StoreError> {
        self.get("get agent", key(agent_pk(id), AGENT_SK))
            .await?
            .map(|i| read_agent(&i))
            .transpose()
    }

    async fn list_agents(&self) -> Result<Vec<Agent>, StoreError> {
        let mut agents: Vec<Agent> = self
            .query_prefix("list agents", DIRECTORY_PK, "", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect::<Result<_, _>>()?;
        agents.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(agents)
    }

    async fn record_interaction(&self, id: &AgentId, at: Timestamp) -> Result<(), StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(id), AGENT_SK)))
            .update_expression("SET last_interaction_at = :t")
            .condition_expression(
                "attribute_exists(pk) AND (attribute_not_exists(last_interaction_at) OR last_interaction_at < :t)",
            )
            .expression_attribute_values(":t", n(to_ms(at)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => {
                    // Either the agent is gone, or a later interaction is already recorded.
                    if c.item.is_some_and(|i| !i.is_empty()) {
                        Ok(())
                    } else {
                        Err(StoreError::NotFound(format!("agent {id}")))
                    }
                }
                other => Err(StoreError::backend("dynamodb", "record interaction", other)),
            },
        }
    }
}

#[async_trait]
impl HeartbeatStore for DynamoStore {
    fn due_shards(&self) -> u16 {
        DUE_SHARDS
    }

    async fn due(
        &self,
        shard: u16,
        now: Timestamp,
        page: Option<PageToken>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        let start = page.as_ref().map(decode_page).transpose()?;
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("due_shard = :shard AND due_at <= :now")
            .expression_attribute_values(":shard", s(format!("{shard:02}")))
            .expression_attribute_values(":now", n(to_ms(now)))
            .limit(limit.clamp(1, i32::MAX as usize) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(backend("query due heartbeats"))?;
        let mut ids = Vec::new();
        for item in out.items() {
            let pk = item.get("pk").and_then(|v| v.as_s().ok());
            let sk = item.get("sk").and_then(|v| v.as_s().ok());
            let parsed = pk
                .and_then(|p| p.strip_prefix("AG#"))
                .and_then(|a| AgentId::parse(a).ok())
                .zip(
                    sk.and_then(|k| k.strip_prefix("HB#"))
                        .and_then(|b| b.parse::<u64>().ok()),
                );
            match parsed {
                Some((agent, beat)) => ids.push(HeartbeatId::new(agent, beat)),
                None => {
                    return Err(StoreError::corrupt(
                        format!("{pk:?}/{sk:?}"),
                        "not a heartbeat key",
                    ));
                }
            }
        }
        Ok(DuePage {
            ids,
            next: out.last_evaluated_key.as_ref().map(encode_page),
        })
    }

    async fn claim(
        &self,
        id: &HeartbeatId,
        req: &ClaimRequest,
    ) -> Result<Option<Heartbeat>, StoreError> {
        let now = to_ms(req.now);
        let lease = to_ms(req.now.saturating_add(req.lease).unwrap_or(req.now));
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(id.agent()), heartbeat_sk(id.beat()))))
            .update_expression(
                "SET #status = :executing, #claim = #claim + :one, lease_until = :lease, due_at = :lease, \
                 started_at = if_not_exists(started_at, :now), window_end = if_not_exists(window_end, :wend)",
            )
            // On the item itself: the index may be stale.
            .condition_expression(
                "(#status = :pending AND scheduled_at <= :now) OR (#status = :executing AND lease_until <= :now)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#claim", "claim")
            .expression_attribute_values(":executing", s("EXECUTING"))
            .expression_attribute_values(":pending", s("PENDING"))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":lease", n(lease))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":wend", s(req.window_end.as_str()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match r {
            Ok(out) => out
                .attributes
                .map(read_heartbeat)
                .transpose()?
                .ok_or_else(|| StoreError::backend("dynamodb", "claim heartbeat", "no attributes returned"))
                .map(Some),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(None),
                other => Err(StoreError::backend("dynamodb", "claim heartbeat", other)),
            },
        }
    }

    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        let hb = &finish.heartbeat;
        let mut set = vec![
            "#status = :status",
            "completed_at = :completed",
            "last_interaction_beat = :lib",
            "events_processed = :ep",
            "actions_triggered = :at",
            "actions_failed = :af",
            "cascade_capped = :cc",
        ];
        let mut remove = vec!["due_shard", "due_at"];
        let mut values: Item = HashMap::from([
            (":status".to_owned(), s(hb.status.as_str())),
            (":executing".to_owned(), s("EXECUTING")),
            (":claim".to_owned(), n(hb.claim)),
            (
                ":completed".to_owned(),
                n(to_ms(hb.completed_at.unwrap_or(Timestamp::UNIX_EPOCH))),
            ),
            (":lib".to_owned(), n(hb.last_interaction_beat)),
            (":ep".to_owned(), n(hb.events_processed)),
            (":at".to_owned(), n(hb.actions_triggered)),
            (":af".to_owned(), n(hb.actions_failed)),
            (":cc".to_owned(), n(hb.cascade_capped)),
        ]);
        let optional = [
            (
                "interaction_seen_at = :isa",
                "interaction_seen_at",
                ":isa",
                hb.interaction_seen_at.map(|t| n(to_ms(t))),
            ),
            (
                "since_last = :sl",
                "since_last",
                ":sl",
                hb.since_last.map(n),
            ),
            ("#error = :err", "#error", ":err", hb.error.clone().map(s)),
        ];
        for (assign, attr, placeholder, value) in optional {
            match value {
                Some(v) => {
                    set.push(assign);
                    values.insert(placeholder.to_owned(), v);
                }
                None => remove.push(attr),
            }
        }
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&hb.agent_id), heartbeat_sk(hb.beat))))
            .update_expression(format!(
                "SET {} REMOVE {}",
                set.join(", "),
                remove.join(", ")
            ))
            .condition_expression("#status = :executing AND #claim = :claim")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#claim", "claim")
            .expression_attribute_names("#error", "error")
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(backend("build transaction"))?;
        let mut items = vec![TransactWriteItem::builder().update(update).build()];
        if let Some(next) = &finish.next {
            items.push(self.put(heartbeat_item(next)?, Some("attribute_not_exists(pk)"))?);
        }
        if let Some(e) = &finish.heartbeat_event {
            items.push(self.put(event_item(e), None)?);
        }
        // No client request token: a retry of a finish that went through fails its
        // condition, and the record read back tells AlreadyFinished from Superseded. (A
        // token would make DynamoDB reject a redelivered job's finish, whose content
        // differs, for ten minutes.)
        match self.transact("finish heartbeat", items).await? {
            Ok(()) => Ok(FinishOutcome::Finished),
            Err(reasons) if is_ccf(reasons.first()) => {
                let current = self
                    .get_heartbeat(&hb.id())
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("heartbeat {}", hb.id())))?;
                Ok(if current.claim == hb.claim && current.status.is_final() {
                    FinishOutcome::AlreadyFinished
                } else {
                    FinishOutcome::Superseded {
                        claim: current.claim,
                        status: current.status,
                    }
                })
            }
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "finish heartbeat",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn defer(&self, hb: &Heartbeat, until: Timestamp) -> Result<bool, StoreError> {
        self.update_held_claim(
            hb,
            "defer heartbeat",
            "SET #status = :pending, scheduled_at = :until, due_at = :until \
             REMOVE lease_until, started_at, window_end",
            [(":pending", s("PENDING")), (":until", n(to_ms(until)))],
        )
        .await
    }

    async fn renew(&self, hb: &Heartbeat, lease_until: Timestamp) -> Result<bool, StoreError> {
        // The due index follows the lease, so the sweeper sees the new end.
        self.update_held_claim(
            hb,
            "renew heartbeat lease",
            "SET lease_until = :lease, due_at = :lease",
            [(":lease", n(to_ms(lease_until)))],
        )
        .await
    }

    async fn get_heartbeat(&self, id: &HeartbeatId) -> Result<Option<Heartbeat>, StoreError> {
        self.get(
            "get heartbeat",
            key(agent_pk(id.agent()), heartbeat_sk(id.beat())),
        )
        .await?
        .map(read_heartbeat)
        .transpose()
    }

    async fn list_heartbeats(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        self.query_prefix(
            "list heartbeats",
            &agent_pk(agent),
            "HB#",
            true,
            Some(limit),
        )
        .await?
        .into_iter()
        .map(read_heartbeat)
        .collect()
    }
}

#[async_trait]
impl EventLog for DynamoStore {
    async fn append(&self, event: &Event) -> Result<(), StoreError> {
        let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .operation_timeout(self.event_write_timeout)
            .build();
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(event_item(event)))
            .customize()
            .config_override(aws_sdk_dynamodb::config::Builder::default().timeout_config(timeouts))
            .send()
            .await
            .map_err(backend("append event"))?;
        Ok(())
    }

    async fn read_window(
        &self,
        agent: &AgentId,
        start: &EventCursor,
        end: &EventCursor,
        limit: usize,
    ) -> Result<Window, StoreError> {
        let pk = agent_pk(agent);
        let mut found = None;
        let mut events = Vec::new();
        let mut truncated = false;
        let mut start_key = None;
        loop {
            // From the window's start to the agent's record, which sorts last.
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND sk BETWEEN :lo AND :hi")
                .filter_expression("attribute_not_exists(#own)")
                .expression_attribute_names("#own", "own")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":lo", s(format!("EV#{}", start.as_str())))
                .expression_attribute_values(":hi", s(AGENT_SK))
                .consistent_read(true)
                .set_exclusive_start_key(start_key)
                .send()
                .await
                .map_err(backend("read event window"))?;
            let mut past_end = false;
            for item in out.items() {
                if item
                    .get("sk")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|k| k == AGENT_SK)
                {
                    found = Some(read_agent(item)?);
                    continue;
                }
                let e: Event = read_doc(item)?;
                if !start.is_before(&e.id) {
                    continue;
                }
                if !end.covers(&e.id) {
                    past_end = true;
                } else if events.len() == limit {
                    truncated = true;
                } else {
                    events.push(e);
                }
            }
            start_key = out.last_evaluated_key;
            // Stop paging once the window is read; fetch the agent directly if the
            // remaining pages (newer events) were not read.
            if start_key.is_none() {
                break;
            }
            if truncated || past_end {
                found = self.get_agent(agent).await?;
                break;
            }
        }
        Ok(Window {
            agent: found,
            events,
            truncated,
        })
    }

    async fn get_events(&self, agent: &AgentId, ids: &[EventId]) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(item) = self
                .get("get events", key(agent_pk(agent), event_sk(id)))
                .await?
            {
                out.push(read_doc(&item)?);
            }
        }
        out.sort_by(|a: &Event, b: &Event| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn list_events(&self, agent: &AgentId, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut events: Vec<Event> = self
            .query_prefix("list events", &agent_pk(agent), "EV#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect::<Result<_, _>>()?;
        events.reverse();
        Ok(events)
    }
}

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
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(action_item(action)))
            .condition_expression("#status = :running AND attempt = :expected")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":running", s("RUNNING"))
            .expression_attribute_values(":expected", n(expected_attempt))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend("dynamodb", "restart action", other)),
            },
        }
    }

    async fn finish_action(&self, action: &Action, new_events: &[Event]) -> Result<(), StoreError> {
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
        match self.transact("finish action", items).await? {
            Ok(()) => Ok(()),
            Err(reasons) if is_ccf(reasons.first()) => Err(conflict()),
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "finish action",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn list_actions(&self, agent: &AgentId, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.query_prefix("list actions", &agent_pk(agent), "AC#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }
}

#[async_trait]
impl ToolRegistry for DynamoStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), format!("T#{}", tool.name), tool);
        item.insert("active".to_owned(), AttributeValue::Bool(tool.active));
        match self.put_new("add tool", item).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::AlreadyExists(format!("tool {}", tool.name))),
        }
    }

    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        self.set_active(
            "update tool",
            key(REGISTRY_PK, format!("T#{name}")),
            active,
            format!("tool {name}"),
        )
        .await
    }

    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let mut item = doc_item(REGISTRY_PK.to_owned(), format!("S#{}", sub.id), sub);
        item.insert("active".to_owned(), AttributeValue::Bool(sub.active));
        match self.put_new("add subscription", item).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::AlreadyExists(format!(
                "subscription {} ({} -> {})",
                sub.id, sub.event_type, sub.tool
            ))),
        }
    }

    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        self.set_active(
            "update subscription",
            key(REGISTRY_PK, format!("S#{id}")),
            active,
            format!("subscription {id}"),
        )
        .await
    }

    async fn load_registry(&self) -> Result<Registry, StoreError> {
        let mut registry = Registry::default();
        for item in self
            .query_prefix("load registry", REGISTRY_PK, "", false, None)
            .await?
        {
            let sk = item
                .get("sk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            if sk.starts_with("T#") {
                let mut t: Tool = read_doc(&item)?;
                t.active = active_flag(&item).unwrap_or(t.active);
                registry.tools.push(t);
            } else if sk.starts_with("S#") {
                let mut sub: Subscription = read_doc(&item)?;
                sub.active = active_flag(&item).unwrap_or(sub.active);
                registry.subscriptions.push(sub);
            }
        }
        Ok(registry)
    }
}

fn turn_sk(id: &TurnId) -> String {
    format!("TN#{id}")
}

fn signal_sk(id: &SignalId) -> String {
    format!("SG#{id}")
}

#[async_trait]
impl ConversationStore for DynamoStore {
    async fn answered(
        &self,
        agent: &AgentId,
        signals: &[SignalId],
    ) -> Result<Vec<(SignalId, TurnId)>, StoreError> {
        let mut found: HashMap<String, TurnId> = HashMap::new();
        // BatchGetItem takes 100 keys; a turn answers at most a batch of signals.
        for chunk in signals.chunks(100) {
            let mut keys = KeysAndAttributes::builder().consistent_read(true);
            for sig in chunk {
                keys = keys.keys(key(agent_pk(agent), signal_sk(sig)));
            }
            let mut request = HashMap::from([(
                self.table.clone(),
                keys.build().map_err(backend("read answered signals"))?,
            )]);
            for attempt in 0..10u32 {
                let out = self
                    .client
                    .batch_get_item()
                    .set_request_items(Some(request))
                    .send()
                    .await
                    .map_err(backend("read answered signals"))?;
                for item in out
                    .responses
                    .and_then(|mut r| r.remove(&self.table))
                    .unwrap_or_default()
                {
                    let sk = item
                        .get("sk")
                        .and_then(|v| v.as_s().ok())
                        .cloned()
                        .unwrap_or_default();
                    let turn = item
                        .get("turn")
                        .and_then(|v| v.as_s().ok())
                        .ok_or_else(|| StoreError::corrupt(sk.clone(), "no turn attribute"))?;
                    let turn =
                        TurnId::parse(turn).map_err(|e| StoreError::corrupt(sk.clone(), e))?;
                    found.insert(sk.trim_start_matches("SG#").to_owned(), turn);
                }
                request = out.unprocessed_keys.unwrap_or_default();
                if request.is_empty() {
                    break;
                }
                if attempt == 9 {
                    return Err(StoreError::backend(
                        "dynamodb",
                        "read answered signals",
                        "keys still unprocessed after 10 attempts",
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
            }
        }
        Ok(signals
            .iter()
            .filter_map(|sig| found.get(sig.as_str()).map(|t| (sig.clone(), t.clone())))
            .collect())
    }

    async fn begin_turn(
        &self,
        turn: &Turn,
        messages: &[ConversationMessage],
    ) -> Result<TurnStart, StoreError> {
        let pk = agent_pk(&turn.agent_id);
        let mut items = vec![self.put(
            doc_item(pk.clone(), turn_sk(&turn.id), turn),
            Some("attribute_not_exists(pk)"),
        )?];
        for sig in &turn.signals {
            let mut item = key(pk.clone(), signal_sk(sig));
            item.insert("turn".to_owned(), s(turn.id.as_str()));
            items.push(self.put(item, Some("attribute_not_exists(pk)"))?);
        }
        for m in messages {
            items.push(self.put(doc_item(pk.clone(), format!("MS#{}", m.id), m), None)?);
        }
        match self.transact("begin turn", items).await? {
            Ok(()) => Ok(TurnStart::Created),
            Err(reasons) => {
                if let Some(existing) = self.get_turn(&turn.agent_id, &turn.id).await? {
                    return Ok(TurnStart::Exists(Box::new(existing)));
                }
                if reasons.iter().any(|r| r == "ConditionalCheckFailed") {
                    return Err(StoreError::Conflict(format!(
                        "a signal of turn {} is answered by another turn already",
                        turn.id
                    )));
                }
                Err(StoreError::backend(
                    "dynamodb",
                    "begin turn",
                    format!("transaction cancelled: {}", reasons.join(", ")),
                ))
            }
        }
    }

    async fn update_turn(&self, turn: &Turn) -> Result<(), StoreError> {
        let item = doc_item(agent_pk(&turn.agent_id), turn_sk(&turn.id), turn);
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_exists(pk)")
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(_) => {
                    Err(StoreError::NotFound(format!("turn {}", turn.id)))
                }
                other => Err(StoreError::backend("dynamodb", "update turn", other)),
            },
        }
    }

    async fn get_turn(&self, agent: &AgentId, id: &TurnId) -> Result<Option<Turn>, StoreError> {
        self.get("read turn", key(agent_pk(agent), turn_sk(id)))
            .await?
            .map(|item| read_doc(&item))
            .transpose()
    }

    async fn recent_messages(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.query_prefix("read messages", &agent_pk(agent), "MS#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }
}

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
