//! Power cuts on the embedded store. With the power-cut fault in the mix, the run's
//! database is a file (under `/dev/shm` where there is one) opened through the faults'
//! file system of `pulse_sqlite_log`, with `pulse serve`'s synced commits, and every
//! write and sync is recorded. Each acknowledgement the outside world is given — a
//! webhook answered accepted, a user message queued — is marked in the recording; after
//! it, the dice choose whether the power is cut there (and a little further on, most
//! often in the middle of a later commit). After the run, the files each chosen cut
//! would have left (everything unsynced lost, a prefix kept, a subset kept, a page torn)
//! are built and opened: the database must be whole and hold every item acknowledged
//! before the cut.
//!
//! The run itself goes on past a cut: what is checked is what a machine starting again
//! at that point would find, which is what the promise is about.

use std::path::Path;
use std::sync::Mutex;

use pulse_shared::adapters::sqlite::Db;
use pulse_shared::adapters::sqlite::faults::{Image, Recording};
use pulse_shared::domain::{AgentId, EventId, SignalId};

use crate::faults::{Dice, Fault, lock};

/// How far past a chosen point the second cut may be, in recorded operations.
const FURTHER: usize = 64;

/// An item the outside world was told is kept.
#[derive(Clone, Debug)]
pub(crate) enum Acked {
    /// A webhook delivery answered accepted, as this event.
    Event(AgentId, EventId),
    /// A user message queued, as this signal.
    Message(AgentId, SignalId),
}

impl Acked {
    fn agent(&self) -> &AgentId {
        match self {
            Self::Event(a, _) | Self::Message(a, _) => a,
        }
    }
}

/// The run's recorded store and the cuts the dice chose.
pub(crate) struct PowerCuts {
    rec: Recording,
    /// Where the run's files are; removed with it.
    dir: tempfile::TempDir,
    acked: Mutex<Vec<Acked>>,
    points: Mutex<Vec<usize>>,
}

impl PowerCuts {
    /// A fresh database file under a recording, or what stopped it.
    pub(crate) fn open() -> Result<(Db, Self), String> {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .map_err(|e| format!("a directory for the recorded database: {e}"))?;
        let rec = Recording::start(dir.path()).map_err(|e| format!("the recording: {e}"))?;
        let db = Db::open_simulated_with_faults(&dir.path().join("pulse.db"))
            .map_err(|e| format!("the recorded database: {e}"))?;
        Ok((
            db,
            Self {
                rec,
                dir,
                acked: Mutex::default(),
                points: Mutex::default(),
            },
        ))
    }

    /// `item` was acknowledged now; the dice say whether the power is cut just after.
    pub(crate) fn acknowledged(&self, dice: &Dice, item: Acked) {
        let n = {
            let mut acked = lock(&self.acked);
            acked.push(item);
            acked.len() as u64 - 1
        };
        self.rec.mark(n);
        if dice.roll(Fault::PowerCut) {
            lock(&self.points).push(self.rec.point());
        }
    }

    /// Builds the files of every chosen cut and checks each: the database opens whole,
    /// and every item acknowledged before the cut is there — but those of agents deleted
    /// since (their records go with them). `each` is told every cut's outcome (what it
    /// broke, if anything); `Err` says why the check itself could not run.
    pub(crate) fn check(
        &self,
        seed: u64,
        deleted: &std::collections::BTreeSet<AgentId>,
        mut each: impl FnMut(Option<String>),
    ) -> Result<(), String> {
        // At each chosen point, where every commit acknowledged was synced, and at a
        // point a little further on, most often in the middle of a later commit (its
        // pages written, not yet synced): where the partial cuts are.
        let end = self.rec.point();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut points = Vec::new();
        for &p in lock(&self.points).iter() {
            points.push(p);
            if p < end {
                points.push(p + 1 + rng.usize(0..(end - p).min(FURTHER)));
            }
        }
        let acked = lock(&self.acked).clone();
        let out = self.dir.path().join("after-the-cut");
        std::fs::create_dir_all(&out).map_err(|e| format!("the cut's directory: {e}"))?;
        let mut broken = None;
        self.rec.replay_at(&points, seed, |image| {
            if broken.is_some() {
                return;
            }
            match verify(image, &out, &acked, deleted) {
                Ok(why) => each(
                    why.map(|why| format!("a cut at {} ({:?}): {why}", image.point, image.cut)),
                ),
                Err(e) => broken = Some(e),
            }
        });
        match broken {
            Some(e) => Err(format!("checking a power cut's files: {e}")),
            None => Ok(()),
        }
    }
}

