//! Records to and from DynamoDB items: JSON documents in a `doc` attribute beside the
//! key and index attributes; heartbeats as plain attributes; page tokens.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};

use super::keys::*;
use crate::domain::{
    Action, Agent, AgentId, Event, EventCursor, Heartbeat, HeartbeatStatus, Json, Outcome,
    OutcomeKind, Requests, SessionId, from_ms, to_ms,
};
use crate::error::StoreError;
use crate::ports::PageToken;

pub(super) type Item = HashMap<String, AttributeValue>;

/// An item's key: its partition and sort keys.
pub(super) fn key(pk: impl Into<String>, sk: impl Into<String>) -> Item {
    HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))])
}

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(super) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// An update's `values` with `r` as `:req`: the requests attribute (a map), as
/// [`heartbeat_item`] stores it.
pub(super) fn with_requests(values: &Item, r: &Requests) -> Item {
    let mut v = values.clone();
    v.insert(
        ":req".to_owned(),
        serde_dynamo::to_attribute_value(r).unwrap_or(AttributeValue::Null(true)),
    );
    v
}

pub(super) fn backend<E>(op: &'static str) -> impl Fn(E) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| StoreError::backend("dynamodb", op, e)
}

pub(super) fn doc_item<T: Serialize>(pk: String, sk: String, value: &T) -> Item {
    let mut item = key(pk, sk);
    item.insert(
        "doc".to_owned(),
        s(serde_json::to_string(value).unwrap_or_default()),
    );
    item
}

pub(super) fn read_doc<T: for<'de> Deserialize<'de>>(item: &Item) -> Result<T, StoreError> {
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

pub(super) fn read_agent(item: &Item) -> Result<Agent, StoreError> {
    let mut agent: Agent = read_doc(item)?;
    // The live record keeps the last interaction beside its doc, updated atomically.
    if let Some(ms) = item.get("last_interaction_at").and_then(|v| v.as_n().ok()) {
        agent.last_interaction_at = ms.parse::<i64>().ok().map(from_ms);
    }
    // So is the pause: an attribute, so conditions (a finish, a resume) can test it.
    agent.paused_at = item
        .get("paused_at")
        .and_then(|v| v.as_n().ok())
        .and_then(|ms| ms.parse::<i64>().ok())
        .map(from_ms);
    // And the next schedule wake, set on its own.
    agent.next_wake = item
        .get("next_wake")
        .and_then(|v| v.as_n().ok())
        .and_then(|ms| ms.parse::<i64>().ok())
        .map(from_ms);
    Ok(agent)
}

pub(super) fn active_flag(item: &Item) -> Option<bool> {
    item.get("active").and_then(|v| v.as_bool().ok()).copied()
}

pub(super) fn event_item<P: Json>(e: &Event<P>) -> Item {
    let mut item = doc_item(agent_pk(&e.agent_id), event_sk(&e.id), e);
    if e.cascade.is_some() {
        item.insert("own".to_owned(), AttributeValue::Bool(true));
    }
    item
}

pub(super) fn action_item(a: &Action) -> Item {
    let mut item = doc_item(agent_pk(&a.agent_id), action_sk(a), a);
    item.insert("status".to_owned(), s(a.status.as_str()));
    item.insert("attempt".to_owned(), n(a.attempt));
    item
}

/// A heartbeat as stored: plain attributes, since claims and finishes update fields.
#[derive(Serialize, Deserialize)]
pub(super) struct HeartbeatItem {
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
    hour_from: Option<i64>,
    #[serde(default)]
    beats_in_hour: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    skipped: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests: Option<Requests>,
    /// What is handed on to this heartbeat's thinking, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handed_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ran_at: Option<i64>,
    /// The task ledger, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tasks: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<String>,
    /// The outcome's reason, where it is not the `skipped` reason or the error already
    /// on the record (an idle beat's record stays within one write unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
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
            hour_from: hb.hour_from.map(to_ms),
            beats_in_hour: hb.beats_in_hour,
            skipped: hb.skipped.clone(),
            requests: hb.requests.clone(),
            handed_on: hb
                .handed_on
                .as_ref()
                .map(|f| serde_json::to_string(f).unwrap_or_default()),
            ran_at: hb.ran_at.map(to_ms),
            tasks: hb.tasks.stored(),
            outcome: hb.outcome.as_ref().map(|o| o.kind.as_str().to_owned()),
            outcome_reason: outcome_reason(hb),
            trace_id: hb.trace_id.clone(),
            due_shard: due_at.map(|_| due_shard(&hb.agent_id)),
            due_at,
        }
    }

    fn into_heartbeat(self) -> Result<Heartbeat, StoreError> {
        let key = format!("{}/{}", self.pk, self.sk);
        let (skipped, error) = (self.skipped.clone(), self.error.clone());
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
            error: error.clone(),
            hour_from: self.hour_from.map(from_ms),
            beats_in_hour: self.beats_in_hour,
            skipped: skipped.clone(),
            requests: self.requests,
            handed_on: self
                .handed_on
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|e| StoreError::corrupt(&key, format!("handed_on: {e}")))?,
            ran_at: self.ran_at.map(from_ms),
            tasks: self
                .tasks
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|e| StoreError::corrupt(&key, format!("tasks: {e}")))?
                .unwrap_or_default(),
            outcome: match self.outcome {
                None => None,
                Some(kind) => Some(Outcome {
                    kind: OutcomeKind::parse(&kind).ok_or_else(|| {
                        StoreError::corrupt(&key, format!("unknown outcome {kind}"))
                    })?,
                    reason: self
                        .outcome_reason
                        .or(skipped)
                        .or(error)
                        .unwrap_or_default(),
                }),
            },
            trace_id: self.trace_id,
        })
    }
}

/// What a heartbeat record stores of its outcome's reason: nothing where it is the
/// `skipped` reason or the error the record holds anyway.
pub(super) fn outcome_reason(hb: &Heartbeat) -> Option<String> {
    let o = hb.outcome.as_ref()?;
    let held = [hb.skipped.as_deref(), hb.error.as_deref()];
    (!held.contains(&Some(o.reason.as_str()))).then(|| o.reason.clone())
}

pub(super) fn heartbeat_item(hb: &Heartbeat) -> Result<Item, StoreError> {
    serde_dynamo::to_item(HeartbeatItem::from_heartbeat(hb))
        .map_err(|e| StoreError::corrupt(hb.id().to_string(), e))
}

pub(super) fn read_heartbeat(item: Item) -> Result<Heartbeat, StoreError> {
    let hb: HeartbeatItem =
        serde_dynamo::from_item(item).map_err(|e| StoreError::corrupt("heartbeat item", e))?;
    hb.into_heartbeat()
}

pub(super) fn encode_page(key: &Item) -> PageToken {
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

pub(super) fn decode_page(token: &PageToken) -> Result<Item, StoreError> {
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

pub(super) fn is_ccf(code: Option<&String>) -> bool {
    code.is_some_and(|c| c == "ConditionalCheckFailed")
}
