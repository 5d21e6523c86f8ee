//! Lambda: the Function URL → the shared axum router (Discord interactions, signed
//! webhooks, health). Requests are authenticated by their signatures, so the URL's auth
//! is NONE; the caller's address comes from the request context.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use lambda_http::request::RequestContext;
use lambda_http::{Error, run, service_fn};
use pulse_shared::app::connect_aws;
use pulse_shared::http::{ClientIp, Inbound, router};
use pulse_shared::lambda::{Metrics, Ready, function};
use pulse_shared::ports::SystemClock;
use pulse_shared::telemetry;
use tower::ServiceExt;

/// Records the Function URL's `requestContext.http.sourceIp` as the request's client.
async fn source_ip(mut req: Request, next: Next) -> Response {
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.extensions().get::<RequestContext>()
        && let Some(ip) = ctx.http.source_ip.clone()
    {
        req.extensions_mut().insert(ClientIp(ip));
    }
    next.run(req).await
}

// Lambda sends one invocation at a time, and below 1,769 MB gives less than a vCPU:
// a single-thread runtime does the same work without starting worker threads at init.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let traces = telemetry::init(
        telemetry::LogFormat::Json,
        function::service(function::RECEIVER),
    )?;
    let metrics = Metrics::install(function::RECEIVER)?.with_traces(traces);
    let app = Ready::new(|vars| async move {
        let config = vars.env().lambda()?;
        let clock = Arc::new(SystemClock);
        let backend = connect_aws(&config).await?;
        let inbound = Inbound::new(backend.store, backend.queue, clock, config.inbound);
        Ok::<Router, Error>(router(Arc::new(inbound)).layer(middleware::from_fn(source_ip)))
    })
    .await?;
    run(service_fn(|req: lambda_http::Request| {
        metrics.around(async {
            let app = app.get().await?.clone();
            Ok::<_, Error>(app.oneshot(req.map(axum::body::Body::new)).await?)
        })
    }))
    .await
}
