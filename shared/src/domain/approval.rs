//! A person's yes before an agent's risky tool call.
//!
//! Each MCP tool has a [`ToolPolicy`]: `allow` (called as the model asks), `ask` (the call
//! is parked for a person's approval) or `deny` (never called). A parked call is an
//! [`Approval`]: a record of the call as the model made it, **not sent**. The model is
//! told at once that it awaits a yes, so its heartbeat or turn ends as usual; nothing
//! waits. The approval is decided once — approved, denied, or expired when nobody
//! answered in time — and the first decision is the only one (a conditional write). An
//! approved call is sent with the key it was parked with, and the agent is told what came
//! of it, as it is of a denial or an expiry.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ids::{ActionId, AgentId, ApprovalId, EventId, HeartbeatId, ToolName, TurnId};
use crate::error::ValidationError;

/// How long a parked call waits for a decision when its agent says nothing else.
pub const DEFAULT_APPROVAL_EXPIRY: SignedDuration = SignedDuration::from_hours(24);

/// The shortest and longest expiry an agent may be given.
pub const APPROVAL_EXPIRY_RANGE: (SignedDuration, SignedDuration) = (
    SignedDuration::from_mins(1),
    SignedDuration::from_hours(24 * 30),
);

/// Most characters of a decision's reason, or of the model's stated reason, kept.
pub const MAX_APPROVAL_REASON: usize = 1_000;

/// Most bytes of a parked call's arguments: a call larger than this is refused, not
/// parked (a person has to be able to read what they approve).
pub const MAX_PARKED_ARGUMENTS: usize = 16 * 1024;

/// What an agent's call of a tool needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolPolicy {
    /// Called as the model asks.
    Allow,
    /// Parked until a person approves it.
    Ask,
    /// Never called; the model is told so.
    Deny,
}

impl ToolPolicy {
    /// `allow`, `ask` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }

    /// Parses `allow`, `ask` or `deny`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "allow" => Ok(Self::Allow),
            "ask" => Ok(Self::Ask),
            "deny" => Ok(Self::Deny),
            other => Err(ValidationError::new(
                "policy",
                format!("{other:?} is not a policy: use allow, ask or deny"),
            )),
        }
    }
}

impl std::fmt::Display for ToolPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ToolPolicy {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Where a tool's policy came from, for listings and for what the model is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// Set for the tool itself (`pulse tools policy SERVER TOOL …`).
    Tool,
    /// Set for its whole server (`pulse tools policy SERVER …`, `add-mcp --policy`).
    Server,
    /// The server marks the tool read-only (`readOnlyHint`): allowed.
    ReadOnly,
    /// Nothing says it is read-only: asked.
    Unmarked,
}

impl PolicySource {
    /// How listings name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "set for the tool",
            Self::Server => "set for the server",
            Self::ReadOnly => "read-only",
            Self::Unmarked => "not marked read-only",
        }
    }
}

/// Where a parked call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalStatus {
    /// Waiting for a person.
    Pending,
    /// A person said yes: the call is sent.
    Approved,
    /// A person said no: the call is never sent.
    Denied,
    /// Nobody answered in time: the call is never sent.
    Expired,
}

impl ApprovalStatus {
    /// `pending`, `approved`, `denied` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }
}

/// What came of a decided approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalOutcome {
    /// Whether the call was sent.
    pub sent: bool,
    /// The action that records the call, when it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_id: Option<ActionId>,
    /// What the server answered (clipped), or why it was not sent.
    pub summary: String,
    /// Whether the call failed (the server's error, or an answer that was lost).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    /// When it was settled.
    pub at: Timestamp,
}

/// A call parked for a person's yes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Its id.
    pub id: ApprovalId,
    /// The agent whose model made the call.
    pub agent_id: AgentId,
    /// The MCP server.
    pub server: ToolName,
    /// The tool's name on the server.
    pub tool: String,
    /// The name the model called it by.
    pub model_name: String,
    /// The arguments, as the model gave them.
    pub arguments: Value,
    /// The `Idempotency-Key` the call is sent with when approved.
    pub key: String,
    /// When the call's run began (ms): the stamp of its action's id.
    pub at_ms: u64,
    /// The heartbeat it came from; none for a chat turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_id: Option<HeartbeatId>,
    /// The event that heartbeat answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<EventId>,
    /// The chat turn it came from; none for a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The call's place in its run.
    pub step: usize,
    /// What the model said beside the call, if anything: its stated reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The digest of the tool's input schema when the call was parked: a server whose
    /// schema changed since is not sent the call.
    pub schema: String,
    /// When it was parked.
    pub requested_at: Timestamp,
    /// When it expires, if nobody decided.
    pub expires_at: Timestamp,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// Who decided (`cli`, `dashboard`, `api pt_…`, `discord 1234…`, `expiry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// When it was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Timestamp>,
    /// Why, as the person said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    /// What came of it, once settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ApprovalOutcome>,
    /// When its owner was asked on Discord (a message with Approve and Deny buttons);
    /// none until then — not yet, while the agent is snoozed or outside its active
    /// hours, or the agent has no Discord home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_at: Option<Timestamp>,
}

