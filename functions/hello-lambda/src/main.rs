//! Hello world on lambda_runtime: echoes its event. The baseline that `pulse bench
//! coldstart` compares each function's init with (same release profile, same runtime).

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(event.payload)
    }))
    .await
}
