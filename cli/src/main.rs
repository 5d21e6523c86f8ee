//! `pulse`: run the heartbeat engine on one machine (`pulse serve`), administer agents,
//! tools and subscriptions, and measure the engine (`pulse bench`).
//!
//! Every command works on the embedded SQLite store (`--db`, `PULSE_DB`, default
//! `./pulse.db`) or, with `PULSE_BACKEND=aws`, on DynamoDB and SQS as the Lambda functions
//! see them. Exit codes: 0 done, 1 failed (e.g. the backend is unreachable), 2 bad input —
//! and on bad input nothing is written.

mod bench;
mod commands;
mod output;
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
    /// Measure the engine; prints figures.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// How often to sweep for due heartbeats.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    tick: String,
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
    /// API base URL for this agent (an OpenAI-compatible server, a proxy).
    #[arg(long, value_name = "URL")]
    llm_base_url: Option<String>,
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
