//! The database schema and its migrations: `PRAGMA user_version` says which version a
//! file has; opening a file brings it up to date under the write lock.

use std::path::Path;

use rusqlite::Connection;

use super::sqlite_err;
use crate::error::StoreError;

/// The schema version this release writes.
const SCHEMA_VERSION: i64 = 27;

const SCHEMA: &str = r#"
CREATE TABLE agents (
    id          TEXT PRIMARY KEY,
    created_ms  INTEGER NOT NULL,
    doc         TEXT NOT NULL
);

CREATE TABLE heartbeats (
    agent_id              TEXT NOT NULL,
    beat                  INTEGER NOT NULL,
    session               TEXT NOT NULL,
    status                TEXT NOT NULL,
    scheduled_ms          INTEGER NOT NULL,
    claim                 INTEGER NOT NULL,
    lease_ms              INTEGER,
    started_ms            INTEGER,
    completed_ms          INTEGER,
    window_start          TEXT NOT NULL,
    window_end            TEXT,
    last_interaction_beat INTEGER NOT NULL,
    interaction_seen_ms   INTEGER,
    since_last            INTEGER,
    consecutive_failures  INTEGER NOT NULL,
    events_processed      INTEGER NOT NULL,
    actions_triggered     INTEGER NOT NULL,
    actions_failed        INTEGER NOT NULL,
    cascade_capped        INTEGER NOT NULL,
    error                 TEXT,
    -- The due index: set while PENDING (to scheduled_ms) or EXECUTING (to lease_ms), NULL
    -- once the heartbeat is over, so the partial index holds only live heartbeats.
    due_ms                INTEGER,
    PRIMARY KEY (agent_id, beat)
) WITHOUT ROWID;
CREATE INDEX heartbeats_due ON heartbeats (due_ms, agent_id, beat) WHERE due_ms IS NOT NULL;

CREATE TABLE events (
    agent_id  TEXT NOT NULL,
    id        TEXT NOT NULL,
    -- 1 for events a heartbeat made and processed itself; windows skip them.
    own       INTEGER NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, id)
) WITHOUT ROWID;

CREATE TABLE actions (
    id        TEXT PRIMARY KEY,
    agent_id  TEXT NOT NULL,
    event_id  TEXT NOT NULL,
    tool      TEXT NOT NULL,
    status    TEXT NOT NULL,
    attempt   INTEGER NOT NULL,
    doc       TEXT NOT NULL
);
CREATE INDEX actions_by_agent ON actions (agent_id, event_id, tool);

CREATE TABLE tools (
    name  TEXT PRIMARY KEY,
    doc   TEXT NOT NULL
);

CREATE TABLE subscriptions (
    id    TEXT PRIMARY KEY,
    doc   TEXT NOT NULL
);

CREATE TABLE queue_messages (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id     TEXT NOT NULL UNIQUE,
    group_id       TEXT NOT NULL,
    body           TEXT NOT NULL,
    sent_ms        INTEGER NOT NULL,
    -- Not deliverable before this time. After a receive it is the end of the visibility
    -- timeout: while it lies ahead and the message has a receipt, the message is in
    -- flight and its group is locked.
    visible_ms     INTEGER NOT NULL,
    receipt        TEXT,
    receive_count  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX queue_by_group ON queue_messages (group_id, seq);
-- Finds messages that used up their receives without scanning the queue.
CREATE INDEX queue_by_receives ON queue_messages (receive_count, visible_ms);

CREATE TABLE queue_dedup (
    dedup_id  TEXT PRIMARY KEY,
    sent_ms   INTEGER NOT NULL
);
CREATE INDEX queue_dedup_by_age ON queue_dedup (sent_ms);

CREATE TABLE queue_dead (
    seq            INTEGER PRIMARY KEY,
    message_id     TEXT NOT NULL,
    group_id       TEXT NOT NULL,
    body           TEXT NOT NULL,
    sent_ms        INTEGER NOT NULL,
    receive_count  INTEGER NOT NULL,
    dead_ms        INTEGER NOT NULL
);
"#;

/// Version 2: conversations (turns, their messages, the signals they answered) and
/// memories.
const SCHEMA_V2: &str = r#"
CREATE TABLE turns (
    agent_id  TEXT NOT NULL,
    id        TEXT NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, id)
) WITHOUT ROWID;
CREATE TABLE signal_turns (
    agent_id   TEXT NOT NULL,
    signal_id  TEXT NOT NULL,
    turn_id    TEXT NOT NULL,
    PRIMARY KEY (agent_id, signal_id)
) WITHOUT ROWID;
CREATE TABLE messages (
    agent_id  TEXT NOT NULL,
    id        TEXT NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, id)
) WITHOUT ROWID;
CREATE TABLE memories (
    agent_id  TEXT NOT NULL,
    id        TEXT NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, id)
) WITHOUT ROWID;
"#;

