//! `pulse tools …`: register, list, change, switch and remove tools.

use clap::Subcommand;
use pulse_shared::domain::{
    HEARTBEAT_AGENT, Registry, Tool, ToolKind, ToolName, ToolPolicy, builtin_tools, parse_duration,
};
use pulse_shared::engine::switch_tool;
use serde_json::Value;

use super::{Ctx, input, json_arg, store, yes_no};
use crate::Failure;
use crate::output::duration_ms;

#[derive(Subcommand, Debug)]
pub(crate) enum ToolsCmd {
    /// Register an HTTP tool: Pulse POSTs each request to its URL.
    Add {
        /// Unique name.
        #[arg(long)]
        name: String,
        /// http:// or https:// URL.
        #[arg(long)]
        url: String,
        /// How long to wait for an answer.
        #[arg(long, default_value = "10s")]
        timeout: String,
        /// JSON given to the tool as `tool_config`.
        #[arg(long)]
        config: Option<String>,
        /// What it does.
        #[arg(long)]
        description: Option<String>,
        /// Calling it twice does no harm: a call whose answer was lost (or a run that
        /// stopped during it) may call it again. Otherwise such a call ends UNKNOWN, for
        /// its operator to settle.
        #[arg(long)]
        idempotent: bool,
    },
    /// Register an MCP server (streamable HTTP): its tools are listed now and kept;
    /// agents attached to it (`pulse agents update A --tools mcp:NAME`) may call them.
    AddMcp(super::mcp::AddMcp),
    /// What a call of an MCP server's tools needs: `allow` (called as the model asks),
    /// `ask` (parked until a person approves it: `pulse approvals`) or `deny` (never
    /// called); `default` goes back to the tools' marks (read-only tools allowed, the
    /// others asked). `pulse tools policy SERVER ask` sets the whole server;
    /// `pulse tools policy SERVER TOOL allow` one tool, over the server's.
    Policy {
        /// The MCP server's name.
        server: String,
        /// A tool of it, then the policy; or the policy alone, for all its tools.
        #[arg(value_name = "TOOL|POLICY")]
        first: String,
        /// The policy, when a tool is named: allow, ask, deny or default.
        #[arg(value_name = "POLICY")]
        policy: Option<String>,
    },
    /// List an MCP server's tools again and keep the new list.
    Refresh {
        /// The MCP server's name.
        name: String,
    },
    /// How each tool fared: calls, succeeded, failed, unknown, and p50/p95 time.
    Stats {
        /// Since when: a duration back from now (1d, 12h) or a time.
        #[arg(long, default_value = "1d")]
        since: String,
    },
    /// List tools.
    List,
    /// Let a tool run again.
    Enable {
        /// The tool's name.
        name: String,
    },
    /// Stop a tool from running (its subscriptions stay).
    Disable {
        /// The tool's name.
        name: String,
    },
    /// Change an HTTP tool's URL, timeout, config or description.
    Update {
        /// The tool's name.
        name: String,
        /// http:// or https:// URL.
        #[arg(long)]
        url: Option<String>,
        /// How long to wait for an answer.
        #[arg(long)]
        timeout: Option<String>,
        /// JSON given to the tool as `tool_config` ("null" removes it).
        #[arg(long)]
        config: Option<String>,
        /// What it does ("" removes it).
        #[arg(long)]
        description: Option<String>,
        /// Whether calling it twice does no harm (true or false).
        #[arg(long, value_name = "true|false")]
        idempotent: Option<bool>,
    },
    /// Remove a tool. Refused while subscriptions name it: remove those first.
    Remove {
        /// The tool's name.
        name: String,
    },
}

/// What `tools update` changes.
pub(crate) struct ToolChanges {
    name: ToolName,
    url: Option<String>,
    timeout: Option<std::time::Duration>,
    config: Option<Value>,
    description: Option<String>,
    idempotent: Option<bool>,
}

/// A validated tools command.
pub(crate) enum ToolsPlan {
    Add(Box<Tool>),
    AddMcp(Box<Tool>),
    Refresh(ToolName),
    Policy {
        server: ToolName,
        tool: Option<String>,
        policy: Option<ToolPolicy>,
    },
    Stats(super::events::Since),
    List,
    Set {
        name: ToolName,
        active: bool,
    },
    Update(Box<ToolChanges>),
    Remove(ToolName),
}

impl ToolsPlan {
    pub(crate) fn writes(&self) -> bool {
        !matches!(self, Self::List | Self::Stats(_))
    }
}

