//! Which addresses are public, and the allow-list of exceptions.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

/// Why an address is refused: the range it falls in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The address.
    pub addr: IpAddr,
    /// Its range and what the range is, e.g. `127.0.0.0/8 (loopback)`.
    pub range: &'static str,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is in {}", self.addr, self.range)
    }
}

/// Non-public IPv4 ranges, most specific first where they nest.
const V4: &[(&str, &str)] = &[
    ("0.0.0.0/8", "0.0.0.0/8 (\"this network\")"),
    ("10.0.0.0/8", "10.0.0.0/8 (private, RFC 1918)"),
    ("100.64.0.0/10", "100.64.0.0/10 (carrier-grade NAT)"),
    ("127.0.0.0/8", "127.0.0.0/8 (loopback)"),
    (
        "169.254.0.0/16",
        "169.254.0.0/16 (link-local; 169.254.169.254 is the cloud metadata service)",
    ),
    ("172.16.0.0/12", "172.16.0.0/12 (private, RFC 1918)"),
    ("192.0.0.0/24", "192.0.0.0/24 (IETF protocol assignments)"),
    ("192.0.2.0/24", "192.0.2.0/24 (documentation)"),
    ("192.88.99.0/24", "192.88.99.0/24 (6to4 relay anycast)"),
    ("192.168.0.0/16", "192.168.0.0/16 (private, RFC 1918)"),
    ("198.18.0.0/15", "198.18.0.0/15 (benchmarking)"),
    ("198.51.100.0/24", "198.51.100.0/24 (documentation)"),
    ("203.0.113.0/24", "203.0.113.0/24 (documentation)"),
    ("224.0.0.0/4", "224.0.0.0/4 (multicast)"),
    ("240.0.0.0/4", "240.0.0.0/4 (reserved, broadcast)"),
];

/// Non-public IPv6 ranges. IPv4-mapped, NAT64, 6to4 and Teredo addresses embed an IPv4
/// address a gateway would reach: they are refused whatever they embed.
const V6: &[(&str, &str)] = &[
    ("::/128", "::/128 (unspecified)"),
    ("::1/128", "::1/128 (loopback)"),
    ("::ffff:0:0/96", "::ffff:0:0/96 (IPv4-mapped)"),
    ("::/96", "::/96 (IPv4-compatible, deprecated)"),
    ("64:ff9b::/96", "64:ff9b::/96 (NAT64)"),
    ("64:ff9b:1::/48", "64:ff9b:1::/48 (local NAT64)"),
    ("100::/64", "100::/64 (discard)"),
    ("2001::/32", "2001::/32 (Teredo)"),
    ("2001:db8::/32", "2001:db8::/32 (documentation)"),
    ("2002::/16", "2002::/16 (6to4)"),
    (
        "fc00::/7",
        "fc00::/7 (unique local; fd00:ec2::254 is the EC2 metadata service)",
    ),
    ("fe80::/10", "fe80::/10 (link-local)"),
    ("fec0::/10", "fec0::/10 (site-local, deprecated)"),
    ("ff00::/8", "ff00::/8 (multicast)"),
];

fn find(ip: IpAddr, table: &'static [(&'static str, &'static str)]) -> Option<&'static str> {
    table.iter().find_map(|(net, what)| {
        // The table is written here and parsed in a test: a typo fails that test.
        let net: IpNet = net.parse().ok()?;
        net.contains(&ip).then_some(*what)
    })
}

/// `Ok` if `ip` is a public unicast address; otherwise the range that makes it not one.
pub fn check_public(ip: IpAddr) -> Result<(), Refusal> {
    let range = match ip {
        IpAddr::V4(v4) => find(IpAddr::V4(v4), V4),
        IpAddr::V6(v6) => find(IpAddr::V6(v6), V6),
    };
    match range {
        Some(range) => Err(Refusal { addr: ip, range }),
        None => Ok(()),
    }
}

/// Ranges outbound requests may reach although they are not public: local development
/// and tests (`PULSE_HOOKS_ALLOW=127.0.0.1/32,::1/128`). Empty by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList(Vec<IpNet>);

/// An allow-list entry that is not a CIDR range or an address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{entry:?} is not an address or CIDR range; write e.g. 127.0.0.1/32,::1/128 (a bare address means just that address)"
)]
pub struct AllowListError {
    /// The entry at fault.
    pub entry: String,
}

