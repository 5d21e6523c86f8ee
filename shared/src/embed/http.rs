//! An OpenAI-compatible embeddings API: `POST {base}/embeddings`.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use url::Url;

use crate::domain::Secret;
use crate::ports::{EmbedError, Embedder};

/// Texts per request.
const BATCH: usize = 64;

/// Calls `POST {base_url}/embeddings` with `{"model", "input": [...], "dimensions"}`,
/// [`BATCH`] texts a request, and reads `data[i].embedding` in `index` order.
#[derive(Clone, Debug)]
pub struct HttpEmbedder {
    client: reqwest::Client,
    endpoint: String,
    /// The model's name, as the API takes it.
    name: String,
    /// The model and its dimensions, as vectors are labelled.
    model: String,
    dimensions: Option<usize>,
    api_key: Option<Secret>,
}

impl HttpEmbedder {
    /// An embedder of `model` at `base_url` (e.g. `https://api.openai.com/v1`), asking for
    /// `dimensions` when given; each request within `timeout`.
    pub fn new(
        base_url: Url,
        model: &str,
        dimensions: Option<usize>,
        api_key: Option<Secret>,
        timeout: Duration,
    ) -> Self {
        // The operator configured the URL: a trusted client (no redirect followed, so the
        // key reaches no other host).
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            client,
            endpoint: format!("{}/embeddings", base_url.as_str().trim_end_matches('/')),
            name: model.to_owned(),
            model: match dimensions {
                Some(d) => format!("{model}/{d}"),
                None => model.to_owned(),
            },
            dimensions,
            api_key,
        }
    }

    async fn batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut body = json!({"model": self.name, "input": texts});
        if let Some(d) = self.dimensions {
            body["dimensions"] = json!(d);
        }
        let mut req = self.client.post(&self.endpoint).json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key.expose());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| EmbedError::Unreachable(e.without_url().to_string()))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| EmbedError::Unreachable(e.without_url().to_string()))?;
        if !status.is_success() {
            return Err(EmbedError::Status {
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        let v: Value =
            serde_json::from_str(&text).map_err(|e| EmbedError::BadAnswer(e.to_string()))?;
        let mut rows: Vec<(usize, Vec<f32>)> = v["data"]
            .as_array()
            .ok_or_else(|| EmbedError::BadAnswer("no \"data\" list".to_owned()))?
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let index = d["index"].as_u64().map_or(i, |x| x as usize);
                let vector = d["embedding"]
                    .as_array()
                    .map(|xs| {
                        xs.iter()
                            .filter_map(Value::as_f64)
                            .map(|x| x as f32)
                            .collect()
                    })
                    .unwrap_or_default();
                (index, vector)
            })
            .collect();
        rows.sort_by_key(|(i, _)| *i);
        if rows.len() != texts.len() || rows.iter().any(|(_, v)| v.is_empty()) {
            return Err(EmbedError::BadAnswer(format!(
                "{} vectors for {} texts",
                rows.len(),
                texts.len()
            )));
        }
        let sizes: Vec<usize> = rows.iter().map(|(_, v)| v.len()).collect();
        if let Some(d) = self.dimensions
            && sizes.iter().any(|s| *s != d)
        {
            return Err(EmbedError::BadAnswer(format!(
                "vectors of {} dimensions where PULSE_EMBED_DIMENSIONS is {d}",
                sizes[0]
            )));
        }
        Ok(rows.into_iter().map(|(_, v)| v).collect())
    }
}

#[async_trait]
impl Embedder for HttpEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            out.extend(self.batch(chunk).await?);
        }
        Ok(out)
    }
}
