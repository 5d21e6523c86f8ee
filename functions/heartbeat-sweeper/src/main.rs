//! Lambda: EventBridge `rate(1 minute)` → one sweep: due heartbeats are claimed and their
//! jobs queued on the sessions FIFO queue. Its daily event (`detail-type`
//! `Pulse Retention`) runs the retention pass instead, and queues each agent's memory
//! consolidation for the worker.

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use pulse_shared::app::connect_aws;
use pulse_shared::lambda::{Metrics, Ready, function};
use pulse_shared::{lambda, telemetry};

// Lambda sends one invocation at a time, and below 1,769 MB gives less than a vCPU:
// a single-thread runtime does the same work without starting worker threads at init.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let traces = telemetry::init(
        telemetry::LogFormat::Json,
        function::service(function::SWEEPER),
    )?;
    let metrics = Metrics::install(function::SWEEPER)?.with_traces(traces);
    let ready = Ready::new(|vars| async move {
        let config = vars.env().lambda()?;
        let connected = connect_aws(&config).await?;
        let sweeper = connected.sweeper(&config.engine);
        Ok((sweeper, connected.store, connected.queue, config.retention))
    })
    .await?;
    run(service_fn(|event: LambdaEvent<CloudWatchEvent>| {
        metrics.around(async {
            let (sweeper, store, queue, retention) = ready.get().await?;
            let now = jiff::Timestamp::now();
            if lambda::is_retention(&event.payload) {
                let report =
                    lambda::retention(store.as_ref(), queue.as_ref(), *retention, now).await?;
                return Ok::<_, Error>(serde_json::to_value(report)?);
            }
            let report = lambda::sweep(sweeper, event.payload, now).await?;
            Ok(serde_json::to_value(report)?)
        })
    }))
    .await
}
