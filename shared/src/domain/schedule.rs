//! Reminders: an agent's schedules beside its interval — a one-time wake, or a cron
//! pattern in a time zone. Each wake puts a SCHEDULED event (with the note) in the
//! agent's log and makes a heartbeat due then.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use super::expectation::Expectation;
use super::ids::AgentId;
use super::time::TimeZoneName;
use crate::error::ValidationError;

/// The event type of a wake.
pub const SCHEDULED: &str = "SCHEDULED";
/// The event a heartbeat its user asked for (`pulse heartbeats trigger`, `/heartbeat`)
/// reads: the agent woke because it was asked to.
pub const WAKE_REQUESTED: &str = "WAKE_REQUESTED";
/// The event type of wakes that were missed (the agent was paused or nothing ran), so
/// the agent learns of them rather than their being skipped in silence.
pub const SCHEDULE_MISSED: &str = "SCHEDULE_MISSED";

/// How far ahead a one-time schedule may be.
pub(crate) const MAX_AHEAD: SignedDuration = SignedDuration::from_hours(24 * 3653);

/// Longest note a schedule carries.
pub const MAX_NOTE_CHARS: usize = 500;

/// How far ahead a cron pattern is checked against the breaker (two days: every hour
/// of every weekday pattern and of a day with a DST change comes up).
const CHECKED_AHEAD: SignedDuration = SignedDuration::from_hours(48);

/// A schedule's id, `sch_` and a ULID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ScheduleId(String);

impl ScheduleId {
    /// A new id, made at `at`: ids made later sort after, also within a millisecond.
    pub fn generate(at: Timestamp) -> Self {
        let ms = at.as_millisecond().max(0) as u64;
        Self(format!(
            "sch_{}",
            Ulid::from_parts(ms, crate::entropy::monotonic(ms))
        ))
    }
    /// Validates an id.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let rest = s.strip_prefix("sch_").ok_or_else(|| {
            ValidationError::new("schedule id", format!("{s:?} does not start with \"sch_\""))
        })?;
        let u = Ulid::from_string(rest).map_err(|e| {
            ValidationError::new("schedule id", format!("{s:?} is not sch_ and a ULID: {e}"))
        })?;
        Ok(Self(format!("sch_{u}")))
    }
    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for ScheduleId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<ScheduleId> for String {
    fn from(id: ScheduleId) -> Self {
        id.0
    }
}

/// When a schedule wakes its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScheduleRule {
    /// Once, at a time.
    Once {
        /// When.
        at: Timestamp,
    },
    /// At the times a cron pattern names (minute, hour, day of month, month, day of
    /// week), in a time zone.
    Cron {
        /// The pattern, e.g. `0 9 * * MON-FRI`.
        pattern: String,
        /// Its time zone.
        timezone: TimeZoneName,
    },
}

impl ScheduleRule {
    /// A cron rule, its pattern checked.
    pub fn cron(pattern: &str, timezone: TimeZoneName) -> Result<Self, ValidationError> {
        parse_cron(pattern)?;
        Ok(Self::Cron {
            pattern: pattern.trim().to_owned(),
            timezone,
        })
    }

    /// The first wake strictly after `t`; `None` when there is none (a one-time rule
    /// whose time has passed, a pattern that never matches again).
    /// Wakes are whole milliseconds, as the stores keep times.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Self::Once { at } => {
                let at = Timestamp::from_millisecond(at.as_millisecond()).unwrap_or(*at);
                (at > t).then_some(at)
            }
            Self::Cron { pattern, timezone } => {
                let cron = parse_cron(pattern).ok()?;
                let from = t.to_zoned(timezone.zone());
                cron.find_next_occurrence(&from, false)
                    .ok()
                    .map(|z| z.timestamp())
            }
        }
    }

    /// The most wakes within any hour from `from` over the next two days.
    pub fn busiest_hour(&self, from: Timestamp) -> u32 {
        busiest_hour(std::slice::from_ref(self), from)
    }

    /// Its wakes after `from` up to `until` (at most `limit`), in order.
    pub fn wakes_between(&self, from: Timestamp, until: Timestamp, limit: usize) -> Vec<Timestamp> {
        let mut wakes = Vec::new();
        let mut t = from;
        while let Some(next) = self.next_after(t) {
            if next > until || wakes.len() >= limit {
                break;
            }
            wakes.push(next);
            t = next;
        }
        wakes
    }
}

