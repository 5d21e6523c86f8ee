//! `pulse hooks …`: outbound hooks — add, list, test, deliveries, enable, disable,
//! replay. Parsed into a [`HooksPlan`] first, so bad input writes nothing.

use crate::output::outln;
use std::sync::Arc;

use clap::{Args, Subcommand};
use pulse_shared::app::Connected;
use pulse_shared::config::Config;
use pulse_shared::domain::{
    AgentId, Hook, HookDeliveryId, HookId, HookTarget, HookType, RetrySchedule, Secret,
    builtin_tools, parse_duration,
};
use pulse_shared::engine::{DispatchSettings, Dispatcher, Switched, set_hook_active};
use pulse_shared::ports::Clock;
use pulse_signatures::inbound::generate_secret;

mod change;
mod deliveries;

use super::{AgentRef, Ctx, agent_ref, input, yes_no};
use crate::Failure;
use crate::output::{Out, short, when};

#[derive(Subcommand, Debug)]
pub(crate) enum HooksCmd {
    /// Add a hook to an agent; prints its id and, once, its signing secret.
    Add(Box<AddHook>),
    /// List hooks (never their secrets or auth headers).
    List {
        /// Only this agent's (its id, name or alias; every agent's when left out).
        #[arg(long)]
        agent: Option<String>,
    },
    /// The hook types: the fixed ones, and BEFORE_/AFTER_ of every registered tool.
    Types,
    /// Send a signed test delivery now and print the attempt.
    Test {
        /// The hook's id.
        id: String,
    },
    /// A hook's latest deliveries, newest first, with their attempts.
    Deliveries {
        /// The hook's id.
        #[arg(long)]
        hook: String,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Turn a hook back on (after 410 Gone or a failure streak disabled it).
    Enable {
        /// The hook's id.
        id: String,
    },
    /// Stop a hook firing; queued deliveries are cancelled when they come up.
    Disable {
        /// The hook's id.
        id: String,
    },
    /// Send a failed, exhausted or cancelled delivery again, now (same webhook-id).
    Replay {
        /// The delivery's id (msg_…).
        #[arg(long)]
        delivery: String,
    },
    /// Send again every delivery made since a time that ended without success
    /// (exhausted, or cancelled while its hook was off), oldest first, one attempt each:
    /// after a receiver's outage is fixed.
    Recover {
        /// Since when: a duration back from now (2h, 1d) or a time.
        #[arg(long, value_name = "2h|TIMESTAMP")]
        since: String,
        /// Only this hook's deliveries.
        #[arg(long, conflicts_with = "agent")]
        hook: Option<String>,
        /// Only this agent's hooks (its id, name or alias); every hook when neither is given.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Empty the hooks dead-letter queue (deliveries whose retries ran out), oldest
    /// first: each is sent again now, one attempt, and leaves the queue when it succeeds
    /// or has nothing left to send (it succeeded since, or it or its hook is gone). A
    /// failure or a disabled hook leaves it there. Fix the receiver first: `pulse hooks
    /// deliveries --hook ID` shows each attempt.
    Redrive {
        /// Take at most this many.
        #[arg(long, default_value_t = 1_000)]
        limit: usize,
    },
    /// Change where a hook delivers, its retry schedule, timeout, disable-after or auth
    /// header. Deliveries already queued go to the new settings.
    Update(Box<UpdateHook>),
    /// Give a hook a new signing secret, printed once: when its old one leaked, or its
    /// encryption key was lost (`pulse status` says so). Give the receiver the new one.
    Rotate {
        /// The hook's id.
        id: String,
        /// A new Authorization header (needed when the stored one cannot be read either).
        #[arg(long, conflicts_with = "no_auth_header")]
        auth_header: Option<String>,
        /// Remove the Authorization header.
        #[arg(long)]
        no_auth_header: bool,
    },
    /// Delete a hook with its deliveries; queued deliveries are dropped when they come up.
    Delete {
        /// The hook's id.
        id: String,
    },
}

#[derive(Args, Debug)]
pub(crate) struct UpdateHook {
    /// The hook's id.
    id: String,
    /// Where it delivers: an https:// URL, or eventbridge://BUS_NAME.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Sent as the Authorization header; "" removes it.
    #[arg(long)]
    auth_header: Option<String>,
    /// How long one attempt may take.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Delays between attempts, comma-separated, or none.
    #[arg(long, value_name = "DELAYS")]
    retry_schedule: Option<String>,
    /// Failing without a success for this long disables the hook.
    #[arg(long, value_name = "DURATION")]
    disable_after: Option<String>,
}

/// What `hooks update` changes.
pub(crate) struct HookChanges {
    target: Option<HookTarget>,
    auth_header: Option<Option<Secret>>,
    timeout: Option<jiff::SignedDuration>,
    retry: Option<RetrySchedule>,
    disable_after: Option<jiff::SignedDuration>,
}

#[derive(Args, Debug)]
pub(crate) struct AddHook {
    /// The agent it follows: its id, name or alias.
    #[arg(long)]
    agent: String,
    /// What it fires on: BEFORE_HEARTBEAT, AFTER_HEARTBEAT, AFTER_<TOOL>, … (`pulse hooks
    /// types`); several, comma-separated, add one hook per type, all signed with one
    /// secret.
    #[arg(
        long = "type",
        value_name = "TYPE,...",
        value_delimiter = ',',
        required = true
    )]
    hook_type: Vec<String>,
    /// Where it delivers: an https:// URL, or eventbridge://BUS_NAME.
    #[arg(long, value_name = "URL")]
    url: String,
    /// Sent as the Authorization header (e.g. "Bearer …").
    #[arg(long, env = "PULSE_HOOK_AUTH_HEADER", hide_env_values = true)]
    auth_header: Option<String>,
    /// How long one attempt may take.
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    timeout: String,
    /// Delays between attempts, comma-separated, or none.
    #[arg(long, default_value = "5s,5m,30m,2h,5h,10h,10h", value_name = "DELAYS")]
    retry_schedule: String,
    /// Failing without a success for this long disables the hook.
    #[arg(long, default_value = "5d", value_name = "DURATION")]
    disable_after: String,
    /// A note for people.
    #[arg(long)]
    description: Option<String>,
}

