//! A model's call to an MCP tool, as an action.
//!
//! Every call is recorded in the agent's action log before it is sent: RUNNING, then
//! COMPLETED, FAILED or UNKNOWN with the answer (clipped for the log), its time and its
//! `Idempotency-Key`. Its hooks are the same as any tool's: BEFORE_<SERVER> and
//! ACTION_STARTED, then AFTER_<SERVER> and ACTION_COMPLETED or ACTION_FAILED.
//!
//! The action's id derives from the run (the heartbeat agent's action, or the chat
//! turn), the call's place in it, the tool and the arguments, so a run made again after
//! a crash finds each call it had already made:
//! - finished: its recorded answer is given to the model again, and nothing is sent;
//! - still RUNNING (the process stopped during the call): the server may have done the
//!   work, so unless the server is marked `--idempotent` the call is recorded UNKNOWN
//!   and not sent again; an idempotent one is sent again with the same key.
//!
//! A call whose answer was lost after it was sent is UNKNOWN the same way. The model is
//! told so, and an operator settles it (`pulse actions resolve ID --as ...`).

use crate::engine::transcript::{Refusal, ToolAnswer};
use std::time::Instant;

use jiff::Timestamp;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::{AgentTools, Offer, fits, idempotency_key};
use crate::domain::{
    Action, ActionId, ActionStatus, Agent, Event, EventId, HeartbeatId, HookData, HookType,
    ModelCall, ToolName, ToolPolicy, ToolUse, TurnId,
};
use crate::engine::hooks::Emission;
use crate::engine::interrupt::{self, Raced, StopOn};
use crate::error::chain;
use crate::ports::Writer;
use crate::tools::McpCall;

/// The most of an answer kept in the action log (the model is given as much: see
/// [`crate::engine::transcript::RESULT_BYTES`]).
const KEPT_ANSWER: usize = 16 * 1024;

/// Where a model's call is made: its run, for the action record and the hooks.
pub struct Site<'a> {
    /// The agent.
    pub agent: &'a Agent,
    /// The heartbeat (for a chat turn, beat 0: no heartbeat).
    pub heartbeat_id: HeartbeatId,
    /// The event the heartbeat agent answers; none in a chat turn.
    pub event: Option<&'a Event>,
    /// The chat turn; none in a heartbeat.
    pub turn_id: Option<&'a TurnId>,
    /// The run: the heartbeat agent's action id, or the turn id.
    pub run: &'a str,
    /// The call's place in its run.
    pub index: usize,
    /// When the run's event (or the turn's first message) was made, in ms: the stamp
    /// of the call's ids, which files the call with its run.
    pub at_ms: u64,
    /// What stops the wait for a call in flight; none: it is waited for.
    pub race: Option<Race>,
    /// What the model said beside its calls, if anything: the reason a parked call's
    /// approval shows.
    pub said: Option<&'a str>,
}

impl<'a> Site<'a> {
    /// Call `index` of chat turn `turn`, whose first message was made at `at_ms`. A
    /// turn's calls belong to no heartbeat: beat 0.
    pub fn in_turn(agent: &'a Agent, turn: &'a TurnId, index: usize, at_ms: u64) -> Self {
        Self {
            agent,
            heartbeat_id: HeartbeatId::new(agent.id.clone(), 0),
            event: None,
            turn_id: Some(turn),
            run: turn.as_str(),
            index,
            at_ms,
            race: None,
            said: None,
        }
    }

    /// The same site, with what the model said beside its calls.
    pub fn said(mut self, text: Option<&'a str>) -> Self {
        self.said = text.filter(|t| !t.trim().is_empty());
        self
    }

    /// The same site, its calls raced against `race`.
    pub fn raced(mut self, race: Race) -> Self {
        self.race = Some(race);
        self
    }

    /// The key of `call` made here, which its server is sent as `Idempotency-Key`.
    pub(super) fn key(&self, call: &ToolUse) -> String {
        idempotency_key(&format!("{}.{}", self.run, self.index), call)
    }

    pub(super) fn triggered_by(&self) -> &str {
        self.event.map_or("TURN", |e| e.event_type.as_str())
    }
    pub(super) fn in_heartbeat(&self) -> Option<HeartbeatId> {
        self.event.map(|_| self.heartbeat_id.clone())
    }
}

