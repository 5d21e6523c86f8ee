//! Time values of the domain: heartbeat intervals, active hours in a time zone, and the
//! schedule arithmetic built on them. Pure functions; the clock itself is a port.

use std::fmt;
use std::str::FromStr;

use jiff::civil::Time;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ValidationError;

/// Milliseconds since the Unix epoch, as the storage adapters keep timestamps.
pub fn to_ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

/// The timestamp for `ms` milliseconds since the Unix epoch (clamped to jiff's range).
pub fn from_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// Parses a duration such as `2s`, `15m`, `1h30m`, `5d` (days of 24 hours) or ISO 8601
/// `PT15M`.
pub fn parse_duration(what: &'static str, s: &str) -> Result<SignedDuration, ValidationError> {
    let t = s.trim();
    // jiff's signed durations have no days (a calendar day is not always 24 h); here a
    // day means 24 hours, as in `--disable-after 5d`.
    if let Some(days) = t.strip_suffix('d').and_then(|n| n.parse::<i64>().ok())
        && (0..=36_500).contains(&days)
    {
        return Ok(SignedDuration::from_hours(days * 24));
    }
    t.parse::<SignedDuration>().map_err(|_| {
        ValidationError::new(
            what,
            format!("{s:?} is not a duration; write e.g. 2s, 15m, 1h30m or 5d"),
        )
    })
}

/// Formats a duration the way users write it (`15m`, `2s`).
pub fn format_duration(d: SignedDuration) -> String {
    format!("{d:#}")
}

/// How often an agent's heartbeat runs: at least one second, at most 31 days.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Interval(SignedDuration);

impl Interval {
    /// The default heartbeat interval: 15 minutes.
    pub const DEFAULT: Interval = Interval(SignedDuration::from_secs(15 * 60));

    /// Validates an interval.
    pub fn new(d: SignedDuration) -> Result<Self, ValidationError> {
        if d < SignedDuration::from_secs(1) || d > SignedDuration::from_hours(31 * 24) {
            return Err(ValidationError::new(
                "interval",
                format!(
                    "{} is out of range; use between 1s and 31 days",
                    format_duration(d)
                ),
            ));
        }
        Ok(Self(d))
    }
    /// The interval as a duration.
    pub fn duration(self) -> SignedDuration {
        self.0
    }
}

impl FromStr for Interval {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(parse_duration("interval", s)?)
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl Serialize for Interval {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How long an agent's finished records are kept (heartbeats, processed events, actions,
/// conversation turns, hook deliveries, webhook request logs): at least a day, at most ten
/// years. Memories and the agent's settings are kept for as long as it exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Retention(SignedDuration);

impl Retention {
    /// The default: 30 days.
    pub const DEFAULT: Retention = Retention(SignedDuration::from_hours(30 * 24));

    /// Validates a retention.
    pub fn new(d: SignedDuration) -> Result<Self, ValidationError> {
        if d < SignedDuration::from_hours(24) || d > SignedDuration::from_hours(3650 * 24) {
            return Err(ValidationError::new(
                "retention",
                format!(
                    "{} is out of range; keep records between 1d and 3650d",
                    format_duration(d)
                ),
            ));
        }
        Ok(Self(d))
    }
    /// The retention as a duration.
    pub fn duration(self) -> SignedDuration {
        self.0
    }
    /// What finished before this time is removed at `now`.
    pub fn horizon(self, now: Timestamp) -> Timestamp {
        now.saturating_sub(self.0).unwrap_or(now)
    }
}

impl FromStr for Retention {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(parse_duration("retention", s)?)
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hours = self.0.as_hours();
        if self.0.as_secs() % 86_400 == 0 {
            write!(f, "{}d", hours / 24)
        } else {
            f.write_str(&format_duration(self.0))
        }
    }
}

impl Serialize for Retention {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How long an agent's user may stay silent before the agent stops beating on its own
/// (`--auto-pause-after`): a day to a year, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoPause {
    /// Never.
    Off,
    /// After this much silence.
    After(SignedDuration),
}

impl AutoPause {
    /// The default: after 30 days of silence.
    pub const DEFAULT: AutoPause = AutoPause::After(SignedDuration::from_hours(30 * 24));

