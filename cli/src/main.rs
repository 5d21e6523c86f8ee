//! `pulse`: run the heartbeat engine on one machine (`pulse serve`), administer agents,
//! tools and subscriptions, and measure the engine (`pulse bench`).
//!
//! Every command works on the embedded SQLite store (`--db`, `PULSE_DB`, default
//! `./pulse.db`) or, with `PULSE_BACKEND=aws`, on DynamoDB and SQS as the Lambda functions
//! see them. Exit codes: 0 done, 1 failed (e.g. the backend is unreachable), 2 bad input —
//! and on bad input nothing is written.

mod bench;
mod bench_coldstart;
mod bench_hooks;
mod bench_receive;
mod commands;
mod demo;
mod hooks;
mod output;
mod secrets;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Pulse: a heartbeat runtime for autonomous agents.
#[derive(Parser, Debug)]
#[command(name = "pulse", version, about, long_about = None)]
struct Cli {
    /// The embedded store's file.
    #[arg(long, global = true, env = "PULSE_DB", value_name = "FILE")]
    db: Option<PathBuf>,

    /// Print listings and records as JSON.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sweeper and the worker on the embedded store until Ctrl-C.
    Serve(ServeArgs),
    /// Sweep once, run the jobs it queued, and exit.
    Sweep,
    /// Create and inspect agents.
    #[command(subcommand)]
    Agents(AgentsCmd),
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
    /// Route event types to tools.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCmd),
    /// Send a message to an agent, as if from Discord; the worker answers it.
    Say(SayArgs),
    /// Show an agent's conversation.
    #[command(subcommand)]
    Conversation(ConversationCmd),
    /// List what agents remembered.
    #[command(subcommand)]
    Memories(MemoriesCmd),
    /// Inbound webhooks: signed events from external systems.
    #[command(subcommand)]
    Webhooks(WebhooksCmd),
    /// Outbound hooks: signed deliveries of the agent's lifecycle to URLs or EventBridge.
    #[command(subcommand)]
    Hooks(hooks::HooksCmd),
    /// Discord application set-up.
    #[command(subcommand)]
    Discord(DiscordCmd),
    /// The key webhook and hook secrets are encrypted with at rest.
    #[command(subcommand)]
    Secrets(secrets::SecretsCmd),
    /// The whole system once, offline, on a temporary store: a signed webhook and a
    /// signed Discord slash command through the HTTP router, heartbeats where the agent
    /// speaks, its replies as Discord receives them, and signed hook deliveries.
    Demo,
    /// Measure the engine; prints figures.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand, Debug)]
enum WebhooksCmd {
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
}

#[derive(Args, Debug)]
struct CreateWebhook {
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
    /// Where the receiver is reachable, for the printed URL.
    #[arg(
        long,
        env = "PULSE_PUBLIC_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    base_url: String,
}

#[derive(Subcommand, Debug)]
enum DiscordCmd {
    /// Register Pulse's commands with Discord (bulk overwrite of the application's global
    /// commands): `/ask` and a message context-menu command. Needs DISCORD_BOT_TOKEN and
    /// DISCORD_APPLICATION_ID.
    RegisterCommands {
        /// The context-menu command's name, shown on every message (at most 32 characters).
        #[arg(long, default_value = "Ask Pulse")]
        menu_name: String,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// How often to sweep for due heartbeats.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    tick: String,
    /// Where the HTTP receiver (Discord interactions, webhooks, health) listens; `off`
    /// for none.
    #[arg(
        long,
        env = "PULSE_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    listen: String,
    /// How long a client may take to send a request's headers (an idle connection is
    /// closed after it).
    #[arg(
        long,
        env = "PULSE_HTTP_HEADER_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION"
    )]
    header_timeout: String,
    /// How long one request may take, its body included (408 after it).
    #[arg(
        long,
        env = "PULSE_HTTP_REQUEST_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION"
    )]
    request_timeout: String,
    /// Most HTTP connections open at once; more wait until one closes.
    #[arg(
        long,
        env = "PULSE_HTTP_MAX_CONNECTIONS",
        default_value_t = 512,
        value_name = "N"
    )]
    max_connections: usize,
    /// On Ctrl-C or SIGTERM: how long to finish the work in hand (queued jobs, requests
    /// in flight) before stopping; heartbeats claimed but not started by then are
    /// released.
    #[arg(
        long,
        env = "PULSE_SHUTDOWN_GRACE",
        default_value = "10s",
        value_name = "DURATION"
    )]
    shutdown_grace: String,
}

#[derive(Args, Debug)]
struct SayArgs {
    /// The agent's id.
    #[arg(long)]
    agent: String,
    /// Your name, as the agent sees it.
    #[arg(long, default_value = "you")]
    user: String,
    /// What to say.
    text: String,
}

