//! The HMAC schemes: published vectors, and each way a request can be wrong.

use http::{HeaderMap, HeaderName, HeaderValue};
use pulse_signatures::inbound::{
    MAX_HEADER_LEN, parse_hex_signature, parse_standard_signatures, parse_stripe_header,
    parse_timestamp,
};
use pulse_signatures::{
    Scheme, TOLERANCE_SECS, VerifyError, generate_secret, sign, standard_signature, verify,
};

const NOW: i64 = 1_700_000_000;
// Valid for every scheme: Standard decodes the base64, the others use the text.
const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW: &str = "whsec_dGhlIG5ldyBzZWNyZXQgZm9yIHJvdGF0aW9uIHRlc3RzIQ==";
const BODY: &[u8] = br#"{"id":"evt_123","type":"payment_intent.succeeded","n":1}"#;

const TIMESTAMPED: [Scheme; 3] = [Scheme::Pulse, Scheme::Standard, Scheme::Stripe];

fn signed_at(scheme: Scheme, secret: &str, body: &[u8], at: i64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in sign(scheme, secret, body, at, "delivery-1").unwrap() {
        headers.insert(name, value);
    }
    if scheme == Scheme::Github {
        // sign leaves the event to the caller, as GitHub's event is not part of the MAC.
        headers.insert("x-github-event", HeaderValue::from_static("push"));
    }
    headers
}

fn signed(scheme: Scheme) -> HeaderMap {
    signed_at(scheme, OLD, BODY, NOW)
}

fn signature_header(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Pulse => "X-Pulse-Signature",
        Scheme::Standard => "webhook-signature",
        Scheme::Github => "X-Hub-Signature-256",
        Scheme::Stripe => "Stripe-Signature",
    }
}

fn timestamp_header(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Pulse => "X-Pulse-Timestamp",
        Scheme::Standard => "webhook-timestamp",
        Scheme::Stripe => "Stripe-Signature",
        Scheme::Github => unreachable!("GitHub has no timestamp"),
    }
}

fn required_headers(scheme: Scheme) -> &'static [&'static str] {
    match scheme {
        Scheme::Pulse => &["X-Pulse-Timestamp", "X-Pulse-Signature"],
        Scheme::Standard => &["webhook-id", "webhook-timestamp", "webhook-signature"],
        Scheme::Github => &["X-Hub-Signature-256", "X-GitHub-Event", "X-GitHub-Delivery"],
        Scheme::Stripe => &["Stripe-Signature"],
    }
}

fn set(headers: &mut HeaderMap, name: &str, value: &str) {
    headers.insert(
        HeaderName::from_bytes(name.as_bytes()).unwrap(),
        HeaderValue::from_str(value).unwrap(),
    );
}

fn get(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).unwrap().to_str().unwrap().to_owned()
}

fn assert_malformed(result: Result<impl std::fmt::Debug, VerifyError>, expected: &str) {
    match result {
        Err(VerifyError::MalformedHeader { header, .. }) => assert_eq!(header, expected),
        other => panic!("expected MalformedHeader({expected}), got {other:?}"),
    }
}

// --- published vectors -----------------------------------------------------------------

const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TIMESTAMP: i64 = 1_614_265_330;
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

#[test]
fn the_standard_webhooks_published_vector_is_reproduced() {
    let signature = standard_signature(SW_SECRET, SW_ID, SW_TIMESTAMP, SW_BODY).unwrap();
    assert_eq!(signature, SW_SIGNATURE);
}

#[test]
fn the_standard_webhooks_published_vector_verifies() {
    let mut headers = HeaderMap::new();
    set(&mut headers, "webhook-id", SW_ID);
    set(&mut headers, "webhook-timestamp", "1614265330");
    set(&mut headers, "webhook-signature", SW_SIGNATURE);
    let verified = verify(
        Scheme::Standard,
        &[SW_SECRET],
        &headers,
        SW_BODY,
        SW_TIMESTAMP,
    )
    .unwrap();
    assert_eq!(verified.delivery_id.as_deref(), Some(SW_ID));
    assert_eq!(verified.timestamp, Some(SW_TIMESTAMP));
    assert_eq!(verified.secret_index, 0);
}

