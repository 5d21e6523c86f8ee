//! Key files: where a key lives when it is not given in `PULSE_ENCRYPTION_KEY` — beside
//! the database (`<db>.key`) under `pulse serve`, or where `pulse init` made it for an
//! emulator (`PULSE_ENCRYPTION_KEY_FILE`). One key, in base64, on one line.
//!
//! A key file is opened without following a symlink, and must belong to this user and be
//! readable by nobody else (mode 0600): a key someone else planted, or could read, would
//! seal secrets anyone with the file can open.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::EncryptionKeys;

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("the key file {}: {why}", path.display())]
pub struct KeyFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub why: String,
}

/// The key in the file at `path` (checked to be a key), and whether it was made now.
/// With `make`, a missing file is created (mode 0600) holding a new random key; without,
/// it is an error.
pub fn key_file(path: &Path, make: bool) -> Result<(String, bool), KeyFileError> {
    let failed = |why: String| KeyFileError {
        path: path.to_owned(),
        why,
    };
    let made = make && !path.exists() && make_key_file(path).map_err(|e| failed(e.to_string()))?;
    let mut file = options().read(true).open(path).map_err(|e| {
        failed(if is_symlink(path) {
            "it is a symbolic link; a key file must be a plain file (replace the link with the file it points to, if that is yours)".to_owned()
        } else {
            e.to_string()
        })
    })?;
    check_private(&file).map_err(failed)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).map_err(|e| failed(e.to_string()))?;
    let key = text.trim().to_owned();
    EncryptionKeys::parse(&key, None).map_err(|e| failed(e.to_string()))?;
    Ok((key, made))
}

/// Makes the key file at `path` holding a new key, unless another process made it first
/// (false then). Another process may look for the file at the same moment (`pulse serve
/// &` and the command after it), so it never sees the file part-written: the key is
/// written whole to a file of its own beside it, which is then linked in under the
/// key file's name, an operation that fails when the name is taken.
fn make_key_file(path: &Path) -> std::io::Result<bool> {
    static DRAFTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = DRAFTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}-{n}.new", std::process::id()));
    let draft = Draft(path.with_file_name(name));
    // One by that name is left from a process that stopped halfway, whose id this one
    // now has: no one else writes it.
    let _ = std::fs::remove_file(&draft.0);
    let key = EncryptionKeys::new_key();
    let mut f = options().write(true).create_new(true).open(&draft.0)?;
    writeln!(f, "{key}")?;
    f.sync_all()?;
    match std::fs::hard_link(&draft.0, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links: made in place, as the next best thing.
        Err(_) => match options().write(true).create_new(true).open(path) {
            Ok(mut f) => {
                writeln!(f, "{key}")?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        },
    }
}

/// A key written beside its file before it is linked in; removed however that went.
struct Draft(PathBuf);

impl Drop for Draft {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Open options that create files 0600 and refuse to follow a symlink at the last
/// component.
fn options() -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    }
    o
}

/// The open file is a regular file of this user that no one else may read or write.
#[cfg(unix)]
fn check_private(file: &std::fs::File) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".to_owned());
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "it belongs to user {}, not to this user ({me}); a key file must be your own",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "its mode is {mode:o}: others may read it; `chmod 600` it (and consider the key exposed)"
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_: &std::fs::File) -> Result<(), String> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_file_is_made_once_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.key");
        assert!(key_file(&path, false).is_err(), "not made without asking");
        let (first, made) = key_file(&path, true).unwrap();
        assert!(made);
        assert!(EncryptionKeys::parse(&first, None).is_ok());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, made) = key_file(&path, true).unwrap();
        assert!(!made);
        assert_eq!(first, again);
    }

    /// `pulse serve &` and the command after it may both find the key file missing and
    /// make it at once: each gets the one key, never a file still being written.
    #[test]
    fn processes_making_the_key_file_at_once_all_read_the_one_key() {
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("pulse.key");
            let start = std::sync::Barrier::new(6);
            let got: Vec<(String, bool)> = std::thread::scope(|s| {
                let makers: Vec<_> = (0..6)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            key_file(&path, true)
                        })
                    })
                    .collect();
                makers
                    .into_iter()
                    .map(|m| {
                        m.join()
                            .unwrap()
                            .unwrap_or_else(|e| panic!("round {round}: {e}"))
                    })
                    .collect()
            });
            assert_eq!(
                got.iter().filter(|(_, made)| *made).count(),
                1,
                "round {round}"
            );
            assert!(
                got.iter().all(|(k, _)| *k == got[0].0),
                "round {round}: {got:?}"
            );
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(left.len(), 1, "round {round}: only the key file is left");
        }
    }

    #[test]
    fn a_symlink_or_a_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.key");
        key_file(&real, true).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = key_file(&link, true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = key_file(&real, false).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }
}
