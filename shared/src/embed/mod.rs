//! Embedders: the vectors memories are recalled by.
//!
//! [`HttpEmbedder`] calls an OpenAI-compatible `POST /v1/embeddings` (`PULSE_EMBED_MODEL`,
//! `PULSE_EMBED_BASE_URL`, `PULSE_EMBED_DIMENSIONS`), batched. Its key
//! (`PULSE_EMBED_API_KEY`, or `OPENAI_API_KEY` for OpenAI's own API) is sent to that base
//! URL only, which the operator configured: no agent chooses where it goes.
//!
//! [`OfflineEmbedder`] is used when no model is configured (and by `pulse demo` and the
//! tests): deterministic, no network, it hashes a text's words and their character
//! trigrams into 256 dimensions. It matches *words and their spellings*, not meaning:
//! "vegetarian" finds "vegetarians", never "does not eat meat".

mod http;
mod offline;

use std::sync::Arc;

pub use http::HttpEmbedder;
pub use offline::OfflineEmbedder;

use crate::config::EmbedConfig;
use crate::ports::Embedder;

/// The embedder the configuration names: the HTTP one when a model is set, else the
/// offline one.
pub fn from_config(config: &EmbedConfig) -> Arc<dyn Embedder> {
    match &config.model {
        Some(model) => Arc::new(HttpEmbedder::new(
            config.base_url.clone(),
            model,
            config.dimensions,
            config.api_key.clone(),
            config.timeout,
        )),
        None => Arc::new(OfflineEmbedder),
    }
}
