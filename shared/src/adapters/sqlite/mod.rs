//! The embedded backend: one SQLite file (WAL) holding the records and a durable FIFO
//! queue with the semantics of SQS FIFO, for `pulse serve` on one machine with no cloud.
//!
//! rusqlite is synchronous, so every operation from async code runs on the connection's
//! own thread (see [`thread`]: calls waiting together are committed together). One
//! connection per [`Db`]: SQLite serialises writers anyway, and a
//! process that wants parallel writers (tests, benchmarks) opens several `Db`s on one file;
//! `busy_timeout` makes them wait for each other instead of failing.
//!
//! ## Layout
//!
//! One file per port, with the same names as in `adapters/aws`: `agents`, `heartbeats`,
//! `events`, `actions`, `registry` (tools, subscriptions), `conversations`, `memories`, `schedules`,
//! `webhooks`, `hooks`, `session_queue` and `hook_queue`; beside them `codec` (records
//! as JSON documents, sealed secrets), `schema` (the tables and their migrations) and
//! `purge` (deleting an agent and all it owns, in one transaction) and `retention`
//! (removing what is past its time, in short batches, and shrinking the file).

mod actions;
mod agents;
mod approvals;
mod claimants;
mod codec;
mod conversations;
mod events;
mod heartbeats;
mod hook_queue;
mod hooks;
mod keys;
mod leases;
mod memories;
mod purge;
mod registry;
mod retention;
mod schedules;
mod schema;
mod session_queue;
mod statements;
mod thread;
mod tokens;
mod wal;
mod webhooks;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

pub use claimants::{OrphanedClaims, TakenBack};
pub use hook_queue::SqliteHookQueue;
pub use keys::{KeysMissing, keys_for};
/// Power cuts and failing disks under a [`Db`] opened with [`Db::open_with_faults`].
pub use pulse_sqlite_log::faults;
pub use session_queue::SqliteQueue;
pub use statements::{Recorded, Recording};
pub use webhooks::ACCEPT_THREAD;

use crate::config::Durability;
use crate::error::StoreError;
use crate::sealing::EncryptionKeys;

/// What the stores in this process have written, counted since it started, for
/// `pulse bench receive` to read before and after a run: the acceptance threads' commits
/// and the acceptances they held (the batches' size), and the frames every connection
/// appended to its write-ahead log (a frame is one page: what a commit costs in writes)
/// and the writes that took them to the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Transactions committed by the acceptance threads (each a batch).
    pub acceptance_commits: u64,
    /// Webhook acceptances in those transactions.
    pub acceptances: u64,
    /// Pages appended to the write-ahead logs, by every commit of every connection. Each
    /// connection counts the log's growth since its own last commit: exact while one
    /// connection writes to a file (as in the bench); where several do, a commit also
    /// counts what the others appended since.
    pub log_frames: u64,
    /// Writes made to the write-ahead logs: one a commit, the frames gathered into it
    /// (see `pulse_sqlite_log`).
    pub log_writes: u64,
}

/// The counts so far (see [`WriteCounts`]).
pub fn write_counts() -> WriteCounts {
    use std::sync::atomic::Ordering::Relaxed;
    WriteCounts {
        acceptance_commits: webhooks::ACCEPT_COMMITS.load(Relaxed),
        acceptances: webhooks::ACCEPTANCES.load(Relaxed),
        log_frames: wal::LOG_FRAMES.load(Relaxed),
        log_writes: pulse_sqlite_log::counts().writes,
    }
}

/// The records of Pulse in a SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    db: Db,
    /// The group-commit writer of webhook acceptances, started on first use.
    accepts: std::sync::Arc<std::sync::OnceLock<webhooks::Batcher>>,
    /// Seals the secrets of webhooks and hooks.
    keys: EncryptionKeys,
}

impl SqliteStore {
    /// A store over an open database. It has no encryption key until given one with
    /// [`SqliteStore::with_keys`]: writing a secret then fails, saying so.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            accepts: std::sync::Arc::default(),
            keys: EncryptionKeys::none(),
        }
    }

    /// Seals secrets with `keys`.
    pub fn with_keys(mut self, keys: EncryptionKeys) -> Self {
        self.keys = keys;
        self
    }
}

