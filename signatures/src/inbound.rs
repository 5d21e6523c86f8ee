//! Verifying HMAC-SHA256 signed webhooks from external systems.
//!
//! Every scheme signs the raw body bytes, so the caller must pass the body exactly as it
//! arrived (before any JSON parsing). Checks run in a fixed order — headers present and
//! well formed, then the timestamp within [`TOLERANCE_SECS`], then the signature — so
//! that the cheap, informative errors come first and the MAC is only computed for
//! requests that could be valid.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

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

/// The parsed `Stripe-Signature` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeHeader {
    /// The `t=` timestamp (unix seconds).
    pub timestamp: i64,
    /// Every well-formed `v1=` signature (32 bytes each), in header order.
    pub v1: Vec<Vec<u8>>,
}

// ---------------------------------------------------------------------------------------
// Header parsers. Public because they are the fuzz targets; none may panic on any input.
// ---------------------------------------------------------------------------------------

fn check_len(value: &str) -> Result<(), String> {
    if value.len() > MAX_HEADER_LEN {
        Err(format!(
            "it is {} bytes long; at most {MAX_HEADER_LEN} are accepted",
            value.len()
        ))
    } else {
        Ok(())
    }
}

/// Parses a unix timestamp in seconds: ASCII digits with an optional leading `-`.
///
/// Anything else — spaces, a `+`, a fraction, a value beyond `i64` — is an error, because
/// the timestamp's text is part of the signed content and must be unambiguous.
pub fn parse_timestamp(value: &str) -> Result<i64, String> {
    check_len(value)?;
    let digits = value.strip_prefix('-').unwrap_or(value);
    if digits.is_empty() {
        return Err("expected unix seconds (ASCII digits), got nothing".to_owned());
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected unix seconds as ASCII digits, with no spaces or sign other than a leading '-'".to_owned());
    }
    // Only digits and an optional '-' remain, so the only possible failure is overflow.
    value
        .parse::<i64>()
        .map_err(|_| "the timestamp is out of range".to_owned())
}

/// Parses `sha256=<64 hex digits>` (either case) into the 32-byte tag.
pub fn parse_hex_signature(value: &str) -> Result<Vec<u8>, String> {
    check_len(value)?;
    let hex_part = value
        .strip_prefix("sha256=")
        .ok_or_else(|| "expected it to start with \"sha256=\"".to_owned())?;
    decode_hex_tag(hex_part)
}

fn decode_hex_tag(hex_part: &str) -> Result<Vec<u8>, String> {
    if hex_part.len() != MAC_LEN * 2 {
        return Err(format!(
            "expected {} hex digits for an HMAC-SHA256 signature, got {} characters",
            MAC_LEN * 2,
            hex_part.len()
        ));
    }
    hex::decode(hex_part).map_err(|_| "the signature is not hex".to_owned())
}

/// Parses a Standard Webhooks `webhook-signature` header: space-separated
/// `<version>,<base64>` entries. Returns the decoded `v1` signatures.
///
/// Entries of other versions are ignored (the spec reserves them for future schemes), and
/// so are `v1` entries that are not base64 of 32 bytes, so that one bad entry cannot hide a
/// good one. It is an error when no usable `v1` entry remains.
pub fn parse_standard_signatures(value: &str) -> Result<Vec<Vec<u8>>, String> {
    check_len(value)?;
    let mut v1_entries = 0usize;
    let mut signatures = Vec::new();
    for entry in value.split(' ').filter(|entry| !entry.is_empty()) {
        let Some(("v1", encoded)) = entry.split_once(',') else {
            continue;
        };
        v1_entries += 1;
        if let Ok(bytes) = BASE64.decode(encoded)
            && bytes.len() == MAC_LEN
        {
            signatures.push(bytes);
        }
    }
    match (v1_entries, signatures.is_empty()) {
        (0, _) => Err("no \"v1,<base64>\" entry found".to_owned()),
        (_, true) => Err(format!(
            "no v1 entry is the base64 of a {MAC_LEN}-byte HMAC-SHA256 signature"
        )),
        _ => Ok(signatures),
    }
}