/// How starting a call's action went.
pub(super) enum Begun {
    /// Send it.
    Send,
    /// A run before finished it (or left it UNKNOWN): its answer, nothing sent.
    Done(Box<Action>),
}

impl Offer {
    /// Where the action of `call` made at `site` is filed (its event and its server),
    /// so that it can be read again by key. `None` when `call` names no offered tool.
    pub fn filed(&self, site: &Site<'_>, call: &ToolUse) -> Option<(EventId, ToolName)> {
        let offered = self.tools.iter().find(|t| t.model_name == call.name)?;
        Some((
            EventId::derived(site.at_ms, &[&site.key(call)]),
            offered.server.clone(),
        ))
    }
}

/// What drops the wait for a call in flight: a user message newer than `known` (or,
/// with [`StopOn::UserOrCancel`], its operator's cancel).
#[derive(Clone, Copy, Debug)]
pub struct Race {
    /// What the run already answers.
    pub known: Option<Timestamp>,
    /// What stops it.
    pub stop: StopOn,
}

/// How a call went.
pub struct Called {
    /// What the model is told.
    pub answer: ToolAnswer,
    /// A user message (or a cancel) at this time stopped the wait for the call: the run
    /// yields to it.
    pub interrupted: Option<Timestamp>,
}

/// A [`Site`] that owns what it names: a call finished in the background.
struct OwnedSite {
    agent: Agent,
    heartbeat_id: HeartbeatId,
    event: Option<Event>,
    turn_id: Option<TurnId>,
    run: String,
    index: usize,
    at_ms: u64,
}

impl OwnedSite {
    fn of(site: &Site<'_>) -> Self {
        Self {
            agent: site.agent.clone(),
            heartbeat_id: site.heartbeat_id.clone(),
            event: site.event.cloned(),
            turn_id: site.turn_id.cloned(),
            run: site.run.to_owned(),
            index: site.index,
            at_ms: site.at_ms,
        }
    }

    fn site(&self) -> Site<'_> {
        Site {
            agent: &self.agent,
            heartbeat_id: self.heartbeat_id.clone(),
            event: self.event.as_ref(),
            turn_id: self.turn_id.as_ref(),
            run: &self.run,
            index: self.index,
            at_ms: self.at_ms,
            race: None,
            said: None,
        }
    }
}

impl AgentTools {
    /// Runs `call` if it names an offered tool (`None` otherwise), recorded as an action
    /// of `site` (see the module's documentation): what the model is told.
    pub async fn run(&self, offer: &Offer, call: &ToolUse, site: &Site<'_>) -> Option<ToolAnswer> {
        Some(self.call(offer, call, site).await?.answer)
    }

