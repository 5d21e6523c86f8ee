//! `pulse simulate`: the whole system through a simulated day on virtual time, with
//! injected faults and checked invariants (the `pulse-sim` crate). Prints the seed, what
//! happened, the faults by kind and every invariant; exits 1 on a violation, with the
//! command that replays it.

use anyhow::anyhow;
use clap::Args;
use pulse_sim::{Mix, Options, SimBackend};

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Args, Debug)]
pub(crate) struct SimulateArgs {
    /// Agents in the fleet (15-minute interval, a tool subscription each, one in ten with
    /// a hook, one in twenty chatting) [default: 1000; 100 with --backend aws]
    #[arg(long)]
    agents: Option<usize>,
    /// Simulated time: 24h, 6h, 90m [default: 24h; 4h with --backend aws]
    #[arg(long)]
    duration: Option<String>,
    /// The seed every choice is drawn from (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The fault mix: none, default, heavy, or power (the default mix and power cuts of
    /// the embedded store, checked afterwards).
    #[arg(long, default_value = "default")]
    faults: String,
    /// Keep the run's database in FILE (a new file), to look into with the other
    /// commands: PULSE_DB=FILE pulse heartbeats list --agent ...
    #[arg(long, value_name = "FILE")]
    keep: Option<std::path::PathBuf>,
    /// The most agents one simulated deployment holds: a larger fleet runs as shards of
    /// their own (own store, sweeper, workers, dispatcher), side by side on the cores.
    #[arg(long, value_name = "N", default_value_t = pulse_sim::SHARD_AGENTS)]
    shard_agents: usize,
    /// Where the run keeps its state: sqlite (the embedded store, as `pulse serve`) or
    /// aws (the DynamoDB and SQS adapters, as the Lambda functions, over the emulator
    /// at --endpoint, with faults injected beneath the SDK as well).
    #[arg(long, default_value = "sqlite", value_name = "sqlite|aws")]
    backend: String,
    /// The AWS emulator (moto) for --backend aws, e.g. http://127.0.0.1:5000. Each shard
    /// makes a table and two queues of its own there, and deletes them afterwards.
    #[arg(
        long,
        value_name = "URL",
        env = "AWS_ENDPOINT_URL",
        hide_env_values = true
    )]
    endpoint: Option<String>,
}

/// Checks the arguments into the simulation's options.
fn options(a: SimulateArgs) -> Result<Options, Failure> {
    // On the emulator every store call is a request of a few milliseconds: a smaller
    // default run, under three minutes on two cores with the emulator under 250 MB
    // (a larger one tests the emulator's limits more than Pulse's).
    let aws = a.backend == "aws";
    let agents = a.agents.unwrap_or(if aws { 100 } else { 1000 });
    let given = a
        .duration
        .unwrap_or_else(|| if aws { "4h" } else { "24h" }.to_owned());
    let duration: jiff::SignedDuration = given.parse().map_err(|e| {
        Failure::Input(format!(
            "--duration {given:?} is not a duration such as 24h, 6h or 90m: {e}"
        ))
    })?;
    if duration.is_negative() || duration.is_zero() {
        return Err(Failure::Input(format!(
            "--duration {given:?} must be more than zero"
        )));
    }
    if let Some(p) = a.keep.as_ref().filter(|p| p.exists()) {
        return Err(Failure::Input(format!(
            "--keep {}: the file exists; give a new file to keep the run's database in",
            p.display()
        )));
    }
    if agents == 0 {
        return Err(Failure::Input("--agents must be at least 1".into()));
    }
    if a.shard_agents == 0 {
        return Err(Failure::Input("--shard-agents must be at least 1".into()));
    }
    let backend = match (a.backend.as_str(), a.endpoint) {
        ("sqlite", _) => SimBackend::Embedded,
        ("aws", Some(endpoint)) => {
            if a.keep.is_some() {
                return Err(Failure::Input(
                    "--keep keeps the embedded store's file: it has no meaning with --backend aws"
                        .into(),
                ));
            }
            SimBackend::Aws { endpoint }
        }
        ("aws", None) => {
            return Err(Failure::Input(
                "--backend aws runs over an AWS emulator, never AWS itself: start one (`moto_server -p 5000`) and give its URL with --endpoint http://127.0.0.1:5000".into(),
            ));
        }
        (other, _) => {
            return Err(Failure::Input(format!(
                "--backend {other:?}: choose sqlite or aws"
            )));
        }
    };
    let mix = Mix::named(&a.faults).ok_or_else(|| {
        Failure::Input(format!(
            "--faults {:?}: choose none, default, heavy or power",
            a.faults
        ))
    })?;
    if mix.rate(pulse_sim::Fault::PowerCut) > 0.0 {
        if backend != SimBackend::Embedded {
            return Err(Failure::Input(
                "--faults power cuts the power under the embedded store's files: run it on the sqlite backend".into(),
            ));
        }
        if a.keep.is_some() {
            return Err(Failure::Input(
                "--faults power keeps the run's database in a recorded file of its own: run it without --keep".into(),
            ));
        }
    }
    Ok(Options {
        agents,
        duration: duration.unsigned_abs(),
        seed: a
            .seed
            .unwrap_or_else(|| pulse_shared::entropy::bits() as u64 >> 1),
        mix,
        keep: a.keep,
        shard_agents: a.shard_agents,
        backend,
    })
}

pub(crate) async fn run(a: SimulateArgs, out: &Out) -> Result<(), Failure> {
    let options = options(a)?;
    // Printed first, so a run that never ends can still be replayed.
    eprintln!(
        "simulating {} agents for {} s of virtual time, seed {}, faults {}{}",
        options.agents,
        options.duration.as_secs(),
        options.seed,
        options.mix.name,
        match &options.backend {
            SimBackend::Embedded => String::new(),
            SimBackend::Aws { endpoint } => format!(", on the AWS adapters over {endpoint}"),
        }
    );
    // The simulation runs its own single-threaded runtime on virtual time.
    let report = tokio::task::spawn_blocking(move || pulse_sim::run(&options))
        .await
        .map_err(|e| anyhow!("the simulation stopped: {e}"))?
        .map_err(|e| anyhow!("the simulation could not run: {e}"))?;
    if out.json {
        out.json_value(&report);
    } else {
        outln!("{}", report.text().trim_end());
    }
    if report.passed() {
        Ok(())
    } else {
        Err(Failure::Runtime(anyhow!(
            "an invariant was violated; replay with: {}",
            report.replay()
        )))
    }
}
