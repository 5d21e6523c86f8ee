//! `pulse bench memory`: memory quality on LoCoMo (Maharana et al., ACL 2024), a public
//! benchmark of very long conversations, read from the file given (its licence, CC
//! BY-NC 4.0, keeps it out of this project).
//!
//! The protocol, so anyone can run it again: each of the benchmark's conversations is
//! one agent on a scratch embedded store. Each of its dialogue turns becomes one memory,
//! `[8 May 2023] Caroline: …` (a shared photo's caption after the words), kept on the day
//! its session was held, at the beat of its session (1, 2, …). Each question is then
//! recalled as a model recalls, one beat after the last session, returning 10 memories
//! without reinforcing them (so no question changes the next one's answer). A question's
//! recall@k is the share of its annotated evidence turns among the first k memories;
//! the figures are their means, per category and overall. No model reads the answers:
//! retrieval alone is measured, and the run is the same every time.
//!
//! The categories are the benchmark's: 1 multi-hop, 2 temporal, 3 open-domain, 4
//! single-hop, 5 adversarial. The adversarial questions ask about something the *other*
//! speaker said; finding that turn is what lets an agent answer "that was Melanie", so
//! they are scored the same way, but shown apart and left out of the overall figure. A
//! question whose evidence names no turn of its conversation is left out and counted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;
use pulse_shared::app::connect;
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{Memory, MemoryId, NewAgent};
use pulse_shared::embed::OfflineEmbedder;
use pulse_shared::engine::memory::index::Mix;
use pulse_shared::engine::memory::{Memories, Recall};
use pulse_shared::ports::{Clock, EmbedError, Embedder, SystemClock};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Failure;
use crate::output::{Out, figure};

/// The benchmark's question categories, by number.
pub(crate) const CATEGORIES: [(u8, &str); 5] = [
    (1, "multi-hop"),
    (2, "temporal"),
    (3, "open-domain"),
    (4, "single-hop"),
    (5, "adversarial"),
];

/// The category left out of the overall figure (see the module's protocol).
const ADVERSARIAL: u8 = 5;

/// Memories a question recalls: enough for recall@10.
const RECALLED: usize = 10;

/// One conversation of the benchmark, as its file holds it.
#[derive(Deserialize)]
pub(crate) struct Sample {
    #[serde(default)]
    sample_id: String,
    conversation: serde_json::Map<String, Value>,
    qa: Vec<Question>,
}

/// One question, with the dialogue ids of its evidence (`D1:3`: session 1, turn 3).
#[derive(Deserialize)]
pub(crate) struct Question {
    question: String,
    #[serde(default)]
    evidence: Vec<String>,
    category: u8,
}

/// A dialogue turn, kept as one memory.
struct Turn {
    id: String,
    text: String,
    session: u64,
    at: Timestamp,
}

impl Sample {
    /// Its dialogue turns, session by session, each with its session's date (or
    /// `fallback` when the date does not read).
    fn turns(&self, fallback: Timestamp) -> Vec<Turn> {
        let mut out = Vec::new();
        for session in 1u64.. {
            let Some(said) = self.conversation.get(&format!("session_{session}")) else {
                // Sessions are numbered from 1 without gaps, but for a date without turns.
                if self
                    .conversation
                    .contains_key(&format!("session_{session}_date_time"))
                {
                    continue;
                }
                break;
            };
            let when = self.conversation[&format!("session_{session}_date_time")]
                .as_str()
                .unwrap_or_default();
            let at = session_date(when).unwrap_or(fallback);
            let day = at.strftime("%-d %B %Y").to_string();
            for turn in said.as_array().into_iter().flatten() {
                let field = |k: &str| turn[k].as_str().unwrap_or_default().trim();
                let mut text = format!("[{day}] {}: {}", field("speaker"), field("text"));
                if !field("blip_caption").is_empty() {
                    text.push_str(&format!(" (shares a photo: {})", field("blip_caption")));
                }
                out.push(Turn {
                    id: field("dia_id").to_owned(),
                    text,
                    session,
                    at,
                });
            }
        }
        out
    }
}

