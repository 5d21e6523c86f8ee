//! The agent's memories as the model uses them, in heartbeats and in conversation: the
//! `remember` and `recall` tools, and the memories a prompt carries (those most related
//! to what is in front of the agent).
//!
//! [`Memories`] keeps them and recalls them by meaning and by words ([`index`] says how
//! a recall scores); the domain's [`Memory`] says how they fade and come back.

mod book;
pub mod consolidate;
pub mod index;

pub use book::{BACKFILL, CACHE_BYTES, Found, GAIN, Memories, REACTIVATE_ABOVE, Recall};

use crate::engine::transcript::{Refusal, ToolAnswer};
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::domain::{
    Agent, AgentId, Heartbeat, HeartbeatId, Memory, MemoryId, MemoryKind, MemorySource,
    MemoryStatus, OutgoingTask, ToolSpec, ToolUse,
};
use crate::error::{StoreError, chain};
use crate::ports::{SessionQueue, Store};

/// Most tokens (estimated at 4 characters a token) of the memories a prompt carries.
pub const PROMPT_TOKENS: usize = 500;

/// The `remember` and `recall` tools, with `later` saying where a memory is seen again.
pub fn specs(later: &str) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "remember".to_owned(),
            description: format!(
                "Store a fact or note worth keeping (about the user, a plan, a preference), to recall {later}. Give its kind (fact, preference, plan, episode) and importance (0 to 1) when you can."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "kind": {"type": "string", "enum": ["fact", "preference", "plan", "episode"]},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1}
                },
                "required": ["text"]
            }),
        },
        ToolSpec {
            name: "recall".to_owned(),
            description: "Search all your memories by meaning and by words: the best matches, each with its kind, status (a suspended one has faded; recalling it brings it back), weight and when it was last recalled.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"]
            }),
        },
    ]
}

/// Where a tool call runs: who keeps a memory, in which beat.
#[derive(Clone, Debug)]
pub struct Context {
    /// Who a memory kept here comes from.
    pub source: MemorySource,
    /// The heartbeat, if one runs the call.
    pub heartbeat: Option<HeartbeatId>,
    /// The ids a memory kept here comes from (the heartbeat, the turn).
    pub source_ids: Vec<String>,
    /// The outside text read before (see [`Memory::after_reading`]).
    pub after_reading: Vec<crate::domain::Outside>,
    /// The agent's beat.
    pub beat: u64,
}

/// Runs `remember` or `recall` for `agent`; `None` for another tool. A memory's id is
/// `id` (derived from the run and the call, so a rerun stores it once).
pub async fn run(
    memories: &Memories,
    agent: &Agent,
    call: &ToolUse,
    id: MemoryId,
    cx: &Context,
    now: Timestamp,
) -> Option<ToolAnswer> {
    Some(match call.name.as_str() {
        "remember" => remember(memories, agent, call, id, cx, now).await,
        "recall" => match text_arg(&call.input, "query") {
            Err(e) => Err(e),
            Ok(query) => match memories
                .recall(agent, &Recall::for_model(&query, cx.beat), now)
                .await
            {
                Err(e) => Err(chain(&e).into()),
                Ok(found) => Ok(json!({"memories": found.iter().map(shown).collect::<Vec<_>>()})),
            },
        },
        _ => return None,
    })
}

async fn remember(
    memories: &Memories,
    agent: &Agent,
    call: &ToolUse,
    id: MemoryId,
    cx: &Context,
    now: Timestamp,
) -> ToolAnswer {
    let text = text_arg(&call.input, "text")?;
    let mut memory = Memory::new(id, &agent.id, &text, cx.beat, now).map_err(|e| e.to_string())?;
    if let Some(kind) = call.input.get("kind").and_then(Value::as_str) {
        memory.kind = MemoryKind::parse(kind).map_err(|e| e.to_string())?;
    }
    if let Some(i) = call.input.get("importance") {
        let i = i
            .as_f64()
            .ok_or_else(|| "\"importance\" is a number from 0 to 1".to_owned())?;
        memory.importance = Memory::check_importance(i as f32).map_err(|e| e.to_string())?;
    }
    memory.source = cx.source;
    memory.source_ids = cx.source_ids.clone();
    memory.heartbeat_id = cx.heartbeat.clone();
    memory.after_reading = cx.after_reading.clone();
    match memories.remember(&agent.id, vec![memory]).await {
        Ok(kept) => Ok(json!({"remembered": true, "memory_id": kept[0].id})),
        Err(e) => Err(chain(&e).into()),
    }
}

