//! The built-in heartbeat agent (seeds 000, 003): a tool subscribed to HEARTBEAT that
//! wakes with the agent, reads its instructions, beats, window events and a digest of
//! the recent conversation, and runs an LLM tool loop with:
//!
//! - `speak({thought})`: queues a `heartbeat` signal on the agent's session and returns at
//!   once. The conversation worker turns it into a reply; the heartbeat never posts to
//!   Discord itself. Not calling `speak` is the silent outcome: nothing is sent.
//! - `remember({text})` / `recall({query})` over the agent's memories.
//! - `emit_event({type, payload, priority})`: events that cascade in the same heartbeat.
//!
//! Budgets (max steps, max tokens per run) stop the loop and are recorded. Before each
//! LLM call and `speak`, and during each call (which is then dropped), the run checks
//! for a user message or its operator's cancel since it started (marks on the agent);
//! finding one, it stops, and the heartbeat ends CANCELLED so the user's turn runs next.
//! Every step is logged and kept in the action's output.

use crate::engine::transcript::ToolAnswer;
use std::sync::Arc;

use serde_json::{Value, json};
use tracing::{Instrument as _, info, warn};

use crate::domain::{
    Action, Agent, CacheKept, ChatMessage, ContentBlock, Event, EventCursor, Found, LlmRequest,
    MAX_AFTER_READING, Memory, MemoryId, MemoryKind, MemorySource, NewEvent, OutgoingTask, Outside,
    REMEMBER, Signal, SignalId, SignalKind, SignalMeta, StopReason, ToolRequest, ToolResponse,
    ToolUse, Usage, Usd,
};
mod prompt;

use prompt::{MAX_EVENTS_SHOWN, about, briefing};

use crate::engine::agent_tools::{AgentTools, Offer, Race, Site, with_own};
use crate::engine::dollars::{self, Held};
use crate::engine::interrupt::{self, Raced};
use crate::engine::memory::{self, text_arg};
use crate::engine::pace;
use crate::engine::prompt as shared_prompt;
use crate::engine::reminders::{self, ScheduleLimits};
use crate::engine::transcript;
use crate::engine::{HookEmitter, Prices};
use crate::error::chain;
use crate::ports::{Clock, LlmSelector, SessionQueue, Store, ToolCall, ToolFailure};

/// Tokens the model may write per step.
const STEP_MAX_TOKENS: u32 = 1_024;

/// The heartbeat agent and what it needs.
#[derive(Clone)]
pub struct HeartbeatAgent {
    store: Arc<dyn Store>,
    queue: Arc<dyn SessionQueue>,
    llm: Arc<dyn LlmSelector>,
    clock: Arc<dyn Clock>,
    schedules: ScheduleLimits,
    memories: Arc<memory::Memories>,
    agent_tools: Option<Arc<AgentTools>>,
    /// The prices dollar budgets are kept at.
    prices: Arc<Prices>,
    /// Where BUDGET_THRESHOLD is told.
    hooks: Option<HookEmitter>,
}

/// What the run did, step by step: the action's output.
#[derive(Default)]
struct Transcript {
    steps: Vec<Value>,
    spoke: Vec<String>,
    new_events: Vec<NewEvent>,
    usage: Usage,
    budget_stop: Option<String>,
    provider: String,
    model: String,
    /// Tool calls made so far: the next one's place in the run.
    calls: usize,
    /// Schedules made with the `schedule` tool: the runner files the next heartbeat no
    /// later than their first wake.
    scheduled: Vec<String>,
    /// The outside text the briefing carried: what a memory kept in this run was kept
    /// after reading.
    read: Vec<Outside>,
    /// The window's events: how many in all, and how many the model was shown.
    events: (usize, usize),
    /// Why the run made no model call at all (a dollar budget that does not fit).
    skipped: Option<String>,
    /// The agent's prompt cache as the run's calls left it, for a model whose hour-long
    /// cache pays: handed on to the next heartbeat, which may keep it warm.
    cache: Option<CacheKept>,
}

/// Why a model call is not made.
enum Closed {
    /// The agent's calls this minute are made.
    Pace(String),
    /// Its worst case does not fit a dollar budget.
    Budget(String),
}

