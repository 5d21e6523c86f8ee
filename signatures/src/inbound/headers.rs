//! Reading the signature headers: length caps, timestamps, hex and base64 tags, the
//! Standard Webhooks and Stripe header formats.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::HeaderMap;

use super::{MAC_LEN, MAX_HEADER_LEN, TOLERANCE_SECS, VerifyError};

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
    // Into a fixed array first: `hex::decode` collects through an iterator of results,
    // which cost more than the HMAC it is compared with.
    let mut tag = [0u8; MAC_LEN];
    hex::decode_to_slice(hex_part, &mut tag).map_err(|_| "the signature is not hex".to_owned())?;
    Ok(tag.to_vec())
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

pub(super) fn malformed(header: &'static str) -> impl Fn(String) -> VerifyError {
    move |reason| VerifyError::MalformedHeader { header, reason }
}
