//! LLM providers: the Anthropic Messages API, OpenAI-compatible chat completions, and the
//! offline provider. Each maps [`LlmRequest`] to its wire format and back, with
//! timeouts and bounded retries on 429/5xx that honour `Retry-After`.
//!
//! [`Router`] picks the client for an agent from the configuration and the agent's own
//! overrides.

use std::sync::Arc;
use std::time::Duration;

use url::Url;

use crate::domain::{Agent, LlmRequest, LlmResponse, ProviderKind, Secret};
use crate::error::LlmError;
use crate::ports::{Llm, LlmSelector};

/// Everything needed to build one provider client.
#[derive(Clone, Debug)]
pub struct ProviderSettings {
    /// Which provider.
    pub kind: ProviderKind,
    /// API base URL (`https://api.anthropic.com`, `https://api.openai.com/v1`).
    pub base_url: Url,
    /// Default model when a request names none.
    pub model: String,
    /// API key; required for Anthropic and OpenAI.
    pub api_key: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Attempts per request, counting the first (429/5xx/transport errors retry).
    pub max_attempts: u32,
    /// Longest single wait between attempts (caps `Retry-After`).
    pub max_retry_wait: Duration,
}

/// The LLM configuration: the default provider and what each provider needs.
#[derive(Clone, Debug)]
pub struct LlmConfig {
    /// The provider agents use unless they name their own.
    pub provider: ProviderKind,
    /// Base URL override (`PULSE_LLM_BASE_URL`) for the default provider.
    pub base_url: Option<Url>,
    /// Model override (`PULSE_LLM_MODEL`) for the default provider.
    pub model: Option<String>,
    /// `ANTHROPIC_API_KEY`.
    pub anthropic_key: Option<Secret>,
    /// `OPENAI_API_KEY`.
    pub openai_key: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Attempts per request.
    pub max_attempts: u32,
    /// Longest single wait between attempts.
    pub max_retry_wait: Duration,
}

/// Builds the client for `settings`.
pub fn client(settings: ProviderSettings) -> Result<Arc<dyn Llm>, LlmError> {
    let _ = settings;
    Err(LlmError::NotConfigured {
        provider: "offline",
        message: "not built yet".into(),
    })
}

/// Chooses and caches clients per (provider, base URL, model).
pub struct Router {
    config: LlmConfig,
}

impl Router {
    /// A router over `config`.
    pub fn new(config: LlmConfig) -> Self {
        Self { config }
    }
}

impl LlmSelector for Router {
    fn select(&self, agent: &Agent) -> Result<Arc<dyn Llm>, LlmError> {
        let _ = (agent, &self.config);
        Err(LlmError::NotConfigured {
            provider: "offline",
            message: "not built yet".into(),
        })
    }
}

#[allow(dead_code)]
fn unused(_: &LlmRequest, _: &LlmResponse) {}
