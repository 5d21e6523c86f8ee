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
/// How a memory's similarity and its words make its match.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mix {
    /// `share × similarity + (1 − share) × words`: by default [`VECTOR_SHARE`].
    Shares(f32),
    /// Reciprocal rank fusion with constant `k`: `1 / (k + rank)` by similarity plus
    /// the same by words (a memory no word matches has no words' part), scaled so that
    /// the first by both would match 1.
    Ranks(f32),
}

impl Default for Mix {
    fn default() -> Self {
        Self::Shares(VECTOR_SHARE)
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Shares(s) => write!(f, "{s}"),
            Self::Ranks(k) => write!(f, "rrf{k}"),
        }
    }
}

impl std::str::FromStr for Mix {
    type Err = String;
    /// `0.7` (the vectors' share) or `rrf60` (rank fusion with k = 60).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("{s:?}: give the vectors' share (0 to 1, e.g. 0.7) or rrfK (e.g. rrf60)");
        match s.strip_prefix("rrf") {
            Some(k) => k
                .parse::<f32>()
                .ok()
                .filter(|k| *k >= 0.0 && k.is_finite())
                .map(Self::Ranks)
                .ok_or_else(bad),
            None => s
                .parse::<f32>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .map(Self::Shares)
                .ok_or_else(bad),
        }
    }
}

/// A similarity this high makes a memory a candidate without a word in common.
pub const SIMILAR: f32 = 0.3;
/// Beyond this many vectors, a recall compares exactly only those its signs put nearest
/// (and those whose words match).
pub const PREFILTER_ABOVE: usize = 20_000;
/// How many of the nearest by signs are compared exactly, at least.
pub const PREFILTER_KEEP: usize = 2_000;
/// How many of the best by words are compared exactly too, beyond [`PREFILTER_ABOVE`].
pub const WORDS_KEEP: usize = 500;
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
    /// Each vector's signs, one bit a dimension, `dims / 64` words each (rounded up): a
    /// large index is searched by them first (see [`PREFILTER_ABOVE`]).
    signs: Vec<u64>,
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
            signs: Vec::new(),
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
        let norm = norm(&e.values);
        let signs = sign_bits(&e.values);
        let words = signs.len();
        match self.slot[at] {
            Some(k) => {
                let k = k as usize;
                self.vectors[k * self.dims..(k + 1) * self.dims].copy_from_slice(&e.values);
                self.signs[k * words..(k + 1) * words].copy_from_slice(&signs);
                self.embedded[k].1 = norm;
            }
            None => {
                self.slot[at] = Some(self.embedded.len() as u32);
                self.vectors.extend_from_slice(&e.values);
                self.signs.extend_from_slice(&signs);
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
        self.score_mixed(vector, query, Mix::default())
    }

    /// [`Index::score`], the match made by `mix`.
    pub fn score_mixed(&self, vector: Option<&[i8]>, query: &str, mix: Mix) -> Vec<Scored> {
        let keep = PREFILTER_KEEP.max(self.embedded.len() / 50);
        let mut scored = self.score_with(vector, query, PREFILTER_ABOVE, keep);
        match mix {
            Mix::Shares(share) => {
                for s in &mut scored {
                    s.matched = share * s.similarity + (1.0 - share) * s.words;
                }
            }
            Mix::Ranks(k) => fuse_ranks(&mut scored, k),
        }
        scored
    }

    /// [`Index::score`], comparing every vector exactly up to `prefilter_above` of them,
    /// and beyond, only the `keep` [`Index::nearest_by_signs`] finds and the
    /// [`WORDS_KEEP`] whose words match best.
    fn score_with(
        &self,
        vector: Option<&[i8]>,
        query: &str,
        prefilter_above: usize,
        keep: usize,
    ) -> Vec<Scored> {
        let mut lexical = vec![0f32; self.memories.len()];
        self.bm25(query, &mut lexical);
        let mut similarity = vec![0f32; self.memories.len()];
        if let Some(q) = vector.filter(|q| q.len() == self.dims && self.dims > 0) {
            let qn = norm(q);
            if qn > 0.0 {
                let exact = crate::domain::DotQuery::new(q);
                let mut compare = |k: usize| {
                    let (at, norm) = self.embedded[k];
                    let v = &self.vectors[k * self.dims..(k + 1) * self.dims];
                    if norm > 0.0 {
                        similarity[at as usize] = exact.dot(v) as f32 / (qn * norm);
                    }
                };
                // Signs say little of sparse vectors (the offline embedder's, and small
                // ones are quick to compare anyway).
                if self.embedded.len() <= prefilter_above || self.dims < 512 {
                    (0..self.embedded.len()).for_each(&mut compare);
                } else {
                    self.nearest_by_signs(q, keep)
                        .into_iter()
                        .for_each(&mut compare);
                    best_by_words(&lexical, WORDS_KEEP)
                        .into_iter()
                        .filter_map(|at| self.slot[at])
                        .for_each(|k| compare(k as usize));
                }
            }
        }
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

    /// The vectors whose signs agree most with the query's (fewest differing bits):
    /// `keep` of them ([`PREFILTER_KEEP`], or 2 % of all if more). Reading one bit a dimension
    /// instead of a byte, a search of 100,000 vectors at 1,536 dimensions reads 19 MB
    /// instead of 154, which is what bounds it; the exact comparison that follows puts
    /// them in order.
    fn nearest_by_signs(&self, q: &[i8], keep: usize) -> Vec<usize> {
        let query = sign_bits(q);
        let words = query.len();
        let mut distance: Vec<(u32, u32)> = (0..self.embedded.len())
            .map(|k| {
                let bits = &self.signs[k * words..(k + 1) * words];
                let d: u32 = bits
                    .iter()
                    .zip(&query)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                (d, k as u32)
            })
            .collect();
        if distance.len() > keep {
            distance.select_nth_unstable(keep);
            distance.truncate(keep);
        }
        distance.into_iter().map(|(_, k)| k as usize).collect()
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

/// The length of a quantized vector.
fn norm(v: &[i8]) -> f32 {
    (crate::domain::dot_i8(v, v) as f32).sqrt()
}

/// The `keep` memories whose words score best (those scoring at all).
fn best_by_words(lexical: &[f32], keep: usize) -> Vec<usize> {
    let mut scored: Vec<(f32, usize)> = lexical
        .iter()
        .enumerate()
        .filter(|(_, s)| **s > 0.0)
        .map(|(at, s)| (*s, at))
        .collect();
    if scored.len() > keep {
        scored.select_nth_unstable_by(keep, |a, b| b.0.total_cmp(&a.0));
        scored.truncate(keep);
    }
    scored.into_iter().map(|(_, at)| at).collect()
}

/// The signs of `v`, one bit a dimension (set when positive), 64 to a word.
fn sign_bits(v: &[i8]) -> Vec<u64> {
    v.chunks(64)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |w, (i, x)| if *x > 0 { w | 1 << i } else { w })
        })
        .collect()
}

