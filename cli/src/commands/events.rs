//! `pulse events …`: emit an event into an agent's log, and list the log.

use std::collections::HashMap;

use clap::Subcommand;
use jiff::Timestamp;
use pulse_shared::domain::{
    AgentId, Event, EventCursor, EventId, EventType, NewEvent, parse_duration,
};
use pulse_shared::ports::EventQuery;

use super::{AgentRef, Ctx, agent_ref, input, json_arg, limit};
use crate::Failure;
use crate::output::{outln, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum EventsCmd {
    /// Append an event to an agent's log; the next heartbeat processes it.
    Emit {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// Event type in SCREAMING_SNAKE_CASE, e.g. NEW_MENTION (what subscriptions match).
        #[arg(long = "type", value_name = "TYPE")]
        event_type: String,
        /// JSON payload.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// 1 (highest) to 10; 5 when left out.
        #[arg(long)]
        priority: Option<i64>,
    },
    /// List an agent's latest events (oldest of them first), filtered and paged.
    List {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// Only these types (comma-separated), e.g. NOTE,SUMMARY.
        #[arg(long = "type", value_name = "TYPE,...", value_delimiter = ',')]
        types: Vec<String>,
        /// Only events created since then: a duration back from now (10m, 2h) or a time
        /// (2026-11-23T09:00:00Z).
        #[arg(long, value_name = "10m|TIMESTAMP")]
        since: Option<String>,
        /// Only events older than this one: pass the first id of a listing to page back.
        #[arg(long, value_name = "EVENT_ID")]
        before: Option<String>,
        /// How many: the newest that match.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Keep printing new events as they land, until Ctrl-C (with --json, one JSON
        /// object per line).
        #[arg(long)]
        follow: bool,
    },
}

/// `--since`: a duration back from now, or a time.
pub(crate) enum Since {
    Ago(jiff::SignedDuration),
    At(Timestamp),
}

impl Since {
    pub(crate) fn parse(s: &str) -> Result<Self, Failure> {
        if let Ok(d) = parse_duration("since", s) {
            return Ok(Self::Ago(d));
        }
        s.trim().parse::<Timestamp>().map(Self::At).map_err(|_| {
            Failure::Input(format!(
                "invalid --since {s:?}: give a duration back from now (10m, 2h, 1d) or a time such as 2026-11-23T09:00:00Z"
            ))
        })
    }

    /// The time it names.
    pub(crate) fn at(&self, now: Timestamp) -> Timestamp {
        match self {
            Self::Ago(d) => now.saturating_sub(*d).unwrap_or(now),
            Self::At(t) => *t,
        }
    }

    /// The cursor just before the first event created at or after this time.
    pub(crate) fn cursor(&self, now: Timestamp) -> EventCursor {
        EventCursor::since(self.at(now))
    }
}

/// A validated events command.
pub(crate) enum EventsPlan {
    Emit {
        agent: AgentRef,
        event: NewEvent,
    },
    List {
        agent: AgentRef,
        query: EventQuery,
        since: Option<Since>,
        follow: bool,
    },
}

impl EventsPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Emit { .. })
    }
}

pub(crate) fn plan(cmd: EventsCmd) -> Result<EventsPlan, Failure> {
    Ok(match cmd {
        EventsCmd::Emit {
            agent,
            event_type,
            payload,
            priority,
        } => EventsPlan::Emit {
            agent: agent_ref(&agent)?,
            event: NewEvent::new(
                emit_type(&event_type)?,
                json_arg("payload", &payload)?,
                priority,
            )
            .map_err(input)?,
        },
        EventsCmd::List {
            agent,
            types,
            since,
            before,
            limit: n,
            follow,
        } => EventsPlan::List {
            agent: agent_ref(&agent)?,
            query: EventQuery {
                types: types
                    .iter()
                    .map(|t| EventType::parse(t.trim()))
                    .collect::<Result<_, _>>()
                    .map_err(input)?,
                after: None,
                before: before
                    .as_deref()
                    .map(EventId::parse)
                    .transpose()
                    .map_err(input)?,
                limit: limit(n)?,
            },
            since: since.as_deref().map(Since::parse).transpose()?,
            follow,
        },
    })
}

