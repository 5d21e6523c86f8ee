//! `pulse bench embed`: the local embedder on this machine — how long its model takes to
//! load and how much memory it adds, how many memories a second it embeds in batches of
//! 32, and how long one query's embedding takes (what a recall adds to its own time).

use std::path::Path;
use std::time::Instant;

use pulse_shared::embed::{BATCH, LocalEmbedder};
use pulse_shared::ports::Embedder;
use serde_json::json;

use super::hooks::pct;
use super::model::model_dir;
use super::recall::{query, resident, text};
use super::retention::mib;
use crate::Failure;
use crate::output::{Out, figure};

/// `pulse bench embed`.
pub(crate) async fn embed(
    model: Option<&Path>,
    memories: usize,
    queries: usize,
    out: &Out,
) -> Result<(), Failure> {
    let Some(dir) = model_dir(model)? else {
        return Err(Failure::Input(
            "no local model to measure: give --model DIR, or install one with `pulse models install minilm`".into(),
        ));
    };
    if !(BATCH..=1_000_000).contains(&memories) || !(1..=100_000).contains(&queries) {
        return Err(Failure::Input(format!(
            "invalid --memories {memories} or --queries {queries}: use {BATCH} to 1000000 memories and 1 to 100000 queries"
        )));
    }
    figure!(
        out,
        "the local model {} ({})",
        dir.label,
        dir.path.display()
    );
    let embedder = LocalEmbedder::new(dir.clone());
    let before = resident();
    let started = Instant::now();
    embedder.load().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let load_ms = started.elapsed().as_secs_f64() * 1000.0;
    let loaded = resident();
    figure!(
        out,
        "  load (weights and tokenizer read, model built): {load_ms:.0} ms; resident memory {:.0} → {:.0} MiB (+{:.0} MiB; goal <= 200 MB added)",
        mib(before),
        mib(loaded),
        mib(loaded.saturating_sub(before))
    );
    let texts: Vec<String> = (0..memories).map(text).collect();
    let started = Instant::now();
    for chunk in texts.chunks(BATCH) {
        embedder
            .embed(chunk)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_second = memories as f64 / seconds;
    let after = resident();
    figure!(
        out,
        "  {memories} memories in batches of {BATCH}: {seconds:.1} s, {per_second:.0} memories/s; resident memory now {:.0} MiB (+{:.0} MiB over the start)",
        mib(after),
        mib(after.saturating_sub(before))
    );
    let mut times = Vec::with_capacity(queries);
    for i in 0..queries {
        let q = [query(i)];
        let started = Instant::now();
        embedder
            .embed(&q)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let (p50, p99) = (pct(&times, 0.5), pct(&times, 0.99));
    figure!(
        out,
        "  one query's embedding, {queries} queries: p50 {p50:.1} ms, p99 {p99:.1} ms"
    );
    if out.json {
        out.json_value(&json!({
            "model": dir.label, "load_ms": load_ms, "rss_before": before, "rss_loaded": loaded,
            "rss_after": after, "memories": memories, "batch": BATCH, "seconds": seconds,
            "memories_per_second": per_second, "query_p50_ms": p50, "query_p99_ms": p99,
        }));
    }
    Ok(())
}
