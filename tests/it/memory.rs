//! Memory that lasts: recall by meaning over all of an agent's memories (a fake
//! embeddings server on loopback maps synonyms together), weights that fade with beats
//! and come back, consolidation's gates and its undoing, an embeddings outage, and a
//! model change; on both backends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use jiff::SignedDuration;
use pulse_shared::domain::{Agent, Memory, MemoryChange, MemoryId, MemoryKind, MemoryStatus};
use pulse_shared::embed::HttpEmbedder;
use pulse_shared::engine::Prices;
use pulse_shared::engine::memory::consolidate::{self, Consolidated};
use pulse_shared::engine::memory::{Memories, Recall};
use pulse_shared::ports::Embedder;
use pulse_tests::fake_llm::{FakeLlm, Scripted};
use pulse_tests::{Backend, Kind, on_both_backends};
use serde_json::{Value, json};

/// Words that mean one thing land on one dimension; the rest are hashed over the others.
const CONCEPTS: [&[&str]; 3] = [
    &[
        "vegetarian",
        "vegan",
        "meat",
        "eat",
        "eats",
        "food",
        "meal",
        "cook",
    ],
    &["dog", "cat", "pet", "puppy", "walk"],
    &["job", "work", "office", "boss", "deadline"],
];

struct Fake {
    failing: AtomicBool,
    texts: AtomicUsize,
    /// A text whose embedding is held until the gate opens, and the signal that it came.
    held: std::sync::Mutex<Option<(String, Arc<tokio::sync::Semaphore>)>>,
    arrived: tokio::sync::Notify,
}

impl Fake {
    /// Holds the next request that embeds `text` until the returned gate gets a permit.
    fn hold(&self, text: &str) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.held.lock().unwrap() = Some((text.to_owned(), gate.clone()));
        gate
    }
}

fn vector(text: &str, dims: usize) -> Vec<f32> {
    let mut v = vec![0f32; dims];
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
    {
        match CONCEPTS.iter().position(|c| c.contains(&w.as_str())) {
            Some(c) => v[c] += 2.0,
            None => {
                let h = w
                    .bytes()
                    .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                v[8 + (h % (dims as u64 - 8)) as usize] += 1.0;
            }
        }
    }
    v
}

async fn embeddings(
    State(f): State<Arc<Fake>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    if f.failing.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "down"})),
        );
    }
    let dims = body["dimensions"].as_u64().unwrap_or(64) as usize;
    let input: Vec<String> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    f.texts.fetch_add(input.len(), Ordering::SeqCst);
    let gate = {
        let held = f.held.lock().unwrap();
        held.as_ref()
            .filter(|(t, _)| input.contains(t))
            .map(|(_, g)| g.clone())
    };
    if let Some(gate) = gate {
        f.arrived.notify_one();
        let _ = gate.acquire().await.unwrap();
    }
    let data: Vec<Value> = input
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"index": i, "embedding": vector(t, dims)}))
        .collect();
    (
        StatusCode::OK,
        Json(json!({"data": data, "model": body["model"]})),
    )
}

/// The fake embeddings API on loopback; its base URL.
async fn fake_embeddings() -> (Arc<Fake>, url::Url) {
    let fake = Arc::new(Fake {
        failing: AtomicBool::new(false),
        texts: AtomicUsize::new(0),
        held: std::sync::Mutex::new(None),
        arrived: tokio::sync::Notify::new(),
    });
    let app = axum::Router::new()
        .route("/v1/embeddings", axum::routing::post(embeddings))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, url.parse().unwrap())
}

fn embedder(url: &url::Url, dims: usize) -> Arc<dyn Embedder> {
    Arc::new(HttpEmbedder::new(
        url.clone(),
        "fake-embed",
        Some(dims),
        None,
        Duration::from_secs(10),
    ))
}

fn memory(b: &Backend, agent: &Agent, n: u64, text: &str, beat: u64) -> Memory {
    Memory::new(
        MemoryId::derived(b.now().as_millisecond() as u64 + n, &[text, &n.to_string()]),
        &agent.id,
        text,
        beat,
        b.now(),
    )
    .unwrap()
}

/// Ten facts and six lunches with Ana (episodes): eight days on, the lunches have faded
/// enough to be summed up, four at a time (a quarter of sixteen).
fn colours_and_lunches(b: &Backend, agent: &Agent) -> Vec<Memory> {
    let colours = [
        "red", "blue", "green", "cyan", "pink", "gold", "grey", "teal", "navy", "lime",
    ];
    let mut batch: Vec<Memory> = (0..10u64)
        .map(|i| {
            let text = format!("{} is a colour", colours[i as usize]);
            memory(b, agent, 200 + i, &text, 0)
        })
        .collect();
    for i in 0..6u64 {
        let mut m = memory(
            b,
            agent,
            100 + i,
            &format!("met Ana for lunch on day {i}"),
            0,
        );
        m.kind = MemoryKind::Episode;
        batch.push(m);
    }
    batch
}

