//! Lambda event shapes to and from the engine's types, so each function's `main` is only
//! wiring.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsMessage};

use crate::domain::Delivery;
use crate::engine::BatchOutcome;

/// An SQS record as a queue delivery. Lambda's event source mapping receives and deletes
/// messages itself, so the receipt is only informative here.
pub fn delivery(m: &SqsMessage) -> Delivery {
    let attr = |k: &str| m.attributes.get(k).cloned().unwrap_or_default();
    Delivery {
        message_id: m.message_id.clone().unwrap_or_default(),
        receipt: m.receipt_handle.clone().unwrap_or_default(),
        group: attr("MessageGroupId"),
        body: m.body.clone().unwrap_or_default(),
        receive_count: attr("ApproximateReceiveCount").parse().unwrap_or(1),
    }
}

/// The partial batch response: Lambda deletes every message not listed.
pub fn batch_response(outcome: BatchOutcome) -> SqsBatchResponse {
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = outcome
        .failed
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            f
        })
        .collect();
    resp
}
