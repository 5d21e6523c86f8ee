//! Lambda: EventBridge `rate(1 minute)` → one sweep: due heartbeats are claimed and their
//! jobs queued on the sessions FIFO queue.

use std::sync::Arc;

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use pulse_shared::app::connect;
use pulse_shared::lambda::Ready;
use pulse_shared::ports::SystemClock;
use pulse_shared::{lambda, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init(telemetry::LogFormat::Json);
    let sweeper = Ready::new(|vars| async move {
        let config = vars.env().lambda()?;
        let connected = connect(&config, Arc::new(SystemClock)).await?;
        Ok(connected.sweeper(&config.engine))
    })
    .await?;
    run(service_fn(|event: LambdaEvent<CloudWatchEvent>| async {
        let sweeper = sweeper.get().await?;
        lambda::sweep(sweeper, event.payload, jiff::Timestamp::now())
            .await
            .map_err(Error::from)
    }))
    .await
}
