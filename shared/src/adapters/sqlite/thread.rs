//! The connection's thread: where a [`Db`](super::Db)'s calls from async code run, and
//! where calls that arrive together are committed together.
//!
//! rusqlite is synchronous. Running each call on tokio's blocking pool sent it to
//! whichever pool thread was free, and with many calls in flight several pool threads
//! queued on the connection's mutex: every hand-over was a futex sleep and wake, a third
//! of the hooks dispatcher's time under `perf`. One thread per connection instead takes
//! the calls from a channel in arrival order.
//!
//! **Group commit.** After the hand-overs, commits were the largest cost: each writes
//! its pages to the log and checksums them. When calls are waiting, the thread runs up
//! to [`GROUP`] of them inside one `BEGIN IMMEDIATE … COMMIT`, each in a savepoint of its
//! own, and answers them only after the commit: a caller told "done" has its write
//! committed, as before, and a failed commit fails every call of the group. A call's own
//! transaction ([`begin`](super::begin)) becomes a nested savepoint, so what it writes
//! still lands whole or not at all. A lone call runs as it always did.
//!
//! **Staying awake.** After a call the thread keeps looking for the next one for
//! [`AWAKE`] before it sleeps. A caller that makes its calls one after another finds it
//! awake, instead of paying a sleep and a wake on every call: one hook delivery alone
//! went from 0.68 ms of queueing to 0.39 ms, and the worker's idle heartbeat cycles from
//! about 4,900 a second to about 6,500. The caller's side does the same: its task looks
//! for the answer for a moment before it parks (`ANSWER_SPIN` in `sqlite/mod.rs`), so
//! a short call costs neither thread a sleep and a wake.
//!
//! An error that ends the whole transaction (a full disk) would take the earlier calls'
//! writes with it: the thread sees the transaction gone after the call and fails those
//! calls too. Calls that cannot run inside a transaction (`VACUUM`, a checkpoint) are
//! sent [`alone`](Job::alone). The mutex stays: the webhook group-commit thread and
//! one-off administrative calls lock it directly, between the thread's groups.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::statement;

/// Called once the call's group is settled: with the error that kept the group from
/// committing, or `None` when it committed (or there was no group).
pub(super) type Reply = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;

/// A call waiting for the connection.
pub(super) struct Job {
    /// Runs the call; gives back what answers its caller.
    pub(super) run: Box<dyn FnOnce(&mut Connection) -> Reply + Send>,
    /// Run outside any group (statements that cannot run inside a transaction).
    pub(super) alone: bool,
}

/// At most this many calls are committed together, so a direct locker (the
/// group-commit thread of webhooks) waits for a bounded run.
const GROUP: usize = 32;

/// The sending end of a connection's thread; the thread ends when the last is dropped.
pub(super) struct ConnThread {
    jobs: Sender<Job>,
}

impl ConnThread {
    /// Starts the thread over `conn`; `None` when the system has no thread to give
    /// (calls then go to the blocking pool).
    pub(super) fn start(conn: Arc<Mutex<Connection>>) -> Option<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("pulse-sqlite".into())
            .spawn(move || serve(&conn, &rx))
            .ok()?;
        Some(Self { jobs: tx })
    }

    /// Queues `job`; gives it back when the thread has stopped.
    pub(super) fn send(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)
    }
}

/// Runs calls until every sender is gone.
fn serve(conn: &Mutex<Connection>, rx: &Receiver<Job>) {
    let mut held: Option<Job> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match next(rx) {
                Some(job) => job,
                None => return,
            },
        };
        let mut jobs = vec![first];
        while !jobs[0].alone && jobs.len() < GROUP {
            match rx.try_recv() {
                Ok(job) if job.alone => {
                    held = Some(job);
                    break;
                }
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut guard = conn.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.len() == 1 || statement(&guard, "BEGIN IMMEDIATE").is_err() {
            each_alone(&mut guard, jobs);
        } else {
            group(&mut guard, jobs);
        }
    }
}

