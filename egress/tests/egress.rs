//! The guard and the client against real sockets on loopback only. A "tripwire" listener
//! on 127.0.0.2 (a loopback address the allow-list does not cover, standing in for an
//! internal service) proves no connection ever reaches a refused address.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderMap;
use pulse_egress::{AllowList, Egress, EgressError, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use url::Url;

fn allow_loopback_one() -> AllowList {
    "127.0.0.1/32".parse().unwrap()
}

/// Answers each call with the next list; the last repeats. Counts calls.
struct Scripted {
    answers: Mutex<Vec<Vec<SocketAddr>>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn new(answers: Vec<Vec<SocketAddr>>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers),
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Resolver for Scripted {
    async fn resolve(&self, _host: &str, _port: u16) -> io::Result<Vec<SocketAddr>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut a = self.answers.lock().unwrap();
        Ok(if a.len() > 1 {
            a.remove(0)
        } else {
            a[0].clone()
        })
    }
}

/// A tiny HTTP/1.1 server: reads one request, answers with `response`, after `delay`.
async fn server(
    addr: &str,
    response: String,
    delay: Duration,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind(addr).await.unwrap();
    let at = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let response = response.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = Vec::new();
                // Read headers and a Content-Length body.
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some(i) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if got.len() >= i + 4 + len {
                            break;
                        }
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).to_string());
                tokio::time::sleep(delay).await;
                let _ = s.write_all(response.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (at, seen)
}

fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A listener on 127.0.0.2 at `port` (any when 0) counting the connections that reach
/// it, and its port.
async fn tripwire(port: u16) -> (Arc<AtomicUsize>, u16) {
    let l = TcpListener::bind(("127.0.0.2", port)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while l.accept().await.is_ok() {
            h.fetch_add(1, Ordering::SeqCst);
        }
    });
    (hits, port)
}

fn post(
    e: &Egress,
    url: &str,
) -> impl std::future::Future<Output = Result<pulse_egress::Response, EgressError>> {
    let e = e.clone();
    let url = Url::parse(url).unwrap();
    async move {
        e.post(
            &url,
            HeaderMap::new(),
            Bytes::from_static(b"{}"),
            Duration::from_secs(5),
            1024,
        )
        .await
    }
}

#[tokio::test]
async fn every_listed_range_is_refused_as_a_literal_and_through_a_resolver_without_a_connection() {
    let literals = [
        "http://0.0.0.0/",
        "http://10.0.0.1/",
        "http://100.64.0.1/",
        "http://127.0.0.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://172.16.0.1/",
        "http://192.168.0.1/",
        "http://224.0.0.1/",
        "http://240.0.0.1/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[64:ff9b::a00:1]/",
        "http://[2002:a00:1::]/",
        "http://[2001::1]/",
        "http://2130706433/",
    ];
    for url in literals {
        let e = Egress::new(AllowList::default());
        let err = post(&e, url).await.unwrap_err();
        assert!(err.is_refused(), "{url}: {err}");
        // The same address behind a name.
        let ip = Url::parse(url).unwrap().socket_addrs(|| None).unwrap()[0];
        let e = Egress::new(AllowList::default()).with_resolver(Scripted::new(vec![vec![ip]]));
        let err = post(&e, "http://hooks.example.com/").await.unwrap_err();
        assert!(err.is_refused(), "{ip}: {err}");
        assert!(
            err.to_string().contains(&ip.ip().to_string()) || ip.is_ipv6(),
            "{err}"
        );
    }
    // No connection is opened to a refused address: a listener on one counts none.
    let hits = tripwire(0).await;
    let port = hits.1;
    let e = Egress::new(AllowList::default());
    assert!(
        post(&e, &format!("http://127.0.0.2:{port}/"))
            .await
            .unwrap_err()
            .is_refused()
    );
    let e = Egress::new(AllowList::default())
        .with_resolver(Scripted::new(vec![vec![([127, 0, 0, 2], port).into()]]));
    assert!(
        post(&e, &format!("http://internal.example.com:{port}/"))
            .await
            .unwrap_err()
            .is_refused()
    );
    assert_eq!(
        hits.0.load(Ordering::SeqCst),
        0,
        "nothing reached 127.0.0.2"
    );
    // Public addresses pass the check (no connection is made by `check`).
    let e = Egress::new(AllowList::default());
    for url in [
        "http://8.8.8.8/",
        "https://1.1.1.1/",
        "https://[2606:4700::1111]/",
    ] {
        assert!(e.check(&Url::parse(url).unwrap()).await.is_ok(), "{url}");
    }
}

