//! `pulse bench recall`: one agent with many memories, recalled as the model recalls
//! (top 5 by meaning and words, weight and importance, reinforced).
//!
//! On SQLite, at 1,536 dimensions (what OpenAI's small model gives) and at 256 (the
//! offline embedder): the cold recall that loads the agent's index, then p50/p99 of warm
//! recalls, and the process's resident memory before and after the index was loaded. On
//! an AWS emulator: the DynamoDB requests a warm recall makes (the goal: one read, the
//! memory version). Vectors come from a hashing embedder of the given size: a recall's
//! cost depends on the number and size of the vectors, not on what they mean.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jiff::Timestamp;
use pulse_shared::adapters::aws::{self, AwsClients, DynamoStore};
use pulse_shared::app::connect;
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{Agent, Embedding, Memory, MemoryId, MemoryKind, NewAgent};
use pulse_shared::embed::OfflineEmbedder;
use pulse_shared::engine::memory::{Memories, Recall};
use pulse_shared::ports::{AgentStore, Clock, EmbedError, Embedder, Store, SystemClock};
use serde_json::{Value, json};

use super::hooks::pct;
use super::retention::mib;
use crate::Failure;
use crate::output::{Out, figure};

/// Words the memories are made of: enough that texts differ and words repeat.
const WORDS: [&str; 64] = [
    "coffee",
    "garden",
    "meeting",
    "sister",
    "train",
    "invoice",
    "doctor",
    "piano",
    "tomato",
    "deadline",
    "holiday",
    "bicycle",
    "recipe",
    "budget",
    "laptop",
    "concert",
    "football",
    "library",
    "passport",
    "dentist",
    "birthday",
    "bakery",
    "printer",
    "mountain",
    "river",
    "tennis",
    "novel",
    "podcast",
    "kitchen",
    "museum",
    "allergy",
    "vegetarian",
    "marathon",
    "wedding",
    "airport",
    "hotel",
    "meeting",
    "report",
    "project",
    "client",
    "contract",
    "password",
    "backup",
    "server",
    "release",
    "review",
    "interview",
    "salary",
    "landlord",
    "plumber",
    "neighbour",
    "daughter",
    "son",
    "grandmother",
    "dog",
    "cat",
    "vet",
    "school",
    "teacher",
    "homework",
    "guitar",
    "yoga",
    "swimming",
    "chess",
];

/// A hashing embedder of any size: each word sets a few dimensions, and every text gets
/// a dense tail, so vectors are as dense as a real model's.
struct HashEmbedder {
    model: String,
    dims: usize,
}

impl HashEmbedder {
    fn new(dims: usize) -> Self {
        Self {
            model: format!("bench-hash/{dims}"),
            dims,
        }
    }

    /// Vectors of `dims` under another model's label: memories stored as if that model
    /// had embedded them (a recall's cost depends on their number and size only).
    fn labelled(model: &str, dims: usize) -> Self {
        Self {
            model: model.to_owned(),
            dims,
        }
    }

    fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dims];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for word in text.split_whitespace() {
            let mut h = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            seed ^= h;
            for _ in 0..8 {
                h = xorshift(h);
                v[(h % self.dims as u64) as usize] += 1.0;
            }
        }
        for x in &mut v {
            seed = xorshift(seed);
            *x += ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
        }
        v
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

#[async_trait]
impl Embedder for HashEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.vector(t)).collect())
    }
}

