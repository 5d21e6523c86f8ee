//! The Anthropic Messages API wire format.
//!
//! The first system message becomes the top-level `system`; a later one (Pulse's own
//! contexts make none, but a request may carry one) becomes a user-role text block
//! wrapped in `<system-note>` tags, since the API has no system role inside `messages`. Consecutive
//! messages of one role are merged into one message of several blocks. A trailing
//! assistant message is a prefill: the model continues from it.

use serde_json::{Value, json};

use super::HttpLlm;
use crate::domain::{
    CacheTtl, ChatMessage, ImageInput, LlmRequest, LlmResponse, StopReason, ToolUse, Usage,
};
use crate::error::LlmError;

pub(crate) struct Anthropic(pub(crate) HttpLlm);

pub(crate) fn request_body(req: &LlmRequest, model: &str) -> Value {
    let mut system = None;
    let mut messages: Vec<(String, Vec<Value>)> = Vec::new();
    // Where each of the request's messages ended: (message, block) of its last block.
    let mut ends: Vec<Option<(usize, usize)>> = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let mut push = |role: &str, block: Value| match messages.last_mut() {
            Some((r, blocks)) if r == role => blocks.push(block),
            _ => messages.push((role.to_owned(), vec![block])),
        };
        match m {
            ChatMessage::System { text } if i == 0 => system = Some(text.clone()),
            ChatMessage::System { text } => push(
                "user",
                json!({"type": "text", "text": format!("<system-note>\n{text}\n</system-note>")}),
            ),
            ChatMessage::User { text, images } => {
                // Images first, then the words about them (Anthropic's advice).
                for image in images {
                    push(
                        "user",
                        json!({"type": "image", "source": image_source(image)}),
                    );
                }
                push("user", json!({"type": "text", "text": text}));
            }
            ChatMessage::Assistant { text, tool_calls } => {
                if let Some(t) = text.as_deref().filter(|t| !t.is_empty()) {
                    push("assistant", json!({"type": "text", "text": t}));
                }
                for c in tool_calls {
                    push(
                        "assistant",
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}),
                    );
                }
            }
            ChatMessage::ToolResult {
                call_id,
                content,
                is_error,
                images,
            } => {
                // A tool's images are blocks of its result.
                let content = if images.is_empty() {
                    json!(content)
                } else {
                    let mut blocks = vec![json!({"type": "text", "text": content})];
                    blocks.extend(
                        images
                            .iter()
                            .map(|i| json!({"type": "image", "source": image_source(i)})),
                    );
                    Value::Array(blocks)
                };
                push(
                    "user",
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}),
                )
            }
        }
        ends.push(
            messages
                .len()
                .checked_sub(1)
                .map(|at| (at, messages[at].1.len() - 1)),
        );
    }
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(
            |t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}),
        )
        .collect();
    let mut system = system.map(|s| vec![json!({"type": "text", "text": s})]);
    if let Some(cache) = req.cache {
        // Cache breakpoints, at most four, in the order the prompt is read (the longer
        // lifetime first, as the API requires): the tools, the system prompt, the end of
        // the history (the prefix every call of the agent repeats), and the end of a
        // tool loop's prompt, which the loop's next step starts with.
        let long = breakpoint(cache.ttl);
        if let Some(last) = tools.last_mut() {
            last["cache_control"] = long.clone();
        }
        if let Some(block) = system.as_mut().and_then(|s| s.last_mut()) {
            block["cache_control"] = long.clone();
        }
        let history_end = cache
            .history
            .checked_sub(1)
            .and_then(|i| ends.get(i).copied().flatten());
        if let Some((m, b)) = history_end {
            messages[m].1[b]["cache_control"] = long;
        }
        let in_loop = matches!(req.messages.last(), Some(ChatMessage::ToolResult { .. }));
        let tail = ends.last().copied().flatten();
        if let Some((m, b)) = tail
            && in_loop
            && req.messages.len() > cache.history
            && tail != history_end
        {
            messages[m].1[b]["cache_control"] = breakpoint(CacheTtl::Minutes5);
        }
    }
    let mut body = json!({
        "model": model,
        "max_tokens": req.max_tokens,
        "messages": messages
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect::<Vec<_>>(),
    });
    if let Some(s) = system {
        body["system"] = Value::Array(s);
    }
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
        if req.tools_off {
            body["tool_choice"] = json!({"type": "none"});
        }
    }
    body
}

