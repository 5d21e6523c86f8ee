//! AWS's service limits, checked on every request before it is sent.
//!
//! The emulator the tests run on is lenient where AWS is not (it takes a 4.5 MB
//! transaction, a 300 KB EventBridge entry, a FIFO deduplication id with a space), so a
//! path that works in every test could fail on AWS with the first large record. Every
//! request the SDK clients serialise passes [`LimitsGuard`], which refuses one past a
//! limit before it leaves the process: the caller gets an error naming the request, its
//! size and the limit, and nothing half-written reaches AWS. The records themselves are
//! bounded where they are made (a memory's text, a tool's kept answer, a turn's parts,
//! a signal's text, a hook attempt's body), well inside these limits; this is the floor
//! under all of them.
//!
//! Sizes are counted as AWS counts them: a DynamoDB item as its attribute names and
//! values ([`super::metrics`]'s sizing; a binary value as sent, base64, which is a
//! little over what DynamoDB counts, so the check errs on the safe side), an SQS
//! message as its body and its attributes' names, types and values, an EventBridge
//! entry as its source, detail type, detail and resources (and 14 bytes for a time).

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::Value;

/// DynamoDB: the largest item, 400 KB.
pub(super) const ITEM_BYTES: usize = 400 * 1024;
/// DynamoDB: items in one TransactWriteItems or TransactGetItems.
pub(super) const TRANSACTION_ITEMS: usize = 100;
/// DynamoDB: the total size of one transaction's items, 4 MB.
pub(super) const TRANSACTION_BYTES: usize = 4 * 1024 * 1024;
/// DynamoDB: requests in one BatchWriteItem.
pub(super) const BATCH_WRITE_ITEMS: usize = 25;
/// DynamoDB: keys in one BatchGetItem.
pub(super) const BATCH_GET_KEYS: usize = 100;
/// SQS: the largest message (body and attributes), and the largest batch, 256 KiB.
pub(super) const SQS_MESSAGE_BYTES: usize = 262_144;
/// SQS: entries in one batch request.
pub(super) const SQS_BATCH_ENTRIES: usize = 10;
/// SQS FIFO: the longest message group or deduplication id.
pub(super) const FIFO_ID_CHARS: usize = 128;
/// EventBridge: the largest PutEvents entry, 256 KB.
pub(super) const EVENT_ENTRY_BYTES: usize = 256 * 1024;
/// EventBridge: entries in one PutEvents.
pub(super) const EVENT_ENTRIES: usize = 10;

/// The interceptor: refuses a request past a limit, before it is signed and sent.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LimitsGuard;

impl Intercept for LimitsGuard {
    fn name(&self) -> &'static str {
        "PulseLimitsGuard"
    }

    fn read_after_serialization(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(meta) = cfg.load::<Metadata>() else {
            return Ok(());
        };
        let Some(body) = context
            .request()
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        else {
            return Ok(());
        };
        check(meta.service(), meta.name(), &body).map_err(|why| {
            format!(
                "refused before sending {}.{}: {why}",
                meta.service(),
                meta.name()
            )
            .into()
        })
    }
}

/// What in a request passes one of AWS's limits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Breach {
    /// A count or a size past its limit.
    #[error("{what} is {size} {unit}, past AWS's limit of {limit} {unit}")]
    Over {
        /// What is too large: "the item", "item 3 of the transaction", "the batch"…
        what: String,
        /// How large it is.
        size: usize,
        /// AWS's limit.
        limit: usize,
        /// Of what: bytes, items, entries…
        unit: &'static str,
    },
    /// A FIFO group or deduplication id of a length SQS refuses.
    #[error("the {what} {id:?} has {chars} characters; SQS takes 1 to {FIFO_ID_CHARS}")]
    IdLength {
        /// Which id.
        what: &'static str,
        /// The id.
        id: String,
        /// Its characters.
        chars: usize,
    },
    /// A FIFO id holding a character SQS refuses.
    #[error("the {what} {id:?} holds {c:?}; SQS takes letters, digits and punctuation only")]
    IdCharacter {
        /// Which id.
        what: &'static str,
        /// The id.
        id: String,
        /// The first character refused.
        c: char,
    },
}

