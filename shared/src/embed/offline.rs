//! The offline embedder: hashed word and character-trigram features, no network.

use async_trait::async_trait;

use crate::domain::STOP_WORDS;
use crate::ports::{EmbedError, Embedder};

/// Its dimensions.
pub(super) const DIMENSIONS: usize = 256;

/// Deterministic vectors of a text's words (weight 1) and their character trigrams
/// (weight 0.5, with the word's boundaries marked), each hashed (FNV-1a) to a dimension
/// and a sign; [`STOP_WORDS`] are left out (unless the text has no other word). Texts
/// sharing words or spellings point the same way; meaning is not seen.
#[derive(Clone, Copy, Debug, Default)]
pub struct OfflineEmbedder;

impl OfflineEmbedder {
    /// The vector of one text.
    pub fn vector(text: &str) -> Vec<f32> {
        let mut v = vec![0f32; DIMENSIONS];
        let mut add = |feature: &[u8], weight: f32| {
            let h = fnv1a(feature);
            let i = (h % DIMENSIONS as u64) as usize;
            let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
            v[i] += sign * weight;
        };
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        let telling = words.iter().any(|w| !STOP_WORDS.contains(&w.as_str()));
        for word in words
            .into_iter()
            .filter(|w| !telling || !STOP_WORDS.contains(&w.as_str()))
        {
            add(word.as_bytes(), 1.0);
            let marked: Vec<char> = std::iter::once('^')
                .chain(word.chars())
                .chain(std::iter::once('$'))
                .collect();
            for gram in marked.windows(3) {
                let gram: String = gram.iter().collect();
                add(gram.as_bytes(), 0.5);
            }
        }
        v
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[async_trait]
impl Embedder for OfflineEmbedder {
    fn model(&self) -> &str {
        "offline-ngram/256"
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| Self::vector(t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Embedding;

    fn cos(a: &str, b: &str) -> f32 {
        let (a, b) = (
            Embedding::quantize("o", &OfflineEmbedder::vector(a)),
            Embedding::quantize("o", &OfflineEmbedder::vector(b)),
        );
        Embedding::cosine(&a.values, &b.values)
    }

    #[test]
    fn shared_words_and_spellings_point_the_same_way_and_meaning_does_not() {
        assert_eq!(
            OfflineEmbedder::vector("Tea, please"),
            OfflineEmbedder::vector("tea please")
        );
        let close = cos("the user is vegetarian", "is the user a vegetarian?");
        let spelled = cos("vegetarian", "vegetarians");
        let unrelated = cos("the user is vegetarian", "the deploy failed on friday");
        let meaning = cos("vegetarian", "does not eat meat");
        assert!(close > 0.7, "{close}");
        assert!(spelled > 0.5, "{spelled}");
        assert!(unrelated < 0.35, "{unrelated}");
        assert!(meaning < 0.2, "{meaning}");
    }
}
