//! A stand-in for the Lambda service around one function: the runtime API a function's
//! `lambda_runtime` polls (`/2018-06-01/runtime/...`: the next invocation, its response,
//! its error, an init error), on a loopback port, and the function's executable started
//! against it with the environment Lambda gives (`AWS_LAMBDA_RUNTIME_API`,
//! `AWS_LAMBDA_FUNCTION_NAME` and the rest) plus the test's own variables — its own
//! credentials among them, so each function can run under its own IAM policy.
//!
//! The executable may run under a runner (`qemu-aarch64-static -L <sysroot>` for an
//! arm64 build on this machine). [`Function::invoke`] hands the function one event, as Lambda's invoke
//! does, and returns its response document, or its error document; if the process dies
//! or sends nothing in time, it panics with the function's log.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{Notify, oneshot};

#[derive(Default)]
struct Api {
    name: String,
    waiting: Mutex<VecDeque<(String, Value)>>,
    arrived: Notify,
    answers: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    init_error: Mutex<Option<Value>>,
}

/// One function, started under the stand-in; stopped when dropped.
pub struct Function {
    name: String,
    api: Arc<Api>,
    child: Mutex<Child>,
    log: PathBuf,
    server: tokio::task::JoinHandle<()>,
    next_id: Mutex<u64>,
}

/// A built function's executable in this workspace's target directory (`cargo build
/// --workspace --bins` builds them; the test command does so before the tests).
pub fn built(binary: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test binary> → target/<profile>/<binary>
    let path = exe.parent().unwrap().parent().unwrap().join(binary);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace --bins` (./scripts/test.sh does)",
        path.display()
    );
    path
}

impl Function {
    /// Starts `executable` (under `runner`, a program and its arguments, if not empty)
    /// as the function `name`, with `env`, its output in `dir/<name>.log`.
    pub async fn start(
        name: &str,
        executable: &Path,
        runner: &[String],
        env: &[(String, String)],
        dir: &Path,
    ) -> Self {
        let api = Arc::new(Api {
            name: name.to_owned(),
            ..Api::default()
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = match runner.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(executable);
                c
            }
            None => Command::new(executable),
        };
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "2026/12/02/[$LATEST]test")
            .env("LAMBDA_TASK_ROOT", dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", executable.display()));
        Self {
            name: name.to_owned(),
            api,
            child: Mutex::new(child),
            log,
            server,
            next_id: Mutex::new(0),
        }
    }

    /// What the function has printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Hands the function `event` and waits (up to five minutes) for its response
    /// document, or its error document (`errorType`, `errorMessage`).
    pub async fn invoke(&self, event: &Value) -> Value {
        let id = {
            let mut n = self.next_id.lock().unwrap();
            *n += 1;
            format!("{}-{:04}", self.name, *n)
        };
        let (tx, mut rx) = oneshot::channel();
        self.api.answers.lock().unwrap().insert(id.clone(), tx);
        self.api
            .waiting
            .lock()
            .unwrap()
            .push_back((id, event.clone()));
        self.api.arrived.notify_one();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        loop {
            match tokio::time::timeout(Duration::from_millis(100), &mut rx).await {
                Ok(answer) => return answer.unwrap(),
                Err(_) => {
                    if let Some(e) = self.api.init_error.lock().unwrap().clone() {
                        panic!("{} failed to start: {e}; log:\n{}", self.name, self.log());
                    }
                    if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                        panic!("{} exited ({status}); log:\n{}", self.name, self.log());
                    }
                    if tokio::time::Instant::now() > deadline {
                        panic!(
                            "{} did not answer in 300 s; log:\n{}",
                            self.name,
                            self.log()
                        );
                    }
                }
            }
        }
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        self.server.abort();
    }
}

async fn next(State(api): State<Arc<Api>>) -> impl IntoResponse {
    loop {
        let notified = api.arrived.notified();
        if let Some((id, event)) = api.waiting.lock().unwrap().pop_front() {
            let mut headers = HeaderMap::new();
            let deadline = jiff::Timestamp::now().as_millisecond() + 300_000;
            let set = |h: &mut HeaderMap, k: &'static str, v: String| {
                h.insert(k, HeaderValue::from_str(&v).unwrap());
            };
            set(&mut headers, "lambda-runtime-aws-request-id", id.clone());
            set(
                &mut headers,
                "lambda-runtime-deadline-ms",
                deadline.to_string(),
            );
            set(
                &mut headers,
                "lambda-runtime-invoked-function-arn",
                format!(
                    "arn:aws:lambda:us-east-1:123456789012:function:{}",
                    api.name
                ),
            );
            set(
                &mut headers,
                "lambda-runtime-trace-id",
                format!("Root=1-00000000-{id}"),
            );
            return (StatusCode::OK, headers, event.to_string());
        }
        notified.await;
    }
}

async fn response(
    State(api): State<Arc<Api>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    answer(&api, &id, body)
}

async fn error(
    State(api): State<Arc<Api>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    answer(&api, &id, body)
}

fn answer(api: &Api, id: &str, body: Bytes) -> StatusCode {
    let doc = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    match api.answers.lock().unwrap().remove(id) {
        Some(tx) => {
            let _ = tx.send(doc);
            StatusCode::ACCEPTED
        }
        None => StatusCode::BAD_REQUEST,
    }
}

async fn init_error(State(api): State<Arc<Api>>, body: Bytes) -> StatusCode {
    *api.init_error.lock().unwrap() = Some(
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned())),
    );
    StatusCode::ACCEPTED
}