/// An image block's source.
fn image_source(image: &ImageInput) -> Value {
    match image {
        ImageInput::Url { url } => json!({"type": "url", "url": url}),
        ImageInput::Inline { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
    }
}

/// A prompt-cache breakpoint: five minutes (the default) or an hour, renewed by each
/// read.
fn breakpoint(ttl: CacheTtl) -> Value {
    match ttl {
        CacheTtl::Minutes5 => json!({"type": "ephemeral"}),
        CacheTtl::Hour => json!({"type": "ephemeral", "ttl": "1h"}),
    }
}

pub(crate) fn parse_response(v: &Value) -> Result<LlmResponse, LlmError> {
    let malformed = |m: &str| LlmError::Malformed {
        provider: "anthropic",
        message: m.to_owned(),
    };
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no \"content\" array"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => tool_calls.push(ToolUse {
                id: b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool_use block has no id"))?
                    .to_owned(),
                name: b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool_use block has no name"))?
                    .to_owned(),
                input: b.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            _ => {}
        }
    }
    let stop = match v.get("stop_reason").and_then(Value::as_str) {
        Some("end_turn") | Some("stop_sequence") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        _ => StopReason::Other,
    };
    super::disagreement("anthropic", v.get("stop_reason"), &tool_calls, stop);
    let usage = v.get("usage").cloned().unwrap_or(Value::Null);
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    // Anthropic counts the prompt in three parts: not cached, written to the cache, read
    // from it. Pulse's input tokens are the whole prompt.
    let (read, written) = (
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
    );
    // The writes kept for an hour, when the answer breaks them down.
    let long = usage
        .pointer("/cache_creation/ephemeral_1h_input_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(written);
    Ok(LlmResponse {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        stop,
        usage: Usage {
            input_tokens: n("input_tokens") + read + written,
            output_tokens: n("output_tokens"),
            cache_read_tokens: read,
            cache_write_tokens: written,
            cache_write_long_tokens: long,
        },
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        provider: "anthropic",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolSpec;

    #[test]
    fn system_goes_on_top_notes_go_in_user_blocks_and_roles_alternate() {
        let req = LlmRequest {
            model: None,
            messages: vec![
                ChatMessage::system("persona"),
                ChatMessage::user("hi"),
                ChatMessage::system("envelope"),
                ChatMessage::Assistant {
                    text: None,
                    tool_calls: vec![ToolUse {
                        id: "t1".into(),
                        name: "speak".into(),
                        input: json!({"thought": "x"}),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "t1".into(),
                    content: "{}".into(),
                    is_error: false,
                    images: Vec::new(),
                },
            ],
            tools: vec![ToolSpec {
                name: "speak".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }],
            max_tokens: 10,
            ..LlmRequest::default()
        };
        let body = request_body(&req, "m");
        assert_eq!(body["system"], json!([{"type": "text", "text": "persona"}]));
        assert!(body.get("tool_choice").is_none());
        assert!(
            !body.to_string().contains("cache_control"),
            "no breakpoint unless asked"
        );
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[0]["role"], "user");
        assert_eq!(
            msgs[0]["content"][1]["text"],
            "<system-note>\nenvelope\n</system-note>"
        );
        assert_eq!(msgs[1]["content"][0]["type"], "tool_use");
        assert_eq!(msgs[2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
    }

    #[test]
    fn tool_use_answers_are_read_with_their_usage() {
        let r = parse_response(&json!({
            "model": "claude", "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "thinking"}, {"type": "tool_use", "id": "a", "name": "speak", "input": {"thought": "hi"}}],
            "usage": {"input_tokens": 12, "output_tokens": 3}
        }))
        .unwrap();
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(r.tool_calls[0].input["thought"], "hi");
        assert_eq!(r.usage.total(), 15);
        assert!(parse_response(&json!({"nothing": 1})).is_err());
    }

    #[test]
    fn the_prompt_counts_its_cached_parts_and_says_which_they_were() {
        let r = parse_response(&json!({
            "model": "claude", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": 40, "cache_creation_input_tokens": 1_000,
                      "cache_read_input_tokens": 6_000, "output_tokens": 9}
        }))
        .unwrap();
        assert_eq!(r.usage.input_tokens, 7_040, "the whole prompt");
        assert_eq!(r.usage.cache_read_tokens, 6_000);
        assert_eq!(r.usage.cache_write_tokens, 1_000);
        assert_eq!(r.usage.cache_write_long_tokens, 0);
        assert_eq!(r.usage.output_tokens, 9);
        let r = parse_response(&json!({
            "model": "claude", "stop_reason": "end_turn", "content": [],
            "usage": {"input_tokens": 40, "cache_creation_input_tokens": 1_000,
                      "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 800},
                      "cache_read_input_tokens": 0, "output_tokens": 9}
        }))
        .unwrap();
        assert_eq!(r.usage.cache_write_tokens, 1_000);
        assert_eq!(r.usage.cache_write_long_tokens, 800, "the hour's writes");
    }

    /// A heartbeat's loop, two steps in: the history's last message and the loop's
    /// tail carry breakpoints as well as the tools and the system prompt.
    fn looping(ttl: CacheTtl) -> Value {
        let req = LlmRequest {
            messages: vec![
                ChatMessage::system("persona"),
                ChatMessage::user("old question"),
                ChatMessage::assistant("old answer"),
                ChatMessage::user("briefing"),
                ChatMessage::Assistant {
                    text: None,
                    tool_calls: vec![ToolUse {
                        id: "t1".into(),
                        name: "recall".into(),
                        input: json!({"query": "tea"}),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "t1".into(),
                    content: "green".into(),
                    is_error: false,
                    images: Vec::new(),
                },
            ],
            tools: vec![
                ToolSpec {
                    name: "speak".into(),
                    description: "d".into(),
                    parameters: json!({"type": "object"}),
                },
                ToolSpec {
                    name: "recall".into(),
                    description: "d".into(),
                    parameters: json!({"type": "object"}),
                },
            ],
            tools_off: true,
            max_tokens: 10,
            cache: Some(crate::domain::PromptCache { history: 3, ttl }),
            ..LlmRequest::default()
        };
        request_body(&req, "m")
    }

    /// Where the breakpoints are: JSON pointers to each block that has one.
    fn breakpoints(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(o) => {
                if let Some(c) = o.get("cache_control") {
                    out.push((at.to_owned(), c.clone()));
                }
                for (k, v) in o {
                    breakpoints(v, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    breakpoints(v, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_prefix_ends_in_breakpoints_at_most_four_the_longer_lifetime_first() {
        let body = looping(CacheTtl::Minutes5);
        let mut found = Vec::new();
        breakpoints(&body, "", &mut found);
        let at: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        // The tools' last, the system prompt, the history's last message (the
        // assistant's old answer), and the tool result the next step starts with.
        assert_eq!(
            at,
            [
                "/messages/1/content/0",
                "/messages/4/content/0",
                "/system/0",
                "/tools/1"
            ]
        );
        assert!(
            found
                .iter()
                .all(|(_, c)| *c == json!({"type": "ephemeral"}))
        );
        assert_eq!(body["messages"][1]["content"][0]["text"], "old answer");
        assert_eq!(body["messages"][4]["content"][0]["type"], "tool_result");
        // Tools shown, not to be called: the prefix stays the one cached.
        assert_eq!(body["tool_choice"], json!({"type": "none"}));

        let body = looping(CacheTtl::Hour);
        let hour = json!({"type": "ephemeral", "ttl": "1h"});
        assert_eq!(body["tools"][1]["cache_control"], hour);
        assert_eq!(body["system"][0]["cache_control"], hour);
        assert_eq!(body["messages"][1]["content"][0]["cache_control"], hour);
        // The loop's tail lives five minutes: it comes after the hour's breakpoints.
        assert_eq!(
            body["messages"][4]["content"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
    }

    #[test]
    fn a_tools_images_are_blocks_of_its_result() {
        let req = LlmRequest {
            model: None,
            messages: vec![
                ChatMessage::system("s"),
                ChatMessage::Assistant {
                    text: None,
                    tool_calls: vec![ToolUse {
                        id: "t1".into(),
                        name: "cal__picture".into(),
                        input: json!({}),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "t1".into(),
                    content: "{\"content\":[\"a red dot\"]}".into(),
                    is_error: false,
                    images: vec![ImageInput::Inline {
                        media_type: "image/png".into(),
                        data: "aGVsbG8=".into(),
                    }],
                },
            ],
            tools: Vec::new(),
            max_tokens: 10,
            ..LlmRequest::default()
        };
        let body = request_body(&req, "claude-sonnet-4");
        let result = &body["messages"][1]["content"][0];
        assert_eq!(result["type"], "tool_result");
        assert_eq!(result["content"][0]["type"], "text");
        assert_eq!(result["content"][1]["type"], "image");
        assert_eq!(result["content"][1]["source"]["data"], "aGVsbG8=");
    }
}
