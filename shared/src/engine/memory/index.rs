//! One agent's memories as a recall searches them: every memory, the vectors of the
//! current embedding model side by side, and the postings BM25 scores words with.
//!
//! Words are scored here, in the worker, on every backend: SQLite's FTS5 ranked the
//! 25,000 matches of a three-word query over 100,000 memories in 44 ms, these postings
//! in about a millisecond.
//!
//! A recall's score for a memory is its *match* — 0.7 × the cosine similarity of its
//! vector to the query's (0 for one not embedded with the current model) plus 0.3 × its
//! BM25 score for the query's words, scaled so the best is 1 — then ranked by
//! `match × (0.5 + 0.3 × weight + 0.2 × importance)`: what matches best comes first, and
//! of two that match alike, the weightier and more important. A memory is a candidate
//! when its words match or its similarity reaches [`SIMILAR`].

use std::collections::HashMap;

use crate::domain::{Embedding, Memory, MemoryId, STOP_WORDS};

/// Share of the vector similarity in a match.
pub const VECTOR_SHARE: f32 = 0.7;
/// Share of the words' BM25 score in a match.
pub const WORDS_SHARE: f32 = 0.3;
/// A similarity this high makes a memory a candidate without a word in common.
pub const SIMILAR: f32 = 0.3;
/// BM25's term-frequency saturation.
const K1: f32 = 1.2;
/// BM25's length normalization.
const B: f32 = 0.75;

/// A memory's words, as both the index and a query read them.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// One agent's searchable memories.
pub struct Index {
    /// The store's memory version it was built at.
    pub version: u64,
    /// The embedding model whose vectors it compares.
    pub model: String,
    /// Every memory (without its vector).
    pub memories: Vec<Memory>,
    /// Where each id is.
    by_id: HashMap<MemoryId, usize>,
    dims: usize,
    /// `dims` values per memory embedded with `model`, in `embedded`'s order.
    vectors: Vec<i8>,
    /// The memory each vector belongs to, and its norm.
    embedded: Vec<(u32, f32)>,
    /// Each memory's place in `embedded`, if it has a vector of `model`.
    slot: Vec<Option<u32>>,
    /// Word → (memory, count), when words are scored here.
    postings: HashMap<String, Vec<(u32, u16)>>,
    lengths: Vec<u32>,
    average_length: f32,
}

/// How one memory matched a query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    /// Where it is in [`Index::memories`].
    pub at: usize,
    /// Its vector's cosine similarity to the query's (0 if not embedded).
    pub similarity: f32,
    /// Its words' BM25 score, scaled so the query's best is 1.
    pub words: f32,
    /// `0.7 × similarity + 0.3 × words`.
    pub matched: f32,
}

impl Index {
    /// The index of `memories` at `version`, comparing vectors of `model`.
    pub fn build(version: u64, model: &str, memories: Vec<Memory>) -> Self {
        let mut index = Self {
            version,
            model: model.to_owned(),
            memories: Vec::with_capacity(memories.len()),
            by_id: HashMap::with_capacity(memories.len()),
            dims: 0,
            vectors: Vec::new(),
            embedded: Vec::new(),
            slot: Vec::new(),
            postings: HashMap::new(),
            lengths: Vec::new(),
            average_length: 0.0,
        };
        for m in memories {
            index.push(m);
        }
        index
    }

    /// How many memories it holds.
    pub fn len(&self) -> usize {
        self.memories.len()
    }

    /// About how many bytes it takes: its vectors, and each memory's text (twice: the
    /// record and its words) and record with its places in the maps.
    pub fn bytes(&self) -> usize {
        self.vectors.len()
            + self
                .memories
                .iter()
                .map(|m| m.text.len() * 2)
                .sum::<usize>()
            + self.memories.len() * 400
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.memories.is_empty()
    }

    /// The memory with `id`.
    pub fn get(&self, id: &MemoryId) -> Option<&Memory> {
        self.by_id.get(id).map(|i| &self.memories[*i])
    }