/// A session's date as the benchmark writes it, `1:56 pm on 8 May, 2023`.
fn session_date(s: &str) -> Option<Timestamp> {
    let s = s.trim().replace("am on", "AM on").replace("pm on", "PM on");
    jiff::fmt::strtime::parse("%-I:%M %p on %-d %B, %Y", &s)
        .ok()?
        .to_datetime()
        .ok()?
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// The evidence ids a question names, as the benchmark writes them: most are one id a
/// string, some several in one (`D8:6; D9:17`).
fn evidence(q: &Question) -> Vec<String> {
    q.evidence
        .iter()
        .flat_map(|e| e.split([';', ',', ' ']))
        .map(str::trim)
        .filter(|e| e.starts_with('D') && e.contains(':'))
        .map(str::to_owned)
        .collect()
}

/// The share of `wanted` among the first `k` of `found`.
fn recall_at(found: &[String], wanted: &[String], k: usize) -> f64 {
    if wanted.is_empty() {
        return 0.0;
    }
    let top = &found[..found.len().min(k)];
    let hit = wanted.iter().filter(|w| top.contains(w)).count();
    hit as f64 / wanted.len() as f64
}

/// Recall@5 and @10 summed over the questions of a category, and how many.
#[derive(Clone, Copy, Default)]
struct Sums {
    at5: f64,
    at10: f64,
    questions: usize,
}

impl Sums {
    fn add(&mut self, at5: f64, at10: f64) {
        self.at5 += at5;
        self.at10 += at10;
        self.questions += 1;
    }

    fn merge(&mut self, other: Sums) {
        self.at5 += other.at5;
        self.at10 += other.at10;
        self.questions += other.questions;
    }

    /// Mean recall@5 and @10, in percent.
    fn percent(self) -> (f64, f64) {
        let n = self.questions.max(1) as f64;
        (100.0 * self.at5 / n, 100.0 * self.at10 / n)
    }
}

/// What one way of recalling scored.
struct Scored {
    name: String,
    by_category: BTreeMap<u8, Sums>,
    left_out: usize,
    memories: usize,
    seconds: f64,
}

/// Runs every conversation's questions against its memories, recalled through the
/// engine with `embedder`.
async fn score(
    samples: &[Sample],
    name: String,
    embedder: Arc<dyn Embedder>,
    mix: Mix,
) -> Result<Scored, Failure> {
    let started = Instant::now();
    let clock = SystemClock;
    let mut scored = Scored {
        name,
        by_category: BTreeMap::new(),
        left_out: 0,
        memories: 0,
        seconds: 0.0,
    };
    for sample in samples {
        let dir = tempfile::tempdir()?;
        let config = Config {
            backend: Backend::Sqlite {
                path: dir.path().join("memory.db"),
            },
            ..Config::defaults()
        };
        let b = connect(&config, Arc::new(SystemClock)).await?;
        let (agent, first) = NewAgent::named("locomo").create(clock.now())?;
        b.store.create_agent(&agent, &first).await?;
        let memories = Memories::new(b.store.clone(), embedder.clone()).with_mix(mix);
        let turns = sample.turns(clock.now());
        // Memory ids are derived from the dialogue ids, and read back to them.
        let mut by_memory: HashMap<MemoryId, String> = HashMap::new();
        let mut last_session = 0;
        for batch in turns.chunks(64) {
            let mut kept = Vec::with_capacity(batch.len());
            for t in batch {
                let id = MemoryId::derived(
                    t.at.as_millisecond().max(0) as u64,
                    &[&sample.sample_id, &t.id],
                );
                let m = Memory::new(id.clone(), &agent.id, &t.text, t.session, t.at)?;
                by_memory.insert(id, t.id.clone());
                last_session = last_session.max(t.session);
                kept.push(m);
            }
            memories.remember(&agent.id, kept).await?;
        }
        scored.memories += turns.len();
        for q in &sample.qa {
            let Some(wanted) = wanted(q, &turns) else {
                scored.left_out += 1;
                continue;
            };
            let recall = Recall {
                query: q.question.clone(),
                beat: last_session + 1,
                limit: RECALLED,
                max_chars: usize::MAX,
                reinforce: false,
                skip_folded: true,
            };
            let found: Vec<String> = memories
                .recall(&agent, &recall, clock.now())
                .await?
                .into_iter()
                .filter_map(|f| by_memory.get(&f.memory.id).cloned())
                .collect();
            scored.by_category.entry(q.category).or_default().add(
                recall_at(&found, &wanted, 5),
                recall_at(&found, &wanted, 10),
            );
        }
    }
    scored.seconds = started.elapsed().as_secs_f64();
    Ok(scored)
}

/// The dialogue ids of `q`'s evidence among `turns`; `None` when it names none of them.
fn wanted(q: &Question, turns: &[Turn]) -> Option<Vec<String>> {
    let wanted: Vec<String> = evidence(q)
        .into_iter()
        .filter(|e| turns.iter().any(|t| t.id == *e))
        .collect();
    (!wanted.is_empty()).then_some(wanted)
}

/// Every conversation's questions against its turns by the model's vectors alone: the
/// 10 turns nearest each question (cosine), no words, no weights — what the model finds
/// by itself, beside the engine's hybrid.
async fn score_vectors(
    samples: &[Sample],
    name: String,
    embedder: &dyn Embedder,
) -> Result<Scored, Failure> {
    let started = Instant::now();
    let mut scored = Scored {
        name,
        by_category: BTreeMap::new(),
        left_out: 0,
        memories: 0,
        seconds: 0.0,
    };
    let now = SystemClock.now();
    for sample in samples {
        let turns = sample.turns(now);
        let texts: Vec<String> = turns.iter().map(|t| t.text.clone()).collect();
        let vectors = embedder
            .embed(&texts)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        scored.memories += turns.len();
        for q in &sample.qa {
            let Some(wanted) = wanted(q, &turns) else {
                scored.left_out += 1;
                continue;
            };
            let query = embedder
                .embed(std::slice::from_ref(&q.question))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut ranked: Vec<(f32, usize)> = vectors
                .iter()
                .enumerate()
                .map(|(i, v)| (v.iter().zip(&query[0]).map(|(a, b)| a * b).sum(), i))
                .collect();
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
            let found: Vec<String> = ranked
                .iter()
                .take(RECALLED)
                .map(|(_, i)| turns[*i].id.clone())
                .collect();
            scored.by_category.entry(q.category).or_default().add(
                recall_at(&found, &wanted, 5),
                recall_at(&found, &wanted, 10),
            );
        }
    }
    scored.seconds = started.elapsed().as_secs_f64();
    Ok(scored)
}

/// An embedder that keeps what it computed, so the vector-only run reuses the hybrid
/// run's vectors instead of embedding every turn again.
struct Cached {
    inner: Arc<dyn Embedder>,
    seen: std::sync::Mutex<HashMap<String, Vec<f32>>>,
}

#[async_trait::async_trait]
impl Embedder for Cached {
    fn model(&self) -> &str {
        self.inner.model()
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let missing: Vec<String> = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let mut missing: Vec<String> = texts
                .iter()
                .filter(|t| !seen.contains_key(*t))
                .cloned()
                .collect();
            missing.sort();
            missing.dedup();
            missing
        };
        let computed = self.inner.embed(&missing).await?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(missing.into_iter().zip(computed));
        Ok(texts.iter().map(|t| seen[t].clone()).collect())
    }
}

