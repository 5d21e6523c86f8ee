//! Who holds a claim: each process that claims heartbeats or receives queue messages on a
//! database file does so under an id of its own, and holds an exclusive lock on the file
//! `<db>.claims/<id>` for as long as it lives. The operating system drops the lock when
//! the process ends, however it ends (`kill -9` included), so another process can tell a
//! live claimant from a dead one by trying the lock — without waiting for a lease.
//!
//! [`OrphanedClaims::take_back`] hands back what dead processes held: the queue messages
//! they had received become visible at once (the job runs again under the same claim),
//! and a heartbeat they claimed whose job is no longer queued (claimed, then the process
//! died before sending it) has its lease ended now, so the next sweep claims it again.
//! A live process's claims are never touched, so two processes on one file still never
//! share a claim.
//!
//! A process may also say what it runs with in its lock file ([`OrphanedClaims::announce`]:
//! `pulse serve` writes its durability), which others read from the live ones
//! ([`OrphanedClaims::announced`]: `pulse status`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::params;

use super::{CachedExecute, Db, sqlite_err};
use crate::domain::{AgentId, HeartbeatId, to_ms};
use crate::error::StoreError;

/// This process's claimant id and the lock that proves it alive.
struct Held {
    id: String,
    /// Locked while this process lives.
    file: File,
}

/// The claimants of one database file.
pub(super) struct Claimants {
    /// `<db>.claims/`; `None` for a database in memory.
    dir: Option<PathBuf>,
    /// Taken on first use, so only processes that claim or receive make a lock file.
    own: OnceLock<Option<Held>>,
}

impl Claimants {
    pub(super) fn new(db: &Path) -> Self {
        let dir = (db.as_os_str() != ":memory:").then(|| {
            let mut p = db.as_os_str().to_owned();
            p.push(".claims");
            PathBuf::from(p)
        });
        Self {
            dir,
            own: OnceLock::new(),
        }
    }

    /// This process's id, its lock file made and locked on first use; `None` when it
    /// cannot be made (its claims then wait for their leases, as before).
    pub(super) fn id(&self) -> Option<String> {
        self.own
            .get_or_init(|| {
                let dir = self.dir.as_ref()?;
                let id = crate::entropy::ulid().to_string();
                let held = std::fs::create_dir_all(dir)
                    .and_then(|()| {
                        OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(dir.join(&id))
                    })
                    .and_then(|file| file.try_lock().map(|()| file).map_err(std::io::Error::from));
                match held {
                    Ok(file) => Some(Held { id, file }),
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot make this process's claim lock file: if it stops, its heartbeats wait for their leases");
                        None
                    }
                }
            })
            .as_ref()
            .map(|h| h.id.clone())
    }

    /// Writes `about` into this process's lock file (made if need be), in place of what
    /// it said before.
    fn announce(&self, about: &str) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.id();
        let Some(held) = self.own.get().and_then(Option::as_ref) else {
            return Err(std::io::Error::other("this process has no claim lock file"));
        };
        held.file.set_len(0)?;
        held.file.write_all_at(about.as_bytes(), 0)
    }

    /// What the other live processes on the file said of themselves (those that said
    /// anything).
    fn announced(&self) -> Vec<String> {
        self.others()
            .into_iter()
            .filter_map(|(_, path)| {
                let file = OpenOptions::new().read(true).write(true).open(path).ok()?;
                // Locked by its process: alive. A lock this takes is a process gone
                // (dropped with the file, for `take_back` to find).
                match file.try_lock() {
                    Err(std::fs::TryLockError::WouldBlock) => {}
                    _ => return None,
                }
                let said = std::io::read_to_string(&file).ok()?;
                (!said.is_empty()).then_some(said)
            })
            .collect()
    }

    /// The lock files of the other claimants on the file, with their ids.
    fn others(&self) -> Vec<(String, PathBuf)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let own = self
            .own
            .get()
            .and_then(Option::as_ref)
            .map(|h| h.id.as_str());
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let id = e.file_name().to_str()?.to_owned();
                (Some(id.as_str()) != own).then(|| (id, e.path()))
            })
            .collect()
    }

    /// The claimants whose process is gone: their lock files, locked now by this
    /// process (so none is counted twice), with their ids.
    fn dead(&self) -> Vec<(String, PathBuf, File)> {
        self.others()
            .into_iter()
            .filter_map(|(id, path)| {
                let file = OpenOptions::new().write(true).open(&path).ok()?;
                file.try_lock().ok()?;
                Some((id, path, file))
            })
            .collect()
    }
}

/// What [`OrphanedClaims::take_back`] handed back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TakenBack {
    /// Queue messages a dead process had received, visible again now.
    pub messages: u64,
    /// Heartbeats a dead process had claimed whose job was no longer queued: due again
    /// now, for the next sweep to claim.
    pub heartbeats: Vec<HeartbeatId>,
    /// Dead processes found.
    pub processes: usize,
}

/// Takes back the claims of processes that stopped on this database file.
///
/// The database is held as a trait object: a program that only ever has none of these
/// (the Lambda functions, whose backend has no claimants) then links no SQLite code
/// for dropping one.
#[derive(Clone)]
pub struct OrphanedClaims {
    db: Arc<dyn TakeBack>,
}

