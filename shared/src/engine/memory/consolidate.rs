//! Consolidation, the agent's sleep: a daily pass (and `pulse memories consolidate`)
//! that folds near-duplicate memories into one, and, with a model, old faded episodes
//! into a `summary` memory.
//!
//! - **Duplicates**: memories whose words are the same (case, spacing and punctuation
//!   aside), or whose vectors are at least [`DUPLICATE`] alike (among the
//!   [`NEAR_SCAN`] newest), are folded into the most important of them (the oldest among
//!   equals), which takes the highest weight and importance and their recall counts.
//! - **Summaries** (not with the offline model): active episodes older than
//!   [`EPISODE_AGE`] whose weight has faded under [`FADED`], the oldest
//!   [`SUMMARY_BATCH`] at a time, are summarized by the agent's model into one memory
//!   (kind `summary`, from consolidation, linked to them), and folded into it. Its
//!   tokens count against the agent's daily budget, and no summary is made when the
//!   budget is spent.
//!
//! **Gates**: one pass never folds more than a quarter of the agent's active memories.
//! Folded memories are kept, suspended (`folded_into` names the memory they live on in),
//! and [`restore`] undoes a fold.

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use tracing::{info, warn};

use super::Memories;
use crate::domain::{
    Agent, ChatMessage, Embedding, LlmRequest, Memory, MemoryChange, MemoryId, MemoryKind,
    MemorySource, MemoryStatus,
};
use crate::error::{StoreError, chain};
use crate::ports::{LlmSelector, MAX_CHANGES, Store};

/// Vectors at least this alike are duplicates.
pub const DUPLICATE: f32 = 0.95;
/// Newest active memories compared by vector for duplicates.
pub const NEAR_SCAN: usize = 1_000;
/// Episodes at least this old may be summarized.
pub const EPISODE_AGE: SignedDuration = SignedDuration::from_hours(7 * 24);
/// Episodes whose weight has faded under this may be summarized.
pub const FADED: f32 = 0.3;
/// Episodes summarized into one memory, at most.
pub const SUMMARY_BATCH: usize = 20;
/// Share of the active memories one pass may fold, at most.
pub const MOST_FOLDED: f32 = 0.25;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Consolidated {
    /// Active memories before the pass.
    pub active: usize,
    /// Memories folded into a duplicate.
    pub merged: usize,
    /// Memories folded into a summary.
    pub summarized: usize,
    /// The summaries made.
    pub summaries: Vec<MemoryId>,
    /// Folds left for a later pass by the gate.
    pub held_back: usize,
    /// Folds not made because their memories changed during the pass (forgotten,
    /// folded or recalled by another process): the next pass tries again.
    pub changed_meanwhile: usize,
    /// Tokens the model spent.
    pub tokens: u64,
    /// Why no summary was made, when one could have been.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_summary: Option<String>,
}

/// Words as duplicates compare them.
fn normalized(text: &str) -> String {
    super::index::words(text).collect::<Vec<_>>().join(" ")
}

