//! Embedders: the vectors memories are recalled by.
//!
//! [`HttpEmbedder`] calls an OpenAI-compatible `POST /v1/embeddings` (`PULSE_EMBED_MODEL`,
//! `PULSE_EMBED_BASE_URL`, `PULSE_EMBED_DIMENSIONS`), batched. Its key
//! (`PULSE_EMBED_API_KEY`, or `OPENAI_API_KEY` for OpenAI's own API) is sent to that base
//! URL only, which the operator configured: no agent chooses where it goes.
//!
//! `LocalEmbedder` (built with the `local-embed` feature, as `pulse` is) runs a
//! sentence-transformers model in the process: `PULSE_EMBED_MODEL=local:PATH`, or
//! all-MiniLM-L6-v2 where `pulse models install minilm` put it when no model is configured.
//! It recalls by meaning with no network: "what does she not eat?" finds "I'm vegetarian".
//!
//! [`OfflineEmbedder`] is used when neither is (and by `pulse demo` and the tests, or with
//! `PULSE_EMBED_MODEL=words`): deterministic, no network, it hashes a text's words and
//! their character trigrams into 256 dimensions. It matches *words and their spellings*,
//! not meaning: "vegetarian" finds "vegetarians", never "does not eat meat".

mod http;
#[cfg(feature = "local-embed")]
mod local;
mod offline;

use std::sync::Arc;

pub use crate::config::{MINILM_DIR, MODEL_FILES, ModelDir, ModelDirError, default_models_dir};
pub use http::HttpEmbedder;
#[cfg(feature = "local-embed")]
pub use local::{BATCH, LocalEmbedder};
pub use offline::OfflineEmbedder;

use crate::config::{EmbedConfig, EmbedSource};
use crate::ports::Embedder;

/// Whether this build runs local models (`PULSE_EMBED_MODEL=local:PATH`).
pub const LOCAL: bool = cfg!(feature = "local-embed");

/// The embedder the configuration names: the HTTP one when a model is set, the local one
/// when a model directory is configured or installed, else the offline one.
pub fn from_config(config: &EmbedConfig) -> Arc<dyn Embedder> {
    match &config.source {
        EmbedSource::Api { model } => Arc::new(HttpEmbedder::new(
            config.base_url.clone(),
            model,
            config.dimensions,
            config.api_key.clone(),
            config.timeout,
        )),
        #[cfg(feature = "local-embed")]
        EmbedSource::Local { dir, .. } => Arc::new(LocalEmbedder::new(dir.clone())),
        #[cfg(not(feature = "local-embed"))]
        EmbedSource::Local { .. } => Arc::new(OfflineEmbedder),
        EmbedSource::Words { .. } => Arc::new(OfflineEmbedder),
    }
}

/// One line saying how memories are recalled, for start-up.
pub fn describe(config: &EmbedConfig) -> String {
    match &config.source {
        EmbedSource::Api { model } => format!(
            "memories are recalled by meaning with {model} at {}",
            config.base_url
        ),
        EmbedSource::Local { dir, installed } => format!(
            "memories are recalled by meaning with the local model {} ({}{})",
            dir.label.trim_start_matches("local:"),
            dir.path.display(),
            if *installed { ", found installed" } else { "" }
        ),
        EmbedSource::Words { chosen: true } => {
            "memories are recalled by their words (PULSE_EMBED_MODEL=words)".to_owned()
        }
        EmbedSource::Words { chosen: false } if LOCAL => "memories are recalled by their words only: no embeddings model is configured or installed (`pulse models install minilm` adds one that recalls by meaning)".to_owned(),
        EmbedSource::Words { chosen: false } => "memories are recalled by their words only: no embeddings model is configured (PULSE_EMBED_MODEL)".to_owned(),
    }
}
