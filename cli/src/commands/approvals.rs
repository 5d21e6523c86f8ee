//! `pulse approvals …`: the tool calls agents parked for a person's yes — list them, read
//! one, approve or deny it.

use clap::Subcommand;
use pulse_shared::domain::{Agent, Approval, ApprovalId, ApprovalStatus, Decision, ToolName};
use pulse_shared::engine::approvals::{self, DecideError};

use super::{AgentRef, Ctx, agent_ref, input};
use crate::Failure;
use crate::output::{shown, when};

#[derive(Subcommand, Debug)]
pub(crate) enum ApprovalsCmd {
    /// List parked calls: the pending ones of every agent, or an agent's latest.
    List {
        /// Only this agent's (its id, name or alias), decided ones too.
        #[arg(long)]
        agent: Option<String>,
        /// Most listed.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One parked call in full: the tool, its arguments, why the agent made it, the
    /// decision and what came of it.
    Show {
        /// The approval's id (`ap_…`).
        id: String,
    },
    /// Say yes: the call is sent once, in the agent's session, and the agent told what
    /// came of it.
    Approve {
        /// The approval's id (`ap_…`).
        id: String,
        /// Why (kept with the decision, and told to the agent).
        #[arg(long)]
        reason: Option<String>,
        /// And let this agent call this tool from now on without asking (that tool,
        /// that agent only; `pulse approvals revoke` takes it back).
        #[arg(long)]
        always: bool,
    },
    /// Say no: the call is never sent, and the agent is told (with the reason).
    Deny {
        /// The approval's id (`ap_…`).
        id: String,
        /// Why (kept with the decision, and told to the agent).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The tools agents were granted with `approve --always`: called without asking.
    Grants {
        /// Only this agent's (its id, name or alias).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Take a grant back: the agent's calls of the tool are asked about again.
    Revoke {
        /// The agent (its id, name or alias).
        #[arg(long)]
        agent: String,
        /// The tool, as SERVER/TOOL (`cal/send_mail`).
        #[arg(value_name = "SERVER/TOOL")]
        tool: String,
    },
}

/// A validated approvals command.
pub(crate) enum ApprovalsPlan {
    List {
        agent: Option<AgentRef>,
        limit: usize,
    },
    Show(ApprovalId),
    Decide {
        id: ApprovalId,
        approve: bool,
        reason: Option<String>,
        always: bool,
    },
    Grants(Option<AgentRef>),
    Revoke {
        agent: AgentRef,
        server: ToolName,
        tool: String,
    },
}

impl ApprovalsPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Decide { .. } | Self::Revoke { .. })
    }
}

fn id_arg(id: &str) -> Result<ApprovalId, Failure> {
    ApprovalId::parse(id.trim()).map_err(input)
}

pub(crate) fn plan(cmd: ApprovalsCmd) -> Result<ApprovalsPlan, Failure> {
    Ok(match cmd {
        ApprovalsCmd::List { agent, limit } => ApprovalsPlan::List {
            agent: agent.as_deref().map(agent_ref).transpose()?,
            limit: limit.clamp(1, 1_000),
        },
        ApprovalsCmd::Show { id } => ApprovalsPlan::Show(id_arg(&id)?),
        ApprovalsCmd::Approve { id, reason, always } => ApprovalsPlan::Decide {
            id: id_arg(&id)?,
            approve: true,
            reason,
            always,
        },
        ApprovalsCmd::Deny { id, reason } => ApprovalsPlan::Decide {
            id: id_arg(&id)?,
            approve: false,
            reason,
            always: false,
        },
        ApprovalsCmd::Grants { agent } => {
            ApprovalsPlan::Grants(agent.as_deref().map(agent_ref).transpose()?)
        }
        ApprovalsCmd::Revoke { agent, tool } => {
            let Some((server, name)) = tool.split_once('/') else {
                return Err(Failure::Input(format!(
                    "{tool:?}: give the tool as SERVER/TOOL, e.g. cal/send_mail (`pulse approvals grants` lists them)"
                )));
            };
            ApprovalsPlan::Revoke {
                agent: agent_ref(&agent)?,
                server: ToolName::parse(server).map_err(input)?,
                tool: name.to_owned(),
            }
        }
    })
}

/// The approval `id` and its agent, or bad input saying where to look.
async fn found(cx: &Ctx<'_>, id: &ApprovalId) -> Result<(Agent, Approval), Failure> {
    let not_found = || {
        Failure::Input(format!(
            "there is no approval {id}; `pulse approvals list` shows the pending ones"
        ))
    };
    let (agent_id, approval) = approvals::find(cx.b.store.as_ref(), id)
        .await?
        .ok_or_else(not_found)?;
    let agent =
        cx.b.store
            .get_agent(&agent_id)
            .await?
            .ok_or_else(not_found)?;
    Ok((agent, approval))
}