/// The `i`th memory's text: six words from the list, in an order of its own.
pub(super) fn text(i: usize) -> String {
    let mut x = xorshift(i as u64 + 1);
    let mut words = Vec::with_capacity(6);
    for _ in 0..6 {
        x = xorshift(x);
        words.push(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    format!("note {i}: the user mentioned {}", words.join(" "))
}

/// A query: three words from the list.
pub(super) fn query(i: usize) -> String {
    let mut x = xorshift(0xdead_beef ^ (i as u64 + 7));
    let mut words = Vec::with_capacity(3);
    for _ in 0..3 {
        x = xorshift(x);
        words.push(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    format!("what about {}?", words.join(" "))
}

/// Stores `n` memories of `agent`, embedded by `embedder`, in batches.
async fn seed(
    store: &dyn Store,
    agent: &Agent,
    embedder: &dyn Embedder,
    n: usize,
    now: Timestamp,
) -> Result<(), Failure> {
    let kinds = MemoryKind::ALL;
    for start in (0..n).step_by(990) {
        let end = (start + 990).min(n);
        let texts: Vec<String> = (start..end).map(text).collect();
        let vectors = embedder.embed(&texts).await?;
        let batch: Vec<Memory> = texts
            .iter()
            .zip(vectors)
            .enumerate()
            .map(|(k, (t, v))| {
                let i = start + k;
                let mut m = Memory::new(
                    MemoryId::derived(i as u64, &["bench", &i.to_string()]),
                    &agent.id,
                    t,
                    (i / 100) as u64,
                    now,
                )?;
                m.kind = kinds[i % kinds.len()];
                m.importance = (i % 10) as f32 / 10.0;
                m.embedding = Some(Embedding::quantize(embedder.model(), &v));
                Ok(m)
            })
            .collect::<Result<_, pulse_shared::error::ValidationError>>()?;
        store.remember(&batch).await?;
    }
    Ok(())
}

/// The process's resident memory, in bytes (Linux; 0 elsewhere).
pub(super) fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// `recalls` recalls as the model makes them; their times in ms, sorted, and the mean
/// number found.
async fn recall_times(
    memories: &Memories,
    agent: &Agent,
    recalls: usize,
    now: Timestamp,
) -> Result<(Vec<f64>, f64), Failure> {
    let mut times = Vec::with_capacity(recalls);
    let mut found = 0;
    for i in 0..recalls {
        let r = Recall::for_model(&query(i), 1_000 + i as u64);
        let started = Instant::now();
        found += memories.recall(agent, &r, now).await?.len();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok((times, found as f64 / recalls.max(1) as f64))
}

/// One SQLite run: `n` memories stored with `seeder`'s vectors, recalled with
/// `embedder` (the same model: each query is embedded by it, inside the time measured).
async fn on_sqlite(
    n: usize,
    recalls: usize,
    embedder: Arc<dyn Embedder>,
    seeder: &dyn Embedder,
    out: &Out,
) -> Result<Value, Failure> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = Config {
        backend: Backend::Sqlite {
            path: dir.path().join("recall.db"),
        },
        ..Config::defaults()
    };
    let b = connect(&config, clock.clone()).await?;
    let (agent, first) = NewAgent::named("rememberer").create(clock.now())?;
    b.store.create_agent(&agent, &first).await?;
    let started = Instant::now();
    seed(b.store.as_ref(), &agent, seeder, n, clock.now()).await?;
    let seeded = started.elapsed().as_secs_f64();
    let model = embedder.model().to_owned();
    let memories = Memories::new(b.store.clone(), embedder);
    let before = resident();
    let started = Instant::now();
    memories
        .recall(&agent, &Recall::for_model("warm up", 1_000), clock.now())
        .await?;
    let cold = started.elapsed().as_secs_f64() * 1000.0;
    let after = resident();
    let (times, found) = recall_times(&memories, &agent, recalls, clock.now()).await?;
    let (p50, p99) = (pct(&times, 0.5), pct(&times, 0.99));
    figure!(
        out,
        "SQLite, {n} memories embedded with {model} (stored in {seeded:.1} s):"
    );
    figure!(
        out,
        "  cold recall (loads the agent's index): {cold:.0} ms; resident memory {:.0} → {:.0} MiB ({:.0} bytes a memory)",
        mib(before),
        mib(after),
        after.saturating_sub(before) as f64 / n.max(1) as f64
    );
    figure!(
        out,
        "  warm recall, top 5 reinforced, {recalls} queries: p50 {p50:.1} ms, p99 {p99:.1} ms, max {:.1} ms ({found:.1} found each; goal p99 <= 25 ms)",
        times.last().copied().unwrap_or(0.0)
    );
    Ok(json!({
        "memories": n, "model": model, "seed_seconds": seeded, "cold_ms": cold,
        "p50_ms": p50, "p99_ms": p99, "rss_before": before, "rss_after": after,
    }))
}

/// On the emulator: the requests of warm recalls, by operation, per recall.
async fn on_aws(
    n: usize,
    recalls: usize,
    dims: usize,
    endpoint: &str,
    out: &Out,
) -> Result<Value, Failure> {
    let counted = AwsClients::for_emulator(endpoint);
    let setup = AwsClients::for_emulator(endpoint);
    let table = format!(
        "pulse-bench-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    aws::create_table(&setup.dynamodb, &table).await?;
    let clock = SystemClock;
    let setup_store = DynamoStore::new(setup.dynamodb.clone(), &table, Duration::from_secs(30));
    let (agent, first) = NewAgent::named("rememberer").create(clock.now())?;
    setup_store.create_agent(&agent, &first).await?;
    let embedder = Arc::new(HashEmbedder::new(dims));
    seed(&setup_store, &agent, embedder.as_ref(), n, clock.now()).await?;
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        counted.dynamodb.clone(),
        &table,
        Duration::from_secs(30),
    ));
    let memories = Memories::new(store, embedder);
    counted.counter.reset();
    memories
        .recall(&agent, &Recall::for_model("warm up", 1_000), clock.now())
        .await?;
    let cold: BTreeMap<String, u64> = counted.counter.snapshot();
    counted.counter.reset();
    recall_times(&memories, &agent, recalls, clock.now()).await?;
    let warm = counted.counter.snapshot();
    let _ = setup
        .dynamodb
        .delete_table()
        .table_name(&table)
        .send()
        .await;
    figure!(
        out,
        "AWS backend on {endpoint}, {n} memories at {dims} dimensions:"
    );
    figure!(
        out,
        "  cold recall: {}",
        cold.iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let per = |v: u64| v as f64 / recalls.max(1) as f64;
    let mut reads = 0.0;
    for (op, count) in &warm {
        figure!(
            out,
            "  warm recall: {op:<28} {:>6.2} per recall",
            per(*count)
        );
        if !op.contains("Write") && !op.contains("Put") && !op.contains("Update") {
            reads += per(*count);
        }
    }
    figure!(
        out,
        "  reads per warm recall: {reads:.2} (goal <= 1: the memory version); the write is the reinforcement of what was found"
    );
    Ok(json!({
        "memories": n, "dims": dims,
        "cold": cold,
        "warm_per_recall": warm.iter().map(|(k, v)| (k.clone(), per(*v))).collect::<BTreeMap<_, _>>(),
        "reads_per_warm_recall": reads,
    }))
}

/// `pulse bench recall`.
pub(crate) async fn recall(
    memories: usize,
    recalls: usize,
    aws_endpoint: Option<String>,
    aws_memories: usize,
    model: Option<&std::path::Path>,
    out: &Out,
) -> Result<(), Failure> {
    if !(10..=1_000_000).contains(&memories) {
        return Err(Failure::Input(format!(
            "invalid --memories {memories}: use 10 to 1000000"
        )));
    }
    if !(1..=100_000).contains(&recalls) {
        return Err(Failure::Input(format!(
            "invalid --recalls {recalls}: use 1 to 100000"
        )));
    }
    let hash = HashEmbedder::new(1536);
    let wide = on_sqlite(
        memories,
        recalls,
        Arc::new(HashEmbedder::new(1536)),
        &hash,
        out,
    )
    .await?;
    let offline = on_sqlite(
        memories,
        recalls,
        Arc::new(OfflineEmbedder),
        &OfflineEmbedder,
        out,
    )
    .await?;
    let local = match super::model::model_dir(model)? {
        Some(dir) => {
            let seeder = HashEmbedder::labelled(&dir.label, dir.dimensions);
            let embedder = Arc::new(pulse_shared::embed::LocalEmbedder::new(dir));
            Some(on_sqlite(memories, recalls, embedder, &seeder, out).await?)
        }
        None => None,
    };
    let aws = match aws_endpoint {
        Some(url) => {
            Some(on_aws(aws_memories.clamp(10, memories), recalls, 1536, &url, out).await?)
        }
        None => None,
    };
    if out.json {
        out.json_value(&json!({
            "sqlite_1536": wide, "sqlite_offline": offline, "sqlite_local": local, "aws": aws,
        }));
    }
    Ok(())
}
