//! The write-ahead log's upkeep on each connection: when the log is copied into the
//! database, and how its pages reach the disk before that copy.
//!
//! Commits append pages to the log. By default (`PULSE_DURABILITY=synced`, SQLite's
//! `synchronous = FULL`) each commit syncs the log before its callers are answered, and
//! what follows only keeps the copies short. With `relaxed` (`synchronous = NORMAL`)
//! commits are not synced: a commit is durable against a crash of the process at once,
//! and against a power cut once the log is synced. SQLite syncs the log only when it copies the log into the
//! database (a checkpoint), in the commit that takes the log past [`CHECKPOINT_PAGES`].
//! That sync found the whole log (40 MB) still in the page cache, and it took 26–33 ms
//! of the checkpoint's 45–55, while every caller of the connection waited: under a
//! stream of webhooks a tenth of the run.
//!
//! So, with `relaxed` only, a thread of the connection's own syncs the log each time it
//! has grown by [`SYNC_PAGES`] (4 MB). The checkpoint's own sync then finds at most that
//! much unwritten, and a power cut loses at most that much. With `synced` the thread
//! has nothing to add, and a sync beside the commits' would be a hazard: when one
//! fails, Linux may drop the pages a commit is about to sync, and that commit's own
//! sync then succeeds (the lesson of PostgreSQL's "fsyncgate"). So it does not run. The copy itself, and the
//! database's sync after it, stay in the commit, where SQLite puts them.
//!
//! A commit's pages reach the log in one write, not two a page: the connection's file
//! system (`pulse_sqlite_log`) gathers them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};

use rusqlite::Connection;

/// Pages of log (4 KiB each: 40 MB) at which a commit copies the log into the database
/// (SQLite's default is 1,000). Each copy writes every page the log changed once, so a
/// longer log writes a page that many commits touched (an index's last leaf, the
/// tables' upper levels) once instead of ten times; and the commit that crosses the
/// mark, whose callers wait for the copy, comes ten times less often.
const CHECKPOINT_PAGES: i32 = 10_000;

/// Pages the log grows by between two syncs by the log's thread.
const SYNC_PAGES: i32 = 1_000;

/// Frames (pages) appended to the logs of every connection in this process, counted in
/// the commit hook below (see [`WriteCounts`](super::WriteCounts)).
pub(super) static LOG_FRAMES: AtomicU64 = AtomicU64::new(0);

/// Whether the log's own thread syncs it as it grows: only while commits are not synced
/// (off as a connection opens, with `synchronous = FULL`).
#[derive(Clone, Default)]
pub(super) struct SyncBehind(Arc<AtomicBool>);

impl SyncBehind {
    pub(super) fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Copies the log at [`CHECKPOINT_PAGES`] and, while [`SyncBehind`] says so, syncs it
/// every [`SYNC_PAGES`], after each commit on `conn` (SQLite's hook for a commit to the
/// log, in place of its own copying at a mark). A database in memory has no log and no
/// thread.
pub(super) fn keep(conn: &mut Connection) -> rusqlite::Result<SyncBehind> {
    let behind = SyncBehind::default();
    keep_with(conn, Arc::new(sync_file), behind.clone())?;
    Ok(behind)
}

/// How the log is synced: [`sync_file`], or what a test watches.
type SyncLog = Arc<dyn Fn(&Path) + Send + Sync>;

/// [`keep`], syncing the log with `sync` (the tests watch it).
fn keep_with(conn: &mut Connection, sync: SyncLog, behind: SyncBehind) -> rusqlite::Result<()> {
    let log = conn
        .path()
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(format!("{p}-wal")));
    let mut due = SyncDue::default();
    let mut frames = Appended::default();
    let mut syncer = log.map(|log| Syncer::new(log, sync));
    conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
        LOG_FRAMES.fetch_add(frames.after_commit(pages), Ordering::Relaxed);
        if pages >= CHECKPOINT_PAGES {
            // As SQLite's own: a copy that cannot finish now (a reader holds old pages)
            // is taken up by a later commit, and the commit has succeeded either way.
            let _ = wal.checkpoint();
        } else if behind.on()
            && due.after_commit(pages)
            && let Some(s) = syncer.as_mut()
        {
            s.sync();
        }
        Ok(())
    }))
}

