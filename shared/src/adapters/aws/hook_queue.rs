//! The hooks queue on a standard SQS queue (FIFO queues take no per-message delay,
//! which retries need).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::session_queue::{SqsQueue, err, record_failed};
use crate::domain::{Delivery, HookTask, Receipt};
use crate::error::StoreError;
use crate::ports::{Backlog, HookMessage, HookQueue, SendReport, SessionQueue, Settle};

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

impl SqsHookQueue {
    /// The dead-letter queue's URL, or what to set.
    fn dead_letters(&self) -> Result<&str, StoreError> {
        self.dead_letter_url.as_deref().ok_or_else(|| {
            StoreError::backend(
                "sqs",
                "read dead hook deliveries",
                "no hooks dead-letter queue is configured: set PULSE_HOOKS_DLQ_URL (the stack's HooksDeadLetterQueueUrl)",
            )
        })
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

    async fn receive_dead(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, StoreError> {
        let dlq = self.dead_letters()?;
        // A long poll of a second asks every server of the queue, where a short one
        // samples a few and may answer nothing while letters are there.
        let out = self
            .client
            .receive_message()
            .queue_url(dlq)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(visibility.as_secs().clamp(1, 43_200) as i32)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| err("receive dead hook deliveries")(e.into()))?;
        Ok(out
            .messages()
            .iter()
            .map(|m| Delivery {
                message_id: m.message_id().unwrap_or_default().into(),
                receipt: m.receipt_handle().unwrap_or_default().into(),
                group: String::new(),
                body: m.body().unwrap_or_default().to_owned(),
                receive_count: 1,
            })
            .collect())
    }

    async fn settle_dead(&self, receipt: &Receipt, settle: Settle) -> Result<(), StoreError> {
        let dlq = SqsQueue::new(self.client.clone(), self.dead_letters()?);
        match settle {
            Settle::Delete => dlq.ack(receipt).await,
            Settle::Release(after) => dlq.release(receipt, after).await,
        }
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