/// A validated hooks command.
pub(crate) enum HooksPlan {
    /// Hooks for one agent, found when the command runs.
    Add(AgentRef, Vec<Hook>),
    List(Option<AgentRef>),
    Types,
    Test(HookId),
    Deliveries {
        hook: HookId,
        limit: usize,
    },
    Set {
        id: HookId,
        active: bool,
    },
    Replay(HookDeliveryId),
    Recover {
        since: super::events::Since,
        hook: Option<HookId>,
        agent: Option<AgentRef>,
    },
    Redrive(usize),
    Update(HookId, Box<HookChanges>),
    Rotate {
        id: HookId,
        auth: Option<Option<Secret>>,
    },
    Delete(HookId),
}

impl HooksPlan {
    /// Whether it may create the database.
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Self::Add(..))
    }
}

pub(crate) fn plan(cmd: HooksCmd, now: jiff::Timestamp) -> Result<HooksPlan, Failure> {
    Ok(match cmd {
        HooksCmd::Add(a) => plan_add(*a, now)?,
        HooksCmd::List { agent } => HooksPlan::List(agent.as_deref().map(agent_ref).transpose()?),
        HooksCmd::Types => HooksPlan::Types,
        HooksCmd::Test { id } => HooksPlan::Test(HookId::parse(&id).map_err(input)?),
        HooksCmd::Deliveries { hook, limit } => {
            if !(1..=1000).contains(&limit) {
                return Err(Failure::Input(format!(
                    "invalid limit {limit}: use 1 to 1000"
                )));
            }
            HooksPlan::Deliveries {
                hook: HookId::parse(&hook).map_err(input)?,
                limit,
            }
        }
        HooksCmd::Enable { id } => HooksPlan::Set {
            id: HookId::parse(&id).map_err(input)?,
            active: true,
        },
        HooksCmd::Disable { id } => HooksPlan::Set {
            id: HookId::parse(&id).map_err(input)?,
            active: false,
        },
        HooksCmd::Replay { delivery } => {
            HooksPlan::Replay(HookDeliveryId::parse(&delivery).map_err(input)?)
        }
        HooksCmd::Redrive { limit: 0 } => {
            return Err(Failure::Input("--limit must be at least 1".into()));
        }
        HooksCmd::Redrive { limit } => HooksPlan::Redrive(limit),
        HooksCmd::Recover { since, hook, agent } => HooksPlan::Recover {
            since: super::events::Since::parse(&since)?,
            hook: hook
                .as_deref()
                .map(HookId::parse)
                .transpose()
                .map_err(input)?,
            agent: agent.as_deref().map(agent_ref).transpose()?,
        },
        HooksCmd::Update(a) => {
            let changes = HookChanges {
                target: a
                    .url
                    .as_deref()
                    .map(HookTarget::parse)
                    .transpose()
                    .map_err(input)?,
                auth_header: a
                    .auth_header
                    .map(|v| match v.trim() {
                        "" => Ok(None),
                        _ => auth_header_arg(&v).map(Some),
                    })
                    .transpose()?,
                timeout: a.timeout.as_deref().map(timeout_arg).transpose()?,
                retry: a
                    .retry_schedule
                    .as_deref()
                    .map(RetrySchedule::parse)
                    .transpose()
                    .map_err(input)?,
                disable_after: a
                    .disable_after
                    .as_deref()
                    .map(disable_after_arg)
                    .transpose()?,
            };
            if changes.target.is_none()
                && changes.auth_header.is_none()
                && changes.timeout.is_none()
                && changes.retry.is_none()
                && changes.disable_after.is_none()
            {
                return Err(Failure::Input(
                    "nothing to change: give --url, --auth-header, --timeout, --retry-schedule or --disable-after".into(),
                ));
            }
            HooksPlan::Update(HookId::parse(&a.id).map_err(input)?, Box::new(changes))
        }
        HooksCmd::Rotate {
            id,
            auth_header,
            no_auth_header,
        } => HooksPlan::Rotate {
            id: HookId::parse(&id).map_err(input)?,
            auth: match (auth_header, no_auth_header) {
                (Some(v), _) => Some(Some(auth_header_arg(&v)?)),
                (None, true) => Some(None),
                (None, false) => None,
            },
        },
        HooksCmd::Delete { id } => HooksPlan::Delete(HookId::parse(&id).map_err(input)?),
    })
}

