//! Lambda handlers: event shape in, one engine call, response shape out. Each function's
//! `main` only builds the engine and hands these to `lambda_runtime::run`, so tests call
//! them with real event payloads.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use futures::future::BoxFuture;
use jiff::Timestamp;
use tokio::sync::OnceCell;
use tracing::{error, info};

use crate::adapters::aws::SecretParameters;
use crate::config::Env;
use crate::domain::{Delivery, Retention};
use crate::engine::{Dispatcher, PruneReport, SweepReport, Sweeper, Worker};
use crate::ports::{SessionQueue, Store};

/// What a function's set-up or handler fails with (`lambda_runtime::Error`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The variables a function is configured by: the process environment, overlaid with
/// the secrets read from SSM Parameter Store (`PULSE_SECRETS_PATH`).
#[derive(Clone, Debug, Default)]
pub struct Vars(Arc<BTreeMap<String, String>>);

impl Vars {
    /// Only the process environment.
    pub fn process() -> Self {
        Self::default()
    }

    /// The environment with `secrets` over it.
    pub fn with_secrets(secrets: BTreeMap<String, String>) -> Self {
        Self(Arc::new(secrets))
    }

    /// The configuration reader over these variables.
    pub fn env(
        &self,
    ) -> Env<impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static + use<>> {
        let secrets = self.0.clone();
        Env(move |k: &str| {
            secrets
                .get(k)
                .cloned()
                .or_else(|| std::env::var(k).ok())
                .filter(|v| !v.is_empty())
        })
    }
}

type Build<T> = Box<dyn Fn(Vars) -> BoxFuture<'static, Result<T, BoxError>> + Send + Sync>;

/// A function's engine, built from its configuration. Without `PULSE_SECRETS_PATH` it is
/// built during init, from the environment. With it, init makes no network call: the
/// secrets are read (one `GetParametersByPath`) and the engine built on the first
/// invocation; a failure fails that invocation and the next one tries again.
pub struct Ready<T> {
    cell: OnceCell<T>,
    secrets: Option<SecretParameters>,
    build: Build<T>,
}

impl<T> Ready<T> {
    /// Set-up: `build` makes the engine from the variables.
    pub async fn new<F, Fut>(build: F) -> Result<Self, BoxError>
    where
        F: Fn(Vars) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let secrets = match var("PULSE_SECRETS_PATH") {
            Some(path) => {
                Some(SecretParameters::new(&path, var("AWS_ENDPOINT_URL").as_deref()).await?)
            }
            None => None,
        };
        let ready = Self {
            cell: OnceCell::new(),
            secrets,
            build: Box::new(move |vars| Box::pin(build(vars))),
        };
        if ready.secrets.is_none() {
            ready.get().await?;
        }
        Ok(ready)
    }

    /// The engine, built now if it is not yet.
    pub async fn get(&self) -> Result<&T, BoxError> {
        self.cell
            .get_or_try_init(|| async {
                let vars = match &self.secrets {
                    None => Vars::process(),
                    Some(s) => {
                        let secrets = s.load().await?;
                        info!(
                            path = s.path(),
                            variables = ?secrets.keys().collect::<Vec<_>>(),
                            "secrets read from SSM Parameter Store"
                        );
                        Vars::with_secrets(secrets)
                    }
                };
                (self.build)(vars).await
            })
            .await
    }
}

/// The Embedded Metric Format collector of one function: what the engine records
/// during an invocation, printed to stdout after it as one JSON line per label set,
/// which CloudWatch Logs turns into metrics in the namespace `PULSE_METRICS_NAMESPACE`
/// (default `Pulse`), with the dimension `function`. No API call is made.
///
/// It also sends the invocation's traces, when they are on, before the invocation
/// returns: Lambda may freeze the process as soon as it has.
pub struct Metrics(
    &'static metrics_cloudwatch_embedded::Collector,
    crate::traces::Traces,
);

/// The function dimension of each Lambda function's metrics.
pub mod function {
    /// The heartbeat sweeper (and the retention pass).
    pub const SWEEPER: &str = "sweeper";
    /// The conversation worker: heartbeat jobs and turns.
    pub const WORKER: &str = "worker";
    /// The webhook receiver.
    pub const RECEIVER: &str = "receiver";
    /// The hook dispatcher.
    pub const DISPATCHER: &str = "dispatcher";

