//! Lambda: EventBridge `rate(1 minute)` → one sweep: due heartbeats are claimed and their
//! jobs queued on the sessions FIFO queue.

use std::sync::Arc;

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use pulse_shared::adapters::connect;
use pulse_shared::config::Env;
use pulse_shared::ports::SystemClock;
use pulse_shared::{lambda, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init(telemetry::LogFormat::Json);
    let config = Env::process().lambda()?;
    let sweeper = connect(&config, Arc::new(SystemClock))
        .await?
        .sweeper(&config.engine);
    run(service_fn(|event: LambdaEvent<CloudWatchEvent>| async {
        lambda::sweep(&sweeper, event.payload, jiff::Timestamp::now())
            .await
            .map_err(Error::from)
    }))
    .await
}
