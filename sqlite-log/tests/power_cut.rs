//! Power cuts at every point of a run through the file system, and disks that fail:
//! with `synchronous = FULL` every commit a caller was told of survives every cut, and
//! the database opens whole; a write or sync that fails fails its commit, and nothing
//! else.

use std::path::Path;

use pulse_sqlite_log::faults::{self, Fault, File, Image, Recording};
use rusqlite::{Connection, OpenFlags};

/// A database in WAL mode through the faulty file system, syncing as `synchronous`
/// says, copying its log every 40 pages (so the cuts meet copies and restarts of the
/// log), with a small page cache (so a large transaction spills pages before its
/// commit).
fn open(path: &Path, synchronous: &str) -> Connection {
    let vfs = faults::register().unwrap();
    let c = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", synchronous).unwrap();
    c.pragma_update(None, "wal_autocheckpoint", 40).unwrap();
    c.pragma_update(None, "cache_size", 20).unwrap();
    c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    c
}

/// Row `id`'s body length: it follows from the id, so a row read whole can be told
/// from a torn one.
fn body_len(id: i64) -> i64 {
    (id * 1_733) % 6_000
}

fn insert(c: &Connection, id: i64) -> rusqlite::Result<usize> {
    c.execute(
        "INSERT INTO t (id, body) VALUES (?1, zeroblob(?2))",
        [id, body_len(id)],
    )
}

/// Commits of one row, and now and then of many (a spilled transaction), marking each
/// row once its commit returned: `ids` rows from `first`.
fn run(c: &Connection, rec: &Recording, first: i64, ids: i64) {
    let mut id = first;
    while id < first + ids {
        if id % 37 == 0 {
            // 60 rows of up to 6 KB in one transaction: past the 20-page cache.
            let tx = c.unchecked_transaction().unwrap();
            let batch: Vec<i64> = (id..id + 60).collect();
            for &i in &batch {
                insert(&tx, i).unwrap();
            }
            tx.commit().unwrap();
            batch.iter().for_each(|&i| rec.mark(i as u64));
            id += 60;
        } else {
            insert(c, id).unwrap();
            rec.mark(id as u64);
            id += 1;
        }
    }
}

/// What an image holds: `Err` says why it is not what the run promised.
fn verify(image: &Image, dir: &Path) -> Result<(), String> {
    image.write_to(dir).map_err(|e| e.to_string())?;
    let c = Connection::open(dir.join("t.db")).map_err(|e| e.to_string())?;
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("integrity_check: {ok}"));
    }
    // Before the table was created nothing was promised.
    let has_table: bool = c
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE name = 't'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if !has_table {
        return match image.acknowledged() {
            [] => Ok(()),
            acked => Err(format!(
                "{n} of {n} acknowledged rows lost (the table too)",
                n = acked.len()
            )),
        };
    }
    let mut st = c
        .prepare("SELECT id, length(body) FROM t")
        .map_err(|e| e.to_string())?;
    let rows: std::collections::HashMap<i64, i64> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if let Some((id, len)) = rows.iter().find(|(id, len)| body_len(**id) != **len) {
        return Err(format!("row {id} has a body of {len} bytes"));
    }
    let lost: Vec<u64> = image
        .acknowledged()
        .iter()
        .copied()
        .filter(|id| !rows.contains_key(&(*id as i64)))
        .collect();
    if !lost.is_empty() {
        return Err(format!(
            "{} of {} acknowledged rows lost (first {})",
            lost.len(),
            image.acknowledged().len(),
            lost[0]
        ));
    }
    Ok(())
}

/// Replays every cut of `rec`, returning the images checked and the failures.
fn replay(rec: &Recording, seed: u64) -> (usize, Vec<String>) {
    let out = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let checked = rec.replay(seed, |image| {
        if let Err(why) = verify(image, out.path()) {
            failures.push(format!("at {} ({:?}): {why}", image.point, image.cut));
        }
    });
    (checked, failures)
}