    /// [`AgentTools::run`], raced against `site`'s [`Race`]: when a user message arrives
    /// during the call, a call that is safe to make again (the tool is read-only, or
    /// its server idempotent) is dropped (its request closed) and recorded CANCELLED; any
    /// other goes on in the background, its outcome recorded when it ends, and the
    /// run is told at once — the person is answered first either way.
    pub async fn call(&self, offer: &Offer, call: &ToolUse, site: &Site<'_>) -> Option<Called> {
        let offered = offer.tools.iter().find(|t| t.model_name == call.name)?;
        let (server, idempotent) = offer.servers.get(&offered.server)?;
        let answered = |answer| {
            Some(Called {
                answer,
                interrupted: None,
            })
        };
        if let Err(why) = fits(&call.input, &offered.spec.parameters) {
            return answered(Err(format!(
                "the arguments do not fit {}: {why}; nothing was sent",
                call.name
            )
            .into()));
        }
        match server.policy_of(&offered.tool) {
            (ToolPolicy::Allow, _) => {}
            // Granted to this agent by an approval made with --always.
            (ToolPolicy::Ask, _) if site.agent.is_granted(&offered.server, &offered.tool) => {}
            (ToolPolicy::Deny, source) => {
                info!(tool = %call.name, "a call of a tool whose policy is deny: not sent");
                return answered(Err(format!(
                    "{} may not be called: its policy is deny ({}); nothing was sent. Tell your owner if it is needed",
                    call.name,
                    source.as_str()
                ).into()));
            }
            (ToolPolicy::Ask, _) => {
                return answered(self.park(offer, call, site, offered).await);
            }
        }
        let key = site.key(call);
        let mut action = self.action(site, &offered.server, &offered.tool, call, key);
        match self.begin(&mut action, *idempotent).await {
            Err(why) => return answered(Err(why)),
            Ok(Begun::Done(done)) => {
                info!(action_id = %done.id, status = ?done.status, "MCP call already made in an earlier run; its answer is reused");
                self.finish_hooks(offer, site, &done).await;
                return answered(answer_of(&done));
            }
            Ok(Begun::Send) => {}
        }
        self.start_hooks(offer, site, &action).await;
        let started = Instant::now();
        let key = action
            .call
            .as_ref()
            .map_or("", |c| c.key.as_str())
            .to_owned();
        let sent = {
            let (clients, name, server) =
                (self.clients.clone(), offered.server.clone(), server.clone());
            let (tool, input) = (offered.tool.clone(), call.input.clone());
            Box::pin(async move { clients.call(&name, &server, &tool, &input, &key).await })
        };
        let outcome = match site.race {
            None => sent.await,
            Some(race) => {
                let mut sent = sent;
                let raced = interrupt::unless_user_speaks(
                    self.store.as_ref(),
                    &site.agent.id,
                    race.known,
                    race.stop,
                    &mut sent,
                )
                .await;
                match raced {
                    Raced::Done(outcome) => outcome,
                    Raced::Interrupted(at) if offered.read_only || *idempotent => {
                        // Dropping the future closes the request.
                        drop(sent);
                        let why = format!(
                            "dropped in flight: a newer message arrived at {at}; this call is safe to make again"
                        );
                        action.status = ActionStatus::Cancelled;
                        action.completed_at = Some(self.clock.now());
                        action.duration_ms = Some(started.elapsed().as_millis() as u64);
                        action.error = Some(why.clone());
                        info!(action_id = %action.id, "an MCP call in flight was dropped for a newer message");
                        if let Err(e) = self
                            .store
                            .finish_action(&action, &[], Writer::Session)
                            .await
                        {
                            warn!(action_id = %action.id, error = %chain(&e), "the dropped call could not be recorded; it stays RUNNING, and a rerun makes it again");
                        }
                        self.finish_hooks(offer, site, &action).await;
                        return Some(Called {
                            answer: Err(why.into()),
                            interrupted: Some(at),
                        });
                    }
                    Raced::Interrupted(at) => {
                        let id = action.id.clone();
                        info!(action_id = %id, "a newer message arrived during an MCP call that is not safe to make again: it finishes in the background");
                        let (me, offer, owned, name) = (
                            self.clone(),
                            offer.clone(),
                            OwnedSite::of(site),
                            call.name.clone(),
                        );
                        let idempotent = *idempotent;
                        tokio::spawn(async move {
                            let outcome = sent.await;
                            // Its answer is on the action's record, for the turn that
                            // takes this one over.
                            let _answer = me
                                .finished(
                                    &offer,
                                    &owned.site(),
                                    action,
                                    outcome,
                                    &name,
                                    idempotent,
                                    started,
                                )
                                .await;
                        });
                        return Some(Called {
                            answer: Err(format!(
                                "still being made: a newer message arrived at {at}, so it goes on in the background and its outcome is recorded on action {id}; do not make it again"
                            ).into()),
                            interrupted: Some(at),
                        });
                    }
                }
            }
        };
        let answer = self
            .finished(
                offer,
                site,
                action,
                outcome,
                &call.name,
                *idempotent,
                started,
            )
            .await;
        answered(answer)
    }

