//! Lambda: SQS FIFO batch from the sessions queue → heartbeat jobs and conversation turns
//! in order per session; failures are reported per message so Lambda redelivers a failed
//! message and the rest of its group, and nothing else.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use pulse_shared::app::{Services, connect_aws};
use pulse_shared::lambda::{Metrics, Ready, function};
use pulse_shared::ports::SystemClock;
use pulse_shared::{lambda, telemetry};

// Lambda sends one invocation at a time, and below 1,769 MB gives less than a vCPU:
// a single-thread runtime does the same work without starting worker threads at init.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let traces = telemetry::init(
        telemetry::LogFormat::Json,
        function::service(function::WORKER),
    )?;
    let metrics = Metrics::install(function::WORKER)?.with_traces(traces);
    let worker = Ready::new(|vars| async move {
        let config = vars.env().lambda()?;
        let clock = Arc::new(SystemClock);
        let connected = connect_aws(&config).await?;
        Ok(connected.worker(clock, &config.engine, &Services::from_config(&config)))
    })
    .await?;
    run(service_fn(|event: LambdaEvent<SqsEvent>| {
        metrics.around(async {
            let worker = worker.get().await?;
            Ok::<_, Error>(lambda::sessions_batch(worker, event.payload).await)
        })
    }))
    .await
}