/// `hooks add`: one hook per type given, of one agent, target and secret.
fn plan_add(a: AddHook, now: jiff::Timestamp) -> Result<HooksPlan, Failure> {
    let agent = agent_ref(&a.agent)?;
    let target = HookTarget::parse(&a.url).map_err(input)?;
    let timeout = timeout_arg(&a.timeout)?;
    let retry = RetrySchedule::parse(&a.retry_schedule).map_err(input)?;
    let disable_after = disable_after_arg(&a.disable_after)?;
    let auth_header = a.auth_header.as_deref().map(auth_header_arg).transpose()?;
    // One secret for all the types: the receiver checks one signature.
    let secret = generate_secret();
    let mut types: Vec<HookType> = Vec::new();
    for t in a
        .hook_type
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    {
        let t = HookType::parse(t).map_err(input)?;
        if !types.contains(&t) {
            types.push(t);
        }
    }
    if types.is_empty() {
        return Err(Failure::Input(
            "give --type: what the hook fires on (`pulse hooks types` lists them)".into(),
        ));
    }
    let hooks = types
        .into_iter()
        .map(|hook_type| {
            // The agent is set once it is found.
            let mut hook = Hook::new(AgentId::generate(), hook_type, target.clone(), &secret, now);
            hook.timeout = timeout;
            hook.retry = retry.clone();
            hook.disable_after = disable_after;
            hook.auth_header = auth_header.clone();
            hook.description = a.description.clone();
            hook
        })
        .collect();
    Ok(HooksPlan::Add(agent, hooks))
}

fn timeout_arg(s: &str) -> Result<jiff::SignedDuration, Failure> {
    Hook::check_timeout(parse_duration("timeout", s).map_err(input)?).map_err(input)
}

fn disable_after_arg(s: &str) -> Result<jiff::SignedDuration, Failure> {
    let d = parse_duration("disable-after", s).map_err(input)?;
    if d < jiff::SignedDuration::from_mins(1) {
        return Err(Failure::Input(
            "invalid disable-after: use at least 1m (the default is 5d)".into(),
        ));
    }
    Ok(d)
}

fn auth_header_arg(v: &str) -> Result<Secret, Failure> {
    if v.trim().is_empty() || http::HeaderValue::from_str(v).is_err() {
        return Err(Failure::Input(
            "invalid auth-header: give a value that fits in an HTTP header, e.g. \"Bearer <token>\"".into(),
        ));
    }
    Ok(Secret::new(v))
}

