//! The world outside the store: tools, models, Discord, hook receivers, event buses.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::domain::{
    Agent, Hook, HookDelivery, LlmRequest, LlmResponse, Tool, ToolRequest, ToolResponse,
};
use crate::error::{DiscordError, LlmError};

/// What came of one attempt to send a hook.
#[derive(Clone, Debug, PartialEq)]
pub struct SendResult {
    /// How it went.
    pub status: crate::domain::AttemptStatus,
    /// The receiver's HTTP status, if it answered.
    pub http_status: Option<u16>,
    /// The start of the response body.
    pub body: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// The receiver's `Retry-After`, if it gave one.
    pub retry_after: Option<Duration>,
}

/// Sends one attempt of a delivery to its hook's target. Never returns an error: every
/// failure is an attempt outcome.
#[async_trait]
pub trait HookSender: Send + Sync {
    /// Sends `delivery` to `hook`'s target, signed at `timestamp` (Unix seconds).
    async fn send(&self, hook: &Hook, delivery: &HookDelivery, timestamp: i64) -> SendResult;
    /// Whether this process may send to `hook`'s target at all (its egress allow-list,
    /// its EventBridge client); `Err` says why not. A dispatcher told to
    /// ([`DispatchSettings::leave_unsendable`](crate::engine::DispatchSettings)) leaves
    /// such deliveries queued for a process that may.
    async fn can_send(&self, hook: &Hook) -> Result<(), Unsendable> {
        let _ = hook;
        Ok(())
    }
}

/// Why this process may not send to a hook's target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsendable {
    /// The target is an event bus and this process has no client for one.
    #[error("this process has no EventBridge client")]
    NoBus,
    /// The egress guard refuses the target's address here.
    #[error("{0}")]
    Refused(String),
}

/// An EventBridge-like event bus.
#[async_trait]
pub trait EventBus: Send + Sync {
    /// Puts one event on `bus` with source `pulse`; `Err` says why it was not accepted.
    async fn put_event(&self, bus: &str, detail_type: &str, detail: &str) -> Result<(), BusError>;
}

/// Why an event bus did not take an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus could not be reached.
    #[error("PutEvents to {bus} failed: {reason}")]
    Unreachable {
        /// The bus.
        bus: String,
        /// What the client said.
        reason: String,
    },
    /// The bus answered, refusing the event.
    #[error("EventBridge refused the event on {bus}: {code} {message}")]
    Refused {
        /// The bus.
        bus: String,
        /// Its error code.
        code: String,
        /// Its message.
        message: String,
    },
}

/// What came of calling a tool.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// The validated response, or why the call produced none.
    pub result: Result<ToolResponse, ToolFailure>,
    /// What is recorded on the action as the response: the body received, or what is
    /// known of a failed exchange (HTTP status, an excerpt of the body).
    pub response_meta: Option<Value>,
}

/// Why a tool call produced no usable response. Each carries the message recorded on
/// the action as its error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolFailure {
    /// The tool was not reached in time: a timeout, a refused or failed connection, an
    /// address the egress guard refuses.
    #[error("{0}")]
    Unreachable(String),
    /// The tool answered, but not with a usable response: an HTTP error status, a body
    /// that is not JSON, too large, or not shaped as a tool response.
    #[error("{0}")]
    BadAnswer(String),
    /// The built-in heartbeat agent failed (its model could not be reached, or answered
    /// with something unusable).
    #[error("{0}")]
    Agent(String),
    /// The tool stopped because a user message interrupted its heartbeat: the action
    /// ends CANCELLED and the heartbeat yields to the user's turn.
    #[error("{0}")]
    Interrupted(String),
    /// This process cannot run the tool's kind.
    #[error("{0}")]
    Unavailable(String),
    /// The tool chose not to run (the heartbeat agent with nothing to think about): the
    /// action ends SKIPPED with this reason.
    #[error("{0}")]
    Skipped(String),
    /// The request was sent and no answer came back (timed out, or the connection was
    /// lost mid-answer): the tool may have done its work. The action ends UNKNOWN
    /// unless the tool is idempotent.
    #[error("{0}")]
    Unknown(String),
}

/// Runs tools. Never returns an error: a tool's failure is an outcome recorded on its
/// action, not a failure of the heartbeat.
#[async_trait]
pub trait ToolRunner: Send + Sync {
    /// Calls `tool` with `request`.
    async fn call(&self, tool: &Tool, request: &ToolRequest) -> ToolCall;
    /// The built-in tools this runner provides, with their default subscriptions; the
    /// engine adds them to the registry unless the store overrides them.
    fn builtins(&self) -> Vec<(Tool, crate::domain::Subscription)> {
        Vec::new()
    }
}

