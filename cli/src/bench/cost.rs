//! `pulse bench cost`: what prompt caching saves on one agent's day.
//!
//! One agent at 15 minutes, with yesterday's conversation behind it, lives a scripted day
//! through the real sweeper and worker on SQLite: 96 beats, 12 of them with new events
//! (so they think; 6 look something up first, 3 speak, each thought then phrased by a
//! turn), and 20 messages from its user in four sittings (6 ask it to remember
//! something, which it does before it answers). Its model is a stand-in for Anthropic's
//! Messages API on loopback, reached through Pulse's own Anthropic client, that bills
//! prompts the way Anthropic documents its prompt cache:
//!
//! - the prompt is read in order — tools, system, messages — block by block, and a
//!   block marked `cache_control` is a breakpoint;
//! - at each breakpoint the prefix ending there, and at up to 20 blocks before it, is
//!   looked up; the longest one cached and alive is read (0.1 times the input price)
//!   and lives on for its lifetime again;
//! - the prefix through each later breakpoint is written (1.25 times for five minutes,
//!   2 times for an hour), if it is at least 1,024 tokens (Sonnet's minimum);
//! - the rest is plain input. Tokens are the blocks' JSON at four characters a token.
//!
//! The day runs twice, once with the stand-in's cache off (every prompt billed in full)
//! and once with it on, and prints both bills, priced by Pulse's own table; the usage
//! Pulse recorded must match what the stand-in billed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use jiff::{SignedDuration, Timestamp};
use pulse_shared::app::{Services, connect};
use pulse_shared::config::{Backend, Config};
use pulse_shared::domain::{NewAgent, NewEvent, ProviderKind, Secret, Signal, SignalMeta, Usage};
use pulse_shared::engine::{Prices, intake};
use pulse_shared::llm::{LlmConfig, Router as LlmRouter};
use pulse_shared::ports::{Clock, ManualClock};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::sweep::{drain, offline_services};
use crate::Failure;
use crate::output::{Out, figure};

/// The model the day is billed at.
const MODEL: &str = "claude-sonnet-4-5";
/// The shortest prefix Sonnet caches, in tokens.
const MIN_CACHED: u64 = 1_024;
/// Blocks before a breakpoint that a lookup also tries.
const LOOKBACK: usize = 20;
/// The beats of the day that bring an event, of those the ones worth speaking of, and
/// the ones whose client the agent looks up first.
const EVENT_BEATS: [u32; 12] = [28, 32, 36, 40, 44, 52, 60, 64, 72, 76, 80, 88];
const URGENT_BEATS: [u32; 3] = [36, 64, 80];
const LOOK_UP_BEATS: [u32; 6] = [28, 36, 44, 60, 72, 88];
/// The messages (by their place in the day, from 1) that ask the agent to remember.
const REMEMBER_MESSAGES: [usize; 6] = [2, 5, 9, 13, 16, 19];
/// When the user writes (hour, minute): four sittings, 20 messages.
const MESSAGES: [(i8, i8); 20] = [
    (7, 40),
    (7, 42),
    (7, 45),
    (12, 10),
    (12, 12),
    (12, 13),
    (12, 16),
    (12, 20),
    (18, 30),
    (18, 31),
    (18, 34),
    (18, 40),
    (21, 0),
    (21, 2),
    (21, 5),
    (21, 6),
    (21, 10),
    (21, 15),
    (21, 21),
    (21, 25),
];
/// Yesterday's exchanges, the history the day starts with.
const YESTERDAY: usize = 30;

/// What the stand-in billed.
#[derive(Clone, Copy, Debug, Default)]
struct Bill {
    calls: u64,
    /// Of the calls, those that only kept the cache warm.
    warm_ups: u64,
    usage: Usage,
}

/// The stand-in's state: its cache and its bill.
struct Provider {
    clock: Arc<ManualClock>,
    caching: bool,
    /// Prefix hash → (expiry, lifetime).
    cached: HashMap<[u8; 32], (Timestamp, SignedDuration)>,
    bill: Bill,
    /// Replies written, for varied answers.
    replies: usize,
}

