//! `pulse bench …`: measurements that print figures (nothing is asserted on time). Each
//! starts what it measures itself, on a temporary store or an emulator, so none needs a
//! configured backend.

mod coldstart;
mod cost;
mod dashboard;
mod embed;
mod hooks;
mod memory;
mod model;
mod recall;
mod receive;
mod retention;
mod siege;
mod sweep;

use std::time::Duration;

use clap::Subcommand;

use crate::Failure;
use crate::output::Out;

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCmd {
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
        /// Slices the requests take turns in, bare then Pulse, each endpoint's figures
        /// summed over its slices: with more than one, both endpoints meet the
        /// machine's slower and faster minutes alike.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// What the store's 2xx promises: `synced` (each commit synced before its
        /// requests are answered, as `pulse serve` runs by default) or `relaxed`
        /// (`PULSE_DURABILITY=relaxed`).
        #[arg(long, default_value = "synced", value_parser = ["synced", "relaxed"])]
        durability: String,
        /// Make every sync of the store's files this many milliseconds slower (a sleep
        /// before it): this machine's disk standing in for a slower one, such as a
        /// network volume (about 1 – 2 ms a sync) or an SSD without power-loss
        /// protection (several ms). The store is then opened through the file system
        /// that slows it; 0 opens it so without slowing it, the floor to compare with.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=100))]
        sync_delay_ms: Option<u64>,
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
        /// Measurements of `--runs` inits each, one after the other, then how many
        /// of them met the goal: the ratio moves with the host's load from one
        /// measurement to the next.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Where the release binaries are (default: beside this `pulse`).
        #[arg(long, value_name = "DIR")]
        bin_dir: Option<std::path::PathBuf>,
    },
    /// The dashboard's agents page and an agent's Heartbeats and Events tabs on SQLite
    /// with a fleet behind them: server time per page, p50 and p99.
    Dashboard {
        /// Agents in the fleet.
        #[arg(long, default_value_t = 1_000)]
        agents: usize,
        /// Events, spread over the agents.
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        /// Requests timed per page.
        #[arg(long, default_value_t = 200)]
        requests: usize,
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
    /// Signed webhooks answered while slowloris clients, idle live streams and slow
    /// bodies hold on
    /// (`pulse serve`'s listener on loopback, default limits): p50/p99 calm and
    /// besieged. Goal: besieged p99 under a second.
    Siege {
        /// Slowloris clients (unfinished requests, a header line every 2 s).
        #[arg(long, default_value_t = 1_000)]
        slowloris: usize,
        /// Idle live streams (the dashboard's server-sent events, never read).
        #[arg(long, default_value_t = 600)]
        streams: usize,
        /// Slow bodies: signed-looking webhook requests to the real webhook whose body
        /// (256 KiB announced) comes one byte every 2 s, 64 from each source address.
        #[arg(long, default_value_t = 0)]
        slow_bodies: usize,
        /// Webhooks timed, calm and again besieged.
        #[arg(long, default_value_t = 200)]
        requests: usize,
        /// How long the besieged run's requests are spread over.
        #[arg(long, default_value = "20s", value_name = "DURATION")]
        hold: String,
    },
    /// One agent with many memories recalled as the model recalls: on SQLite at 1,536
    /// dimensions and with the offline embedder (256), the cold recall, p50/p99 warm and
    /// resident memory; on an emulator, the DynamoDB requests of a warm recall.
    Recall {
        /// Memories of the agent.
        #[arg(long, default_value_t = 100_000)]
        memories: usize,
        /// Warm recalls timed.
        #[arg(long, default_value_t = 300)]
        recalls: usize,
        /// An AWS emulator (e.g. moto) to count the requests of a warm recall on.
        #[arg(long, value_name = "URL")]
        aws_endpoint: Option<String>,
        /// Memories on the emulator (the requests per warm recall do not depend on it).
        #[arg(long, default_value_t = 2_000)]
        aws_memories: usize,
        /// A local model directory (by default an installed all-MiniLM-L6-v2, if any):
        /// a run at its size, each recall's query embedded by it.
        #[arg(long, value_name = "DIR")]
        model: Option<std::path::PathBuf>,
    },
    /// Memory quality on LoCoMo, a public benchmark of long conversations: each dialogue
    /// turn kept as a memory, each question recalled, recall@5 and @10 of the annotated
    /// evidence per category (no model judges: the run is the same every time).
    Memory {
        /// LoCoMo's `locomo10.json` (github.com/snap-research/LoCoMo; CC BY-NC 4.0, read
        /// where it is).
        #[arg(long, value_name = "FILE")]
        locomo: std::path::PathBuf,
        /// Only the first N conversations (all ten by default).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        conversations: Option<u64>,
        /// A local model directory measured beside the words (by default the
        /// all-MiniLM-L6-v2 `pulse models install` put in PULSE_MODELS_DIR, if any): the
        /// engine's hybrid with it, and its vectors alone.
        #[arg(long, value_name = "DIR")]
        model: Option<std::path::PathBuf>,
        /// How the engine's recall mixes the local model's similarity and the words, one
        /// run each: the vectors' share (`0.7`, the engine's) or rank fusion (`rrf60`).
        #[arg(long, value_name = "MIX", value_delimiter = ',', default_value = "0.7")]
        mix: Vec<pulse_shared::engine::memory::index::Mix>,
    },
    /// The local embedder on this machine: its model's load time and added memory,
    /// memories embedded a second in batches of 32, and one query's embedding time.
    Embed {
        /// The model directory (by default the all-MiniLM-L6-v2 `pulse models install`
        /// put in PULSE_MODELS_DIR).
        #[arg(long, value_name = "DIR")]
        model: Option<std::path::PathBuf>,
        /// Memories embedded for the throughput.
        #[arg(long, default_value_t = 2_000)]
        memories: usize,
        /// Queries embedded one at a time for the latency.
        #[arg(long, default_value_t = 200)]
        queries: usize,
    },
    /// One agent's scripted day (96 beats at 15 minutes, 12 thinking, 20 messages) against
    /// a loopback stand-in for Anthropic that caches prompt prefixes as Anthropic
    /// documents it: input tokens and dollars with the cache off and on.
    Cost,
    /// One agent at 15 minutes for a year of simulated time on SQLite (an event and a
    /// heartbeat a beat, a conversation turn a day), then the retention pass: the file
    /// before and after.
    Retention {
        /// Heartbeats to run (35,040 is a year at 15 minutes).
        #[arg(long, default_value_t = retention::YEAR_OF_BEATS)]
        beats: usize,
    },
}

