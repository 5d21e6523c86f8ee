//! `pulse serve`'s listener, kept available under hostile load.
//!
//! A connection takes one of [`ServeLimits::max_connections`] places, and one address at
//! most [`ServeLimits::max_per_address`] of them. When every place is taken, the newest
//! connection does not wait in the kernel's backlog behind them: the longest idle one — a
//! connection waiting for a request's headers, as a slowloris client's always is — is
//! closed to make room, and only when every connection is busy answering is the new one
//! refused. No connection waits for a request's headers longer than
//! [`ServeLimits::header_timeout`], and no request takes longer than
//! [`ServeLimits::request_timeout`].
//!
//! A request whose body must be waited for (it did not come with its headers) is
//! *reading* until it has arrived, and one address may have at most
//! [`ServeLimits::max_reading_per_address`] requests reading at once: past it a body is
//! not waited for, the request is answered 503, and its connection closed. With
//! each body's deadline (its size at a minimum rate, see [`super::body_deadline`]), a
//! crowd trickling bodies holds a few places an address for seconds, never all of them.
//! An IPv6 client is counted by its /64, the block one machine is usually given.
//!
//! Long-lived streams (the dashboard's server-sent events, long polls) hold a connection
//! by design, so they leave the connection places for a budget of their own
//! ([`ServeLimits::max_streams`], [`ServeLimits::max_streams_per_address`]), each for at
//! most [`ServeLimits::stream_lifetime`]: idle streams can never starve the receiver. A
//! handler asks for a place with [`StreamSlot::open`]; one that is not served here (the
//! Lambda receiver) has no slot and needs none.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use super::{ClientIp, error_response};

/// Limits of the listener (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Longest wait for a request's headers (hyper's header-read timeout).
    pub header_timeout: Duration,
    /// Longest a request may take, its body included: past it the request is answered
    /// 408 with why.
    pub request_timeout: Duration,
    /// Most connections open at once (streams aside).
    pub max_connections: usize,
    /// Most connections one address holds at once (streams aside).
    pub max_per_address: usize,
    /// Most requests one address may have reading their bodies at once.
    pub max_reading_per_address: usize,
    /// Most long-lived streams open at once.
    pub max_streams: usize,
    /// Most long-lived streams one address holds at once.
    pub max_streams_per_address: usize,
    /// Longest a stream stays open; its client opens another (an event source does so
    /// by itself).
    pub stream_lifetime: Duration,
    /// Longest a shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            // Well under the usual 1,024 open files, with room for the database, the
            // streams and outbound connections.
            max_connections: 512,
            max_per_address: 64,
            max_reading_per_address: 8,
            max_streams: 128,
            max_streams_per_address: 16,
            stream_lifetime: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What a connection is doing.
const IDLE: u8 = 0;
const BUSY: u8 = 1;
const STREAM: u8 = 2;

/// One open connection, as the listener keeps track of it.
struct Conn {
    ip: IpAddr,
    state: Arc<AtomicU8>,
    /// Since when it is idle (waiting for a request's headers), or opened.
    since: Arc<Mutex<Instant>>,
    abort: Option<AbortHandle>,
}

/// The open connections and streams, by address.
#[derive(Default)]
struct Places {
    conns: HashMap<u64, Conn>,
    next_id: u64,
    streams: usize,
    streams_by_ip: HashMap<IpAddr, usize>,
    /// Requests reading their bodies, by address.
    reading: HashMap<IpAddr, usize>,
}

/// The address a client is counted by: an IPv4 address (an IPv4-mapped IPv6 one too) as
/// it is, an IPv6 one by its /64, the block one machine is usually given.
pub fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

impl Places {
    /// Connections holding a place (streams aside), overall and from `ip`.
    fn held(&self, ip: IpAddr) -> (usize, usize) {
        let mut all = 0;
        let mut mine = 0;
        for c in self.conns.values() {
            if c.state.load(Ordering::Acquire) != STREAM {
                all += 1;
                mine += usize::from(c.ip == ip);
            }
        }
        (all, mine)
    }

