//! The admin verbs. Each command is first turned into a [`Plan`] — every input parsed and
//! validated — and only then is the backend opened, so bad input writes nothing (not even
//! a new database file).

use crate::output::outln;
use std::sync::Arc;
use std::time::Duration;

use pulse_shared::app::{Connected, connect};
use pulse_shared::config::{Backend, Config, Env};
use pulse_shared::domain::{
    ActiveHours, AgentId, AgentLlm, Budgets, EventType, Filter, HEARTBEAT_AGENT, Interval,
    NewAgent, NewEvent, ProviderKind, RateLimit, Role, Signal, SignalMeta, Subscription,
    SubscriptionId, TimeZoneName, Tool, ToolKind, ToolName, Webhook, WebhookId, WebhookScheme,
    builtin_tools, parse_duration,
};
use pulse_shared::engine::intake;
use pulse_shared::error::{StoreError, ValidationError};
use pulse_shared::ports::{Clock, SystemClock};
use pulse_shared::telemetry::{self, LogFormat};
use pulse_signatures::inbound::generate_secret;
use serde_json::Value;

use crate::output::{Out, short, when};
use crate::{
    ActionsCmd, AgentsCmd, BenchCmd, Cli, Command, ConversationCmd, DiscordCmd, EventsCmd, Failure,
    HeartbeatsCmd, MemoriesCmd, SubscriptionsCmd, ToolsCmd, WebhooksCmd, bench, serve,
};

/// A validated command.
enum Plan {
    Serve {
        tick: Duration,
        listen: Option<std::net::SocketAddr>,
        limits: pulse_shared::http::ServeLimits,
    },
    Sweep,
    CreateAgent(NewAgent),
    ListAgents,
    ShowAgent(AgentId),
    Emit {
        agent: AgentId,
        event: NewEvent,
    },
    ListEvents {
        agent: AgentId,
        limit: usize,
    },
    ListHeartbeats {
        agent: AgentId,
        limit: usize,
    },
    ListActions {
        agent: AgentId,
        limit: usize,
    },
    AddTool(Tool),
    ListTools,
    SetTool {
        name: ToolName,
        active: bool,
    },
    AddSubscription(Subscription),
    ListSubscriptions,
    SetSubscription {
        id: SubscriptionId,
        active: bool,
    },
    Say {
        agent: AgentId,
        user: String,
        text: String,
    },
    ShowConversation {
        agent: AgentId,
        limit: usize,
    },
    ListMemories {
        agent: AgentId,
        limit: usize,
    },
    CreateWebhook {
        webhook: Webhook,
        secret: String,
        base_url: String,
    },
    RotateWebhook {
        id: WebhookId,
        grace: jiff::SignedDuration,
        secret: String,
    },
    ListWebhooks {
        agent: Option<AgentId>,
    },
    ListRequests {
        webhook: WebhookId,
        limit: usize,
    },
    SetWebhook {
        id: WebhookId,
        active: bool,
    },
    RegisterCommands {
        menu_name: String,
    },
    Hooks(crate::hooks::HooksPlan),
    Reseal,
}

impl Plan {
    /// Whether the command may create the database.
    fn writes(&self) -> bool {
        matches!(
            self,
            Plan::Serve { .. }
                | Plan::Sweep
                | Plan::CreateAgent(_)
                | Plan::Emit { .. }
                | Plan::AddTool(_)
                | Plan::SetTool { .. }
                | Plan::AddSubscription(_)
                | Plan::SetSubscription { .. }
                | Plan::Say { .. }
                | Plan::CreateWebhook { .. }
        ) || matches!(self, Plan::Hooks(h) if h.writes())
    }
}

fn input(e: ValidationError) -> Failure {
    Failure::Input(e.to_string())
}

fn json_arg(what: &str, s: &str) -> Result<Value, Failure> {
    serde_json::from_str(s).map_err(|e| {
        Failure::Input(format!(
            "invalid {what}: {e}; give a JSON value, e.g. '{{\"key\": 1}}'"
        ))
    })
}

fn limit(n: usize) -> Result<usize, Failure> {
    if (1..=10_000).contains(&n) {
        Ok(n)
    } else {
        Err(Failure::Input(format!("invalid limit {n}: use 1 to 10000")))
    }
}