    /// Where the memory with `id` is.
    pub fn position(&self, id: &MemoryId) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Adds a memory, or replaces the one with its id (its vector and words included).
    pub fn push(&mut self, mut m: Memory) {
        let vector = m.embedding.take();
        if let Some(at) = self.by_id.get(&m.id).copied() {
            let reworded = self.memories[at].text != m.text;
            self.memories[at] = m;
            if let Some(e) = vector {
                self.set_vector(at, &e);
            }
            if reworded {
                self.rebuild_words();
            }
            return;
        }
        let at = self.memories.len();
        self.slot.push(None);
        self.add_words(at, &m.text);
        self.by_id.insert(m.id.clone(), at);
        self.memories.push(m);
        if let Some(e) = vector {
            self.set_vector(at, &e);
        }
    }

    fn add_words(&mut self, at: usize, text: &str) {
        let mut counts: HashMap<String, u16> = HashMap::new();
        for w in words(text) {
            let c = counts.entry(w).or_default();
            *c = c.saturating_add(1);
        }
        let length: u32 = counts.values().map(|c| u32::from(*c)).sum();
        // A query never asks for stop words (see `telling_words`): they are counted in
        // the length only.
        for (w, c) in counts {
            if !STOP_WORDS.contains(&w.as_str()) {
                self.postings.entry(w).or_default().push((at as u32, c));
            }
        }
        let n = self.lengths.len() as f32;
        self.average_length = (self.average_length * n + length as f32) / (n + 1.0);
        self.lengths.push(length);
    }

    fn rebuild_words(&mut self) {
        self.postings.clear();
        self.lengths.clear();
        self.average_length = 0.0;
        let texts: Vec<String> = self.memories.iter().map(|m| m.text.clone()).collect();
        for (at, text) in texts.iter().enumerate() {
            self.add_words(at, text);
        }
    }

    /// Gives the memory at `at` a vector (ignored unless of the current model).
    pub fn set_vector(&mut self, at: usize, e: &Embedding) {
        if e.model != self.model || at >= self.slot.len() {
            return;
        }
        if self.dims == 0 {
            self.dims = e.values.len();
        }
        if e.values.len() != self.dims {
            return;
        }
        let norm = e
            .values
            .iter()
            .map(|v| f32::from(*v) * f32::from(*v))
            .sum::<f32>()
            .sqrt();
        match self.slot[at] {
            Some(k) => {
                let k = k as usize;
                self.vectors[k * self.dims..(k + 1) * self.dims].copy_from_slice(&e.values);
                self.embedded[k].1 = norm;
            }
            None => {
                self.slot[at] = Some(self.embedded.len() as u32);
                self.vectors.extend_from_slice(&e.values);
                self.embedded.push((at as u32, norm));
            }
        }
    }

    /// The vector of the memory at `at`, if it has one of the current model.
    pub fn vector_of(&self, at: usize) -> Option<Embedding> {
        let k = self.slot.get(at).copied().flatten()? as usize;
        Some(Embedding {
            model: self.model.clone(),
            values: self.vectors[k * self.dims..(k + 1) * self.dims].to_vec(),
        })
    }

    /// Which memories have no vector of the current model.
    pub fn unembedded(&self) -> Vec<usize> {
        (0..self.memories.len())
            .filter(|i| self.slot[*i].is_none())
            .collect()
    }

