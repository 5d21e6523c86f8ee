//! Verifying HMAC-SHA256 signed webhooks from external systems.
//!
//! Every scheme signs the raw body bytes, so the caller must pass the body exactly as it
//! arrived (before any JSON parsing). Checks run in a fixed order — headers present and
//! well formed, then the timestamp within [`TOLERANCE_SECS`], then the signature — so
//! that the cheap, informative errors come first and the MAC is only computed for
//! requests that could be valid.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;

mod headers;
mod sign;

use headers::malformed;
pub use headers::{
    StripeHeader, parse_hex_signature, parse_standard_signatures, parse_stripe_header,
    parse_timestamp,
};
pub(crate) use headers::{check_fresh, header_str, required_header, timestamp_header};
pub use sign::{generate_secret, sign, standard_signature};

type HmacSha256 = Hmac<Sha256>;

/// How far a signed timestamp may be from the receiver's clock, either way, in seconds
/// (inclusive: a skew of exactly 300 s is accepted).
pub const TOLERANCE_SECS: i64 = 300;

/// The longest header value the parsers look at, in bytes. Longer values are rejected
/// before any parsing, so a hostile sender cannot make us decode megabytes of hex.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

/// The prefix of generated secrets and of Standard Webhooks secrets.
pub const SECRET_PREFIX: &str = "whsec_";

/// Length of an HMAC-SHA256 tag in bytes.
const MAC_LEN: usize = 32;

// Header names as a sender writes them (used in error messages). Lookups through
// `HeaderMap::get(&str)` are case-insensitive, so these work for any casing on the wire.
const PULSE_TIMESTAMP: &str = "X-Pulse-Timestamp";
const PULSE_SIGNATURE: &str = "X-Pulse-Signature";
const PULSE_DELIVERY: &str = "X-Pulse-Delivery";
const STANDARD_ID: &str = "webhook-id";
const STANDARD_TIMESTAMP: &str = "webhook-timestamp";
const STANDARD_SIGNATURE: &str = "webhook-signature";
const GITHUB_SIGNATURE: &str = "X-Hub-Signature-256";
const GITHUB_EVENT: &str = "X-GitHub-Event";
const GITHUB_DELIVERY: &str = "X-GitHub-Delivery";
const STRIPE_SIGNATURE: &str = "Stripe-Signature";

/// A webhook signature scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Pulse's own: `X-Pulse-Timestamp` and `X-Pulse-Signature: sha256=<hex>` over
    /// `{delivery}.{timestamp}.{body}` when an `X-Pulse-Delivery` id is sent, else over
    /// `{timestamp}.{body}`.
    Pulse,
    /// Standard Webhooks (<https://www.standardwebhooks.com>): `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature: v1,<base64>` over
    /// `{id}.{timestamp}.{body}`.
    Standard,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body. There is no timestamp
    /// and the delivery and event headers are not signed, so the body itself is the
    /// replay guard (see [`Verified::replay_key`]).
    Github,
    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>` over `{t}.{body}`.
    Stripe,
}

impl Scheme {
    /// Every scheme, in the order they are documented.
    pub const ALL: [Scheme; 4] = [
        Scheme::Pulse,
        Scheme::Standard,
        Scheme::Github,
        Scheme::Stripe,
    ];

    /// The scheme's name as written in configuration: `pulse`, `standard`, `github` or
    /// `stripe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Pulse => "pulse",
            Scheme::Standard => "standard",
            Scheme::Github => "github",
            Scheme::Stripe => "stripe",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error from parsing a [`Scheme`] name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown signature scheme {0:?}: expected one of pulse, standard, github, stripe")]
pub struct UnknownScheme(pub String);

impl FromStr for Scheme {
    type Err = UnknownScheme;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scheme::ALL
            .into_iter()
            .find(|scheme| scheme.as_str() == s)
            .ok_or_else(|| UnknownScheme(s.to_owned()))
    }
}

/// What a verified request told us besides "it is authentic".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The sender's id for this delivery, for de-duplicating retries (`X-Pulse-Delivery`,
    /// `webhook-id`, `X-GitHub-Delivery`, or the Stripe event's `id`).
    pub delivery_id: Option<String>,
    /// The signed timestamp (unix seconds), for schemes that have one.
    pub timestamp: Option<i64>,
    /// An event type derived from the request, for schemes that say one
    /// (`GITHUB_PUSH`, `STRIPE_PAYMENT_INTENT_SUCCEEDED`).
    pub event_type: Option<String>,
    /// Which of the configured secrets matched (for key rotation: once the old secret
    /// stops matching, it can be removed).
    pub secret_index: usize,
    /// What identifies this request among all the sender could make, taken only from
    /// what the signature covers, so a replay is recognised whatever its unsigned headers
    /// say: the sender's delivery id where it is signed (`webhook-id`, a `pulse`
    /// `X-Pulse-Delivery`, a Stripe event's `id`), else `sha256:` and the hex SHA-256 of
    /// the signed content (timestamp and body; for GitHub, the body).
    pub replay_key: String,
}

