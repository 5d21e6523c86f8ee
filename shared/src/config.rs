//! Typed configuration from the environment, validated at start. Every error names the
//! variable at fault and what it expects.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `PULSE_BACKEND` | `sqlite` or `aws` | `sqlite` (the Lambda functions always use `aws`) |
//! | `PULSE_DB` | SQLite file | `./pulse.db` |
//! | `PULSE_TABLE` | DynamoDB table | required for `aws` |
//! | `PULSE_SESSIONS_QUEUE_URL` | SQS FIFO queue URL | required for `aws` |
//! | `AWS_ENDPOINT_URL` | an emulator instead of AWS | unset |
//! | `PULSE_LEASE` | claim lease | `10m` |
//! | `PULSE_EVENT_SETTLE` | how far behind its claim a window ends | `2s` |
//! | `PULSE_CASCADE_DEPTH` | cascade depth cap | `3` |
//! | `PULSE_MAX_WINDOW_EVENTS` | window events per heartbeat | `500` |
//! | `PULSE_SWEEP_MAX` | claims per sweep | `10000` |
//! | `PULSE_REGISTRY_TTL` | how long a worker caches tools and subscriptions | `10s` |

use std::path::PathBuf;

use jiff::SignedDuration;

use crate::adapters::aws::AwsSettings;
use crate::domain::parse_duration;
use crate::engine::EngineSettings;
use crate::error::ConfigError;

/// Which backend to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file.
    Sqlite {
        /// Its path.
        path: PathBuf,
    },
    /// DynamoDB and SQS.
    Aws(AwsSettings),
}

/// Everything configurable.
#[derive(Clone, Debug)]
pub struct Config {
    /// The backend.
    pub backend: Backend,
    /// Engine tunables.
    pub engine: EngineSettings,
}

/// Reads variables through `lookup` (the process environment in production).
pub struct Env<F: Fn(&str) -> Option<String>>(pub F);

impl Env<fn(&str) -> Option<String>> {
    /// The process environment.
    pub fn process() -> Self {
        Env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn get(&self, k: &str) -> Option<String> {
        (self.0)(k)
    }

    fn duration(
        &self,
        var: &'static str,
        default: SignedDuration,
    ) -> Result<SignedDuration, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            Some(v) => {
                let d =
                    parse_duration("duration", &v).map_err(|e| ConfigError::new(var, e.message))?;
                if d.is_negative() {
                    return Err(ConfigError::new(var, format!("{v:?} is negative")));
                }
                Ok(d)
            }
        }
    }

    fn number<T>(&self, var: &'static str, default: T, min: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        match self.get(var) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<T>() {
                Ok(n) if n >= min => Ok(n),
                _ => Err(ConfigError::new(
                    var,
                    format!("{v:?} is not a whole number of at least {min}"),
                )),
            },
        }
    }

    /// The engine settings.
    pub fn engine(&self) -> Result<EngineSettings, ConfigError> {
        let d = EngineSettings::default();
        let settings = EngineSettings {
            lease: self.duration("PULSE_LEASE", d.lease)?,
            event_settle: self.duration("PULSE_EVENT_SETTLE", d.event_settle)?,
            cascade_depth: self.number("PULSE_CASCADE_DEPTH", d.cascade_depth, 0)?,
            max_window_events: self.number("PULSE_MAX_WINDOW_EVENTS", d.max_window_events, 1)?,
            sweep_max: self.number("PULSE_SWEEP_MAX", d.sweep_max, 1)?,
            registry_ttl: self.duration("PULSE_REGISTRY_TTL", d.registry_ttl)?,
            ..d
        };
        if settings.lease < SignedDuration::from_secs(1) {
            return Err(ConfigError::new(
                "PULSE_LEASE",
                "use at least 1s (the default is 10m)",
            ));
        }
        Ok(settings)
    }

    /// The AWS resources.
    pub fn aws(&self) -> Result<AwsSettings, ConfigError> {
        let required = |var: &'static str, what: &str| {
            self.get(var)
                .ok_or_else(|| ConfigError::new(var, format!("is not set; give the {what}")))
        };
        Ok(AwsSettings {
            table: required("PULSE_TABLE", "DynamoDB table name")?,
            sessions_queue_url: required("PULSE_SESSIONS_QUEUE_URL", "sessions FIFO queue URL")?,
            endpoint_url: self.get("AWS_ENDPOINT_URL"),
        })
    }

    /// The backend: `PULSE_BACKEND`, with `db` (from `--db`) taking precedence over
    /// `PULSE_DB` for SQLite.
    pub fn backend(&self, db: Option<PathBuf>) -> Result<Backend, ConfigError> {
        match self.get("PULSE_BACKEND").as_deref().map(str::trim) {
            None | Some("sqlite") => Ok(Backend::Sqlite {
                path: db
                    .or_else(|| self.get("PULSE_DB").map(PathBuf::from))
                    .unwrap_or_else(|| PathBuf::from("pulse.db")),
            }),
            Some("aws") => Ok(Backend::Aws(self.aws()?)),
            Some(other) => Err(ConfigError::new(
                "PULSE_BACKEND",
                format!("{other:?} is not a backend; use sqlite or aws"),
            )),
        }
    }

    /// The configuration of a Lambda function: always the AWS backend.
    pub fn lambda(&self) -> Result<Config, ConfigError> {
        Ok(Config {
            backend: Backend::Aws(self.aws()?),
            engine: self.engine()?,
        })
    }

    /// The whole configuration.
    pub fn config(&self, db: Option<PathBuf>) -> Result<Config, ConfigError> {
        Ok(Config {
            backend: self.backend(db)?,
            engine: self.engine()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Env<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env(move |k: &str| map.get(k).cloned())
    }

    #[test]
    fn the_default_backend_is_the_embedded_file() {
        let c = env(&[]).config(None).unwrap();
        assert_eq!(
            c.backend,
            Backend::Sqlite {
                path: "pulse.db".into()
            }
        );
        let c = env(&[("PULSE_DB", "/tmp/x.db")])
            .config(Some("cli.db".into()))
            .unwrap();
        assert_eq!(
            c.backend,
            Backend::Sqlite {
                path: "cli.db".into()
            }
        );
    }

    #[test]
    fn aws_needs_its_table_and_queue_and_says_which_is_missing() {
        let err = env(&[("PULSE_BACKEND", "aws"), ("PULSE_TABLE", "t")])
            .config(None)
            .unwrap_err();
        assert_eq!(err.variable, "PULSE_SESSIONS_QUEUE_URL");
        let err = env(&[("PULSE_BACKEND", "cloud")]).config(None).unwrap_err();
        assert_eq!(err.variable, "PULSE_BACKEND");
    }

    #[test]
    fn bad_tunables_name_their_variable() {
        let err = env(&[("PULSE_LEASE", "forever")]).engine().unwrap_err();
        assert_eq!(err.variable, "PULSE_LEASE");
        let err = env(&[("PULSE_MAX_WINDOW_EVENTS", "0")])
            .engine()
            .unwrap_err();
        assert_eq!(err.variable, "PULSE_MAX_WINDOW_EVENTS");
        let ok = env(&[("PULSE_EVENT_SETTLE", "5s"), ("PULSE_CASCADE_DEPTH", "2")])
            .engine()
            .unwrap();
        assert_eq!(ok.event_settle, SignedDuration::from_secs(5));
        assert_eq!(ok.cascade_depth, 2);
    }
}
