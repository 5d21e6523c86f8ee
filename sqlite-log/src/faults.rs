//! Power cuts and failing disks, for tests.
//!
//! [`register`] adds a second file system, [`NAME`]: this crate's, with every file SQLite
//! opens through it wrapped (not only the logs). A file under a directory a
//! [`Recording`] watches has what reached the platform recorded in order: each write
//! (after the log's gathering, so as the disk is asked), truncation, sync and deletion,
//! and the marks the test sets when the caller was told a commit succeeded.
//!
//! A power cut keeps of each file what its last sync made durable, and of what was
//! written since, only what the disk happened to write: [`Recording::replay`] builds the
//! files as cuts at every point of the run would have left them, in several ways each
//! (everything unsynced lost; a prefix of it kept; any subset of it kept, as a disk that
//! reorders writes; a prefix kept and the next write torn at a sector), and hands each
//! to the test with the marks set before the cut: a database that opens whole and holds
//! every marked item has kept every promise.
//!
//! [`Recording::inject`] makes the next write or sync of a file fail: a short write (a
//! disk that filled in the middle), a write that fails having written nothing, a sync
//! that fails. A failed sync loses what it was to make durable, as Linux does (it drops
//! the dirty pages whose write-back failed, and a later sync then succeeds): the replay
//! never counts those writes as kept, so a caller told "committed" after such a failure
//! shows up as a lost item.
//!
//! [`SlowDisk`] records nothing: it makes every sync of the files under a directory
//! slower, for measuring group commit on a disk slower than the machine's.
//!
//! Directory entries are taken as durable at once (a file exists from its first write,
//! and is gone when deleted): the cuts are of the files' contents.

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rusqlite::ffi;

/// The file system's name, for `Connection::open_with_flags_and_vfs`.
pub const NAME: &CStr = c"pulse-log-faults";

/// A sector: the unit a torn write keeps whole.
const SECTOR: usize = 512;

/// Registers the file system with SQLite (once a process; later calls only name it).
pub fn register() -> Result<&'static CStr, c_int> {
    static DONE: OnceLock<Result<(), c_int>> = OnceLock::new();
    (*DONE.get_or_init(|| crate::register_as(NAME, open, Some(delete)))).map(|()| NAME)
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: the arguments are SQLite's, passed on.
    unsafe { crate::open_file(name, file, flags, out_flags, true) }
}

unsafe extern "C" fn delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    let base = crate::BASE.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: `base` was stored before this file system was registered; the platform's
    // functions read of `vfs` only what the copy copied from it (see `register_as`).
    let rc = match unsafe { (*base).xDelete } {
        // SAFETY: the arguments are SQLite's, passed on.
        Some(d) => unsafe { d(vfs, name, sync_dir) },
        None => ffi::SQLITE_IOERR_DELETE,
    };
    if rc == ffi::SQLITE_OK && !name.is_null() {
        // SAFETY: SQLite passes a NUL-terminated path.
        if let Some(w) = watch(unsafe { CStr::from_ptr(name) }) {
            w.record(Op::Delete { file: w.file });
        }
    }
    rc
}

/// Which of a database's files a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    /// The database file itself.
    Database,
    /// Its write-ahead log (`-wal`).
    Log,
}

impl File {
    fn of(name: &str) -> Option<Self> {
        if name.ends_with("-wal") {
            Some(Self::Log)
        } else if name.ends_with("-journal") || name.ends_with("-shm") {
            None
        } else {
            Some(Self::Database)
        }
    }
}

/// A failure the next write or sync of a file meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next write writes its first `kept` bytes and fails as on a full disk
    /// (`SQLITE_FULL`).
    ShortWrite { file: File, kept: usize },
    /// The next write fails having written nothing (`SQLITE_IOERR_WRITE`): what an
    /// interrupted write becomes when nothing below tries it again.
    FailedWrite { file: File },
    /// The next sync fails (`SQLITE_IOERR_FSYNC`), and what it was to make durable is
    /// lost.
    FailedSync { file: File },
}

impl Fault {
    fn file(self) -> File {
        match self {
            Self::ShortWrite { file, .. }
            | Self::FailedWrite { file }
            | Self::FailedSync { file } => file,
        }
    }
}