    /// The connection idle the longest, if any is idle.
    fn longest_idle(&self) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, c)| c.state.load(Ordering::Acquire) == IDLE)
            .min_by_key(|(_, c)| *lock(&c.since))
            .map(|(id, _)| *id)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The listener's book of places, shared with the connections and their streams.
#[derive(Clone)]
struct Book {
    places: Arc<Mutex<Places>>,
    limits: ServeLimits,
}

impl Book {
    /// Admits a connection from `ip`: its id and state, or `None` when it is refused (its
    /// address holds its share, or every place is busy). At capacity the longest idle
    /// connection is closed to make room.
    fn admit(&self, ip: IpAddr) -> Option<(u64, Arc<AtomicU8>, Arc<Mutex<Instant>>)> {
        let mut places = lock(&self.places);
        let (all, mine) = places.held(ip);
        if mine >= self.limits.max_per_address {
            return None;
        }
        if all >= self.limits.max_connections {
            let idle = places.longest_idle()?;
            if let Some(shed) = places.conns.remove(&idle)
                && let Some(abort) = shed.abort
            {
                abort.abort();
            }
        }
        let id = places.next_id;
        places.next_id += 1;
        let state = Arc::new(AtomicU8::new(IDLE));
        let since = Arc::new(Mutex::new(Instant::now()));
        places.conns.insert(
            id,
            Conn {
                ip,
                state: state.clone(),
                since: since.clone(),
                abort: None,
            },
        );
        Some((id, state, since))
    }

    fn started(&self, id: u64, abort: AbortHandle) {
        match lock(&self.places).conns.get_mut(&id) {
            Some(c) => c.abort = Some(abort),
            // Shed before its task began.
            None => abort.abort(),
        }
    }

    fn closed(&self, id: u64) {
        lock(&self.places).conns.remove(&id);
    }

    /// A place for a request of `ip` to read its body in, held until the guard is
    /// dropped; `None` when its address has its share reading already.
    fn start_reading(&self, ip: IpAddr) -> Option<Reading> {
        let mut places = lock(&self.places);
        let n = places.reading.entry(ip).or_default();
        if *n >= self.limits.max_reading_per_address {
            return None;
        }
        *n += 1;
        Some(Reading {
            book: self.clone(),
            ip,
        })
    }
}

/// A request's place among those reading their bodies; given back when dropped.
struct Reading {
    book: Book,
    ip: IpAddr,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut places = lock(&self.book.places);
        if let Some(n) = places.reading.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                places.reading.remove(&self.ip);
            }
        }
    }
}

/// A request body that takes a [`Reading`] place the first time it must be waited for
/// (a body that came with its headers never does), and holds it until it has all
/// arrived or is dropped. When its address has its share reading, it ends in
/// [`ReadingFull`] instead of waiting.
struct ReadingBody {
    inner: hyper::body::Incoming,
    book: Book,
    ip: IpAddr,
    place: Option<Reading>,
}

/// A body that would have waited while its address has its share of bodies reading.
#[derive(Debug, thiserror::Error)]
#[error("too many requests from this address are still sending their bodies")]
pub(crate) struct ReadingFull;