/// Reads the benchmark's file: a JSON array of conversations.
fn read(path: &Path) -> Result<Vec<Sample>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::Input(format!(
            "cannot read {}: {e}. LoCoMo's locomo10.json is published by its authors (github.com/snap-research/LoCoMo, data/locomo10.json, CC BY-NC 4.0): give its path with --locomo",
            path.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        Failure::Input(format!(
            "{} is not LoCoMo's locomo10.json (a JSON array of conversations with `conversation` and `qa`): {e}",
            path.display()
        ))
    })
}

/// `pulse bench memory`.
pub(crate) async fn memory(
    locomo: &Path,
    conversations: Option<usize>,
    model: Option<&Path>,
    mixes: &[Mix],
    out: &Out,
) -> Result<(), Failure> {
    let mut samples = read(locomo)?;
    if let Some(n) = conversations {
        samples.truncate(n);
    }
    let questions: usize = samples.iter().map(|s| s.qa.len()).sum();
    figure!(
        out,
        "LoCoMo ({}): {} conversation(s), {questions} questions; each dialogue turn one memory, each question recalled for 10 (no reinforcement)",
        locomo.display(),
        samples.len()
    );
    let mut runs = vec![
        score(
            &samples,
            "offline words".into(),
            Arc::new(OfflineEmbedder),
            Mix::default(),
        )
        .await?,
    ];
    match super::model::model_dir(model)? {
        Some(dir) => {
            figure!(
                out,
                "the local model: {} ({})",
                dir.label,
                dir.path.display()
            );
            let local = Arc::new(Cached {
                inner: Arc::new(pulse_shared::embed::LocalEmbedder::new(dir)),
                seen: std::sync::Mutex::new(HashMap::new()),
            });
            for mix in mixes {
                let name = format!("local hybrid {mix}");
                runs.push(score(&samples, name, local.clone(), *mix).await?);
            }
            runs.push(score_vectors(&samples, "local vectors".into(), local.as_ref()).await?);
        }
        None => figure!(
            out,
            "no local model (give --model DIR, or `pulse models install minilm`): words only"
        ),
    }
    figure!(
        out,
        "{:<20} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "recall@5/@10 %",
        "multi-hop",
        "temporal",
        "open-domain",
        "single-hop",
        "overall 1-4",
        "adversarial"
    );
    let mut rows = Vec::new();
    for run in &runs {
        let cell = |s: Sums| {
            let (a, b) = s.percent();
            format!("{a:.1}/{b:.1}")
        };
        let of = |c: u8| run.by_category.get(&c).copied().unwrap_or_default();
        let mut overall = Sums::default();
        for (c, _) in CATEGORIES.iter().filter(|(c, _)| *c != ADVERSARIAL) {
            overall.merge(of(*c));
        }
        figure!(
            out,
            "{:<20} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            run.name,
            cell(of(1)),
            cell(of(2)),
            cell(of(3)),
            cell(of(4)),
            cell(overall),
            cell(of(ADVERSARIAL))
        );
        figure!(
            out,
            "  {} memories, {} questions scored, {} left out (evidence naming no turn), {:.1} s",
            run.memories,
            overall.questions + of(ADVERSARIAL).questions,
            run.left_out,
            run.seconds
        );
        let categories: Vec<Value> = CATEGORIES
            .iter()
            .map(|(c, name)| {
                let (at5, at10) = of(*c).percent();
                json!({"category": c, "name": name, "questions": of(*c).questions,
                       "recall_at_5": at5, "recall_at_10": at10})
            })
            .collect();
        let (at5, at10) = overall.percent();
        rows.push(json!({
            "recall": run.name, "memories": run.memories, "left_out": run.left_out,
            "seconds": run.seconds, "categories": categories,
            "overall": {"questions": overall.questions, "recall_at_5": at5, "recall_at_10": at10},
        }));
    }
    if out.json {
        out.json_value(&json!({
            "benchmark": "LoCoMo", "conversations": samples.len(), "questions": questions,
            "runs": rows,
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_reads_one_or_several_ids_and_recall_counts_the_share_found() {
        let q = Question {
            question: "?".into(),
            evidence: vec!["D8:6; D9:17".into(), "D1:3".into(), "".into()],
            category: 1,
        };
        let wanted = evidence(&q);
        assert_eq!(wanted, ["D8:6", "D9:17", "D1:3"]);
        let found: Vec<String> = ["D1:3", "D2:1", "D8:6", "D4:4", "D5:5", "D9:17"]
            .map(String::from)
            .to_vec();
        assert!((recall_at(&found, &wanted, 5) - 2.0 / 3.0).abs() < 1e-9);
        assert!((recall_at(&found, &wanted, 10) - 1.0).abs() < 1e-9);
        assert_eq!(recall_at(&found, &[], 10), 0.0);
    }

    #[test]
    fn a_session_s_date_reads_as_the_benchmark_writes_it() {
        assert_eq!(
            session_date("1:56 pm on 8 May, 2023").unwrap().to_string(),
            "2023-05-08T13:56:00Z"
        );
        assert_eq!(
            session_date("10:37 am on 27 June, 2023")
                .unwrap()
                .to_string(),
            "2023-06-27T10:37:00Z"
        );
        assert_eq!(session_date("someday"), None);
    }
}