/// The prefix of the custom id of an approval's Discord buttons.
const BUTTON: &str = "approval";
const SHORT_BUTTON: &str = "a";

/// What a decision says: yes or no, by whom, why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Approved (true) or denied.
    pub approve: bool,
    /// Who decides.
    pub by: String,
    /// Why, if they said.
    pub reason: Option<String>,
    /// Approved, and the agent may call this tool from now on without asking (a
    /// [`ToolGrant`]): that tool, that agent, nothing wider.
    pub always: bool,
}

/// A tool one agent may call without asking, though its policy is `ask`: granted by an
/// approval made with `--always`, listed, and revocable. A `deny` policy still wins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolGrant {
    /// The MCP server.
    pub server: ToolName,
    /// The tool's name on the server.
    pub tool: String,
    /// Who granted it (as the approval's `decided_by`).
    pub by: String,
    /// When.
    pub at: Timestamp,
    /// The approval it was granted with.
    pub approval_id: ApprovalId,
}

impl Approval {
    /// Whether it is still waiting.
    pub fn is_pending(&self) -> bool {
        self.status == ApprovalStatus::Pending
    }

    /// Whether it is past its expiry at `now` and still waiting.
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.is_pending() && self.expires_at <= now
    }

    /// This approval decided by `decision` at `now`.
    pub fn decided(&self, decision: &Decision, now: Timestamp) -> Self {
        let mut d = self.clone();
        d.status = if decision.approve {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Denied
        };
        d.decided_by = Some(decision.by.clone());
        d.decided_at = Some(now);
        d.decision_reason = decision.reason.as_deref().map(clip_reason);
        d
    }

    /// This approval expired at `now`.
    pub fn expired(&self, now: Timestamp) -> Self {
        let mut d = self.clone();
        d.status = ApprovalStatus::Expired;
        d.decided_by = Some("expiry".to_owned());
        d.decided_at = Some(now);
        d
    }

    /// Who decided it and when, for a refusal of a second decision.
    pub fn who_decided(&self) -> String {
        format!(
            "{} by {} at {}",
            self.status.as_str(),
            self.decided_by.as_deref().unwrap_or("?"),
            self.decided_at
                .map_or_else(|| "?".to_owned(), |t| t.to_string())
        )
    }

    /// The custom id of its Discord button: `approval:approve|deny:AGENT:ID` (at most
    /// 100 characters, as Discord allows).
    pub fn button(&self, approve: bool) -> String {
        format!(
            "{BUTTON}:{}:{}:{}",
            if approve { "approve" } else { "deny" },
            self.agent_id,
            self.id
        )
    }

    /// The plain text that asks `agent_name`'s owner about it where a platform's
    /// message is text with buttons beside it (Telegram, Slack): sent without markup,
    /// so nothing in the arguments can be taken for any.
    pub fn asking(&self, agent_name: &str) -> String {
        let clip = |s: &str, n: usize| {
            if s.chars().count() <= n {
                s.to_owned()
            } else {
                s.chars().take(n).collect::<String>() + "…"
            }
        };
        let args = serde_json::to_string_pretty(&self.arguments).unwrap_or_default();
        let mut text = format!(
            "{} asks to call {}/{}.\n",
            clip(agent_name, 100),
            self.server,
            clip(&self.tool, 100)
        );
        if let Some(r) = &self.reason {
            text.push_str(&format!("“{}”\n", clip(r, 300)));
        }
        text.push_str(&format!(
            "{}\nApprove or deny before {} (UTC); it is not sent until you do. (approval {})",
            clip(&args, 1_200),
            self.expires_at.strftime("%Y-%m-%d %H:%M"),
            self.id
        ));
        text
    }

    /// Its button's data where a platform allows only 64 bytes (Telegram's
    /// `callback_data`): `a:y|n:AGENT:ID` with the ids' ULIDs alone, 57 bytes.
    pub fn short_button(&self, approve: bool) -> String {
        let ulid = |id: &str| id.split_once('_').map_or(id, |(_, u)| u).to_owned();
        format!(
            "{SHORT_BUTTON}:{}:{}:{}",
            if approve { "y" } else { "n" },
            ulid(self.agent_id.as_str()),
            ulid(self.id.as_str())
        )
    }

    /// One line on what it asks, for people: `cal/send_mail {"to": …}`.
    pub fn summary(&self, max: usize) -> String {
        let args = self.arguments.to_string();
        let args = if args.chars().count() > max {
            let head: String = args.chars().take(max).collect();
            format!("{head}…")
        } else {
            args
        };
        format!("{}/{} {args}", self.server, self.tool)
    }
}