impl AllowList {
    /// Every address: for destinations the operator configured, not a user.
    pub fn any() -> Self {
        Self(vec![
            IpNet::V4(ipnet::Ipv4Net::default()),
            IpNet::V6(ipnet::Ipv6Net::default()),
        ])
    }

    /// Whether `ip` is allowed.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An IPv4-mapped IPv6 address is matched against IPv4 entries as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl FromStr for AllowList {
    type Err = AllowListError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nets = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || AllowListError {
                entry: entry.to_owned(),
            };
            let net = if entry.contains('/') {
                entry.parse::<IpNet>().map_err(|_| bad())?.trunc()
            } else {
                IpNet::from(entry.parse::<IpAddr>().map_err(|_| bad())?)
            };
            nets.push(net);
        }
        Ok(Self(nets))
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// Public addresses used in documentation of this module's tests.
#[doc(hidden)]
pub const PUBLIC_EXAMPLES: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)),
    IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1)),
    IpAddr::V6(Ipv6Addr::new(0x2606, 0x4700, 0, 0, 0, 0, 0, 0x1111)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_range_in_the_tables_parses() {
        for (net, _) in V4.iter().chain(V6) {
            assert!(net.parse::<IpNet>().is_ok(), "{net}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in PUBLIC_EXAMPLES {
            assert_eq!(check_public(ip), Ok(()), "{ip}");
        }
    }

    #[test]
    fn each_listed_range_is_refused_and_named() {
        let cases = [
            ("0.0.0.0", "0.0.0.0/8"),
            ("0.1.2.3", "0.0.0.0/8"),
            ("10.0.0.1", "10.0.0.0/8"),
            ("100.64.0.1", "100.64.0.0/10"),
            ("100.127.255.254", "100.64.0.0/10"),
            ("127.0.0.1", "127.0.0.0/8"),
            ("127.255.0.9", "127.0.0.0/8"),
            ("169.254.169.254", "169.254.0.0/16"),
            ("172.16.0.1", "172.16.0.0/12"),
            ("172.31.255.255", "172.16.0.0/12"),
            ("192.168.1.1", "192.168.0.0/16"),
            ("224.0.0.1", "224.0.0.0/4"),
            ("239.255.255.250", "224.0.0.0/4"),
            ("240.0.0.1", "240.0.0.0/4"),
            ("255.255.255.255", "240.0.0.0/4"),
            ("::", "::/128"),
            ("::1", "::1/128"),
            ("fe80::1", "fe80::/10"),
            ("fc00::1", "fc00::/7"),
            ("fd00:ec2::254", "fc00::/7"),
            ("::ffff:127.0.0.1", "::ffff:0:0/96"),
            ("::ffff:8.8.8.8", "::ffff:0:0/96"),
            ("64:ff9b::a00:1", "64:ff9b::/96"),
            ("2002:a00:1::", "2002::/16"),
            ("2001::1", "2001::/32"),
            ("ff02::1", "ff00::/8"),
        ];
        for (ip, range) in cases {
            let r = check_public(ip.parse().unwrap()).unwrap_err();
            assert!(r.range.starts_with(range), "{ip}: {}", r.range);
        }
        // Just outside the ranges.
        for ip in ["100.128.0.1", "172.32.0.1", "11.0.0.1", "2003::1"] {
            assert_eq!(check_public(ip.parse().unwrap()), Ok(()), "{ip}");
        }
    }

    #[test]
    fn the_allow_list_parses_cidrs_and_addresses_and_names_a_bad_entry() {
        let a: AllowList = "127.0.0.1/32, ::1/128,10.1.0.0/16".parse().unwrap();
        assert!(a.contains("127.0.0.1".parse().unwrap()));
        assert!(!a.contains("127.0.0.2".parse().unwrap()));
        assert!(a.contains("10.1.200.3".parse().unwrap()));
        assert!(a.contains("::1".parse().unwrap()));
        assert!(a.contains("::ffff:127.0.0.1".parse().unwrap()));
        let one: AllowList = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        for bad in ["300.1.1.1/8", "10.0.0.0/33", "nonsense", "127.0.0.1/32,x"] {
            let e = bad.parse::<AllowList>().unwrap_err();
            assert!(bad.contains(&e.entry), "{bad}: {e}");
        }
        assert!("".parse::<AllowList>().unwrap().is_empty());
        assert_eq!(a.to_string(), "127.0.0.1/32,::1/128,10.1.0.0/16");
    }
}
