//! A model's tool loop as it is kept — on the heartbeat agent's action and on a
//! conversation turn: each model call, and each tool's input and result.

use serde_json::{Value, json};
use tracing::info;

use crate::domain::{ChatMessage, ImageInput, LlmResponse, ToolUse};

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
/// model (an error as `{"error": …}`, marked so).
pub fn tool_step(
    call: &ToolUse,
    result: Result<Value, String>,
    sees_images: bool,
) -> (Value, ChatMessage) {
    let (mut content, is_error) = match result {
        Ok(v) => (v, false),
        Err(e) => (json!({"error": e}), true),
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
    let message = ChatMessage::ToolResult {
        call_id: call.id.clone(),
        content: content.to_string(),
        is_error,
        images,
    };
    let step = json!({
        "kind": "tool",
        "name": call.name,
        "input": call.input,
        "result": content,
        "is_error": is_error,
    });
    (step, message)
}
