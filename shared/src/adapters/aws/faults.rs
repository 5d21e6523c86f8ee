//! Faults injected under the real SDK clients, at their HTTP layer: what a busy or
//! flaky AWS does to a request, for the tests and the simulation (never built into the
//! Lambda functions: the `faults` feature).
//!
//! A [`FaultPlan`] decides, request by request, whether one goes through untouched or
//! meets a fault:
//! - **throttled** — answered `400` with the service's throttling error, as AWS does
//!   when a partition or queue is too busy; nothing was done;
//! - **server error** — answered `500`; nothing was done;
//! - **reset** — the connection breaks before the request is sent; nothing was done;
//! - **lost answer** — the request goes through to the service, which does the work
//!   (a conditional write commits, a message is queued), and then the answer is lost,
//!   as a timeout. This is the case that tells a correct adapter from one that only
//!   looks correct: the SDK sends the request again, and the service sees it twice.
//!
//! The SDK's own retries run above this layer, as they would against AWS.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_runtime_api::shared::IntoShared;
use aws_smithy_types::body::SdkBody;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// Answered with the service's throttling error.
    Throttled,
    /// Answered `500`.
    ServerError,
    /// The connection broke before the request was sent.
    Reset,
    /// The request was done, and its answer lost.
    LostAnswer,
}

impl Fault {
    /// Every kind, for reports.
    pub const ALL: [Fault; 4] = [
        Fault::Throttled,
        Fault::ServerError,
        Fault::Reset,
        Fault::LostAnswer,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::ServerError => "server error",
            Self::Reset => "connection reset before sending",
            Self::LostAnswer => "answer lost after the request was done",
        }
    }
}

/// Which requests meet which faults: ones a test names (the next request of an
/// operation), and a share of all requests from a seed.
#[derive(Default)]
pub struct FaultPlan {
    state: Mutex<PlanState>,
}

#[derive(Default)]
struct PlanState {
    /// (operation, fault), each met once by the next request of that operation.
    next: Vec<(String, Fault)>,
    /// Faults met so far, by kind.
    met: BTreeMap<Fault, u64>,
    /// Requests seen, by operation.
    seen: BTreeMap<String, u64>,
    /// A share of all requests, from a seed: (xorshift state, per-million rates).
    random: Option<(u64, [(Fault, u32); 4])>,
}

impl FaultPlan {
    /// No faults until some are asked for.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The next request of `operation` (`UpdateItem`, `SendMessageBatch`, ...) meets
    /// `fault`; several such wait their turn.
    pub fn next(&self, operation: &str, fault: Fault) {
        self.lock().next.push((operation.to_owned(), fault));
    }

    /// From now on, each request meets each fault with the given share (per million),
    /// drawn from `seed`: the same seed and requests meet the same faults.
    pub fn random(&self, seed: u64, per_million: [(Fault, u32); 4]) {
        self.lock().random = Some((seed.max(1), per_million));
    }

    /// No more faults: the scripted ones still waiting and the seeded share are dropped
    /// (what was met and seen is kept).
    pub fn calm(&self) {
        let mut s = self.lock();
        s.next.clear();
        s.random = None;
    }

    /// Faults met so far, by kind.
    pub fn met(&self) -> BTreeMap<Fault, u64> {
        self.lock().met.clone()
    }

    /// Requests seen so far of `operation`.
    pub fn seen(&self, operation: &str) -> u64 {
        self.lock().seen.get(operation).copied().unwrap_or(0)
    }

    /// Requests seen so far, by operation (each retry of the SDK counts).
    pub fn seen_all(&self) -> BTreeMap<String, u64> {
        self.lock().seen.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, operation: &str) -> Option<Fault> {
        let mut s = self.lock();
        *s.seen.entry(operation.to_owned()).or_default() += 1;
        let fault = match s.next.iter().position(|(op, _)| op == operation) {
            Some(i) => Some(s.next.remove(i).1),
            None => s.random.as_mut().and_then(|(state, rates)| {
                // xorshift64*: small, seeded, and the same on every machine.
                *state ^= *state >> 12;
                *state ^= *state << 25;
                *state ^= *state >> 27;
                let draw = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 1_000_000;
                let mut edge = 0;
                let drawn = rates.iter().find_map(|(f, r)| {
                    edge += u64::from(*r);
                    (draw < edge).then_some(*f)
                });
                // A receive whose answer is lost leaves the messages it took in flight,
                // out of every receiver's sight, until their visibility timeout: on the
                // emulator's real time, minutes, while a run on the injected clock lasts
                // seconds, and their FIFO groups wait behind them. SQS brings them back
                // by itself (no code of Pulse's is involved), so a drawn one meets a
                // reset instead: nothing is taken.
                match (drawn, operation) {
                    (Some(Fault::LostAnswer), "ReceiveMessage") => Some(Fault::Reset),
                    (f, _) => f,
                }
            }),
        };
        if let Some(f) = fault {
            *s.met.entry(f).or_default() += 1;
        }
        fault
    }
}

/// An HTTP client that passes requests to `inner` through `plan`.
#[derive(Debug)]
pub struct FaultyHttp {
    inner: SharedHttpClient,
    plan: Arc<FaultPlan>,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultPlan").finish_non_exhaustive()
    }
}

impl FaultyHttp {
    /// `inner` (the real client) under `plan`.
    pub fn shared(inner: SharedHttpClient, plan: Arc<FaultPlan>) -> SharedHttpClient {
        Self { inner, plan }.into_shared()
    }
}

impl HttpClient for FaultyHttp {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        FaultyConnector {
            inner: self.inner.http_connector(settings, components),
            plan: self.plan.clone(),
        }
        .into_shared()
    }
}

#[derive(Debug)]
struct FaultyConnector {
    inner: SharedHttpConnector,
    plan: Arc<FaultPlan>,
}

impl HttpConnector for FaultyConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        // `DynamoDB_20120810.UpdateItem`, `AmazonSQS.SendMessageBatch`: the operation.
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let sqs = target.starts_with("AmazonSQS");
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        let fault = self.plan.take(&operation);
        let inner = self.inner.clone();
        HttpConnectorFuture::new(async move {
            match fault {
                None => inner.call(request).await,
                Some(Fault::Throttled) => {
                    let code = if sqs {
                        "ThrottlingException"
                    } else {
                        "ProvisionedThroughputExceededException"
                    };
                    Ok(answer(400, code, "injected: the request rate is too high"))
                }
                Some(Fault::ServerError) => Ok(answer(
                    500,
                    "InternalServerError",
                    "injected: internal server error",
                )),
                Some(Fault::Reset) => Err(ConnectorError::io(
                    "injected: the connection was reset before the request was sent".into(),
                )),
                Some(Fault::LostAnswer) => {
                    // Done by the service; its answer never arrives.
                    let _ = inner.call(request).await;
                    Err(ConnectorError::timeout(
                        "injected: the request was done and its answer lost".into(),
                    ))
                }
            }
        })
    }
}

/// An error answer in the AWS JSON protocols' shape.
fn answer(status: u16, code: &str, message: &str) -> Response<SdkBody> {
    let body = serde_json::json!({"__type": code, "message": message}).to_string();
    let mut r = Response::new(
        StatusCode::try_from(status).expect("a valid status"),
        SdkBody::from(body),
    );
    r.headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    r.headers_mut()
        .insert("x-amzn-query-error", format!("{code};Sender"));
    r
}
