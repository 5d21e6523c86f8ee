//! What the turns a turn takes over did. A turn that a newer message dropped mid-answer
//! leaves its messages to the next turn, which answers them with the newer ones; the
//! steps it had taken — its tool calls and their results — go into that turn's context
//! after the messages, so the model knows what was done already, and its calls to MCP
//! tools go to that turn's calls, so an identical one is answered from the call made
//! and not sent again: a table asked for once is booked once.

use std::collections::HashSet;

use serde_json::Value;

use crate::domain::{Action, AgentId, ChatMessage, ToolUse, Turn, TurnId};
use crate::error::StoreError;
use crate::ports::Store;

/// Turns read back, newest first, to find the ones taken over.
const TURNS_BACK: usize = 8;
/// Actions read back, newest first, to find their calls.
const ACTIONS_BACK: usize = 200;

/// What the turns taken over did.
#[derive(Default)]
pub(super) struct TakenOver {
    /// Their tool calls and results, as the model was given them.
    pub(super) messages: Vec<ChatMessage>,
    /// Their calls to MCP tools.
    pub(super) calls: Vec<Action>,
}

/// What the turns the next turn of `agent` takes over did: the newest turns, as long as
/// each was dropped for a newer message.
pub(super) async fn taken_over(
    store: &dyn Store,
    agent: &AgentId,
) -> Result<TakenOver, StoreError> {
    let dropped: Vec<Turn> = store
        .list_turns(agent, TURNS_BACK)
        .await?
        .into_iter()
        .take_while(Turn::superseded)
        .collect();
    let mut out = TakenOver::default();
    for t in dropped.iter().rev() {
        out.messages.extend(replayed(&t.steps));
    }
    if out.messages.is_empty() {
        return Ok(out);
    }
    let ids: HashSet<&TurnId> = dropped.iter().map(|t| &t.id).collect();
    out.calls = store
        .list_actions(agent, ACTIONS_BACK)
        .await?
        .into_iter()
        .filter(|a| {
            a.call
                .as_ref()
                .and_then(|c| c.turn_id.as_ref())
                .is_some_and(|t| ids.contains(t))
        })
        .collect();
    Ok(out)
}

/// A turn's kept steps as the messages that gave them to the model: each model step
/// that called tools, with the results of those calls (a step whose results were not
/// all kept is left out).
fn replayed(steps: &[Value]) -> Vec<ChatMessage> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let step = &steps[i];
        i += 1;
        if step["kind"] != "llm" {
            continue;
        }
        let Ok(calls) = serde_json::from_value::<Vec<ToolUse>>(step["tool_calls"].clone()) else {
            continue;
        };
        let results = &steps[i..(i + calls.len()).min(steps.len())];
        let answered = results.len() == calls.len()
            && calls
                .iter()
                .zip(results)
                .all(|(c, r)| r["kind"] == "tool" && r["name"] == c.name.as_str());
        if calls.is_empty() || !answered {
            continue;
        }
        i += calls.len();
        out.push(ChatMessage::Assistant {
            text: step["text"].as_str().map(str::to_owned),
            tool_calls: calls.clone(),
        });
        for (call, r) in calls.iter().zip(results) {
            out.push(ChatMessage::ToolResult {
                call_id: call.id.clone(),
                content: r["result"].to_string(),
                is_error: r["is_error"].as_bool().unwrap_or(false),
                images: Vec::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_dropped_turns_calls_and_results_are_replayed_and_an_unanswered_step_is_not() {
        let steps = vec![
            json!({"kind": "llm", "step": 0, "text": "booking",
                   "tool_calls": [{"id": "c1", "name": "book", "input": {"at": "20:00"}}]}),
            json!({"kind": "tool", "name": "book", "input": {"at": "20:00"}, "result": {"booked": 7}, "is_error": false}),
            json!({"kind": "llm", "step": 1, "text": null,
                   "tool_calls": [{"id": "c2", "name": "pay", "input": {}}]}),
            json!({"kind": "aborted", "step": 2}),
        ];
        let messages = replayed(&steps);
        assert_eq!(messages.len(), 2, "{messages:?}");
        match &messages[1] {
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => {
                assert_eq!(
                    (call_id.as_str(), content.as_str(), *is_error),
                    ("c1", r#"{"booked":7}"#, false)
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
