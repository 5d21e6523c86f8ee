//! LLM providers: the Anthropic Messages API, OpenAI-compatible chat completions, and the
//! offline provider. Each maps [`LlmRequest`] to its wire format and back; the HTTP ones
//! share [`HttpLlm`]: one exchange timeout, and bounded retries on 429, 5xx (Anthropic's
//! 529 included) and transport errors that honour `Retry-After`.
//!
//! [`Router`] picks the client for an agent from the configuration and the agent's own
//! overrides, building each client once.
//!
//! **Keys go only where they were configured to go.** The deployment's key
//! (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`) is sent to its provider's API, to
//! `PULSE_LLM_BASE_URL`, and to the base URLs the operator lists in
//! `PULSE_LLM_BASE_URLS` — never to a base URL an agent names on its own. An agent with
//! its own base URL names its own key (`--llm-api-key-env PULSE_LLM_KEY_…`), and its
//! requests go through the egress guard (public addresses only, checked at connection
//! time, no proxy). No client follows redirects, so no credential is carried to a second
//! host.
//!
//! [`EgressImages`] fetches the images users send, through the egress guard, for a
//! model that cannot reach their URL itself.
//!
//! The offline provider ([`offline`]) answers deterministically with no network: for
//! demos and tests without a key. It is named `offline` in every response and log line
//! and is never chosen when a key is configured.

mod anthropic;
mod images;
pub mod offline;
mod openai;
pub mod tokens;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Client, StatusCode};
use serde_json::Value;
use tracing::warn;
use url::Url;

use crate::domain::{AGENT_KEY_PREFIX, Agent, LlmRequest, LlmResponse, ProviderKind, Secret};
use crate::error::LlmError;
use crate::ports::{Llm, LlmSelector};
use pulse_egress::Egress;

pub use images::{EgressImages, ImageHosts};

/// Everything needed to build one provider client.
#[derive(Clone, Debug)]
pub struct ProviderSettings {
    /// Which provider.
    pub kind: ProviderKind,
    /// API base URL (`https://api.anthropic.com`, `https://api.openai.com/v1`).
    pub base_url: Url,
    /// Default model when a request names none.
    pub model: String,
    /// API key; required for Anthropic and OpenAI.
    pub api_key: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Attempts per request, counting the first (429/5xx/transport errors retry).
    pub max_attempts: u32,
    /// Longest single wait between attempts (caps `Retry-After`).
    pub max_retry_wait: Duration,
    /// The client the requests go through: for a base URL an agent chose, the egress
    /// guard's (every address it resolves to must pass it, and no proxy is used, so the
    /// check is the connection's own); for one the operator configured, a trusted one.
    pub egress: Egress,
}

impl ProviderSettings {
    /// The provider's public API base.
    pub fn default_base_url(kind: ProviderKind) -> Url {
        let s = match kind {
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::OpenAi => "https://api.openai.com/v1",
            ProviderKind::Offline => "http://offline.invalid",
        };
        Url::parse(s).unwrap_or_else(|_| unreachable!("a valid constant URL"))
    }
    /// The model used when none is configured.
    pub fn default_model(kind: ProviderKind) -> &'static str {
        match kind {
            ProviderKind::Anthropic => "claude-sonnet-4-5",
            ProviderKind::OpenAi => "gpt-4o-mini",
            ProviderKind::Offline => "offline",
        }
    }
}

/// The LLM configuration: the default provider and what each provider needs.
#[derive(Clone, Debug)]
pub struct LlmConfig {
    /// The provider agents use unless they name their own.
    pub provider: ProviderKind,
    /// Whether `provider` was named (`PULSE_LLM_PROVIDER`) rather than inferred.
    pub explicit: bool,
    /// Base URL override (`PULSE_LLM_BASE_URL`) for the default provider.
    pub base_url: Option<Url>,
    /// Model override (`PULSE_LLM_MODEL`) for the default provider.
    pub model: Option<String>,
    /// `ANTHROPIC_API_KEY`.
    pub anthropic_key: Option<Secret>,
    /// `OPENAI_API_KEY`.
    pub openai_key: Option<Secret>,
    /// Timeout of one HTTP exchange.
    pub timeout: Duration,
    /// Attempts per request.
    pub max_attempts: u32,
    /// Longest single wait between attempts.
    pub max_retry_wait: Duration,
    /// `PULSE_LLM_BASE_URLS`: further base URLs the deployment's keys may be sent to.
    pub trusted_base_urls: Vec<Url>,
    /// Where an agent's own key variable (`--llm-api-key-env`) is read.
    pub agent_keys: KeyLookup,
}