/// A target this backend can deliver to.
pub(super) fn check_target(b: &Connected, target: &HookTarget) -> Result<(), Failure> {
    if let HookTarget::EventBridge { bus } = target
        && b.bus.is_none()
    {
        return Err(Failure::Input(format!(
            "hook target eventbridge://{bus} needs the AWS backend: this store has no event bus, so every delivery would fail until it gave up; use an https:// URL"
        )));
    }
    Ok(())
}

pub(super) async fn require_hook(b: &Connected, id: &HookId) -> Result<Hook, Failure> {
    b.store.get_hook(id).await?.ok_or_else(|| {
        Failure::Input(format!(
            "hook {id} not found; `pulse hooks list` shows the hooks"
        ))
    })
}

fn dispatcher(
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
) -> Result<Dispatcher, Failure> {
    b.dispatcher(
        clock,
        &pulse_shared::app::egress(config),
        DispatchSettings::default(),
    )
    .ok_or_else(|| {
        Failure::Input("hooks are not configured on this backend: set PULSE_HOOKS_QUEUE_URL".into())
    })
}

pub(crate) async fn execute(plan: HooksPlan, cx: &Ctx<'_>) -> Result<(), Failure> {
    let (config, b, clock, out) = (cx.config, cx.b, cx.clock.clone(), cx.out);
    match plan {
        HooksPlan::Add(agent, mut hooks) => {
            let agent = agent.find(b).await?.id;
            for hook in &mut hooks {
                hook.agent_id = agent.clone();
            }
            add(b, out, &hooks).await
        }
        HooksPlan::List(agent) => list(b, out, agent).await,
        HooksPlan::Types => types(b, out).await,
        HooksPlan::Test(id) => {
            let hook = require_hook(b, &id).await?;
            let (d, a) = dispatcher(config, b, clock)?.send_test(&hook).await?;
            deliveries::print_attempt(out, &d, &a);
            deliveries::succeeded(&d, &a)
        }
        HooksPlan::Deliveries { hook, limit } => deliveries::list(b, out, &hook, limit).await,
        HooksPlan::Set { id, active } => set_active(b, out, &id, active).await,
        HooksPlan::Update(id, changes) => change::update(b, out, &id, &changes).await,
        HooksPlan::Rotate { id, auth } => change::rotate(b, out, &id, auth).await,
        HooksPlan::Delete(id) => {
            b.store.delete_hook(&id).await.map_err(super::store)?;
            out.done(&format!(
                "deleted hook {id} with its deliveries; queued deliveries are dropped when they come up"
            ));
            Ok(())
        }
        HooksPlan::Replay(id) => deliveries::replay(&dispatcher(config, b, clock)?, out, &id).await,
        HooksPlan::Recover { since, hook, agent } => {
            let since = since.at(cx.clock.now());
            let dispatcher = dispatcher(config, b, clock)?;
            deliveries::recover(b, &dispatcher, out, hook, agent, since).await
        }
        HooksPlan::Redrive(limit) => {
            deliveries::redrive(&dispatcher(config, b, clock)?, out, limit).await
        }
    }
}

