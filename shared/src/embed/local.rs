//! The local embedder: a sentence-transformers BERT model (all-MiniLM-L6-v2) run in the
//! process on the CPU with candle, its WordPiece tokenizer with `tokenizers`.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, DTYPE};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::ModelDir;
use crate::ports::{EmbedError, Embedder};

/// Texts embedded in one pass through the model.
pub const BATCH: usize = 32;

/// Vectors from a model directory: each text tokenized (cut to the directory's
/// `max_seq_length`), run through the encoder, its token vectors averaged over the
/// attention mask and normalised to length 1 — sentence-transformers' mean pooling.
///
/// The weights are read on the first embedding (about 90 MB for all-MiniLM-L6-v2, a
/// fraction of a second), not when the embedder is made, so commands that never embed
/// never pay for them. Work runs on the blocking pool, batched by length.
pub struct LocalEmbedder {
    dir: ModelDir,
    loaded: Arc<OnceLock<Result<Arc<Loaded>, String>>>,
}

struct Loaded {
    model: BertModel,
    tokenizer: Tokenizer,
}

impl LocalEmbedder {
    /// An embedder for the model in `dir` (inspected already); nothing is read yet.
    pub fn new(dir: ModelDir) -> Self {
        Self {
            dir,
            loaded: Arc::new(OnceLock::new()),
        }
    }

    /// The model directory.
    pub fn dir(&self) -> &ModelDir {
        &self.dir
    }

    /// Reads the weights and the tokenizer now (the first embedding does otherwise), so a
    /// broken model is said at start-up.
    pub async fn load(&self) -> Result<(), EmbedError> {
        let (dir, loaded) = (self.dir.clone(), self.loaded.clone());
        tokio::task::spawn_blocking(move || get(&dir, &loaded).map(drop))
            .await
            .map_err(|e| EmbedError::Local(e.to_string()))?
    }

    /// The vectors of `texts`, on this thread.
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        embed(&self.dir, &self.loaded, texts)
    }
}

fn get(
    dir: &ModelDir,
    loaded: &OnceLock<Result<Arc<Loaded>, String>>,
) -> Result<Arc<Loaded>, EmbedError> {
    loaded
        .get_or_init(|| Loaded::read(dir).map(Arc::new))
        .clone()
        .map_err(|e| {
            EmbedError::Local(format!(
                "the model at {} could not be loaded: {e}",
                dir.path.display()
            ))
        })
}

impl Loaded {
    fn read(dir: &ModelDir) -> Result<Self, String> {
        let config: Config = serde_json::from_slice(
            &std::fs::read(dir.path.join("config.json")).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("config.json: {e}"))?;
        let weights =
            std::fs::read(dir.path.join("model.safetensors")).map_err(|e| e.to_string())?;
        // The buffer is dropped with the builder once the tensors are copied out of it.
        let vb = VarBuilder::from_buffered_safetensors(weights, DTYPE, &Device::Cpu)
            .map_err(|e| format!("model.safetensors: {e}"))?;
        let model = BertModel::load(vb, &config).map_err(|e| format!("model.safetensors: {e}"))?;
        let mut tokenizer = Tokenizer::from_file(dir.path.join("tokenizer.json"))
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: dir.max_tokens,
                ..TruncationParams::default()
            }))
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        Ok(Self { model, tokenizer })
    }

    /// One batch's vectors.
    fn batch(&self, texts: &[&str]) -> candle_core::Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(candle_core::Error::wrap)?;
        let (rows, len) = (encodings.len(), encodings[0].len());
        let flat = |f: fn(&tokenizers::Encoding) -> &[u32]| {
            let v: Vec<u32> = encodings.iter().flat_map(|e| f(e).to_vec()).collect();
            Tensor::from_vec(v, (rows, len), &Device::Cpu)
        };
        let ids = flat(tokenizers::Encoding::get_ids)?;
        let types = flat(tokenizers::Encoding::get_type_ids)?;
        let mask = flat(tokenizers::Encoding::get_attention_mask)?;
        let tokens = self.model.forward(&ids, &types, Some(&mask))?;
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = tokens.broadcast_mul(&mask)?.sum(1)?;
        let mean = summed.broadcast_div(&mask.sum(1)?)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f32::MAX)?;
        mean.broadcast_div(&norm)?.to_vec2::<f32>()
    }
}

fn embed(
    dir: &ModelDir,
    loaded: &OnceLock<Result<Arc<Loaded>, String>>,
    texts: &[String],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    if texts.is_empty() {
        return Ok(Vec::new());
    }
    let model = get(dir, loaded)?;
    // Texts of like length share a batch, so little of a batch is padding.
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].len());
    let mut out = vec![Vec::new(); texts.len()];
    for chunk in order.chunks(BATCH) {
        let batch: Vec<&str> = chunk.iter().map(|&i| texts[i].as_str()).collect();
        let vectors = model
            .batch(&batch)
            .map_err(|e| EmbedError::Local(e.to_string()))?;
        for (&i, v) in chunk.iter().zip(vectors) {
            out[i] = v;
        }
    }
    Ok(out)
}

#[async_trait]
impl Embedder for LocalEmbedder {
    fn model(&self) -> &str {
        &self.dir.label
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (dir, loaded, texts) = (self.dir.clone(), self.loaded.clone(), texts.to_vec());
        tokio::task::spawn_blocking(move || embed(&dir, &loaded, &texts))
            .await
            .map_err(|e| EmbedError::Local(e.to_string()))?
    }
}