/// A language model behind some provider.
#[async_trait]
pub trait Llm: Send + Sync {
    /// The provider's name (`anthropic`, `openai`, `offline`), for logs and records.
    fn provider(&self) -> &'static str;
    /// The model a request that names none is sent to.
    fn model(&self) -> &str;
    /// Sends one request. Transient failures (429, 5xx, timeouts) are retried inside,
    /// within a bound; what is returned is final.
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError>;
    /// The tokens `text` takes as one user message to `model`, by the provider's own
    /// counting (Anthropic's count-tokens endpoint); `None` when the provider counts no
    /// tokens for others, and the caller counts or estimates them itself.
    async fn count_tokens(&self, model: &str, text: &str) -> Result<Option<usize>, LlmError> {
        let _ = (model, text);
        Ok(None)
    }
}

/// Turns texts into vectors, so memories are recalled by meaning.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// The model and its dimensions, as its vectors are labelled (vectors of different
    /// labels are never compared): e.g. `text-embedding-3-small/1536`.
    fn model(&self) -> &str;
    /// One vector for each of `texts`, in order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;
}

/// Why texts were not embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The provider could not be reached, or did not answer in time.
    #[error("the embeddings provider could not be reached: {0}")]
    Unreachable(String),
    /// It answered with an error.
    #[error("the embeddings provider answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of its answer.
        body: String,
    },
    /// Its answer was not vectors for the texts.
    #[error("the embeddings provider's answer is not one vector a text: {0}")]
    BadAnswer(String),
    /// The local model could not be loaded or run.
    #[error("the local embeddings model failed: {0}")]
    Local(String),
}

/// Fetches an image a user sent, for a model that cannot reach its URL itself.
#[async_trait]
pub trait ImageFetcher: Send + Sync {
    /// Whether `url` is on a host users' images come from: only those are passed to a
    /// model or fetched.
    fn allows(&self, url: &str) -> bool;
    /// The image at `url`.
    async fn fetch_image(&self, url: &str) -> Result<FetchedImage, ImageError>;
}

/// An image fetched for a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedImage {
    /// Its media type (one a model takes).
    pub media_type: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// Why an image could not be fetched for a model (it then reads the URL as text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Not a URL.
    #[error("not a URL: {0}")]
    BadUrl(String),
    /// Not on a host users' images come from (`PULSE_IMAGE_HOSTS`).
    #[error("{0} is not a host images are taken from (PULSE_IMAGE_HOSTS)")]
    NotAllowed(String),
    /// The egress guard refused it, or it could not be reached in time.
    #[error("{0}")]
    Unreachable(String),
    /// The server answered, but not with the image.
    #[error("the server answered {0}")]
    Status(u16),
    /// Larger than a model takes.
    #[error("larger than {0} MiB")]
    TooLarge(usize),
    /// Not an image type a model takes.
    #[error("its content type {found:?} is not an image a model takes ({takes})")]
    NotAnImage {
        /// What the server said it is.
        found: String,
        /// What a model takes.
        takes: String,
    },
}

/// Picks the model client for an agent: the configured default, or the agent's own
/// provider, model and base URL.
pub trait LlmSelector: Send + Sync {
    /// The client for `agent`; `NotConfigured` if its provider has no API key.
    fn select(&self, agent: &Agent) -> Result<std::sync::Arc<dyn Llm>, LlmError>;
}

/// Discord's HTTP API, as far as replies need it. Each method returns the id of the
/// message written. 429s are waited out (`retry_after`) and retried within a bound.
#[async_trait]
pub trait DiscordApi: Send + Sync {
    /// Edits the deferred original response of an interaction (valid for 15 minutes
    /// after the interaction).
    async fn edit_original(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError>;
    /// Sends a follow-up message through the interaction's webhook.
    async fn follow_up(
        &self,
        interaction_token: &str,
        content: &str,
    ) -> Result<String, DiscordError>;
    /// Posts a message to a channel with the bot token. `nonce` (at most 25 characters)
    /// is enforced, so a retried post with the same nonce does not post twice. With
    /// `reply_to`, the message is a reply to that message of the channel.
    async fn create_message(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
        reply_to: Option<&str>,
    ) -> Result<String, DiscordError>;
    /// Posts a message with `components` (buttons) to a channel, as
    /// [`DiscordApi::create_message`] does. Where components are not supported, the
    /// message alone.
    async fn post_card(
        &self,
        channel_id: &str,
        content: &str,
        nonce: &str,
        components: serde_json::Value,
    ) -> Result<String, DiscordError> {
        let _ = components;
        self.create_message(channel_id, content, nonce, None).await
    }
    /// Shows "typing…" in a channel for about ten seconds, or until a message is posted.
    async fn typing(&self, channel_id: &str) -> Result<(), DiscordError>;
    /// The direct-message channel with a user (opened if there is none); its id.
    async fn open_dm(&self, user_id: &str) -> Result<String, DiscordError>;
}
