//! # pulse-egress: outbound HTTP behind an SSRF guard
//!
//! Every request Pulse makes to a URL a user gave it (outbound hooks, HTTP tools, the
//! images users send, fetched for a model) goes
//! through [`Egress`]. It resolves the host once, refuses unless every address is public
//! (or in the [`AllowList`]), and connects to the checked address itself — never looking
//! the name up again, so a DNS answer that changes between check and connect (rebinding)
//! cannot steer the request to an internal address. Redirects are never followed.
//!
//! ## Layout
//!
//! - [`guard`]: which addresses are public ([`check_public`]), and the allow-list.
//! - [`Resolver`] and [`Connector`]: the two steps that touch the network, as traits, so
//!   tests inject them and prove no connection to a refused address is ever opened.
//! - [`Egress::post`] and [`Egress::get`]: check, connect, TLS (platform verifier), one
//!   HTTP/1.1 exchange with hyper, a bounded body; the whole of it under one timeout.

pub mod guard;
pub mod tls;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use url::{Host, Url};

pub use guard::{AllowList, AllowListError, Refusal, check_public};

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

/// Opens a TCP connection to a checked address.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Connects to `addr`.
    async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream>;
}

/// Plain TCP.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

#[async_trait]
impl Connector for TcpConnector {
    async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
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
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The last address tried.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
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
    /// The address the request went to.
    pub addr: SocketAddr,
}

/// The outbound client. Cheap to clone.
#[derive(Clone)]
pub struct Egress {
    resolver: Arc<dyn Resolver>,
    connector: Arc<dyn Connector>,
    allow: AllowList,
    user_agent: HeaderValue,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("allow", &self.allow.to_string())
            .finish_non_exhaustive()
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Egress {
    /// The system resolver, plain TCP, TLS verified by the platform's roots, and `allow`.
    pub fn new(allow: AllowList) -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            connector: Arc::new(TcpConnector),
            allow,
            user_agent: HeaderValue::from_static(concat!("pulse/", env!("CARGO_PKG_VERSION"))),
        }
    }

    /// Uses `resolver` to look names up.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Uses `connector` to open connections.
    pub fn with_connector(mut self, connector: Arc<dyn Connector>) -> Self {
        self.connector = connector;
        self
    }

    /// The allow-list.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// `Ok` if requests may go to `ip`: it is public, or in the allow-list.
    pub fn permits(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow.contains(ip) {
            return Ok(());
        }
        check_public(ip)
    }

    /// Resolves `url`'s host once (an IP literal is not resolved) and checks every
    /// address: one that is neither public nor allowed refuses the lot.
    pub async fn check(&self, url: &Url) -> Result<Vec<SocketAddr>, EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::BadUrl(format!(
                "{url}: only http and https URLs"
            )));
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| EgressError::BadUrl(format!("{url}: no port")))?;
        let addrs = match url.host() {
            Some(Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            Some(Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            Some(Host::Domain(name)) => {
                self.resolver
                    .resolve(name, port)
                    .await
                    .map_err(|source| EgressError::Resolve {
                        host: name.to_owned(),
                        source,
                    })?
            }
            None => return Err(EgressError::BadUrl(format!("{url}: no host"))),
        };
        if addrs.is_empty() {
            return Err(EgressError::NoAddresses(
                url.host_str().unwrap_or_default().to_owned(),
            ));
        }
        for a in &addrs {
            self.permits(a.ip()).map_err(EgressError::Refused)?;
        }
        Ok(addrs)
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
        let addrs = self.check(url).await?;
        let (stream, addr) = self.connect(&addrs).await?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let io: Box<dyn Io> = if url.scheme() == "https" {
            Box::new(self.tls(url, &host, stream).await?)
        } else {
            Box::new(stream)
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| EgressError::Http(e.to_string()))?;
        // The connection task ends when the exchange does (the sender is dropped).
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let post = method == http::Method::POST;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .body(Full::new(body.clone()))
            .map_err(|e| EgressError::BadUrl(format!("{url}: {e}")))?;
        *req.headers_mut() = headers;
        let h = req.headers_mut();
        h.insert(
            http::header::HOST,
            HeaderValue::from_str(&authority)
                .map_err(|_| EgressError::BadUrl(format!("{url}: bad host")))?,
        );
        if post || !body.is_empty() {
            h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        if !h.contains_key(http::header::USER_AGENT) {
            h.insert(http::header::USER_AGENT, self.user_agent.clone());
        }
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| EgressError::Http(e.to_string()))?;
        let (parts, mut incoming) = resp.into_parts();
        let mut buf = Vec::new();
        let mut truncated = false;
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| EgressError::Http(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                let room = max_body - buf.len();
                if data.len() > room {
                    buf.extend_from_slice(&data[..room]);
                    // Stop reading: an endless body must not hold the caller.
                    truncated = true;
                    break;
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body: Bytes::from(buf),
            truncated,
            addr,
        })
    }

    /// Connects to the first checked address that accepts.
    async fn connect(&self, addrs: &[SocketAddr]) -> Result<(TcpStream, SocketAddr), EgressError> {
        let mut last = None;
        for &addr in addrs {
            match self.connector.connect(addr).await {
                Ok(s) => return Ok((s, addr)),
                Err(e) => last = Some((addr, e)),
            }
        }
        let (addr, source) = last.unwrap_or_else(|| {
            (
                SocketAddr::from(([0, 0, 0, 0], 0)),
                io::Error::other("no address to connect to"),
            )
        });
        Err(EgressError::Connect { addr, source })
    }

    async fn tls(
        &self,
        url: &Url,
        host: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, EgressError> {
        let tls_err = |message: String| EgressError::Tls {
            host: host.to_owned(),
            message,
        };
        let connector = tokio_rustls::TlsConnector::from(tls::client_config());
        // An IP literal is verified against the certificate's IP addresses.
        let name = match url.host() {
            Some(Host::Ipv4(ip)) => rustls::pki_types::ServerName::IpAddress(IpAddr::V4(ip).into()),
            Some(Host::Ipv6(ip)) => rustls::pki_types::ServerName::IpAddress(IpAddr::V6(ip).into()),
            _ => rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| tls_err(e.to_string()))?,
        };
        connector
            .connect(name, stream)
            .await
            .map_err(|e| tls_err(e.to_string()))
    }
}
