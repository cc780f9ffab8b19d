//! What kind of address an IP is: public, the local network, or this machine.
//!
//! Two guards decide by it: `web_fetch`'s pinned resolver (only public
//! addresses unless `[web] allow_private`) and the exec sandbox's network
//! proxy (`[exec] network = "internet" | "lan"`). Both must agree on what
//! "public" means, so the tables live here once.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is a globally routable address (not private, loopback,
/// link-local, CGNAT, multicast, reserved or otherwise special). IPv6 forms
/// that embed an IPv4 address are judged by that address.
pub fn is_public(ip: IpAddr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    const BLOCKED: [(u32, u32); 14] = [
        (0x0000_0000, 8),  // 0.0.0.0/8 "this network"
        (0x0A00_0000, 8),  // 10.0.0.0/8
        (0x6440_0000, 10), // 100.64.0.0/10 CGNAT
        (0x7F00_0000, 8),  // 127.0.0.0/8 loopback
        (0xA9FE_0000, 16), // 169.254.0.0/16 link-local, cloud metadata
        (0xAC10_0000, 12), // 172.16.0.0/12
        (0xC000_0000, 24), // 192.0.0.0/24 IETF protocol assignments
        (0xC000_0200, 24), // 192.0.2.0/24 documentation
        (0xC0A8_0000, 16), // 192.168.0.0/16
        (0xC612_0000, 15), // 198.18.0.0/15 benchmarking
        (0xC633_6400, 24), // 198.51.100.0/24 documentation
        (0xCB00_7100, 24), // 203.0.113.0/24 documentation
        (0xE000_0000, 4),  // 224.0.0.0/4 multicast
        (0xF000_0000, 4),  // 240.0.0.0/4 reserved, incl. 255.255.255.255
    ];
    let bits = u32::from(ip);
    !BLOCKED.iter().any(|&(net, len)| bits >> (32 - len) == net >> (32 - len))
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    const BLOCKED: [(u128, u32); 8] = [
        (0, 128),                          // :: unspecified
        (1, 128),                          // ::1 loopback
        (0x0100_0000_0000_0000 << 64, 64), // 100::/64 discard
        (0x2001_0db8 << 96, 32),           // 2001:db8::/32 documentation
        (0x0064_ff9b_0001 << 80, 48),      // 64:ff9b:1::/48 local-use NAT64
        (0xfc00 << 112, 7),                // fc00::/7 unique local
        (0xfe80 << 112, 10),               // fe80::/10 link-local (and fec0::/10 below)
        (0xff00 << 112, 8),                // ff00::/8 multicast
    ];
    let bits = u128::from(ip);
    let site_local = bits >> 118 == 0xfec0 >> 6;
    !site_local && !BLOCKED.iter().any(|&(net, len)| bits >> (128 - len) == net >> (128 - len))
}

/// The IPv4 address inside an IPv6 one: mapped (`::ffff:a.b.c.d`), compatible
/// (`::a.b.c.d`, not `::` or `::1`), NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:aabb:ccdd::`).
pub fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let bits = u128::from(v6);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    if bits >> 32 == 0 && bits > 1 {
        return Some(low); // IPv4-compatible (deprecated)
    }
    if bits >> 32 == 0x0064_ff9b << 64 {
        return Some(low); // NAT64 well-known prefix 64:ff9b::/96
    }
    if bits >> 112 == 0x2002 {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32)); // 6to4
    }
    None
}

/// Whether `ip` is on a local network: RFC 1918, CGNAT (100.64/10), IPv4 and
/// IPv6 link-local, IPv6 unique-local (and the old site-local). Loopback is
/// not: that is this machine.
pub fn is_lan(ip: IpAddr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_lan_v4(v4);
    }
    match ip {
        IpAddr::V4(v4) => is_lan_v4(v4),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            bits >> 121 == 0xfc00 >> 9 || bits >> 118 == 0xfe80 >> 6 || bits >> 118 == 0xfec0 >> 6
        }
    }
}

fn is_lan_v4(ip: Ipv4Addr) -> bool {
    const LAN: [(u32, u32); 5] = [
        (0x0A00_0000, 8),  // 10.0.0.0/8
        (0x6440_0000, 10), // 100.64.0.0/10 CGNAT (Tailscale, carrier NAT)
        (0xA9FE_0000, 16), // 169.254.0.0/16 link-local
        (0xAC10_0000, 12), // 172.16.0.0/12
        (0xC0A8_0000, 16), // 192.168.0.0/16
    ];
    let bits = u32::from(ip);
    LAN.iter().any(|&(net, len)| bits >> (32 - len) == net >> (32 - len))
}

/// Whether `ip` is this machine whatever its interfaces: loopback or unspecified
/// (connecting to `0.0.0.0` reaches the local host), also inside IPv6 forms.
pub fn is_local_host(ip: IpAddr) -> bool {
    let ip = embedded_v4(ip).map_or(ip, IpAddr::V4);
    ip.is_loopback() || ip.is_unspecified()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_and_reserved_addresses_are_not_public() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.5",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.255.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::10.1.2.3",
            "2002:c0a8:0101::1",
        ] {
            assert!(!is_public(ip(s)), "{s} should not be public");
        }
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
        ] {
            assert!(is_public(ip(s)), "{s} should be public");
        }
    }

    #[test]
    fn lan_public_and_this_host_do_not_overlap() {
        for s in [
            "10.1.2.3",
            "192.168.1.5",
            "172.20.0.1",
            "100.100.1.1",
            "169.254.169.254",
            "fd00::1",
            "fe80::1",
            "::ffff:192.168.0.1",
        ] {
            assert!(is_lan(ip(s)) && !is_public(ip(s)) && !is_local_host(ip(s)), "{s} is on the LAN");
        }
        for s in ["1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(ip(s)) && !is_lan(ip(s)) && !is_local_host(ip(s)), "{s} is public");
        }
        for s in ["127.0.0.1", "127.8.9.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"] {
            assert!(is_local_host(ip(s)) && !is_public(ip(s)) && !is_lan(ip(s)), "{s} is this host");
        }
        for s in ["224.0.0.1", "255.255.255.255", "192.0.2.1", "2001:db8::1", "ff02::1"] {
            assert!(!is_public(ip(s)) && !is_lan(ip(s)) && !is_local_host(ip(s)), "{s} is special");
        }
    }
}
