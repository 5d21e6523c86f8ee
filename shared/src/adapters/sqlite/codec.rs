//! Records as JSON documents beside the columns queries need: reading, writing and
//! updating them, sealed secrets included.

use rusqlite::{Connection, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CachedExecute, sqlite_err};
use crate::error::StoreError;
use crate::sealing::{EncryptionKeys, SealError, SealedRecord, Stored, open_or_mark};

/// Reads records whose secrets are sealed (webhooks, hooks) and opens them (one no
/// configured key opens is read marked unreadable: [`open_or_mark`]). With `reseal`, one
/// stored stale (plain, or under an old key) is sealed with the current key and written
/// back, if the stored document has not changed meanwhile.
pub(super) fn read_sealed<T: Serialize + DeserializeOwned + SealedRecord>(
    conn: &Connection,
    op: &'static str,
    table: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
    keys: &EncryptionKeys,
    reseal: bool,
) -> Result<Vec<T>, StoreError> {
    let rows: Vec<(String, String)> = {
        let mut stmt = conn.prepare_cached(sql).map_err(sqlite_err(op))?;
        stmt.query_map(args, |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(sqlite_err(op))?
    };
    let mut out = Vec::with_capacity(rows.len());
    for (id, doc) in rows {
        let (record, state) = open_or_mark(keys, from_doc::<T>(&id, &doc)?);
        if state == Stored::Stale && reseal {
            match record.sealed(keys) {
                Ok(sealed) => {
                    conn.exec(
                        &format!("UPDATE {table} SET doc = ?2 WHERE id = ?1 AND doc = ?3"),
                        params![id, to_doc(&sealed), doc],
                    )
                    .map_err(sqlite_err(op))?;
                }
                // No key to seal with: it stays as it is, and is read as it is.
                Err(SealError::NoKey) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.push(record);
    }
    Ok(out)
}

/// Room a document is written into at first. serde_json starts at 128 bytes and doubles;
/// an event with a small payload runs to 250 – 400 (244 for one with three fields, more
/// with a webhook's metadata), so that was two copies of each as it grew, on the thread
/// every write goes through.
const DOC_START: usize = 512;

pub(super) fn to_doc<T: Serialize>(v: &T) -> String {
    let mut doc = Vec::with_capacity(DOC_START);
    match serde_json::to_writer(&mut doc, v) {
        // serde_json writes UTF-8 only.
        Ok(()) => String::from_utf8(doc).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

pub(super) fn from_doc<T: DeserializeOwned>(key: &str, doc: &str) -> Result<T, StoreError> {
    serde_json::from_str(doc).map_err(|e| StoreError::corrupt(key, e))
}

pub(super) fn read_docs<T: DeserializeOwned>(
    conn: &Connection,
    op: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite_err(op))?;
    let rows = stmt
        .query_map(args, |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(sqlite_err(op))?;
    let mut out = Vec::new();
    for row in rows {
        let (key, doc) = row.map_err(sqlite_err(op))?;
        out.push(from_doc(&key, &doc)?);
    }
    Ok(out)
}

/// Reads a document, applies `change`, writes it back; `NotFound` if absent.
pub(super) fn update_doc<T: Serialize + DeserializeOwned>(
    conn: &mut Connection,
    op: &'static str,
    table: &'static str,
    key_col: &'static str,
    key: &str,
    what: String,
    change: impl FnOnce(&mut T),
) -> Result<(), StoreError> {
    let tx = super::begin(conn).map_err(sqlite_err(op))?;
    let mut doc: T = read_docs(
        &tx,
        op,
        &format!("SELECT {key_col}, doc FROM {table} WHERE {key_col} = ?1"),
        [key],
    )?
    .pop()
    .ok_or(StoreError::NotFound(what))?;
    change(&mut doc);
    tx.exec(
        &format!("UPDATE {table} SET doc = ?2 WHERE {key_col} = ?1"),
        params![key, to_doc(&doc)],
    )
    .map_err(sqlite_err(op))?;
    tx.commit().map_err(sqlite_err(op))
}

/// Deletes a record (the first statement, which must remove one row, else `NotFound`
/// naming `what`) and what hangs from it (the statements before it, run first), all
/// keyed by `key` as `?1`, in one transaction.
pub(super) fn delete_with(
    conn: &mut Connection,
    op: &'static str,
    record: &str,
    dependents: &[&str],
    key: &str,
    what: String,
) -> Result<(), StoreError> {
    let tx = super::begin(conn).map_err(sqlite_err(op))?;
    for sql in dependents {
        tx.exec(sql, [key]).map_err(sqlite_err(op))?;
    }
    if tx.exec(record, [key]).map_err(sqlite_err(op))? == 0 {
        return Err(StoreError::NotFound(what));
    }
    tx.commit().map_err(sqlite_err(op))
}
