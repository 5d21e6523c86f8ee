//! The outside world inside the simulation: the model, Discord, the agents' tool and
//! their hook receivers — in process, on virtual time, failing as the dice say, and
//! recording everything they receive so the invariants are checked from the outside as
//! well as from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use pulse_shared::domain::{
    ActionStatus, Agent, AgentId, AttemptStatus, DeliveryStatus, Hook, HookDelivery,
    HookDeliveryId, LlmRequest, LlmResponse, StopReason, Tool, ToolRequest, ToolResponse, ToolUse,
    Usage,
};
use pulse_shared::error::{DiscordError, LlmError};
use pulse_shared::ports::{
    Clock, DiscordApi, HookSender, Llm, LlmSelector, SendResult, Store, ToolCall, ToolFailure,
    ToolRunner,
};
use serde_json::json;

use crate::faults::{Dice, Fault, lock};

/// The event type the agents' tool is subscribed to.
pub const PING: &str = "sim.ping";
/// The agents' tool.
pub const TOOL: &str = "sim-echo";
/// How long the tool may take.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long Discord remembers a nonce (`enforce_nonce`): a post retried later than this
/// shows twice.
const NONCE_MEMORY: jiff::SignedDuration = jiff::SignedDuration::from_mins(5);

/// What the outside world received.
#[derive(Default)]
pub struct Seen {
    /// Tool calls answered with success, by action id. More than one is at-least-once
    /// delivery after a crash between the call and its record: the same action id lets
    /// the tool recognise it.
    pub tool_successes: BTreeMap<String, u32>,
    /// Tool calls made for an action already recorded as finished: never allowed.
    pub tool_after_finish: Vec<String>,
    /// Tool calls received.
    pub tool_calls: u64,
    /// Model requests received.
    pub llm_requests: u64,
    /// Messages that appeared in Discord, by nonce, with when each appeared.
    pub discord_posts: BTreeMap<String, Vec<Timestamp>>,
    /// Channel posts whose turn was found in the store, to see what it had recorded.
    pub discord_turns_found: u64,
    /// Posts of a part its turn had already recorded as delivered: never allowed.
    pub discord_after_record: Vec<String>,
    /// Hook deliveries answered 2xx, by delivery id (more than one: at-least-once
    /// delivery after a crash, recognisable by the `webhook-id`).
    pub hook_successes: BTreeMap<HookDeliveryId, u32>,
    /// Hook requests sent for a delivery already recorded as succeeded: never allowed.
    pub hook_after_success: Vec<String>,
    /// Hook requests received.
    pub hook_requests: u64,
}

/// The outside world.
pub struct World {
    pub(crate) dice: Arc<Dice>,
    clock: Arc<dyn Clock>,
    /// The store without faults, to look up what was recorded when a call comes in.
    store: Arc<dyn Store>,
    pub(crate) seen: Mutex<Seen>,
    /// Agents that chat: a user message may be sent to one while its heartbeat runs.
    pub(crate) chatting: BTreeSet<AgentId>,
    /// The same agents by name, as the heartbeat agent's prompt names them.
    by_name: BTreeMap<String, AgentId>,
    /// User messages the world decided to send mid-heartbeat, for the run to submit.
    pub(crate) interruptions: Mutex<Vec<AgentId>>,
}

impl World {
    /// A world drawing from `dice`, on `clock`.
    pub fn new(
        dice: Arc<Dice>,
        clock: Arc<dyn Clock>,
        store: Arc<dyn Store>,
        by_name: BTreeMap<String, AgentId>,
    ) -> Self {
        Self {
            dice,
            clock,
            store,
            seen: Mutex::default(),
            chatting: by_name.values().cloned().collect(),
            by_name,
            interruptions: Mutex::default(),
        }
    }