/// One block of the prompt, as the cache reads it.
struct Block {
    /// The prefix through this block.
    hash: [u8; 32],
    /// Tokens of the prefix through this block.
    tokens: u64,
    /// The block's breakpoint lifetime, if it has one.
    breakpoint: Option<SignedDuration>,
}

fn blocks(body: &Value) -> Vec<Block> {
    let mut parts: Vec<Value> = Vec::new();
    for t in body["tools"].as_array().into_iter().flatten() {
        parts.push(t.clone());
    }
    for s in body["system"].as_array().into_iter().flatten() {
        parts.push(s.clone());
    }
    for m in body["messages"].as_array().into_iter().flatten() {
        for b in m["content"].as_array().into_iter().flatten() {
            parts.push(json!({"role": m["role"], "block": b}));
        }
    }
    let mut hash: [u8; 32] = Sha256::digest(body["model"].to_string()).into();
    let mut tokens = 0;
    parts
        .into_iter()
        .map(|mut p| {
            let marked = p
                .pointer_mut("/block")
                .unwrap_or(&mut Value::Null)
                .as_object_mut()
                .and_then(|o| o.remove("cache_control"))
                .or_else(|| p.as_object_mut().and_then(|o| o.remove("cache_control")));
            let text = p.to_string();
            tokens += text.len().div_ceil(4) as u64;
            let mut h = Sha256::new();
            h.update(hash);
            h.update(text.as_bytes());
            hash = h.finalize().into();
            Block {
                hash,
                tokens,
                breakpoint: marked.map(|c| {
                    if c["ttl"] == "1h" {
                        SignedDuration::from_hours(1)
                    } else {
                        SignedDuration::from_mins(5)
                    }
                }),
            }
        })
        .collect()
}

