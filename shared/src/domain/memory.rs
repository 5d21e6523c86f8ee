//! What an agent remembers: typed, weighted memories that fade with its beats and come
//! back when recalled.
//!
//! A memory has a kind, an importance (0–1), and a weight that fades by half every
//! half-life of the agent's beats since it was last weighed (made, or recalled): a
//! memory that is not recalled fades, one that is recalled is reinforced. Below
//! [`SUSPENDED_BELOW`] it is *suspended*: it is still found when a recall matches it
//! closely, which brings it back. Consolidation folds duplicates and old faded episodes
//! into other memories; the folded ones are kept, suspended and linked, so it can be
//! undone.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ids::{AgentId, HeartbeatId, MemoryId};
use crate::error::ValidationError;

/// The event type an outside system sends to give an agent a memory: `{"text", "kind"?,
/// "importance"?}`. Its heartbeat keeps it, marked as coming from an event.
pub const REMEMBER: &str = "REMEMBER";

/// Below this weight a memory is suspended.
pub const SUSPENDED_BELOW: f32 = 0.1;
/// Longest memory text.
pub const MAX_MEMORY_CHARS: usize = 4_000;

/// What kind of thing a memory is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// Something true about the user or the world.
    #[default]
    Fact,
    /// What the user likes or wants.
    Preference,
    /// Something to do, or planned.
    Plan,
    /// Something that happened.
    Episode,
    /// What consolidation made of older memories.
    Summary,
}

impl MemoryKind {
    /// Every kind.
    pub const ALL: [Self; 5] = [
        Self::Fact,
        Self::Preference,
        Self::Plan,
        Self::Episode,
        Self::Summary,
    ];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fact => "fact",
            Self::Preference => "preference",
            Self::Plan => "plan",
            Self::Episode => "episode",
            Self::Summary => "summary",
        }
    }

    /// Reads a kind's name.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    "kind",
                    format!("{s:?} is not a kind; use fact, preference, plan, episode or summary"),
                )
            })
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a memory came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemorySource {
    /// The user, in a conversation.
    #[default]
    User,
    /// The agent itself, in a heartbeat.
    Agent,
    /// An event (a webhook's, a tool's): text from outside, framed as data wherever it
    /// is shown to a model.
    Event,
    /// An operator, with the CLI or the dashboard.
    Operator,
    /// Consolidation (a summary of other memories).
    Consolidation,
}

impl MemorySource {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Agent => "agent",
            Self::Event => "event",
            Self::Operator => "operator",
            Self::Consolidation => "consolidation",
        }
    }
}

/// English words too common to tell texts apart: the offline embedder leaves them out of
/// its vectors and a recall out of its word search, so "what does the user eat" leans
/// on "eat", not on "the".
pub const STOP_WORDS: [&str; 48] = [
    "a", "about", "an", "and", "are", "as", "at", "be", "been", "but", "by", "did", "do", "does",
    "for", "from", "had", "has", "have", "he", "her", "his", "i", "in", "is", "it", "its", "me",
    "my", "of", "on", "or", "our", "she", "so", "that", "the", "their", "they", "this", "to",
    "was", "we", "were", "what", "which", "with", "you",
];

/// The words of a query that tell memories apart: its words, lower-cased, without
/// [`STOP_WORDS`] (all of them, when it has no other word).
pub fn telling_words(query: &str) -> Vec<String> {
    let all: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let telling: Vec<String> = all
        .iter()
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .cloned()
        .collect();
    if telling.is_empty() { all } else { telling }
}

/// A memory's vector: unit length, quantized to signed bytes (×127), and the model that
/// made it. Vectors of different models are never compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Embedding {
    /// The embedding model and its dimensions, e.g. `text-embedding-3-small/1536`.
    pub model: String,
    /// The quantized vector.
    pub values: Vec<i8>,
}

