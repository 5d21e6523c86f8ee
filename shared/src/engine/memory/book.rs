//! [`Memories`]: keeping and recalling an agent's memories, with a cached index per agent.
//!
//! An agent's index ([`super::index::Index`]) is built from all its memories the first
//! time it is searched in a process, and kept: each recall reads the agent's memory
//! version (one small read) and builds the index again only when another process
//! changed its memories. What this process changes it applies to its own index.
//!
//! Vectors come from the [`Embedder`] in the worker, never on the receiver's path. A
//! memory whose embedding failed is stored without a vector (recall finds it by its
//! words) and embedded later: each recall embeds up to [`BACKFILL`] of the agent's
//! memories that have no vector of the current model, and `pulse memories reindex` does
//! them all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{Instrument as _, info, warn};

use super::index::{Index, Scored};
use crate::domain::{Agent, AgentId, Embedding, Memory, MemoryChange, MemoryId, MemoryStatus};
use crate::error::StoreError;
use crate::ports::{Embedder, Store};

/// Memories embedded after a recall, at most, when some have no vector yet.
pub const BACKFILL: usize = 32;
/// A suspended memory this similar to a recall's query comes back.
pub const REACTIVATE_ABOVE: f32 = 0.5;
/// What a recall adds to a memory's weight.
pub const GAIN: f32 = 0.1;
/// The bytes the cached indexes take, in all, before the least recently used go, unless
/// [`Memories::with_cache`] says otherwise.
pub const CACHE_BYTES: usize = 512 << 20;

/// What a recall asks for.
#[derive(Clone, Debug)]
pub struct Recall {
    /// The query.
    pub query: String,
    /// The agent's beat now (weights fade with beats).
    pub beat: u64,
    /// Most memories returned.
    pub limit: usize,
    /// Most characters of their texts together.
    pub max_chars: usize,
    /// Whether what is returned is reinforced (and suspended ones brought back).
    pub reinforce: bool,
    /// Whether memories folded into others are skipped (they are, for a model).
    pub skip_folded: bool,
}

impl Recall {
    /// A model's recall of `query` at `beat`: the top 5 within 8,000 characters,
    /// reinforced.
    pub fn for_model(query: &str, beat: u64) -> Self {
        Self {
            query: query.to_owned(),
            beat,
            limit: 5,
            max_chars: 8_000,
            reinforce: true,
            skip_folded: true,
        }
    }
}

/// One memory a recall found.
#[derive(Clone, Debug, Serialize)]
pub struct Found {
    /// The memory, as the recall left it (reinforced, if it was).
    pub memory: Memory,
    /// Its standing when found (a reactivated one was suspended).
    pub status: MemoryStatus,
    /// Its weight now.
    pub weight: f32,
    /// How well it matched: 0.7 × similarity + 0.3 × words.
    pub score: f32,
    /// Its vector's similarity to the query's.
    pub similarity: f32,
    /// It was suspended and this recall brought it back.
    pub reactivated: bool,
    /// When a recall returned it before this one (`None`: never); `memory.recalled_at`
    /// is this recall's time when it reinforced the memory.
    pub recalled_before: Option<Timestamp>,
}

struct Cached {
    index: Arc<AsyncMutex<Option<Index>>>,
    used: Instant,
    size: usize,
}

/// An agent's memories, kept and recalled.
pub struct Memories {
    store: Arc<dyn Store>,
    embedder: Arc<dyn Embedder>,
    cache: std::sync::Mutex<HashMap<AgentId, Cached>>,
    /// Most bytes the cached indexes take.
    cache_bytes: usize,
    /// How a memory's similarity and words make its match.
    mix: super::index::Mix,
}

impl Memories {
    /// Memories in `store`, embedded by `embedder`.
    pub fn new(store: Arc<dyn Store>, embedder: Arc<dyn Embedder>) -> Self {
        Self {
            store,
            embedder,
            cache: std::sync::Mutex::default(),
            cache_bytes: CACHE_BYTES,
            mix: super::index::Mix::default(),
        }
    }

    /// Matches made by `mix` (the benchmark compares them).
    pub fn with_mix(mut self, mix: super::index::Mix) -> Self {
        self.mix = mix;
        self
    }