/// What reached a file, in order.
#[derive(Clone, Debug)]
enum Op {
    Write {
        file: usize,
        at: u64,
        bytes: Vec<u8>,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Sync {
        file: usize,
    },
    /// A sync failed: what the file held unsynced will never be durable.
    SyncFailed {
        file: usize,
    },
    Delete {
        file: usize,
    },
    /// The test's mark: a caller was told this item was committed.
    Mark(u64),
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    /// A [`SlowDisk`]'s: each sync waits this long first, and nothing is recorded.
    slow: Option<std::time::Duration>,
}

#[derive(Default)]
struct State {
    /// The recorded files' names, relative to the directory.
    names: Vec<String>,
    ops: Vec<Op>,
    injected: VecDeque<Fault>,
    /// Faults met so far.
    met: usize,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The recordings under way: a file opened under one's directory is recorded by it.
static RECORDINGS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// A watched file: its recording and its number there.
pub(crate) struct Watched {
    shared: Arc<Shared>,
    file: usize,
}

/// The recording watching the file at `path`, if any.
pub(crate) fn watch(path: &CStr) -> Option<Watched> {
    let path = Path::new(path.to_str().ok()?);
    let mut all = RECORDINGS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    let shared = all
        .iter()
        .filter_map(Weak::upgrade)
        .find(|s| path.starts_with(&s.dir))?;
    let name = path.strip_prefix(&shared.dir).ok()?.to_str()?.to_owned();
    let file = {
        let mut state = shared.state();
        match state.names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                state.names.push(name);
                state.names.len() - 1
            }
        }
    };
    Some(Watched { shared, file })
}

impl Watched {
    fn record(&self, op: Op) {
        self.shared.state().ops.push(op);
    }

    /// The fault this file's next `kind` of call meets, taken from those injected.
    fn fault(&self, state: &mut State, sync: bool) -> Option<Fault> {
        let kind = File::of(&state.names[self.file])?;
        let i = state
            .injected
            .iter()
            .position(|f| f.file() == kind && matches!(f, Fault::FailedSync { .. }) == sync)?;
        state.met += 1;
        state.injected.remove(i)
    }

    /// Writes `data` at `at` with `write` (given the part to write), as an injected
    /// fault says, and records what was written.
    pub(crate) fn write(&self, data: &[u8], at: i64, write: impl FnOnce(&[u8]) -> c_int) -> c_int {
        if self.shared.slow.is_some() {
            return write(data);
        }
        let mut state = self.shared.state();
        let (part, failed) = match self.fault(&mut state, false) {
            Some(Fault::ShortWrite { kept, .. }) => {
                (&data[..kept.min(data.len())], Some(ffi::SQLITE_FULL))
            }
            Some(_) => return ffi::SQLITE_IOERR_WRITE,
            None => (data, None),
        };
        let rc = if part.is_empty() {
            ffi::SQLITE_OK
        } else {
            write(part)
        };
        if rc == ffi::SQLITE_OK && !part.is_empty() {
            state.ops.push(Op::Write {
                file: self.file,
                at: at as u64,
                bytes: part.to_vec(),
            });
        }
        failed.unwrap_or(rc)
    }

    /// Syncs with `sync`, as an injected fault says, and records it.
    pub(crate) fn sync(&self, sync: impl FnOnce() -> c_int) -> c_int {
        if let Some(delay) = self.shared.slow {
            std::thread::sleep(delay);
            return sync();
        }
        let mut state = self.shared.state();
        if self.fault(&mut state, true).is_some() {
            state.ops.push(Op::SyncFailed { file: self.file });
            return ffi::SQLITE_IOERR_FSYNC;
        }
        let rc = sync();
        state.ops.push(if rc == ffi::SQLITE_OK {
            Op::Sync { file: self.file }
        } else {
            Op::SyncFailed { file: self.file }
        });
        rc
    }

    /// Records a truncation to `size` bytes.
    pub(crate) fn truncated(&self, size: i64) {
        if self.shared.slow.is_some() {
            return;
        }
        self.record(Op::Truncate {
            file: self.file,
            size: size.max(0) as u64,
        });
    }
}

/// Records what reaches the files under a directory through [`NAME`], from its start
/// until it is dropped.
pub struct Recording {
    shared: Arc<Shared>,
}

impl Recording {
    /// Starts recording the files opened through [`NAME`] under `dir` from now on
    /// (open them after this).
    pub fn start(dir: &Path) -> std::io::Result<Self> {
        Ok(Self {
            shared: watching(dir, None)?,
        })
    }

    /// Marks item `id` as acknowledged: a caller was told it is committed. Every replayed
    /// cut after this point must hold it.
    pub fn mark(&self, id: u64) {
        self.shared.state().ops.push(Op::Mark(id));
    }

