//! The OpenAI-compatible chat completions wire format. Roles map one to one (system
//! messages stay where they are); tool calls carry their arguments as a JSON string.

use serde_json::{Value, json};

use super::HttpLlm;
use crate::domain::{ChatMessage, ImageInput, LlmRequest, LlmResponse, StopReason, ToolUse, Usage};
use crate::error::LlmError;

pub(crate) struct OpenAi(pub(crate) HttpLlm);

pub(crate) fn request_body(req: &LlmRequest, model: &str) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    // A tool message carries text only: the images tools returned follow the run of
    // tool messages as one user message.
    let mut tool_images: Vec<Value> = Vec::new();
    for m in &req.messages {
        if !matches!(m, ChatMessage::ToolResult { .. }) {
            flush_images(&mut messages, &mut tool_images);
        }
        messages.push(match m {
            ChatMessage::System { text } => json!({"role": "system", "content": text}),
            ChatMessage::User { text, images } if images.is_empty() => {
                json!({"role": "user", "content": text})
            }
            ChatMessage::User { text, images } => {
                let mut parts = vec![json!({"type": "text", "text": text})];
                parts.extend(images.iter().map(image_part));
                json!({"role": "user", "content": parts})
            }
            ChatMessage::Assistant { text, tool_calls } => {
                let mut v = json!({"role": "assistant", "content": text});
                if !tool_calls.is_empty() {
                    v["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.input.to_string()},
                            })
                        })
                        .collect();
                }
                v
            }
            ChatMessage::ToolResult {
                call_id,
                content,
                images,
                ..
            } => {
                tool_images.extend(images.iter().map(image_part));
                json!({"role": "tool", "tool_call_id": call_id, "content": content})
            }
        });
    }
    flush_images(&mut messages, &mut tool_images);
    let mut body = json!({"model": model, "max_tokens": req.max_tokens, "messages": messages});
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect();
        if req.tools_off {
            body["tool_choice"] = json!("none");
        }
    }
    // The provider caches a prompt's prefix on its own; a request keeps it the same
    // bytes from call to call (the tools, the system prompt, the history first).
    body
}

/// An image as a content part.
fn image_part(image: &ImageInput) -> Value {
    let url = match image {
        ImageInput::Url { url } => url.clone(),
        ImageInput::Inline { media_type, data } => format!("data:{media_type};base64,{data}"),
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// The images of the tool results just written, as one user message after them.
fn flush_images(messages: &mut Vec<Value>, images: &mut Vec<Value>) {
    if images.is_empty() {
        return;
    }
    let mut parts = vec![
        json!({"type": "text", "text": "The images the tool calls above returned, in order:"}),
    ];
    parts.append(images);
    messages.push(json!({"role": "user", "content": parts}));
}

pub(crate) fn parse_response(v: &Value) -> Result<LlmResponse, LlmError> {
    let malformed = |m: String| LlmError::Malformed {
        provider: "openai",
        message: m,
    };
    let choice = v
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| malformed("no choices".into()))?;
    let msg = choice
        .get("message")
        .ok_or_else(|| malformed("the choice has no message".into()))?;
    let mut tool_calls = Vec::new();
    for c in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = c
            .get("function")
            .ok_or_else(|| malformed("a tool call has no function".into()))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed("a tool call has no name".into()))?;
        let args = f.get("arguments").and_then(Value::as_str).unwrap_or("{}");
        let input: Value = serde_json::from_str(if args.trim().is_empty() { "{}" } else { args })
            .map_err(|e| {
            malformed(format!(
                "the arguments of tool call {name} are not JSON: {e}"
            ))
        })?;
        tool_calls.push(ToolUse {
            id: c.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
            name: name.to_owned(),
            input,
        });
    }
    let stop = match choice.get("finish_reason").and_then(Value::as_str) {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        _ if !tool_calls.is_empty() => StopReason::ToolUse,
        _ => StopReason::Other,
    };
    super::disagreement("openai", choice.get("finish_reason"), &tool_calls, stop);
    let usage = v.get("usage").cloned().unwrap_or(Value::Null);
    Ok(LlmResponse {
        text: msg
            .get("content")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        tool_calls,
        stop,
        usage: Usage {
            input_tokens: usage
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            output_tokens: usage
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            // Automatic prefix caching: the prompt tokens read from the cache are part of
            // the prompt's count.
            cache_read_tokens: usage
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            cache_write_tokens: 0,
            cache_write_long_tokens: 0,
        },
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        provider: "openai",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_round_trip_with_string_arguments() {
        let req = LlmRequest {
            model: None,
            messages: vec![
                ChatMessage::system("s"),
                ChatMessage::Assistant {
                    text: None,
                    tool_calls: vec![ToolUse {
                        id: "c1".into(),
                        name: "recall".into(),
                        input: json!({"query": "q"}),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "c1".into(),
                    content: "[]".into(),
                    is_error: false,
                    images: Vec::new(),
                },
                ChatMessage::system("note"),
            ],
            tools: Vec::new(),
            max_tokens: 5,
            ..LlmRequest::default()
        };
        let body = request_body(&req, "gpt");
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "{\"query\":\"q\"}"
        );
        assert_eq!(body["messages"][2]["role"], "tool");
        assert_eq!(body["messages"][3]["role"], "system");
        let r = parse_response(&json!({
            "model": "gpt", "usage": {"prompt_tokens": 4, "completion_tokens": 2},
            "choices": [{"finish_reason": "tool_calls", "message": {"content": null,
              "tool_calls": [{"id": "x", "type": "function", "function": {"name": "speak", "arguments": "{\"thought\":\"t\"}"}}]}}]
        }))
        .unwrap();
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(r.tool_calls[0].input["thought"], "t");
        assert_eq!(r.usage.input_tokens, 4);
        let bad = parse_response(
            &json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "x", "arguments": "{"}}]}}]}),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn a_tools_images_follow_the_tool_messages_as_one_user_message() {
        let call = |id: &str| ToolUse {
            id: id.into(),
            name: "cal__picture".into(),
            input: json!({}),
        };
        let result = |id: &str, images: Vec<ImageInput>| ChatMessage::ToolResult {
            call_id: id.into(),
            content: "{}".into(),
            is_error: false,
            images,
        };
        let png = ImageInput::Inline {
            media_type: "image/png".into(),
            data: "aGVsbG8=".into(),
        };
        let req = LlmRequest {
            model: None,
            messages: vec![
                ChatMessage::system("s"),
                ChatMessage::Assistant {
                    text: None,
                    tool_calls: vec![call("a"), call("b")],
                },
                result("a", vec![png.clone()]),
                result("b", vec![png]),
            ],
            tools: Vec::new(),
            max_tokens: 5,
            ..LlmRequest::default()
        };
        let body = request_body(&req, "gpt-4o");
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "assistant", "tool", "tool", "user"]);
        let parts = &body["messages"][4]["content"];
        assert_eq!(parts.as_array().unwrap().len(), 3, "{parts}");
        assert_eq!(
            parts[1]["image_url"]["url"],
            "data:image/png;base64,aGVsbG8="
        );
    }

    #[test]
    fn cached_prompt_tokens_are_read_from_the_details() {
        let r = parse_response(&json!({
            "model": "gpt", "usage": {"prompt_tokens": 5_000, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 4_096}},
            "choices": [{"finish_reason": "stop", "message": {"content": "hi"}}]
        }))
        .unwrap();
        assert_eq!(r.usage.input_tokens, 5_000);
        assert_eq!(r.usage.cache_read_tokens, 4_096);
        assert_eq!(r.usage.cache_write_tokens, 0);
    }
}