/// Version 3: inbound webhooks (their request log, remembered delivery ids, hourly
/// counters) and the Discord channel each agent answers in.
const SCHEMA_V3: &str = r#"
CREATE TABLE webhooks (
    id        TEXT PRIMARY KEY,
    agent_id  TEXT NOT NULL,
    doc       TEXT NOT NULL
);
CREATE TABLE webhook_requests (
    webhook_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    doc         TEXT NOT NULL,
    PRIMARY KEY (webhook_id, id)
) WITHOUT ROWID;
CREATE TABLE webhook_deliveries (
    webhook_id   TEXT NOT NULL,
    delivery_id  TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    expires_ms   INTEGER NOT NULL,
    PRIMARY KEY (webhook_id, delivery_id)
) WITHOUT ROWID;
CREATE TABLE webhook_counters (
    webhook_id  TEXT NOT NULL,
    window      INTEGER NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (webhook_id, window)
) WITHOUT ROWID;
CREATE TABLE discord_channels (
    channel_id  TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL
);
INSERT OR IGNORE INTO discord_channels (channel_id, agent_id)
    SELECT json_extract(doc, '$.discord_channel'), id FROM agents
    WHERE json_extract(doc, '$.discord_channel') IS NOT NULL ORDER BY created_ms;
"#;

/// Version 4: outbound hooks, their deliveries, attempts, queue and dead letters.
const SCHEMA_V4: &str = r#"
CREATE TABLE hooks (
    id        TEXT PRIMARY KEY,
    agent_id  TEXT NOT NULL,
    version   INTEGER NOT NULL,
    doc       TEXT NOT NULL
);
CREATE INDEX hooks_by_agent ON hooks (agent_id, id);
CREATE TABLE hook_deliveries (
    id          TEXT PRIMARY KEY,
    hook_id     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    doc         TEXT NOT NULL
);
CREATE INDEX hook_deliveries_by_hook ON hook_deliveries (hook_id, created_ms, id);
CREATE TABLE hook_attempts (
    delivery_id  TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    doc          TEXT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
) WITHOUT ROWID;
CREATE TABLE hook_queue (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    body           TEXT NOT NULL,
    -- Not deliverable before this time: the send delay, then the visibility timeout.
    visible_ms     INTEGER NOT NULL,
    receipt        TEXT,
    receive_count  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX hook_queue_by_time ON hook_queue (visible_ms);
CREATE TABLE hook_dead (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    body     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    dead_ms  INTEGER NOT NULL
);
"#;

/// Version 5: the per-minute budget of refused webhook requests logged in full.
const SCHEMA_V5: &str = r#"
CREATE TABLE webhook_log_budget (
    webhook_id  TEXT NOT NULL,
    minute      INTEGER NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (webhook_id, minute)
) WITHOUT ROWID;
"#;

/// Version 6: the breaker's hourly count and the heartbeat agent's skip on heartbeats,
/// and the daily spend ledger.
const SCHEMA_V6: &str = r#"
ALTER TABLE heartbeats ADD COLUMN hour_from_ms INTEGER;
ALTER TABLE heartbeats ADD COLUMN beats_in_hour INTEGER NOT NULL DEFAULT 0;
ALTER TABLE heartbeats ADD COLUMN skipped TEXT;
CREATE TABLE spend (
    agent_id  TEXT NOT NULL,
    day       TEXT NOT NULL,
    source    TEXT NOT NULL,
    tokens    INTEGER NOT NULL,
    at_ms     INTEGER NOT NULL,
    PRIMARY KEY (agent_id, day, source)
) WITHOUT ROWID;
"#;

/// Version 7: the cloud requests a heartbeat made (JSON; this store makes none, it
/// keeps what it is given, like every store), and agents' schedules (reminders).
const SCHEMA_V7: &str = r#"
ALTER TABLE heartbeats ADD COLUMN requests TEXT;
CREATE TABLE schedules (
    agent_id  TEXT NOT NULL,
    id        TEXT NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, id)
) WITHOUT ROWID;
"#;

/// Version 8: remembered delivery ids found by when they expire, for the tidy that
/// forgets them whether or not their webhook has a rate limit.
const SCHEMA_V8: &str = r#"
CREATE INDEX webhook_deliveries_by_expiry ON webhook_deliveries (expires_ms);
"#;

