//! Conversation turns, their messages and the signals they answered, on DynamoDB.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::KeysAndAttributes;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use super::metrics::{put_units, with_own};
use crate::domain::{
    AgentId, ConversationMessage, Requests, SessionId, SignalId, Turn, TurnId, Undelivered,
    WaitingTurn,
};
use crate::error::StoreError;
use crate::ports::{ConversationStore, TurnStart};

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
        let mut others = Vec::new();
        for sig in &turn.signals {
            let mut item = key(pk.clone(), signal_sk(sig));
            item.insert("turn".to_owned(), s(turn.id.as_str()));
            others.push((item, Some("attribute_not_exists(pk)")));
        }
        for m in messages {
            others.push((doc_item(pk.clone(), format!("MS#{}", m.id), m), None));
        }
        // The turn carries its requests, this transaction (each item written twice)
        // included.
        let others_units: f64 = others.iter().map(|(item, _)| put_units(item)).sum();
        let turn_item = with_own_cost(turn, "DynamoDB.TransactWriteItems", |item| {
            2.0 * (put_units(item) + others_units)
        });
        let mut items = vec![self.put(turn_item, Some("attribute_not_exists(pk)"))?];
        for (item, condition) in others {
            items.push(self.put(item, condition)?);
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
        let item = with_own_cost(turn, "DynamoDB.PutItem", put_units);
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

    async fn list_turns(&self, agent: &AgentId, limit: usize) -> Result<Vec<Turn>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.query_prefix("list turns", &agent_pk(agent), "TN#", true, Some(limit))
            .await?
            .iter()
            .map(read_doc)
            .collect()
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

    async fn messages_before(
        &self,
        agent: &AgentId,
        before: &str,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let hi = format!("MS#{before}");
        self.query_between(
            "read older messages",
            &agent_pk(agent),
            "MS#"..=hi.as_str(),
            true,
            limit,
            |m: &ConversationMessage| m.id.as_str() < before,
        )
        .await
    }

    async fn put_waiting(&self, waiting: &WaitingTurn) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(doc_item(
                WAITING_PK.to_owned(),
                waiting_sk(&waiting.agent_id, &waiting.session),
                waiting,
            )))
            .send()
            .await
            .map_err(backend("keep waiting turn"))?;
        Ok(())
    }

    async fn get_waiting(
        &self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Option<WaitingTurn>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(WAITING_PK, waiting_sk(agent, session))))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend("read waiting turn"))?;
        out.item.as_ref().map(read_doc).transpose()
    }

    async fn delete_waiting(&self, agent: &AgentId, session: &SessionId) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key(WAITING_PK, waiting_sk(agent, session))))
            .send()
            .await
            .map_err(backend("forget waiting turn"))?;
        Ok(())
    }

    async fn put_undelivered(&self, u: &Undelivered) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(doc_item(
                UNDELIVERED_PK.to_owned(),
                undelivered_sk(&u.agent_id, &u.turn_id),
                u,
            )))
            .send()
            .await
            .map_err(backend("keep undelivered reply"))?;
        Ok(())
    }

    async fn get_undelivered(
        &self,
        agent: &AgentId,
        turn: &TurnId,
    ) -> Result<Option<Undelivered>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(UNDELIVERED_PK, undelivered_sk(agent, turn))))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend("read undelivered reply"))?;
        out.item.as_ref().map(read_doc).transpose()
    }

    async fn delete_undelivered(&self, agent: &AgentId, turn: &TurnId) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key(UNDELIVERED_PK, undelivered_sk(agent, turn))))
            .send()
            .await
            .map_err(backend("forget undelivered reply"))?;
        Ok(())
    }

    async fn list_undelivered(&self, limit: usize) -> Result<Vec<Undelivered>, StoreError> {
        // One partition holds them all: there are some only while a channel refuses
        // replies, and the dead letters until they are dismissed.
        let mut all: Vec<Undelivered> = self
            .query_prefix("read undelivered replies", UNDELIVERED_PK, "", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect::<Result<_, _>>()?;
        all.sort_by_key(|u| {
            let ms = u.next_at.as_millisecond();
            (u.undeliverable(), if u.undeliverable() { -ms } else { ms })
        });
        all.truncate(limit);
        Ok(all)
    }

    async fn list_waiting(&self, limit: usize) -> Result<Vec<WaitingTurn>, StoreError> {
        // One partition holds them all: there are some only while a model is down.
        let mut all: Vec<WaitingTurn> = self
            .query_prefix("read waiting turns", WAITING_PK, "", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect::<Result<_, _>>()?;
        all.sort_by_key(|w| w.next_at);
        all.truncate(limit);
        Ok(all)
    }
}

/// The turn's item, its requests counting the `op` that writes it, whose units `units`
/// gives for the item.
fn with_own_cost(turn: &Turn, op: &str, units: impl Fn(&Item) -> f64) -> Item {
    let item = |r: &Requests| {
        let mut t = turn.clone();
        t.requests = Some(r.clone());
        doc_item(agent_pk(&turn.agent_id), turn_sk(&turn.id), &t)
    };
    item(&with_own(turn.requests.as_ref(), op, |r| units(&item(r))))
}

/// The partition of the replies the channel did not take (see [`Undelivered`]).
const UNDELIVERED_PK: &str = "UNDELIVERED";

/// An undelivered reply's sort key: its agent and turn.
fn undelivered_sk(agent: &AgentId, turn: &TurnId) -> String {
    format!("{agent}#{turn}")
}

/// The partition of the turns that wait on the model (see [`WaitingTurn`]).
const WAITING_PK: &str = "WAITING";

/// A waiting turn's sort key: its agent and session.
fn waiting_sk(agent: &AgentId, session: &SessionId) -> String {
    format!("{agent}#{session}")
}