/// Stores new hooks of one agent, one target and one secret (one per type); prints
/// their ids and, once, the secret. Every type is checked before any hook is stored.
async fn add(b: &Connected, out: &Out, hooks: &[Hook]) -> Result<(), Failure> {
    let Some(first) = hooks.first() else {
        return Ok(());
    };
    check_target(b, &first.target)?;
    let valid = valid_types(b).await?;
    for hook in hooks {
        if !valid.iter().any(|t| t == hook.hook_type.as_str()) {
            return Err(Failure::Input(format!(
                "hook type {} fires on nothing: it is neither a lifecycle type nor BEFORE_/AFTER_ of a registered tool; valid types: {} (`pulse hooks types` explains each)",
                hook.hook_type,
                valid.join(", ")
            )));
        }
    }
    for hook in hooks {
        b.store.create_hook(hook).await?;
    }
    if first.target.is_plain_http() {
        eprintln!(
            "note: {} is plain http: use it only for a local receiver allowed by PULSE_HOOKS_ALLOW",
            first.target
        );
    }
    if out.json {
        let summaries: Vec<_> = hooks.iter().map(Hook::summary).collect();
        let mut doc = serde_json::json!({
            "hooks": summaries,
            "secret": first.secret.expose(),
        });
        // One hook: also as `hook`, as before several types could be given.
        if let [one] = hooks {
            doc["hook"] = serde_json::to_value(one.summary()).unwrap_or_default();
        }
        out.json_value(&doc);
    } else {
        for hook in hooks {
            outln!("{}", hook.id);
        }
        outln!("{}", first.secret.expose());
        let added: Vec<String> = hooks
            .iter()
            .map(|h| format!("{} ({})", h.id, h.hook_type))
            .collect();
        let one = hooks.len() == 1;
        eprintln!(
            "added {} → {} to agent {}: {}.\nThe first {}, the last its signing secret (Standard Webhooks): store the secret now, it is not shown again.",
            if one { "a hook" } else { "hooks" },
            first.target,
            first.agent_id,
            added.join(", "),
            if one {
                "line is its id"
            } else {
                "lines are their ids"
            },
        );
    }
    Ok(())
}

/// Lists one agent's hooks, or every agent's.
async fn list(b: &Connected, out: &Out, agent: Option<AgentRef>) -> Result<(), Failure> {
    let agents = match agent {
        Some(a) => vec![a.id(b).await?],
        None => b
            .store
            .list_agents()
            .await?
            .into_iter()
            .map(|a| a.id)
            .collect(),
    };
    let mut rows = Vec::new();
    for a in &agents {
        rows.extend(b.store.list_hooks(a).await?.iter().map(Hook::summary));
    }
    out.table(
        &rows,
        &[
            "ID",
            "AGENT",
            "TYPE",
            "TARGET",
            "ACTIVE",
            "TIMEOUT",
            "RETRY",
            "FAILING_SINCE",
            "DISABLED_BECAUSE",
            "SECRET",
        ],
        |h| {
            vec![
                h.id.to_string(),
                h.agent_id.to_string(),
                h.hook_type.to_string(),
                short(&h.target, 48),
                yes_no(h.active),
                h.timeout.clone(),
                h.retry.clone(),
                when(h.failing_since),
                h.disabled_reason.clone().unwrap_or_else(|| "-".into()),
                match &h.unreadable {
                    Some(u) => format!("unreadable (key {})", u.key_id),
                    None => "ok".to_owned(),
                },
            ]
        },
    );
    Ok(())
}

/// Every hook type with when it fires: the lifecycle types, and BEFORE_/AFTER_ of each
/// registered tool (built-in ones included).
async fn catalogue(b: &Connected) -> Result<Vec<(HookType, String)>, Failure> {
    let registry = b
        .store
        .load_registry()
        .await?
        .with_builtins(builtin_tools());
    Ok(HookType::catalogue(registry.tools.iter().map(|t| &t.name)))
}

async fn valid_types(b: &Connected) -> Result<Vec<String>, Failure> {
    Ok(catalogue(b)
        .await?
        .into_iter()
        .map(|(t, _)| t.as_str().to_owned())
        .collect())
}

async fn types(b: &Connected, out: &Out) -> Result<(), Failure> {
    let rows: Vec<serde_json::Value> = catalogue(b)
        .await?
        .into_iter()
        .map(|(t, when)| serde_json::json!({ "type": t, "fires_when": when }))
        .collect();
    out.table(&rows, &["TYPE", "FIRES WHEN"], |r| {
        vec![
            r["type"].as_str().unwrap_or_default().to_owned(),
            r["fires_when"].as_str().unwrap_or_default().to_owned(),
        ]
    });
    Ok(())
}

/// Enables or disables a hook, retrying when a delivery changes it meanwhile.
async fn set_active(b: &Connected, out: &Out, id: &HookId, active: bool) -> Result<(), Failure> {
    let state = if active { "enabled" } else { "disabled" };
    match set_hook_active(b.store.as_ref(), id, active)
        .await
        .map_err(super::store)?
    {
        Switched::Already => out.done(&format!("hook {id} is already {state}")),
        Switched::Done if active => out.done(&format!("hook {id} enabled")),
        Switched::Done => out.done(&format!(
            "hook {id} disabled; queued deliveries are cancelled when they come up"
        )),
    }
    Ok(())
}
