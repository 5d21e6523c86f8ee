//! The sessions queue on an SQS FIFO queue: group id = session, dedup id from the task.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};

use crate::domain::{Delivery, OutgoingTask, Receipt};
use crate::error::StoreError;
use crate::ports::{Backlog, SendFailure, SendReport, SessionQueue};

/// An SQS FIFO queue.
#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: super::LazyClient<aws_sdk_sqs::Client>,
    url: String,
}

impl SqsQueue {
    /// The queue at `url`.
    pub fn new(client: super::LazyClient<aws_sdk_sqs::Client>, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }
}

pub(super) fn err(op: &'static str) -> impl Fn(aws_sdk_sqs::error::BoxError) -> StoreError {
    move |e| StoreError::backend("sqs", op, e)
}

/// SQS takes whole seconds, at most 12 hours.
pub(super) fn seconds(d: Duration) -> i32 {
    d.as_secs().min(43_200) as i32
}

/// A queue's approximate counts, and its dead-letter queue's: the one its redrive
/// policy names, else `dead_letter_url`.
pub(super) async fn backlog(
    client: &aws_sdk_sqs::Client,
    url: &str,
    dead_letter_url: Option<&str>,
) -> Result<Backlog, StoreError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesDelayed)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(A::RedrivePolicy)
        .send()
        .await
        .map_err(|e| err("read queue attributes")(e.into()))?;
    let attrs = attrs.attributes().cloned().unwrap_or_default();
    let n = |a: &A| {
        attrs
            .get(a)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let dead = match dead_letter_queue(client, &attrs, dead_letter_url).await? {
        Some(dlq) => {
            let out = client
                .get_queue_attributes()
                .queue_url(dlq)
                .attribute_names(A::ApproximateNumberOfMessages)
                .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .map_err(|e| err("read dead-letter queue attributes")(e.into()))?;
            let a = out.attributes().cloned().unwrap_or_default();
            let m = |k: &A| a.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            Some(m(&A::ApproximateNumberOfMessages) + m(&A::ApproximateNumberOfMessagesNotVisible))
        }
        None => None,
    };
    Ok(Backlog {
        waiting: n(&A::ApproximateNumberOfMessages) + n(&A::ApproximateNumberOfMessagesDelayed),
        in_flight: n(&A::ApproximateNumberOfMessagesNotVisible),
        dead,
    })
}

/// The URL of the dead-letter queue a queue's attributes (with its redrive policy) name,
/// else `dead_letter_url`.
async fn dead_letter_queue(
    client: &aws_sdk_sqs::Client,
    attrs: &std::collections::HashMap<aws_sdk_sqs::types::QueueAttributeName, String>,
    dead_letter_url: Option<&str>,
) -> Result<Option<String>, StoreError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    // The redrive policy names the DLQ by ARN; its URL comes from its name.
    let redrive = attrs
        .get(&A::RedrivePolicy)
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
        .and_then(|p| p["deadLetterTargetArn"].as_str().map(str::to_owned))
        .and_then(|arn| arn.rsplit(':').next().map(str::to_owned));
    let dead_url = match redrive {
        Some(name) => Some(
            client
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(|e| err("find the dead-letter queue")(e.into()))?
                .queue_url()
                .unwrap_or_default()
                .to_owned(),
        ),
        None => dead_letter_url.map(str::to_owned),
    };
    Ok(dead_url.filter(|u| !u.is_empty()))
}

