//! Agents on DynamoDB, their directory entry and the Discord channel each answers in.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use futures::StreamExt;
use jiff::Timestamp;
use jiff::civil::Date;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{
    Agent, AgentId, AgentState, AgentStates, Event, Heartbeat, Limit, Spend, Tally, Usd, from_ms,
    to_ms,
};
use crate::error::StoreError;
use crate::ports::{AgentStore, AgentsPage, Footprint, Writer};

pub(super) fn channel_item(channel: &str, agent: &AgentId) -> Item {
    let mut item = key(format!("CH#{channel}"), "CH");
    item.insert("agent_id".to_owned(), s(agent.as_str()));
    item
}

/// The key of the item that holds an agent's name (ignoring ASCII case) for one agent.
pub(super) fn name_key(name: &str) -> Item {
    key(format!("NM#{}", name.to_ascii_lowercase()), "NM")
}

fn name_item(name: &str, agent: &AgentId) -> Item {
    let mut item = name_key(name);
    item.insert("agent_id".to_owned(), s(agent.as_str()));
    item
}

/// A new agent's live record: no hooks yet.
fn live_item(agent: &Agent) -> Item {
    let mut item = doc_item(agent_pk(&agent.id), AGENT_SK.to_owned(), agent);
    item.insert(HAS_HOOKS.to_owned(), AttributeValue::Bool(false));
    item
}

/// What a listing needs of a directory entry: its order, and the fields that decide its
/// state (in the order of [`Agent::state`]).
#[derive(serde::Deserialize)]
struct Listed {
    id: AgentId,
    created_at: Timestamp,
    #[serde(default)]
    paused_at: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    auto_paused_since: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    snoozed_until: Option<serde::de::IgnoredAny>,
}

impl Listed {
    fn state(&self) -> AgentState {
        AgentState::of(
            self.paused_at.is_some(),
            self.auto_paused_since.is_some(),
            self.snoozed_until.is_some(),
        )
    }
}