/// Runs one pass over `agent`'s memories at `beat`; `llm` summarizes (none, or the
/// offline model: duplicates only), its calls held against the agent's dollar budget
/// at `prices`.
pub async fn consolidate(
    memories: &Memories,
    store: &dyn Store,
    llm: Option<(&dyn LlmSelector, &crate::engine::Prices)>,
    agent: &Agent,
    beat: u64,
    now: Timestamp,
) -> Result<Consolidated, StoreError> {
    let all = store.all_memories(&agent.id).await?;
    let half_life = agent.memory_half_life_beats();
    let active: Vec<usize> = (0..all.len())
        .filter(|i| all[*i].status_at(beat, half_life) == MemoryStatus::Active)
        .collect();
    let mut done = Consolidated {
        active: active.len(),
        ..Consolidated::default()
    };
    let mut budget = (active.len() as f32 * MOST_FOLDED).floor() as usize;
    // Each group (a keeper and what folds into it) is written all or none, on the
    // condition that its memories are still as read: a forget, a fold or a recall made
    // by another process meanwhile stands, and the group waits for the next pass.
    let mut taken: HashSet<usize> = HashSet::new();
    for (keeper, folded) in duplicates(&all, &active) {
        let mut k = all[keeper].clone();
        let mut group = Vec::new();
        for f in folded {
            // One write holds the keeper and at most MAX_CHANGES - 1 folds.
            if budget == 0 || group.len() + 1 >= MAX_CHANGES {
                done.held_back += 1;
                continue;
            }
            budget -= 1;
            k.weight = k.weight.max(all[f].weight_at(beat, half_life));
            k.importance = k.importance.max(all[f].importance);
            k.recalls = k.recalls.saturating_add(all[f].recalls);
            let mut m = all[f].clone();
            m.folded_into = Some(all[keeper].id.clone());
            group.push(MemoryChange::of(&all[f], m));
            taken.insert(f);
        }
        if group.is_empty() {
            continue;
        }
        let folds = group.len();
        group.push(MemoryChange::of(&all[keeper], k));
        taken.insert(keeper);
        if memories.change(&agent.id, &group).await? {
            done.merged += folds;
        } else {
            done.changed_meanwhile += folds;
        }
    }
    if let Some(llm) = llm {
        let episodes: Vec<usize> = active
            .iter()
            .copied()
            .filter(|i| {
                let m = &all[*i];
                !taken.contains(i)
                    && m.kind == MemoryKind::Episode
                    && now.duration_since(m.created_at) >= EPISODE_AGE
                    && m.weight_at(beat, half_life) < FADED
            })
            .take(SUMMARY_BATCH.min(budget))
            .collect();
        if episodes.len() >= 2 {
            match summarize(store, llm, agent, &all, &episodes, beat, now).await {
                Ok((summary, tokens)) => {
                    done.tokens = tokens;
                    let summary = memories.embedded(vec![summary]).await.remove(0);
                    let mut group: Vec<MemoryChange> = episodes
                        .iter()
                        .map(|i| {
                            let mut m = all[*i].clone();
                            m.folded_into = Some(summary.id.clone());
                            MemoryChange::of(&all[*i], m)
                        })
                        .collect();
                    let id = summary.id.clone();
                    group.push(MemoryChange::new(summary));
                    if memories.change(&agent.id, &group).await? {
                        done.summarized = episodes.len();
                        done.summaries.push(id);
                    } else {
                        done.changed_meanwhile += episodes.len();
                        done.no_summary = Some(
                            "its episodes changed while the model summed them up (forgotten, folded or recalled elsewhere); the next pass tries again".to_owned(),
                        );
                    }
                }
                Err(why) => done.no_summary = Some(why),
            }
        }
    }
    info!(agent_id = %agent.id, merged = done.merged, summarized = done.summarized, held_back = done.held_back, changed_meanwhile = done.changed_meanwhile, tokens = done.tokens, "memories consolidated");
    Ok(done)
}

