//! Properties over arbitrary bodies, secrets and header strings.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use pulse_signatures::inbound::{
    parse_hex_signature, parse_standard_signatures, parse_stripe_header, parse_timestamp,
};
use pulse_signatures::{
    DiscordKey, DiscordSigner, Scheme, VerifyError, sign, verify, verify_discord,
};

const NOW: i64 = 1_700_000_000;
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A secret every scheme accepts: Standard gets `whsec_` + base64 of arbitrary key bytes;
/// the others get any non-empty text, including non-ASCII.
fn secret_for(scheme: Scheme, key: &[u8], text: &str) -> String {
    match scheme {
        Scheme::Standard => format!("whsec_{}", BASE64.encode(key)),
        _ => text.to_owned(),
    }
}

fn signed(scheme: Scheme, secret: &str, body: &[u8]) -> HeaderMap {
    let mut headers: HeaderMap = sign(scheme, secret, body, NOW, "d-1")
        .unwrap()
        .into_iter()
        .collect();
    if scheme == Scheme::Github {
        headers.insert("x-github-event", HeaderValue::from_static("push"));
    }
    headers
}

fn scheme() -> impl Strategy<Value = Scheme> {
    prop::sample::select(Scheme::ALL.to_vec())
}

/// Header text: anything, plus shapes close to valid so the parsers' inner paths run.
fn header_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9-]{0,25}",
        "sha256=[0-9a-fA-Fg]{0,70}",
        "(v[0-9a]{1,2},[A-Za-z0-9+/=]{0,50} ?){0,4}",
        "((t|v1|v0|x)=[0-9a-f-]{0,66},?){0,5}",
        prop::collection::vec(any::<char>(), 8000..9000).prop_map(String::from_iter),
    ]
}

const HEADER_NAMES: [&str; 13] = [
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
    "content-type",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn sign_then_verify_holds_for_any_body_and_secret(
        scheme in scheme(),
        body in prop::collection::vec(any::<u8>(), 0..2048),
        key in prop::collection::vec(any::<u8>(), 1..80),
        text in ".+",
    ) {
        let secret = secret_for(scheme, &key, &text);
        let verified = verify(scheme, &[&secret], &signed(scheme, &secret, &body), &body, NOW);
        prop_assert!(verified.is_ok(), "{scheme}: {verified:?}");
    }

    #[test]
    fn discord_sign_then_verify_holds_for_any_body_and_seed(
        body in prop::collection::vec(any::<u8>(), 0..2048),
        seed in any::<[u8; 32]>(),
    ) {
        let signer = DiscordSigner::from_seed(seed);
        let key = DiscordKey::from_hex(&signer.public_key_hex()).unwrap();
        let headers: HeaderMap = signer.sign(NOW, &body).into_iter().collect();
        prop_assert_eq!(verify_discord(&key, &headers, &body, NOW), Ok(NOW));
    }

    #[test]
    fn any_single_flipped_bit_of_the_body_fails(
        scheme in scheme(),
        body in prop::collection::vec(any::<u8>(), 1..512),
        index in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let secret = SECRET;
        let headers = signed(scheme, secret, &body);
        let mut flipped = body.clone();
        flipped[index.index(body.len())] ^= 1 << bit;
        prop_assert_eq!(
            verify(scheme, &[secret], &headers, &flipped, NOW).map(|_| ()),
            Err(VerifyError::Mismatch)
        );

        let signer = DiscordSigner::from_seed([3; 32]);
        let key = DiscordKey::from_hex(&signer.public_key_hex()).unwrap();
        let headers: HeaderMap = signer.sign(NOW, &body).into_iter().collect();
        prop_assert_eq!(verify_discord(&key, &headers, &flipped, NOW), Err(VerifyError::Mismatch));
    }

    #[test]
    fn the_parsers_never_panic(text in header_text()) {
        let _ = parse_timestamp(&text);
        let _ = parse_hex_signature(&text);
        let _ = parse_standard_signatures(&text);
        let _ = parse_stripe_header(&text);
        let _ = DiscordKey::from_hex(&text);
    }

    #[test]
    fn arbitrary_headers_never_panic_verification(
        values in prop::collection::vec((0..HEADER_NAMES.len(), header_text()), 0..8),
        body in prop::collection::vec(any::<u8>(), 0..64),
        now in prop_oneof![Just(NOW), any::<i64>()],
        prefill in any::<bool>(),
    ) {
        // Prefilled with every scheme's valid headers, so that overriding a few reaches
        // the timestamp and MAC checks rather than stopping at a missing header.
        let mut headers = HeaderMap::new();
        if prefill {
            for scheme in Scheme::ALL {
                headers.extend(signed(scheme, SECRET, &body));
            }
            headers.extend(DiscordSigner::from_seed([1; 32]).sign(NOW, &body));
        }
        for (name, text) in &values {
            // Values a client cannot send (control characters) cannot reach us either.
            if let Ok(value) = HeaderValue::from_bytes(text.as_bytes()) {
                headers.append(HeaderName::from_static(HEADER_NAMES[*name]), value);
            }
        }
        for scheme in Scheme::ALL {
            let result = verify(scheme, &[SECRET], &headers, &body, now);
            // Random headers are astronomically unlikely to carry a valid MAC.
            prop_assert!(prefill || result.is_err());
        }
        let key = DiscordKey::from_hex(&DiscordSigner::from_seed([1; 32]).public_key_hex()).unwrap();
        let result = verify_discord(&key, &headers, &body, now);
        prop_assert!(prefill || result.is_err());
    }
}
