//! What a heartbeat must do (`--expect`): an agent's expectation of each of its
//! heartbeats, or a schedule's of each heartbeat it wakes.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

/// What a heartbeat must do (`--expect`): one that finishes without doing it ends
/// `incomplete` (see [`super::OutcomeKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Must {
    /// Speak to its user.
    Speak,
    /// Act: speak, or call a tool that does something, or run a subscribed tool.
    Act,
}

impl Must {
    /// `speak` or `act`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Speak => "speak",
            Self::Act => "act",
        }
    }

    /// `speak` or `act`; what to write otherwise.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "speak" => Ok(Self::Speak),
            "act" => Ok(Self::Act),
            other => Err(ValidationError::new(
                "expect",
                format!("{other:?}: use speak or act (or none, on update)"),
            )),
        }
    }
}

/// An agent's expectation of its heartbeats, or a schedule's of the heartbeats it wakes:
/// what each must do, and after how many in a row that did not the
/// `HEARTBEAT_INCOMPLETE` hook fires (once a streak).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    pub must: Must,
    pub alert_after: u32,
}

impl Expectation {
    /// Incomplete heartbeats in a row before the hook fires, unless `--alert-after`.
    pub const ALERT_AFTER: u32 = 3;
    /// The most `--alert-after` takes.
    pub const MAX_ALERT_AFTER: u32 = 100;

    /// The expectation, refused when its `alert_after` is outside 1 to
    /// [`Self::MAX_ALERT_AFTER`]; `counted` names what is counted in a row (an agent's
    /// `heartbeats`, a schedule's `runs`).
    pub fn checked(self, counted: &str) -> Result<Self, ValidationError> {
        if (1..=Self::MAX_ALERT_AFTER).contains(&self.alert_after) {
            return Ok(self);
        }
        Err(ValidationError::new(
            "alert-after",
            format!(
                "{}: give 1 to {} {counted} in a row",
                self.alert_after,
                Self::MAX_ALERT_AFTER
            ),
        ))
    }
}
