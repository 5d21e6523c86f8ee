//! Counting a text's tokens as the model that reads it counts them, for the budgets of
//! the texts sent with every model call (`pulse apply`'s plan).
//!
//! - **OpenAI's models**: their own tokenizer (tiktoken's `o200k_base` for GPT-4o,
//!   GPT-4.1, GPT-5 and the o-series; `cl100k_base` for GPT-4 and GPT-3.5), in the
//!   process, with no request — when the binary is built with the `token-count` feature,
//!   as `pulse` is.
//! - **Anthropic's models**: Anthropic's count-tokens endpoint, with the deployment's key
//!   (or the agent's own), through the agent's base URL.
//! - **Anything else** (the offline provider, a model no tokenizer is known for, a
//!   count-tokens call that failed): an estimate at four characters a token, said to be
//!   one, and why. A plan waits at most [`COUNT_TIMEOUT`] for a provider, once: after
//!   a failure, [`TokenCounter`] estimates the rest of that provider's texts.

use serde::Serialize;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{LlmConfig, Router};
use crate::domain::{Agent, ProviderKind};
use crate::ports::LlmSelector as _;

/// A text's tokens and how they were counted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenCount {
    /// The tokens.
    pub tokens: usize,
    /// Whether the model's own counting gave them (not an estimate).
    pub exact: bool,
    /// What counted them: `gpt-4o-mini's tokenizer (o200k_base)`, `Anthropic's
    /// count_tokens for claude-sonnet-4-5`, or `an estimate at 4 characters a token (…)`
    /// with the reason.
    pub by: String,
}

impl TokenCount {
    /// An estimate (four characters a token), for `why`.
    pub fn estimate(text: &str, why: impl std::fmt::Display) -> Self {
        Self {
            tokens: crate::engine::prompt::estimate_tokens(text),
            exact: false,
            by: format!("an estimate at 4 characters a token ({why})"),
        }
    }
}

/// The name of OpenAI's tokenizer for `model`, and the tokens of `text` by it; `None`
/// for a model no tokenizer is known for (or without the `token-count` feature).
#[cfg(feature = "token-count")]
pub fn openai_tokens(model: &str, text: &str) -> Option<(&'static str, usize)> {
    use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
    let tokenizer = get_tokenizer(model)?;
    let name = match tokenizer {
        Tokenizer::O200kHarmony => "o200k_harmony",
        Tokenizer::O200kBase => "o200k_base",
        Tokenizer::Cl100kBase => "cl100k_base",
        Tokenizer::P50kBase => "p50k_base",
        Tokenizer::R50kBase => "r50k_base",
        Tokenizer::P50kEdit => "p50k_edit",
        Tokenizer::Gpt2 => "gpt2",
    };
    let bpe = tiktoken_rs::bpe_for_tokenizer(tokenizer).ok()?;
    Some((name, bpe.encode_with_special_tokens(text).len()))
}

/// Without the `token-count` feature no tokenizer is built in.
#[cfg(not(feature = "token-count"))]
pub fn openai_tokens(_model: &str, _text: &str) -> Option<(&'static str, usize)> {
    None
}

impl Router {
    /// The provider and the model `agent`'s heartbeats think with: its heartbeat model,
    /// else its model, else the deployment's for its provider.
    pub fn heartbeat_model(&self, agent: &Agent) -> (ProviderKind, String) {
        let kind = agent.llm.provider.unwrap_or(self.config.provider);
        let model = agent
            .llm
            .heartbeat_model
            .clone()
            .unwrap_or_else(|| self.model_of(agent, kind));
        (kind, model)
    }
}

/// How long a plan waits for one count-tokens request (one attempt: a count that fails
/// is estimated, never retried).
pub const COUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Counts texts as each agent's model does, for a plan. A provider that fails to count
/// once (unreachable, refused) is not asked again by this counter: the plan of fifty
/// agents made where the provider cannot be reached waits once, not fifty times.
pub struct TokenCounter {
    router: Router,
    /// The clients that failed, by address, and why.
    failed: Mutex<HashMap<usize, String>>,
}

