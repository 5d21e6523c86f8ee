//! The pages a commit appends to SQLite's write-ahead log, written in one call.
//!
//! SQLite appends each page of a commit to the log as two writes: the frame's 24-byte
//! header, then the page. A commit of 16 pages is 32 `pwrite` calls, each a system call
//! and a walk of the file's page cache; on a 2-core virtual machine two such writes of a
//! 4 KiB page cost 3.6 µs where one write of the gathered frames costs 1.1 µs a page.
//!
//! [`register`] adds a file system to SQLite (a "VFS"), [`NAME`], that is the platform's
//! default one except for write-ahead logs. A log's appends are gathered in memory and
//! written in one call as soon as the commit's last frame is complete. SQLite marks that
//! frame in its header (the database's size after the commit, zero in every other
//! frame), and writes it last, before it publishes the commit in the log's index (the
//! shared memory readers consult): so no reader, in this process or another, can learn
//! of a frame that is not yet in the file. Everything else on a log file (a read, its
//! size, a sync, a truncation, closing it) first writes what is gathered; a write that
//! does not follow what is gathered writes it first too; and a transaction too large
//! for memory (pages SQLite spills before the commit) is written every [`GATHER_AT_MOST`]
//! bytes, in pieces of at most 124 KiB (the most the platform writes in one call).
//!
//! A crash loses nothing that SQLite's own writes would have kept: what is gathered is
//! the unpublished part of a commit under way, which a crash between SQLite's own writes
//! would leave unpublished as well, and recovery ignores.
//!
//! [`faults`] is the same file system with every file recorded: the tests cut the power
//! at every point of a run, and make writes and syncs fail, over this crate's code.

use std::ffi::{CStr, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use rusqlite::ffi;

pub mod faults;

/// The file system's name, for `Connection::open_with_flags_and_vfs`.
pub const NAME: &CStr = c"pulse-log";

/// Bytes gathered at most before they are written (about 250 frames of 4 KiB): only a
/// transaction that spills pages before its commit gathers this many.
pub const GATHER_AT_MOST: usize = 1 << 20;

/// Bytes written in one call at most: the platform's file system takes at most
/// 128 KiB – 1 a call (it masks the length to that).
const WRITE_AT_MOST: usize = 124 * 1024;

/// A frame's header, written by SQLite in a call of its own.
const FRAME_HEADER: usize = 24;

/// The platform's file system, which does the actual work.
static BASE: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// Calls that wrote to a log file, and appends gathered into them (see [`Counts`]).
static WRITES: AtomicU64 = AtomicU64::new(0);
static APPENDS: AtomicU64 = AtomicU64::new(0);

/// What the log files of this process were given and what they wrote, since it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Writes SQLite asked of a log file.
    pub appends: u64,
    /// Writes made to a log file.
    pub writes: u64,
}

/// The counts so far.
pub fn counts() -> Counts {
    Counts {
        appends: APPENDS.load(Ordering::Relaxed),
        writes: WRITES.load(Ordering::Relaxed),
    }
}

/// Registers the file system with SQLite (once a process; later calls only name it).
/// An error is SQLite's code when the platform has no default file system or refuses
/// the registration.
pub fn register() -> Result<&'static CStr, c_int> {
    static DONE: OnceLock<Result<(), c_int>> = OnceLock::new();
    (*DONE.get_or_init(|| register_as(NAME, open, None))).map(|()| NAME)
}

/// Registers a copy of the platform's default file system under `name`, opening files
/// with `open` (and deleting them with `delete`, when given).
fn register_as(name: &'static CStr, open: Open, delete: Option<Delete>) -> Result<(), c_int> {
    // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed and returns a pointer to
    // the default file system, which SQLite keeps for the life of the process, or null.
    let base = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
    if base.is_null() {
        return Err(ffi::SQLITE_ERROR);
    }
    // Every registration finds the same default (this crate never registers its own as
    // the default), so storing it again changes nothing.
    BASE.store(base, Ordering::Release);
    // SAFETY: `base` points at a live `sqlite3_vfs` (above); it is copied, not moved.
    let mut vfs = unsafe { ptr::read(base) };
    // SAFETY: as above; only its size is read.
    let base_size = unsafe { (*base).szOsFile };
    // A wrapped file is this crate's `LogFile` followed by the platform's file; any
    // other file is the platform's alone, at the start of the same memory.
    vfs.szOsFile = base_size + c_int::try_from(INNER_AT).map_err(|_| ffi::SQLITE_ERROR)?;
    vfs.pNext = ptr::null_mut();
    vfs.zName = name.as_ptr();
    vfs.xOpen = Some(open);
    if let Some(delete) = delete {
        vfs.xDelete = Some(delete);
    }
    // The copy's other functions are the platform's, which read nothing of the copy but
    // its application data and longest path, copied with them.
    let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
    // SAFETY: `vfs` lives for the rest of the process (leaked), as SQLite requires of a
    // registered file system; 0 leaves the default file system as it is.
    match unsafe { ffi::sqlite3_vfs_register(vfs, 0) } {
        ffi::SQLITE_OK => Ok(()),
        rc => Err(rc),
    }
}

