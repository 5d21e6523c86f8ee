//! `pulse tools add-mcp` and `pulse tools refresh`: MCP servers as agent tools.

use clap::Args;
use pulse_shared::app::Services;
use pulse_shared::domain::{McpHeader, McpServer, Tool, ToolName, ToolPolicy};

use super::{Ctx, input, store};
use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct AddMcp {
    /// Its name: agents are given it as mcp:NAME, and the model sees its tools as
    /// NAME__tool.
    name: String,
    /// Its streamable HTTP endpoint (https://…/mcp).
    #[arg(long, required_unless_present = "command", conflicts_with = "command")]
    url: Option<String>,
    /// Or a local program to start and speak to over stdin and stdout ("npx -y
    /// @acme/mcp-server"): under `pulse serve` with PULSE_MCP_STDIO=on only.
    #[arg(long, value_name = "PROGRAM ARGS")]
    command: Option<String>,
    /// An environment variable the local program is given from pulse serve's
    /// environment, by name (repeat for more); nothing else of it is passed.
    #[arg(long = "env", value_name = "NAME", requires = "command")]
    env: Vec<String>,
    /// A header sent with every request, "Name: value" (repeat for more). Stored
    /// encrypted; never listed.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Only these of its tools are offered (comma-separated; default: all it lists).
    #[arg(long, value_name = "TOOL,...")]
    allow: Option<String>,
    /// How long one call may take.
    #[arg(long, default_value = "30s")]
    timeout: String,
    /// Its tools may be called again after a call whose answer was lost (they do no
    /// harm twice); otherwise such a call is reported to the model as not known.
    #[arg(long)]
    idempotent: bool,
    /// What a call of any of its tools needs: allow, ask (parked until a person
    /// approves it) or deny. Unset, each tool's marks decide: read-only tools are allowed,
    /// the others asked.
    #[arg(long, value_name = "allow|ask|deny")]
    policy: Option<String>,
    /// What it is, for people.
    #[arg(long)]
    description: Option<String>,
}