    /// Records how a sent call ended, emits its hooks and counts its health; what the
    /// model is told.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finished(
        &self,
        offer: &Offer,
        site: &Site<'_>,
        mut action: Action,
        outcome: McpCall,
        name: &str,
        idempotent: bool,
        started: Instant,
    ) -> ToolAnswer {
        action.duration_ms = Some(started.elapsed().as_millis() as u64);
        action.completed_at = Some(self.clock.now());
        let answer = settle(&mut action, outcome, name, idempotent);
        info!(
            action_id = %action.id,
            tool = %action.tool,
            ms = action.duration_ms,
            status = ?action.status,
            "MCP tool call"
        );
        if let Err(e) = self
            .store
            .finish_action(&action, &[], Writer::Session)
            .await
        {
            warn!(action_id = %action.id, error = %chain(&e), "the MCP call's outcome could not be recorded; it stays RUNNING, and a rerun finds it so");
        }
        self.finish_hooks(offer, site, &action).await;
        let ok = action.status == ActionStatus::Completed;
        if let Some(change) =
            self.health
                .record(&action.agent_id, &action.tool, ok, self.clock.now())
        {
            change
                .announce(self.hooks.as_ref(), &offer.routes, site.agent)
                .await;
        }
        answer
    }

    pub(super) fn action(
        &self,
        site: &Site<'_>,
        server: &ToolName,
        tool: &str,
        call: &ToolUse,
        key: String,
    ) -> Action {
        let event_id = EventId::derived(site.at_ms, &[&key]);
        Action {
            id: ActionId::for_event(&event_id, server),
            agent_id: site.agent.id.clone(),
            heartbeat_id: site.heartbeat_id.clone(),
            event_id,
            tool: server.clone(),
            status: ActionStatus::Running,
            attempt: 1,
            depth: site
                .event
                .and_then(|e| e.cascade.as_ref())
                .map_or(0, |c| c.depth),
            request: json!({"tool": tool, "as": call.name, "arguments": call.input}),
            response: None,
            error: None,
            started_at: self.clock.now(),
            completed_at: None,
            duration_ms: None,
            new_events: Vec::new(),
            call: Some(ModelCall {
                tool: tool.to_owned(),
                event_id: site.event.map(|e| e.id.clone()),
                turn_id: site.turn_id.cloned(),
                key,
            }),
        }
    }

    /// Records the call RUNNING, or finds what a run before made of it.
    pub(super) async fn begin(
        &self,
        action: &mut Action,
        idempotent: bool,
    ) -> Result<Begun, Refusal> {
        let existing = match self.store.start_action(action).await {
            Ok(None) => return Ok(Begun::Send),
            Ok(Some(existing)) => existing,
            Err(e) => {
                return Err(Refusal(format!(
                    "the call could not be recorded ({}); nothing was sent",
                    chain(&e)
                )));
            }
        };
        if existing.status.is_final() {
            return Ok(Begun::Done(Box::new(existing)));
        }
        if !idempotent {
            let mut unknown = existing.clone();
            unknown.status = ActionStatus::Unknown;
            unknown.completed_at = Some(self.clock.now());
            unknown.error = Some(format!(
                "an earlier run stopped while this call to {} was being made (attempt {}), so it may have been done; settle it with `pulse actions resolve {} --as succeeded|failed`",
                existing.tool, existing.attempt, existing.id
            ));
            if let Err(e) = self
                .store
                .finish_action(&unknown, &[], Writer::Session)
                .await
            {
                warn!(action_id = %unknown.id, error = %chain(&e), "the call could not be recorded UNKNOWN");
            }
            warn!(action_id = %unknown.id, "an MCP call of an earlier run did not finish and its server is not idempotent: recorded UNKNOWN, not sent again");
            return Ok(Begun::Done(Box::new(unknown)));
        }
        action.attempt = existing.attempt + 1;
        match self.store.restart_action(action, existing.attempt).await {
            Ok(true) => Ok(Begun::Send),
            Ok(false) => Err("another run of this heartbeat is making this call".into()),
            Err(e) => Err(Refusal(format!(
                "the call could not be recorded ({}); nothing was sent",
                chain(&e)
            ))),
        }
    }

    pub(super) async fn start_hooks(&self, offer: &Offer, site: &Site<'_>, action: &Action) {
        let data = json!({
            "tool_name": action.tool,
            "mcp_tool": action.call.as_ref().map(|c| &c.tool),
            "attempt": action.attempt,
            "event_id": site.event.map(|e| &e.id),
            "turn_id": site.turn_id,
        });
        for t in [
            HookType::before_tool(&action.tool),
            HookType::of(HookType::ACTION_STARTED),
        ] {
            self.emit_for(offer, site, action, t, data.clone()).await;
        }
    }

    pub(super) async fn finish_hooks(&self, offer: &Offer, site: &Site<'_>, action: &Action) {
        let mut data = HookData::tool_finished(action, &[]);
        data["mcp_tool"] = json!(action.call.as_ref().map(|c| &c.tool));
        data["turn_id"] = json!(site.turn_id);
        let finished = match action.status {
            ActionStatus::Completed => Some(HookType::ACTION_COMPLETED),
            ActionStatus::Failed => Some(HookType::ACTION_FAILED),
            _ => None,
        };
        let types =
            std::iter::once(HookType::after_tool(&action.tool)).chain(finished.map(HookType::of));
        for t in types {
            self.emit_for(offer, site, action, t, data.clone()).await;
        }
    }

    /// Emits one of a call's hooks. A queue that refuses it is logged: the call was
    /// made and its answer stands; a rerun of the run emits the same deliveries again.
    async fn emit_for(
        &self,
        offer: &Offer,
        site: &Site<'_>,
        action: &Action,
        hook_type: HookType,
        data: Value,
    ) {
        let Some(hooks) = &self.hooks else {
            return;
        };
        let emission = Emission {
            hook_type,
            heartbeat_id: site.in_heartbeat(),
            action_id: Some(action.id.clone()),
            data,
            triggered_by: site.triggered_by().to_owned(),
            key_ms: site.at_ms,
            key: vec![action.id.to_string()],
        };
        if let Err(e) = hooks.emit(&offer.routes, site.agent, emission).await {
            warn!(action_id = %action.id, error = %e, "a hook of an MCP call was not queued");
        }
    }
}

