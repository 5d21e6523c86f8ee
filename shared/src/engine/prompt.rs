//! The prompt every model call of an agent starts with, heartbeats and conversation
//! turns alike: the tools, the system prompt, then the conversation's history — the same
//! bytes from one call to the next, so a provider's prompt cache reads them at a fraction
//! of the input price instead of billing them again. What changes from call to call (a
//! heartbeat's briefing, a turn's beats, frames and new messages, memories) comes after.
//!
//! - **One set of tools**, in one order, for both: `speak`, `remember`, `recall`,
//!   `emit_event`, `schedule`, then the agent's MCP tools. A turn that calls `speak` or
//!   `emit_event` is told they work in heartbeats only.
//! - **One system prompt**: the persona, how the agent's two kinds of moments work, and
//!   what frames are. A heartbeat's instructions and events are in its briefing, after
//!   the history.
//! - **A history that moves in steps**: the newest messages within a token budget, but
//!   starting at a cut point — a user message whose id hashes to one in four — so the
//!   start stays put while the conversation grows and jumps ahead a few turns at a time,
//!   rather than sliding (and missing the cache) with every message.
//! - **Breakpoints** ([`cache`]): the provider is asked to keep the prefix through the
//!   history's last message, five minutes (renewed by each read) or an hour.

use jiff::{SignedDuration, Timestamp};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::domain::{
    Agent, CacheKept, CacheTtl, ChatMessage, ConversationMessage, Instructions, PromptCache, Role,
    ThinkPolicy, ToolSpec,
};
use crate::engine::{framing, memory, reminders};

/// Most history tokens (estimated at 4 characters a token) a prompt holds.
pub const HISTORY_TOKENS: usize = 8_000;
/// Most history messages read for a prompt.
pub const HISTORY_MESSAGES: usize = 100;

/// How a heartbeat's briefing begins: what tells the model (and the offline provider)
/// that this call is a heartbeat, not a conversation turn.
pub const HEARTBEAT_OPENING: &str = "Heartbeat: you woke on your own schedule; nobody wrote to you. Nothing you write here reaches the user unless you call speak.";

/// The tools only a heartbeat may call.
const HEARTBEAT_ONLY: [&str; 2] = ["speak", "emit_event"];

/// The system prompt: the agent's persona, its two kinds of moments, what frames are.
pub fn system(agent: &Agent) -> String {
    let persona = agent.persona.clone().unwrap_or_else(|| {
        format!(
            "You are {}, an assistant who talks with your user and keeps watch for them between conversations. Be warm and brief.",
            agent.name
        )
    });
    format!(
        "{persona}\n\n\
         You live in two kinds of moments. In a conversation turn someone wrote to you (the newest messages come last): your answer is what they read. \
         In a heartbeat you woke on your own schedule: a message after the conversation says so and brings what happened since you last woke and what your tools found. \
         Decide whether anything is worth telling the user; if it is, call speak with your thought (what you want to bring up and why) and your conversational self will phrase it; if not, do not call speak: silence is a fine outcome. \
         speak and emit_event (events for other tools) work in heartbeats only. \
         Use remember for facts worth keeping, recall to look them up, schedule to wake yourself at a later time (a SCHEDULED event brings its note back). \
         Be brief; every step costs.\n\n{}",
        framing::EXPLAINED
    )
}

/// Pulse's own tools, in the order every call shows them.
pub fn tools() -> Vec<ToolSpec> {
    let mut specs = vec![
        ToolSpec {
            name: "speak".to_owned(),
            description: "Heartbeats only. Communicate something to the user. Use when you have something worth saying: a proactive check-in, a reminder, a thought to share. Returns at once; your conversational self phrases and sends it.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"thought": {"type": "string", "description": "Your thought, e.g. 'The user mentioned a deadline tomorrow; I should check in about it'"}},
                "required": ["thought"]
            }),
        },
        ToolSpec {
            name: "emit_event".to_owned(),
            description: "Heartbeats only. Raise an event in your log; subscribed tools process it in this same heartbeat, after you.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "type": {"type": "string", "description": "Event type, e.g. REMINDER_DUE"},
                    "payload": {"type": "object"},
                    "priority": {"type": "integer", "minimum": 1, "maximum": 10, "description": "1 highest, 10 lowest; 5 if left out"}
                },
                "required": ["type"]
            }),
        },
    ];
    // After speak: remember, recall; then emit_event; schedule last.
    specs.splice(1..1, memory::specs("in later heartbeats and conversations"));
    specs.push(reminders::tool_spec());
    specs
}