    /// Makes the next write (or, for [`Fault::FailedSync`], sync) of the file fail.
    pub fn inject(&self, fault: Fault) {
        self.shared.state().injected.push_back(fault);
    }

    /// How many injected faults have been met.
    pub fn faults_met(&self) -> usize {
        self.shared.state().met
    }

    /// What was recorded so far: writes, truncations, syncs (failed or not), deletions
    /// and marks.
    pub fn ops(&self) -> usize {
        self.shared.state().ops.len()
    }

    /// How many syncs and writes were recorded: `(writes, syncs)`.
    pub fn writes_and_syncs(&self) -> (usize, usize) {
        let state = self.shared.state();
        let writes = state
            .ops
            .iter()
            .filter(|o| matches!(o, Op::Write { .. }))
            .count();
        let syncs = state
            .ops
            .iter()
            .filter(|o| matches!(o, Op::Sync { .. }))
            .count();
        (writes, syncs)
    }

    /// Where the run is now: a power cut now would be at this point (for
    /// [`Recording::replay_at`]).
    pub fn point(&self) -> usize {
        self.ops()
    }

    /// Cuts the power at every point of the run so far (before each recorded operation,
    /// and at its end), in the ways [`Cut`] names, chosen by `seed`; `check` is given the
    /// files each cut leaves. Returns how many images were checked.
    pub fn replay(&self, seed: u64, check: impl FnMut(&Image)) -> usize {
        self.replay_where(seed, usize::MAX, |_| true, check)
    }

    /// As [`Recording::replay`], at the given points of the run only (as
    /// [`Recording::point`] gave them): for a long run, whose every point would be too
    /// many to check.
    pub fn replay_at(&self, points: &[usize], seed: u64, check: impl FnMut(&Image)) -> usize {
        let at: std::collections::BTreeSet<usize> = points.iter().copied().collect();
        let last = at.last().copied().unwrap_or(0);
        self.replay_where(seed, last, |p| at.contains(&p), check)
    }

    fn replay_where(
        &self,
        seed: u64,
        last: usize,
        at: impl Fn(usize) -> bool,
        mut check: impl FnMut(&Image),
    ) -> usize {
        let (names, ops) = {
            let state = self.shared.state();
            (state.names.clone(), state.ops.clone())
        };
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut files: Vec<Model> = names.iter().map(|_| Model::default()).collect();
        let mut acknowledged = Vec::new();
        let mut checked = 0;
        for point in 0..=ops.len().min(last) {
            let pending: usize = files.iter().map(|f| f.pending.len()).sum();
            let mut cuts = Vec::new();
            if at(point) {
                cuts.push(Cut::Lost);
                if pending > 0 {
                    cuts.push(Cut::Prefix(rng.usize(0..=pending)));
                    cuts.push(Cut::Subset(rng.u64(..)));
                    cuts.push(Cut::Torn(rng.usize(0..pending), rng.u64(..)));
                }
            }
            for cut in cuts {
                let image = Image {
                    point,
                    cut,
                    files: cut_files(&names, &files, cut),
                    acknowledged: acknowledged.clone(),
                };
                check(&image);
                checked += 1;
            }
            let Some(op) = ops.get(point) else { break };
            match op {
                Op::Mark(id) => acknowledged.push(*id),
                Op::Write { file, at, bytes } => {
                    files[*file].exists = true;
                    files[*file].pending.push(Pending {
                        seq: point,
                        what: Change::Write(*at, bytes.clone()),
                    });
                }
                Op::Truncate { file, size } => files[*file].pending.push(Pending {
                    seq: point,
                    what: Change::Truncate(*size),
                }),
                Op::Sync { file } => {
                    let f = &mut files[*file];
                    for p in std::mem::take(&mut f.pending) {
                        p.what.apply(&mut f.durable);
                    }
                }
                Op::SyncFailed { file } => files[*file].pending.clear(),
                Op::Delete { file } => files[*file] = Model::default(),
            }
        }
        checked
    }
}

/// Watches the files under `dir` from now on: recorded, or, with `slow`, synced late.
fn watching(dir: &Path, slow: Option<std::time::Duration>) -> std::io::Result<Arc<Shared>> {
    let shared = Arc::new(Shared {
        dir: dir.canonicalize()?,
        state: Mutex::default(),
        slow,
    });
    RECORDINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(&shared));
    Ok(shared)
}

/// Stops watching what `shared` watched.
fn unwatch(shared: &Arc<Shared>) {
    let mut all = RECORDINGS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(shared)));
}

