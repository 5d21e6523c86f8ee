//! The admin verbs, one module per noun, each shaped alike: its clap types, a `plan`
//! that parses and validates every input into a plan (so bad input writes nothing, not
//! even a new database file), and an `execute` that runs the plan on a connected
//! backend. [`run`] ties them together.

pub(crate) mod actions;
pub(crate) mod agents;
pub(crate) mod apply;
pub(crate) mod approvals;
pub(crate) mod conversation;
pub(crate) mod dashboard;
pub(crate) mod deliveries;
pub(crate) mod discord;
pub(crate) mod events;
pub(crate) mod gateway;
pub(crate) mod heartbeats;
pub(crate) mod hooks;
pub(crate) mod init;
mod listen;
mod mcp;
pub(crate) mod memories;
pub(crate) mod models;
pub(crate) mod prune;
pub(crate) mod schedules;
pub(crate) mod secrets;
pub(crate) mod serve;
pub(crate) mod sessions;
mod shutdown;
pub(crate) mod simulate;
pub(crate) mod slack;
pub(crate) mod status;
mod story;
pub(crate) mod subscriptions;
pub(crate) mod telegram;
pub(crate) mod tokens;
pub(crate) mod tools;
pub(crate) mod usage;
pub(crate) mod webhooks;

use std::collections::BTreeMap;
use std::sync::Arc;

use pulse_shared::adapters::aws::{self, AwsClients};
use pulse_shared::app::{Connected, connect};
use pulse_shared::config::{Backend, Config, Env};
use pulse_shared::domain::{Agent, AgentId};
use pulse_shared::error::{StoreError, ValidationError};
use pulse_shared::ports::{Clock, SystemClock};
use pulse_shared::telemetry::{self, LogFormat};
use serde_json::Value;

use crate::output::Out;
use crate::{Cli, Command, Failure};

/// What a command runs with once its plan is made.
pub(crate) struct Ctx<'a> {
    pub(crate) config: &'a Config,
    pub(crate) b: &'a Connected,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) out: &'a Out,
    /// The deployed stack's receiver URL (`PULSE_STACK`), when no PULSE_PUBLIC_URL is set.
    pub(crate) public_url: Option<String>,
}

/// A validated command.
enum Plan {
    Serve(serve::ServePlan),
    Dashboard(dashboard::DashboardPlan),
    Agents(agents::AgentsPlan),
    Apply(apply::ApplyPlan),
    Export(apply::ExportPlan),
    Events(events::EventsPlan),
    Heartbeats(heartbeats::HeartbeatsPlan),
    Actions(actions::ActionsPlan),
    Tools(tools::ToolsPlan),
    Approvals(approvals::ApprovalsPlan),
    Tokens(tokens::TokensPlan),
    Subscriptions(subscriptions::SubscriptionsPlan),
    Conversation(conversation::ConversationPlan),
    Memories(memories::MemoriesPlan),
    Schedules(schedules::SchedulesPlan),
    Webhooks(webhooks::WebhooksPlan),
    Hooks(hooks::HooksPlan),
    Usage(usage::UsagePlan),
    Prune(prune::PrunePlan),
    Sessions(sessions::SessionsPlan),
    Deliveries(deliveries::DeliveriesPlan),
    Status(status::StatusPlan),
    Gateway,
    Secrets,
}

impl Plan {
    /// Whether the command may create the database.
    fn writes(&self) -> bool {
        match self {
            Plan::Serve(_) | Plan::Dashboard(_) => true,
            Plan::Agents(p) => p.writes(),
            Plan::Apply(p) => p.writes(),
            Plan::Events(p) => p.writes(),
            Plan::Tools(p) => p.writes(),
            Plan::Approvals(p) => p.writes(),
            Plan::Tokens(p) => p.writes(),
            Plan::Subscriptions(p) => p.writes(),
            Plan::Conversation(p) => p.writes(),
            Plan::Webhooks(p) => p.writes(),
            Plan::Hooks(p) => p.writes(),
            Plan::Memories(p) => p.writes(),
            Plan::Heartbeats(_)
            | Plan::Export(_)
            | Plan::Actions(_)
            | Plan::Schedules(_)
            | Plan::Usage(_)
            | Plan::Prune(_)
            | Plan::Sessions(_)
            | Plan::Deliveries(_)
            | Plan::Status(_)
            | Plan::Gateway
            | Plan::Secrets => false,
        }
    }
}

