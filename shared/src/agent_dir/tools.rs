//! `tools.toml`: the tools an agent's files declare and the events that run them.
//!
//! Tools are the deployment's registry, shared by every agent; so a tool declared here
//! is *owned* by the agent whose files declare it (recorded on the tool): apply makes
//! it, changes it and (with `--prune`) removes it, and no other directory may declare a
//! tool of that name. A tool registered with `pulse tools add` is the deployment's: a
//! file may subscribe the agent to it, never change it.
//!
//! - `[[tool]]`: an HTTP tool (URL, timeout, config; values that are secrets named by
//!   the variable holding them, `config_env`, read when the plan is made);
//! - `[[mcp]]`: an MCP server (a URL with headers named by their variables,
//!   `headers_env`, or a local program), listed by apply when made or moved; given to
//!   the agent by `tools = ["mcp:NAME"]` in `agent.toml`;
//! - `[[subscription]]`: which of the agent's events run which tool (its own or the
//!   deployment's), keyed by tool and event type.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{FieldChange, FileError};
use crate::domain::{
    AgentId, EventType, Filter, McpHeader, McpServer, Subscription, SubscriptionId, Tool, ToolKind,
    ToolName, ToolPolicy, format_duration, parse_duration,
};

/// The tools file.
pub const TOOLS_TOML: &str = "tools.toml";

/// How a secret value shows in a plan.
const HIDDEN: &str = "***";

/// `tools.toml`: `[[tool]]`, `[[mcp]]` and `[[subscription]]` tables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsToml {
    /// HTTP tools this agent's files own.
    #[serde(default, rename = "tool", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<HttpToolToml>,
    /// MCP servers this agent's files own.
    #[serde(default, rename = "mcp", skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<McpToml>,
    /// The agent's events that run a tool.
    #[serde(
        default,
        rename = "subscription",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subscriptions: Vec<SubscriptionToml>,
}

impl ToolsToml {
    /// Whether it declares nothing.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.servers.is_empty() && self.subscriptions.is_empty()
    }
}

/// One `[[tool]]`: an HTTP tool, sent each event it is subscribed to as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpToolToml {
    /// Its name, unique in the deployment (letters, digits, `-`, `_`).
    pub name: String,
    /// Where each request is POSTed (http or https).
    pub url: String,
    /// How long one exchange may take (10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Whether calling it twice does no harm, so a call whose answer was lost is made
    /// again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub idempotent: bool,
    /// Sent with every request as `tool_config`: values that are not secrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Value>,
    /// Keys of `tool_config` whose values are read from variables (`api_key =
    /// "GITHUB_TOKEN"`): the names, never the values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_env: BTreeMap<String, String>,
    /// What it does, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One `[[mcp]]`: an MCP server whose tools agents given it (`mcp:NAME`) may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpToml {
    /// Its name, unique in the deployment: agents are given `mcp:NAME`.
    pub name: String,
    /// Its streamable HTTP endpoint; or give `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A local program and its arguments (`["npx", "-y", "@acme/mcp"]`), under `pulse
    /// serve` with `PULSE_MCP_STDIO=on` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Variables the local program is given from `pulse serve`'s environment, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Headers sent with every request, each named by the variable holding its value
    /// (`Authorization = "LINEAR_MCP_AUTH"`): the names, never the values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_env: BTreeMap<String, String>,
    /// Only these of its tools are offered; every one it lists when left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// How long one call may take (30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Whether its tools do no harm called twice.
    #[serde(default, skip_serializing_if = "is_false")]
    pub idempotent: bool,
    /// What a call of any of its tools needs: allow, ask or deny; each tool's marks
    /// decide when left out (read-only allowed, the others asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// What a call of one tool needs, by the tool's name, over `policy`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, String>,
    /// What it is, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One `[[subscription]]`: the agent's events of one type run one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionToml {
    /// The tool: one of this file's, or the deployment's.
    pub tool: String,
    /// The event type (`GITHUB_PUSH`).
    pub event: String,
    /// Lower runs first among the tools of one event (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub order: i32,
    /// Further conditions: `min_priority`, `topics`, `payload` (dotted paths to values).
    #[serde(default, skip_serializing_if = "is_no_filter")]
    #[schemars(with = "BTreeMap<String, Value>")]
    pub filter: Filter,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_no_filter(f: &Filter) -> bool {
    *f == Filter::default()
}