    /// The chatting agent whose heartbeat agent makes `request`: its prompt says "You are
    /// NAME, ...".
    fn speaker(&self, request: &LlmRequest) -> Option<AgentId> {
        let text = request.messages.first()?.text()?;
        let name = text.strip_prefix("You are ")?.split([',', ' ']).next()?;
        self.by_name.get(name).cloned()
    }

    /// What it received.
    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        lock(&self.seen)
    }
}

/// Runs the agents' tool in process and the built-in tools (the heartbeat agent) as
/// Pulse does.
pub struct SimTools {
    pub(crate) world: Arc<World>,
    pub(crate) builtin: Arc<dyn ToolRunner>,
}

#[async_trait]
impl ToolRunner for SimTools {
    async fn call(&self, tool: &Tool, request: &ToolRequest) -> ToolCall {
        if tool.name.as_str() != TOOL {
            return self.builtin.call(tool, request).await;
        }
        let w = &self.world;
        let agent = request.agent.id.clone();
        if let Ok(Some(done)) = w.store.get_action(&agent, &request.action_id).await
            && matches!(done.status, ActionStatus::Completed | ActionStatus::Failed)
        {
            w.seen().tool_after_finish.push(format!(
                "agent {agent}: action {} was called again (attempt {}) after it was recorded {}",
                done.id,
                request.attempt,
                done.status.as_str()
            ));
        }
        w.seen().tool_calls += 1;
        if w.chatting.contains(&agent) && w.dice.roll(Fault::MessageMidHeartbeat) {
            lock(&w.interruptions).push(agent.clone());
        }
        // The tool takes a moment, so other tasks (the interrupting message) run meanwhile.
        tokio::time::sleep(
            w.dice
                .between(Duration::from_millis(20), Duration::from_millis(800)),
        )
        .await;
        let failure = |f: ToolFailure| ToolCall {
            result: Err(f),
            response_meta: None,
        };
        if w.dice.roll(Fault::ToolFails) {
            failure(ToolFailure::Unreachable("connection refused".into()))
        } else if w.dice.roll(Fault::ToolTimesOut) {
            tokio::time::sleep(TOOL_TIMEOUT).await;
            failure(ToolFailure::Unreachable(format!(
                "no answer within {}s",
                TOOL_TIMEOUT.as_secs()
            )))
        } else if w.dice.roll(Fault::ToolMalformed) {
            failure(ToolFailure::BadAnswer(
                "the response is not a JSON object".into(),
            ))
        } else {
            let new_events = if w.dice.roll(Fault::ToolCascades) {
                json!([{"type": PING, "payload": {"cascade": true}}])
            } else {
                json!([])
            };
            let body = json!({"success": true, "output": {"echo": request.event.id}, "new_events": new_events});
            *w.seen()
                .tool_successes
                .entry(request.action_id.as_str().to_owned())
                .or_default() += 1;
            ToolCall {
                result: ToolResponse::from_json(&body).map_err(|e| ToolFailure::BadAnswer(e.0)),
                response_meta: Some(body),
            }
        }
    }

    fn builtins(&self) -> Vec<(Tool, pulse_shared::domain::Subscription)> {
        self.builtin.builtins()
    }
}

/// The model: answers at once with a line of text, or asks for one of the tools it was
/// offered (`speak`, `remember`), or fails as the dice say.
pub struct SimLlm {
    pub(crate) world: Arc<World>,
}

impl LlmSelector for SimLlm {
    fn select(&self, _agent: &Agent) -> Result<Arc<dyn Llm>, LlmError> {
        Ok(Arc::new(SimLlm {
            world: self.world.clone(),
        }))
    }
}

