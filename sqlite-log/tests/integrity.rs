//! A database written through the file system stays whole for readers in other
//! connections, through rollbacks of spilled pages, copies of the log and reopening.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::{Connection, OpenFlags};

fn open(path: &std::path::Path) -> Connection {
    let vfs = pulse_sqlite_log::register().unwrap();
    let c = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", "NORMAL").unwrap();
    c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    c
}

/// The body of row `id`: its length follows from its id, so a reader can tell a page it
/// should not have seen.
fn body_len(id: i64) -> i64 {
    (id * 733) % 5_000
}

/// Inserts the rows `ids`, each with its body.
fn insert(c: &Connection, ids: std::ops::RangeInclusive<i64>) {
    for id in ids {
        c.execute(
            "INSERT INTO t (id, body) VALUES (?1, zeroblob(?2))",
            [id, body_len(id)],
        )
        .unwrap();
    }
}

/// Rows 1..=n and their bodies' lengths as a reader sees them: both must agree with
/// `body_len`.
fn check(c: &Connection) -> i64 {
    let (n, total): (i64, f64) = c
        .query_row("SELECT count(*), total(length(body)) FROM t", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let want: i64 = (1..=n).map(body_len).sum();
    assert_eq!(total as i64, want, "{n} rows read with the wrong bodies");
    n
}

#[test]
fn readers_beside_the_writer_never_see_a_frame_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let w = open(&path);
    // Copies of the log (and its restarts) along the way.
    w.pragma_update(None, "wal_autocheckpoint", 64).unwrap();
    w.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                // One reader through this file system, one through the platform's.
                let r = if k == 0 {
                    open(&path)
                } else {
                    Connection::open(&path).unwrap()
                };
                r.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
                let (mut reads, mut last) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let n = check(&r);
                    assert!(n >= last, "rows went from {last} to {n}");
                    (reads, last) = (reads + 1, n);
                }
                reads
            })
        })
        .collect();
    insert(&w, 1..=1_500_i64);
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 10, "a reader read too seldom to tell");
    }
    assert_eq!(check(&w), 1_500);
}

#[test]
fn a_rolled_back_transaction_that_spilled_pages_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let w = open(&path);
    // A small page cache: the transaction spills its pages to the log before the end.
    w.pragma_update(None, "cache_size", 10).unwrap();
    w.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    insert(&w, 1..=20);
    w.execute_batch("BEGIN").unwrap();
    insert(&w, 21..=900);
    let r = Connection::open(&path).unwrap();
    assert_eq!(
        check(&r),
        20,
        "a reader saw the transaction before its commit"
    );
    w.execute_batch("ROLLBACK").unwrap();
    assert_eq!(check(&r), 20);
    insert(&w, 21..=40);
    assert_eq!(check(&r), 40);
    let ok: String = r
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    drop((w, r));

    // Reopened on the platform's file system alone, as an older `pulse` would.
    let c = Connection::open(&path).unwrap();
    assert_eq!(check(&c), 40);
}