/// Moves up to `max` messages of the dead-letter queue of the queue at `url` back onto
/// it, oldest first as SQS hands them out: each is sent again in its group (with a new
/// deduplication id, so the five-minute window does not drop it), then deleted from the
/// dead-letter queue. A message sent and not yet deleted (a failure between the two)
/// comes back in the dead-letter queue and would be sent once more: its task is one the
/// worker runs at most once all the same (a claim, a turn found by its signals).
async fn redrive(client: &aws_sdk_sqs::Client, url: &str, max: usize) -> Result<u64, StoreError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::RedrivePolicy)
        .send()
        .await
        .map_err(|e| err("read queue attributes")(e.into()))?;
    let attrs = attrs.attributes().cloned().unwrap_or_default();
    let Some(dlq) = dead_letter_queue(client, &attrs, None).await? else {
        return Err(StoreError::backend(
            "sqs",
            "redrive dead letters",
            format!("the queue {url} has no redrive policy naming a dead-letter queue"),
        ));
    };
    let fifo = url.ends_with(".fifo");
    let mut moved = 0u64;
    while (moved as usize) < max {
        let out = client
            .receive_message()
            .queue_url(&dlq)
            .max_number_of_messages((max - moved as usize).clamp(1, 10) as i32)
            .visibility_timeout(60)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .map_err(|e| err("receive dead letters")(e.into()))?;
        let messages = out.messages();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let mut send = client
                .send_message()
                .queue_url(url)
                .message_body(m.body().unwrap_or_default());
            if fifo {
                let group = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                    .cloned()
                    .unwrap_or_else(|| "redriven".to_owned());
                let id = m.message_id().unwrap_or_default();
                send = send.message_group_id(group).message_deduplication_id(
                    format!("redrive-{id}")
                        .chars()
                        .take(128)
                        .collect::<String>(),
                );
            }
            send.send()
                .await
                .map_err(|e| err("redrive dead letter")(e.into()))?;
            client
                .delete_message()
                .queue_url(&dlq)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .map_err(|e| err("delete redriven dead letter")(e.into()))?;
            moved += 1;
        }
    }
    Ok(moved)
}

#[async_trait]
impl SessionQueue for SqsQueue {
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        backlog(&self.client, &self.url, None).await
    }

    async fn redrive(&self, max: usize) -> Result<u64, StoreError> {
        redrive(&self.client, &self.url, max).await
    }

    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError> {
        let mut report = SendReport::default();
        for (chunk_no, chunk) in tasks.chunks(10).enumerate() {
            let mut req = self.client.send_message_batch().queue_url(&self.url);
            for (i, t) in chunk.iter().enumerate() {
                req = req.entries(
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_group_id(t.group.as_str())
                        .message_deduplication_id(t.dedup_id.as_str())
                        .message_body(t.envelope.encode())
                        .build()
                        .map_err(|e| err("send batch")(e.into()))?,
                );
            }
            let out = req.send().await.map_err(|e| err("send batch")(e.into()))?;
            record_failed(&mut report, chunk_no * 10, out.failed());
        }
        Ok(report)
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(seconds(visibility).max(1))
            .wait_time_seconds(0)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| err("receive")(e.into()))?;
        Ok(out
            .messages()
            .iter()
            .map(|m| {
                let attr = |k: MessageSystemAttributeName| {
                    m.attributes()
                        .and_then(|a| a.get(&k))
                        .cloned()
                        .unwrap_or_default()
                };
                Delivery {
                    message_id: m.message_id().unwrap_or_default().into(),
                    receipt: m.receipt_handle().unwrap_or_default().into(),
                    group: attr(MessageSystemAttributeName::MessageGroupId),
                    body: m.body().unwrap_or_default().to_owned(),
                    receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount)
                        .parse()
                        .unwrap_or(1),
                }
            })
            .collect())
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt.as_str())
            .send()
            .await
            .map_err(|e| err("delete message")(e.into()))?;
        Ok(())
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), StoreError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt.as_str())
            .visibility_timeout(seconds(delay))
            .send()
            .await
            .map_err(|e| err("change visibility")(e.into()))?;
        Ok(())
    }
}

/// Adds the entries SendMessageBatch did not take to `report`; entry ids are their
/// indexes in the batch, which starts at `offset` of the slice sent.
pub(super) fn record_failed(
    report: &mut SendReport,
    offset: usize,
    failed: &[BatchResultErrorEntry],
) {
    for f in failed {
        let i: usize = f.id().parse().unwrap_or(0);
        report.failed.push((
            offset + i,
            SendFailure {
                code: f.code().to_owned(),
                message: f.message().unwrap_or("no message").to_owned(),
            },
        ));
    }
}