/// Parses a `Stripe-Signature` header: comma-separated `key=value` pairs with exactly one
/// `t=` and at least one usable `v1=` (64 hex digits). Unknown keys (such as `v0`) and
/// `v1` values that are not 64 hex digits are ignored.
pub fn parse_stripe_header(value: &str) -> Result<StripeHeader, String> {
    check_len(value)?;
    let mut timestamp = None;
    let mut v1_entries = 0usize;
    let mut v1 = Vec::new();
    for pair in value.split(',') {
        let Some((key, val)) = pair.split_once('=') else {
            continue;
        };
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err("more than one t= timestamp".to_owned());
                }
                timestamp = Some(parse_timestamp(val).map_err(|reason| format!("t=: {reason}"))?);
            }
            "v1" => {
                v1_entries += 1;
                if let Ok(bytes) = decode_hex_tag(val) {
                    v1.push(bytes);
                }
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or_else(|| "no t=<unix seconds> timestamp".to_owned())?;
    if v1.is_empty() {
        return Err(if v1_entries == 0 {
            "no v1=<hex> signature".to_owned()
        } else {
            format!("no v1= value is {} hex digits", MAC_LEN * 2)
        });
    }
    Ok(StripeHeader { timestamp, v1 })
}

// ---------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------

/// Reads a header as text, capped at [`MAX_HEADER_LEN`]; `None` when absent.
pub(crate) fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<Option<&'a str>, VerifyError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let malformed = |reason: String| VerifyError::MalformedHeader {
        header: name,
        reason,
    };
    if value.len() > MAX_HEADER_LEN {
        return Err(malformed(format!(
            "it is {} bytes long; at most {MAX_HEADER_LEN} are accepted",
            value.len()
        )));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| malformed("it contains characters other than visible ASCII".to_owned()))
}

pub(crate) fn required_header<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<&'a str, VerifyError> {
    header_str(headers, name)?.ok_or(VerifyError::MissingHeader(name))
}

/// Parses a required timestamp header and checks it against the clock.
pub(crate) fn timestamp_header<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<(&'a str, i64), VerifyError> {
    let text = required_header(headers, name)?;
    let timestamp = parse_timestamp(text).map_err(|reason| VerifyError::MalformedHeader {
        header: name,
        reason,
    })?;
    Ok((text, timestamp))
}

pub(crate) fn check_fresh(
    header: &'static str,
    timestamp: i64,
    now_unix: i64,
) -> Result<(), VerifyError> {
    // Saturating: both values come from outside, and i64::MIN - i64::MAX must not panic.
    let skew_secs = now_unix.saturating_sub(timestamp);
    if skew_secs.unsigned_abs() > TOLERANCE_SECS.unsigned_abs() {
        return Err(VerifyError::StaleTimestamp { header, skew_secs });
    }
    Ok(())
}

fn malformed(header: &'static str) -> impl Fn(String) -> VerifyError {
    move |reason| VerifyError::MalformedHeader { header, reason }
}