/// What a heartbeat reads of its window.
struct WindowRead {
    /// The events the model is shown, oldest first.
    shown: Vec<Event>,
    /// Every event of the window.
    total: usize,
    /// The REMEMBER events past those shown.
    remembered_past: Vec<Event>,
}

/// Events a read of the window past those shown takes at a time.
const WINDOW_PAGE: usize = 500;

impl Transcript {
    fn output(&self, interrupted: Option<&str>) -> Value {
        json!({
            "spoke": self.spoke,
            "scheduled": self.scheduled,
            "silent": self.spoke.is_empty(),
            // Within half of what the action keeps of its response, so the figures
            // beside the steps are never cut.
            "steps": transcript::kept(self.steps.clone(), Action::KEPT_RESPONSE / 2),
            "budget_stop": self.budget_stop,
            "interrupted": interrupted,
            "provider": self.provider,
            "model": self.model,
            "events": {"in_window": self.events.0, "shown": self.events.1},
            "cache": self.cache,
        })
    }
    /// What the run used, and what it cost at today's `prices` (kept with the action,
    /// so a later price change does not rewrite it).
    fn usage(&self, prices: &Prices) -> Value {
        let cost = prices
            .of(&self.model)
            .filter(|_| self.usage.total() > 0)
            .map(|p| Usd::from_dollars(p.cost(&self.usage)));
        json!({
            "cost_usd": cost,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "cache_write_long_tokens": self.usage.cache_write_long_tokens,
            "llm_calls": self.steps.iter().filter(|s| s["kind"] == "llm").count(),
        })
    }
}

