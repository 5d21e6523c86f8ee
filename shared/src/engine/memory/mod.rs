//! The agent's memories as the model uses them, in heartbeats and in conversation: the
//! `remember` and `recall` tools, and the memories a prompt carries (those most related
//! to what is in front of the agent).
//!
//! [`Memories`] keeps them and recalls them by meaning and by words ([`index`] says how
//! a recall scores); the domain's [`Memory`] says how they fade and come back.

mod book;
pub mod consolidate;
pub mod index;

pub use book::{BACKFILL, CACHE_BYTES, Found, GAIN, Memories, REACTIVATE_ABOVE, Recall};

use crate::engine::transcript::{Refusal, ToolAnswer};
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::domain::{
    Agent, AgentId, Heartbeat, HeartbeatId, Memory, MemoryId, MemoryKind, MemorySource,
    MemoryStatus, OutgoingTask, ToolSpec, ToolUse,
};
use crate::error::{StoreError, chain};
use crate::ports::{SessionQueue, Store};

/// Most tokens (estimated at 4 characters a token) of the memories a prompt carries.
pub const PROMPT_TOKENS: usize = 500;

/// Most characters of JSON in a `recall` answer: the lowest-ranked memories are left
/// out past it, and a memory too long alone is cut.
pub const RECALL_ANSWER_CHARS: usize = 8_000;

/// Most characters of the memories' texts a recall by query returns: the answer's bound
/// less room for each of five memories' other fields (about 450 characters of JSON), so
/// what the recall reinforces is what the answer carries ([`bounded`] leaves out more only
/// when texts full of quotes and line breaks grow in JSON).
const RECALL_TEXT_CHARS: usize = RECALL_ANSWER_CHARS - 5 * 600;

/// Most characters of a memory's title (its first line), before the "…" of a cut.
pub const TITLE_CHARS: usize = 80;

/// What ends a memory's text cut to fit a recall by query.
const CUT_FOUND: &str = "… (cut: recall by id for all of it)";

/// What ends a memory's text cut to fit a recall by id.
const CUT_WHOLE: &str = "… (cut: this memory is longer than one answer can carry)";

/// The `remember` and `recall` tools, with `later` saying where a memory is seen again.
pub fn specs(later: &str) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "remember".to_owned(),
            description: format!(
                "Store a fact or note worth keeping (about the user, a plan, a preference), to recall {later}. Write it in the third person (\"Ana is vegetarian\"), so it is found however it is asked about. Give its kind (fact, preference, plan, episode) and importance (0 to 1) when you can."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "kind": {"type": "string", "enum": ["fact", "preference", "plan", "episode"]},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1}
                },
                "required": ["text"]
            }),
        },
        ToolSpec {
            name: "recall".to_owned(),
            description: "Search all your memories by meaning and by words ({\"query\": …}): the best matches, each with its id, title, kind, status (a suspended one has faded; recalling it brings it back), weight, score and when it was last recalled. Or read one whole: {\"id\": \"mem_…\"}.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"query": {"type": "string"}, "id": {"type": "string"}}
            }),
        },
    ]
}

/// Where a tool call runs: who keeps a memory, in which beat.
#[derive(Clone, Debug)]
pub struct Context {
    /// Who a memory kept here comes from.
    pub source: MemorySource,
    /// The heartbeat, if one runs the call.
    pub heartbeat: Option<HeartbeatId>,
    /// The ids a memory kept here comes from (the heartbeat, the turn).
    pub source_ids: Vec<String>,
    /// The outside text read before (see [`Memory::after_reading`]).
    pub after_reading: Vec<crate::domain::Outside>,
    /// The agent's beat.
    pub beat: u64,
}

/// Runs `remember` or `recall` for `agent`; `None` for another tool. A memory's id is
/// `id` (derived from the run and the call, so a rerun stores it once).
pub async fn run(
    memories: &Memories,
    agent: &Agent,
    call: &ToolUse,
    id: MemoryId,
    cx: &Context,
    now: Timestamp,
) -> Option<ToolAnswer> {
    Some(match call.name.as_str() {
        "remember" => remember(memories, agent, call, id, cx, now).await,
        "recall" => recall(memories, agent, &call.input, cx.beat, now).await,
        _ => return None,
    })
}