/// `execute` and `query_row` through the connection's statement cache: the hot paths
/// run the same few dozen statements over and over, and `Connection::execute` and
/// `Connection::query_row` parse the SQL each call (the two reads of a heartbeat's
/// finish, parsed afresh, were 7 % of the database thread's time in `bench sweep`).
trait CachedExecute {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl CachedExecute for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 128;

/// A connection's settings. Every statement is prepared once: a statement cache that
/// holds them all (rusqlite keeps 16 by default), and plans that do not depend on bound
/// values (the query planner stability guarantee), so a new `now` or limit never
/// re-prepares a statement. And the write-ahead log is kept by [`wal::keep`].
fn tune(conn: &mut Connection) -> rusqlite::Result<wal::SyncBehind> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    wal::keep(conn)
}

/// One connection to a Pulse database file.
#[derive(Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    /// The id this process claims and receives under, and the other processes on the
    /// file.
    claimants: Arc<claimants::Claimants>,
    /// Calls run on the caller's thread instead of the connection's (the simulator).
    inline: bool,
    /// The connection's thread, started by the first call from async code.
    thread: Arc<std::sync::OnceLock<Option<thread::ConnThread>>>,
    /// Why writes are failing (a full disk, a read-only file), from the last call that
    /// failed so, until a call writes again: what `/healthz` reports.
    trouble: Arc<Mutex<Option<String>>>,
    /// Counts the conversation turns written through this database (by any process
    /// part sharing it), so a long poll waits for a write rather than looking again
    /// and again.
    turns: Arc<tokio::sync::watch::Sender<u64>>,
    /// How late an event a window reads may still be committed: see [`EventDeadline`].
    deadline: Option<EventDeadline>,
    /// Whether the log's own thread syncs it as it grows (only when commits do not).
    sync_behind: wal::SyncBehind,
}

/// The longest an event may take from its stamp (the time in its id) to its commit.
///
/// A heartbeat's window ends `event_settle` before its claim, and trusts that every
/// event stamped before that end is committed by the time the window is read. Nothing
/// bounds how long a write waits for the connection (a stalled disk, a large group
/// commit, another process holding the file): an event stamped before a window's end
/// and committed after the window was read would land behind it, never read by any
/// heartbeat. So inside its transaction, holding the file's write lock, an event the
/// windows read is refused when its stamp is older than the deadline, unless it is
/// already there (a write sent again). The caller is told to send it again, and its new
/// stamp falls in a later window. A claim committed before the event's transaction
/// began read the clock no later than the check, so its window ends at least
/// `event_settle` before the check, and before any stamp the check lets through (the
/// deadline being shorter than `event_settle`); a claim after the commit sees the event.
/// The AWS store keeps the same bound with an operation timeout on event writes.
#[derive(Clone)]
pub struct EventDeadline {
    clock: Arc<dyn crate::ports::Clock>,
    within: std::time::Duration,
}

impl EventDeadline {
    /// Fails when `e`, an event the windows read, was stamped longer ago than the
    /// deadline and is not yet in the log. Run inside the transaction that writes it.
    fn check<P>(&self, conn: &Connection, e: &crate::domain::Event<P>) -> Result<(), StoreError> {
        if e.cascade.is_some() {
            return Ok(());
        }
        let now = crate::domain::to_ms(self.clock.now()).max(0) as u64;
        let waited = now.saturating_sub(e.id.timestamp_ms());
        if u128::from(waited) <= self.within.as_millis() {
            return Ok(());
        }
        let there = conn
            .prepare_cached("SELECT 1 FROM events WHERE agent_id = ?1 AND id = ?2")
            .and_then(|mut st| {
                rusqlite::OptionalExtension::optional(st.query_row(
                    rusqlite::params![e.agent_id.as_str(), e.id.as_str()],
                    |_| Ok(()),
                ))
            })
            .map_err(sqlite_err("append event"))?;
        if there.is_some() {
            return Ok(());
        }
        Err(StoreError::backend(
            "sqlite",
            "append event",
            format!(
                "event {} waited {:.1}s for the database, longer than the {:.1}s an event \
                 may take to be written (set by PULSE_EVENT_SETTLE: three quarters of it, or \
                 {}s when it is 0): it was not written, since a heartbeat may already have \
                 read past its time; send it again",
                e.id,
                waited as f64 / 1000.0,
                self.within.as_secs_f64(),
                crate::ports::UNSETTLED_WRITE_TIMEOUT.as_secs()
            ),
        ))
    }
}