/// How many frames each commit appended, from the log's length after it.
#[derive(Default)]
struct Appended {
    /// The log's length after the last commit.
    last: i32,
}

impl Appended {
    /// The log is `pages` long after a commit: the frames that commit appended. A log
    /// shorter than after the last commit was copied and started over, so all of it is
    /// the commit's.
    fn after_commit(&mut self, pages: i32) -> u64 {
        let appended = if pages >= self.last {
            pages - self.last
        } else {
            pages
        };
        self.last = pages;
        appended.max(0) as u64
    }
}

/// When the log has grown by [`SYNC_PAGES`] since its last sync.
#[derive(Default)]
struct SyncDue {
    /// The log's length at its last sync.
    synced: i32,
}

impl SyncDue {
    /// The log is `pages` long after a commit: whether to sync it now.
    fn after_commit(&mut self, pages: i32) -> bool {
        // Shorter than at the last sync: the log was copied and started over.
        if pages < self.synced {
            self.synced = 0;
        }
        if pages - self.synced < SYNC_PAGES {
            return false;
        }
        self.synced = pages;
        true
    }
}

/// The thread that syncs the log, started at its first sync; it ends when the
/// connection (which holds the hook and with it the sending end) closes.
struct Syncer {
    log: PathBuf,
    sync: SyncLog,
    wake: Option<SyncSender<()>>,
}

impl Syncer {
    fn new(log: PathBuf, sync: SyncLog) -> Self {
        Self {
            log,
            sync,
            wake: None,
        }
    }

    /// Asks the thread to sync the log; a sync already asked for and not begun covers
    /// this one too.
    fn sync(&mut self) {
        if self.wake.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
            let (log, sync) = (self.log.clone(), self.sync.clone());
            let started = std::thread::Builder::new()
                .name("pulse-wal-sync".into())
                .spawn(move || {
                    while rx.recv().is_ok() {
                        sync(&log);
                    }
                });
            if started.is_err() {
                // No thread to be had: the checkpoint's own sync still makes the log
                // durable, only later.
                return;
            }
            self.wake = Some(tx);
        }
        if let Some(tx) = &self.wake
            && let Err(TrySendError::Disconnected(())) = tx.try_send(())
        {
            self.wake = None;
        }
    }
}

