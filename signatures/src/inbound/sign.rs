//! Signing: what a sender does (the tests, `pulse webhooks send`, and Pulse's own
//! outbound hooks with the Standard Webhooks scheme).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::Mac;
use http::{HeaderName, HeaderValue};

use super::{
    GITHUB_DELIVERY, GITHUB_SIGNATURE, PULSE_DELIVERY, PULSE_SIGNATURE, PULSE_TIMESTAMP,
    SECRET_PREFIX, STANDARD_ID, STANDARD_SIGNATURE, STANDARD_TIMESTAMP, STRIPE_SIGNATURE, Scheme,
    VerifyError, key_bytes, mac,
};
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