/// Runs `recall`: by `query`, the best matches (reinforced, as a recall is) within
/// [`RECALL_ANSWER_CHARS`]; by `id`, that one memory whole (nothing reinforced).
async fn recall(
    memories: &Memories,
    agent: &Agent,
    input: &Value,
    beat: u64,
    now: Timestamp,
) -> ToolAnswer {
    let given = |name: &str| match input.get(name) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(_) => true,
    };
    match (given("query"), given("id")) {
        (true, true) => Err(Refusal(
            "give either \"query\" (to search) or \"id\" (to read one memory whole), not both"
                .to_owned(),
        )),
        (false, false) => Err(Refusal(
            "give \"query\" (what to look for) or \"id\" (a memory's id, mem_…)".to_owned(),
        )),
        (true, false) => {
            let query = text_arg(input, "query")?;
            let found = memories
                .recall(
                    agent,
                    &Recall {
                        max_chars: RECALL_TEXT_CHARS,
                        ..Recall::for_model(&query, beat)
                    },
                    now,
                )
                .await
                .map_err(|e| Refusal(chain(&e)))?;
            Ok(bounded(
                found.iter().map(|f| shown(f, now)).collect(),
                RECALL_ANSWER_CHARS,
            ))
        }
        (false, true) => {
            let raw = text_arg(input, "id")?;
            let id = MemoryId::parse(&raw).map_err(|_| {
                Refusal(format!(
                    "{} is not a memory id (mem_ and 26 letters and digits); recall by query to find one",
                    crate::domain::quote_input(&raw)
                ))
            })?;
            let memory = memories
                .get(&agent.id, &id)
                .await
                .map_err(|e| Refusal(chain(&e)))?
                .ok_or_else(|| {
                    Refusal(format!(
                        "no memory {id} is yours; recall by query to find one"
                    ))
                })?;
            let half_life = agent.memory_half_life_beats();
            let v = described(
                &memory,
                memory.status_at(beat, half_life),
                memory.weight_at(beat, half_life),
                memory.recalled_at,
                now,
            );
            Ok(whole(v, RECALL_ANSWER_CHARS))
        }
    }
}

async fn remember(
    memories: &Memories,
    agent: &Agent,
    call: &ToolUse,
    id: MemoryId,
    cx: &Context,
    now: Timestamp,
) -> ToolAnswer {
    let text = text_arg(&call.input, "text")?;
    let mut memory = Memory::new(id, &agent.id, &text, cx.beat, now).map_err(|e| e.to_string())?;
    if let Some(kind) = call.input.get("kind").and_then(Value::as_str) {
        memory.kind = MemoryKind::parse(kind).map_err(|e| e.to_string())?;
    }
    if let Some(i) = call.input.get("importance") {
        let i = i
            .as_f64()
            .ok_or_else(|| "\"importance\" is a number from 0 to 1".to_owned())?;
        memory.importance = Memory::check_importance(i as f32).map_err(|e| e.to_string())?;
    }
    memory.source = cx.source;
    memory.source_ids = cx.source_ids.clone();
    memory.heartbeat_id = cx.heartbeat.clone();
    memory.after_reading = cx.after_reading.clone();
    match memories.remember(&agent.id, vec![memory]).await {
        Ok(kept) => Ok(json!({"remembered": true, "memory_id": kept[0].id})),
        Err(e) => Err(chain(&e).into()),
    }
}

/// A found memory as the model reads it at `now`: [`described`], with how well it
/// matched, and `"reactivated": true` when this recall brought it back.
fn shown(f: &Found, now: Timestamp) -> Value {
    let status = if f.reactivated {
        MemoryStatus::Active
    } else {
        f.status
    };
    let mut v = described(&f.memory, status, f.weight, f.recalled_before, now);
    v["score"] = json!(round2(f.score));
    if f.reactivated {
        v["reactivated"] = json!(true);
    }
    v
}

/// A memory as the model reads it at `now`, with its `status` and `weight` then and
/// when a recall last returned it (`recalled`, before the one answered now): its id, a
/// title (its first line), its text, and when it was kept, both as times and in words.
fn described(
    m: &Memory,
    status: MemoryStatus,
    weight: f32,
    recalled: Option<Timestamp>,
    now: Timestamp,
) -> Value {
    let mut v = json!({
        "id": m.id,
        "title": title(&m.text),
        "text": m.text,
        "kind": m.kind,
        "status": status,
        "weight": round2(weight),
        "importance": round2(m.importance),
        "last_recalled": recalled,
        "last_recalled_ago": recalled.map_or_else(|| "never".to_owned(), |t| ago(t, now)),
        "kept_at": m.created_at,
        "kept_ago": ago(m.created_at, now),
        "source": m.source.as_str(),
    });
    if let Some(into) = &m.folded_into {
        v["folded_into"] = json!(into);
    }
    v
}