fn plan(command: Command, now: jiff::Timestamp) -> Result<Plan, Failure> {
    Ok(match command {
        Command::Serve(a) => Plan::Serve(serve::plan_serve(a)?),
        Command::Sweep => Plan::Serve(serve::ServePlan::Sweep),
        Command::Dashboard(a) => Plan::Dashboard(dashboard::plan(a)?),
        Command::Agents(c) => Plan::Agents(agents::plan(c, now)?),
        Command::Apply(a) => Plan::Apply(apply::plan(a)?),
        Command::Export(a) => Plan::Export(apply::plan_export(a)?),
        Command::Events(c) => Plan::Events(events::plan(c)?),
        Command::Heartbeats(c) => Plan::Heartbeats(heartbeats::plan(c)?),
        Command::Actions(c) => Plan::Actions(actions::plan(c)?),
        Command::Tools(c) => Plan::Tools(tools::plan(c, now)?),
        Command::Approvals(c) => Plan::Approvals(approvals::plan(c)?),
        Command::Tokens(c) => Plan::Tokens(tokens::plan(c)?),
        Command::Subscriptions(c) => Plan::Subscriptions(subscriptions::plan(c, now)?),
        Command::Say(a) => Plan::Conversation(conversation::plan_say(a, now)?),
        Command::Conversation(c) => Plan::Conversation(conversation::plan(c)?),
        Command::Memories(c) => Plan::Memories(memories::plan(c)?),
        Command::Schedules(c) => Plan::Schedules(schedules::plan(c)?),
        Command::Webhooks(c) => Plan::Webhooks(webhooks::plan(c, now)?),
        Command::Hooks(c) => Plan::Hooks(hooks::plan(c, now)?),
        Command::Usage(a) => Plan::Usage(usage::plan(a)?),
        Command::Prune(a) => Plan::Prune(prune::plan(a)?),
        Command::Sessions(c) => Plan::Sessions(sessions::plan(c)?),
        Command::Deliveries(c) => Plan::Deliveries(deliveries::plan(c)?),
        Command::Status(a) => Plan::Status(status::plan(a)?),
        Command::Gateway => Plan::Gateway,
        Command::Secrets(_) => Plan::Secrets,
        Command::Discord(_)
        | Command::Telegram(_)
        | Command::Slack(_)
        | Command::Models(_)
        | Command::Bench(_)
        | Command::Demo
        | Command::Docs(_)
        | Command::Init(_)
        | Command::Simulate(_) => {
            unreachable!("answered before planning: they need no database")
        }
    })
}