/// What the files ask of the registry for one agent.
#[derive(Clone, Debug, Default)]
pub(crate) struct ToolSpecs {
    /// The tools declared, as they would be stored (owner and dates set when made).
    pub(crate) tools: Vec<Tool>,
    /// The subscriptions: tool, event, order, filter.
    pub(crate) subscriptions: Vec<(ToolName, EventType, i32, Filter)>,
}

/// The tools and subscriptions `file` asks for, every value checked and each variable
/// read from `env`.
pub(crate) fn specs(
    file: &Path,
    toml: &ToolsToml,
    env: &dyn Fn(&str) -> Option<String>,
    now: Timestamp,
) -> Result<ToolSpecs, FileError> {
    let mut out = ToolSpecs::default();
    let mut names = HashSet::new();
    let variable = |what: &str, var: &str| {
        env(var.trim()).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
            FileError::new(
                file,
                format!(
                    "{what} is read from {var}, which is not set: set it (the value is never written in a file)"
                ),
            )
        })
    };
    for t in &toml.tools {
        let bad = |p: String| FileError::new(file, format!("tool {:?}: {p}", t.name));
        let name = ToolName::parse(t.name.trim()).map_err(|e| bad(e.to_string()))?;
        if !names.insert(name.clone()) {
            return Err(bad("declared twice; each tool needs its own name".into()));
        }
        let timeout = match &t.timeout {
            Some(s) => parse_duration("timeout", s)
                .map_err(|e| bad(e.to_string()))?
                .unsigned_abs(),
            None => Tool::DEFAULT_TIMEOUT,
        };
        let mut tool = Tool::http(name, &t.url, timeout, now).map_err(|e| bad(e.to_string()))?;
        let mut config = serde_json::Map::new();
        for (k, v) in &t.config {
            config.insert(k.clone(), v.clone());
        }
        for (k, var) in &t.config_env {
            if config.contains_key(k) {
                return Err(bad(format!(
                    "config key {k:?} is given both in config and in config_env; keep one"
                )));
            }
            let value = variable(&format!("tool {:?}'s config key {k:?}", t.name), var)?;
            config.insert(k.clone(), Value::String(value));
            tool.config_env.insert(k.clone(), var.trim().to_owned());
        }
        tool.config = if config.is_empty() {
            Value::Null
        } else {
            Value::Object(config)
        };
        tool.idempotent = t.idempotent;
        tool.description = text(&t.description);
        out.tools.push(tool);
    }
    for m in &toml.servers {
        let bad = |p: String| FileError::new(file, format!("MCP server {:?}: {p}", m.name));
        let name = ToolName::parse(m.name.trim()).map_err(|e| bad(e.to_string()))?;
        if !names.insert(name.clone()) {
            return Err(bad("declared twice; each tool needs its own name".into()));
        }
        let timeout = match &m.timeout {
            Some(s) => parse_duration("timeout", s)
                .map_err(|e| bad(e.to_string()))?
                .unsigned_abs(),
            None => McpServer::DEFAULT_TIMEOUT,
        };
        let allow: Vec<String> = m.allow.iter().map(|a| a.trim().to_owned()).collect();
        let mut server = match (&m.url, m.command.is_empty()) {
            (Some(url), true) => {
                let mut headers = Vec::new();
                for (header, var) in &m.headers_env {
                    let value = variable(&format!("MCP server {:?}'s {header}", m.name), var)?;
                    headers.push(
                        McpHeader::parse(&format!("{header}: {value}"))
                            .map_err(|e| bad(e.to_string()))?,
                    );
                }
                McpServer::new(url, headers, allow, timeout)
            }
            (None, false) => {
                if !m.headers_env.is_empty() {
                    return Err(bad(
                        "headers_env is for a server at a URL; a local program is given `env`"
                            .into(),
                    ));
                }
                McpServer::local(m.command.clone(), m.env.clone(), allow, timeout)
            }
            (Some(_), false) => {
                return Err(bad("give `url` or `command`, not both".into()));
            }
            (None, true) => return Err(bad("give `url`, or `command`".into())),
        }
        .map_err(|e| bad(e.to_string()))?;
        server.policy = m
            .policy
            .as_deref()
            .map(ToolPolicy::parse)
            .transpose()
            .map_err(|e| bad(e.to_string()))?;
        for (tool, policy) in &m.policies {
            let policy = ToolPolicy::parse(policy).map_err(|e| bad(format!("{tool}: {e}")))?;
            server.policies.insert(tool.clone(), policy);
        }
        let mut tool = Tool::mcp(name, server, now);
        tool.idempotent = m.idempotent;
        tool.description = text(&m.description);
        out.tools.push(tool);
    }
    let mut routes = HashSet::new();
    for s in &toml.subscriptions {
        let bad = |p: String| {
            FileError::new(
                file,
                format!("subscription of {:?} to {:?}: {p}", s.tool, s.event),
            )
        };
        let tool = ToolName::parse(s.tool.trim()).map_err(|e| bad(e.to_string()))?;
        let event = EventType::parse(s.event.trim()).map_err(|e| bad(e.to_string()))?;
        if !routes.insert((tool.clone(), event.clone())) {
            return Err(bad(
                "given twice; one tool runs once for one event type (merge their filters)".into(),
            ));
        }
        if out
            .tools
            .iter()
            .any(|t| t.name == tool && t.mcp_server().is_some())
        {
            return Err(bad(
                "an MCP server's tools are called by the model, not run on events: give the agent `tools = [\"mcp:NAME\"]` in agent.toml".into(),
            ));
        }
        out.subscriptions
            .push((tool, event, s.order, s.filter.clone()));
    }
    Ok(out)
}