/// A disk slower to sync than this machine's: every sync of a file opened through
/// [`NAME`] under a directory while it lives takes `delay` longer (a sleep before it);
/// nothing is recorded or injected. For measuring what a commit's
/// wait for its sync does on a disk whose syncs take milliseconds (a cloud volume, a
/// consumer SSD without power-loss protection) on a machine whose disk is fast.
pub struct SlowDisk {
    shared: Arc<Shared>,
}

impl SlowDisk {
    /// Slows the syncs of the files opened under `dir` from now on (open them after).
    pub fn start(dir: &Path, delay: std::time::Duration) -> std::io::Result<Self> {
        Ok(Self {
            shared: watching(dir, Some(delay))?,
        })
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        unwatch(&self.shared);
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        unwatch(&self.shared);
    }
}

/// A file as the replay models it: what is durable, and what was written since.
#[derive(Default)]
struct Model {
    exists: bool,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

/// A change not yet synced, and its place in the run.
struct Pending {
    seq: usize,
    what: Change,
}

#[derive(Clone)]
enum Change {
    Write(u64, Vec<u8>),
    Truncate(u64),
}

impl Change {
    fn apply(&self, file: &mut Vec<u8>) {
        match self {
            Self::Write(at, bytes) => write_at(file, *at as usize, bytes),
            Self::Truncate(size) => file.truncate(*size as usize),
        }
    }
}

fn write_at(file: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    if file.len() < at + bytes.len() {
        file.resize(at + bytes.len(), 0);
    }
    file[at..at + bytes.len()].copy_from_slice(bytes);
}

/// How a power cut treated what was written and not yet synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// All of it lost.
    Lost,
    /// The first n writes kept (in the order they were made, across the files).
    Prefix(usize),
    /// Each write kept or lost at random (a disk that reorders), from this seed.
    Subset(u64),
    /// The first n kept, and of the next write a random number of whole sectors (a page
    /// torn), from this seed.
    Torn(usize, u64),
}

/// The files a cut left.
fn cut_files(names: &[String], files: &[Model], cut: Cut) -> Vec<(String, Vec<u8>)> {
    // The unsynced writes in the order they were made, across the files.
    let mut order: Vec<(usize, usize, usize)> = Vec::new();
    for (f, m) in files.iter().enumerate() {
        order.extend(m.pending.iter().enumerate().map(|(i, p)| (p.seq, f, i)));
    }
    order.sort_unstable();
    let mut rng = match cut {
        Cut::Subset(seed) | Cut::Torn(_, seed) => fastrand::Rng::with_seed(seed),
        _ => fastrand::Rng::with_seed(0),
    };
    let kept = |k: usize, rng: &mut fastrand::Rng| -> Keep {
        match cut {
            Cut::Lost => Keep::No,
            Cut::Prefix(n) => {
                if k < n {
                    Keep::Whole
                } else {
                    Keep::No
                }
            }
            Cut::Subset(_) => {
                if rng.bool() {
                    Keep::Whole
                } else {
                    Keep::No
                }
            }
            Cut::Torn(n, _) => {
                if k < n {
                    Keep::Whole
                } else if k == n {
                    Keep::Sectors(rng.u64(..))
                } else {
                    Keep::No
                }
            }
        }
    };
    let mut images: Vec<Option<Vec<u8>>> = files
        .iter()
        .map(|m| m.exists.then(|| m.durable.clone()))
        .collect();
    for (k, (_, f, i)) in order.into_iter().enumerate() {
        let p = &files[f].pending[i].what;
        let Some(image) = images[f].as_mut() else {
            continue;
        };
        match (kept(k, &mut rng), p) {
            (Keep::No, _) => {}
            (Keep::Whole, p) => p.apply(image),
            (Keep::Sectors(r), Change::Write(at, bytes)) => {
                let sectors = bytes.len().div_ceil(SECTOR);
                let n = (r as usize % sectors.max(1)) * SECTOR;
                write_at(image, *at as usize, &bytes[..n.min(bytes.len())]);
            }
            (Keep::Sectors(_), p) => p.apply(image),
        }
    }
    names
        .iter()
        .zip(images)
        .filter_map(|(n, i)| i.map(|i| (n.clone(), i)))
        .collect()
}

enum Keep {
    No,
    Whole,
    Sectors(u64),
}

