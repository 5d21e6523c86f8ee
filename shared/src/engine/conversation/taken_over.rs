//! What the turns a turn takes over did. A turn that a newer message dropped mid-answer
//! leaves its messages to the next turn, which answers them with the newer ones; the
//! steps it had taken — its tool calls and their results — go into that turn's context
//! after the messages, so the model knows what was done already, and its calls that
//! were done go to that turn as [`Made`]: a call of the next turn identical to one of
//! them (same tool, same arguments) is answered from it and not made again, whatever
//! the tool — a table asked for once is booked once, a reminder set once, a memory kept
//! once. Only what was done is carried: a call that failed is made again when the model
//! asks again (a transient failure can be retried); an MCP call whose outcome is
//! unknown is not (it may have been done). An MCP call's outcome is read from its
//! action by the key the step keeps, not by scanning the log.

use crate::engine::transcript::ToolAnswer;
use serde_json::Value;
use tracing::warn;

use crate::domain::{ActionStatus, AgentId, ChatMessage, EventId, ToolName, ToolUse, Turn};
use crate::engine::agent_tools::answer_of;
use crate::error::StoreError;
use crate::ports::Store;

/// Turns read back, newest first, to find the ones taken over.
const TURNS_BACK: usize = 8;

/// What the turns taken over did.
#[derive(Default)]
pub(super) struct TakenOver {
    /// Their tool calls and results, as the model was given them.
    pub(super) messages: Vec<ChatMessage>,
    /// Their calls that were done, oldest first.
    pub(super) made: Vec<Made>,
}

/// A call a turn taken over made and that is not to be made again.
pub(super) struct Made {
    name: String,
    input: Value,
    /// What the model is told again.
    answer: ToolAnswer,
}

impl TakenOver {
    /// The answer of the first call made like `call` (same tool, same arguments), taken
    /// out so that it answers one call only; `None` when none was made.
    pub(super) fn answer(&mut self, call: &ToolUse) -> Option<ToolAnswer> {
        let at = self
            .made
            .iter()
            .position(|m| m.name == call.name && m.input == call.input)?;
        Some(self.made.remove(at).answer)
    }
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
        for step in t.steps.iter().filter(|s| s["kind"] == "tool") {
            if let Some(made) = made(store, agent, step).await? {
                out.made.push(made);
            }
        }
    }
    Ok(out)
}

/// The call a tool step records, if it was done. A step that reused an earlier turn's
/// answer is not counted again.
async fn made(
    store: &dyn Store,
    agent: &AgentId,
    step: &Value,
) -> Result<Option<Made>, StoreError> {
    if step["reused"] == true {
        return Ok(None);
    }
    let (Some(name), input) = (step["name"].as_str(), step["input"].clone()) else {
        return Ok(None);
    };
    let failed = step["is_error"].as_bool().unwrap_or(false);
    let filed = (
        step["filed"]["event_id"].as_str().map(EventId::parse),
        step["filed"]["tool"].as_str().map(ToolName::parse),
    );
    let answer = match filed {
        // An MCP call: its action says how it went.
        (Some(Ok(event)), Some(Ok(tool))) => match store.action_on(agent, &event, &tool).await? {
            // Finished in the background, after its turn was told it was still going:
            // the answer is the one recorded.
            Some(a) if a.status == ActionStatus::Completed && failed => answer_of(&a),
            Some(a) if a.status == ActionStatus::Completed => Ok(step["result"].clone()),
            Some(a) if matches!(a.status, ActionStatus::Unknown | ActionStatus::Running) => {
                answer_of(&a)
            }
            Some(_) => return Ok(None),
            None if failed => return Ok(None),
            None => {
                warn!(
                    tool = name,
                    "a dropped turn's call has no action on record; taken as done"
                );
                Ok(step["result"].clone())
            }
        },
        _ if failed => return Ok(None),
        _ => Ok(step["result"].clone()),
    };
    Ok(Some(Made {
        name: name.to_owned(),
        input,
        answer,
    }))
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