/// Parses, validates, connects, runs.
pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let out = Out::new(cli.json);
    let command = match cli.command {
        Command::Bench(cmd) => return crate::bench::run(cmd, &out).await,
        Command::Demo => return crate::demo::demo().await,
        Command::Docs(cmd) => return crate::docs::run(cmd),
        Command::Simulate(a) => return simulate::run(a, &out).await,
        Command::Secrets(secrets::SecretsCmd::NewKey) => {
            secrets::new_key(&out);
            return Ok(());
        }
        Command::Init(a) => return init::run(a, cli.db, cli.stack.as_deref(), &out).await,
        Command::Models(cmd) => return models::run(cmd, cli.db, &out).await,
        Command::Discord(cmd) => {
            let (config, _) = with_stack(cli.db, cli.stack.as_deref()).await?;
            return discord::run(cmd, &config, &out).await;
        }
        Command::Slack(cmd) => return slack::run(cmd, &out),
        Command::Telegram(cmd) => {
            let (config, _) = with_stack(cli.db, cli.stack.as_deref()).await?;
            return telegram::run(cmd, &config, &out).await;
        }
        other => other,
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let plan = plan(command, clock.now())?;
    let (config, public_url) = with_stack(cli.db, cli.stack.as_deref()).await?;
    if let Backend::Sqlite { path } = &config.backend
        && !plan.writes()
        && !path.exists()
    {
        return Err(Failure::Input(format!(
            "there is no Pulse database at {}; create an agent first, or point --db (PULSE_DB) at one",
            path.display()
        )));
    }
    let traces = if matches!(plan, Plan::Serve(_) | Plan::Dashboard(_) | Plan::Gateway) {
        telemetry::init(log_format()?, "pulse").map_err(Failure::Input)?
    } else {
        pulse_shared::traces::Traces::default()
    };
    if let Backend::Aws(settings) = &config.backend {
        let clients = AwsClients::new(settings.endpoint_url.as_deref()).await;
        aws::check(&clients, settings)
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
    }
    let b = connect(&config, clock.clone()).await?;
    if let Some(missing) = &b.keys_missing {
        // Serving would answer every webhook 503 and send no hook: refuse, with the fix.
        // Other commands go on (they are how it is fixed), and say so once.
        if matches!(plan, Plan::Serve(_)) {
            return Err(Failure::Runtime(anyhow::anyhow!("{missing}")));
        }
        eprintln!("warning: {missing}");
    }
    let cx = Ctx {
        config: &config,
        b: &b,
        clock,
        out: &out,
        public_url,
    };
    let done = match plan {
        Plan::Serve(p) => serve::execute(p, &cx).await,
        Plan::Dashboard(p) => dashboard::execute(p, &cx).await,
        Plan::Agents(p) => agents::execute(p, &cx).await,
        Plan::Apply(p) => apply::execute(p, &cx).await,
        Plan::Export(p) => apply::export(p, &cx).await,
        Plan::Events(p) => events::execute(p, &cx).await,
        Plan::Heartbeats(p) => heartbeats::execute(p, &cx).await,
        Plan::Actions(p) => actions::execute(p, &cx).await,
        Plan::Tools(p) => tools::execute(p, &cx).await,
        Plan::Approvals(p) => approvals::execute(p, &cx).await,
        Plan::Tokens(p) => tokens::execute(p, &cx).await,
        Plan::Subscriptions(p) => subscriptions::execute(p, &cx).await,
        Plan::Conversation(p) => conversation::execute(p, &cx).await,
        Plan::Memories(p) => memories::execute(p, &cx).await,
        Plan::Schedules(p) => schedules::execute(p, &cx).await,
        Plan::Webhooks(p) => webhooks::execute(p, &cx).await,
        Plan::Hooks(p) => hooks::execute(p, &cx).await,
        Plan::Usage(p) => usage::execute(p, &cx).await,
        Plan::Prune(p) => prune::execute(p, &cx).await,
        Plan::Sessions(p) => sessions::execute(p, &cx).await,
        Plan::Deliveries(p) => deliveries::execute(p, &cx).await,
        Plan::Status(p) => status::execute(p, &cx).await,
        Plan::Gateway => gateway::execute(&cx).await,
        Plan::Secrets => secrets::reseal(&b, &out).await,
    };
    // What the exporter still holds is sent before the process ends.
    traces.finished().await;
    done
}

fn configuration(db: Option<std::path::PathBuf>) -> Result<Config, Failure> {
    Env::process()
        .config(db)
        .map_err(|e| Failure::Input(format!("configuration: {e}")))
}

/// The configuration; with a stack (`PULSE_STACK`, `--stack`), its outputs fill the
/// variables left unset (the table, the queues, PULSE_BACKEND=aws) and its receiver URL
/// is returned for the URLs the CLI prints.
async fn with_stack(
    db: Option<std::path::PathBuf>,
    stack: Option<&str>,
) -> Result<(Config, Option<String>), Failure> {
    let Some(stack) = stack.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok((configuration(db)?, None));
    };
    let process = Env::process();
    if let Some(backend) = process.var("PULSE_BACKEND").filter(|b| b.trim() != "aws") {
        return Err(Failure::Input(format!(
            "PULSE_STACK (--stack) names the AWS stack {stack:?} but PULSE_BACKEND is {backend:?}: unset one of them"
        )));
    }
    let endpoint = process.var("AWS_ENDPOINT_URL");
    let outputs = aws::stack_outputs(endpoint.as_deref(), stack)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    let mut vars: BTreeMap<String, String> = aws::STACK_VARIABLES
        .iter()
        .filter_map(|(output, var)| Some(((*var).to_owned(), outputs.get(*output)?.clone())))
        .collect();
    if !vars.contains_key("PULSE_TABLE") {
        return Err(Failure::Input(format!(
            "stack {stack:?} has no TableName output: is it Pulse's stack (infra/template.yaml)?"
        )));
    }
    vars.insert("PULSE_BACKEND".into(), "aws".into());
    // The functions' secrets (the encryption key webhooks and hooks are sealed with,
    // Discord's token), as they read them: under the stack's SSM path.
    if let Some(path) = outputs.get("SecretsPath") {
        let read = async {
            aws::SecretParameters::new(path, endpoint.as_deref())
                .await?
                .load()
                .await
        };
        match read.await {
            Ok(secrets) => {
                for (k, v) in secrets {
                    vars.entry(k).or_insert(v);
                }
            }
            Err(e) => eprintln!(
                "note: the stack's secrets were not read ({e}); commands that seal or open secrets (webhooks, hooks) need PULSE_ENCRYPTION_KEY"
            ),
        }
    }
    let public_url = process
        .var("PULSE_PUBLIC_URL")
        .is_none()
        .then(|| vars.get("PULSE_PUBLIC_URL").cloned())
        .flatten();
    let vars = Arc::new(vars);
    let env = Env(move |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| vars.get(k).cloned())
    });
    let config = env
        .config(db)
        .map_err(|e| Failure::Input(format!("configuration: {e}")))?;
    Ok((config, public_url))
}