    /// The silence it waits for, unless off.
    pub fn after(self) -> Option<SignedDuration> {
        match self {
            Self::Off => None,
            Self::After(d) => Some(d),
        }
    }
}

impl FromStr for AutoPause {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        let d = parse_duration("auto-pause", s)?;
        if d < SignedDuration::from_hours(24) || d > SignedDuration::from_hours(366 * 24) {
            return Err(ValidationError::new(
                "auto-pause",
                format!(
                    "{} is out of range; give 1d to 366d of silence, or off",
                    format_duration(d)
                ),
            ));
        }
        Ok(Self::After(d))
    }
}

impl fmt::Display for AutoPause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::After(d) if d.as_secs() % 86_400 == 0 => write!(f, "{}d", d.as_hours() / 24),
            Self::After(d) => f.write_str(&format_duration(*d)),
        }
    }
}

impl Serialize for AutoPause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AutoPause {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An IANA time zone name (`UTC`, `Europe/Paris`), checked against the bundled database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeZoneName(String);

impl TimeZoneName {
    /// UTC.
    pub fn utc() -> Self {
        Self("UTC".to_owned())
    }
    /// Validates a time zone name.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        TimeZone::get(s).map_err(|_| {
            ValidationError::new(
                "time zone",
                format!("{s:?} is not a known IANA time zone (e.g. UTC, Europe/Paris)"),
            )
        })?;
        Ok(Self(s.to_owned()))
    }
    /// The zone's rules. Falls back to UTC only if the name stopped resolving, which the
    /// bundled database makes impossible for a name that once validated.
    pub fn zone(&self) -> TimeZone {
        TimeZone::get(&self.0).unwrap_or(TimeZone::UTC)
    }
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TimeZoneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for TimeZoneName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TimeZoneName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The daily hours in which an agent's heartbeats may run, `HH:MM-HH:MM` in the agent's
/// time zone. A range that wraps midnight (`22:00-06:00`) is allowed; the end is exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveHours {
    start: Time,
    end: Time,
}

impl ActiveHours {
    /// Whether `t` (a wall-clock time) falls inside the hours.
    pub fn contains(&self, t: Time) -> bool {
        if self.start < self.end {
            self.start <= t && t < self.end
        } else {
            t >= self.start || t < self.end
        }
    }

    /// The first instant at or after `at` that falls inside the hours in `tz`.
    pub fn next_active(&self, at: Timestamp, tz: &TimeZone) -> Timestamp {
        let zoned = at.to_zoned(tz.clone());
        if self.contains(zoned.time()) {
            return at;
        }
        // Outside the hours, the next opening is today's start if it is still ahead,
        // otherwise tomorrow's. That holds for wrapping ranges too.
        let mut day = zoned.date();
        for _ in 0..3 {
            if let Ok(open) = day
                .at(self.start.hour(), self.start.minute(), 0, 0)
                .to_zoned(tz.clone())
            {
                // A start time skipped by a DST gap (02:30 on the spring-forward night)
                // opens when the clocks jump, the first instant inside the hours.
                let open = match tz.preceding(open.timestamp()).next() {
                    Some(jump)
                        if open.time() != self.start
                            && self.contains(jump.timestamp().to_zoned(tz.clone()).time()) =>
                    {
                        jump.timestamp()
                    }
                    _ => open.timestamp(),
                };
                if open >= at {
                    return open;
                }
            }
            match day.tomorrow() {
                Ok(d) => day = d,
                Err(_) => break,
            }
        }
        at
    }
}

impl FromStr for ActiveHours {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ValidationError::new(
                "active hours",
                format!("{s:?} is not HH:MM-HH:MM, e.g. 08:00-22:00"),
            )
        };
        let (a, b) = s.trim().split_once('-').ok_or_else(bad)?;
        let parse = |x: &str| -> Result<Time, ValidationError> {
            let (h, m) = x.trim().split_once(':').ok_or_else(bad)?;
            let (h, m) = (
                h.parse::<i8>().map_err(|_| bad())?,
                m.parse::<i8>().map_err(|_| bad())?,
            );
            Time::new(h, m, 0, 0).map_err(|_| bad())
        };
        let (start, end) = (parse(a)?, parse(b)?);
        if start == end {
            return Err(ValidationError::new(
                "active hours",
                format!("{s:?} is empty; leave active hours unset to run around the clock"),
            ));
        }
        Ok(Self { start, end })
    }
}

