//! A model's tool loop as it is kept — on the heartbeat agent's action and on a
//! conversation turn: each model call, and each tool's input and result.

use serde_json::{Value, json};

use crate::domain::{ChatMessage, LlmResponse, ToolUse};

/// The step of model call number `step`: its text, tool calls, usage and stop reason.
pub fn call_step(step: u32, resp: &LlmResponse) -> Value {
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
pub fn tool_step(call: &ToolUse, result: Result<Value, String>) -> (Value, ChatMessage) {
    let (content, is_error) = match result {
        Ok(v) => (v, false),
        Err(e) => (json!({"error": e}), true),
    };
    let message = ChatMessage::ToolResult {
        call_id: call.id.clone(),
        content: content.to_string(),
        is_error,
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