/// Each of `scored`'s match by reciprocal rank fusion with constant `k` (see
/// [`Mix::Ranks`]).
fn fuse_ranks(scored: &mut [Scored], k: f32) {
    let mut order: Vec<usize> = (0..scored.len()).collect();
    let mut part = vec![0f32; scored.len()];
    order.sort_by(|a, b| scored[*b].similarity.total_cmp(&scored[*a].similarity));
    for (rank, i) in order.iter().enumerate() {
        if scored[*i].similarity > 0.0 {
            part[*i] += 1.0 / (k + 1.0 + rank as f32);
        }
    }
    order.sort_by(|a, b| scored[*b].words.total_cmp(&scored[*a].words));
    for (rank, i) in order.iter().enumerate() {
        if scored[*i].words > 0.0 {
            part[*i] += 1.0 / (k + 1.0 + rank as f32);
        }
    }
    for (s, p) in scored.iter_mut().zip(part) {
        s.matched = p * (k + 1.0) / 2.0;
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
    fn a_search_by_signs_first_finds_what_the_exact_search_finds() {
        // 3,000 dense vectors in 100 clusters (what a model's vectors of related texts
        // look like); the prefilter compares 200 of them exactly.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let centers: Vec<Vec<f32>> = (0..100)
            .map(|_| (0..512).map(|_| noise()).collect())
            .collect();
        let near = |c: &[f32], noise: &mut dyn FnMut() -> f32| -> Vec<f32> {
            c.iter().map(|x| x + 0.8 * noise()).collect()
        };
        let ms: Vec<Memory> = (0..3_000u64)
            .map(|i| {
                let mut m = memory(i, &format!("memory {i}"), false);
                let v = near(&centers[(i % 100) as usize], &mut noise);
                m.embedding = Some(Embedding::quantize("dense/512", &v));
                m
            })
            .collect();
        let index = Index::build(1, "dense/512", ms);
        for c in 0..20 {
            let q = Embedding::quantize("dense/512", &near(&centers[c * 5], &mut noise));
            let ids = |mut s: Vec<Scored>| {
                s.sort_by_key(|s| s.at);
                s.into_iter().map(|s| s.at).collect::<Vec<_>>()
            };
            let exact = ids(index.score_with(Some(&q.values), "", usize::MAX, 0));
            assert!(
                exact.len() >= 20,
                "a cluster's memories are candidates: {exact:?}"
            );
            let quick = ids(index.score_with(Some(&q.values), "", 100, 200));
            assert_eq!(quick, exact, "cluster {}", c * 5);
        }
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

    #[test]
    fn a_mix_is_a_share_or_rank_fusion_and_fusion_puts_first_what_both_put_first() {
        assert_eq!("0.7".parse::<Mix>(), Ok(Mix::Shares(0.7)));
        assert_eq!("rrf60".parse::<Mix>(), Ok(Mix::Ranks(60.0)));
        for bad in ["1.5", "rrf", "rrf-1", "x"] {
            assert!(bad.parse::<Mix>().unwrap_err().contains("rrfK"), "{bad}");
        }
        assert_eq!(Mix::Ranks(60.0).to_string(), "rrf60");
        let s = |at, similarity, words| Scored {
            at,
            similarity,
            words,
            matched: 0.0,
        };
        let mut scored = [s(0, 0.9, 1.0), s(1, 0.0, 0.5), s(2, 0.5, 0.0)];
        fuse_ranks(&mut scored, 60.0);
        assert!((scored[0].matched - 1.0).abs() < 1e-6, "{scored:?}");
        // Second by words only, and second by similarity only: alike, below the first.
        assert!(
            (scored[1].matched - scored[2].matched).abs() < 1e-6,
            "{scored:?}"
        );
        assert!(scored[1].matched < 0.6, "{scored:?}");
    }
}