fn text(t: &Option<String>) -> Option<String> {
    t.as_deref()
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
}

/// What a [`ToolChange`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolTarget {
    /// An HTTP tool, by name.
    Tool(ToolName),
    /// An MCP server, by name.
    Server(ToolName),
    /// The agent's subscription of a tool to an event type.
    Subscription(ToolName, EventType),
}

impl ToolTarget {
    /// The tool `t`.
    pub fn of(t: &Tool) -> Self {
        match t.kind {
            ToolKind::Mcp(_) => Self::Server(t.name.clone()),
            _ => Self::Tool(t.name.clone()),
        }
    }

    /// How a plan names it: `tool NAME`, `mcp NAME` or `subscription TOOL EVENT`.
    pub fn label(&self) -> String {
        match self {
            Self::Tool(n) => format!("tool {n}"),
            Self::Server(n) => format!("mcp {n}"),
            Self::Subscription(tool, event) => format!("subscription {tool} {event}"),
        }
    }

    /// The tool or server it names (`None` for a subscription).
    pub fn tool(&self) -> Option<&ToolName> {
        match self {
            Self::Tool(n) | Self::Server(n) => Some(n),
            Self::Subscription(..) => None,
        }
    }
}

/// What happens to one of an agent's tools or subscriptions.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum ToolChange {
    /// It is made.
    Create {
        /// `tool NAME`, `mcp NAME` or `subscription TOOL EVENT`.
        name: String,
        /// What it is: a URL, a place, a filter.
        detail: String,
        /// What it is about.
        #[serde(skip)]
        target: ToolTarget,
    },
    /// It differs: changed in place (a tool keeps its name and record; a subscription
    /// its id and whether it is enabled).
    Change {
        /// As in `Create`.
        name: String,
        /// What differs; a secret as `***`.
        fields: Vec<FieldChange>,
        /// What it is about.
        #[serde(skip)]
        target: ToolTarget,
    },
    /// In the store and not in the files: removed only with `prune`.
    Remove {
        /// As in `Create`.
        name: String,
        /// Whether it is removed.
        pruned: bool,
        /// What it is about.
        #[serde(skip)]
        target: ToolTarget,
    },
}

impl ToolChange {
    /// `target` made, as `detail` says.
    pub fn create(target: ToolTarget, detail: String) -> Self {
        Self::Create {
            name: target.label(),
            detail,
            target,
        }
    }

