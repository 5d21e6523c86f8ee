//! A webhook's body read without building a JSON tree: checked as strictly as parsing it
//! into a [`serde_json::Value`] would (so whatever is written into the log reads back),
//! then the few top-level fields the receiver needs picked out as text.
//!
//! Parsing a body into a tree allocates a map for every object and a string for every
//! key and text value, and the tree is freed again once its event is written: for a
//! small order, three maps of 600 bytes each. The text is what the log stores anyway.

use std::fmt;

use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::value::RawValue;

use crate::domain::RawJson;

/// Checks that `body` is one JSON value that [`serde_json::Value`] would accept (numbers
/// in range, escapes valid, UTF-8, nesting within serde_json's limit, nothing after it),
/// and gives it as text without the white space around it.
pub(crate) fn checked(body: &[u8]) -> Result<&str, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    Checked::deserialize(&mut de)?;
    de.end()?;
    // Checked: every byte outside a string is ASCII, every string valid UTF-8.
    let text = std::str::from_utf8(body).map_err(de::Error::custom)?;
    Ok(text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r')))
}

/// `text` (checked by [`checked`]) kept as it is.
pub(crate) fn raw(text: &str) -> Result<RawJson, serde_json::Error> {
    RawValue::from_string(text.to_owned())
}

/// The top-level fields of a body the receiver reads, each as its JSON text; when a key
/// comes twice the last one counts, as when the body is parsed into a tree.
#[derive(Debug, Default)]
pub(crate) struct Fields<'a> {
    pub(crate) event_type: Option<&'a RawValue>,
    pub(crate) type_: Option<&'a RawValue>,
    pub(crate) priority: Option<&'a RawValue>,
    pub(crate) payload: Option<&'a RawValue>,
    pub(crate) data: Option<&'a RawValue>,
}

impl<'a> Fields<'a> {
    /// The fields of `text`, a body checked by [`checked`]; `None` when it is not an
    /// object.
    pub(crate) fn of(text: &'a str) -> Option<Self> {
        let mut de = serde_json::Deserializer::from_str(text);
        de.deserialize_map(FieldsVisitor).ok()
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let slot = match key {
                Key::EventType => &mut fields.event_type,
                Key::Type => &mut fields.type_,
                Key::Priority => &mut fields.priority,
                Key::Payload => &mut fields.payload,
                Key::Data => &mut fields.data,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value::<&'de RawValue>()?);
        }
        Ok(fields)
    }
}

/// A top-level key, told apart without allocating it.
enum Key {
    EventType,
    Type,
    Priority,
    Payload,
    Data,
    Other,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(KeySeed)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "event_type" => Key::EventType,
            "type" => Key::Type,
            "priority" => Key::Priority,
            "payload" => Key::Payload,
            "data" => Key::Data,
            _ => Key::Other,
        })
    }
}

/// Walks a value the way parsing it into a tree does (`deserialize_any`: numbers and
/// strings decoded, so out-of-range numbers and bad escapes fail), keeping nothing.
/// serde's own `IgnoredAny` skips values without decoding them, which would let through
/// text that cannot be read back.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked).map(|()| Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Whatever the check lets through parses into a tree, and whatever parses into a
    /// tree passes the check: the two agree on every body here, valid or not.
    #[test]
    fn the_check_accepts_what_a_tree_accepts() {
        let bodies: &[&[u8]] = &[
            br#"{"a": 1, "b": [true, null, "x"], "c": {"d": -0.5e3}}"#,
            b"  [1, 2]\n",
            b"\"\\u00e9t\\u00e9\"",
            b"\"\\ud83d\\ude00\"",
            b"12345678901234567890123",
            // Out of range for a float: the tree refuses it.
            b"1e400",
            b"[1e400]",
            b"{\"k\": 1e400}",
            // A lone surrogate escape, an escape that does not exist.
            b"\"\\ud800\"",
            b"\"\\q\"",
            // Not UTF-8, in a string and in a key.
            b"\"\xff\"",
            b"{\"\xff\": 1}",
            // Trailing content, truncated, empty.
            b"{} {}",
            b"{\"a\": [1, 2",
            b"",
            b"nul",
        ];
        for body in bodies {
            let tree = serde_json::from_slice::<Value>(body);
            let check = checked(body);
            assert_eq!(
                check.is_ok(),
                tree.is_ok(),
                "{}: check {check:?}, tree {tree:?}",
                String::from_utf8_lossy(body)
            );
            if let Ok(text) = check {
                let back: Value = serde_json::from_str(text).unwrap();
                assert_eq!(back, tree.unwrap());
            }
        }
    }

    /// Nesting past serde_json's limit fails the check as it fails a tree.
    #[test]
    fn deep_nesting_fails_as_it_does_for_a_tree() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert!(checked(deep.as_bytes()).is_err());
        let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(checked(fine.as_bytes()).is_ok());
    }

    /// The fields are picked out as text, the last of a repeated key counting, and a
    /// body that is not an object has none.
    #[test]
    fn fields_are_picked_out_as_text() {
        let text = checked(
            br#"{"payload": 1, "type": "A", "other": {"payload": 2}, "payload": {"n": [1]}, "priority": 3}"#,
        )
        .unwrap();
        let f = Fields::of(text).unwrap();
        assert_eq!(f.payload.map(RawValue::get), Some(r#"{"n": [1]}"#));
        assert_eq!(f.type_.map(RawValue::get), Some(r#""A""#));
        assert_eq!(f.priority.map(RawValue::get), Some("3"));
        assert!(f.event_type.is_none() && f.data.is_none());
        assert!(Fields::of("[1]").is_none());
        assert!(Fields::of("\"x\"").is_none());
    }
}