fn plan(command: Command, now: jiff::Timestamp) -> Result<Plan, Failure> {
    Ok(match command {
        Command::Serve(a) => {
            let tick = parse_duration("tick", &a.tick).map_err(input)?;
            if tick < jiff::SignedDuration::from_millis(100) {
                return Err(Failure::Input("invalid tick: use at least 100ms".into()));
            }
            let listen = match a.listen.trim() {
                "off" | "none" => None,
                addr => Some(addr.parse().map_err(|_| {
                    Failure::Input(format!(
                        "invalid --listen {addr:?}: give an address and port such as 127.0.0.1:8080, or off"
                    ))
                })?),
            };
            let positive = |name: &'static str, v: &str| -> Result<Duration, Failure> {
                let d = parse_duration(name, v).map_err(input)?;
                if d <= jiff::SignedDuration::ZERO {
                    return Err(Failure::Input(format!(
                        "invalid {name} {v:?}: use more than 0s"
                    )));
                }
                Ok(d.unsigned_abs())
            };
            if a.max_connections == 0 {
                return Err(Failure::Input(
                    "invalid --max-connections 0: use at least 1".into(),
                ));
            }
            let limits = pulse_shared::http::ServeLimits {
                header_timeout: positive("header timeout", &a.header_timeout)?,
                request_timeout: positive("request timeout", &a.request_timeout)?,
                max_connections: a.max_connections,
                shutdown_grace: positive("shutdown grace", &a.shutdown_grace)?,
            };
            Plan::Serve {
                tick: tick.unsigned_abs(),
                listen,
                limits,
            }
        }
        Command::Sweep => Plan::Sweep,
        Command::Agents(AgentsCmd::Create(a)) => {
            let mut new = NewAgent::named(a.name);
            new.interval = a.interval.parse::<Interval>().map_err(input)?;
            new.active_hours = a
                .active_hours
                .as_deref()
                .map(str::parse::<ActiveHours>)
                .transpose()
                .map_err(input)?;
            new.timezone = TimeZoneName::parse(&a.timezone).map_err(input)?;
            new.instructions = a.instructions;
            new.persona = a.persona;
            new.alias = a.alias;
            new.llm = AgentLlm {
                provider: a
                    .llm_provider
                    .as_deref()
                    .map(ProviderKind::parse)
                    .transpose()
                    .map_err(input)?,
                model: a.llm_model.filter(|m| !m.trim().is_empty()),
                base_url: a
                    .llm_base_url
                    .as_deref()
                    .map(|u| {
                        url::Url::parse(u)
                            .map_err(|e| Failure::Input(format!("invalid LLM base URL {u:?}: {e}")))
                    })
                    .transpose()?,
                api_key_env: a.llm_api_key_env.map(|v| v.trim().to_owned()),
            };
            new.budgets = Budgets {
                max_steps: a.max_steps,
                max_tokens: a.max_tokens,
            };
            new.quiet_period = a
                .quiet_period
                .as_deref()
                .map(str::parse::<Interval>)
                .transpose()
                .map_err(input)?;
            new.discord_channel = a.discord_channel;
            // Validate the name now, so a bad one is reported before anything is opened.
            new.clone().create(now).map_err(input)?;
            Plan::CreateAgent(new)
        }
        Command::Agents(AgentsCmd::List) => Plan::ListAgents,
        Command::Agents(AgentsCmd::Show { id }) => {
            Plan::ShowAgent(AgentId::parse(&id).map_err(input)?)
        }
        Command::Events(EventsCmd::Emit {
            agent,
            event_type,
            payload,
            priority,
        }) => Plan::Emit {
            agent: AgentId::parse(&agent).map_err(input)?,
            event: NewEvent::new(&event_type, json_arg("payload", &payload)?, priority)
                .map_err(input)?,
        },
        Command::Events(EventsCmd::List { agent, limit: n }) => Plan::ListEvents {
            agent: AgentId::parse(&agent).map_err(input)?,
            limit: limit(n)?,
        },
        Command::Heartbeats(HeartbeatsCmd::List { agent, limit: n }) => Plan::ListHeartbeats {
            agent: AgentId::parse(&agent).map_err(input)?,
            limit: limit(n)?,
        },
        Command::Actions(ActionsCmd::List { agent, limit: n }) => Plan::ListActions {
            agent: AgentId::parse(&agent).map_err(input)?,
            limit: limit(n)?,
        },
        Command::Tools(ToolsCmd::Add {
            name,
            url,
            timeout,
            config,
            description,
        }) => {
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
            Plan::AddTool(tool)
        }
        Command::Tools(ToolsCmd::List) => Plan::ListTools,
        Command::Tools(ToolsCmd::Enable { name }) => Plan::SetTool {
            name: ToolName::parse(&name).map_err(input)?,
            active: true,
        },
        Command::Tools(ToolsCmd::Disable { name }) => Plan::SetTool {
            name: ToolName::parse(&name).map_err(input)?,
            active: false,
        },
        Command::Subscriptions(SubscriptionsCmd::Add {
            tool,
            event,
            order,
            filter,
            agent,
        }) => {
            let tool = ToolName::parse(&tool).map_err(input)?;
            let event_type = EventType::parse(&event).map_err(input)?;
            let agent = agent
                .as_deref()
                .map(AgentId::parse)
                .transpose()
                .map_err(input)?;
            let filter = filter
                .as_deref()
                .map(Filter::parse)
                .transpose()
                .map_err(input)?
                .unwrap_or_default();
            Plan::AddSubscription(Subscription {
                id: SubscriptionId::for_route(&tool, &event_type, agent.as_ref()),
                tool,
                event_type,
                agent_id: agent,
                filter,
                order,
                active: true,
                created_at: now,
            })
        }
        Command::Subscriptions(SubscriptionsCmd::List) => Plan::ListSubscriptions,
        Command::Subscriptions(SubscriptionsCmd::Enable { id }) => Plan::SetSubscription {
            id: SubscriptionId::parse(&id).map_err(input)?,
            active: true,
        },
        Command::Subscriptions(SubscriptionsCmd::Disable { id }) => Plan::SetSubscription {
            id: SubscriptionId::parse(&id).map_err(input)?,
            active: false,
        },
        Command::Say(a) => {
            let agent = AgentId::parse(&a.agent).map_err(input)?;
            // Validate the text now; the signal itself is made once the agent is read.
            Signal::user_message(
                &agent,
                &pulse_shared::domain::SessionId::for_agent(&agent),
                &a.text,
                SignalMeta::default(),
                now,
            )
            .map_err(input)?;
            Plan::Say {
                agent,
                user: a.user,
                text: a.text,
            }
        }
        Command::Conversation(ConversationCmd::Show { agent, limit: n }) => {
            Plan::ShowConversation {
                agent: AgentId::parse(&agent).map_err(input)?,
                limit: limit(n)?,
            }
        }
        Command::Memories(MemoriesCmd::List { agent, limit: n }) => Plan::ListMemories {
            agent: AgentId::parse(&agent).map_err(input)?,
            limit: limit(n)?,
        },
        Command::Webhooks(WebhooksCmd::Create(a)) => {
            let agent = AgentId::parse(&a.agent).map_err(input)?;
            let scheme = WebhookScheme::parse(&a.scheme).map_err(input)?;
            let secret = a.secret.unwrap_or_else(generate_secret);
            check_secret(scheme, &secret)?;
            let mut webhook = Webhook::new(agent, scheme, &secret, now).map_err(input)?;
            webhook.allowed_types = a
                .allow
                .iter()
                .map(|t| t.trim())
                .filter(|t| !t.is_empty())
                .map(EventType::parse)
                .collect::<Result<_, _>>()
                .map_err(input)?;
            webhook.rate_limit = RateLimit::parse(&a.rate_limit).map_err(input)?;
            webhook.wake = a.wake;
            webhook.description = a.description.filter(|d| !d.trim().is_empty());
            let base_url = a.base_url.trim_end_matches('/').to_owned();
            if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                return Err(Failure::Input(format!(
                    "invalid --base-url {base_url:?}: give the receiver's http:// or https:// address"
                )));
            }
            Plan::CreateWebhook {
                webhook,
                secret,
                base_url,
            }
        }
        Command::Webhooks(WebhooksCmd::Rotate { id, grace, secret }) => {
            let grace = parse_duration("grace", &grace).map_err(input)?;
            if grace.is_negative() {
                return Err(Failure::Input("invalid grace: it is negative".into()));
            }
            Plan::RotateWebhook {
                id: WebhookId::parse(&id).map_err(input)?,
                grace,
                secret: secret.unwrap_or_else(generate_secret),
            }
        }
        Command::Webhooks(WebhooksCmd::List { agent }) => Plan::ListWebhooks {
            agent: agent
                .as_deref()
                .map(AgentId::parse)
                .transpose()
                .map_err(input)?,
        },
        Command::Webhooks(WebhooksCmd::Requests { webhook, limit: n }) => Plan::ListRequests {
            webhook: WebhookId::parse(&webhook).map_err(input)?,
            limit: limit(n)?,
        },
        Command::Webhooks(WebhooksCmd::Enable { id }) => Plan::SetWebhook {
            id: WebhookId::parse(&id).map_err(input)?,
            active: true,
        },
        Command::Webhooks(WebhooksCmd::Disable { id }) => Plan::SetWebhook {
            id: WebhookId::parse(&id).map_err(input)?,
            active: false,
        },
        Command::Hooks(cmd) => Plan::Hooks(crate::hooks::plan(cmd, now)?),
        Command::Secrets(crate::secrets::SecretsCmd::Reseal) => Plan::Reseal,
        Command::Secrets(crate::secrets::SecretsCmd::NewKey) => {
            unreachable!("needs no configuration: answered before planning")
        }
        Command::Discord(DiscordCmd::RegisterCommands { menu_name }) => {
            let menu_name = menu_name.trim().to_owned();
            if menu_name.is_empty() || menu_name.chars().count() > 32 {
                return Err(Failure::Input(
                    "invalid --menu-name: Discord takes 1 to 32 characters".into(),
                ));
            }
            Plan::RegisterCommands { menu_name }
        }
        Command::Bench(_) | Command::Demo => {
            unreachable!("benchmarks and the demo are dispatched before planning")
        }
    })
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

