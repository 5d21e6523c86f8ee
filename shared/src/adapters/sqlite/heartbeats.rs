//! Heartbeats on SQLite: plain columns, since claims and finishes update them field by
//! field; the partial `heartbeats_due` index is the due index.

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::events::upsert_event;
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{
    AgentId, ClaimRequest, EventCursor, Heartbeat, HeartbeatId, HeartbeatStatus, Outcome,
    OutcomeKind, SessionId, from_ms, to_ms,
};
use crate::error::StoreError;
use crate::ports::{DuePage, Finish, FinishOutcome, HeartbeatStore, PageToken, Reschedule};

pub(super) const HB_COLS: &str = "agent_id, beat, session, status, scheduled_ms, claim, lease_ms, started_ms, \
    completed_ms, window_start, window_end, last_interaction_beat, interaction_seen_ms, since_last, \
    consecutive_failures, events_processed, actions_triggered, actions_failed, cascade_capped, error, \
    hour_from_ms, beats_in_hour, skipped, requests, handed_on, ran_ms, tasks, outcome, outcome_reason, trace_id";

pub(super) fn heartbeat_row(r: &Row<'_>) -> rusqlite::Result<Result<Heartbeat, StoreError>> {
    let agent: String = r.get(0)?;
    let beat: i64 = r.get(1)?;
    let session: String = r.get(2)?;
    let status: String = r.get(3)?;
    let ts = |i: usize| -> rusqlite::Result<Option<Timestamp>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(from_ms))
    };
    let n = |i: usize| -> rusqlite::Result<u32> { Ok(r.get::<_, i64>(i)? as u32) };
    let key = format!("heartbeat {agent}/{beat}");
    let (agent_id, session, status) = match (
        AgentId::parse(&agent),
        SessionId::parse(&session),
        HeartbeatStatus::parse(&status),
    ) {
        (Ok(a), Ok(s), Some(st)) => (a, s, st),
        (Err(e), _, _) => return Ok(Err(StoreError::corrupt(key, e))),
        (_, Err(e), _) => return Ok(Err(StoreError::corrupt(key, e))),
        (_, _, None) => {
            return Ok(Err(StoreError::corrupt(
                key,
                format!("unknown status {status}"),
            )));
        }
    };
    Ok(Ok(Heartbeat {
        agent_id,
        beat: beat as u64,
        session,
        status,
        scheduled_at: from_ms(r.get(4)?),
        claim: n(5)?,
        lease_until: ts(6)?,
        started_at: ts(7)?,
        completed_at: ts(8)?,
        window_start: EventCursor::from_stored(r.get::<_, String>(9)?),
        window_end: r
            .get::<_, Option<String>>(10)?
            .map(EventCursor::from_stored),
        last_interaction_beat: r.get::<_, i64>(11)? as u64,
        interaction_seen_at: ts(12)?,
        since_last: r.get::<_, Option<i64>>(13)?.map(|n| n as u64),
        consecutive_failures: n(14)?,
        events_processed: n(15)?,
        actions_triggered: n(16)?,
        actions_failed: n(17)?,
        cascade_capped: n(18)?,
        error: r.get(19)?,
        hour_from: ts(20)?,
        beats_in_hour: n(21)?,
        skipped: r.get(22)?,
        requests: match r.get::<_, Option<String>>(23)? {
            None => None,
            Some(json) => match serde_json::from_str(&json) {
                Ok(counts) => Some(counts),
                Err(e) => return Ok(Err(StoreError::corrupt(key, e))),
            },
        },
        handed_on: match r.get::<_, Option<String>>(24)? {
            None => None,
            Some(json) => match serde_json::from_str(&json) {
                Ok(found) => Some(found),
                Err(e) => return Ok(Err(StoreError::corrupt(key, format!("handed_on: {e}")))),
            },
        },
        ran_at: ts(25)?,
        tasks: match r.get::<_, Option<String>>(26)? {
            None => Default::default(),
            Some(json) => match serde_json::from_str(&json) {
                Ok(tasks) => tasks,
                Err(e) => return Ok(Err(StoreError::corrupt(key, format!("tasks: {e}")))),
            },
        },
        outcome: match r.get::<_, Option<String>>(27)? {
            None => None,
            Some(kind) => match OutcomeKind::parse(&kind) {
                Some(kind) => Some(Outcome {
                    kind,
                    reason: r.get::<_, Option<String>>(28)?.unwrap_or_default(),
                }),
                None => {
                    return Ok(Err(StoreError::corrupt(
                        key,
                        format!("unknown outcome {kind}"),
                    )));
                }
            },
        },
        trace_id: r.get(29)?,
    }))
}