#[tokio::test]
async fn a_resolver_that_rebinds_to_a_private_address_never_leads_to_it() {
    let (good, seen) = server("127.0.0.1:0", ok("fine"), Duration::ZERO).await;
    let (hits, _) = tripwire(good.port()).await;
    let evil: SocketAddr = ([127, 0, 0, 2], good.port()).into();
    // Public (allow-listed) on the first lookup, private on every later one.
    let resolver = Scripted::new(vec![vec![good], vec![evil]]);
    let e = Egress::new(allow_loopback_one()).with_resolver(resolver.clone());
    let r = post(&e, "http://hooks.example.com/x").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.addr, Some(good));
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1, "one lookup");
    // A new connection looks the name up again and is refused (a pooled one was checked
    // when it was opened: the server closes each connection here, so none is pooled).
    let err = post(&e, "http://hooks.example.com/x").await.unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 2);
    // One private address among public ones refuses the lot.
    let e = Egress::new(allow_loopback_one()).with_resolver(Scripted::new(vec![vec![good, evil]]));
    assert!(
        post(&e, "http://hooks.example.com/x")
            .await
            .unwrap_err()
            .is_refused()
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing reached 127.0.0.2");
}

#[tokio::test]
async fn connections_to_a_destination_are_kept_alive_and_reused() {
    // A server that keeps connections open and answers every request on them.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = Vec::new();
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    // Requests here are small POSTs with a 2-byte body.
                    while let Some(i) = find(&got, b"\r\n\r\n") {
                        if got.len() < i + 4 + 2 {
                            break;
                        }
                        got.drain(..i + 4 + 2);
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                    }
                }
            });
        }
    });
    let e = Egress::new(allow_loopback_one());
    for _ in 0..20 {
        let r = post(&e, &format!("http://{addr}/")).await.unwrap();
        assert_eq!(&r.body[..], b"ok");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection for twenty requests"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn a_post_sends_headers_and_body_and_reads_the_answer() {
    let (addr, seen) = server("127.0.0.1:0", ok("{\"ok\":true}"), Duration::ZERO).await;
    let e = Egress::new(allow_loopback_one());
    let mut h = HeaderMap::new();
    h.insert("x-test", "1".parse().unwrap());
    let r = e
        .post(
            &Url::parse(&format!("http://{addr}/path?q=1")).unwrap(),
            h,
            Bytes::from_static(b"hello"),
            Duration::from_secs(5),
            1024,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"{\"ok\":true}");
    assert!(!r.truncated);
    let req = seen.lock().unwrap()[0].clone();
    assert!(req.starts_with("POST /path?q=1 HTTP/1.1\r\n"), "{req}");
    assert!(req.to_ascii_lowercase().contains("x-test: 1"));
    assert!(req.to_ascii_lowercase().contains(&format!("host: {addr}")));
    assert!(req.ends_with("hello"));
}

#[tokio::test]
async fn a_redirect_is_returned_not_followed() {
    let (addr, seen) = server(
        "127.0.0.1:0",
        "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/\r\ncontent-length: 0\r\n\r\n"
            .into(),
        Duration::ZERO,
    )
    .await;
    let e = Egress::new(allow_loopback_one());
    let r = post(&e, &format!("http://{addr}/")).await.unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(r.headers["location"], "http://169.254.169.254/");
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "one request: the redirect was not followed"
    );
}