    /// Every memory's match for a query with `vector` (quantized, of the current model;
    /// `None` when the query could not be embedded) and the words of `query`, candidates
    /// only.
    pub fn score(&self, vector: Option<&[i8]>, query: &str) -> Vec<Scored> {
        let mut similarity = vec![0f32; self.memories.len()];
        if let Some(q) = vector.filter(|q| q.len() == self.dims && self.dims > 0) {
            let qn = q
                .iter()
                .map(|v| f32::from(*v) * f32::from(*v))
                .sum::<f32>()
                .sqrt();
            if qn > 0.0 {
                let q = crate::domain::DotQuery::new(q);
                for (k, (at, norm)) in self.embedded.iter().enumerate() {
                    let v = &self.vectors[k * self.dims..(k + 1) * self.dims];
                    if *norm > 0.0 {
                        similarity[*at as usize] = q.dot(v) as f32 / (qn * norm);
                    }
                }
            }
        }
        let mut lexical = vec![0f32; self.memories.len()];
        self.bm25(query, &mut lexical);
        let best = lexical.iter().copied().fold(0f32, f32::max);
        (0..self.memories.len())
            .filter_map(|at| {
                let w = if best > 0.0 { lexical[at] / best } else { 0.0 };
                let s = similarity[at].max(0.0);
                (w > 0.0 || s >= SIMILAR).then_some(Scored {
                    at,
                    similarity: s,
                    words: w,
                    matched: VECTOR_SHARE * s + WORDS_SHARE * w,
                })
            })
            .collect()
    }

    fn bm25(&self, query: &str, out: &mut [f32]) {
        let postings = &self.postings;
        let n = self.lengths.len() as f32;
        let mut seen = Vec::new();
        for w in crate::domain::telling_words(query) {
            if seen.contains(&w) {
                continue;
            }
            let Some(list) = postings.get(&w) else {
                seen.push(w);
                continue;
            };
            let df = list.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for (at, tf) in list {
                let tf = f32::from(*tf);
                let len = self.lengths[*at as usize] as f32;
                let norm = 1.0 - B + B * len / self.average_length.max(1.0);
                out[*at as usize] += idf * tf * (K1 + 1.0) / (tf + K1 * norm);
            }
            seen.push(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;
    use crate::domain::AgentId;
    use crate::embed::OfflineEmbedder;

    fn memory(n: u64, text: &str, embed: bool) -> Memory {
        let mut m = Memory::new(
            MemoryId::derived(n, &[text]),
            &AgentId::generate(),
            text,
            0,
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        if embed {
            m.embedding = Some(Embedding::quantize(
                "offline-ngram/256",
                &OfflineEmbedder::vector(text),
            ));
        }
        m
    }

    #[test]
    fn words_and_vectors_both_find_a_memory_and_unrelated_ones_are_not_candidates() {
        let ms = vec![
            memory(1, "the user is vegetarian", true),
            memory(2, "the report is due on friday", true),
            memory(3, "green tea in the morning", false),
        ];
        let index = Index::build(1, "offline-ngram/256", ms);
        let q = Embedding::quantize("x", &OfflineEmbedder::vector("vegetarians"));
        let found = index.score(Some(&q.values), "vegetarians");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].at, 0);
        assert!(
            found[0].similarity >= SIMILAR && found[0].words == 0.0,
            "{found:?}"
        );
        // Not embedded: found by its words alone.
        let found = index.score(None, "tea");
        assert_eq!(
            found,
            [Scored {
                at: 2,
                similarity: 0.0,
                words: 1.0,
                matched: WORDS_SHARE
            }]
        );
        assert_eq!(index.unembedded(), [2]);
        // Rarer words count more.
        let found = index.score(None, "report friday the");
        let best = found
            .iter()
            .max_by(|a, b| a.matched.total_cmp(&b.matched))
            .unwrap();
        assert_eq!(best.at, 1);
    }

    #[test]
    fn vectors_of_another_model_are_never_compared() {
        let mut m = memory(1, "the user is vegetarian", false);
        m.embedding = Some(Embedding::quantize(
            "other/256",
            &OfflineEmbedder::vector("the user is vegetarian"),
        ));
        let index = Index::build(1, "offline-ngram/256", vec![m]);
        let q = Embedding::quantize("x", &OfflineEmbedder::vector("the user is vegetarian"));
        assert!(index.score(Some(&q.values), "zzz").is_empty());
        assert_eq!(index.unembedded(), [0]);
    }
}
