//! Dollars: budgets in US dollars and what is held and spent against them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ValidationError;

/// An amount of US dollars, kept in millionths (micro-dollars) so sums are exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(u64);

impl Usd {
    /// Nothing.
    pub const ZERO: Usd = Usd(0);
    /// The largest budget accepted: a million dollars.
    pub const MAX_BUDGET: Usd = Usd(1_000_000 * 1_000_000);

    /// `n` millionths of a dollar.
    pub const fn from_micros(n: u64) -> Self {
        Self(n)
    }

    /// In millionths of a dollar.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// `d` dollars, rounded up to the next millionth (a cost is never undercounted);
    /// zero for what is not a positive finite number.
    pub fn from_dollars(d: f64) -> Self {
        if d.is_finite() && d > 0.0 {
            Self((d * 1_000_000.0).ceil().min(u64::MAX as f64) as u64)
        } else {
            Self(0)
        }
    }

    /// In dollars.
    pub fn dollars(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }

    /// Reads a budget: dollars, with or without `$` (`2.50`, `$40`), more than 0 and at
    /// most a million.
    pub fn parse_budget(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| {
            ValidationError::new(
                "dollar budget",
                format!("{s:?}: {why}; give dollars, e.g. 2.50 or 40"),
            )
        };
        let t = s.trim().trim_start_matches('$');
        let d: f64 = t.parse().map_err(|_| bad("not a number"))?;
        if !d.is_finite() || d <= 0.0 {
            return Err(bad("use more than 0"));
        }
        let usd = Self::from_dollars(d);
        if usd > Self::MAX_BUDGET {
            return Err(bad("use at most 1000000"));
        }
        Ok(usd)
    }

    /// `self` less `other`, never below zero.
    pub fn saturating_sub(self, other: Usd) -> Usd {
        Usd(self.0.saturating_sub(other.0))
    }

    /// `self` and `other`.
    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Usd {
    /// `$2.50`; amounts under a cent with the digits that tell them apart (`$0.0042`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(10_000) || self.0 >= 1_000_000 {
            write!(f, "${:.2}", self.dollars())
        } else {
            let s = format!("{:.6}", self.dollars());
            write!(f, "${}", s.trim_end_matches('0'))
        }
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !v.is_finite() || v < 0.0 {
            return Err(serde::de::Error::custom(format!(
                "{v} is not an amount of dollars"
            )));
        }
        // Stored amounts are whole millionths: round, not up.
        Ok(Self((v * 1_000_000.0).round() as u64))
    }
}

/// A budget's period and its limit: `2026-12-06` (a day) or `2026-12` (a month), in the
/// agent's time zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The period.
    pub period: String,
    /// The most that may be spent in it.
    pub limit: Usd,
}

/// What one period of an agent's dollar budget holds: spent (settled calls) and held
/// (calls being made, at their worst case).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The period.
    pub period: String,
    /// Spent by calls made and settled.
    pub spent: Usd,
    /// Held for calls being made.
    pub held: Usd,
}

impl Tally {
    /// Spent and held together: what a new hold must fit beside.
    pub fn committed(&self) -> Usd {
        self.spent.saturating_add(self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_read_print_and_round_trip_in_millionths() {
        assert_eq!(
            Usd::parse_budget("2.50").unwrap(),
            Usd::from_micros(2_500_000)
        );
        assert_eq!(Usd::parse_budget("$40").unwrap().to_string(), "$40.00");
        assert!(Usd::parse_budget("0").is_err());
        assert!(Usd::parse_budget("-1").is_err());
        assert!(
            Usd::parse_budget("lots")
                .unwrap_err()
                .to_string()
                .contains("e.g. 2.50")
        );
        assert!(Usd::parse_budget("2000000").is_err());
        assert_eq!(Usd::from_micros(4_200).to_string(), "$0.0042");
        assert_eq!(
            Usd::from_dollars(0.000_000_1),
            Usd::from_micros(1),
            "rounded up"
        );
        let json = serde_json::to_string(&Usd::from_micros(1_250_000)).unwrap();
        assert_eq!(json, "1.25");
        let back: Usd = serde_json::from_str(&json).unwrap();
        assert_eq!(back, Usd::from_micros(1_250_000));
        assert!(serde_json::from_str::<Usd>("-2").is_err());
    }
}
