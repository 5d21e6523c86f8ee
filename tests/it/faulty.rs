//! A store that delegates to a real backend but can be told to fail one operation: how
//! the tests provoke an engine failure (storage failing mid-run) on real storage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use jiff::Timestamp;
use pulse_shared::domain::{
    AcceptOutcome, Acceptance, Action, Agent, AgentId, ClaimRequest, ConversationMessage, Event,
    EventCursor, EventId, Heartbeat, HeartbeatId, Hook, HookAttempt, HookDelivery, HookDeliveryId,
    HookId, HookRoute, Memory, Registry, SignalId, Subscription, SubscriptionId, Tool, ToolName,
    Turn, TurnId, Webhook, WebhookId, WebhookRequest,
};
use pulse_shared::error::StoreError;
use pulse_shared::ports::{
    ActionLog, AgentStore, ConversationStore, DuePage, EventLog, Finish, FinishOutcome,
    HeartbeatStore, HookStore, MemoryStore, PageToken, Store, ToolRegistry, TurnStart,
    WebhookStore, Window,
};

pub(crate) struct FaultyStore {
    inner: Arc<dyn Store>,
    fail_actions: AtomicBool,
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            fail_actions: AtomicBool::new(false),
        }
    }

    /// While set, starting an action fails as if the backend were down.
    pub(crate) fn fail_actions(&self, on: bool) {
        self.fail_actions.store(on, Ordering::SeqCst);
    }
}

#[async_trait]
impl AgentStore for FaultyStore {
    async fn create_agent(&self, agent: &Agent, first: &Heartbeat) -> Result<(), StoreError> {
        self.inner.create_agent(agent, first).await
    }
    async fn import_agents(&self, agents: &[(Agent, Heartbeat)]) -> Result<(), StoreError> {
        self.inner.import_agents(agents).await
    }
    async fn get_agent(&self, id: &AgentId) -> Result<Option<Agent>, StoreError> {
        self.inner.get_agent(id).await
    }
    async fn list_agents(&self) -> Result<Vec<Agent>, StoreError> {
        self.inner.list_agents().await
    }
    async fn record_interaction(&self, id: &AgentId, at: Timestamp) -> Result<(), StoreError> {
        self.inner.record_interaction(id, at).await
    }
    async fn agent_for_channel(&self, channel_id: &str) -> Result<Option<AgentId>, StoreError> {
        self.inner.agent_for_channel(channel_id).await
    }
}

#[async_trait]
impl HeartbeatStore for FaultyStore {
    fn due_shards(&self) -> u16 {
        self.inner.due_shards()
    }
    async fn due(
        &self,
        shard: u16,
        now: Timestamp,
        page: Option<PageToken>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        self.inner.due(shard, now, page, limit).await
    }
    async fn claim(
        &self,
        id: &HeartbeatId,
        req: &ClaimRequest,
    ) -> Result<Option<Heartbeat>, StoreError> {
        self.inner.claim(id, req).await
    }
    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        self.inner.finish(finish).await
    }
    async fn defer(&self, hb: &Heartbeat, until: Timestamp) -> Result<bool, StoreError> {
        self.inner.defer(hb, until).await
    }
    async fn renew(&self, hb: &Heartbeat, until: Timestamp) -> Result<bool, StoreError> {
        self.inner.renew(hb, until).await
    }
    async fn get_heartbeat(&self, id: &HeartbeatId) -> Result<Option<Heartbeat>, StoreError> {
        self.inner.get_heartbeat(id).await
    }
    async fn list_heartbeats(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        self.inner.list_heartbeats(agent, limit).await
    }
}

#[async_trait]
impl EventLog for FaultyStore {
    async fn append(&self, event: &Event) -> Result<(), StoreError> {
        self.inner.append(event).await
    }
    async fn read_window(
        &self,
        agent: &AgentId,
        start: &EventCursor,
        end: &EventCursor,
        limit: usize,
    ) -> Result<Window, StoreError> {
        self.inner.read_window(agent, start, end, limit).await
    }
    async fn get_events(&self, agent: &AgentId, ids: &[EventId]) -> Result<Vec<Event>, StoreError> {
        self.inner.get_events(agent, ids).await
    }
    async fn list_events(&self, agent: &AgentId, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.inner.list_events(agent, limit).await
    }
}

#[async_trait]
impl ActionLog for FaultyStore {
    async fn start_action(&self, action: &Action) -> Result<Option<Action>, StoreError> {
        if self.fail_actions.load(Ordering::SeqCst) {
            return Err(StoreError::backend(
                "test",
                "start action",
                "injected backend failure",
            ));
        }
        self.inner.start_action(action).await
    }
    async fn restart_action(
        &self,
        action: &Action,
        expected_attempt: u32,
    ) -> Result<bool, StoreError> {
        self.inner.restart_action(action, expected_attempt).await
    }
    async fn finish_action(&self, action: &Action, new_events: &[Event]) -> Result<(), StoreError> {
        self.inner.finish_action(action, new_events).await
    }
    async fn list_actions(&self, agent: &AgentId, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.inner.list_actions(agent, limit).await
    }
}

