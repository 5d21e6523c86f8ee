//! Error types of the library. Each says what was wrong and, where the user can act, what to
//! do; each keeps its source so the chain reaches the log.

use std::error::Error as StdError;

/// A value from outside (CLI flag, JSON body, tool response) that does not satisfy a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {message}")]
pub struct ValidationError {
    /// What was being validated ("priority", "event type", ...).
    pub what: &'static str,
    /// What was wrong with it.
    pub message: String,
}

impl ValidationError {
    /// A validation error for `what`.
    pub fn new(what: &'static str, message: impl Into<String>) -> Self {
        Self {
            what,
            message: message.into(),
        }
    }
}

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A storage or queue operation that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The record to update or read does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The record to create exists already.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A conditional write lost to a concurrent writer.
    #[error("{0}")]
    Conflict(String),
    /// A stored record could not be decoded: written by a newer version, or damaged.
    #[error("stored record {key} is unreadable: {message}")]
    Corrupt {
        /// Which record.
        key: String,
        /// Why it could not be read.
        message: String,
    },
    /// A stored secret could not be encrypted or decrypted (see `sealing`): a key is
    /// missing or wrong. The message names the variable to set.
    #[error("{0}")]
    Secret(String),
    /// The backend failed (network, throttling, I/O, SQLite busy beyond its timeout).
    #[error("{backend} {operation} failed")]
    Backend {
        /// `sqlite`, `dynamodb` or `sqs`.
        backend: &'static str,
        /// The operation that failed, e.g. `claim heartbeat`.
        operation: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// Wraps a backend error with the operation it interrupted.
    pub fn backend(
        backend: &'static str,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Backend {
            backend,
            operation,
            source: source.into(),
        }
    }
    /// A record that could not be decoded.
    pub fn corrupt(key: impl Into<String>, message: impl ToString) -> Self {
        Self::Corrupt {
            key: key.into(),
            message: message.to_string(),
        }
    }
}

/// A heartbeat run could not finish its work. The engine records the heartbeat FAILED with
/// this error and schedules the next one.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Storage or queue failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record needed for the run is missing or inconsistent.
    #[error("{0}")]
    Missing(String),
    /// An outside service (the model, Discord) is unavailable for now; the work is
    /// delivered again later.
    #[error("{0}")]
    Unavailable(String),
    /// The model could not answer a turn for now (unreachable, 429, 5xx): the turn waits
    /// and is tried again later (see `WaitingTurn`).
    #[error("{0}")]
    ModelDown(String),
    /// Another run of the same heartbeat is working on it right now. Not a failure of
    /// the heartbeat: the job is retried later, when the other run has finished.
    #[error("{0}")]
    Contended(String),
}

/// A call to an LLM provider that did not succeed. Recorded on the action or turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// The provider cannot be used as configured (no API key, bad base URL).
    #[error("{provider} is not configured: {message}")]
    NotConfigured {
        /// `anthropic`, `openai` or `offline`.
        provider: &'static str,
        /// What is missing and how to give it.
        message: String,
    },
    /// No answer: connection refused, timed out, TLS failure.
    #[error("{provider} request failed: {message}")]
    Transport {
        /// The provider.
        provider: &'static str,
        /// What went wrong.
        message: String,
    },
    /// The provider answered with an error status that retrying does not fix, or a
    /// retryable one after the last attempt.
    #[error("{provider} answered HTTP {status}: {body}")]
    Status {
        /// The provider.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// An excerpt of the body (the provider's error message).
        body: String,
    },
    /// The provider's answer could not be read.
    #[error("{provider} sent an answer Pulse cannot read: {message}")]
    Malformed {
        /// The provider.
        provider: &'static str,
        /// What was wrong with it.
        message: String,
    },
}