/// A file system's `xOpen`.
type Open = unsafe extern "C" fn(
    *mut ffi::sqlite3_vfs,
    ffi::sqlite3_filename,
    *mut ffi::sqlite3_file,
    c_int,
    *mut c_int,
) -> c_int;

/// A file system's `xDelete`.
type Delete = unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *const std::ffi::c_char, c_int) -> c_int;

/// A write-ahead log file: the header SQLite sees, the platform's file, and the appends
/// gathered for it.
#[repr(C)]
struct LogFile {
    /// SQLite's view of the file (first, as SQLite requires): points at [`METHODS`].
    file: ffi::sqlite3_file,
    /// The platform's file, [`INNER_AT`] bytes after this one in the same memory.
    inner: *mut ffi::sqlite3_file,
    gathered: Gathered,
    /// A write-ahead log, whose appends are gathered; any other file (wrapped only under
    /// [`faults`]) writes as it is asked.
    gathers: bool,
    /// What [`faults`] records of this file and does to it, when it is watched.
    watched: Option<faults::Watched>,
}

/// Appends not yet written: `bytes` go at `at` in the file.
#[derive(Default)]
struct Gathered {
    at: i64,
    bytes: Vec<u8>,
    /// The last frame header appended marked a commit: what follows it (its page) ends
    /// the commit, and is written at once.
    in_commit: bool,
}

/// Where the platform's file starts in a log file's memory.
const INNER_AT: usize = std::mem::size_of::<LogFile>().next_multiple_of(16);

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// Opens a file through the platform's file system, a log file inside a [`LogFile`].
unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: the arguments are SQLite's, passed on.
    unsafe { open_file(name, file, flags, out_flags, false) }
}

/// Opens a file through the platform's file system: inside a [`LogFile`] when it is a
/// write-ahead log or `watch` is set ([`faults`]: every file, recorded when it is under
/// a recorded directory), as the platform's alone otherwise.
///
/// # Safety
/// The arguments are those SQLite passes to `xOpen` of a file system registered by
/// [`register_as`].
unsafe fn open_file(
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
    watch: bool,
) -> c_int {
    let base = BASE.load(Ordering::Acquire);
    // SAFETY: `base` was stored before this file system was registered, so before SQLite
    // could call this; the platform's file system always has `xOpen`.
    let Some(base_open) = (unsafe { (*base).xOpen }) else {
        return ffi::SQLITE_ERROR;
    };
    let gathers = flags & ffi::SQLITE_OPEN_WAL != 0;
    if !gathers && !watch {
        // SAFETY: SQLite gave `file` this file system's `szOsFile` bytes, more than the
        // platform's; the other arguments are SQLite's own, passed on.
        return unsafe { base_open(base, name, file, flags, out_flags) };
    }
    let watched = if watch && !name.is_null() {
        // SAFETY: a name SQLite passes is a NUL-terminated path it keeps while the file
        // is open.
        faults::watch(unsafe { CStr::from_ptr(name) })
    } else {
        None
    };
    // SAFETY: the memory holds `INNER_AT` plus the platform's `szOsFile` bytes (see
    // `register_as`); SQLite aligns it to 8 bytes, and `INNER_AT`, a multiple of 16,
    // keeps the platform's file so aligned.
    let inner = unsafe { file.cast::<u8>().add(INNER_AT) }.cast::<ffi::sqlite3_file>();
    // SAFETY: as for any other file, at `inner`.
    let rc = unsafe { base_open(base, name, inner, flags, out_flags) };
    // SAFETY: `inner` was written by the platform's `xOpen`, which sets its methods (or
    // null) whether or not it succeeded; `file` is ours to write (SQLite reads only its
    // methods, and calls `close` on it when they are set).
    unsafe {
        if (*inner).pMethods.is_null() {
            (*file).pMethods = ptr::null();
        } else {
            file.cast::<LogFile>().write(LogFile {
                file: ffi::sqlite3_file { pMethods: &METHODS },
                inner,
                gathered: Gathered::default(),
                gathers,
                watched,
            });
        }
    }
    rc
}