impl Embedding {
    /// Quantizes `vector` (normalized to unit length first) made by `model`.
    pub fn quantize(model: &str, vector: &[f32]) -> Self {
        let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
        let scale = if norm > 0.0 { 127.0 / norm } else { 0.0 };
        Self {
            model: model.to_owned(),
            values: vector
                .iter()
                .map(|v| (v * scale).round().clamp(-127.0, 127.0) as i8)
                .collect(),
        }
    }

    /// The cosine similarity of two quantized vectors of one model (0 when they are of
    /// different sizes or one is all zeros).
    pub fn cosine(a: &[i8], b: &[i8]) -> f32 {
        if a.len() != b.len() {
            return 0.0;
        }
        let (na, nb) = (dot_i8(a, a), dot_i8(b, b));
        if na == 0 || nb == 0 {
            return 0.0;
        }
        dot_i8(a, b) as f32 / ((na as f32).sqrt() * (nb as f32).sqrt())
    }
}

/// The dot product of two quantized vectors (over the shorter's length), 16 bytes at a
/// time: each 16 bytes are read as eight 16-bit lanes, whose high and low bytes are
/// sign-extended by shifts and multiplied pairwise with a widening multiply-add (SSE2's
/// `pmaddwd`; NEON's `smull` and pairwise add). Vectors of up to 66,000 dimensions
/// cannot overflow (127 × 127 × 2 per lane and step).
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    use wide::{i16x8, i32x4};
    let n = a.len().min(b.len());
    let (x, y): (&[u8], &[u8]) = (bytemuck::cast_slice(&a[..n]), bytemuck::cast_slice(&b[..n]));
    let mut acc = i32x4::default();
    let whole = n - n % 16;
    for at in (0..whole).step_by(16) {
        let p: i16x8 = bytemuck::pod_read_unaligned(&x[at..at + 16]);
        let q: i16x8 = bytemuck::pod_read_unaligned(&y[at..at + 16]);
        let (p_high, q_high): (i16x8, i16x8) = (p >> 8u32, q >> 8u32);
        let (p_low, q_low): (i16x8, i16x8) = ((p << 8u32) >> 8u32, (q << 8u32) >> 8u32);
        acc += p_high.dot(q_high);
        acc += p_low.dot(q_low);
    }
    let mut sum: i32 = acc.to_array().iter().sum();
    for i in whole..n {
        sum += i32::from(a[i]) * i32::from(b[i]);
    }
    sum
}

/// A quantized query made ready to be compared with many vectors of its length: its odd
/// and even bytes sign-extended into 16-bit lanes once. Each vector's 16 bytes are then
/// read as eight lanes whose high bytes (masked) and low bytes (shifted up) are 256 times
/// the vector's values, multiplied with the query's by one widening multiply-add each;
/// the sums, kept in 64-bit every 1,024 dimensions, are divided by 256 at the end
/// (exactly: every term is a multiple of 256). Half the work of [`dot_i8`] per vector.
#[derive(Clone, Debug)]
pub struct DotQuery {
    query: Vec<i8>,
    high: Vec<wide::i16x8>,
    low: Vec<wide::i16x8>,
}

impl DotQuery {
    /// Prepares `query`.
    pub fn new(query: &[i8]) -> Self {
        let bytes: &[u8] = bytemuck::cast_slice(query);
        let (mut high, mut low) = (Vec::new(), Vec::new());
        for lanes in bytes.chunks_exact(16) {
            let q: wide::i16x8 = bytemuck::pod_read_unaligned(lanes);
            high.push(q >> 8u32);
            low.push((q << 8u32) >> 8u32);
        }
        Self {
            query: query.to_vec(),
            high,
            low,
        }
    }