#[test]
fn the_github_published_vector_is_reproduced_and_verifies() {
    let secret = "It's a Secret to Everybody";
    let body = b"Hello, World!";
    let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let headers = signed_at(Scheme::Github, secret, body, NOW);
    assert_eq!(get(&headers, "X-Hub-Signature-256"), expected);

    let mut headers = HeaderMap::new();
    set(&mut headers, "X-Hub-Signature-256", expected);
    set(&mut headers, "X-GitHub-Event", "push");
    set(
        &mut headers,
        "X-GitHub-Delivery",
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    );
    let verified = verify(Scheme::Github, &[secret], &headers, body, NOW).unwrap();
    assert_eq!(verified.event_type.as_deref(), Some("GITHUB_PUSH"));
    assert_eq!(
        verified.delivery_id.as_deref(),
        Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
    );
    assert_eq!(verified.timestamp, None);
}

#[test]
fn an_uppercase_hex_signature_is_accepted() {
    let secret = "It's a Secret to Everybody";
    let mut headers = HeaderMap::new();
    set(
        &mut headers,
        "X-Hub-Signature-256",
        "sha256=757107EA0EB2509FC211221CCE984B8A37570B6D7586C22C46F4379C8B043E17",
    );
    set(&mut headers, "X-GitHub-Event", "push");
    set(&mut headers, "X-GitHub-Delivery", "d-1");
    verify(Scheme::Github, &[secret], &headers, b"Hello, World!", NOW).unwrap();
}

// --- every scheme ----------------------------------------------------------------------

#[test]
fn a_signed_request_is_accepted_for_every_scheme() {
    for scheme in Scheme::ALL {
        let verified = verify(scheme, &[OLD], &signed(scheme), BODY, NOW)
            .unwrap_or_else(|e| panic!("{scheme}: {e}"));
        assert_eq!(verified.secret_index, 0, "{scheme}");
        match scheme {
            Scheme::Pulse | Scheme::Standard | Scheme::Github => {
                assert_eq!(
                    verified.delivery_id.as_deref(),
                    Some("delivery-1"),
                    "{scheme}"
                );
            }
            Scheme::Stripe => assert_eq!(verified.delivery_id.as_deref(), Some("evt_123")),
        }
        if scheme == Scheme::Github {
            assert_eq!(verified.timestamp, None);
        } else {
            assert_eq!(verified.timestamp, Some(NOW), "{scheme}");
        }
    }
}

#[test]
fn a_tampered_body_is_rejected_for_every_scheme() {
    for scheme in Scheme::ALL {
        let headers = signed(scheme);
        let mut body = BODY.to_vec();
        body[5] ^= 1;
        assert_eq!(
            verify(scheme, &[OLD], &headers, &body, NOW),
            Err(VerifyError::Mismatch),
            "{scheme}"
        );
        assert_eq!(
            verify(scheme, &[OLD], &headers, &BODY[..BODY.len() - 1], NOW),
            Err(VerifyError::Mismatch),
            "{scheme}"
        );
    }
}

#[test]
fn a_wrong_secret_is_rejected_for_every_scheme() {
    for scheme in Scheme::ALL {
        assert_eq!(
            verify(scheme, &[NEW], &signed(scheme), BODY, NOW),
            Err(VerifyError::Mismatch),
            "{scheme}"
        );
    }
}

#[test]
fn each_missing_header_is_named() {
    for scheme in Scheme::ALL {
        for &name in required_headers(scheme) {
            let mut headers = signed(scheme);
            assert!(
                headers.remove(name).is_some(),
                "{scheme}: {name} was not sent"
            );
            assert_eq!(
                verify(scheme, &[OLD], &headers, BODY, NOW),
                Err(VerifyError::MissingHeader(name)),
                "{scheme}"
            );
        }
    }
}

#[test]
fn the_pulse_delivery_header_is_optional() {
    let mut headers = HeaderMap::new();
    for (name, value) in sign(Scheme::Pulse, OLD, BODY, NOW, "").unwrap() {
        headers.insert(name, value);
    }
    assert!(headers.get("X-Pulse-Delivery").is_none());
    let verified = verify(Scheme::Pulse, &[OLD], &headers, BODY, NOW).unwrap();
    assert_eq!(verified.delivery_id, None);
}