    /// The cached indexes take at most `bytes` in all (the agent being recalled is kept
    /// whatever its size; others go, least recently used first).
    pub fn with_cache(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// The embedder's model.
    pub fn model(&self) -> &str {
        self.embedder.model()
    }

    /// The embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    fn slot(&self, agent: &AgentId) -> Arc<AsyncMutex<Option<Index>>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let slot = cache.entry(agent.clone()).or_insert_with(|| Cached {
            index: Arc::default(),
            used: Instant::now(),
            size: 0,
        });
        slot.used = Instant::now();
        slot.index.clone()
    }

    fn note_size(&self, agent: &AgentId, size: usize) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get_mut(agent) {
            c.size = size;
        }
        // The least recently used go while the rest hold too many.
        while cache.values().map(|c| c.size).sum::<usize>() > self.cache_bytes && cache.len() > 1 {
            let Some(oldest) = cache
                .iter()
                .filter(|(a, _)| *a != agent)
                .min_by_key(|(_, c)| c.used)
                .map(|(a, _)| a.clone())
            else {
                break;
            };
            cache.remove(&oldest);
        }
    }

    /// The agent's index, current with the store: loaded if it is not cached, or if the
    /// store's version moved past it.
    async fn current<'a>(
        &self,
        agent: &AgentId,
        guard: &'a mut Option<Index>,
    ) -> Result<&'a mut Index, StoreError> {
        let version = self.store.memory_version(agent).await?;
        let stale = guard
            .as_ref()
            .is_none_or(|i| i.version != version || i.model != self.embedder.model());
        if stale {
            let all = self.store.all_memories(agent).await?;
            let started = Instant::now();
            let index = Index::build(version, self.embedder.model(), all);
            info!(agent_id = %agent, memories = index.len(), version, ms = started.elapsed().as_millis() as u64, "memory index loaded");
            self.note_size(agent, index.bytes());
            *guard = Some(index);
        }
        Ok(guard.as_mut().expect("loaded above"))
    }

    /// Embeds `texts`; `None` for each when the embedder fails (logged).
    async fn vectors(&self, texts: &[String]) -> Vec<Option<Embedding>> {
        match self.embedder.embed(texts).await {
            Ok(vs) => vs
                .iter()
                .map(|v| Some(Embedding::quantize(self.embedder.model(), v)))
                .collect(),
            Err(e) => {
                warn!(error = %e, texts = texts.len(), model = self.embedder.model(), "could not embed: recall finds these by words until a later pass embeds them");
                vec![None; texts.len()]
            }
        }
    }

    /// Stores `memories` of `agent` (embedding them first, best effort), and applies
    /// them to the cached index when nothing else changed the agent's memories meanwhile.
    pub async fn remember(
        &self,
        agent: &AgentId,
        memories: Vec<Memory>,
    ) -> Result<Vec<Memory>, StoreError> {
        let span = crate::traces::memory_store(memories.iter().map(|m| m.id.as_str()));
        async {
            let memories = self.embedded(memories).await;
            self.write(agent, &memories).await?;
            Ok(memories)
        }
        .instrument(span)
        .await
    }

    /// `memories`, each without a vector embedded (best effort: one the embedder
    /// failed on is left without, for a later pass).
    pub async fn embedded(&self, mut memories: Vec<Memory>) -> Vec<Memory> {
        let missing: Vec<usize> = (0..memories.len())
            .filter(|i| memories[*i].embedding.is_none())
            .collect();
        if !missing.is_empty() {
            let texts: Vec<String> = missing.iter().map(|i| memories[*i].text.clone()).collect();
            for (i, v) in missing.into_iter().zip(self.vectors(&texts).await) {
                memories[i].embedding = v;
            }
        }
        memories
    }

    /// Writes memories and keeps the cached index in step with the write.
    async fn write(&self, agent: &AgentId, memories: &[Memory]) -> Result<(), StoreError> {
        let slot = self.slot(agent);
        let mut guard = slot.lock().await;
        self.store.remember(memories).await?;
        let version = self.store.memory_version(agent).await?;
        let bumps = memories.len().div_ceil(99) as u64;
        match guard.as_mut() {
            Some(index) if index.version + bumps == version => {
                for m in memories {
                    index.push(m.clone());
                }
                index.version = version;
            }
            _ => *guard = None,
        }
        Ok(())
    }

    /// Writes `changes` all or none, each only if the store still holds what it was read
    /// from (see [`MemoryChange`]); `false`, with nothing written, when one changed
    /// meanwhile. The cached index is read again next time.
    pub async fn change(
        &self,
        agent: &AgentId,
        changes: &[MemoryChange],
    ) -> Result<bool, StoreError> {
        let slot = self.slot(agent);
        let mut guard = slot.lock().await;
        *guard = None;
        self.store.change(agent, changes).await
    }

    /// Deletes a memory; `false` if there was none.
    pub async fn forget(&self, agent: &AgentId, id: &MemoryId) -> Result<bool, StoreError> {
        let slot = self.slot(agent);
        let mut guard = slot.lock().await;
        *guard = None;
        self.store.forget(agent, id).await
    }

    /// Recalls what matches `r.query` among all of `agent`'s memories: the best by match,
    /// weight and importance, within `r.limit` and `r.max_chars`. With `r.reinforce`,
    /// each active one found is reinforced and each suspended one similar enough is
    /// brought back, and that is stored. Then up to [`BACKFILL`] memories without a
    /// vector are embedded.
    pub async fn recall(
        &self,
        agent: &Agent,
        r: &Recall,
        now: Timestamp,
    ) -> Result<Vec<Found>, StoreError> {
        let span = crate::traces::memory_search(&r.query);
        let found = self
            .recalled(agent, r, now)
            .instrument(span.clone())
            .await?;
        crate::traces::memories_found(&span, found.iter().map(|f| (f.memory.id.as_str(), f.score)));
        Ok(found)
    }

    /// [`Self::recall`]'s work.
    async fn recalled(
        &self,
        agent: &Agent,
        r: &Recall,
        now: Timestamp,
    ) -> Result<Vec<Found>, StoreError> {
        let slot = self.slot(&agent.id);
        let mut guard = slot.lock().await;
        let index = self.current(&agent.id, &mut guard).await?;
        let query_vector = self
            .vectors(std::slice::from_ref(&r.query))
            .await
            .pop()
            .flatten();
        let scored = index.score_mixed(
            query_vector.as_ref().map(|e| e.values.as_slice()),
            &r.query,
            self.mix,
        );
        let half_life = agent.memory_half_life_beats();
        let found = pick(index, scored, r, half_life);
        let mut out = Vec::with_capacity(found.len());
        let mut changed = Vec::new();
        for (s, _) in found {
            let m = &mut index.memories[s.at];
            let recalled_before = m.recalled_at;
            let status = m.status_at(r.beat, half_life);
            let reactivated = r.reinforce
                && status == MemoryStatus::Suspended
                && m.folded_into.is_none()
                && s.similarity > REACTIVATE_ABOVE;
            if r.reinforce && (status == MemoryStatus::Active || reactivated) {
                m.reinforce(r.beat, half_life, GAIN, now);
                changed.push(s.at);
            }
            out.push(Found {
                weight: m.weight_at(r.beat, half_life),
                memory: m.clone(),
                status,
                score: s.matched,
                similarity: s.similarity,
                reactivated,
                recalled_before,
            });
        }
        self.store_reinforced(agent, index, changed, r.beat, now)
            .await?;
        self.backfill(agent, index, BACKFILL).await?;
        Ok(out)
    }

    /// Stores the reinforcement of the memories at `changed` in `index`. One forgotten
    /// since the index was read is left gone; one another process reinforced meanwhile
    /// is read again and reinforced over what it holds now, so no reinforcement is lost.
    async fn store_reinforced(
        &self,
        agent: &Agent,
        index: &mut Index,
        mut changed: Vec<usize>,
        beat: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let half_life = agent.memory_half_life_beats();
        // A few rounds: each loses only to a recall that landed in between.
        for _ in 0..4 {
            if changed.is_empty() {
                return Ok(());
            }
            let batch: Vec<Memory> = changed
                .iter()
                .map(|at| index.memories[*at].clone())
                .collect();
            let missed = self.store.reinforce(&batch).await?;
            let mut again = Vec::new();
            for id in missed {
                let Some(at) = changed
                    .iter()
                    .copied()
                    .find(|at| index.memories[*at].id == id)
                else {
                    continue;
                };
                if let Some(mut fresh) = self.store.get_memory(&agent.id, &id).await? {
                    fresh.embedding = None;
                    fresh.reinforce(beat, half_life, GAIN, now);
                    index.memories[at] = fresh;
                    again.push(at);
                }
            }
            changed = again;
        }
        if !changed.is_empty() {
            tracing::warn!(agent_id = %agent.id, memories = changed.len(), "reinforcements kept losing to other recalls; left as they are");
        }
        Ok(())
    }

    /// Embeds up to `max` of the agent's memories that have no vector of the current
    /// model, stores them, and returns how many were embedded.
    async fn backfill(
        &self,
        agent: &Agent,
        index: &mut Index,
        max: usize,
    ) -> Result<usize, StoreError> {
        let todo: Vec<usize> = index.unembedded().into_iter().take(max).collect();
        if todo.is_empty() {
            return Ok(0);
        }
        let texts: Vec<String> = todo
            .iter()
            .map(|at| index.memories[*at].text.clone())
            .collect();
        let vectors = self.vectors(&texts).await;
        let mut batch = Vec::new();
        for (at, v) in todo.into_iter().zip(vectors) {
            if let Some(e) = v {
                let mut m = index.memories[at].clone();
                m.embedding = Some(e);
                batch.push((at, m));
            }
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let memories: Vec<Memory> = batch.iter().map(|(_, m)| m.clone()).collect();
        // The vectors alone, and only of memories that still exist: a forget made
        // meanwhile stands, and so does a fold or a recall.
        let missed = self.store.set_vectors(&agent.id, &memories).await?;
        let version = self.store.memory_version(&agent.id).await?;
        for (at, m) in &batch {
            if let Some(e) = &m.embedding
                && !missed.contains(&m.id)
            {
                index.set_vector(*at, e);
            }
        }
        let bumps = u64::from(missed.len() < memories.len());
        index.version = if missed.is_empty() && index.version + bumps == version {
            version
        } else {
            // Another process wrote meanwhile: the next recall loads again.
            u64::MAX
        };
        Ok(batch.len())
    }

    /// Embeds every memory of the agent without a vector of the current model, in
    /// batches, calling `progress(done, total)` after each; returns how many were
    /// embedded, and how many are left (the embedder failed on them).
    pub async fn reindex(
        &self,
        agent: &Agent,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<(usize, usize), StoreError> {
        let slot = self.slot(&agent.id);
        let mut guard = slot.lock().await;
        let index = self.current(&agent.id, &mut guard).await?;
        let total = index.unembedded().len();
        let mut done = 0;
        progress(0, total);
        while done < total {
            let n = self.backfill(agent, index, 256).await?;
            if n == 0 {
                break;
            }
            done += n;
            progress(done, total);
            if index.version == u64::MAX {
                *guard = None;
                return Ok((done, total - done));
            }
        }
        Ok((done, total - done))
    }

    /// The agent's weightiest active memories at `beat` (by weight × importance, not
    /// folded), at most `limit`: what it knows best, whatever the subject.
    pub async fn weightiest(
        &self,
        agent: &Agent,
        beat: u64,
        limit: usize,
    ) -> Result<Vec<Memory>, StoreError> {
        let slot = self.slot(&agent.id);
        let mut guard = slot.lock().await;
        let index = self.current(&agent.id, &mut guard).await?;
        let half_life = agent.memory_half_life_beats();
        let mut ranked: Vec<(f32, &Memory)> = index
            .memories
            .iter()
            .filter(|m| m.status_at(beat, half_life) == MemoryStatus::Active)
            .map(|m| (m.weight_at(beat, half_life) * (0.5 + m.importance), m))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.id.cmp(&a.1.id)));
        Ok(ranked
            .into_iter()
            .take(limit)
            .map(|(_, m)| m.clone())
            .collect())
    }

    /// One memory of `agent`, as the store holds it; `None` if the agent has none with
    /// that id. Reading it is not recalling it: nothing is reinforced.
    pub async fn get(&self, agent: &AgentId, id: &MemoryId) -> Result<Option<Memory>, StoreError> {
        self.store.get_memory(agent, id).await
    }

    /// The agent's memories as the index holds them (vectors left out), loaded if needed.
    pub async fn all(&self, agent: &AgentId) -> Result<Vec<Memory>, StoreError> {
        let slot = self.slot(agent);
        let mut guard = slot.lock().await;
        Ok(self.current(agent, &mut guard).await?.memories.clone())
    }
}

