//! Leases on DynamoDB: one `LEASE#<name>` item, taken or renewed by one conditional put.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use jiff::Timestamp;
use serde_json::Value;

use super::DynamoStore;
use super::codec::*;
use crate::domain::{from_ms, to_ms};
use crate::error::StoreError;
use crate::ports::{Lease, LeaseStore};

fn lease_key(name: &str) -> Item {
    key(format!("LEASE#{name}"), "LEASE")
}

#[async_trait]
impl LeaseStore for DynamoStore {
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
        state: &Value,
    ) -> Result<bool, StoreError> {
        let mut item = lease_key(name);
        item.insert("holder".into(), s(holder));
        item.insert("until_ms".into(), n(to_ms(until)));
        item.insert("state".into(), s(state.to_string()));
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR holder = :me OR until_ms <= :now")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":now", n(to_ms(now)))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend("dynamodb", "hold lease", other)),
            },
        }
    }

    async fn get_lease(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        let Some(item) = self.get("read lease", lease_key(name)).await? else {
            return Ok(None);
        };
        let text = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .ok_or_else(|| StoreError::corrupt(format!("LEASE#{name}"), format!("no {k}")))
        };
        let until = item
            .get("until_ms")
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| StoreError::corrupt(format!("LEASE#{name}"), "no until_ms"))?;
        Ok(Some(Lease {
            name: name.to_owned(),
            holder: text("holder")?,
            until: from_ms(until),
            state: serde_json::from_str(&text("state")?)
                .map_err(|e| StoreError::corrupt(format!("LEASE#{name}"), e))?,
        }))
    }

    async fn release_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        state: &Value,
    ) -> Result<(), StoreError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(lease_key(name)))
            .update_expression("SET until_ms = :now, #state = :state")
            .condition_expression("holder = :me")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":now", n(to_ms(now)))
            .expression_attribute_values(":state", s(state.to_string()))
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                // Someone else holds it now: nothing of ours to give up.
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(()),
                other => Err(StoreError::backend("dynamodb", "release lease", other)),
            },
        }
    }
}