fn sqlite_err(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::backend("sqlite", op, e)
}

/// Makes sure `path` exists readable by its owner only: a new file is created with mode
/// 0600 (SQLite then gives its `-wal` and `-shm` files the same mode); an existing one
/// readable by others is narrowed, with its `-wal` and `-shm`.
fn private_file(path: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let failed = |e: std::io::Error| {
            StoreError::backend(
                "sqlite",
                "open database",
                format!("{}: {e}", path.display()),
            )
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(e)),
        }
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let p = PathBuf::from(p);
            if let Ok(meta) = std::fs::metadata(&p)
                && meta.permissions().mode() & 0o077 != 0
            {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(failed)?;
                tracing::warn!(file = %p.display(), "the file was readable by other users: now 0600");
            }
        }
    }
    Ok(())
}

/// How long a call looks for its answer, letting other tasks run between looks, before
/// its task parks. Parking the runtime's thread and being woken by the database's thread
/// costs tens of microseconds, as much as a short statement takes: a caller whose answer
/// comes within this gets it without that wake.
const ANSWER_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a call waits for another process holding the file before it fails.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `step` again while it fails because another process holds the file, for up to
/// `within`, then returns what it last returned.
///
/// SQLite waits (its busy timeout) where waiting cannot deadlock, but answers "busy" at
/// once where it could: a connection inside a read that must now write while another
/// holds the file. Opening a file (its page count, its vacuum mode, the switch to the
/// write-ahead log) can meet that when another process opens or writes the same new
/// file: `pulse serve &` and a CLI command right after it did, once, in CI. Each try
/// here starts over, holding nothing, so the other finishes first.
fn until_free<T>(
    within: std::time::Duration,
    mut sleep: impl FnMut(std::time::Duration),
    mut step: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut waited = std::time::Duration::ZERO;
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        match step() {
            Err(e)
                if waited < within
                    && matches!(
                        e.sqlite_error_code(),
                        Some(
                            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                        )
                    ) =>
            {
                sleep(pause);
                waited += pause;
                pause = (pause * 2).min(std::time::Duration::from_millis(200));
            }
            done => return done,
        }
    }
}