fn requests_json(hb: &Heartbeat) -> Option<String> {
    hb.requests
        .as_ref()
        .map(|r| serde_json::to_string(r).unwrap_or_default())
}

pub(super) fn insert_heartbeat(conn: &Connection, hb: &Heartbeat) -> Result<(), StoreError> {
    conn.exec(
        &format!(
            "INSERT INTO heartbeats ({HB_COLS}, due_ms) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31)"
        ),
        params![
            hb.agent_id.as_str(),
            hb.beat as i64,
            hb.session.as_str(),
            hb.status.as_str(),
            to_ms(hb.scheduled_at),
            hb.claim,
            hb.lease_until.map(to_ms),
            hb.started_at.map(to_ms),
            hb.completed_at.map(to_ms),
            hb.window_start.as_str(),
            hb.window_end.as_ref().map(EventCursor::as_str),
            hb.last_interaction_beat as i64,
            hb.interaction_seen_at.map(to_ms),
            hb.since_last.map(|n| n as i64),
            hb.consecutive_failures,
            hb.events_processed,
            hb.actions_triggered,
            hb.actions_failed,
            hb.cascade_capped,
            hb.error,
            hb.hour_from.map(to_ms),
            hb.beats_in_hour,
            hb.skipped,
            requests_json(hb),
            hb.handed_on
                .as_ref()
                .map(|f| serde_json::to_string(f).unwrap_or_default()),
            hb.ran_at.map(to_ms),
            hb.tasks.stored(),
            hb.outcome.as_ref().map(|o| o.kind.as_str()),
            hb.outcome.as_ref().map(|o| o.reason.as_str()),
            hb.trace_id,
            hb.due_at().map(to_ms),
        ],
    )
    .map_err(sqlite_err("insert heartbeat"))?;
    Ok(())
}

pub(super) fn parse_page(token: &PageToken) -> Option<(i64, String, i64)> {
    let mut parts = token.0.splitn(3, '|');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_owned(),
        parts.next()?.parse().ok()?,
    ))
}

#[async_trait]
impl HeartbeatStore for SqliteStore {
    fn due_shards(&self) -> u16 {
        // One partial index; SQLite has no hot partitions to spread.
        1
    }

