//! Secrets at rest: webhook signing secrets, hook signing secrets and hook Authorization
//! headers are sealed with AES-256-GCM before a store adapter writes them, and opened
//! when it reads them, so the engine and the domain only ever hold plain values in
//! memory, and a copy of the database file or table holds none.
//!
//! One key seals (`PULSE_ENCRYPTION_KEY`: the base64 of 32 random bytes; `pulse secrets
//! new-key` makes one); older keys may still open (`PULSE_ENCRYPTION_OLD_KEYS`, comma
//! separated), which is how a key is rotated: set the new key, move the old one to the
//! old keys, and every value is sealed again with the new key when it is next read (or
//! all at once with `pulse secrets reseal`), after which the old key can go. Values
//! stored in plain text by an earlier release are sealed the same way on first read.
//!
//! A sealed value is `pulse:v1:<key id>:<base64 of nonce, ciphertext and tag>`. The key id
//! (8 hex digits of a digest of the key) says which key opens it; the associated data is
//! the record and field it belongs to, so a sealed value copied to another record does
//! not open.

mod key_file;

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::aead::{AES_256_GCM, Aad, NONCE_LEN, Nonce, RandomizedNonceKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

use crate::domain::{Hook, Secret, Unreadable, Webhook};
use crate::error::StoreError;

pub use key_file::{KeyFileError, key_file};

/// The start of every sealed value.
pub const SEALED_PREFIX: &str = "pulse:v1:";

/// Why a secret could not be sealed or opened. Never carries the secret or a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// No key to seal with.
    #[error(
        "secrets are encrypted at rest and PULSE_ENCRYPTION_KEY is not set: give it the key this deployment uses (`pulse secrets new-key` makes a new one)"
    )]
    NoKey,
    /// The value was sealed with a key that is not configured.
    #[error(
        "a stored secret was encrypted with key {0}, which is neither PULSE_ENCRYPTION_KEY nor among PULSE_ENCRYPTION_OLD_KEYS: configure that key"
    )]
    UnknownKey(String),
    /// The value does not open with its key: damaged, or moved from another record.
    #[error(
        "a stored secret does not decrypt with key {0}: it is damaged or belongs to another record"
    )]
    Damaged(String),
}

impl From<SealError> for StoreError {
    fn from(e: SealError) -> Self {
        StoreError::Secret(e.to_string())
    }
}

/// A key given in configuration is not a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}: give the base64 of 32 random bytes (`pulse secrets new-key` makes one)")]
pub struct BadKey(String);

struct Key {
    id: String,
    key: RandomizedNonceKey,
}

impl Key {
    fn parse(text: &str) -> Result<Self, BadKey> {
        let bytes = BASE64
            .decode(text.trim())
            .map_err(|_| BadKey("the key is not base64".to_owned()))?;
        if bytes.len() != 32 {
            return Err(BadKey(format!("the key is {} bytes long", bytes.len())));
        }
        let digest = Sha256::new()
            .chain_update(b"pulse encryption key id\0")
            .chain_update(&bytes)
            .finalize();
        let key = RandomizedNonceKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| BadKey("the key was refused by AES-256-GCM".to_owned()))?;
        Ok(Self {
            id: hex::encode(&digest[..4]),
            key,
        })
    }
}

/// Whether an opened value is stored as it should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Sealed with the current key.
    Current,
    /// Plain text, or sealed with an old key: seal it again when it can be written.
    Stale,
}

/// The keys of a deployment. Cheap to clone; `Debug` shows key ids only.
#[derive(Clone, Default)]
pub struct EncryptionKeys(Arc<Vec<Key>>);

impl fmt::Debug for EncryptionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|k| &k.id))
            .finish()
    }
}

impl EncryptionKeys {
    /// `current` seals and opens; each of `old` (comma separated) only opens.
    pub fn parse(current: &str, old: Option<&str>) -> Result<Self, BadKey> {
        let mut keys = vec![Key::parse(current)?];
        for k in old
            .unwrap_or_default()
            .split(',')
            .filter(|k| !k.trim().is_empty())
        {
            keys.push(Key::parse(k)?);
        }
        Ok(Self(Arc::new(keys)))
    }

    /// No key: plain values are read as they are, and nothing can be sealed.
    pub fn none() -> Self {
        Self::default()
    }

