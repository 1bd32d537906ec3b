//! The address filter: addresses the proxy never connects to unless the
//! allowlist names them or their range. Every address a name resolves to
//! is checked, after resolution, so a name on the allowlist that resolves
//! (or is rebound) to the host, the LAN or a cloud metadata service cannot
//! reach it.
//!
//! Refused: everything that is not a public unicast destination, by the
//! IANA special-purpose registries: this network, loopback, RFC 1918
//! private ranges, shared (CGNAT) space, link-local (with the metadata
//! services that live there), IETF protocol assignments, documentation and
//! benchmarking ranges, multicast, reserved space and broadcast; for IPv6
//! the unspecified and loopback addresses, IPv4-compatible addresses,
//! discard-only, Teredo, documentation, unique-local, link-local,
//! site-local and multicast ranges. IPv4-mapped IPv6 addresses are judged
//! as the IPv4 address they carry, and NAT64 and 6to4 addresses by the IPv4
//! address they embed. Metadata services on public addresses (Azure's) are
//! named too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use ipnet::IpNet;

/// A range the proxy refuses, and what it is in words (with its article).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub range: IpNet,
    pub what: &'static str,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.what, self.range)
    }
}

/// Most specific first: the first match names the address.
const RANGES: &[(&str, &str)] = &[
    ("169.254.169.254/32", "a cloud metadata address"),
    ("168.63.129.16/32", "a cloud metadata address (Azure)"),
    ("100.100.100.200/32", "a cloud metadata address (Alibaba)"),
    ("fd00:ec2::254/128", "a cloud metadata address (AWS)"),
    ("255.255.255.255/32", "a broadcast address"),
    ("0.0.0.0/8", "a \"this network\" address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a 6to4 relay address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("::/96", "an IPv4-compatible address"),
    ("64:ff9b:1::/48", "a local NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001::/32", "a Teredo address"),
    ("2001:db8::/32", "a documentation address"),
    ("fc00::/7", "a unique-local address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
];

static TABLE: LazyLock<Vec<Refused>> = LazyLock::new(|| {
    RANGES
        .iter()
        .map(|(range, what)| Refused {
            range: range.parse().expect("a valid range in the table"),
            what,
        })
        .collect()
});

const NAT64: &str = "64:ff9b::/96";
const SIX_TO_FOUR: &str = "2002::/16";

/// The refused range `ip` lies in, or `None` for a public address.
pub fn refused_range(ip: IpAddr) -> Option<Refused> {
    let ip = ip.to_canonical();
    if let Some(r) = TABLE.iter().find(|r| r.range.contains(&ip)) {
        return Some(*r);
    }
    let IpAddr::V6(v6) = ip else {
        return None;
    };
    // Translated to IPv4 on the way: judged by the IPv4 address inside.
    let (prefix, embedded) = if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        (NAT64, low_ipv4(v6))
    } else if v6.segments()[0] == 0x2002 {
        let s = v6.segments();
        (
            SIX_TO_FOUR,
            Ipv4Addr::from(((s[1] as u32) << 16) | s[2] as u32),
        )
    } else {
        return None;
    };
    refused_range(IpAddr::V4(embedded))?;
    Some(Refused {
        range: prefix.parse().expect("a valid prefix"),
        what: if prefix == NAT64 {
            "a NAT64 address of a refused IPv4 address"
        } else {
            "a 6to4 address of a refused IPv4 address"
        },
    })
}

/// The last 32 bits of `v6` as an IPv4 address.
fn low_ipv4(v6: Ipv6Addr) -> Ipv4Addr {
    let o = v6.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(s: &str) -> Option<&'static str> {
        refused_range(s.parse().unwrap()).map(|r| r.what)
    }

    #[test]
    fn every_special_ipv4_range_is_refused() {
        for (addr, expected) in [
            ("0.0.0.0", "a \"this network\" address"),
            ("0.1.2.3", "a \"this network\" address"),
            ("10.0.0.1", "a private address"),
            ("10.255.255.255", "a private address"),
            ("100.64.0.1", "a shared (carrier-grade NAT) address"),
            ("100.127.255.254", "a shared (carrier-grade NAT) address"),
            ("127.0.0.1", "a loopback address"),
            ("127.255.0.9", "a loopback address"),
            ("169.254.1.1", "a link-local address"),
            ("169.254.169.254", "a cloud metadata address"),
            ("168.63.129.16", "a cloud metadata address (Azure)"),
            ("100.100.100.200", "a cloud metadata address (Alibaba)"),
            ("172.16.0.1", "a private address"),
            ("172.31.255.255", "a private address"),
            ("192.0.0.170", "an IETF protocol assignment"),
            ("192.0.2.10", "a documentation address"),
            ("192.168.1.1", "a private address"),
            ("198.18.0.1", "a benchmarking address"),
            ("198.19.255.1", "a benchmarking address"),
            ("198.51.100.7", "a documentation address"),
            ("203.0.113.9", "a documentation address"),
            ("224.0.0.251", "a multicast address"),
            ("239.255.255.250", "a multicast address"),
            ("240.0.0.1", "a reserved address"),
            ("255.255.255.255", "a broadcast address"),
        ] {
            assert_eq!(what(addr), Some(expected), "{addr}");
        }
    }

    #[test]
    fn every_special_ipv6_range_is_refused() {
        for (addr, expected) in [
            ("::", "an unspecified address"),
            ("::1", "a loopback address"),
            ("::7f00:1", "an IPv4-compatible address"),
            ("64:ff9b:1::1", "a local NAT64 address"),
            ("100::1", "a discard-only address"),
            ("2001::1", "a Teredo address"),
            ("2001:db8::1", "a documentation address"),
            ("fc00::1", "a unique-local address"),
            ("fd12:3456::1", "a unique-local address"),
            ("fd00:ec2::254", "a cloud metadata address (AWS)"),
            ("fe80::1", "a link-local address"),
            ("febf::1", "a link-local address"),
            ("fec0::1", "a site-local address"),
            ("ff02::1", "a multicast address"),
        ] {
            assert_eq!(what(addr), Some(expected), "{addr}");
        }
    }

    #[test]
    fn mapped_and_embedded_ipv4_is_judged_as_ipv4() {
        assert_eq!(what("::ffff:127.0.0.1"), Some("a loopback address"));
        assert_eq!(
            what("::ffff:169.254.169.254"),
            Some("a cloud metadata address")
        );
        assert_eq!(what("::ffff:10.1.2.3"), Some("a private address"));
        assert_eq!(what("::ffff:192.168.0.1"), Some("a private address"));
        assert_eq!(what("::ffff:8.8.8.8"), None);
        assert_eq!(
            what("64:ff9b::127.0.0.1"),
            Some("a NAT64 address of a refused IPv4 address")
        );
        assert_eq!(
            what("64:ff9b::a9fe:a9fe"),
            Some("a NAT64 address of a refused IPv4 address")
        );
        assert_eq!(what("64:ff9b::8.8.8.8"), None);
        assert_eq!(
            what("2002:7f00:1::1"),
            Some("a 6to4 address of a refused IPv4 address")
        );
        assert_eq!(
            what("2002:c0a8:101::"),
            Some("a 6to4 address of a refused IPv4 address")
        );
        assert_eq!(what("2002:0808:0808::1"), None);
    }

    #[test]
    fn public_addresses_pass() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "151.101.0.223",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2a04:4e42::223",
            "2001:4860:4860::8888",
        ] {
            assert_eq!(what(addr), None, "{addr}");
        }
    }
}