impl HttpBody for ReadingBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Pending if self.place.is_none() => match self.book.start_reading(self.ip) {
                Some(place) => self.place = Some(place),
                None => return Poll::Ready(Some(Err(Box::new(ReadingFull)))),
            },
            Poll::Ready(None) => self.place = None,
            Poll::Ready(Some(_)) if self.inner.is_end_stream() => self.place = None,
            _ => {}
        }
        polled.map(|frame| frame.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether a request comes with a body to read.
fn has_body(req: &Request<hyper::body::Incoming>) -> bool {
    let headers = req.headers();
    headers.contains_key(axum::http::header::TRANSFER_ENCODING)
        || headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// A connection's place in the book, handed to handlers in the request's extensions so
/// a long-lived stream can move to the streams' budget.
#[derive(Clone)]
pub struct StreamSlot {
    book: Book,
    ip: IpAddr,
    state: Arc<AtomicU8>,
}

/// A stream's place; the stream holds it while it runs, and gives it back when dropped.
pub struct StreamPlace {
    book: Book,
    ip: IpAddr,
    /// How long the stream may run.
    pub lifetime: Duration,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut places = lock(&self.book.places);
        places.streams = places.streams.saturating_sub(1);
        if let Some(n) = places.streams_by_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                places.streams_by_ip.remove(&self.ip);
            }
        }
    }
}

impl StreamSlot {
    /// The longest a handler may wait before answering (a long poll): a second under the
    /// request timeout, which would cut it off.
    pub fn longest_wait(&self) -> Duration {
        self.book
            .limits
            .request_timeout
            .saturating_sub(Duration::from_secs(1))
    }

    /// Turns the request's connection into a long-lived stream: it gives up its
    /// connection place for one in the streams' budget. [`StreamsFull`] when that budget
    /// is spent; its response is a 503 asking to retry later.
    pub fn open(&self) -> Result<StreamPlace, StreamsFull> {
        let limits = self.book.limits;
        let mut places = lock(&self.book.places);
        let mine = places.streams_by_ip.get(&self.ip).copied().unwrap_or(0);
        if places.streams >= limits.max_streams || mine >= limits.max_streams_per_address {
            return Err(StreamsFull);
        }
        places.streams += 1;
        *places.streams_by_ip.entry(self.ip).or_default() += 1;
        self.state.store(STREAM, Ordering::Release);
        Ok(StreamPlace {
            book: self.book.clone(),
            ip: self.ip,
            lifetime: limits.stream_lifetime,
        })
    }
}

/// The streams' budget is spent: no long-lived stream opens now.
#[derive(Debug, thiserror::Error)]
#[error("too many live streams are open; close some pages, or retry in a minute")]
pub struct StreamsFull;

impl IntoResponse for StreamsFull {
    fn into_response(self) -> Response {
        let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, self.to_string());
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("30"),
        );
        r
    }
}

/// A response body that marks its connection idle again once it has been sent (or
/// dropped): from then on the connection waits for the next request's headers.
struct Tracked {
    inner: Body,
    state: Arc<AtomicU8>,
    since: Arc<Mutex<Instant>>,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        *lock(&self.since) = Instant::now();
        self.state.store(IDLE, Ordering::Release);
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, within `limits` (see the
/// module's documentation), recording each request's peer address as its [`ClientIp`]
/// and giving it the connection's [`StreamSlot`].
pub async fn serve_app(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower_service::Service;

    let request_timeout = limits.request_timeout;
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let book = Book {
        places: Arc::default(),
        limits,
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut refused = Refusals::default();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let ip = counted_as(peer.ip());
        let Some((id, state, since)) = book.admit(ip) else {
            // Closed at once: its address holds its share, or every place is busy.
            if let Some(r) = refused.count(ip, Instant::now()) {
                info!(refused = r.count, busiest = %r.busiest, from_it = r.from_busiest, "connections refused: their address held its share of places, or every place was busy");
            }
            drop(stream);
            continue;
        };
        let slot = StreamSlot {
            book: book.clone(),
            ip,
            state: state.clone(),
        };
        let client = ClientIp(peer.ip().to_string());
        let reading = book.clone();
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            state.store(BUSY, Ordering::Release);
            req.extensions_mut().insert(client.clone());
            req.extensions_mut().insert(slot.clone());
            let (state, since) = (state.clone(), since.clone());
            let reading = has_body(&req).then(|| reading.clone());
            let mut app = app.clone();
            async move {
                // The timeout is kept here, around the router, rather than as a layer of
                // it: a router layer wraps every route in another boxed service, cloned
                // and called for each request.
                let call = match reading {
                    Some(book) => app.call(req.map(|inner| {
                        Body::new(ReadingBody {
                            inner,
                            book,
                            ip,
                            place: None,
                        })
                    })),
                    None => app.call(req.map(Body::new)),
                };
                let response = match tokio::time::timeout(request_timeout, call).await {
                    Ok(response) => response?,
                    Err(_) => timed_out(),
                };
                Ok::<_, std::convert::Infallible>(response.map(|inner| {
                    Body::new(Tracked {
                        inner,
                        state,
                        since,
                    })
                }))
            }
        });
        let conn = graceful.watch(http1.serve_connection(TokioIo::new(stream), service));
        let done = book.clone();
        let abort = connections.spawn(async move {
            let _ = conn.await;
            done.closed(id);
        });
        book.started(id, abort);
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            open = connections.len(),
            grace = ?limits.shutdown_grace,
            "connections still open after the shutdown grace: closing them"
        );
    }
    connections.abort_all();
    Ok(())
}