/// The [`Verified::replay_key`] of signed content that names no signed delivery id.
fn content_key(prefix: &[u8], body: &[u8]) -> String {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(prefix);
    h.update(body);
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Why a request was not accepted. Messages are safe to return to the sender: they never
/// contain a secret or the expected signature.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A required header is absent.
    #[error("the {0} header is missing: a signed request must carry it")]
    MissingHeader(&'static str),
    /// A header is present but cannot be parsed.
    #[error("the {header} header is malformed: {reason}")]
    MalformedHeader {
        /// The header's name.
        header: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The signed timestamp is too far from the receiver's clock.
    #[error(
        "the {header} timestamp is {} (at most {TOLERANCE_SECS} s either way is accepted): \
         sign each request when sending it, and check the sender's clock",
        describe_skew(*.skew_secs)
    )]
    StaleTimestamp {
        /// The header carrying the timestamp.
        header: &'static str,
        /// Receiver's clock minus the timestamp: positive when the request is old,
        /// negative when it claims to come from the future.
        skew_secs: i64,
    },
    /// No configured secret produces the signature sent.
    #[error(
        "the signature does not match: sign the raw body bytes exactly as sent, \
         with the secret currently configured for this endpoint"
    )]
    Mismatch,
    /// The endpoint has no secret configured, so nothing can be verified.
    #[error(
        "no signing secret is configured for this endpoint: configure one before accepting requests"
    )]
    NoSecrets,
    /// A configured secret cannot be used as a key.
    #[error("a configured signing secret is unusable: {0}")]
    BadSecret(String),
}

fn describe_skew(skew_secs: i64) -> String {
    if skew_secs >= 0 {
        format!("{skew_secs} s old")
    } else {
        format!("{} s in the future", skew_secs.unsigned_abs())
    }
}

/// The HMAC key bytes of a secret under a scheme: the secret's own bytes, lent, or the
/// key its base64 decodes to.
fn key_bytes(scheme: Scheme, secret: &str, index: usize) -> Result<Cow<'_, [u8]>, VerifyError> {
    let key = match scheme {
        // Standard Webhooks secrets are base64 keys, optionally prefixed with `whsec_`.
        Scheme::Standard => {
            let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
            let decoded = BASE64.decode(encoded).map_err(|_| {
                VerifyError::BadSecret(format!(
                    "secret #{index} is not base64 (after an optional {SECRET_PREFIX} prefix), \
                     as the standard scheme requires"
                ))
            })?;
            Cow::Owned(decoded)
        }
        // GitHub and Stripe use the secret's text as the key, and so does Pulse.
        Scheme::Pulse | Scheme::Github | Scheme::Stripe => Cow::Borrowed(secret.as_bytes()),
    };
    // An empty key would let anyone sign: refuse it rather than accept forgeries.
    if key.is_empty() {
        return Err(VerifyError::BadSecret(format!("secret #{index} is empty")));
    }
    Ok(key)
}

fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC hashes long keys and pads short ones, so any length is accepted.
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Verifies a signed webhook request.
///
/// `secrets` holds every currently valid secret (several during key rotation); the first
/// that matches wins and its index is returned in [`Verified::secret_index`]. `body` must
/// be the raw bytes as received. `now_unix` is the receiver's clock in unix seconds.
///
/// # Errors
///
/// [`VerifyError::NoSecrets`] or [`VerifyError::BadSecret`] when the configuration cannot
/// verify anything; otherwise, in check order, a missing or malformed header, a stale
/// timestamp, or [`VerifyError::Mismatch`].
pub fn verify(
    scheme: Scheme,
    secrets: &[&str],
    headers: &HeaderMap,
    body: &[u8],
    now_unix: i64,
) -> Result<Verified, VerifyError> {
    // Configuration errors first: they are the operator's to fix, whatever the request.
    if secrets.is_empty() {
        return Err(VerifyError::NoSecrets);
    }
    let keys = secrets
        .iter()
        .enumerate()
        .map(|(index, secret)| key_bytes(scheme, secret, index))
        .collect::<Result<Vec<_>, _>>()?;

    let Signed {
        prefix,
        tags,
        mut verified,
    } = match scheme {
        Scheme::Pulse => read_pulse(headers, now_unix)?,
        Scheme::Standard => read_standard(headers, now_unix)?,
        Scheme::Github => read_github(headers)?,
        Scheme::Stripe => read_stripe(headers, now_unix)?,
    };

    let secret_index = keys
        .iter()
        .position(|key| {
            let base = mac(key, &[prefix.as_bytes(), body]);
            // Constant-time comparison; a tag of the wrong length is a plain mismatch.
            tags.iter()
                .any(|tag| base.clone().verify_slice(tag).is_ok())
        })
        .ok_or(VerifyError::Mismatch)?;
    verified.secret_index = secret_index;

    if scheme == Scheme::Stripe {
        // Only an authenticated body is parsed, and only for these two fields.
        let (delivery_id, event_type) = stripe_body_fields(body);
        verified.replay_key = delivery_id.clone().unwrap_or_default();
        verified.delivery_id = delivery_id;
        verified.event_type = event_type;
    }
    if verified.replay_key.is_empty() {
        verified.replay_key = content_key(prefix.as_bytes(), body);
    }
    Ok(verified)
}