    /// The dot product of the query with `v` (over the shorter's length).
    pub fn dot(&self, v: &[i8]) -> i32 {
        use wide::{i16x8, i32x4};
        if v.len() != self.query.len() {
            return dot_i8(&self.query, v);
        }
        let x: &[u8] = bytemuck::cast_slice(v);
        let mask = i16x8::splat(0xFF00u16 as i16);
        let mut total: i64 = 0;
        for start in (0..self.high.len()).step_by(64) {
            let mut acc = i32x4::default();
            for k in start..(start + 64).min(self.high.len()) {
                let p: i16x8 = bytemuck::pod_read_unaligned(&x[k * 16..k * 16 + 16]);
                acc += (p & mask).dot(self.high[k]);
                acc += (p << 8u32).dot(self.low[k]);
            }
            total += acc.to_array().iter().map(|s| i64::from(*s)).sum::<i64>();
        }
        let whole = self.high.len() * 16;
        let tail: i32 = self.query[whole..]
            .iter()
            .zip(&v[whole..])
            .map(|(a, b)| i32::from(*a) * i32::from(*b))
            .sum();
        (total / 256) as i32 + tail
    }
}

/// Most sources of outside text a memory keeps ([`Memory::after_reading`]).
pub const MAX_AFTER_READING: usize = 10;

/// Outside text an agent had read: where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outside {
    /// Its source: `webhook:<id>`, `tool:<name>`, `api`, ….
    pub source: String,
    /// The event that carried it, when it was one of the window's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<super::ids::EventId>,
}

impl Outside {
    /// Whether an event from `source` is outside text (not Pulse's own, nor its
    /// operator's).
    pub fn is_outside(source: &str) -> bool {
        !matches!(source, "system" | "pulse" | "hooks" | "operator" | "cli")
    }
}

impl Memory {
    /// Where it came from, as a prompt's frame and a listing name it.
    pub fn provenance(&self) -> String {
        let base = match self.source {
            MemorySource::User => "kept in a conversation",
            MemorySource::Agent => "kept in a heartbeat",
            MemorySource::Event => "from an event: outside text",
            MemorySource::Operator => "kept by your operator",
            MemorySource::Consolidation => "a summary of older memories",
        };
        match self.read_from().as_slice() {
            [] => base.to_owned(),
            from => format!(
                "{base}, after reading outside text from {}",
                from.join(", ")
            ),
        }
    }

    /// The sources of the outside text read before it was kept, each once.
    pub fn read_from(&self) -> Vec<&str> {
        let mut sources: Vec<&str> = Vec::new();
        for o in &self.after_reading {
            if !sources.contains(&o.source.as_str()) {
                sources.push(&o.source);
            }
        }
        sources
    }
}

/// Something an agent remembers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Its id.
    pub id: MemoryId,
    /// The agent.
    pub agent_id: AgentId,
    /// What to remember.
    pub text: String,
    /// What kind of thing it is.
    #[serde(default)]
    pub kind: MemoryKind,
    /// How much it matters, 0–1.
    #[serde(default = "half")]
    pub importance: f32,
    /// Its weight when last weighed (made or recalled), 0–1: it fades from there.
    #[serde(default = "one")]
    pub weight: f32,
    /// The agent's beat when it was last weighed.
    #[serde(default)]
    pub weighed_beat: u64,
    /// When a recall last returned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recalled_at: Option<Timestamp>,
    /// How many recalls returned it.
    #[serde(default)]
    pub recalls: u32,
    /// Who it came from.
    #[serde(default)]
    pub source: MemorySource,
    /// What it came from: the heartbeat, turn, event or memories' ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ids: Vec<String>,
    /// The heartbeat that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_id: Option<HeartbeatId>,
    /// The outside text its agent had read when it kept it in a heartbeat (the events
    /// of the heartbeat's window from webhooks, tools or the API, and what its tools
    /// found), at most [`MAX_AFTER_READING`]: a note a webhook's text prompted stays
    /// marked as such wherever it is shown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_reading: Vec<Outside>,
    /// Set when consolidation folded it into another memory (a duplicate, or a summary):
    /// it is kept, suspended, and `pulse memories restore` brings it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folded_into: Option<MemoryId>,
    /// When.
    pub created_at: Timestamp,
    /// Its vector, stored beside the record (not in it); `None` until embedded.
    #[serde(skip)]
    pub embedding: Option<Embedding>,
}