/// The files a power cut left, and what had been acknowledged before it.
pub struct Image {
    /// Where in the run: before the recorded operation of this number.
    pub point: usize,
    pub cut: Cut,
    files: Vec<(String, Vec<u8>)>,
    acknowledged: Vec<u64>,
}

impl Image {
    /// The items marked before the cut, in order.
    pub fn acknowledged(&self) -> &[u64] {
        &self.acknowledged
    }

    /// Writes the files into `dir` (emptied of them first), as the machine would find
    /// them on starting again. The shared-memory index is never kept: SQLite rebuilds it.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::remove_file(entry.path())?;
            }
        }
        for (name, bytes) in &self.files {
            std::fs::write(dir.join(name), bytes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording of one file: 1,024 bytes of 1 synced, then 1,024 bytes of 2 and 3
    /// bytes of 3 at 2,048, unsynced.
    fn recorded() -> Recording {
        let rec = Recording {
            shared: Arc::new(Shared {
                dir: PathBuf::from("/nowhere"),
                state: Mutex::default(),
                slow: None,
            }),
        };
        {
            let mut state = rec.shared.state();
            state.names.push("t.db".into());
            state.ops.extend([
                Op::Write {
                    file: 0,
                    at: 0,
                    bytes: vec![1; 1_024],
                },
                Op::Sync { file: 0 },
                Op::Mark(1),
                Op::Write {
                    file: 0,
                    at: 0,
                    bytes: vec![2; 1_024],
                },
                Op::Write {
                    file: 0,
                    at: 2_048,
                    bytes: vec![3; 3],
                },
            ]);
        }
        rec
    }

    #[test]
    fn cuts_at_chosen_points_are_those_of_the_whole_replay_there() {
        let rec = recorded();
        let mut all = Vec::new();
        rec.replay(5, |image| all.push((image.point, image.cut)));
        let mut some = Vec::new();
        let checked = rec.replay_at(&[1, 3], 9, |image| {
            some.push((image.point, image.cut, image.files[0].1.clone()));
        });
        assert_eq!(checked, some.len());
        // At 1 the first write is unsynced (four cuts), at 3 nothing is (one).
        assert_eq!(
            some.iter().map(|(p, ..)| *p).collect::<Vec<_>>(),
            [1, 1, 1, 1, 3]
        );
        assert!(some.iter().all(|(p, ..)| all.iter().any(|(q, _)| q == p)));
        assert_eq!(some[4].2, vec![1; 1_024], "synced by point 3");
        assert_eq!(rec.point(), 5);
    }

    #[test]
    fn a_cut_keeps_what_was_synced_and_of_the_rest_what_it_says() {
        let rec = recorded();
        let mut at_end = Vec::new();
        rec.replay(5, |image| {
            if image.point == 5 {
                at_end.push((
                    image.cut,
                    image.files[0].1.clone(),
                    image.acknowledged.clone(),
                ));
            }
        });
        assert_eq!(at_end.len(), 4);
        for (cut, file, acked) in at_end {
            assert_eq!(acked, [1]);
            match cut {
                Cut::Lost => assert_eq!(file, vec![1; 1_024]),
                Cut::Prefix(0) => assert_eq!(file, vec![1; 1_024]),
                Cut::Prefix(1) => assert_eq!(file, vec![2; 1_024]),
                Cut::Prefix(_) => {
                    assert_eq!(file.len(), 2_051);
                    assert_eq!(&file[..1_024], &[2; 1_024]);
                    assert_eq!(&file[2_048..], &[3; 3]);
                }
                Cut::Torn(0, _) => {
                    // Whole sectors of the second write over the first.
                    let torn = file.iter().take_while(|&&b| b == 2).count();
                    assert_eq!(torn % SECTOR, 0, "{torn}");
                    assert!(file[torn..].iter().all(|&b| b == 1));
                }
                Cut::Torn(..) | Cut::Subset(_) => {
                    assert!(
                        file[..1_024].iter().all(|&b| b == 1)
                            || file[..1_024].iter().all(|&b| b == 2)
                    );
                }
            }
        }
    }

    #[test]
    fn a_failed_sync_loses_what_it_was_to_make_durable_and_a_later_sync_does_not_bring_it_back() {
        let rec = recorded();
        rec.shared
            .state()
            .ops
            .extend([Op::SyncFailed { file: 0 }, Op::Sync { file: 0 }]);
        let mut last = None;
        rec.replay(5, |image| last = image.files.first().map(|f| f.1.clone()));
        assert_eq!(last.unwrap(), vec![1; 1_024]);
    }
}