impl Provider {
    /// Bills one prompt: (plain, read, written, written for an hour).
    fn bill(&mut self, body: &Value) -> Usage {
        let blocks = blocks(body);
        let total = blocks.last().map_or(0, |b| b.tokens);
        let marks: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].breakpoint.is_some())
            .collect();
        if !self.caching || marks.is_empty() {
            return Usage {
                input_tokens: total,
                ..Usage::default()
            };
        }
        let now = self.clock.now();
        // The longest prefix alive at a breakpoint or up to 20 blocks before one.
        let hit = marks
            .iter()
            .filter_map(|&m| {
                (m.saturating_sub(LOOKBACK)..=m).rev().find(|&j| {
                    self.cached
                        .get(&blocks[j].hash)
                        .is_some_and(|(until, _)| *until > now)
                })
            })
            .max();
        if let Some(j) = hit
            && let Some((until, ttl)) = self.cached.get_mut(&blocks[j].hash)
        {
            *until = now + *ttl;
        }
        let read = hit.map_or(0, |j| blocks[j].tokens);
        let (mut written, mut long, mut from) = (0, 0, read);
        for &m in marks.iter().filter(|&&m| hit.is_none_or(|j| m > j)) {
            let b = &blocks[m];
            let ttl = b.breakpoint.unwrap_or(SignedDuration::from_mins(5));
            if b.tokens < MIN_CACHED {
                continue;
            }
            self.cached.insert(b.hash, (now + ttl, ttl));
            let segment = b.tokens - from;
            written += segment;
            if ttl > SignedDuration::from_mins(5) {
                long += segment;
            }
            from = b.tokens;
        }
        Usage {
            input_tokens: total,
            cache_read_tokens: read,
            cache_write_tokens: written,
            cache_write_long_tokens: long,
            ..Usage::default()
        }
    }

    /// The answer. A heartbeat looks its client up first when its event asks for it
    /// (`recall`), speaks of an urgent event (`speak`) and is otherwise silent; a turn
    /// keeps what it is asked to remember (`remember`), then answers in a paragraph.
    fn answer(&mut self, body: &Value) -> Value {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let texts = |m: &Value| -> Vec<String> {
            m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["text"].as_str().map(str::to_owned))
                .collect()
        };
        let opening = pulse_shared::engine::prompt::HEARTBEAT_OPENING;
        // Where this call's own part starts: the heartbeat's briefing, or the turn's
        // time-stamped message.
        let own = messages.iter().rposition(|m| {
            m["role"] == "user"
                && texts(m)
                    .iter()
                    .any(|t| t.starts_with(opening) || t.starts_with('['))
        });
        let own_text = own
            .map(|i| texts(&messages[i]).join("\n"))
            .unwrap_or_default();
        let called: Vec<String> = own
            .map(|i| &messages[i..])
            .unwrap_or_default()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["name"].as_str().map(str::to_owned))
            .collect();
        let has = |name: &str| called.iter().any(|c| c == name);
        let heartbeat = own_text.contains(opening);
        let tool = |name: &str, input: Value, n: u64| {
            (
                json!([{"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": input}]),
                "tool_use",
            )
        };
        let n = self.bill.calls;
        let last_text = messages
            .last()
            .map(|m| texts(m).join("\n"))
            .unwrap_or_default();
        let warm_up = last_text == pulse_shared::engine::prompt::WARM_UP_LINE;
        let (content, stop) = if warm_up {
            self.bill.warm_ups += 1;
            (json!([{"type": "text", "text": "Ok"}]), "max_tokens")
        } else if heartbeat {
            if own_text.contains("\"look_up\":true") && !has("recall") {
                tool(
                    "recall",
                    json!({"query": "what the client asked before"}),
                    n,
                )
            } else if own_text.contains("\"urgent\":true") && !has("speak") {
                tool(
                    "speak",
                    json!({"thought": "Something urgent came in; the user should hear of it now."}),
                    n,
                )
            } else {
                (
                    json!([{"type": "text", "text": "Nothing more worth saying."}]),
                    "end_turn",
                )
            }
        } else if own_text.contains("please remember") && !has("remember") {
            tool(
                "remember",
                json!({"text": "Ada's Lisbon client wants the brochure by Thursday."}),
                n,
            )
        } else {
            self.replies += 1;
            let reply = format!(
                "Reply {}: {}",
                self.replies,
                "Here is what I make of it, in a few sentences that a person would read on a phone without scrolling much, with one concrete suggestion at the end. ".repeat(3)
            );
            (json!([{"type": "text", "text": reply}]), "end_turn")
        };
        let mut usage = self.bill(body);
        usage.output_tokens = content.to_string().len().div_ceil(4) as u64;
        self.bill.calls += 1;
        self.bill.usage.add(usage);
        let plain = usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens;
        json!({
            "id": format!("msg_{}", self.bill.calls),
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": content,
            "stop_reason": stop,
            "usage": {
                "input_tokens": plain,
                "cache_read_input_tokens": usage.cache_read_tokens,
                "cache_creation_input_tokens": usage.cache_write_tokens,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": usage.cache_write_tokens - usage.cache_write_long_tokens,
                    "ephemeral_1h_input_tokens": usage.cache_write_long_tokens,
                },
                "output_tokens": usage.output_tokens,
            }
        })
    }
}

type Shared = Arc<Mutex<Provider>>;

async fn messages(State(p): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    let answer = p.lock().unwrap_or_else(|e| e.into_inner()).answer(&body);
    Json(answer)
}

