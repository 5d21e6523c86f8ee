//! Discord's Ed25519 interaction signatures.

use http::{HeaderMap, HeaderValue};
use pulse_signatures::{DiscordKey, DiscordSigner, KeyError, VerifyError, verify_discord};

const NOW: i64 = 1_700_000_000;
const BODY: &[u8] = br#"{"type":1,"id":"123"}"#;

fn signer() -> DiscordSigner {
    DiscordSigner::from_seed([7; 32])
}

fn key() -> DiscordKey {
    DiscordKey::from_hex(&signer().public_key_hex()).unwrap()
}

fn signed_at(body: &[u8], at: i64) -> HeaderMap {
    signer().sign(at, body).into_iter().collect()
}

fn assert_malformed(result: Result<i64, VerifyError>, expected: &str) {
    match result {
        Err(VerifyError::MalformedHeader { header, .. }) => assert_eq!(header, expected),
        other => panic!("expected MalformedHeader({expected}), got {other:?}"),
    }
}

#[test]
fn the_rfc_8032_seed_gives_its_published_public_key() {
    let seed =
        hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").unwrap();
    let signer = DiscordSigner::from_seed(seed.try_into().unwrap());
    assert_eq!(
        signer.public_key_hex(),
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    );
}

#[test]
fn a_signed_interaction_verifies_and_returns_its_timestamp() {
    assert_eq!(
        verify_discord(&key(), &signed_at(BODY, NOW), BODY, NOW),
        Ok(NOW)
    );
}

#[test]
fn a_wrong_key_is_a_mismatch() {
    let other = DiscordSigner::from_seed([8; 32]);
    let other_key = DiscordKey::from_hex(&other.public_key_hex()).unwrap();
    assert_eq!(
        verify_discord(&other_key, &signed_at(BODY, NOW), BODY, NOW),
        Err(VerifyError::Mismatch)
    );
}

#[test]
fn a_tampered_body_is_a_mismatch() {
    let headers = signed_at(BODY, NOW);
    let mut body = BODY.to_vec();
    body[3] ^= 0x20;
    assert_eq!(
        verify_discord(&key(), &headers, &body, NOW),
        Err(VerifyError::Mismatch)
    );
}

#[test]
fn a_changed_timestamp_is_a_mismatch() {
    // The timestamp is signed, so moving it (within tolerance) must not pass.
    let mut headers = signed_at(BODY, NOW);
    headers.insert("x-signature-timestamp", HeaderValue::from(NOW + 1));
    assert_eq!(
        verify_discord(&key(), &headers, BODY, NOW),
        Err(VerifyError::Mismatch)
    );
}

#[test]
fn each_missing_header_is_named() {
    for name in ["X-Signature-Ed25519", "X-Signature-Timestamp"] {
        let mut headers = signed_at(BODY, NOW);
        headers.remove(name);
        assert_eq!(
            verify_discord(&key(), &headers, BODY, NOW),
            Err(VerifyError::MissingHeader(name))
        );
    }
}

#[test]
fn a_malformed_signature_is_reported_as_such() {
    let headers = signed_at(BODY, NOW);
    let good = headers["x-signature-ed25519"].to_str().unwrap().to_owned();
    for bad in [
        good[..127].to_owned(),
        format!("{good}0"),
        format!("{}zz", &good[..126]),
        String::new(),
    ] {
        let mut headers = headers.clone();
        headers.insert("x-signature-ed25519", HeaderValue::from_str(&bad).unwrap());
        assert_malformed(
            verify_discord(&key(), &headers, BODY, NOW),
            "X-Signature-Ed25519",
        );
    }
    let mut upper = headers.clone();
    upper.insert(
        "x-signature-ed25519",
        HeaderValue::from_str(&good.to_ascii_uppercase()).unwrap(),
    );
    assert_eq!(verify_discord(&key(), &upper, BODY, NOW), Ok(NOW));
}

#[test]
fn a_non_numeric_timestamp_is_malformed() {
    let mut headers = signed_at(BODY, NOW);
    headers.insert("x-signature-timestamp", HeaderValue::from_static("soon"));
    assert_malformed(
        verify_discord(&key(), &headers, BODY, NOW),
        "X-Signature-Timestamp",
    );
}

#[test]
fn a_stale_timestamp_is_rejected_either_way() {
    for skew in [301, -301] {
        let headers = signed_at(BODY, NOW - skew);
        assert_eq!(
            verify_discord(&key(), &headers, BODY, NOW),
            Err(VerifyError::StaleTimestamp {
                header: "X-Signature-Timestamp",
                skew_secs: skew
            })
        );
    }
    for skew in [299, -299, 300, -300] {
        let headers = signed_at(BODY, NOW - skew);
        assert_eq!(verify_discord(&key(), &headers, BODY, NOW), Ok(NOW - skew));
    }
}

#[test]
fn a_bad_public_key_says_what_is_wrong_and_names_the_variable() {
    let good = signer().public_key_hex();
    assert_eq!(
        DiscordKey::from_hex(&good[..62]),
        Err(KeyError::WrongLength(62))
    );
    assert_eq!(
        DiscordKey::from_hex(&format!("{}zz", &good[..62])),
        Err(KeyError::NotHex)
    );
    assert_eq!(
        DiscordKey::from_hex("é".repeat(32).as_str()),
        Err(KeyError::NotHex)
    );
    // The identity point has small order: it would accept forgeries.
    let identity = format!("01{}", "00".repeat(31));
    assert_eq!(DiscordKey::from_hex(&identity), Err(KeyError::InvalidKey));
    for err in [
        KeyError::WrongLength(3),
        KeyError::NotHex,
        KeyError::InvalidKey,
    ] {
        assert!(err.to_string().contains("DISCORD_PUBLIC_KEY"), "{err}");
    }
    // Whitespace from an environment file is forgiven.
    assert!(DiscordKey::from_hex(&format!(" {good}\n")).is_ok());
}

#[test]
fn debug_output_is_short_and_never_shows_the_private_key() {
    let key = key();
    let debug = format!("{key:?}");
    assert!(debug.len() < 32, "{debug}");
    let signer = signer();
    let debug = format!("{signer:?}");
    assert!(!debug.contains(&hex::encode([7u8; 32])), "{debug}");
    assert!(!debug.contains("[7, 7"), "{debug}");
}