/// What a conversation turn is answered when its model calls a heartbeat's tool; `None`
/// for any other tool.
pub fn heartbeat_only(tool: &str) -> Option<String> {
    HEARTBEAT_ONLY.contains(&tool).then(|| {
        format!("{tool} works in heartbeats only: in a conversation, what you write is your answer")
    })
}

/// Estimated tokens of a text: 4 characters a token, plus a little per message.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4) + 4
}

/// The history as the prompt holds it, oldest first: of `history` (newest first, as
/// read, at most `limit` asked for), the newest messages within `tokens`, starting at a
/// cut point when some had to be left out (see the module's notes).
pub fn history(history: &[ConversationMessage], tokens: usize, limit: usize) -> Vec<ChatMessage> {
    let kept = window(history, tokens, limit);
    history[..kept]
        .iter()
        .rev()
        .map(|m| match m.role {
            Role::User if m.source == APPROVAL_SOURCE => {
                ChatMessage::user(framing::frame(APPROVAL_SOURCE, &m.content))
            }
            Role::User if from_webhook(&m.source) => {
                ChatMessage::user(framing::frame(&format!("webhook {}", m.source), &m.content))
            }
            Role::User => ChatMessage::user(m.content.clone()),
            Role::Assistant => ChatMessage::assistant(m.content.clone()),
        })
        .collect()
}

/// How many of `history`'s newest messages the prompt holds.
fn window(history: &[ConversationMessage], tokens: usize, limit: usize) -> usize {
    let mut budget = tokens;
    let mut fits = 0;
    for m in history {
        let cost = estimate_tokens(&m.content);
        if cost > budget {
            break;
        }
        budget -= cost;
        fits += 1;
    }
    // All of it: the start is the conversation's own.
    if fits == history.len() && history.len() < limit {
        return fits;
    }
    let users = || (0..fits).rev().filter(|&i| history[i].role == Role::User);
    users()
        .find(|&i| cut_point(&history[i].id))
        .or_else(|| users().next())
        .map_or(fits, |i| i + 1)
}

/// Whether a message may start the history: one in four, by its id, so the choice is the
/// same in every call that reads it.
fn cut_point(id: &str) -> bool {
    Sha256::digest(id.as_bytes())[0] % 4 == 0
}

/// The source (and author) of what came of an approval, as a turn keeps it: not the
/// person's words, so it is framed as data.
pub(crate) const APPROVAL_SOURCE: &str = "approval";

/// Whether a persisted message's source is a webhook (its id), not a person.
fn from_webhook(source: &str) -> bool {
    source.starts_with("wh_") || source == "webhook"
}

/// What a warm-up call says after the stable prefix: it has one token to answer with.
pub const WARM_UP_LINE: &str =
    "(This call only keeps the prompt cache warm: nothing has happened. Answer with one word.)";