/// The agent's persona: about as long as the ones people write.
fn persona() -> String {
    let mut p = String::from(
        "You are Wren, a calm and practical assistant to Ada, a freelance translator who works from home in Lisbon. \
         You help her keep her deadlines, her invoices and her week in order, and you notice when she is overloaded. \
         Speak plainly, in short paragraphs; never pad an answer; ask one question at a time. ",
    );
    for (topic, rule) in [
        (
            "Deadlines",
            "remind her two days ahead and again on the morning a delivery is due; never more often unless she asks",
        ),
        (
            "Invoices",
            "an invoice unpaid after 30 days is worth one polite nudge; say which client and how much",
        ),
        (
            "Health",
            "if she has worked past 22:00 three nights running, say so once, kindly, and let it go",
        ),
        (
            "Clients",
            "keep what each client prefers (file formats, tone, who signs off) and use it without being asked",
        ),
        (
            "Privacy",
            "never repeat a client's text outside the conversation it came from",
        ),
        (
            "Tone",
            "warm, dry humour is welcome; exclamation marks are not",
        ),
        (
            "Quiet",
            "between 22:30 and 07:00 only something that cannot wait is worth a message",
        ),
        (
            "Memory",
            "remember what she tells you about her work and her preferences; recall before you guess",
        ),
    ] {
        p.push_str(&format!("\n{topic}: {rule}. "));
        p.push_str(
            "When in doubt, say less and ask; when sure, act and say what you did in one line.",
        );
    }
    p
}

/// The day's figures.
struct Day {
    bill: Bill,
    recorded: Usage,
    turns: usize,
    heartbeats_thinking: usize,
}