impl fmt::Display for ActiveHours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}:{:02}-{:02}:{:02}",
            self.start.hour(),
            self.start.minute(),
            self.end.hour(),
            self.end.minute()
        )
    }
}

impl Serialize for ActiveHours {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ActiveHours {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_days_of_twenty_four_hours() {
        assert_eq!(
            parse_duration("d", "5d").unwrap(),
            SignedDuration::from_hours(120)
        );
        assert_eq!(
            parse_duration("d", "90s").unwrap(),
            SignedDuration::from_secs(90)
        );
        assert!(parse_duration("d", "xd").is_err());
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn intervals_accept_seconds_and_reject_zero() {
        assert_eq!(
            "2s".parse::<Interval>().unwrap().duration(),
            SignedDuration::from_secs(2)
        );
        assert_eq!("15m".parse::<Interval>().unwrap().to_string(), "15m");
        assert!("0s".parse::<Interval>().is_err());
        assert!("soon".parse::<Interval>().is_err());
    }

    #[test]
    fn a_time_inside_active_hours_is_kept() {
        let h: ActiveHours = "08:00-22:00".parse().unwrap();
        let t = ts("2026-03-02T10:00:00Z");
        assert_eq!(h.next_active(t, &TimeZone::UTC), t);
    }

    #[test]
    fn a_time_after_hours_moves_to_the_next_morning() {
        let h: ActiveHours = "08:00-22:00".parse().unwrap();
        let t = ts("2026-03-02T23:10:00Z");
        assert_eq!(h.next_active(t, &TimeZone::UTC), ts("2026-03-03T08:00:00Z"));
        let early = ts("2026-03-02T06:00:00Z");
        assert_eq!(
            h.next_active(early, &TimeZone::UTC),
            ts("2026-03-02T08:00:00Z")
        );
    }

    #[test]
    fn wrapping_hours_cover_midnight() {
        let h: ActiveHours = "22:00-06:00".parse().unwrap();
        assert_eq!(
            h.next_active(ts("2026-03-02T23:00:00Z"), &TimeZone::UTC),
            ts("2026-03-02T23:00:00Z")
        );
        assert_eq!(
            h.next_active(ts("2026-03-02T12:00:00Z"), &TimeZone::UTC),
            ts("2026-03-02T22:00:00Z")
        );
    }

    #[test]
    fn active_hours_follow_the_agents_time_zone() {
        let h: ActiveHours = "08:00-22:00".parse().unwrap();
        let paris = TimeZoneName::parse("Europe/Paris").unwrap().zone();
        // 06:30 UTC is 07:30 in Paris in winter: opens at 08:00 Paris = 07:00 UTC.
        assert_eq!(
            h.next_active(ts("2026-01-10T06:30:00Z"), &paris),
            ts("2026-01-10T07:00:00Z")
        );
    }

    #[test]
    fn hours_follow_a_dst_change_and_a_start_in_the_gap_opens_when_the_clocks_jump() {
        let berlin = TimeZoneName::parse("Europe/Berlin").unwrap().zone();
        let day: ActiveHours = "08:00-22:00".parse().unwrap();
        // 23:30 CET on the night clocks go forward: 08:00 CEST is 06:00 UTC, not 07:00.
        assert_eq!(
            day.next_active(ts("2026-03-28T22:30:00Z"), &berlin),
            ts("2026-03-29T06:00:00Z")
        );
        // And back: 08:00 CET on 25 October is 07:00 UTC.
        assert_eq!(
            day.next_active(ts("2026-10-24T21:00:00Z"), &berlin),
            ts("2026-10-25T07:00:00Z")
        );
        // 02:30 does not exist on 29 March: the hours open at 03:00 CEST (01:00 UTC).
        let night: ActiveHours = "02:30-04:00".parse().unwrap();
        assert_eq!(
            night.next_active(ts("2026-03-28T23:00:00Z"), &berlin),
            ts("2026-03-29T01:00:00Z")
        );
    }

    #[test]
    fn malformed_or_empty_hours_are_rejected() {
        assert!("8-22".parse::<ActiveHours>().is_err());
        assert!("25:00-02:00".parse::<ActiveHours>().is_err());
        assert!("08:00-08:00".parse::<ActiveHours>().is_err());
        assert!(TimeZoneName::parse("Mars/Olympus").is_err());
    }
}
