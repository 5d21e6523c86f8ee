//! The keys of a database's stored secrets, and the check that they open them.
//!
//! Without `PULSE_ENCRYPTION_KEY` (or `PULSE_ENCRYPTION_KEY_FILE`), the key is the file
//! `<db>.key` beside the database, made with a new random key the first time — but
//! never while the database holds secrets sealed with some other key: a new key would
//! leave the database with secrets under two keys, one of them lost. Then no key is
//! used, and [`KeysMissing`] says which key ids the database needs and where Pulse
//! looked; `pulse serve` refuses to start with it, and the CLI still works (listings show
//! the secrets as unreadable; `webhooks rotate` and `hooks rotate` give new ones).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::{Db, sqlite_err};
use crate::error::StoreError;
use crate::sealing::{EncryptionKeys, SEALED_PREFIX};

/// The database holds sealed secrets and no configured key opens any of them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct KeysMissing {
    /// The key ids the stored secrets are sealed with, and how many records each seals.
    pub needed: BTreeMap<String, usize>,
    /// Where Pulse looked for a key, and what it found.
    pub looked: Vec<String>,
}

impl fmt::Display for KeysMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needed: Vec<String> = self
            .needed
            .iter()
            .map(|(id, n)| format!("{id} ({n} {})", if *n == 1 { "record" } else { "records" }))
            .collect();
        write!(
            f,
            "the database's stored webhook and hook secrets are encrypted with key {}, and no configured key opens them (looked at: {}). Restore the key file from the database's backup, or set PULSE_ENCRYPTION_KEY (or PULSE_ENCRYPTION_OLD_KEYS) to the key with that id. If the key is lost, give each webhook and hook a new secret with the CLI, which still works (`pulse status` lists them; `pulse webhooks rotate ID`, `pulse hooks rotate ID`), then start again",
            needed.join(", "),
            self.looked.join("; ")
        )
    }
}

/// The key ids the secrets stored at `db` are sealed with, and how many records each
/// seals.
fn sealed_key_ids(db: &Db) -> Result<BTreeMap<String, usize>, StoreError> {
    db.blocking(|conn| {
        let op = sqlite_err("read the stored secrets' key ids");
        let mut stmt = conn
            .prepare("SELECT doc FROM webhooks UNION ALL SELECT doc FROM hooks UNION ALL SELECT doc FROM tools")
            .map_err(&op)?;
        let docs = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(&op)?;
        let mut ids = BTreeMap::new();
        for doc in docs {
            let mut seen: Vec<&str> = Vec::new();
            for (at, _) in doc.match_indices(SEALED_PREFIX) {
                let rest = &doc[at + SEALED_PREFIX.len()..];
                if let Some((id, _)) = rest.split_once(':')
                    && !seen.contains(&id)
                {
                    seen.push(id);
                }
            }
            for id in seen {
                *ids.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
        Ok(ids)
    })
}

/// The keys for the database at `db`: `configured` (from `PULSE_ENCRYPTION_KEY` or
/// `PULSE_ENCRYPTION_KEY_FILE`), else the key file `<db>.key`, made the first time
/// unless the database already holds sealed secrets. `Some(KeysMissing)` beside them when
/// the database holds sealed secrets and none of the keys opens any of them.
pub fn keys_for(
    db: &Db,
    configured: Option<EncryptionKeys>,
) -> Result<(EncryptionKeys, Option<KeysMissing>), StoreError> {
    let sealed = sealed_key_ids(db)?;
    let file = key_path(db.path());
    let (keys, looked) = match configured {
        Some(keys) => {
            let looked = format!(
                "PULSE_ENCRYPTION_KEY or PULSE_ENCRYPTION_KEY_FILE, with PULSE_ENCRYPTION_OLD_KEYS: key {}",
                keys.ids().join(", ")
            );
            (keys, looked)
        }
        None => {
            let exists = std::fs::symlink_metadata(&file).is_ok();
            if !exists && !sealed.is_empty() {
                let looked = vec![
                    "PULSE_ENCRYPTION_KEY and PULSE_ENCRYPTION_KEY_FILE: not set".to_owned(),
                    format!("{}: not found", file.display()),
                ];
                tracing::warn!(file = %file.display(), "the database holds encrypted secrets and there is no key file: no new key is made");
                return Ok((
                    EncryptionKeys::none(),
                    Some(KeysMissing {
                        needed: sealed,
                        looked,
                    }),
                ));
            }
            let keys = key_file(&file)?;
            let looked = format!(
                "PULSE_ENCRYPTION_KEY and PULSE_ENCRYPTION_KEY_FILE: not set; {}: key {}",
                file.display(),
                keys.ids().join(", ")
            );
            (keys, looked)
        }
    };
    let opens_some = sealed.keys().any(|id| keys.ids().contains(&id.as_str()));
    if sealed.is_empty() || opens_some {
        let unknown: Vec<&String> = sealed
            .keys()
            .filter(|id| !keys.ids().contains(&id.as_str()))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "some stored secrets are encrypted with a key that is not configured: `pulse status` lists them");
        }
        return Ok((keys, None));
    }
    Ok((
        keys,
        Some(KeysMissing {
            needed: sealed,
            looked: vec![looked],
        }),
    ))
}

/// `<db>.key`.
fn key_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".key");
    PathBuf::from(p)
}

/// The keys in the key file at `path` (mode 0600, the user's, not a symlink), made
/// with a new random key the first time. Back it up with the database: without it the
/// stored secrets cannot be read.
fn key_file(path: &Path) -> Result<EncryptionKeys, StoreError> {
    let failed = |e: String| {
        StoreError::Secret(format!(
            "{e}; set PULSE_ENCRYPTION_KEY, or restore the file"
        ))
    };
    let (key, made) = crate::sealing::key_file(path, true).map_err(|e| failed(e.to_string()))?;
    if made {
        tracing::info!(file = %path.display(), "made a new encryption key for stored secrets: back it up with the database");
    }
    EncryptionKeys::parse(&key, None).map_err(|e| failed(e.to_string()))
}
