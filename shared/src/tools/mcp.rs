//! Calling MCP servers: the official SDK's client (`rmcp`) over streamable HTTP, on the
//! egress guard's HTTP client — so an MCP URL is held to the same rules as a hook or an
//! HTTP tool (public addresses only unless `PULSE_HOOKS_ALLOW` lists them, checked as
//! each connection opens; no redirects; no proxy).
//!
//! One session per server and process, opened on first use and kept: a warm worker
//! calls at once, a cold one initializes once. A session the server expired (`404`) is
//! initialized again and the request sent once more by the SDK. A session whose worker
//! ended is dropped and opened afresh on the next call.
//!
//! Every `tools/call` carries the caller's key as an `Idempotency-Key` header (and in
//! the request's `_meta`), the same on every attempt of the same call, so a server that
//! honours it does the work once.
//!
//! What a call can come to ([`McpCall`]): an answer (the server's result, `isError`
//! included, which the model sees as a failed call); not sent (the connection or the
//! session could not be made: safe to try again); or unknown (the request went out and
//! no answer came: timed out, or the connection broke) — the work may have been done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use pulse_egress::Egress;
use rmcp::model::{
    CallToolRequestParams, ClientConfig, ClientJsonRpcMessage, Implementation, MetaObject,
    RequestMetaObject,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::domain::{MAX_KEPT_BYTES, MAX_MCP_TOOLS, McpServer, McpTool, ToolName};

/// The largest answer read from an MCP server (a tools list or a call's result).
pub const MAX_ANSWER: usize = 1 << 20;
/// How long opening a session and listing tools may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// Most pages of `tools/list` followed.
const MAX_LIST_PAGES: usize = 32;

/// Most bytes of tool definitions (as JSON) one listing may bring.
const MAX_LIST_BYTES: usize = 4 << 20;
/// Where the caller's key travels in a call's `_meta`.
const META_KEY: &str = "pulse/idempotency-key";

/// What one `tools/call` came to.
#[derive(Clone, Debug, PartialEq)]
pub enum McpCall {
    /// The server answered: its result for the model, and whether it says the call
    /// failed (`isError`).
    Answered {
        /// Text, structured content and image notes.
        result: Value,
        /// The server's `isError`.
        is_error: bool,
    },
    /// Nothing reached the server (no connection, no session): safe to try again.
    NotSent(String),
    /// The request went out and no answer came back: the work may have been done.
    Unknown(String),
}

/// The sessions this process keeps with MCP servers.
#[derive(Clone)]
pub struct McpClients {
    egress: Egress,
    sessions: Arc<Mutex<HashMap<ToolName, Arc<Session>>>>,
    /// Whether local servers (programs) may be started: `pulse serve` with
    /// `PULSE_MCP_STDIO=on` only, never a Lambda function.
    local: bool,
}

struct Session {
    /// Where and with which headers it was opened: a changed server opens a new one.
    opened_for: (String, Vec<(String, String)>),
    service: RunningService<RoleClient, Handler>,
    changed: Arc<AtomicBool>,
    /// A local server's process, stopped with the session.
    _child: Option<tokio::process::Child>,
}

/// Receives the server's notifications: a changed tools list is marked, and the
/// list is made again before the tools are next offered.
#[derive(Clone)]
struct Handler {
    changed: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("pulse", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        info!("an MCP server says its tools changed; they are listed again before next use");
        self.changed.store(true, Ordering::SeqCst);
    }
}

impl McpClients {
    /// Sessions over `egress` (the guarded client: every connection checked).
    pub fn new(egress: Egress) -> Self {
        Self {
            egress,
            sessions: Arc::default(),
            local: false,
        }
    }

    /// Local servers may be started (see [`McpServer::local`]).
    pub fn with_local_servers(mut self, on: bool) -> Self {
        self.local = on;
        self
    }

    /// Lists the server's tools, following pages, each checked: at most
    /// [`MAX_MCP_TOOLS`]; a tool the model could not use is left out with the reason.
    pub async fn list(
        &self,
        name: &ToolName,
        server: &McpServer,
    ) -> Result<(Vec<McpTool>, Vec<String>), String> {
        let listing = async {
            let session = self.session(name, server).await?;
            session.changed.store(false, Ordering::SeqCst);
            // Page by page, stopping at the first bound passed: a server that pages
            // forever (or answers pages of megabytes) is refused, not followed.
            let mut tools = Vec::new();
            let mut cursor = None;
            let mut bytes = 0;
            for page_no in 1.. {
                let page = session
                    .service
                    .list_tools(Some(
                        rmcp::model::PaginatedRequestParams::default().with_cursor(cursor),
                    ))
                    .await
                    .map_err(|e| format!("the MCP server {name} did not list its tools: {e}"))?;
                bytes += serde_json::to_vec(&page.tools).map_or(0, |v| v.len());
                tools.extend(page.tools);
                let over = if tools.len() > MAX_MCP_TOOLS {
                    Some(format!("more than {MAX_MCP_TOOLS} tools"))
                } else if bytes > MAX_LIST_BYTES {
                    Some(format!(
                        "more than {} MiB of tool definitions",
                        MAX_LIST_BYTES >> 20
                    ))
                } else if page.next_cursor.is_some() && page_no >= MAX_LIST_PAGES {
                    Some(format!("more than {MAX_LIST_PAGES} pages"))
                } else {
                    None
                };
                if let Some(over) = over {
                    return Err(format!(
                        "the MCP server {name} lists {over}, past what Pulse keeps (at most {MAX_MCP_TOOLS} tools, {MAX_LIST_PAGES} pages, {} MiB); give the tools agents need with --allow",
                        MAX_LIST_BYTES >> 20
                    ));
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            Ok(tools)
        };
        let tools = match tokio::time::timeout(LIST_TIMEOUT, listing).await {
            Ok(r) => r.inspect_err(|_| self.forget(name))?,
            Err(_) => {
                self.forget(name);
                return Err(format!(
                    "the MCP server {name} did not list its tools within {LIST_TIMEOUT:?}"
                ));
            }
        };
        let mut checked = Vec::new();
        let mut left_out = Vec::new();
        for t in tools {
            let schema = Value::Object((*t.input_schema).clone());
            match McpTool::checked(&t.name, t.description.as_deref(), schema) {
                Ok(mut tool) => {
                    tool.read_only = t
                        .annotations
                        .as_ref()
                        .and_then(|a| a.read_only_hint)
                        .unwrap_or(false);
                    checked.push(tool);
                }
                Err(why) => left_out.push(why),
            }
        }
        // Within the bound a record keeps, the tools an allow-list names come first (one
        // the operator named is never left out for the others), then the rest in the
        // server's order; those kept stay in that order.
        let named = |t: &McpTool| server.allow.contains(&t.name);
        let mut keep = vec![false; checked.len()];
        let mut bytes = 0;
        let order = (0..checked.len())
            .filter(|&i| named(&checked[i]))
            .chain((0..checked.len()).filter(|&i| !named(&checked[i])));
        for i in order {
            let size = checked[i].definition_bytes();
            if bytes + size <= MAX_KEPT_BYTES {
                bytes += size;
                keep[i] = true;
            } else {
                left_out.push(format!(
                    "tool {:?}: the definitions kept before it fill the {} KiB a server's record keeps",
                    checked[i].name,
                    MAX_KEPT_BYTES / 1024
                ));
            }
        }
        let kept = checked
            .into_iter()
            .zip(keep)
            .filter_map(|(t, k)| k.then_some(t))
            .collect();
        Ok((kept, left_out))
    }

    /// Whether the server said its tools changed since they were last listed here.
    pub fn changed(&self, name: &ToolName) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .is_some_and(|s| s.changed.load(Ordering::SeqCst))
    }

    /// Calls `tool` with `arguments` under the server's timeout; `key` is the call's
    /// idempotency key, the same on every attempt.
    pub async fn call(
        &self,
        name: &ToolName,
        server: &McpServer,
        tool: &str,
        arguments: &Value,
        key: &str,
    ) -> McpCall {
        if let Some(why) = &server.unreadable {
            return McpCall::NotSent(why.clone());
        }
        let Some(arguments) = arguments.as_object().cloned() else {
            return McpCall::NotSent(format!(
                "the arguments for {tool} must be a JSON object, not {arguments}"
            ));
        };
        let timeout = Duration::from_millis(server.timeout_ms);
        let session = match tokio::time::timeout(timeout, self.session(name, server)).await {
            Ok(Ok(s)) => s,
            Ok(Err(why)) => return McpCall::NotSent(why),
            Err(_) => {
                return McpCall::NotSent(format!(
                    "no session with the MCP server {name} within {timeout:?}"
                ));
            }
        };
        let mut meta = serde_json::Map::new();
        meta.insert(META_KEY.to_owned(), Value::String(key.to_owned()));
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        match tokio::time::timeout(timeout, session.service.call_tool(params)).await {
            Ok(Ok(result)) => {
                let is_error = result.is_error == Some(true);
                let result = serde_json::to_value(&result).unwrap_or_default();
                McpCall::Answered {
                    result: for_model(&result),
                    is_error,
                }
            }
            Ok(Err(ServiceError::McpError(e))) => McpCall::Answered {
                result: json!({"error": e.message, "code": e.code.0}),
                is_error: true,
            },
            Ok(Err(e)) => {
                self.forget(name);
                if never_sent(&e) {
                    McpCall::NotSent(format!("the MCP server {name} could not be reached: {e}"))
                } else {
                    McpCall::Unknown(format!(
                        "the call to {tool} on the MCP server {name} got no answer: {e}"
                    ))
                }
            }
            Err(_) => McpCall::Unknown(format!(
                "the call to {tool} on the MCP server {name} did not answer within {timeout:?}"
            )),
        }
    }

    /// Drops the session with `name`, if any (a broken one, or a changed server).
    pub fn forget(&self, name: &ToolName) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    async fn session(&self, name: &ToolName, server: &McpServer) -> Result<Arc<Session>, String> {
        let opened_for = (
            server.place(),
            server
                .headers
                .iter()
                .map(|h| (h.name.clone(), h.value.expose().to_owned()))
                .collect::<Vec<_>>(),
        );
        if let Some(s) = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .filter(|s| s.opened_for == opened_for && !s.service.is_closed())
        {
            return Ok(s.clone());
        }
        let changed = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            changed: changed.clone(),
        };
        let (service, child) = match &server.url {
            Some(url) => (
                self.open_http(name, url, &opened_for.1, handler).await?,
                None,
            ),
            None => {
                let (service, child) = self.open_local(name, server, handler).await?;
                (service, Some(child))
            }
        };
        let session = Arc::new(Session {
            opened_for,
            service,
            changed,
            _child: child,
        });
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), session.clone());
        Ok(session)
    }

    async fn open_http(
        &self,
        name: &ToolName,
        url: &url::Url,
        headers: &[(String, String)],
        handler: Handler,
    ) -> Result<RunningService<RoleClient, Handler>, String> {
        // The client's resolver checks names as it connects; an address written in the
        // URL is checked here.
        self.egress.check(url).await.map_err(|e| {
            format!(
                "the MCP server {name} at {} is not reachable from Pulse: {e}",
                pulse_egress::redacted(url)
            )
        })?;
        let mut custom = HashMap::new();
        for (k, v) in headers {
            let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v))
            else {
                return Err(format!(
                    "the MCP server {name} has a header that HTTP cannot carry"
                ));
            };
            custom.insert(k, v);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
            .custom_headers(custom)
            .max_json_response_size(MAX_ANSWER)
            .max_sse_event_size(MAX_ANSWER)
            .reinit_on_expired_session(true);
        let transport =
            StreamableHttpClientTransport::with_client(Keyed(self.egress.client().clone()), config);
        handler.serve(transport).await.map_err(|e| {
            warn!(server = %name, error = %e, "no MCP session");
            format!(
                "the MCP server {name} at {} did not open a session (is it an MCP server, over streamable HTTP?): {e}",
                pulse_egress::redacted(url)
            )
        })
    }

    /// Starts a local server: its program with a clean environment (`PATH`, `HOME` and
    /// the variables it names, nothing else of this process's), spoken to over its
    /// stdin and stdout, its stderr logged line by line (within [`StderrLog`]'s bounds). It is stopped when its session
    /// is dropped.
    async fn open_local(
        &self,
        name: &ToolName,
        server: &McpServer,
        handler: Handler,
    ) -> Result<(RunningService<RoleClient, Handler>, tokio::process::Child), String> {
        if !self.local {
            return Err(format!(
                "the MCP server {name} is a local program, and local MCP servers run only under `pulse serve` with PULSE_MCP_STDIO=on"
            ));
        }
        let (program, args) = server
            .command
            .split_first()
            .ok_or_else(|| format!("the MCP server {name} has no program to start"))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for var in ["PATH", "HOME"]
            .iter()
            .copied()
            .chain(server.env.iter().map(String::as_str))
        {
            match std::env::var_os(var) {
                Some(v) => {
                    cmd.env(var, v);
                }
                None if server.env.iter().any(|e| e == var) => {
                    return Err(format!(
                        "the MCP server {name} is given {var}, which is not set where Pulse runs"
                    ));
                }
                None => {}
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("the MCP server {name} could not be started ({program}): {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("the MCP server {name} gave no stdin or stdout"));
        };
        if let Some(mut stderr) = child.stderr.take() {
            let server = name.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut log = StderrLog::default();
                let mut buf = vec![0u8; 8 * 1024];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    for said in log.read(&buf[..n], std::time::Instant::now()) {
                        // The log escapes what it writes: one line stays one line.
                        match said {
                            Said::Line(line) => {
                                info!(server = %server, line = %line, "the local MCP server says");
                            }
                            Said::Dropped(lines) => {
                                info!(server = %server, lines, "the local MCP server said more than the log keeps: lines dropped this minute");
                            }
                        }
                    }
                }
            });
        }
        let service = handler.serve((stdout, stdin)).await.map_err(|e| {
            warn!(server = %name, error = %e, "no MCP session");
            format!(
                "the MCP server {name} ({}) did not open a session (does it speak MCP on stdin and stdout?): {e}",
                server.command.join(" ")
            )
        })?;
        Ok((service, child))
    }
}

