//! Hooks delivered to an EventBridge bus: one PutEvents entry, source `pulse`,
//! detail-type = the hook type, detail = the payload. Users route them with rules.

use async_trait::async_trait;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;

use crate::error::chain;
use crate::ports::{BusError, EventBus};

/// The source of every event Pulse puts.
pub const EVENT_SOURCE: &str = "pulse";

/// EventBridge through the SDK.
#[derive(Clone, Debug)]
pub struct EventBridgeBus {
    client: super::LazyClient<aws_sdk_eventbridge::Client>,
}

impl EventBridgeBus {
    /// A bus client.
    pub fn new(client: super::LazyClient<aws_sdk_eventbridge::Client>) -> Self {
        Self { client }
    }
}

#[async_trait]
impl EventBus for EventBridgeBus {
    async fn put_event(&self, bus: &str, detail_type: &str, detail: &str) -> Result<(), BusError> {
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(bus)
            .source(EVENT_SOURCE)
            .detail_type(detail_type)
            .detail(detail)
            .build();
        let out = self
            .client
            .put_events()
            .entries(entry)
            .send()
            .await
            .map_err(|e| BusError::Unreachable {
                bus: bus.to_owned(),
                reason: chain(&e),
            })?;
        // PutEvents answers 200 with per-entry failures.
        match out.entries().first() {
            Some(e) if e.error_code().is_some() => Err(BusError::Refused {
                bus: bus.to_owned(),
                code: e.error_code().unwrap_or_default().to_owned(),
                message: e.error_message().unwrap_or_default().to_owned(),
            }),
            _ if out.failed_entry_count() > 0 => Err(BusError::Refused {
                bus: bus.to_owned(),
                code: "FailedEntry".to_owned(),
                message: "no reason given".to_owned(),
            }),
            _ => Ok(()),
        }
    }
}
