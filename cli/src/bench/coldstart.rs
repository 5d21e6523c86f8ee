//! `pulse bench coldstart`: each Lambda function's init, beside a hello-world
//! lambda_runtime binary built with the same profile, in the same run.
//!
//! Init is measured as Lambda sees it: from spawning the process to its first request
//! for work (`GET /2018-06-01/runtime/invocation/next`) on a local runtime API, which
//! includes reading the configuration and building every client. The runtime API here
//! never answers that request; the process is killed once it has asked. Runs go round
//! robin over the binaries, so a noisy moment costs every binary alike. The functions
//! are configured as in the template (table, queues, region) minus `PULSE_SECRETS_PATH`:
//! with it, init builds nothing and the first invocation pays for the set-up.

use crate::output::outln;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use serde_json::json;
use tokio::sync::mpsc;

use super::hooks::pct;
use crate::Failure;
use crate::output::Out;

/// The binaries measured; the first is the baseline.
const BINARIES: [&str; 5] = [
    "hello-lambda",
    "heartbeat-sweeper",
    "conversation-worker",
    "webhook-receiver",
    "hook-dispatcher",
];

/// The release binaries beside the running `pulse`, or in `dir`.
fn binary_dir(dir: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(d) = dir {
        return Ok(d);
    }
    let exe = std::env::current_exe()?;
    Ok(exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// Spawns `bin` against the runtime API at `api`; the time until it asks for work.
async fn one_init(
    bin: &Path,
    api: &str,
    arrivals: &mut mpsc::UnboundedReceiver<Instant>,
) -> Result<Duration, Failure> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", api)
        .env("AWS_LAMBDA_FUNCTION_NAME", "coldstart")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/coldstart")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "2026/11/23/[$LATEST]0")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "AKIDCOLDSTART")
        .env("AWS_SECRET_ACCESS_KEY", "coldstart")
        .env("AWS_SESSION_TOKEN", "coldstart")
        .env("PULSE_TABLE", "pulse-Table")
        .env(
            "PULSE_SESSIONS_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/pulse-sessions.fifo",
        )
        .env(
            "PULSE_HOOKS_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/pulse-hooks",
        )
        .env(
            "PULSE_HOOKS_DLQ_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/pulse-hooks-dlq",
        )
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    while arrivals.try_recv().is_ok() {}
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::Runtime(anyhow::anyhow!("cannot start {}: {e}", bin.display())))?;
    let outcome = tokio::select! {
        at = arrivals.recv() => Ok(at.map(|t| t.duration_since(started))),
        status = child.wait() => Err(status),
        _ = tokio::time::sleep(Duration::from_secs(20)) => Ok(None),
    };
    let _ = child.start_kill();
    let out = child.wait_with_output().await?;
    match outcome {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(Failure::Runtime(anyhow::anyhow!(
            "{} did not ask for work within 20 s",
            bin.display()
        ))),
        Err(status) => Err(Failure::Runtime(anyhow::anyhow!(
            "{} exited during init ({:?}): {}",
            bin.display(),
            status.ok(),
            String::from_utf8_lossy(&out.stderr)
        ))),
    }
}

/// Runs the benchmark: `runs` inits of each binary.
pub(crate) async fn coldstart(runs: usize, dir: Option<PathBuf>, out: &Out) -> Result<(), Failure> {
    if runs == 0 {
        return Err(Failure::Input("invalid runs: give at least 1".into()));
    }
    let dir = binary_dir(dir)?;
    let mut bins = Vec::new();
    for name in BINARIES {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(Failure::Input(format!(
                "{} is missing: build the functions and the baseline with the release profile first:\n  \
                 cargo build --release -p heartbeat-sweeper -p conversation-worker -p webhook-receiver -p hook-dispatcher -p hello-lambda -p pulse-cli\n\
                 then run target/release/pulse bench coldstart (or give --bin-dir)",
                path.display()
            )));
        }
        bins.push(path);
    }

    let (tx, mut arrivals) = mpsc::unbounded_channel();
    let tx = Arc::new(tx);
    let app = Router::new().route(
        "/2018-06-01/runtime/invocation/next",
        get(move || {
            let _ = tx.send(Instant::now());
            // Never answered: the process is killed once it has asked.
            std::future::pending::<&'static str>()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = listener.local_addr()?.to_string();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // One unmeasured round warms the page cache.
    for b in &bins {
        one_init(b, &api, &mut arrivals).await?;
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); bins.len()];
    for _ in 0..runs {
        for (i, b) in bins.iter().enumerate() {
            times[i].push(one_init(b, &api, &mut arrivals).await?.as_secs_f64() * 1e3);
        }
    }
    server.abort();
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    let base = pct(&times[0], 0.5);
    let rows: Vec<_> = BINARIES
        .iter()
        .zip(&times)
        .zip(&bins)
        .map(|((name, t), path)| {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            json!({
                "binary": name,
                "p50_ms": pct(t, 0.5),
                "p90_ms": pct(t, 0.9),
                "ratio_p50": pct(t, 0.5) / base,
                "size_bytes": size,
            })
        })
        .collect();
    if out.json {
        out.json_value(&json!({ "runs": runs, "binaries": rows }));
    } else {
        outln!("init, process start → first request for work, {runs} runs each (round robin):");
        outln!(
            "{:<22} {:>9} {:>9} {:>12} {:>10}",
            "binary",
            "p50 ms",
            "p90 ms",
            "× hello p50",
            "size MB"
        );
        for r in &rows {
            outln!(
                "{:<22} {:>9.2} {:>9.2} {:>12.2} {:>10.1}",
                r["binary"].as_str().unwrap_or_default(),
                r["p50_ms"].as_f64().unwrap_or_default(),
                r["p90_ms"].as_f64().unwrap_or_default(),
                r["ratio_p50"].as_f64().unwrap_or_default(),
                r["size_bytes"].as_f64().unwrap_or_default() / 1e6
            );
        }
    }
    Ok(())
}