/// A memory's title: its first line, cut to [`TITLE_CHARS`] characters (at a character
/// boundary) with "…" when longer.
pub fn title(text: &str) -> String {
    let line = text.trim_start().lines().next().unwrap_or("").trim_end();
    if line.chars().count() <= TITLE_CHARS {
        return line.to_owned();
    }
    let head: String = line.chars().take(TITLE_CHARS).collect();
    format!("{}…", head.trim_end())
}

/// How long before `now` `then` was, in words: "just now" (under a minute, or later
/// than `now`), "5 minutes ago", "1 hour ago", "3 days ago", "2 months ago" (of 30
/// days), "1 year ago" (of 365).
pub fn ago(then: Timestamp, now: Timestamp) -> String {
    const MINUTE: i64 = 60;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    const MONTH: i64 = 30 * DAY;
    const YEAR: i64 = 365 * DAY;
    let secs = now.as_second().saturating_sub(then.as_second());
    let (n, unit) = match secs {
        s if s < MINUTE => return "just now".to_owned(),
        s if s < HOUR => (s / MINUTE, "minute"),
        s if s < DAY => (s / HOUR, "hour"),
        s if s < MONTH => (s / DAY, "day"),
        s if s < YEAR => (s / MONTH, "month"),
        s => (s / YEAR, "year"),
    };
    if n == 1 {
        format!("1 {unit} ago")
    } else {
        format!("{n} {unit}s ago")
    }
}

/// How many characters `v` takes as JSON.
fn json_chars(v: &Value) -> usize {
    v.to_string().chars().count()
}

/// A recall's answer: `memories` (each [`shown`], best first) within `max` characters of
/// JSON. The lowest-ranked are left out while it is longer, counted in `"more"`; a memory
/// still too long alone has its text cut, saying so.
fn bounded(mut memories: Vec<Value>, max: usize) -> Value {
    let found = memories.len();
    loop {
        let more = found - memories.len();
        let mut answer = json!({"memories": memories});
        if more > 0 {
            answer["more"] = json!(more);
        }
        let size = json_chars(&answer);
        if size <= max {
            return answer;
        }
        if memories.len() > 1 {
            memories.pop();
            continue;
        }
        let cut = match memories.first_mut() {
            Some(only) => shortened(only, size - max, CUT_FOUND),
            None => false,
        };
        if !cut {
            // Nothing left to cut.
            return answer;
        }
    }
}

/// A recall by id's answer: `{"memory": memory}`, its text cut only when the answer
/// would be longer than `max` characters of JSON, saying so.
fn whole(mut memory: Value, max: usize) -> Value {
    loop {
        let answer = json!({"memory": memory});
        let size = json_chars(&answer);
        if size <= max || !shortened(&mut memory, size - max, CUT_WHOLE) {
            return answer;
        }
    }
}

/// Cuts the `"text"` of `memory` by `over` characters of JSON (at a character
/// boundary), ending it with `note`; `false` when there is no text left to cut.
fn shortened(memory: &mut Value, over: usize, note: &str) -> bool {
    let Some(text) = memory.get("text").and_then(Value::as_str) else {
        return false;
    };
    let (kept, noted) = match text.strip_suffix(note) {
        Some(head) => (head, true),
        None => (text, false),
    };
    if kept.is_empty() {
        return false;
    }
    let mut to_go = over + if noted { 0 } else { note.chars().count() };
    let mut end = kept.len();
    for (at, c) in kept.char_indices().rev() {
        if to_go == 0 {
            break;
        }
        to_go = to_go.saturating_sub(json_len(c));
        end = at;
    }
    let cut = format!("{}{note}", &kept[..end]);
    memory["text"] = Value::String(cut);
    true
}

/// How many characters `c` takes in a JSON string (`"`, `\\` and control characters
/// are escaped).
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if u32::from(c) < 0x20 => 6,
        _ => 1,
    }
}

fn round2(x: f32) -> f64 {
    (f64::from(x) * 100.0).round() / 100.0
}

/// A tool's string argument, trimmed and not empty.
pub(crate) fn text_arg(input: &Value, name: &str) -> Result<String, Refusal> {
    input
        .get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Refusal(format!("give a non-empty string \"{name}\"")))
}