    async fn due(
        &self,
        _shard: u16,
        now: Timestamp,
        page: Option<PageToken>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        let after = page
            .as_ref()
            .and_then(parse_page)
            .unwrap_or((i64::MIN, String::new(), 0));
        self.db
            .call("query due heartbeats", move |conn| {
                let op = sqlite_err("query due heartbeats");
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT agent_id, beat, due_ms FROM heartbeats \
                         WHERE due_ms IS NOT NULL AND due_ms <= ?1 AND (due_ms, agent_id, beat) > (?2, ?3, ?4) \
                         ORDER BY due_ms, agent_id, beat LIMIT ?5",
                    )
                    .map_err(&op)?;
                let rows = stmt
                    .query_map(params![to_ms(now), after.0, after.1, after.2, limit as i64], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                    })
                    .map_err(&op)?;
                let mut ids = Vec::new();
                let mut last = None;
                for row in rows {
                    let (agent, beat, due) = row.map_err(&op)?;
                    let agent_id = AgentId::parse(&agent).map_err(|e| StoreError::corrupt(&agent, e))?;
                    ids.push(HeartbeatId::new(agent_id, beat as u64));
                    last = Some(format!("{due}|{agent}|{beat}"));
                }
                let next = if ids.len() == limit { last.map(PageToken) } else { None };
                Ok(DuePage { ids, next })
            })
            .await
    }

    async fn claim(
        &self,
        id: &HeartbeatId,
        req: &ClaimRequest,
    ) -> Result<Option<Heartbeat>, StoreError> {
        self.claim_many(std::slice::from_ref(id), req, 1)
            .await
            .pop()
            .unwrap_or(Ok(None))
    }

    async fn claim_many(
        &self,
        ids: &[HeartbeatId],
        req: &ClaimRequest,
        _concurrency: usize,
    ) -> Vec<Result<Option<Heartbeat>, StoreError>> {
        let (owned, req) = (ids.to_vec(), req.clone());
        let claimant = self.db.claimants.id();
        // One transaction for the page: each UPDATE is still conditional on its row, so
        // concurrent sweepers (other connections) still claim each heartbeat once.
        let result = self
            .db
            .call("claim heartbeats", move |conn| {
                let op = sqlite_err("claim heartbeats");
                let now = to_ms(req.now);
                let lease = to_ms(req.now.saturating_add(req.lease).unwrap_or(req.now));
                let tx = super::begin(conn)
                    .map_err(&op)?;
                let mut out = Vec::with_capacity(owned.len());
                {
                    let mut stmt = tx
                        .prepare_cached(&format!(
                            "UPDATE heartbeats SET status = 'EXECUTING', claim = claim + 1, lease_ms = ?3, due_ms = ?3, \
                                 started_ms = COALESCE(started_ms, ?4), window_end = COALESCE(window_end, ?5), claimed_by = ?6 \
                             WHERE agent_id = ?1 AND beat = ?2 AND \
                                 ((status = 'PENDING' AND scheduled_ms <= ?4) OR (status = 'EXECUTING' AND lease_ms <= ?4)) \
                             RETURNING {HB_COLS}"
                        ))
                        .map_err(&op)?;
                    for id in &owned {
                        let claimed = stmt
                            .query_row(
                                params![
                                    id.agent().as_str(),
                                    id.beat() as i64,
                                    lease,
                                    now,
                                    req.window_end.as_str(),
                                    claimant
                                ],
                                heartbeat_row,
                            )
                            .optional()
                            .map_err(&op)?
                            .transpose();
                        out.push(claimed);
                    }
                }
                tx.commit().map_err(&op)?;
                Ok(out)
            })
            .await;
        match result {
            Ok(out) => out,
            Err(e) => {
                let why = crate::error::chain(&e);
                ids.iter()
                    .map(|_| {
                        Err(StoreError::backend(
                            "sqlite",
                            "claim heartbeats",
                            why.clone(),
                        ))
                    })
                    .collect()
            }
        }
    }

    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        let finish = finish.clone();
        self.db
            .call("finish heartbeat", move |conn| {
                let op = sqlite_err("finish heartbeat");
                let hb = &finish.heartbeat;
                let tx = super::begin(conn).map_err(&op)?;
                let current: Option<(String, i64)> = tx
                    .row(
                        "SELECT status, claim FROM heartbeats WHERE agent_id = ?1 AND beat = ?2",
                        params![hb.agent_id.as_str(), hb.beat as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(&op)?;
                let Some((status, claim)) = current else {
                    return Ok(FinishOutcome::Gone);
                };
                let status = HeartbeatStatus::parse(&status)
                    .ok_or_else(|| StoreError::corrupt(hb.id().to_string(), format!("unknown status {status}")))?;
                let claim = claim as u32;
                if claim != hb.claim || status == HeartbeatStatus::Pending {
                    return Ok(FinishOutcome::Superseded { claim, status });
                }
                if status.is_final() {
                    return Ok(FinishOutcome::AlreadyFinished);
                }
                tx.exec(
                    "UPDATE heartbeats SET status = ?3, completed_ms = ?4, last_interaction_beat = ?5, \
                         interaction_seen_ms = ?6, since_last = ?7, events_processed = ?8, actions_triggered = ?9, \
                         actions_failed = ?10, cascade_capped = ?11, error = ?12, skipped = ?13, requests = ?14, ran_ms = ?15, tasks = ?16, outcome = ?17, outcome_reason = ?18, trace_id = ?19, due_ms = NULL \
                     WHERE agent_id = ?1 AND beat = ?2",
                    params![
                        hb.agent_id.as_str(),
                        hb.beat as i64,
                        hb.status.as_str(),
                        hb.completed_at.map(to_ms),
                        hb.last_interaction_beat as i64,
                        hb.interaction_seen_at.map(to_ms),
                        hb.since_last.map(|n| n as i64),
                        hb.events_processed,
                        hb.actions_triggered,
                        hb.actions_failed,
                        hb.cascade_capped,
                        hb.error,
                        hb.skipped,
                        requests_json(hb),
                        hb.ran_at.map(to_ms),
                        hb.tasks.stored(),
                        hb.outcome.as_ref().map(|o| o.kind.as_str()),
                        hb.outcome.as_ref().map(|o| o.reason.as_str()),
                        hb.trace_id,
                    ],
                )
                .map_err(&op)?;
                if let Some(next) = &finish.next {
                    // The agent's state now decides how the next one is filed.
                    let paused: Option<Option<i64>> = tx
                        .row(
                            "SELECT json_extract(doc, '$.paused_at') IS NOT NULL FROM agents WHERE id = ?1",
                            [hb.agent_id.as_str()],
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(&op)?;
                    match paused {
                        None => {}
                        Some(Some(1)) => {
                            let mut next = next.clone();
                            next.status = HeartbeatStatus::Paused;
                            insert_heartbeat(&tx, &next)?;
                        }
                        Some(_) => insert_heartbeat(&tx, next)?,
                    }
                }
                // The heartbeat's own event, which no window reads: no deadline.
                if let Some(e) = &finish.heartbeat_event {
                    upsert_event(&tx, e, None)?;
                }
                tx.commit().map_err(&op)?;
                Ok(FinishOutcome::Finished)
            })
            .await
    }

    async fn reschedule(
        &self,
        id: &HeartbeatId,
        to: Reschedule,
    ) -> Result<Option<Heartbeat>, StoreError> {
        let id = id.clone();
        self.db
            .call("reschedule heartbeat", move |conn| {
                let (set, from, at) = match to {
                    // The finish reads the agent's state in its own transaction: only
                    // whether it still runs is answered.
                    Reschedule::Running { .. } => ("status", "EXECUTING", None),
                    Reschedule::Due(at) => ("'PENDING'", "PENDING", Some(to_ms(at))),
                    Reschedule::Pause => ("'PAUSED'", "PENDING", None),
                    Reschedule::Resume(at) => ("'PENDING'", "PAUSED", Some(to_ms(at))),
                };
                conn.row(
                    &format!(
                        "UPDATE heartbeats SET status = {set}, scheduled_ms = COALESCE(?4, scheduled_ms), \
                             due_ms = CASE WHEN ?3 = 'EXECUTING' THEN due_ms ELSE ?4 END \
                         WHERE agent_id = ?1 AND beat = ?2 AND status = ?3 RETURNING {HB_COLS}"
                    ),
                    params![id.agent().as_str(), id.beat() as i64, from, at],
                    heartbeat_row,
                )
                .optional()
                .map_err(sqlite_err("reschedule heartbeat"))?
                .transpose()
            })
            .await
    }

    async fn defer(&self, hb: &Heartbeat, until: Timestamp) -> Result<bool, StoreError> {
        let (agent, beat, claim) = (hb.agent_id.to_string(), hb.beat as i64, hb.claim);
        self.db
            .call("defer heartbeat", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE heartbeats SET status = 'PENDING', scheduled_ms = ?4, due_ms = ?4, lease_ms = NULL, \
                             started_ms = NULL, window_end = NULL \
                         WHERE agent_id = ?1 AND beat = ?2 AND claim = ?3 AND status = 'EXECUTING'",
                        params![agent, beat, claim, to_ms(until)],
                    )
                    .map_err(sqlite_err("defer heartbeat"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn renew(&self, hb: &Heartbeat, lease_until: Timestamp) -> Result<bool, StoreError> {
        let (agent, beat, claim) = (hb.agent_id.to_string(), hb.beat as i64, hb.claim);
        self.db
            .call("renew heartbeat lease", move |conn| {
                let n = conn
                    .exec(
                        "UPDATE heartbeats SET lease_ms = ?4, due_ms = ?4 \
                         WHERE agent_id = ?1 AND beat = ?2 AND claim = ?3 AND status = 'EXECUTING'",
                        params![agent, beat, claim, to_ms(lease_until)],
                    )
                    .map_err(sqlite_err("renew heartbeat lease"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn get_heartbeat(&self, id: &HeartbeatId) -> Result<Option<Heartbeat>, StoreError> {
        let id = id.clone();
        self.db
            .call("get heartbeat", move |conn| {
                conn.row(
                    &format!("SELECT {HB_COLS} FROM heartbeats WHERE agent_id = ?1 AND beat = ?2"),
                    params![id.agent().as_str(), id.beat() as i64],
                    heartbeat_row,
                )
                .optional()
                .map_err(sqlite_err("get heartbeat"))?
                .transpose()
            })
            .await
    }

    async fn mark_undeliverable(&self, id: &HeartbeatId, reason: &str) -> Result<(), StoreError> {
        let id = id.clone();
        let outcome =
            crate::domain::Outcome::new(crate::domain::OutcomeKind::Undeliverable, reason);
        self.db
            .call("mark heartbeat undeliverable", move |conn| {
                conn.exec(
                    "UPDATE heartbeats SET outcome = ?3, outcome_reason = ?4 \
                     WHERE agent_id = ?1 AND beat = ?2 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')",
                    params![
                        id.agent().as_str(),
                        id.beat() as i64,
                        outcome.kind.as_str(),
                        outcome.reason
                    ],
                )
                .map_err(sqlite_err("mark heartbeat undeliverable"))?;
                Ok(())
            })
            .await
    }

    async fn heartbeats_page(
        &self,
        agent: &AgentId,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let agent = agent.clone();
        let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
        self.db
            .call("list heartbeats", move |conn| {
                let op = sqlite_err("list heartbeats");
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT {HB_COLS} FROM heartbeats WHERE agent_id = ?1 AND beat < ?2 ORDER BY beat DESC LIMIT ?3"
                    ))
                    .map_err(&op)?;
                let rows = stmt
                    .query_map(params![agent.as_str(), before, limit as i64], heartbeat_row)
                    .map_err(&op)?;
                rows.map(|r| r.map_err(&op)?).collect()
            })
            .await
    }
}
