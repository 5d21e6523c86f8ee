//! `pulse webhooks …`: inbound webhooks — create (URL and secret, shown once), rotate,
//! change, list, their request log, enable, disable, delete.

use clap::{Args, Subcommand};
use pulse_shared::app::Connected;
use pulse_shared::domain::{
    AgentId, EventType, RateLimit, Webhook, WebhookId, WebhookScheme, format_duration,
    parse_duration,
};
use pulse_signatures::inbound::generate_secret;

use super::{AgentRef, Ctx, agent_ref, input, limit, store, yes_no};
use crate::Failure;
use crate::output::{outln, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum WebhooksCmd {
    /// Create a webhook for an agent; prints its URL and, once, its signing secret.
    Create(Box<CreateWebhook>),
    /// Add a new signing secret; the old one stays valid for the grace period.
    Rotate {
        /// The webhook's id.
        id: String,
        /// How long the old secret keeps working.
        #[arg(long, default_value = "24h", value_name = "DURATION")]
        grace: String,
        /// The new secret (e.g. one Stripe or GitHub generated); generated when left out.
        #[arg(long, env = "PULSE_WEBHOOK_SECRET", hide_env_values = true)]
        secret: Option<String>,
    },
    /// List webhooks (never their secrets).
    List {
        /// Only this agent's.
        #[arg(long)]
        agent: Option<String>,
    },
    /// A webhook's latest requests, newest first: accepted or why not.
    Requests {
        /// The webhook's id.
        #[arg(long)]
        webhook: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Accept requests again.
    Enable {
        /// The webhook's id.
        id: String,
    },
    /// Refuse every request (answered 404, logged).
    Disable {
        /// The webhook's id.
        id: String,
    },
    /// Change which event types a webhook takes, its rate limit, whether it wakes the
    /// conversation, or its note.
    Update {
        /// The webhook's id.
        id: String,
        /// Event types it may create, comma-separated; `any` for every type.
        #[arg(long, value_delimiter = ',', value_name = "TYPE,...")]
        allow: Option<Vec<String>>,
        /// Accepted requests per hour (100/h, 2400/d, or none).
        #[arg(long, value_name = "RATE")]
        rate_limit: Option<String>,
        /// Wake the agent's conversation on each accepted event: yes or no.
        #[arg(long, value_name = "yes|no")]
        wake: Option<String>,
        /// A note: what sends to it ("" removes it).
        #[arg(long)]
        description: Option<String>,
    },
    /// Delete a webhook with its request log: its URL answers 404 from then on.
    Delete {
        /// The webhook's id.
        id: String,
    },
}

/// What `webhooks update` changes.
pub(crate) struct WebhookChanges {
    allow: Option<Vec<EventType>>,
    rate_limit: Option<Option<RateLimit>>,
    wake: Option<bool>,
    description: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct CreateWebhook {
    /// The agent whose log its events go to.
    #[arg(long)]
    agent: String,
    /// How requests are signed: pulse, standard (Standard Webhooks), github or stripe.
    #[arg(long, default_value = "pulse")]
    scheme: String,
    /// Event types it may create, comma-separated (any when left out).
    #[arg(long, value_delimiter = ',', value_name = "TYPE,...")]
    allow: Vec<String>,
    /// Accepted requests per hour (100/h, 2400/d, or none).
    #[arg(long, default_value = "100/h", value_name = "RATE")]
    rate_limit: String,
    /// Also wake the agent's conversation on each accepted event, instead of waiting for
    /// the next heartbeat.
    #[arg(long)]
    wake: bool,
    /// The signing secret (e.g. one Stripe or GitHub generated); generated when left out.
    #[arg(long, env = "PULSE_WEBHOOK_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// A note: what sends to it.
    #[arg(long)]
    description: Option<String>,
    /// Where the receiver is reachable, for the printed URL (default: the stack's
    /// receiver with PULSE_STACK, else http://127.0.0.1:8080).
    #[arg(long, env = "PULSE_PUBLIC_URL")]
    base_url: Option<String>,
}

/// A validated webhooks command.
pub(crate) enum WebhooksPlan {
    Create {
        agent: AgentRef,
        webhook: Box<Webhook>,
        secret: String,
        base_url: Option<String>,
    },
    Rotate {
        id: WebhookId,
        grace: jiff::SignedDuration,
        secret: String,
    },
    List {
        agent: Option<AgentRef>,
    },
    Requests {
        webhook: WebhookId,
        limit: usize,
    },
    Set {
        id: WebhookId,
        active: bool,
    },
    Update(WebhookId, Box<WebhookChanges>),
    Delete(WebhookId),
}

impl WebhooksPlan {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Create { .. })
    }
}

pub(crate) fn plan(cmd: WebhooksCmd, now: jiff::Timestamp) -> Result<WebhooksPlan, Failure> {
    Ok(match cmd {
        WebhooksCmd::Create(a) => {
            let agent = agent_ref(&a.agent)?;
            let scheme = WebhookScheme::parse(&a.scheme).map_err(input)?;
            let secret = a.secret.unwrap_or_else(generate_secret);
            check_secret(scheme, &secret)?;
            // The agent is set once it is found.
            let mut webhook =
                Webhook::new(AgentId::generate(), scheme, &secret, now).map_err(input)?;
            webhook.allowed_types = allowed_types(&a.allow)?;
            webhook.rate_limit = RateLimit::parse(&a.rate_limit).map_err(input)?;
            webhook.wake = a.wake;
            webhook.description = a.description.filter(|d| !d.trim().is_empty());
            let base_url = a.base_url.map(|u| u.trim_end_matches('/').to_owned());
            if let Some(u) = &base_url
                && !(u.starts_with("http://") || u.starts_with("https://"))
            {
                return Err(Failure::Input(format!(
                    "invalid --base-url {u:?}: give the receiver's http:// or https:// address"
                )));
            }
            WebhooksPlan::Create {
                agent,
                webhook: Box::new(webhook),
                secret,
                base_url,
            }
        }
        WebhooksCmd::Rotate { id, grace, secret } => {
            let grace = parse_duration("grace", &grace).map_err(input)?;
            if grace.is_negative() {
                return Err(Failure::Input("invalid grace: it is negative".into()));
            }
            WebhooksPlan::Rotate {
                id: WebhookId::parse(&id).map_err(input)?,
                grace,
                secret: secret.unwrap_or_else(generate_secret),
            }
        }
        WebhooksCmd::List { agent } => WebhooksPlan::List {
            agent: agent.as_deref().map(agent_ref).transpose()?,
        },
        WebhooksCmd::Requests { webhook, limit: n } => WebhooksPlan::Requests {
            webhook: WebhookId::parse(&webhook).map_err(input)?,
            limit: limit(n)?,
        },
        WebhooksCmd::Enable { id } => WebhooksPlan::Set {
            id: WebhookId::parse(&id).map_err(input)?,
            active: true,
        },
        WebhooksCmd::Disable { id } => WebhooksPlan::Set {
            id: WebhookId::parse(&id).map_err(input)?,
            active: false,
        },
        WebhooksCmd::Update {
            id,
            allow,
            rate_limit,
            wake,
            description,
        } => {
            let changes = WebhookChanges {
                allow: allow.map(|types| allowed_types(&types)).transpose()?,
                rate_limit: rate_limit
                    .as_deref()
                    .map(RateLimit::parse)
                    .transpose()
                    .map_err(input)?,
                wake: wake.as_deref().map(yes_or_no).transpose()?,
                description,
            };
            if changes.allow.is_none()
                && changes.rate_limit.is_none()
                && changes.wake.is_none()
                && changes.description.is_none()
            {
                return Err(Failure::Input(
                    "nothing to change: give --allow, --rate-limit, --wake or --description".into(),
                ));
            }
            WebhooksPlan::Update(WebhookId::parse(&id).map_err(input)?, Box::new(changes))
        }
        WebhooksCmd::Delete { id } => WebhooksPlan::Delete(WebhookId::parse(&id).map_err(input)?),
    })
}

/// `--allow` types; none (any type) for `any` or nothing.
fn allowed_types(types: &[String]) -> Result<Vec<EventType>, Failure> {
    Webhook::parse_allowed(types.iter().map(String::as_str)).map_err(input)
}

/// `yes` or `no` (also `on`/`off`, `true`/`false`).
fn yes_or_no(s: &str) -> Result<bool, Failure> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "on" | "true" => Ok(true),
        "no" | "off" | "false" => Ok(false),
        _ => Err(Failure::Input(format!("{s:?}: answer yes or no"))),
    }
}