/// The HMAC key bytes of a secret under a scheme.
fn key_bytes(scheme: Scheme, secret: &str, index: usize) -> Result<Vec<u8>, VerifyError> {
    let key = match scheme {
        // Standard Webhooks secrets are base64 keys, optionally prefixed with `whsec_`.
        Scheme::Standard => {
            let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
            BASE64.decode(encoded).map_err(|_| {
                VerifyError::BadSecret(format!(
                    "secret #{index} is not base64 (after an optional {SECRET_PREFIX} prefix), \
                     as the standard scheme requires"
                ))
            })?
        }
        // GitHub and Stripe use the secret's text as the key, and so does Pulse.
        Scheme::Pulse | Scheme::Github | Scheme::Stripe => secret.as_bytes().to_vec(),
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

    // Each scheme yields the signed prefix (what comes before the body), the candidate
    // tags, and what the request says about itself.
    let (prefix, tags, mut verified) = match scheme {
        Scheme::Pulse => {
            let (ts_text, timestamp) = timestamp_header(headers, PULSE_TIMESTAMP)?;
            let tag = parse_hex_signature(required_header(headers, PULSE_SIGNATURE)?)
                .map_err(malformed(PULSE_SIGNATURE))?;
            let delivery_id = header_str(headers, PULSE_DELIVERY)?
                .filter(|id| !id.is_empty())
                .map(str::to_owned);
            check_fresh(PULSE_TIMESTAMP, timestamp, now_unix)?;
            // The delivery id is signed with the rest, so it cannot be changed or dropped
            // to pass a captured request off as a new delivery.
            let prefix = match &delivery_id {
                Some(id) => format!("{id}.{ts_text}."),
                None => format!("{ts_text}."),
            };
            (
                prefix,
                vec![tag],
                Verified {
                    replay_key: delivery_id.clone().unwrap_or_default(),
                    delivery_id,
                    timestamp: Some(timestamp),
                    event_type: None,
                    secret_index: 0,
                },
            )
        }
        Scheme::Standard => {
            let id = required_header(headers, STANDARD_ID)?;
            if id.is_empty() {
                return Err(malformed(STANDARD_ID)("it is empty".to_owned()));
            }
            let (ts_text, timestamp) = timestamp_header(headers, STANDARD_TIMESTAMP)?;
            let tags = parse_standard_signatures(required_header(headers, STANDARD_SIGNATURE)?)
                .map_err(malformed(STANDARD_SIGNATURE))?;
            check_fresh(STANDARD_TIMESTAMP, timestamp, now_unix)?;
            (
                format!("{id}.{ts_text}."),
                tags,
                Verified {
                    delivery_id: Some(id.to_owned()),
                    timestamp: Some(timestamp),
                    event_type: None,
                    secret_index: 0,
                    replay_key: id.to_owned(),
                },
            )
        }
        Scheme::Github => {
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
            (
                String::new(),
                vec![tag],
                Verified {
                    delivery_id: Some(delivery.to_owned()),
                    timestamp: None,
                    event_type: Some(event_type_name("GITHUB_", event)),
                    secret_index: 0,
                    replay_key: String::new(),
                },
            )
        }
        Scheme::Stripe => {
            let header = parse_stripe_header(required_header(headers, STRIPE_SIGNATURE)?)
                .map_err(malformed(STRIPE_SIGNATURE))?;
            check_fresh(STRIPE_SIGNATURE, header.timestamp, now_unix)?;
            // Stripe's own libraries rebuild the signed content from the parsed integer
            // (so `t=007` signs `7.`); do the same.
            (
                format!("{}.", header.timestamp),
                header.v1,
                Verified {
                    delivery_id: None,
                    timestamp: Some(header.timestamp),
                    event_type: None,
                    secret_index: 0,
                    replay_key: String::new(),
                },
            )
        }
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

// ---------------------------------------------------------------------------------------
// Signing (what a sender does)
// ---------------------------------------------------------------------------------------

fn hmac_tag(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    mac(key, parts).finalize().into_bytes().to_vec()
}

/// The Standard Webhooks signature `v1,<base64>` of `{msg_id}.{timestamp}.{body}`.
///
/// Pulse also signs its outbound hooks with this, so receivers can use any Standard
/// Webhooks library.
///
/// # Errors
///
/// [`VerifyError::BadSecret`] when the secret is not base64 (after an optional `whsec_`
/// prefix) or is empty.
pub fn standard_signature(
    secret: &str,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, VerifyError> {
    let key = key_bytes(Scheme::Standard, secret, 0)?;
    let prefix = format!("{msg_id}.{timestamp}.");
    Ok(format!(
        "v1,{}",
        BASE64.encode(hmac_tag(&key, &[prefix.as_bytes(), body]))
    ))
}

fn header_value(header: &'static str, value: &str) -> Result<HeaderValue, VerifyError> {
    HeaderValue::from_str(value).map_err(|_| VerifyError::MalformedHeader {
        header,
        reason: "it contains characters other than visible ASCII".to_owned(),
    })
}

/// The headers a sender of `scheme` would attach to `body` at `now_unix`.
///
/// `delivery_id` goes into `X-Pulse-Delivery` (and, for `pulse`, into the signed content
/// `{delivery}.{timestamp}.{body}`), `webhook-id` or `X-GitHub-Delivery`; Stripe carries
/// its id in the body, so it is unused there. For GitHub the caller adds
/// `X-GitHub-Event`. Header names are lower case, as HTTP/2 sends them.
///
/// # Errors
///
/// [`VerifyError::BadSecret`] for an unusable secret, [`VerifyError::MalformedHeader`]
/// when `delivery_id` cannot be a header value.
pub fn sign(
    scheme: Scheme,
    secret: &str,
    body: &[u8],
    now_unix: i64,
    delivery_id: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, VerifyError> {
    let key = key_bytes(scheme, secret, 0)?;
    let timestamp = now_unix.to_string();
    // Only the delivery id can fail `value`: digits, hex and base64 are valid header values.
    let value = header_value;
    let headers = match scheme {
        Scheme::Pulse => {
            // An empty delivery id is no delivery id: the header is left out and the
            // signed content is `{timestamp}.{body}`, as `verify` reads it.
            let mut signed: Vec<&[u8]> = Vec::new();
            if !delivery_id.is_empty() {
                signed.extend([delivery_id.as_bytes(), b"."]);
            }
            signed.extend([timestamp.as_bytes(), b".", body]);
            let tag = hmac_tag(&key, &signed);
            let mut headers = vec![
                (
                    HeaderName::from_static("x-pulse-timestamp"),
                    value(PULSE_TIMESTAMP, &timestamp)?,
                ),
                (
                    HeaderName::from_static("x-pulse-signature"),
                    value(PULSE_SIGNATURE, &format!("sha256={}", hex::encode(tag)))?,
                ),
            ];
            if !delivery_id.is_empty() {
                headers.push((
                    HeaderName::from_static("x-pulse-delivery"),
                    value(PULSE_DELIVERY, delivery_id)?,
                ));
            }
            headers
        }
        Scheme::Standard => {
            let signature = standard_signature(secret, delivery_id, now_unix, body)?;
            vec![
                (
                    HeaderName::from_static("webhook-id"),
                    value(STANDARD_ID, delivery_id)?,
                ),
                (
                    HeaderName::from_static("webhook-timestamp"),
                    value(STANDARD_TIMESTAMP, &timestamp)?,
                ),
                (
                    HeaderName::from_static("webhook-signature"),
                    value(STANDARD_SIGNATURE, &signature)?,
                ),
            ]
        }
        Scheme::Github => {
            let tag = hmac_tag(&key, &[body]);
            vec![
                (
                    HeaderName::from_static("x-hub-signature-256"),
                    value(GITHUB_SIGNATURE, &format!("sha256={}", hex::encode(tag)))?,
                ),
                (
                    HeaderName::from_static("x-github-delivery"),
                    value(GITHUB_DELIVERY, delivery_id)?,
                ),
            ]
        }
        Scheme::Stripe => {
            let tag = hmac_tag(&key, &[timestamp.as_bytes(), b".", body]);
            vec![(
                HeaderName::from_static("stripe-signature"),
                value(
                    STRIPE_SIGNATURE,
                    &format!("t={timestamp},v1={}", hex::encode(tag)),
                )?,
            )]
        }
    };
    Ok(headers)
}

/// A new random secret: `whsec_` followed by the base64 of 32 random bytes.
///
/// It is valid for every scheme: Standard Webhooks decodes the base64 part, the others
/// use the whole text as the key.
///
/// # Panics
///
/// If the operating system's random number generator fails, which leaves no safe way to
/// make a secret.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    format!("{SECRET_PREFIX}{}", BASE64.encode(bytes))
}
