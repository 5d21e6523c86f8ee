//! # pulse-egress: outbound HTTP behind an SSRF guard
//!
//! Every request Pulse makes to a URL a user gave it (outbound hooks, HTTP tools, the
//! images users send, an agent's own model URL) goes through [`Egress`]: one HTTP client,
//! with pooled keep-alive connections per destination, whose name resolution is the
//! guard. Each new connection resolves its host once and is refused unless every address
//! is public (or in the [`AllowList`]); the client then connects to the checked
//! addresses, never looking the name up again, so a DNS answer that changes between
//! check and connect (rebinding) cannot steer it to an internal address. A pooled
//! connection was checked when it was opened; the next new one is checked again. A URL
//! naming an address outright is checked before it is sent. Redirects are never
//! followed, and no proxy from the environment is used.
//!
//! ## Layout
//!
//! - [`guard`]: which addresses are public ([`check_public`]), and the allow-list.
//! - [`Resolver`]: the lookup, as a trait, so tests inject one.
//! - [`tls`]: the TLS configuration every outbound client of the process shares.
//! - [`Egress`]: the client — [`Egress::post`] and [`Egress::get`] (one exchange under one
//!   timeout, a bounded body), and [`Egress::client`] for callers that need the whole
//!   `reqwest` API (model providers).

pub mod guard;
pub mod tls;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use url::{Host, Url};

pub use guard::{AllowList, AllowListError, Refusal, check_public};

/// A URL as errors, logs, hooks, prompts and listings show it: without a user name or
/// password, and with every query value replaced by `***` (its names kept), so a key
/// someone put in a tool's URL (`?api_key=…`) never travels further than the request.
pub fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    if shown.query().is_some() {
        let names: Vec<String> = shown.query_pairs().map(|(k, _)| k.into_owned()).collect();
        shown
            .query_pairs_mut()
            .clear()
            .extend_pairs(names.iter().map(|k| (k.as_str(), "***")));
    }
    shown.set_fragment(None);
    shown.to_string()
}

/// Looks a host name up.
#[async_trait]
pub trait Resolver: Send + Sync + 'static {
    /// The addresses of `host` at `port`.
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The system's resolver.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// Why a request was not made or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The URL cannot be requested.
    #[error("cannot request {0}")]
    BadUrl(String),
    /// The SSRF guard refused an address the host resolves to.
    #[error(
        "refused: {0}, not a public address; only for local development may PULSE_HOOKS_ALLOW list it"
    )]
    Refused(Refusal),
    /// The name did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        source: io::Error,
    },
    /// The name resolved to nothing.
    #[error("{0} resolves to no address")]
    NoAddresses(String),
    /// No checked address accepted a connection.
    #[error("cannot connect to {target}: {message}")]
    Connect {
        /// The host and port.
        target: String,
        /// Why.
        message: String,
    },
    /// The TLS handshake failed.
    #[error("TLS with {host} failed: {message}")]
    Tls {
        /// The host.
        host: String,
        /// Why.
        message: String,
    },
    /// The exchange did not finish in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The HTTP exchange failed.
    #[error("HTTP exchange failed: {0}")]
    Http(String),
}