/// Groups of duplicates among `active`: (the one kept, the ones folded into it).
fn duplicates(all: &[Memory], active: &[usize]) -> Vec<(usize, Vec<usize>)> {
    // Union-find over the active memories.
    let mut parent: HashMap<usize, usize> = active.iter().map(|i| (*i, *i)).collect();
    fn root(parent: &mut HashMap<usize, usize>, i: usize) -> usize {
        let mut r = i;
        while parent[&r] != r {
            r = parent[&r];
        }
        parent.insert(i, r);
        r
    }
    let join = |parent: &mut HashMap<usize, usize>, a: usize, b: usize| {
        let (ra, rb) = (root(parent, a), root(parent, b));
        if ra != rb {
            parent.insert(rb, ra);
        }
    };
    let mut by_words: HashMap<String, usize> = HashMap::new();
    for i in active {
        let key = normalized(&all[*i].text);
        match by_words.get(&key) {
            Some(first) => join(&mut parent, *first, *i),
            None => {
                by_words.insert(key, *i);
            }
        }
    }
    let newest: Vec<usize> = active.iter().rev().take(NEAR_SCAN).copied().collect();
    for (x, a) in newest.iter().enumerate() {
        let Some(ea) = &all[*a].embedding else {
            continue;
        };
        for b in &newest[x + 1..] {
            if let Some(eb) = &all[*b].embedding
                && ea.model == eb.model
                && Embedding::cosine(&ea.values, &eb.values) >= DUPLICATE
            {
                join(&mut parent, *a, *b);
            }
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in active {
        let r = root(&mut parent, *i);
        groups.entry(r).or_default().push(*i);
    }
    let mut out: Vec<(usize, Vec<usize>)> = groups
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            // The most important is kept; the oldest among equals (ids sort by time).
            g.sort_by(|a, b| {
                all[*b]
                    .importance
                    .total_cmp(&all[*a].importance)
                    .then(all[*a].id.cmp(&all[*b].id))
            });
            let keeper = g.remove(0);
            (keeper, g)
        })
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

/// Asks the agent's model for one memory summing up `episodes`; the summary and the
/// tokens spent (recorded against the daily budget). `Err` says why there is none.
async fn summarize(
    store: &dyn Store,
    (llm, prices): (&dyn LlmSelector, &crate::engine::Prices),
    agent: &Agent,
    all: &[Memory],
    episodes: &[usize],
    beat: u64,
    now: Timestamp,
) -> Result<(Memory, u64), String> {
    let model = llm.select(agent).map_err(|e| e.to_string())?;
    if model.provider() == "offline" {
        return Err("the offline model does not summarize".to_owned());
    }
    match crate::engine::budget::exhausted(store, agent, now).await {
        Ok(Some(_)) => return Err("the daily token budget is spent".to_owned()),
        Ok(None) => {}
        Err(e) => return Err(chain(&e)),
    }
    let listed: Vec<String> = episodes
        .iter()
        .map(|i| {
            crate::engine::framing::frame(
                &format!("memory kept at {}", all[*i].created_at),
                &all[*i].text,
            )
        })
        .collect();
    let request = LlmRequest {
        model: None,
        messages: vec![
            ChatMessage::system(format!(
                "You keep the long-term memory of {}. Sum up the memories below in one short memory (at most three sentences) that keeps what is worth remembering: facts, decisions, what the user cares about. Answer with the memory's text only.\n\n{}",
                agent.name,
                crate::engine::framing::EXPLAINED
            )),
            ChatMessage::user(listed.join("\n")),
        ],
        tools: Vec::new(),
        max_tokens: 300,
        ..LlmRequest::default()
    };
    let served = request
        .model
        .clone()
        .unwrap_or_else(|| model.model().to_owned());
    let hold =
        match crate::engine::dollars::hold(store, None, prices, agent, &served, &request, now)
            .await
            .map_err(|e| chain(&e))?
        {
            crate::engine::dollars::Held::Free => None,
            crate::engine::dollars::Held::Held(h) => Some(h),
            crate::engine::dollars::Held::Refused(r) => return Err(r.reason),
        };
    let answer = model.complete(&request).await;
    if let Some(hold) = hold {
        let used = answer.as_ref().ok().map(|a| a.usage);
        crate::engine::dollars::settle(store, None, agent, hold, used.as_ref(), now).await;
    }
    let answer = answer.map_err(|e| e.to_string())?;
    let tokens = answer.usage.input_tokens + answer.usage.output_tokens;
    let source = format!("consolidation:{beat}");
    crate::engine::budget::record(store, agent, now, &source, tokens).await;
    let text = answer
        .text
        .filter(|t| !t.trim().is_empty())
        .ok_or("the model answered no text")?;
    let ids: Vec<String> = episodes.iter().map(|i| all[*i].id.to_string()).collect();
    let mut summary = Memory::new(
        MemoryId::derived(
            now.as_millisecond().max(0) as u64,
            &ids.iter().map(String::as_str).collect::<Vec<_>>(),
        ),
        &agent.id,
        &text,
        beat,
        now,
    )
    .map_err(|e| e.to_string())?;
    summary.kind = MemoryKind::Summary;
    summary.source = MemorySource::Consolidation;
    summary.importance = episodes
        .iter()
        .map(|i| all[*i].importance)
        .fold(0.0, f32::max);
    summary.source_ids = ids;
    Ok((summary, tokens))
}

/// What [`restore`] brought back.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Restored {
    /// Memories no longer folded.
    pub restored: Vec<MemoryId>,
    /// The summary removed (when `id` was one consolidation made).
    pub removed: Option<MemoryId>,
}

/// Undoes a fold: given a summary consolidation made, its memories come back and it
/// goes; given a memory others were folded into, they come back; given a folded
/// memory, it comes back. `None` when there is no memory `id`.
pub async fn restore(
    memories: &Memories,
    store: &dyn Store,
    agent: &Agent,
    id: &MemoryId,
) -> Result<Option<Restored>, StoreError> {
    let Some(target) = store.get_memory(&agent.id, id).await? else {
        return Ok(None);
    };
    let all = store.all_memories(&agent.id).await?;
    let back: Vec<Memory> = all
        .iter()
        .filter(|m| m.folded_into.as_ref() == Some(id) || (m.id == *id && m.folded_into.is_some()))
        .cloned()
        .collect();
    let mut done = Restored {
        restored: Vec::new(),
        removed: None,
    };
    // Each on the condition that the memory is still folded as read: one forgotten,
    // refolded or recalled meanwhile is left as it is now.
    for read in &back {
        let mut m = read.clone();
        m.folded_into = None;
        if memories
            .change(&agent.id, &[MemoryChange::of(read, m)])
            .await?
        {
            done.restored.push(read.id.clone());
        }
    }
    if target.source == MemorySource::Consolidation && !done.restored.is_empty() {
        memories.forget(&agent.id, id).await?;
        done.removed = Some(id.clone());
    }
    if done.restored.is_empty() {
        warn!(memory_id = %id, "nothing to restore: no memory was folded into it, and it is not folded");
    }
    Ok(Some(done))
}