#[async_trait]
impl Llm for SimLlm {
    fn provider(&self) -> &'static str {
        "offline"
    }

    fn model(&self) -> &str {
        "sim"
    }

    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let w = &self.world;
        let n = {
            let mut seen = w.seen();
            seen.llm_requests += 1;
            seen.llm_requests
        };
        if w.dice.roll(Fault::LlmFails) {
            return Err(LlmError::Transport {
                provider: "offline",
                message: "connection reset".into(),
            });
        }
        if w.dice.roll(Fault::LlmRateLimited) {
            return Err(LlmError::Status {
                provider: "offline",
                status: 429,
                body: "rate limited".into(),
            });
        }
        // The user may write while the heartbeat agent thinks: it must then not speak.
        let thinking = heartbeat_start(request).and_then(|_| w.speaker(request));
        if let Some(agent) = thinking
            && w.dice.roll(Fault::MessageMidHeartbeat)
        {
            lock(&w.interruptions).push(agent);
        }
        let wait = if w.dice.roll(Fault::LlmSlow) {
            w.dice
                .between(Duration::from_secs(60), Duration::from_secs(240))
        } else {
            w.dice
                .between(Duration::from_millis(200), Duration::from_secs(3))
        };
        tokio::time::sleep(wait).await;
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 20,
            ..Usage::default()
        };
        let offered: Vec<&str> = request
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| matches!(*n, "speak" | "remember"))
            .collect();
        if !offered.is_empty() && w.dice.roll(Fault::LlmAsksTool) {
            let name = offered[w.dice.below(offered.len() as u64) as usize];
            let input = match name {
                // The thought carries the start of the heartbeat that spoke it (the
                // prompt's `Now:`), for the check that none speaks after a user message
                // that arrived while it ran.
                "speak" => json!({"thought": format!(
                    "check in {n}{}",
                    heartbeat_start(request)
                        .map(|at| format!(" {STARTED}{at}"))
                        .unwrap_or_default()
                )}),
                _ => json!({"text": format!("fact {n}")}),
            };
            return Ok(LlmResponse {
                text: None,
                tool_calls: vec![ToolUse {
                    id: format!("call_{n}"),
                    name: name.to_owned(),
                    input,
                }],
                stop: StopReason::ToolUse,
                usage,
                model: "sim".into(),
                provider: "offline",
            });
        }
        Ok(LlmResponse {
            text: Some(format!("noted {n}")),
            tool_calls: Vec::new(),
            stop: StopReason::EndTurn,
            usage,
            model: "sim".into(),
            provider: "offline",
        })
    }
}

/// Marks, in a spoken thought, the start of the heartbeat that spoke it.
pub(crate) const STARTED: &str = "heartbeat started ";

/// The start of the heartbeat a heartbeat agent's request is made in: the prompt's
/// `Now:` line.
fn heartbeat_start(request: &LlmRequest) -> Option<Timestamp> {
    request.messages.iter().find_map(|m| {
        let text = m.text()?;
        let (_, rest) = text.split_once("\nNow: ")?;
        rest.lines().next()?.trim().parse().ok()
    })
}

/// Discord: a post appears once per nonce within a few minutes, as `enforce_nonce` does;
/// a post that times out may have appeared. A part posted again later (its first post
/// acknowledged, the worker gone before the turn recorded it) appears twice: counted as
/// an at-least-once repeat; a part posted after its turn recorded it is a violation.
pub struct SimDiscord {
    pub(crate) world: Arc<World>,
}

impl SimDiscord {
    /// Whether the turn that `nonce` names (in `channel`'s agent) recorded part `nonce`'s
    /// number as delivered: the nonce is the turn id's last 22 characters and the part.
    async fn recorded(&self, channel: &str, nonce: &str) -> Option<String> {
        let store = &self.world.store;
        let agent = store.agent_for_channel(channel).await.ok()??;
        let (tail, part) = nonce.split_at(nonce.len().checked_sub(2)?);
        let part: u32 = part.parse().ok()?;
        let turns = store.list_turns(&agent, 50).await.ok()?;
        let turn = turns.iter().find(|t| t.id.as_str().ends_with(tail))?;
        self.world.seen().discord_turns_found += 1;
        (turn.delivered > part).then(|| {
            format!(
                "turn {} had recorded part {part} delivered ({} of {}) when it was posted again",
                turn.id,
                turn.delivered,
                turn.parts.len()
            )
        })
    }