impl EgressError {
    /// What the client's error was, in this crate's terms: the guard's own refusal when
    /// its resolver refused, a TLS failure by the TLS library's error, a connection that
    /// could not be opened, or the exchange failing.
    fn from_client(url: &Url, e: reqwest::Error) -> Self {
        // The client's own text names the whole URL, query and all.
        let e = e.without_url();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if let Some(ours) = err.downcast_ref::<EgressError>() {
                return ours.clone_kind();
            }
            // The TLS library's error, itself or inside an I/O error.
            let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
                err.downcast_ref::<io::Error>()
                    .and_then(io::Error::get_ref)
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            });
            // (Some stacks pass it on as text only: known by rustls's own wording.)
            let text = err.to_string();
            let tls_text = [
                "invalid peer certificate",
                "received fatal alert",
                "peer is incompatible",
                "peer misbehaved",
            ]
            .iter()
            .any(|p| text.starts_with(p));
            if tls.is_some() || tls_text {
                return Self::Tls {
                    host: url.host_str().unwrap_or_default().to_owned(),
                    message: tls.map_or(text, ToString::to_string),
                };
            }
            source = err.source();
        }
        let chain = chain(&e);
        if e.is_timeout() {
            return Self::Http(format!("timed out: {chain}"));
        }
        if e.is_connect() {
            return Self::Connect {
                target: format!(
                    "{}:{}",
                    url.host_str().unwrap_or_default(),
                    url.port_or_known_default().unwrap_or_default()
                ),
                message: chain,
            };
        }
        Self::Http(chain)
    }

    /// A copy of an error the resolver returned through the client (its I/O source, if
    /// any, kept as text).
    fn clone_kind(&self) -> Self {
        match self {
            Self::BadUrl(s) => Self::BadUrl(s.clone()),
            Self::Refused(r) => Self::Refused(r.clone()),
            Self::Resolve { host, source } => Self::Resolve {
                host: host.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Self::NoAddresses(h) => Self::NoAddresses(h.clone()),
            Self::Connect { target, message } => Self::Connect {
                target: target.clone(),
                message: message.clone(),
            },
            Self::Tls { host, message } => Self::Tls {
                host: host.clone(),
                message: message.clone(),
            },
            Self::Timeout(d) => Self::Timeout(*d),
            Self::Http(s) => Self::Http(s.clone()),
        }
    }

    /// Whether the guard refused the address.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Refused(_))
    }
    /// Whether it timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }
}

/// An answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// Its status (a 3xx is returned as it is: redirects are not followed).
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, at most the `max_body` asked for.
    pub body: Bytes,
    /// Whether the body was longer and was cut off.
    pub truncated: bool,
    /// The address the request went to, when the client tells.
    pub addr: Option<SocketAddr>,
}

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(60);
/// Idle connections kept per destination.
const POOL_PER_HOST: usize = 64;

