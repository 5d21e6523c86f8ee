//! Heartbeat instructions as tasks, each with its own cadence, so a beat with nothing new
//! and nothing due costs no model call.
//!
//! Instructions are Markdown. A second-level heading that ends in a cadence in
//! parentheses starts a task; its text runs to the next such heading:
//!
//! ```text
//! Be brief. Only speak when it matters.
//!
//! ## Inbox (every 4h)
//! Look at the inbox for anything from Sam.
//!
//! ## Morning plan (cron 0 8 * * MON-FRI)
//! Tell me what the day holds.
//!
//! ## Failed builds (on ci.failed, deploy.*)
//! Look at what failed and say whether it is mine.
//!
//! ## Check in (when silent 2d)
//! Ask how the move is going.
//! ```
//!
//! The text before the first task is guidance: read whenever the heartbeat thinks, never
//! a reason to think by itself. Instructions without any task are one task due every
//! beat, as they always were.

use std::collections::BTreeMap;
use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::schedule::ScheduleRule;
use super::time::{TimeZoneName, format_duration, parse_duration};
use crate::error::ValidationError;

/// The name of the one task of instructions that have no task headings.
pub const EVERY_BEAT_TASK: &str = "instructions";

/// When a task is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cadence {
    /// On every beat.
    EveryBeat,
    /// When this long has passed since it was last done (at most once a beat).
    Every(SignedDuration),
    /// At the first beat after each time a cron pattern names, in the agent's time zone.
    Cron(String),
    /// When events of these types (exact, or a prefix ending in `*`) are in the window
    /// or were returned by the heartbeat's tools.
    OnEvents(Vec<String>),
    /// Once each time the user has been silent this long.
    Silent(SignedDuration),
}

impl Cadence {
    /// Reads `every beat`, `every 4h`, `cron 0 8 * * MON-FRI`, `on TYPE, TYPE*` or
    /// `when silent 2d`. `None` when the text does not start like a cadence at all (a
    /// heading's parentheses that are only words); an error when it does but is wrong.
    pub fn parse(s: &str) -> Option<Result<Self, ValidationError>> {
        let s = s.trim();
        let (word, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        let rest = rest.trim();
        let bad = |why: String| Some(Err(ValidationError::new("heartbeat task", why)));
        match word {
            "every" if rest == "beat" => Some(Ok(Self::EveryBeat)),
            "every" => Some(
                parse_duration("heartbeat task", rest)
                    .and_then(positive)
                    .map(Self::Every)
                    .map_err(|e| with_example(e, "(every 4h)")),
            ),
            "cron" => {
                let utc = TimeZoneName::utc();
                Some(
                    ScheduleRule::cron(rest, utc)
                        .map(|_| Self::Cron(rest.to_owned()))
                        .map_err(|e| ValidationError::new("heartbeat task", e.message)),
                )
            }
            "on" => {
                let types: Vec<String> = rest
                    .split(',')
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .collect();
                if types.is_empty()
                    || types.iter().any(|t| {
                        let head = t.strip_suffix('*').unwrap_or(t);
                        !head.is_empty() && super::ids::EventType::parse(head).is_err()
                    })
                {
                    return bad(format!(
                        "{s:?}: name event types after \"on\", separated by commas, e.g. (on ci.failed, deploy.*)"
                    ));
                }
                Some(Ok(Self::OnEvents(types)))
            }
            "when" => {
                let Some(after) = rest.strip_prefix("silent") else {
                    return bad(format!(
                        "{s:?}: the one condition is \"when silent\" and a duration, e.g. (when silent 2d)"
                    ));
                };
                Some(
                    parse_duration("heartbeat task", after)
                        .and_then(positive)
                        .map(Self::Silent)
                        .map_err(|e| with_example(e, "(when silent 2d)")),
                )
            }
            _ => None,
        }
    }
}

fn positive(d: SignedDuration) -> Result<SignedDuration, ValidationError> {
    if d.is_positive() {
        Ok(d)
    } else {
        Err(ValidationError::new(
            "heartbeat task",
            "a cadence's duration must be more than zero",
        ))
    }
}

fn with_example(e: ValidationError, example: &str) -> ValidationError {
    ValidationError::new("heartbeat task", format!("{}, e.g. {example}", e.message))
}

impl fmt::Display for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EveryBeat => f.write_str("every beat"),
            Self::Every(d) => write!(f, "every {}", format_duration(*d)),
            Self::Cron(p) => write!(f, "cron {p}"),
            Self::OnEvents(types) => write!(f, "on {}", types.join(", ")),
            Self::Silent(d) => write!(f, "when silent {}", format_duration(*d)),
        }
    }
}

