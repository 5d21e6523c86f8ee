//! MCP servers as agent tools: a server registered once (`pulse tools add-mcp`), its
//! tools as it last listed them, and the names the model knows them by.
//!
//! A server is a [`super::Tool`] of kind [`super::ToolKind::Mcp`]. Its tools list is kept
//! with it in the store, so a worker that just started offers the tools without asking
//! the server; the list is refreshed by `pulse tools refresh` and when the server says
//! its list changed. An agent uses a server's tools once it is attached to it
//! (`pulse agents update A --tools mcp:NAME`): then, in its heartbeats and its chat
//! turns alike, the model sees each allowed tool under `NAME__tool`.

use std::collections::{BTreeMap, HashSet};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use super::approval::{PolicySource, ToolPolicy};
use super::chat::{Secret, ToolSpec};
use super::ids::{EventId, ToolName, TurnId};
use crate::error::ValidationError;

/// What an agent's tools list says to attach a whole MCP server: `mcp:NAME`.
pub const MCP_PREFIX: &str = "mcp:";
/// Most tools kept from one server's list.
pub const MAX_MCP_TOOLS: usize = 128;
/// Most characters of one tool's description shown to the model.
pub(crate) const MAX_DESCRIPTION: usize = 1_024;
/// Most bytes of one tool's input schema.
pub(crate) const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// Most bytes of MCP tool definitions (names, descriptions and input schemas) sent with
/// one request to the model: past it, the later tools are not offered.
pub const MAX_OFFERED_BYTES: usize = 64 * 1024;
/// Most bytes of one server's tool definitions kept with its record: four requests'
/// worth, and well inside a DynamoDB item's 400 KB. Past it, the later tools of its list
/// are left out when it is listed, each said.
pub const MAX_KEPT_BYTES: usize = 256 * 1024;
/// The longest name a model provider accepts for a tool.
pub(crate) const MAX_MODEL_NAME: usize = 64;

/// An MCP server: a remote one reached over streamable HTTP, or (under `pulse serve`
/// with `PULSE_MCP_STDIO=on` only) a local program spoken to over its stdin and stdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct McpServer {
    /// Its endpoint (`https://mcp.example.com/mcp`); none for a local program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Url>,
    /// A local program and its arguments (`npx -y @acme/mcp-server`), started by
    /// `pulse serve` and spoken to over its stdin and stdout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The environment variables a local program is given, by name, from `pulse
    /// serve`'s own environment (nothing else of it is passed: not its keys or tokens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Sent with every request (`Authorization: Bearer …`). Sealed at rest; never listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<McpHeader>,
    /// The tools agents may use; every listed tool when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// How long one call may take.
    pub timeout_ms: u64,
    /// Its tools, as it last listed them.
    #[serde(default)]
    pub tools: Vec<McpTool>,
    /// When they were listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed_at: Option<Timestamp>,
    /// What a call of any of its tools needs (`pulse tools policy SERVER allow|ask|deny`);
    /// unset, each tool's marks decide: read-only tools are allowed, the others asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<ToolPolicy>,
    /// What a call of one tool needs, by the tool's name, over the server's policy
    /// (`pulse tools policy SERVER TOOL allow|ask|deny`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, ToolPolicy>,
    /// Why its headers could not be opened (sealed with a key that is not configured):
    /// then it is not called. Never stored.
    #[serde(skip)]
    pub unreadable: Option<String>,
}

/// One header sent to an MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct McpHeader {
    /// Its name (`Authorization`).
    pub name: String,
    /// Its value; sealed at rest.
    #[serde(with = "super::chat::secret_string")]
    pub value: Secret,
}

