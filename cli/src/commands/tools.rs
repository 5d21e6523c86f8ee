//! `pulse tools …`: register, list and switch tools.

use clap::Subcommand;
use pulse_shared::domain::{
    HEARTBEAT_AGENT, Tool, ToolKind, ToolName, builtin_tools, parse_duration,
};
use pulse_shared::error::StoreError;
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
}

/// A validated tools command.
pub(crate) enum ToolsPlan {
    Add(Box<Tool>),
    List,
    Set { name: ToolName, active: bool },
}

impl ToolsPlan {
    pub(crate) fn writes(&self) -> bool {
        !matches!(self, Self::List)
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
        } => {
            let timeout = parse_duration("tool timeout", &timeout).map_err(input)?;
            if timeout.is_negative() {
                return Err(Failure::Input(
                    "invalid tool timeout: it is negative".into(),
                ));
            }
            let mut tool = Tool::http(
                ToolName::parse(&name).map_err(input)?,
                &url,
                timeout.unsigned_abs(),
                now,
            )
            .map_err(input)?;
            tool.config = config
                .as_deref()
                .map(|c| json_arg("config", c))
                .transpose()?
                .unwrap_or(Value::Null);
            tool.description = description;
            ToolsPlan::Add(Box::new(tool))
        }
        ToolsCmd::List => ToolsPlan::List,
        ToolsCmd::Enable { name } => ToolsPlan::Set {
            name: ToolName::parse(&name).map_err(input)?,
            active: true,
        },
        ToolsCmd::Disable { name } => ToolsPlan::Set {
            name: ToolName::parse(&name).map_err(input)?,
            active: false,
        },
    })
}

pub(crate) async fn execute(plan: ToolsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        ToolsPlan::Add(tool) => {
            b.store.add_tool(&tool).await.map_err(store)?;
            out.created(
                &tool,
                tool.name.as_str(),
                &format!("registered tool {}", tool.name),
            );
        }
        ToolsPlan::List => {
            let mut tools = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools())
                .tools;
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
                    };
                    vec![
                        t.name.to_string(),
                        yes_no(t.active),
                        kind.into(),
                        url,
                        timeout,
                        t.description.clone().unwrap_or_else(|| "-".into()),
                    ]
                },
            );
        }
        ToolsPlan::Set { name, active } => {
            if name.as_str() == HEARTBEAT_AGENT {
                // Built-ins are implicit until first switched: store the record to switch.
                match b.store.add_tool(&Tool::heartbeat_agent()).await {
                    Ok(()) | Err(StoreError::AlreadyExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            b.store
                .set_tool_active(&name, active)
                .await
                .map_err(store)?;
            out.done(&format!(
                "tool {name} {}",
                if active { "enabled" } else { "disabled" }
            ));
        }
    }
    Ok(())
}
