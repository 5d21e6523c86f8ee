//! Counts the HTTP requests the SDK clients send, by operation (retries included), and
//! the DynamoDB capacity each would consume on a real table.
//!
//! Capacity is computed the way DynamoDB bills on-demand tables, from the items in the
//! request (writes) and the response (reads): a write request unit per started KB of
//! each item written (two in a transaction), a read request unit per started 4 KB read
//! consistently (half for an eventually consistent read). Emulators do not do this (moto
//! reports fixed units per call), so the benches price cycles from this model. Where
//! the stored size is not in the request (an update writes attributes of an item whose
//! full size only the table knows), the request's key and values stand for it: exact
//! for the small heartbeat records Pulse updates, a lower bound for large ones.
//!
//! Each request is also added to the [`crate::tally`] of the unit of work that sent it,
//! so heartbeats and turns carry their own counts; [`with_own`] lets a write carry its
//! own cost on the record it writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use serde_json::Value;

use crate::domain::Requests;

/// Requests sent, by `Service.Operation` (e.g. `DynamoDB.UpdateItem`), and the DynamoDB
/// capacity they would consume.
#[derive(Clone, Debug, Default)]
pub struct RequestCounter(Arc<Mutex<Counts>>);

#[derive(Clone, Debug, Default)]
struct Counts {
    requests: BTreeMap<String, u64>,
    units: Capacity,
}

/// DynamoDB request units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Capacity {
    /// Write request units.
    pub write: f64,
    /// Read request units.
    pub read: f64,
}

impl RequestCounter {
    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.lock().requests.clone()
    }
    /// The DynamoDB capacity the requests so far would consume.
    pub fn capacity(&self) -> Capacity {
        self.lock().units
    }
    /// Sets every count back to zero.
    pub fn reset(&self) {
        *self.lock() = Counts::default();
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a DynamoDB request said that its response's read units depend on.
#[derive(Clone, Debug)]
struct ReadMode {
    consistent: bool,
}

impl Storable for ReadMode {
    type Storer = StoreReplace<Self>;
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "PulseRequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, op) = match cfg.load::<Metadata>() {
            Some(m) => (m.service().to_owned(), m.name().to_owned()),
            None => ("unknown".to_owned(), String::new()),
        };
        let mut write = 0.0;
        if service == "DynamoDB"
            && let Some(body) = context
                .request()
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        {
            write = write_units(&op, &body);
            let consistent = body["ConsistentRead"].as_bool().unwrap_or(false);
            cfg.interceptor_state().store_put(ReadMode { consistent });
        }
        let name = format!("{service}.{op}");
        crate::tally::count(&name, write);
        let mut counts = self.lock();
        *counts.requests.entry(name).or_default() += 1;
        counts.units.write += write;
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(mode) = cfg.load::<ReadMode>().cloned() else {
            return Ok(());
        };
        let op = cfg
            .load::<Metadata>()
            .map(|m| m.name().to_owned())
            .unwrap_or_default();
        if let Some(body) = context
            .response()
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        {
            let units = read_units(&op, &body, mode.consistent);
            crate::tally::count_read(units);
            self.lock().units.read += units;
        }
        Ok(())
    }
}

/// `base` and one more `op` request, whose write units `units` gives for the requests
/// a record carries: a write that stores its own cost on the record it writes. Its
/// size grows with that cost, so the units are found again until they hold.
pub(super) fn with_own(
    base: Option<&Requests>,
    op: &str,
    units: impl Fn(&Requests) -> f64,
) -> Requests {
    let mut counted = base.cloned().unwrap_or_default();
    counted.count(op, 0.0);
    let mut own = 0.0;
    loop {
        let mut candidate = counted.clone();
        candidate.wru += own;
        let needed = units(&candidate);
        if needed <= own {
            return candidate;
        }
        own = needed;
    }
}

/// Write units of a put of `item` (one started KB each).
pub(super) fn put_units(item: &HashMap<String, AttributeValue>) -> f64 {
    kb(attrs_size(item))
}