#[test]
fn the_pulse_delivery_id_is_signed_so_changing_or_dropping_it_fails() {
    let mut changed = signed(Scheme::Pulse);
    set(&mut changed, "X-Pulse-Delivery", "delivery-2");
    assert_eq!(
        verify(Scheme::Pulse, &[OLD], &changed, BODY, NOW),
        Err(VerifyError::Mismatch)
    );
    let mut dropped = signed(Scheme::Pulse);
    dropped.remove("X-Pulse-Delivery");
    assert_eq!(
        verify(Scheme::Pulse, &[OLD], &dropped, BODY, NOW),
        Err(VerifyError::Mismatch)
    );
}

/// The worked example in the book's Security chapter, computed independently (Python's
/// hmac module): a sender's implementation can be checked against it.
#[test]
fn the_readme_pulse_example_is_reproduced_and_verifies() {
    let body = br#"{"event_type":"DEPLOY_FINISHED","payload":{"service":"api"},"priority":2}"#;
    let expected = "sha256=f43a5e40c5af7cae2b9f8146b758e474629fd624f27a413a256d50f5fb28f4e6";
    let headers = sign(Scheme::Pulse, OLD, body, 1_767_225_600, "dlv_42").unwrap();
    let signature = headers
        .iter()
        .find(|(n, _)| n == "x-pulse-signature")
        .map(|(_, v)| v.to_str().unwrap())
        .unwrap();
    assert_eq!(signature, expected);
    let mut map = HeaderMap::new();
    set(&mut map, "X-Pulse-Timestamp", "1767225600");
    set(&mut map, "X-Pulse-Delivery", "dlv_42");
    set(&mut map, "X-Pulse-Signature", expected);
    let verified = verify(Scheme::Pulse, &[OLD], &map, body, 1_767_225_600).unwrap();
    assert_eq!(verified.replay_key, "dlv_42");
}

#[test]
fn the_replay_key_comes_only_from_what_is_signed() {
    // A signed delivery id is the key: a sender's retry (new timestamp) is recognised.
    for scheme in [Scheme::Pulse, Scheme::Standard] {
        let first = verify(scheme, &[OLD], &signed(scheme), BODY, NOW).unwrap();
        let retry = verify(
            scheme,
            &[OLD],
            &signed_at(scheme, OLD, BODY, NOW + 60),
            BODY,
            NOW,
        )
        .unwrap();
        assert_eq!(first.replay_key, "delivery-1", "{scheme}");
        assert_eq!(retry.replay_key, first.replay_key, "{scheme}");
    }
    // Stripe: the event's id, from the signed body.
    let stripe = verify(Scheme::Stripe, &[OLD], &signed(Scheme::Stripe), BODY, NOW).unwrap();
    assert_eq!(stripe.replay_key, "evt_123");

    // GitHub: neither the delivery nor the event header is signed, so the key is the
    // body's digest, the same whatever those headers say.
    let github = verify(Scheme::Github, &[OLD], &signed(Scheme::Github), BODY, NOW).unwrap();
    assert!(
        github.replay_key.starts_with("sha256:"),
        "{}",
        github.replay_key
    );
    let mut replay = signed(Scheme::Github);
    set(&mut replay, "X-GitHub-Delivery", "another-delivery");
    set(&mut replay, "X-GitHub-Event", "release");
    let replayed = verify(Scheme::Github, &[OLD], &replay, BODY, NOW).unwrap();
    assert_eq!(replayed.replay_key, github.replay_key);
    assert_eq!(replayed.event_type.as_deref(), Some("GITHUB_RELEASE"));
    let other_body = br#"{"action":"opened"}"#;
    let other = verify(
        Scheme::Github,
        &[OLD],
        &signed_at(Scheme::Github, OLD, other_body, NOW),
        other_body,
        NOW,
    )
    .unwrap();
    assert_ne!(other.replay_key, github.replay_key);

    // No delivery id at all: the digest of the signed content (timestamp and body).
    let no_id = br#"{"type":"x"}"#;
    for scheme in [Scheme::Pulse, Scheme::Stripe] {
        let mut headers = HeaderMap::new();
        for (name, value) in sign(scheme, OLD, no_id, NOW, "").unwrap() {
            headers.insert(name, value);
        }
        let a = verify(scheme, &[OLD], &headers, no_id, NOW).unwrap();
        let b = verify(scheme, &[OLD], &headers, no_id, NOW + 30).unwrap();
        assert!(a.replay_key.starts_with("sha256:"), "{scheme}");
        assert_eq!(a.replay_key, b.replay_key, "{scheme}: an exact replay");
        let mut later = HeaderMap::new();
        for (name, value) in sign(scheme, OLD, no_id, NOW + 1, "").unwrap() {
            later.insert(name, value);
        }
        let c = verify(scheme, &[OLD], &later, no_id, NOW).unwrap();
        assert_ne!(
            a.replay_key, c.replay_key,
            "{scheme}: signed anew is another request"
        );
    }
    // The key does not depend on which secret matched.
    let two = verify(
        Scheme::Github,
        &[NEW, OLD],
        &signed(Scheme::Github),
        BODY,
        NOW,
    )
    .unwrap();
    assert_eq!(two.replay_key, github.replay_key);
}