#[async_trait]
impl ToolRegistry for FaultyStore {
    async fn add_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        self.inner.add_tool(tool).await
    }
    async fn set_tool_active(&self, name: &ToolName, active: bool) -> Result<(), StoreError> {
        self.inner.set_tool_active(name, active).await
    }
    async fn add_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        self.inner.add_subscription(sub).await
    }
    async fn set_subscription_active(
        &self,
        id: &SubscriptionId,
        active: bool,
    ) -> Result<(), StoreError> {
        self.inner.set_subscription_active(id, active).await
    }
    async fn load_registry(&self) -> Result<Registry, StoreError> {
        self.inner.load_registry().await
    }
}

#[async_trait]
impl ConversationStore for FaultyStore {
    async fn answered(
        &self,
        agent: &AgentId,
        signals: &[SignalId],
    ) -> Result<Vec<(SignalId, TurnId)>, StoreError> {
        self.inner.answered(agent, signals).await
    }
    async fn begin_turn(
        &self,
        turn: &Turn,
        messages: &[ConversationMessage],
    ) -> Result<TurnStart, StoreError> {
        self.inner.begin_turn(turn, messages).await
    }
    async fn update_turn(&self, turn: &Turn) -> Result<(), StoreError> {
        self.inner.update_turn(turn).await
    }
    async fn get_turn(&self, agent: &AgentId, id: &TurnId) -> Result<Option<Turn>, StoreError> {
        self.inner.get_turn(agent, id).await
    }
    async fn recent_messages(
        &self,
        agent: &AgentId,
        limit: usize,
    ) -> Result<Vec<ConversationMessage>, StoreError> {
        self.inner.recent_messages(agent, limit).await
    }
}

#[async_trait]
impl MemoryStore for FaultyStore {
    async fn remember(&self, memory: &Memory) -> Result<(), StoreError> {
        self.inner.remember(memory).await
    }
    async fn memories(&self, agent: &AgentId, limit: usize) -> Result<Vec<Memory>, StoreError> {
        self.inner.memories(agent, limit).await
    }
}

#[async_trait]
impl WebhookStore for FaultyStore {
    async fn create_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        self.inner.create_webhook(webhook).await
    }
    async fn get_webhook(&self, id: &WebhookId) -> Result<Option<Webhook>, StoreError> {
        self.inner.get_webhook(id).await
    }
    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError> {
        self.inner.list_webhooks().await
    }
    async fn update_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        self.inner.update_webhook(webhook).await
    }
    async fn accept_webhook(&self, acceptance: &Acceptance) -> Result<AcceptOutcome, StoreError> {
        self.inner.accept_webhook(acceptance).await
    }
    async fn log_request(&self, request: &WebhookRequest) -> Result<(), StoreError> {
        self.inner.log_request(request).await
    }
    async fn list_requests(
        &self,
        id: &WebhookId,
        limit: usize,
    ) -> Result<Vec<WebhookRequest>, StoreError> {
        self.inner.list_requests(id, limit).await
    }
}

#[async_trait]
impl HookStore for FaultyStore {
    async fn create_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        self.inner.create_hook(hook).await
    }
    async fn get_hook(&self, id: &HookId) -> Result<Option<Hook>, StoreError> {
        self.inner.get_hook(id).await
    }
    async fn list_hooks(&self, agent: &AgentId) -> Result<Vec<Hook>, StoreError> {
        self.inner.list_hooks(agent).await
    }
    async fn hook_routes(&self, agent: &AgentId) -> Result<Vec<HookRoute>, StoreError> {
        self.inner.hook_routes(agent).await
    }
    async fn update_hook(&self, hook: &Hook) -> Result<(), StoreError> {
        self.inner.update_hook(hook).await
    }
    async fn get_delivery(&self, id: &HookDeliveryId) -> Result<Option<HookDelivery>, StoreError> {
        self.inner.get_delivery(id).await
    }
    async fn save_delivery(
        &self,
        delivery: &HookDelivery,
        attempt: Option<&HookAttempt>,
    ) -> Result<(), StoreError> {
        self.inner.save_delivery(delivery, attempt).await
    }
    async fn list_deliveries(
        &self,
        hook: &HookId,
        limit: usize,
    ) -> Result<Vec<HookDelivery>, StoreError> {
        self.inner.list_deliveries(hook, limit).await
    }
    async fn list_attempts(
        &self,
        delivery: &HookDeliveryId,
    ) -> Result<Vec<HookAttempt>, StoreError> {
        self.inner.list_attempts(delivery).await
    }
}