/// Refuses a secret the scheme cannot sign with (a Standard Webhooks secret must be
/// `whsec_` + base64).
fn check_secret(scheme: WebhookScheme, secret: &str) -> Result<(), Failure> {
    let s = scheme.signing();
    pulse_signatures::inbound::sign(s, secret, b"{}", 0, "check")
        .map(|_| ())
        .map_err(|e| Failure::Input(format!("invalid secret for the {scheme} scheme: {e}")))
}

async fn require_webhook(b: &Connected, id: &WebhookId) -> Result<Webhook, Failure> {
    b.store.get_webhook(id).await?.ok_or_else(|| {
        Failure::Input(format!(
            "webhook {id} not found; `pulse webhooks list` shows the webhooks"
        ))
    })
}

pub(crate) async fn execute(plan: WebhooksPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let b = cx.b;
    match plan {
        WebhooksPlan::Create {
            agent,
            mut webhook,
            secret,
            base_url,
        } => {
            webhook.agent_id = agent.find(b).await?.id;
            // A stack's receiver URL ends in '/'.
            let base_url = base_url
                .or_else(|| {
                    cx.public_url
                        .as_ref()
                        .map(|u| u.trim_end_matches('/').to_owned())
                })
                .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
            create(cx, &webhook, &secret, &base_url).await?
        }
        WebhooksPlan::Rotate { id, grace, secret } => rotate(cx, &id, grace, &secret).await?,
        WebhooksPlan::List { agent } => list(cx, agent).await?,
        WebhooksPlan::Requests { webhook, limit } => requests(cx, &webhook, limit).await?,
        WebhooksPlan::Set { id, active } => {
            let mut webhook = require_webhook(b, &id).await?;
            webhook.active = active;
            b.store.update_webhook(&webhook).await.map_err(store)?;
            eprintln!(
                "webhook {id} {}",
                if active {
                    "accepts requests again"
                } else {
                    "is disabled: requests are refused (404) and logged"
                }
            );
        }
        WebhooksPlan::Update(id, c) => {
            let mut webhook = require_webhook(b, &id).await?;
            if let Some(allow) = c.allow {
                webhook.allowed_types = allow;
            }
            if let Some(rate) = c.rate_limit {
                webhook.rate_limit = rate;
            }
            if let Some(wake) = c.wake {
                webhook.wake = wake;
            }
            if let Some(d) = c.description {
                webhook.description = Some(d).filter(|d| !d.trim().is_empty());
            }
            b.store.update_webhook(&webhook).await.map_err(store)?;
            let summary = webhook.summary(cx.clock.now());
            cx.out
                .created(&summary, id.as_str(), &format!("updated webhook {id}"));
        }
        WebhooksPlan::Delete(id) => {
            b.store.delete_webhook(&id).await.map_err(store)?;
            cx.out.done(&format!(
                "deleted webhook {id} and its request log; its URL answers 404 from now on"
            ));
        }
    }
    Ok(())
}