/// What a cut's files hold: `Ok(Some(why))` when a promise was broken, `Err` when the
/// check itself could not run.
fn verify(
    image: &Image,
    dir: &Path,
    acked: &[Acked],
    deleted: &std::collections::BTreeSet<AgentId>,
) -> Result<Option<String>, String> {
    image.write_to(dir).map_err(|e| e.to_string())?;
    let c = match rusqlite::Connection::open(dir.join("pulse.db")) {
        Ok(c) => c,
        Err(e) => return Ok(Some(format!("the database does not open: {e}"))),
    };
    let whole: String = match c.query_row("PRAGMA integrity_check", [], |r| r.get(0)) {
        Ok(ok) => ok,
        Err(e) => return Ok(Some(format!("the database cannot be read: {e}"))),
    };
    if whole != "ok" {
        return Ok(Some(format!("integrity_check: {whole}")));
    }
    let found = |sql: &str, args: &[&str]| -> Result<bool, String> {
        c.query_row(sql, rusqlite::params_from_iter(args), |_| Ok(()))
            .map(|()| true)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(false),
                e => Err(e.to_string()),
            })
    };
    for &n in image.acknowledged() {
        let item = &acked[n as usize];
        if deleted.contains(item.agent()) {
            continue;
        }
        let kept = match item {
            Acked::Event(agent, id) => found(
                "SELECT 1 FROM events WHERE agent_id = ?1 AND id = ?2",
                &[agent.as_str(), id.as_str()],
            )?,
            // Queued, answered by a turn, waiting on the model, or dead-lettered.
            Acked::Message(agent, id) => {
                let within = format!("%{id}%");
                found(
                    "SELECT 1 FROM signal_turns WHERE agent_id = ?1 AND signal_id = ?2",
                    &[agent.as_str(), id.as_str()],
                )? || found(
                    "SELECT 1 FROM queue_messages WHERE body LIKE ?1",
                    &[&within],
                )? || found("SELECT 1 FROM queue_dead WHERE body LIKE ?1", &[&within])?
                    || found(
                        "SELECT 1 FROM waiting_turns WHERE agent_id = ?1 AND doc LIKE ?2",
                        &[agent.as_str(), &within],
                    )?
            }
        };
        if !kept {
            return Ok(Some(format!("{item:?} was acknowledged and is lost")));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use pulse_shared::adapters::sqlite::SqliteStore;
    use pulse_shared::config::Durability;
    use pulse_shared::domain::{NewAgent, NewEvent};
    use pulse_shared::ports::{AgentStore, EventLog};

    use super::*;
    use crate::faults::Mix;

    /// Appends `n` events to a fresh agent, each acknowledged, with a cut after each:
    /// the cuts checked, and what each broke.
    fn acknowledge(durability: Durability, n: usize) -> (usize, Vec<String>) {
        let (db, power) = PowerCuts::open().unwrap();
        let store = SqliteStore::new(db.with_durability(durability).unwrap());
        let dice = Dice::new(1, Mix::only(&[(Fault::PowerCut, 1.0)]));
        dice.arm(true);
        let now = jiff::Timestamp::UNIX_EPOCH;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (agent, first) = NewAgent::named("kept").create(now).unwrap();
            store.create_agent(&agent, &first).await.unwrap();
            for _ in 0..n {
                let event = NewEvent::new("PING", serde_json::json!({"n": 1}), None)
                    .unwrap()
                    .into_event(agent.id.clone(), "test", now);
                store.append_in_session(&event).await.unwrap();
                power.acknowledged(&dice, Acked::Event(agent.id.clone(), event.id));
            }
        });
        let (mut checked, mut broken) = (0, Vec::new());
        power
            .check(3, &BTreeSet::new(), |why| {
                checked += 1;
                broken.extend(why);
            })
            .unwrap();
        (checked, broken)
    }

    #[test]
    fn commits_synced_keep_every_acknowledged_event_and_unsynced_ones_are_caught() {
        let (checked, broken) = acknowledge(Durability::Synced, 20);
        assert!(checked >= 20, "{checked}");
        assert!(broken.is_empty(), "{broken:?}");
        // Commits left to the log's own sync: the check sees the loss.
        let (_, broken) = acknowledge(Durability::Relaxed, 20);
        assert!(!broken.is_empty());
        assert!(broken.iter().all(|b| b.contains("is lost")), "{broken:?}");
    }
}
