//! `--listen`: where `pulse serve` and `pulse dashboard` take connections.

use std::net::SocketAddr;

use crate::Failure;

/// `--listen`: an address and port (`127.0.0.1:8080`, `[::1]:8080`) or a host name and
/// port (`localhost:8080`, resolved locally; IPv4 preferred).
pub(crate) fn listen_addr(addr: &str) -> Result<SocketAddr, Failure> {
    let bad = |why: String| {
        Failure::Input(format!(
            "invalid --listen {addr:?}{why}: give an address or host name and a port such as 127.0.0.1:8080 or localhost:8080, or off"
        ))
    };
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    let found: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| bad(format!(" ({e})")))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| bad(" (it resolves to no address)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_addresses_and_host_names() {
        let a = listen_addr("127.0.0.1:8080").ok().unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:8080");
        let h = listen_addr("localhost:8080").ok().unwrap();
        assert!(h.ip().is_loopback() && h.port() == 8080, "{h}");
        for bad in ["8080", "localhost"] {
            match listen_addr(bad) {
                Err(Failure::Input(m)) => assert!(m.contains("localhost:8080"), "{m}"),
                _ => panic!("{bad} was taken"),
            }
        }
    }
}
