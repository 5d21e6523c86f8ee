//! The hooks queue on a standard SQS queue (FIFO queues take no per-message delay,
//! which retries need).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::session_queue::{SqsQueue, err, record_failed};
use crate::domain::{Delivery, HookTask, Receipt};
use crate::error::StoreError;
use crate::ports::{Backlog, HookMessage, HookQueue, SendReport, SessionQueue};

/// The hooks queue on a standard SQS queue: per-message delay (at most 15 minutes),
/// redelivery after the visibility timeout, and a dead-letter queue that exhausted
/// deliveries are sent to.
#[derive(Clone, Debug)]
pub struct SqsHookQueue {
    client: super::LazyClient<aws_sdk_sqs::Client>,
    url: String,
    dead_letter_url: Option<String>,
}

impl SqsHookQueue {
    /// The queue at `url`, dead-lettering to `dead_letter_url` if given.
    pub fn new(
        client: super::LazyClient<aws_sdk_sqs::Client>,
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
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        super::session_queue::backlog(&self.client, &self.url, self.dead_letter_url.as_deref())
            .await
    }

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
            record_failed(&mut report, chunk_no * 10, out.failed());
        }
        Ok(report)
    }

    async fn receive(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, StoreError> {
        SqsQueue::new(self.client.clone(), &self.url)
            .receive(max, visibility)
            .await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
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
