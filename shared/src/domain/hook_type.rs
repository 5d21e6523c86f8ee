//! Hook types: what a hook fires on — the lifecycle points, and BEFORE_/AFTER_ of every
//! tool, named in SCREAMING_SNAKE_CASE.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ids::ToolName;
use crate::error::ValidationError;

/// A hook type: `BEFORE_HEARTBEAT`, `AFTER_SNIP_CREATE`, … (SCREAMING_SNAKE_CASE).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HookType(String);

impl HookType {
    /// Before a heartbeat processes its window.
    pub const BEFORE_HEARTBEAT: &'static str = "BEFORE_HEARTBEAT";
    /// After a heartbeat completed, with its counts.
    pub const AFTER_HEARTBEAT: &'static str = "AFTER_HEARTBEAT";
    /// A heartbeat failed (the next one is scheduled).
    pub const HEARTBEAT_FAILED: &'static str = "HEARTBEAT_FAILED";
    /// An action (one tool run for one event) started.
    pub const ACTION_STARTED: &'static str = "ACTION_STARTED";
    /// An action completed.
    pub const ACTION_COMPLETED: &'static str = "ACTION_COMPLETED";
    /// An action failed.
    pub const ACTION_FAILED: &'static str = "ACTION_FAILED";
    /// The agent's conversation took in user messages (a turn began).
    pub const MESSAGE_RECEIVED: &'static str = "MESSAGE_RECEIVED";
    /// The agent's reply reached Discord.
    pub const MESSAGE_SENT: &'static str = "MESSAGE_SENT";
    /// The agent's reply could not be delivered, however often it was tried: a dead
    /// letter (`pulse deliveries list`).
    pub const MESSAGE_UNDELIVERABLE: &'static str = "MESSAGE_UNDELIVERABLE";
    /// One of the agent's hooks was disabled (410 Gone, or failing for too long).
    pub const HOOK_DISABLED: &'static str = "HOOK_DISABLED";
    /// The agent was paused: its heartbeats stop until it is resumed.
    pub const AGENT_PAUSED: &'static str = "AGENT_PAUSED";
    /// The agent was resumed: its next heartbeat is due at once.
    pub const AGENT_RESUMED: &'static str = "AGENT_RESUMED";
    /// The agent's user was silent longer than its `--auto-pause-after`: it stopped
    /// beating on its own until the user writes again.
    pub const AGENT_AUTO_PAUSED: &'static str = "AGENT_AUTO_PAUSED";
    /// The agent spent its daily token budget: no model calls until midnight.
    pub const BUDGET_EXHAUSTED: &'static str = "BUDGET_EXHAUSTED";
    /// The agent's spent share of a dollar budget crossed 50, 80 or 100 %.
    pub const BUDGET_THRESHOLD: &'static str = "BUDGET_THRESHOLD";
    /// Too many heartbeats in an hour: the breaker paused the agent.
    pub const BREAKER_TRIPPED: &'static str = "BREAKER_TRIPPED";
    /// `--alert-after` heartbeats in a row did not do what the agent expects of each, or
    /// runs in a row of a schedule did not do what it expects of the heartbeat it wakes.
    pub const HEARTBEAT_INCOMPLETE: &'static str = "HEARTBEAT_INCOMPLETE";
    /// Most of a tool's calls failed over a window: told once, until it recovers.
    pub const TOOL_DEGRADED: &'static str = "TOOL_DEGRADED";
    /// A degraded tool's calls mostly succeed again.
    pub const TOOL_RECOVERED: &'static str = "TOOL_RECOVERED";
    /// A tool call was parked for a person's approval.
    pub const APPROVAL_REQUESTED: &'static str = "APPROVAL_REQUESTED";
    /// A parked call was approved (and sent) or denied.
    pub const APPROVAL_DECIDED: &'static str = "APPROVAL_DECIDED";
    /// A parked call expired with nobody's decision; it was not sent.
    pub const APPROVAL_EXPIRED: &'static str = "APPROVAL_EXPIRED";

    /// The fixed types with what they report; per-tool types are `BEFORE_<TOOL>` and
    /// `AFTER_<TOOL>`.
    pub const LIFECYCLE: [(&'static str, &'static str); 22] = [
        (
            Self::BEFORE_HEARTBEAT,
            "a heartbeat starts processing its window",
        ),
        (
            Self::AFTER_HEARTBEAT,
            "a heartbeat completed (events processed, actions run)",
        ),
        (
            Self::HEARTBEAT_FAILED,
            "a heartbeat failed; the next one is scheduled",
        ),
        (Self::ACTION_STARTED, "a tool starts for an event"),
        (Self::ACTION_COMPLETED, "a tool completed for an event"),
        (Self::ACTION_FAILED, "a tool failed for an event"),
        (
            Self::MESSAGE_RECEIVED,
            "the conversation takes in user messages",
        ),
        (
            Self::MESSAGE_SENT,
            "a reply was delivered: posted to Discord, or stored for the dashboard and the API",
        ),
        (
            Self::MESSAGE_UNDELIVERABLE,
            "a reply the channel would not take was given up on after its tries",
        ),
        (Self::HOOK_DISABLED, "one of the agent's hooks was disabled"),
        (
            Self::AGENT_PAUSED,
            "the agent was paused; its heartbeats stop",
        ),
        (
            Self::AGENT_RESUMED,
            "the agent was resumed; a heartbeat is due at once",
        ),
        (
            Self::AGENT_AUTO_PAUSED,
            "its user was silent too long; the agent stops beating until the user writes",
        ),
        (
            Self::BUDGET_EXHAUSTED,
            "the agent spent its daily token budget; no model calls until midnight",
        ),
        (
            Self::BUDGET_THRESHOLD,
            "the agent spent 50, 80 or 100 % of a dollar budget (once each a day or month)",
        ),
        (
            Self::BREAKER_TRIPPED,
            "too many heartbeats in an hour; the breaker paused the agent",
        ),
        (
            Self::HEARTBEAT_INCOMPLETE,
            "heartbeats in a row (--alert-after) did not do what the agent expects of each (--expect), or runs of a schedule what it expects; once a streak",
        ),
        (
            Self::TOOL_DEGRADED,
            "most calls of a tool failed over 10 minutes (told once, until it recovers)",
        ),
        (
            Self::TOOL_RECOVERED,
            "a degraded tool's calls mostly succeed again",
        ),
        (
            Self::APPROVAL_REQUESTED,
            "a tool call was parked for a person's approval (not sent)",
        ),
        (
            Self::APPROVAL_DECIDED,
            "a parked call was approved (then sent) or denied (never sent)",
        ),
        (
            Self::APPROVAL_EXPIRED,
            "a parked call expired with no decision; it was not sent",
        ),
    ];