/// Records `outcome` on `action`; what the model is told.
fn settle(action: &mut Action, outcome: McpCall, name: &str, idempotent: bool) -> ToolAnswer {
    let (status, answer) = match outcome {
        McpCall::Answered {
            result,
            is_error: false,
        } => {
            action.response = Some(json!({"result": kept(&result)}));
            (ActionStatus::Completed, Ok(result))
        }
        McpCall::Answered {
            result,
            is_error: true,
        } => {
            action.response = Some(json!({"result": kept(&result), "is_error": true}));
            (
                ActionStatus::Failed,
                Err(format!("{name} failed: {result}")),
            )
        }
        McpCall::NotSent(why) => (
            ActionStatus::Failed,
            Err(format!("{why}; nothing was done")),
        ),
        McpCall::Unknown(why) if idempotent => (
            ActionStatus::Failed,
            Err(format!(
                "{why}; it may have been done, and may be tried again"
            )),
        ),
        McpCall::Unknown(why) => (
            ActionStatus::Unknown,
            Err(format!(
                "{why}; it may or may not have been done, so do not repeat it and do not say it was done"
            )),
        ),
    };
    action.status = status;
    if let Err(why) = &answer {
        action.error = Some(why.clone());
    }
    answer.map_err(Refusal)
}

/// What the model is told of a call a run before made.
pub(crate) fn answer_of(action: &Action) -> ToolAnswer {
    match action.status {
        ActionStatus::Completed => Ok(action
            .response
            .as_ref()
            .map_or(Value::Null, |r| r["result"].clone())),
        ActionStatus::Unknown | ActionStatus::Running => Err(format!(
            "{}; it may or may not have been done, so do not repeat it and do not say it was done",
            action
                .error
                .as_deref()
                .unwrap_or("this call's answer was never recorded")
        )
        .into()),
        _ => Err(action
            .error
            .clone()
            .unwrap_or_else(|| "the call failed".to_owned())
            .into()),
    }
}

/// An answer as the log keeps it (its images left out): whole, or its start when it is
/// long.
fn kept(result: &Value) -> Value {
    // Copied without the images (their bytes can run to megabytes).
    let result = match result.as_object() {
        Some(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| k.as_str() != crate::tools::IMAGES)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        None => result.clone(),
    };
    crate::domain::clipped(result, KEPT_ANSWER)
}