/// The most wakes of all of `rules` together within any hour from `from` over the next
/// two days: what the breaker must allow beside the heartbeats the interval plans.
pub fn busiest_hour(rules: &[ScheduleRule], from: Timestamp) -> u32 {
    let end = from.saturating_add(CHECKED_AHEAD).unwrap_or(from);
    let mut wakes: Vec<Timestamp> = rules
        .iter()
        .flat_map(|r| r.wakes_between(from, end, 10_000))
        .collect();
    wakes.sort();
    let hour = SignedDuration::from_hours(1);
    let mut most = 0;
    let mut first = 0;
    for (i, w) in wakes.iter().enumerate() {
        while w.duration_since(wakes[first]) >= hour {
            first += 1;
        }
        most = most.max(i - first + 1);
    }
    u32::try_from(most).unwrap_or(u32::MAX)
}

fn parse_cron(pattern: &str) -> Result<Cron, ValidationError> {
    let pattern = pattern.trim();
    let fields = pattern.split_whitespace().count();
    if fields != 5 && !pattern.starts_with('@') {
        return Err(ValidationError::new(
            "cron",
            format!(
                "{pattern:?} has {fields} fields; give 5: minute hour day-of-month month day-of-week, e.g. \"0 9 * * MON-FRI\""
            ),
        ));
    }
    if !pattern.starts_with('@') {
        for (field, text) in CRON_FIELDS.iter().zip(pattern.split_whitespace()) {
            field
                .check(text)
                .map_err(|why| ValidationError::new("cron", format!("{pattern:?}: {why}")))?;
        }
    }
    let parser = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build();
    // The fields are checked above in words; what the parser still refuses is a shape
    // (a range upside down, a stray character), said the same way for any field.
    let cron = parser.parse(pattern).map_err(|_| {
        ValidationError::new(
            "cron",
            format!(
                "{pattern:?} is not a pattern: each field is *, a value, a range (1-5), a list (1,3,5) or a step (*/15), e.g. \"0 9 * * MON-FRI\""
            ),
        )
    })?;
    // Parsing accepts some patterns no date matches (31 February).
    let probe = Timestamp::UNIX_EPOCH.to_zoned(jiff::tz::TimeZone::UTC);
    cron.find_next_occurrence(&probe, false).map_err(|_| {
        ValidationError::new(
            "cron",
            format!(
                "{pattern:?} never matches a date: no month given has the day of month given (e.g. the 31st in February)"
            ),
        )
    })?;
    Ok(cron)
}

/// One field of a five-field cron pattern: its name, range and value names.
struct CronField {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

/// Minute, hour, day of month, month, day of week (0 and 7 are Sunday).
const CRON_FIELDS: [CronField; 5] = [
    CronField {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    CronField {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    CronField {
        name: "day-of-month",
        min: 1,
        max: 31,
        names: &["L", "W", "LW"],
    },
    CronField {
        name: "month",
        min: 1,
        max: 12,
        names: &[
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ],
    },
    CronField {
        name: "day-of-week",
        min: 0,
        max: 7,
        names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "L"],
    },
];

impl CronField {
    /// Checks every value and name in `text`: values in range, steps at least 1, names
    /// the field knows; says which field and value is wrong.
    fn check(&self, text: &str) -> Result<(), String> {
        let mut after = ' ';
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if !c.is_ascii_alphanumeric() {
                after = c;
                continue;
            }
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !d.is_ascii_alphanumeric() {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            let token = &text[i..end];
            let digits = token.trim_end_matches(['L', 'W', 'l', 'w']);
            if let Ok(n) = digits.parse::<u32>() {
                let (lo, hi) = match after {
                    '/' => (1, self.max.max(1)),
                    '#' => (1, 5),
                    _ => (self.min, self.max),
                };
                if !(lo..=hi).contains(&n) {
                    let what = match after {
                        '/' => "step",
                        '#' => "week of the month",
                        _ => "value",
                    };
                    return Err(format!(
                        "the {} field {text:?} has {what} {n}, outside {lo}-{hi}",
                        self.name
                    ));
                }
            } else if !self.names.iter().any(|n| n.eq_ignore_ascii_case(token)) {
                let known = if self.names.is_empty() {
                    "numbers only".to_owned()
                } else {
                    format!("numbers or {}", self.names.join(", "))
                };
                return Err(format!(
                    "the {} field {text:?} has {token:?}, which it does not take ({known})",
                    self.name
                ));
            }
            after = ' ';
        }
        Ok(())
    }
}

/// One of an agent's schedules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its id.
    pub id: ScheduleId,
    /// The agent it wakes.
    pub agent_id: AgentId,
    /// Its name in the agent's `schedules.toml` (`pulse apply`), by which it is found
    /// again; none for one made otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When.
    pub rule: ScheduleRule,
    /// What it is about, given to the agent with each wake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Its next wake; `None` once a one-time schedule has woken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<Timestamp>,
    /// Wakes so far.
    #[serde(default)]
    pub wakes: u32,
    /// What each heartbeat it wakes must do (`--expect`), and after how many of its runs
    /// in a row that did not its operator is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expectation>,
    /// Its runs in a row, up to the latest, that did not do what it expects.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incomplete_runs: u32,
    /// When it was made.
    pub created_at: Timestamp,
}

/// Whether a count is 0: then it is left out of the stored doc.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Schedule {
    /// A new schedule for `agent_id`, first waking after `now`. Refused when it would
    /// never wake, or with a note over [`MAX_NOTE_CHARS`].
    pub fn new(
        agent_id: &AgentId,
        rule: ScheduleRule,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<Self, ValidationError> {
        let note = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty());
        if let Some(n) = &note
            && n.chars().count() > MAX_NOTE_CHARS
        {
            return Err(ValidationError::new(
                "note",
                format!("at most {MAX_NOTE_CHARS} characters"),
            ));
        }
        let next_at = rule.next_after(now).ok_or_else(|| {
            ValidationError::new("schedule", "it would never wake: the time has passed")
        })?;
        if let ScheduleRule::Once { at } = &rule
            && at.duration_since(now) > MAX_AHEAD
        {
            return Err(ValidationError::new(
                "schedule",
                format!("{at} is more than ten years ahead; give a nearer time"),
            ));
        }
        Ok(Self {
            id: ScheduleId::generate(now),
            agent_id: agent_id.clone(),
            name: None,
            rule,
            note,
            next_at: Some(next_at),
            wakes: 0,
            expect: None,
            incomplete_runs: 0,
            created_at: now,
        })
    }