/// A call to Discord's API that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscordError {
    /// A setting needed for this call is missing (bot token, application id).
    #[error("Discord is not configured: {0}")]
    NotConfigured(String),
    /// No answer: connection refused, timed out.
    #[error("Discord request failed: {0}")]
    Transport(String),
    /// Discord kept answering 429 beyond the retry bound.
    #[error("Discord rate limited the request {attempts} times; giving up")]
    RateLimited {
        /// Attempts made.
        attempts: u32,
    },
    /// Discord answered with an error status.
    #[error("Discord answered HTTP {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// An excerpt of the body.
        body: String,
    },
    /// Discord's answer could not be read.
    #[error("Discord sent an answer Pulse cannot read: {0}")]
    Malformed(String),
}

/// A call to a chat platform's API that did not succeed: [`DiscordError`]'s cases for
/// any platform, worded the same ("Discord answered HTTP 403: …"), so what is kept of a
/// failure reads as it always has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// A setting needed for this call is missing (a bot token).
    #[error("{channel} is not configured: {message}")]
    NotConfigured {
        /// The platform's name.
        channel: &'static str,
        /// What is missing.
        message: String,
    },
    /// No answer: connection refused, timed out.
    #[error("{channel} request failed: {message}")]
    Transport {
        /// The platform's name.
        channel: &'static str,
        /// What failed (never the request's URL, which may hold a token).
        message: String,
    },
    /// The platform kept answering 429 beyond the retry bound, or asked for a longer
    /// wait than a reply can spend.
    #[error("{channel} rate limited the request {attempts} times; giving up")]
    RateLimited {
        /// The platform's name.
        channel: &'static str,
        /// Attempts made.
        attempts: u32,
    },
    /// The platform answered with an error status.
    #[error("{channel} answered HTTP {status}: {body}")]
    Status {
        /// The platform's name.
        channel: &'static str,
        /// HTTP status.
        status: u16,
        /// An excerpt of the body.
        body: String,
    },
    /// The platform's answer could not be read.
    #[error("{channel} sent an answer Pulse cannot read: {message}")]
    Malformed {
        /// The platform's name.
        channel: &'static str,
        /// What was wrong with it.
        message: String,
    },
    /// The platform answered, and refused the request with its own error code (Slack's
    /// `ok: false`).
    #[error("{channel} refused the request: {code}")]
    Refused {
        /// The platform's name.
        channel: &'static str,
        /// Its error code (`not_in_channel`).
        code: String,
        /// Whether trying again cannot help (the request itself is wrong).
        hopeless: bool,
    },
    /// The reply's target was written by a newer release of Pulse.
    #[error(
        "its target was written by a newer release of Pulse; it is tried again once this one is upgraded"
    )]
    UnknownTarget,
}

impl ChannelError {
    /// Whether trying again cannot help: the platform is not set up, or refused the
    /// request itself as malformed (400). A refusal of access (401, 403, 404: a
    /// permission, a channel) may be put right meanwhile, and an outage (429, 5xx, the
    /// network) passes.
    pub fn hopeless(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::RateLimited { .. } | Self::UnknownTarget => false,
            Self::Status { status, .. } => *status == 400,
            Self::NotConfigured { .. } | Self::Malformed { .. } => true,
            Self::Refused { hopeless, .. } => *hopeless,
        }
    }
}

impl From<DiscordError> for ChannelError {
    fn from(e: DiscordError) -> Self {
        let channel = "Discord";
        match e {
            DiscordError::NotConfigured(message) => Self::NotConfigured { channel, message },
            DiscordError::Transport(message) => Self::Transport { channel, message },
            DiscordError::RateLimited { attempts } => Self::RateLimited { channel, attempts },
            DiscordError::Status { status, body } => Self::Status {
                channel,
                status,
                body,
            },
            DiscordError::Malformed(message) => Self::Malformed { channel, message },
        }
    }
}

/// A configuration value from the environment that is missing or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub variable: &'static str,
    /// What is wrong and what is expected.
    pub message: String,
}

impl ConfigError {
    /// A configuration error naming `variable`.
    pub fn new(variable: &'static str, message: impl Into<String>) -> Self {
        Self {
            variable,
            message: message.into(),
        }
    }
}

/// Formats an error and its chain of sources on one line: `a: b: c`.
pub fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        // Some errors repeat their source's message; don't print it twice.
        if !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}
