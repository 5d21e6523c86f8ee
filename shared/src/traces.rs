//! Traces for the operator's own tools (Grafana Tempo, Jaeger, Honeycomb, Langfuse…):
//! OpenTelemetry over OTLP/HTTP (protobuf), on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, off otherwise.
//!
//! One trace per heartbeat and per conversation turn. Its root is `invoke_agent {agent}`;
//! below it, `chat {model}` for each model call and `execute_tool {tool}` for each tool
//! the model or an event calls, named and attributed as the OpenTelemetry semantic
//! conventions for generative AI say at the version [`SCHEMA_URL`] names (`gen_ai.*`),
//! and Pulse's own ids as `pulse.*`. What the model was sent and said is added only when
//! `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
//!
//! The exporter reads the rest of the standard variables itself: the headers a hosted
//! collector wants (`OTEL_EXPORTER_OTLP_HEADERS`), its timeout, the resource's
//! attributes.
//!
//! These spans are `tracing` spans of the target [`TARGET`], which only the exporting
//! layer takes: log lines never show them, and without an exporter they are not made.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Value, json};
use tracing::Span;
use tracing::field::Empty;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

use crate::domain::{ChatMessage, LlmRequest, LlmResponse, StopReason};
use crate::error::LlmError;
use crate::ports::Llm;

/// The semantic conventions the spans follow (the schema URL of their version).
pub use opentelemetry_semantic_conventions::SCHEMA_URL;

/// The target of the spans exported as traces.
pub const TARGET: &str = "pulse::traces";

/// Whether spans carry what the model was sent and what it said.
static CAPTURE: AtomicBool = AtomicBool::new(false);