    async fn post(&self, nonce: String) -> Result<String, DiscordError> {
        let w = &self.world;
        tokio::time::sleep(
            w.dice
                .between(Duration::from_millis(50), Duration::from_millis(500)),
        )
        .await;
        if w.dice.roll(Fault::DiscordRateLimited) {
            return Err(DiscordError::RateLimited { attempts: 3 });
        }
        if w.dice.roll(Fault::DiscordFails) {
            return Err(DiscordError::Status {
                status: 502,
                body: "bad gateway".into(),
            });
        }
        let now = self.world.clock.now();
        let timed_out = w.dice.roll(Fault::DiscordTimesOut);
        {
            let mut seen = w.seen();
            let posts = seen.discord_posts.entry(nonce.clone()).or_default();
            let remembered = posts
                .last()
                .is_some_and(|t| now.duration_since(*t) < NONCE_MEMORY);
            if !remembered {
                posts.push(now);
            }
        }
        if timed_out {
            tokio::time::sleep(Duration::from_secs(10)).await;
            return Err(DiscordError::Transport("operation timed out".into()));
        }
        Ok(format!("m_{nonce}"))
    }
}

#[async_trait]
impl DiscordApi for SimDiscord {
    async fn edit_original(&self, token: &str, content: &str) -> Result<String, DiscordError> {
        self.post(format!("{token}:original:{}", content.len()))
            .await
    }

    async fn follow_up(&self, token: &str, content: &str) -> Result<String, DiscordError> {
        self.post(format!("{token}:follow:{content}")).await
    }

    async fn create_message(
        &self,
        channel_id: &str,
        _content: &str,
        nonce: &str,
        _reply_to: Option<&str>,
    ) -> Result<String, DiscordError> {
        if let Some(why) = self.recorded(channel_id, nonce).await {
            self.world.seen().discord_after_record.push(why);
        }
        self.post(nonce.to_owned()).await
    }

    async fn typing(&self, _channel_id: &str) -> Result<(), DiscordError> {
        Ok(())
    }

    async fn open_dm(&self, user_id: &str) -> Result<String, DiscordError> {
        Ok(format!("dm-{user_id}"))
    }
}

/// The agents' hook receivers.
pub struct SimHooks {
    pub(crate) world: Arc<World>,
}

#[async_trait]
impl HookSender for SimHooks {
    async fn send(&self, hook: &Hook, delivery: &HookDelivery, _timestamp: i64) -> SendResult {
        let w = &self.world;
        w.seen().hook_requests += 1;
        if let Ok(Some(done)) = w.store.get_delivery(&delivery.id).await
            && done.status == DeliveryStatus::Succeeded
        {
            w.seen().hook_after_success.push(format!(
                "delivery {} was sent again after it was recorded as succeeded",
                delivery.id
            ));
        }
        tokio::time::sleep(
            w.dice
                .between(Duration::from_millis(20), Duration::from_millis(300)),
        )
        .await;
        let answer = |status: AttemptStatus, http: Option<u16>, error: Option<&str>| SendResult {
            status,
            http_status: http,
            body: None,
            error: error.map(str::to_owned),
            retry_after: None,
        };
        if w.dice.roll(Fault::HookFails) {
            return answer(AttemptStatus::Failed, Some(500), Some("HTTP 500"));
        }
        if w.dice.roll(Fault::HookTimesOut) {
            tokio::time::sleep(hook.timeout.unsigned_abs()).await;
            return answer(AttemptStatus::Timeout, None, Some("timed out"));
        }
        if w.dice.roll(Fault::HookGone) {
            return answer(AttemptStatus::Failed, Some(410), Some("HTTP 410"));
        }
        *w.seen()
            .hook_successes
            .entry(delivery.id.clone())
            .or_default() += 1;
        answer(AttemptStatus::Success, Some(200), None)
    }
}
