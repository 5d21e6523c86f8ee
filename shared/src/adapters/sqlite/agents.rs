//! Agents on SQLite, and the Discord channel each answers in.

use async_trait::async_trait;
use jiff::Timestamp;
use jiff::civil::Date;
use rusqlite::{Connection, OptionalExtension, params};

use super::codec::{read_docs, to_doc};
use super::events::upsert_event;
use super::heartbeats::insert_heartbeat;
use super::schema::agent_state;
use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{
    Agent, AgentId, AgentStates, Event, Heartbeat, Limit, Spend, Tally, Usd, from_ms, to_ms,
};
use crate::error::StoreError;
use crate::ports::{AgentStore, AgentsPage, Footprint, Writer};

/// How many agents are in each state, read from the index `agents_by_state`.
const COUNT_BY_STATE: &str = concat!(
    "SELECT ",
    agent_state!(),
    " AS state, count(*) FROM agents GROUP BY state"
);

/// A page of agents (`LIMIT ?1 OFFSET ?2`), oldest first: found in the index
/// `agents_by_age`, then only those records read.
const PAGE_BY_AGE: &str = "SELECT id, doc FROM agents WHERE rowid IN (
        SELECT rowid FROM agents ORDER BY created_ms, id LIMIT ?1 OFFSET ?2)
     ORDER BY created_ms, id";

/// The stored agent, read inside a transaction; `NotFound` if there is none.
fn stored_agent(conn: &Connection, op: &'static str, id: &AgentId) -> Result<Agent, StoreError> {
    read_docs(
        conn,
        op,
        "SELECT id, doc FROM agents WHERE id = ?1",
        [id.as_str()],
    )?
    .pop()
    .ok_or_else(|| StoreError::NotFound(format!("agent {id}")))
}

fn write_agent(conn: &Connection, op: &'static str, agent: &Agent) -> Result<(), StoreError> {
    conn.exec(
        "UPDATE agents SET doc = ?2 WHERE id = ?1",
        params![agent.id.as_str(), to_doc(agent)],
    )
    .map_err(sqlite_err(op))?;
    Ok(())
}

/// Files `agent` as the one that answers in `channel`; `AlreadyExists` if another does.
/// Gives `agent` its name (ignoring ASCII case): `AlreadyExists` naming the agent that
/// holds it.
fn claim_name(conn: &Connection, name: &str, agent: &AgentId) -> Result<(), StoreError> {
    let op = sqlite_err("hold the agent's name");
    let key = name.to_ascii_lowercase();
    let n = conn
        .exec(
            "INSERT INTO agent_names (name, agent_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![key, agent.as_str()],
        )
        .map_err(&op)?;
    if n == 0 {
        let other: String = conn
            .query_row(
                "SELECT agent_id FROM agent_names WHERE name = ?1",
                [&key],
                |r| r.get(0),
            )
            .map_err(&op)?;
        if other != agent.as_str() {
            return Err(StoreError::AlreadyExists(format!(
                "an agent named {name:?} ({other})"
            )));
        }
    }
    Ok(())
}

pub(super) fn claim_channel(
    conn: &Connection,
    channel: &str,
    agent: &AgentId,
) -> Result<(), StoreError> {
    let op = sqlite_err("bind Discord channel");
    let n = conn
        .exec(
            "INSERT INTO discord_channels (channel_id, agent_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![channel, agent.as_str()],
        )
        .map_err(&op)?;
    if n == 0 {
        let other: String = conn
            .query_row(
                "SELECT agent_id FROM discord_channels WHERE channel_id = ?1",
                [channel],
                |r| r.get(0),
            )
            .map_err(&op)?;
        return Err(StoreError::AlreadyExists(format!(
            "an agent for Discord channel {channel} ({other})"
        )));
    }
    Ok(())
}

#[async_trait]
impl AgentStore for SqliteStore {
    async fn agent_for_channel(&self, channel_id: &str) -> Result<Option<AgentId>, StoreError> {
        let channel = channel_id.to_owned();
        self.db
            .call("find channel's agent", move |conn| {
                let id: Option<String> = conn
                    .prepare_cached("SELECT agent_id FROM discord_channels WHERE channel_id = ?1")
                    .and_then(|mut st| st.query_row([&channel], |r| r.get(0)).optional())
                    .map_err(sqlite_err("find channel's agent"))?;
                id.map(|id| {
                    AgentId::parse(&id).map_err(|e| StoreError::corrupt("discord_channels", e))
                })
                .transpose()
            })
            .await
    }

