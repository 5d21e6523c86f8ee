//! Asking the model for a turn's reply: a tool loop within the agent's budgets.

use crate::engine::transcript::{Refusal, ToolAnswer};
use tracing::{Instrument as _, error, info, warn};

use super::*;
use crate::domain::{Agent, ChatMessage, LlmRequest, MemoryId, TurnId, Usage};
use crate::engine::agent_tools::{Race, Site};
use crate::engine::dollars::{self, Held};
use crate::engine::interrupt::{self, Raced};
use crate::engine::{memory, prompt, reminders, transcript};
use crate::error::{EngineError, chain};

/// What the model answered a turn.
#[derive(Default)]
pub(super) struct Asked {
    pub(super) text: String,
    pub(super) provider: String,
    pub(super) model: String,
    pub(super) usage: Usage,
    pub(super) failed: Option<String>,
    pub(super) steps: Vec<serde_json::Value>,
}

impl Conversation {
    /// Asks the model for the reply, in a tool loop with `remember`, `recall`,
    /// `schedule` and the agent's MCP tools (a call identical to one `taken` made, in a
    /// turn this one takes over, is answered from it and not made again) under the
    /// agent's step and token budgets (the heartbeat agent's): each request asks for
    /// at most the tokens left, and the last step allowed shows the tools but lets the
    /// model call none, so the loop ends with words. The tools are the heartbeat's too
    /// (its `speak` and `emit_event` answered "heartbeats only"), and the context's
    /// first `prefix` messages are marked for the provider's prompt cache, so a turn
    /// and a heartbeat share what they send first ([`prompt`]). A failure that retrying cannot fix (no key, a rejected request)
    /// becomes a reply saying so, recorded as the turn's error, rather than a message
    /// that is redelivered until it is dead-lettered.
    pub(super) async fn ask(
        &self,
        agent: &Agent,
        (mut messages, prefix): (Vec<ChatMessage>, usize),
        turn_id: &TurnId,
        (first_ms, mut taken): (u64, taken_over::TakenOver),
        (beat, user_spoke): (u64, bool),
        known: Option<jiff::Timestamp>,
    ) -> Result<Asked, EngineError> {
        let cx = memory::Context {
            source: crate::domain::MemorySource::User,
            heartbeat: None,
            source_ids: vec![turn_id.to_string()],
            after_reading: Vec::new(),
            beat,
        };
        let llm = match self.llm.select(agent) {
            Ok(l) => l,
            Err(e) => {
                let why = chain(&e);
                error!(error = %why, "no model for this agent");
                return Ok(Asked {
                    text: apology(&why),
                    provider: "none".into(),
                    model: "none".into(),
                    failed: Some(why),
                    ..Asked::default()
                });
            }
        };
        let mut asked = Asked {
            provider: llm.provider().to_owned(),
            ..Asked::default()
        };
        let (tools, offer) = crate::engine::agent_tools::with_own(
            self.agent_tools.as_deref(),
            agent,
            prompt::tools(),
        )
        .await;
        // Someone is talking now.
        let now = self.clock.now();
        let cache = prompt::cache(agent, llm.model(), prefix, (Some(now), None, now));
        let budgets = &agent.budgets;
        let steps = budgets.max_steps.max(1);
        let mut last_input = 0;
        let mut calls = 0usize;
        for step in 0..steps {
            // Another step only if the next prompt (the last one and the results since)
            // still fits.
            let left = budgets
                .max_tokens
                .saturating_sub(asked.usage.total() + last_input);
            if step > 0 && left == 0 {
                warn!(
                    budget = budgets.max_tokens,
                    "the turn's token budget is spent; replying with what was written"
                );
                break;
            }
            let last = step + 1 == steps;
            let request = LlmRequest {
                model: None,
                messages: messages.clone(),
                tools: tools.clone(),
                tools_off: last,
                max_tokens: u32::try_from(left)
                    .unwrap_or(u32::MAX)
                    .min(self.settings.reply_max_tokens),
                cache: Some(cache),
            };
            // Past the agent's calls a minute, the turn waits its turn (tried again, as
            // when the model is down); a later step ends the loop with what was written.
            if let Some(why) =
                crate::engine::pace::take(self.store.as_ref(), agent, self.clock.now()).await?
            {
                if step == 0 {
                    return Err(EngineError::ModelDown(why));
                }
                warn!(reason = %why, "the turn stops: its next model call would pass the calls a minute");
                break;
            }
            // The call's worst case is held against a dollar budget first: one that
            // does not fit is not made.
            let hold = match dollars::hold(
                self.store.as_ref(),
                self.hooks.as_ref(),
                &self.settings.prices,
                agent,
                llm.model(),
                &request,
                self.clock.now(),
            )
            .await?
            {
                Held::Free => None,
                Held::Held(h) => Some(h),
                Held::Refused(r) if step == 0 => {
                    warn!(reason = %r.reason, "no model call for this turn");
                    // A person is told in a fixed line (the reason is in the log); a
                    // thought alone goes unspoken.
                    return Ok(Asked {
                        failed: (!user_spoke).then(|| format!("not answered: {}", r.reason)),
                        text: if user_spoke { r.line } else { String::new() },
                        provider: "pulse".into(),
                        model: "none".into(),
                        ..Asked::default()
                    });
                }
                Held::Refused(r) => {
                    warn!(reason = %r.reason, "the turn stops: its next model call does not fit the dollar budget");
                    break;
                }
            };
            // A user message that arrives meanwhile makes this reply stale: the call is
            // dropped and the turn ends superseded, so the next turn answers all of it.
            let call = interrupt::unless_user_speaks(
                self.store.as_ref(),
                &agent.id,
                known,
                interrupt::StopOn::UserMessage,
                llm.complete(&request),
            );
            let raced = call.await;
            if let Some(hold) = hold {
                let used = dollars::used(&raced, &request);
                dollars::settle(
                    self.store.as_ref(),
                    self.hooks.as_ref(),
                    agent,
                    hold,
                    used.as_ref(),
                    self.clock.now(),
                )
                .await;
            }
            let resp = match raced {
                Raced::Done(Ok(resp)) => resp,
                Raced::Done(Err(e)) => return refused(e, asked),
                Raced::Interrupted(at) => return Ok(superseded(asked, &request, step, at)),
            };
            asked.usage.add(resp.usage);
            crate::meter::tokens(resp.provider, &resp.usage);
            last_input = resp.usage.input_tokens;
            asked.provider = resp.provider.to_owned();
            asked.model = resp.model.clone();
            if asked.steps.is_empty() && resp.tool_calls.is_empty() {
                // A plain reply, as most are: no steps to keep.
                asked.text = resp.text.unwrap_or_default();
                break;
            }
            asked
                .steps
                .push(transcript::call_step(step, &resp, "reply"));
            asked.text = resp.text.clone().unwrap_or_default();
            if resp.tool_calls.is_empty() || last {
                break;
            }
            messages.push(ChatMessage::Assistant {
                text: resp.text.clone(),
                tool_calls: resp.tool_calls.clone(),
            });
            let answered_from = messages.len();
            for (n, call) in resp.tool_calls.iter().enumerate() {
                if n >= transcript::CALLS_PER_ANSWER {
                    let (record, message) =
                        transcript::tool_step(call, transcript::not_made(call), false);
                    asked.steps.push(record);
                    messages.push(message);
                    continue;
                }
                let id = MemoryId::derived(
                    first_ms,
                    &[turn_id.as_str(), &step.to_string(), &calls.to_string()],
                );
                let site = Site::in_turn(agent, turn_id, calls, first_ms)
                    .raced(Race {
                        known,
                        stop: interrupt::StopOn::UserMessage,
                    })
                    .said(resp.text.as_deref());
                calls += 1;
                let (result, reused, interrupted) = match taken.answer(call) {
                    Some(answer) => {
                        info!(tool = %call.name, "the turn this one takes over made this call: its answer is reused, nothing is done again");
                        (answer, true, None)
                    }
                    None => {
                        let trace = crate::traces::tool(&call.name, &call.id, "function");
                        let (answer, interrupted) = self
                            .run_tool(agent, (&offer, &site), call, id, &cx)
                            .instrument(trace.clone())
                            .await;
                        if let Err(refusal) = &answer {
                            crate::traces::failed(&trace, "tool_error", &refusal.0);
                        }
                        (answer, false, interrupted)
                    }
                };
                info!(tool = %call.name, is_error = result.is_err(), "reply tool call");
                let (mut record, message) =
                    transcript::tool_step(call, result, agent.llm.sees_images(&resp.model));
                if reused {
                    record["reused"] = true.into();
                } else if let Some((event_id, tool)) = offer.filed(&site, call) {
                    // Where its action is, for a turn that takes this one over.
                    record["filed"] = serde_json::json!({"event_id": event_id, "tool": tool});
                }
                asked.steps.push(record);
                messages.push(message);
                if let Some(at) = interrupted {
                    // A newer message arrived during the call: this turn yields to it
                    // now, and the turn answering both takes over what it did.
                    return Ok(yielded(asked, step + 1, at));
                }
            }
            // The next prompt is the last one with the results added.
            last_input += transcript::added_tokens(&messages[answered_from..]);
        }
        Ok(written(asked))
    }
}