/// The log file behind SQLite's `file`.
///
/// # Safety
/// `file` was opened by [`open`] as a log (its methods are [`METHODS`]), is not closed,
/// and no other reference to it is live: SQLite calls a file's methods one at a time.
unsafe fn log_file<'a>(file: *mut ffi::sqlite3_file) -> &'a mut LogFile {
    // SAFETY: the caller's promise.
    unsafe { &mut *file.cast::<LogFile>() }
}

impl LogFile {
    /// The platform file's methods.
    fn methods(&self) -> &ffi::sqlite3_io_methods {
        // SAFETY: `inner` was opened by the platform's `xOpen` with its methods set (see
        // `open`), and stays open until `close`.
        unsafe { &*(*self.inner).pMethods }
    }

    /// Writes `len` bytes at `buf` to the platform's file at `at` (as [`faults`] says,
    /// when the file is watched).
    fn write_inner(&self, buf: *const c_void, len: c_int, at: i64) -> c_int {
        WRITES.fetch_add(1, Ordering::Relaxed);
        let Some(write) = self.methods().xWrite else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let Some(watched) = &self.watched else {
            // SAFETY: `inner` is open (see `methods`); `buf` holds `len` bytes (the
            // callers' promise).
            return unsafe { write(self.inner, buf, len, at) };
        };
        let Ok(n) = usize::try_from(len) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        // SAFETY: the callers' promise: `buf` holds `len` bytes, unchanged during the call.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
        watched.write(data, at, |part| {
            // SAFETY: `part` is a prefix of `data`, within a `c_int`; `inner` is open.
            unsafe { write(self.inner, part.as_ptr().cast(), part.len() as c_int, at) }
        })
    }

    /// Writes what is gathered, if anything. A failed write drops it all the same: it
    /// belonged to the transaction the failure ends.
    fn write_gathered(&mut self) -> c_int {
        if self.gathered.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let mut rc = ffi::SQLITE_OK;
        let mut at = self.gathered.at;
        for piece in self.gathered.bytes.chunks(WRITE_AT_MOST) {
            // At most `WRITE_AT_MOST`, so within a `c_int`.
            rc = self.write_inner(piece.as_ptr().cast(), piece.len() as c_int, at);
            if rc != ffi::SQLITE_OK {
                break;
            }
            at += piece.len() as i64;
        }
        // `in_commit` stays: a commit's page SQLite writes in two parts (around a sync
        // point, with `synchronous = FULL`) is written part by part. The buffer keeps its
        // memory for the next commit: never more than `GATHER_AT_MOST` and a page.
        self.gathered.bytes.clear();
        rc
    }