/// One task of the instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeatTask {
    /// Its name: the heading's words, which keep its record across edits of its text.
    pub name: String,
    /// When it is due.
    pub cadence: Cadence,
    /// What to do.
    pub text: String,
}

/// Heartbeat instructions read as guidance and tasks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instructions {
    /// The text before the first task.
    pub guidance: String,
    /// The tasks, in their order.
    pub tasks: Vec<BeatTask>,
}

impl Instructions {
    /// Reads instructions; errors name the heading that is wrong and how to write it.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let mut out = Self::default();
        let mut body = String::new();
        let mut current: Option<(String, Cadence)> = None;
        let flush = |current: Option<(String, Cadence)>,
                     body: &mut String,
                     out: &mut Self|
         -> Result<(), ValidationError> {
            let text = std::mem::take(body).trim().to_owned();
            match current {
                None => out.guidance = text,
                Some((name, cadence)) => {
                    if out.tasks.iter().any(|t| t.name.eq_ignore_ascii_case(&name)) {
                        return Err(ValidationError::new(
                            "heartbeat task",
                            format!(
                                "two tasks are named {name:?}: give each its own name (the name keeps when it was last done)"
                            ),
                        ));
                    }
                    out.tasks.push(BeatTask {
                        name,
                        cadence,
                        text,
                    });
                }
            }
            Ok(())
        };
        for line in text.lines() {
            if let Some(task) = heading(line) {
                let task = task.map_err(|e| {
                    ValidationError::new(
                        "heartbeat task",
                        format!("{}: {}", line.trim(), e.message),
                    )
                })?;
                flush(current.take(), &mut body, &mut out)?;
                current = Some(task);
            } else {
                body.push_str(line);
                body.push('\n');
            }
        }
        flush(current, &mut body, &mut out)?;
        if out.tasks.is_empty() && !out.guidance.is_empty() {
            out.tasks.push(BeatTask {
                name: EVERY_BEAT_TASK.into(),
                cadence: Cadence::EveryBeat,
                text: std::mem::take(&mut out.guidance),
            });
        }
        Ok(out)
    }

    /// The instructions of an agent, read leniently: instructions stored before tasks
    /// existed (or that no longer read) are one task due every beat.
    pub fn of(text: Option<&str>) -> Self {
        let text = text.unwrap_or_default();
        Self::parse(text).unwrap_or_else(|_| Self {
            guidance: String::new(),
            tasks: vec![BeatTask {
                name: EVERY_BEAT_TASK.into(),
                cadence: Cadence::EveryBeat,
                text: text.trim().to_owned(),
            }],
        })
    }

    /// The tasks due at `at`, by name.
    pub fn due(&self, at: &Moment<'_>) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|t| at.is_due(t))
            .map(|t| t.name.clone())
            .collect()
    }

    /// The shortest time between two runs of a task, where a task says it ahead: every
    /// beat is `Some(ZERO)`; `None` when no task has a fixed period.
    pub fn shortest_period(&self) -> Option<SignedDuration> {
        self.tasks
            .iter()
            .filter_map(|t| match t.cadence {
                Cadence::EveryBeat => Some(SignedDuration::ZERO),
                Cadence::Every(d) => Some(d),
                _ => None,
            })
            .min()
    }
}

/// A task heading: `## Name (cadence)`. `None` for any other line, headings whose
/// parentheses hold no cadence included.
fn heading(line: &str) -> Option<Result<(String, Cadence), ValidationError>> {
    let title = line.trim().strip_prefix("## ")?.trim();
    let inner = title.strip_suffix(')')?;
    let open = inner.rfind('(')?;
    let cadence = Cadence::parse(&inner[open + 1..])?;
    let name = inner[..open].trim();
    Some(cadence.and_then(|c| {
        if name.is_empty() {
            Err(ValidationError::new(
                "heartbeat task",
                "give the task a name before its cadence, e.g. ## Inbox (every 4h)",
            ))
        } else {
            Ok((name.to_owned(), c))
        }
    }))
}