    async fn create_agent(&self, agent: &Agent, first: &Heartbeat) -> Result<(), StoreError> {
        let (agent, first) = (agent.clone(), first.clone());
        self.db
            .call("create agent", move |conn| {
                let tx = super::begin(conn)
                    .map_err(sqlite_err("create agent"))?;
                let n = tx
                    .exec(
                        "INSERT INTO agents (id, created_ms, doc) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![agent.id.as_str(), to_ms(agent.created_at), to_doc(&agent)],
                    )
                    .map_err(sqlite_err("create agent"))?;
                if n == 0 {
                    return Err(StoreError::AlreadyExists(format!("agent {}", agent.id)));
                }
                claim_name(&tx, &agent.name, &agent.id)?;
                if let Some(channel) = &agent.discord_channel {
                    claim_channel(&tx, channel, &agent.id)?;
                }
                insert_heartbeat(&tx, &first)?;
                tx.commit().map_err(sqlite_err("create agent"))
            })
            .await
    }

    async fn import_agents(&self, agents: &[(Agent, Heartbeat)]) -> Result<(), StoreError> {
        let agents = agents.to_vec();
        self.db
            .call("import agents", move |conn| {
                let op = sqlite_err("import agents");
                let tx = super::begin(conn)
                    .map_err(&op)?;
                for (agent, first) in &agents {
                    tx.exec(
                        "INSERT OR REPLACE INTO agents (id, created_ms, doc) VALUES (?1, ?2, ?3)",
                        params![agent.id.as_str(), to_ms(agent.created_at), to_doc(agent)],
                    )
                    .map_err(&op)?;
                    tx.exec(
                        "DELETE FROM heartbeats WHERE agent_id = ?1 AND beat = ?2",
                        params![first.agent_id.as_str(), first.beat as i64],
                    )
                    .map_err(&op)?;
                    if let Some(channel) = &agent.discord_channel {
                        tx.exec(
                            "INSERT OR REPLACE INTO discord_channels (channel_id, agent_id) VALUES (?1, ?2)",
                            params![channel, agent.id.as_str()],
                        )
                        .map_err(&op)?;
                    }
                    tx.exec(
                        "INSERT OR REPLACE INTO agent_names (name, agent_id) VALUES (?1, ?2)",
                        params![agent.name.to_ascii_lowercase(), agent.id.as_str()],
                    )
                    .map_err(&op)?;
                    insert_heartbeat(&tx, first)?;
                }
                tx.commit().map_err(&op)
            })
            .await
    }

    async fn get_agent(&self, id: &AgentId) -> Result<Option<Agent>, StoreError> {
        let id = id.clone();
        self.db
            .call("get agent", move |conn| {
                Ok(read_docs(
                    conn,
                    "get agent",
                    "SELECT id, doc FROM agents WHERE id = ?1",
                    [id.as_str()],
                )?
                .pop())
            })
            .await
    }

    async fn list_agents(&self) -> Result<Vec<Agent>, StoreError> {
        self.db
            .call("list agents", |conn| {
                read_docs(
                    conn,
                    "list agents",
                    "SELECT id, doc FROM agents ORDER BY created_ms, id",
                    [],
                )
            })
            .await
    }

    async fn agents_page(&self, offset: usize, limit: usize) -> Result<AgentsPage, StoreError> {
        self.db
            .call("list agents", move |conn| {
                let op = "list agents";
                // Counted from the index, so no record is read but the page's.
                let mut stmt = conn
                    .prepare_cached(COUNT_BY_STATE)
                    .map_err(sqlite_err(op))?;
                let counts = stmt
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                    .map_err(sqlite_err(op))?;
                let mut states = AgentStates::default();
                for row in counts {
                    let (state, n) = row.map_err(sqlite_err(op))?;
                    let n = usize::try_from(n).unwrap_or(0);
                    match state {
                        3 => states.paused = n,
                        2 => states.auto_paused = n,
                        1 => states.snoozed = n,
                        _ => states.active = n,
                    }
                }
                let agents = read_docs(
                    conn,
                    op,
                    PAGE_BY_AGE,
                    params![
                        i64::try_from(limit).unwrap_or(i64::MAX),
                        i64::try_from(offset).unwrap_or(i64::MAX)
                    ],
                )?;
                Ok(AgentsPage { states, agents })
            })
            .await
    }