    /// The schedule named `name`.
    pub fn named(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }

    /// What an agent's files call it: its name, or its id when it has none.
    pub fn key(&self) -> &str {
        self.name.as_deref().unwrap_or(self.id.as_str())
    }

    /// The schedule expecting `expect` of each heartbeat it wakes: refused when its
    /// `alert_after` is outside 1 to [`Expectation::MAX_ALERT_AFTER`].
    pub fn expecting(mut self, expect: Option<Expectation>) -> Result<Self, ValidationError> {
        self.expect = expect.map(|e| e.checked("runs")).transpose()?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn paris(pattern: &str) -> ScheduleRule {
        ScheduleRule::cron(pattern, TimeZoneName::parse("Europe/Paris").unwrap()).unwrap()
    }

    #[test]
    fn a_weekday_pattern_wakes_at_nine_local_time_across_a_dst_change() {
        let rule = paris("0 9 * * MON-FRI");
        // Friday 2026-03-27, before the change to summer time on Sunday the 29th.
        let friday = rule.next_after(ts("2026-03-27T06:00:00Z")).unwrap();
        assert_eq!(friday, ts("2026-03-27T08:00:00Z"), "09:00 CET is 08:00 UTC");
        let monday = rule.next_after(friday).unwrap();
        assert_eq!(
            monday,
            ts("2026-03-30T07:00:00Z"),
            "09:00 CEST is 07:00 UTC"
        );
        // Back to winter time on Sunday 2026-10-25.
        let before = rule.next_after(ts("2026-10-23T06:00:00Z")).unwrap();
        assert_eq!(before, ts("2026-10-23T07:00:00Z"));
        assert_eq!(rule.next_after(before).unwrap(), ts("2026-10-26T08:00:00Z"));
    }

    #[test]
    fn an_hour_skipped_by_dst_does_not_wake_twice_or_never() {
        // 02:30 does not exist in Paris on 2026-03-29: one wake that day, the next at
        // 02:30 the day after.
        let rule = paris("30 2 * * *");
        let first = rule.next_after(ts("2026-03-28T12:00:00Z")).unwrap();
        let second = rule.next_after(first).unwrap();
        assert!(
            first >= ts("2026-03-29T00:00:00Z") && first < ts("2026-03-30T00:00:00Z"),
            "{first}"
        );
        assert_eq!(second, ts("2026-03-30T00:30:00Z"), "02:30 CEST");
    }

    #[test]
    fn a_one_time_rule_wakes_once() {
        let rule = ScheduleRule::Once {
            at: ts("2026-01-01T09:00:00Z"),
        };
        assert_eq!(
            rule.next_after(ts("2026-01-01T08:00:00Z")),
            Some(ts("2026-01-01T09:00:00Z"))
        );
        assert_eq!(rule.next_after(ts("2026-01-01T09:00:00Z")), None);
        assert_eq!(rule.busiest_hour(ts("2026-01-01T08:00:00Z")), 1);
    }

    #[test]
    fn the_busiest_hour_counts_wakes_in_any_hour() {
        let now = ts("2026-01-05T00:00:00Z");
        assert_eq!(paris("* * * * *").busiest_hour(now), 60);
        assert_eq!(paris("*/15 * * * *").busiest_hour(now), 4);
        assert_eq!(paris("0 9 * * MON-FRI").busiest_hour(now), 1);
    }

    #[test]
    fn a_bad_pattern_names_its_field_in_words_not_the_parser_s() {
        let utc = TimeZoneName::utc;
        let why = |p: &str| ScheduleRule::cron(p, utc()).unwrap_err().to_string();
        let minute = why("61 * * * *");
        assert!(
            minute.contains("the minute field \"61\" has value 61, outside 0-59"),
            "{minute}"
        );
        let step = why("*/0 * * * *");
        assert!(step.contains("has step 0, outside 1-59"), "{step}");
        let hour = why("0 24 * * *");
        assert!(hour.contains("the hour field"), "{hour}");
        let dow = why("0 9 * * FUNDAY");
        assert!(
            dow.contains("the day-of-week field \"FUNDAY\" has \"FUNDAY\""),
            "{dow}"
        );
        let never = why("0 0 31 2 *");
        assert!(never.contains("never matches a date"), "{never}");
        for p in [minute, step, hour, dow, never] {
            assert!(
                !p.contains("CronScheduler") && !p.contains("Component"),
                "the parser's wording: {p}"
            );
        }
        for ok in [
            "0 9 * * MON-FRI",
            "*/15 8-18 * * 1-5",
            "0 9 L * *",
            "0 9 * * MON#2",
            "0 0 1 JAN,JUL *",
        ] {
            assert!(ScheduleRule::cron(ok, utc()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_schedule_without_an_expectation_keeps_the_old_shape_and_one_with_reads_back() {
        use crate::domain::Must;
        let made = Schedule::new(
            &AgentId::generate(),
            ScheduleRule::cron("0 9 * * *", TimeZoneName::utc()).unwrap(),
            None,
            ts("2026-01-01T00:00:00Z"),
        )
        .unwrap();
        let doc = serde_json::to_value(&made).unwrap();
        assert!(
            doc.get("expect").is_none() && doc.get("incomplete_runs").is_none(),
            "{doc}"
        );
        let read: Schedule = serde_json::from_value(doc).unwrap();
        assert_eq!(
            read, made,
            "a doc stored before expectations reads as expecting nothing"
        );
        let speak = Expectation {
            must: Must::Speak,
            alert_after: 2,
        };
        let mut doc = serde_json::to_value(made.clone().expecting(Some(speak)).unwrap()).unwrap();
        assert_eq!(
            doc["expect"],
            serde_json::json!({"must": "speak", "alert_after": 2})
        );
        doc["incomplete_runs"] = serde_json::json!(1);
        let read: Schedule = serde_json::from_value(doc).unwrap();
        assert_eq!((read.expect, read.incomplete_runs), (Some(speak), 1));
        let never = made.expecting(Some(Expectation {
            alert_after: 0,
            ..speak
        }));
        let why = never.unwrap_err().to_string();
        assert!(why.contains("give 1 to 100 runs in a row"), "{why}");
    }

    #[test]
    fn patterns_are_checked() {
        let utc = TimeZoneName::utc;
        for bad in [
            "0 9 * *",
            "0 0 9 * * *",
            "61 * * * *",
            "0 9 * * FUNDAY",
            "0 0 31 2 *",
        ] {
            assert!(ScheduleRule::cron(bad, utc()).is_err(), "{bad}");
        }
        assert!(ScheduleRule::cron(" 0 9 * * mon-fri ", utc()).is_ok());
        let past = Schedule::new(
            &AgentId::generate(),
            ScheduleRule::Once {
                at: ts("2020-01-01T00:00:00Z"),
            },
            None,
            ts("2026-01-01T00:00:00Z"),
        );
        assert!(past.is_err());
        let id = ScheduleId::generate(ts("2026-01-01T00:00:00Z"));
        let next = ScheduleId::generate(ts("2026-01-01T00:00:00Z"));
        assert!(id < next, "ordered within a millisecond");
        assert_eq!(ScheduleId::parse(id.as_str()).unwrap(), id);
        assert!(ScheduleId::parse("ag_01").is_err());
    }
}