impl OrphanedClaims {
    pub(super) fn new(db: Db) -> Self {
        Self { db: Arc::new(db) }
    }

    /// Hands back what processes that are gone held (see the module doc) and forgets
    /// them. Safe beside live processes on the same file.
    pub async fn take_back(&self, now: Timestamp) -> Result<TakenBack, StoreError> {
        self.db.take_back(now).await
    }

    /// Says `about` (a line of JSON, say) for other processes on the file to read while
    /// this one lives, in place of what it said before.
    pub fn announce(&self, about: &str) -> std::io::Result<()> {
        self.db.announce(about)
    }

    /// What the other live processes on the file announced.
    pub fn announced(&self) -> Vec<String> {
        self.db.announced()
    }
}

#[async_trait]
trait TakeBack: Send + Sync {
    async fn take_back(&self, now: Timestamp) -> Result<TakenBack, StoreError>;
    fn announce(&self, about: &str) -> std::io::Result<()>;
    fn announced(&self) -> Vec<String>;
}

#[async_trait]
impl TakeBack for Db {
    fn announce(&self, about: &str) -> std::io::Result<()> {
        self.claimants.announce(about)
    }

    fn announced(&self) -> Vec<String> {
        self.claimants.announced()
    }

    async fn take_back(&self, now: Timestamp) -> Result<TakenBack, StoreError> {
        let dead = self.claimants.dead();
        if dead.is_empty() {
            return Ok(TakenBack::default());
        }
        let ids = serde_json::to_string(&dead.iter().map(|(id, ..)| id).collect::<Vec<_>>())
            .unwrap_or_default();
        let now = to_ms(now);
        let mut taken = self
            .call("take back orphaned claims", move |conn| {
                let op = sqlite_err("take back orphaned claims");
                let tx = super::begin(conn)
                    .map_err(&op)?;
                let messages = tx
                    .exec(
                        "UPDATE queue_messages SET visible_ms = ?2 \
                         WHERE receipt IS NOT NULL AND visible_ms > ?2 \
                           AND received_by IN (SELECT value FROM json_each(?1))",
                        params![ids, now],
                    )
                    .map_err(&op)? as u64;
                let mut heartbeats = Vec::new();
                {
                    let mut stmt = tx
                        .prepare(
                            "UPDATE heartbeats SET lease_ms = ?2, due_ms = ?2 \
                             WHERE status = 'EXECUTING' AND lease_ms > ?2 \
                               AND claimed_by IN (SELECT value FROM json_each(?1)) \
                               AND NOT EXISTS (SELECT 1 FROM queue_messages q \
                                   WHERE q.group_id = heartbeats.session \
                                     AND json_extract(q.body, '$.heartbeat.agent_id') = heartbeats.agent_id \
                                     AND json_extract(q.body, '$.heartbeat.beat') = heartbeats.beat) \
                             RETURNING agent_id, beat",
                        )
                        .map_err(&op)?;
                    let rows = stmt
                        .query_map(params![ids, now], |r| {
                            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                        })
                        .map_err(&op)?;
                    for row in rows {
                        let (agent, beat) = row.map_err(&op)?;
                        let agent = AgentId::parse(&agent)
                            .map_err(|e| StoreError::corrupt(&agent, e))?;
                        heartbeats.push(HeartbeatId::new(agent, beat as u64));
                    }
                }
                tx.commit().map_err(&op)?;
                Ok(TakenBack {
                    messages,
                    heartbeats,
                    processes: 0,
                })
            })
            .await?;
        taken.processes = dead.len();
        // Forgotten once handed back; the lock held on each is dropped with it.
        for (_, path, _) in dead {
            let _ = std::fs::remove_file(path);
        }
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimant_is_dead_once_its_process_lets_go_of_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("pulse.db");
        let alive = Claimants::new(&db);
        let other = Claimants::new(&db);
        let id = alive.id().expect("a lock file in a writable directory");
        assert_eq!(
            alive.id().as_deref(),
            Some(id.as_str()),
            "one id per process"
        );
        assert!(other.dead().is_empty(), "a live claimant is not dead");
        drop(alive);
        let dead = other.dead();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].0, id);
        // In memory, nobody else can open the database: no claimants at all.
        assert_eq!(Claimants::new(Path::new(":memory:")).id(), None);
    }

    #[test]
    fn what_a_live_process_announced_is_read_by_the_others_and_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("pulse.db");
        let serve = Claimants::new(&db);
        let status = Claimants::new(&db);
        assert!(status.announced().is_empty());
        serve
            .announce(r#"{"durability":"relaxed","note":"a longer first say"}"#)
            .unwrap();
        serve.announce(r#"{"durability":"synced"}"#).unwrap();
        assert_eq!(status.announced(), [r#"{"durability":"synced"}"#]);
        // A process's own word is not among the others'.
        assert!(serve.announced().is_empty());
        drop(serve);
        assert!(status.announced().is_empty(), "a process gone says nothing");
        assert_eq!(status.dead().len(), 1, "and is still found gone");
    }
}