    /// A new random key, as configuration takes it.
    ///
    /// # Panics
    ///
    /// If the operating system's random number generator fails.
    pub fn new_key() -> String {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        BASE64.encode(bytes)
    }

    /// The ids of the keys, the one that seals first.
    pub fn ids(&self) -> Vec<&str> {
        self.0.iter().map(|k| k.id.as_str()).collect()
    }

    /// The id of the key that seals, if there is one.
    pub fn current_id(&self) -> Option<&str> {
        self.0.first().map(|k| k.id.as_str())
    }

    /// Seals `plain` for `context` (the record and field it belongs to).
    pub fn seal(&self, plain: &str, context: &str) -> Result<String, SealError> {
        let key = self.0.first().ok_or(SealError::NoKey)?;
        let mut data = plain.as_bytes().to_vec();
        let nonce = key
            .key
            .seal_in_place_append_tag(Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| SealError::Damaged(key.id.clone()))?;
        let mut out = nonce.as_ref().to_vec();
        out.extend_from_slice(&data);
        Ok(format!("{SEALED_PREFIX}{}:{}", key.id, BASE64.encode(out)))
    }

    /// Opens a stored value for `context`: a sealed one with its key, a plain one (from an
    /// earlier release) as it is. Says whether it should be sealed again.
    pub fn open(&self, stored: &str, context: &str) -> Result<(String, Stored), SealError> {
        let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok((stored.to_owned(), Stored::Stale));
        };
        let (id, body) = rest
            .split_once(':')
            .ok_or_else(|| SealError::Damaged("?".to_owned()))?;
        let (position, key) = self
            .0
            .iter()
            .enumerate()
            .find(|(_, k)| k.id == id)
            .ok_or_else(|| SealError::UnknownKey(id.to_owned()))?;
        let damaged = || SealError::Damaged(id.to_owned());
        let bytes = BASE64.decode(body).map_err(|_| damaged())?;
        if bytes.len() < NONCE_LEN {
            return Err(damaged());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| damaged())?;
        let mut data = sealed.to_vec();
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| damaged())?;
        let plain = String::from_utf8(plain.to_vec()).map_err(|_| damaged())?;
        let state = if position == 0 {
            Stored::Current
        } else {
            Stored::Stale
        };
        Ok((plain, state))
    }

    /// Seals `secret`; with `keep_sealed` (a record read unreadable), a value still
    /// sealed as it was read is kept as it is.
    fn seal_secret(
        &self,
        secret: &mut Secret,
        context: &str,
        keep_sealed: bool,
    ) -> Result<(), SealError> {
        if keep_sealed && secret.expose().starts_with(SEALED_PREFIX) {
            return Ok(());
        }
        *secret = Secret::new(self.seal(secret.expose(), context)?);
        Ok(())
    }

    fn open_secret(&self, secret: &mut Secret, context: &str) -> Result<Stored, SealError> {
        let (plain, state) = self.open(secret.expose(), context)?;
        *secret = Secret::new(plain);
        Ok(state)
    }

    /// The webhook as stored: its secrets sealed (unreadable ones are stored as they
    /// were read, still sealed).
    pub fn seal_webhook(&self, webhook: &Webhook) -> Result<Webhook, SealError> {
        let mut stored = webhook.clone();
        let keep = webhook.unreadable.is_some();
        let context = format!("webhook:{}", webhook.id);
        for s in &mut stored.secrets {
            self.seal_secret(&mut s.secret, &context, keep)?;
        }
        Ok(stored)
    }

    /// Opens a stored webhook's secrets; `Stale` if any should be sealed again.
    pub fn open_webhook(&self, webhook: &mut Webhook) -> Result<Stored, SealError> {
        let context = format!("webhook:{}", webhook.id);
        let mut state = Stored::Current;
        for s in &mut webhook.secrets {
            if self.open_secret(&mut s.secret, &context)? == Stored::Stale {
                state = Stored::Stale;
            }
        }
        Ok(state)
    }

    /// The hook as stored: its signing secret and Authorization header sealed
    /// (unreadable ones are stored as they were read, still sealed).
    pub fn seal_hook(&self, hook: &Hook) -> Result<Hook, SealError> {
        let mut stored = hook.clone();
        let keep = hook.unreadable.is_some();
        self.seal_secret(
            &mut stored.secret,
            &format!("hook:{}:secret", hook.id),
            keep,
        )?;
        if let Some(auth) = &mut stored.auth_header {
            self.seal_secret(auth, &format!("hook:{}:authorization", hook.id), keep)?;
        }
        Ok(stored)
    }

    /// The tool as stored: an MCP server's header values sealed.
    pub fn seal_tool(&self, tool: &crate::domain::Tool) -> Result<crate::domain::Tool, SealError> {
        let mut stored = tool.clone();
        if let crate::domain::ToolKind::Mcp(server) = &mut stored.kind {
            if server.unreadable.is_some() {
                // Read unopened: its values are still sealed as they were read.
                return Ok(stored);
            }
            for h in &mut server.headers {
                let context = format!("tool:{}:header:{}", tool.name, h.name.to_ascii_lowercase());
                self.seal_secret(&mut h.value, &context, false)?;
            }
        }
        Ok(stored)
    }

    /// Opens a stored tool's header values. One no configured key opens is kept sealed
    /// and the server marked unreadable (it is not called, and says why); never fails.
    pub fn open_tool(&self, tool: &mut crate::domain::Tool) {
        let name = tool.name.clone();
        if let crate::domain::ToolKind::Mcp(server) = &mut tool.kind {
            let mut opened = server.headers.clone();
            for h in &mut opened {
                let context = format!("tool:{name}:header:{}", h.name.to_ascii_lowercase());
                if let Err(e) = self.open_secret(&mut h.value, &context) {
                    server.unreadable = Some(format!(
                        "the headers of MCP server {name} cannot be read ({e}); add it again with its headers"
                    ));
                    return;
                }
            }
            server.headers = opened;
        }
    }

    /// Opens a stored hook's secrets; `Stale` if any should be sealed again.
    pub fn open_hook(&self, hook: &mut Hook) -> Result<Stored, SealError> {
        let mut state = self.open_secret(&mut hook.secret, &format!("hook:{}:secret", hook.id))?;
        if let Some(auth) = &mut hook.auth_header
            && self.open_secret(auth, &format!("hook:{}:authorization", hook.id))? == Stored::Stale
        {
            state = Stored::Stale;
        }
        Ok(state)
    }
}

