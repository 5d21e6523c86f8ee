//! `pulse`: run the heartbeat engine on one machine (`pulse serve`), administer agents,
//! tools and subscriptions, and measure the engine (`pulse bench`).
//!
//! Every command works on the embedded SQLite store (`--db`, `PULSE_DB`, default
//! `./pulse.db`) or, with `PULSE_BACKEND=aws`, on DynamoDB and SQS as the Lambda functions
//! see them. Exit codes: 0 done, 1 failed (e.g. the backend is unreachable), 2 bad input —
//! and on bad input nothing is written.

mod bench;
mod commands;
mod demo;
mod docs;
mod output;
mod scrape;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pulse_shared::adapters::aws::{SetupError, explain};

use commands::{
    actions::ActionsCmd, agents::AgentsCmd, conversation::ConversationCmd, conversation::SayArgs,
    discord::DiscordCmd, events::EventsCmd, heartbeats::HeartbeatsCmd, hooks::HooksCmd,
    memories::MemoriesCmd, schedules::SchedulesCmd, secrets::SecretsCmd, serve::ServeArgs,
    sessions::SessionsCmd, subscriptions::SubscriptionsCmd, tools::ToolsCmd, webhooks::WebhooksCmd,
};

/// Pulse: a heartbeat runtime for autonomous agents.
#[derive(Parser, Debug)]
#[command(name = "pulse", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The embedded store's file.
    #[arg(long, global = true, env = "PULSE_DB", value_name = "FILE")]
    pub(crate) db: Option<PathBuf>,

    /// Print listings and records as JSON.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// A deployed stack (`sam deploy`): its outputs name the table, queues and receiver
    /// URL, and imply PULSE_BACKEND=aws. Variables set explicitly win.
    #[arg(long, global = true, env = "PULSE_STACK", value_name = "NAME")]
    pub(crate) stack: Option<String>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run the sweeper and the worker on the embedded store until Ctrl-C.
    Serve(ServeArgs),
    /// Sweep once, run the jobs it queued, and exit.
    Sweep,
    /// Keep the Discord gateway open (direct and channel messages, reactions) until
    /// SIGTERM: on AWS, the forwarder onto the sessions queue. Needs DISCORD_BOT_TOKEN;
    /// a second one with the same token stands by.
    Gateway,
    /// Make what the backend needs: on AWS (an emulator, or an account without SAM) the
    /// table and queues as infra/template.yaml declares them; on SQLite the database.
    /// Prints the export lines.
    Init(commands::init::InitArgs),
    /// Serve the dashboard alone (pulse serve also serves it, under /ui/ on its listener).
    Dashboard(commands::dashboard::DashboardArgs),
    /// Create and inspect agents.
    #[command(subcommand)]
    Agents(AgentsCmd),
    /// Apply agent directories (agent.toml, SOUL.md, HEARTBEAT.md, schedules.toml): shows
    /// the plan, field by field, then creates and changes what differs, matched by name.
    Apply(commands::apply::ApplyArgs),
    /// Write an agent out as a directory of files that `pulse apply` takes back.
    Export(commands::apply::ExportArgs),
    /// Emit and list events.
    #[command(subcommand)]
    Events(EventsCmd),
    /// List heartbeats.
    #[command(subcommand)]
    Heartbeats(HeartbeatsCmd),
    /// List actions (tool runs).
    #[command(subcommand)]
    Actions(ActionsCmd),
    /// Register and switch tools.
    #[command(subcommand)]
    Tools(ToolsCmd),
    /// Tool calls parked for a person's yes (a tool whose policy is `ask`): list them,
    /// approve or deny them.
    #[command(subcommand)]
    Approvals(commands::approvals::ApprovalsCmd),
    /// Route event types to tools.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCmd),
    /// Send a message to an agent, as if from Discord; the worker answers it.
    Say(SayArgs),
    /// API tokens: a program talks to one agent over the messages API
    /// (POST /v1/agents/{id}/messages, GET /v1/turns/{id}).
    #[command(subcommand)]
    Tokens(commands::tokens::TokensCmd),
    /// Show an agent's conversation.
    #[command(subcommand)]
    Conversation(ConversationCmd),
    /// List what agents remembered.
    #[command(subcommand)]
    Memories(MemoriesCmd),
    /// Reminders: wake an agent at a time or on a cron pattern, beside its interval.
    #[command(subcommand)]
    Schedules(SchedulesCmd),
    /// Inbound webhooks: signed events from external systems.
    #[command(subcommand)]
    Webhooks(WebhooksCmd),
    /// Outbound hooks: signed deliveries of the agent's lifecycle to URLs or EventBridge.
    #[command(subcommand)]
    Hooks(HooksCmd),
    /// Model tokens per agent per day, by model, with an estimated cost.
    Usage(commands::usage::UsageArgs),
    /// Remove what is past its retention (PULSE_RETENTION, or an agent's --retention):
    /// finished heartbeats, read events, actions, conversation turns, hook deliveries,
    /// webhook logs. `pulse serve` does this hourly.
    Prune(commands::prune::PruneArgs),
    /// The sessions queue, where heartbeat jobs and conversation turns wait: move its
    /// dead letters back onto it.
    #[command(subcommand)]
    Sessions(SessionsCmd),
    /// Replies Discord did not take: those tried again later while their session goes
    /// on, and those given up on (undeliverable).
    #[command(subcommand)]
    Deliveries(commands::deliveries::DeliveriesCmd),
    /// Is the deployment healthy? Agents, overdue heartbeats, queues and dead letters,
    /// failing hooks, refusing webhooks, today's tokens; exits 1 when something needs
    /// attention, one line each with the command to look closer.
    Status(commands::status::StatusArgs),
    /// Discord application set-up.
    #[command(subcommand)]
    Discord(DiscordCmd),
    /// Telegram bot set-up: register the receiver's webhook.
    #[command(subcommand)]
    Telegram(commands::telegram::TelegramCmd),
    /// Slack app set-up: the app's manifest, with the receiver's request URLs.
    #[command(subcommand)]
    Slack(commands::slack::SlackCmd),
    /// Embeddings models run in the process, so memories are recalled by meaning with no
    /// embeddings API: install all-MiniLM-L6-v2, list what is installed.
    #[command(subcommand)]
    Models(commands::models::ModelsCmd),
    /// The key webhook and hook secrets are encrypted with at rest.
    #[command(subcommand)]
    Secrets(SecretsCmd),
    /// The whole system once, offline, on a temporary store: a signed webhook and a
    /// signed Discord slash command through the HTTP router, heartbeats where the agent
    /// speaks, its replies as Discord receives them, and signed hook deliveries.
    Demo,
    /// The whole system through a simulated day on virtual time, with injected faults;
    /// checks every invariant and exits 1 on a violation, printing the seed to replay.
    Simulate(commands::simulate::SimulateArgs),
    /// Measure the engine; prints figures.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Print a reference page of the book, made from the code.
    #[command(subcommand, hide = true)]
    Docs(docs::DocsCmd),
}

/// A command's failure: bad input (exit 2, nothing written) or a failure to do the work
/// (exit 1).
#[derive(Debug)]
pub(crate) enum Failure {
    Input(String),
    Runtime(anyhow::Error),
    /// The command did its work and found something wrong (exit 1): `pulse status`.
    Attention(String),
    /// A dry run found something to do, and did nothing (exit 2): `pulse apply --dry-run`.
    Planned(String),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Runtime(e.into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Attention(msg)) => {
            eprintln!("{msg}");
            ExitCode::from(1)
        }
        Err(Failure::Planned(msg)) => {
            eprintln!("{msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(e)) => {
            eprintln!("error: {e:#}");
            // An AWS error met mid-command: the fix, when it is known. (The check before
            // a command says its own.)
            if e.downcast_ref::<SetupError>().is_none()
                && let Some(fix) = explain(&format!("{e:#}"))
            {
                eprintln!("fix: {fix}");
            }
            ExitCode::from(1)
        }
    }
}
