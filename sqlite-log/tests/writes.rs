//! What the log files are asked to write and what they write, counted (one test: the
//! counts are the process's).

use rusqlite::{Connection, OpenFlags};

fn writer(path: &std::path::Path) -> Connection {
    let vfs = pulse_sqlite_log::register().unwrap();
    let c = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", "NORMAL").unwrap();
    // No copy of the log into the database: each commit appends, and only appends.
    c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    c
}

fn log_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(format!("{}-wal", path.display()))
        .unwrap()
        .len()
}

#[test]
fn each_commit_is_one_write_of_all_its_frames_and_readers_see_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let w = writer(&path);
    // A reader on the platform's own file system, as another process would read.
    let r = Connection::open(&path).unwrap();
    let mut expected = (0_i64, 0_i64);
    for i in 0..200_i64 {
        let size = (i % 7) * 1_500;
        let before = (pulse_sqlite_log::counts(), log_len(&path));
        w.execute("INSERT INTO t (body) VALUES (zeroblob(?1))", [size])
            .unwrap();
        let after = (pulse_sqlite_log::counts(), log_len(&path));
        let frames = (after.1 - before.1) / (4_096 + 24);
        assert!(frames >= 1, "commit {i} appended no frame");
        assert_eq!(
            (after.1 - before.1) % (4_096 + 24),
            0,
            "commit {i} left part of a frame"
        );
        assert_eq!(
            after.0.writes - before.0.writes,
            1,
            "commit {i} of {frames} frames took more than one write"
        );
        assert_eq!(after.0.appends - before.0.appends, 2 * frames);
        expected = (expected.0 + 1, expected.1 + size);
        let seen: (i64, i64) = r
            .query_row("SELECT count(*), total(length(body)) FROM t", [], |row| {
                Ok((row.get(0)?, row.get::<_, f64>(1)? as i64))
            })
            .unwrap();
        assert_eq!(seen, expected, "the reader after commit {i}");
    }

    // A transaction larger than what is gathered at most is written as it grows, and
    // committed whole.
    let before = pulse_sqlite_log::counts();
    w.execute_batch("BEGIN").unwrap();
    for _ in 0..600 {
        w.execute("INSERT INTO t (body) VALUES (zeroblob(3000))", [])
            .unwrap();
    }
    w.execute_batch("COMMIT").unwrap();
    let after = pulse_sqlite_log::counts();
    let (writes, appends) = (after.writes - before.writes, after.appends - before.appends);
    assert!(
        writes >= 2 && writes * 20 < appends,
        "600 rows of 3,000 bytes in {writes} writes for {appends} appends"
    );
    let n: i64 = r
        .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
        .unwrap();
    assert_eq!(n, expected.0 + 600);
    let check: String = r
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