    async fn record_interaction(&self, id: &AgentId, at: Timestamp) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("record interaction", move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err("record interaction"))?;
                let mut agent = stored_agent(&tx, "record interaction", &id)?;
                if agent.last_interaction_at.is_some_and(|t| t >= at) {
                    return Ok(());
                }
                agent.last_interaction_at = Some(at);
                write_agent(&tx, "record interaction", &agent)?;
                tx.commit().map_err(sqlite_err("record interaction"))
            })
            .await
    }

    async fn set_next_wake(&self, id: &AgentId, at: Option<Timestamp>) -> Result<(), StoreError> {
        let id = id.clone();
        self.db
            .call("set next wake", move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err("set next wake"))?;
                let mut agent = stored_agent(&tx, "set next wake", &id)?;
                agent.next_wake = at;
                write_agent(&tx, "set next wake", &agent)?;
                tx.commit().map_err(sqlite_err("set next wake"))
            })
            .await
    }

    async fn update_agent(&self, agent: &Agent, previous: &Agent) -> Result<(), StoreError> {
        let (mut agent, previous) = (agent.clone(), previous.clone());
        self.db
            .call("update agent", move |conn| {
                let op = "update agent";
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let stored = stored_agent(&tx, op, &agent.id)?;
                agent.paused_at = stored.paused_at;
                agent.last_interaction_at = stored.last_interaction_at;
                agent.next_wake = stored.next_wake;
                if !agent.name.eq_ignore_ascii_case(&stored.name) {
                    // Renamed: the new name is taken first, then the old one given up
                    // (if this agent held it: one of a pair that shared it may not).
                    claim_name(&tx, &agent.name, &agent.id)?;
                    tx.exec(
                        "DELETE FROM agent_names WHERE name = ?1 AND agent_id = ?2",
                        params![stored.name.to_ascii_lowercase(), agent.id.as_str()],
                    )
                    .map_err(sqlite_err(op))?;
                }
                if agent.discord_channel != previous.discord_channel {
                    tx.exec(
                        "DELETE FROM discord_channels WHERE agent_id = ?1",
                        [agent.id.as_str()],
                    )
                    .map_err(sqlite_err(op))?;
                    if let Some(channel) = &agent.discord_channel {
                        claim_channel(&tx, channel, &agent.id)?;
                    }
                }
                write_agent(&tx, op, &agent)?;
                tx.commit().map_err(sqlite_err(op))
            })
            .await
    }

    async fn set_paused(
        &self,
        id: &AgentId,
        paused_at: Option<Timestamp>,
        event: &Event,
        writer: Writer,
    ) -> Result<bool, StoreError> {
        let (id, event) = (id.clone(), event.clone());
        let deadline = self.db.deadline_for(writer);
        self.db
            .call("pause or resume agent", move |conn| {
                let op = "pause or resume agent";
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let mut agent = stored_agent(&tx, op, &id)?;
                if agent.paused_at.is_some() == paused_at.is_some() {
                    return Ok(false);
                }
                agent.paused_at = paused_at;
                write_agent(&tx, op, &agent)?;
                upsert_event(&tx, &event, deadline.as_ref())?;
                tx.commit().map_err(sqlite_err(op))?;
                Ok(true)
            })
            .await
    }

    async fn purge_agent(&self, id: &AgentId, apply: bool) -> Result<Footprint, StoreError> {
        let id = id.clone();
        self.db
            .call("delete agent", move |conn| {
                super::purge::purge(conn, &id, apply)
            })
            .await
    }

    async fn record_spend(&self, agent: &AgentId, spend: &Spend) -> Result<(), StoreError> {
        let (agent, spend) = (agent.clone(), spend.clone());
        let op = "record spend";
        self.db
            .call(op, move |conn| {
                let oldest = spend
                    .day
                    .checked_sub(jiff::Span::new().days(Spend::KEPT_DAYS))
                    .unwrap_or(spend.day);
                let tx = super::begin(conn)
                    .map_err(sqlite_err(op))?;
                tx.exec(
                    "INSERT INTO spend (agent_id, day, source, tokens, at_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (agent_id, day, source) DO UPDATE SET tokens = excluded.tokens, at_ms = excluded.at_ms",
                    params![
                        agent.as_str(),
                        spend.day.to_string(),
                        spend.source,
                        spend.tokens as i64,
                        to_ms(spend.at)
                    ],
                )
                .map_err(sqlite_err(op))?;
                tx.exec(
                    "DELETE FROM spend WHERE agent_id = ?1 AND day < ?2",
                    params![agent.as_str(), oldest.to_string()],
                )
                .map_err(sqlite_err(op))?;
                tx.commit().map_err(sqlite_err(op))
            })
            .await
    }

    async fn hold_usd(
        &self,
        agent: &AgentId,
        limits: &[Limit],
        amount: Usd,
        at: Timestamp,
    ) -> Result<Result<(), Tally>, StoreError> {
        let (agent, limits) = (agent.clone(), limits.to_vec());
        let op = "hold dollars";
        self.db
            .call(op, move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                for l in &limits {
                    let t = usd_tally(&tx, &agent, &l.period).map_err(sqlite_err(op))?;
                    if t.committed().saturating_add(amount) > l.limit {
                        // Nothing held: the transaction is dropped, so rolled back.
                        return Ok(Err(t));
                    }
                }
                for l in &limits {
                    tx.exec(
                        "INSERT INTO usd (agent_id, period, spent, held, at_ms) VALUES (?1, ?2, 0, ?3, ?4) \
                         ON CONFLICT (agent_id, period) DO UPDATE SET held = held + excluded.held, at_ms = excluded.at_ms",
                        params![agent.as_str(), l.period, amount.micros() as i64, to_ms(at)],
                    )
                    .map_err(sqlite_err(op))?;
                }
                tx.commit().map_err(sqlite_err(op))?;
                Ok(Ok(()))
            })
            .await
    }

    async fn settle_usd(
        &self,
        agent: &AgentId,
        periods: &[String],
        held: Usd,
        spent: Usd,
        at: Timestamp,
    ) -> Result<Vec<Tally>, StoreError> {
        let (agent, periods) = (agent.clone(), periods.to_vec());
        let op = "settle dollars";
        self.db
            .call(op, move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let mut out = Vec::with_capacity(periods.len());
                for p in &periods {
                    tx.exec(
                        "INSERT INTO usd (agent_id, period, spent, held, at_ms) VALUES (?1, ?2, ?3, 0, ?4) \
                         ON CONFLICT (agent_id, period) DO UPDATE SET spent = spent + excluded.spent, \
                         held = max(held - ?5, 0), at_ms = excluded.at_ms",
                        params![
                            agent.as_str(),
                            p,
                            spent.micros() as i64,
                            to_ms(at),
                            held.micros() as i64
                        ],
                    )
                    .map_err(sqlite_err(op))?;
                    out.push(usd_tally(&tx, &agent, p).map_err(sqlite_err(op))?);
                }
                tx.commit().map_err(sqlite_err(op))?;
                Ok(out)
            })
            .await
    }

    async fn mark_usd(
        &self,
        agent: &AgentId,
        period: &str,
        percent: u64,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let (agent, period) = (agent.clone(), period.to_owned());
        let op = "mark dollars";
        let mark = format!("{percent};");
        self.db
            .call(op, move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                tx.exec(
                    "INSERT INTO usd (agent_id, period, spent, held, at_ms) VALUES (?1, ?2, 0, 0, ?3) \
                     ON CONFLICT (agent_id, period) DO NOTHING",
                    params![agent.as_str(), period, to_ms(at)],
                )
                .map_err(sqlite_err(op))?;
                let changed = tx
                    .exec(
                        "UPDATE usd SET marks = marks || ?3 \
                         WHERE agent_id = ?1 AND period = ?2 AND instr(';' || marks, ';' || ?3) = 0",
                        params![agent.as_str(), period, mark],
                    )
                    .map_err(sqlite_err(op))?;
                tx.commit().map_err(sqlite_err(op))?;
                Ok(changed == 1)
            })
            .await
    }

    async fn take_call(
        &self,
        agent: &AgentId,
        minute: &str,
        limit: u32,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let (agent, minute) = (agent.clone(), minute.to_owned());
        let op = "count a model call";
        self.db
            .call(op, move |conn| {
                let tx = super::begin(conn).map_err(sqlite_err(op))?;
                let counted = tx
                    .exec(
                        "INSERT INTO calls (agent_id, minute, count, at_ms) VALUES (?1, ?2, 1, ?3) \
                         ON CONFLICT (agent_id, minute) DO UPDATE SET count = count + 1, at_ms = excluded.at_ms \
                         WHERE count < ?4",
                        params![agent.as_str(), minute, to_ms(at), i64::from(limit)],
                    )
                    .map_err(sqlite_err(op))?;
                // Minutes more than an hour old are done with.
                tx.exec(
                    "DELETE FROM calls WHERE agent_id = ?1 AND at_ms < ?2",
                    params![agent.as_str(), to_ms(at) - 3_600_000],
                )
                .map_err(sqlite_err(op))?;
                tx.commit().map_err(sqlite_err(op))?;
                Ok(counted == 1)
            })
            .await
    }

    async fn usd_tallies(
        &self,
        agent: &AgentId,
        periods: &[String],
    ) -> Result<Vec<Tally>, StoreError> {
        let (agent, periods) = (agent.clone(), periods.to_vec());
        let op = "read dollars";
        self.db
            .call(op, move |conn| {
                periods
                    .iter()
                    .map(|p| usd_tally(conn, &agent, p).map_err(sqlite_err(op)))
                    .collect()
            })
            .await
    }

    async fn spend_of_day(&self, agent: &AgentId, day: Date) -> Result<Vec<Spend>, StoreError> {
        let agent = agent.clone();
        let op = "read spend";
        self.db
            .call(op, move |conn| {
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT source, tokens, at_ms FROM spend WHERE agent_id = ?1 AND day = ?2 ORDER BY source",
                    )
                    .map_err(sqlite_err(op))?;
                let rows = stmt
                    .query_map(params![agent.as_str(), day.to_string()], |r| {
                        Ok(Spend {
                            day,
                            source: r.get(0)?,
                            tokens: r.get::<_, i64>(1)? as u64,
                            at: from_ms(r.get(2)?),
                        })
                    })
                    .map_err(sqlite_err(op))?;
                rows.collect::<Result<Vec<_>, _>>().map_err(sqlite_err(op))
            })
            .await
    }
}

