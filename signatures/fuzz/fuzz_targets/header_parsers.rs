//! Feeds arbitrary text to every header parser, and to `verify` and `verify_discord` with
//! headers built from it. Any panic is a bug: these parsers face the open internet.

#![no_main]

use std::sync::LazyLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use pulse_signatures::inbound::{
    parse_hex_signature, parse_standard_signatures, parse_stripe_header, parse_timestamp,
};
use pulse_signatures::{DiscordKey, DiscordSigner, Scheme, verify, verify_discord};

const NOW: i64 = 1_700_000_000;

// Built once: deriving a key per input would spend most of the run on key generation.
static DISCORD_KEY: LazyLock<DiscordKey> = LazyLock::new(|| {
    DiscordKey::from_hex(&DiscordSigner::from_seed([1; 32]).public_key_hex())
        .expect("a signer's public key parses")
});

// In the order the input's newline-separated fields fill them; the rest is the body.
const HEADERS: [&str; 12] = [
    "x-pulse-timestamp",
    "x-pulse-signature",
    "x-pulse-delivery",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-hub-signature-256",
    "x-github-event",
    "x-github-delivery",
    "stripe-signature",
    "x-signature-ed25519",
    "x-signature-timestamp",
];

fuzz_target!(|data: &[u8]| {
    let mut fields = data.splitn(HEADERS.len() + 1, |&b| b == b'\n');
    let mut headers = HeaderMap::new();
    for name in HEADERS {
        let Some(field) = fields.next() else { break };
        // Lossy, so non-UTF-8 input still reaches the parsers as (non-ASCII) text.
        let text = String::from_utf8_lossy(field);
        let _ = parse_timestamp(&text);
        let _ = parse_hex_signature(&text);
        let _ = parse_standard_signatures(&text);
        let _ = parse_stripe_header(&text);
        let _ = DiscordKey::from_hex(&text);
        if let Ok(value) = HeaderValue::from_bytes(field) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    let body = fields.next().unwrap_or_default();
    // Both a realistic clock and the extremes, for the skew arithmetic.
    let now = match data.first() {
        Some(0) => i64::MIN,
        Some(1) => i64::MAX,
        _ => NOW,
    };
    for scheme in Scheme::ALL {
        let _ = verify(
            scheme,
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            &headers,
            body,
            now,
        );
    }
    let _ = verify_discord(&DISCORD_KEY, &headers, body, now);
});