impl McpHeader {
    /// Parses `Name: value`, refusing what HTTP would not carry.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::new("header", why.to_owned());
        let (name, value) = s
            .split_once(':')
            .ok_or_else(|| bad("write it as \"Name: value\", e.g. \"Authorization: Bearer …\""))?;
        let (name, value) = (name.trim(), value.trim());
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(bad(&format!("{name:?} is not a header name")));
        }
        if http::HeaderValue::from_str(value).is_err() || value.is_empty() {
            return Err(bad(&format!(
                "the value of {name} is empty or holds characters a header cannot carry"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "host" | "content-length" | "content-type" | "accept" | "mcp-session-id"
        ) || lower.starts_with("mcp-")
        {
            return Err(bad(&format!(
                "{name} is set by the MCP client itself; give only your own headers"
            )));
        }
        Ok(Self {
            name: name.to_owned(),
            value: Secret::new(value),
        })
    }
}

/// One tool of an MCP server, as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct McpTool {
    /// Its name on the server.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
    /// The server marks it read-only (`readOnlyHint`): a call of it changes nothing, so
    /// it may be dropped mid-flight and made again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl McpTool {
    /// A listed tool, checked: a name, an object schema of a bounded size.
    pub fn checked(
        name: &str,
        description: Option<&str>,
        input_schema: Value,
    ) -> Result<Self, String> {
        if name.trim().is_empty() || name.chars().count() > 128 {
            return Err(format!(
                "a tool name {name:?} that is empty or over 128 characters"
            ));
        }
        if input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(format!(
                "tool {name:?} has an input schema that is not an object schema"
            ));
        }
        if input_schema.to_string().len() > MAX_SCHEMA_BYTES {
            return Err(format!(
                "tool {name:?} has an input schema over {} KiB",
                MAX_SCHEMA_BYTES / 1024
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            description: description.map(|d| d.chars().take(MAX_DESCRIPTION).collect()),
            input_schema,
            read_only: false,
        })
    }

    /// Bytes of its definition as a request carries it: name, description, schema.
    pub fn definition_bytes(&self) -> usize {
        self.name.len()
            + self.description.as_deref().map_or(0, str::len)
            + self.input_schema.to_string().len()
    }
}

impl McpServer {
    /// The default timeout of one call.
    pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

    /// A server at `url` (http or https, a host, no credentials), with its list still to
    /// be made.
    pub fn new(
        url: &str,
        headers: Vec<McpHeader>,
        allow: Vec<String>,
        timeout: std::time::Duration,
    ) -> Result<Self, ValidationError> {
        let url = super::outbound::web_url(
            "mcp url",
            url,
            "credentials in the URL would end up in listings and logs; give them with --header \"Authorization: …\" instead",
        )?;
        super::outbound::check_timeout("mcp timeout", timeout)?;
        Ok(Self {
            url: Some(url),
            command: Vec::new(),
            env: Vec::new(),
            headers,
            allow,
            timeout_ms: timeout.as_millis() as u64,
            tools: Vec::new(),
            listed_at: None,
            policy: None,
            policies: BTreeMap::new(),
            unreadable: None,
        })
    }

    /// A local program, `command` (the program, then its arguments), given the
    /// variables `env` names from `pulse serve`'s environment.
    pub fn local(
        command: Vec<String>,
        env: Vec<String>,
        allow: Vec<String>,
        timeout: std::time::Duration,
    ) -> Result<Self, ValidationError> {
        let bad = |why: String| ValidationError::new("mcp command", why);
        if command.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(bad(
                "give the program to start, e.g. --command \"npx -y @acme/mcp-server\"".into(),
            ));
        }
        for name in &env {
            let ok = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !ok {
                return Err(ValidationError::new(
                    "mcp env",
                    format!(
                        "{name:?} is not an environment variable name; give names only (--env GITHUB_TOKEN): the values are read where pulse serve runs"
                    ),
                ));
            }
        }
        super::outbound::check_timeout("mcp timeout", timeout)?;
        Ok(Self {
            url: None,
            command,
            env,
            headers: Vec::new(),
            allow,
            timeout_ms: timeout.as_millis() as u64,
            tools: Vec::new(),
            listed_at: None,
            policy: None,
            policies: BTreeMap::new(),
            unreadable: None,
        })
    }

    /// Whether it is a local program.
    pub fn is_local(&self) -> bool {
        !self.command.is_empty()
    }

    /// Where it is, for people: its URL, or `local: PROGRAM ARGS…`.
    pub fn place(&self) -> String {
        match &self.url {
            Some(url) => url.to_string(),
            None => format!("local: {}", self.command.join(" ")),
        }
    }

    /// The tools agents may use: the listed ones the allow-list names (all without one).
    pub fn allowed(&self) -> impl Iterator<Item = &McpTool> {
        self.tools
            .iter()
            .filter(|t| self.allow.is_empty() || self.allow.iter().any(|a| a == &t.name))
    }

    /// What a call of `tool` needs, and why: the tool's own policy, else the server's,
    /// else its marks (read-only: allowed; anything else: asked).
    pub fn policy_of(&self, tool: &str) -> (ToolPolicy, PolicySource) {
        if let Some(p) = self.policies.get(tool) {
            return (*p, PolicySource::Tool);
        }
        if let Some(p) = self.policy {
            return (p, PolicySource::Server);
        }
        match self.tools.iter().find(|t| t.name == tool) {
            Some(t) if t.read_only => (ToolPolicy::Allow, PolicySource::ReadOnly),
            _ => (ToolPolicy::Ask, PolicySource::Unmarked),
        }
    }

    /// Names the allow-list gives that the server did not list.
    pub fn missing_allowed(&self) -> Vec<&str> {
        self.allow
            .iter()
            .filter(|a| !self.tools.iter().any(|t| &t.name == *a))
            .map(String::as_str)
            .collect()
    }
}