/// Lines of a local server's stderr logged a minute; past them, lines are counted and
/// the count logged once the minute is over.
const STDERR_LINES_A_MINUTE: u32 = 20;
/// Characters of a stderr line logged; the rest of the line is read and dropped.
const STDERR_LINE_CHARS: usize = 500;

/// A local server's stderr, cut into lines as it arrives, each cut short, at most
/// [`STDERR_LINES_A_MINUTE`] a minute: a server that floods it (or writes one endless
/// line) neither fills the log nor the memory.
#[derive(Default)]
struct StderrLog {
    /// The line being read, up to [`STDERR_LINE_CHARS`] bytes and a few more (a
    /// character cut in two is left out).
    line: Vec<u8>,
    minute: Option<std::time::Instant>,
    logged: u32,
    dropped: u32,
}

/// What [`StderrLog::read`] says to log.
#[derive(Debug, PartialEq, Eq)]
enum Said {
    Line(String),
    Dropped(u32),
}

impl StderrLog {
    /// Reads `bytes` at `now`: the lines to log, and a count of those dropped when a
    /// minute that dropped some is over.
    fn read(&mut self, bytes: &[u8], now: std::time::Instant) -> Vec<Said> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            self.keep(&rest[..end]);
            self.finish(now, &mut out);
            rest = &rest[end + 1..];
        }
        self.keep(rest);
        out
    }

    fn keep(&mut self, part: &[u8]) {
        let room = (STDERR_LINE_CHARS * 4).saturating_sub(self.line.len());
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    fn finish(&mut self, now: std::time::Instant, out: &mut Vec<Said>) {
        let line = std::mem::take(&mut self.line);
        if self
            .minute
            .is_none_or(|m| now.saturating_duration_since(m) >= Duration::from_secs(60))
        {
            if self.dropped > 0 {
                out.push(Said::Dropped(self.dropped));
            }
            self.minute = Some(now);
            self.logged = 0;
            self.dropped = 0;
        }
        if self.logged >= STDERR_LINES_A_MINUTE {
            self.dropped += 1;
            return;
        }
        self.logged += 1;
        let text = String::from_utf8_lossy(&line);
        out.push(Said::Line(
            text.trim_end_matches('\r')
                .chars()
                .take(STDERR_LINE_CHARS)
                .collect(),
        ));
    }
}