/// A record the user named does not exist, or already exists: the input was wrong.
fn store(e: StoreError) -> Failure {
    match e {
        StoreError::NotFound(what) => Failure::Input(format!("{what} not found")),
        StoreError::AlreadyExists(what) => Failure::Input(format!("{what} already exists")),
        other => Failure::Runtime(other.into()),
    }
}

/// Parses, validates, connects, runs.
pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let out = Out::new(cli.json);
    if let Command::Bench(BenchCmd::Sweep {
        heartbeats,
        aws_endpoint,
    }) = cli.command
    {
        return bench::sweep(heartbeats, aws_endpoint, &out).await;
    }
    if let Command::Bench(BenchCmd::Receive {
        requests,
        concurrency,
    }) = cli.command
    {
        return crate::bench_receive::receive(requests, concurrency, &out).await;
    }
    if let Command::Bench(BenchCmd::Hooks {
        deliveries,
        samples,
    }) = cli.command
    {
        return crate::bench_hooks::hooks(deliveries, samples, &out).await;
    }
    if let Command::Bench(BenchCmd::Coldstart { runs, bin_dir }) = cli.command {
        return crate::bench_coldstart::coldstart(runs, bin_dir, &out).await;
    }
    if let Command::Demo = cli.command {
        return crate::demo::demo().await;
    }
    if let Command::Secrets(crate::secrets::SecretsCmd::NewKey) = cli.command {
        crate::secrets::new_key(&out);
        return Ok(());
    }
    if let Command::Bench(BenchCmd::Turn { history, turns }) = &cli.command {
        return bench::turn(history, *turns, &out).await;
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let plan = plan(cli.command, clock.now())?;
    let config = Env::process()
        .config(cli.db)
        .map_err(|e| Failure::Input(format!("configuration: {e}")))?;
    if let Plan::RegisterCommands { menu_name } = &plan {
        return register_commands(&config, menu_name, &out).await;
    }
    if let Backend::Sqlite { path } = &config.backend
        && !plan.writes()
        && !path.exists()
    {
        return Err(Failure::Input(format!(
            "there is no Pulse database at {}; create an agent first, or point --db (PULSE_DB) at one",
            path.display()
        )));
    }
    if matches!(plan, Plan::Serve { .. } | Plan::Sweep) {
        telemetry::init(LogFormat::Text);
    }
    let backend = connect(&config, clock.clone()).await?;
    execute(plan, &config, &backend, clock, &out).await
}

