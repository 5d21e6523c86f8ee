//! Typed configuration from the environment, validated at start. Every error names the
//! variable at fault and what it expects.
//!
//! Every variable, with its default and what a wrong value does, is listed in
//! [`variables::VARIABLES`], from which the book's configuration page is made.

mod model_dir;
pub mod variables;

pub use model_dir::{MINILM_DIR, MODEL_FILES, ModelDir, ModelDirError, default_models_dir};

use std::path::PathBuf;

use jiff::SignedDuration;

use std::time::Duration;

use url::Url;

use crate::discord::DiscordConfig;
use crate::domain::{AgentId, ProviderKind, Retention, Secret, parse_duration};
use crate::engine::EngineSettings;
use crate::engine::reminders::ScheduleLimits;
use crate::error::{ConfigError, ValidationError};
use crate::llm::{KeyLookup, LlmConfig};
use crate::sealing::EncryptionKeys;
use crate::slack::SlackConfig;
use crate::telegram::TelegramConfig;

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

/// What an acknowledgement of the embedded store promises (`PULSE_DURABILITY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Every commit is synced to the disk before its callers are answered (SQLite's
    /// `synchronous = FULL`; the calls that arrive together share one commit and one
    /// sync): a 2xx survives a power cut.
    #[default]
    Synced,
    /// Commits are synced in the background, every 4 MB of log and at each copy of the
    /// log into the database (`synchronous = NORMAL`): a crash of the process loses
    /// nothing, a power cut or a kernel crash may lose the last acknowledged writes.
    Relaxed,
}

impl Durability {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Synced => "synced",
            Self::Relaxed => "relaxed",
        }
    }

    /// What a 2xx promises under it, in a sentence.
    pub fn promise(self) -> &'static str {
        match self {
            Self::Synced => "every acknowledgement waits for its commit to reach the disk",
            Self::Relaxed => {
                "acknowledgements do not wait for the disk: a power cut may lose the last few MB of acknowledged writes"
            }
        }
    }
}

/// Where the AWS resources are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsSettings {
    /// The DynamoDB table (`PULSE_TABLE`).
    pub table: String,
    /// The sessions FIFO queue's URL (`PULSE_SESSIONS_QUEUE_URL`).
    pub sessions_queue_url: String,
    /// The hooks standard queue's URL (`PULSE_HOOKS_QUEUE_URL`); unset, hooks are not
    /// emitted (logged at start).
    pub hooks_queue_url: Option<String>,
    /// The hooks dead-letter queue's URL (`PULSE_HOOKS_DLQ_URL`).
    pub hooks_dlq_url: Option<String>,
    /// An endpoint to use instead of AWS's (an emulator); `AWS_ENDPOINT_URL` works too.
    pub endpoint_url: Option<String>,
}

/// Everything configurable.
#[derive(Clone, Debug)]
pub struct Config {
    /// The backend.
    pub backend: Backend,
    /// Engine tunables.
    pub engine: EngineSettings,
    /// The LLM providers.
    pub llm: LlmConfig,
    /// Discord.
    pub discord: DiscordConfig,
    /// Telegram.
    pub telegram: TelegramConfig,
    /// Slack.
    pub slack: SlackConfig,
    /// The HTTP receiver.
    pub inbound: InboundConfig,
    /// Outbound hooks and requests.
    pub hooks: HooksConfig,
    /// `PULSE_ENCRYPTION_KEY` (+ old keys); `None` when unset (see [`crate::app::connect`]).
    pub encryption: Option<EncryptionKeys>,
    /// `PULSE_RETENTION`: how long finished records are kept, unless an agent says
    /// otherwise.
    pub retention: Retention,
    /// The embeddings model memories are recalled by.
    pub embed: EmbedConfig,
    /// `PULSE_DURABILITY`: what the embedded store's acknowledgements promise.
    pub durability: Durability,
}