    /// `target` changed in `fields`.
    pub fn change(target: ToolTarget, fields: Vec<FieldChange>) -> Self {
        Self::Change {
            name: target.label(),
            fields,
            target,
        }
    }

    /// `target` left out of the files: removed if `pruned`.
    pub fn remove(target: ToolTarget, pruned: bool) -> Self {
        Self::Remove {
            name: target.label(),
            pruned,
            target,
        }
    }

    /// Whether applying it writes something.
    pub fn writes(&self) -> bool {
        !matches!(self, Self::Remove { pruned: false, .. })
    }

    /// Its name, as the plan shows it.
    pub fn name(&self) -> &str {
        match self {
            Self::Create { name, .. } | Self::Change { name, .. } | Self::Remove { name, .. } => {
                name
            }
        }
    }

    /// What it is about.
    pub fn target(&self) -> &ToolTarget {
        match self {
            Self::Create { target, .. }
            | Self::Change { target, .. }
            | Self::Remove { target, .. } => target,
        }
    }
}

/// How a tool is named in a plan: `tool NAME` or `mcp NAME`.
pub(crate) fn label(t: &Tool) -> String {
    ToolTarget::of(t).label()
}

/// A tool's settings the files cover, by key, for comparing; secret values hidden.
fn settings(t: &Tool) -> BTreeMap<&'static str, Option<String>> {
    let mut out = BTreeMap::from([
        ("description", t.description.clone()),
        ("idempotent", Some(t.idempotent.to_string())),
    ]);
    match &t.kind {
        ToolKind::Http { url, timeout_ms } => {
            out.insert("url", Some(pulse_egress::redacted(url)));
            out.insert("timeout", Some(ms(*timeout_ms)));
            out.insert("config", config_shown(t));
            let vars: Vec<String> = t
                .config_env
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            out.insert(
                "config_env",
                Some(vars.join(", ")).filter(|s| !s.is_empty()),
            );
        }
        ToolKind::Mcp(m) => {
            out.insert("place", Some(m.place()));
            out.insert("env", Some(m.env.join(", ")).filter(|s| !s.is_empty()));
            let headers: Vec<&str> = m.headers.iter().map(|h| h.name.as_str()).collect();
            out.insert(
                "headers",
                Some(headers.join(", ")).filter(|s| !s.is_empty()),
            );
            out.insert("allow", Some(m.allow.join(", ")).filter(|s| !s.is_empty()));
            out.insert("timeout", Some(ms(m.timeout_ms)));
            out.insert("policy", m.policy.map(|p| p.as_str().to_owned()));
            let policies: Vec<String> = m
                .policies
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str()))
                .collect();
            out.insert(
                "policies",
                Some(policies.join(", ")).filter(|s| !s.is_empty()),
            );
        }
        ToolKind::HeartbeatAgent => {}
    }
    out
}

fn ms(n: u64) -> String {
    format_duration(jiff::SignedDuration::from_millis(n as i64))
}

/// A tool's config as a plan shows it: the values read from variables as `***`.
fn config_shown(t: &Tool) -> Option<String> {
    let Value::Object(m) = &t.config else {
        return None;
    };
    let keys: Vec<String> = m
        .iter()
        .map(|(k, v)| {
            if t.config_env.contains_key(k) {
                format!("{k} = {HIDDEN}")
            } else {
                format!("{k} = {v}")
            }
        })
        .collect();
    Some(keys.join(", ")).filter(|s| !s.is_empty())
}