fn half() -> f32 {
    0.5
}

fn one() -> f32 {
    1.0
}

/// A memory's standing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryStatus {
    /// Weighty enough to be offered.
    Active,
    /// Faded below [`SUSPENDED_BELOW`], or folded into another memory.
    Suspended,
}

/// One write of a memory that is conditional on the store still holding what was read:
/// a new memory is written only if its id is free; a memory read before is rewritten
/// (all but its vector) only if it still exists with the recall count and the fold it
/// was read with. A forget, a fold or a recall landing between the read and the write
/// therefore stands, and the write is refused instead.
#[derive(Clone, Debug)]
pub struct MemoryChange {
    /// What to write.
    pub memory: Memory,
    /// What the store held when it was read: `None` for a new memory.
    pub read: Option<MemoryRead>,
}

/// What a conditional write of a memory expects the store to still hold.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryRead {
    /// Its recall count: every recall bumps it.
    pub recalls: u32,
    /// The memory it was folded into.
    pub folded_into: Option<MemoryId>,
}

impl MemoryChange {
    /// A new memory, written only if its id is free.
    pub fn new(memory: Memory) -> Self {
        Self { memory, read: None }
    }

    /// `changed`, written over `read` only if the store still holds it as read.
    pub fn of(read: &Memory, changed: Memory) -> Self {
        Self {
            memory: changed,
            read: Some(MemoryRead {
                recalls: read.recalls,
                folded_into: read.folded_into.clone(),
            }),
        }
    }
}

impl MemoryStatus {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Suspended => "suspended",
        }
    }
}