/// The embeddings model (`PULSE_EMBED_*`, `PULSE_MODELS_DIR`).
#[derive(Clone, Debug)]
pub struct EmbedConfig {
    /// Where vectors come from.
    pub source: EmbedSource,
    /// `PULSE_EMBED_BASE_URL`: an OpenAI-compatible API (`…/v1`).
    pub base_url: Url,
    /// `PULSE_EMBED_DIMENSIONS`, asked of the model when set.
    pub dimensions: Option<usize>,
    /// `PULSE_EMBED_API_KEY`, or `OPENAI_API_KEY` for OpenAI's own API: sent to the base
    /// URL only.
    pub api_key: Option<Secret>,
    /// One request's time limit.
    pub timeout: std::time::Duration,
}

/// Where memories' vectors come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmbedSource {
    /// An embeddings API: `PULSE_EMBED_MODEL`, e.g. `text-embedding-3-small`.
    Api {
        /// The model asked for.
        model: String,
    },
    /// A model run in the process: `PULSE_EMBED_MODEL=local:PATH`, or all-MiniLM-L6-v2
    /// installed beside the database or in the models directory when nothing is set.
    Local {
        /// The model's directory.
        dir: ModelDir,
        /// Found installed rather than configured.
        installed: bool,
    },
    /// The offline word embedder: nothing configured or installed, or
    /// `PULSE_EMBED_MODEL=words` (`chosen`).
    Words {
        /// Asked for by name.
        chosen: bool,
    },
}

