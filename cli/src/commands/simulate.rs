//! `pulse simulate`: the whole system through a simulated day on virtual time, with
//! injected faults and checked invariants (the `pulse-sim` crate). Prints the seed, what
//! happened, the faults by kind and every invariant; exits 1 on a violation, with the
//! command that replays it.

use anyhow::anyhow;
use clap::Args;
use pulse_sim::{Mix, Options};

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Args, Debug)]
pub(crate) struct SimulateArgs {
    /// Agents in the fleet (15-minute interval, a tool subscription each, one in ten with
    /// a hook, one in twenty chatting).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Simulated time: 24h, 6h, 90m.
    #[arg(long, default_value = "24h")]
    duration: String,
    /// The seed every choice is drawn from (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The fault mix: none, default or heavy.
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
}

/// Checks the arguments into the simulation's options.
fn options(a: SimulateArgs) -> Result<Options, Failure> {
    let duration: jiff::SignedDuration = a.duration.parse().map_err(|e| {
        Failure::Input(format!(
            "--duration {:?} is not a duration such as 24h, 6h or 90m: {e}",
            a.duration
        ))
    })?;
    if duration.is_negative() || duration.is_zero() {
        return Err(Failure::Input(format!(
            "--duration {:?} must be more than zero",
            a.duration
        )));
    }
    if let Some(p) = a.keep.as_ref().filter(|p| p.exists()) {
        return Err(Failure::Input(format!(
            "--keep {}: the file exists; give a new file to keep the run's database in",
            p.display()
        )));
    }
    if a.agents == 0 {
        return Err(Failure::Input("--agents must be at least 1".into()));
    }
    if a.shard_agents == 0 {
        return Err(Failure::Input("--shard-agents must be at least 1".into()));
    }
    let mix = Mix::named(&a.faults).ok_or_else(|| {
        Failure::Input(format!(
            "--faults {:?}: choose none, default or heavy",
            a.faults
        ))
    })?;
    Ok(Options {
        agents: a.agents,
        duration: duration.unsigned_abs(),
        seed: a
            .seed
            .unwrap_or_else(|| pulse_shared::entropy::bits() as u64 >> 1),
        mix,
        keep: a.keep,
        shard_agents: a.shard_agents,
    })
}

pub(crate) async fn run(a: SimulateArgs, out: &Out) -> Result<(), Failure> {
    let options = options(a)?;
    // Printed first, so a run that never ends can still be replayed.
    eprintln!(
        "simulating {} agents for {} s of virtual time, seed {}, faults {}",
        options.agents,
        options.duration.as_secs(),
        options.seed,
        options.mix.name
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
