//! The AWS backend: DynamoDB for the records, SQS FIFO for the sessions queue, a standard
//! SQS queue for hook deliveries, EventBridge for hooks that target a bus.
//!
//! SDK clients are built once per process ([`AwsClients::new`]) and shared. Every request
//! goes through a [`RequestCounter`], so benchmarks can report AWS requests per heartbeat
//! cycle by operation — the number a user prices a fleet with.

mod dynamodb;
mod eventbridge;
mod metrics;
mod provision;
mod secrets;
mod sqs;

use std::time::Duration;

use aws_config::BehaviorVersion;

pub use dynamodb::{DUE_INDEX, DUE_SHARDS, DynamoStore};
pub use eventbridge::{EVENT_SOURCE, EventBridgeBus};
pub use metrics::RequestCounter;
pub use provision::{create_hooks_queue, create_sessions_queue, create_table};
pub use secrets::{SecretParameters, SecretsError};
pub use sqs::{SqsHookQueue, SqsQueue};

/// Where the AWS resources are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsSettings {
    /// The DynamoDB table (`PULSE_TABLE`).
    pub table: String,
    /// The sessions FIFO queue's URL (`PULSE_SESSIONS_QUEUE_URL`).
    pub sessions_queue_url: String,
    /// The hooks standard queue's URL (`PULSE_HOOKS_QUEUE_URL`); unset, hooks are not
    /// emitted (logged at start).
    pub hooks_queue_url: Option<String>,
    /// The hooks dead-letter queue's URL (`PULSE_HOOKS_DLQ_URL`).
    pub hooks_dlq_url: Option<String>,
    /// An endpoint to use instead of AWS's (an emulator); `AWS_ENDPOINT_URL` works too.
    pub endpoint_url: Option<String>,
}

/// The SDK clients, with a shared request counter.
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// SQS.
    pub sqs: aws_sdk_sqs::Client,
    /// EventBridge.
    pub eventbridge: aws_sdk_eventbridge::Client,
    /// Requests sent so far, by operation.
    pub counter: RequestCounter,
}

impl AwsClients {
    /// Loads the SDK configuration from the environment (region, credentials; in Lambda
    /// from the execution role) and builds the clients. No network calls are made here.
    pub async fn new(endpoint_url: Option<&str>) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        let sdk = loader.load().await;
        Self::from_sdk_config(&sdk)
    }

    /// Clients for a local emulator: fixed test credentials and region, no lookups.
    pub fn for_emulator(endpoint_url: &str) -> Self {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(endpoint_url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
                aws_sdk_dynamodb::config::Credentials::new(
                    "test",
                    "test",
                    None,
                    None,
                    "pulse-emulator",
                ),
            ))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            )
            .build();
        Self::from_sdk_config(&sdk)
    }

    fn from_sdk_config(sdk: &aws_config::SdkConfig) -> Self {
        let counter = RequestCounter::default();
        let dynamodb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(sdk)
                .interceptor(counter.clone())
                .build(),
        );
        let sqs = aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::config::Builder::from(sdk)
                .interceptor(counter.clone())
                .build(),
        );
        let eventbridge = aws_sdk_eventbridge::Client::from_conf(
            aws_sdk_eventbridge::config::Builder::from(sdk)
                .interceptor(counter.clone())
                .build(),
        );
        Self {
            dynamodb,
            sqs,
            eventbridge,
            counter,
        }
    }
}