/// How long the thread stays awake for the next call before it sleeps on the channel.
/// Sleeping and being woken costs tens of microseconds on each side; a caller that makes
/// its calls one after another (a delivery: read, claim, record, delete) sends the next
/// within this, so it finds the thread awake. It was 50 µs, shorter than the POST
/// between a delivery's claim and its outcome (60–90 µs on loopback), so the outcome's
/// call always paid a wake: at 200 µs the queueing one delivery adds went from 0.35–0.42
/// to 0.30–0.33 ms p50 (`pulse bench hooks`), with the worker, sweep and receiver
/// figures unchanged. Staying awake yields the core between looks, and costs at most
/// 200 µs of one core after the last call of a burst.
const AWAKE: Duration = Duration::from_micros(200);

/// The next call; `None` once every sender is gone.
fn next(rx: &Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + AWAKE;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() >= until => return rx.recv().ok(),
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
}

/// Runs one call; `None` when it panicked (its caller's reply is dropped, an error).
fn run(conn: &mut Connection, job: Job) -> Option<Reply> {
    catch_unwind(AssertUnwindSafe(|| (job.run)(conn))).ok()
}

/// Runs `jobs` one after another outside any group, answering each as it finishes.
fn each_alone(conn: &mut Connection, jobs: Vec<Job>) {
    for job in jobs {
        if let Some(reply) = run(conn, job) {
            reply(None);
        }
    }
}

