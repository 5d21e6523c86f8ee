//! Creates the table and queue Pulse needs, as `infra/template.yaml` declares them. Used
//! against an emulator by the tests and `pulse bench`; in AWS, SAM creates them.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType,
};
use aws_sdk_sqs::types::QueueAttributeName;

use super::keys::DUE_INDEX;
use crate::error::StoreError;

/// Creates the single table: `pk`/`sk` strings, and the sparse due index (`due_shard`
/// string, `due_at` number, keys only).
pub async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), StoreError> {
    let attr = |name: &str, t: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(t)
            .build()
            .map_err(|e| StoreError::backend("dynamodb", "create table", e))
    };
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .map_err(|e| StoreError::backend("dynamodb", "create table", e))
    };
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk", ScalarAttributeType::S)?)
        .attribute_definitions(attr("sk", ScalarAttributeType::S)?)
        .attribute_definitions(attr("due_shard", ScalarAttributeType::S)?)
        .attribute_definitions(attr("due_at", ScalarAttributeType::N)?)
        .key_schema(key("pk", KeyType::Hash)?)
        .key_schema(key("sk", KeyType::Range)?)
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(DUE_INDEX)
                .key_schema(key("due_shard", KeyType::Hash)?)
                .key_schema(key("due_at", KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(|e| StoreError::backend("dynamodb", "create table", e))?,
        )
        .send()
        .await
        .map_err(|e| StoreError::backend("dynamodb", "create table", e))?;
    Ok(())
}

/// Creates a FIFO sessions queue (`name` must end in `.fifo`) and returns its URL.
pub async fn create_sessions_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
) -> Result<String, StoreError> {
    let out = client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        // Heartbeat jobs carry explicit deduplication ids; content dedup stays off.
        .attributes(QueueAttributeName::ContentBasedDeduplication, "false")
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .map_err(|e| StoreError::backend("sqs", "create queue", e))?;
    out.queue_url
        .ok_or_else(|| StoreError::backend("sqs", "create queue", "no queue URL returned"))
}

/// Creates a standard hooks queue and returns its URL.
pub async fn create_hooks_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
) -> Result<String, StoreError> {
    let out = client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::VisibilityTimeout, "120")
        .send()
        .await
        .map_err(|e| StoreError::backend("sqs", "create queue", e))?;
    out.queue_url
        .ok_or_else(|| StoreError::backend("sqs", "create queue", "no queue URL returned"))
}