/// Version 9: the registry version, one more on every change to a tool or a
/// subscription — counted by triggers, so it moves in the same transaction as the change
/// whichever statement makes it (an agent's delete removing its subscriptions too); and
/// which process holds each claim and each received queue message (see `claimants`).
const SCHEMA_V9: &str = r#"
ALTER TABLE heartbeats ADD COLUMN claimed_by TEXT;
ALTER TABLE queue_messages ADD COLUMN received_by TEXT;
CREATE TABLE registry_version (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    version  INTEGER NOT NULL
);
INSERT INTO registry_version (id, version) VALUES (1, 0);
CREATE TRIGGER tools_insert AFTER INSERT ON tools
    BEGIN UPDATE registry_version SET version = version + 1; END;
CREATE TRIGGER tools_update AFTER UPDATE ON tools
    BEGIN UPDATE registry_version SET version = version + 1; END;
CREATE TRIGGER tools_delete AFTER DELETE ON tools
    BEGIN UPDATE registry_version SET version = version + 1; END;
CREATE TRIGGER subscriptions_insert AFTER INSERT ON subscriptions
    BEGIN UPDATE registry_version SET version = version + 1; END;
CREATE TRIGGER subscriptions_update AFTER UPDATE ON subscriptions
    BEGIN UPDATE registry_version SET version = version + 1; END;
CREATE TRIGGER subscriptions_delete AFTER DELETE ON subscriptions
    BEGIN UPDATE registry_version SET version = version + 1; END;
"#;