/// Whether a request (its JSON body) keeps inside AWS's limits; what passes one, if not.
pub(crate) fn check(service: &str, op: &str, body: &Value) -> Result<(), Breach> {
    match service {
        "DynamoDB" => dynamodb(op, body),
        "SQS" => sqs(op, body),
        "EventBridge" => eventbridge(body),
        _ => Ok(()),
    }
}

fn over(what: &str, size: usize, limit: usize, unit: &'static str) -> Breach {
    Breach::Over {
        what: what.to_owned(),
        size,
        limit,
        unit,
    }
}

fn item(what: &str, item: &Value) -> Result<usize, Breach> {
    let size = super::metrics::item_size(item);
    if size > ITEM_BYTES {
        return Err(over(what, size, ITEM_BYTES, "bytes"));
    }
    Ok(size)
}

fn dynamodb(op: &str, body: &Value) -> Result<(), Breach> {
    match op {
        "PutItem" => item("the item", &body["Item"]).map(|_| ()),
        "TransactWriteItems" | "TransactGetItems" => {
            let items = body["TransactItems"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            if items.len() > TRANSACTION_ITEMS {
                return Err(over(
                    "the transaction",
                    items.len(),
                    TRANSACTION_ITEMS,
                    "items",
                ));
            }
            let mut total = 0;
            for (i, entry) in items.iter().enumerate() {
                let Some((_, inner)) = entry.as_object().and_then(|m| m.iter().next()) else {
                    continue;
                };
                total += match inner.get("Item") {
                    Some(put) => item(&format!("item {i} of the transaction"), put)?,
                    None => super::metrics::item_size(&inner["Key"]),
                };
            }
            if total > TRANSACTION_BYTES {
                return Err(over("the transaction", total, TRANSACTION_BYTES, "bytes"));
            }
            Ok(())
        }
        "BatchWriteItem" => {
            let mut n = 0;
            for writes in body["RequestItems"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                for w in writes.as_array().into_iter().flatten() {
                    n += 1;
                    if let Some(put) = w.pointer("/PutRequest/Item") {
                        item(&format!("item {} of the batch", n - 1), put)?;
                    }
                }
            }
            if n > BATCH_WRITE_ITEMS {
                return Err(over("the batch", n, BATCH_WRITE_ITEMS, "requests"));
            }
            Ok(())
        }
        "BatchGetItem" => {
            let n: usize = body["RequestItems"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
                .map(|t| t["Keys"].as_array().map_or(0, Vec::len))
                .sum();
            if n > BATCH_GET_KEYS {
                return Err(over("the batch", n, BATCH_GET_KEYS, "keys"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A message's size as SQS counts it: its body, and each attribute's name, data type
/// and value.
fn message_size(m: &Value) -> usize {
    let body = m["MessageBody"].as_str().map_or(0, str::len);
    let attributes: usize = m["MessageAttributes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            k.len()
                + v["DataType"].as_str().map_or(0, str::len)
                + v["StringValue"].as_str().map_or(0, str::len)
                + v["BinaryValue"].as_str().map_or(0, str::len)
        })
        .sum();
    body + attributes
}

/// A FIFO group or deduplication id: at most 128 characters, each an ASCII letter, digit
/// or punctuation mark.
fn fifo_id(what: &'static str, v: &Value) -> Result<(), Breach> {
    let Some(id) = v.as_str() else { return Ok(()) };
    if id.is_empty() || id.len() > FIFO_ID_CHARS {
        return Err(Breach::IdLength {
            what,
            id: id.to_owned(),
            chars: id.chars().count(),
        });
    }
    if let Some(c) = id
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !c.is_ascii_punctuation())
    {
        return Err(Breach::IdCharacter {
            what,
            id: id.to_owned(),
            c,
        });
    }
    Ok(())
}

fn one_message(m: &Value) -> Result<usize, Breach> {
    let size = message_size(m);
    if size > SQS_MESSAGE_BYTES {
        return Err(over("the message", size, SQS_MESSAGE_BYTES, "bytes"));
    }
    fifo_id("message group id", &m["MessageGroupId"])?;
    fifo_id("deduplication id", &m["MessageDeduplicationId"])?;
    Ok(size)
}

fn sqs(op: &str, body: &Value) -> Result<(), Breach> {
    match op {
        "SendMessage" => one_message(body).map(|_| ()),
        "SendMessageBatch" => {
            let entries = body["Entries"].as_array().map_or(&[][..], Vec::as_slice);
            if entries.len() > SQS_BATCH_ENTRIES {
                return Err(over(
                    "the batch",
                    entries.len(),
                    SQS_BATCH_ENTRIES,
                    "entries",
                ));
            }
            let total = entries.iter().map(one_message).sum::<Result<usize, _>>()?;
            if total > SQS_MESSAGE_BYTES {
                return Err(over("the batch", total, SQS_MESSAGE_BYTES, "bytes"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An entry's size as EventBridge counts it.
fn entry_size(e: &Value) -> usize {
    let s = |k: &str| e[k].as_str().map_or(0, str::len);
    let resources: usize = e["Resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::len)
        .sum();
    let time = if e.get("Time").is_some() { 14 } else { 0 };
    s("Source") + s("DetailType") + s("Detail") + resources + time
}

fn eventbridge(body: &Value) -> Result<(), Breach> {
    let entries = body["Entries"].as_array().map_or(&[][..], Vec::as_slice);
    if entries.len() > EVENT_ENTRIES {
        return Err(over("PutEvents", entries.len(), EVENT_ENTRIES, "entries"));
    }
    for e in entries {
        let size = entry_size(e);
        if size > EVENT_ENTRY_BYTES {
            return Err(over("the event", size, EVENT_ENTRY_BYTES, "bytes"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A DynamoDB item of exactly `size` bytes: `pk` and a string attribute `d`.
    fn item_of(size: usize) -> Value {
        let fixed = "pk".len() + "a".len() + "d".len();
        json!({"pk": {"S": "a"}, "d": {"S": "x".repeat(size - fixed)}})
    }

    #[test]
    fn an_item_of_400_kb_is_sent_and_one_byte_more_is_refused() {
        assert_eq!(
            super::super::metrics::item_size(&item_of(ITEM_BYTES)),
            ITEM_BYTES
        );
        let put = |size| check("DynamoDB", "PutItem", &json!({"Item": item_of(size)}));
        assert_eq!(put(ITEM_BYTES), Ok(()));
        assert_eq!(
            put(ITEM_BYTES + 1),
            Err(Breach::Over {
                what: "the item".into(),
                size: 409_601,
                limit: ITEM_BYTES,
                unit: "bytes"
            })
        );
        let in_a_transaction =
            json!({"TransactItems": [{"Put": {"Item": item_of(ITEM_BYTES + 1)}}]});
        assert!(check("DynamoDB", "TransactWriteItems", &in_a_transaction).is_err());
        let in_a_batch =
            json!({"RequestItems": {"t": [{"PutRequest": {"Item": item_of(ITEM_BYTES + 1)}}]}});
        assert!(check("DynamoDB", "BatchWriteItem", &in_a_batch).is_err());
    }

    #[test]
    fn transactions_hold_100_items_and_4_mb_and_batches_25_writes_and_100_keys() {
        let puts = |n: usize, size: usize| json!({"TransactItems": (0..n).map(|_| json!({"Put": {"Item": item_of(size)}})).collect::<Vec<_>>()});
        assert_eq!(
            check("DynamoDB", "TransactWriteItems", &puts(100, 100)),
            Ok(())
        );
        assert!(check("DynamoDB", "TransactWriteItems", &puts(101, 100)).is_err());
        // Eleven items of 400 KB: each within the item limit, 4.4 MB together.
        assert_eq!(
            check("DynamoDB", "TransactWriteItems", &puts(10, ITEM_BYTES)),
            Ok(())
        );
        let err = check("DynamoDB", "TransactWriteItems", &puts(11, ITEM_BYTES)).unwrap_err();
        assert!(err.to_string().contains("4194304 bytes"), "{err}");
        let writes = |n: usize| json!({"RequestItems": {"t": (0..n).map(|_| json!({"DeleteRequest": {"Key": {}}})).collect::<Vec<_>>()}});
        assert_eq!(check("DynamoDB", "BatchWriteItem", &writes(25)), Ok(()));
        assert!(check("DynamoDB", "BatchWriteItem", &writes(26)).is_err());
        let keys = |n: usize| json!({"RequestItems": {"t": {"Keys": (0..n).map(|_| json!({})).collect::<Vec<_>>()}}});
        assert_eq!(check("DynamoDB", "BatchGetItem", &keys(100)), Ok(()));
        assert!(check("DynamoDB", "BatchGetItem", &keys(101)).is_err());
    }

    #[test]
    fn an_sqs_message_holds_256_kib_with_its_attributes_and_fifo_ids_are_checked() {
        let message = |body: usize, attr: &str| {
            json!({"MessageBody": "x".repeat(body), "MessageGroupId": "ss_ag_01", "MessageDeduplicationId": "hb_01.1",
                   "MessageAttributes": {"k": {"DataType": "String", "StringValue": attr}}})
        };
        // "k" + "String" + "v": 8 bytes of attributes.
        assert_eq!(
            check("SQS", "SendMessage", &message(SQS_MESSAGE_BYTES - 8, "v")),
            Ok(())
        );
        assert!(check("SQS", "SendMessage", &message(SQS_MESSAGE_BYTES - 8, "vv")).is_err());
        let ten = json!({"Entries": (0..10).map(|_| message(26_000, "v")).collect::<Vec<_>>()});
        assert_eq!(check("SQS", "SendMessageBatch", &ten), Ok(()));
        let heavy = json!({"Entries": (0..10).map(|_| message(27_000, "v")).collect::<Vec<_>>()});
        assert!(
            check("SQS", "SendMessageBatch", &heavy)
                .unwrap_err()
                .to_string()
                .contains("the batch is 270080 bytes")
        );
        let eleven = json!({"Entries": (0..11).map(|_| message(1, "v")).collect::<Vec<_>>()});
        assert!(check("SQS", "SendMessageBatch", &eleven).is_err());
        let with = |group: &str| json!({"MessageBody": "x", "MessageGroupId": group});
        assert_eq!(check("SQS", "SendMessage", &with(&"g".repeat(128))), Ok(()));
        assert!(check("SQS", "SendMessage", &with(&"g".repeat(129))).is_err());
        assert!(
            check("SQS", "SendMessage", &with("a b"))
                .unwrap_err()
                .to_string()
                .contains("' '")
        );
        assert!(check("SQS", "SendMessage", &with("é")).is_err());
    }

    #[test]
    fn an_eventbridge_entry_holds_256_kb_and_a_put_10_entries() {
        let entry = |detail: usize| json!({"Source": "pulse", "DetailType": "HOOK", "Detail": "x".repeat(detail), "Time": 1});
        // "pulse" + "HOOK" + 14 for the time: 23 bytes beside the detail.
        let fits = EVENT_ENTRY_BYTES - 23;
        assert_eq!(
            check(
                "EventBridge",
                "PutEvents",
                &json!({"Entries": [entry(fits)]})
            ),
            Ok(())
        );
        assert!(
            check(
                "EventBridge",
                "PutEvents",
                &json!({"Entries": [entry(fits + 1)]})
            )
            .is_err()
        );
        let eleven = json!({"Entries": (0..11).map(|_| entry(1)).collect::<Vec<_>>()});
        assert!(check("EventBridge", "PutEvents", &eleven).is_err());
    }
}