/// Stores a new webhook; prints its URL and, once, its secret.
async fn create(
    cx: &Ctx<'_>,
    webhook: &Webhook,
    secret: &str,
    base_url: &str,
) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    b.store.create_webhook(webhook).await.map_err(store)?;
    let url = format!("{base_url}/webhooks/{}", webhook.id);
    if out.json {
        out.json_value(&serde_json::json!({
            "webhook": webhook.summary(cx.clock.now()),
            "url": url,
            "secret": secret,
        }));
    } else {
        outln!("{url}");
        outln!("{secret}");
        eprintln!(
            "created webhook {} ({} scheme) for agent {}.\nThe first line is its URL, the second its signing secret: store the secret now, it is not shown again.",
            webhook.id, webhook.scheme, webhook.agent_id
        );
    }
    Ok(())
}

/// Adds `secret` to a webhook, keeping the old one for `grace`; prints the new secret.
async fn rotate(
    cx: &Ctx<'_>,
    id: &WebhookId,
    grace: jiff::SignedDuration,
    secret: &str,
) -> Result<(), Failure> {
    let (b, out) = (cx.b, cx.out);
    let mut webhook = require_webhook(b, id).await?;
    check_secret(webhook.scheme, secret)?;
    let now = cx.clock.now();
    let was_unreadable = webhook.unreadable.is_some();
    webhook.rotate(secret, grace, now).map_err(input)?;
    b.store.update_webhook(&webhook).await.map_err(store)?;
    if out.json {
        out.json_value(&serde_json::json!({
            "webhook": webhook.summary(now),
            "secret": secret,
        }));
    } else {
        outln!("{secret}");
        if was_unreadable {
            eprintln!(
                "gave {id} a new secret (shown once, above) in place of the ones no key could read: requests signed with it are accepted now; give it to the sender"
            );
        } else {
            eprintln!(
                "added a new secret to {id} (shown once, above); the previous one is accepted for another {}",
                format_duration(grace)
            );
        }
    }
    Ok(())
}