pub(crate) async fn execute(plan: ApprovalsPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    match plan {
        ApprovalsPlan::List { agent, limit } => {
            let rows = match agent {
                Some(r) => b.store.approvals(&r.find(b).await?.id, limit).await?,
                None => b
                    .store
                    .open_approvals(limit)
                    .await?
                    .into_iter()
                    .filter(Approval::is_pending)
                    .collect(),
            };
            out.table(&rows, &["ID", "AGENT", "STATUS", "EXPIRES", "CALL"], |a| {
                vec![
                    a.id.to_string(),
                    a.agent_id.to_string(),
                    a.status.as_str().to_owned(),
                    when(Some(a.expires_at)),
                    shown(&a.summary(80)),
                ]
            });
        }
        ApprovalsPlan::Show(id) => {
            let (agent, a) = found(cx, &id).await?;
            if out.json {
                out.json_value(&a);
                return Ok(());
            }
            let from = match (&a.turn_id, &a.heartbeat_id) {
                (Some(t), _) => format!("chat turn {t}"),
                (None, Some(h)) => format!("heartbeat {h}"),
                _ => "-".to_owned(),
            };
            let args = serde_json::to_string_pretty(&a.arguments).unwrap_or_default();
            let mut lines = vec![
                format!("approval   {}", a.id),
                format!("agent      {} ({})", shown(&agent.name), agent.id),
                format!("call       {}/{}", a.server, a.tool),
                format!("from       {from}, step {}", a.step),
                format!(
                    "reason     {}",
                    a.reason.as_deref().map_or("-".to_owned(), shown)
                ),
                format!("asked      {}", when(Some(a.requested_at))),
                format!("expires    {}", when(Some(a.expires_at))),
                format!("status     {}", a.status.as_str()),
            ];
            if a.status != ApprovalStatus::Pending {
                lines.push(format!("decided    {}", a.who_decided()));
            }
            if let Some(r) = &a.decision_reason {
                lines.push(format!("because    {}", shown(r)));
            }
            if let Some(o) = &a.outcome {
                lines.push(format!(
                    "outcome    {}{}",
                    if o.sent { "sent" } else { "not sent" },
                    o.action_id
                        .as_ref()
                        .map_or_else(String::new, |id| format!(" (action {id})"))
                ));
                lines.push(format!("           {}", shown(&o.summary)));
            } else if a.status != ApprovalStatus::Pending {
                lines.push("outcome    not carried out yet (the agent's worker does it)".into());
            }
            lines.push(format!("arguments  {}", shown(&args)));
            for l in lines {
                crate::output::outln!("{l}");
            }
            if a.is_pending() {
                eprintln!(
                    "decide with `pulse approvals approve {id}` or `pulse approvals deny {id} --reason …`"
                );
            }
        }
        ApprovalsPlan::Grants(agent) => {
            let agents = match agent {
                Some(r) => vec![r.find(b).await?],
                None => b.store.list_agents().await?,
            };
            let rows: Vec<serde_json::Value> = agents
                .iter()
                .flat_map(|a| {
                    a.granted.iter().map(|g| {
                        serde_json::json!({
                            "agent_id": a.id,
                            "agent": a.name,
                            "server": g.server,
                            "tool": g.tool,
                            "by": g.by,
                            "at": g.at,
                            "approval_id": g.approval_id,
                        })
                    })
                })
                .collect();
            out.table(
                &rows,
                &["AGENT", "TOOL", "GRANTED BY", "AT", "APPROVAL"],
                |r| {
                    let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                    vec![
                        shown(&s("agent")),
                        format!("{}/{}", s("server"), s("tool")),
                        s("by"),
                        s("at"),
                        s("approval_id"),
                    ]
                },
            );
        }
        ApprovalsPlan::Revoke {
            agent,
            server,
            tool,
        } => {
            let a = agent.find(b).await?;
            if approvals::revoke(b.store.as_ref(), &a.id, &server, &tool).await? {
                out.done(&format!(
                    "revoked: {}'s calls of {server}/{tool} are asked about again",
                    a.name
                ));
            } else {
                return Err(Failure::Input(format!(
                    "{} holds no grant of {server}/{tool}; `pulse approvals grants --agent {}` lists its grants",
                    a.name, a.id
                )));
            }
        }
        ApprovalsPlan::Decide {
            id,
            approve,
            reason,
            always,
        } => {
            let (agent, _) = found(cx, &id).await?;
            let decision = Decision {
                approve,
                by: "cli".to_owned(),
                reason,
                always,
            };
            match approvals::decide(
                b.store.as_ref(),
                b.queue.as_ref(),
                &agent,
                &id,
                &decision,
                cx.clock.now(),
            )
            .await
            {
                Ok(decided) => out.created(
                    &decided,
                    decided.id.as_str(),
                    &match approve {
                        true => format!(
                            "approved: {} is sent in {}'s session, and it is told what came of it; `pulse approvals show {id}` shows the outcome{}",
                            decided.summary(80),
                            agent.name,
                            if always {
                                format!(
                                    "\n{}/{} is granted to {} from now on: `pulse approvals revoke --agent {} {}/{}` takes it back",
                                    decided.server, decided.tool, agent.name, agent.id, decided.server, decided.tool
                                )
                            } else {
                                String::new()
                            }
                        ),
                        false => format!(
                            "denied: {} is never sent; {} is told",
                            decided.summary(80),
                            agent.name
                        ),
                    },
                ),
                Err(DecideError::Decided(first)) => {
                    return Err(Failure::Input(format!(
                        "approval {id} was {} already; the first decision stands",
                        first.who_decided()
                    )));
                }
                Err(DecideError::NotFound(_)) => {
                    return Err(Failure::Input(format!("there is no approval {id}")));
                }
                Err(DecideError::Store(e)) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
