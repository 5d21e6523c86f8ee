//! Running the `pulse` binary as a user does, in a directory of its own.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output};

use serde_json::Value;

/// `pulse args` in `dir` with the offline model, no Discord, no dashboard token and
/// loopback allowed, whatever the developer's shell has.
pub(crate) fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pulse"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("PULSE_DB")
        .env_remove("PULSE_BACKEND")
        .env_remove("PULSE_DASHBOARD_TOKEN")
        .env_remove("PULSE_ENCRYPTION_KEY")
        .env_remove("PULSE_ENCRYPTION_KEY_FILE")
        .env("PULSE_LLM_PROVIDER", "offline")
        .env_remove("DISCORD_BOT_TOKEN")
        .env_remove("DISCORD_APPLICATION_ID")
        .env("PULSE_EVENT_SETTLE", "0s")
        // The word embedder, whatever model this machine has installed.
        .env_remove("PULSE_EMBED_MODEL")
        .env("PULSE_MODELS_DIR", dir.join("no-models"))
        // The fake tools and hook receivers listen on loopback, which outbound requests
        // may not reach unless allowed.
        .env("PULSE_HOOKS_ALLOW", "127.0.0.1/32");
    for (k, v) in backend_env(dir) {
        cmd.env(k, v);
    }
    cmd
}

/// A loopback port nothing listens on (for now).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The file in a test's directory naming the backend its commands use (`KEY=VALUE`
/// lines); none means SQLite.
const BACKEND_ENV: &str = "pulse-test-backend.env";

fn backend_env(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join(BACKEND_ENV))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Which backend a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    /// A fresh table and queues on the moto server (`PULSE_TEST_MOTO_URL`), made by
    /// `pulse init`.
    Aws,
}

/// A directory whose `pulse` commands run on `backend`.
pub(crate) fn dir_on(backend: Backend) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if backend == Backend::Aws {
        on_aws(dir.path());
    }
    dir
}

/// What an emulator user sets: the moto endpoint, a region and static keys.
pub(crate) fn emulator_env() -> [(&'static str, String); 4] {
    [
        ("AWS_ENDPOINT_URL", pulse_tests::moto_url()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
    ]
}

/// Points `dir`'s commands at a fresh table and queues on moto, as a user would:
/// static keys and a region for the emulator, then `pulse init` and its exports (which
/// name the key file it made in `dir`).
pub(crate) fn on_aws(dir: &Path) {
    let mut vars: Vec<(String, String)> = emulator_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    vars.push(("PULSE_BACKEND".to_owned(), "aws".to_owned()));
    write_backend_env(dir, &vars);
    let name = pulse_tests::unique("cli").replace('.', "-");
    let made = json(dir, &["init", "--name", &name]);
    for (k, v) in made.as_object().unwrap() {
        vars.push((k.clone(), v.as_str().unwrap().to_owned()));
    }
    write_backend_env(dir, &vars);
}

fn write_backend_env(dir: &Path, vars: &[(String, String)]) {
    let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(dir.join(BACKEND_ENV), text).unwrap();
}

/// A test on both backends: `both!(name, body)` makes `name::sqlite` and `name::aws`,
/// each calling `body(backend)`.
#[macro_export]
macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn sqlite() {
                super::$body($crate::common::Backend::Sqlite)
            }
            #[test]
            fn aws() {
                super::$body($crate::common::Backend::Aws)
            }
        }
    };
}

/// [`both!`] for an async body.
#[macro_export]
macro_rules! both_async {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body($crate::common::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn aws() {
                super::$body($crate::common::Backend::Aws).await
            }
        }
    };
}

/// Sends SIGTERM to `child` (a `pulse serve`, say) and waits for it to exit: its output.
pub(crate) fn terminate(child: Child) -> Output {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIGTERM to {}", child.id());
    child.wait_with_output().expect("it exits")
}

/// Runs `pulse args` in `dir` (see [`command`]).
pub(crate) fn pulse(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("pulse runs")
}

pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let out = pulse(dir, args);
    assert!(
        out.status.success(),
        "pulse {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(crate) fn json(dir: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&ok(dir, &all)).unwrap()
}

pub(crate) fn bad(dir: &Path, args: &[&str]) -> String {
    let out = pulse(dir, args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "pulse {args:?} should reject its input"
    );
    String::from_utf8(out.stderr).unwrap()
}

/// Polls `f` every 50 ms until it holds; fails naming `what` past `limit`. How long it
/// took.
pub(crate) fn wait_until(
    what: &str,
    limit: std::time::Duration,
    mut f: impl FnMut() -> bool,
) -> std::time::Duration {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    start.elapsed()
}

/// A child process killed (and waited for) when dropped, so that a test that fails
/// half-way leaves no process behind.
pub(crate) struct Running(pub(crate) Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
