//! IAM enforced on the emulator: the moto server `scripts/test.sh` starts for it
//! (`PULSE_TEST_MOTO_IAM_URL`) checks every request's signature and authorises it against
//! the signer's policy, by action and by resource (see `scripts/moto_server.py`). Each
//! function gets a user whose policy is its role's statements read from
//! `infra/template.yaml` by `scripts/roles.py`, so a run under those credentials is
//! allowed exactly what a deployment's role allows; the refusals moto makes are appended
//! to `PULSE_TEST_MOTO_IAM_DENIALS`, so one a function's code swallows (logged as a
//! warning, say) still fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// The emulator's account and region, as ARNs name them.
pub const ACCOUNT: &str = "123456789012";
/// The region every test uses.
pub const REGION: &str = "us-east-1";

/// An access key.
#[derive(Clone, Debug)]
pub struct Keys {
    /// `AWS_ACCESS_KEY_ID`.
    pub id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret: String,
    /// The variables the template sets for the function (empty for the admin).
    pub environment: Vec<String>,
}

/// The users made from the template's roles, and the refusals since they were made.
pub struct Users {
    /// An administrator, for the test's own setup and reading back.
    pub admin: Keys,
    by_function: BTreeMap<String, Keys>,
    denials: PathBuf,
    seen: Mutex<u64>,
}

pub(crate) fn var(name: &str, what: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run ./scripts/test.sh, which sets it ({what})")
    })
}

/// The IAM-enforcing emulator's URL.
pub fn moto_iam_url() -> String {
    var(
        "PULSE_TEST_MOTO_IAM_URL",
        "a moto server of its own, for IAM",
    )
}

pub(crate) fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// What the template's references stand for on the emulator, for resources named
/// `table`, the queues and `secrets_path`.
pub fn resolve(
    table: &str,
    sessions: &str,
    hooks: &str,
    hooks_dlq: &str,
    secrets_path: &str,
) -> Value {
    let sqs = |q: &str| format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{q}");
    serde_json::json!({
        "Table.Arn": format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"),
        "SessionsQueue.Arn": sqs(sessions),
        "HooksQueue.Arn": sqs(hooks),
        "HooksDeadLetterQueue.Arn": sqs(hooks_dlq),
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "SecretsPath": secrets_path,
    })
}

impl Users {
    /// Switches IAM on at `endpoint` (a moto server nothing else has used) and makes an
    /// administrator and a user per role of the template, resolved with `resolve`.
    pub fn create(endpoint: &str, resolve: &Value) -> Self {
        let python = var(
            "PULSE_TEST_PYTHON",
            "the venv's Python, with moto and cfn-lint",
        );
        let denials = PathBuf::from(var(
            "PULSE_TEST_MOTO_IAM_DENIALS",
            "the file the IAM moto server appends its refusals to",
        ));
        let seen = std::fs::metadata(&denials).map_or(0, |m| m.len());
        let out = Command::new(&python)
            .arg(workspace().join("scripts/roles.py"))
            .arg("moto-users")
            .arg(workspace().join("infra/template.yaml"))
            .arg(endpoint)
            .arg(resolve.to_string())
            .output()
            .unwrap_or_else(|e| panic!("running {python} scripts/roles.py: {e}"));
        assert!(
            out.status.success(),
            "scripts/roles.py moto-users failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let keys = |v: &Value| Keys {
            id: v["access_key_id"].as_str().unwrap().to_owned(),
            secret: v["secret_access_key"].as_str().unwrap().to_owned(),
            environment: v["environment"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
        };
        let by_function = doc
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "admin")
            .map(|(k, v)| (k.clone(), keys(v)))
            .collect();
        Self {
            admin: keys(&doc["admin"]),
            by_function,
            denials,
            seen: Mutex::new(seen),
        }
    }

    /// The keys of `function`'s role (a binary's name, or `gateway`).
    pub fn of(&self, function: &str) -> &Keys {
        self.by_function
            .get(function)
            .unwrap_or_else(|| panic!("the template gives {function} no role"))
    }

    /// `env` as the template gives it to `function`: a variable the template sets for
    /// another function but not this one is left out (a stand-in's own, such as the
    /// LLM's loopback URL, is kept), and the function's own keys added.
    pub fn environment_of(
        &self,
        function: &str,
        env: &[(String, String)],
    ) -> Vec<(String, String)> {
        let own = self.of(function);
        let templated = |k: &str| {
            self.by_function
                .values()
                .any(|f| f.environment.iter().any(|n| n == k))
        };
        let mut out: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| !templated(k) || own.environment.iter().any(|n| n == k))
            .cloned()
            .collect();
        out.push(("AWS_ACCESS_KEY_ID".into(), own.id.clone()));
        out.push(("AWS_SECRET_ACCESS_KEY".into(), own.secret.clone()));
        out
    }

    /// The refusals since the last call, as "function: action on resource".
    pub fn new_denials(&self) -> Vec<String> {
        let mut seen = self.seen.lock().unwrap();
        let all = std::fs::read(&self.denials).unwrap_or_default();
        let start = (*seen as usize).min(all.len());
        *seen = all.len() as u64;
        String::from_utf8_lossy(&all[start..])
            .lines()
            .filter_map(|line| {
                let mut parts = line.split('\t');
                // Users are named `<function>@<run>`.
                let user = parts.next()?.rsplit('/').next()?;
                let function = user.split('@').next()?.to_owned();
                Some(format!(
                    "{function}: {} on {}",
                    parts.next()?,
                    parts.next()?
                ))
            })
            .collect()
    }
}
