//! Switching tools and subscriptions on and off, built-in ones included: the built-in
//! heartbeat agent and its subscription are implicit until first switched, so their
//! records are stored first. The CLI and the dashboard both switch through here.

use crate::domain::{HEARTBEAT_AGENT, Subscription, SubscriptionId, Tool, ToolName};
use crate::error::StoreError;
use crate::ports::Store;

/// Enables or disables a tool; `NotFound` if there is none by that name.
pub async fn switch_tool(
    store: &dyn Store,
    name: &ToolName,
    active: bool,
) -> Result<(), StoreError> {
    if name.as_str() == HEARTBEAT_AGENT {
        match store.add_tool(&Tool::heartbeat_agent()).await {
            Ok(()) | Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    store.set_tool_active(name, active).await
}

/// Enables or disables a subscription; `NotFound` if it does not exist.
pub async fn switch_subscription(
    store: &dyn Store,
    id: &SubscriptionId,
    active: bool,
) -> Result<(), StoreError> {
    let builtin = Subscription::heartbeat_agent();
    if *id == builtin.id {
        match store.add_subscription(&builtin).await {
            Ok(()) | Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    store.set_subscription_active(id, active).await
}