/// What a scheme's headers give: the signed prefix (what comes before the body), the
/// candidate tags, and what the request says about itself.
struct Signed {
    prefix: String,
    tags: Vec<Vec<u8>>,
    verified: Verified,
}

fn unverified(delivery_id: Option<String>, timestamp: Option<i64>) -> Verified {
    Verified {
        replay_key: String::new(),
        delivery_id,
        timestamp,
        event_type: None,
        secret_index: 0,
    }
}

fn read_pulse(headers: &HeaderMap, now_unix: i64) -> Result<Signed, VerifyError> {
    let (ts_text, timestamp) = timestamp_header(headers, PULSE_TIMESTAMP)?;
    let tag = parse_hex_signature(required_header(headers, PULSE_SIGNATURE)?)
        .map_err(malformed(PULSE_SIGNATURE))?;
    let delivery_id = header_str(headers, PULSE_DELIVERY)?
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    check_fresh(PULSE_TIMESTAMP, timestamp, now_unix)?;
    // The delivery id is signed with the rest, so it cannot be changed or dropped to pass
    // a captured request off as a new delivery.
    let prefix = match &delivery_id {
        Some(id) => [id.as_str(), ".", ts_text, "."].concat(),
        None => [ts_text, "."].concat(),
    };
    let mut verified = unverified(delivery_id.clone(), Some(timestamp));
    verified.replay_key = delivery_id.unwrap_or_default();
    Ok(Signed {
        prefix,
        tags: vec![tag],
        verified,
    })
}

fn read_standard(headers: &HeaderMap, now_unix: i64) -> Result<Signed, VerifyError> {
    let id = required_header(headers, STANDARD_ID)?;
    if id.is_empty() {
        return Err(malformed(STANDARD_ID)("it is empty".to_owned()));
    }
    let (ts_text, timestamp) = timestamp_header(headers, STANDARD_TIMESTAMP)?;
    let tags = parse_standard_signatures(required_header(headers, STANDARD_SIGNATURE)?)
        .map_err(malformed(STANDARD_SIGNATURE))?;
    check_fresh(STANDARD_TIMESTAMP, timestamp, now_unix)?;
    let mut verified = unverified(Some(id.to_owned()), Some(timestamp));
    verified.replay_key = id.to_owned();
    Ok(Signed {
        prefix: [id, ".", ts_text, "."].concat(),
        tags,
        verified,
    })
}

fn read_github(headers: &HeaderMap) -> Result<Signed, VerifyError> {
    let tag = parse_hex_signature(required_header(headers, GITHUB_SIGNATURE)?)
        .map_err(malformed(GITHUB_SIGNATURE))?;
    let event = required_header(headers, GITHUB_EVENT)?;
    if event.is_empty() {
        return Err(malformed(GITHUB_EVENT)("it is empty".to_owned()));
    }
    let delivery = required_header(headers, GITHUB_DELIVERY)?;
    if delivery.is_empty() {
        return Err(malformed(GITHUB_DELIVERY)("it is empty".to_owned()));
    }
    let mut verified = unverified(Some(delivery.to_owned()), None);
    verified.event_type = Some(event_type_name("GITHUB_", event));
    Ok(Signed {
        prefix: String::new(),
        tags: vec![tag],
        verified,
    })
}

fn read_stripe(headers: &HeaderMap, now_unix: i64) -> Result<Signed, VerifyError> {
    let header = parse_stripe_header(required_header(headers, STRIPE_SIGNATURE)?)
        .map_err(malformed(STRIPE_SIGNATURE))?;
    check_fresh(STRIPE_SIGNATURE, header.timestamp, now_unix)?;
    // Stripe's own libraries rebuild the signed content from the parsed integer (so
    // `t=007` signs `7.`); do the same. Its delivery id and event type are in the body,
    // read once the body is authenticated.
    Ok(Signed {
        prefix: format!("{}.", header.timestamp),
        tags: header.v1,
        verified: unverified(None, Some(header.timestamp)),
    })
}

/// `prefix` + the name upper-cased, with anything outside `[A-Z0-9_]` mapped to `_`, so the
/// result is always a valid Pulse event type.
fn event_type_name(prefix: &str, name: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + name.len());
    out.push_str(prefix);
    out.extend(name.chars().map(|c| {
        let c = c.to_ascii_uppercase();
        if c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    out
}

/// The Stripe event's `id` and `type`, when the body is a JSON object that has them as
/// strings.
fn stripe_body_fields(body: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(body)
    else {
        return (None, None);
    };
    let id = object.get("id").and_then(|v| v.as_str()).map(str::to_owned);
    let event_type = object
        .get("type")
        .and_then(|v| v.as_str())
        .map(|t| event_type_name("STRIPE_", t));
    (id, event_type)
}
