//! `pulse serve`'s HTTP listener against slow and idle clients:
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
use pulse_shared::domain::{Webhook, WebhookScheme};
use pulse_shared::http::{self, Inbound, ServeLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const LIMITS: ServeLimits = ServeLimits {
    header_timeout: Duration::from_secs(2),
    request_timeout: Duration::from_secs(3),
    max_connections: 4,
    max_per_address: 100,
    max_reading_per_address: 2,
    max_streams: 2,
    max_streams_per_address: 2,
    stream_lifetime: Duration::from_secs(60),
    shutdown_grace: Duration::from_secs(5),
};

struct Listener {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// A webhook that exists (signed with `crate::inbound::SECRET`), without a rate limit.
    webhook: Webhook,
    clock: Arc<pulse_shared::ports::ManualClock>,
}

async fn listen(limits: ServeLimits) -> Listener {
    use pulse_shared::adapters::sqlite::{Db, SqliteQueue, SqliteStore};
    use pulse_shared::ports::Clock;
    // The store answers on the caller's thread: on the paused clock, a call that waited
    // for another thread would let time jump past the listener's deadlines meanwhile.
    let db = Db::open_simulated(None).unwrap();
    let clock = pulse_tests::test_clock();
    let store = Arc::new(SqliteStore::new(db.clone()).with_keys(pulse_tests::test_keys()));
    let queue = Arc::new(SqliteQueue::new(db, clock.clone()));
    let webhook = crate::inbound::unlimited_webhook(store.as_ref(), clock.now()).await;
    let inbound = Arc::new(Inbound::new(
        store,
        queue,
        clock.clone(),
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
        webhook,
        clock,
    }
}

impl Listener {
    /// The head of a POST to the webhook declaring a body of `length` bytes.
    fn head(&self, length: usize) -> String {
        format!(
            "POST /webhooks/{} HTTP/1.1\r\nHost: pulse\r\nContent-Length: {length}\r\n\r\n",
            self.webhook.id
        )
    }

    /// A signed webhook delivery `n` sent whole from 127.0.0.1 on a new connection: the
    /// status line it was answered with, if within `within`.
    async fn deliver(&self, n: u32, within: Duration) -> Option<String> {
        self.deliver_from([127, 0, 0, 1], n, within).await
    }

    /// [`Listener::deliver`] from `from`, its head and body in one write.
    async fn deliver_from(&self, from: [u8; 4], n: u32, within: Duration) -> Option<String> {
        let body = crate::inbound::body_for(WebhookScheme::Pulse, "NOTE", n);
        let headers = crate::inbound::signed(
            WebhookScheme::Pulse,
            crate::inbound::SECRET,
            pulse_shared::ports::Clock::now(self.clock.as_ref()).as_second(),
            &format!("siege-{n}"),
            &body,
        );
        let mut request = format!(
            "POST /webhooks/{} HTTP/1.1\r\nHost: pulse\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.webhook.id,
            body.len()
        );
        for (k, v) in &headers {
            request.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap()));
        }
        request.push_str("\r\n");
        let mut whole = request.into_bytes();
        whole.extend_from_slice(&body);
        let ask = async {
            let mut s = connect_from(from, self.addr).await;
            s.write_all(&whole).await.ok()?;
            let answer = until_closed(&mut s).await;
            answer.lines().next().map(str::to_owned)
        };
        tokio::time::timeout(within, ask).await.ok().flatten()
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
async fn a_body_that_never_comes_is_answered_408_at_its_deadline() {
    let l = listen(LIMITS).await;
    // 100 bytes may take the grace and 3 ms; a large body is cut off by the request
    // timeout before its own deadline (10 s).
    for (length, deadline) in [
        (100, http::BODY_GRACE),
        (256 * 1024, LIMITS.request_timeout),
    ] {
        let start = Instant::now();
        let mut s = TcpStream::connect(l.addr).await.unwrap();
        s.write_all(format!("{}{{\"event", l.head(length)).as_bytes())
            .await
            .unwrap();
        let answer = until_closed(&mut s).await;
        close_to(start.elapsed(), deadline);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"error\""), "a JSON error: {answer}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_body_is_read_for_a_webhook_that_does_not_exist() {
    let l = listen(LIMITS).await;
    let start = Instant::now();
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    s.write_all(
        b"POST /webhooks/wh_01KJPWD6M00CDAJH58GEB7Q2ZP HTTP/1.1\r\nHost: pulse\r\nContent-Length: 100\r\n\r\n{\"event",
    )
    .await
    .unwrap();
    let answer = until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "answered at once"
    );
}

#[tokio::test(start_paused = true)]
async fn one_address_has_a_few_requests_reading_their_bodies_at_once() {
    let l = listen(LIMITS).await;
    // Two from 127.0.0.2 trickle their bodies: its share.
    let mut reading = Vec::new();
    for _ in 0..LIMITS.max_reading_per_address {
        let mut s = connect_from([127, 0, 0, 2], l.addr).await;
        s.write_all(format!("{}{{", l.head(1_000)).as_bytes())
            .await
            .unwrap();
        reading.push(s);
    }
    // On the paused clock this returns once every task waits: the server has taken both
    // in. Not decisive: had it not, the third below would be read, not refused.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A third from there is answered 503 before its body is read, and closed.
    let start = Instant::now();
    let mut third = connect_from([127, 0, 0, 2], l.addr).await;
    third
        .write_all(format!("{}{{", l.head(1_000)).as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.to_lowercase().contains("retry-after: 5"), "{answer}");
    assert!(start.elapsed() < Duration::from_millis(100));
    // A body that comes with its headers is never waited for: it takes no place, and
    // is taken even now.
    assert_eq!(
        l.deliver_from([127, 0, 0, 2], 0, Duration::from_secs(1))
            .await
            .as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    // Another address's delivery is taken meanwhile; so is 127.0.0.2's once its
    // bodies are done with (answered 408 at their deadline).
    assert_eq!(
        l.deliver(1, Duration::from_secs(1)).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    for s in &mut reading {
        assert!(until_closed(s).await.starts_with("HTTP/1.1 408"));
    }
    let mut fourth = connect_from([127, 0, 0, 2], l.addr).await;
    fourth
        .write_all(format!("{}{{", l.head(1)).as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut fourth).await;
    assert!(!answer.starts_with("HTTP/1.1 503"), "{answer}");
}

/// A past defect: 8 addresses × 64 sockets trickling a body one byte every 2 s held
/// every place until the 30 s request timeout, and every signed webhook was refused.
/// Now each address reads few bodies at once, each body has a deadline, and the rest of
/// the crowd is answered 503 or waits as idle connections do, which make room.
#[tokio::test(start_paused = true)]
async fn slow_bodies_from_many_addresses_never_keep_a_signed_webhook_from_being_answered() {
    let limits = ServeLimits {
        max_connections: 32,
        max_per_address: 8,
        max_reading_per_address: 1,
        request_timeout: Duration::from_secs(30),
        ..LIMITS
    };
    let l = listen(limits).await;
    // Each attacker's socket, reconnected whenever it is answered or closed.
    let mut attackers: Vec<Option<TcpStream>> = (0..8 * 8).map(|_| None).collect();
    let mut answered = 0;
    for round in 0..10u32 {
        for (i, slot) in attackers.iter_mut().enumerate() {
            let alive = slot.as_ref().is_some_and(|s| {
                let mut buf = [0u8; 64];
                matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            if alive {
                let _ = slot.as_mut().unwrap().write_all(b"x").await;
                continue;
            }
            let host = 2 + (i / 8) as u8;
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(([127, 0, 0, host], 0).into()).unwrap();
            *slot = match socket.connect(l.addr).await {
                Ok(mut s) => {
                    let _ = s
                        .write_all(format!("{}{{", l.head(256 * 1024)).as_bytes())
                        .await;
                    Some(s)
                }
                Err(_) => None,
            };
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = l.deliver(round, Duration::from_secs(1)).await;
        assert_eq!(status.as_deref(), Some("HTTP/1.1 200 OK"), "round {round}");
        answered += 1;
    }
    assert_eq!(answered, 10);
}

/// Connects to `addr` from the loopback address `from` (127.0.0.x: each stands for
/// another client machine).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `GET /healthz` on a new connection from 127.0.0.1: whether it was answered 200 within
/// `within`.
async fn healthy_within(addr: SocketAddr, within: Duration) -> bool {
    let ask = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pulse\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        Some(until_closed(&mut s).await.starts_with("HTTP/1.1 200"))
    };
    matches!(tokio::time::timeout(within, ask).await, Ok(Some(true)))
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_the_longest_idle_connection_makes_room() {
    let l = listen(LIMITS).await;
    let mut idle = Vec::new();
    for _ in 0..LIMITS.max_connections {
        idle.push(TcpStream::connect(l.addr).await.unwrap());
        // Each one idle a moment longer than the next.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A fifth connection: the oldest idle one is closed at once, long before its
    // header timeout, and the new one is answered.
    let start = Instant::now();
    assert!(healthy_within(l.addr, Duration::from_millis(500)).await);
    until_closed(&mut idle[0]).await;
    assert!(
        start.elapsed() < LIMITS.header_timeout,
        "shed, not timed out"
    );
    // The others were left alone (each waits for its header timeout).
    for s in &mut idle[1..] {
        until_closed(s).await;
    }
    assert!(start.elapsed() >= LIMITS.header_timeout - Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn one_address_holds_no_more_than_its_share() {
    let l = listen(ServeLimits {
        max_per_address: 3,
        max_connections: 100,
        ..LIMITS
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from([127, 0, 0, 2], l.addr).await);
    }
    // The fourth from that address is closed at once; another address is served.
    let start = Instant::now();
    let mut fourth = connect_from([127, 0, 0, 2], l.addr).await;
    until_closed(&mut fourth).await;
    assert!(start.elapsed() < Duration::from_millis(100));
    assert!(healthy_within(l.addr, Duration::from_millis(500)).await);
}

/// A past defect: 1,000 sockets from one address, each sending a header line
/// every 2 s, kept `/healthz` from answering at all. Now a slowloris client holds its
/// address's share, and clients from many addresses are shed as idle: health is answered
/// at once throughout.
#[tokio::test(start_paused = true)]
async fn slowloris_clients_never_keep_the_receiver_from_answering() {
    let limits = ServeLimits {
        max_connections: 32,
        max_per_address: 8,
        header_timeout: Duration::from_secs(10),
        ..LIMITS
    };
    let l = listen(limits).await;
    let mut sockets = Vec::new();
    // 200 from one address, then 10 from each of 20 more.
    for _ in 0..200 {
        sockets.push(connect_from([127, 0, 0, 2], l.addr).await);
    }
    for host in 3..23u8 {
        for _ in 0..10 {
            sockets.push(connect_from([127, 0, 0, host], l.addr).await);
        }
    }
    let mut answered = 0;
    let mut asked = 0;
    for round in 0..5 {
        // Every socket sends one more header line: slow, never finished.
        for s in &mut sockets {
            let _ = s
                .write_all(format!("X-Slow-{round}: 1\r\n").as_bytes())
                .await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        asked += 1;
        answered += usize::from(healthy_within(l.addr, Duration::from_secs(1)).await);
    }
    assert_eq!(
        answered, asked,
        "health was answered every time it was asked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_waits_for_a_slow_client_no_longer_than_the_grace() {
    let limits = ServeLimits {
        request_timeout: Duration::from_secs(60),
        ..LIMITS
    };
    let mut l = listen(limits).await;
    let mut slow = TcpStream::connect(l.addr).await.unwrap();
    // A body whose deadline (10 s) is past the grace.
    slow.write_all(format!("{}{{", l.head(256 * 1024)).as_bytes())
        .await
        .unwrap();
    // On the paused clock this returns once every task waits: the server has taken the
    // request in. Not decisive: had it not, the shutdown would end at once, not at the grace.
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
