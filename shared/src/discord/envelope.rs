//! What a Discord message is to an agent: its envelope (type, flags, timestamps, author,
//! content, attachments with name, content type, size, duration, waveform, width,
//! height and description, embeds, stickers, reference, poll), its pictures as image
//! parts, and words for a message that has no text — a voice note or a file is never
//! dropped, the agent is told what arrived. Built from the raw JSON, so nothing Discord
//! sends is lost to a typed model. Used by the interactions endpoint (the message
//! context-menu command) and the gateway (every message).

use serde_json::{Value, json};

use crate::domain::ContentBlock;

/// Most characters of a message's text kept in its envelope and its signal; the rest
/// is cut with a note (Discord allows 4,000 to its largest plans).
pub const MAX_MESSAGE_CHARS: usize = 4_000;

/// The name a person shows: their nickname in the guild, else their global name,
/// else their username.
pub fn display_name(user: &Value, nick: Option<&Value>) -> Option<String> {
    nick.and_then(Value::as_str)
        .or_else(|| user.get("global_name").and_then(Value::as_str))
        .or_else(|| user.get("username").and_then(Value::as_str))
        .map(str::to_owned)
}

/// Who someone is: id, username and global name.
pub fn person(user: &Value) -> Value {
    json!({
        "id": user.get("id"),
        "username": user.get("username"),
        "global_name": user.get("global_name"),
    })
}

/// An attachment's fields an agent reads, from Discord's attachment object.
pub fn attachment(a: &Value) -> Value {
    json!({
        "name": a.get("filename"),
        "content_type": a.get("content_type"),
        "size": a.get("size"),
        "duration": a.get("duration_secs"),
        "waveform": a.get("waveform"),
        "width": a.get("width"),
        "height": a.get("height"),
        "description": a.get("description"),
    })
}

/// An image attachment as an image part for the model.
pub fn image_block(a: &Value) -> Option<ContentBlock> {
    let media = a.get("content_type").and_then(Value::as_str)?;
    if !media.starts_with("image/") {
        return None;
    }
    Some(ContentBlock::Image {
        url: a.get("url").and_then(Value::as_str)?.to_owned(),
        media_type: Some(media.to_owned()),
    })
}

/// "1 attachment: voice-message.ogg (audio/ogg, 12.5 s)": for messages with no text.
pub fn describe(attachments: &[Value]) -> String {
    let parts: Vec<String> = attachments
        .iter()
        .map(|a| {
            let name = a.get("filename").and_then(Value::as_str).unwrap_or("file");
            let mut what = vec![
                a.get("content_type")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown type")
                    .to_owned(),
            ];
            if let Some(d) = a.get("duration_secs").and_then(Value::as_f64) {
                what.push(format!("{d:.1} s"));
            }
            format!("{name} ({})", what.join(", "))
        })
        .collect();
    match parts.len() {
        0 => "(no text)".to_owned(),
        1 => format!("(no text; 1 attachment: {})", parts[0]),
        n => format!("(no text; {n} attachments: {})", parts.join("; ")),
    }
}

/// `text` cut to [`MAX_MESSAGE_CHARS`] with a note saying how much was left out.
pub fn bounded(text: &str) -> String {
    let n = text.chars().count();
    if n <= MAX_MESSAGE_CHARS {
        return text.to_owned();
    }
    let kept: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
    format!(
        "{kept}\n[truncated: {} of {n} characters left out]",
        n - MAX_MESSAGE_CHARS
    )
}

