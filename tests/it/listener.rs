//! `pulse serve`'s HTTP listener against slow and idle clients (hardening finding 5):
//! an idle connection, a partial request line, unfinished headers and a body that never
//! comes each used to hold a connection forever, 1,100 idle connections exhausted the
//! process's files, and a shutdown waited for the slowest client.
//!
//! Time is tokio's paused clock: it jumps to the next timer whenever every task waits, so
//! a 2 s timeout takes no real time and elapsed times are exact.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pulse_shared::config::InboundConfig;
use pulse_shared::http::{self, Inbound, ServeLimits};
use pulse_tests::{Backend, Kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const LIMITS: ServeLimits = ServeLimits {
    header_timeout: Duration::from_secs(2),
    request_timeout: Duration::from_secs(3),
    max_connections: 4,
    shutdown_grace: Duration::from_secs(5),
};

struct Listener {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    _backend: Backend,
}

async fn listen(limits: ServeLimits) -> Listener {
    let b = Backend::new(Kind::Sqlite).await;
    let inbound = Arc::new(Inbound::new(
        b.store.clone(),
        b.queue.clone(),
        b.clock.clone(),
        InboundConfig::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(http::serve(listener, inbound, limits, async move {
        let _ = stopped.await;
    }));
    Listener {
        addr,
        stop: Some(stop),
        served,
        _backend: b,
    }
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    // A reset is a close too.
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

fn close_to(took: Duration, expected: Duration) {
    assert!(
        took >= expected && took < expected + Duration::from_millis(500),
        "took {took:?}, expected {expected:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_or_half_sent_headers_are_closed_after_the_header_timeout() {
    let l = listen(LIMITS).await;
    for partial in [
        &b""[..],
        b"POST /webhooks/wh_01KJPWD6M00CDAJH58GEB7Q2ZP HT",
        b"POST /healthz HTTP/1.1\r\nHost: pulse\r\nContent-Type: appl",
    ] {
        let start = Instant::now();
        let mut s = TcpStream::connect(l.addr).await.unwrap();
        s.write_all(partial).await.unwrap();
        until_closed(&mut s).await;
        close_to(start.elapsed(), LIMITS.header_timeout);
    }
    // A keep-alive connection that goes quiet after a request is closed the same way.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pulse\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let start = Instant::now();
    until_closed(&mut s).await;
    close_to(start.elapsed(), LIMITS.header_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_comes_is_answered_408_after_the_request_timeout() {
    let l = listen(LIMITS).await;
    let start = Instant::now();
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    s.write_all(
        b"POST /webhooks/wh_01KJPWD6M00CDAJH58GEB7Q2ZP HTTP/1.1\r\nHost: pulse\r\nContent-Length: 100\r\n\r\n{\"event",
    )
    .await
    .unwrap();
    let answer = until_closed(&mut s).await;
    close_to(start.elapsed(), LIMITS.request_timeout);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"error\""), "a JSON error: {answer}");
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_wait_for_one_to_close() {
    let l = listen(LIMITS).await;
    let start = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..LIMITS.max_connections + 2 {
        idle.push(TcpStream::connect(l.addr).await.unwrap());
    }
    // The first four are served and time out; the other two wait in the backlog, are
    // accepted as those close, and time out in turn: never more than four at once.
    let mut closed_at = Vec::new();
    for s in &mut idle {
        until_closed(s).await;
        closed_at.push(start.elapsed());
    }
    for t in &closed_at[..LIMITS.max_connections] {
        close_to(*t, LIMITS.header_timeout);
    }
    for t in &closed_at[LIMITS.max_connections..] {
        close_to(*t, LIMITS.header_timeout * 2);
    }
    // Health answers once a place is free.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pulse\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(until_closed(&mut s).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_waits_for_a_slow_client_no_longer_than_the_grace() {
    let limits = ServeLimits {
        request_timeout: Duration::from_secs(60),
        ..LIMITS
    };
    let mut l = listen(limits).await;
    let mut slow = TcpStream::connect(l.addr).await.unwrap();
    slow.write_all(
        b"POST /webhooks/wh_01KJPWD6M00CDAJH58GEB7Q2ZP HTTP/1.1\r\nHost: pulse\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    // Let the server take the request in.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    l.stop.take().unwrap().send(()).unwrap();
    l.served.await.unwrap().unwrap();
    close_to(start.elapsed(), limits.shutdown_grace);
    until_closed(&mut slow).await;
    assert!(
        TcpStream::connect(l.addr).await.is_err(),
        "the listener is closed"
    );
}
