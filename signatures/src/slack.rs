//! Slack's request signatures: `X-Slack-Signature: v0=<hex>`, the HMAC-SHA256 with the
//! app's signing secret of `v0:<X-Slack-Request-Timestamp>:<raw body>`, the timestamp
//! within [`TOLERANCE_SECS`](crate::TOLERANCE_SECS) of the receiver's clock (a replay of
//! an older request is refused).

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

use crate::inbound::{VerifyError, check_fresh, required_header, timestamp_header};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The header carrying the signed timestamp (unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// Verifies a request Slack signed with `secret`; its timestamp.
///
/// # Errors
///
/// In check order: no secret, a missing or malformed `X-Slack-Signature` (`v0=` and 64 hex
/// digits) or `X-Slack-Request-Timestamp` (unix seconds), a timestamp more than
/// [`TOLERANCE_SECS`](crate::TOLERANCE_SECS) from `now_unix`, or
/// [`VerifyError::Mismatch`].
pub fn verify_slack(
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    now_unix: i64,
) -> Result<i64, VerifyError> {
    if secret.is_empty() {
        return Err(VerifyError::NoSecrets);
    }
    let sent = required_header(headers, SIGNATURE_HEADER)?;
    let (ts_text, timestamp) = timestamp_header(headers, TIMESTAMP_HEADER)?;
    let hex_part = sent
        .strip_prefix("v0=")
        .filter(|h| h.len() == 64)
        .ok_or_else(|| VerifyError::MalformedHeader {
            header: SIGNATURE_HEADER,
            reason: "expected v0= and 64 hex digits".to_owned(),
        })?;
    let mut signature = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut signature).map_err(|_| VerifyError::MalformedHeader {
        header: SIGNATURE_HEADER,
        reason: "the signature is not hex".to_owned(),
    })?;
    check_fresh(TIMESTAMP_HEADER, timestamp, now_unix)?;
    // verify_slice compares in constant time.
    mac(secret, ts_text, body)
        .verify_slice(&signature)
        .map_err(|_| VerifyError::Mismatch)?;
    Ok(timestamp)
}

/// The headers Slack would send with `body` at `timestamp`, signed with `secret`: for
/// tests and the demo.
pub fn sign_slack(secret: &str, timestamp: i64, body: &[u8]) -> HeaderMap {
    let ts = timestamp.to_string();
    let signature = hex::encode(mac(secret, &ts, body).finalize().into_bytes());
    let mut headers = HeaderMap::new();
    for (name, value) in [
        (SIGNATURE_HEADER, format!("v0={signature}")),
        (TIMESTAMP_HEADER, ts),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap_or_else(|_| unreachable!("ASCII")),
        );
    }
    headers
}