/// A record whose secrets are sealed at rest: what the store adapters read and write
/// through [`EncryptionKeys`].
pub trait SealedRecord: Sized + Clone {
    /// The record as stored.
    fn sealed(&self, keys: &EncryptionKeys) -> Result<Self, SealError>;
    /// Opens a stored record's secrets; `Stale` if any should be sealed again.
    fn open(&mut self, keys: &EncryptionKeys) -> Result<Stored, SealError>;
    /// Marks it as read with secrets no configured key opens.
    fn mark_unreadable(&mut self, why: Unreadable);
}

/// Opens a stored record's secrets. One that no configured key opens is still read — as
/// stored, its secrets sealed, marked [`Unreadable`] — so it can be listed, disabled,
/// deleted or given a new secret when its key is lost; it is never `Stale`.
pub fn open_or_mark<T: SealedRecord>(keys: &EncryptionKeys, stored: T) -> (T, Stored) {
    let mut opened = stored.clone();
    match opened.open(keys) {
        Ok(state) => (opened, state),
        Err(e) => {
            let mut kept = stored;
            kept.mark_unreadable(match e {
                SealError::Damaged(key_id) => Unreadable {
                    key_id,
                    damaged: true,
                },
                SealError::UnknownKey(key_id) => Unreadable {
                    key_id,
                    damaged: false,
                },
                SealError::NoKey => Unreadable {
                    key_id: "?".to_owned(),
                    damaged: false,
                },
            });
            (kept, Stored::Current)
        }
    }
}

impl SealedRecord for Webhook {
    fn sealed(&self, keys: &EncryptionKeys) -> Result<Self, SealError> {
        keys.seal_webhook(self)
    }
    fn open(&mut self, keys: &EncryptionKeys) -> Result<Stored, SealError> {
        keys.open_webhook(self)
    }
    fn mark_unreadable(&mut self, why: Unreadable) {
        self.unreadable = Some(why);
    }
}