    /// The service name of `function`'s traces: `pulse-sweeper`, `pulse-worker`…
    pub fn service(function: &str) -> &'static str {
        match function {
            SWEEPER => "pulse-sweeper",
            WORKER => "pulse-worker",
            RECEIVER => "pulse-receiver",
            DISPATCHER => "pulse-dispatcher",
            _ => "pulse",
        }
    }
}

impl Metrics {
    /// Installs the process's metrics recorder for `function` (one of [`function`]).
    /// Fails when a recorder is installed already.
    pub fn install(function: &'static str) -> Result<Self, BoxError> {
        let namespace = std::env::var("PULSE_METRICS_NAMESPACE")
            .ok()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "Pulse".to_owned());
        let collector = metrics_cloudwatch_embedded::Builder::new()
            .cloudwatch_namespace(namespace)
            .with_dimension("function", function)
            .init()?;
        crate::meter::describe();
        Ok(Self(collector, crate::traces::Traces::default()))
    }

    /// Sends `traces` too after each invocation.
    pub fn with_traces(self, traces: crate::traces::Traces) -> Self {
        Self(self.0, traces)
    }

    /// Writes what was recorded since the last flush as EMF lines, and starts again
    /// from zero (counters and histograms; gauges keep their last value).
    pub fn flush_to(&self, out: impl std::io::Write) -> std::io::Result<()> {
        self.0.flush(out)
    }

    /// Runs one invocation, then prints its metrics to stdout and sends its traces
    /// (whatever it returned).
    pub async fn around<F: Future>(&self, invocation: F) -> F::Output {
        let out = invocation.await;
        if let Err(e) = self.flush_to(std::io::stdout().lock()) {
            error!(error = %e, "the invocation's metrics could not be written");
        }
        self.1.flushed().await;
        out
    }
}

/// A sweep that met problems. Returned to Lambda so the invocation counts as an error
/// (alarms see it); the next scheduled sweep retries whatever was missed.
#[derive(Debug, thiserror::Error)]
#[error("the sweep met {count} problems (each logged); claimed {claimed}, queued {queued}")]
pub struct SweepFailed {
    /// Problems met.
    pub count: usize,
    /// Heartbeats claimed anyway.
    pub claimed: usize,
    /// Jobs queued anyway.
    pub queued: usize,
}

/// EventBridge's scheduled event → one sweep at `now`.
pub async fn sweep(
    sweeper: &Sweeper,
    _event: CloudWatchEvent,
    now: Timestamp,
) -> Result<SweepReport, SweepFailed> {
    let report = sweeper.sweep_once(now).await;
    if report.errors.is_empty() {
        return Ok(report);
    }
    for e in &report.errors {
        error!(error = %e, "sweep problem");
    }
    Err(SweepFailed {
        count: report.errors.len(),
        claimed: report.claimed,
        queued: report.queued,
    })
}

/// The `detail-type` of the sweeper's daily scheduled event, which runs the retention
/// pass instead of a sweep.
pub const RETENTION_DETAIL_TYPE: &str = "Pulse Retention";

/// Whether a scheduled event asks for the retention pass.
pub fn is_retention(event: &CloudWatchEvent) -> bool {
    event.detail_type.as_deref() == Some(RETENTION_DETAIL_TYPE)
}