/// A message's attachments (none when it has none).
pub fn attachments(m: &Value) -> Vec<Value> {
    m.get("attachments")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Discord's message flags by bit, as its documentation names them.
const MESSAGE_FLAGS: [(u64, &str); 14] = [
    (1 << 0, "CROSSPOSTED"),
    (1 << 1, "IS_CROSSPOST"),
    (1 << 2, "SUPPRESS_EMBEDS"),
    (1 << 3, "SOURCE_MESSAGE_DELETED"),
    (1 << 4, "URGENT"),
    (1 << 5, "HAS_THREAD"),
    (1 << 6, "EPHEMERAL"),
    (1 << 7, "LOADING"),
    (1 << 8, "FAILED_TO_MENTION_SOME_ROLES_IN_THREAD"),
    (1 << 10, "SHOULD_SHOW_LINK_NOT_DISCORD_WARNING"),
    (1 << 12, "SUPPRESS_NOTIFICATIONS"),
    (1 << 13, "IS_VOICE_MESSAGE"),
    (1 << 14, "HAS_SNAPSHOT"),
    (1 << 15, "IS_COMPONENTS_V2"),
];

/// The names of the bits set in `flags` (a bit Discord has not named as `BIT_<n>`), so
/// a model can tell a voice message without knowing the table.
pub fn flag_names(flags: u64) -> Vec<String> {
    (0..64)
        .map(|bit| 1u64 << bit)
        .filter(|b| flags & b != 0)
        .map(|b| {
            MESSAGE_FLAGS.iter().find(|(v, _)| *v == b).map_or_else(
                || format!("BIT_{}", b.trailing_zeros()),
                |(_, n)| (*n).to_owned(),
            )
        })
        .collect()
}

/// The envelope of a Discord message object.
pub fn message_envelope(m: &Value) -> Value {
    let files = attachments(m);
    let author = m.get("author").cloned().unwrap_or(Value::Null);
    let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
    let stickers: Vec<Value> = m
        .get("sticker_items")
        .and_then(Value::as_array)
        .map(|s| {
            s.iter()
                .map(|x| json!({"name": x.get("name"), "format": x.get("format_type")}))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "type": m.get("type"),
        "flags": m.get("flags"),
        "flag_names": m.get("flags").and_then(Value::as_u64).map(flag_names),
        "created_at": m.get("timestamp"),
        "edited_at": m.get("edited_timestamp"),
        "pinned": m.get("pinned"),
        "tts": m.get("tts"),
        "author": person(&author),
        "content": if content.is_empty() { Value::Null } else { Value::from(bounded(content)) },
        "attachments": files.iter().map(attachment).collect::<Vec<_>>(),
        "embeds": m.get("embeds").cloned().unwrap_or_else(|| json!([])),
        "stickers": stickers,
        "reference": m.get("message_reference"),
        "poll": m.pointer("/poll/question/text").map(|q| json!({"question": q})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_without_text_is_described_by_its_attachments() {
        let voice = json!({"filename": "voice-message.ogg", "content_type": "audio/ogg", "duration_secs": 12.5, "size": 4000});
        assert_eq!(
            describe(&[voice]),
            "(no text; 1 attachment: voice-message.ogg (audio/ogg, 12.5 s))"
        );
        assert_eq!(describe(&[]), "(no text)");
    }

    #[test]
    fn flags_are_named_beside_the_integer() {
        assert_eq!(flag_names(8192), ["IS_VOICE_MESSAGE"]);
        assert_eq!(
            flag_names(4096 | 4),
            ["SUPPRESS_EMBEDS", "SUPPRESS_NOTIFICATIONS"]
        );
        assert_eq!(flag_names(1 << 20), ["BIT_20"]);
        assert!(flag_names(0).is_empty());
        let envelope = message_envelope(&json!({"flags": 8192}));
        assert_eq!(envelope["flag_names"], json!(["IS_VOICE_MESSAGE"]));
    }

    #[test]
    fn a_long_message_is_cut_with_a_note() {
        let long = "x".repeat(MAX_MESSAGE_CHARS + 10);
        let cut = bounded(&long);
        assert!(cut.starts_with(&"x".repeat(MAX_MESSAGE_CHARS)));
        assert!(
            cut.ends_with("[truncated: 10 of 4010 characters left out]"),
            "{cut}"
        );
        assert_eq!(bounded("short"), "short");
    }
}