/// Syncs the file at `path`'s data to the disk. A failure is logged as a warning: the
/// commits since the last sync may not survive a power cut (they were never promised
/// to, under `relaxed`), and SQLite's own sync before it copies the log may then succeed
/// without them.
fn sync_file(path: &Path) {
    let synced = std::fs::File::open(path).and_then(|f| f.sync_data());
    if let Err(e) = synced {
        tracing::warn!(log = %path.display(), error = %e, "could not sync the write-ahead log: commits since its last sync may not survive a power cut; check the disk");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_commit_counts_the_frames_it_appended_and_a_log_started_over_counts_whole() {
        let mut frames = Appended::default();
        let appended: Vec<u64> = [20, 41, 41, 10_003, 18, 30]
            .into_iter()
            .map(|p| frames.after_commit(p))
            .collect();
        // 41 twice: the same length appends nothing. 18 after 10,003: the log was copied
        // and started over.
        assert_eq!(appended, [20, 21, 0, 9_962, 18, 12]);
    }

    #[test]
    fn the_log_is_synced_each_time_it_grows_by_the_step() {
        let mut due = SyncDue::default();
        let commits = [12, 500, 999, 1_000, 1_020, 1_999, 2_000, 2_500, 3_100];
        let synced: Vec<i32> = commits
            .into_iter()
            .filter(|&p| due.after_commit(p))
            .collect();
        assert_eq!(synced, [1_000, 2_000, 3_100]);
    }

    #[test]
    fn a_log_started_over_counts_from_its_start() {
        let mut due = SyncDue::default();
        assert!(due.after_commit(9_500));
        // Copied and started over: 900 pages are not yet a step, 1,000 are.
        assert!(!due.after_commit(20));
        assert!(!due.after_commit(900));
        assert!(due.after_commit(1_000));
    }

    /// A database in WAL mode kept by [`keep_with`], syncing with `sync`, and a table of
    /// pages to fill; commits unsynced (`relaxed`).
    fn database(dir: &Path, sync: SyncLog) -> Connection {
        database_with(dir, sync, "NORMAL")
    }

    /// [`database`] with commits synced as `synchronous` says, and the log's thread on
    /// only when they are not.
    fn database_with(dir: &Path, sync: SyncLog, synchronous: &str) -> Connection {
        let mut conn = Connection::open(dir.join("t.db")).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", synchronous)
            .unwrap();
        let behind = SyncBehind::default();
        behind.set(synchronous == "NORMAL");
        keep_with(&mut conn, sync, behind).unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        conn
    }

    /// Commits `n` transactions of 50 rows of nearly a page each: 51 pages of log a
    /// commit or so.
    fn fill(conn: &Connection, n: usize) {
        for _ in 0..n {
            conn.execute_batch(
                "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 50) \
                 INSERT INTO t SELECT randomblob(4000) FROM r",
            )
            .unwrap();
        }
    }

    /// The log file's length, and how many times it has started over (the checkpoint
    /// sequence in its header), read from the file without touching the database.
    fn log_file(dir: &Path) -> (u64, u32) {
        let bytes = std::fs::read(dir.join("t.db-wal")).unwrap();
        let restarts = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        (bytes.len() as u64, restarts)
    }

    #[test]
    fn the_log_is_copied_at_the_mark_and_started_over() {
        let dir = tempfile::tempdir().unwrap();
        let conn = database(dir.path(), Arc::new(|_: &Path| {}));
        fill(&conn, 150);
        // Below the mark the log only grows: nothing copied it at SQLite's own mark of
        // 1,000 pages (the file would then be reused from its start, about 4 MB).
        let (len, restarts) = log_file(dir.path());
        let frames = len / (24 + 4096);
        assert!(frames > 7_000, "{frames} frames");
        fill(&conn, 60);
        // The commit that crossed 10,000 pages copied the log, and the next one started
        // it over, once.
        let (_, after) = log_file(dir.path());
        assert_eq!(after, restarts + 1);
    }

    #[test]
    fn the_frames_appended_are_counted_for_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let before = LOG_FRAMES.load(Ordering::Relaxed);
        let conn = database(dir.path(), Arc::new(|_: &Path| {}));
        fill(&conn, 4);
        // Every frame in the file was counted (other tests' connections add theirs to
        // the same count, never take any away).
        let (len, _) = log_file(dir.path());
        let in_file = len.saturating_sub(32) / (24 + 4096);
        let counted = LOG_FRAMES.load(Ordering::Relaxed) - before;
        assert!(in_file > 150, "{in_file} frames in the file");
        assert!(
            counted >= in_file,
            "counted {counted}, the file holds {in_file}"
        );
    }

    #[test]
    fn the_log_is_synced_by_its_thread_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        let tx = std::sync::Mutex::new(tx);
        let conn = database(
            dir.path(),
            Arc::new(move |log: &Path| {
                let _ = tx.lock().unwrap().send(log.to_owned());
            }),
        );
        fill(&conn, 10);
        assert!(rx.try_recv().is_err(), "synced before a step's pages");
        fill(&conn, 12);
        let synced = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the log's thread synced it");
        assert_eq!(synced, dir.path().join("t.db-wal"));
        assert!(synced.exists());
    }

    #[test]
    fn with_every_commit_synced_the_log_has_no_thread_syncing_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        let tx = std::sync::Mutex::new(tx);
        let conn = database_with(
            dir.path(),
            Arc::new(move |log: &Path| {
                let _ = tx.lock().unwrap().send(log.to_owned());
            }),
            "FULL",
        );
        // Past two steps' pages: the thread would have synced twice.
        fill(&conn, 45);
        let (len, _) = log_file(dir.path());
        assert!(len / (24 + 4096) > 2 * SYNC_PAGES as u64, "{len}");
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(50))
                .is_err()
        );
    }
}