/// The outbound client. Cheap to clone: clones share one connection pool.
#[derive(Clone)]
pub struct Egress {
    resolver: Arc<dyn Resolver>,
    allow: AllowList,
    /// For an operator's destination: every address allowed, and the environment's
    /// proxy (`HTTPS_PROXY`) used, as a corporate network may need.
    trusted: bool,
    /// Built on first use, so a resolver given after [`Egress::new`] is the one used.
    client: Arc<OnceLock<reqwest::Client>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("allow", &self.allow.to_string())
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// The system resolver, TLS verified by the platform's roots, and `allow`.
    pub fn new(allow: AllowList) -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            allow,
            trusted: false,
            client: Arc::default(),
        }
    }

    /// A client for destinations the operator configured (a model provider's URL), not
    /// a user: every address is allowed and the environment's proxy is used; the rest
    /// (no redirects, the TLS configuration, the pool) is the same.
    pub fn trusted() -> Self {
        Self {
            trusted: true,
            ..Self::new(AllowList::any())
        }
    }

    /// Uses `resolver` to look names up (with a pool of its own).
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.resolver = resolver;
        self.client = Arc::default();
        self
    }

    /// The allow-list.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// `Ok` if requests may go to `ip`: it is public, or in the allow-list.
    pub fn permits(&self, ip: IpAddr) -> Result<(), Refusal> {
        self.clone_for_resolver().permits(ip)
    }

    /// The guarded client itself, for callers that need more than one exchange (a model
    /// provider's JSON API). Names are checked as it connects; a URL naming an address
    /// outright must pass [`Egress::permits`] first (the client does not resolve it).
    pub fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| {
            let builder = reqwest::Client::builder()
                .tls_backend_preconfigured(tls::client_config().as_ref().clone())
                .user_agent(concat!("pulse/", env!("CARGO_PKG_VERSION")))
                // A redirect would carry the request (and its credentials) wherever it
                // points.
                .redirect(reqwest::redirect::Policy::none())
                .tcp_nodelay(true)
                .pool_idle_timeout(POOL_IDLE)
                .pool_max_idle_per_host(POOL_PER_HOST)
                .dns_resolver(Arc::new(Guarded(self.clone_for_resolver())));
            // A proxy would resolve and connect for us, past the guard.
            let builder = if self.trusted {
                builder
            } else {
                builder.no_proxy()
            };
            builder
                .build()
                .unwrap_or_else(|e| panic!("the outbound HTTP client could not be built: {e}"))
        })
    }

    /// What the client's resolver checks with: this egress without its client (the
    /// resolver must not keep the client alive through itself).
    fn clone_for_resolver(&self) -> Check {
        Check {
            resolver: self.resolver.clone(),
            allow: self.allow.clone(),
        }
    }

    /// Resolves `url`'s host once (an IP literal is not resolved) and checks every
    /// address: one that is neither public nor allowed refuses the lot.
    pub async fn check(&self, url: &Url) -> Result<Vec<SocketAddr>, EgressError> {
        self.clone_for_resolver().check(url).await
    }

    /// POSTs `body` with `headers` to `url` under one `timeout`; reads at most
    /// `max_body` bytes of the answer.
    pub async fn post(
        &self,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Response, EgressError> {
        self.timed(http::Method::POST, url, headers, body, timeout, max_body)
            .await
    }

    /// GETs `url` with `headers` under one `timeout`; reads at most `max_body` bytes of
    /// the answer.
    pub async fn get(
        &self,
        url: &Url,
        headers: HeaderMap,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Response, EgressError> {
        self.timed(
            http::Method::GET,
            url,
            headers,
            Bytes::new(),
            timeout,
            max_body,
        )
        .await
    }

    /// One exchange under one `timeout`.
    async fn timed(
        &self,
        method: http::Method,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Response, EgressError> {
        tokio::time::timeout(timeout, self.exchange(method, url, headers, body, max_body))
            .await
            .map_err(|_| EgressError::Timeout(timeout))?
    }

    async fn exchange(
        &self,
        method: http::Method,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
        max_body: usize,
    ) -> Result<Response, EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::BadUrl(format!(
                "{}: only http and https URLs",
                redacted(url)
            )));
        }
        // The client resolves names through the guard; an address given outright is
        // checked here, since nothing resolves it.
        match url.host() {
            Some(Host::Ipv4(ip)) => self.permits(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.permits(IpAddr::V6(ip)),
            Some(Host::Domain(_)) => Ok(()),
            None => return Err(EgressError::BadUrl(format!("{}: no host", redacted(url)))),
        }
        .map_err(EgressError::Refused)?;
        let mut resp = self
            .client()
            .request(method, url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| EgressError::from_client(url, e))?;
        let status = resp.status();
        let addr = resp.remote_addr();
        let headers = resp.headers().clone();
        let mut buf = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| EgressError::from_client(url, e))?
        {
            let room = max_body - buf.len();
            if chunk.len() > room {
                buf.extend_from_slice(&chunk[..room]);
                // Stop reading: an endless body must not hold the caller.
                truncated = true;
                break;
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Response {
            status,
            headers,
            body: Bytes::from(buf),
            truncated,
            addr,
        })
    }
}

/// The guard's half of the client: a resolver and the allow-list.
#[derive(Clone)]
struct Check {
    resolver: Arc<dyn Resolver>,
    allow: AllowList,
}

impl Check {
    async fn check(&self, url: &Url) -> Result<Vec<SocketAddr>, EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::BadUrl(format!(
                "{}: only http and https URLs",
                redacted(url)
            )));
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| EgressError::BadUrl(format!("{}: no port", redacted(url))))?;
        let ip = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(Host::Domain(name)) => return self.resolve(name, port).await,
            None => return Err(EgressError::BadUrl(format!("{}: no host", redacted(url)))),
        };
        self.permits(ip).map_err(EgressError::Refused)?;
        Ok(vec![SocketAddr::new(ip, port)])
    }

    fn permits(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow.contains(ip) {
            return Ok(());
        }
        check_public(ip)
    }

    /// `name`'s addresses, each one public or allowed, or the refusal.
    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
        let addrs =
            self.resolver
                .resolve(name, port)
                .await
                .map_err(|source| EgressError::Resolve {
                    host: name.to_owned(),
                    source,
                })?;
        if addrs.is_empty() {
            return Err(EgressError::NoAddresses(name.to_owned()));
        }
        for a in &addrs {
            self.permits(a.ip()).map_err(EgressError::Refused)?;
        }
        Ok(addrs)
    }
}

/// The client's name resolution: the guard's check, so every new connection goes only
/// to addresses that passed it.
struct Guarded(Check);

impl reqwest::dns::Resolve for Guarded {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let check = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // The port is the request's; the client puts it on the addresses it gets.
            let addrs = check
                .resolve(&host, 0)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// An error and its causes, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