/// Reads the variables agents name as their keys, from the environment the configuration
/// was read from (in Lambda, with the SSM secrets over it).
#[derive(Clone, Default)]
pub struct KeyLookup(Option<Arc<Lookup>>);

type Lookup = dyn Fn(&str) -> Option<String> + Send + Sync;

impl KeyLookup {
    /// Reads through `f`.
    pub fn new(f: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    /// The key in `var`; `None` unless it is one of the [`AGENT_KEY_PREFIX`] variables.
    fn get(&self, var: &str) -> Option<Secret> {
        if !var.starts_with(AGENT_KEY_PREFIX) {
            return None;
        }
        self.0.as_ref().and_then(|f| f(var)).map(Secret::new)
    }
}

impl std::fmt::Debug for KeyLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyLookup")
    }
}

/// Whether two base URLs name the same API (a trailing slash aside).
fn same_base(a: &Url, b: &Url) -> bool {
    a.as_str().trim_end_matches('/') == b.as_str().trim_end_matches('/')
}

impl LlmConfig {
    /// The offline provider and default tunables.
    pub fn offline() -> Self {
        Self {
            provider: ProviderKind::Offline,
            explicit: true,
            base_url: None,
            model: None,
            anthropic_key: None,
            openai_key: None,
            timeout: Duration::from_secs(60),
            max_attempts: 4,
            max_retry_wait: Duration::from_secs(30),
            trusted_base_urls: Vec::new(),
            agent_keys: KeyLookup::default(),
        }
    }

    /// One line for the start-up log; says loudly when the offline provider was chosen
    /// because no key is configured.
    pub fn describe(&self) -> String {
        match (self.provider, self.explicit) {
            (ProviderKind::Offline, false) => "offline (no PULSE_LLM_PROVIDER and no ANTHROPIC_API_KEY or OPENAI_API_KEY: replies are deterministic stand-ins, not a model's)".to_owned(),
            (ProviderKind::Offline, true) => "offline (deterministic stand-in replies, as configured)".to_owned(),
            (p, _) => format!(
                "{p}, model {}",
                self.model.as_deref().unwrap_or(ProviderSettings::default_model(p))
            ),
        }
    }

    fn key(&self, kind: ProviderKind) -> Option<Secret> {
        match kind {
            ProviderKind::Anthropic => self.anthropic_key.clone(),
            ProviderKind::OpenAi => self.openai_key.clone(),
            ProviderKind::Offline => None,
        }
    }
}

/// The variable holding the deployment's key for `kind`.
fn key_variable(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        _ => "OPENAI_API_KEY",
    }
}

/// Builds the client for `settings`.
pub fn client(settings: ProviderSettings) -> Result<Arc<dyn Llm>, LlmError> {
    let kind = settings.kind;
    if kind == ProviderKind::Offline {
        return Ok(Arc::new(offline::Offline));
    }
    if settings.api_key.is_none() {
        return Err(LlmError::NotConfigured {
            provider: kind.as_str(),
            message: format!("no API key; set {}", key_variable(kind)),
        });
    }
    let http = HttpLlm::new(settings)?;
    Ok(match kind {
        ProviderKind::Anthropic => Arc::new(anthropic::Anthropic(http)),
        _ => Arc::new(openai::OpenAi(http)),
    })
}