impl Db {
    /// Opens (creating if needed, mode 0600) the database at `path` and brings its
    /// schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // SQLite's file system with the log's appends gathered into one write a commit
        // (see `pulse_sqlite_log`).
        Self::open_through(path, pulse_sqlite_log::register())
    }

    /// [`Db::open`] through the file system of `pulse_sqlite_log::faults`: the same,
    /// but every write and sync of a file under a directory a `Recording` watches is
    /// recorded, and can be made to fail. For tests of power cuts and failing disks.
    pub fn open_with_faults(path: &Path) -> Result<Self, StoreError> {
        faults::register().map_err(|rc| {
            StoreError::backend(
                "sqlite",
                "open database",
                format!("cannot register the faults' file system (SQLite error {rc})"),
            )
        })?;
        Self::open_through(path, pulse_sqlite_log::faults::register())
    }

    fn open_through(
        path: &Path,
        vfs: Result<&'static std::ffi::CStr, std::ffi::c_int>,
    ) -> Result<Self, StoreError> {
        let open = sqlite_err("open database");
        private_file(path)?;
        let vfs = vfs.map_err(|rc| {
            StoreError::backend(
                "sqlite",
                "open database",
                format!("cannot register the log's file system (SQLite error {rc})"),
            )
        })?;
        let mut conn =
            Connection::open_with_flags_and_vfs(path, rusqlite::OpenFlags::default(), vfs)
                .map_err(|e| {
                    StoreError::backend(
                        "sqlite",
                        "open database",
                        format!("{}: {e}", path.display()),
                    )
                })?;
        conn.busy_timeout(BUSY_WAIT).map_err(&open)?;
        until_free(BUSY_WAIT, std::thread::sleep, || {
            // A new file gives the pages pruning frees back to the file system (by
            // `Maintenance::reclaim`); the mode can only be chosen before the first
            // table.
            let pages: i64 = conn.pragma_query_value(None, "page_count", |r| r.get(0))?;
            if pages == 0 {
                conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
            }
            // WAL lets readers (the CLI) work while `pulse serve` writes; FULL syncs
            // the log at every commit, before the commit's callers are answered (see
            // [`Durability`]); the connection's thread commits the calls that arrive
            // together as one, so they share one sync.
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")
        })
        .map_err(&open)?;
        let sync_behind = tune(&mut conn).map_err(&open)?;
        schema::migrate(&conn, path)?;
        Ok(Self {
            sync_behind,
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
            claimants: Arc::new(claimants::Claimants::new(path)),
            inline: false,
            thread: Arc::default(),
            trouble: Arc::default(),
            turns: Arc::new(tokio::sync::watch::channel(0).0),
            deadline: None,
        })
    }

    /// Acknowledges as `durability` says: [`Durability::Synced`] (how a file opens) syncs
    /// the log at every commit; [`Durability::Relaxed`] leaves it to the log's own
    /// thread (every 4 MB) and the copies into the database.
    pub fn with_durability(self, durability: Durability) -> Result<Self, StoreError> {
        let level = match durability {
            Durability::Synced => "FULL",
            Durability::Relaxed => "NORMAL",
        };
        self.blocking(|c| c.pragma_update(None, "synchronous", level))
            .map_err(sqlite_err("open database"))?;
        self.sync_behind.set(durability == Durability::Relaxed);
        Ok(self)
    }

    /// What the connection's commits promise, as SQLite says it now.
    pub fn durability(&self) -> Result<Durability, StoreError> {
        let level: i64 = self
            .blocking(|c| c.pragma_query_value(None, "synchronous", |r| r.get(0)))
            .map_err(sqlite_err("read durability"))?;
        // 2 is FULL, 3 EXTRA; 1 NORMAL, 0 OFF.
        Ok(if level >= 2 {
            Durability::Synced
        } else {
            Durability::Relaxed
        })
    }

    /// Refuses to write an event the windows read more than `within` after its stamp, by
    /// `clock` (the clock that stamps events): see [`EventDeadline`]. Without, events are
    /// written however late (tools that write a file alone).
    pub fn with_event_deadline(
        mut self,
        clock: Arc<dyn crate::ports::Clock>,
        within: std::time::Duration,
    ) -> Self {
        self.deadline = Some(EventDeadline { clock, within });
        self
    }

    /// The deadline of events `writer` writes: none for a job of the agent's session.
    pub(crate) fn deadline_for(&self, writer: crate::ports::Writer) -> Option<EventDeadline> {
        match writer {
            crate::ports::Writer::Session => None,
            crate::ports::Writer::Outside => self.deadline.clone(),
        }
    }

    /// Opens a database for the simulator, in memory (or in the file at `path`, to
    /// look into afterwards): every call runs on the caller's thread, so a
    /// single-threaded run is deterministic (no blocking pool decides the order calls
    /// finish in); commits are not synced, the rollback journal is kept in memory, and
    /// nothing else may open the file while it runs (a simulated crash drops futures,
    /// never the database).
    ///
    /// In memory means SQLite's `memdb` file system, private to this connection, rather
    /// than `:memory:`: a `:memory:` database keeps every page in its page cache, and
    /// each commit then walks that cache: 10,000 agents through 4 simulated hours took
    /// 34 s that way, 19 s this way.
    pub fn open_simulated(path: Option<&Path>) -> Result<Self, StoreError> {
        let open = sqlite_err("open database");
        let mut db = match path {
            Some(path) => Self::open(path)?,
            None => {
                let mut conn = Connection::open_with_flags(
                    "file:pulse-simulated?vfs=memdb",
                    rusqlite::OpenFlags::default(),
                )
                .map_err(&open)?;
                let sync_behind = tune(&mut conn).map_err(&open)?;
                let path = PathBuf::from(":memory:");
                schema::migrate(&conn, &path)?;
                Self {
                    sync_behind,
                    conn: Arc::new(Mutex::new(conn)),
                    claimants: Arc::new(claimants::Claimants::new(&path)),
                    path,
                    inline: false,
                    thread: Arc::default(),
                    trouble: Arc::default(),
                    turns: Arc::new(tokio::sync::watch::channel(0).0),
                    deadline: None,
                }
            }
        };
        db.blocking(|c| {
            c.pragma_update(None, "synchronous", "OFF")?;
            c.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
            c.pragma_update(None, "journal_mode", "MEMORY")
        })
        .map_err(&open)?;
        db.inline = true;
        Ok(db)
    }

    /// [`Db::open_with_faults`] for the simulator: `pulse serve`'s file, write-ahead log
    /// and synced commits, with every call on the caller's thread as
    /// [`Db::open_simulated`]'s: for a simulated run whose power is cut (its files under
    /// a `Recording`).
    pub fn open_simulated_with_faults(path: &Path) -> Result<Self, StoreError> {
        let mut db = Self::open_with_faults(path)?;
        db.inline = true;
        Ok(db)
    }

    /// A turn was written: wakes the long polls waiting on one.
    pub(crate) fn turn_written(&self) {
        self.turns.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes each time a turn is written through this database.
    pub(crate) fn turns_written(&self) -> tokio::sync::watch::Receiver<u64> {
        self.turns.subscribe()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What takes back the claims of processes that stopped on this file.
    pub fn orphaned_claims(&self) -> OrphanedClaims {
        OrphanedClaims::new(self.clone())
    }

    /// Runs `f` with the connection on this thread (for a thread of its own).
    fn blocking<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// Runs `f` with the connection on the connection's thread (see [`thread`]), noting
    /// whether writes fail. Calls that arrive together are committed together.
    async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.call_as(op, false, f).await
    }

    /// As [`call`](Self::call), never inside a group: for statements that cannot run
    /// inside a transaction (`VACUUM`, a checkpoint).
    async fn call_alone<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.call_as(op, true, f).await
    }

    async fn call_as<T, F>(&self, op: &'static str, alone: bool, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let trouble = self.trouble.clone();
        let watched = {
            let trouble = trouble.clone();
            move |conn: &mut Connection| {
                let before = conn.total_changes();
                let r = f(conn);
                note_writes(&trouble, conn.total_changes() != before, r.as_ref().err());
                r
            }
        };
        if self.inline {
            return self.blocking(watched);
        }
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let job = thread::Job {
            alone,
            run: Box::new(move |conn| {
                let r = watched(conn);
                Box::new(move |failed: Option<&rusqlite::Error>| {
                    let r = match failed {
                        None => r,
                        Some(e) => {
                            let e = sqlite_err(op)(copy_error(e));
                            note_writes(&trouble, false, Some(&e));
                            Err(e)
                        }
                    };
                    let _ = reply.send(r);
                })
            }),
        };
        let conn = self.conn.clone();
        let started = self
            .thread
            .get_or_init(|| thread::ConnThread::start(conn.clone()));
        let unsent = match started {
            Some(t) => t.send(job).err(),
            None => Some(job),
        };
        if let Some(job) = unsent {
            // No thread to run it: the blocking pool, holding the mutex.
            tokio::task::spawn_blocking(move || {
                let mut guard = conn.lock().unwrap_or_else(|e| e.into_inner());
                (job.run)(&mut guard)(None)
            })
            .await
            .map_err(|e| StoreError::backend("sqlite", op, e))?;
        }
        // Look for the answer for a moment before parking: see [`ANSWER_SPIN`].
        let until = std::time::Instant::now() + ANSWER_SPIN;
        while std::time::Instant::now() < until {
            match answer.try_recv() {
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                    tokio::task::yield_now().await
                }
                Ok(r) => return r,
                Err(_) => break,
            }
        }
        answer.await.map_err(|_| {
            StoreError::backend(
                "sqlite",
                op,
                "the call panicked on the database's thread (the log has the panic)",
            )
        })?
    }

    /// Why writes are failing now, if they are: the last failure that says the file
    /// cannot be written (full, read-only, an I/O error), until a write succeeds.
    pub fn write_trouble(&self) -> Option<String> {
        self.trouble
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// [`Db::write_trouble`], looked at again: while there is trouble, when the file has
    /// room to grow again (its file system has [`ROOM_TO_WRITE`] free, and it is under
    /// its page cap), a small write is tried — its outcome sets or clears the trouble as
    /// any write's does.
    pub async fn recheck_writes(&self) -> Option<String> {
        let trouble = self.write_trouble()?;
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        if free_bytes(&dir).is_some_and(|free| free < ROOM_TO_WRITE) {
            return Some(trouble);
        }
        let now = jiff::Timestamp::now().as_millisecond();
        let _ = self
            .call("check that writes go through", move |conn| {
                let op = sqlite_err("check that writes go through");
                let (pages, cap): (i64, i64) = (
                    conn.pragma_query_value(None, "page_count", |r| r.get(0))
                        .map_err(&op)?,
                    conn.pragma_query_value(None, "max_page_count", |r| r.get(0))
                        .map_err(&op)?,
                );
                if pages >= cap {
                    return Err(StoreError::backend(
                        "sqlite",
                        "check that writes go through",
                        rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                            Some("the file is at its page cap".into()),
                        ),
                    ));
                }
                conn.exec(
                    "INSERT OR REPLACE INTO write_checks (id, at_ms) VALUES (1, ?1)",
                    [now],
                )
                .map_err(op)?;
                Ok(())
            })
            .await;
        self.write_trouble()
    }

    /// Caps the file at `pages` pages (SQLite's `max_page_count`), so writes past it
    /// fail as on a full disk: for drills and tests of what a full disk does.
    pub fn cap_pages(&self, pages: i64) -> Result<(), StoreError> {
        self.blocking(|c| c.pragma_update(None, "max_page_count", pages))
            .map_err(sqlite_err("cap the file's size"))
    }
}

