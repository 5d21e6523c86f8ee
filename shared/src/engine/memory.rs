//! The agent's memories as the model uses them, in heartbeats and in conversation: the
//! `remember` and `recall` tools, and what a conversation's system prompt says the agent
//! knows about its user (facts about them, their preferences, what they asked it to keep).

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::domain::{Agent, HeartbeatId, Memory, MemoryId, ToolSpec, ToolUse};
use crate::error::chain;
use crate::ports::Store;

/// Memories searched by `recall` (the most recent ones).
pub const RECALL_SCAN: usize = 500;
/// Memories read for a conversation's system prompt (the most recent ones).
pub const PROMPT_SCAN: usize = 200;
/// Most tokens (estimated at 4 characters a token) of the memories a conversation's
/// system prompt carries.
pub const PROMPT_TOKENS: usize = 500;

/// The `remember` and `recall` tools, with `later` saying where a memory is seen again.
pub fn specs(later: &str) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "remember".to_owned(),
            description: format!(
                "Store a fact or note worth keeping (about the user, a plan, a preference), to recall {later}."
            ),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            }),
        },
        ToolSpec {
            name: "recall".to_owned(),
            description: "Search your memories by keywords.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"]
            }),
        },
    ]
}

/// Runs `remember` or `recall` for `agent`; `None` for another tool. A memory's id is
/// `id` (derived from the run and the call, so a rerun stores it once); `heartbeat` is
/// the heartbeat that made it, if one did.
pub async fn run(
    store: &dyn Store,
    agent: &Agent,
    call: &ToolUse,
    id: MemoryId,
    heartbeat: Option<HeartbeatId>,
    now: Timestamp,
) -> Option<Result<Value, String>> {
    Some(match call.name.as_str() {
        "remember" => match text_arg(&call.input, "text") {
            Err(e) => Err(e),
            Ok(text) => {
                let memory = Memory {
                    id,
                    agent_id: agent.id.clone(),
                    text,
                    heartbeat_id: heartbeat,
                    created_at: now,
                };
                match store.remember(&memory).await {
                    Ok(()) => Ok(json!({"remembered": true, "memory_id": memory.id})),
                    Err(e) => Err(chain(&e)),
                }
            }
        },
        "recall" => match text_arg(&call.input, "query") {
            Err(e) => Err(e),
            Ok(query) => match store.memories(&agent.id, RECALL_SCAN).await {
                Err(e) => Err(chain(&e)),
                Ok(memories) => {
                    let found = recall(&memories, &query, 5);
                    Ok(json!({"memories": found
                        .iter()
                        .map(|m| json!({"text": m.text, "at": m.created_at}))
                        .collect::<Vec<_>>()}))
                }
            },
        },
        _ => return None,
    })
}

/// A tool's string argument, trimmed and not empty.
pub(crate) fn text_arg(input: &Value, name: &str) -> Result<String, String> {
    input
        .get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| format!("give a non-empty string \"{name}\""))
}

/// Memories sharing the most words with `query`, newest first among equals (`memories`
/// are newest first). An empty query matches every memory.
pub fn recall<'a>(memories: &'a [Memory], query: &str, limit: usize) -> Vec<&'a Memory> {
    let words = words(query);
    let mut scored: Vec<(usize, usize, &Memory)> = memories
        .iter()
        .enumerate()
        .map(|(i, m)| (shared_words(&words, &m.text), i, m))
        .filter(|(score, _, _)| *score > 0 || words.is_empty())
        .collect();
    // Higher score first; memories are newest first, so a lower index wins ties.
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(limit).map(|(_, _, m)| m).collect()
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(str::to_lowercase)
        .collect()
}

fn shared_words(words: &[String], text: &str) -> usize {
    let text = text.to_lowercase();
    words.iter().filter(|w| text.contains(w.as_str())).count()
}

/// What the agent knows about its user, for a conversation's context: the memories most
/// related to `said` first, then the newest, while they fit in `tokens` (estimated at 4
/// characters a token), one frame each ([`super::framing`]: a memory's text is data,
/// whoever wrote it). `None` without memories.
pub fn known(memories: &[Memory], said: &str, tokens: usize) -> Option<String> {
    let words = words(said);
    let mut order: Vec<(usize, usize, &Memory)> = memories
        .iter()
        .enumerate()
        .map(|(i, m)| (shared_words(&words, &m.text), i, m))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut left = tokens;
    let mut lines = Vec::new();
    for (_, _, m) in order {
        let from = match m.heartbeat_id {
            Some(_) => "memory (kept in a heartbeat)",
            None => "memory (kept in a conversation)",
        };
        let line = super::framing::frame(from, &m.text);
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
    use crate::domain::AgentId;

    fn memory(text: &str, n: u64) -> Memory {
        Memory {
            id: MemoryId::derived(n, &[text]),
            agent_id: AgentId::generate(),
            text: text.to_owned(),
            heartbeat_id: None,
            created_at: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn recall_ranks_memories_by_shared_words_and_prefers_newer_ones() {
        let ms = vec![
            memory("the deadline for the report is friday", 3),
            memory("user likes green tea", 2),
            memory("report draft shared with Ana", 1),
        ];
        let found = recall(&ms, "report deadline", 5);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].text, "the deadline for the report is friday");
        assert_eq!(found[1].text, "report draft shared with Ana");
        assert!(recall(&ms, "bicycle", 5).is_empty());
    }

    #[test]
    fn the_prompt_knows_the_related_memories_first_then_the_newest_within_its_budget() {
        let ms = vec![
            memory("user likes green tea", 3),
            memory("the report is due friday", 2),
            memory(&"a very long note ".repeat(40), 1),
        ];
        let k = known(&ms, "how is the report going?", 50).unwrap();
        let lines: Vec<_> = k.lines().collect();
        assert_eq!(
            lines,
            [
                r#"{"from":"memory (kept in a conversation)","text":"the report is due friday"}"#,
                r#"{"from":"memory (kept in a conversation)","text":"user likes green tea"}"#
            ],
            "related first, framed; the long note does not fit"
        );
        assert_eq!(known(&[], "anything", 100), None);
        assert_eq!(known(&ms, "tea", 3), None, "nothing fits");
    }

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
