//! Which IP addresses a request granted by *name* may not connect to.
//!
//! A rule like `*.example.org` grants names, and whoever controls their DNS
//! chooses the addresses: `127.0.0.1`, `169.254.169.254` (cloud metadata),
//! the operator's private network. [`prohibited`] names the range of such an
//! address, so that the connector ([`super::connect`]) can refuse it unless
//! the rule itself named the IP literal or `localhost`.
//!
//! Refused: IPv4 "this network" 0/8, private 10/8, 172.16/12, 192.168/16,
//! shared (CGNAT) 100.64/10 (Alibaba's metadata is 100.100.100.200),
//! loopback 127/8, link-local 169.254/16 (AWS, GCP, Azure and OpenStack
//! metadata at 169.254.169.254), IETF protocol assignments 192.0.0/24,
//! benchmarking 198.18/15, multicast 224/4, reserved 240/4 and broadcast,
//! Azure's host endpoint 168.63.129.16; IPv6 unspecified, loopback,
//! multicast, link-local fe80::/10, site-local fec0::/10, unique-local
//! fc00::/7 (AWS's fd00:ec2::254), discard 100::/64, local-use NAT64
//! 64:ff9b:1::/48. IPv6 forms that embed an IPv4 address (mapped
//! `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4
//! `2002:aabb:ccdd::`) are judged by that IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The range `ip` belongs to if a granted name must not reach it, or `None`
/// for an ordinary public address.
pub(crate) fn prohibited(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => prohibited_v4(v4),
        IpAddr::V6(v6) => prohibited_v6(v6),
    }
}

fn prohibited_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, ..) => "this-network 0.0.0.0/8",
        (10, ..) => "private 10.0.0.0/8",
        (100, 64..=127, _) => "shared (CGNAT) 100.64.0.0/10",
        (127, ..) => "loopback 127.0.0.0/8",
        (169, 254, _) => "link-local (cloud metadata) 169.254.0.0/16",
        (172, 16..=31, _) => "private 172.16.0.0/12",
        (192, 0, 0) => "IETF protocol assignments 192.0.0.0/24",
        (192, 168, _) => "private 192.168.0.0/16",
        (198, 18..=19, _) => "benchmarking 198.18.0.0/15",
        (224..=239, ..) => "multicast 224.0.0.0/4",
        (240..=255, ..) => "reserved 240.0.0.0/4 (and broadcast)",
        _ if ip == Ipv4Addr::new(168, 63, 129, 16) => "Azure host endpoint 168.63.129.16",
        _ => return None,
    })
}

fn prohibited_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified ::");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    if let Some(v4) = embedded_v4(ip) {
        return prohibited_v4(v4);
    }
    let s = ip.segments();
    Some(match s[0] {
        0xff00..=0xffff => "multicast ff00::/8",
        0xfe80..=0xfebf => "link-local fe80::/10",
        0xfec0..=0xfeff => "site-local fec0::/10",
        0xfc00..=0xfdff => "unique-local fc00::/7",
        0x0100 if s[1..4] == [0, 0, 0] => "discard 100::/64",
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "local-use NAT64 64:ff9b:1::/48",
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address stands for, where it embeds one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d.
        [0, 0, 0, 0, 0, 0xffff | 0, ..] => Some(low),
        // NAT64 well-known prefix 64:ff9b::/96.
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(low),
        // 6to4 2002:aabb:ccdd::/48.
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ip: &str) -> Option<&'static str> {
        prohibited(ip.parse().unwrap())
    }

    #[test]
    fn private_ipv4_ranges_are_prohibited() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.255",
            "127.0.0.1",
            "127.0.1.1",
            "127.255.255.254",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.192",
            "192.168.1.1",
            "198.18.0.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "168.63.129.16",
        ] {
            assert!(check(ip).is_some(), "{ip} must be prohibited");
        }
    }

    #[test]
    fn public_ipv4_addresses_are_not() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.169.0.1",
            "198.20.0.1",
            "169.253.1.1",
            "223.255.255.255",
            "168.63.129.17",
        ] {
            assert_eq!(check(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn private_ipv6_ranges_are_prohibited() {
        for ip in [
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "fc00::1",
            "fd00:ec2::254",
            "ff02::1",
            "100::1",
            "64:ff9b:1::1",
        ] {
            assert!(check(ip).is_some(), "{ip} must be prohibited");
        }
    }

    #[test]
    fn ipv6_forms_of_private_ipv4_addresses_are_prohibited() {
        for ip in [
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.1.2.3",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(check(ip).is_some(), "{ip} must be prohibited");
        }
    }

    #[test]
    fn public_ipv6_addresses_are_not() {
        for ip in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "fe7f::1",
        ] {
            assert_eq!(check(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn ranges_are_named() {
        assert_eq!(
            check("169.254.169.254"),
            Some("link-local (cloud metadata) 169.254.0.0/16")
        );
        assert_eq!(check("::ffff:127.0.0.1"), Some("loopback 127.0.0.0/8"));
    }
}