/// Runs `jobs` inside the transaction begun for them, each in a savepoint, then commits
/// and answers them.
fn group(conn: &mut Connection, jobs: Vec<Job>) {
    let mut replies: Vec<Reply> = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter();
    while let Some(job) = jobs.next() {
        let mark = statement(conn, "SAVEPOINT pulse_call");
        let reply = run(conn, job);
        if conn.is_autocommit() {
            // The call's error ended the transaction: the group's writes so far are gone.
            let lost = rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("an error in a call committed with this one rolled the write back; send it again".into()),
            );
            for r in replies.drain(..).chain(reply) {
                r(Some(&lost));
            }
            let rest: Vec<Job> = jobs.collect();
            if !rest.is_empty() && statement(conn, "BEGIN IMMEDIATE").is_ok() {
                return group(conn, rest);
            }
            return each_alone(conn, rest);
        }
        if mark.is_ok() {
            // A panic: undo what it wrote.
            if reply.is_none() {
                let _ = statement(conn, "ROLLBACK TO pulse_call");
            }
            let _ = statement(conn, "RELEASE pulse_call");
        }
        replies.extend(reply);
    }
    match statement(conn, "COMMIT") {
        Ok(()) => replies.into_iter().for_each(|r| r(None)),
        Err(e) => {
            let _ = statement(conn, "ROLLBACK");
            replies.into_iter().for_each(|r| r(Some(&e)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// What a call's caller was told: its name, and the error it got if any.
    type Told = (&'static str, Result<(), String>);

    /// A call that runs `f` and reports to `told`, as `Db::call` answers its caller.
    fn job(
        name: &'static str,
        told: &mpsc::Sender<Told>,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> Job {
        let told = told.clone();
        Job {
            alone: false,
            run: Box::new(move |conn| {
                let own = f(conn).map_err(|e| e.to_string());
                Box::new(move |failed| {
                    let r = match failed {
                        Some(e) => Err(e.to_string()),
                        None => own,
                    };
                    let _ = told.send((name, r));
                })
            }),
        }
    }

    fn insert(k: &'static str) -> impl FnOnce(&mut Connection) -> rusqlite::Result<()> {
        move |conn| {
            let tx = crate::adapters::sqlite::begin(conn)?;
            tx.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
            tx.commit()
        }
    }

    /// Runs `jobs` on a connection thread as one group: the thread is kept waiting on
    /// the lock behind a first call while they queue. Returns what each caller was told
    /// (by name; a panicked call is absent) and the keys the table holds.
    fn grouped(jobs: impl FnOnce(&mpsc::Sender<Told>) -> Vec<Job>) -> (Vec<Told>, Vec<String>) {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY)")
            .unwrap();
        let conn = Arc::new(Mutex::new(conn));
        let thread = ConnThread::start(conn.clone()).unwrap();
        let (tx, rx) = mpsc::channel();
        let guard = conn.lock().unwrap();
        assert!(thread.send(job("first", &tx, |_| Ok(()))).is_ok());
        let jobs = jobs(&tx);
        let n = jobs.len();
        for j in jobs {
            assert!(thread.send(j).is_ok());
        }
        drop(tx);
        drop(guard);
        drop(thread);
        let told: Vec<Told> = rx.iter().filter(|t| t.0 != "first").collect();
        assert!(told.len() <= n);
        let keys = crate::adapters::sqlite::tests::keys(&conn.lock().unwrap());
        (told, keys)
    }

    fn told<'a>(all: &'a [Told], name: &str) -> Option<&'a Result<(), String>> {
        all.iter().find(|t| t.0 == name).map(|t| &t.1)
    }

    #[test]
    fn calls_queued_together_commit_together_and_a_failing_or_panicking_one_takes_only_itself() {
        let (all, keys) = grouped(|tx| {
            vec![
                job("a", tx, insert("a")),
                job("in_group", tx, |conn: &mut Connection| {
                    // Inside the group's transaction, so its own became a savepoint.
                    assert!(!conn.is_autocommit());
                    Ok(())
                }),
                job("b", tx, insert("b")),
                // A duplicate key: its own savepoint is rolled back, nothing else.
                job("dup", tx, |conn: &mut Connection| {
                    let tx = crate::adapters::sqlite::begin(conn)?;
                    tx.execute("INSERT INTO t (k) VALUES ('c')", [])?;
                    tx.execute("INSERT INTO t (k) VALUES ('a')", [])?;
                    tx.commit()
                }),
                job("panics", tx, |conn: &mut Connection| {
                    conn.execute("INSERT INTO t (k) VALUES ('p')", [])?;
                    panic!("a call that panics after writing");
                }),
                job("e", tx, insert("e")),
            ]
        });
        assert_eq!(told(&all, "a"), Some(&Ok(())));
        assert_eq!(told(&all, "in_group"), Some(&Ok(())), "{all:?}");
        assert_eq!(told(&all, "b"), Some(&Ok(())));
        assert!(
            matches!(told(&all, "dup"), Some(Err(e)) if e.contains("UNIQUE")),
            "{all:?}"
        );
        assert_eq!(
            told(&all, "panics"),
            None,
            "a panicked call's caller gets no answer"
        );
        assert_eq!(told(&all, "e"), Some(&Ok(())));
        assert_eq!(
            keys,
            ["a", "b", "e"],
            "the duplicate's and the panic's writes undone"
        );
    }

    #[test]
    fn a_call_that_ends_the_groups_transaction_fails_the_calls_whose_writes_went_with_it() {
        let (all, keys) = grouped(|tx| {
            vec![
                job("x", tx, insert("x")),
                // What an error that rolls back the whole transaction (a full disk) does.
                job("ends", tx, |conn: &mut Connection| {
                    conn.execute_batch("ROLLBACK")
                }),
                job("z", tx, insert("z")),
            ]
        });
        assert!(
            matches!(told(&all, "x"), Some(Err(e)) if e.contains("send it again")),
            "{all:?}"
        );
        assert!(told(&all, "ends").is_some_and(Result::is_err), "{all:?}");
        assert_eq!(
            told(&all, "z"),
            Some(&Ok(())),
            "the calls after it run on: {all:?}"
        );
        assert_eq!(
            keys,
            ["z"],
            "x's write went with the transaction, and x was told so"
        );
    }
}