#[test]
fn every_acknowledged_commit_survives_a_power_cut_at_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recording::start(dir.path()).unwrap();
    let c = open(&dir.path().join("t.db"), "FULL");
    run(&c, &rec, 1, 400);
    let (writes, syncs) = rec.writes_and_syncs();
    assert!(syncs > 100, "{syncs} syncs");
    let (checked, failures) = replay(&rec, 7);
    eprintln!("{writes} writes, {syncs} syncs, {checked} cuts checked");
    assert!(checked > 1_500, "{checked} cuts");
    assert!(
        failures.is_empty(),
        "{} cuts: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

#[test]
fn without_a_sync_at_each_commit_the_cuts_lose_acknowledged_rows() {
    // The harness can fail: with `synchronous = NORMAL` the log is synced only when it
    // is copied, and commits acknowledged in between are lost to a cut there.
    let dir = tempfile::tempdir().unwrap();
    let rec = Recording::start(dir.path()).unwrap();
    let c = open(&dir.path().join("t.db"), "NORMAL");
    run(&c, &rec, 1, 150);
    let (checked, failures) = replay(&rec, 7);
    let lost = failures
        .iter()
        .filter(|f| f.contains("acknowledged rows lost"))
        .count();
    assert!(lost > 10, "{lost} of {checked} cuts lost a row");
    // Losing commits is all it does: no cut leaves a database that is not whole.
    let other: Vec<&String> = failures
        .iter()
        .filter(|f| !f.contains("acknowledged rows lost"))
        .collect();
    assert!(other.is_empty(), "{other:?}");
}

/// Runs `fault` into the commit of row 50 of 100, asserting that commit fails and every
/// other succeeds, that the database reads whole with every other row, and that every
/// cut of the run keeps what was acknowledged.
fn commit_meets(fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recording::start(dir.path()).unwrap();
    let c = open(&dir.path().join("t.db"), "FULL");
    for id in 1..=100 {
        if id == 50 {
            rec.inject(fault);
            let failed = insert(&c, id);
            assert!(failed.is_err(), "{fault:?}: the commit was reported done");
            assert_eq!(rec.faults_met(), 1);
            continue;
        }
        insert(&c, id).unwrap_or_else(|e| panic!("{fault:?}, row {id}: {e}"));
        rec.mark(id as u64);
    }
    let ids: Vec<i64> = c
        .prepare("SELECT id FROM t ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let expected: Vec<i64> = (1..=100).filter(|&i| i != 50).collect();
    assert_eq!(ids, expected, "{fault:?}");
    let (checked, failures) = replay(&rec, 11);
    assert!(checked > 300, "{checked}");
    assert!(failures.is_empty(), "{fault:?}: {}", failures.join("\n"));
}

#[test]
fn a_short_write_to_the_log_fails_its_commit_and_nothing_else() {
    commit_meets(Fault::ShortWrite {
        file: File::Log,
        kept: 1_000,
    });
}

#[test]
fn a_write_that_fails_having_written_nothing_fails_its_commit_and_nothing_else() {
    commit_meets(Fault::FailedWrite { file: File::Log });
}

#[test]
fn a_failed_sync_of_the_log_fails_its_commit_and_is_never_reported_done() {
    // The sync's writes are lost, as after a failed fsync on Linux; the commits after it
    // write those frames again, and sync them.
    commit_meets(Fault::FailedSync { file: File::Log });
}

#[test]
fn a_failed_sync_of_the_database_in_a_copy_of_the_log_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recording::start(dir.path()).unwrap();
    let c = open(&dir.path().join("t.db"), "FULL");
    c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    for id in 1..=60 {
        insert(&c, id).unwrap();
        rec.mark(id as u64);
    }
    rec.inject(Fault::FailedSync {
        file: File::Database,
    });
    // The copy fails at the database's sync; the log stays, and still holds the rows.
    let copied = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    });
    assert!(copied.is_err(), "the copy was reported done: {copied:?}");
    assert_eq!(rec.faults_met(), 1);
    for id in 61..=80 {
        insert(&c, id).unwrap();
        rec.mark(id as u64);
    }
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap();
    let (_, failures) = replay(&rec, 13);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_slow_disk_makes_each_synced_commit_wait_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let delay = std::time::Duration::from_millis(40);
    let slow = faults::SlowDisk::start(dir.path(), delay).unwrap();
    let c = open(&dir.path().join("t.db"), "FULL");
    // Each synced commit waits for at least one slowed sync of its log.
    for id in 1..=3 {
        let started = std::time::Instant::now();
        insert(&c, id).unwrap();
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    }
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
    // Dropped, the disk is this machine's again: a file opened after is not slowed, and
    // a recording of the same directory sees its writes.
    drop(slow);
    let rec = Recording::start(dir.path()).unwrap();
    let c = open(&dir.path().join("u.db"), "FULL");
    insert(&c, 1).unwrap();
    let (writes, syncs) = rec.writes_and_syncs();
    assert!(writes > 0 && syncs > 0, "{writes} writes, {syncs} syncs");
}