/// The daily pass failed: the agents could not be listed, some agents' records could
/// not be pruned (each logged; the rest were, and the next day's pass tries them again),
/// or the consolidations could not be queued. The invocation fails so the function's
/// error alarm sees it.
#[derive(Debug, thiserror::Error)]
pub enum PruneFailed {
    /// The store could not be read.
    #[error("the retention pass could not start: {0}")]
    Store(#[from] crate::error::StoreError),
    /// Some agents were not pruned.
    #[error("{failed} of {agents} agents could not be pruned (each logged)")]
    Agents {
        /// Agents not pruned.
        failed: usize,
        /// Agents looked at.
        agents: u64,
    },
    /// The memory consolidations could not be queued (the records were pruned).
    #[error("the daily consolidation of memories could not be queued: {0}")]
    Consolidations(#[source] crate::error::StoreError),
}

/// What the daily pass did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DailyReport {
    /// The retention pass.
    #[serde(flatten)]
    pub retention: PruneReport,
    /// Agents whose memory consolidation was queued for the worker.
    pub consolidations_queued: usize,
}

/// The daily scheduled event → the retention pass at `now` (see [`crate::engine::prune`]),
/// and each agent's memory consolidation queued on the sessions queue for the worker,
/// which has the model (see [`crate::engine::memory::queue_consolidations`]).
pub async fn retention(
    store: &dyn Store,
    queue: &dyn SessionQueue,
    retention: Retention,
    now: Timestamp,
) -> Result<DailyReport, PruneFailed> {
    let queued = crate::engine::memory::queue_consolidations(store, queue, now).await;
    let report = crate::engine::prune(store, retention, now, true).await?;
    if !report.failed.is_empty() {
        return Err(PruneFailed::Agents {
            failed: report.failed.len(),
            agents: report.agents,
        });
    }
    let consolidations_queued = queued.map_err(PruneFailed::Consolidations)?;
    info!(
        agents = consolidations_queued,
        "queued the daily consolidation of memories"
    );
    Ok(DailyReport {
        retention: report,
        consolidations_queued,
    })
}

/// An SQS FIFO batch → the tasks run in order per group; the response lists the
/// messages Lambda must leave on the queue (a failed one and the rest of its group).
pub async fn sessions_batch(worker: &Worker, event: SqsEvent) -> SqsBatchResponse {
    let batch: Vec<Delivery> = event.records.iter().map(delivery).collect();
    let outcome = worker.process_batch(&batch).await;
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = outcome
        .failed
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id.to_string();
            f
        })
        .collect();
    resp
}

/// An SQS batch from the hooks queue → one attempt per message (a retry is a new
/// message with a delay); the response lists only messages that failed for a reason
/// outside the delivery (storage or queue unavailable), which SQS brings back.
pub async fn hooks_batch(dispatcher: &Dispatcher, event: SqsEvent) -> SqsBatchResponse {
    let batch: Vec<Delivery> = event.records.iter().map(delivery).collect();
    let report = dispatcher.process_batch(&batch).await;
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = report
        .failed
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id.to_string();
            f
        })
        .collect();
    resp
}

/// An SQS record as a queue delivery. Lambda's event source mapping receives and deletes
/// messages itself, so the receipt is only informative here.
pub fn delivery(m: &SqsMessage) -> Delivery {
    let attr = |k: &str| m.attributes.get(k).cloned().unwrap_or_default();
    Delivery {
        message_id: m.message_id.clone().unwrap_or_default().into(),
        receipt: m.receipt_handle.clone().unwrap_or_default().into(),
        group: attr("MessageGroupId"),
        body: m.body.clone().unwrap_or_default(),
        receive_count: attr("ApproximateReceiveCount").parse().unwrap_or(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_override_the_environment_and_feed_the_configuration() {
        let secrets = BTreeMap::from([
            ("PULSE_HOOKS_ALLOW".to_owned(), "10.1.2.3/32".to_owned()),
            ("PULSE_CASCADE_DEPTH".to_owned(), "7".to_owned()),
        ]);
        let env = Vars::with_secrets(secrets).env();
        assert!(
            env.hooks()
                .unwrap()
                .allow
                .contains("10.1.2.3".parse().unwrap())
        );
        assert_eq!(env.engine().unwrap().cascade_depth, 7);
        // An empty secret counts as unset, as an empty variable does.
        let env = Vars::with_secrets(BTreeMap::from([(
            "PULSE_CASCADE_DEPTH".to_owned(),
            String::new(),
        )]))
        .env();
        assert_eq!(
            env.engine().unwrap().cascade_depth,
            crate::engine::EngineSettings::default().cascade_depth
        );
    }

    #[tokio::test]
    async fn a_secrets_path_must_be_an_ssm_path() {
        for bad in ["pulse", "", "/"] {
            let err = SecretParameters::new(bad, Some("http://127.0.0.1:9"))
                .await
                .unwrap_err();
            assert!(err.to_string().contains("PULSE_SECRETS_PATH"), "{err}");
        }
        let ok = SecretParameters::new("/pulse/prod/", Some("http://127.0.0.1:9"))
            .await
            .unwrap();
        assert_eq!(ok.path(), "/pulse/prod");
    }
}