    /// Takes SQLite's write of `data` at `at`: gathered when it extends what is gathered
    /// (or starts it), and written when it completes a commit.
    fn append(&mut self, data: &[u8], at: i64) -> c_int {
        APPENDS.fetch_add(1, Ordering::Relaxed);
        if !self.gathers {
            return match c_int::try_from(data.len()) {
                Ok(len) => self.write_inner(data.as_ptr().cast(), len, at),
                Err(_) => ffi::SQLITE_IOERR_WRITE,
            };
        }
        let g = &mut self.gathered;
        let end = g.at + g.bytes.len() as i64;
        if !g.bytes.is_empty() && at != end {
            // Elsewhere in the file (a frame rewritten in place): what is gathered goes
            // first, then this, as it comes.
            let rc = self.write_gathered();
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            return match c_int::try_from(data.len()) {
                Ok(len) => self.write_inner(data.as_ptr().cast(), len, at),
                Err(_) => ffi::SQLITE_IOERR_WRITE,
            };
        }
        if g.bytes.is_empty() {
            g.at = at;
        }
        g.bytes.extend_from_slice(data);
        let ends_commit = if data.len() == FRAME_HEADER {
            // Bytes 4 – 7 of a frame's header: the database's size in pages after the
            // commit this frame ends, or zero.
            g.in_commit = data[4..8] != [0; 4];
            false
        } else {
            g.in_commit
        };
        if ends_commit || g.bytes.len() >= GATHER_AT_MOST {
            self.write_gathered()
        } else {
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once, after its last call on it.
    let f = unsafe { log_file(file) };
    let written = f.write_gathered();
    let closed = match f.methods().xClose {
        // SAFETY: `inner` is open (see `LogFile::methods`) and closed here once.
        Some(close) => unsafe { close(f.inner) },
        None => ffi::SQLITE_OK,
    };
    // SAFETY: the `LogFile` was written by `open` and is not used after this; SQLite
    // frees its memory.
    unsafe { ptr::drop_in_place(file.cast::<LogFile>()) };
    if written != ffi::SQLITE_OK {
        written
    } else {
        closed
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    len: c_int,
    at: ffi::sqlite3_int64,
) -> c_int {
    let Ok(n) = usize::try_from(len) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite passes `len` readable bytes at `buf`, unchanged during the call.
    let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
    // SAFETY: SQLite calls this on a file `open` opened, one call at a time.
    unsafe { log_file(file) }.append(data, at)
}

/// Calls the platform file's method `$m` with `$args`, with nothing written first;
/// `$missing` when the platform has no such method.
macro_rules! passed_on {
    ($file:ident, $m:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite calls this on a file `open` opened, one call at a time.
        let f = unsafe { log_file($file) };
        match f.methods().$m {
            // SAFETY: `inner` is open (see `LogFile::methods`); the arguments are
            // SQLite's own, passed on.
            Some(m) => unsafe { m(f.inner $(, $arg)*) },
            None => $missing,
        }
    }};
}

/// [`passed_on!`] once what is gathered is written.
macro_rules! after_gathered {
    ($file:ident, $m:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite calls this on a file `open` opened, one call at a time.
        let rc = unsafe { log_file($file) }.write_gathered();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        passed_on!($file, $m, $missing $(, $arg)*)
    }};
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    len: c_int,
    at: ffi::sqlite3_int64,
) -> c_int {
    after_gathered!(file, xRead, ffi::SQLITE_IOERR_READ, buf, len, at)
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let rc = after_gathered!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size);
    // SAFETY: SQLite calls this on a file `open` opened, one call at a time.
    if let Some(w) = &unsafe { log_file(file) }.watched
        && rc == ffi::SQLITE_OK
    {
        w.truncated(size);
    }
    rc
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite calls this on a file `open` opened, one call at a time.
    let f = unsafe { log_file(file) };
    let rc = f.write_gathered();
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let Some(sync) = f.methods().xSync else {
        return ffi::SQLITE_IOERR_FSYNC;
    };
    // SAFETY: `inner` is open (see `LogFile::methods`); the flags are SQLite's own.
    let synced = || unsafe { sync(f.inner, flags) };
    match &f.watched {
        Some(w) => w.sync(synced),
        None => synced(),
    }
}

unsafe extern "C" fn file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    after_gathered!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    after_gathered!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    at: ffi::sqlite3_int64,
    len: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // Without the platform's, the answer "not mapped: read it".
    // SAFETY: `out` is SQLite's, to be written.
    let unmapped = || unsafe {
        *out = ptr::null_mut();
        ffi::SQLITE_OK
    };
    after_gathered!(file, xFetch, unmapped(), at, len, out)
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    at: ffi::sqlite3_int64,
    p: *mut c_void,
) -> c_int {
    passed_on!(file, xUnfetch, ffi::SQLITE_OK, at, p)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    passed_on!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    passed_on!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    passed_on!(
        file,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    passed_on!(file, xSectorSize, 4096)
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    passed_on!(file, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    passed_on!(
        file,
        xShmMap,
        ffi::SQLITE_IOERR_SHMMAP,
        page,
        size,
        extend,
        out
    )
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    passed_on!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags)
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    passed_on!(file, xShmBarrier, ())
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    passed_on!(file, xShmUnmap, ffi::SQLITE_OK, delete)
}