impl DynamoStore {
    /// `AlreadyExists`, naming the agent that holds `name`.
    async fn name_taken(&self, name: &str) -> StoreError {
        let other = self
            .get_id(
                "find name's agent",
                name_key(name),
                "agent_id",
                AgentId::parse,
            )
            .await
            .ok()
            .flatten();
        StoreError::AlreadyExists(format!(
            "an agent named {name:?} ({})",
            other.map_or_else(|| "?".to_owned(), |a| a.to_string())
        ))
    }
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
            self.put(live_item(agent), Some("attribute_not_exists(pk)"))?,
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), agent.id.to_string(), agent),
                None,
            )?,
            self.put(heartbeat_item(first)?, Some("attribute_not_exists(pk)"))?,
            self.put(
                name_item(&agent.name, &agent.id),
                Some("attribute_not_exists(pk)"),
            )?,
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
                let failed = |i: usize| {
                    reasons
                        .get(i)
                        .is_some_and(|r| r == "ConditionalCheckFailed")
                };
                if failed(3) {
                    return Err(self.name_taken(&agent.name).await);
                }
                if agent.discord_channel.is_some() && failed(4) {
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
            items.push(live_item(agent));
            items.push(doc_item(
                DIRECTORY_PK.to_owned(),
                agent.id.to_string(),
                agent,
            ));
            items.push(heartbeat_item(first)?);
            if let Some(channel) = &agent.discord_channel {
                items.push(channel_item(channel, &agent.id));
            }
            items.push(name_item(&agent.name, &agent.id));
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

    async fn agents_page(&self, offset: usize, limit: usize) -> Result<AgentsPage, StoreError> {
        // DynamoDB counts nothing itself: the directory is read whole (as a listing
        // is), but each entry is parsed only for the fields that order and count it,
        // and only the page's entries into agents.
        let items = self
            .query_prefix("list agents", DIRECTORY_PK, "", false, None)
            .await?;
        let mut entries: Vec<(Listed, &Item)> = items
            .iter()
            .map(|i| Ok((read_doc::<Listed>(i)?, i)))
            .collect::<Result<_, StoreError>>()?;
        entries.sort_by(|(a, _), (b, _)| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        let mut states = AgentStates::default();
        for (e, _) in &entries {
            states.add(e.state());
        }
        let agents = entries
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(_, i)| read_doc(i))
            .collect::<Result<_, _>>()?;
        Ok(AgentsPage { states, agents })
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

    async fn set_next_wake(&self, id: &AgentId, at: Option<Timestamp>) -> Result<(), StoreError> {
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(id), AGENT_SK)))
            .condition_expression("attribute_exists(pk)");
        let req = match at {
            Some(t) => req
                .update_expression("SET next_wake = :t")
                .expression_attribute_values(":t", n(to_ms(t))),
            None => req.update_expression("REMOVE next_wake"),
        };
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => {
                    Err(StoreError::NotFound(format!("agent {id}")))
                }
                other => Err(StoreError::backend("dynamodb", "set next wake", other)),
            },
        }
    }

    async fn update_agent(&self, agent: &Agent, previous: &Agent) -> Result<(), StoreError> {
        let mut agent = agent.clone();
        agent.paused_at = previous.paused_at;
        // The next wake lives in its own attribute (`set_next_wake`), never in the doc.
        agent.next_wake = None;
        let doc = serde_json::to_string(&agent).unwrap_or_default();
        let live = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(&agent.id), AGENT_SK)))
            .update_expression("SET doc = :doc")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":doc", s(&doc))
            .build()
            .map_err(backend("build transaction"))?;
        let mut items = vec![
            TransactWriteItem::builder().update(live).build(),
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), agent.id.to_string(), &agent),
                None,
            )?,
        ];
        // Renamed: the new name is taken in the same transaction, and the old one given
        // up if this agent held it (one of a pair that shared it before names were held
        // may not; a read tells).
        let renamed = !agent.name.eq_ignore_ascii_case(&previous.name);
        if renamed {
            items.push(self.put(
                name_item(&agent.name, &agent.id),
                Some("attribute_not_exists(pk)"),
            )?);
            let held = self
                .get_id(
                    "find name's agent",
                    name_key(&previous.name),
                    "agent_id",
                    AgentId::parse,
                )
                .await?;
            if held.as_ref() == Some(&agent.id) {
                let delete = Delete::builder()
                    .table_name(&self.table)
                    .set_key(Some(name_key(&previous.name)))
                    .build()
                    .map_err(backend("build transaction"))?;
                items.push(TransactWriteItem::builder().delete(delete).build());
            }
        }
        let moved = agent.discord_channel != previous.discord_channel;
        if moved {
            if let Some(old) = &previous.discord_channel {
                let delete = Delete::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(format!("CH#{old}"), "CH")))
                    .build()
                    .map_err(backend("build transaction"))?;
                items.push(TransactWriteItem::builder().delete(delete).build());
            }
            if let Some(new) = &agent.discord_channel {
                items.push(self.put(
                    channel_item(new, &agent.id),
                    Some("attribute_not_exists(pk)"),
                )?);
            }
        }
        match self.transact("update agent", items).await? {
            Ok(()) => Ok(()),
            Err(reasons) if is_ccf(reasons.first()) => {
                Err(StoreError::NotFound(format!("agent {}", agent.id)))
            }
            Err(reasons) if renamed && is_ccf(reasons.get(2)) => {
                Err(self.name_taken(&agent.name).await)
            }
            Err(_) => {
                let channel = agent.discord_channel.as_deref().unwrap_or_default();
                let other = self.agent_for_channel(channel).await?;
                Err(StoreError::AlreadyExists(format!(
                    "an agent for Discord channel {channel} ({})",
                    other.map_or_else(|| "?".to_owned(), |a| a.to_string())
                )))
            }
        }
    }

    async fn set_paused(
        &self,
        id: &AgentId,
        paused_at: Option<Timestamp>,
        event: &Event,
        writer: Writer,
    ) -> Result<bool, StoreError> {
        let Some(mut agent) = self.get_agent(id).await? else {
            return Err(StoreError::NotFound(format!("agent {id}")));
        };
        let live = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(id), AGENT_SK)));
        let live = match paused_at {
            Some(at) => live
                .update_expression("SET paused_at = :at")
                .condition_expression("attribute_exists(pk) AND attribute_not_exists(paused_at)")
                .expression_attribute_values(":at", n(to_ms(at))),
            None => live
                .update_expression("REMOVE paused_at")
                .condition_expression("attribute_exists(pk) AND attribute_exists(paused_at)"),
        }
        .build()
        .map_err(backend("build transaction"))?;
        agent.paused_at = paused_at;
        let items = vec![
            TransactWriteItem::builder().update(live).build(),
            self.put(
                doc_item(DIRECTORY_PK.to_owned(), id.to_string(), &agent),
                None,
            )?,
            self.put(event_item(event), None)?,
        ];
        match self
            .transact_events("pause or resume agent", items, writer)
            .await?
        {
            Ok(()) => Ok(true),
            Err(reasons) if is_ccf(reasons.first()) => match self.get_agent(id).await? {
                Some(_) => Ok(false),
                None => Err(StoreError::NotFound(format!("agent {id}"))),
            },
            Err(reasons) => Err(StoreError::backend(
                "dynamodb",
                "pause or resume agent",
                format!("transaction cancelled: {}", reasons.join(", ")),
            )),
        }
    }

    async fn purge_agent(&self, id: &AgentId, apply: bool) -> Result<Footprint, StoreError> {
        self.purge(id, apply).await
    }

    async fn record_spend(&self, agent: &AgentId, spend: &Spend) -> Result<(), StoreError> {
        // Old entries expire by TTL, a day after they stop being read.
        let expires = spend.at.as_second() + (Spend::KEPT_DAYS + 1) * 86_400;
        let mut item = key(agent_pk(agent), spend_sk(spend.day, &spend.source));
        item.insert("tokens".to_owned(), n(spend.tokens));
        item.insert("at".to_owned(), n(to_ms(spend.at)));
        item.insert(super::TTL_ATTRIBUTE.to_owned(), n(expires));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(backend("record spend"))?;
        Ok(())
    }

    async fn hold_usd(
        &self,
        agent: &AgentId,
        limits: &[Limit],
        amount: Usd,
        at: Timestamp,
    ) -> Result<Result<(), Tally>, StoreError> {
        let op = "hold dollars";
        if limits.is_empty() {
            return Ok(Ok(()));
        }
        let over = |tallies: Vec<Tally>| -> Result<(), Tally> {
            match limits
                .iter()
                .zip(tallies)
                .find(|(l, t)| t.committed().saturating_add(amount) > l.limit)
            {
                Some((_, t)) => Err(t),
                None => Ok(()),
            }
        };
        if limits.iter().any(|l| amount > l.limit) {
            let periods: Vec<String> = limits.iter().map(|l| l.period.clone()).collect();
            return Ok(over(self.usd_tallies(agent, &periods).await?));
        }
        // Each period's item: `committed` (spent and held) may take `amount` only while
        // it stays within the limit; the condition and the addition are one write (one
        // transaction for a day's and a month's budget together).
        const HOLD: &str = "SET #at = :at, #ttl = :ttl ADD committed :amount, held :amount";
        const FITS: &str = "attribute_not_exists(committed) OR committed <= :room";
        let values = |l: &Limit| {
            HashMap::from([
                (":at".to_owned(), n(to_ms(at))),
                (":ttl".to_owned(), n(usd_expiry(at))),
                (":amount".to_owned(), n(amount.micros())),
                (
                    ":room".to_owned(),
                    n(l.limit.saturating_sub(amount).micros()),
                ),
            ])
        };
        let names = HashMap::from([
            ("#at".to_owned(), "at".to_owned()),
            ("#ttl".to_owned(), super::TTL_ATTRIBUTE.to_owned()),
        ]);
        let refused = if let [l] = limits {
            let r = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(agent_pk(agent), usd_sk(&l.period))))
                .update_expression(HOLD)
                .condition_expression(FITS)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values(l)))
                .send()
                .await;
            !conditional(op, r)?
        } else {
            let mut items = Vec::with_capacity(limits.len());
            for l in limits {
                let update = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(agent_pk(agent), usd_sk(&l.period))))
                    .update_expression(HOLD)
                    .condition_expression(FITS)
                    .set_expression_attribute_names(Some(names.clone()))
                    .set_expression_attribute_values(Some(values(l)))
                    .build()
                    .map_err(backend("build transaction"))?;
                items.push(TransactWriteItem::builder().update(update).build());
            }
            match self.transact(op, items).await? {
                Ok(()) => false,
                Err(reasons) if reasons.iter().any(|r| is_ccf(Some(r))) => true,
                Err(reasons) => {
                    return Err(StoreError::backend(
                        "dynamodb",
                        op,
                        format!("the hold was cancelled: {reasons:?}"),
                    ));
                }
            }
        };
        if !refused {
            return Ok(Ok(()));
        }
        let periods: Vec<String> = limits.iter().map(|l| l.period.clone()).collect();
        let tallies = self.usd_tallies(agent, &periods).await?;
        // Refused: the period that was full when read (or, if another settle freed room
        // meanwhile, the first).
        Ok(Err(over(tallies.clone()).err().unwrap_or_else(|| {
            tallies.into_iter().next().unwrap_or_default()
        })))
    }

    async fn settle_usd(
        &self,
        agent: &AgentId,
        periods: &[String],
        held: Usd,
        spent: Usd,
        at: Timestamp,
    ) -> Result<Vec<Tally>, StoreError> {
        let mut out = Vec::with_capacity(periods.len());
        let change = spent.micros() as i128 - held.micros() as i128;
        for p in periods {
            let r = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(agent_pk(agent), usd_sk(p))))
                .update_expression(
                    "SET #at = :at, #ttl = :ttl ADD committed :change, held :release, spent :spent",
                )
                .expression_attribute_names("#at", "at")
                .expression_attribute_names("#ttl", super::TTL_ATTRIBUTE)
                .expression_attribute_values(":at", n(to_ms(at)))
                .expression_attribute_values(":ttl", n(usd_expiry(at)))
                .expression_attribute_values(":change", AttributeValue::N(change.to_string()))
                .expression_attribute_values(
                    ":release",
                    AttributeValue::N(format!("-{}", held.micros())),
                )
                .expression_attribute_values(":spent", n(spent.micros()))
                .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
                .send()
                .await
                .map_err(backend("settle dollars"))?;
            out.push(usd_tally(p, r.attributes.as_ref()));
        }
        Ok(out)
    }

    async fn mark_usd(
        &self,
        agent: &AgentId,
        period: &str,
        percent: u64,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(agent), usd_sk(period))))
            .update_expression("SET #at = :at, #ttl = :ttl ADD marks :mark")
            .condition_expression("attribute_not_exists(marks) OR NOT contains(marks, :percent)")
            .expression_attribute_names("#at", "at")
            .expression_attribute_names("#ttl", super::TTL_ATTRIBUTE)
            .expression_attribute_values(":at", n(to_ms(at)))
            .expression_attribute_values(":ttl", n(usd_expiry(at)))
            .expression_attribute_values(":mark", AttributeValue::Ns(vec![percent.to_string()]))
            .expression_attribute_values(":percent", n(percent))
            .send()
            .await;
        conditional("mark dollars", r)
    }

    async fn take_call(
        &self,
        agent: &AgentId,
        minute: &str,
        limit: u32,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(agent), calls_sk(minute))))
            .update_expression("SET #ttl = :ttl ADD calls :one")
            .condition_expression("attribute_not_exists(calls) OR calls < :limit")
            .expression_attribute_names("#ttl", super::TTL_ATTRIBUTE)
            // A minute's count is done with after it; kept a day.
            .expression_attribute_values(":ttl", n(at.as_second() + 86_400))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":limit", n(limit))
            .send()
            .await;
        conditional("count a model call", r)
    }

    async fn usd_tallies(
        &self,
        agent: &AgentId,
        periods: &[String],
    ) -> Result<Vec<Tally>, StoreError> {
        let mut out = Vec::with_capacity(periods.len());
        for p in periods {
            let item = self
                .get("read dollars", key(agent_pk(agent), usd_sk(p)))
                .await?;
            out.push(usd_tally(p, item.as_ref()));
        }
        Ok(out)
    }

    async fn spend_of_day(&self, agent: &AgentId, day: Date) -> Result<Vec<Spend>, StoreError> {
        let prefix = spend_sk(day, "");
        let items = self
            .query_prefix("read spend", &agent_pk(agent), &prefix, false, None)
            .await?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let sk = item.get("sk").and_then(|v| v.as_s().ok());
            let number = |k: &str| {
                item.get(k)
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse::<i64>().ok())
            };
            let (Some(source), Some(tokens), Some(at)) = (
                sk.and_then(|k| k.strip_prefix(&prefix)),
                number("tokens"),
                number("at"),
            ) else {
                return Err(StoreError::corrupt(
                    format!("{}/{}", agent_pk(agent), sk.map_or("?", |k| k)),
                    "a spend entry without its source, tokens or time",
                ));
            };
            out.push(Spend {
                day,
                source: source.to_owned(),
                tokens: tokens.max(0) as u64,
                at: from_ms(at),
            });
        }
        Ok(out)
    }
}

/// When a dollar tally expires: two months after it was last written, past the month
/// it counts.
fn usd_expiry(at: Timestamp) -> i64 {
    at.as_second() + 62 * 86_400
}

/// A period's tally from its item; zero when there is none.
fn usd_tally(period: &str, item: Option<&Item>) -> Tally {
    let number = |k: &str| {
        item.and_then(|i| i.get(k))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
            .max(0) as u64
    };
    Tally {
        period: period.to_owned(),
        spent: Usd::from_micros(number("spent")),
        held: Usd::from_micros(number("held")),
    }
}

/// Whether a conditional update was made: `false` when its condition did not hold.
fn conditional<O, R: std::fmt::Debug + Send + Sync + 'static>(
    op: &'static str,
    r: Result<
        O,
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
            R,
        >,
    >,
) -> Result<bool, StoreError> {
    match r {
        Ok(_) => Ok(true),
        Err(e) => match e.into_service_error() {
            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(false),
            other => Err(StoreError::backend("dynamodb", op, other)),
        },
    }
}