async fn require_agent(
    b: &Connected,
    id: &AgentId,
) -> Result<pulse_shared::domain::Agent, Failure> {
    b.store.get_agent(id).await?.ok_or_else(|| {
        Failure::Input(format!(
            "agent {id} not found; `pulse agents list` shows the agents"
        ))
    })
}

async fn execute(
    plan: Plan,
    config: &Config,
    b: &Connected,
    clock: Arc<dyn Clock>,
    out: &Out,
) -> Result<(), Failure> {
    match plan {
        Plan::Serve {
            tick,
            listen,
            limits,
        } => serve::serve(config, b, clock, tick, listen, limits).await,
        Plan::Hooks(h) => crate::hooks::execute(h, config, b, clock, out).await,
        Plan::Reseal => crate::secrets::reseal(b, out).await,
        Plan::CreateWebhook {
            webhook,
            secret,
            base_url,
        } => {
            require_agent(b, &webhook.agent_id).await?;
            b.store.create_webhook(&webhook).await.map_err(store)?;
            let url = format!("{base_url}/webhooks/{}", webhook.id);
            if out.json {
                out.json_value(&serde_json::json!({
                    "webhook": webhook.summary(clock.now()),
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
        Plan::RotateWebhook { id, grace, secret } => {
            let mut webhook = require_webhook(b, &id).await?;
            check_secret(webhook.scheme, &secret)?;
            let now = clock.now();
            webhook.rotate(&secret, grace, now).map_err(input)?;
            b.store.update_webhook(&webhook).await.map_err(store)?;
            if out.json {
                out.json_value(&serde_json::json!({
                    "webhook": webhook.summary(now),
                    "secret": secret,
                }));
            } else {
                outln!("{secret}");
                eprintln!(
                    "added a new secret to {id} (shown once, above); the previous one is accepted for another {}",
                    pulse_shared::domain::format_duration(grace)
                );
            }
            Ok(())
        }
        Plan::ListWebhooks { agent } => {
            let now = clock.now();
            let rows: Vec<_> = b
                .store
                .list_webhooks()
                .await?
                .into_iter()
                .filter(|w| agent.as_ref().is_none_or(|a| &w.agent_id == a))
                .map(|w| w.summary(now))
                .collect();
            out.table(
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
                        w.wake.to_string(),
                        w.active.to_string(),
                        match w.old_secret_retires_at {
                            Some(t) => format!("{} (old until {})", w.secrets, when(Some(t))),
                            None => w.secrets.to_string(),
                        },
                        w.path.clone(),
                    ]
                },
            );
            Ok(())
        }
        Plan::ListRequests { webhook, limit } => {
            require_webhook(b, &webhook).await?;
            let rows = b.store.list_requests(&webhook, limit).await?;
            out.table(
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
        Plan::SetWebhook { id, active } => {
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
            Ok(())
        }
        Plan::RegisterCommands { menu_name } => register_commands(config, &menu_name, out).await,
        Plan::Sweep => serve::sweep_and_drain(config, b, clock, out).await,
        Plan::CreateAgent(new) => {
            let (agent, first) = new.create(clock.now()).map_err(input)?;
            b.store.create_agent(&agent, &first).await.map_err(store)?;
            out.created(
                &agent,
                agent.id.as_str(),
                &format!(
                    "created agent {} ({}); its first heartbeat is due now",
                    agent.name, agent.id
                ),
            );
            Ok(())
        }
        Plan::ListAgents => {
            let agents = b.store.list_agents().await?;
            out.table(
                &agents,
                &["ID", "NAME", "INTERVAL", "ACTIVE HOURS", "TZ", "CREATED"],
                |a| {
                    vec![
                        a.id.to_string(),
                        a.name.clone(),
                        a.interval.to_string(),
                        a.active_hours.map_or("always".into(), |h| h.to_string()),
                        a.timezone.to_string(),
                        when(Some(a.created_at)),
                    ]
                },
            );
            Ok(())
        }
        Plan::ShowAgent(id) => {
            let agent = require_agent(b, &id).await?;
            let recent = b.store.list_heartbeats(&id, 5).await?;
            if out.json {
                out.json_value(&serde_json::json!({ "agent": agent, "heartbeats": recent }));
                return Ok(());
            }
            let field = |k: &str, v: String| outln!("{k:<18}{v}");
            field("id", agent.id.to_string());
            field("name", agent.name.clone());
            if let Some(a) = &agent.alias {
                field("alias", a.clone());
            }
            field("interval", agent.interval.to_string());
            field(
                "active hours",
                agent
                    .active_hours
                    .map_or("always".into(), |h| h.to_string()),
            );
            field("time zone", agent.timezone.to_string());
            field("session", agent.session.to_string());
            field("created", when(Some(agent.created_at)));
            field("last interaction", when(agent.last_interaction_at));
            if let Some(i) = &agent.instructions {
                field("instructions", short(i, 200));
            }
            if let Some(p) = &agent.persona {
                field("persona", short(p, 200));
            }
            outln!();
            heartbeat_table(out, &recent);
            Ok(())
        }
        Plan::Emit { agent, event } => {
            require_agent(b, &agent).await?;
            let event = event.into_event(agent, "cli", clock.now());
            b.store.append(&event).await?;
            out.created(
                &event,
                event.id.as_str(),
                &format!(
                    "emitted {} {}; the next heartbeat processes it",
                    event.event_type, event.id
                ),
            );
            Ok(())
        }
        Plan::ListEvents { agent, limit } => {
            require_agent(b, &agent).await?;
            let events = b.store.list_events(&agent, limit).await?;
            out.table(
                &events,
                &[
                    "ID", "TYPE", "PRIO", "SOURCE", "CREATED", "PARENT", "PAYLOAD",
                ],
                |e| {
                    let mut source = e.source.clone();
                    if let Some(c) = &e.cascade {
                        source = format!(
                            "{source} (depth {}{})",
                            c.depth,
                            if c.capped { ", capped" } else { "" }
                        );
                    }
                    vec![
                        e.id.to_string(),
                        e.event_type.to_string(),
                        e.priority.to_string(),
                        source,
                        when(Some(e.created_at)),
                        e.parent_id.as_ref().map_or("-".into(), |p| p.to_string()),
                        short(&e.payload.to_string(), 60),
                    ]
                },
            );
            Ok(())
        }
        Plan::ListHeartbeats { agent, limit } => {
            require_agent(b, &agent).await?;
            let hbs = b.store.list_heartbeats(&agent, limit).await?;
            heartbeat_table(out, &hbs);
            Ok(())
        }
        Plan::ListActions { agent, limit } => {
            require_agent(b, &agent).await?;
            let actions = b.store.list_actions(&agent, limit).await?;
            out.table(
                &actions,
                &[
                    "ID", "TOOL", "EVENT", "BEAT", "STATUS", "TRY", "MS", "ERROR",
                ],
                |a| {
                    vec![
                        a.id.to_string(),
                        a.tool.to_string(),
                        a.event_id.to_string(),
                        a.heartbeat_id.beat().to_string(),
                        format!("{:?}", a.status).to_uppercase(),
                        a.attempt.to_string(),
                        a.duration_ms.map_or("-".into(), |d| d.to_string()),
                        a.error.as_deref().map_or("-".into(), |e| short(e, 80)),
                    ]
                },
            );
            Ok(())
        }
        Plan::AddTool(tool) => {
            b.store.add_tool(&tool).await.map_err(store)?;
            out.created(
                &tool,
                tool.name.as_str(),
                &format!("registered tool {}", tool.name),
            );
            Ok(())
        }
        Plan::ListTools => {
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
                            ("http", url.to_string(), format!("{timeout_ms}ms"))
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
            Ok(())
        }
        Plan::SetTool { name, active } => {
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
            Ok(())
        }
        Plan::AddSubscription(sub) => {
            let registry = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools());
            if !registry.tools.iter().any(|t| t.name == sub.tool) {
                return Err(Failure::Input(format!(
                    "tool {} is not registered; add it first with `pulse tools add`",
                    sub.tool
                )));
            }
            if let Some(agent) = &sub.agent_id {
                require_agent(b, agent).await?;
            }
            b.store.add_subscription(&sub).await.map_err(store)?;
            out.created(
                &sub,
                sub.id.as_str(),
                &format!("subscribed {} to {} ({})", sub.tool, sub.event_type, sub.id),
            );
            Ok(())
        }
        Plan::ListSubscriptions => {
            let mut subs = b
                .store
                .load_registry()
                .await?
                .with_builtins(builtin_tools())
                .subscriptions;
            subs.sort_by(|a, b| {
                (&a.event_type, a.order, &a.tool).cmp(&(&b.event_type, b.order, &b.tool))
            });
            out.table(
                &subs,
                &["ID", "EVENT", "TOOL", "ORDER", "ACTIVE", "AGENT", "FILTER"],
                |s| {
                    vec![
                        s.id.to_string(),
                        s.event_type.to_string(),
                        s.tool.to_string(),
                        s.order.to_string(),
                        yes_no(s.active),
                        s.agent_id.as_ref().map_or("all".into(), |a| a.to_string()),
                        serde_json::to_string(&s.filter).unwrap_or_default(),
                    ]
                },
            );
            Ok(())
        }
        Plan::SetSubscription { id, active } => {
            let builtin = Subscription::heartbeat_agent();
            if id == builtin.id {
                match b.store.add_subscription(&builtin).await {
                    Ok(()) | Err(StoreError::AlreadyExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            b.store
                .set_subscription_active(&id, active)
                .await
                .map_err(store)?;
            out.done(&format!(
                "subscription {id} {}",
                if active { "enabled" } else { "disabled" }
            ));
            Ok(())
        }
        Plan::Say { agent, user, text } => {
            let a = require_agent(b, &agent).await?;
            let signal = Signal::user_message(
                &a.id,
                &a.session,
                &text,
                SignalMeta {
                    source: Some("cli".into()),
                    user_name: Some(user),
                    ..SignalMeta::default()
                },
                clock.now(),
            )
            .map_err(input)?;
            intake::submit(b.store.as_ref(), b.queue.as_ref(), signal.clone()).await?;
            out.created(
                &signal,
                signal.id.as_str(),
                &format!(
                    "queued for {}; `pulse serve` (or `pulse sweep`) answers it, `pulse conversation show --agent {}` shows the reply",
                    a.name, a.id
                ),
            );
            Ok(())
        }
        Plan::ShowConversation { agent, limit } => {
            require_agent(b, &agent).await?;
            let mut messages = b.store.recent_messages(&agent, limit).await?;
            messages.reverse();
            out.table(&messages, &["TIME", "WHO", "SOURCE", "TEXT"], |m| {
                let who = match m.role {
                    Role::User => m.author.clone().unwrap_or_else(|| "user".into()),
                    Role::Assistant => m.agent.clone().unwrap_or_else(|| "agent".into()),
                };
                vec![
                    when(Some(m.created_at)),
                    who,
                    m.source.clone(),
                    short(&m.content, 120),
                ]
            });
            Ok(())
        }
        Plan::ListMemories { agent, limit } => {
            require_agent(b, &agent).await?;
            let memories = b.store.memories(&agent, limit).await?;
            out.table(&memories, &["ID", "TIME", "HEARTBEAT", "TEXT"], |m| {
                vec![
                    m.id.to_string(),
                    when(Some(m.created_at)),
                    m.heartbeat_id
                        .as_ref()
                        .map_or("-".into(), |h| h.beat().to_string()),
                    short(&m.text, 120),
                ]
            });
            Ok(())
        }
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn heartbeat_table(out: &Out, hbs: &[pulse_shared::domain::Heartbeat]) {
    out.table(
        hbs,
        &[
            "BEAT",
            "STATUS",
            "SCHEDULED",
            "STARTED",
            "COMPLETED",
            "EVENTS",
            "ACTIONS",
            "FAILED",
            "ERROR",
        ],
        |h| {
            vec![
                h.beat.to_string(),
                h.status.as_str().to_owned(),
                when(Some(h.scheduled_at)),
                when(h.started_at),
                when(h.completed_at),
                h.events_processed.to_string(),
                h.actions_triggered.to_string(),
                h.actions_failed.to_string(),
                h.error.as_deref().map_or("-".into(), |e| short(e, 60)),
            ]
        },
    );
}

/// Registers the Discord commands; needs no database.
async fn register_commands(config: &Config, menu_name: &str, out: &Out) -> Result<(), Failure> {
    if config.discord.bot_token.is_none() || config.discord.application_id.is_none() {
        return Err(Failure::Input(
                    "set DISCORD_BOT_TOKEN and DISCORD_APPLICATION_ID (Developer Portal: Bot, and General Information) to register commands".into(),
                ));
    }
    let client = pulse_shared::discord::DiscordClient::new(config.discord.clone());
    let registered = client
        .overwrite_commands(&pulse_shared::discord::command_definitions(menu_name))
        .await
        .map_err(|e| anyhow::anyhow!("Discord refused the commands: {e}"))?;
    if out.json {
        out.json_value(&registered);
    } else {
        for c in &registered {
            outln!(
                "{}  {}",
                c.get("id").and_then(Value::as_str).unwrap_or("?"),
                c.get("name").and_then(Value::as_str).unwrap_or("?")
            );
        }
        eprintln!(
            "registered {} commands; global commands can take a few minutes to show up in Discord",
            registered.len()
        );
    }
    Ok(())
}
