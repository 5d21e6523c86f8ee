//! Who may use the dashboard, and the headers every page carries.
//!
//! A loopback listener needs no login. Any other listener needs `PULSE_DASHBOARD_TOKEN`:
//! the login form takes it and sets an HttpOnly, SameSite=Strict session cookie. Every
//! state-changing request carries the process's CSRF token (a hidden form field), checked
//! here, before any handler runs: a request without it is refused 403 and writes nothing.

use std::net::SocketAddr;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::Dashboard;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "pulse_session";
/// Largest form body the dashboard reads.
const MAX_FORM: usize = 64 * 1024;

/// Why a listener cannot serve the dashboard (or `/metrics`) as configured.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The token is too short to be a secret.
    #[error(
        "PULSE_DASHBOARD_TOKEN is too short: use at least 16 random characters (e.g. `openssl rand -hex 24`)"
    )]
    ShortToken,
    /// The listener is reachable from other machines and there is no token.
    #[error(
        "the dashboard on {0} would be reachable from other machines: set PULSE_DASHBOARD_TOKEN (at least 16 random characters) to require a login, or listen on 127.0.0.1"
    )]
    Exposed(SocketAddr),
}

/// How the dashboard is reached.
#[derive(Clone, Debug)]
pub enum Access {
    /// On a loopback listener: no login.
    Open,
    /// Elsewhere: a login with this token (`PULSE_DASHBOARD_TOKEN`).
    Token(String),
}

impl Access {
    /// What a listener on `addr` needs: nothing on loopback, else the token, which must
    /// then be given (at least 16 characters).
    pub fn for_listener(addr: SocketAddr, token: Option<&str>) -> Result<Self, AccessError> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) if t.len() < 16 => Err(AccessError::ShortToken),
            Some(t) => Ok(Self::Token(t.to_owned())),
            None if addr.ip().is_loopback() => Ok(Self::Open),
            None => Err(AccessError::Exposed(addr)),
        }
    }

    /// Whether a machine client (a Prometheus scraper at `GET /metrics`) may read: on
    /// loopback, a request made on this machine; with a token, one that sends it as
    /// `Authorization: Bearer <token>` (compared in constant time).
    pub fn admits_bearer(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Open => from_this_machine(headers),
            Self::Token(token) => headers
                .get_all(header::AUTHORIZATION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .filter_map(|v| v.strip_prefix("Bearer "))
                .any(|given| {
                    let key = random();
                    let expected = mac(&key, token.as_bytes()).finalize().into_bytes();
                    mac(&key, given.trim().as_bytes())
                        .verify_slice(&expected)
                        .is_ok()
                }),
        }
    }
}

/// The process's secrets for sessions and CSRF.
pub(crate) struct Guard {
    access: Access,
    /// Compares secrets in constant time (HMACs under this key).
    key: [u8; 32],
    csrf: String,
    session: Option<String>,
}

fn random() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

fn mac(key: &[u8], data: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(data);
    m
}

impl Guard {
    pub(crate) fn new(access: Access) -> Self {
        let key = random();
        let session = match &access {
            Access::Open => None,
            Access::Token(t) => Some(hex::encode(
                mac(t.as_bytes(), &random()).finalize().into_bytes(),
            )),
        };
        Self {
            access,
            key,
            csrf: hex::encode(random()),
            session,
        }
    }

    /// The token every form carries.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    fn same(&self, a: &str, b: &str) -> bool {
        let expected = mac(&self.key, b.as_bytes()).finalize().into_bytes();
        mac(&self.key, a.as_bytes()).verify_slice(&expected).is_ok()
    }

    /// Whether a request may go on: signed in, or (on loopback, without a token) made
    /// from this machine directly. A loopback dashboard refuses requests that came
    /// through a proxy or tunnel, or name another host (DNS rebinding): those could come
    /// from anywhere.
    fn admit(&self, headers: &HeaderMap) -> Admit {
        match &self.session {
            None if from_this_machine(headers) => Admit::Yes,
            None => Admit::Refused,
            Some(_) if self.signed_in(headers) => Admit::Yes,
            Some(_) => Admit::Login,
        }
    }

    fn signed_in(&self, headers: &HeaderMap) -> bool {
        let Some(session) = &self.session else {
            return false;
        };
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(name, value)| name == COOKIE && self.same(value, session))
    }

    /// Checks a login token; the cookie to set when it is right.
    pub(crate) fn login(&self, token: &str) -> Option<String> {
        match (&self.access, &self.session) {
            (Access::Token(t), Some(session)) if self.same(token.trim(), t) => Some(format!(
                "{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/ui"
            )),
            _ => None,
        }
    }

    /// Whether a login is asked for at all.
    pub(crate) fn needs_login(&self) -> bool {
        self.session.is_some()
    }
}

/// What [`Guard::admit`] says.
enum Admit {
    Yes,
    Login,
    Refused,
}

/// A request made on this machine to a loopback address: no proxy headers, and a Host
/// that is a loopback name or address.
fn from_this_machine(headers: &HeaderMap) -> bool {
    let proxied = [
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-real-ip",
        "cf-connecting-ip",
    ]
    .iter()
    .any(|h| headers.contains_key(*h));
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    let local = name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !proxied && local
}

/// The headers of every dashboard response.
fn harden(headers: &mut HeaderMap) {
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// Signs in, checks CSRF on every state-changing request, and hardens every response.
pub(crate) async fn protect(State(d): State<Dashboard>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let open = path.starts_with("/ui/assets/") || path == "/ui/login";
    let admit = if open {
        Admit::Yes
    } else {
        d.0.guard.admit(req.headers())
    };
    let mut response = if let Admit::Refused = admit {
        (
            StatusCode::FORBIDDEN,
            "this dashboard has no login, so it answers only requests made on its own machine to a loopback address (not through a proxy or tunnel): set PULSE_DASHBOARD_TOKEN to reach it from elsewhere",
        )
            .into_response()
    } else if let Admit::Login = admit {
        if req.method() == Method::GET {
            Redirect::to("/ui/login").into_response()
        } else {
            (StatusCode::UNAUTHORIZED, "sign in at /ui/login first").into_response()
        }
    } else if req.method() == Method::GET || req.method() == Method::HEAD {
        next.run(req).await
    } else {
        match csrf_checked(&d, req).await {
            Ok(req) => next.run(req).await,
            Err(refused) => refused,
        }
    };
    harden(response.headers_mut());
    response
}

/// The request again if its form carries the CSRF token; 403 otherwise.
async fn csrf_checked(d: &Dashboard, req: Request) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_FORM)
        .await
        .map_err(|_| (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large").into_response())?;
    let token = url::form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned());
    match token {
        Some(t) if d.0.guard.same(&t, d.0.guard.csrf()) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        _ => Err((
            StatusCode::FORBIDDEN,
            "this form is missing its CSRF token (or it is from another session): reload the page and try again",
        )
            .into_response()),
    }
}