/// A write transaction: its own (`BEGIN IMMEDIATE`), or, inside a group of calls the
/// connection's thread commits together, a savepoint in the group's. Either way what is
/// written through it lands whole or not at all: dropped without [`Tx::commit`], it is
/// rolled back.
///
/// Its statements (`BEGIN`, `SAVEPOINT`, `RELEASE`, `COMMIT`, the rollbacks) run through
/// the statement cache. rusqlite's own `Transaction` and `Savepoint` run them through
/// `execute_batch`, which parses each afresh: two parses for each call of a group (its
/// transaction is a savepoint in the group's), and for each acceptance the receiver
/// writes again in a savepoint of its own after a batch failed. Savepoints need no
/// unique names: SQLite releases or rolls back to the newest of a name, so every one is
/// `pulse_tx`.
pub(super) struct Tx<'c> {
    conn: &'c mut Connection,
    savepoint: bool,
    open: bool,
}

/// Begins a write transaction on `conn` (see [`Tx`]).
pub(super) fn begin(conn: &mut Connection) -> rusqlite::Result<Tx<'_>> {
    begin_as(conn, "BEGIN IMMEDIATE")
}

/// As [`begin`], a read snapshot outside a group (`BEGIN DEFERRED`: no write lock
/// until the first write).
pub(super) fn begin_deferred(conn: &mut Connection) -> rusqlite::Result<Tx<'_>> {
    begin_as(conn, "BEGIN DEFERRED")
}

