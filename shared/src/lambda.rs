//! Lambda handlers: event shape in, one engine call, response shape out. Each function's
//! `main` only builds the engine and hands these to `lambda_runtime::run`, so tests call
//! them with real event payloads.

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use jiff::Timestamp;
use tracing::error;

use crate::domain::Delivery;
use crate::engine::{Dispatcher, SweepReport, Sweeper, Worker};

/// A sweep that met problems. Returned to Lambda so the invocation counts as an error
/// (alarms see it); the next scheduled sweep retries whatever was missed.
#[derive(Debug, thiserror::Error)]
#[error("the sweep met {count} problems (each logged); claimed {claimed}, queued {queued}")]
pub struct SweepFailed {
    /// Problems met.
    pub count: usize,
    /// Heartbeats claimed anyway.
    pub claimed: usize,
    /// Jobs queued anyway.
    pub queued: usize,
}

/// EventBridge's scheduled event → one sweep at `now`.
pub async fn sweep(
    sweeper: &Sweeper,
    _event: CloudWatchEvent,
    now: Timestamp,
) -> Result<SweepReport, SweepFailed> {
    let report = sweeper.sweep_once(now).await;
    if report.errors.is_empty() {
        return Ok(report);
    }
    for e in &report.errors {
        error!(error = %e, "sweep problem");
    }
    Err(SweepFailed {
        count: report.errors.len(),
        claimed: report.claimed,
        queued: report.queued,
    })
}

/// An SQS FIFO batch → the tasks run in order per group; the response lists the
/// messages Lambda must leave on the queue (a failed one and the rest of its group).
pub async fn sessions_batch(worker: &Worker, event: SqsEvent) -> SqsBatchResponse {
    let batch: Vec<Delivery> = event.records.iter().map(delivery).collect();
    let outcome = worker.process_batch(&batch).await;
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

/// An SQS batch from the hooks queue → one attempt per message (a retry is a new
/// message with a delay); the response lists only messages that failed for a reason
/// outside the delivery (storage or queue unavailable), which SQS brings back.
pub async fn hooks_batch(dispatcher: &Dispatcher, event: SqsEvent) -> SqsBatchResponse {
    let batch: Vec<Delivery> = event.records.iter().map(delivery).collect();
    let report = dispatcher.process_batch(&batch).await;
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = report
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