/// What an agent is given to use, one entry of `--tools`: a whole MCP server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentTool {
    /// The registered MCP server.
    pub server: ToolName,
}

impl AgentTool {
    /// Parses `mcp:NAME`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let s = s.trim();
        match s.strip_prefix(MCP_PREFIX) {
            Some(name) => Ok(Self {
                server: ToolName::parse(name)?,
            }),
            None => Err(ValidationError::new(
                "tools",
                format!(
                    "{s:?} is not a tool an agent can be given: name an MCP server as mcp:NAME (`pulse tools list` shows them); HTTP tools run on events through subscriptions"
                ),
            )),
        }
    }

    /// Parses a comma-separated list; an empty one detaches every tool.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, ValidationError> {
        let mut out: Vec<Self> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let t = Self::parse(part)?;
            if !out.contains(&t) {
                out.push(t);
            }
        }
        Ok(out)
    }
}

impl std::fmt::Display for AgentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{MCP_PREFIX}{}", self.server)
    }
}

impl TryFrom<String> for AgentTool {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<AgentTool> for String {
    fn from(t: AgentTool) -> Self {
        t.to_string()
    }
}

/// A call a model made, in a heartbeat or a chat turn, to a tool of an MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    /// The server's own name for the tool.
    pub tool: String,
    /// The event its heartbeat run answered; none for a chat turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<EventId>,
    /// The chat turn it was made in; none for a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The `Idempotency-Key` it was sent with, the same on every attempt.
    pub key: String,
}

/// One MCP tool as the model sees it, and where its calls go.
#[derive(Clone, Debug, PartialEq)]
pub struct OfferedTool {
    /// The name the model calls it by: `server__tool`, sanitized and unique.
    pub model_name: String,
    /// The server.
    pub server: ToolName,
    /// The tool's name on the server.
    pub tool: String,
    /// Its definition for the model.
    pub spec: ToolSpec,
    /// The server marks it read-only.
    pub read_only: bool,
}

/// The MCP tools offered to the model from `servers` (each with its registered name),
/// named `server__tool`: characters other than letters, digits, `_` and `-` become `_`,
/// cut to 64, and made unique (`_2`, `_3`, …) against each other and `taken` (the
/// built-in tools' names).
pub fn offered<'a>(
    servers: impl IntoIterator<Item = (&'a ToolName, &'a McpServer)>,
    taken: &[&str],
) -> Vec<OfferedTool> {
    let mut used: HashSet<String> = taken.iter().map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    for (name, server) in servers {
        for tool in server.allowed() {
            let model_name = unique(&sanitize(&format!("{name}__{}", tool.name)), &used);
            used.insert(model_name.clone());
            let description = tool
                .description
                .clone()
                .unwrap_or_else(|| format!("{} (from the MCP server {name})", tool.name));
            out.push(OfferedTool {
                spec: ToolSpec {
                    name: model_name.clone(),
                    description,
                    parameters: tool.input_schema.clone(),
                },
                model_name,
                server: name.clone(),
                tool: tool.name.clone(),
                read_only: tool.read_only,
            });
        }
    }
    out
}