fn begin_as<'c>(conn: &'c mut Connection, own: &str) -> rusqlite::Result<Tx<'c>> {
    if conn.is_autocommit() {
        Tx::start(conn, own, false)
    } else {
        Tx::start(conn, "SAVEPOINT pulse_tx", true)
    }
}

impl<'c> Tx<'c> {
    fn start(conn: &'c mut Connection, sql: &str, savepoint: bool) -> rusqlite::Result<Self> {
        statement(conn, sql)?;
        Ok(Self {
            conn,
            savepoint,
            open: true,
        })
    }

    /// Keeps what was written: the transaction commits, a savepoint is released into the
    /// transaction around it. On failure it is rolled back when dropped.
    pub(super) fn commit(mut self) -> rusqlite::Result<()> {
        statement(
            self.conn,
            if self.savepoint {
                "RELEASE pulse_tx"
            } else {
                "COMMIT"
            },
        )?;
        self.open = false;
        Ok(())
    }

    /// Undoes what was written.
    pub(super) fn rollback(mut self) -> rusqlite::Result<()> {
        self.open = false;
        self.undo()
    }

    fn undo(&mut self) -> rusqlite::Result<()> {
        if self.savepoint {
            statement(self.conn, "ROLLBACK TO pulse_tx")?;
            statement(self.conn, "RELEASE pulse_tx")
        } else {
            statement(self.conn, "ROLLBACK")
        }
    }