/// A found memory as the model reads it.
fn shown(f: &Found) -> Value {
    let m = &f.memory;
    let mut v = json!({
        "id": m.id,
        "text": m.text,
        "kind": m.kind,
        "status": if f.reactivated { MemoryStatus::Active } else { f.status },
        "weight": round2(f.weight),
        "importance": round2(m.importance),
        "score": round2(f.score),
        "last_recalled": m.recalled_at,
        "kept_at": m.created_at,
        "source": m.source.as_str(),
    });
    if f.reactivated {
        v["reactivated"] = json!(true);
    }
    v
}

fn round2(x: f32) -> f64 {
    (f64::from(x) * 100.0).round() / 100.0
}

/// A tool's string argument, trimmed and not empty.
pub(crate) fn text_arg(input: &Value, name: &str) -> Result<String, Refusal> {
    input
        .get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Refusal(format!("give a non-empty string \"{name}\"")))
}

/// What the agent knows that bears on `about` (the new messages, the window's events),
/// for a prompt: the memories a recall of it finds first, then, while
/// room is left, what it knows best whatever the subject (its weightiest memories: the
/// user's name, that they are vegetarian), within `tokens` (estimated at 4 characters a
/// token), one frame each ([`super::framing`]: a memory's text is data, whoever wrote
/// it), labelled with where it came from. `None` without memories.
///
/// Being shown is not being recalled: nothing shown here is reinforced, and a suspended
/// memory stays suspended and out of the prompt, so memories on a recurring subject still fade when the agent
/// never recalls them (the `recall` tool does). What was shown is logged by id.
pub async fn known(
    memories: &Memories,
    agent: &Agent,
    about: &str,
    beat: u64,
    tokens: usize,
    now: Timestamp,
) -> Result<Option<String>, StoreError> {
    let recall = Recall {
        query: about.to_owned(),
        beat,
        limit: 20,
        max_chars: tokens * 4,
        reinforce: false,
        skip_folded: true,
    };
    let mut shown: Vec<Memory> = memories
        .recall(agent, &recall, now)
        .await?
        .into_iter()
        .filter(|f| f.status == MemoryStatus::Active)
        .map(|f| f.memory)
        .collect();
    for m in memories.weightiest(agent, beat, 20).await? {
        if !shown.iter().any(|s| s.id == m.id) {
            shown.push(m);
        }
    }
    let text = frames(&shown, tokens);
    if !shown.is_empty() {
        let ids: Vec<&str> = shown.iter().map(|m| m.id.as_str()).collect();
        tracing::info!(agent_id = %agent.id, shown = shown.len(), memories = ?ids, "memories shown in the prompt");
    }
    Ok(text)
}

/// The beat `agent` is at: its newest heartbeat's, or the one before it when that one
/// has not started yet (0 before its first heartbeat). Weights fade by it.
pub async fn beat_now(store: &dyn Store, agent: &AgentId) -> Result<u64, StoreError> {
    let newest = store.heartbeats_page(agent, None, 1).await?;
    Ok(newest.first().map_or(0, Heartbeat::beat_reached))
}

/// Queues the day's consolidation of every agent that is not paused (a paused agent's
/// memories do not fade: its beats stand still), each in the agent's own session so the
/// worker runs it after what was queued before; a second call the same day is dropped by
/// the queue's deduplication within its window. Returns how many were queued.
pub async fn queue_consolidations(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let day = now.strftime("%Y-%m-%d").to_string();
    let tasks: Vec<OutgoingTask> = store
        .list_agents()
        .await?
        .iter()
        .filter(|a| !a.is_paused())
        .map(|a| OutgoingTask::consolidate(&a.id, &day))
        .collect();
    for chunk in tasks.chunks(10) {
        queue.send(chunk).await?;
    }
    Ok(tasks.len())
}

/// Frames of `memories`, in order, while they fit in `tokens`.
pub fn frames(memories: &[Memory], tokens: usize) -> Option<String> {
    let mut left = tokens;
    let mut lines = Vec::new();
    for m in memories {
        let from = format!("memory ({})", m.provenance());
        let line = super::framing::frame(&from, &m.text);
        let cost = line.chars().count().div_ceil(4) + 1;
        if cost > left {
            continue;
        }
        left -= cost;
        lines.push(line);
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_arguments_must_be_non_empty_strings() {
        assert_eq!(
            text_arg(&json!({"thought": " hi "}), "thought").unwrap(),
            "hi"
        );
        assert!(text_arg(&json!({"thought": ""}), "thought").is_err());
        assert!(text_arg(&json!({"thought": 3}), "thought").is_err());
    }
}
