//! `pulse tokens …`: API tokens for the messages API (`POST /v1/agents/{id}/messages`).

use clap::Subcommand;
use jiff::SignedDuration;
use pulse_shared::domain::{ApiToken, TokenId, parse_duration};

use super::{AgentRef, Ctx, agent_ref, input};
use crate::Failure;
use crate::output::when;

#[derive(Subcommand, Debug)]
pub(crate) enum TokensCmd {
    /// Make a token that speaks to one agent; it is shown once.
    Create {
        /// The agent: its id, name or alias.
        #[arg(long)]
        agent: String,
        /// How long it works (e.g. 30d, 12h; at most a year), or `never`.
        #[arg(long, default_value = "90d")]
        expires: String,
        /// What it is for (shown in listings).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List tokens (never their secrets).
    List {
        /// Only this agent's.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Stop a token from working, at once.
    Revoke {
        /// The token's id (`pt_…`, the part before the dot).
        id: String,
    },
}

/// A validated tokens command.
pub(crate) enum TokensPlan {
    Create {
        agent: AgentRef,
        life: Option<SignedDuration>,
        label: String,
    },
    List(Option<AgentRef>),
    Revoke(TokenId),
}

impl TokensPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Create { .. })
    }
}

pub(crate) fn plan(cmd: TokensCmd) -> Result<TokensPlan, Failure> {
    Ok(match cmd {
        TokensCmd::Create {
            agent,
            expires,
            label,
        } => {
            let life = match expires.trim() {
                "never" => None,
                e => Some(parse_duration("--expires", e).map_err(input)?),
            };
            // Check the expiry and label now, before anything is read or written.
            let placeholder = pulse_shared::domain::AgentId::generate();
            ApiToken::issue(&placeholder, &label, life, jiff::Timestamp::now()).map_err(input)?;
            TokensPlan::Create {
                agent: agent_ref(&agent)?,
                life,
                label,
            }
        }
        TokensCmd::List { agent } => TokensPlan::List(agent.as_deref().map(agent_ref).transpose()?),
        TokensCmd::Revoke { id } => {
            // A whole token pasted in is accepted: its id is the part before the dot.
            let id = id.split('.').next().unwrap_or_default();
            TokensPlan::Revoke(TokenId::parse(id).map_err(input)?)
        }
    })
}

pub(crate) async fn execute(plan: TokensPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    let now = cx.clock.now();
    match plan {
        TokensPlan::Create { agent, life, label } => {
            let a = agent.find(b).await?;
            let (token, secret) = ApiToken::issue(&a.id, &label, life, now).map_err(input)?;
            b.store.put_token(&token).await?;
            let expiry = token.expires_at.map_or("does not expire".to_owned(), |t| {
                format!("works until {}", when(Some(t)))
            });
            if out.json {
                out.json_value(&serde_json::json!({
                    "id": token.id,
                    "token": secret,
                    "agent_id": token.agent_id,
                    "label": token.label,
                    "expires_at": token.expires_at,
                }));
            } else {
                crate::output::outln!("{secret}");
                eprintln!(
                    "a token for {} ({}); it {expiry}. It is shown this once: keep it like a password.\n\
                     send a message:  curl -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' \\\n\
                     \x20                 -d '{{\"text\": \"hello\"}}' $PULSE_URL/v1/agents/{}/messages\n\
                     revoke it with `pulse tokens revoke {}`",
                    a.name, a.id, a.id, token.id
                );
            }
        }
        TokensPlan::List(agent) => {
            let agent = match agent {
                Some(r) => Some(r.find(b).await?.id),
                None => None,
            };
            let tokens = b.store.list_tokens(agent.as_ref()).await?;
            let rows: Vec<serde_json::Value> = tokens
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "id": t.id,
                        "agent_id": t.agent_id,
                        "label": t.label,
                        "state": t.state(now),
                        "created_at": t.created_at,
                        "expires_at": t.expires_at,
                        "revoked_at": t.revoked_at,
                    })
                })
                .collect();
            out.table(
                &rows,
                &["ID", "AGENT", "STATE", "CREATED", "EXPIRES", "LABEL"],
                |r| {
                    let t = |k: &str| {
                        r[k].as_str()
                            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
                    };
                    vec![
                        r["id"].as_str().unwrap_or_default().to_owned(),
                        r["agent_id"].as_str().unwrap_or_default().to_owned(),
                        r["state"].as_str().unwrap_or_default().to_owned(),
                        when(t("created_at")),
                        t("expires_at").map_or("never".into(), |e| when(Some(e))),
                        r["label"].as_str().unwrap_or_default().to_owned(),
                    ]
                },
            );
        }
        TokensPlan::Revoke(id) => {
            b.store.revoke_token(&id, now).await.map_err(|e| match e {
                pulse_shared::error::StoreError::NotFound(_) => {
                    Failure::Input(format!("no token {id}; `pulse tokens list` shows them"))
                }
                e => e.into(),
            })?;
            out.done(&format!(
                "token {id} revoked: requests showing it are refused (401) from now on"
            ));
        }
    }
    Ok(())
}