impl Default for EmbedConfig {
    fn default() -> Self {
        Self {
            source: EmbedSource::Words { chosen: false },
            base_url: Url::parse(OPENAI_EMBED_BASE).expect("a valid URL"),
            dimensions: None,
            api_key: None,
            timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// OpenAI's API, the default embeddings base URL.
const OPENAI_EMBED_BASE: &str = "https://api.openai.com/v1";

/// Outbound requests (hooks, HTTP tools, the images users send).
#[derive(Clone, Debug, Default)]
pub struct HooksConfig {
    /// `PULSE_HOOKS_ALLOW`: non-public ranges hooks and HTTP tools may reach anyway.
    pub allow: pulse_egress::AllowList,
    /// `PULSE_IMAGE_HOSTS`: the hosts images users send are taken from (never opened by
    /// `PULSE_HOOKS_ALLOW`).
    pub image_hosts: crate::llm::ImageHosts,
}

/// What the HTTP receiver (`POST /discord/interactions`, `POST /telegram/webhook`,
/// `POST /webhooks/{id}`) needs.
#[derive(Clone, Debug, Default)]
pub struct InboundConfig {
    /// `DISCORD_PUBLIC_KEY`, checked to be 64 hex characters.
    pub discord_public_key: Option<String>,
    /// `PULSE_DISCORD_DEFAULT_AGENT`.
    pub default_agent: Option<AgentId>,
    /// `TELEGRAM_WEBHOOK_SECRET`: the secret token every Telegram update must carry.
    pub telegram_secret: Option<Secret>,
    /// `SLACK_SIGNING_SECRET`: what every Slack request is signed with.
    pub slack_signing_secret: Option<Secret>,
    /// `PULSE_DELIVERY_MEMORY`.
    pub delivery_memory: SignedDuration,
    /// `PULSE_API_RATE`: requests one API token may make a minute.
    pub api_rate: ApiRate,
}

pub use crate::http::messages::ApiRate;

impl InboundConfig {
    /// How long delivery ids are remembered by default: a week, longer than any
    /// sender's retry schedule (Standard Webhooks senders retry for about 3 days).
    pub const DEFAULT_DELIVERY_MEMORY: SignedDuration = SignedDuration::from_hours(7 * 24);
}

impl Config {
    /// The embedded backend at `./pulse.db`, default tunables, the offline model and no
    /// Discord: for benchmarks and tests, which override what they need.
    pub fn defaults() -> Self {
        Self {
            backend: Backend::Sqlite {
                path: PathBuf::from("pulse.db"),
            },
            engine: EngineSettings::default(),
            llm: LlmConfig::offline(),
            discord: DiscordConfig::unconfigured(),
            telegram: TelegramConfig::unconfigured(),
            slack: SlackConfig::unconfigured(),
            inbound: InboundConfig {
                delivery_memory: InboundConfig::DEFAULT_DELIVERY_MEMORY,
                ..InboundConfig::default()
            },
            hooks: HooksConfig::default(),
            encryption: None,
            retention: Retention::DEFAULT,
            embed: EmbedConfig::default(),
            durability: Durability::Synced,
        }
    }
}

/// Reads variables through `lookup` (the process environment in production).
pub struct Env<F: Fn(&str) -> Option<String>>(pub F);

impl Env<fn(&str) -> Option<String>> {
    /// The process environment.
    pub fn process() -> Self {
        Env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }
}

impl<F: Fn(&str) -> Option<String> + Clone + Send + Sync + 'static> Env<F> {
    fn get(&self, k: &str) -> Option<String> {
        (self.0)(k)
    }

    /// One variable as read (unset or empty: `None`).
    pub fn var(&self, k: &str) -> Option<String> {
        self.get(k)
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
            schedules: ScheduleLimits {
                max_per_agent: self.number("PULSE_MAX_SCHEDULES", d.schedules.max_per_agent, 1)?,
                grace: self.duration("PULSE_SCHEDULE_GRACE", d.schedules.grace)?,
            },
            turn_patience: self.duration("PULSE_TURN_PATIENCE", d.turn_patience)?,
            keep_cache_warm: match self.get("PULSE_CACHE_WARM").as_deref().map(str::trim) {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => {
                    return Err(ConfigError::new(
                        "PULSE_CACHE_WARM",
                        format!("{other:?}: give on or off"),
                    ));
                }
            },
            prices: match self.get("PULSE_PRICES") {
                None => d.prices.clone(),
                Some(path) => std::sync::Arc::new(read_prices(&path)?),
            },
            trace_url: self
                .get("PULSE_TRACE_URL")
                .map(|t| crate::traces::link_template(&t))
                .transpose()
                .map_err(|why| ConfigError::new("PULSE_TRACE_URL", why))?,
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

    fn url(&self, var: &'static str) -> Result<Option<Url>, ConfigError> {
        self.get(var)
            .map(|v| {
                Url::parse(v.trim())
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| {
                        ConfigError::new(var, format!("{v:?} is not an http:// or https:// URL"))
                    })
            })
            .transpose()
    }

    /// The LLM configuration. With no `PULSE_LLM_PROVIDER`, the provider whose key is set
    /// is used; with no key either, the offline provider (the caller logs that loudly).
    pub fn llm(&self) -> Result<LlmConfig, ConfigError> {
        let anthropic_key = self.get("ANTHROPIC_API_KEY").map(Secret::new);
        let openai_key = self.get("OPENAI_API_KEY").map(Secret::new);
        let provider = match self.get("PULSE_LLM_PROVIDER") {
            Some(p) => ProviderKind::parse(&p)
                .map_err(|e| ConfigError::new("PULSE_LLM_PROVIDER", e.message))?,
            None if anthropic_key.is_some() => ProviderKind::Anthropic,
            None if openai_key.is_some() => ProviderKind::OpenAi,
            None => ProviderKind::Offline,
        };
        match provider {
            ProviderKind::Anthropic if anthropic_key.is_none() => {
                return Err(ConfigError::new(
                    "ANTHROPIC_API_KEY",
                    "is not set but PULSE_LLM_PROVIDER is anthropic; set the key, or choose another provider",
                ));
            }
            ProviderKind::OpenAi if openai_key.is_none() => {
                return Err(ConfigError::new(
                    "OPENAI_API_KEY",
                    "is not set but PULSE_LLM_PROVIDER is openai; set the key, or choose another provider",
                ));
            }
            _ => {}
        }
        let d = LlmConfig::offline();
        let trusted_base_urls = match self.get("PULSE_LLM_BASE_URLS") {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(|u| {
                    Url::parse(u)
                        .ok()
                        .filter(|p| matches!(p.scheme(), "http" | "https"))
                        .ok_or_else(|| {
                            ConfigError::new(
                                "PULSE_LLM_BASE_URLS",
                                format!("{u:?} is not an http:// or https:// URL"),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
        };
        let lookup = self.0.clone();
        Ok(LlmConfig {
            provider,
            explicit: self.get("PULSE_LLM_PROVIDER").is_some(),
            base_url: self.url("PULSE_LLM_BASE_URL")?,
            model: self.get("PULSE_LLM_MODEL"),
            anthropic_key,
            openai_key,
            timeout: self
                .duration(
                    "PULSE_LLM_TIMEOUT",
                    SignedDuration::try_from(d.timeout).unwrap_or_default(),
                )?
                .unsigned_abs()
                .max(Duration::from_millis(1)),
            max_attempts: self.number("PULSE_LLM_MAX_ATTEMPTS", d.max_attempts, 1)?,
            max_retry_wait: d.max_retry_wait,
            trusted_base_urls,
            agent_keys: KeyLookup::new(lookup),
        })
    }

    /// Telegram's configuration; no token leaves replies there stored only.
    pub fn telegram(&self) -> Result<TelegramConfig, ConfigError> {
        let d = TelegramConfig::unconfigured();
        Ok(TelegramConfig {
            api_base: self.url("TELEGRAM_API_BASE")?.unwrap_or(d.api_base),
            bot_token: self.get("TELEGRAM_BOT_TOKEN").map(Secret::new),
            ..d
        })
    }

    /// Slack's configuration; no token leaves replies there stored only.
    pub fn slack(&self) -> Result<SlackConfig, ConfigError> {
        let d = SlackConfig::unconfigured();
        Ok(SlackConfig {
            api_base: self.url("SLACK_API_BASE")?.unwrap_or(d.api_base),
            bot_token: self.get("SLACK_BOT_TOKEN").map(Secret::new),
            ..d
        })
    }

    /// Discord's configuration; unset tokens leave replies stored only.
    pub fn discord(&self) -> Result<DiscordConfig, ConfigError> {
        let d = DiscordConfig::unconfigured();
        Ok(DiscordConfig {
            api_base: self.url("DISCORD_API_BASE")?.unwrap_or(d.api_base),
            bot_token: self.get("DISCORD_BOT_TOKEN").map(Secret::new),
            application_id: self.get("DISCORD_APPLICATION_ID"),
            gateway_url: match self.get("DISCORD_GATEWAY_URL") {
                Some(u) if u.starts_with("ws://") || u.starts_with("wss://") => Some(u),
                Some(u) => {
                    return Err(ConfigError::new(
                        "DISCORD_GATEWAY_URL",
                        format!(
                            "{u:?} is not a WebSocket URL: give wss://host (or ws:// on loopback)"
                        ),
                    ));
                }
                None => None,
            },
            gateway: match self.get("PULSE_DISCORD_GATEWAY").as_deref() {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => {
                    return Err(ConfigError::new(
                        "PULSE_DISCORD_GATEWAY",
                        format!("{other:?}: give on or off"),
                    ));
                }
            },
            ..d
        })
    }

    /// The HTTP receiver's settings.
    pub fn inbound(&self) -> Result<InboundConfig, ConfigError> {
        let discord_public_key = self
            .get("DISCORD_PUBLIC_KEY")
            .map(|k| {
                let k = k.trim().to_owned();
                pulse_signatures::discord::DiscordKey::from_hex(&k)
                    .map(|_| k)
                    .map_err(|e| ConfigError::new("DISCORD_PUBLIC_KEY", e.to_string()))
            })
            .transpose()?;
        let default_agent = self
            .get("PULSE_DISCORD_DEFAULT_AGENT")
            .map(|a| {
                AgentId::parse(a.trim())
                    .map_err(|e| ConfigError::new("PULSE_DISCORD_DEFAULT_AGENT", e.message))
            })
            .transpose()?;
        let delivery_memory = self.duration(
            "PULSE_DELIVERY_MEMORY",
            InboundConfig::DEFAULT_DELIVERY_MEMORY,
        )?;
        let api_rate = ApiRate(self.number("PULSE_API_RATE", ApiRate::default().0, 1)?);
        let telegram_secret = self
            .get("TELEGRAM_WEBHOOK_SECRET")
            .map(|s| {
                let s = s.trim().to_owned();
                let ok = (1..=256).contains(&s.len())
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if ok {
                    Ok(Secret::new(s))
                } else {
                    Err(ConfigError::new(
                        "TELEGRAM_WEBHOOK_SECRET",
                        "Telegram takes 1-256 characters of A-Z, a-z, 0-9, _ and - (`pulse telegram set-webhook` makes one)",
                    ))
                }
            })
            .transpose()?;
        let slack_signing_secret = self
            .get("SLACK_SIGNING_SECRET")
            .map(|s| Secret::new(s.trim().to_owned()));
        Ok(InboundConfig {
            discord_public_key,
            default_agent,
            telegram_secret,
            slack_signing_secret,
            delivery_memory,
            api_rate,
        })
    }

    /// Outbound request settings.
    pub fn hooks(&self) -> Result<HooksConfig, ConfigError> {
        let allow = match self.get("PULSE_HOOKS_ALLOW") {
            None => pulse_egress::AllowList::default(),
            Some(v) => v.parse().map_err(|e: pulse_egress::AllowListError| {
                ConfigError::new("PULSE_HOOKS_ALLOW", e.to_string())
            })?,
        };
        let image_hosts = match self.get("PULSE_IMAGE_HOSTS") {
            None => crate::llm::ImageHosts::default(),
            Some(v) => v
                .parse()
                .map_err(|e: String| ConfigError::new("PULSE_IMAGE_HOSTS", e))?,
        };
        Ok(HooksConfig { allow, image_hosts })
    }

    /// The keys secrets are sealed with at rest, if `PULSE_ENCRYPTION_KEY` is set, or
    /// `PULSE_ENCRYPTION_KEY_FILE` names the file holding it (`pulse init` makes one).
    pub fn encryption(&self) -> Result<Option<EncryptionKeys>, ConfigError> {
        let old = self.get("PULSE_ENCRYPTION_OLD_KEYS");
        let file = self.get("PULSE_ENCRYPTION_KEY_FILE");
        match (self.get("PULSE_ENCRYPTION_KEY"), file) {
            (Some(_), Some(_)) => Err(ConfigError::new(
                "PULSE_ENCRYPTION_KEY_FILE",
                "is set and so is PULSE_ENCRYPTION_KEY: give the key one way; unset one of them",
            )),
            (None, Some(file)) => {
                let (key, _) = crate::sealing::key_file(std::path::Path::new(&file), false)
                    .map_err(|e| ConfigError::new("PULSE_ENCRYPTION_KEY_FILE", e.to_string()))?;
                EncryptionKeys::parse(&key, old.as_deref())
                    .map(Some)
                    .map_err(|e| ConfigError::new("PULSE_ENCRYPTION_OLD_KEYS", e.to_string()))
            }
            (None, None) if old.is_some() => Err(ConfigError::new(
                "PULSE_ENCRYPTION_OLD_KEYS",
                "is set but PULSE_ENCRYPTION_KEY is not: old keys only decrypt; set the current key too",
            )),
            (None, None) => Ok(None),
            (Some(key), None) => {
                if let Err(e) = EncryptionKeys::parse(&key, None) {
                    return Err(ConfigError::new("PULSE_ENCRYPTION_KEY", e.to_string()));
                }
                EncryptionKeys::parse(&key, old.as_deref())
                    .map(Some)
                    .map_err(|e| ConfigError::new("PULSE_ENCRYPTION_OLD_KEYS", e.to_string()))
            }
        }
    }

    /// The AWS resources.
    pub fn aws(&self) -> Result<AwsSettings, ConfigError> {
        let required = |var: &'static str, what: &str| {
            self.get(var).ok_or_else(|| {
                ConfigError::new(
                    var,
                    format!(
                        "is not set; give the {what}: against an emulator, `eval \"$(pulse init)\"` makes the table and queues and sets it; after `sam deploy`, set PULSE_STACK to the stack's name instead"
                    ),
                )
            })
        };
        Ok(AwsSettings {
            table: required("PULSE_TABLE", "DynamoDB table name")?,
            sessions_queue_url: required("PULSE_SESSIONS_QUEUE_URL", "sessions FIFO queue URL")?,
            hooks_queue_url: self.get("PULSE_HOOKS_QUEUE_URL"),
            hooks_dlq_url: self.get("PULSE_HOOKS_DLQ_URL"),
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

    /// The embeddings model: `PULSE_EMBED_MODEL` (an API's model, `local:PATH`, `words`;
    /// none: all-MiniLM-L6-v2 if installed in `models` beside the database `db` or in the
    /// models directory, else the offline embedder), `PULSE_EMBED_BASE_URL`,
    /// `PULSE_EMBED_DIMENSIONS`, and the key for that URL.
    pub fn embed(&self, db: Option<&std::path::Path>) -> Result<EmbedConfig, ConfigError> {
        let d = EmbedConfig::default();
        let base_url = self.url("PULSE_EMBED_BASE_URL")?.unwrap_or(d.base_url);
        let dimensions = match self.get("PULSE_EMBED_DIMENSIONS") {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (8..=8192).contains(n))
                    .ok_or_else(|| {
                        ConfigError::new(
                            "PULSE_EMBED_DIMENSIONS",
                            format!("{v:?} is not a number of dimensions from 8 to 8192"),
                        )
                    })?,
            ),
        };
        // OpenAI's key goes to OpenAI's API only; another API names its own key.
        let openai = base_url.as_str().trim_end_matches('/') == OPENAI_EMBED_BASE;
        let api_key = self
            .get("PULSE_EMBED_API_KEY")
            .or_else(|| openai.then(|| self.get("OPENAI_API_KEY")).flatten())
            .map(Secret::new);
        let model = self
            .get("PULSE_EMBED_MODEL")
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty());
        let source = match model {
            Some(m) if m == "words" => EmbedSource::Words { chosen: true },
            Some(m) if m.starts_with("local:") => {
                let path = m.trim_start_matches("local:").trim();
                if !cfg!(feature = "local-embed") {
                    return Err(ConfigError::new(
                        "PULSE_EMBED_MODEL",
                        format!(
                            "{m:?}: this program is built without the local embedder (`pulse` has it; the Lambda functions do not): use an embeddings API here"
                        ),
                    ));
                }
                let dir = ModelDir::inspect(std::path::Path::new(path))
                    .map_err(|e| ConfigError::new("PULSE_EMBED_MODEL", e.to_string()))?;
                EmbedSource::Local {
                    dir,
                    installed: false,
                }
            }
            Some(model) => EmbedSource::Api { model },
            None => self.installed_model(db),
        };
        if matches!(source, EmbedSource::Api { .. }) && api_key.is_none() && openai {
            return Err(ConfigError::new(
                "PULSE_EMBED_MODEL",
                "is set for OpenAI's API without a key: set OPENAI_API_KEY or PULSE_EMBED_API_KEY, or PULSE_EMBED_BASE_URL for another API",
            ));
        }
        Ok(EmbedConfig {
            source,
            base_url,
            dimensions,
            api_key,
            ..d
        })
    }

    /// all-MiniLM-L6-v2 where `pulse models install minilm` puts it: in `models` beside the
    /// database `db`, else in the models directory; the word embedder when neither holds
    /// it (or a found one cannot be read, which is logged). Only on the embedded store
    /// (`db`): against AWS the vectors must be the deployed worker's, so only what is
    /// named (`PULSE_EMBED_MODEL`, as the stack's `EmbedModel`) is used.
    fn installed_model(&self, db: Option<&std::path::Path>) -> EmbedSource {
        let Some(db) = db.filter(|_| cfg!(feature = "local-embed")) else {
            return EmbedSource::Words { chosen: false };
        };
        let parent = db.parent().filter(|p| !p.as_os_str().is_empty());
        let mut dirs = vec![parent.unwrap_or(std::path::Path::new(".")).join("models")];
        dirs.extend(self.models_dir());
        let found = ModelDir::find_installed(&dirs);
        match found.map(|p| ModelDir::inspect(&p)) {
            Some(Ok(dir)) => EmbedSource::Local {
                dir,
                installed: true,
            },
            Some(Err(e)) => {
                tracing::warn!(error = %e, "an installed embeddings model cannot be read; memories are recalled by their words");
                EmbedSource::Words { chosen: false }
            }
            None => EmbedSource::Words { chosen: false },
        }
    }

    /// `PULSE_MODELS_DIR`, else `$XDG_DATA_HOME/pulse/models`, else
    /// `~/.local/share/pulse/models`: where `pulse models install` puts models.
    pub fn models_dir(&self) -> Option<PathBuf> {
        default_models_dir(
            self.get("PULSE_MODELS_DIR").as_deref(),
            self.get("XDG_DATA_HOME").as_deref(),
            self.get("HOME").as_deref(),
        )
    }

    /// `PULSE_DURABILITY`: `synced` (the default) or `relaxed`.
    fn durability(&self) -> Result<Durability, ConfigError> {
        match self.get("PULSE_DURABILITY").as_deref().map(str::trim) {
            None | Some("synced") => Ok(Durability::Synced),
            Some("relaxed") => Ok(Durability::Relaxed),
            Some(other) => Err(ConfigError::new(
                "PULSE_DURABILITY",
                format!(
                    "{other:?} is not a durability; use synced (every acknowledgement waits for the disk) or relaxed (a power cut may lose the last acknowledged writes)"
                ),
            )),
        }
    }

    /// `PULSE_RETENTION`.
    fn retention(&self) -> Result<Retention, ConfigError> {
        match self.get("PULSE_RETENTION") {
            None => Ok(Retention::DEFAULT),
            Some(v) => v
                .parse()
                .map_err(|e: ValidationError| ConfigError::new("PULSE_RETENTION", e.message)),
        }
    }

    /// The configuration of a Lambda function: always the AWS backend.
    pub fn lambda(&self) -> Result<Config, ConfigError> {
        Ok(Config {
            backend: Backend::Aws(self.aws()?),
            engine: self.engine()?,
            llm: self.llm()?,
            discord: self.discord()?,
            telegram: self.telegram()?,
            slack: self.slack()?,
            inbound: self.inbound()?,
            hooks: self.hooks()?,
            encryption: self.encryption()?,
            retention: self.retention()?,
            embed: self.embed(None)?,
            durability: self.durability()?,
        })
    }

    /// The whole configuration.
    pub fn config(&self, db: Option<PathBuf>) -> Result<Config, ConfigError> {
        let backend = self.backend(db)?;
        let db = match &backend {
            Backend::Sqlite { path } => Some(path.clone()),
            Backend::Aws(_) => None,
        };
        Ok(Config {
            backend,
            engine: self.engine()?,
            llm: self.llm()?,
            discord: self.discord()?,
            telegram: self.telegram()?,
            slack: self.slack()?,
            inbound: self.inbound()?,
            hooks: self.hooks()?,
            encryption: self.encryption()?,
            retention: self.retention()?,
            embed: self.embed(db.as_deref())?,
            durability: self.durability()?,
        })
    }
}

/// The price table in the file at `path`, over the built-in one.
pub fn read_prices(path: &str) -> Result<crate::engine::Prices, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("PULSE_PRICES", format!("cannot read {path}: {e}")))?;
    crate::engine::Prices::with_overrides(&text)
        .map_err(|e| ConfigError::new("PULSE_PRICES", format!("{path}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(
        pairs: &[(&str, &str)],
    ) -> Env<impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static> {
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
    fn durability_is_synced_unless_relaxed_is_asked_for_and_nothing_else_is_taken() {
        assert_eq!(
            env(&[]).config(None).unwrap().durability,
            Durability::Synced
        );
        assert_eq!(
            env(&[("PULSE_DURABILITY", "relaxed")])
                .config(None)
                .unwrap()
                .durability,
            Durability::Relaxed
        );
        let err = env(&[("PULSE_DURABILITY", "fast")])
            .config(None)
            .unwrap_err();
        assert_eq!(err.variable, "PULSE_DURABILITY");
        assert!(err.message.contains("synced"), "{}", err.message);
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

    #[test]
    fn the_engine_keeps_dollar_budgets_at_the_prices_given_or_stops_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("prices.json");
        std::fs::write(
            &good,
            r#"{"models": {"my-llama": {"input": 0.5, "output": 0.7}}}"#,
        )
        .unwrap();
        let ok = env(&[("PULSE_PRICES", good.to_str().unwrap())])
            .engine()
            .unwrap();
        assert_eq!(ok.prices.of("my-llama").unwrap().output, 0.7);
        assert!(
            ok.prices.of("claude-sonnet-4-5").is_some(),
            "over the built-in"
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"models": {"my-llama": {"in": 1}}}"#).unwrap();
        for path in [bad.to_str().unwrap(), "/nowhere/prices.json"] {
            let err = env(&[("PULSE_PRICES", path)]).engine().unwrap_err();
            assert_eq!(err.variable, "PULSE_PRICES");
            assert!(err.message.contains(path), "{}", err.message);
        }
    }

    #[test]
    fn the_llm_provider_follows_the_key_that_is_set_and_offline_is_never_silent_over_a_key() {
        assert_eq!(env(&[]).llm().unwrap().provider, ProviderKind::Offline);
        assert_eq!(
            env(&[("OPENAI_API_KEY", "k")]).llm().unwrap().provider,
            ProviderKind::OpenAi
        );
        assert_eq!(
            env(&[("OPENAI_API_KEY", "k"), ("ANTHROPIC_API_KEY", "k")])
                .llm()
                .unwrap()
                .provider,
            ProviderKind::Anthropic
        );
        let err = env(&[("PULSE_LLM_PROVIDER", "anthropic")])
            .llm()
            .unwrap_err();
        assert_eq!(err.variable, "ANTHROPIC_API_KEY");
        let err = env(&[("PULSE_LLM_PROVIDER", "gemini")]).llm().unwrap_err();
        assert_eq!(err.variable, "PULSE_LLM_PROVIDER");
        let err = env(&[("PULSE_LLM_BASE_URL", "nope")]).llm().unwrap_err();
        assert_eq!(err.variable, "PULSE_LLM_BASE_URL");
        let c = env(&[("ANTHROPIC_API_KEY", "sk-secret")]).llm().unwrap();
        assert!(!format!("{c:?}").contains("sk-secret"), "keys never print");
    }

    #[test]
    fn discord_settings_come_from_the_environment() {
        let d = env(&[
            ("DISCORD_API_BASE", "http://127.0.0.1:9/api/v10"),
            ("DISCORD_BOT_TOKEN", "t"),
        ])
        .discord()
        .unwrap();
        assert_eq!(d.api_base.as_str(), "http://127.0.0.1:9/api/v10");
        assert!(d.bot_token.is_some());
        let err = env(&[("DISCORD_API_BASE", "ftp://x")])
            .discord()
            .unwrap_err();
        assert_eq!(err.variable, "DISCORD_API_BASE");
    }
}