/// The server `a` describes, not listed yet.
pub(crate) fn plan(a: AddMcp, now: jiff::Timestamp) -> Result<Tool, Failure> {
    let name = ToolName::parse(&a.name).map_err(input)?;
    let headers = a
        .headers
        .iter()
        .map(|h| McpHeader::parse(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(input)?;
    let allow = a
        .allow
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let timeout = pulse_shared::domain::parse_duration("timeout", &a.timeout).map_err(input)?;
    if timeout.is_negative() {
        return Err(Failure::Input("--timeout must not be negative".into()));
    }
    let server = match (&a.url, &a.command) {
        (Some(url), _) => McpServer::new(url, headers, allow, timeout.unsigned_abs()),
        (None, Some(command)) => {
            if !headers.is_empty() {
                return Err(Failure::Input(
                    "--header is for servers at a URL; a local program is given --env NAME".into(),
                ));
            }
            let words = command.split_whitespace().map(str::to_owned).collect();
            McpServer::local(words, a.env.clone(), allow, timeout.unsigned_abs())
        }
        (None, None) => return Err(Failure::Input("give --url, or --command".into())),
    }
    .map_err(input)?;
    let mut server = server;
    server.policy = a
        .policy
        .as_deref()
        .map(ToolPolicy::parse)
        .transpose()
        .map_err(input)?;
    let mut tool = Tool::mcp(name, server, now);
    tool.idempotent = a.idempotent;
    tool.description = a.description;
    Ok(tool)
}

/// A server's line in `tools list`: its tools, each with what a call of it needs, and
/// when they were listed.
pub(crate) fn summary(m: &McpServer, description: Option<&str>) -> String {
    let tools: Vec<String> = m
        .allowed()
        .map(|t| format!("{} {}", t.name, m.policy_of(&t.name).0))
        .collect();
    let listed = m
        .listed_at
        .map_or("never listed".to_owned(), |t| format!("listed {t}"));
    let mut line = format!("{} tools ({}); {listed}", tools.len(), tools.join(", "));
    if let Some(d) = description {
        line = format!("{d}; {line}");
    }
    line
}

/// `tools add-mcp`: lists the server's tools first — a server that cannot be reached or
/// does not speak MCP is refused with nothing stored — then registers it with them.
pub(crate) async fn add(mut tool: Tool, cx: &Ctx<'_>) -> Result<(), Failure> {
    let services = Services::from_config(cx.config);
    let local = tool.mcp_server().is_some_and(McpServer::is_local);
    if local {
        local_servers(cx.config)?;
    }
    let agent_tools = cx.b.agent_tools_with(cx.clock.clone(), &services, local);
    let server = tool
        .mcp_server()
        .cloned()
        .expect("planned as an MCP server");
    let (tools, left_out) = agent_tools
        .clients()
        .list(&tool.name, &server)
        .await
        .map_err(|why| Failure::Input(format!("{why}; nothing was registered")))?;
    let mut listed = server;
    listed.tools = tools;
    listed.listed_at = Some(cx.clock.now());
    let missing = listed.missing_allowed();
    if !missing.is_empty() {
        let have: Vec<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
        let mut why = format!(
            "--allow names tools the server does not list: {}; it lists {}",
            missing.join(", "),
            have.join(", ")
        );
        for out in &left_out {
            why.push_str(&format!("\nleft out: {out}"));
        }
        return Err(Failure::Input(why));
    }
    tool.kind = pulse_shared::domain::ToolKind::Mcp(Box::new(listed));
    cx.b.store.add_tool(&tool).await.map_err(store)?;
    let m = tool.mcp_server().expect("an MCP server");
    let mut line = format!(
        "registered MCP server {}: {}; give it to an agent with `pulse agents update AGENT --tools mcp:{}`",
        tool.name,
        summary(m, None),
        tool.name
    );
    for why in left_out {
        line.push_str(&format!("\nleft out: {why}"));
    }
    cx.out.created(&tool.redacted(), tool.name.as_str(), &line);
    Ok(())
}

/// `tools refresh NAME`.
pub(crate) async fn refresh(name: &ToolName, cx: &Ctx<'_>) -> Result<(), Failure> {
    let registry = cx.b.store.load_registry().await?;
    let tool = registry
        .tools
        .iter()
        .find(|t| t.name == *name)
        .ok_or_else(|| {
            Failure::Input(format!(
                "there is no MCP server {name}; `pulse tools list` shows the tools"
            ))
        })?;
    if tool.mcp_server().is_none() {
        return Err(Failure::Input(format!(
            "{name} is not an MCP server: only MCP servers have tools to list"
        )));
    }
    let services = Services::from_config(cx.config);
    let local = tool.mcp_server().is_some_and(McpServer::is_local);
    if local {
        local_servers(cx.config)?;
    }
    let agent_tools = cx.b.agent_tools_with(cx.clock.clone(), &services, local);
    let (fresh, left_out) = agent_tools
        .refresh(tool)
        .await
        .map_err(|why| Failure::Runtime(anyhow::anyhow!("{why}; the stored list is kept")))?;
    let m = fresh.mcp_server().expect("an MCP server");
    let mut line = format!("MCP server {name}: {}", summary(m, None));
    let missing = m.missing_allowed();
    if !missing.is_empty() {
        line.push_str(&format!(
            "\nits allow-list names tools it no longer lists: {}",
            missing.join(", ")
        ));
    }
    for why in left_out {
        line.push_str(&format!("\nleft out: {why}"));
    }
    cx.out.created(&fresh.redacted(), name.as_str(), &line);
    Ok(())
}

/// `tools policy SERVER [TOOL] POLICY`: sets (or with `None` clears) the policy of the
/// server's tools, or of one of them.
pub(crate) async fn set_policy(
    cx: &Ctx<'_>,
    name: &ToolName,
    tool: Option<&str>,
    policy: Option<ToolPolicy>,
) -> Result<(), Failure> {
    let registry = cx.b.store.load_registry().await?;
    let mut stored = registry
        .tools
        .iter()
        .find(|t| t.name == *name)
        .cloned()
        .ok_or_else(|| {
            Failure::Input(format!(
                "there is no MCP server {name}; `pulse tools list` shows the tools"
            ))
        })?;
    let pulse_shared::domain::ToolKind::Mcp(server) = &mut stored.kind else {
        return Err(Failure::Input(format!(
            "{name} is not an MCP server: policies are for the tools agents call themselves"
        )));
    };
    let said = policy.map_or("default".to_owned(), |p| p.to_string());
    let what = match tool {
        Some(t) => {
            if !server.tools.iter().any(|l| l.name == t) {
                let have: Vec<&str> = server.tools.iter().map(|l| l.name.as_str()).collect();
                return Err(Failure::Input(format!(
                    "{name} lists no tool {t:?}; it lists {} (`pulse tools refresh {name}` lists them again)",
                    have.join(", ")
                )));
            }
            match policy {
                Some(p) => server.policies.insert(t.to_owned(), p),
                None => server.policies.remove(t),
            };
            format!("{name}/{t}")
        }
        None => {
            server.policy = policy;
            format!("every tool of {name} without its own")
        }
    };
    cx.b.store.update_tool(&stored).await.map_err(store)?;
    let m = stored.mcp_server().expect("an MCP server");
    cx.out.created(
        &stored.redacted(),
        name.as_str(),
        &format!("policy of {what}: {said}\n{name}: {}", summary(m, None)),
    );
    Ok(())
}

/// Refuses to remove an MCP server agents are still given.
pub(crate) async fn refuse_attached(cx: &Ctx<'_>, name: &ToolName) -> Result<(), Failure> {
    let attached: Vec<String> =
        cx.b.store
            .list_agents()
            .await?
            .into_iter()
            .filter(|a| a.tools.iter().any(|t| t.server == *name))
            .map(|a| format!("{} ({})", a.name, a.id))
            .collect();
    if attached.is_empty() {
        return Ok(());
    }
    Err(Failure::Input(format!(
        "MCP server {name} is given to {}: take it from them first with `pulse agents update AGENT --tools …`",
        attached.join(", ")
    )))
}

/// Refuses unless local MCP servers may be started here ([`local_switch`]).
pub(crate) fn local_servers(config: &pulse_shared::config::Config) -> Result<(), Failure> {
    if local_switch(config)? {
        return Ok(());
    }
    Err(Failure::Input(
        "local MCP servers (--command) are started by `pulse serve` only when PULSE_MCP_STDIO=on is set, here and where it runs: a program started this way runs with your user's rights".into(),
    ))
}

/// Whether local MCP servers (programs) may be started here: `PULSE_MCP_STDIO=on`, on
/// the embedded backend. Unset or `off` is no; anything else, or `on` with the AWS
/// backend (whose Lambda functions never start programs), is refused saying why.
pub(crate) fn local_switch(config: &pulse_shared::config::Config) -> Result<bool, Failure> {
    let on = match std::env::var("PULSE_MCP_STDIO")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        None | Some("") | Some("off") => false,
        Some("on") => true,
        Some(other) => {
            return Err(Failure::Input(format!(
                "PULSE_MCP_STDIO={other:?}: give on or off"
            )));
        }
    };
    if !on {
        return Ok(false);
    }
    if !matches!(config.backend, pulse_shared::config::Backend::Sqlite { .. }) {
        return Err(Failure::Input(
            "local MCP servers run only under `pulse serve` on the embedded database: the Lambda functions never start programs".into(),
        ));
    }
    Ok(true)
}