/// The answer to a request that took longer than [`ServeLimits::request_timeout`].
fn timed_out() -> Response {
    error_response(
        StatusCode::REQUEST_TIMEOUT,
        "the request (its body included) took too long to arrive; send it in one go",
    )
}

/// Refused connections, told at most once a minute with their count and the busiest
/// address (a flood must not flood the log): the first at once, then those of each
/// minute at the first refusal after it.
#[derive(Default)]
struct Refusals {
    /// When they were last told.
    told: Option<Instant>,
    count: u64,
    by_ip: HashMap<IpAddr, u64>,
}

/// What [`Refusals::count`] says to log.
#[derive(Debug, PartialEq, Eq)]
struct Refused {
    count: u64,
    busiest: IpAddr,
    from_busiest: u64,
}

impl Refusals {
    /// Counts a refusal of `ip` at `now`: what to log, when it is time to.
    fn count(&mut self, ip: IpAddr, now: Instant) -> Option<Refused> {
        self.count += 1;
        *self.by_ip.entry(ip).or_default() += 1;
        if self
            .told
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(60))
        {
            return None;
        }
        let (busiest, from_busiest) = self
            .by_ip
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(ip, n)| (*ip, *n))?;
        let told = Refused {
            count: self.count,
            busiest,
            from_busiest,
        };
        *self = Self {
            told: Some(now),
            ..Self::default()
        };
        Some(told)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_counted_by_its_64_and_a_mapped_ipv4_one_as_ipv4() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            counted_as(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            counted_as(ip("2001:db8:1:2::1"))
        );
        assert_eq!(counted_as(ip("2001:db8:1:2::1")), ip("2001:db8:1:2::"));
        assert_ne!(
            counted_as(ip("2001:db8:1:2::1")),
            counted_as(ip("2001:db8:1:3::1"))
        );
        assert_eq!(counted_as(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(counted_as(ip("10.0.0.1")), ip("10.0.0.1"));
    }

    #[test]
    fn a_flood_of_refusals_is_told_once_a_minute_with_its_count() {
        let mut r = Refusals::default();
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // The first is told at once.
        assert_eq!(
            r.count(a, t0),
            Some(Refused {
                count: 1,
                busiest: a,
                from_busiest: 1
            })
        );
        // 17,000 more within the minute: none told.
        let told = (0..17_000u64)
            .filter_map(|n| {
                let ip = if n % 4 == 0 { a } else { b };
                r.count(ip, t0 + Duration::from_millis(n * 3))
            })
            .count();
        assert_eq!(told, 0);
        // The first past the minute tells them all, and the busiest address.
        assert_eq!(
            r.count(b, t0 + Duration::from_secs(61)),
            Some(Refused {
                count: 17_001,
                busiest: b,
                from_busiest: 12_751
            })
        );
        assert_eq!(r.count(a, t0 + Duration::from_secs(62)), None);
    }
}