on_both_backends!(
    the_first_of_two_thousand_memories_is_recalled_by_meaning,
    by_meaning
);
async fn by_meaning(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (fake, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    memories
        .remember(&agent.id, vec![memory(&b, &agent, 0, "I'm vegetarian", 0)])
        .await
        .unwrap();
    let filler = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
    ];
    for chunk in 0..10u64 {
        let batch: Vec<Memory> = (0..200u64)
            .map(|i| {
                let n = chunk * 200 + i + 1;
                let text = format!(
                    "note {n}: {} {} {}",
                    filler[(n % 7) as usize],
                    filler[(n % 5) as usize],
                    filler[(n % 3) as usize]
                );
                memory(&b, &agent, n, &text, 0)
            })
            .collect();
        memories.remember(&agent.id, batch).await.unwrap();
    }
    assert_eq!(b.store.all_memories(&agent.id).await.unwrap().len(), 2001);
    assert_eq!(
        fake.texts.load(Ordering::SeqCst),
        2001,
        "each embedded once"
    );
    // Not one word in common: found by meaning, first.
    let found = memories
        .recall(
            &agent,
            &Recall::for_model("what does she not eat?", 10),
            b.now(),
        )
        .await
        .unwrap();
    assert_eq!(
        found[0].memory.text,
        "I'm vegetarian",
        "{:?}",
        found.iter().map(|f| &f.memory.text).collect::<Vec<_>>()
    );
    assert!(
        found[0].similarity > 0.5 && found[0].score > 0.3,
        "{:?}",
        found[0]
    );
    // Recalled: reinforced, in the store too.
    let stored = b
        .store
        .get_memory(&agent.id, &found[0].memory.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.recalls, 1);
    assert_eq!(stored.weighed_beat, 10);
}

on_both_backends!(
    a_memory_fades_with_beats_is_suspended_and_a_close_recall_brings_it_back,
    fading
);
async fn fading(kind: Kind) {
    let b = Backend::new(kind).await;
    // 15-minute beats and a 30-day half-life: 2,880 beats halve a weight.
    let (agent, _) = b.agent("keeper", "15m").await;
    assert_eq!(agent.memory_half_life_beats(), 2_880);
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    let kept = memories
        .remember(
            &agent.id,
            vec![
                memory(&b, &agent, 0, "the dog is called Rex", 0),
                memory(&b, &agent, 1, "the boss wants the deadline moved", 0),
            ],
        )
        .await
        .unwrap();
    // Four half-lives later (beats pass with the clock), both weigh 1/16: suspended.
    b.advance(SignedDuration::from_hours(24 * 120));
    let beat = 4 * 2_880;
    let listed = b.store.all_memories(&agent.id).await.unwrap();
    for m in &listed {
        assert_eq!(m.status_at(beat, 2_880), MemoryStatus::Suspended);
    }
    // A recall close to one brings it back; the other is not found.
    let found = memories
        .recall(&agent, &Recall::for_model("walk puppy", beat), b.now())
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].reactivated);
    assert_eq!(found[0].status, MemoryStatus::Suspended, "as it was found");
    let back = b
        .store
        .get_memory(&agent.id, &kept[0].id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        (back.weight - (1.0 / 16.0 + 0.1)).abs() < 1e-4,
        "{}",
        back.weight
    );
    assert_eq!(back.status_at(beat, 2_880), MemoryStatus::Active);
    let other = b
        .store
        .get_memory(&agent.id, &kept[1].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        other.status_at(beat, 2_880),
        MemoryStatus::Suspended,
        "untouched"
    );
    // A recall by a word only, not close in meaning, shows a suspended memory as it is.
    let found = memories
        .recall(&agent, &Recall::for_model("moved", beat), b.now())
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert!(!found[0].reactivated && found[0].status == MemoryStatus::Suspended);
}

