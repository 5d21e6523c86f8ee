//! A model's tool loop as it is kept — on the heartbeat agent's action and on a
//! conversation turn: each model call, and each tool's input and result.

use serde_json::{Value, json};
use tracing::info;

use crate::domain::{ChatMessage, ImageInput, LlmResponse, ToolUse, clipped};

/// The most of a tool call's result (its images aside) that the model is given and its
/// step keeps, and of its input that the step keeps: a longer one is clipped, its
/// strings cut with the count of bytes left out, so one large answer neither fills the
/// prompt nor the record.
pub const RESULT_BYTES: usize = 16 * 1024;

/// The most tool calls of one model answer that are made: the others are answered
/// with an error saying so (nothing is done for them), and the model may make them in
/// its next answer.
pub const CALLS_PER_ANSWER: usize = 16;

/// What a tool call tells the model: what the tool returned, or why it was not done.
/// Neither is a failure of Pulse's: the model reads either one and goes on.
pub type ToolAnswer = Result<Value, Refusal>;

/// Why a tool call was not done, in words for the model (given back to it marked as an
/// error, as `{"error": …}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl Refusal {
    /// The words the model is given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Self(why)
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Self {
        Self(why.to_owned())
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the model is told of a call past [`CALLS_PER_ANSWER`] in one answer.
pub fn not_made(call: &ToolUse) -> ToolAnswer {
    Err(Refusal(format!(
        "not made: one answer may make at most {CALLS_PER_ANSWER} tool calls, and this was a later one; nothing was done for {}. Make the calls still needed in your next answer",
        call.name
    )))
}

/// The most of each field of a step kept when a record holds too many steps for their
/// texts to be cut to fit.
const BRIEF_FIELD: usize = 512;

/// `steps` as a record keeps them, within `limit` bytes of JSON: whole; or with their
/// longest texts cut (see [`clipped`]); or, when there are too many steps for that,
/// the first ones (each field cut to half a kilobyte) and a last step of kind `omitted`
/// counting those left out. Each step stays a step: a page can still show them.
pub fn kept(steps: Vec<Value>, limit: usize) -> Vec<Value> {
    let count = steps.len();
    if let Value::Array(kept) = clipped(Value::Array(steps.clone()), limit) {
        return kept;
    }
    // Room for the note of what was left out.
    let room = limit.saturating_sub(128);
    let mut used = 2;
    let mut out = Vec::new();
    for step in steps {
        // Each field cut on its own, so the step keeps its kind and its shape.
        let step = match step {
            Value::Object(fields) => Value::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (k, clipped(v, BRIEF_FIELD)))
                    .collect(),
            ),
            other => clipped(other, BRIEF_FIELD),
        };
        let size = step.to_string().len() + 1;
        if used + size > room {
            break;
        }
        used += size;
        out.push(step);
    }
    let left_out = count - out.len();
    out.push(json!({"kind": "omitted", "steps": left_out}));
    out
}

/// About how many tokens `messages` add to the next prompt (four characters a token).
pub fn added_tokens(messages: &[ChatMessage]) -> u64 {
    super::interrupt::estimated_usage(messages).input_tokens
}

/// The step of model call number `step` of a loop (`heartbeat agent`, `reply`): its
/// text, tool calls, usage and stop reason, also logged.
pub fn call_step(step: u32, resp: &LlmResponse, run: &'static str) -> Value {
    info!(
        run,
        step,
        provider = resp.provider,
        model = %resp.model,
        tool_calls = resp.tool_calls.len(),
        input_tokens = resp.usage.input_tokens,
        output_tokens = resp.usage.output_tokens,
        "model step"
    );
    json!({
        "kind": "llm",
        "step": step,
        "text": resp.text,
        "tool_calls": resp.tool_calls,
        "usage": resp.usage,
        "stop": resp.stop,
    })
}

/// What `call` returned: the step kept, and the message giving the result back to the
/// model (an error as `{"error": …}`, marked so), each within [`RESULT_BYTES`].
pub fn tool_step(call: &ToolUse, result: ToolAnswer, sees_images: bool) -> (Value, ChatMessage) {
    let (mut content, is_error) = match result {
        Ok(v) => (v, false),
        Err(Refusal(why)) => (json!({"error": why}), true),
    };
    // Images ride beside the result (see [`crate::tools::IMAGES`]): given to a model that
    // is sent images, left as the result's notes for one that is not, kept out of the
    // transcript either way.
    let images = match content
        .as_object_mut()
        .and_then(|o| o.remove(crate::tools::IMAGES))
    {
        Some(Value::Array(found)) if sees_images => found
            .iter()
            .filter_map(|i| {
                Some(ImageInput::Inline {
                    media_type: i["media_type"].as_str()?.to_owned(),
                    data: i["data"].as_str()?.to_owned(),
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    let content = clipped(content, RESULT_BYTES);
    let message = ChatMessage::ToolResult {
        call_id: call.id.clone(),
        content: content.to_string(),
        is_error,
        images,
    };
    let step = json!({
        "kind": "tool",
        "name": call.name,
        "input": clipped(call.input.clone(), RESULT_BYTES),
        "result": content,
        "is_error": is_error,
    });
    (step, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_steps_stay_steps_within_the_limit() {
        let small: Vec<Value> = (0..3)
            .map(|i| json!({"kind": "tool", "name": "remember", "input": {"text": i}}))
            .collect();
        assert_eq!(kept(small.clone(), 10_000), small, "whole when they fit");
        // One long text is cut, the steps stay.
        let mut long = small.clone();
        long[1]["result"] = json!("x".repeat(50_000));
        let cut = kept(long, 10_000);
        assert_eq!(cut.len(), 3);
        assert!(Value::Array(cut.clone()).to_string().len() <= 10_000);
        assert!(cut[1]["result"].as_str().unwrap().contains("more bytes]"));
        // Too many steps for cutting to help: the first ones, then what was left out.
        let many: Vec<Value> = (0..1_000)
            .map(|i| json!({"kind": "tool", "name": "remember", "input": {"text": format!("fact number {i}")}, "result": {"id": format!("mm_{i:020}")}}))
            .collect();
        let kept_many = kept(many.clone(), 10_000);
        assert!(Value::Array(kept_many.clone()).to_string().len() <= 10_000);
        let last = kept_many.last().unwrap();
        assert_eq!(last["kind"], "omitted");
        let shown = kept_many.len() - 1;
        assert!(shown > 20, "{shown}");
        assert_eq!(last["steps"], 1_000 - shown);
        assert_eq!(kept_many[..shown], many[..shown], "the first ones whole");
    }

    #[test]
    fn a_tool_result_is_clipped_for_the_model_and_the_step() {
        let call = ToolUse {
            id: "c1".into(),
            name: "big".into(),
            input: json!({"q": "y".repeat(40_000)}),
        };
        let (step, message) =
            tool_step(&call, Ok(json!({"content": ["z".repeat(1 << 20)]})), false);
        let ChatMessage::ToolResult { content, .. } = message else {
            panic!("a tool result")
        };
        assert!(content.len() <= RESULT_BYTES, "{}", content.len());
        assert!(content.contains("more bytes]"));
        assert!(step.to_string().len() <= 2 * RESULT_BYTES + 200);
        let err = tool_step(&call, Err(Refusal("e".repeat(1 << 20))), false).1;
        assert!(err.text().unwrap().len() <= RESULT_BYTES);
    }
}
