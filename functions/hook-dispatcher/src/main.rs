//! Lambda: SQS batch from the hooks queue → signed POSTs to hook URLs (or PutEvents to
//! EventBridge), one attempt per message. Retries are new messages with a delay, so a
//! slow receiver never holds this function; only storage or queue failures are reported
//! back for redelivery.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use pulse_shared::app::connect_aws;
use pulse_shared::engine::DispatchSettings;
use pulse_shared::lambda::{Metrics, Ready, function};
use pulse_shared::ports::SystemClock;
use pulse_shared::{lambda, telemetry};

// Lambda sends one invocation at a time, and below 1,769 MB gives less than a vCPU:
// a single-thread runtime does the same work without starting worker threads at init.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let traces = telemetry::init(
        telemetry::LogFormat::Json,
        function::service(function::DISPATCHER),
    )?;
    let metrics = Metrics::install(function::DISPATCHER)?.with_traces(traces);
    let dispatcher = Ready::new(|vars| async move {
        let config = vars.env().lambda()?;
        let clock = Arc::new(SystemClock);
        connect_aws(&config)
            .await?
            .dispatcher(
                clock,
                &pulse_shared::app::egress(&config),
                DispatchSettings::default(),
            )
            .ok_or_else(|| {
                "PULSE_HOOKS_QUEUE_URL is not set: the hook dispatcher needs the hooks queue".into()
            })
    })
    .await?;
    run(service_fn(|event: LambdaEvent<SqsEvent>| {
        metrics.around(async {
            let dispatcher = dispatcher.get().await?;
            Ok::<_, Error>(lambda::hooks_batch(dispatcher, event.payload).await)
        })
    }))
    .await
}