/// One period's tally; zero when nothing was held or spent in it.
fn usd_tally(conn: &Connection, agent: &AgentId, period: &str) -> rusqlite::Result<Tally> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT spent, held FROM usd WHERE agent_id = ?1 AND period = ?2")?
        .query_row(params![agent.as_str(), period], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let (spent, held) = row.unwrap_or((0, 0));
    Ok(Tally {
        period: period.to_owned(),
        spent: Usd::from_micros(spent.max(0) as u64),
        held: Usd::from_micros(held.max(0) as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What SQLite plans for `sql`, one line per step.
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let args: Vec<i64> = (0..stmt.parameter_count()).map(|_| 1).collect();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>();
        rows.join("\n")
    }

    #[test]
    fn the_listing_reads_its_counts_and_its_page_from_indexes() {
        let conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&conn, std::path::Path::new(":memory:")).unwrap();
        let counts = plan(&conn, COUNT_BY_STATE);
        assert!(
            counts.contains("USING INDEX agents_by_state") && !counts.contains("TEMP B-TREE"),
            "the counts are not read from the index: {counts:?}"
        );
        let page = plan(&conn, PAGE_BY_AGE);
        assert!(
            page.contains("SCAN agents USING COVERING INDEX agents_by_age"),
            "the page is not found in the index: {page:?}"
        );
    }

    #[test]
    fn a_record_that_is_not_json_does_not_stop_the_listing_s_migration() {
        let conn = Connection::open_in_memory().unwrap();
        let path = std::path::Path::new(":memory:");
        super::super::schema::migrate(&conn, path).unwrap();
        // A file of version 12 (before the listing's indexes and the tool counts),
        // holding a record that is not JSON.
        conn.execute_batch(
            "DROP INDEX agents_by_state; DROP INDEX agents_by_age;
             DROP TABLE tool_counts; DROP TABLE tool_times; DROP TABLE api_counts;
             ALTER TABLE heartbeats DROP COLUMN handed_on;
             DROP TABLE waiting_turns;
             ALTER TABLE hook_dead DROP COLUMN visible_ms;
             DROP TABLE write_checks;
             ALTER TABLE heartbeats DROP COLUMN ran_ms;
             DROP TABLE agent_names;
             DROP TABLE approvals;
             DROP TABLE usd;
             DROP TABLE calls;
             ALTER TABLE heartbeats DROP COLUMN tasks;
             ALTER TABLE heartbeats DROP COLUMN outcome;
             ALTER TABLE heartbeats DROP COLUMN outcome_reason;
             DROP TABLE undelivered;
             ALTER TABLE heartbeats DROP COLUMN trace_id;
             PRAGMA user_version = 12;
             INSERT INTO agents (id, created_ms, doc) VALUES ('ag_broken', 1, 'not json');",
        )
        .unwrap();
        super::super::schema::migrate(&conn, path).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, 27);
        let counted: (i64, i64) = conn
            .query_row(COUNT_BY_STATE, [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!(counted, (0, 1), "the broken record is counted, as active");
    }
}