/// A client's identity: provider, base URL, model, and the variable its key comes from.
type ClientKey = (ProviderKind, String, String, &'static str, Option<String>);

/// Chooses and caches clients per (provider, base URL, model, key).
pub struct Router {
    config: LlmConfig,
    egress: Egress,
    /// For the base URLs the operator configured.
    trusted: Egress,
    clients: Mutex<HashMap<ClientKey, Arc<dyn Llm>>>,
}

impl Router {
    /// A router over `config`; agents' own base URLs are reached through `egress`.
    pub fn new(config: LlmConfig, egress: Egress) -> Self {
        Self {
            config,
            egress,
            trusted: Egress::trusted(),
            clients: Mutex::new(HashMap::new()),
        }
    }
}

impl Router {
    /// The model `agent` talks with on `kind`: its own, else the deployment's when
    /// `kind` is the deployment's provider, else the provider's default.
    fn model_of(&self, agent: &Agent, kind: ProviderKind) -> String {
        agent
            .llm
            .model
            .clone()
            .or_else(|| {
                self.config
                    .model
                    .clone()
                    .filter(|_| kind == self.config.provider)
            })
            .unwrap_or_else(|| ProviderSettings::default_model(kind).to_owned())
    }
}

impl LlmSelector for Router {
    fn select(&self, agent: &Agent) -> Result<Arc<dyn Llm>, LlmError> {
        let c = &self.config;
        let kind = agent.llm.provider.unwrap_or(c.provider);
        if kind == ProviderKind::Offline {
            return Ok(crate::traces::traced(Arc::new(offline::Offline)));
        }
        let provider = kind.as_str();
        let is_default = kind == c.provider;
        let model = self.model_of(agent, kind);
        let configured = c
            .base_url
            .clone()
            .filter(|_| is_default)
            .unwrap_or_else(|| ProviderSettings::default_base_url(kind));
        let base_url = agent.llm.base_url.clone().unwrap_or(configured.clone());
        let trusted = same_base(&base_url, &configured)
            || c.trusted_base_urls.iter().any(|t| same_base(t, &base_url));
        let own = agent.llm.api_key_env.clone();
        let (api_key, key_from) = match &own {
            Some(var) => {
                let key = c.agent_keys.get(var).ok_or_else(|| LlmError::NotConfigured {
                    provider,
                    message: format!(
                        "the agent's key variable {var} is not set (it must start with {AGENT_KEY_PREFIX})"
                    ),
                })?;
                (Some(key), "agent")
            }
            None if trusted => (c.key(kind), key_variable(kind)),
            None => {
                return Err(LlmError::NotConfigured {
                    provider,
                    message: format!(
                        "the agent's base URL {base_url} is not one the deployment's {} is sent to: list it in PULSE_LLM_BASE_URLS, or give the agent a key of its own with --llm-api-key-env {AGENT_KEY_PREFIX}NAME",
                        key_variable(kind)
                    ),
                });
            }
        };
        // A URL the operator did not configure is reached only through the guard.
        let egress = if trusted {
            self.trusted.clone()
        } else {
            self.egress.clone()
        };
        if !trusted
            && let Some(ip) = match base_url.host() {
                Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
                Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            }
        {
            egress.permits(ip).map_err(|refusal| LlmError::Transport {
                provider,
                message: format!(
                    "{base_url}: {}",
                    pulse_egress::EgressError::Refused(refusal)
                ),
            })?;
        }
        let key = (kind, base_url.to_string(), model.clone(), key_from, own);
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = clients.get(&key) {
            return Ok(found.clone());
        }
        let built = crate::traces::traced(client(ProviderSettings {
            kind,
            base_url,
            model,
            api_key,
            timeout: c.timeout,
            max_attempts: c.max_attempts,
            max_retry_wait: c.max_retry_wait,
            egress,
        })?);
        clients.insert(key, built.clone());
        Ok(built)
    }
}

/// The HTTP side shared by the providers: a client built once, the settings, retries.
pub(crate) struct HttpLlm {
    client: Client,
    settings: ProviderSettings,
}

impl HttpLlm {
    fn new(settings: ProviderSettings) -> Result<Self, LlmError> {
        Ok(Self {
            client: settings.egress.client().clone(),
            settings,
        })
    }

    fn provider(&self) -> &'static str {
        self.settings.kind.as_str()
    }

    fn endpoint(&self, path: &str) -> String {
        format!(
            "{}/{path}",
            self.settings.base_url.as_str().trim_end_matches('/')
        )
    }

    fn key(&self) -> &str {
        self.settings.api_key.as_ref().map_or("", Secret::expose)
    }

    /// POSTs `body` with `headers`, retrying what is worth retrying; returns the JSON
    /// answer of the first 2xx.
    async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, LlmError> {
        let provider = self.provider();
        let url = self.endpoint(path);
        let attempts = self.settings.max_attempts.max(1);
        let mut last = None;
        for attempt in 1..=attempts {
            let mut req = self
                .client
                .post(&url)
                .timeout(self.settings.timeout)
                .json(body);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let (err, wait) = match req.send().await {
                Err(e) => (
                    LlmError::Transport {
                        provider,
                        message: if e.is_timeout() {
                            format!("no answer from {url} within {:?}", self.settings.timeout)
                        } else {
                            format!("{url}: {}", crate::error::chain(&e))
                        },
                    },
                    None,
                ),
                Ok(resp) => {
                    let status = resp.status();
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_retry_after);
                    let text = resp.text().await.unwrap_or_default();
                    if status.is_success() {
                        return serde_json::from_str(&text).map_err(|e| LlmError::Malformed {
                            provider,
                            message: format!("the body is not JSON: {e}"),
                        });
                    }
                    let err = LlmError::Status {
                        provider,
                        status: status.as_u16(),
                        body: excerpt(&text),
                    };
                    if !retryable(status) {
                        return Err(err);
                    }
                    (err, retry_after)
                }
            };
            if attempt == attempts {
                return Err(err);
            }
            let wait = wait
                .unwrap_or_else(|| backoff(attempt))
                .min(self.settings.max_retry_wait);
            warn!(provider, attempt, wait_ms = wait.as_millis() as u64, error = %err, "LLM request failed; retrying");
            last = Some(err);
            tokio::time::sleep(wait).await;
        }
        Err(last.unwrap_or(LlmError::Transport {
            provider,
            message: "no attempt was made".to_owned(),
        }))
    }
}