/// Whether the request surely never reached the server: the connection was refused or
/// could not be made.
fn never_sent(e: &ServiceError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(r) = err.downcast_ref::<reqwest::Error>()
            && r.is_connect()
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// Where a result carries its images beside its text: taken out before the result is
/// shown to the model or logged, and given to a model that is sent images as image
/// parts of the tool's result.
pub const IMAGES: &str = "_images";
/// Most images taken from one result.
const MAX_IMAGES: usize = 4;

/// A tool result as the model reads it: the text parts, the structured content, and a
/// note for each image or other part; the images (PNG, JPEG, GIF or WebP, at most
/// [`MAX_IMAGES`]) under [`IMAGES`].
fn for_model(result: &Value) -> Value {
    let mut parts = Vec::new();
    let mut images = Vec::new();
    for c in result["content"].as_array().into_iter().flatten() {
        match c["type"].as_str() {
            Some("image") => {
                let media_type = c["mimeType"].as_str().unwrap_or("?");
                let data = c["data"].as_str().unwrap_or_default();
                let usable = matches!(
                    media_type,
                    "image/png" | "image/jpeg" | "image/gif" | "image/webp"
                ) && !data.is_empty()
                    && images.len() < MAX_IMAGES;
                if usable {
                    images.push(json!({"media_type": media_type, "data": data}));
                }
                parts.push(json!(format!(
                    "[image {}, {media_type}, {} base64 characters]",
                    if usable { images.len() } else { 0 },
                    data.len()
                )));
            }
            Some("text") => parts.push(c["text"].clone()),
            Some("resource_link") | Some("resource") => parts.push(c.clone()),
            other => parts.push(json!(format!("[{} content]", other.unwrap_or("unknown")))),
        }
    }
    let mut out = serde_json::Map::new();
    out.insert("content".to_owned(), Value::Array(parts));
    if let Some(s) = result.get("structuredContent").filter(|s| !s.is_null()) {
        out.insert("structured".to_owned(), s.clone());
    }
    if !images.is_empty() {
        out.insert(IMAGES.to_owned(), Value::Array(images));
    }
    Value::Object(out)
}

/// The guarded reqwest client, with each `tools/call` given its `Idempotency-Key`
/// header from the key in its `_meta`.
#[derive(Clone)]
struct Keyed(reqwest::Client);

fn with_key(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let Ok(v) = serde_json::to_value(message) else {
        return headers;
    };
    if v["method"] == "tools/call"
        && let Some(key) = v["params"]["_meta"][META_KEY].as_str()
        && let Ok(value) = HeaderValue::from_str(key)
    {
        headers.insert(HeaderName::from_static("idempotency-key"), value);
    }
    headers
}

type Answer = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

impl StreamableHttpClient for Keyed {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Answer {
        let headers = with_key(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Answer {
        let headers = with_key(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<reqwest::Error>,
    > {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<reqwest::Error>,
    > {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_flood_of_stderr_is_logged_twenty_lines_a_minute_each_cut_short() {
        let mut log = StderrLog::default();
        let t0 = Instant::now();
        // A line in two pieces, then one endless line of 10 MB.
        assert!(log.read(b"start", t0).is_empty());
        assert_eq!(log.read(b"ed\n", t0), [Said::Line("started".into())]);
        let endless = vec![b'x'; 10 << 20];
        assert!(log.read(&endless, t0).is_empty());
        assert!(log.line.len() <= STDERR_LINE_CHARS * 4, "nothing piles up");
        let said = log.read(b"\n", t0);
        assert_eq!(said, [Said::Line("x".repeat(STDERR_LINE_CHARS))]);
        // 100,000 lines within the minute: 18 more logged, the rest counted.
        let flood = "noise\n".repeat(100_000);
        let said = log.read(flood.as_bytes(), t0 + Duration::from_secs(1));
        assert_eq!(said.len(), 18);
        // The next line past the minute says how many were dropped, and is logged.
        let said = log.read(b"calm again\n", t0 + Duration::from_secs(61));
        assert_eq!(
            said,
            [Said::Dropped(99_982), Said::Line("calm again".into())]
        );
    }
}
