//! Who may use the dashboard, and the headers every page carries.
//!
//! A loopback listener needs no login. Any other listener needs `PULSE_DASHBOARD_TOKEN`:
//! the login form takes it and opens a session of its own ([`crate::sessions`]). Every
//! state-changing request is checked here, before any handler runs: one from another site
//! (`Sec-Fetch-Site`, `Origin`) is refused, and one without its caller's CSRF token (a
//! hidden form field: the session's, or on loopback the process's) is refused 403 and
//! writes nothing.

use std::net::SocketAddr;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, KeyInit, Mac};
use jiff::{SignedDuration, Timestamp};
use sha2::Sha256;

use crate::Dashboard;
use crate::sessions::Sessions;

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

/// Who is asking, and what their forms must carry: set by [`protect`] for the request's
/// handler, read by the layout when it renders forms.
#[derive(Clone, Debug, Default)]
pub(crate) struct Caller {
    /// The CSRF token this caller's forms carry (empty before a login).
    pub(crate) csrf: String,
    /// Signed in with a session (token mode): pages offer a logout.
    pub(crate) session: bool,
}

tokio::task_local! {
    static CALLER: Caller;
}

/// The caller of the request being handled.
pub(crate) fn caller() -> Caller {
    CALLER.try_with(Caller::clone).unwrap_or_default()
}

/// The process's secrets: the CSRF token of a loopback dashboard, or the sessions of one
/// reached with a token.
pub(crate) struct Guard {
    access: Access,
    /// Compares secrets in constant time (HMACs under this key).
    key: [u8; 32],
    /// Without a token: the one CSRF token of this machine's pages.
    csrf: String,
    /// With a token: the sessions its logins open.
    sessions: Option<Sessions>,
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

/// What a login came to.
pub(crate) enum Login {
    /// Signed in: the cookie to set.
    Opened(String),
    /// Not the token.
    Wrong,
    /// Too many wrong tokens: try again after this long.
    Wait(SignedDuration),
    /// No login here (a loopback dashboard).
    NotAsked,
}

impl Guard {
    pub(crate) fn new(access: Access) -> Self {
        let sessions = matches!(access, Access::Token(_)).then(Sessions::new);
        Self {
            access,
            key: random(),
            csrf: hex::encode(random()),
            sessions,
        }
    }

    fn same(&self, a: &str, b: &str) -> bool {
        let expected = mac(&self.key, b.as_bytes()).finalize().into_bytes();
        mac(&self.key, a.as_bytes()).verify_slice(&expected).is_ok()
    }

    /// Whether a request may go on, and as whom: a session's (token mode), or, on
    /// loopback without a token, one made from this machine directly. A loopback
    /// dashboard refuses requests that came through a proxy or tunnel, or name another
    /// host (DNS rebinding): those could come from anywhere.
    fn admit(&self, headers: &HeaderMap, now: Timestamp) -> Admit {
        match &self.sessions {
            None if from_this_machine(headers) => Admit::Yes(Caller {
                csrf: self.csrf.clone(),
                session: false,
            }),
            None => Admit::Refused,
            Some(sessions) => match session_cookie(headers).and_then(|id| sessions.find(id, now)) {
                Some(csrf) => Admit::Yes(Caller {
                    csrf,
                    session: true,
                }),
                None => Admit::Login,
            },
        }
    }

    /// Checks a login token from `address` at `now`; `secure` when the page was served
    /// over https (the cookie is then `Secure`).
    pub(crate) fn login(&self, token: &str, address: &str, now: Timestamp, secure: bool) -> Login {
        let (Access::Token(t), Some(sessions)) = (&self.access, &self.sessions) else {
            return Login::NotAsked;
        };
        if let Some(wait) = sessions.throttled(address, now) {
            return Login::Wait(wait);
        }
        if !self.same(token.trim(), t) {
            sessions.failed(address, now);
            tracing::warn!(address, "a dashboard login with a wrong token");
            return Login::Wrong;
        }
        sessions.succeeded(address);
        let opened = sessions.open(now);
        Login::Opened(format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={}{}",
            opened.id,
            crate::sessions::LIFETIME.as_secs(),
            if secure { "; Secure" } else { "" }
        ))
    }