/// What a heartbeat knows when it asks which tasks are due.
#[derive(Clone, Debug)]
pub struct Moment<'a> {
    /// When the heartbeat started.
    pub now: Timestamp,
    /// The agent's interval: a task a little early by the beat's timing is due (half
    /// of it is the slack), and a cron time is looked for since one interval ago when
    /// the task was never done.
    pub interval: SignedDuration,
    /// The agent's time zone, for cron patterns.
    pub timezone: &'a TimeZoneName,
    /// Since when the user has been silent: their last message, or the agent's creation.
    pub silent_since: Timestamp,
    /// The types of the events the heartbeat read and its tools returned.
    pub event_types: &'a [&'a str],
    /// When each task was last done.
    pub runs: &'a BTreeMap<String, Timestamp>,
}

impl Moment<'_> {
    fn is_due(&self, task: &BeatTask) -> bool {
        let last = self.runs.get(&task.name).copied();
        match &task.cadence {
            Cadence::EveryBeat => true,
            Cadence::Every(d) => {
                last.is_none_or(|l| self.now.duration_since(l) + self.interval / 2 >= *d)
            }
            Cadence::Cron(pattern) => {
                let Ok(rule) = ScheduleRule::cron(pattern, self.timezone.clone()) else {
                    return false;
                };
                let since = last.unwrap_or_else(|| self.now - self.interval);
                rule.next_after(since).is_some_and(|t| t <= self.now)
            }
            Cadence::OnEvents(types) => self
                .event_types
                .iter()
                .any(|e| types.iter().any(|t| type_matches(t, e))),
            Cadence::Silent(d) => {
                self.now.duration_since(self.silent_since) >= *d
                    && last.is_none_or(|l| l < self.silent_since + *d)
            }
        }
    }
}

fn type_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// What a heartbeat carries about its agent's tasks: when each was last done (handed on
/// from heartbeat to heartbeat) and, once it has run, which were due in it; and what it
/// knows of the agent's prompt cache, handed on the same way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLedger {
    /// When each task was last done, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runs: BTreeMap<String, Timestamp>,
    /// The tasks due in this heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub due: Vec<String>,
    /// The agent's prompt cache, as the last model call left it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::domain::CacheKept>,
}