#[test]
fn a_non_numeric_timestamp_is_malformed() {
    let bad = [
        "abc",
        "",
        " 1700000000",
        "1700000000 ",
        "+1700000000",
        "1.5",
        "-",
        "1e9",
    ];
    for scheme in [Scheme::Pulse, Scheme::Standard] {
        for text in bad {
            let mut headers = signed(scheme);
            set(&mut headers, timestamp_header(scheme), text);
            assert_malformed(
                verify(scheme, &[OLD], &headers, BODY, NOW),
                timestamp_header(scheme),
            );
        }
    }
    for text in bad {
        let mut headers = signed(Scheme::Stripe);
        let original = get(&headers, "Stripe-Signature");
        let v1 = original.split_once(',').unwrap().1;
        set(&mut headers, "Stripe-Signature", &format!("t={text},{v1}"));
        assert_malformed(
            verify(Scheme::Stripe, &[OLD], &headers, BODY, NOW),
            "Stripe-Signature",
        );
    }
}

#[test]
fn a_timestamp_beyond_i64_is_malformed_not_a_panic() {
    assert!(parse_timestamp("9223372036854775807").is_ok());
    assert!(parse_timestamp("-9223372036854775808").is_ok());
    assert!(parse_timestamp("9223372036854775808").is_err());
    assert!(parse_timestamp("99999999999999999999999999").is_err());
    let mut headers = signed(Scheme::Pulse);
    set(&mut headers, "X-Pulse-Timestamp", "99999999999999999999");
    assert_malformed(
        verify(Scheme::Pulse, &[OLD], &headers, BODY, NOW),
        "X-Pulse-Timestamp",
    );
}

#[test]
fn extreme_timestamps_are_stale_not_an_overflow() {
    for (ts, now) in [(i64::MIN, i64::MAX), (i64::MAX, i64::MIN)] {
        let headers = signed_at(Scheme::Pulse, OLD, BODY, ts);
        assert!(matches!(
            verify(Scheme::Pulse, &[OLD], &headers, BODY, now),
            Err(VerifyError::StaleTimestamp { .. })
        ));
    }
}

#[test]
fn a_stale_timestamp_is_rejected_either_way() {
    for scheme in TIMESTAMPED {
        for skew in [TOLERANCE_SECS + 1, -(TOLERANCE_SECS + 1), 100_000, -100_000] {
            let headers = signed_at(scheme, OLD, BODY, NOW - skew);
            assert_eq!(
                verify(scheme, &[OLD], &headers, BODY, NOW),
                Err(VerifyError::StaleTimestamp {
                    header: timestamp_header(scheme),
                    skew_secs: skew
                }),
                "{scheme} skew {skew}"
            );
        }
    }
}

