//! Heartbeats on DynamoDB: claims, finishes, the sharded due index.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{ReturnValue, TransactWriteItem, Update};
use jiff::Timestamp;
use tracing::info;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use super::metrics::{put_units, update_units, with_own};
use crate::domain::{AgentId, ClaimRequest, Heartbeat, HeartbeatId, HeartbeatStatus, to_ms};
use crate::error::StoreError;
use crate::ports::{DuePage, Finish, FinishOutcome, HeartbeatStore, PageToken, Reschedule};

/// On a running heartbeat: its agent was paused while it ran, so its finish files the
/// next one PAUSED.
const PAUSE_NEXT: &str = "pause_next";

/// Why a finish's condition failed, read back from the record.
enum Refused {
    /// The heartbeat still runs under this claim, but the pause mark is the other way
    /// (`true`: the agent is paused now): try again with it.
    Marked(bool),
    /// It is over, or another claim holds it: what to report.
    Because(FinishOutcome),
}

impl DynamoStore {
    /// The finish's update of the heartbeat record, before its condition and the
    /// requests it carries; with the values it binds and the record's key.
    fn finish_update(
        &self,
        hb: &Heartbeat,
    ) -> Result<(aws_sdk_dynamodb::types::builders::UpdateBuilder, Item, Item), StoreError> {
        let mut set = vec![
            "#status = :status",
            "completed_at = :completed",
            "last_interaction_beat = :lib",
            "events_processed = :ep",
            "actions_triggered = :at",
            "actions_failed = :af",
            "cascade_capped = :cc",
        ];
        let mut remove = vec!["due_shard", "due_at", PAUSE_NEXT];
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
            (
                "skipped = :skip",
                "skipped",
                ":skip",
                hb.skipped.clone().map(s),
            ),
            (
                "ran_at = :ran",
                "ran_at",
                ":ran",
                hb.ran_at.map(|t| n(to_ms(t))),
            ),
            (
                "tasks = :tasks",
                "tasks",
                ":tasks",
                hb.tasks.stored().map(s),
            ),
            (
                "outcome = :oc",
                "outcome",
                ":oc",
                hb.outcome.as_ref().map(|o| s(o.kind.as_str())),
            ),
            (
                "outcome_reason = :ocr",
                "outcome_reason",
                ":ocr",
                super::codec::outcome_reason(hb).map(s),
            ),
            (
                "trace_id = :tr",
                "trace_id",
                ":tr",
                hb.trace_id.clone().map(s),
            ),
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
        // The record carries what the heartbeat's requests were, this finish included.
        set.push("requests = :req");
        let item_key = key(agent_pk(&hb.agent_id), heartbeat_sk(hb.beat));
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(item_key.clone()))
            .update_expression(format!(
                "SET {} REMOVE {}",
                set.join(", "),
                remove.join(", ")
            ))
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#claim", "claim")
            .expression_attribute_names("#error", "error");
        Ok((update, values, item_key))
    }

    /// A finish that writes no event (an idle beat's, a failure's, a cancel's) in two
    /// writes of one unit each, where a transaction of the same two items bills four:
    /// the next heartbeat first, put only if it is not there (only a run of this
    /// heartbeat writes it), then this one's record, under its claim and the pause mark
    /// as in a transactional finish. A run stopped between the two leaves this
    /// heartbeat EXECUTING beside its next: its lease runs out, it is run again, and that
    /// run's finish finds the next there and only completes this one. A pause or resume
    /// that came in between moves the next as it would have been filed.
    async fn finish_in_two(
        &self,
        hb: &Heartbeat,
        next: &Heartbeat,
    ) -> Result<FinishOutcome, StoreError> {
        let (update, values, item_key) = self.finish_update(hb)?;
        let mut paused = next.status == HeartbeatStatus::Paused;
        let next_id = next.id();
        let put = self
            .put_new("file next heartbeat", heartbeat_item(next)?)
            .await?;
        if put.is_some() {
            info!(heartbeat = %next_id, "the next heartbeat was filed by an earlier run of this one: kept");
        }
        let update = update
            .condition_expression("#status = :executing AND #claim = :claim")
            .build()
            .map_err(backend("build update"))?;
        let mut counted = hb.requests.clone();
        for _ in 0..4 {
            crate::tally::stamp(&mut counted);
            let requests = with_own(counted.as_ref(), "DynamoDB.UpdateItem", |r| {
                update_units(&item_key, &with_requests(&values, r))
            });
            let mark = if paused {
                "attribute_exists(pause_next)"
            } else {
                "attribute_not_exists(pause_next)"
            };
            let sent = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(update.key.clone()))
                .update_expression(update.update_expression.clone())
                .set_expression_attribute_names(update.expression_attribute_names.clone())
                .set_expression_attribute_values(Some(with_requests(&values, &requests)))
                .condition_expression(format!(
                    "{} AND {mark}",
                    update.condition_expression.as_deref().unwrap_or_default()
                ))
                .send()
                .await;
            match sent {
                Ok(_) => return Ok(FinishOutcome::Finished),
                Err(e) => match e.into_service_error() {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => {}
                    other => return Err(StoreError::backend("dynamodb", "finish heartbeat", other)),
                },
            }
            match self.why_not_finished(hb, paused).await? {
                Refused::Marked(now_paused) => {
                    paused = now_paused;
                    let to = if paused {
                        Reschedule::Pause
                    } else {
                        Reschedule::Resume(next.scheduled_at)
                    };
                    self.reschedule(&next_id, to).await?;
                }
                Refused::Because(FinishOutcome::Gone) => {
                    // The agent was deleted meanwhile: the next is not left behind.
                    let _ = self
                        .delete_existing(
                            "delete next heartbeat",
                            heartbeat_key(&next_id),
                            next_id.to_string(),
                        )
                        .await;
                    return Ok(FinishOutcome::Gone);
                }
                Refused::Because(outcome) => return Ok(outcome),
            }
        }
        Err(StoreError::Conflict(format!(
            "heartbeat {}: the agent was paused and resumed while it finished; the job runs again",
            hb.id()
        )))
    }

    /// Reads the record back after a finish whose condition failed (`paused`: the mark
    /// it expected).
    async fn why_not_finished(&self, hb: &Heartbeat, paused: bool) -> Result<Refused, StoreError> {
        let key = key(agent_pk(&hb.agent_id), heartbeat_sk(hb.beat));
        let Some(item) = self.get("read heartbeat", key).await? else {
            return Ok(Refused::Because(FinishOutcome::Gone));
        };
        let marked = item.contains_key(PAUSE_NEXT);
        let current = read_heartbeat(item)?;
        if current.claim == hb.claim
            && current.status == HeartbeatStatus::Executing
            && marked != paused
        {
            return Ok(Refused::Marked(marked));
        }
        Ok(Refused::Because(
            if current.claim == hb.claim && current.status.is_final() {
                FinishOutcome::AlreadyFinished
            } else {
                FinishOutcome::Superseded {
                    claim: current.claim,
                    status: current.status,
                }
            },
        ))
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
        let item_key = heartbeat_key(id);
        // This claim's own mark. The SDK sends a request again when its answer is lost;
        // a claim that was done then fails its own condition, and the mark on the item
        // it finds says the claim is this one's.
        let claim_token = ulid::Ulid::new().to_string();
        let mut values: Item = HashMap::from([
            (":executing".to_owned(), s("EXECUTING")),
            (":pending".to_owned(), s("PENDING")),
            (":one".to_owned(), n(1)),
            (":lease".to_owned(), n(lease)),
            (":now".to_owned(), n(now)),
            (":wend".to_owned(), s(req.window_end.as_str())),
            (":token".to_owned(), s(&claim_token)),
        ]);
        // The heartbeat's request count starts with its claim (a reclaim starts it
        // again: what a dead run did was never written).
        let requests = with_own(None, "DynamoDB.UpdateItem", |r| {
            update_units(&item_key, &with_requests(&values, r))
        });
        values = with_requests(&values, &requests);
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item_key))
            .update_expression(
                "SET #status = :executing, #claim = #claim + :one, lease_until = :lease, due_at = :lease, \
                 started_at = if_not_exists(started_at, :now), window_end = if_not_exists(window_end, :wend), \
                 requests = :req, claim_token = :token",
            )
            // On the item itself: the index may be stale.
            .condition_expression(
                "(#status = :pending AND scheduled_at <= :now) OR (#status = :executing AND lease_until <= :now)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#claim", "claim")
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
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
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed) => {
                    match failed.item {
                        Some(item) if item.get("claim_token").and_then(|t| t.as_s().ok()) == Some(&claim_token) => {
                            tracing::info!(heartbeat = %id, "the claim's answer was lost and it was sent again: the claim is this one's");
                            read_heartbeat(item).map(Some)
                        }
                        _ => Ok(None),
                    }
                }
                other => Err(StoreError::backend("dynamodb", "claim heartbeat", other)),
            },
        }
    }

    /// One transaction: the finished record, the next heartbeat and the HEARTBEAT event.
    /// No check of the agent's record: a pause marks the running
    /// heartbeat instead (and a delete removes it, which fails the finish).
    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        if let (Some(next), None) = (&finish.next, &finish.heartbeat_event) {
            return self.finish_in_two(&finish.heartbeat, next).await;
        }
        let hb = &finish.heartbeat;
        let (update, values, item_key) = self.finish_update(hb)?;
        // How the next heartbeat is filed follows the mark a pause or resume left on this
        // one while it ran (`Reschedule::Running`): the finish's own condition checks it,
        // so the choice is atomic with the finish at no extra item, and a wrong guess is
        // made again with the other choice.
        let mut next = finish.next.clone();
        let mut paused = next
            .as_ref()
            .is_some_and(|n| n.status == HeartbeatStatus::Paused);
        let mut counted = hb.requests.clone();
        for _ in 0..4 {
            // An attempt after the first counts the ones before it.
            crate::tally::stamp(&mut counted);
            let mark = if paused {
                "attribute_exists(pause_next)"
            } else {
                "attribute_not_exists(pause_next)"
            };
            let mut puts = Vec::new();
            if let Some(next) = &mut next {
                next.status = if paused {
                    HeartbeatStatus::Paused
                } else {
                    HeartbeatStatus::Pending
                };
                puts.push((heartbeat_item(next)?, Some("attribute_not_exists(pk)")));
            }
            if let Some(e) = &finish.heartbeat_event {
                puts.push((event_item(e), None));
            }
            // A transaction writes each item twice.
            let others: f64 = puts.iter().map(|(item, _)| put_units(item)).sum();
            let requests = with_own(counted.as_ref(), "DynamoDB.TransactWriteItems", |r| {
                2.0 * (update_units(&item_key, &with_requests(&values, r)) + others)
            });
            let update = update
                .clone()
                .set_expression_attribute_values(Some(with_requests(&values, &requests)))
                .condition_expression(format!(
                    "#status = :executing AND #claim = :claim AND {mark}"
                ))
                .build()
                .map_err(backend("build transaction"))?;
            let mut items = vec![TransactWriteItem::builder().update(update).build()];
            for (item, condition) in puts {
                items.push(self.put(item, condition)?);
            }
            // No client request token: a retry of a finish that went through fails its
            // condition, and the record read back tells AlreadyFinished from Superseded.
            // (A token would make DynamoDB reject a redelivered job's finish, whose
            // content differs, for ten minutes.)
            let reasons = match self.transact("finish heartbeat", items).await? {
                Ok(()) => return Ok(FinishOutcome::Finished),
                Err(reasons) => reasons,
            };
            if !is_ccf(reasons.first()) {
                return Err(StoreError::backend(
                    "dynamodb",
                    "finish heartbeat",
                    format!("transaction cancelled: {}", reasons.join(", ")),
                ));
            }
            match self.why_not_finished(hb, paused).await? {
                Refused::Marked(now_paused) => paused = now_paused,
                Refused::Because(outcome) => return Ok(outcome),
            }
        }
        Err(StoreError::Conflict(format!(
            "heartbeat {}: the agent was paused and resumed while it finished; the job runs again",
            hb.id()
        )))
    }

    async fn reschedule(
        &self,
        id: &HeartbeatId,
        to: Reschedule,
    ) -> Result<Option<Heartbeat>, StoreError> {
        let req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(heartbeat_key(id)))
            .condition_expression("#status = :from")
            .expression_attribute_names("#status", "status")
            .return_values(ReturnValue::AllNew);
        let (from, req) = match to {
            Reschedule::Pause => (
                "PENDING",
                req.update_expression("SET #status = :paused REMOVE due_shard, due_at")
                    .expression_attribute_values(":paused", s("PAUSED")),
            ),
            Reschedule::Running { pause_next: true } => (
                "EXECUTING",
                req.update_expression("SET #mark = :t")
                    .expression_attribute_names("#mark", PAUSE_NEXT)
                    .expression_attribute_values(
                        ":t",
                        aws_sdk_dynamodb::types::AttributeValue::Bool(true),
                    ),
            ),
            Reschedule::Running { pause_next: false } => (
                "EXECUTING",
                req.update_expression("REMOVE #mark")
                    .expression_attribute_names("#mark", PAUSE_NEXT),
            ),
            Reschedule::Due(at) | Reschedule::Resume(at) => (
                if matches!(to, Reschedule::Due(_)) {
                    "PENDING"
                } else {
                    "PAUSED"
                },
                req.update_expression(
                    "SET #status = :pending, scheduled_at = :at, due_at = :at, due_shard = :shard",
                )
                .expression_attribute_values(":pending", s("PENDING"))
                .expression_attribute_values(":at", n(to_ms(at)))
                .expression_attribute_values(":shard", s(due_shard(id.agent()))),
            ),
        };
        match req
            .expression_attribute_values(":from", s(from))
            .send()
            .await
        {
            Ok(out) => out.attributes.map(read_heartbeat).transpose(),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(None),
                other => Err(StoreError::backend("dynamodb", "reschedule heartbeat", other)),
            },
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
        self.get("get heartbeat", heartbeat_key(id))
            .await?
            .map(read_heartbeat)
            .transpose()
    }

    async fn mark_undeliverable(&self, id: &HeartbeatId, reason: &str) -> Result<(), StoreError> {
        let outcome =
            crate::domain::Outcome::new(crate::domain::OutcomeKind::Undeliverable, reason);
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(heartbeat_key(id)))
            .update_expression("SET outcome = :oc, outcome_reason = :ocr")
            .condition_expression("#status IN (:completed, :failed, :cancelled)")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":oc", s(outcome.kind.as_str()))
            .expression_attribute_values(":ocr", s(&outcome.reason))
            .expression_attribute_values(":completed", s("COMPLETED"))
            .expression_attribute_values(":failed", s("FAILED"))
            .expression_attribute_values(":cancelled", s("CANCELLED"))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                // Gone (pruned) or not finished: nothing to mark.
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_) => Ok(()),
                other => Err(StoreError::backend("dynamodb", "mark heartbeat undeliverable", other)),
            },
        }
    }

    async fn heartbeats_page(
        &self,
        agent: &AgentId,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        // `HB#` + 12 digits: below beat `b` is through `HB#<b - 1>`.
        let hi = match before {
            Some(0) => return Ok(Vec::new()),
            Some(b) => heartbeat_sk(b - 1),
            None => "HB#~".to_owned(),
        };
        self.query_range(
            "list heartbeats",
            &agent_pk(agent),
            "HB#"..=hi.as_str(),
            true,
            limit,
            limit,
            |item| read_heartbeat(item).map(Some),
        )
        .await
    }
}

/// The key of a heartbeat's record.
fn heartbeat_key(id: &HeartbeatId) -> Item {
    key(agent_pk(id.agent()), heartbeat_sk(id.beat()))
}
