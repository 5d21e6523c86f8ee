//! The statements a database runs, recorded with the values bound to them, and run
//! again on a copy with nothing around them: the floor `pulse bench sweep` holds the
//! sweep and the worker against. What Pulse adds to SQLite's own work (building the
//! statements' values, reading rows into records, the engine's decisions, the
//! connection's thread) is the difference between the two timings.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::trace::{TraceEvent, TraceEventCodes};
use rusqlite::types::Value;

use super::{Db, sqlite_err};
use crate::error::StoreError;

/// One statement as it ran: its SQL and the values bound to its parameters, by index.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub sql: String,
    pub values: Vec<(usize, Value)>,
}

/// Statements being recorded on a database, until [`Recording::finish`].
pub struct Recording {
    db: Db,
    log: Arc<Mutex<Vec<Result<Recorded, String>>>>,
}

impl Recording {
    /// Stops recording; the statements in the order they ran, or the first whose values
    /// could not be read back from SQLite's rendering of it.
    pub fn finish(self) -> Result<Vec<Recorded>, StoreError> {
        self.db
            .blocking(|conn| conn.trace_v2(TraceEventCodes::empty(), None::<fn(TraceEvent<'_>)>))
            .map_err(sqlite_err("stop recording statements"))?;
        let log = std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()));
        log.into_iter()
            .map(|r| r.map_err(|e| StoreError::backend("sqlite", "read a recorded statement", e)))
            .collect()
    }
}

impl Db {
    /// Records every statement this connection runs from now on (for benchmarks: it
    /// renders each statement's values as text, which costs time).
    pub fn record_statements(&self) -> Result<Recording, StoreError> {
        let log: Arc<Mutex<Vec<Result<Recorded, String>>>> = Arc::default();
        let into = log.clone();
        self.blocking(move |conn| {
            conn.trace_v2(
                TraceEventCodes::SQLITE_TRACE_STMT,
                Some(move |event: TraceEvent<'_>| {
                    let TraceEvent::Stmt(stmt, text) = event else {
                        return;
                    };
                    // A trigger's subprogram starts with a comment naming it: it runs
                    // again as part of its statement.
                    if text.starts_with("--") {
                        return;
                    }
                    let sql = stmt.sql().into_owned();
                    let recorded = match stmt.expanded_sql() {
                        Some(expanded) => bound(&sql, &expanded)
                            .map(|values| Recorded {
                                sql: sql.clone(),
                                values,
                            })
                            .ok_or_else(|| format!("could not read the values of: {expanded}")),
                        None => Err(format!("SQLite did not render: {sql}")),
                    };
                    into.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(recorded);
                }),
            )
        })
        .map_err(sqlite_err("record statements"))?;
        Ok(Recording {
            db: self.clone(),
            log,
        })
    }

    /// Writes a copy of the database, as it is now, to `path` (`VACUUM INTO`).
    pub async fn copy_to(&self, path: &Path) -> Result<(), StoreError> {
        let path = path.to_string_lossy().into_owned();
        self.call_alone("copy the database", move |conn| {
            conn.execute("VACUUM INTO ?1", [path])
                .map_err(sqlite_err("copy the database"))?;
            Ok(())
        })
        .await
    }

    /// Runs `statements` in order on this thread, each prepared once and its rows
    /// stepped through, and nothing else; how long they took.
    pub fn replay(&self, statements: &[Recorded]) -> Result<Duration, StoreError> {
        self.blocking(|conn| {
            let began = Instant::now();
            for r in statements {
                let mut stmt = conn.prepare_cached(&r.sql)?;
                for (i, v) in &r.values {
                    stmt.raw_bind_parameter(*i, v)?;
                }
                let mut rows = stmt.raw_query();
                while rows.next()?.is_some() {}
            }
            Ok(began.elapsed())
        })
        .map_err(sqlite_err("run the recorded statements"))
    }
}