impl Memory {
    /// A new memory of `agent`, weighed at `beat`: a fact of importance 0.5 from the
    /// user, until the caller says otherwise.
    pub fn new(
        id: MemoryId,
        agent: &AgentId,
        text: &str,
        beat: u64,
        now: Timestamp,
    ) -> Result<Self, ValidationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ValidationError::new("text", "a memory needs some text"));
        }
        if text.chars().count() > MAX_MEMORY_CHARS {
            return Err(ValidationError::new(
                "text",
                format!("a memory is at most {MAX_MEMORY_CHARS} characters; keep the gist"),
            ));
        }
        Ok(Self {
            id,
            agent_id: agent.clone(),
            text: text.to_owned(),
            kind: MemoryKind::Fact,
            importance: 0.5,
            weight: 1.0,
            weighed_beat: beat,
            recalled_at: None,
            recalls: 0,
            source: MemorySource::User,
            source_ids: Vec::new(),
            heartbeat_id: None,
            after_reading: Vec::new(),
            folded_into: None,
            created_at: now,
            embedding: None,
        })
    }

    /// An importance as given: 0 to 1.
    pub fn check_importance(importance: f32) -> Result<f32, ValidationError> {
        if (0.0..=1.0).contains(&importance) {
            Ok(importance)
        } else {
            Err(ValidationError::new(
                "importance",
                format!("{importance} is out of range: give 0 to 1"),
            ))
        }
    }

    /// Its weight at the agent's `beat`: halved every `half_life` beats since it was
    /// last weighed.
    pub fn weight_at(&self, beat: u64, half_life: u64) -> f32 {
        let since = beat.saturating_sub(self.weighed_beat) as f32;
        self.weight * 0.5f32.powf(since / half_life.max(1) as f32)
    }

    /// Its standing at `beat`.
    pub fn status_at(&self, beat: u64, half_life: u64) -> MemoryStatus {
        if self.folded_into.is_some() || self.weight_at(beat, half_life) < SUSPENDED_BELOW {
            MemoryStatus::Suspended
        } else {
            MemoryStatus::Active
        }
    }

    /// Weighs it again at `beat`: its faded weight plus `gain` (at most 1).
    pub fn reinforce(&mut self, beat: u64, half_life: u64, gain: f32, now: Timestamp) {
        self.weight = (self.weight_at(beat, half_life) + gain).min(1.0);
        self.weighed_beat = beat;
        self.recalled_at = Some(now);
        self.recalls = self.recalls.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simd_dot_product_is_the_plain_one_for_every_length_and_extreme_values() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 32) as u8 as i8
        };
        for n in [0, 1, 15, 16, 17, 31, 256, 1000, 1536, 3072] {
            let a: Vec<i8> = (0..n).map(|_| next()).collect();
            let b: Vec<i8> = (0..n).map(|_| next()).collect();
            let plain: i32 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| i32::from(*x) * i32::from(*y))
                .sum();
            assert_eq!(dot_i8(&a, &b), plain, "{n} dimensions");
        }
        for n in [0, 1, 15, 16, 17, 256, 1000, 1536, 3072, 4096] {
            let a: Vec<i8> = (0..n).map(|_| next()).collect();
            let b: Vec<i8> = (0..n).map(|_| next()).collect();
            let plain: i32 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| i32::from(*x) * i32::from(*y))
                .sum();
            assert_eq!(DotQuery::new(&a).dot(&b), plain, "{n} dimensions, prepared");
        }
        for (x, y) in [(-128i8, -128i8), (-128, 127), (127, 127), (-127, 127)] {
            let (a, b) = (vec![x; 4096], vec![y; 4096]);
            assert_eq!(
                DotQuery::new(&a).dot(&b),
                i32::from(x) * i32::from(y) * 4096,
                "{x} × {y}, prepared"
            );
        }
        let low = vec![-128i8; 3072];
        let high = vec![127i8; 3072];
        assert_eq!(dot_i8(&low, &low), 128 * 128 * 3072);
        assert_eq!(dot_i8(&low, &high), -128 * 127 * 3072);
        assert_eq!(
            dot_i8(&high[..5], &high),
            127 * 127 * 5,
            "the shorter's length"
        );
    }

    #[test]
    fn a_memory_fades_by_half_each_half_life_and_a_recall_brings_it_back() {
        let now = Timestamp::UNIX_EPOCH;
        let mut m = Memory::new(
            MemoryId::derived(1, &["x"]),
            &AgentId::generate(),
            "the user is vegetarian",
            100,
            now,
        )
        .unwrap();
        assert_eq!(m.weight_at(100, 2880), 1.0);
        assert!((m.weight_at(100 + 2880, 2880) - 0.5).abs() < 1e-6);
        assert_eq!(m.status_at(100 + 3 * 2880, 2880), MemoryStatus::Active);
        assert_eq!(
            m.status_at(100 + 4 * 2880, 2880),
            MemoryStatus::Suspended,
            "1/16 < 0.1"
        );
        m.reinforce(100 + 4 * 2880, 2880, 0.1, now);
        assert!((m.weight - (0.0625 + 0.1)).abs() < 1e-6);
        assert_eq!(m.status_at(100 + 4 * 2880, 2880), MemoryStatus::Active);
        assert_eq!(m.recalls, 1);
    }

    #[test]
    fn quantized_vectors_keep_their_angle() {
        let a = Embedding::quantize("m/3", &[1.0, 2.0, 3.0]);
        let b = Embedding::quantize("m/3", &[2.0, 4.0, 6.1]);
        let c = Embedding::quantize("m/3", &[-3.0, 0.0, 1.0]);
        assert!(Embedding::cosine(&a.values, &b.values) > 0.999);
        assert!(Embedding::cosine(&a.values, &c.values).abs() < 0.01);
        assert_eq!(Embedding::cosine(&a.values, &[1, 2]), 0.0);
    }
}