    /// Validates a type: an uppercase letter, then uppercase letters, digits or `_`; at
    /// most 128.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let mut bytes = s.bytes();
        let ok = s.len() <= 128
            && bytes.next().is_some_and(|b| b.is_ascii_uppercase())
            && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(ValidationError::new(
                "hook type",
                format!(
                    "{s:?} is not a hook type: use SCREAMING_SNAKE_CASE such as BEFORE_HEARTBEAT, AFTER_HEARTBEAT or AFTER_<TOOL> (`pulse hooks types` lists them)"
                ),
            ))
        }
    }

    /// One of the fixed types (the constants above).
    pub fn of(name: &'static str) -> Self {
        Self(name.to_owned())
    }

    /// `BEFORE_<TOOL>`: `SnipCreate` → `BEFORE_SNIP_CREATE`.
    pub fn before_tool(tool: &ToolName) -> Self {
        Self(format!("BEFORE_{}", screaming_snake(tool.as_str())))
    }

    /// `AFTER_<TOOL>`: `SnipCreate` → `AFTER_SNIP_CREATE`.
    pub fn after_tool(tool: &ToolName) -> Self {
        Self(format!("AFTER_{}", screaming_snake(tool.as_str())))
    }

    /// The type as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Every type a hook may take with these tools, and when it fires: the lifecycle
    /// types, then `BEFORE_`/`AFTER_` of each tool.
    pub fn catalogue<'a>(
        tools: impl IntoIterator<Item = &'a super::ids::ToolName>,
    ) -> Vec<(HookType, String)> {
        let mut all: Vec<(HookType, String)> = Self::LIFECYCLE
            .iter()
            .map(|(t, what)| (Self::of(t), (*what).to_owned()))
            .collect();
        for name in tools {
            for (t, when) in [
                (Self::before_tool(name), "before"),
                (Self::after_tool(name), "after"),
            ] {
                all.push((t, format!("{when} the tool {name} runs for an event")));
            }
        }
        all
    }
}

impl fmt::Display for HookType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for HookType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HookType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A tool's name in SCREAMING_SNAKE_CASE, as the documented hook names spell it:
/// `SnipCreate` → `SNIP_CREATE`, `feed-reader` → `FEED_READER`, `HTTPFetch` → `HTTP_FETCH`
/// (upper-casing alone would give `SNIPCREATE`, matching no documented name).
pub fn screaming_snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c == '-' || c == '_' {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 && !out.ends_with('_') {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            // A word starts at a capital after a lower-case letter or digit (`snipCreate`),
            // or at the last capital of an acronym followed by lower case (`HTTPFetch`).
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push('_');
            }
        }
        out.push(c.to_ascii_uppercase());
    }
    out.trim_end_matches('_').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_become_the_documented_hook_names() {
        let t = |s: &str| screaming_snake(s);
        assert_eq!(t("SnipCreate"), "SNIP_CREATE");
        assert_eq!(t("FeedReader"), "FEED_READER");
        assert_eq!(t("feed-reader"), "FEED_READER");
        assert_eq!(t("heartbeat_agent"), "HEARTBEAT_AGENT");
        assert_eq!(t("HTTPFetch"), "HTTP_FETCH");
        assert_eq!(t("fetch2Go"), "FETCH2_GO");
        assert_eq!(t("a--b"), "A_B");
        let tool = ToolName::parse("SnipCreate").unwrap();
        assert_eq!(HookType::before_tool(&tool).as_str(), "BEFORE_SNIP_CREATE");
        assert_eq!(HookType::after_tool(&tool).as_str(), "AFTER_SNIP_CREATE");
        assert!(HookType::parse(HookType::after_tool(&tool).as_str()).is_ok());
    }

    #[test]
    fn hook_types_must_be_screaming_snake_case() {
        assert!(HookType::parse("AFTER_HEARTBEAT").is_ok());
        assert!(HookType::parse("after_heartbeat").is_err());
        assert!(HookType::parse("_X").is_err());
        assert!(HookType::parse("").is_err());
    }
}
