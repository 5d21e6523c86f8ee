//! A real MCP server on 127.0.0.1, built with the official SDK's server side over
//! streamable HTTP: the tools a test needs, a tools list in pages of two, a list a test
//! can change (telling connected clients), sessions a test can expire, and a record of
//! every `tools/call` that reached it — its arguments and its `Idempotency-Key` header.
//!
//! Tools: `add {a, b}` answers the sum as text and as structured content; `note {text}`
//! answers "noted"; `fail {}` answers with `isError`; `slow {ms}` answers after a pause
//! (for calls that time out after they arrived); `picture {}` answers an image.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};

/// A `tools/call` as it reached the server.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
    /// The request's `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
}

#[derive(Default)]
struct Shared {
    tools: Mutex<Vec<Tool>>,
    calls: Mutex<Vec<Call>>,
    expire_next: AtomicBool,
    expired: Mutex<u32>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    initialized: Mutex<u32>,
    /// Every `tools/list` page names a next one.
    endless: AtomicBool,
    /// `tools/list` pages served.
    pages: Mutex<u32>,
}

/// The server.
pub struct FakeMcp {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

fn tool(name: &str, description: &str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else {
        unreachable!("an object schema")
    };
    Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
}

/// The tools it starts with.
fn first_tools() -> Vec<Tool> {
    vec![
        tool(
            "add",
            "Adds two integers.",
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
        ),
        tool(
            "note",
            "Keeps a note (a side effect: do it once).",
            json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ),
        tool("fail", "Always fails.", json!({"type": "object"})),
        tool(
            "slow",
            "Answers after a pause.",
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
        ),
        tool("picture", "Draws a picture.", json!({"type": "object"})),
        tool(
            "lookup",
            "Looks something up after a pause (read-only).",
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
    ]
}

#[derive(Clone)]
struct Handler(Arc<Shared>);

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        *self.0.initialized.lock().unwrap() += 1;
        self.0.peers.lock().unwrap().push(context.peer);
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        *self.0.pages.lock().unwrap() += 1;
        // Pages of two: the cursor is where the page starts.
        let start: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if self.0.endless.load(Ordering::SeqCst) {
            let two = (start..start + 2)
                .map(|n| tool(&format!("t{n}"), "one of many", json!({"type": "object"})))
                .collect();
            let mut page = ListToolsResult::with_all_items(two);
            page.next_cursor = Some((start + 2).to_string());
            return Ok(page);
        }
        let all = self.0.tools.lock().unwrap().clone();
        let end = (start + 2).min(all.len());
        let mut page = ListToolsResult::with_all_items(all[start.min(end)..end].to_vec());
        page.next_cursor = (end < all.len()).then(|| end.to_string());
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let result = match request.name.as_ref() {
            "add" => {
                let sum = args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0);
                let mut r = CallToolResult::success(vec![ContentBlock::text(sum.to_string())]);
                r.structured_content = Some(json!({"sum": sum}));
                r
            }
            "note" => CallToolResult::success(vec![ContentBlock::text("noted")]),
            "fail" => CallToolResult::error(vec![ContentBlock::text("the calendar is locked")]),
            "slow" | "lookup" => {
                let ms = args["ms"].as_u64().unwrap_or(1_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                CallToolResult::success(vec![ContentBlock::text("done slowly")])
            }
            // The names of the variables it was started with (a local server only).
            "env" => {
                let mut names: Vec<String> = std::env::vars_os()
                    .map(|(k, _)| k.to_string_lossy().into_owned())
                    .collect();
                names.sort();
                CallToolResult::success(vec![ContentBlock::text(names.join(","))])
            }
            // A long answer: `bytes` of text (900,000 unless told).
            "big" => {
                let n = args["bytes"].as_u64().unwrap_or(900_000) as usize;
                CallToolResult::success(vec![ContentBlock::text("b".repeat(n))])
            }
            "picture" => CallToolResult::success(vec![
                ContentBlock::text("a red dot"),
                ContentBlock::image("aGVsbG8=", "image/png"),
            ]),
            other => {
                return Err(ErrorData::invalid_params(format!("no tool {other}"), None));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Records each `tools/call` with its header (every one that arrived, acted on or not),
/// and answers 404 (the session expired) to the next request in a session when a test
/// asks for it.
async fn watch(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    let in_session = req.headers().contains_key("mcp-session-id");
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, 4 << 20).await.unwrap_or_default();
    if let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        && v["method"] == "tools/call"
    {
        shared.calls.lock().unwrap().push(Call {
            name: v["params"]["name"].as_str().unwrap_or_default().to_owned(),
            arguments: v["params"]["arguments"].clone(),
            idempotency_key: parts
                .headers
                .get("idempotency-key")
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned),
        });
    }
    // Recorded first: a request answered "expired" arrived, and was not acted on.
    if in_session
        && parts.method == axum::http::Method::POST
        && shared.expire_next.swap(false, Ordering::SeqCst)
    {
        *shared.expired.lock().unwrap() += 1;
        return (StatusCode::NOT_FOUND, "session expired").into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

impl FakeMcp {
    /// Starts it on a free loopback port.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        *shared.tools.lock().unwrap() = first_tools();
        let handler = Handler(shared.clone());
        let service: StreamableHttpService<Handler, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(handler.clone()),
                Default::default(),
                StreamableHttpServerConfig::default().with_sse_keep_alive(None),
            );
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(middleware::from_fn_with_state(shared.clone(), watch));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Every `tools/call` that reached it, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.calls.lock().unwrap().clone()
    }

    /// How many sessions were initialized.
    pub fn sessions(&self) -> u32 {
        *self.shared.initialized.lock().unwrap()
    }

    /// How many requests were answered "session expired".
    pub fn expired(&self) -> u32 {
        *self.shared.expired.lock().unwrap()
    }

    /// The next request in a session is answered 404, as a server that forgot it.
    pub fn expire_next(&self) {
        self.shared.expire_next.store(true, Ordering::SeqCst);
    }

    /// From now on every `tools/list` page names a next one, forever.
    pub fn page_forever(&self) {
        self.shared.endless.store(true, Ordering::SeqCst);
    }

    /// How many `tools/list` pages it served.
    pub fn pages(&self) -> u32 {
        *self.shared.pages.lock().unwrap()
    }

    /// Tells connected clients the list changed, without changing it.
    pub async fn say_tools_changed(&self) {
        let peers = self.shared.peers.lock().unwrap().clone();
        for p in peers {
            let _ = p.notify_tool_list_changed().await;
        }
    }

    /// Adds `n` tools (`wide0`, `wide1`, …), each with a description of 1,000
    /// characters and an input schema of about 15 KiB, and tells connected clients the
    /// list changed.
    pub async fn add_wide_tools(&self, n: usize) {
        let schema = json!({"type": "object", "description": "w".repeat(15_000)});
        self.shared
            .tools
            .lock()
            .unwrap()
            .extend((0..n).map(|i| tool(&format!("wide{i}"), &"d".repeat(1_000), schema.clone())));
        let peers = self.shared.peers.lock().unwrap().clone();
        for p in peers {
            let _ = p.notify_tool_list_changed().await;
        }
    }

    /// Adds a tool and tells connected clients the list changed.
    pub async fn add_tool(&self, name: &str, description: &str) {
        self.shared
            .tools
            .lock()
            .unwrap()
            .push(tool(name, description, json!({"type": "object"})));
        let peers = self.shared.peers.lock().unwrap().clone();
        for p in peers {
            let _ = p.notify_tool_list_changed().await;
        }
    }
}

/// Serves the same tools, and `env` (the names of its environment variables), over
/// stdin and stdout until the client goes away: the `fake-mcp-stdio` program.
pub async fn serve_stdio() {
    use rmcp::ServiceExt;
    let shared = Arc::new(Shared::default());
    let mut tools = first_tools();
    tools.push(tool(
        "env",
        "Names the environment variables it was given.",
        json!({"type": "object"}),
    ));
    *shared.tools.lock().unwrap() = tools;
    let running = Handler(shared)
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .expect("an MCP client on stdin and stdout");
    let _ = running.waiting().await;
}

impl Drop for FakeMcp {
    fn drop(&mut self) {
        self.task.abort();
    }
}