/// What a Discord button's custom id says: approve (true) or deny, of which agent's
/// approval. `None` for a custom id that is not an approval's button.
pub fn parse_button(custom_id: &str) -> Option<(bool, AgentId, ApprovalId)> {
    let mut parts = custom_id.split(':');
    let short = match parts.next()? {
        BUTTON => false,
        SHORT_BUTTON => true,
        _ => return None,
    };
    let approve = match (short, parts.next()?) {
        (false, "approve") | (true, "y") => true,
        (false, "deny") | (true, "n") => false,
        _ => return None,
    };
    let (agent, id) = (parts.next()?, parts.next()?);
    let (agent, id) = if short {
        (
            AgentId::parse(&format!("ag_{agent}")).ok()?,
            ApprovalId::parse(&format!("ap_{id}")).ok()?,
        )
    } else {
        (AgentId::parse(agent).ok()?, ApprovalId::parse(id).ok()?)
    };
    parts.next().is_none().then_some((approve, agent, id))
}

/// A reason as kept: trimmed and bounded.
pub fn clip_reason(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_APPROVAL_REASON {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX_APPROVAL_REASON).collect();
        out.push('…');
        out
    }
}

/// The digest of a tool's input schema, to tell later whether it changed.
pub fn schema_digest(schema: &Value) -> String {
    let digest = Sha256::digest(schema.to_string().as_bytes());
    hex::encode(&digest[..8])
}

/// Checks an approval expiry an agent is given.
pub fn check_approval_expiry(d: SignedDuration) -> Result<(), ValidationError> {
    let (lo, hi) = APPROVAL_EXPIRY_RANGE;
    if d < lo || d > hi {
        return Err(ValidationError::new(
            "approval expiry",
            format!(
                "{d:#} is outside 1m..30d; an approval must stay open long enough for a person to see it, and not forever"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parked() -> Approval {
        Approval {
            id: ApprovalId::derived(1_000, "k"),
            agent_id: AgentId::generate(),
            server: ToolName::parse("cal").unwrap(),
            tool: "send".into(),
            model_name: "cal__send".into(),
            arguments: json!({"to": "x"}),
            key: "k".into(),
            at_ms: 1_000,
            heartbeat_id: None,
            event_id: None,
            turn_id: None,
            step: 0,
            reason: None,
            schema: schema_digest(&json!({"type": "object"})),
            requested_at: Timestamp::from_second(1).unwrap(),
            expires_at: Timestamp::from_second(100).unwrap(),
            status: ApprovalStatus::Pending,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            outcome: None,
            asked_at: None,
        }
    }

    #[test]
    fn a_button_names_the_decision_the_agent_and_the_approval_within_discords_limit() {
        let p = parked();
        for approve in [true, false] {
            let id = p.button(approve);
            assert!(id.len() <= 100, "{id}");
            assert_eq!(
                parse_button(&id),
                Some((approve, p.agent_id.clone(), p.id.clone()))
            );
        }
        for approve in [true, false] {
            let id = p.short_button(approve);
            assert!(id.len() <= 64, "{id} is {} bytes", id.len());
            assert_eq!(
                parse_button(&id),
                Some((approve, p.agent_id.clone(), p.id.clone()))
            );
        }
        assert_eq!(parse_button("a:approve:x:y"), None);
        assert_eq!(
            parse_button(&format!("{}:extra", p.short_button(false))),
            None
        );
        assert_eq!(parse_button("approval:maybe:x:y"), None);
        assert_eq!(parse_button(&format!("{}:extra", p.button(true))), None);
        assert_eq!(parse_button("other:approve"), None);
    }

    #[test]
    fn a_decision_names_who_and_when_and_keeps_a_bounded_reason() {
        let p = parked();
        let at = Timestamp::from_second(50).unwrap();
        let d = p.decided(
            &Decision {
                approve: false,
                by: "cli".into(),
                reason: Some("x".repeat(5_000)),
                always: false,
            },
            at,
        );
        assert_eq!(d.status, ApprovalStatus::Denied);
        assert_eq!(d.who_decided(), format!("denied by cli at {at}"));
        assert_eq!(
            d.decision_reason.as_ref().unwrap().chars().count(),
            MAX_APPROVAL_REASON + 1
        );
        assert!(!p.is_due(at));
        assert!(p.is_due(Timestamp::from_second(100).unwrap()));
        assert!(!d.is_due(Timestamp::from_second(100).unwrap()));
    }

    #[test]
    fn policies_parse_in_any_case_and_refuse_others() {
        assert_eq!(ToolPolicy::parse(" Ask ").unwrap(), ToolPolicy::Ask);
        assert!(
            ToolPolicy::parse("maybe")
                .unwrap_err()
                .to_string()
                .contains("allow, ask or deny")
        );
        assert_eq!(
            ApprovalId::derived(5, "a"),
            ApprovalId::derived(5, "a"),
            "a rerun parks the same approval"
        );
        assert_ne!(ApprovalId::derived(5, "a"), ApprovalId::derived(5, "b"));
        let id = ApprovalId::derived(5, "a");
        assert_eq!(ApprovalId::parse(id.as_str()).unwrap(), id);
    }

    #[test]
    fn an_expiry_must_be_between_a_minute_and_thirty_days() {
        assert!(check_approval_expiry(SignedDuration::from_hours(24)).is_ok());
        assert!(check_approval_expiry(SignedDuration::from_secs(5)).is_err());
        assert!(check_approval_expiry(SignedDuration::from_hours(24 * 31)).is_err());
    }
}