/// What the agent knows that bears on `about` (the new messages, the window's events),
/// for a prompt: the memories a recall of it finds first, then, while
/// room is left, what it knows best whatever the subject (its weightiest memories: the
/// user's name, that they are vegetarian), within `tokens` (estimated at 4 characters a
/// token), one frame each ([`super::framing`]: a memory's text is data, whoever wrote
/// it), labelled with where it came from. `None` without memories.
///
/// Being shown is not being recalled: nothing shown here is reinforced, and a suspended
/// memory stays suspended and out of the prompt, so memories on a recurring subject still fade when the agent
/// never recalls them (the `recall` tool does). What was shown is logged by id.
pub async fn known(
    memories: &Memories,
    agent: &Agent,
    about: &str,
    beat: u64,
    tokens: usize,
    now: Timestamp,
) -> Result<Option<String>, StoreError> {
    let recall = Recall {
        query: about.to_owned(),
        beat,
        limit: 20,
        max_chars: tokens * 4,
        reinforce: false,
        skip_folded: true,
    };
    let mut shown: Vec<Memory> = memories
        .recall(agent, &recall, now)
        .await?
        .into_iter()
        .filter(|f| f.status == MemoryStatus::Active)
        .map(|f| f.memory)
        .collect();
    for m in memories.weightiest(agent, beat, 20).await? {
        if !shown.iter().any(|s| s.id == m.id) {
            shown.push(m);
        }
    }
    let text = frames(&shown, tokens);
    if !shown.is_empty() {
        let ids: Vec<&str> = shown.iter().map(|m| m.id.as_str()).collect();
        tracing::info!(agent_id = %agent.id, shown = shown.len(), memories = ?ids, "memories shown in the prompt");
    }
    Ok(text)
}

/// The beat `agent` is at: its newest heartbeat's, or the one before it when that one
/// has not started yet (0 before its first heartbeat). Weights fade by it.
pub async fn beat_now(store: &dyn Store, agent: &AgentId) -> Result<u64, StoreError> {
    let newest = store.heartbeats_page(agent, None, 1).await?;
    Ok(newest.first().map_or(0, Heartbeat::beat_reached))
}

/// Queues the day's consolidation of every agent that is not paused (a paused agent's
/// memories do not fade: its beats stand still), each in the agent's own session so the
/// worker runs it after what was queued before; a second call the same day is dropped by
/// the queue's deduplication within its window. Returns how many were queued.
pub async fn queue_consolidations(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let day = now.strftime("%Y-%m-%d").to_string();
    let tasks: Vec<OutgoingTask> = store
        .list_agents()
        .await?
        .iter()
        .filter(|a| !a.is_paused())
        .map(|a| OutgoingTask::consolidate(&a.id, &day))
        .collect();
    for chunk in tasks.chunks(10) {
        queue.send(chunk).await?;
    }
    Ok(tasks.len())
}