/// What differs between a stored tool and what the files want; secrets as `***`.
pub(crate) fn differences(stored: &Tool, wanted: &Tool) -> Vec<FieldChange> {
    let mut out = FieldChange::between(&settings(stored), &settings(wanted));
    let mut hidden = |field: &str| {
        out.push(FieldChange {
            field: field.into(),
            before: Some(HIDDEN.into()),
            after: Some(format!("{HIDDEN} (other values)")),
        });
    };
    let (a, b) = (&settings(stored), &settings(wanted));
    if a.get("config") == b.get("config") && stored.config != wanted.config {
        hidden("config");
    }
    if let (Some(x), Some(y)) = (stored.mcp_server(), wanted.mcp_server()) {
        let values = |m: &McpServer| -> Vec<(String, String)> {
            m.headers
                .iter()
                .map(|h| (h.name.clone(), h.value.expose().to_owned()))
                .collect()
        };
        if a.get("headers") == b.get("headers") && values(x) != values(y) {
            hidden("headers");
        }
    }
    // A URL is shown with its query's values hidden: one that differs only there is
    // still a change.
    if let (ToolKind::Http { url: x, .. }, ToolKind::Http { url: y, .. }) =
        (&stored.kind, &wanted.kind)
        && a.get("url") == b.get("url")
        && x != y
    {
        let shown = pulse_egress::redacted(y);
        out.push(FieldChange {
            field: "url".into(),
            before: Some(shown.clone()),
            after: Some(format!("{shown} (other values)")),
        });
    }
    if std::mem::discriminant(&stored.kind) != std::mem::discriminant(&wanted.kind) {
        out.push(FieldChange {
            field: "kind".into(),
            before: Some(label(stored)),
            after: Some(label(wanted)),
        });
    }
    out
}

/// Whether a changed MCP server must be listed again: it is reached elsewhere, or
/// offers other tools.
pub(crate) fn relist(stored: &Tool, wanted: &Tool) -> bool {
    match (stored.mcp_server(), wanted.mcp_server()) {
        (Some(a), Some(b)) => {
            a.url != b.url
                || a.command != b.command
                || a.env != b.env
                || a.headers != b.headers
                || a.allow != b.allow
        }
        (None, Some(_)) => true,
        _ => false,
    }
}

/// `stored` made as the files want it, what the store keeps of its own (its date, its
/// owner, whether it is enabled, an MCP server's listed tools) kept.
pub(crate) fn onto(stored: &Tool, wanted: &Tool) -> Tool {
    let mut t = wanted.clone();
    t.created_at = stored.created_at;
    t.owner = stored.owner.clone();
    t.active = stored.active;
    if let (ToolKind::Mcp(new), Some(old)) = (&mut t.kind, stored.mcp_server()) {
        new.tools = old.tools.clone();
        new.listed_at = old.listed_at;
    }
    t
}

/// A subscription's settings the files cover.
pub(crate) fn subscription_fields(
    stored: &Subscription,
    order: i32,
    filter: &Filter,
) -> Vec<FieldChange> {
    let shown =
        |f: &Filter| Some(serde_json::to_string(f).unwrap_or_default()).filter(|s| s != "{}");
    FieldChange::between(
        &BTreeMap::from([
            ("order", Some(stored.order.to_string())),
            ("filter", shown(&stored.filter)),
        ]),
        &BTreeMap::from([
            ("order", Some(order.to_string())),
            ("filter", shown(filter)),
        ]),
    )
}

/// A new subscription of `agent`'s events.
pub(crate) fn subscription(
    agent: &AgentId,
    tool: &ToolName,
    event: &EventType,
    order: i32,
    filter: &Filter,
    now: Timestamp,
) -> Subscription {
    Subscription {
        id: SubscriptionId::for_route(tool, event, Some(agent)),
        tool: tool.clone(),
        event_type: event.clone(),
        agent_id: Some(agent.clone()),
        filter: filter.clone(),
        order,
        active: true,
        created_at: now,
    }
}