/// The values bound to `sql`'s parameters, read from `expanded` (SQLite's rendering of
/// the statement with each parameter replaced by its value), by parameter index; `None`
/// when the two do not line up.
fn bound(sql: &str, expanded: &str) -> Option<Vec<(usize, Value)>> {
    let (s, e) = (sql.as_bytes(), expanded.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut values: Vec<(usize, Value)> = Vec::new();
    let mut names: Vec<(&str, usize)> = Vec::new();
    let mut highest = 0;
    while i < s.len() {
        match s[i] {
            // A literal or a quoted name: the same in both, to its closing quote.
            q @ (b'\'' | b'"' | b'`') => {
                let end = quoted_end(s, i, q)?;
                if e.get(j..j + (end - i))? != &s[i..end] {
                    return None;
                }
                j += end - i;
                i = end;
            }
            b'?' | b':' | b'@' | b'$' => {
                let start = i;
                i += 1;
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                    i += 1;
                }
                let token = &sql[start..i];
                let index = if token == "?" {
                    highest + 1
                } else if let Some(n) = token.strip_prefix('?') {
                    n.parse().ok()?
                } else if let Some(&(_, n)) = names.iter().find(|(t, _)| *t == token) {
                    n
                } else {
                    names.push((token, highest + 1));
                    highest + 1
                };
                highest = highest.max(index);
                let (value, used) = literal(&expanded[j..])?;
                j += used;
                if !values.iter().any(|(n, _)| *n == index) {
                    values.push((index, value));
                }
            }
            c => {
                if e.get(j) != Some(&c) {
                    return None;
                }
                i += 1;
                j += 1;
            }
        }
    }
    (j == e.len()).then_some(values)
}

/// Where the literal or name quoted by `q` at `start` ends (past its closing quote; a
/// doubled quote is one inside it).
fn quoted_end(s: &[u8], start: usize, q: u8) -> Option<usize> {
    let mut k = start + 1;
    loop {
        if *s.get(k)? == q {
            if s.get(k + 1) == Some(&q) {
                k += 2;
                continue;
            }
            return Some(k + 1);
        }
        k += 1;
    }
}

/// The value SQLite rendered at the start of `text`, and how many bytes it took.
fn literal(text: &str) -> Option<(Value, usize)> {
    let b = text.as_bytes();
    if text.starts_with("NULL") {
        return Some((Value::Null, 4));
    }
    if b.first() == Some(&b'\'') {
        let end = quoted_end(b, 0, b'\'')?;
        return Some((Value::Text(text[1..end - 1].replace("''", "'")), end));
    }
    if text.starts_with("x'") {
        let end = quoted_end(b, 1, b'\'')?;
        let hex = &text[2..end - 1];
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(hex.get(k..k + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        return Some((Value::Blob(bytes), end));
    }
    let end = b
        .iter()
        .position(|c| !(c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')))
        .unwrap_or(b.len());
    let number = &text[..end];
    if number.contains(['.', 'e', 'E']) {
        Some((Value::Real(number.parse().ok()?), end))
    } else {
        Some((Value::Integer(number.parse().ok()?), end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_back_from_the_rendered_statement() {
        let sql =
            "UPDATE t SET a = ?1, b = ?2, c = ?, d = 'it''s ?' WHERE e = ?1 AND f = :g AND h = ?";
        let expanded = "UPDATE t SET a = 'x''y', b = -2.5, c = x'00ff', d = 'it''s ?' WHERE e = 'x''y' AND f = NULL AND h = 7";
        assert_eq!(
            bound(sql, expanded),
            Some(vec![
                (1, Value::Text("x'y".into())),
                (2, Value::Real(-2.5)),
                (3, Value::Blob(vec![0, 255])),
                (4, Value::Null),
                (5, Value::Integer(7)),
            ])
        );
        // Renderings that do not line up with the statement are not guessed at.
        assert_eq!(bound("SELECT ?1", "SELECT"), None);
        assert_eq!(bound("SELECT a FROM t", "SELECT b FROM t"), None);
    }

    #[tokio::test]
    async fn recorded_statements_run_again_on_a_copy_make_the_same_rows() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("a.db")).unwrap();
        let made = |conn: &mut rusqlite::Connection| {
            conn.execute_batch("CREATE TABLE bench_t (k INTEGER PRIMARY KEY, v TEXT, r REAL)")
        };
        db.blocking(made).unwrap();
        let copy_path = dir.path().join("b.db");
        db.copy_to(&copy_path).await.unwrap();
        let recording = db.record_statements().unwrap();
        db.blocking(|conn| {
            for k in 0..3 {
                conn.execute(
                    "INSERT INTO bench_t (k, v, r) VALUES (?1, ?2, ?3)",
                    rusqlite::params![k, format!("it's {k}"), k as f64 / 4.0],
                )
                .unwrap();
            }
        });
        let statements = recording.finish().unwrap();
        assert_eq!(statements.len(), 3, "{statements:?}");
        let copy = Db::open(&copy_path).unwrap();
        copy.replay(&statements).unwrap();
        let rows = |db: &Db| {
            db.blocking(|conn| {
                conn.prepare("SELECT k, v, r FROM bench_t ORDER BY k")
                    .unwrap()
                    .query_map([], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, f64>(2)?,
                        ))
                    })
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap()
            })
        };
        assert_eq!(rows(&copy), rows(&db));
        assert_eq!(rows(&copy)[2], (2, "it's 2".to_owned(), 0.5));
    }
}
