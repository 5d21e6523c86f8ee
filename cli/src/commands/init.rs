//! `pulse init`: what the configured backend needs, made once. On AWS (an emulator, or
//! an account tried without SAM) the table and the four queues as `infra/template.yaml`
//! declares them, reused when they exist after their shape is checked; on the embedded
//! store the database file, created or migrated. Prints the `export` lines to use it.

use std::path::PathBuf;

use clap::Args;
use pulse_shared::adapters::aws;
use pulse_shared::config::Env;

use crate::Failure;
use crate::output::{Out, outln};

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// On AWS: the table's name and the queues' prefix (NAME-sessions.fifo,
    /// NAME-sessions-dlq.fifo, NAME-hooks, NAME-hooks-dlq).
    #[arg(long, default_value = "pulse", value_name = "NAME")]
    name: String,
}

/// A name DynamoDB and SQS both take, with room for the queues' suffixes.
fn valid_name(name: &str) -> Result<(), Failure> {
    let ok = (3..=60).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Failure::Input(format!(
            "invalid --name {name:?}: use 3 to 60 letters, digits, '-' or '_' (it names the table and prefixes the queues)"
        )))
    }
}

/// `export NAME='value'`, quoted for a POSIX shell.
fn export(name: &str, value: &str) -> String {
    format!("export {name}='{}'", value.replace('\'', r"'\''"))
}

fn print(out: &Out, vars: &[(&str, String)]) {
    if out.json {
        let doc: serde_json::Map<String, serde_json::Value> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone().into()))
            .collect();
        out.json_value(&doc);
    } else {
        for (k, v) in vars {
            outln!("{}", export(k, v));
        }
    }
}

pub(crate) async fn run(
    a: InitArgs,
    db: Option<PathBuf>,
    stack: Option<&str>,
    out: &Out,
) -> Result<(), Failure> {
    let name = a.name.trim();
    valid_name(name)?;
    if let Some(stack) = stack {
        return Err(Failure::Input(format!(
            "PULSE_STACK (--stack) names the deployed stack {stack:?}, whose resources SAM made: pulse init is for an emulator or a trial without SAM; unset PULSE_STACK to use it"
        )));
    }
    let env = Env::process();
    match env.var("PULSE_BACKEND").as_deref().map(str::trim) {
        None | Some("sqlite") => sqlite(db, out).await,
        Some("aws") => {
            let endpoint = env.var("AWS_ENDPOINT_URL");
            let clients = aws::AwsClients::new(endpoint.as_deref()).await;
            let names = aws::Names::new(name);
            eprintln!(
                "setting up {} for Pulse…",
                endpoint.as_deref().unwrap_or("AWS")
            );
            let mut progress = |line: &str| eprintln!("  {line}");
            let made = aws::init(&clients, endpoint.as_deref(), &names, &mut progress)
                .await
                .map_err(|e| Failure::Runtime(e.into()))?;
            let region = aws::region(endpoint.as_deref())
                .await
                .map_err(|e| Failure::Runtime(e.into()))?;
            let mut vars = vec![("PULSE_BACKEND", "aws".to_owned())];
            if let Some(url) = endpoint {
                vars.push(("AWS_ENDPOINT_URL", url));
            }
            vars.extend([
                ("AWS_REGION", region),
                ("PULSE_TABLE", made.table),
                ("PULSE_SESSIONS_QUEUE_URL", made.sessions_queue_url),
                ("PULSE_HOOKS_QUEUE_URL", made.hooks_queue_url),
                ("PULSE_HOOKS_DLQ_URL", made.hooks_dlq_url),
            ]);
            if let Some(file) = key_home(name)? {
                vars.push(("PULSE_ENCRYPTION_KEY_FILE", file));
            }
            eprintln!(
                "ready. The CLI and the functions read these (eval \"$(pulse init)\" sets them):"
            );
            print(out, &vars);
            Ok(())
        }
        Some(other) => Err(Failure::Input(format!(
            "configuration: PULSE_BACKEND {other:?} is not a backend; use sqlite or aws"
        ))),
    }
}

/// Where the key webhook and hook secrets are sealed with lives, so every shell that
/// evaluates these exports uses the same one: `PULSE_ENCRYPTION_KEY` from the environment
/// (nothing to export), the key file `PULSE_ENCRYPTION_KEY_FILE` already names, or the
/// key file `NAME.key` in this directory, made (mode 0600) the first time.
fn key_home(name: &str) -> Result<Option<String>, Failure> {
    let env = Env::process();
    if env.var("PULSE_ENCRYPTION_KEY").is_some() {
        eprintln!(
            "secrets are sealed with PULSE_ENCRYPTION_KEY from your environment: give every shell the same key"
        );
        return Ok(None);
    }
    if let Some(file) = env.var("PULSE_ENCRYPTION_KEY_FILE") {
        return Ok(Some(file));
    }
    let dir = std::env::current_dir()
        .map_err(|e| Failure::Runtime(anyhow::anyhow!("the working directory: {e}")))?;
    let path = dir.join(format!("{name}.key"));
    let (_, made) =
        pulse_shared::sealing::key_file(&path, true).map_err(|e| Failure::Runtime(e.into()))?;
    eprintln!(
        "{} {}: webhook and hook secrets are sealed with it; keep it (and back it up) with this stack",
        if made {
            "made the key file"
        } else {
            "the key file"
        },
        path.display()
    );
    Ok(Some(path.display().to_string()))
}

/// Creates or migrates the database file.
async fn sqlite(db: Option<PathBuf>, out: &Out) -> Result<(), Failure> {
    let config = super::configuration(db)?;
    let pulse_shared::config::Backend::Sqlite { path } = &config.backend else {
        unreachable!("PULSE_BACKEND is sqlite or unset");
    };
    let existed = path.exists();
    let clock: std::sync::Arc<dyn pulse_shared::ports::Clock> =
        std::sync::Arc::new(pulse_shared::ports::SystemClock);
    pulse_shared::app::connect(&config, clock).await?;
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
    eprintln!(
        "SQLite database {}: {}",
        path.display(),
        if existed {
            "exists, its schema is up to date"
        } else {
            "created"
        }
    );
    print(out, &[("PULSE_DB", path.display().to_string())]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_quoted_for_the_shell() {
        assert_eq!(export("A", "x"), "export A='x'");
        assert_eq!(export("A", "it's"), r"export A='it'\''s'");
    }

    #[test]
    fn names_fit_dynamodb_and_sqs() {
        assert!(valid_name("pulse").is_ok());
        assert!(valid_name("my_pulse-2").is_ok());
        assert!(valid_name("pu").is_err());
        assert!(valid_name("a.b").is_err());
        assert!(valid_name(&"x".repeat(61)).is_err());
    }
}
