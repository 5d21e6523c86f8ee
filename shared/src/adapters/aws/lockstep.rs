//! HTTP in lockstep with a simulated clock: every request the SDK sends is carried out on
//! a thread of its own while the calling thread waits for the whole answer, for the
//! simulation on the AWS backend (the `faults` feature; never built into the Lambda
//! functions).
//!
//! The simulation runs on one thread whose tokio clock is paused and jumps to the next
//! timer whenever every task waits. A request to the emulator would look like such a
//! wait: the clock would jump minutes ahead while the emulator worked for a millisecond,
//! and leases, timeouts and schedules would run out that never should. Here the
//! calling thread blocks instead, so virtual time stands still for the length of a
//! request, and no other task runs meanwhile: requests go out one at a time, in the
//! order the simulation's tasks make them, which the seed decides. The answer's body
//! is read whole on the I/O thread, so nothing of the request is left to wait for.
//!
//! The SDK's own timers (retry backoff, operation timeouts) still run on the calling
//! thread, on virtual time, as the engine's do.

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::shared::IntoShared;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;

type Answer = Result<HttpResponse, ConnectorError>;
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The I/O thread: it carries out the requests of every client [`LockstepIo::wrap`]
/// makes, and stops when the last of them is dropped.
#[derive(Debug, Clone)]
pub struct LockstepIo {
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

impl LockstepIo {
    /// Starts the I/O thread.
    pub fn start() -> std::io::Result<Self> {
        let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("pulse-lockstep-io".into())
            .spawn(move || {
                rt.block_on(async move {
                    while let Some(job) = queue.recv().await {
                        job.await;
                    }
                })
            })?;
        Ok(Self { jobs })
    }

    /// `inner` (the real client, or one injecting faults) in lockstep: its requests
    /// run on this thread while their caller blocks.
    pub fn wrap(&self, inner: SharedHttpClient) -> SharedHttpClient {
        Lockstep {
            inner,
            jobs: self.jobs.clone(),
        }
        .into_shared()
    }
}

/// An HTTP client whose requests run to completion on the I/O thread while the caller
/// blocks.
#[derive(Debug)]
struct Lockstep {
    inner: SharedHttpClient,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

impl HttpClient for Lockstep {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        LockstepConnector {
            inner: self.inner.http_connector(settings, components),
            jobs: self.jobs.clone(),
        }
        .into_shared()
    }
}

#[derive(Debug)]
struct LockstepConnector {
    inner: SharedHttpConnector,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

impl HttpConnector for LockstepConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        // The inner connector decides here, on the calling thread and in call order,
        // what the request meets (the fault plan draws at this point).
        let pending = self.inner.call(request);
        let (reply, answer) = mpsc::sync_channel::<Answer>(1);
        let job: Job = Box::pin(async move {
            let _ = reply.send(whole(pending.await).await);
        });
        let answer = match self.jobs.send(job) {
            Ok(()) => answer.recv().unwrap_or_else(|_| {
                Err(ConnectorError::other(
                    "the lockstep I/O thread stopped during the request".into(),
                    None,
                ))
            }),
            Err(_) => Err(ConnectorError::other(
                "the lockstep I/O thread has stopped".into(),
                None,
            )),
        };
        HttpConnectorFuture::ready(answer)
    }
}

/// The answer with its body read to the end, so the caller has nothing left to wait on.
async fn whole(answer: Answer) -> Answer {
    let response = answer?;
    let (status, headers, body) = (response.status(), response.headers().clone(), response);
    let bytes = ByteStream::new(body.into_body())
        .collect()
        .await
        .map_err(|e| ConnectorError::io(e.into()))?
        .into_bytes();
    let mut r = HttpResponse::new(status, SdkBody::from(bytes));
    *r.headers_mut() = headers;
    Ok(r)
}