/// The type of an event emitted by hand: SCREAMING_SNAKE_CASE, as subscriptions and the
/// engine's own types are written, so `note` is not stored where `NOTE` was meant.
/// (Webhook senders keep their own spellings; their types are not typed by hand.)
fn emit_type(t: &str) -> Result<&str, Failure> {
    let mut bytes = t.bytes();
    let screaming = bytes.next().is_some_and(|b| b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if screaming {
        return Ok(t);
    }
    let hint = pulse_shared::domain::upper_snake(t);
    let hint = hint.trim_matches('_');
    let suggestion = if hint.is_empty() || !hint.starts_with(|c: char| c.is_ascii_uppercase()) {
        String::new()
    } else {
        format!(" (did you mean {hint}?)")
    };
    Err(Failure::Input(format!(
        "invalid event type {t:?}: emitted types are SCREAMING_SNAKE_CASE — capital letters, digits and '_', starting with a letter{suggestion}"
    )))
}

const HEADERS: [&str; 7] = [
    "ID", "TYPE", "PRIO", "SOURCE", "CREATED", "PARENT", "PAYLOAD",
];

fn row(e: &Event) -> Vec<String> {
    let mut source = e.source.clone();
    if let Some(c) = &e.cascade {
        source = format!(
            "{source} (depth {}{})",
            c.depth,
            if c.capped { ", capped" } else { "" }
        );
    }
    vec![
        e.id.to_string(),
        e.event_type.to_string(),
        e.priority.to_string(),
        source,
        when(Some(e.created_at)),
        e.parent_id.as_ref().map_or("-".into(), |p| p.to_string()),
        short(&e.payload.to_string(), 60),
    ]
}

/// How often `--follow` looks for new events.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How far back each look of `--follow` reads. An event's id is its creation time, and
/// some are stored after it (a heartbeat's HEARTBEAT event goes in when the heartbeat
/// finishes): re-reading a recent stretch, and skipping what was printed, shows those too.
const FOLLOW_LOOKBACK: jiff::SignedDuration = jiff::SignedDuration::from_mins(5);

/// `--follow`: prints the listing, then every new event that matches, as it lands,
/// until Ctrl-C. Lines, not a table: a table's columns cannot be known ahead.
async fn follow_events(cx: &Ctx<'_>, agent: &AgentId, listing: EventQuery) -> Result<(), Failure> {
    let print = |e: &Event| {
        if cx.out.json {
            outln!("{}", serde_json::to_string(e).unwrap_or_default());
        } else {
            outln!("{}", row(e).join("  "));
        }
    };
    let since = listing.after.clone();
    let mut query = EventQuery {
        before: None,
        limit: 1_000,
        ..listing.clone()
    };
    // What is stored before the listing counts as seen, printed or not: only the listing
    // and what lands after it are shown. (Seen first, listed second, so nothing that
    // lands between the two reads is missed.)
    let mut seen: HashMap<EventId, Timestamp> = HashMap::new();
    let window = |now: Timestamp, query: &mut EventQuery| {
        let from = now.saturating_sub(FOLLOW_LOOKBACK).unwrap_or(now);
        let lookback = EventCursor::through(from);
        query.after = Some(match &since {
            Some(s) if s.as_str() > lookback.as_str() => s.clone(),
            _ => lookback,
        });
        from
    };
    window(cx.clock.now(), &mut query);
    for e in cx.b.store.query_events(agent, &query).await? {
        seen.insert(e.id, e.created_at);
    }
    if !cx.out.json {
        outln!("{}", HEADERS.join("  "));
    }
    for e in cx.b.store.query_events(agent, &listing).await? {
        print(&e);
        seen.insert(e.id, e.created_at);
    }
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        let from = window(cx.clock.now(), &mut query);
        for e in cx.b.store.query_events(agent, &query).await? {
            if seen.insert(e.id.clone(), e.created_at).is_none() {
                print(&e);
            }
        }
        seen.retain(|_, at| *at >= from);
    }
}

pub(crate) async fn execute(plan: EventsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        EventsPlan::Emit { agent, event } => {
            let agent = agent.find(b).await?.id;
            let event = event.into_event(agent, "cli", cx.clock.now());
            b.store.append(&event).await?;
            out.created(
                &event,
                event.id.as_str(),
                &format!(
                    "emitted {} {}; the next heartbeat processes it",
                    event.event_type, event.id
                ),
            );
        }
        EventsPlan::List {
            agent,
            mut query,
            since,
            follow,
        } => {
            let agent = agent.find(b).await?.id;
            query.after = since.map(|s| s.cursor(cx.clock.now()));
            if follow {
                return follow_events(cx, &agent, query).await;
            }
            let events = b.store.query_events(&agent, &query).await?;
            out.table(&events, &HEADERS, row);
        }
    }
    Ok(())
}