/// Bad input, as the user is told.
pub(crate) fn input(e: ValidationError) -> Failure {
    Failure::Input(e.to_string())
}

/// A JSON argument.
pub(crate) fn json_arg(what: &str, s: &str) -> Result<Value, Failure> {
    serde_json::from_str(s).map_err(|e| {
        Failure::Input(format!(
            "invalid {what}: {e}; give a JSON value, e.g. '{{\"key\": 1}}'"
        ))
    })
}

/// A listing's `--limit`.
pub(crate) fn limit(n: usize) -> Result<usize, Failure> {
    if (1..=10_000).contains(&n) {
        Ok(n)
    } else {
        Err(Failure::Input(format!("invalid limit {n}: use 1 to 10000")))
    }
}

/// An agent as the user named it — its id, its name or its alias (`@scout` or `scout`) —
/// found when the command runs. An id is checked at once, so a mistyped one writes
/// nothing.
#[derive(Clone, Debug)]
pub(crate) struct AgentRef(String);

/// An agent argument: an id (`ag_…`), a name or an alias.
pub(crate) fn agent_ref(s: &str) -> Result<AgentRef, Failure> {
    let s = s.trim();
    if s.is_empty() {
        return Err(Failure::Input(
            "give an agent: its id, name or alias (`pulse agents list` shows them)".into(),
        ));
    }
    if s.starts_with("ag_") {
        AgentId::parse(s).map_err(input)?;
    }
    Ok(AgentRef(s.to_owned()))
}

impl AgentRef {
    /// The agent, read from the store; bad input when there is none by that id, name or
    /// alias, or when a name or alias is shared (the matches are listed).
    pub(crate) async fn find(&self, b: &Connected) -> Result<Agent, Failure> {
        if let Ok(id) = AgentId::parse(&self.0) {
            return require_agent(b, &id).await;
        }
        let agents = b.store.list_agents().await?;
        let matches = pulse_shared::domain::agents_named(&agents, &self.0);
        match matches.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(Failure::Input(format!(
                "no agent has the id, name or alias {:?}; `pulse agents list` shows the agents",
                self.0
            ))),
            several => Err(Failure::Input(format!(
                "{:?} names {} agents: {}; give the id, or rename one with `pulse agents update ID --name NEW`",
                self.0,
                several.len(),
                several
                    .iter()
                    .map(|a| format!("{} ({})", a.id, a.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The agent's id: as given, or found by name or alias.
    pub(crate) async fn id(&self, b: &Connected) -> Result<AgentId, Failure> {
        match AgentId::parse(&self.0) {
            Ok(id) => Ok(id),
            Err(_) => Ok(self.find(b).await?.id),
        }
    }
}

/// A record the user named does not exist, or already exists: the input was wrong.
pub(crate) fn store(e: StoreError) -> Failure {
    match e {
        StoreError::NotFound(what) => Failure::Input(format!("{what} not found")),
        StoreError::AlreadyExists(what) => Failure::Input(format!("{what} already exists")),
        other => Failure::Runtime(other.into()),
    }
}

/// The agent the user named, or bad input.
pub(crate) async fn require_agent(b: &Connected, id: &AgentId) -> Result<Agent, Failure> {
    b.store.get_agent(id).await?.ok_or_else(|| {
        Failure::Input(format!(
            "agent {id} not found; `pulse agents list` shows the agents"
        ))
    })
}

/// `yes` or `no`, for tables.
pub(crate) fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// The log format `PULSE_LOG_FORMAT` names: `text` (unset or empty too) or `json`.
fn log_format() -> Result<LogFormat, Failure> {
    match std::env::var("PULSE_LOG_FORMAT").unwrap_or_default().trim() {
        "" | "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(Failure::Input(format!(
            "PULSE_LOG_FORMAT is {other:?}; it is `text` (readable lines on stderr) or `json` (one JSON object a line on stdout)"
        ))),
    }
}
