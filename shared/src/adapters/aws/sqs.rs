//! The queues on SQS: the sessions queue on a FIFO queue (group id = session, dedup id
//! from the task), and the hooks queue on a standard queue (FIFO queues take no
//! per-message delay, which retries need).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{MessageSystemAttributeName, SendMessageBatchRequestEntry};

use crate::domain::{Delivery, HookTask, OutgoingTask};
use crate::error::StoreError;
use crate::ports::{HookMessage, HookQueue, SendReport, SessionQueue};

/// An SQS FIFO queue.
#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsQueue {
    /// The queue at `url`.
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }
}

fn err(op: &'static str) -> impl Fn(aws_sdk_sqs::error::BoxError) -> StoreError {
    move |e| StoreError::backend("sqs", op, e)
}

/// SQS takes whole seconds, at most 12 hours.
fn seconds(d: Duration) -> i32 {
    d.as_secs().min(43_200) as i32
}

#[async_trait]
impl SessionQueue for SqsQueue {
    async fn send(&self, tasks: &[OutgoingTask]) -> Result<SendReport, StoreError> {
        let mut report = SendReport::default();
        for (chunk_no, chunk) in tasks.chunks(10).enumerate() {
            let mut req = self.client.send_message_batch().queue_url(&self.url);
            for (i, t) in chunk.iter().enumerate() {
                req = req.entries(
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_group_id(t.group.as_str())
                        .message_deduplication_id(&t.dedup_id)
                        .message_body(t.envelope.encode())
                        .build()
                        .map_err(|e| err("send batch")(e.into()))?,
                );
            }
            let out = req.send().await.map_err(|e| err("send batch")(e.into()))?;
            for f in out.failed() {
                let i: usize = f.id().parse().unwrap_or(0);
                report.failed.push((
                    chunk_no * 10 + i,
                    format!("{}: {}", f.code(), f.message().unwrap_or("no message")),
                ));
            }
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
                    message_id: m.message_id().unwrap_or_default().to_owned(),
                    receipt: m.receipt_handle().unwrap_or_default().to_owned(),
                    group: attr(MessageSystemAttributeName::MessageGroupId),
                    body: m.body().unwrap_or_default().to_owned(),
                    receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount)
                        .parse()
                        .unwrap_or(1),
                }
            })
            .collect())
    }

    async fn ack(&self, receipt: &str) -> Result<(), StoreError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| err("delete message")(e.into()))?;
        Ok(())
    }

    async fn release(&self, receipt: &str, delay: Duration) -> Result<(), StoreError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds(delay))
            .send()
            .await
            .map_err(|e| err("change visibility")(e.into()))?;
        Ok(())
    }
}

/// The hooks queue on a standard SQS queue: per-message delay (at most 15 minutes),
/// redelivery after the visibility timeout, and a dead-letter queue that exhausted
/// deliveries are sent to.
#[derive(Clone, Debug)]
pub struct SqsHookQueue {
    client: aws_sdk_sqs::Client,
    url: String,
    dead_letter_url: Option<String>,
}

impl SqsHookQueue {
    /// The queue at `url`, dead-lettering to `dead_letter_url` if given.
    pub fn new(
        client: aws_sdk_sqs::Client,
        url: impl Into<String>,
        dead_letter_url: Option<String>,
    ) -> Self {
        Self {
            client,
            url: url.into(),
            dead_letter_url,
        }
    }
}

#[async_trait]
impl HookQueue for SqsHookQueue {
    async fn send(&self, messages: &[HookMessage]) -> Result<SendReport, StoreError> {
        let mut report = SendReport::default();
        for (chunk_no, chunk) in messages.chunks(10).enumerate() {
            let mut req = self.client.send_message_batch().queue_url(&self.url);
            for (i, m) in chunk.iter().enumerate() {
                req = req.entries(
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .delay_seconds(m.delay.as_secs().min(900) as i32)
                        .message_body(m.task.encode())
                        .build()
                        .map_err(|e| err("send hook batch")(e.into()))?,
                );
            }
            let out = req
                .send()
                .await
                .map_err(|e| err("send hook batch")(e.into()))?;
            for f in out.failed() {
                let i: usize = f.id().parse().unwrap_or(0);
                report.failed.push((
                    chunk_no * 10 + i,
                    format!("{}: {}", f.code(), f.message().unwrap_or("no message")),
                ));
            }
        }
        Ok(report)
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        SqsQueue::new(self.client.clone(), &self.url)
            .receive(max, visibility)
            .await
    }

    async fn ack(&self, receipt: &str) -> Result<(), StoreError> {
        SqsQueue::new(self.client.clone(), &self.url)
            .ack(receipt)
            .await
    }

    async fn dead_letter(&self, task: &HookTask, reason: &str) -> Result<(), StoreError> {
        let Some(dlq) = &self.dead_letter_url else {
            tracing::warn!(delivery_id = %task.delivery_id, reason, "no hooks dead-letter queue is configured (PULSE_HOOKS_DLQ_URL): the delivery is recorded EXHAUSTED only");
            return Ok(());
        };
        self.client
            .send_message()
            .queue_url(dlq)
            .message_body(task.encode())
            .message_attributes(
                "reason",
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(reason)
                    .build()
                    .map_err(|e| err("dead-letter hook")(e.into()))?,
            )
            .send()
            .await
            .map_err(|e| err("dead-letter hook")(e.into()))?;
        Ok(())
    }
}