#[test]
fn a_timestamp_within_the_tolerance_is_accepted_including_the_edge() {
    for scheme in TIMESTAMPED {
        for skew in [0, 299, -299, 300, -300] {
            let headers = signed_at(scheme, OLD, BODY, NOW - skew);
            let verified = verify(scheme, &[OLD], &headers, BODY, NOW)
                .unwrap_or_else(|e| panic!("{scheme} skew {skew}: {e}"));
            assert_eq!(verified.timestamp, Some(NOW - skew));
        }
    }
}

#[test]
fn a_stale_and_forged_request_reports_the_timestamp_first() {
    // Check order: timestamp before signature, so a replayed request says "stale".
    let headers = signed_at(Scheme::Pulse, NEW, BODY, NOW - 1000);
    assert!(matches!(
        verify(Scheme::Pulse, &[OLD], &headers, BODY, NOW),
        Err(VerifyError::StaleTimestamp { .. })
    ));
}

#[test]
fn a_truncated_signature_is_malformed_for_every_scheme() {
    for scheme in Scheme::ALL {
        let mut headers = signed(scheme);
        let name = signature_header(scheme);
        let mut value = get(&headers, name);
        value.pop();
        set(&mut headers, name, &value);
        assert_malformed(verify(scheme, &[OLD], &headers, BODY, NOW), name);
    }
}

#[test]
fn a_signature_with_a_wrong_prefix_is_malformed() {
    for scheme in [Scheme::Pulse, Scheme::Github] {
        let mut headers = signed(scheme);
        let name = signature_header(scheme);
        let value = get(&headers, name).replacen("sha256=", "sha1=", 1);
        set(&mut headers, name, &value);
        assert_malformed(verify(scheme, &[OLD], &headers, BODY, NOW), name);
    }
}

#[test]
fn old_and_new_secrets_both_verify_during_rotation() {
    for scheme in Scheme::ALL {
        let secrets = [OLD, NEW];
        let old = verify(
            scheme,
            &secrets,
            &signed_at(scheme, OLD, BODY, NOW),
            BODY,
            NOW,
        )
        .unwrap();
        assert_eq!(old.secret_index, 0, "{scheme}");
        let new = verify(
            scheme,
            &secrets,
            &signed_at(scheme, NEW, BODY, NOW),
            BODY,
            NOW,
        )
        .unwrap();
        assert_eq!(new.secret_index, 1, "{scheme}");
    }
}

#[test]
fn no_secrets_is_a_configuration_error() {
    for scheme in Scheme::ALL {
        assert_eq!(
            verify(scheme, &[], &signed(scheme), BODY, NOW),
            Err(VerifyError::NoSecrets)
        );
    }
}

#[test]
fn an_undecodable_standard_secret_is_a_bad_secret_whose_message_hides_it() {
    let secret = "whsec_not base64!!";
    let err = verify(
        Scheme::Standard,
        &[secret],
        &signed(Scheme::Standard),
        BODY,
        NOW,
    )
    .unwrap_err();
    assert!(matches!(err, VerifyError::BadSecret(_)), "{err:?}");
    assert!(!err.to_string().contains("not base64!!"));
    assert!(matches!(
        standard_signature(secret, "id", NOW, BODY),
        Err(VerifyError::BadSecret(_))
    ));
    assert!(matches!(
        sign(Scheme::Standard, secret, BODY, NOW, "id"),
        Err(VerifyError::BadSecret(_))
    ));
}

#[test]
fn a_standard_secret_without_the_prefix_is_decoded_as_is() {
    let bare = OLD.strip_prefix("whsec_").unwrap();
    assert_eq!(
        standard_signature(bare, "id", NOW, BODY).unwrap(),
        standard_signature(OLD, "id", NOW, BODY).unwrap()
    );
}

#[test]
fn an_empty_secret_is_refused_because_anyone_could_sign() {
    for scheme in Scheme::ALL {
        assert!(matches!(
            verify(scheme, &[""], &signed(scheme), BODY, NOW),
            Err(VerifyError::BadSecret(_))
        ));
    }
    assert!(matches!(
        verify(
            Scheme::Standard,
            &["whsec_"],
            &signed(Scheme::Standard),
            BODY,
            NOW
        ),
        Err(VerifyError::BadSecret(_))
    ));
}

