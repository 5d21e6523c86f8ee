//! What the engine says to an LLM and hears back, independent of any provider's wire
//! format. The `llm` module maps these to the Anthropic Messages API and to
//! OpenAI-compatible chat completions.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation sent to an LLM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// Instructions. The first one is the system prompt; later ones are notes inserted
    /// into the conversation (the ephemeral Discord envelope).
    System {
        /// The text.
        text: String,
    },
    /// What the user said, and the pictures they sent with it.
    User {
        /// The text.
        text: String,
        /// Images, for a model that accepts them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageInput>,
    },
    /// What the agent said or thought, and the tools it asked for.
    Assistant {
        /// The text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Tool calls, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolUse>,
    },
    /// The result of one tool call.
    ToolResult {
        /// The `ToolUse::id` it answers.
        call_id: String,
        /// The result, as text (usually JSON).
        content: String,
        /// True when the tool failed.
        #[serde(default)]
        is_error: bool,
        /// Images the tool returned, for a model that is sent images.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageInput>,
    },
}

impl ChatMessage {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::System { text: text.into() }
    }
    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            text: text.into(),
            images: Vec::new(),
        }
    }
    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        }
    }
    /// The role's name: `system`, `user`, `assistant` or `tool`.
    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant { .. } => "assistant",
            Self::ToolResult { .. } => "tool",
        }
    }
    /// The text, if the message has any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::System { text } | Self::User { text, .. } => Some(text),
            Self::Assistant { text, .. } => text.as_deref(),
            Self::ToolResult { content, .. } => Some(content),
        }
    }
}

/// An image given to a model: where the provider fetches it, or its bytes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageInput {
    /// A URL the provider can reach.
    Url {
        /// The URL.
        url: String,
    },
    /// The image itself, base64-encoded.
    Inline {
        /// Its media type (`image/png`, `image/jpeg`, `image/gif`, `image/webp`).
        media_type: String,
        /// The bytes, base64 (standard alphabet, padded).
        data: String,
    },
}

impl std::fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url { url } => f.debug_struct("Url").field("url", url).finish(),
            Self::Inline { media_type, data } => f
                .debug_struct("Inline")
                .field("media_type", media_type)
                .field("bytes_base64", &data.len())
                .finish(),
        }
    }
}

/// The media types providers accept for images.
pub const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Largest image sent inline, in bytes (5 MiB, Anthropic's limit per image).
pub const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// Models known to accept images, by name prefix. Others get the text fallback unless
/// an agent says `--vision on`.
const VISION_MODELS: [&str; 12] = [
    "claude-opus-4",
    "claude-sonnet-4",
    "claude-haiku-4",
    "claude-3-7-sonnet",
    "claude-3-5-sonnet",
    "claude-3-opus",
    "gpt-5",
    "gpt-4.1",
    "gpt-4o",
    "o4-mini",
    "o3",
    "o1",
];

/// Whether `model` is known to accept images.
pub fn model_sees_images(model: &str) -> bool {
    VISION_MODELS.iter().any(|p| model.starts_with(p))
}

/// A tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    /// The provider's id of the call, echoed in the result.
    pub id: String,
    /// Which tool.
    pub name: String,
    /// Its arguments (a JSON object).
    pub input: Value,
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// Tokens used by one call (or summed over a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, all of them: those read from the provider's prompt cache and
    /// those written to it included.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Of the prompt tokens, those read from the provider's cache (billed at a fraction
    /// of the input price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of the prompt tokens, those written to the provider's cache (billed at a premium
    /// by Anthropic).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Of the cache writes, those kept for an hour rather than five minutes (Anthropic
    /// bills them at a higher premium).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_long_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Both together.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
    /// Adds another call's usage.
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.cache_write_long_tokens += other.cache_write_long_tokens;
    }
}

/// One request to a model.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LlmRequest {
    /// The model; the provider's configured default when `None`.
    pub model: Option<String>,
    /// The conversation, in order.
    pub messages: Vec<ChatMessage>,
    /// Tools the model is shown.
    pub tools: Vec<ToolSpec>,
    /// Whether the model may call them: `false` shows the tools (so the prompt's
    /// prefix, and the provider's cache of it, stays the same) but asks for words.
    pub tools_off: bool,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Where the prompt's stable prefix ends, for the provider's prompt cache; none
    /// marked when `None`.
    pub cache: Option<PromptCache>,
}

/// The stable prefix of a request: the tools, the system prompt, then the first
/// `history` messages (the system message counted) — the same bytes from one call of
/// the agent to the next, heartbeats and conversation turns alike — and how long the
/// provider should keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PromptCache {
    /// Messages of the prefix, from the first.
    pub history: usize,
    /// How long the cached prefix is kept after its last use.
    pub ttl: CacheTtl,
}

/// How long a provider keeps a cached prompt prefix after its last use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheTtl {
    /// Five minutes, Anthropic's default.
    #[default]
    Minutes5,
    /// An hour: dearer to write, for agents whose calls come less than an hour apart.
    Hour,
}

impl CacheTtl {
    /// The lifetime as a duration.
    pub fn duration(self) -> jiff::SignedDuration {
        match self {
            CacheTtl::Minutes5 => jiff::SignedDuration::from_mins(5),
            CacheTtl::Hour => jiff::SignedDuration::from_hours(1),
        }
    }
}

/// What a heartbeat hands on to the next about its agent's prompt cache, so that a beat
/// that does not think can keep it warm for one that will (see
/// [`crate::engine::prompt::warm_up_due`]). Only written for a model whose hour-long
/// cache pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKept {
    /// When the agent last called the model for its work: a heartbeat's thinking or a
    /// conversation turn, not a warm-up.
    pub called_at: jiff::Timestamp,
    /// Until when the cached prefix lives, as the last call's breakpoints asked.
    pub until: jiff::Timestamp,
    /// When a warm-up call renewed it, if one has since `called_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmed_at: Option<jiff::Timestamp>,
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It hit `max_tokens`.
    MaxTokens,
    /// Anything else the provider reported.
    Other,
}

/// A model's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LlmResponse {
    /// Its text, if any.
    pub text: Option<String>,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolUse>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Tokens used.
    pub usage: Usage,
    /// The model that answered, as the provider named it.
    pub model: String,
    /// Which provider (`anthropic`, `openai`, `offline`).
    pub provider: &'static str,
}

/// The LLM providers Pulse speaks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// The Anthropic Messages API.
    Anthropic,
    /// An OpenAI-compatible chat completions API.
    #[serde(rename = "openai")]
    OpenAi,
    /// The built-in offline provider: deterministic replies and tool calls, no network.
    /// For demos and tests; never chosen when a key is configured.
    Offline,
}

impl ProviderKind {
    /// The name used in configuration and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::Offline => "offline",
        }
    }
    /// Reads a configured name.
    pub fn parse(s: &str) -> Result<Self, crate::error::ValidationError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "anthropic" => Ok(Self::Anthropic),
            "openai" => Ok(Self::OpenAi),
            "offline" => Ok(Self::Offline),
            other => Err(crate::error::ValidationError::new(
                "LLM provider",
                format!("{other:?} is not a provider; use anthropic, openai or offline"),
            )),
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A secret (API key, bot token). Never printed: `Debug` shows `Secret(***)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A [`Secret`] stored as its string (sealed by the store adapters before it is written).
pub(crate) mod secret_string {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Secret;

    pub(crate) fn serialize<S: Serializer>(s: &Secret, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.expose())
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}