    /// Ends the request's session; the cookie that clears it.
    pub(crate) fn logout(&self, headers: &HeaderMap) -> String {
        if let (Some(sessions), Some(id)) = (&self.sessions, session_cookie(headers)) {
            sessions.close(id);
        }
        format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0")
    }

    /// Whether a login is asked for at all.
    pub(crate) fn needs_login(&self) -> bool {
        self.sessions.is_some()
    }
}

/// The session cookie's value, if the request carries one.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// Whether the request reached this process over https (as a TLS proxy in front says).
pub(crate) fn over_https(headers: &HeaderMap) -> bool {
    let said = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default()
    };
    said("x-forwarded-proto").split(',').next().map(str::trim) == Some("https")
        || said("forwarded").contains("proto=https")
}

/// What [`Guard::admit`] says.
enum Admit {
    Yes(Caller),
    Login,
    Refused,
}

/// Whether a state-changing request comes from another site: the browser says so
/// (`Sec-Fetch-Site`, which decides when it is sent), or its `Origin` is not this host —
/// the `null` origin too (a sandboxed frame, a `data:` page; the dashboard's own pages,
/// served with `Referrer-Policy: same-origin`, send their real origin). A request with
/// neither header (a script, an old browser) is judged by its CSRF token alone.
fn cross_site(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site != "same-origin";
    }
    let Some(origin) = get(header::ORIGIN.as_str()) else {
        return false;
    };
    if origin == "null" {
        return true;
    }
    let host = get("x-forwarded-host")
        .or_else(|| get(header::HOST.as_str()))
        .unwrap_or_default();
    let origin_host = origin
        .split_once("://")
        .map_or("", |(_, rest)| rest.trim_end_matches('/'));
    !origin_host.eq_ignore_ascii_case(host)
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
        // Same-origin requests carry the page's address and origin (so a form's
        // `Origin` is this host's, never `null`); nothing goes to another site.
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// Signs in, refuses cross-site requests and checks CSRF on every state-changing one,
/// and hardens every response.
pub(crate) async fn protect(State(d): State<Dashboard>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let login = path == "/ui/login";
    let admit = if path.starts_with("/ui/assets/") || login {
        Admit::Yes(Caller::default())
    } else {
        d.0.guard.admit(req.headers(), d.0.clock.now())
    };
    let changes = req.method() != Method::GET && req.method() != Method::HEAD;
    let mut response = match admit {
        Admit::Refused => (
            StatusCode::FORBIDDEN,
            "this dashboard has no login, so it answers only requests made on its own machine to a loopback address (not through a proxy or tunnel): set PULSE_DASHBOARD_TOKEN to reach it from elsewhere",
        )
            .into_response(),
        Admit::Login if !changes => Redirect::to("/ui/login").into_response(),
        Admit::Login => (StatusCode::UNAUTHORIZED, "sign in at /ui/login first").into_response(),
        Admit::Yes(caller) if changes && cross_site(req.headers()) => {
            let _ = caller;
            (
                StatusCode::FORBIDDEN,
                "a request from another site: the dashboard takes changes from its own pages only",
            )
                .into_response()
        }
        // The login form carries no token (there is no session yet to bind one to):
        // the origin check above and the login throttle guard it.
        Admit::Yes(caller) if !changes || login => CALLER.scope(caller, next.run(req)).await,
        Admit::Yes(caller) => match csrf_checked(&d, &caller, req).await {
            Ok(req) => CALLER.scope(caller, next.run(req)).await,
            Err(refused) => refused,
        },
    };
    harden(response.headers_mut());
    response
}

/// The request again if its form carries the caller's CSRF token; 403 otherwise.
async fn csrf_checked(d: &Dashboard, caller: &Caller, req: Request) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_FORM)
        .await
        .map_err(|_| (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large").into_response())?;
    let token = url::form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned());
    match token {
        Some(t) if !caller.csrf.is_empty() && d.0.guard.same(&t, &caller.csrf) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        _ => Err((
            StatusCode::FORBIDDEN,
            "this form is missing its CSRF token (or it is from another session): reload the page and try again",
        )
            .into_response()),
    }
}