async fn day(caching: bool) -> Result<Day, Failure> {
    let dir = tempfile::tempdir()?;
    let start: Timestamp = "2026-03-01T18:00:00Z".parse().expect("a valid time");
    let midnight: Timestamp = "2026-03-02T00:00:00Z".parse().expect("a valid time");
    let manual = Arc::new(ManualClock::new(start));
    let clock: Arc<dyn Clock> = manual.clone();
    let provider: Shared = Arc::new(Mutex::new(Provider {
        clock: manual.clone(),
        caching,
        cached: HashMap::new(),
        bill: Bill::default(),
        replies: 0,
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .with_state(provider.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let mut config = Config {
        backend: Backend::Sqlite {
            path: dir.path().join("day.db"),
        },
        ..Config::defaults()
    };
    // Without a cache there is nothing to keep warm.
    config.engine.keep_cache_warm = caching;
    let offline = offline_services();
    let llm = LlmConfig {
        provider: ProviderKind::Anthropic,
        explicit: true,
        base_url: Some(
            url.parse()
                .map_err(|e| Failure::Runtime(anyhow::anyhow!("{e}")))?,
        ),
        model: Some(MODEL.to_owned()),
        anthropic_key: Some(Secret::new("bench-key")),
        ..LlmConfig::offline()
    };
    let services = Services {
        llm: Arc::new(LlmRouter::new(llm, offline.egress.clone())),
        ..offline
    };
    let b = connect(&config, clock.clone()).await?;
    let mut new = NewAgent::named("wren");
    new.persona = Some(persona());
    let (agent, first) = new.create(clock.now())?;
    b.store.create_agent(&agent, &first).await?;
    let sweeper = b.sweeper(&config.engine);
    let worker = b.worker(clock.clone(), &config.engine, &services);
    let say = |text: String| {
        Signal::user_message(
            &agent.id,
            &agent.session,
            &text,
            SignalMeta::default(),
            clock.now(),
        )
    };

    // Yesterday evening's conversation: the history the day starts with.
    for n in 0..YESTERDAY {
        intake::submit(
            b.store.as_ref(),
            b.queue.as_ref(),
            say(format!(
                "Yesterday's note {n}: the Lisbon client wants the brochure in Portuguese by Thursday, and the invoice for March is still open; what should I do first?"
            ))?,
        )
        .await?;
        drain(&worker, b.queue.as_ref()).await?;
        manual.advance(SignedDuration::from_mins(5));
    }
    manual.set(midnight);
    let swept = sweeper.sweep_once(clock.now()).await;
    if let Some(e) = swept.errors.first() {
        return Err(Failure::Runtime(anyhow::anyhow!("sweep failed: {e}")));
    }
    drain(&worker, b.queue.as_ref()).await?;
    let day_start = provider.lock().unwrap_or_else(|e| e.into_inner()).bill;

    // The day, minute by minute where something happens.
    let mut moments: Vec<(Timestamp, Option<u32>)> = (1..=96)
        .map(|beat| {
            (
                midnight + SignedDuration::from_mins(15 * i64::from(beat)),
                Some(beat),
            )
        })
        .chain(MESSAGES.iter().map(|(h, m)| {
            (
                midnight + SignedDuration::from_mins(60 * i64::from(*h) + i64::from(*m)),
                None,
            )
        }))
        .collect();
    moments.sort_by_key(|(at, beat)| (*at, beat.is_some()));
    let mut said = 0;
    let mut thinking = 0;
    for (at, beat) in moments {
        manual.set(at.max(clock.now()));
        match beat {
            Some(beat) => {
                if EVENT_BEATS.contains(&beat) {
                    let event = NewEvent::new(
                        "NOTE",
                        json!({
                            "note": format!("An email from a client at beat {beat}."),
                            "urgent": URGENT_BEATS.contains(&beat),
                            "look_up": LOOK_UP_BEATS.contains(&beat),
                        }),
                        None,
                    )?
                    .into_event(agent.id.clone(), "bench", clock.now());
                    b.store.append(&event).await?;
                    thinking += 1;
                }
                let swept = sweeper.sweep_once(clock.now()).await;
                if let Some(e) = swept.errors.first() {
                    return Err(Failure::Runtime(anyhow::anyhow!("sweep failed: {e}")));
                }
            }
            None => {
                said += 1;
                let ask = if REMEMBER_MESSAGES.contains(&said) {
                    "please remember that the brochure is due Thursday"
                } else {
                    "can you check where I am with the brochure, and whether the March invoice was paid?"
                };
                intake::submit(
                    b.store.as_ref(),
                    b.queue.as_ref(),
                    say(format!("Message {said}: {ask}"))?,
                )
                .await?;
            }
        }
        drain(&worker, b.queue.as_ref()).await?;
    }
    server.abort();
    let end = provider.lock().unwrap_or_else(|e| e.into_inner()).bill;
    // What Pulse recorded of the day, beside what it was billed.
    let report =
        pulse_shared::engine::usage(b.store.as_ref(), &agent, midnight, Prices::builtin()).await?;
    let mut recorded = Usage::default();
    for row in &report.models {
        recorded.add(Usage {
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            cache_read_tokens: row.cache_read_tokens,
            cache_write_tokens: row.cache_write_tokens,
            cache_write_long_tokens: row.cache_write_long_tokens,
        });
    }
    let turns = b.store.list_turns(&agent.id, 1_000).await?.len() - YESTERDAY;
    let mut bill = end;
    bill.calls -= day_start.calls;
    bill.warm_ups -= day_start.warm_ups;
    bill.usage = minus(end.usage, day_start.usage);
    Ok(Day {
        bill,
        recorded,
        turns,
        heartbeats_thinking: thinking,
    })
}

fn minus(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens - b.input_tokens,
        output_tokens: a.output_tokens - b.output_tokens,
        cache_read_tokens: a.cache_read_tokens - b.cache_read_tokens,
        cache_write_tokens: a.cache_write_tokens - b.cache_write_tokens,
        cache_write_long_tokens: a.cache_write_long_tokens - b.cache_write_long_tokens,
    }
}

pub(crate) async fn cost(out: &Out) -> Result<(), Failure> {
    let price = Prices::builtin()
        .of(MODEL)
        .ok_or_else(|| Failure::Runtime(anyhow::anyhow!("no price for {MODEL}")))?;
    let off = day(false).await?;
    let on = day(true).await?;
    for d in [&off, &on] {
        if d.recorded != d.bill.usage {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "the usage Pulse recorded ({:?}) is not what the provider billed ({:?})",
                d.recorded,
                d.bill.usage
            )));
        }
    }
    let (a, b) = (price.cost(&off.bill.usage), price.cost(&on.bill.usage));
    let u = &on.bill.usage;
    figure!(
        out,
        "one agent's day at 15 min ({} beats thinking of 96, {} turns: 20 messages and the thoughts it spoke) on {MODEL} at list prices:",
        on.heartbeats_thinking,
        on.turns
    );
    figure!(
        out,
        "  caching off: {} calls, {} input tokens billed in full, {} output; ${a:.4}",
        off.bill.calls,
        off.bill.usage.input_tokens,
        off.bill.usage.output_tokens
    );
    figure!(
        out,
        "  caching on:  {} calls ({} of them warm-ups), {} input tokens: {} read from the cache ({:.1} % hit rate), {} written ({} for an hour), {} plain; ${b:.4}",
        on.bill.calls,
        on.bill.warm_ups,
        u.input_tokens,
        u.cache_read_tokens,
        100.0 * u.cache_read_tokens as f64 / u.input_tokens.max(1) as f64,
        u.cache_write_tokens,
        u.cache_write_long_tokens,
        u.input_tokens - u.cache_read_tokens - u.cache_write_tokens
    );
    figure!(
        out,
        "  caching on costs {:.3} of off: {:.1} % fewer dollars (goal: at least 60 %)",
        b / a.max(f64::MIN_POSITIVE),
        100.0 * (1.0 - b / a.max(f64::MIN_POSITIVE))
    );
    if out.json {
        out.json_value(&json!({
            "model": MODEL,
            "off": {"calls": off.bill.calls, "usage": off.bill.usage, "usd": a},
            "on": {"calls": on.bill.calls, "warm_ups": on.bill.warm_ups, "usage": on.bill.usage, "usd": b},
            "saved_share": 1.0 - b / a.max(f64::MIN_POSITIVE),
            "hit_rate": u.cache_read_tokens as f64 / u.input_tokens.max(1) as f64,
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(system: &str, messages: Value, ttl: Option<&str>) -> Value {
        let mut mark = json!({"type": "ephemeral"});
        if let Some(t) = ttl {
            mark["ttl"] = json!(t);
        }
        json!({
            "model": MODEL,
            "system": [{"type": "text", "text": system, "cache_control": mark}],
            "messages": messages,
        })
    }

    #[test]
    fn the_stand_in_reads_a_live_prefix_writes_past_it_and_forgets_it_when_it_expires() {
        let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
        let mut p = Provider {
            clock: clock.clone(),
            caching: true,
            cached: HashMap::new(),
            bill: Bill::default(),
            replies: 0,
        };
        let system = "s".repeat(8_000);
        let msgs = json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
        let first = p.bill(&body(&system, msgs.clone(), None));
        assert_eq!(first.cache_read_tokens, 0);
        assert!(first.cache_write_tokens >= 2_000, "{first:?}");
        let again = p.bill(&body(&system, msgs.clone(), None));
        assert_eq!(again.cache_read_tokens, first.cache_write_tokens);
        assert_eq!(again.cache_write_tokens, 0);
        // Five minutes after its last read, it is gone; an hour's lives on.
        clock.advance(SignedDuration::from_mins(6));
        let long = p.bill(&body(&system, msgs.clone(), Some("1h")));
        assert_eq!(long.cache_read_tokens, 0, "expired");
        assert!(long.cache_write_tokens > 0);
        assert_eq!(long.cache_write_long_tokens, long.cache_write_tokens);
        clock.advance(SignedDuration::from_mins(50));
        assert!(
            p.bill(&body(&system, msgs.clone(), Some("1h")))
                .cache_read_tokens
                > 0
        );
        // A short prefix is not cached; off, nothing is.
        assert_eq!(
            p.bill(&body("short", msgs.clone(), None))
                .cache_write_tokens,
            0
        );
        p.caching = false;
        let off = p.bill(&body(&system, msgs, None));
        assert_eq!((off.cache_read_tokens, off.cache_write_tokens), (0, 0));
    }
}