/// Runs a benchmark.
pub(crate) async fn run(cmd: BenchCmd, out: &Out) -> Result<(), Failure> {
    match cmd {
        BenchCmd::Sweep {
            heartbeats,
            aws_endpoint,
        } => sweep::sweep(heartbeats, aws_endpoint, out).await,
        BenchCmd::Receive {
            requests,
            concurrency,
            rounds,
            durability,
            sync_delay_ms,
        } => {
            let durability = match durability.as_str() {
                "relaxed" => pulse_shared::config::Durability::Relaxed,
                _ => pulse_shared::config::Durability::Synced,
            };
            let slower = sync_delay_ms.map(std::time::Duration::from_millis);
            receive::receive(requests, concurrency, rounds, (durability, slower), out).await
        }
        BenchCmd::Hooks {
            deliveries,
            samples,
        } => hooks::hooks(deliveries, samples, out).await,
        BenchCmd::Coldstart {
            runs,
            repeat,
            bin_dir,
        } => coldstart::coldstart(runs, repeat, bin_dir, out).await,
        BenchCmd::Turn { history, turns } => sweep::turn(&history, turns, out).await,
        BenchCmd::Cost => cost::cost(out).await,
        BenchCmd::Memory {
            locomo,
            conversations,
            model,
            mix,
        } => {
            memory::memory(
                &locomo,
                conversations.map(|n| n as usize),
                model.as_deref(),
                &mix,
                out,
            )
            .await
        }
        BenchCmd::Embed {
            model,
            memories,
            queries,
        } => embed::embed(model.as_deref(), memories, queries, out).await,
        BenchCmd::Retention { beats } => retention::retention(beats, out).await,
        BenchCmd::Recall {
            memories,
            recalls,
            aws_endpoint,
            aws_memories,
            model,
        } => {
            recall::recall(
                memories,
                recalls,
                aws_endpoint,
                aws_memories,
                model.as_deref(),
                out,
            )
            .await
        }
        BenchCmd::Siege {
            slowloris,
            streams,
            slow_bodies,
            requests,
            hold,
        } => {
            let hold = pulse_shared::domain::parse_duration("hold", &hold)
                .ok()
                .and_then(|d| Duration::try_from(d).ok())
                .ok_or_else(|| Failure::Input(format!("invalid --hold {hold:?}: give e.g. 20s")))?;
            siege::siege(
                siege::Siege {
                    slowloris,
                    streams,
                    slow_bodies,
                    requests,
                    hold,
                },
                out,
            )
            .await
        }
        BenchCmd::Dashboard {
            agents,
            events,
            requests,
        } => dashboard::dashboard(agents, events, requests, out).await,
    }
}

/// The `p` percentile (0 to 1) of `sorted` durations, in milliseconds: the one at
/// `len × p`, the last for 1; 0 when there are none.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}