impl HeartbeatAgent {
    /// The agent over a store, the sessions queue, the model router and a clock.
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn SessionQueue>,
        llm: Arc<dyn LlmSelector>,
        clock: Arc<dyn Clock>,
        memories: Arc<memory::Memories>,
    ) -> Self {
        Self {
            store,
            queue,
            llm,
            clock,
            schedules: ScheduleLimits::default(),
            memories,
            agent_tools: None,
            prices: Arc::new(Prices::default()),
            hooks: None,
        }
    }

    /// Offers the model the tools of the MCP servers each agent is attached to.
    pub fn with_agent_tools(mut self, tools: Arc<AgentTools>) -> Self {
        self.agent_tools = Some(tools);
        self
    }

    /// Keeps dollar budgets at `prices`, telling BUDGET_THRESHOLD through `hooks`.
    pub fn with_dollars(mut self, prices: Arc<Prices>, hooks: Option<HookEmitter>) -> Self {
        self.prices = prices;
        self.hooks = hooks;
        self
    }

    /// Bounds the schedules its `schedule` tool makes by `limits`.
    pub fn with_schedule_limits(mut self, limits: ScheduleLimits) -> Self {
        self.schedules = limits;
        self
    }

    /// Runs one heartbeat's agent loop, or skips it when the agent's think policy finds
    /// nothing to think about: then no model call and no read is made.
    pub async fn call(&self, request: &ToolRequest) -> ToolCall {
        if let Err(why) = request.agent.thinks(&request.heartbeat) {
            if request.heartbeat.warm_up && request.heartbeat.budget_spent.is_none() {
                return self.warm_up(request, why).await;
            }
            return ToolCall {
                response_meta: Some(json!({
                    "output": {"skipped": why},
                    "usage": {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0},
                })),
                result: Err(ToolFailure::Skipped(why)),
            };
        }
        let mut t = Transcript::default();
        match self.run(request, &mut t).await {
            Ok(None) if t.skipped.is_some() => {
                let why = t.skipped.clone().unwrap_or_default();
                info!(reason = %why, "heartbeat agent skipped: no model call");
                ToolCall {
                    response_meta: Some(json!({
                        "output": {"skipped": why},
                        "usage": {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0},
                    })),
                    result: Err(ToolFailure::Skipped(why)),
                }
            }
            Ok(None) => {
                let output = t.output(None);
                info!(
                    spoke = t.spoke.len(),
                    steps = t.steps.len(),
                    input_tokens = t.usage.input_tokens,
                    output_tokens = t.usage.output_tokens,
                    budget_stop = t.budget_stop.as_deref(),
                    "heartbeat agent finished"
                );
                ToolCall {
                    result: Ok(ToolResponse {
                        success: true,
                        output: output.clone(),
                        new_events: std::mem::take(&mut t.new_events),
                        usage: t.usage(&self.prices),
                        error: None,
                    }),
                    response_meta: Some(json!({"output": output, "usage": t.usage(&self.prices)})),
                }
            }
            Ok(Some(why)) => {
                info!(reason = %why, steps = t.steps.len(), "heartbeat agent interrupted; yielding to the user's turn");
                ToolCall {
                    response_meta: Some(
                        json!({"output": t.output(Some(&why)), "usage": t.usage(&self.prices)}),
                    ),
                    result: Err(ToolFailure::Interrupted(why)),
                }
            }
            Err(why) => ToolCall {
                result: Err(ToolFailure::Agent(why)),
                response_meta: Some(
                    json!({"output": t.output(None), "usage": t.usage(&self.prices)}),
                ),
            },
        }
    }

    /// `Ok(Some(reason))` when interrupted, `Err` when the run failed.
    async fn run(&self, req: &ToolRequest, t: &mut Transcript) -> Result<Option<String>, String> {
        let agent = self.agent(req).await?;
        let llm = self.llm.select(&agent).map_err(|e| chain(&e))?;
        t.provider = llm.provider().to_owned();
        let (read, history) = futures::try_join!(
            self.window(req),
            self.store
                .recent_messages(&agent.id, shared_prompt::HISTORY_MESSAGES)
        )
        .map_err(|e| chain(&e))?;
        let remembered: Vec<&Event> = read
            .shown
            .iter()
            .chain(&read.remembered_past)
            .filter(|e| e.event_type.as_str() == REMEMBER)
            .collect();
        self.keep_remembered(&agent, req, &remembered)
            .await
            .map_err(|e| chain(&e))?;
        t.events = (read.total, read.shown.len());
        let window = read.shown;
        t.read = outside_read(&window, &req.heartbeat.found);
        let known = memory::known(
            &self.memories,
            &agent,
            &about(&agent, &window, &req.heartbeat.found),
            req.heartbeat.beats.beat,
            memory::PROMPT_TOKENS,
            self.clock.now(),
        )
        .await
        .map_err(|e| chain(&e))?;
        // The prompt the agent's turns start with too — the system prompt, the
        // conversation's history — then this heartbeat's briefing.
        let mut messages = vec![ChatMessage::system(shared_prompt::system(&agent))];
        messages.extend(shared_prompt::history(
            &history,
            shared_prompt::HISTORY_TOKENS,
            shared_prompt::HISTORY_MESSAGES,
        ));
        let cache = shared_prompt::cache(
            &agent,
            agent.llm.heartbeat_model.as_deref().unwrap_or(llm.model()),
            messages.len(),
            (
                history.first().map(|m| m.created_at),
                req.heartbeat.cache.map(|k| k.called_at),
                self.clock.now(),
            ),
        );
        let left = dollars::left_line(self.store.as_ref(), &agent, self.clock.now())
            .await
            .map_err(|e| chain(&e))?;
        messages.push(ChatMessage::user(briefing(
            &agent,
            req,
            (&window, t.events.0),
            known.as_deref(),
            left.as_deref(),
        )));
        let (tools, offer) =
            with_own(self.agent_tools.as_deref(), &agent, shared_prompt::tools()).await;
        let budgets = agent.budgets;
        // The next prompt's size, in tokens: the last one's, and the results added since.
        let mut last_input = 0u64;
        for step in 0..budgets.max_steps {
            // The agent read above answers the first check; later ones read it again.
            let why = if step == 0 {
                interruption(&agent, req)
            } else {
                self.interrupted(req).await?
            };
            if let Some(why) = why {
                return Ok(Some(why));
            }
            // The budget counts input and output. The next prompt is the last one and
            // the results added since, so a step is made only if that prompt still fits, and the
            // model may answer with at most what is left: one step cannot overrun the
            // budget by a whole response.
            let used = t.usage.total();
            let left = budgets.max_tokens.saturating_sub(used + last_input);
            if left == 0 {
                t.budget_stop = Some(format!(
                    "max_tokens: {used} tokens used and the next prompt needs about {last_input}; the budget is {}",
                    budgets.max_tokens
                ));
                warn!(
                    used,
                    budget = budgets.max_tokens,
                    "heartbeat agent stopped: token budget reached"
                );
                return Ok(None);
            }
            let max_tokens = u32::try_from(left).unwrap_or(u32::MAX).min(STEP_MAX_TOKENS);
            let request = LlmRequest {
                // Beats may think with a cheaper model than the one that talks.
                model: agent.llm.heartbeat_model.clone(),
                messages: messages.clone(),
                tools: tools.clone(),
                tools_off: false,
                max_tokens,
                cache: Some(cache),
            };
            let model = request.model.as_deref().unwrap_or(llm.model()).to_owned();
            let hold = match self.open_call(&agent, &model, &request).await? {
                Ok(hold) => hold,
                // Past the agent's calls a minute, the heartbeat yields: its window goes
                // to the next heartbeat, which reads it again.
                Err(Closed::Pace(why)) => {
                    warn!(reason = %why, "heartbeat agent: no model call; the window goes to the next heartbeat");
                    return Ok(Some(why));
                }
                Err(Closed::Budget(why)) => {
                    warn!(reason = %why, "heartbeat agent: no model call");
                    if step == 0 {
                        t.skipped = Some(why);
                    } else {
                        t.budget_stop = Some(why);
                    }
                    return Ok(None);
                }
            };
            // A user message during the call drops it (its request is closed) rather
            // than waiting for an answer the heartbeat would throw away.
            let call = interrupt::unless_user_speaks(
                self.store.as_ref(),
                &agent.id,
                Some(req.heartbeat.started_at),
                interrupt::StopOn::UserOrCancel,
                llm.complete(&request),
            );
            let raced = call.await;
            self.close_call(&agent, hold, || dollars::used(&raced, &request))
                .await;
            let resp = match raced {
                Raced::Done(done) => done.map_err(|e| chain(&e))?,
                Raced::Interrupted(at) => {
                    return Ok(Some(self.dropped(req, t, &request, step, at).await));
                }
            };
            t.usage.add(resp.usage);
            crate::meter::tokens(resp.provider, &resp.usage);
            last_input = resp.usage.input_tokens;
            t.model = resp.model.clone();
            if shared_prompt::hour_pays(&model) {
                let now = self.clock.now();
                t.cache = Some(CacheKept {
                    called_at: now,
                    until: now + cache.ttl.duration(),
                    warmed_at: None,
                });
            }
            t.steps
                .push(transcript::call_step(step, &resp, "heartbeat agent"));
            messages.push(ChatMessage::Assistant {
                text: resp.text.clone(),
                tool_calls: resp.tool_calls.clone(),
            });
            if resp.stop == StopReason::MaxTokens && max_tokens < STEP_MAX_TOKENS {
                t.budget_stop = Some(format!(
                    "max_tokens: the answer was cut at the {max_tokens} tokens left of the budget of {}",
                    budgets.max_tokens
                ));
                warn!(
                    budget = budgets.max_tokens,
                    "heartbeat agent stopped: token budget reached mid-answer"
                );
                return Ok(None);
            }
            // The calls are run whatever the stop reason says (the provider warns when
            // the two disagree).
            if resp.tool_calls.is_empty() {
                return Ok(None);
            }
            let answered_from = messages.len();
            if let Some(why) = self
                .answer_calls(req, &agent, &offer, &resp.tool_calls, t, &mut messages)
                .await?
            {
                return Ok(Some(why));
            }
            // The next prompt is the last one with the results added.
            last_input += transcript::added_tokens(&messages[answered_from..]);
        }
        t.budget_stop = Some(format!(
            "max_steps: the model still wanted tools after {} steps",
            budgets.max_steps
        ));
        warn!(
            budget = budgets.max_steps,
            "heartbeat agent stopped: step budget reached"
        );
        Ok(None)
    }

    /// Records a model call dropped at `at` (a user message, or its operator's cancel):
    /// its usage estimated and marked so. The interruption's reason.
    async fn dropped(
        &self,
        req: &ToolRequest,
        t: &mut Transcript,
        request: &LlmRequest,
        step: u32,
        at: jiff::Timestamp,
    ) -> String {
        let by = match self
            .agent(req)
            .await
            .ok()
            .and_then(|a| a.cancel_requested_at)
        {
            Some(c) if c == at => "its operator cancelled it",
            _ => "a user message arrived",
        };
        let estimate = interrupt::estimated_usage(&request.messages);
        t.usage.add(estimate);
        t.steps.push(json!({
            "step": step,
            "kind": "aborted",
            "reason": by,
            "usage": estimate,
            "usage_estimated": true,
        }));
        format!("interrupted: {by} at {at}, during the model call (dropped)")
    }

    /// Runs the tools the model asked for, in order, adding each result to the
    /// conversation and the transcript. `Some(reason)` if a user message interrupted
    /// the heartbeat before a `speak`.
    async fn answer_calls(
        &self,
        req: &ToolRequest,
        agent: &Agent,
        offer: &Offer,
        tool_calls: &[ToolUse],
        t: &mut Transcript,
        messages: &mut Vec<ChatMessage>,
    ) -> Result<Option<String>, String> {
        // What the model said beside its calls: the reason a parked call shows.
        let said = match messages.last() {
            Some(ChatMessage::Assistant { text, .. }) => text.clone(),
            _ => None,
        };
        for (n, call) in tool_calls.iter().enumerate() {
            if n >= transcript::CALLS_PER_ANSWER {
                let (step, message) =
                    transcript::tool_step(call, transcript::not_made(call), false);
                t.steps.push(step);
                messages.push(message);
                continue;
            }
            // A user message (or a cancel) that arrived meanwhile — perhaps during the
            // previous call, which then yielded — stops the run before the next call.
            if let Some(why) = self.interrupted(req).await? {
                return Ok(Some(why));
            }
            let index = t.calls;
            t.calls += 1;
            let trace = crate::traces::tool(&call.name, &call.id, "function");
            let result = self
                .run_tool(req, agent, (offer, said.as_deref()), call, index, t)
                .instrument(trace.clone())
                .await;
            if let Err(refusal) = &result {
                crate::traces::failed(&trace, "tool_error", &refusal.0);
            }
            info!(tool = %call.name, is_error = result.is_err(), "heartbeat agent tool call");
            let (step, message) =
                transcript::tool_step(call, result, agent.llm.sees_images(&t.model));
            t.steps.push(step);
            messages.push(message);
        }
        Ok(None)
    }

    /// A beat with nothing to think about (`why`) whose agent's hour-long prompt cache
    /// would lapse before the next beat: one call with the prompt's stable prefix — the
    /// tools, the system prompt, the history, marked for an hour as a thinking beat
    /// marks them — a line saying what the call is for, and one token of answer. The
    /// prefix is read at a tenth of its price and lives another hour. Skipped like any
    /// beat with nothing to do, with the call's usage; a failed warm-up is logged and
    /// costs the next call a write, nothing else.
    async fn warm_up(&self, req: &ToolRequest, why: String) -> ToolCall {
        let skipped = |why: String, output: Value, usage: Value| ToolCall {
            response_meta: Some(json!({"output": output, "usage": usage})),
            result: Err(ToolFailure::Skipped(why)),
        };
        let nothing = json!({"input_tokens": 0, "output_tokens": 0, "llm_calls": 0});
        match self.warm(req).await {
            Ok(Some((t, kept))) => {
                info!(
                    cache_read_tokens = t.usage.cache_read_tokens,
                    until = %kept.until,
                    "heartbeat agent kept the prompt cache warm"
                );
                let output = json!({
                    "skipped": why,
                    "warm_up": true,
                    "provider": t.provider,
                    "model": t.model,
                    "cache": kept,
                    "steps": t.steps,
                });
                skipped(
                    format!("{why}; the prompt cache was kept warm"),
                    output,
                    t.usage(&self.prices),
                )
            }
            Ok(None) => skipped(why.clone(), json!({"skipped": why}), nothing),
            Err(e) => {
                warn!(error = %e, "heartbeat agent: the prompt cache could not be kept warm; the next call writes it again");
                skipped(why.clone(), json!({"skipped": why}), nothing)
            }
        }
    }

    /// The warm-up call, when the agent's model still caches for an hour and its
    /// budgets let it be made: what it used, and the cache it renewed.
    async fn warm(&self, req: &ToolRequest) -> Result<Option<(Transcript, CacheKept)>, String> {
        let Some(kept) = req.heartbeat.cache else {
            return Ok(None);
        };
        let agent = self.agent(req).await?;
        let llm = self.llm.select(&agent).map_err(|e| chain(&e))?;
        let model = agent
            .llm
            .heartbeat_model
            .clone()
            .unwrap_or_else(|| llm.model().to_owned());
        if !shared_prompt::hour_pays(&model) {
            return Ok(None);
        }
        let history = self
            .store
            .recent_messages(&agent.id, shared_prompt::HISTORY_MESSAGES)
            .await
            .map_err(|e| chain(&e))?;
        let mut messages = vec![ChatMessage::system(shared_prompt::system(&agent))];
        messages.extend(shared_prompt::history(
            &history,
            shared_prompt::HISTORY_TOKENS,
            shared_prompt::HISTORY_MESSAGES,
        ));
        let cache = crate::domain::PromptCache {
            history: messages.len(),
            ttl: crate::domain::CacheTtl::Hour,
        };
        messages.push(ChatMessage::user(shared_prompt::WARM_UP_LINE.to_owned()));
        let (tools, _) =
            with_own(self.agent_tools.as_deref(), &agent, shared_prompt::tools()).await;
        let request = LlmRequest {
            model: agent.llm.heartbeat_model.clone(),
            messages,
            tools,
            tools_off: false,
            max_tokens: 1,
            cache: Some(cache),
        };
        let hold = match self.open_call(&agent, &model, &request).await? {
            Ok(hold) => hold,
            Err(Closed::Pace(why) | Closed::Budget(why)) => {
                info!(reason = %why, "no warm-up");
                return Ok(None);
            }
        };
        let answer = llm.complete(&request).await;
        self.close_call(&agent, hold, || answer.as_ref().ok().map(|r| r.usage))
            .await;
        let resp = answer.map_err(|e| chain(&e))?;
        let mut t = Transcript {
            provider: llm.provider().to_owned(),
            model: resp.model.clone(),
            ..Transcript::default()
        };
        t.usage.add(resp.usage);
        crate::meter::tokens(resp.provider, &resp.usage);
        t.steps.push(transcript::call_step(0, &resp, "warm-up"));
        let at = self.clock.now();
        Ok(Some((
            t,
            CacheKept {
                until: at + cache.ttl.duration(),
                warmed_at: Some(at),
                ..kept
            },
        )))
    }

    /// Opens a model call of `agent` to `model` with `request`: counted against the
    /// agent's calls a minute, then its worst case held against its dollar budgets. The
    /// hold to settle after the call (none without a dollar budget), or why the call is
    /// not to be made.
    async fn open_call(
        &self,
        agent: &Agent,
        model: &str,
        request: &LlmRequest,
    ) -> Result<Result<Option<dollars::Hold>, Closed>, String> {
        if let Some(why) = pace::take(self.store.as_ref(), agent, self.clock.now())
            .await
            .map_err(|e| chain(&e))?
        {
            return Ok(Err(Closed::Pace(why)));
        }
        let held = dollars::hold(
            self.store.as_ref(),
            self.hooks.as_ref(),
            &self.prices,
            agent,
            model,
            request,
            self.clock.now(),
        )
        .await
        .map_err(|e| chain(&e))?;
        Ok(match held {
            Held::Free => Ok(None),
            Held::Held(h) => Ok(Some(h)),
            Held::Refused(r) => Err(Closed::Budget(r.reason)),
        })
    }

    /// Settles the hold [`Self::open_call`] took with what the call `used` (read only
    /// when there is a hold).
    async fn close_call(
        &self,
        agent: &Agent,
        hold: Option<dollars::Hold>,
        used: impl FnOnce() -> Option<Usage>,
    ) {
        if let Some(hold) = hold {
            dollars::settle(
                self.store.as_ref(),
                self.hooks.as_ref(),
                agent,
                hold,
                used().as_ref(),
                self.clock.now(),
            )
            .await;
        }
    }

    async fn agent(&self, req: &ToolRequest) -> Result<Agent, String> {
        self.store
            .get_agent(&req.agent.id)
            .await
            .map_err(|e| chain(&e))?
            .ok_or_else(|| format!("agent {} no longer exists", req.agent.id))
    }

    /// A user message that arrived after this heartbeat started interrupts it.
    async fn interrupted(&self, req: &ToolRequest) -> Result<Option<String>, String> {
        Ok(interruption(&self.agent(req).await?, req))
    }

    /// The heartbeat's window: the events the model is shown (the first
    /// [`MAX_EVENTS_SHOWN`]), and past them, read a page at a time, how many there are
    /// and the REMEMBER events among them (they need no model to be kept).
    async fn window(&self, req: &ToolRequest) -> Result<WindowRead, crate::error::StoreError> {
        let (start, end) = (&req.heartbeat.window_start, &req.heartbeat.window_end);
        let first = self
            .store
            .read_window(&req.agent.id, start, end, MAX_EVENTS_SHOWN)
            .await?;
        let mut read = WindowRead {
            total: first.events.len(),
            shown: first.events,
            remembered_past: Vec::new(),
        };
        let mut more = first.truncated;
        let mut after = read.shown.last().map(|e| EventCursor::after(&e.id));
        while more && let Some(from) = after.take() {
            let page = self
                .store
                .read_window(&req.agent.id, &from, end, WINDOW_PAGE)
                .await?;
            read.total += page.events.len();
            after = page.events.last().map(|e| EventCursor::after(&e.id));
            more = page.truncated;
            read.remembered_past.extend(
                page.events
                    .into_iter()
                    .filter(|e| e.event_type.as_str() == REMEMBER),
            );
        }
        Ok(read)
    }

    /// Keeps the memories the window's REMEMBER events carry, marked as coming from an
    /// event (each once: its id comes from the event's).
    async fn keep_remembered(
        &self,
        agent: &Agent,
        req: &ToolRequest,
        remembered: &[&Event],
    ) -> Result<(), crate::error::StoreError> {
        let mut kept = Vec::new();
        for e in remembered {
            let text = e.payload.get("text").and_then(Value::as_str).unwrap_or("");
            let id = MemoryId::derived(
                e.created_at.as_millisecond().max(0) as u64,
                &["event", e.id.as_str()],
            );
            let mut m = match Memory::new(
                id,
                &agent.id,
                text,
                req.heartbeat.beats.beat,
                self.clock.now(),
            ) {
                Ok(m) => m,
                Err(why) => {
                    warn!(event_id = %e.id, error = %why, "a REMEMBER event without a memory in it");
                    continue;
                }
            };
            if let Some(k) = e
                .payload
                .get("kind")
                .and_then(Value::as_str)
                .and_then(|k| MemoryKind::parse(k).ok())
            {
                m.kind = k;
            }
            if let Some(i) = e
                .payload
                .get("importance")
                .and_then(Value::as_f64)
                .and_then(|i| Memory::check_importance(i as f32).ok())
            {
                m.importance = i;
            }
            m.source = MemorySource::Event;
            m.source_ids = vec![e.id.to_string()];
            m.heartbeat_id = Some(req.heartbeat.id.clone());
            kept.push(m);
        }
        if !kept.is_empty() {
            info!(memories = kept.len(), "kept the memories events carried");
            self.memories.remember(&agent.id, kept).await?;
        }
        Ok(())
    }

    async fn run_tool(
        &self,
        req: &ToolRequest,
        agent: &Agent,
        (offer, said): (&Offer, Option<&str>),
        call: &ToolUse,
        index: usize,
        t: &mut Transcript,
    ) -> ToolAnswer {
        let now = self.clock.now();
        let ms = now.as_millisecond().max(0) as u64;
        let key = [
            req.action_id.as_str(),
            &req.attempt.to_string(),
            &index.to_string(),
        ];
        match call.name.as_str() {
            "speak" => {
                let thought = text_arg(&call.input, "thought")?;
                let signal = Signal {
                    id: SignalId::derived(ms, &key),
                    agent_id: agent.id.clone(),
                    session: agent.session.clone(),
                    kind: SignalKind::Heartbeat,
                    content: vec![ContentBlock::Text {
                        text: thought.clone(),
                    }],
                    meta: SignalMeta {
                        source: Some("heartbeat".to_owned()),
                        heartbeat_id: Some(req.heartbeat.id.clone()),
                        ..SignalMeta::default()
                    },
                    created_at: now,
                };
                let report = self
                    .queue
                    .send(&[OutgoingTask::signal(signal.clone())])
                    .await
                    .map_err(|e| chain(&e))?;
                if let Some((_, why)) = report.failed.first() {
                    return Err(format!("the thought could not be queued: {why}").into());
                }
                t.spoke.push(thought);
                Ok(json!({"queued": true, "signal_id": signal.id}))
            }
            "remember" | "recall" => memory::run(
                &self.memories,
                agent,
                call,
                MemoryId::derived(ms, &key),
                &memory::Context {
                    source: crate::domain::MemorySource::Agent,
                    heartbeat: Some(req.heartbeat.id.clone()),
                    source_ids: vec![req.heartbeat.id.to_string()],
                    after_reading: t.read.clone(),
                    beat: req.heartbeat.beats.beat,
                },
                now,
            )
            .await
            .unwrap_or_else(|| Err(format!("no tool {}", call.name).into())),
            "schedule" => {
                let (schedule, answer) = reminders::run_tool(
                    self.store.as_ref(),
                    agent,
                    &call.input,
                    now,
                    self.schedules,
                )
                .await
                .map_err(|e| e.to_string())?;
                if let Some(made) = schedule {
                    t.scheduled.push(made.id.to_string());
                }
                Ok(answer)
            }
            "emit_event" => {
                let ty = text_arg(&call.input, "type")?;
                let payload = match call.input.get("payload") {
                    None | Some(Value::Null) => json!({}),
                    Some(p @ Value::Object(_)) => p.clone(),
                    Some(_) => return Err("\"payload\" must be a JSON object".to_owned().into()),
                };
                let priority = match call.input.get("priority") {
                    None | Some(Value::Null) => None,
                    Some(p) => Some(p.as_i64().ok_or("\"priority\" must be an integer 1..10")?),
                };
                if t.new_events.len() >= ToolResponse::MAX_NEW_EVENTS {
                    return Err(format!(
                        "at most {} events per run",
                        ToolResponse::MAX_NEW_EVENTS
                    ).into());
                }
                let event = NewEvent::new(&ty, payload, priority).map_err(|e| e.to_string())?;
                t.new_events.push(event);
                Ok(json!({"emitted": true, "type": ty}))
            }
            other => match &self.agent_tools {
                Some(at) if offer.offers(other) => {
                    let site = Site {
                        agent,
                        heartbeat_id: req.heartbeat.id.clone(),
                        event: Some(&req.event),
                        turn_id: None,
                        run: req.action_id.as_str(),
                        index,
                        at_ms: req.event.id.timestamp_ms(),
                        // A user message (or a cancel) during a call yields at once;
                        // the next step sees it and ends the heartbeat.
                        race: Some(Race {
                            known: Some(req.heartbeat.started_at),
                            stop: interrupt::StopOn::UserOrCancel,
                        }),
                        said: None,
                    }
                    .said(said);
                    at.run(offer, call, &site)
                        .await
                        .unwrap_or_else(|| Err(format!("no tool {other}").into()))
                }
                _ => Err(format!(
                    "there is no tool {other:?}; use speak, remember, recall, emit_event or schedule"
                ).into()),
            },
        }
    }
}