/// `tools` within [`MAX_OFFERED_BYTES`] of definitions, in their order (one too large to
/// fit is left out, a smaller one after it may still be offered); and the model names
/// of those left out.
pub fn within_budget(tools: Vec<OfferedTool>) -> (Vec<OfferedTool>, Vec<String>) {
    let mut used = 0;
    let (mut kept, mut left_out) = (Vec::new(), Vec::new());
    for t in tools {
        let size =
            t.spec.name.len() + t.spec.description.len() + t.spec.parameters.to_string().len();
        if used + size <= MAX_OFFERED_BYTES {
            used += size;
            kept.push(t);
        } else {
            left_out.push(t.model_name);
        }
    }
    (kept, left_out)
}

fn sanitize(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    clean.chars().take(MAX_MODEL_NAME).collect()
}

fn unique(base: &str, used: &HashSet<String>) -> String {
    if !used.contains(base) {
        return base.to_owned();
    }
    (2..)
        .map(|n| {
            let suffix = format!("_{n}");
            let keep = MAX_MODEL_NAME - suffix.len();
            format!("{}{suffix}", &base[..base.len().min(keep)])
        })
        .find(|c| !used.contains(c))
        .unwrap_or_else(|| unreachable!("an unused suffix exists"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(tools: &[&str], allow: &[&str]) -> McpServer {
        let mut s = McpServer::new(
            "https://mcp.example.com/mcp",
            Vec::new(),
            allow.iter().map(|s| s.to_string()).collect(),
            McpServer::DEFAULT_TIMEOUT,
        )
        .unwrap();
        s.tools = tools
            .iter()
            .map(|t| McpTool::checked(t, None, json!({"type": "object"})).unwrap())
            .collect();
        s
    }

    #[test]
    fn model_names_are_namespaced_sanitized_bounded_and_unique() {
        let cal = ToolName::parse("cal").unwrap();
        let long = ToolName::parse(&"x".repeat(60)).unwrap();
        let a = server(&["list events", "list-events", "speak"], &[]);
        let b = server(&["a_very_long_tool_name"], &[]);
        let first = offered([(&cal, &a), (&long, &b)], &["speak", "cal__list_events_2"]);
        let names: Vec<&str> = first.iter().map(|o| o.model_name.as_str()).collect();
        assert_eq!(names[0], "cal__list_events");
        assert_eq!(names[1], "cal__list-events");
        assert_eq!(names[2], "cal__speak");
        assert_eq!(names[3].len(), 64);
        assert!(names[3].starts_with("xxxx"));
        for n in &names {
            assert!(
                n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            );
        }
        // The same sanitized name twice gets a suffix, avoiding a taken one.
        let c = server(&["a b", "a.b", "a?b"], &[]);
        let again = offered([(&cal, &c)], &["cal__a_b_2"]);
        let names: Vec<&str> = again.iter().map(|o| o.model_name.as_str()).collect();
        assert_eq!(names, ["cal__a_b", "cal__a_b_3", "cal__a_b_4"]);
        assert_eq!(again[1].tool, "a.b", "calls go to the server's own name");
    }

    #[test]
    fn the_definitions_offered_in_one_request_stay_within_their_budget() {
        let big = ToolName::parse("big").unwrap();
        let mut s = server(&[], &[]);
        // 128 tools, each with a schema of nearly the largest size allowed.
        s.tools = (0..MAX_MCP_TOOLS)
            .map(|i| {
                let schema =
                    json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES - 64)});
                McpTool::checked(&format!("t{i}"), Some(&"d".repeat(MAX_DESCRIPTION)), schema)
                    .unwrap()
            })
            .collect();
        let all = offered([(&big, &s)], &[]);
        assert_eq!(all.len(), MAX_MCP_TOOLS);
        let whole: usize = all
            .iter()
            .map(|t| t.spec.description.len() + t.spec.parameters.to_string().len())
            .sum();
        assert!(whole > 2_000_000, "{whole}");
        let (kept, left_out) = within_budget(all);
        let sent: usize = kept
            .iter()
            .map(|t| {
                t.spec.name.len() + t.spec.description.len() + t.spec.parameters.to_string().len()
            })
            .sum();
        assert!(sent <= MAX_OFFERED_BYTES, "{sent}");
        assert_eq!(kept.len(), 3, "three of these fit in 64 KiB");
        assert_eq!(kept.len() + left_out.len(), MAX_MCP_TOOLS);
        assert_eq!(left_out[0], "big__t3", "the first ones listed are kept");
        // A small tool after the large ones still fits.
        let small = server(&["tiny"], &[]);
        let tiny = ToolName::parse("tiny").unwrap();
        let mut both = offered([(&big, &s)], &[]);
        both.extend(offered([(&tiny, &small)], &[]));
        let (kept, _) = within_budget(both);
        assert_eq!(
            kept.last().map(|t| t.model_name.as_str()),
            Some("tiny__tiny")
        );
    }

    #[test]
    fn the_allow_list_keeps_only_the_tools_it_names() {
        let cal = ToolName::parse("cal").unwrap();
        let s = server(&["read", "write", "delete"], &["read", "gone"]);
        let kept = offered([(&cal, &s)], &[]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].tool, "read");
        assert_eq!(s.missing_allowed(), ["gone"]);
    }

    #[test]
    fn bad_servers_tools_and_headers_are_refused_with_the_reason() {
        let to = McpServer::DEFAULT_TIMEOUT;
        assert!(McpServer::new("ftp://x/mcp", vec![], vec![], to).is_err());
        let creds = McpServer::new("https://u:p@x/mcp", vec![], vec![], to).unwrap_err();
        assert!(creds.to_string().contains("--header"), "{creds}");
        assert!(!creds.to_string().contains("u:p"));
        let schema = McpTool::checked("t", None, json!({"type": "string"})).unwrap_err();
        assert!(schema.contains("not an object schema"), "{schema}");
        let big = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(McpTool::checked("t", None, big).is_err());
        let h = McpHeader::parse("Authorization: Bearer abc").unwrap();
        assert_eq!(
            (h.name.as_str(), h.value.expose()),
            ("Authorization", "Bearer abc")
        );
        assert!(McpHeader::parse("no colon").is_err());
        assert!(McpHeader::parse("Mcp-Session-Id: x").is_err());
        assert!(McpHeader::parse("X-Key: bad\nvalue").is_err());
    }

    #[test]
    fn agent_tools_are_mcp_servers_named_with_their_prefix() {
        let list = AgentTool::parse_list("mcp:cal, mcp:home,mcp:cal,").unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].to_string(), "mcp:cal");
        assert!(AgentTool::parse_list("").unwrap().is_empty());
        let bare = AgentTool::parse("cal").unwrap_err().to_string();
        assert!(bare.contains("mcp:NAME"), "{bare}");
        assert!(AgentTool::parse("mcp:1bad").is_err());
        let json = serde_json::to_string(&list).unwrap();
        assert_eq!(json, r#"["mcp:cal","mcp:home"]"#);
        let back: Vec<AgentTool> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, list);
    }

    #[test]
    fn a_tools_policy_is_its_own_else_its_servers_else_its_marks() {
        let mut s = server(&["lookup", "send"], &[]);
        s.tools[0].read_only = true;
        assert_eq!(
            s.policy_of("lookup"),
            (ToolPolicy::Allow, PolicySource::ReadOnly)
        );
        assert_eq!(
            s.policy_of("send"),
            (ToolPolicy::Ask, PolicySource::Unmarked)
        );
        assert_eq!(
            s.policy_of("unlisted"),
            (ToolPolicy::Ask, PolicySource::Unmarked)
        );
        s.policy = Some(ToolPolicy::Deny);
        assert_eq!(
            s.policy_of("lookup"),
            (ToolPolicy::Deny, PolicySource::Server)
        );
        s.policies.insert("send".into(), ToolPolicy::Allow);
        assert_eq!(s.policy_of("send"), (ToolPolicy::Allow, PolicySource::Tool));
        // Stored and read back the same; a server stored before policies reads as unset.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["policy"], "deny");
        assert_eq!(json["policies"]["send"], "allow");
        let back: McpServer = serde_json::from_value(json).unwrap();
        assert_eq!(back.policies, s.policies);
        let mut old = serde_json::to_value(server(&["send"], &[])).unwrap();
        old.as_object_mut().unwrap().remove("policy");
        let old: McpServer = serde_json::from_value(old).unwrap();
        assert_eq!(old.policy_of("send").0, ToolPolicy::Ask);
    }
}