/// Write units of an update or check of the item at `key` setting `values`: its key
/// and values stand for the item, as in [`write_units`].
pub(super) fn update_units(
    key: &HashMap<String, AttributeValue>,
    values: &HashMap<String, AttributeValue>,
) -> f64 {
    kb(attrs_size(key) + attrs_size(values))
}

fn kb(size: usize) -> f64 {
    size.div_ceil(1024).max(1) as f64
}

/// [`item_size`] of an item before it is sent.
fn attrs_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + attr_size(v)).sum()
}

/// [`value_size`] of a value before it is sent.
fn attr_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(x) => x.len(),
        AttributeValue::N(x) => number_size(x),
        AttributeValue::B(x) => x.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(x) => x.iter().map(String::len).sum(),
        AttributeValue::Ns(x) => x.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(x) => x.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(x) => 3 + x.iter().map(|e| attr_size(e) + 1).sum::<usize>(),
        AttributeValue::M(x) => {
            3 + x
                .iter()
                .map(|(k, e)| k.len() + attr_size(e) + 1)
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// The bytes DynamoDB counts for a number: about one per two significant digits, plus
/// one.
fn number_size(s: &str) -> usize {
    let digits = s.trim_start_matches('-').replace('.', "");
    let significant = digits.trim_start_matches('0').len().max(1);
    significant.div_ceil(2) + 1
}

/// The write units of a DynamoDB request.
fn write_units(op: &str, body: &Value) -> f64 {
    let changed = |v: &Value| {
        // An update or check: its key and values stand for the item.
        item_size(&v["Key"]) + item_size(&v["ExpressionAttributeValues"])
    };
    match op {
        "PutItem" => kb(item_size(&body["Item"])),
        "UpdateItem" => kb(changed(body)),
        "DeleteItem" => kb(item_size(&body["Key"])),
        "BatchWriteItem" => body["RequestItems"]
            .as_object()
            .into_iter()
            .flat_map(|tables| tables.values())
            .flat_map(|reqs| reqs.as_array().into_iter().flatten())
            .map(|r| match r.get("PutRequest") {
                Some(p) => kb(item_size(&p["Item"])),
                None => 1.0,
            })
            .sum(),
        "TransactWriteItems" => body["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                2.0 * match (t.get("Put"), t.get("Update"), t.get("Delete")) {
                    (Some(p), _, _) => kb(item_size(&p["Item"])),
                    (_, Some(u), _) => kb(changed(u)),
                    (_, _, Some(d)) => kb(item_size(&d["Key"])),
                    // A ConditionCheck is billed as a transactional write of its item.
                    _ => kb(changed(&t["ConditionCheck"])),
                }
            })
            .sum(),
        _ => 0.0,
    }
}

