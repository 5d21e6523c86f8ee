//! Discord interaction signatures (Ed25519).
//!
//! Discord signs `{X-Signature-Timestamp}{body}` with the application's key and sends the
//! signature in `X-Signature-Ed25519`; the application's public key (`DISCORD_PUBLIC_KEY`)
//! verifies it. Discord also sends deliberately bad signatures and expects them refused,
//! so verification must be strict.

use std::fmt;

use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::inbound::{VerifyError, check_fresh, required_header, timestamp_header};

const SIGNATURE_HEADER: &str = "X-Signature-Ed25519";
const TIMESTAMP_HEADER: &str = "X-Signature-Timestamp";

/// Why a `DISCORD_PUBLIC_KEY` cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key does not have 64 characters.
    #[error(
        "DISCORD_PUBLIC_KEY must be 64 hex characters (the application's public key from the \
         Discord developer portal), got {0} characters"
    )]
    WrongLength(usize),
    /// The key has characters that are not hex digits.
    #[error(
        "DISCORD_PUBLIC_KEY must be hex digits only: copy the public key from the Discord developer portal"
    )]
    NotHex,
    /// The bytes are not a usable Ed25519 public key.
    #[error(
        "DISCORD_PUBLIC_KEY is not a valid Ed25519 public key: copy the public key (not the \
         bot token or client secret) from the Discord developer portal"
    )]
    InvalidKey,
}

/// A Discord application's public key, for verifying interactions.
#[derive(Clone, PartialEq, Eq)]
pub struct DiscordKey(VerifyingKey);

impl DiscordKey {
    /// Parses the 64 hex characters shown as the application's public key (surrounding
    /// whitespace, as left by copying into an environment file, is ignored).
    ///
    /// # Errors
    ///
    /// A [`KeyError`] saying what is wrong with the text.
    pub fn from_hex(hex: &str) -> Result<Self, KeyError> {
        let hex = hex.trim();
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError::NotHex);
        }
        if hex.len() != 64 {
            return Err(KeyError::WrongLength(hex.len()));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex, &mut bytes).map_err(|_| KeyError::NotHex)?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::InvalidKey)?;
        // A small-order key would accept forged signatures; verify_strict refuses them
        // anyway, but say so at start-up rather than refusing every request.
        if key.is_weak() {
            return Err(KeyError::InvalidKey);
        }
        Ok(Self(key))
    }

    /// The key as 64 lower-case hex characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.as_bytes())
    }
}

impl fmt::Debug for DiscordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell keys apart in logs; the full point is noise.
        let hex = self.to_hex();
        write!(f, "DiscordKey({}…)", &hex[..8])
    }
}

/// Verifies a Discord interaction request and returns its timestamp.
///
/// # Errors
///
/// In check order: a missing or malformed `X-Signature-Ed25519` (128 hex characters) or
/// `X-Signature-Timestamp` (unix seconds), a timestamp more than
/// [`TOLERANCE_SECS`](crate::TOLERANCE_SECS) from `now_unix`, or
/// [`VerifyError::Mismatch`].
pub fn verify_discord(
    key: &DiscordKey,
    headers: &HeaderMap,
    body: &[u8],
    now_unix: i64,
) -> Result<i64, VerifyError> {
    let signature_hex = required_header(headers, SIGNATURE_HEADER)?;
    let (ts_text, timestamp) = timestamp_header(headers, TIMESTAMP_HEADER)?;
    if signature_hex.len() != 128 {
        return Err(VerifyError::MalformedHeader {
            header: SIGNATURE_HEADER,
            reason: format!(
                "expected 128 hex digits for an Ed25519 signature, got {} characters",
                signature_hex.len()
            ),
        });
    }
    let mut signature = [0u8; 64];
    hex::decode_to_slice(signature_hex, &mut signature).map_err(|_| {
        VerifyError::MalformedHeader {
            header: SIGNATURE_HEADER,
            reason: "the signature is not hex".to_owned(),
        }
    })?;
    check_fresh(TIMESTAMP_HEADER, timestamp, now_unix)?;

    let mut message = Vec::with_capacity(ts_text.len() + body.len());
    message.extend_from_slice(ts_text.as_bytes());
    message.extend_from_slice(body);
    // verify_strict rejects small-order keys and non-canonical signatures, which plain
    // verify would accept.
    key.0
        .verify_strict(&message, &Signature::from_bytes(&signature))
        .map_err(|_| VerifyError::Mismatch)?;
    Ok(timestamp)
}

/// Signs requests as Discord would, for tests, the demo and the benchmark.
#[derive(Clone)]
pub struct DiscordSigner(SigningKey);

impl DiscordSigner {
    /// A signer from a 32-byte Ed25519 seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// The public key as 64 lower-case hex characters, as [`DiscordKey::from_hex`] reads.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.0.verifying_key().as_bytes())
    }

    /// The `X-Signature-Ed25519` and `X-Signature-Timestamp` headers for `body` sent at
    /// `timestamp`.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> Vec<(HeaderName, HeaderValue)> {
        let ts_text = timestamp.to_string();
        let mut message = Vec::with_capacity(ts_text.len() + body.len());
        message.extend_from_slice(ts_text.as_bytes());
        message.extend_from_slice(body);
        let signature = self.0.sign(&message);
        vec![
            (
                HeaderName::from_static("x-signature-ed25519"),
                HeaderValue::from_str(&hex::encode(signature.to_bytes()))
                    .expect("hex is a valid header value"),
            ),
            (
                HeaderName::from_static("x-signature-timestamp"),
                HeaderValue::from(timestamp),
            ),
        ]
    }
}

impl fmt::Debug for DiscordSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("DiscordSigner")
            .field("public_key", &self.public_key_hex())
            .finish()
    }
}