/// The breakpoints of a call by `agent` to `model` whose first `prefix` messages (the
/// system prompt and the history) are the stable prefix, and how long they are kept;
/// `said` is when the conversation last moved (now, for a turn; the history's newest
/// message, for a heartbeat), `called` when the agent last called the model for its
/// work, when its heartbeats keep its cache warm ([`warm_up_due`]).
///
/// An hour when another call is likely within one but maybe not within five minutes —
/// the conversation moved less than an hour ago (people come back to a conversation a
/// few minutes later, and a heartbeat after it reads what it cached), the agent's own
/// heartbeats will call the model within the hour (every beat, or every Nth, thinks,
/// more than five minutes apart), or its last call came within [`WARM_REACH`] and its
/// cache is kept warm (a warm-up near the hour's end carries it to a call up to that
/// far apart) — and the model's price says an hour pays
/// ([`crate::engine::ModelPrice::hour_cache_pays`]); else five minutes. A beat that
/// thinks on an event hours after anyone spoke or anything was called is written for
/// five minutes: an hour's write (twice the input, against 1.25 times) would be paid
/// for a read that seldom comes.
pub fn cache(
    agent: &Agent,
    model: &str,
    prefix: usize,
    (said, called, now): (Option<Timestamp>, Option<Timestamp>, Timestamp),
) -> PromptCache {
    let within = |gap: SignedDuration| gap < SignedDuration::from_hours(1);
    let talking = said.is_some_and(|t| within(now.duration_since(t)));
    let beating =
        thinking_gap(agent).is_some_and(|gap| gap > SignedDuration::from_mins(5) && within(gap));
    let calling = called.is_some_and(|t| now.duration_since(t) <= warm_reach(agent));
    PromptCache {
        history: prefix,
        ttl: if (talking || beating || calling) && hour_pays(model) {
            CacheTtl::Hour
        } else {
            CacheTtl::Minutes5
        },
    }
}

/// Whether an hour's cache pays at `model`'s built-in price.
pub fn hour_pays(model: &str) -> bool {
    crate::engine::Prices::builtin()
        .of(model)
        .is_some_and(|p| p.hour_cache_pays())
}

/// How long after an hour's cache is written a warm-up may still renew it: an hour less
/// nothing, so the beat that does it is the last before the cache would lapse.
pub const WARM_REACH: SignedDuration = SignedDuration::from_hours(2);

/// How far apart two calls of `agent` may be for a warm-up between them to pay: two
/// hours and a beat (the warm-up comes at the last beat before the hour ends).
fn warm_reach(agent: &Agent) -> SignedDuration {
    WARM_REACH + agent.interval.duration()
}

/// How late a beat may come after its interval and still be "the next beat" for a
/// warm-up's decision: sweeps run a minute apart.
const NEXT_BEAT_SLACK: SignedDuration = SignedDuration::from_mins(1);

/// The agent's prompt cache as a heartbeat at `now` finds it: what the last heartbeat
/// handed on, moved forward by a conversation turn since (a turn writes for an hour:
/// the conversation is moving). `None` when nothing was handed on: the agent's model
/// has no hour-long cache, or it has not thought yet.
pub fn cache_kept(agent: &Agent, handed: Option<CacheKept>) -> Option<CacheKept> {
    let mut kept = handed?;
    if let Some(turn) = agent.last_interaction_at.filter(|t| *t > kept.called_at) {
        kept.called_at = turn;
        kept.until = kept.until.max(turn + SignedDuration::from_hours(1));
    }
    Some(kept)
}

/// Whether a heartbeat at `now` that does not think should make one small call to keep
/// the agent's prompt cache warm (`kept`, from [`cache_kept`]): the cache was written for
/// an hour and is still alive, but would lapse before the next beat, no warm-up has renewed it since the
/// agent's last call, and its beats come less than an hour apart. A read costs a tenth
/// of the input and a lapsed prefix 1.25 – 2 times to write again, so one warm-up pays
/// when a call follows within its hour one time in ten. At most one per call: an agent
/// that stops calling stops being warmed an hour later.
pub fn warm_up_due(agent: &Agent, kept: Option<&CacheKept>, now: Timestamp) -> bool {
    let Some(kept) = kept else {
        return false;
    };
    let every = agent.interval.duration();
    let warmed = kept.warmed_at.is_some_and(|w| w >= kept.called_at);
    let hour = SignedDuration::from_hours(1);
    // Five minutes' cache is written again by any call: only an hour's is renewed.
    let long = kept.until.duration_since(kept.called_at) >= hour;
    every < hour
        && long
        && !warmed
        && kept.until > now
        && kept.until <= now + every + NEXT_BEAT_SLACK
}