    /// A savepoint inside this transaction.
    pub(super) fn savepoint(&mut self) -> rusqlite::Result<Tx<'_>> {
        Tx::start(self.conn, "SAVEPOINT pulse_tx", true)
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // An error that ended the whole transaction (a full disk) leaves nothing to undo.
        if self.open && !self.conn.is_autocommit() {
            let _ = self.undo();
        }
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// Runs `sql`, a statement without parameters or rows, through the statement cache.
fn statement(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// A copy of `e` for each call of a group that failed to commit: SQLite's code and
/// message where it has them (so a full disk still reads as one), its text otherwise.
fn copy_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

/// Free space a file system needs before [`Db::recheck_writes`] tries a write: a few
/// commits' worth of log.
pub const ROOM_TO_WRITE: u64 = 1 << 20;

/// The bytes free to this process on the file system holding `dir`, when it can tell.
fn free_bytes(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        let s = rustix::fs::statvfs(dir).ok()?;
        Some(s.f_bavail.saturating_mul(s.f_frsize))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

/// Notes what a call did, for [`Db::write_trouble`]: a failure that says the file
/// cannot be written sets it; a call that wrote clears it.
fn note_writes(trouble: &Mutex<Option<String>>, wrote: bool, failure: Option<&StoreError>) {
    let mut t = trouble.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = failure.and_then(cannot_write) {
        *t = Some(why);
    } else if wrote {
        *t = None;
    }
}

/// The failure, when `e` says the file cannot be written: SQLite's code, or (for an
/// error passed on as text, as a batch's) SQLite's own words for it.
fn cannot_write(e: &StoreError) -> Option<String> {
    use rusqlite::ErrorCode::{CannotOpen, DiskFull, ReadOnly, SystemIoFailure};
    let StoreError::Backend { source, .. } = e else {
        return None;
    };
    let full = match source.downcast_ref::<rusqlite::Error>() {
        Some(sqlite) => matches!(
            sqlite.sqlite_error_code(),
            Some(DiskFull | ReadOnly | SystemIoFailure | CannotOpen)
        ),
        None => {
            let text = source.to_string();
            [
                "database or disk is full",
                "attempt to write a readonly database",
                "disk I/O error",
                "unable to open database file",
            ]
            .iter()
            .any(|m| text.contains(m))
        }
    };
    full.then(|| crate::error::chain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of the tests' table `t`, in order.
    pub(in crate::adapters::sqlite) fn keys(conn: &Connection) -> Vec<String> {
        let mut st = conn.prepare("SELECT k FROM t ORDER BY k").unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn insert(conn: &Connection, k: &str) {
        conn.exec("INSERT INTO t (k) VALUES (?1)", [k]).unwrap();
    }

    #[test]
    fn a_transaction_lands_whole_or_not_at_all_and_its_savepoints_nest() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY)")
            .unwrap();

        // Dropped without a commit: nothing, and no transaction left open.
        let tx = begin(&mut conn).unwrap();
        insert(&tx, "dropped");
        drop(tx);
        assert!(conn.is_autocommit());
        assert!(keys(&conn).is_empty());

        // Savepoints inside it: rolled back, released, dropped.
        let mut tx = begin(&mut conn).unwrap();
        insert(&tx, "a");
        let sp = tx.savepoint().unwrap();
        insert(&sp, "b");
        sp.rollback().unwrap();
        let sp = tx.savepoint().unwrap();
        insert(&sp, "c");
        sp.commit().unwrap();
        {
            let sp = tx.savepoint().unwrap();
            insert(&sp, "d");
        }
        tx.commit().unwrap();
        assert!(conn.is_autocommit());
        assert_eq!(keys(&conn), ["a", "c"]);

        // Inside a transaction already (a group's), it is a savepoint of that one: what
        // it keeps goes only when the transaction commits.
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let tx = begin(&mut conn).unwrap();
        insert(&tx, "x");
        drop(tx);
        let tx = begin(&mut conn).unwrap();
        insert(&tx, "y");
        tx.commit().unwrap();
        assert!(
            !conn.is_autocommit(),
            "the group's transaction is still open"
        );
        assert_eq!(keys(&conn), ["a", "c", "y"]);
        conn.execute_batch("ROLLBACK").unwrap();
        assert_eq!(keys(&conn), ["a", "c"]);

        // A transaction an error already ended is not rolled back twice.
        let tx = begin(&mut conn).unwrap();
        insert(&tx, "z");
        tx.execute_batch("ROLLBACK").unwrap();
        drop(tx);
        assert!(conn.is_autocommit());
        assert_eq!(keys(&conn), ["a", "c"]);
    }
}

#[cfg(test)]
mod opening {
    use super::*;

    #[test]
    fn a_step_refused_while_another_process_holds_the_file_is_tried_again_until_it_is_free() {
        let busy = || {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                Some("database is locked".into()),
            )
        };
        let mut slept = Vec::new();
        let mut tries = 0;
        let got = until_free(
            std::time::Duration::from_secs(10),
            |d| slept.push(d.as_millis()),
            || {
                tries += 1;
                if tries < 4 { Err(busy()) } else { Ok(tries) }
            },
        );
        assert_eq!(got.unwrap(), 4);
        assert_eq!(slept, [5, 10, 20], "spaced, doubling");

        // Past the wait, the refusal is the answer; any other error is at once.
        let mut tries = 0;
        let got: rusqlite::Result<()> = until_free(
            std::time::Duration::from_millis(300),
            |_| {},
            || {
                tries += 1;
                Err(busy())
            },
        );
        assert_eq!(
            got.unwrap_err().sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy)
        );
        assert_eq!(
            tries, 7,
            "5 + 10 + 20 + 40 + 80 + 160 ms waited, then one more try"
        );
        let mut tries = 0;
        let got: rusqlite::Result<()> = until_free(
            std::time::Duration::from_secs(10),
            |_| {},
            || {
                tries += 1;
                Err(rusqlite::Error::InvalidQuery)
            },
        );
        assert!(got.is_err());
        assert_eq!(tries, 1);
    }

    /// Another connection reading the new file as it is opened: the open waits for it.
    #[test]
    fn a_new_file_another_connection_reads_is_opened_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.db");
        let (reading, read) = std::sync::mpsc::channel();
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || {
                let conn = Connection::open(&path).unwrap();
                conn.execute_batch("BEGIN; SELECT count(*) FROM sqlite_master;")
                    .unwrap();
                reading.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(300));
                conn.execute_batch("COMMIT").unwrap();
            })
        };
        read.recv().unwrap();
        let db = Db::open(&path).expect("opened once the reader is done");
        reader.join().unwrap();
        let mode: String = db
            .blocking(|c| c.pragma_query_value(None, "journal_mode", |r| r.get(0)))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}