/// The file that describes `tools` (those the agent owns) and `subscriptions` (its
/// events'). A secret is named by a variable made from the tool's name and its key, to
/// set before applying.
pub(super) fn entries(tools: &[Tool], subscriptions: &[Subscription]) -> ToolsToml {
    let mut out = ToolsToml::default();
    let mut tools: Vec<&Tool> = tools.iter().collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    for t in tools {
        let description = t.description.clone();
        match &t.kind {
            ToolKind::Http { url, timeout_ms } => out.tools.push(HttpToolToml {
                name: t.name.to_string(),
                url: url.to_string(),
                timeout: (*timeout_ms != Tool::DEFAULT_TIMEOUT.as_millis() as u64)
                    .then(|| ms(*timeout_ms)),
                idempotent: t.idempotent,
                // The values read from variables are named by them; the others, written
                // in the file, are written again.
                config: match &t.config {
                    Value::Object(m) => m
                        .iter()
                        .filter(|(k, _)| !t.config_env.contains_key(*k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    _ => BTreeMap::new(),
                },
                config_env: t.config_env.clone(),
                description,
            }),
            ToolKind::Mcp(m) => out.servers.push(McpToml {
                name: t.name.to_string(),
                url: m.url.as_ref().map(ToString::to_string),
                command: m.command.clone(),
                env: m.env.clone(),
                headers_env: m
                    .headers
                    .iter()
                    .map(|h| (h.name.clone(), config_variable(t.name.as_str(), &h.name)))
                    .collect(),
                allow: m.allow.clone(),
                timeout: (m.timeout_ms != McpServer::DEFAULT_TIMEOUT.as_millis() as u64)
                    .then(|| ms(m.timeout_ms)),
                idempotent: t.idempotent,
                policy: m.policy.map(|p| p.as_str().to_owned()),
                policies: m
                    .policies
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().to_owned()))
                    .collect(),
                description,
            }),
            ToolKind::HeartbeatAgent => {}
        }
    }
    let mut subs: Vec<&Subscription> = subscriptions.iter().collect();
    subs.sort_by(|a, b| (&a.tool, &a.event_type).cmp(&(&b.tool, &b.event_type)));
    out.subscriptions = subs
        .into_iter()
        .map(|s| SubscriptionToml {
            tool: s.tool.to_string(),
            event: s.event_type.to_string(),
            order: s.order,
            filter: s.filter.clone(),
        })
        .collect();
    out
}

/// The variable an export names for a tool's secret value (a config key's, a header's):
/// `PULSE_TOOL_`, the tool's name and the key, in capitals, other characters as `_`.
pub fn config_variable(tool: &str, key: &str) -> String {
    format!(
        "PULSE_TOOL_{}_{}",
        crate::domain::upper_snake(tool),
        crate::domain::upper_snake(key)
    )
}

/// Where a tool is, for a plan: an HTTP tool's URL (its query's values hidden), an MCP
/// server's URL or program.
pub(crate) fn place(t: &Tool) -> String {
    match &t.kind {
        ToolKind::Http { url, .. } => pulse_egress::redacted(url),
        ToolKind::Mcp(m) => m.place(),
        ToolKind::HeartbeatAgent => "built in".into(),
    }
}