#[tokio::test]
async fn a_silent_server_times_out_a_long_body_is_cut_and_a_closed_port_is_a_connect_error() {
    let (slow, _) = server("127.0.0.1:0", ok("late"), Duration::from_secs(30)).await;
    let e = Egress::new(allow_loopback_one());
    let err = e
        .post(
            &Url::parse(&format!("http://{slow}/")).unwrap(),
            HeaderMap::new(),
            Bytes::new(),
            Duration::from_millis(200),
            1024,
        )
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");

    let big = "x".repeat(50 * 1024);
    let (addr, _) = server("127.0.0.1:0", ok(&big), Duration::ZERO).await;
    let r = e
        .post(
            &Url::parse(&format!("http://{addr}/")).unwrap(),
            HeaderMap::new(),
            Bytes::new(),
            Duration::from_secs(5),
            10 * 1024,
        )
        .await
        .unwrap();
    assert_eq!(r.body.len(), 10 * 1024);
    assert!(r.truncated);

    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let err = post(&e, &format!("http://{closed}/")).await.unwrap_err();
    assert!(matches!(err, EgressError::Connect { .. }), "{err}");
    let err = post(&e, "ftp://127.0.0.1/").await.unwrap_err();
    assert!(matches!(err, EgressError::BadUrl(_)), "{err}");
}

/// A TLS server on loopback with a self-signed certificate (for 127.0.0.1 and
/// localhost, in `tests/fixtures`) that no platform trusts. Returns its address and how
/// many handshakes reached it.
async fn untrusted_tls_server() -> (SocketAddr, Arc<AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let cert = CertificateDer::from_pem_file(format!("{dir}/self-signed.crt")).unwrap();
    let key = PrivateKeyDer::from_pem_file(format!("{dir}/self-signed.key")).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hellos = Arc::new(AtomicUsize::new(0));
    let seen = hellos.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // The client refuses the certificate: the handshake fails here too.
                if let Ok(mut tls) = acceptor.accept(stream).await {
                    let _ = tls.write_all(ok("trusted?").as_bytes()).await;
                }
            });
        }
    });
    (addr, hellos)
}

#[tokio::test]
async fn https_verifies_the_server_certificate_against_the_platform_roots() {
    let (addr, hellos) = untrusted_tls_server().await;
    let e = Egress::new(allow_loopback_one());
    // The name matches the certificate; only its issuer is unknown.
    let err = post(&e, &format!("https://{addr}/")).await.unwrap_err();
    assert_eq!(hellos.load(Ordering::SeqCst), 1);
    match &err {
        EgressError::Tls { host, message } => {
            assert_eq!(host, "127.0.0.1");
            assert!(message.contains("UnknownIssuer"), "{message}");
        }
        other => panic!("expected a TLS refusal, got {other}"),
    }
}

#[test]
fn a_url_is_shown_without_its_credentials_or_query_values() {
    let url = Url::parse("https://me:pw@api.example.com/v1/x?api_key=SECRET&limit=5#frag").unwrap();
    assert_eq!(
        pulse_egress::redacted(&url),
        "https://api.example.com/v1/x?api_key=***&limit=***"
    );
    let plain = Url::parse("http://127.0.0.1:8080/tool").unwrap();
    assert_eq!(pulse_egress::redacted(&plain), "http://127.0.0.1:8080/tool");
}

#[tokio::test]
async fn a_failed_request_s_error_does_not_carry_the_key_in_its_url() {
    // A port nothing listens on: the connection is refused.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let e = Egress::new(allow_loopback_one());
    let err = post(&e, &format!("http://127.0.0.1:{port}/x?api_key=SECRET"))
        .await
        .expect_err("nothing listens there");
    let text = err.to_string();
    assert!(!text.contains("SECRET"), "{text}");
    let refused = post(&e, &format!("ftp://127.0.0.1:{port}/x?api_key=SECRET"))
        .await
        .expect_err("not http");
    assert!(!refused.to_string().contains("SECRET"), "{refused}");
}