/// Why the run must yield, if the user wrote after the heartbeat started.
fn interruption(agent: &Agent, req: &ToolRequest) -> Option<String> {
    if let Some(at) = agent.cancel_requested_at
        && at > req.heartbeat.started_at
    {
        return Some(format!("interrupted: its operator cancelled it at {at}"));
    }
    match agent.last_interaction_at {
        Some(at) if at > req.heartbeat.started_at => Some(format!(
            "interrupted: a user message arrived at {at}, after the heartbeat started"
        )),
        _ => None,
    }
}

/// The outside text a briefing of `window` and `found` carries: the window's events from
/// outside (webhooks, tools, the API), then the tools that found something; the first
/// [`MAX_AFTER_READING`] sources.
fn outside_read(window: &[Event], found: &Found) -> Vec<Outside> {
    let mut out: Vec<Outside> = window
        .iter()
        .filter(|e| Outside::is_outside(&e.source))
        .map(|e| Outside {
            source: e.source.clone(),
            event_id: Some(e.id.clone()),
        })
        .collect();
    for r in &found.results {
        let source = format!("tool:{}", r.tool);
        if !out.iter().any(|o| o.source == source) {
            out.push(Outside {
                source,
                event_id: None,
            });
        }
    }
    out.truncate(MAX_AFTER_READING);
    out
}
