//! The cloud requests one unit of work made: a heartbeat (its claim, run and finish) or
//! a conversation turn. Counted where the AWS adapters send them (see [`crate::tally`]),
//! kept on the heartbeat or turn record, and priced by `pulse usage`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Requests by operation, with the DynamoDB capacity they consume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    /// Requests sent, by `Service.Operation` (`DynamoDB.Query`, `SQS.SendMessage`),
    /// retries included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ops: BTreeMap<String, u32>,
    /// DynamoDB write request units.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wru: f64,
    /// DynamoDB read request units.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rru: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Requests {
    /// Nothing counted.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.wru == 0.0 && self.rru == 0.0
    }
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Requests) {
        for (op, n) in &other.ops {
            *self.ops.entry(op.clone()).or_default() += n;
        }
        self.wru += other.wru;
        self.rru += other.rru;
    }
    /// One more `op` request consuming `wru` write units.
    pub fn count(&mut self, op: &str, wru: f64) {
        match self.ops.get_mut(op) {
            Some(n) => *n += 1,
            None => {
                self.ops.insert(op.to_owned(), 1);
            }
        }
        self.wru += wru;
    }
    /// All requests, whatever the operation.
    pub fn total(&self) -> u64 {
        self.ops.values().map(|n| u64::from(*n)).sum()
    }
    /// Requests to one service (`DynamoDB`, `SQS`, `EventBridge`).
    pub fn of_service(&self, service: &str) -> u64 {
        self.ops
            .iter()
            .filter(|(op, _)| op.split('.').next() == Some(service))
            .map(|(_, n)| u64::from(*n))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_operation_and_service() {
        let mut a = Requests::default();
        assert!(a.is_empty());
        a.count("DynamoDB.Query", 0.0);
        a.count("DynamoDB.TransactWriteItems", 4.0);
        a.rru += 0.5;
        let mut b = Requests::default();
        b.count("DynamoDB.Query", 0.0);
        b.count("SQS.SendMessage", 0.0);
        a.add(&b);
        assert_eq!(a.ops["DynamoDB.Query"], 2);
        assert_eq!(a.total(), 4);
        assert_eq!(a.of_service("DynamoDB"), 3);
        assert_eq!(a.of_service("SQS"), 1);
        assert_eq!((a.wru, a.rru), (4.0, 0.5));
        let json = serde_json::to_string(&Requests::default()).unwrap();
        assert_eq!(json, "{}", "an empty count stores nothing");
    }
}