pub(crate) fn plan(cmd: ToolsCmd, now: jiff::Timestamp) -> Result<ToolsPlan, Failure> {
    Ok(match cmd {
        ToolsCmd::Add {
            name,
            url,
            timeout,
            config,
            description,
            idempotent,
        } => {
            let mut tool = Tool::http(
                ToolName::parse(&name).map_err(input)?,
                &url,
                timeout_arg(&timeout)?,
                now,
            )
            .map_err(input)?;
            tool.config = config
                .as_deref()
                .map(|c| json_arg("config", c))
                .transpose()?
                .unwrap_or(Value::Null);
            tool.description = description;
            tool.idempotent = idempotent;
            ToolsPlan::Add(Box::new(tool))
        }
        ToolsCmd::AddMcp(a) => ToolsPlan::AddMcp(Box::new(super::mcp::plan(a, now)?)),
        ToolsCmd::Refresh { name } => ToolsPlan::Refresh(ToolName::parse(&name).map_err(input)?),
        ToolsCmd::Policy {
            server,
            first,
            policy,
        } => {
            let (tool, policy) = match policy {
                Some(p) => (Some(first), p),
                None => (None, first),
            };
            ToolsPlan::Policy {
                server: ToolName::parse(&server).map_err(input)?,
                tool,
                policy: match policy.trim() {
                    "default" => None,
                    p => Some(ToolPolicy::parse(p).map_err(|_| {
                        Failure::Input(format!(
                            "{p:?} is not a policy: give allow, ask, deny or default (`pulse tools policy SERVER [TOOL] POLICY`)"
                        ))
                    })?),
                },
            }
        }
        ToolsCmd::Stats { since } => ToolsPlan::Stats(super::events::Since::parse(&since)?),
        ToolsCmd::List => ToolsPlan::List,
        ToolsCmd::Enable { name } => ToolsPlan::Set {
            name: ToolName::parse(&name).map_err(input)?,
            active: true,
        },
        ToolsCmd::Disable { name } => ToolsPlan::Set {
            name: ToolName::parse(&name).map_err(input)?,
            active: false,
        },
        ToolsCmd::Update {
            name,
            url,
            timeout,
            config,
            description,
            idempotent,
        } => {
            if url.is_none()
                && timeout.is_none()
                && config.is_none()
                && description.is_none()
                && idempotent.is_none()
            {
                return Err(Failure::Input(
                    "nothing to change: give --url, --timeout, --config, --description or --idempotent".into(),
                ));
            }
            ToolsPlan::Update(Box::new(ToolChanges {
                name: ToolName::parse(&name).map_err(input)?,
                url,
                timeout: timeout.as_deref().map(timeout_arg).transpose()?,
                config: config
                    .as_deref()
                    .map(|c| json_arg("config", c))
                    .transpose()?,
                description,
                idempotent,
            }))
        }
        ToolsCmd::Remove { name } => ToolsPlan::Remove(ToolName::parse(&name).map_err(input)?),
    })
}

fn timeout_arg(s: &str) -> Result<std::time::Duration, Failure> {
    let timeout = parse_duration("tool timeout", s).map_err(input)?;
    if timeout.is_negative() {
        return Err(Failure::Input(
            "invalid tool timeout: it is negative".into(),
        ));
    }
    Ok(timeout.unsigned_abs())
}

/// A registered HTTP tool the user named, or bad input.
fn stored_http_tool(registry: &Registry, name: &ToolName) -> Result<Tool, Failure> {
    if name.as_str() == HEARTBEAT_AGENT {
        return Err(Failure::Input(format!(
            "{HEARTBEAT_AGENT} is built in: it can be enabled or disabled, not changed or removed"
        )));
    }
    registry
        .tools
        .iter()
        .find(|t| t.name == *name)
        .cloned()
        .ok_or_else(|| {
            Failure::Input(format!(
                "tool {name} not found; `pulse tools list` shows the tools"
            ))
        })
}

async fn change(plan: ToolsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let registry = cx.b.store.load_registry().await?;
    match plan {
        ToolsPlan::Update(c) => {
            let c = *c;
            let old = stored_http_tool(&registry, &c.name)?;
            let ToolKind::Http { url, timeout_ms } = &old.kind else {
                return Err(Failure::Input(format!(
                    "{} is an MCP server: `pulse tools refresh {}` lists its tools again; to change its URL, headers or allow-list, remove it and add it again",
                    old.name, old.name
                )));
            };
            let mut tool = Tool::http(
                old.name.clone(),
                c.url.as_deref().unwrap_or(url.as_str()),
                c.timeout
                    .unwrap_or(std::time::Duration::from_millis(*timeout_ms)),
                old.created_at,
            )
            .map_err(input)?;
            tool.active = old.active;
            tool.idempotent = c.idempotent.unwrap_or(old.idempotent);
            tool.config = c.config.unwrap_or(old.config);
            tool.description = match c.description {
                Some(d) if d.trim().is_empty() => None,
                Some(d) => Some(d),
                None => old.description,
            };
            cx.b.store.update_tool(&tool).await.map_err(store)?;
            cx.out.created(
                &tool.redacted(),
                tool.name.as_str(),
                &format!("updated tool {}", tool.name),
            );
            if c.url.is_some()
                && let ToolKind::Http { url, .. } = &tool.kind
            {
                warn_if_refused(cx, url).await;
            }
        }
        ToolsPlan::Remove(name) => {
            if stored_http_tool(&registry, &name)?.mcp_server().is_some() {
                super::mcp::refuse_attached(cx, &name).await?;
            }
            let subs: Vec<String> = registry
                .subscriptions
                .iter()
                .filter(|s| s.tool == name)
                .map(|s| format!("{} ({})", s.id, s.event_type))
                .collect();
            if !subs.is_empty() {
                return Err(Failure::Input(format!(
                    "tool {name} is still subscribed to by {}: remove them first with `pulse subscriptions remove ID`",
                    subs.join(", ")
                )));
            }
            cx.b.store.remove_tool(&name).await.map_err(store)?;
            cx.out.done(&format!("removed tool {name}"));
        }
        _ => unreachable!("answered by execute"),
    }
    Ok(())
}