#[test]
fn a_mismatch_message_reveals_neither_secret_nor_expected_signature() {
    for scheme in Scheme::ALL {
        let expected = signed_at(scheme, NEW, BODY, NOW);
        let err = verify(scheme, &[NEW], &signed(scheme), BODY, NOW).unwrap_err();
        let message = err.to_string();
        assert!(!message.contains(NEW));
        let expected_sig = get(&expected, signature_header(scheme));
        let tail = expected_sig
            .rsplit(['=', ','])
            .find(|part| part.len() >= 40)
            .unwrap();
        assert!(!message.contains(tail), "{scheme}: {message}");
    }
}

#[test]
fn a_header_longer_than_eight_kib_is_malformed() {
    let long = format!("sha256={}", "a".repeat(MAX_HEADER_LEN));
    let mut headers = signed(Scheme::Github);
    set(&mut headers, "X-Hub-Signature-256", &long);
    assert_malformed(
        verify(Scheme::Github, &[OLD], &headers, BODY, NOW),
        "X-Hub-Signature-256",
    );
    assert!(parse_hex_signature(&long).is_err());
    assert!(parse_timestamp(&"1".repeat(MAX_HEADER_LEN + 1)).is_err());
}

#[test]
fn a_non_ascii_header_value_is_malformed() {
    let mut headers = signed(Scheme::Pulse);
    headers.insert(
        "x-pulse-timestamp",
        HeaderValue::from_bytes("17000000é".as_bytes()).unwrap(),
    );
    assert_malformed(
        verify(Scheme::Pulse, &[OLD], &headers, BODY, NOW),
        "X-Pulse-Timestamp",
    );
}

// --- Standard Webhooks ------------------------------------------------------------------

#[test]
fn standard_accepts_one_valid_v1_among_invalid_and_other_versions() {
    let headers = signed(Scheme::Standard);
    let good = get(&headers, "webhook-signature");
    let wrong = standard_signature(NEW, "delivery-1", NOW, BODY).unwrap();
    let value = format!(
        "v2,AAAA v1a,{} {wrong} v1,!!notbase64 v1,AAAA {good}",
        &good[3..]
    );
    let mut headers = headers;
    set(&mut headers, "webhook-signature", &value);
    verify(Scheme::Standard, &[OLD], &headers, BODY, NOW).unwrap();
}

#[test]
fn standard_without_any_v1_entry_is_malformed() {
    let mut headers = signed(Scheme::Standard);
    let good = get(&headers, "webhook-signature");
    set(
        &mut headers,
        "webhook-signature",
        &format!("v2,{} v1a,{}", &good[3..], &good[3..]),
    );
    assert_malformed(
        verify(Scheme::Standard, &[OLD], &headers, BODY, NOW),
        "webhook-signature",
    );
    assert!(parse_standard_signatures("").is_err());
    assert!(parse_standard_signatures("v1").is_err());
}

#[test]
fn standard_signs_the_message_id_so_changing_it_fails() {
    let mut headers = signed(Scheme::Standard);
    set(&mut headers, "webhook-id", "msg_other");
    assert_eq!(
        verify(Scheme::Standard, &[OLD], &headers, BODY, NOW),
        Err(VerifyError::Mismatch)
    );
}

// --- GitHub --------------------------------------------------------------------------

#[test]
fn github_event_names_become_pulse_event_types() {
    for (event, expected) in [
        ("push", "GITHUB_PUSH"),
        ("pull_request", "GITHUB_PULL_REQUEST"),
        ("check-run.v2", "GITHUB_CHECK_RUN_V2"),
    ] {
        let mut headers = signed(Scheme::Github);
        set(&mut headers, "X-GitHub-Event", event);
        let verified = verify(Scheme::Github, &[OLD], &headers, BODY, NOW).unwrap();
        assert_eq!(verified.event_type.as_deref(), Some(expected));
    }
}

// --- Stripe --------------------------------------------------------------------------