impl TokenCounter {
    /// Counting through `config`'s providers (each request within [`COUNT_TIMEOUT`],
    /// one attempt), an agent's own base URL reached through `egress`.
    pub fn new(config: LlmConfig, egress: pulse_egress::Egress) -> Self {
        let config = LlmConfig {
            timeout: COUNT_TIMEOUT,
            max_attempts: 1,
            ..config
        };
        Self {
            router: Router::new(config, egress),
            failed: Mutex::default(),
        }
    }

    /// Counts each of `texts` as `agent`'s heartbeat model does (see the module's notes);
    /// never fails: what cannot be counted is estimated, with the reason.
    pub async fn count(&self, agent: &Agent, texts: &[&str]) -> Vec<TokenCount> {
        let (kind, model) = self.router.heartbeat_model(agent);
        let estimated = |why: String| -> Vec<TokenCount> {
            texts
                .iter()
                .map(|t| TokenCount::estimate(t, &why))
                .collect()
        };
        match kind {
            ProviderKind::Offline => estimated("the offline provider has no tokenizer".into()),
            ProviderKind::OpenAi => texts
                .iter()
                .map(|t| match openai_tokens(&model, t) {
                    Some((name, tokens)) => TokenCount {
                        tokens,
                        exact: true,
                        by: format!("{model}'s tokenizer ({name})"),
                    },
                    None => TokenCount::estimate(t, format!("no tokenizer is known for {model}")),
                })
                .collect(),
            ProviderKind::Anthropic => {
                let llm = match self.router.select(agent) {
                    Ok(llm) => llm,
                    Err(e) => return estimated(format!("not counted by Anthropic: {e}")),
                };
                let client = Arc::as_ptr(&llm).cast::<()>() as usize;
                let earlier = self.failed().get(&client).cloned();
                if let Some(why) = earlier {
                    return estimated(format!(
                        "Anthropic's count_tokens failed earlier in this plan: {why}"
                    ));
                }
                let counts =
                    futures::future::join_all(texts.iter().map(|t| llm.count_tokens(&model, t)))
                        .await;
                let out: Vec<TokenCount> = texts
                    .iter()
                    .zip(counts)
                    .map(|(t, counted)| match counted {
                        Ok(Some(tokens)) => TokenCount {
                            tokens,
                            exact: true,
                            by: format!("Anthropic's count_tokens for {model}"),
                        },
                        Ok(None) => TokenCount::estimate(t, "the provider counted none"),
                        Err(e) => {
                            self.failed().insert(client, e.to_string());
                            TokenCount::estimate(t, format!("Anthropic's count_tokens failed: {e}"))
                        }
                    })
                    .collect();
                out
            }
        }
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, HashMap<usize, String>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(all(test, feature = "token-count"))]
mod tests {
    use super::*;

    #[test]
    fn openai_models_are_counted_by_their_own_tokenizer() {
        // The ids tiktoken's own tests give for "hello world" in each table.
        let o200k =
            tiktoken_rs::bpe_for_tokenizer(tiktoken_rs::tokenizer::Tokenizer::O200kBase).unwrap();
        assert_eq!(
            o200k.encode_with_special_tokens("hello world"),
            [24912, 2375]
        );
        let cl100k =
            tiktoken_rs::bpe_for_tokenizer(tiktoken_rs::tokenizer::Tokenizer::Cl100kBase).unwrap();
        assert_eq!(
            cl100k.encode_with_special_tokens("hello world"),
            [15339, 1917]
        );
        assert_eq!(
            openai_tokens("gpt-4o-mini", "hello world"),
            Some(("o200k_base", 2))
        );
        assert_eq!(
            openai_tokens("gpt-4.1", "hello world").unwrap().0,
            "o200k_base"
        );
        assert_eq!(
            openai_tokens("gpt-4", "hello world"),
            Some(("cl100k_base", 2))
        );
        assert_eq!(openai_tokens("llama-3-70b", "hello"), None);
        // Text the estimate gets badly wrong: Japanese is about a token a character.
        let jp = "日本語のテキストを数えます。".repeat(10);
        let (_, n) = openai_tokens("gpt-5", &jp).unwrap();
        assert!(n > crate::engine::prompt::estimate_tokens(&jp), "{n}");
    }
}