/// The reply as written: logged, and never empty.
fn written(mut asked: Asked) -> Asked {
    info!(
        provider = %asked.provider,
        model = %asked.model,
        input_tokens = asked.usage.input_tokens,
        output_tokens = asked.usage.output_tokens,
        steps = asked.steps.len(),
        "reply written"
    );
    if asked.text.trim().is_empty() {
        asked.text = "(no reply)".to_owned();
    }
    asked
}

impl Conversation {
    /// Runs one of the turn's tools for the model: an MCP tool the agent is given (a
    /// call made at `site`), or `remember`, `recall`, `schedule` (a memory it keeps gets
    /// `id`).
    /// An MCP call is raced against a newer message (see [`crate::engine::agent_tools::AgentTools::call`]): the time
    /// one arrived, when it stopped the wait.
    async fn run_tool(
        &self,
        agent: &Agent,
        (offer, site): (&crate::engine::agent_tools::Offer, &Site<'_>),
        call: &crate::domain::ToolUse,
        id: MemoryId,
        cx: &memory::Context,
    ) -> (ToolAnswer, Option<jiff::Timestamp>) {
        if let Some(at) = &self.agent_tools
            && offer.offers(&call.name)
        {
            return match at.call(offer, call, site).await {
                Some(c) => (c.answer, c.interrupted),
                None => (Err(format!("no tool {}", call.name).into()), None),
            };
        }
        (self.run_own(agent, call, id, cx).await, None)
    }

    /// Runs one of Pulse's own tools for the turn's model.
    async fn run_own(
        &self,
        agent: &Agent,
        call: &crate::domain::ToolUse,
        id: MemoryId,
        cx: &memory::Context,
    ) -> ToolAnswer {
        let now = self.clock.now();
        if let Some(why) = prompt::heartbeat_only(&call.name) {
            return Err(why.into());
        }
        match memory::run(&self.memories, agent, call, id, cx, now).await {
            Some(r) => r,
            None if call.name == "schedule" => reminders::run_tool(
                self.store.as_ref(),
                agent,
                &call.input,
                now,
                self.settings.schedules,
            )
            .await
            .map(|(_, answer)| answer)
            .map_err(|e| Refusal(e.to_string())),
            None => Err(format!(
                "there is no tool {:?}; use remember, recall or schedule",
                call.name
            )
            .into()),
        }
    }
}

/// A model call that failed: a transient failure (transport, 429, 5xx) fails the step,
/// so the turn waits and is tried again (see `WaitingTurn`); one retrying cannot fix (no key, a rejected
/// request) becomes the reply, saying so, and the turn's error.
fn refused(e: crate::error::LlmError, mut asked: Asked) -> Result<Asked, EngineError> {
    let why = chain(&e);
    let retry = match &e {
        crate::error::LlmError::Transport { .. } => true,
        crate::error::LlmError::Status { status, .. } => *status == 429 || *status >= 500,
        _ => false,
    };
    if retry {
        return Err(EngineError::ModelDown(format!(
            "the model did not answer: {why}"
        )));
    }
    error!(error = %why, "the model rejected the turn");
    asked.text = apology(&why);
    asked.failed = Some(why);
    Ok(asked)
}

fn apology(why: &str) -> String {
    format!(
        "I could not think of a reply just now: {why}. An operator should check my LLM settings."
    )
}

/// What a turn that yielded to a newer message during a tool call records: no reply,
/// what it did so far, and [`Turn::SUPERSEDED`](crate::domain::Turn::SUPERSEDED) as its
/// error. No model call was dropped: nothing is estimated.
fn yielded(mut asked: Asked, step: u32, at: jiff::Timestamp) -> Asked {
    info!(newer_message_at = %at, "a newer message arrived during a tool call: the turn yields to it; the next turn answers both");
    asked.steps.push(serde_json::json!({
        "step": step,
        "kind": "aborted",
        "reason": "a newer user message arrived during a tool call",
        "newer_message_at": at,
    }));
    asked.text = String::new();
    asked.failed = Some(crate::domain::Turn::SUPERSEDED.to_owned());
    asked
}

/// What a turn whose model call was dropped for a newer message records: no reply, the
/// usage of its finished calls plus an estimate for the dropped one (marked as such),
/// and [`Turn::SUPERSEDED`] as its error.
fn superseded(mut asked: Asked, request: &LlmRequest, step: u32, at: jiff::Timestamp) -> Asked {
    let estimate = interrupt::estimated_usage(&request.messages);
    info!(
        newer_message_at = %at,
        estimated_input_tokens = estimate.input_tokens,
        "a newer message arrived while the model answered: its call was dropped; the next turn answers both"
    );
    asked.usage.add(estimate);
    asked.steps.push(serde_json::json!({
        "step": step,
        "kind": "aborted",
        "reason": "a newer user message arrived",
        "newer_message_at": at,
        "usage": estimate,
        "usage_estimated": true,
    }));
    asked.text = String::new();
    asked.failed = Some(crate::domain::Turn::SUPERSEDED.to_owned());
    asked
}
