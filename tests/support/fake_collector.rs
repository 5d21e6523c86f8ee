//! An OpenTelemetry collector on loopback: a real HTTP server taking OTLP/HTTP trace
//! exports (`POST /v1/traces`, protobuf), decoded with the official protobuf
//! definitions (`opentelemetry-proto`), and keeping each span with its resource and
//! scope.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

/// One span as the collector received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// The trace id, 32 hex digits.
    pub trace_id: String,
    /// The span id, 16 hex digits.
    pub span_id: String,
    /// The parent's span id; empty at a trace's root.
    pub parent_id: String,
    /// Its name.
    pub name: String,
    /// Its kind: 1 internal, 2 server, 3 client (OTLP's numbering).
    pub kind: i32,
    /// Its status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// When it started, in nanoseconds since the epoch.
    pub start: u64,
    /// Its attributes, as JSON values (strings, numbers, booleans, arrays).
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// The `service.name` of its resource.
    pub service: String,
    /// Its instrumentation scope's name and schema URL.
    pub scope: (String, String),
}

impl Received {
    /// The attribute `key` as text (a number as its digits); empty when absent.
    pub fn text(&self, key: &str) -> String {
        match self.attributes.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }

    /// The attribute `key` as a number.
    pub fn number(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(serde_json::Value::as_i64)
    }
}

/// The collector.
#[derive(Clone)]
pub struct FakeCollector {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    exports: Arc<Mutex<Vec<HeaderMap>>>,
}

impl FakeCollector {
    /// Starts the collector on a free loopback port.
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let exports = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state((spans.clone(), exports.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            spans,
            exports,
        }
    }

    /// The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` names it.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The traces URL (`…/v1/traces`).
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.url)
    }

    /// Every span received, in the order received.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The headers of each export request.
    pub fn exports(&self) -> Vec<HeaderMap> {
        self.exports.lock().unwrap().clone()
    }
}

type Shared = (Arc<Mutex<Vec<Received>>>, Arc<Mutex<Vec<HeaderMap>>>);

async fn export(
    State((spans, exports)): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let is_protobuf = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    if !is_protobuf {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
    }
    exports.lock().unwrap().push(headers);
    let mut kept = spans.lock().unwrap();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(|v| value(v).as_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        for ss in rs.scope_spans {
            let scope = (
                ss.scope
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                ss.schema_url.clone(),
            );
            for span in ss.spans {
                kept.push(Received {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    status: span.status.map(|s| s.code).unwrap_or_default(),
                    start: span.start_time_unix_nano,
                    attributes: attributes(&span.attributes),
                    service: service.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, serde_json::Value> {
    kvs.iter()
        .filter_map(|kv| Some((kv.key.clone(), value(kv.value.as_ref()?))))
        .collect()
}

fn value(v: &AnyValue) -> serde_json::Value {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone().into(),
        Some(any_value::Value::BoolValue(b)) => (*b).into(),
        Some(any_value::Value::IntValue(i)) => (*i).into(),
        Some(any_value::Value::DoubleValue(d)) => (*d).into(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(value).collect(),
        _ => serde_json::Value::Null,
    }
}