/// Version 10: memories with vectors beside them (quantized bytes and their model) and
/// a version per agent that cached recall indexes check.
const SCHEMA_V10: &str = r#"
ALTER TABLE memories ADD COLUMN vector BLOB;
ALTER TABLE memories ADD COLUMN vector_model TEXT;
CREATE TABLE memory_versions (
    agent_id  TEXT PRIMARY KEY,
    version   INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// Version 11: leases (the Discord gateway's: one process of many holds the connection).
const SCHEMA_V11: &str = r#"
CREATE TABLE leases (
    name      TEXT PRIMARY KEY,
    holder    TEXT NOT NULL,
    until_ms  INTEGER NOT NULL,
    state     TEXT NOT NULL
) WITHOUT ROWID;
"#;

/// Version 12: API tokens of the messages API (their secrets' digests only).
const SCHEMA_V12: &str = r#"
CREATE TABLE api_tokens (
    id        TEXT PRIMARY KEY,
    agent_id  TEXT NOT NULL,
    doc       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX api_tokens_by_agent ON api_tokens (agent_id);
"#;

/// An agent's state from its stored record, in the order of `Agent::state`: 3 paused,
/// 2 auto-paused, 1 snoozed, 0 active. A query must spell it exactly so for SQLite to
/// read it from the index `agents_by_state`. A record that is not JSON counts as active:
/// otherwise it would fail the migration that builds the index, and every later write
/// to the table. Reading that record still reports it as corrupt.
macro_rules! agent_state {
    () => {
        "CASE WHEN NOT json_valid(doc) THEN 0 \
         WHEN json_extract(doc, '$.paused_at') IS NOT NULL THEN 3 \
         WHEN json_extract(doc, '$.auto_paused_since') IS NOT NULL THEN 2 \
         WHEN json_extract(doc, '$.snoozed_until') IS NOT NULL THEN 1 ELSE 0 END"
    };
}
pub(super) use agent_state;

/// Version 13: the agents listing's indexes — by age (the order pages go in), and by
/// state, an index on [`agent_state!`] so the counts by state are read from it, not
/// from every agent's record.
const SCHEMA_V13: &str = concat!(
    "CREATE INDEX agents_by_age ON agents (created_ms, id);\n",
    "CREATE INDEX agents_by_state ON agents ((",
    agent_state!(),
    "));\n"
);

/// Version 14: each tool's calls counted by the hour as they are written (what `tools
/// stats` adds up), their times in buckets beside them. The migration counts the calls
/// already in the action log.
const SCHEMA_V14: &str = r#"
CREATE TABLE tool_counts (
    hour       INTEGER NOT NULL,
    agent_id   TEXT NOT NULL,
    tool       TEXT NOT NULL,
    succeeded  INTEGER NOT NULL,
    failed     INTEGER NOT NULL,
    unknown    INTEGER NOT NULL,
    PRIMARY KEY (hour, agent_id, tool)
) WITHOUT ROWID;
CREATE INDEX tool_counts_by_agent ON tool_counts (agent_id, hour);
CREATE TABLE tool_times (
    hour      INTEGER NOT NULL,
    agent_id  TEXT NOT NULL,
    tool      TEXT NOT NULL,
    bucket    INTEGER NOT NULL,
    calls     INTEGER NOT NULL,
    PRIMARY KEY (hour, agent_id, tool, bucket)
) WITHOUT ROWID;
CREATE INDEX tool_times_by_agent ON tool_times (agent_id, hour);
"#;

/// Version 15: the messages API's requests counted by token and minute in the store, so
/// that every process serving the API shares one limit.
const SCHEMA_V15: &str = r#"
CREATE TABLE api_counts (
    token_id  TEXT NOT NULL,
    minute    INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    PRIMARY KEY (token_id, minute)
) WITHOUT ROWID;
"#;

/// Version 16: what a heartbeat's tools found after its thinking, handed on to the next
/// heartbeat's (JSON).
const SCHEMA_V16: &str = r#"
ALTER TABLE heartbeats ADD COLUMN handed_on TEXT;
"#;

/// Version 17: turns that wait on the model, one a session, found by when they are due.
const SCHEMA_V17: &str = r#"
CREATE TABLE waiting_turns (
    agent_id  TEXT NOT NULL,
    session   TEXT NOT NULL,
    next_ms   INTEGER NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, session)
) WITHOUT ROWID;
CREATE INDEX waiting_turns_due ON waiting_turns (next_ms);
"#;

/// Version 18: dead hook deliveries hidden while `pulse hooks redrive` sends them again.
const SCHEMA_V18: &str = r#"
ALTER TABLE hook_dead ADD COLUMN visible_ms INTEGER NOT NULL DEFAULT 0;
"#;

/// Version 19: the row `/healthz` writes to see whether writes go through again.
const SCHEMA_V19: &str = r#"
CREATE TABLE write_checks (
    id     INTEGER PRIMARY KEY,
    at_ms  INTEGER NOT NULL
);
"#;

/// Version 20: when a heartbeat's run began its work, for how late it started.
const SCHEMA_V20: &str = r#"
ALTER TABLE heartbeats ADD COLUMN ran_ms INTEGER;
"#;

/// Version 21: each agent's name, held by one agent (ignoring ASCII case). A file that
/// already holds agents sharing a name gives it to the oldest of them; the others keep
/// working, named by id, until one is renamed.
const SCHEMA_V21: &str = r#"
CREATE TABLE agent_names (
    name      TEXT PRIMARY KEY,
    agent_id  TEXT NOT NULL
);
INSERT OR IGNORE INTO agent_names (name, agent_id)
    SELECT lower(json_extract(doc, '$.name')), id FROM agents
    WHERE json_valid(doc) AND json_extract(doc, '$.name') IS NOT NULL ORDER BY created_ms;
"#;

/// Version 22: calls parked for a person's approval; those not yet settled (`open`)
/// found by expiry.
const SCHEMA_V22: &str = r#"
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    pending     INTEGER NOT NULL,
    open        INTEGER NOT NULL,
    expires_ms  INTEGER NOT NULL,
    doc         TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX approvals_agent ON approvals (agent_id, id);
CREATE INDEX approvals_open ON approvals (expires_ms) WHERE open = 1;
"#;

/// Version 23: dollar budgets' tallies, per agent and period (a day or a month): spent
/// by settled calls and held for calls being made, in millionths of a dollar; and the
/// model calls counted per minute (`calls`).
/// Version 24: heartbeats carry their agent's task ledger (when each heartbeat task was
/// last done, which were due).
const SCHEMA_V24: &str = r#"
ALTER TABLE heartbeats ADD COLUMN tasks TEXT;
"#;

/// Version 25: a finished heartbeat's outcome (`acted`, `nothing_to_do`, …) and its
/// reason.
const SCHEMA_V25: &str = r#"
ALTER TABLE heartbeats ADD COLUMN outcome TEXT;
ALTER TABLE heartbeats ADD COLUMN outcome_reason TEXT;
"#;

/// Version 26: replies the channel did not take, retrying or given up on, found by when
/// they are due.
const SCHEMA_V26: &str = r#"
CREATE TABLE undelivered (
    agent_id  TEXT NOT NULL,
    turn_id   TEXT NOT NULL,
    state     TEXT NOT NULL,
    next_ms   INTEGER NOT NULL,
    doc       TEXT NOT NULL,
    PRIMARY KEY (agent_id, turn_id)
) WITHOUT ROWID;
CREATE INDEX undelivered_due ON undelivered (state, next_ms);
"#;

/// Version 27: the trace a heartbeat's last run was recorded in, when traces are sent.
const SCHEMA_V27: &str = r#"
ALTER TABLE heartbeats ADD COLUMN trace_id TEXT;
"#;

const SCHEMA_V23: &str = r#"
CREATE TABLE usd (
    agent_id  TEXT NOT NULL,
    period    TEXT NOT NULL,
    spent     INTEGER NOT NULL,
    held      INTEGER NOT NULL,
    marks     TEXT NOT NULL DEFAULT '',
    at_ms     INTEGER NOT NULL,
    PRIMARY KEY (agent_id, period)
) WITHOUT ROWID;
CREATE TABLE calls (
    agent_id  TEXT NOT NULL,
    minute    TEXT NOT NULL,
    count     INTEGER NOT NULL,
    at_ms     INTEGER NOT NULL,
    PRIMARY KEY (agent_id, minute)
) WITHOUT ROWID;
"#;

pub(super) fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = sqlite_err("migrate schema");
    // Under the write lock, so processes opening a new file at once migrate it once.
    conn.execute_batch("BEGIN IMMEDIATE").map_err(&err)?;
    let result = (|| {
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(&err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::backend(
                "sqlite",
                "migrate schema",
                format!(
                    "{} has schema version {version}, newer than this release's {SCHEMA_VERSION}; upgrade pulse",
                    path.display()
                ),
            ));
        }
        if version < 1 {
            conn.execute_batch(SCHEMA).map_err(&err)?;
        }
        if version < 2 {
            conn.execute_batch(SCHEMA_V2).map_err(&err)?;
        }
        if version < 3 {
            conn.execute_batch(SCHEMA_V3).map_err(&err)?;
        }
        if version < 4 {
            conn.execute_batch(SCHEMA_V4).map_err(&err)?;
        }
        if version < 5 {
            conn.execute_batch(SCHEMA_V5).map_err(&err)?;
        }
        if version < 6 {
            conn.execute_batch(SCHEMA_V6).map_err(&err)?;
        }
        if version < 7 {
            conn.execute_batch(SCHEMA_V7).map_err(&err)?;
        }
        if version < 8 {
            conn.execute_batch(SCHEMA_V8).map_err(&err)?;
        }
        if version < 9 {
            conn.execute_batch(SCHEMA_V9).map_err(&err)?;
        }
        if version < 10 {
            conn.execute_batch(SCHEMA_V10).map_err(&err)?;
        }
        if version < 11 {
            conn.execute_batch(SCHEMA_V11).map_err(&err)?;
        }
        if version < 12 {
            conn.execute_batch(SCHEMA_V12).map_err(&err)?;
        }
        if version < 13 {
            conn.execute_batch(SCHEMA_V13).map_err(&err)?;
        }
        if version < 14 {
            conn.execute_batch(SCHEMA_V14).map_err(&err)?;
            super::actions::count_logged_calls(conn)?;
        }
        if version < 15 {
            conn.execute_batch(SCHEMA_V15).map_err(&err)?;
        }
        if version < 16 {
            conn.execute_batch(SCHEMA_V16).map_err(&err)?;
        }
        if version < 17 {
            conn.execute_batch(SCHEMA_V17).map_err(&err)?;
        }
        if version < 18 {
            conn.execute_batch(SCHEMA_V18).map_err(&err)?;
        }
        if version < 19 {
            conn.execute_batch(SCHEMA_V19).map_err(&err)?;
        }
        if version < 20 {
            conn.execute_batch(SCHEMA_V20).map_err(&err)?;
        }
        if version < 21 {
            conn.execute_batch(SCHEMA_V21).map_err(&err)?;
        }
        if version < 22 {
            conn.execute_batch(SCHEMA_V22).map_err(&err)?;
        }
        if version < 23 {
            conn.execute_batch(SCHEMA_V23).map_err(&err)?;
        }
        if version < 24 {
            conn.execute_batch(SCHEMA_V24).map_err(&err)?;
        }
        if version < 25 {
            conn.execute_batch(SCHEMA_V25).map_err(&err)?;
        }
        if version < 26 {
            conn.execute_batch(SCHEMA_V26).map_err(&err)?;
        }
        if version < 27 {
            conn.execute_batch(SCHEMA_V27).map_err(&err)?;
        }
        if version < SCHEMA_VERSION {
            conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))
                .map_err(&err)?;
        }
        Ok(())
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    conn.execute_batch(end).map_err(&err)?;
    result
}