/// How far apart the agent's heartbeats call the model, when that is known ahead: every
/// beat under `always`, every Nth under `every:N`, and under `auto` as often as its most
/// frequent heartbeat task with a period (instructions without tasks: every beat).
fn thinking_gap(agent: &Agent) -> Option<SignedDuration> {
    let every = agent.interval.duration();
    match agent.think {
        ThinkPolicy::Always => Some(every),
        ThinkPolicy::Every(n) => every.checked_mul(i32::try_from(n).ok()?),
        ThinkPolicy::Auto => Instructions::of(agent.instructions.as_deref())
            .shortest_period()
            .map(|d| d.max(every)),
        ThinkPolicy::Events => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::{NewAgent, TurnId};

    /// `n` messages of `chars` characters, newest first as read, a user's and the
    /// agent's in turn.
    pub(crate) fn said(
        agent: &crate::domain::AgentId,
        n: usize,
        chars: usize,
    ) -> Vec<ConversationMessage> {
        let turn = TurnId::parse("tn_01J00000000000000000000000").unwrap();
        (0..n)
            .rev()
            .map(|i| ConversationMessage {
                id: format!("m{i:05}"),
                agent_id: agent.clone(),
                turn_id: turn.clone(),
                role: if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                source: "cli".into(),
                agent: None,
                author: None,
                content: format!("{i:05}{}", "x".repeat(chars.saturating_sub(5))),
                created_at: Timestamp::UNIX_EPOCH,
                waiting: false,
            })
            .collect()
    }

    fn scout() -> crate::domain::AgentId {
        NewAgent::named("scout")
            .create(Timestamp::UNIX_EPOCH)
            .unwrap()
            .0
            .id
    }

    fn first(h: &[ChatMessage]) -> String {
        h[0].text().unwrap()[..5].to_owned()
    }

    #[test]
    fn a_history_that_fits_is_whole_and_one_that_does_not_starts_at_a_cut_point() {
        let all = said(&scout(), 10, 40);
        let h = history(&all, 10_000, 100);
        assert_eq!(h.len(), 10);
        assert_eq!(first(&h), "00000");
        // 14 tokens a message, 140 in all: with room for 100, some are left out and
        // the rest starts on a user message.
        let all = said(&scout(), 200, 40);
        let h = history(&all, 1_400, 1_000);
        assert!(h.len() <= 100, "{}", h.len());
        assert!(matches!(h[0], ChatMessage::User { .. }));
    }

    #[test]
    fn the_start_stays_put_as_the_conversation_grows_and_jumps_ahead_in_steps() {
        let all = said(&scout(), 400, 40);
        // The conversation as it was after each of its last 200 messages.
        let starts: Vec<String> = (200..=400)
            .map(|n| first(&history(&all[400 - n..], 1_400, 1_000)))
            .collect();
        let moves = starts.windows(2).filter(|w| w[0] != w[1]).count();
        // Sliding would move the start with every message: 200 times.
        assert!((10..=100).contains(&moves), "{moves} moves in 200 messages");
        // Starts only move forward.
        assert!(starts.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn an_hour_is_asked_for_agents_that_think_within_one_and_prices_that_pay() {
        let mut a = NewAgent::named("scout")
            .create(Timestamp::UNIX_EPOCH)
            .unwrap()
            .0;
        let cache = |a: &Agent, model: &str, n: usize| {
            let now = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(5);
            cache(a, model, n, (Some(Timestamp::UNIX_EPOCH), None, now))
        };
        // Every 15 minutes, but only on events, hours after the user last spoke:
        // nobody knows when the next call is.
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).ttl, CacheTtl::Minutes5);
        a.think = ThinkPolicy::Events;
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).ttl, CacheTtl::Minutes5);
        a.think = ThinkPolicy::Every(8);
        assert_eq!(
            cache(&a, "claude-sonnet-4-5", 3).ttl,
            CacheTtl::Minutes5,
            "2 hours"
        );
        a.think = ThinkPolicy::Every(2);
        assert_eq!(
            cache(&a, "claude-sonnet-4-5", 3).ttl,
            CacheTtl::Hour,
            "30 minutes"
        );
        a.think = ThinkPolicy::Auto;
        a.instructions = Some("Look at the inbox.".into());
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).ttl, CacheTtl::Hour);
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).history, 3);
        assert_eq!(cache(&a, "my-own-model", 3).ttl, CacheTtl::Minutes5);
        a.interval = crate::domain::Interval::new(SignedDuration::from_hours(2)).unwrap();
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).ttl, CacheTtl::Minutes5);
        a.interval = crate::domain::Interval::new(SignedDuration::from_mins(5)).unwrap();
        assert_eq!(cache(&a, "claude-sonnet-4-5", 3).ttl, CacheTtl::Minutes5);
        // Someone spoke within the hour: they may well be back in ten minutes.
        a.instructions = None;
        let now = Timestamp::UNIX_EPOCH + SignedDuration::from_mins(50);
        let talking = super::cache(
            &a,
            "claude-sonnet-4-5",
            3,
            (Some(Timestamp::UNIX_EPOCH), None, now),
        );
        assert_eq!(talking.ttl, CacheTtl::Hour);
        let none = super::cache(&a, "claude-sonnet-4-5", 3, (None, None, now));
        assert_eq!(none.ttl, CacheTtl::Minutes5);
        // Nobody spoke, but the agent called the model two hours ago and its cache is
        // kept warm: the next call reads what this one writes.
        let later = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(3);
        let called = Some(Timestamp::UNIX_EPOCH + SignedDuration::from_hours(1));
        let calling = super::cache(&a, "claude-sonnet-4-5", 3, (None, called, later));
        assert_eq!(calling.ttl, CacheTtl::Hour);
        let long_ago = Some(Timestamp::UNIX_EPOCH);
        let cold = super::cache(&a, "claude-sonnet-4-5", 3, (None, long_ago, later));
        assert_eq!(cold.ttl, CacheTtl::Minutes5, "three hours between calls");
    }

    #[test]
    fn a_beat_warms_the_cache_once_just_before_it_would_lapse() {
        let (a, _) = NewAgent::named("scout")
            .create(Timestamp::UNIX_EPOCH)
            .unwrap();
        let at = |m: i64| Timestamp::UNIX_EPOCH + SignedDuration::from_mins(m);
        // A heartbeat thought at 0:00 and wrote for an hour; beats every 15 minutes.
        let kept = CacheKept {
            called_at: at(0),
            until: at(60),
            warmed_at: None,
        };
        let due = |k: &CacheKept, m| warm_up_due(&a, Some(k), at(m));
        assert!(
            !due(&kept, 15) && !due(&kept, 30),
            "the next beat still reads it"
        );
        assert!(due(&kept, 45), "the last beat before it lapses");
        assert!(!due(&kept, 60), "lapsed: a warm-up would write it again");
        // Once warmed, not again until the agent calls the model for its work.
        let warmed = CacheKept {
            until: at(105),
            warmed_at: Some(at(45)),
            ..kept
        };
        assert!(!due(&warmed, 90));
        // A turn since moves it on: the cache lives an hour past the turn.
        let mut talked = a.clone();
        talked.last_interaction_at = Some(at(70));
        let moved = cache_kept(&talked, Some(warmed)).unwrap();
        assert_eq!((moved.called_at, moved.until), (at(70), at(130)));
        assert!(!warm_up_due(&talked, Some(&moved), at(100)));
        assert!(warm_up_due(&talked, Some(&moved), at(115)));
        // Five minutes' cache, nothing handed on, or beats an hour apart: none.
        let short = CacheKept {
            until: at(5),
            ..kept
        };
        assert!(!due(&short, 0), "five minutes' cache is not renewed");
        assert!(!warm_up_due(&a, None, at(45)));
        let mut hourly = a.clone();
        hourly.interval = crate::domain::Interval::new(SignedDuration::from_hours(1)).unwrap();
        assert!(!warm_up_due(&hourly, Some(&kept), at(1)));
    }

    #[test]
    fn a_turn_is_told_the_heartbeats_tools_are_not_its_own() {
        let names: Vec<String> = tools().into_iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            ["speak", "remember", "recall", "emit_event", "schedule"]
        );
        assert!(heartbeat_only("speak").unwrap().contains("heartbeats only"));
        assert!(heartbeat_only("remember").is_none());
    }
}