/// A response that carries tool calls but whose stop reason says something else: some
/// OpenAI-compatible servers answer that way (and OpenAI itself when `tool_choice`
/// forces a function). The calls are run all the same; the disagreement is logged once
/// per response.
fn disagreement(
    provider: &'static str,
    said: Option<&Value>,
    tool_calls: &[crate::domain::ToolUse],
    stop: crate::domain::StopReason,
) {
    if !tool_calls.is_empty() && stop != crate::domain::StopReason::ToolUse {
        let said = said.map_or_else(|| "none".to_owned(), Value::to_string);
        warn!(
            provider,
            stop_reason = %said,
            tool_calls = tool_calls.len(),
            "the response carries tool calls but its stop reason is not a tool call; the calls are run"
        );
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// 500 ms, 1 s, 2 s … with up to 25 % jitter.
fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(500u64 << attempt.saturating_sub(1).min(6));
    let jitter = crate::entropy::below(250) as u32;
    base + base * jitter / 1000
}

/// `Retry-After` as seconds or as an HTTP date.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>() {
        // A value too large for a Duration (`1e300`) is not a wait anyone meant: ignore it,
        // and the caller's backoff applies. Every wait is capped by the caller anyway.
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = jiff::fmt::rfc2822::parse(v).ok()?.timestamp();
    let d = at.duration_since(jiff::Timestamp::now());
    Some(d.unsigned_abs())
        .filter(|_| !d.is_negative())
        .or(Some(Duration::ZERO))
}

fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(500).collect();
    if s.chars().count() > 500 {
        out.push('…');
    }
    out
}

#[async_trait]
impl Llm for anthropic::Anthropic {
    fn provider(&self) -> &'static str {
        "anthropic"
    }
    fn model(&self) -> &str {
        &self.0.settings.model
    }
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let model = request
            .model
            .clone()
            .unwrap_or_else(|| self.0.settings.model.clone());
        let body = anthropic::request_body(request, &model);
        let key = self.0.key().to_owned();
        let v = self
            .0
            .post(
                "v1/messages",
                &[("x-api-key", &key), ("anthropic-version", "2023-06-01")],
                &body,
            )
            .await?;
        anthropic::parse_response(&v)
    }
    async fn count_tokens(&self, model: &str, text: &str) -> Result<Option<usize>, LlmError> {
        let key = self.0.key().to_owned();
        let body = serde_json::json!({
            "model": model,
            "messages": [{ "role": "user", "content": text }],
        });
        let v = self
            .0
            .post(
                "v1/messages/count_tokens",
                &[("x-api-key", &key), ("anthropic-version", "2023-06-01")],
                &body,
            )
            .await?;
        let tokens = v["input_tokens"]
            .as_u64()
            .ok_or_else(|| LlmError::Malformed {
                provider: "anthropic",
                message: "count_tokens answered no input_tokens".into(),
            })?;
        Ok(Some(usize::try_from(tokens).unwrap_or(usize::MAX)))
    }
}

#[async_trait]
impl Llm for openai::OpenAi {
    fn provider(&self) -> &'static str {
        "openai"
    }
    fn model(&self) -> &str {
        &self.0.settings.model
    }
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let model = request
            .model
            .clone()
            .unwrap_or_else(|| self.0.settings.model.clone());
        let body = openai::request_body(request, &model);
        let auth = format!("Bearer {}", self.0.key());
        let v = self
            .0
            .post("chat/completions", &[("authorization", &auth)], &body)
            .await?;
        openai::parse_response(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(
            parse_retry_after("1e300"),
            None,
            "too large: ignored, no panic"
        );
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("NaN"), None);
    }

    #[test]
    fn an_agent_without_a_key_for_its_provider_is_told_which_variable_to_set() {
        let router = Router::new(LlmConfig::offline(), Egress::new(Default::default()));
        let mut agent = crate::domain::NewAgent::named("a")
            .create(jiff::Timestamp::UNIX_EPOCH)
            .unwrap()
            .0;
        assert_eq!(router.select(&agent).unwrap().provider(), "offline");
        agent.llm.provider = Some(ProviderKind::OpenAi);
        let err = router.select(&agent).err().unwrap();
        assert!(err.to_string().contains("OPENAI_API_KEY"), "{err}");
    }
}