impl SealedRecord for Hook {
    fn sealed(&self, keys: &EncryptionKeys) -> Result<Self, SealError> {
        keys.seal_hook(self)
    }
    fn open(&mut self, keys: &EncryptionKeys) -> Result<Stored, SealError> {
        keys.open_hook(self)
    }
    fn mark_unreadable(&mut self, why: Unreadable) {
        self.unreadable = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mcp_servers_headers_are_sealed_and_one_no_key_opens_is_marked_not_called() {
        use crate::domain::{McpHeader, McpServer, Tool, ToolName};
        let keys = EncryptionKeys::parse(&EncryptionKeys::new_key(), None).unwrap();
        let server = McpServer::new(
            "https://mcp.example.com/mcp",
            vec![McpHeader::parse("Authorization: Bearer s3cret").unwrap()],
            Vec::new(),
            McpServer::DEFAULT_TIMEOUT,
        )
        .unwrap();
        let tool = Tool::mcp(
            ToolName::parse("cal").unwrap(),
            server,
            jiff::Timestamp::UNIX_EPOCH,
        );
        let stored = keys.seal_tool(&tool).unwrap();
        let doc = serde_json::to_string(&stored).unwrap();
        assert!(
            !doc.contains("s3cret") && doc.contains(SEALED_PREFIX),
            "{doc}"
        );
        let mut read = stored.clone();
        keys.open_tool(&mut read);
        assert_eq!(read, tool);
        // Another deployment's key: kept sealed, marked, never sent.
        let other = EncryptionKeys::parse(&EncryptionKeys::new_key(), None).unwrap();
        let mut lost = stored.clone();
        other.open_tool(&mut lost);
        let m = lost.mcp_server().unwrap();
        assert!(
            m.unreadable
                .as_deref()
                .is_some_and(|w| w.contains("add it again"))
        );
        assert!(m.headers[0].value.expose().starts_with(SEALED_PREFIX));
        assert_eq!(
            other.seal_tool(&lost).unwrap(),
            lost,
            "written back as it was read"
        );
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_its_context() {
        let k1 = EncryptionKeys::new_key();
        let k2 = EncryptionKeys::new_key();
        let keys = EncryptionKeys::parse(&k1, None).unwrap();
        let sealed = keys.seal("whsec_topsecret", "webhook:wh_1").unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX), "{sealed}");
        assert!(!sealed.contains("topsecret"));
        assert_ne!(
            sealed,
            keys.seal("whsec_topsecret", "webhook:wh_1").unwrap(),
            "a fresh nonce each time"
        );
        assert_eq!(
            keys.open(&sealed, "webhook:wh_1").unwrap(),
            ("whsec_topsecret".to_owned(), Stored::Current)
        );
        assert!(matches!(
            keys.open(&sealed, "webhook:wh_2"),
            Err(SealError::Damaged(_))
        ));
        let other = EncryptionKeys::parse(&k2, None).unwrap();
        assert!(matches!(
            other.open(&sealed, "webhook:wh_1"),
            Err(SealError::UnknownKey(_))
        ));
        // Rotation: the new key seals; the old one still opens, and says so.
        let rotated = EncryptionKeys::parse(&k2, Some(&k1)).unwrap();
        assert_eq!(
            rotated.open(&sealed, "webhook:wh_1").unwrap(),
            ("whsec_topsecret".to_owned(), Stored::Stale)
        );
        assert_ne!(rotated.current_id(), keys.current_id());
        // Plain text from an earlier release reads as it is, marked for sealing.
        assert_eq!(
            keys.open("whsec_plain", "x").unwrap(),
            ("whsec_plain".to_owned(), Stored::Stale)
        );
        assert_eq!(EncryptionKeys::none().seal("x", "y"), Err(SealError::NoKey));
        assert!(!format!("{rotated:?}").contains(&k1));
    }

    #[test]
    fn a_key_must_be_32_bytes_of_base64() {
        assert!(EncryptionKeys::parse("not base64!", None).is_err());
        assert!(EncryptionKeys::parse(&BASE64.encode([1u8; 16]), None).is_err());
        assert!(EncryptionKeys::parse(&EncryptionKeys::new_key(), Some("bad")).is_err());
    }
}