/// A subscription's order and filter, for a plan.
pub(crate) fn describe_route(order: i32, filter: &Filter) -> String {
    let mut out = format!("order {order}");
    if *filter != Filter::default() {
        out.push_str(&format!(
            ", filter {}",
            serde_json::to_string(filter).unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[tool]]
name = "mail-triage"
url = "https://tools.example.com/triage?team=ops"
timeout = "20s"
config = { folder = "INBOX" }
config_env = { api_key = "TRIAGE_API_KEY" }

[[mcp]]
name = "linear"
url = "https://mcp.linear.app/mcp"
headers_env = { Authorization = "LINEAR_MCP_AUTH" }
allow = ["list_issues"]
policy = "ask"
policies = { list_issues = "allow" }

[[subscription]]
tool = "mail-triage"
event = "EMAIL_RECEIVED"
order = -1
filter = { min_priority = 2, topics = ["billing"], payload = { "from.domain" = "acme.com" } }
"#;

    fn env(var: &str) -> Option<String> {
        match var {
            "TRIAGE_API_KEY" => Some("k-123".into()),
            "LINEAR_MCP_AUTH" => Some("Bearer lin-456".into()),
            _ => None,
        }
    }

    fn read(text: &str) -> Result<ToolSpecs, String> {
        let toml: ToolsToml = toml::from_str(text).map_err(|e| e.to_string())?;
        specs(Path::new("tools.toml"), &toml, &env, Timestamp::UNIX_EPOCH)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_reads_into_tools_with_their_secrets_from_variables_and_shows_none() {
        let specs = read(FILE).unwrap();
        let triage = &specs.tools[0];
        assert_eq!(triage.config["api_key"], "k-123");
        assert_eq!(triage.config["folder"], "INBOX");
        assert_eq!(triage.config_env["api_key"], "TRIAGE_API_KEY");
        let linear = specs.tools[1].mcp_server().unwrap();
        assert_eq!(linear.headers[0].value.expose(), "Bearer lin-456");
        assert_eq!(linear.policy, Some(ToolPolicy::Ask));
        let (tool, event, order, filter) = &specs.subscriptions[0];
        assert_eq!(
            (tool.as_str(), event.as_str(), *order),
            ("mail-triage", "EMAIL_RECEIVED", -1)
        );
        assert_eq!(filter.topics, ["billing"]);

        // A plan shows the config's plain values, the secrets as ***, the URL's query
        // hidden; a new secret is a change of hidden values.
        let shown = format!("{:?}", settings(triage));
        assert!(
            shown.contains("folder = \\\"INBOX\\\"") && shown.contains("api_key = ***"),
            "{shown}"
        );
        assert!(
            !shown.contains("k-123") && !shown.contains("ops"),
            "{shown}"
        );
        let mut rotated = triage.clone();
        rotated.config["api_key"] = Value::String("k-789".into());
        let fields = differences(triage, &rotated);
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].after.as_deref(), Some("*** (other values)"));
        assert!(differences(&specs.tools[1], &specs.tools[1].clone()).is_empty());
        // So is a URL whose query's values alone changed, still hidden.
        let moved = read(&FILE.replace("team=ops", "team=dev")).unwrap();
        let fields = differences(triage, &moved.tools[0]);
        assert_eq!(fields.len(), 1, "{fields:?}");
        assert_eq!(fields[0].field, "url");
        let after = fields[0].after.as_deref().unwrap();
        assert!(
            after.ends_with("(other values)") && !after.contains("dev"),
            "{after}"
        );

        // Exported, a secret is named by its variable; the rest written as it was.
        let back = entries(&specs.tools, &[]);
        assert_eq!(back.tools[0].config_env["api_key"], "TRIAGE_API_KEY");
        assert_eq!(back.tools[0].config["folder"], "INBOX");
        assert!(!back.tools[0].config.contains_key("api_key"));
        // (Written in two pieces: a whole `PULSE_…` literal is taken for a setting.)
        assert_eq!(
            back.servers[0].headers_env["Authorization"],
            format!("PULSE_TOOL_{}", "LINEAR_AUTHORIZATION")
        );
        let text = toml::to_string(&back).unwrap();
        assert!(
            !text.contains("k-123") && !text.contains("lin-456"),
            "{text}"
        );
    }

    #[test]
    fn what_a_file_gets_wrong_is_said_with_the_tool() {
        for (text, said) in [
            (
                "[[tool]]\nname = \"t\"\nurl = \"https://x.example\"\nconfig_env = { key = \"NOPE\" }\n",
                "tool \"t\"'s config key \"key\" is read from NOPE, which is not set",
            ),
            (
                "[[tool]]\nname = \"t\"\nurl = \"https://x.example\"\nconfig = { key = 1 }\nconfig_env = { key = \"TRIAGE_API_KEY\" }\n",
                "given both in config and in config_env",
            ),
            (
                "[[mcp]]\nname = \"m\"\ncommand = [\"prog\"]\nheaders_env = { A = \"TRIAGE_API_KEY\" }\n",
                "headers_env is for a server at a URL",
            ),
            ("[[mcp]]\nname = \"m\"\n", "give `url`, or `command`"),
            (
                "[[tool]]\nname = \"t\"\nurl = \"https://x.example\"\n[[mcp]]\nname = \"t\"\nurl = \"https://y.example\"\n",
                "declared twice",
            ),
            (
                "[[mcp]]\nname = \"m\"\nurl = \"https://y.example\"\n[[subscription]]\ntool = \"m\"\nevent = \"E\"\n",
                "not run on events",
            ),
            (
                "[[subscription]]\ntool = \"a\"\nevent = \"E\"\n[[subscription]]\ntool = \"a\"\nevent = \"E\"\norder = 2\n",
                "given twice",
            ),
            (
                "[[tool]]\nname = \"t\"\nurl = \"https://x.example\"\nurl_typo = 1\n",
                "unknown field `url_typo`",
            ),
        ] {
            let why = read(text).map(|_| ()).unwrap_err();
            assert!(why.contains(said), "{text}: {why}");
        }
    }
}
