//! Agents' schedules (reminders) on DynamoDB: `SC#<id>` documents in the agent's
//! partition.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Schedule, ScheduleId};
use crate::error::StoreError;
use crate::ports::ScheduleStore;

#[async_trait]
impl ScheduleStore for DynamoStore {
    async fn put_schedule(&self, schedule: &Schedule) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(doc_item(
                agent_pk(&schedule.agent_id),
                schedule_sk(&schedule.id),
                schedule,
            )))
            .send()
            .await
            .map_err(backend("write schedule"))?;
        Ok(())
    }

    async fn schedules(&self, agent: &AgentId) -> Result<Vec<Schedule>, StoreError> {
        self.query_prefix("read schedules", &agent_pk(agent), "SC#", false, None)
            .await?
            .iter()
            .map(read_doc)
            .collect()
    }

    async fn delete_schedule(&self, agent: &AgentId, id: &ScheduleId) -> Result<bool, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key(agent_pk(agent), schedule_sk(id))))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(backend("delete schedule"))?;
        Ok(out.attributes.is_some_and(|a| !a.is_empty()))
    }
}