/// The read units of a DynamoDB response.
fn read_units(op: &str, body: &Value, consistent: bool) -> f64 {
    let factor = if consistent { 1.0 } else { 0.5 };
    let blocks = |size: usize| size.div_ceil(4096).max(1) as f64;
    match op {
        "GetItem" => factor * blocks(item_size(&body["Item"])),
        "Query" | "Scan" => {
            let items: Vec<usize> = body["Items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(item_size)
                .collect();
            // A filter drops items after they were read: each counts at the average
            // size of those returned (or a small record's, when none were).
            let returned: usize = items.iter().sum();
            let average = if items.is_empty() {
                512
            } else {
                returned / items.len()
            };
            let scanned = body["ScannedCount"].as_u64().unwrap_or(items.len() as u64) as usize;
            let filtered = scanned.saturating_sub(items.len());
            factor * blocks(returned + filtered * average)
        }
        _ => 0.0,
    }
}

/// The size DynamoDB counts for an item (or a map of attributes) in its JSON form:
/// each attribute's name and value.
pub(super) fn item_size(item: &Value) -> usize {
    item.as_object()
        .map_or(0, |m| m.iter().map(|(k, v)| k.len() + value_size(v)).sum())
}

fn value_size(v: &Value) -> usize {
    let Some((kind, inner)) = v.as_object().and_then(|m| m.iter().next()) else {
        return 0;
    };
    let number = number_size;
    match kind.as_str() {
        "S" | "B" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(1, number),
        "BOOL" | "NULL" => 1,
        "SS" | "BS" => inner.as_array().map_or(0, |a| {
            a.iter().filter_map(Value::as_str).map(str::len).sum()
        }),
        "NS" => inner
            .as_array()
            .map_or(0, |a| a.iter().filter_map(Value::as_str).map(number).sum()),
        "L" => {
            3 + inner
                .as_array()
                .map_or(0, |a| a.iter().map(|e| value_size(e) + 1).sum())
        }
        "M" => {
            3 + inner.as_object().map_or(0, |m| {
                m.iter().map(|(k, e)| k.len() + value_size(e) + 1).sum()
            })
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn capacity_follows_dynamodbs_rules() {
        let small = json!({"pk": {"S": "AG#1"}, "n": {"N": "12345"}, "ok": {"BOOL": true}});
        assert_eq!(item_size(&small), 2 + 4 + 1 + 4 + 2 + 1);
        let big = json!({"doc": {"S": "x".repeat(1500)}});
        assert_eq!(write_units("PutItem", &json!({"Item": small})), 1.0);
        assert_eq!(write_units("PutItem", &json!({"Item": big})), 2.0);
        let tx = json!({"TransactItems": [
            {"Put": {"Item": big}},
            {"Update": {"Key": {"pk": {"S": "a"}}, "ExpressionAttributeValues": {":s": {"S": "DONE"}}}},
            {"ConditionCheck": {"Key": {"pk": {"S": "a"}}}},
        ]});
        assert_eq!(
            write_units("TransactWriteItems", &tx),
            2.0 * (2.0 + 1.0 + 1.0)
        );
        let page = json!({"Items": [small, small], "Count": 2, "ScannedCount": 3});
        assert_eq!(read_units("Query", &page, true), 1.0);
        assert_eq!(read_units("Query", &page, false), 0.5);
        let large = json!({"Items": [{"doc": {"S": "x".repeat(5000)}}], "ScannedCount": 1});
        assert_eq!(read_units("Query", &large, true), 2.0);
        assert_eq!(read_units("GetItem", &json!({}), true), 1.0);
    }

    #[test]
    fn an_item_is_sized_the_same_before_it_is_sent_and_on_the_wire() {
        let sent = HashMap::from([
            ("pk".to_owned(), AttributeValue::S("AG#1".into())),
            ("n".to_owned(), AttributeValue::N("-12.345".into())),
            ("ok".to_owned(), AttributeValue::Bool(true)),
            (
                "m".to_owned(),
                AttributeValue::M(HashMap::from([(
                    "l".to_owned(),
                    AttributeValue::L(vec![AttributeValue::S("ab".into())]),
                )])),
            ),
        ]);
        let wire = json!({"pk": {"S": "AG#1"}, "n": {"N": "-12.345"}, "ok": {"BOOL": true},
            "m": {"M": {"l": {"L": [{"S": "ab"}]}}}});
        assert_eq!(attrs_size(&sent), item_size(&wire));
    }

    #[test]
    fn a_write_that_carries_its_own_cost_counts_the_units_its_record_ends_up_with() {
        let mut base = Requests::default();
        base.count("DynamoDB.Query", 0.0);
        // A record whose size is 1,000 bytes plus 10 per write unit it carries: 1 KB at
        // first guess, 2 KB once it carries 1 unit, and 2 KB carrying 2.
        let units = |r: &Requests| kb(1_000 + 10 * r.wru as usize + 20);
        let own = with_own(Some(&base), "DynamoDB.PutItem", units);
        assert_eq!(own.ops["DynamoDB.PutItem"], 1);
        assert_eq!(own.ops["DynamoDB.Query"], 1);
        assert_eq!(own.wru, 2.0);
        assert_eq!(
            units(&own),
            own.wru,
            "the units hold for the record as written"
        );
    }
}