#[derive(Subcommand, Debug)]
enum ConversationCmd {
    /// The latest messages, oldest first.
    Show {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
enum MemoriesCmd {
    /// An agent's latest memories, newest first.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
enum AgentsCmd {
    /// Create an agent; its first heartbeat is due at once.
    Create(Box<CreateAgent>),
    /// List agents.
    List,
    /// Show one agent and its latest heartbeat.
    Show {
        /// The agent's id.
        id: String,
    },
}

#[derive(Args, Debug)]
struct CreateAgent {
    /// Display name.
    #[arg(long)]
    name: String,
    /// Time between heartbeats (2s, 15m, 1h).
    #[arg(long, default_value = "15m")]
    interval: String,
    /// Hours in which heartbeats may run, HH:MM-HH:MM (wrapping midnight is fine).
    #[arg(long, value_name = "HH:MM-HH:MM")]
    active_hours: Option<String>,
    /// IANA time zone of the active hours.
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// What to look at on waking, like a HEARTBEAT.md.
    #[arg(long)]
    instructions: Option<String>,
    /// Persona (system prompt).
    #[arg(long)]
    persona: Option<String>,
    /// Short handle.
    #[arg(long)]
    alias: Option<String>,
    /// LLM provider for this agent: anthropic, openai or offline (default: the configured one).
    #[arg(long, value_name = "PROVIDER")]
    llm_provider: Option<String>,
    /// Model for this agent.
    #[arg(long, value_name = "MODEL")]
    llm_model: Option<String>,
    /// API base URL for this agent (an OpenAI-compatible server, a proxy). The
    /// deployment's key is sent there only if the URL is listed in PULSE_LLM_BASE_URLS;
    /// otherwise give the agent its own key with --llm-api-key-env.
    #[arg(long, value_name = "URL")]
    llm_base_url: Option<String>,
    /// The variable holding this agent's own API key, named PULSE_LLM_KEY_<NAME> (set it
    /// where Pulse runs; in AWS, under the secrets path). Only the name is stored.
    #[arg(long, value_name = "VAR")]
    llm_api_key_env: Option<String>,
    /// Most LLM calls per heartbeat.
    #[arg(long, default_value_t = 8)]
    max_steps: u32,
    /// Most tokens per heartbeat.
    #[arg(long, default_value_t = 50_000)]
    max_tokens: u64,
    /// How long after a user turn the next heartbeat waits (default: half the interval).
    #[arg(long, value_name = "DURATION")]
    quiet_period: Option<String>,
    /// The Discord channel the agent speaks in when no interaction is open.
    #[arg(long, value_name = "CHANNEL_ID")]
    discord_channel: Option<String>,
}

#[derive(Subcommand, Debug)]
enum EventsCmd {
    /// Append an event to an agent's log; the next heartbeat processes it.
    Emit {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// Event type, e.g. NEW_MENTION.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: String,
        /// JSON payload.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// 1 (highest) to 10; 5 when left out.
        #[arg(long)]
        priority: Option<i64>,
    },
    /// List an agent's latest events.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
enum HeartbeatsCmd {
    /// List an agent's latest heartbeats, newest first.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
enum ActionsCmd {
    /// List an agent's latest actions.
    List {
        /// The agent's id.
        #[arg(long)]
        agent: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
enum ToolsCmd {
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

#[derive(Subcommand, Debug)]
enum SubscriptionsCmd {
    /// Route an event type to a tool.
    Add {
        /// The tool's name.
        #[arg(long)]
        tool: String,
        /// The event type.
        #[arg(long)]
        event: String,
        /// Lower runs first among the tools of one event.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        order: i32,
        /// JSON filter: {"min_priority": N, "topics": [..], "payload": {"path": value}}.
        #[arg(long)]
        filter: Option<String>,
        /// Only this agent's events (all agents when left out).
        #[arg(long)]
        agent: Option<String>,
    },
    /// List subscriptions.
    List,
    /// Let a subscription fire again.
    Enable {
        /// The subscription's id.
        id: String,
    },
    /// Stop a subscription from firing.
    Disable {
        /// The subscription's id.
        id: String,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Claims per second on the embedded store, and AWS requests per heartbeat cycle on
    /// an emulator endpoint when one is given.
    Sweep {
        /// How many due heartbeats to sweep.
        #[arg(long, default_value_t = 10_000)]
        heartbeats: usize,
        /// An AWS emulator (e.g. moto) to measure the AWS backend on as well.
        #[arg(long, value_name = "URL")]
        aws_endpoint: Option<String>,
    },
    /// The HTTP receiver's throughput and latency with signed webhooks over loopback,
    /// beside a bare axum endpoint in the same run.
    Receive {
        /// Requests sent to each endpoint.
        #[arg(long, default_value_t = 20_000)]
        requests: usize,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
    },
    /// Hook deliveries per second through the embedded hooks queue to a loopback
    /// receiver, and the latency queueing adds to one delivery beside a bare POST.
    Hooks {
        /// Deliveries in the backlog drained for throughput.
        #[arg(long, default_value_t = 2_000)]
        deliveries: usize,
        /// Single deliveries timed for latency (and bare POSTs beside them).
        #[arg(long, default_value_t = 200)]
        samples: usize,
    },
    /// Each Lambda function's init (process start → first request for work on a local
    /// runtime API) beside a hello-world lambda_runtime binary, same release profile.
    Coldstart {
        /// Inits measured per binary.
        #[arg(long, default_value_t = 30)]
        runs: usize,
        /// Where the release binaries are (default: beside this `pulse`).
        #[arg(long, value_name = "DIR")]
        bin_dir: Option<std::path::PathBuf>,
    },
    /// The worker's cost per conversation turn with histories of several sizes (offline
    /// model, no Discord).
    Turn {
        /// History sizes, in messages.
        #[arg(long, value_delimiter = ',', default_value = "10,1000,10000")]
        history: Vec<usize>,
        /// Turns measured per size.
        #[arg(long, default_value_t = 200)]
        turns: usize,
    },
}

/// A command's failure: bad input (exit 2, nothing written) or a failure to do the work
/// (exit 1).
#[derive(Debug)]
enum Failure {
    Input(String),
    Runtime(anyhow::Error),
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
        Err(Failure::Runtime(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