on_both_backends!(
    an_embeddings_outage_leaves_recall_working_by_words_and_a_later_pass_embeds,
    outage
);
async fn outage(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (fake, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    fake.failing.store(true, Ordering::SeqCst);
    let kept = memories
        .remember(
            &agent.id,
            vec![memory(&b, &agent, 0, "green tea every morning", 0)],
        )
        .await
        .unwrap();
    assert!(kept[0].embedding.is_none(), "stored without a vector");
    let found = memories
        .recall(&agent, &Recall::for_model("tea", 1), b.now())
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "found by its words");
    assert_eq!(found[0].similarity, 0.0);
    fake.failing.store(false, Ordering::SeqCst);
    // The next recall embeds it.
    memories
        .recall(&agent, &Recall::for_model("coffee", 2), b.now())
        .await
        .unwrap();
    let stored = b
        .store
        .get_memory(&agent.id, &kept[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.embedding.unwrap().model, "fake-embed/64");
}

on_both_backends!(
    vectors_of_another_model_or_size_are_never_compared_and_reindex_redoes_them,
    model_change
);
async fn model_change(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let before = Memories::new(b.store.clone(), embedder(&url, 64));
    let batch: Vec<Memory> = (0..40)
        .map(|i| memory(&b, &agent, i, &format!("walk the dog at {i}"), 0))
        .collect();
    before.remember(&agent.id, batch).await.unwrap();
    // Dimensions change: nothing of the old vectors is compared.
    let after = Memories::new(b.store.clone(), embedder(&url, 32));
    let found = after
        .recall(
            &agent,
            &Recall {
                reinforce: false,
                ..Recall::for_model("puppy", 1)
            },
            b.now(),
        )
        .await
        .unwrap();
    assert!(
        found.is_empty(),
        "no word in common, no vector of this size: {found:?}"
    );
    // That recall re-embedded BACKFILL of them; reindex does the rest, with progress.
    let mut seen = Vec::new();
    let (done, left) = after
        .reindex(&agent, |n, total| seen.push((n, total)))
        .await
        .unwrap();
    assert_eq!(
        (done, left),
        (40 - pulse_shared::engine::memory::BACKFILL, 0)
    );
    assert_eq!(seen.first(), Some(&(0, 8)));
    assert_eq!(seen.last(), Some(&(8, 8)));
    let models: Vec<String> = b
        .store
        .all_memories(&agent.id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.embedding.unwrap().model)
        .collect();
    assert!(models.iter().all(|m| m == "fake-embed/32"), "{models:?}");
    let found = after
        .recall(&agent, &Recall::for_model("puppy", 1), b.now())
        .await
        .unwrap();
    assert!(!found.is_empty(), "by meaning again, with the new vectors");
}

on_both_backends!(
    consolidation_folds_duplicates_and_old_episodes_within_its_gate_and_restore_undoes_it,
    consolidation
);
async fn consolidation(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    // Twelve active memories: a gate of 3 folds. Four say one thing (3 to fold).
    let mut batch = vec![
        memory(&b, &agent, 0, "The user likes green tea.", 0),
        memory(&b, &agent, 1, "the user likes GREEN tea", 0),
        memory(&b, &agent, 2, "The user likes green tea!", 0),
        memory(&b, &agent, 3, "the user  likes green tea", 0),
    ];
    batch[2].importance = 0.9;
    for i in 4..12 {
        batch.push(memory(&b, &agent, i, &format!("fact number {i}"), 0));
    }
    memories.remember(&agent.id, batch).await.unwrap();
    let offline = pulse_tests::offline_services();
    let done = consolidate::consolidate(
        &memories,
        b.store.as_ref(),
        Some((offline.llm.as_ref(), Prices::builtin())),
        &agent,
        1,
        b.now(),
    )
    .await
    .unwrap();
    assert_eq!(
        (done.active, done.merged, done.held_back, done.summarized),
        (12, 3, 0, 0),
        "{done:?}"
    );
    let all = b.store.all_memories(&agent.id).await.unwrap();
    let keeper = all.iter().find(|m| m.importance == 0.9).unwrap().clone();
    assert!(keeper.folded_into.is_none());
    assert_eq!(
        all.iter()
            .filter(|m| m.folded_into.as_ref() == Some(&keeper.id))
            .count(),
        3
    );
    // A folded memory is not offered to a model.
    let found = memories
        .recall(&agent, &Recall::for_model("green tea", 2), b.now())
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].memory.id, keeper.id);
    // Restore undoes it.
    let restored = consolidate::restore(&memories, b.store.as_ref(), &agent, &keeper.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(restored.restored.len(), 3);
    assert!(
        b.store
            .all_memories(&agent.id)
            .await
            .unwrap()
            .iter()
            .all(|m| m.folded_into.is_none())
    );

    // With a model: old faded episodes become a summary; its tokens are spent today.
    let (dreamer, _) = b.agent("dreamer", "15m").await;
    let llm = FakeLlm::start().await;
    let discord = pulse_tests::fake_discord::FakeDiscord::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    memories
        .remember(&dreamer.id, colours_and_lunches(&b, &dreamer))
        .await
        .unwrap();
    // Eight days and two half-lives later, the episodes have faded under 0.3.
    b.advance(SignedDuration::from_hours(24 * 8));
    llm.script([Scripted::text("The user often has lunch with Ana.")]);
    let done: Consolidated = consolidate::consolidate(
        &memories,
        b.store.as_ref(),
        Some((services.llm.as_ref(), Prices::builtin())),
        &dreamer,
        2 * 2_880 + 1,
        b.now(),
    )
    .await
    .unwrap();
    assert_eq!(done.active, 16, "{done:?}");
    assert_eq!(done.summarized, 4, "the gate: a quarter of 16 is 4");
    assert_eq!(done.summaries.len(), 1);
    assert_eq!(done.tokens, 120, "{done:?}");
    let summary = b
        .store
        .get_memory(&dreamer.id, &done.summaries[0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(summary.kind, MemoryKind::Summary);
    assert_eq!(summary.text, "The user often has lunch with Ana.");
    assert_eq!(summary.source_ids.len(), 4);
    let today = pulse_shared::engine::budget::spent_today(b.store.as_ref(), &dreamer, b.now())
        .await
        .unwrap();
    assert_eq!(today.spent, 120, "counted against the daily budget");
    let restored = consolidate::restore(&memories, b.store.as_ref(), &dreamer, &summary.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(restored.restored.len(), 4);
    assert_eq!(restored.removed, Some(summary.id.clone()));
    assert!(
        b.store
            .get_memory(&dreamer.id, &summary.id)
            .await
            .unwrap()
            .is_none()
    );
}

on_both_backends!(
    the_daily_pass_queues_each_active_agents_consolidation_and_the_worker_runs_it,
    daily_consolidation
);
async fn daily_consolidation(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (resting, _) = b.agent("resting", "15m").await;
    let lifecycle = pulse_shared::engine::Lifecycle::new(
        b.store.clone(),
        b.clock.clone(),
        pulse_tests::settings(),
        None,
    );
    lifecycle.pause(&resting.id).await.unwrap();
    let memories = Memories::new(
        b.store.clone(),
        Arc::new(pulse_shared::embed::OfflineEmbedder),
    );
    let mut batch = vec![
        memory(&b, &agent, 0, "The user walks at dawn.", 0),
        memory(&b, &agent, 1, "the user walks at DAWN", 0),
    ];
    for i in 2..8 {
        batch.push(memory(&b, &agent, i, &format!("fact number {i}"), 0));
    }
    memories.remember(&agent.id, batch.clone()).await.unwrap();
    let queued = pulse_shared::engine::memory::queue_consolidations(
        b.store.as_ref(),
        b.queue.as_ref(),
        b.now(),
    )
    .await
    .unwrap();
    assert_eq!(queued, 1, "the paused agent waits");
    let worker = b.connected().worker(
        b.clock.clone(),
        &pulse_tests::settings(),
        &pulse_tests::offline_services(),
    );
    let ran = b.drain(&worker).await;
    assert!(ran >= 1, "the worker ran the consolidation");
    let folded: Vec<Memory> = b
        .store
        .all_memories(&agent.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.folded_into.is_some())
        .collect();
    assert_eq!(folded.len(), 1, "one duplicate folded: {folded:?}");
    assert_eq!(folded[0].folded_into.as_ref(), Some(&batch[0].id));
}

on_both_backends!(
    being_shown_in_a_prompt_is_not_being_recalled,
    shown_not_recalled
);
async fn shown_not_recalled(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    let kept = memories
        .remember(
            &agent.id,
            vec![
                memory(&b, &agent, 0, "the dog is called Rex", 0),
                memory(&b, &agent, 1, "she eats no meat", 0),
            ],
        )
        .await
        .unwrap();
    let stored = |id: MemoryId| {
        let store = b.store.clone();
        let agent = agent.id.clone();
        async move { store.get_memory(&agent, &id).await.unwrap().unwrap() }
    };
    // Every turn about the dog shows its memory, and reinforces nothing.
    for beat in [10, 20, 30] {
        let known = pulse_shared::engine::memory::known(
            &memories,
            &agent,
            "walk the dog",
            beat,
            1_000,
            b.now(),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(known.contains("Rex"), "{known}");
    }
    let rex = stored(kept[0].id.clone()).await;
    assert_eq!((rex.recalls, rex.weighed_beat), (0, 0), "{rex:?}");
    assert_eq!(rex.weight, kept[0].weight);

    // Four half-lives on, both are suspended: being shown would not bring one back, and
    // a suspended memory is not shown.
    let beat = 4 * 2_880;
    let known = pulse_shared::engine::memory::known(
        &memories,
        &agent,
        "walk the puppy",
        beat,
        1_000,
        b.now(),
    )
    .await
    .unwrap();
    assert_eq!(known, None, "nothing active to show");
    let rex = stored(kept[0].id.clone()).await;
    assert_eq!(rex.status_at(beat, 2_880), MemoryStatus::Suspended);
    // An explicit recall does both: reinforces, and brings it back.
    let found = memories
        .recall(&agent, &Recall::for_model("walk puppy", beat), b.now())
        .await
        .unwrap();
    assert!(found[0].reactivated, "{found:?}");
    let rex = stored(kept[0].id.clone()).await;
    assert_eq!(rex.recalls, 1);
    assert_eq!(rex.status_at(beat, 2_880), MemoryStatus::Active);
}

on_both_backends!(
    a_reinforcement_never_undoes_a_forget_or_a_fold_nor_another_recalls,
    reinforcement_races
);
async fn reinforcement_races(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    let kept = memories
        .remember(
            &agent.id,
            vec![
                memory(&b, &agent, 0, "the dog is called Rex", 0),
                memory(&b, &agent, 1, "she eats no meat", 0),
                memory(&b, &agent, 2, "the boss is called Ana", 0),
            ],
        )
        .await
        .unwrap();
    let stored = |id: &MemoryId| {
        let (store, agent, id) = (b.store.clone(), agent.id.clone(), id.clone());
        async move { store.get_memory(&agent, &id).await.unwrap() }
    };
    // A recall read the first two; before its write lands, the first is forgotten and
    // the second folded into the third by a consolidation.
    let read: Vec<Memory> = kept[..2]
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.reinforce(10, 2_880, 0.1, b.now());
            m
        })
        .collect();
    assert!(b.store.forget(&agent.id, &kept[0].id).await.unwrap());
    let mut folded = stored(&kept[1].id).await.unwrap();
    folded.folded_into = Some(kept[2].id.clone());
    b.store.remember(&[folded]).await.unwrap();
    let missed = b.store.reinforce(&read).await.unwrap();
    assert_eq!(missed, vec![kept[0].id.clone()], "the forgotten one");
    assert_eq!(stored(&kept[0].id).await, None, "forgotten stays forgotten");
    let back = stored(&kept[1].id).await.unwrap();
    assert_eq!(
        back.folded_into.as_ref(),
        Some(&kept[2].id),
        "the fold stands"
    );
    assert_eq!((back.recalls, back.weighed_beat), (1, 10));
    assert_eq!(back.weight, read[1].weight);
    assert_eq!(back.text, "she eats no meat");
    // The same stale read written twice: the second finds the count moved on.
    assert_eq!(
        b.store.reinforce(&read[1..]).await.unwrap(),
        vec![kept[1].id.clone()]
    );
    assert_eq!(stored(&kept[1].id).await.unwrap().recalls, 1);

    // Two workers, each with its index cached, recall the same memory: neither
    // overwrites the other's reinforcement.
    let (one, two) = (
        Memories::new(b.store.clone(), embedder(&url, 64)),
        Memories::new(b.store.clone(), embedder(&url, 64)),
    );
    async fn recall(m: &Memories, agent: &Agent, now: jiff::Timestamp) -> MemoryId {
        let found = m
            .recall(
                agent,
                &Recall::for_model("who is my boss at work?", 20),
                now,
            )
            .await
            .unwrap();
        found[0].memory.id.clone()
    }
    assert_eq!(recall(&one, &agent, b.now()).await, kept[2].id);
    assert_eq!(recall(&two, &agent, b.now()).await, kept[2].id);
    // `one` still holds the copy it read before `two`'s recall.
    assert_eq!(recall(&one, &agent, b.now()).await, kept[2].id);
    let boss = stored(&kept[2].id).await.unwrap();
    assert_eq!(boss.recalls, 3, "three recalls, three reinforcements");
    assert_eq!(boss.weighed_beat, 20);
}

on_both_backends!(
    a_memory_is_rewritten_only_as_it_was_read_all_or_none_and_a_vector_touches_nothing_else,
    conditional_writes
);
async fn conditional_writes(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    let kept = memories
        .remember(
            &agent.id,
            vec![
                memory(&b, &agent, 0, "the dog is called Rex", 0),
                memory(&b, &agent, 1, "the cat is called Tom", 0),
                memory(&b, &agent, 2, "the boss is called Ana", 0),
            ],
        )
        .await
        .unwrap();
    let stored = |id: &MemoryId| {
        let (store, agent, id) = (b.store.clone(), agent.id.clone(), id.clone());
        async move { store.get_memory(&agent, &id).await.unwrap() }
    };
    let folded = |m: &Memory, into: &Memory| {
        let mut f = m.clone();
        f.folded_into = Some(into.id.clone());
        MemoryChange::of(m, f)
    };
    let version = b.store.memory_version(&agent.id).await.unwrap();

    // A recall lands after the read: a fold of that read is refused, and the one beside
    // it in the same write is not made either.
    let mut recalled = kept[0].clone();
    recalled.reinforce(5, 2_880, 0.1, b.now());
    assert!(b.store.reinforce(&[recalled]).await.unwrap().is_empty());
    assert!(
        !b.store
            .change(
                &agent.id,
                &[folded(&kept[1], &kept[2]), folded(&kept[0], &kept[2])]
            )
            .await
            .unwrap()
    );
    assert_eq!(
        stored(&kept[1].id).await.unwrap().folded_into,
        None,
        "all or none"
    );
    assert_eq!(
        stored(&kept[0].id).await.unwrap().recalls,
        1,
        "the recall stands"
    );
    assert_eq!(b.store.memory_version(&agent.id).await.unwrap(), version);

    // A forget lands after the read: the change does not bring the memory back.
    assert!(b.store.forget(&agent.id, &kept[1].id).await.unwrap());
    assert!(
        !b.store
            .change(&agent.id, &[folded(&kept[1], &kept[2])])
            .await
            .unwrap()
    );
    assert_eq!(stored(&kept[1].id).await, None, "forgotten stays forgotten");

    // A fold lands after the read: a second fold of the same read is refused.
    let fresh = stored(&kept[0].id).await.unwrap();
    assert!(
        b.store
            .change(&agent.id, &[folded(&fresh, &kept[2])])
            .await
            .unwrap()
    );
    let again = folded(&fresh, &kept[1]);
    assert!(!b.store.change(&agent.id, &[again]).await.unwrap());
    let now_folded = stored(&kept[0].id).await.unwrap();
    assert_eq!(now_folded.folded_into.as_ref(), Some(&kept[2].id));
    assert!(
        now_folded.embedding.is_some(),
        "a change keeps the stored vector"
    );
    // Restoring from what is stored now works.
    let mut back = now_folded.clone();
    back.folded_into = None;
    assert!(
        b.store
            .change(&agent.id, &[MemoryChange::of(&now_folded, back)])
            .await
            .unwrap()
    );
    assert_eq!(stored(&kept[0].id).await.unwrap().folded_into, None);

    // A new memory is written only if its id is free.
    let mut twin = kept[2].clone();
    twin.text = "the boss is called Bob".to_owned();
    assert!(
        !b.store
            .change(&agent.id, &[MemoryChange::new(twin)])
            .await
            .unwrap()
    );
    assert_eq!(
        stored(&kept[2].id).await.unwrap().text,
        "the boss is called Ana"
    );
    let new = memory(&b, &agent, 3, "the fish is called Nemo", 0);
    assert!(
        b.store
            .change(&agent.id, &[MemoryChange::new(new.clone())])
            .await
            .unwrap()
    );
    assert_eq!(
        stored(&new.id).await.unwrap().text,
        "the fish is called Nemo"
    );
    assert!(b.store.memory_version(&agent.id).await.unwrap() > version);

    // Vectors alone: a forgotten memory is not brought back, a fold stands.
    let mut with_vector = vec![kept[1].clone(), now_folded.clone()];
    for m in &mut with_vector {
        m.embedding = Some(pulse_shared::domain::Embedding {
            model: "other".to_owned(),
            values: vec![1; 8],
        });
        m.folded_into = None;
    }
    let fold_again = folded(&stored(&kept[0].id).await.unwrap(), &kept[2]);
    assert!(b.store.change(&agent.id, &[fold_again]).await.unwrap());
    let missed = b.store.set_vectors(&agent.id, &with_vector).await.unwrap();
    assert_eq!(missed, vec![kept[1].id.clone()]);
    assert_eq!(stored(&kept[1].id).await, None);
    let vectored = stored(&kept[0].id).await.unwrap();
    assert_eq!(vectored.embedding.unwrap().model, "other");
    assert_eq!(
        vectored.folded_into.as_ref(),
        Some(&kept[2].id),
        "the fold stands"
    );
}

on_both_backends!(
    a_forget_made_while_a_recall_embeds_or_a_consolidation_thinks_is_never_undone,
    forget_races
);
async fn forget_races(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (fake, url) = fake_embeddings().await;
    let memories = Arc::new(Memories::new(b.store.clone(), embedder(&url, 64)));
    // Kept while the embedder was down: no vector yet, so a recall backfills it.
    let late = memory(&b, &agent, 0, "the dog is called Rex", 0);
    b.store.remember(std::slice::from_ref(&late)).await.unwrap();
    let gate = fake.hold("the dog is called Rex");
    let recall = tokio::spawn({
        let (memories, agent) = (memories.clone(), agent.clone());
        async move {
            memories
                .recall(
                    &agent,
                    &Recall::for_model("what is the cat called?", 1),
                    jiff::Timestamp::now(),
                )
                .await
                .unwrap()
        }
    });
    // The backfill is embedding it when another process forgets it.
    fake.arrived.notified().await;
    assert!(b.store.forget(&agent.id, &late.id).await.unwrap());
    gate.add_permits(1);
    recall.await.unwrap();
    assert_eq!(
        b.store.get_memory(&agent.id, &late.id).await.unwrap(),
        None,
        "the backfill does not bring it back"
    );

    // A consolidation reads six faded episodes and asks the model for a summary; one
    // of them is forgotten while it waits.
    let (dreamer, _) = b.agent("dreamer", "15m").await;
    let llm = FakeLlm::start().await;
    let discord = pulse_tests::fake_discord::FakeDiscord::start().await;
    let services = pulse_tests::fake_services(&llm, &discord);
    let kept = memories
        .remember(&dreamer.id, colours_and_lunches(&b, &dreamer))
        .await
        .unwrap();
    b.advance(SignedDuration::from_hours(24 * 8));
    llm.script([
        Scripted::text("The user often has lunch with Ana."),
        Scripted::text("The user often has lunch with Ana."),
    ]);
    llm.hold();
    let pass = |memories: Arc<Memories>| {
        let (store, llm, dreamer, now) = (
            b.store.clone(),
            services.llm.clone(),
            dreamer.clone(),
            b.now(),
        );
        async move {
            consolidate::consolidate(
                &memories,
                store.as_ref(),
                Some((llm.as_ref(), Prices::builtin())),
                &dreamer,
                2 * 2_880 + 1,
                now,
            )
            .await
            .unwrap()
        }
    };
    let first = tokio::spawn(pass(memories.clone()));
    llm.wait_for(1).await;
    let episodes: Vec<&Memory> = kept
        .iter()
        .filter(|m| m.kind == MemoryKind::Episode)
        .collect();
    assert!(b.store.forget(&dreamer.id, &episodes[0].id).await.unwrap());
    llm.release();
    let done = first.await.unwrap();
    assert_eq!(
        (done.summarized, done.changed_meanwhile),
        (0, 4),
        "{done:?}"
    );
    assert!(done.no_summary.unwrap().contains("changed"));
    assert_eq!(
        b.store
            .get_memory(&dreamer.id, &episodes[0].id)
            .await
            .unwrap(),
        None,
        "forgotten stays forgotten"
    );
    let all = b.store.all_memories(&dreamer.id).await.unwrap();
    assert_eq!(all.len(), 15, "no summary written: {all:?}");
    assert!(all.iter().all(|m| m.folded_into.is_none()));
    // The next pass sums up what is left.
    let done = pass(memories.clone()).await;
    assert_eq!(done.summarized, 3, "{done:?}");
    assert_eq!(done.changed_meanwhile, 0);
}

/// Runs the agent's `recall` tool with `input` at `beat`, as a heartbeat does: its
/// answer, or the refusal's words.
async fn recall_tool(
    b: &Backend,
    memories: &Memories,
    agent: &Agent,
    input: Value,
    beat: u64,
) -> Result<Value, String> {
    let call = pulse_shared::domain::ToolUse {
        id: "call_1".into(),
        name: "recall".into(),
        input,
    };
    let cx = pulse_shared::engine::memory::Context {
        source: pulse_shared::domain::MemorySource::Agent,
        heartbeat: None,
        source_ids: Vec::new(),
        after_reading: Vec::new(),
        beat,
    };
    pulse_shared::engine::memory::run(
        memories,
        agent,
        &call,
        MemoryId::derived(b.now().as_millisecond() as u64, &["recall", "call_1"]),
        &cx,
        b.now(),
    )
    .await
    .expect("recall is a memory tool")
    .map_err(|refusal| refusal.to_string())
}

on_both_backends!(
    the_recall_tool_answers_with_titles_and_times_within_its_size_and_one_memory_by_id,
    recall_tool_answers
);
async fn recall_tool_answers(kind: Kind) {
    let b = Backend::new(kind).await;
    let (agent, _) = b.agent("keeper", "15m").await;
    let (_, url) = fake_embeddings().await;
    let memories = Memories::new(b.store.clone(), embedder(&url, 64));
    let first_line = "The user went vegetarian in March and asked for a weekly meal plan she can cook after a long day";
    assert!(first_line.chars().count() > 80);
    let plan = memory(
        &b,
        &agent,
        0,
        &format!("{first_line}\nMonday: lentils\nTuesday: tofu"),
        0,
    );
    // Longer than a memory may be made now (one kept before the limit): stored as it is.
    let mut huge = memory(&b, &agent, 1, "vegetarian food diary", 0);
    huge.text = format!(
        "vegetarian food diary: {}",
        "tofu, rice and beans; ".repeat(500)
    )
    .chars()
    .take(9_000)
    .collect();
    let long = |n: u64| {
        let text = format!("vegetarian meal {n}: {}", "lentils ".repeat(480));
        memory(&b, &agent, n, &text, 0)
    };
    let kept = memories
        .remember(
            &agent.id,
            vec![
                plan,
                huge,
                long(2),
                long(3),
                memory(&b, &agent, 4, "she is vegetarian since March", 0),
                memory(&b, &agent, 5, "the dog is called Rex", 0),
                memory(&b, &agent, 6, "the boss moved the deadline", 0),
            ],
        )
        .await
        .unwrap();
    assert_eq!(kept[1].text.chars().count(), 9_000);

    // By query: within 8,000 characters, the two long meals not both in; each memory
    // with its title, kind, status, weight, match and when it was last recalled.
    let answer = recall_tool(&b, &memories, &agent, json!({"query": "vegetarian"}), 10)
        .await
        .unwrap();
    let size = answer.to_string().chars().count();
    assert!(size <= 8_000, "{size} characters");
    let found = answer["memories"].as_array().unwrap();
    assert!(!found.is_empty(), "{answer}");
    let ids: Vec<&str> = found.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let longs = [kept[2].id.as_str(), kept[3].id.as_str()];
    assert!(
        ids.iter().filter(|i| longs.contains(i)).count() <= 1,
        "two memories of 3,900 characters do not both fit: {answer}"
    );
    // What the recall reinforced is what the answer carries, no more.
    for m in &kept {
        let stored = b.store.get_memory(&agent.id, &m.id).await.unwrap().unwrap();
        assert_eq!(
            stored.recalls == 1,
            ids.contains(&m.id.as_str()),
            "{}: {} recalls, shown: {answer}",
            m.id,
            stored.recalls
        );
    }
    for m in found {
        let title = m["title"].as_str().unwrap();
        assert!(title.chars().count() <= 81 && !title.contains('\n'), "{m}");
        for field in ["id", "text", "kind", "status", "weight", "score"] {
            assert!(!m[field].is_null(), "{field} in {m}");
        }
        assert_eq!(m["last_recalled_ago"], "never", "not recalled before: {m}");
        assert_eq!(m["status"], "active");
    }
    let shown_plan = found
        .iter()
        .find(|m| m["id"] == kept[0].id.as_str())
        .unwrap_or_else(|| panic!("the meal plan is among the best: {answer}"));
    let cut: String = first_line.chars().take(80).collect();
    assert_eq!(shown_plan["title"], format!("{}…", cut.trim_end()));
    assert_eq!(shown_plan["text"], kept[0].text.as_str(), "the text whole");

    // By id: the 9,000-character memory, cut only because it is over 8,000, saying so.
    let whole = recall_tool(&b, &memories, &agent, json!({"id": kept[1].id}), 10)
        .await
        .unwrap();
    assert!(whole.to_string().chars().count() <= 8_000);
    let text = whole["memory"]["text"].as_str().unwrap();
    let (head, note) = text.rsplit_once("… (cut:").expect("cut, saying so");
    assert!(note.contains("longer than one answer can carry"), "{note}");
    assert!(
        kept[1].text.starts_with(head) && head.chars().count() > 7_000,
        "{} characters kept",
        head.chars().count()
    );
    // An ordinary one whole, as it is: reading it is not recalling it.
    let she = recall_tool(&b, &memories, &agent, json!({"id": kept[4].id}), 10)
        .await
        .unwrap();
    let m = &she["memory"];
    assert_eq!(m["text"], "she is vegetarian since March");
    assert_eq!(m["title"], "she is vegetarian since March");
    assert_eq!(
        (m["kind"].as_str(), m["status"].as_str()),
        (Some("fact"), Some("active"))
    );
    assert_eq!(m["last_recalled_ago"], "just now", "by the recall above");
    assert!(m.get("score").is_none(), "{m}");
    let stored = b
        .store
        .get_memory(&agent.id, &kept[4].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.recalls, 1, "the query's recall only");

    // An id that is not the agent's, or not an id, is refused; so is asking both ways,
    // or neither.
    let unknown = MemoryId::derived(1, &["nobody kept this"]);
    let refused = recall_tool(&b, &memories, &agent, json!({"id": unknown}), 10)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        format!("no memory {unknown} is yours; recall by query to find one")
    );
    let (other, _) = b.agent("other", "15m").await;
    let refused = recall_tool(&b, &memories, &other, json!({"id": kept[4].id}), 10)
        .await
        .unwrap_err();
    assert!(refused.contains("is yours"), "{refused}");
    let refused = recall_tool(&b, &memories, &agent, json!({"id": "rex"}), 10)
        .await
        .unwrap_err();
    assert!(refused.contains("not a memory id"), "{refused}");
    let refused = recall_tool(
        &b,
        &memories,
        &agent,
        json!({"query": "tofu", "id": kept[4].id}),
        10,
    )
    .await
    .unwrap_err();
    assert!(refused.contains("not both"), "{refused}");
    let refused = recall_tool(&b, &memories, &agent, json!({}), 10)
        .await
        .unwrap_err();
    assert!(
        refused.contains("\"query\"") && refused.contains("\"id\""),
        "{refused}"
    );

    // Four half-lives and 120 days on: by id, a faded memory shows as suspended and
    // when it was recalled; a close recall brings another back, marked so.
    b.advance(SignedDuration::from_hours(24 * 120));
    let beat = 4 * 2_880;
    let later = recall_tool(&b, &memories, &agent, json!({"id": kept[4].id}), beat)
        .await
        .unwrap();
    assert_eq!(later["memory"]["status"], "suspended", "{later}");
    assert_eq!(later["memory"]["last_recalled_ago"], "4 months ago");
    let back = recall_tool(&b, &memories, &agent, json!({"query": "walk puppy"}), beat)
        .await
        .unwrap();
    let rex = &back["memories"][0];
    assert_eq!(rex["id"], kept[5].id.as_str(), "{back}");
    assert_eq!(
        (rex["status"].as_str(), rex["reactivated"].as_bool()),
        (Some("active"), Some(true)),
        "{back}"
    );
    assert_eq!(rex["last_recalled_ago"], "never");
}