pub(crate) async fn execute(plan: ToolsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        ToolsPlan::Add(tool) => {
            b.store.add_tool(&tool).await.map_err(store)?;
            out.created(
                &tool.redacted(),
                tool.name.as_str(),
                &format!("registered tool {}", tool.name),
            );
            if let ToolKind::Http { url, .. } = &tool.kind {
                if url.query().is_some() {
                    eprintln!(
                        "note: the URL's query is sent with every call; errors, hooks, logs and listings show its values as ***. A key belongs in --config (sent in each request's tool_config) rather than in the URL"
                    );
                }
                warn_if_refused(cx, url).await;
            }
        }
        ToolsPlan::List => {
            let mut tools = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools())
                .tools
                .iter()
                .map(Tool::redacted)
                .collect::<Vec<_>>();
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            out.table(
                &tools,
                &["NAME", "ACTIVE", "KIND", "URL", "TIMEOUT", "DESCRIPTION"],
                |t| {
                    let (kind, url, timeout) = match &t.kind {
                        ToolKind::Http { url, timeout_ms } => {
                            ("http", url.to_string(), duration_ms(*timeout_ms))
                        }
                        ToolKind::HeartbeatAgent => ("built-in", "-".into(), "-".into()),
                        ToolKind::Mcp(m) => ("mcp", m.place(), duration_ms(m.timeout_ms)),
                    };
                    vec![
                        t.name.to_string(),
                        yes_no(t.active),
                        kind.into(),
                        url,
                        timeout,
                        match t.mcp_server() {
                            Some(m) => super::mcp::summary(m, t.description.as_deref()),
                            None => t.description.clone().unwrap_or_else(|| "-".into()),
                        },
                    ]
                },
            );
        }
        ToolsPlan::Set { name, active } => {
            switch_tool(b.store.as_ref(), &name, active)
                .await
                .map_err(store)?;
            out.done(&format!(
                "tool {name} {}",
                if active { "enabled" } else { "disabled" }
            ));
        }
        ToolsPlan::AddMcp(tool) => super::mcp::add(*tool, cx).await?,
        ToolsPlan::Policy {
            server,
            tool,
            policy,
        } => super::mcp::set_policy(cx, &server, tool.as_deref(), policy).await?,
        ToolsPlan::Refresh(name) => super::mcp::refresh(&name, cx).await?,
        ToolsPlan::Stats(since) => {
            let now = cx.clock.now();
            let stats =
                pulse_shared::engine::actions::tool_stats(b.store.as_ref(), since.at(now), now)
                    .await?;
            let ms = |v: Option<u64>| v.map_or("-".into(), duration_ms);
            out.table(
                &stats,
                &[
                    "TOOL",
                    "CALLS",
                    "SUCCEEDED",
                    "FAILED",
                    "UNKNOWN",
                    "P50",
                    "P95",
                ],
                |s| {
                    vec![
                        s.tool.clone(),
                        s.calls.to_string(),
                        s.succeeded.to_string(),
                        s.failed.to_string(),
                        s.unknown.to_string(),
                        ms(s.p50_ms),
                        ms(s.p95_ms),
                    ]
                },
            );
        }
        other => return change(other, cx).await,
    }
    Ok(())
}

/// Says at once when the guard on outbound requests will refuse every call to `url`
/// (an address that is private, loopback or link-local and not allowed), rather than
/// leaving it to the first heartbeat's failed action.
async fn warn_if_refused(cx: &Ctx<'_>, url: &url::Url) {
    let shown = pulse_egress::redacted(url);
    match pulse_shared::app::egress(cx.config).check(url).await {
        Ok(_) => {}
        Err(e) if e.is_refused() => eprintln!(
            "note: every call to {shown} will be refused: {e}. Allow its address with PULSE_HOOKS_ALLOW (e.g. PULSE_HOOKS_ALLOW=10.0.0.0/8) where Pulse runs, or give the tool a public URL"
        ),
        Err(e) => eprintln!(
            "note: {shown} could not be checked now ({e}); calls to it fail until it resolves"
        ),
    }
}