/// Lists one agent's webhooks, or every agent's.
async fn list(cx: &Ctx<'_>, agent: Option<AgentRef>) -> Result<(), Failure> {
    let agent = match agent {
        Some(a) => Some(a.id(cx.b).await?),
        None => None,
    };
    let now = cx.clock.now();
    let rows: Vec<_> =
        cx.b.store
            .list_webhooks()
            .await?
            .into_iter()
            .filter(|w| agent.as_ref().is_none_or(|a| &w.agent_id == a))
            .map(|w| w.summary(now))
            .collect();
    cx.out.table(
        &rows,
        &[
            "ID", "AGENT", "SCHEME", "ALLOW", "RATE", "WAKE", "ACTIVE", "SECRETS", "PATH",
        ],
        |w| {
            vec![
                w.id.to_string(),
                w.agent_id.to_string(),
                w.scheme.to_string(),
                if w.allowed_types.is_empty() {
                    "any".to_owned()
                } else {
                    w.allowed_types
                        .iter()
                        .map(EventType::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                },
                w.rate_limit.clone().unwrap_or_else(|| "none".to_owned()),
                yes_no(w.wake),
                yes_no(w.active),
                match (&w.unreadable, w.old_secret_retires_at) {
                    (Some(u), _) => format!("unreadable (key {})", u.key_id),
                    (None, Some(t)) => format!("{} (old until {})", w.secrets, when(Some(t))),
                    (None, None) => w.secrets.to_string(),
                },
                w.path.clone(),
            ]
        },
    );
    Ok(())
}

/// Prints a webhook's request log, newest first.
async fn requests(cx: &Ctx<'_>, webhook: &WebhookId, limit: usize) -> Result<(), Failure> {
    require_webhook(cx.b, webhook).await?;
    let rows = cx.b.store.list_requests(webhook, limit).await?;
    cx.out.table(
        &rows,
        &[
            "RECEIVED", "STATUS", "HTTP", "TYPE", "EVENT", "DELIVERY", "FROM", "REASON",
        ],
        |r| {
            vec![
                when(Some(r.received_at)),
                match r.count {
                    Some(n) => format!("{} ×{n}", r.status.as_str()),
                    None => r.status.as_str().to_owned(),
                },
                match r.http_status {
                    0 => "-".to_owned(),
                    s => s.to_string(),
                },
                r.event_type.clone().unwrap_or_default(),
                r.event_id
                    .as_ref()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
                r.delivery_id.clone().unwrap_or_default(),
                r.source_ip.clone().unwrap_or_default(),
                short(r.reason.as_deref().unwrap_or_default(), 120),
            ]
        },
    );
    Ok(())
}