/// What the environment asks of traces, read by [`Exporting::from_env`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exporting {
    /// The traces URL; `None` takes it from the environment as the OTLP exporter does
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces`).
    pub endpoint: Option<String>,
    /// The service the spans are from, unless `OTEL_SERVICE_NAME` says otherwise.
    pub service: String,
    /// Whether spans carry messages' text.
    pub capture_content: bool,
}

impl Exporting {
    /// What the environment asks for: `None` when no OTLP endpoint is set (or
    /// `OTEL_TRACES_EXPORTER=none`); an error naming the variable when one is set to
    /// what Pulse cannot do.
    pub fn from_env(service: &str) -> Result<Option<Self>, String> {
        Self::from_vars(service, |name| {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        })
    }

    fn from_vars(
        service: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, String> {
        match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other}: Pulse exports traces over OTLP only (otlp, or none for no traces)"
                ));
            }
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = var(name)
                && p.trim() != "http/protobuf"
            {
                return Err(format!(
                    "{name}={p}: Pulse sends OTLP over HTTP as protobuf (http/protobuf); point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)"
                ));
            }
        }
        let capture_content = match var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(format!(
                    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT={other}: expected true or false"
                ));
            }
        };
        let set = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .into_iter()
        .find_map(|name| var(name).map(|url| (name, url)));
        let Some((name, url)) = set else {
            return Ok(None);
        };
        url::Url::parse(url.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| format!("{name}={url}: not an http:// or https:// URL"))?;
        Ok(Some(Self {
            endpoint: None,
            service: service.to_owned(),
            capture_content,
        }))
    }
}

/// The exporter behind the traces layer, to send what it holds before a Lambda
/// invocation returns and before the process ends. Cloning shares it; the default
/// exports nothing.
#[derive(Clone, Debug, Default)]
pub struct Traces(Option<SdkTracerProvider>);

impl Traces {
    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Sends the spans that ended and are still held, waiting for the collector's answer
    /// (at most the exporter's timeout, 10 s unless `OTEL_EXPORTER_OTLP_TIMEOUT` says).
    /// Blocks the thread: async code calls [`Traces::flushed`].
    pub fn flush(&self) {
        if let Some(p) = &self.0
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "the traces could not be sent to the collector");
        }
    }

    /// [`Traces::flush`], on a thread that may block.
    pub async fn flushed(&self) {
        if self.is_on() {
            let traces = self.clone();
            let _ = tokio::task::spawn_blocking(move || traces.flush()).await;
        }
    }

    /// [`Traces::shutdown`], on a thread that may block.
    pub async fn finished(self) {
        if self.is_on() {
            let _ = tokio::task::spawn_blocking(move || self.shutdown()).await;
        }
    }

    /// Sends what is held and stops the exporter: at the end of the process.
    pub fn shutdown(&self) {
        if let Some(p) = &self.0
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "the traces exporter did not shut down cleanly");
        }
    }
}

/// The layer that exports the spans of [`TARGET`] as `exporting` says, and the handle
/// of its exporter. Sets whether spans carry messages' text.
pub fn layer<S>(exporting: &Exporting) -> Result<(impl Layer<S> + use<S>, Traces), String>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
    if let Some(url) = &exporting.endpoint {
        builder = builder.with_endpoint(url.clone());
    }
    let exporter = builder
        .build()
        .map_err(|e| format!("the OTLP traces exporter could not be built: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(exporting.service.clone());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let scope = opentelemetry::InstrumentationScope::builder("pulse")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(SCHEMA_URL)
        .build();
    let tracer = provider.tracer_with_scope(scope);
    CAPTURE.store(exporting.capture_content, Ordering::Relaxed);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Only Pulse's own trace spans: no library's spans, and no log lines as events
        // (they are in the logs).
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO));
    Ok((layer, Traces(Some(provider))))
}

/// Whether spans carry messages' text.
fn capturing() -> bool {
    CAPTURE.load(Ordering::Relaxed)
}

/// A heartbeat's root span, named `invoke_agent` until [`agent_known`] names the agent.
pub fn heartbeat(agent_id: &str, heartbeat_id: &str, beat: u64) -> Span {
    let span = invoke_agent(agent_id);
    span.record("pulse.heartbeat.id", heartbeat_id);
    span.record("pulse.beat", count(beat));
    span
}

/// A conversation turn's root span.
pub fn turn(agent_id: &str, session: &str, signals: usize) -> Span {
    let span = invoke_agent(agent_id);
    span.record("gen_ai.conversation.id", session);
    span.record("pulse.signals", count(signals as u64));
    span
}

/// The root span of a heartbeat or a turn, `invoke_agent`: each records its own ids
/// (a field never recorded is not sent).
fn invoke_agent(agent_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = "invoke_agent",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.id = agent_id,
        gen_ai.agent.name = Empty,
        gen_ai.conversation.id = Empty,
        pulse.heartbeat.id = Empty,
        pulse.beat = Empty,
        pulse.turn.id = Empty,
        pulse.signals = Empty,
        pulse.outcome = Empty,
        pulse.reason = Empty,
        "error.type" = Empty,
    )
}

/// Names the agent on `span` (a root span of this module): its name in the span's
/// name, and its session as the conversation.
pub fn agent_known(span: &Span, name: &str, session: &str) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    // Once a span has started, its `otel.name` is no longer read: it is renamed.
    if !span.is_disabled() {
        span.context()
            .span()
            .update_name(format!("invoke_agent {name}"));
    }
    span.record("gen_ai.agent.name", name);
    span.record("gen_ai.conversation.id", session);
}

/// Records on a root span how its heartbeat or turn ended. The reason is Pulse's own
/// words when the outcome is `skipped`, `failed` or `undeliverable`, and otherwise may
/// be the model's: then it is kept only when spans carry messages' text.
pub fn ended(span: &Span, outcome: &str, reason: &str) {
    span.record("pulse.outcome", outcome);
    let own = matches!(outcome, "skipped" | "failed" | "undeliverable");
    if !reason.is_empty() && (own || capturing()) {
        span.record("pulse.reason", reason);
    }
}

/// Marks `span` failed: `kind` names the kind of error (its `error.type`).
pub fn failed(span: &Span, kind: &str, message: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", message);
    span.record("error.type", kind);
}

/// The id of the trace `span` is in, as 32 hex digits: none when traces are off.
pub fn trace_id(span: &Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    let id = cx.span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// A tool's call: `execute_tool {name}`. `kind` is the conventions' tool type:
/// `function` for a tool the model called, `extension` for one an event called.
pub fn tool(name: &str, call_id: &str, kind: &'static str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = format!("execute_tool {name}"),
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        "gen_ai.tool.type" = kind,
        pulse.action.id = Empty,
        "error.type" = Empty,
    )
}

/// An action of a built-in tool on an event (the heartbeat agent's thinking, a
/// reminder…): Pulse's own span, `pulse.action {tool}`.
pub fn action(tool: &str, action_id: &str, event_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "pulse.action",
        otel.name = format!("pulse.action {tool}"),
        otel.status_code = Empty,
        otel.status_description = Empty,
        pulse.tool = tool,
        pulse.action.id = action_id,
        pulse.event.id = event_id,
        "error.type" = Empty,
    )
}

/// A request to a webhook, as the receiver took it: `pulse.webhook`, a server span of
/// its own trace.
pub fn webhook(id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "pulse.webhook",
        otel.name = "pulse.webhook",
        otel.kind = "server",
        otel.status_code = Empty,
        otel.status_description = Empty,
        pulse.webhook.id = id,
        pulse.verdict = Empty,
        pulse.event.id = Empty,
        "error.type" = Empty,
    )
}

/// How a webhook request was answered: `verdict` (`accepted`, `duplicate`, `rejected`…)
/// and the event it made.
pub fn webhook_answered(span: &Span, verdict: &str, event: Option<&str>) {
    span.record("pulse.verdict", verdict);
    if let Some(event) = event {
        span.record("pulse.event.id", event);
    }
}

/// One attempt to deliver a hook: `pulse.hook {type}`, a client span of its own trace.
pub fn hook(hook_type: &str, hook_id: &str, delivery_id: &str, attempt: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        "pulse.hook",
        otel.name = format!("pulse.hook {hook_type}"),
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        pulse.hook.type = hook_type,
        pulse.hook.id = hook_id,
        pulse.hook.delivery.id = delivery_id,
        pulse.hook.attempt = i64::from(attempt),
        pulse.hook.result = Empty,
        http.response.status_code = Empty,
        "error.type" = Empty,
    )
}

/// How a hook's attempt ended: `result` (`success`, `http_error`, `timeout`…) and the
/// receiver's status.
pub fn hook_answered(span: &Span, result: &str, status: Option<u16>) {
    span.record("pulse.hook.result", result);
    if let Some(status) = status {
        span.record("http.response.status_code", i64::from(status));
    }
}

/// A sweep's claim of a heartbeat, `pulse.claim`, open until its job is queued: the job
/// carries it ([`traceparent`]) and the heartbeat's run continues its trace
/// ([`continues`]), so the wait in the queue shows between the two. Only claims are
/// spans: a sweep that claims nothing sends nothing.
pub fn claim(heartbeat: &crate::domain::Heartbeat) -> Span {
    // How late after its due time it was first claimed.
    let late = heartbeat
        .started_at
        .map(|started| started.duration_since(heartbeat.scheduled_at).as_millis())
        .unwrap_or_default();
    tracing::info_span!(
        target: TARGET,
        "pulse.claim",
        otel.name = "pulse.claim",
        otel.kind = "producer",
        pulse.heartbeat.id = heartbeat.id().to_string(),
        gen_ai.agent.id = heartbeat.agent_id.as_str(),
        pulse.beat = count(heartbeat.beat),
        pulse.claim = i64::from(heartbeat.claim),
        pulse.late_ms = i64::try_from(late).unwrap_or(i64::MAX),
    )
}

/// `span`'s place as a W3C `traceparent`, for a message to carry: none when traces are
/// off.
pub fn traceparent(span: &Span) -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    trace_id(span)?;
    let mut carrier = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the span `traceparent` names, in its trace: called before
/// `span` is first entered. A `traceparent` that does not parse leaves `span` a root.
pub fn continues(span: &Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let carrier =
        std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    // Traces off, the span is not one of this layer's: nothing to join.
    let _ = span.set_parent(parent);
}

/// A heartbeat's reading of its agent and its window of events: `pulse.window`.
pub fn window() -> Span {
    tracing::info_span!(
        target: TARGET,
        "pulse.window",
        otel.name = "pulse.window",
        pulse.window.events = Empty,
        pulse.window.truncated = Empty,
    )
}

/// What the window held.
pub fn window_read(span: &Span, events: usize, truncated: bool) {
    span.record("pulse.window.events", count(events as u64));
    span.record("pulse.window.truncated", truncated);
}

/// A search of an agent's memories, for the prompt or the model's `recall`: the
/// conventions' retrieval span, `retrieval memories`. The query's text only when spans
/// carry messages' text.
pub fn memory_search(query: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "retrieval",
        otel.name = "retrieval memories",
        gen_ai.operation.name = "retrieval",
        gen_ai.data_source.id = "memories",
        gen_ai.retrieval.query.text = Empty,
        gen_ai.retrieval.documents = Empty,
        pulse.memories.found = Empty,
    );
    if capturing() {
        span.record("gen_ai.retrieval.query.text", query);
    }
    span
}

/// What a memory search found: each memory's id and score (no text), best first.
pub fn memories_found<'a>(span: &Span, found: impl ExactSizeIterator<Item = (&'a str, f32)>) {
    span.record("pulse.memories.found", count(found.len() as u64));
    let documents: Vec<serde_json::Value> = found
        .map(|(id, score)| serde_json::json!({"id": id, "score": (f64::from(score) * 1e4).round() / 1e4}))
        .collect();
    span.record(
        "gen_ai.retrieval.documents",
        serde_json::Value::from(documents).to_string(),
    );
}

/// Memories being kept: `pulse.memory.store`, with how many and their ids.
pub fn memory_store<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Span {
    let n = ids.len();
    tracing::info_span!(
        target: TARGET,
        "pulse.memory.store",
        otel.name = "pulse.memory.store",
        pulse.memories.stored = count(n as u64),
        pulse.memory.ids = ids.collect::<Vec<_>>().join(","),
    )
}

/// Where a tracing UI shows one trace: `template` with its `{trace_id}` replaced.
pub fn link(template: &str, trace_id: &str) -> String {
    template.replace(TRACE_ID, trace_id)
}

/// What a trace link's template is replaced in.
const TRACE_ID: &str = "{trace_id}";

/// `template` when it can be a trace link: an `http(s)` URL holding `{trace_id}`.
pub fn link_template(template: &str) -> Result<String, String> {
    let template = template.trim();
    if !template.contains(TRACE_ID) {
        return Err(format!(
            "{template:?} does not say where the trace id goes: put {TRACE_ID} in it, e.g. http://localhost:16686/trace/{TRACE_ID}"
        ));
    }
    match url::Url::parse(&link(template, "0af7651916cd43dd8448eb211c80319c")) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(template.to_owned()),
        Ok(u) => Err(format!(
            "{template:?} is a {} URL: give an http or https one",
            u.scheme()
        )),
        Err(e) => Err(format!("{template:?} is not a URL: {e}")),
    }
}

/// Wraps `llm` so each call is a `chat {model}` span.
pub fn traced(llm: Arc<dyn Llm>) -> Arc<dyn Llm> {
    Arc::new(Traced(llm))
}

/// A model client whose calls are spans.
struct Traced(Arc<dyn Llm>);

#[async_trait]
impl Llm for Traced {
    fn provider(&self) -> &'static str {
        self.0.provider()
    }

    fn model(&self) -> &str {
        self.0.model()
    }

    async fn count_tokens(&self, model: &str, text: &str) -> Result<Option<usize>, LlmError> {
        self.0.count_tokens(model, text).await
    }

    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        use tracing::Instrument as _;
        let model = request.model.as_deref().unwrap_or(self.0.model());
        let span = tracing::info_span!(
            target: TARGET,
            "chat",
            otel.name = format!("chat {model}"),
            otel.kind = "client",
            otel.status_code = Empty,
            otel.status_description = Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = self.0.provider(),
            gen_ai.request.model = model,
            gen_ai.request.max_tokens = i64::from(request.max_tokens),
            gen_ai.response.model = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.usage.cache_read.input_tokens = Empty,
            gen_ai.usage.cache_creation.input_tokens = Empty,
            gen_ai.system_instructions = Empty,
            gen_ai.input.messages = Empty,
            gen_ai.output.messages = Empty,
            "error.type" = Empty,
        );
        if capturing() && !span.is_disabled() {
            let (system, input) = messages(&request.messages);
            span.record("gen_ai.system_instructions", system.to_string());
            span.record("gen_ai.input.messages", input.to_string());
        }
        let answer = self.0.complete(request).instrument(span.clone()).await;
        match &answer {
            Ok(resp) => {
                let u = &resp.usage;
                span.record("gen_ai.response.model", resp.model.as_str());
                if !span.is_disabled() {
                    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
                    let reasons = vec![opentelemetry::StringValue::from(finish(resp.stop))];
                    span.set_attribute(
                        "gen_ai.response.finish_reasons",
                        opentelemetry::Value::Array(reasons.into()),
                    );
                }
                span.record("gen_ai.usage.input_tokens", count(u.input_tokens));
                span.record("gen_ai.usage.output_tokens", count(u.output_tokens));
                span.record(
                    "gen_ai.usage.cache_read.input_tokens",
                    count(u.cache_read_tokens),
                );
                span.record(
                    "gen_ai.usage.cache_creation.input_tokens",
                    count(u.cache_write_tokens),
                );
                if capturing() && !span.is_disabled() {
                    span.record("gen_ai.output.messages", output(resp).to_string());
                }
            }
            Err(e) => failed(&span, error_type(e), &e.to_string()),
        }
        answer
    }
}

/// A count as the exporter sends numbers (unsigned ones would go as text).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The conventions' finish reason for `stop`.
fn finish(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndTurn => "stop",
        StopReason::ToolUse => "tool_call",
        StopReason::MaxTokens => "length",
        StopReason::Other => "other",
    }
}

/// The kind of a model call's failure, for `error.type`.
fn error_type(e: &LlmError) -> &'static str {
    match e {
        LlmError::NotConfigured { .. } => "not_configured",
        LlmError::Transport { .. } => "transport",
        LlmError::Status { .. } => "status",
        LlmError::Malformed { .. } => "malformed",
    }
}

/// The system instructions and the other messages, in the conventions' shape (a role
/// and parts; images are named, never sent).
fn messages(all: &[ChatMessage]) -> (Value, Value) {
    let mut system = Vec::new();
    let mut input = Vec::new();
    for m in all {
        match m {
            ChatMessage::System { text } if input.is_empty() => {
                system.push(json!({"type": "text", "content": text}));
            }
            ChatMessage::System { text } => input.push(json!({
                "role": "system",
                "parts": [{"type": "text", "content": text}],
            })),
            ChatMessage::User { text, images } => {
                let mut parts = vec![json!({"type": "text", "content": text})];
                parts.extend(images.iter().map(|_| json!({"type": "image"})));
                input.push(json!({"role": "user", "parts": parts}));
            }
            ChatMessage::Assistant { text, tool_calls } => {
                input.push(json!({"role": "assistant", "parts": parts(text, tool_calls)}));
            }
            ChatMessage::ToolResult {
                call_id, content, ..
            } => input.push(json!({
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": call_id, "response": content}],
            })),
        }
    }
    (Value::Array(system), Value::Array(input))
}

/// The model's answer, in the conventions' shape.
fn output(resp: &LlmResponse) -> Value {
    json!([{
        "role": "assistant",
        "parts": parts(&resp.text, &resp.tool_calls),
        "finish_reason": finish(resp.stop),
    }])
}

fn parts(text: &Option<String>, calls: &[crate::domain::ToolUse]) -> Vec<Value> {
    let mut parts: Vec<Value> = text
        .iter()
        .map(|t| json!({"type": "text", "content": t}))
        .collect();
    parts.extend(
        calls.iter().map(
            |c| json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.input}),
        ),
    );
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            set.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_trace_link_is_an_http_url_with_the_trace_id_in_it() {
        let jaeger = link_template(" http://localhost:16686/trace/{trace_id} ").unwrap();
        assert_eq!(
            link(&jaeger, "4bf92f3577b34da6a3ce929d0e0e4736"),
            "http://localhost:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for (wrong, said) in [
            ("http://localhost:16686/trace/", "put {trace_id} in it"),
            (
                "ftp://traces/{trace_id}",
                "a ftp URL: give an http or https one",
            ),
            ("jaeger/{trace_id}", "is not a URL"),
        ] {
            let err = link_template(wrong).unwrap_err();
            assert!(err.contains(said), "{wrong}: {err}");
        }
    }

    #[test]
    fn traces_are_on_only_with_an_endpoint_and_a_wrong_setting_is_named() {
        assert_eq!(Exporting::from_vars("pulse", vars(&[])), Ok(None));
        let on = Exporting::from_vars(
            "pulse",
            vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(on.service, "pulse");
        assert!(!on.capture_content);
        let traces_only = Exporting::from_vars(
            "pulse-sweeper",
            vars(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://otel.example/v1/traces",
                ),
                ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "TRUE"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert!(traces_only.capture_content);
        assert_eq!(
            Exporting::from_vars(
                "pulse",
                vars(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ])
            ),
            Ok(None)
        );
        for (set, named) in [
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: Pulse sends OTLP over HTTP",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT=localhost:4318: not an http:// or https:// URL",
            ),
            (
                vec![("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER=zipkin: Pulse exports traces over OTLP only",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "yes"),
                ],
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=yes: expected true or false",
            ),
        ] {
            let err = Exporting::from_vars("pulse", vars(&set)).unwrap_err();
            assert!(err.starts_with(named), "{err}");
        }
    }

    #[test]
    fn messages_take_the_conventions_shape_with_the_system_prompt_apart() {
        let (system, input) = messages(&[
            ChatMessage::System {
                text: "You are scout.".into(),
            },
            ChatMessage::User {
                text: "hi".into(),
                images: Vec::new(),
            },
            ChatMessage::Assistant {
                text: None,
                tool_calls: vec![crate::domain::ToolUse {
                    id: "t1".into(),
                    name: "recall".into(),
                    input: json!({"query": "plants"}),
                }],
            },
            ChatMessage::ToolResult {
                call_id: "t1".into(),
                content: "[]".into(),
                is_error: false,
                images: Vec::new(),
            },
        ]);
        assert_eq!(
            system,
            json!([{"type": "text", "content": "You are scout."}])
        );
        assert_eq!(
            input,
            json!([
                {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "t1", "name": "recall", "arguments": {"query": "plants"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "t1", "response": "[]"}]},
            ])
        );
    }
}