/// The memory at `at` with its vector again (the index keeps vectors apart).
/// The best of `scored` for `r`: ranked by match × (0.5 + 0.3 × weight + 0.2 ×
/// importance), within the count and character limits.
fn pick(index: &Index, scored: Vec<Scored>, r: &Recall, half_life: u64) -> Vec<(Scored, f32)> {
    let mut ranked: Vec<(Scored, f32)> = scored
        .into_iter()
        .filter(|s| !r.skip_folded || index.memories[s.at].folded_into.is_none())
        .map(|s| {
            let m = &index.memories[s.at];
            let weight = m.weight_at(r.beat, half_life);
            (s, s.matched * (0.5 + 0.3 * weight + 0.2 * m.importance))
        })
        .collect();
    let order =
        |a: &(Scored, f32), b: &(Scored, f32)| b.1.total_cmp(&a.1).then(b.0.at.cmp(&a.0.at));
    // Only the best few can be returned: they are picked out first (linear), then sorted.
    let keep = (r.limit * 8).max(64);
    if ranked.len() > keep {
        ranked.select_nth_unstable_by(keep, order);
        ranked.truncate(keep);
    }
    ranked.sort_by(order);
    let mut chars = 0;
    let mut out = Vec::new();
    for (s, rank) in ranked {
        if out.len() >= r.limit {
            break;
        }
        let n = index.memories[s.at].text.chars().count();
        if chars + n > r.max_chars {
            continue;
        }
        chars += n;
        out.push((s, rank));
    }
    out
}