/// Frames of `memories`, in order, while they fit in `tokens`.
pub fn frames(memories: &[Memory], tokens: usize) -> Option<String> {
    let mut left = tokens;
    let mut lines = Vec::new();
    for m in memories {
        let from = format!("memory ({})", m.provenance());
        let line = super::framing::frame(&from, &m.text);
        let cost = line.chars().count().div_ceil(4) + 1;
        if cost > left {
            continue;
        }
        left -= cost;
        lines.push(line);
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_arguments_must_be_non_empty_strings() {
        assert_eq!(
            text_arg(&json!({"thought": " hi "}), "thought").unwrap(),
            "hi"
        );
        assert!(text_arg(&json!({"thought": ""}), "thought").is_err());
        assert!(text_arg(&json!({"thought": 3}), "thought").is_err());
    }

    #[test]
    fn a_title_is_the_first_line_cut_to_80_characters() {
        assert_eq!(title("The user is vegetarian"), "The user is vegetarian");
        assert_eq!(title("Groceries\n- tofu\n- rice"), "Groceries");
        assert_eq!(title(""), "");
        let long = "é".repeat(79) + "abc";
        let t = title(&format!("{long}\nsecond line"));
        assert_eq!(t.chars().count(), 81, "{t}");
        assert!(t.starts_with(&"é".repeat(79)) && t.ends_with("a…"), "{t}");
        let exact = "x".repeat(80);
        assert_eq!(title(&exact), exact, "80 characters are not cut");
    }

    #[test]
    fn ago_says_how_long_in_words() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let before = |secs: i64| Timestamp::from_second(1_800_000_000 - secs).unwrap();
        assert_eq!(ago(before(0), now), "just now");
        assert_eq!(ago(before(59), now), "just now");
        assert_eq!(ago(before(-3_600), now), "just now", "a time to come");
        assert_eq!(ago(before(60), now), "1 minute ago");
        assert_eq!(ago(before(5 * 60 + 30), now), "5 minutes ago");
        assert_eq!(ago(before(3_600), now), "1 hour ago");
        assert_eq!(ago(before(3 * 3_600 + 59), now), "3 hours ago");
        assert_eq!(ago(before(86_400), now), "1 day ago");
        assert_eq!(ago(before(3 * 86_400), now), "3 days ago");
        assert_eq!(ago(before(29 * 86_400), now), "29 days ago");
        assert_eq!(ago(before(30 * 86_400), now), "1 month ago");
        assert_eq!(ago(before(65 * 86_400), now), "2 months ago");
        assert_eq!(ago(before(365 * 86_400), now), "1 year ago");
        assert_eq!(ago(before(3 * 365 * 86_400), now), "3 years ago");
    }

    fn made(n: usize, text: &str) -> Value {
        json!({"id": format!("mem_{n}"), "title": title(text), "text": text, "kind": "fact"})
    }

    #[test]
    fn a_recall_answer_leaves_out_the_lowest_ranked_past_its_size() {
        let small: Vec<Value> = (0..3).map(|n| made(n, "a short note")).collect();
        let answer = bounded(small.clone(), RECALL_ANSWER_CHARS);
        assert_eq!(answer, json!({"memories": small}), "all fit: no \"more\"");

        let big = "word ".repeat(600);
        let many: Vec<Value> = (0..5).map(|n| made(n, &big)).collect();
        let answer = bounded(many, RECALL_ANSWER_CHARS);
        assert!(json_chars(&answer) <= RECALL_ANSWER_CHARS, "{answer}");
        let kept = answer["memories"].as_array().unwrap();
        assert_eq!(kept.len(), 2, "3,000 characters each: two fit");
        assert_eq!(kept[0]["id"], "mem_0", "the best are kept");
        assert_eq!(kept[1]["id"], "mem_1");
        assert_eq!(answer["more"], 3);
        assert_eq!(kept[0]["text"], big.as_str(), "kept whole");
    }

    #[test]
    fn a_memory_too_long_alone_is_cut_saying_so() {
        // Quotes and line breaks take two characters of JSON each.
        let huge = "\"quoted\"\n".repeat(1_000);
        let answer = bounded(
            vec![made(0, &huge), made(1, "a short note")],
            RECALL_ANSWER_CHARS,
        );
        assert!(json_chars(&answer) <= RECALL_ANSWER_CHARS, "{answer}");
        assert!(
            json_chars(&answer) > RECALL_ANSWER_CHARS - 100,
            "cut no more than it must"
        );
        assert_eq!(answer["more"], 1);
        let text = answer["memories"][0]["text"].as_str().unwrap();
        assert!(text.ends_with(CUT_FOUND), "{text}");
        assert!(huge.starts_with(text.strip_suffix(CUT_FOUND).unwrap()));

        let by_id = whole(made(0, &huge), RECALL_ANSWER_CHARS);
        assert!(json_chars(&by_id) <= RECALL_ANSWER_CHARS);
        assert!(
            by_id["memory"]["text"]
                .as_str()
                .unwrap()
                .ends_with(CUT_WHOLE)
        );
        let short = whole(made(1, "a short note"), RECALL_ANSWER_CHARS);
        assert_eq!(short, json!({"memory": made(1, "a short note")}));
    }

    #[test]
    fn a_found_memory_shows_its_title_and_when_it_was_last_recalled() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut memory = Memory::new(
            MemoryId::derived(1, &["t"]),
            &AgentId::generate(),
            "Plans for May\nvisit Ana",
            0,
            Timestamp::from_second(1_800_000_000 - 3 * 86_400).unwrap(),
        )
        .unwrap();
        memory.recalled_at = Some(now);
        let found = Found {
            memory,
            status: MemoryStatus::Suspended,
            weight: 0.123,
            score: 0.456,
            similarity: 0.6,
            reactivated: true,
            recalled_before: Some(Timestamp::from_second(1_800_000_000 - 2 * 3_600).unwrap()),
        };
        let v = shown(&found, now);
        assert_eq!(v["title"], "Plans for May");
        assert_eq!(v["text"], "Plans for May\nvisit Ana");
        assert_eq!(v["status"], "active", "brought back");
        assert_eq!(v["reactivated"], true);
        assert_eq!(
            (v["weight"].as_f64(), v["score"].as_f64()),
            (Some(0.12), Some(0.46))
        );
        assert_eq!(v["last_recalled_ago"], "2 hours ago", "before this recall");
        assert_eq!(v["kept_ago"], "3 days ago");
        let never = Found {
            recalled_before: None,
            reactivated: false,
            ..found
        };
        let v = shown(&never, now);
        assert_eq!(v["last_recalled_ago"], "never");
        assert_eq!(v["last_recalled"], Value::Null);
        assert_eq!(v["status"], "suspended");
        assert!(v.get("reactivated").is_none());
    }
}
