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
    let mut made = false;
    if make {
        match options().write(true).create_new(true).open(path) {
            Ok(mut f) => {
                writeln!(f, "{}", EncryptionKeys::new_key()).map_err(|e| failed(e.to_string()))?;
                made = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(e.to_string())),
        }
    }
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