#[test]
fn stripe_accepts_a_second_v1_when_the_first_is_wrong() {
    let mut headers = signed(Scheme::Stripe);
    let good = get(&headers, "Stripe-Signature");
    let (t, v1) = good.split_once(',').unwrap();
    let wrong = format!("v1={}", "0".repeat(64));
    set(
        &mut headers,
        "Stripe-Signature",
        &format!("{t},{wrong},{v1},v0={},scheme=x", "1".repeat(64)),
    );
    let verified = verify(Scheme::Stripe, &[OLD], &headers, BODY, NOW).unwrap();
    assert_eq!(verified.delivery_id.as_deref(), Some("evt_123"));
}

#[test]
fn stripe_reads_the_event_id_and_type_from_the_body() {
    let verified = verify(Scheme::Stripe, &[OLD], &signed(Scheme::Stripe), BODY, NOW).unwrap();
    assert_eq!(verified.delivery_id.as_deref(), Some("evt_123"));
    assert_eq!(
        verified.event_type.as_deref(),
        Some("STRIPE_PAYMENT_INTENT_SUCCEEDED")
    );
}

#[test]
fn stripe_verifies_a_non_json_body_without_id_or_type() {
    for body in [
        &b"not json"[..],
        b"[1,2]",
        br#"{"id": 5, "type": null}"#,
        b"",
    ] {
        let headers = signed_at(Scheme::Stripe, OLD, body, NOW);
        let verified = verify(Scheme::Stripe, &[OLD], &headers, body, NOW).unwrap();
        assert_eq!(verified.delivery_id, None);
        assert_eq!(verified.event_type, None);
    }
}

#[test]
fn stripe_header_parsing_handles_order_unknown_keys_and_duplicates() {
    let sig = "ab".repeat(32);
    let parsed = parse_stripe_header(&format!("v1={sig},foo=bar,t=12,junk,v0=zz")).unwrap();
    assert_eq!(parsed.timestamp, 12);
    assert_eq!(parsed.v1, vec![vec![0xab; 32]]);
    assert!(parse_stripe_header(&format!("t=1,t=2,v1={sig}")).is_err());
    assert!(parse_stripe_header(&format!("v1={sig}")).is_err());
    assert!(parse_stripe_header("t=1").is_err());
    assert!(parse_stripe_header("t=1,v1=abc").is_err());
}

// --- Scheme names and secrets ----------------------------------------------------------

#[test]
fn scheme_names_round_trip_and_an_unknown_name_lists_the_valid_ones() {
    for scheme in Scheme::ALL {
        assert_eq!(scheme.to_string().parse::<Scheme>().unwrap(), scheme);
    }
    let err = "svix".parse::<Scheme>().unwrap_err().to_string();
    for name in ["pulse", "standard", "github", "stripe"] {
        assert!(err.contains(name), "{err}");
    }
}

#[test]
fn a_generated_secret_is_prefixed_random_and_works_for_every_scheme() {
    let a = generate_secret();
    let b = generate_secret();
    assert_ne!(a, b);
    assert!(a.starts_with("whsec_"));
    assert_eq!(a.len(), "whsec_".len() + 44);
    for scheme in Scheme::ALL {
        let headers = signed_at(scheme, &a, BODY, NOW);
        verify(scheme, &[&a], &headers, BODY, NOW).unwrap();
    }
}

#[test]
fn sign_refuses_a_delivery_id_that_cannot_be_a_header() {
    assert!(matches!(
        sign(Scheme::Pulse, OLD, BODY, NOW, "line\nbreak"),
        Err(VerifyError::MalformedHeader { .. })
    ));
}

#[test]
fn a_hex_tag_is_decoded_in_either_case_and_refused_when_not_hex() {
    let hex = "00ff10AB".repeat(8);
    let tag = parse_hex_signature(&format!("sha256={hex}")).unwrap();
    assert_eq!(tag, [0x00, 0xff, 0x10, 0xab].repeat(8));
    let bad = format!("sha256={}zz", &hex[..62]);
    assert_eq!(
        parse_hex_signature(&bad).unwrap_err(),
        "the signature is not hex"
    );
    assert!(parse_hex_signature(&format!("sha256={}", &hex[..62])).is_err());
}
