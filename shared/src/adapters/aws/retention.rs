//! Retention on DynamoDB: an agent's finished records found by ranges of its partition's
//! time-ordered sort keys, then deleted 25 to a request.
//!
//! Hook deliveries and attempts, webhook request log entries and replay keys carry a TTL
//! written with them (their expiry is known then), so DynamoDB removes those at no cost.
//! Heartbeats, events, actions and conversation records are removed here: an event's end
//! is only known when the heartbeat that reads it completes, which may be weeks after it
//! was written (a paused agent), and writing a TTL then would cost one more write per
//! event. A pass reads what it removes once (its key range starts at the oldest item) and
//! deletes it; it runs daily, never in the sweep, so the idle cycle costs what it did.

use async_trait::async_trait;
use jiff::Timestamp;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, EventCursor, first_id_at};
use crate::error::StoreError;
use crate::ports::{Maintenance, Pruned, Reclaimed};

const OP: &str = "prune records";

fn sort_key(item: &Item) -> Option<&str> {
    item.get("sk")
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

impl DynamoStore {
    /// The keys of the partition's items with sort keys from `lo` up to `hi` (included
    /// when `through`).
    async fn keys_below(
        &self,
        pk: &str,
        lo: &str,
        hi: &str,
        through: bool,
    ) -> Result<Vec<Item>, StoreError> {
        self.query_range(OP, pk, lo..=hi, false, usize::MAX, 1_000, |item| {
            Ok(sort_key(&item)
                .filter(|sk| through || *sk < hi)
                .map(|sk| key(pk.to_owned(), sk.to_owned())))
        })
        .await
    }

    /// The agent's heartbeats that finished before `horizon`: they finish in beat order,
    /// so the read goes from the first and stops at the first that did not.
    async fn old_heartbeats(&self, pk: &str, horizon: Timestamp) -> Result<Vec<Item>, StoreError> {
        const PAGE: usize = 100;
        let mut old = Vec::new();
        let mut lo = "HB#".to_owned();
        loop {
            let page = self
                .query_range(OP, pk, lo.as_str()..="HB#~", false, PAGE, PAGE, |item| {
                    read_heartbeat(item).map(Some)
                })
                .await?;
            let full = page.len() == PAGE;
            for hb in page {
                let ended = hb.completed_at.unwrap_or(hb.scheduled_at);
                if !(hb.status.is_final() && ended < horizon) {
                    return Ok(old);
                }
                lo = format!("{}0", heartbeat_sk(hb.beat));
                old.push(key(pk.to_owned(), heartbeat_sk(hb.beat)));
            }
            if !full {
                return Ok(old);
            }
        }
    }

    /// Where the agent's events may be removed up to: the start of its live heartbeat's
    /// window, the newest of its heartbeats ("" when it has none: nothing is removed).
    async fn event_frontier(&self, pk: &str) -> Result<String, StoreError> {
        let newest = self
            .query_range(OP, pk, "HB#"..="HB#~", true, 2, 2, |item| {
                read_heartbeat(item).map(Some)
            })
            .await?;
        Ok(newest
            .iter()
            .filter(|hb| !hb.status.is_final())
            .map(|hb| hb.window_start.as_str())
            .min()
            .unwrap_or("")
            .to_owned())
    }
}

#[async_trait]
impl Maintenance for DynamoStore {
    /// DynamoDB did not answer the last attempt (no answer, or a 5xx), until one is
    /// answered again.
    fn write_trouble(&self) -> Option<String> {
        self.reachable.trouble()
    }

    /// While DynamoDB did not answer: one consistent read of an item that need not
    /// exist, whose answer (or none) sets what [`Maintenance::write_trouble`] says.
    async fn recheck_writes(&self) -> Option<String> {
        self.reachable.trouble()?;
        let _ = self
            .get(
                "check that DynamoDB answers",
                super::codec::key("HEALTH", "CHECK"),
            )
            .await;
        self.reachable.trouble()
    }

    async fn prune_agent(
        &self,
        agent: &AgentId,
        horizon: Timestamp,
        _now: Timestamp,
        apply: bool,
    ) -> Result<Pruned, StoreError> {
        let pk = agent_pk(agent);
        let heartbeats = self.old_heartbeats(&pk, horizon).await?;
        let frontier = self.event_frontier(&pk).await?;
        let stamped = EventCursor::since(horizon).as_str().to_owned();
        let events_to = frontier.min(stamped);
        let mut pruned = Pruned {
            heartbeats: heartbeats.len() as u64,
            ..Pruned::default()
        };
        let mut doomed = heartbeats;
        if !events_to.is_empty() {
            let events = self
                .keys_below(&pk, "EV#", &format!("EV#{events_to}"), true)
                .await?;
            // `AC#<event id>#<tool>`: `#` sorts before `~`.
            let actions = self
                .keys_below(&pk, "AC#", &format!("AC#{events_to}~"), false)
                .await?;
            pruned.events = events.len() as u64;
            pruned.actions = actions.len() as u64;
            doomed.extend(actions);
            doomed.extend(events);
        }
        for (lo, prefix) in [("MS#", "MS#tn_"), ("SG#", "SG#sg_"), ("TN#", "TN#tn_")] {
            let rows = self
                .keys_below(&pk, lo, &first_id_at(prefix, horizon), false)
                .await?;
            pruned.conversation += rows.len() as u64;
            doomed.extend(rows);
        }
        // Approvals parked before the horizon, once settled (an open one stays).
        let settled = self
            .query_range(
                OP,
                &pk,
                "AP#"..=first_id_at("AP#ap_", horizon).as_str(),
                false,
                usize::MAX,
                1_000,
                |item| {
                    let a: crate::domain::Approval = read_doc(&item)?;
                    Ok(a.outcome
                        .is_some()
                        .then(|| key(pk.clone(), format!("AP#{}", a.id))))
                },
            )
            .await?;
        pruned.approvals = settled.len() as u64;
        doomed.extend(settled);
        if apply {
            self.batch_delete(OP, doomed).await?;
        }
        Ok(pruned)
    }

    async fn reclaim(&self) -> Result<Reclaimed, StoreError> {
        Ok(Reclaimed::default())
    }
}