impl TaskLedger {
    /// Whether it holds nothing (left out of stored records).
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.due.is_empty() && self.cache.is_none()
    }

    /// This ledger with `cache` as what is known of the prompt cache, when known.
    pub fn caching(mut self, cache: Option<crate::domain::CacheKept>) -> Self {
        if cache.is_some() {
            self.cache = cache;
        }
        self
    }

    /// As a store keeps it: JSON, or nothing when it is empty.
    pub fn stored(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(self).unwrap_or_default())
    }

    /// The ledger the next heartbeat starts from: the tasks due in this one marked done
    /// at `at` when its heartbeat agent thought (`done`), and the tasks the instructions
    /// no longer have forgotten.
    pub fn handed_on(&self, done: bool, at: Timestamp, tasks: &Instructions) -> Self {
        let mut runs = self.runs.clone();
        if done {
            for name in &self.due {
                runs.insert(name.clone(), at);
            }
        }
        runs.retain(|name, _| tasks.tasks.iter().any(|t| &t.name == name));
        Self {
            runs,
            due: Vec::new(),
            cache: self.cache,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "Be brief.\n\n## Inbox (every 4h)\nLook at the inbox.\n\n## Morning plan (cron 0 8 * * MON-FRI)\nPlan the day.\n\n## Builds (on ci.failed, deploy.*)\nSay what broke.\n\n## Check in (when silent 2d)\nAsk how it goes.\n\n## Notes (not a task)\nStill the check-in's text.";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn instructions_read_as_guidance_and_tasks() {
        let i = Instructions::parse(EXAMPLE).unwrap();
        assert_eq!(i.guidance, "Be brief.");
        let names: Vec<_> = i.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Inbox", "Morning plan", "Builds", "Check in"]);
        assert_eq!(
            i.tasks[0].cadence,
            Cadence::Every(SignedDuration::from_hours(4))
        );
        assert_eq!(i.tasks[1].cadence.to_string(), "cron 0 8 * * MON-FRI");
        assert_eq!(
            i.tasks[2].cadence,
            Cadence::OnEvents(vec!["ci.failed".into(), "deploy.*".into()])
        );
        assert_eq!(i.tasks[3].cadence.to_string(), "when silent 48h");
        assert!(
            i.tasks[3]
                .text
                .ends_with("## Notes (not a task)\nStill the check-in's text.")
        );
        assert_eq!(i.shortest_period(), Some(SignedDuration::from_hours(4)));

        // Without headings: one task, every beat, as before.
        let plain = Instructions::parse("Look at the inbox.").unwrap();
        assert_eq!(plain.guidance, "");
        assert_eq!(plain.tasks[0].name, EVERY_BEAT_TASK);
        assert_eq!(plain.tasks[0].cadence, Cadence::EveryBeat);
        assert_eq!(plain.shortest_period(), Some(SignedDuration::ZERO));
        assert!(Instructions::parse("").unwrap().tasks.is_empty());
    }

    #[test]
    fn a_wrong_cadence_says_which_heading_and_how() {
        for (text, says) in [
            ("## Inbox (every often)", "## Inbox (every often)"),
            ("## Inbox (every 0s)", "more than zero"),
            ("## Plan (cron 0 8 * *)", "5"),
            ("## Builds (on )", "event types"),
            ("## Builds (on ci failed)", "event types"),
            ("## Quiet (when idle 2d)", "when silent"),
            ("## (every 4h)", "give the task a name"),
            ("## A (every 1h)\n## a (every 2h)", "two tasks are named"),
        ] {
            let e = Instructions::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        // Read leniently when stored: the whole text is one task.
        let of = Instructions::of(Some("## Inbox (every often)\nx"));
        assert_eq!(of.tasks.len(), 1);
        assert_eq!(of.tasks[0].cadence, Cadence::EveryBeat);
    }

    #[test]
    fn tasks_are_due_by_their_cadences() {
        let i = Instructions::parse(EXAMPLE).unwrap();
        let utc = TimeZoneName::utc();
        let mut runs = BTreeMap::new();
        // Monday 2026-12-07 08:10 UTC, beats every 15 minutes; the user spoke an hour ago.
        let now = t("2026-12-07T08:10:00Z");
        let moment = |runs: &BTreeMap<String, Timestamp>, types: &[&str], silent: &str| {
            let types: Vec<&str> = types.to_vec();
            let m = Moment {
                now,
                interval: SignedDuration::from_mins(15),
                timezone: &utc,
                silent_since: t(silent),
                event_types: &types,
                runs,
            };
            i.due(&m)
        };
        // Never done: the inbox is due; 08:00 passed in the last interval.
        assert_eq!(
            moment(&runs, &[], "2026-12-07T07:10:00Z"),
            ["Inbox", "Morning plan"]
        );
        runs.insert("Inbox".into(), t("2026-12-07T04:17:00Z"));
        runs.insert("Morning plan".into(), t("2026-12-07T08:05:00Z"));
        // 3h53m since the inbox: within half a beat of 4h, so due; the plan was done.
        assert_eq!(moment(&runs, &[], "2026-12-07T07:10:00Z"), ["Inbox"]);
        runs.insert("Inbox".into(), t("2026-12-07T05:00:00Z"));
        assert!(moment(&runs, &[], "2026-12-07T07:10:00Z").is_empty());
        // Events of a named type or prefix make their task due.
        assert_eq!(
            moment(&runs, &["deploy.eu"], "2026-12-07T07:10:00Z"),
            ["Builds"]
        );
        assert!(moment(&runs, &["ci.passed"], "2026-12-07T07:10:00Z").is_empty());
        // Silent for two days: due once, not again until the user speaks and goes silent.
        assert_eq!(moment(&runs, &[], "2026-12-05T08:00:00Z"), ["Check in"]);
        runs.insert("Check in".into(), t("2026-12-07T08:05:00Z"));
        assert!(moment(&runs, &[], "2026-12-05T08:00:00Z").is_empty());
        assert!(moment(&runs, &[], "2026-12-05T08:30:00Z").is_empty());
    }

    #[test]
    fn the_ledger_hands_on_what_was_done() {
        let i = Instructions::parse(EXAMPLE).unwrap();
        let at = t("2026-12-07T08:10:00Z");
        let ledger = TaskLedger {
            runs: BTreeMap::from([("Gone".to_owned(), at), ("Builds".to_owned(), at)]),
            due: vec!["Inbox".into()],
            cache: None,
        };
        let next = ledger.handed_on(true, at, &i);
        assert_eq!(next.runs.keys().collect::<Vec<_>>(), ["Builds", "Inbox"]);
        assert!(next.due.is_empty());
        // A heartbeat that did not think leaves its due tasks due.
        let next = ledger.handed_on(false, at, &i);
        assert_eq!(next.runs.keys().collect::<Vec<_>>(), ["Builds"]);
    }
}
