//! The event log on DynamoDB: windows read by cursor, with the agent's record.

use async_trait::async_trait;

use super::DynamoStore;
use super::codec::*;
use super::keys::*;
use crate::domain::{AgentId, Event, EventCursor, EventId};
use crate::error::StoreError;
use crate::ports::{AgentStore, EventLog, Window};

#[async_trait]
impl EventLog for DynamoStore {
    async fn append(&self, event: &Event) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(event_item(event)))
            .customize()
            .config_override(self.event_write_config())
            .send()
            .await
            .map_err(backend("append event"))?;
        Ok(())
    }

    /// The same write: its operation timeout bounds how late an event may become
    /// visible, which no event needs more than another.
    async fn append_in_session(&self, event: &Event) -> Result<(), StoreError> {
        self.append(event).await
    }

    async fn read_window(
        &self,
        agent: &AgentId,
        start: &EventCursor,
        end: &EventCursor,
        limit: usize,
    ) -> Result<Window, StoreError> {
        let pk = agent_pk(agent);
        let mut found = None;
        let mut has_hooks = None;
        let mut events = Vec::new();
        let mut truncated = false;
        let mut start_key = None;
        loop {
            // From the window's start to the agent's record, which sorts last.
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND sk BETWEEN :lo AND :hi")
                .filter_expression("attribute_not_exists(#own)")
                .expression_attribute_names("#own", "own")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":lo", s(format!("EV#{}", start.as_str())))
                .expression_attribute_values(":hi", s(AGENT_SK))
                .consistent_read(true)
                .set_exclusive_start_key(start_key)
                .send()
                .await
                .map_err(backend("read event window"))?;
            let mut past_end = false;
            for item in out.items() {
                if item
                    .get("sk")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|k| k == AGENT_SK)
                {
                    found = Some(read_agent(item)?);
                    has_hooks = item.get(HAS_HOOKS).and_then(|v| v.as_bool().ok()).copied();
                    continue;
                }
                let e: Event = read_doc(item)?;
                if !start.is_before(&e.id) {
                    continue;
                }
                if !end.covers(&e.id) {
                    past_end = true;
                } else if events.len() == limit {
                    truncated = true;
                } else {
                    events.push(e);
                }
            }
            start_key = out.last_evaluated_key;
            // Stop paging once the window is read; fetch the agent directly if the
            // remaining pages (newer events) were not read.
            if start_key.is_none() {
                break;
            }
            if truncated || past_end {
                found = self.get_agent(agent).await?;
                has_hooks = None;
                break;
            }
        }
        Ok(Window {
            agent: found,
            events,
            truncated,
            has_hooks,
        })
    }

    async fn get_events(&self, agent: &AgentId, ids: &[EventId]) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(item) = self
                .get("get events", key(agent_pk(agent), event_sk(id)))
                .await?
            {
                out.push(read_doc(&item)?);
            }
        }
        out.sort_by(|a: &Event, b: &Event| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn events_page(
        &self,
        agent: &AgentId,
        after: Option<&EventCursor>,
        before: Option<&EventId>,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        // Exclusive bounds on the sort key: `EV#` + the cursor (ids are longer, so an id
        // equal to the cursor sorts after it and is skipped below), and `EV#` + `before`.
        let lo = format!("EV#{}", after.map_or("", |c| c.as_str()));
        let hi = format!("EV#{}", before.map_or("~", |id| id.as_str()));
        self.query_between(
            "list events",
            &agent_pk(agent),
            lo.as_str()..=hi.as_str(),
            true,
            limit,
            |e: &Event| {
                after.is_none_or(|c| c.is_before(&e.id))
                    && before.is_none_or(|b| e.id.as_str() < b.as_str())
            },
        )
        .await
    }
}
