//! What an address is *for this machine*: this machine itself, the local
//! network, or the public internet.
//!
//! Every guard that decides where bramble may connect asks [`Judge::place`]:
//! `web_fetch`'s and `web_search`'s pinned resolver (only public addresses
//! unless `[web] allow_private`) and the exec sandbox's network proxy
//! (`[exec] network = "internet" | "lan"`). One judgement, so no two guards
//! can disagree about an address.
//!
//! The address class alone is not enough. A service listening on all
//! interfaces is reached through the board's own public IPv4 or global IPv6
//! address as well as through loopback, and a device on the board's own IPv6
//! link has a global address like any server on the internet. So the
//! judgement combines three facts: the class (the tables below), whether the
//! kernel lets a socket bind the address (then it is one of this machine's
//! own), and whether the address is inside a prefix one of this machine's
//! interfaces is on, reached without a router (read from the kernel's
//! routes and addresses in `/proc`: no netlink, which the packaged unit does
//! not allow). The last two say "this machine" and "LAN" whatever the class.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// Whether `ip`'s class is globally routable (not private, loopback,
/// link-local, CGNAT, multicast, reserved or otherwise special). IPv6 forms
/// that embed an IPv4 address are judged by that address. The class only:
/// whether a connection may go there is [`Judge::place`]'s to say.
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
fn is_lan(ip: IpAddr) -> bool {
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
fn is_local_host(ip: IpAddr) -> bool {
    let ip = embedded_v4(ip).map_or(ip, IpAddr::V4);
    ip.is_loopback() || ip.is_unspecified()
}

/// Where a connection to an address leads, for this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// This machine itself: loopback, unspecified, or an address it holds.
    ThisMachine,
    /// The local network: a private range, or a prefix one of this
    /// machine's interfaces is on (no router between), whatever its class.
    Lan,
    /// A globally routable address off this machine's links.
    Public,
    /// Multicast, broadcast, documentation or reserved: nowhere to connect to.
    Special,
}

/// Shortest on-link prefix believed: a route without a gateway that covers
/// more than this is a tunnel to the wider network (`default dev ppp0`,
/// `0.0.0.0/1 dev tun0`), not a link with neighbours on it.
const MIN_LINK_V4: u32 = 8;
const MIN_LINK_V6: u32 = 32;

/// Route flags of `/proc/net/route` and `/proc/net/ipv6_route` (`linux/route.h`).
const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
const RTF_REJECT: u32 = 0x0200;
/// `if_inet6`'s scope of `::1` (`IFA_HOST`).
const SCOPE_HOST: u32 = 0x10;

/// The prefixes this machine reaches without a router: the routes without a
/// gateway of the main IPv4 table and of every IPv6 table, and the prefixes
/// of the IPv6 addresses of its interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Links {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u32)>,
}

/// The kernel's routes could not be read: without them the local network
/// cannot be told from the internet, so nothing is judged.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read this machine's routes ({path}: {source}), so the local network cannot be told from the \
     internet; /proc must be mounted and readable"
)]
pub struct LinksError {
    path: String,
    #[source]
    source: std::io::Error,
}

impl Links {
    /// The current tables of the calling thread's network namespace
    /// (`/proc/thread-self`: a thread may have entered another one). No
    /// IPv6 tables (IPv6 disabled at boot) is no IPv6 links.
    pub fn read() -> Result<Links, LinksError> {
        let base = if std::path::Path::new("/proc/thread-self/net").exists() {
            "/proc/thread-self/net"
        } else {
            "/proc/self/net"
        };
        let read = |name: &str, optional: bool| {
            let path = format!("{base}/{name}");
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(text),
                Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
                Err(source) => Err(LinksError { path, source }),
            }
        };
        Ok(Links::parse(&read("route", false)?, &read("ipv6_route", true)?, &read("if_inet6", true)?))
    }

    /// The tables from the text of `/proc/net/route`, `/proc/net/ipv6_route`
    /// and `/proc/net/if_inet6`; lines that do not parse are skipped.
    pub fn parse(route: &str, ipv6_route: &str, if_inet6: &str) -> Links {
        let mut links = Links::default();
        // Iface Destination Gateway Flags RefCnt Use Metric Mask …; hex of the
        // address in memory (network) order, printed as a native-endian u32.
        for line in route.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(dest), Some(gw), Some(flags), Some(mask)) = (
                f.get(1).and_then(|s| hex_v4(s)),
                f.get(2).and_then(|s| hex_v4(s)),
                f.get(3),
                f.get(7).and_then(|s| hex_v4(s)),
            ) else {
                continue;
            };
            let Ok(flags) = u32::from_str_radix(flags, 16) else { continue };
            let len = mask.leading_ones();
            if on_link(flags, gw == 0) && mask.count_ones() == len {
                links.add_v4(dest, len);
            }
        }
        // dest plen src src_plen next_hop metric refcnt use flags dev
        for line in ipv6_route.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(dest), Some(len), Some(hop), Some(flags)) = (
                f.first().and_then(|s| u128::from_str_radix(s, 16).ok()),
                f.get(1).and_then(|s| u32::from_str_radix(s, 16).ok()),
                f.get(4).and_then(|s| u128::from_str_radix(s, 16).ok()),
                f.get(8).and_then(|s| u32::from_str_radix(s, 16).ok()),
            ) else {
                continue;
            };
            if on_link(flags, hop == 0) {
                links.add_v6(dest, len);
            }
        }
        // address ifindex plen scope flags dev: an address's prefix is on its link
        // even where its route was left out (`noprefixroute`, DHCPv6's /128 aside).
        for line in if_inet6.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(len), Some(scope)) = (
                f.first().and_then(|s| u128::from_str_radix(s, 16).ok()),
                f.get(2).and_then(|s| u32::from_str_radix(s, 16).ok()),
                f.get(3).and_then(|s| u32::from_str_radix(s, 16).ok()),
            ) else {
                continue;
            };
            if scope != SCOPE_HOST {
                links.add_v6(addr, len);
            }
        }
        links
    }

    fn add_v4(&mut self, net: u32, len: u32) {
        if (MIN_LINK_V4..=32).contains(&len) {
            self.v4.push((net, len));
        }
    }

    fn add_v6(&mut self, net: u128, len: u32) {
        if (MIN_LINK_V6..=128).contains(&len) {
            self.v6.push((net, len));
        }
    }

    /// Whether `ip` is inside one of the prefixes.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                self.v4.iter().any(|&(net, len)| bits >> (32 - len) == net >> (32 - len))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                self.v6.iter().any(|&(net, len)| bits >> (128 - len) == net >> (128 - len))
            }
        }
    }
}

/// An IPv4 address as `/proc/net/route` prints it.
fn hex_v4(s: &str) -> Option<u32> {
    u32::from_str_radix(s, 16).ok().map(|v| u32::from_be_bytes(v.to_ne_bytes()))
}

/// A usable route straight onto a link: up, no gateway, not a reject route.
fn on_link(flags: u32, no_next_hop: bool) -> bool {
    flags & RTF_UP != 0 && flags & (RTF_GATEWAY | RTF_REJECT) == 0 && no_next_hop
}

/// The one judgement of an address: its class, this machine's own addresses
/// (asked the kernel by binding) and the prefixes of its links.
#[derive(Debug, Clone)]
pub struct Judge {
    links: Links,
    own: fn(IpAddr) -> bool,
}

impl Judge {
    /// This machine as it is now (the calling thread's network namespace).
    pub fn read() -> Result<Judge, LinksError> {
        Ok(Judge { links: Links::read()?, own: is_own_address })
    }

    /// A judge of given links and own addresses (tests).
    pub fn new(links: Links, own: fn(IpAddr) -> bool) -> Judge {
        Judge { links, own }
    }

    /// Where a connection to `ip` leads. IPv6 forms that embed an IPv4
    /// address are judged by both.
    pub fn place(&self, ip: IpAddr) -> Place {
        let effective = embedded_v4(ip).map_or(ip, IpAddr::V4);
        if is_local_host(ip) {
            return Place::ThisMachine;
        }
        // Before the bind test: a socket can bind a multicast or broadcast address.
        if effective.is_multicast() || effective == IpAddr::V4(Ipv4Addr::BROADCAST) {
            return Place::Special;
        }
        if (self.own)(ip) || (effective != ip && (self.own)(effective)) {
            return Place::ThisMachine;
        }
        if self.links.contains(ip) || self.links.contains(effective) {
            return Place::Lan;
        }
        if is_public(ip) {
            Place::Public
        } else if is_lan(ip) {
            Place::Lan
        } else {
            Place::Special
        }
    }
}

/// Whether `ip` is an address of this machine, asked the kernel's way: a
/// socket can be bound to it only if it is local (an interface's address, or a
/// `local` route), in the calling thread's network namespace. No list to go
/// stale, and no netlink. Where binding to foreign addresses is allowed
/// (`ip_nonlocal_bind`), everything counts as this machine: refused, the safe
/// way round.
pub fn is_own_address(ip: IpAddr) -> bool {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let family = if ip.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let Ok(sock) = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None) else {
        return true; // Cannot tell: treat it as this machine.
    };
    bind(sock.as_raw_fd(), &SockaddrStorage::from(SocketAddr::new(ip, 0))).is_ok()
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

    /// A board on 192.168.1.0/24 and 81.2.69.0/24 (a public LAN) and on
    /// 2001:470:77::/64 by route, 2001:470:99::/64 by address only, with its
    /// default routes through gateways and a few routes that are no link.
    fn board() -> Judge {
        let hex = |a: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(a));
        let (any, lan, public, gw) = (hex([0; 4]), hex([192, 168, 1, 0]), hex([81, 2, 69, 0]), hex([192, 168, 1, 1]));
        let (m0, m1, m24) = (hex([0; 4]), hex([128, 0, 0, 0]), hex([255, 255, 255, 0]));
        let route = format!(
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t{any}\t{gw}\t0003\t0\t0\t0\t{m0}\t0\t0\t0\n\
             eth0\t{lan}\t{any}\t0001\t0\t0\t0\t{m24}\t0\t0\t0\n\
             eth1\t{public}\t{any}\t0001\t0\t0\t0\t{m24}\t0\t0\t0\n\
             tun0\t{any}\t{any}\t0001\t0\t0\t0\t{m1}\t0\t0\t0\n\
             ppp0\t{any}\t{any}\t0001\t0\t0\t0\t{m0}\t0\t0\t0\n\
             *\t{public}\t{any}\t0201\t0\t0\t0\t{m24}\t0\t0\t0\n\
             garbage line\n"
        );
        let zero = "00000000000000000000000000000000";
        let v6 = |net: &str, len: &str, hop: &str, flags: &str, dev: &str| {
            format!("{net} {len} {zero} 00 {hop} 00000100 00000001 00000000 {flags} {dev}\n")
        };
        let ipv6_route = [
            v6("20010470007700000000000000000000", "40", zero, "00000001", "eth0"),
            v6("20010db8000000000000000000000000", "40", zero, "00000001", "eth2"),
            v6(zero, "00", "fe800000000000000000000000000001", "00000003", "eth0"),
            v6("20010470008800000000000000000000", "30", "fe800000000000000000000000000001", "00000003", "eth0"),
            v6(zero, "00", zero, "00000001", "wg0"),
            v6("20000000000000000000000000000000", "03", zero, "00000001", "wg0"),
            v6("20010470007800000000000000000000", "40", zero, "00200201", "lo"),
            "not a route\n".to_string(),
        ]
        .concat();
        let if_inet6 = "20010470009900000000000000000005 02 40 00 80 eth0\n\
                        00000000000000000000000000000001 01 80 10 80 lo\n\
                        200104700aaa00000000000000000005 02 80 00 80 eth0\n";
        let own = |a: IpAddr| ["81.2.69.10", "2001:470:77::10", "192.168.1.10"].iter().any(|s| ip(s) == a);
        Judge::new(Links::parse(&route, &ipv6_route, if_inet6), own)
    }

    #[test]
    fn this_machine_is_its_own_addresses_whatever_their_class() {
        let j = board();
        for s in ["81.2.69.10", "2001:470:77::10", "192.168.1.10", "::ffff:81.2.69.10", "127.0.0.1", "::1", "0.0.0.0"] {
            assert_eq!(j.place(ip(s)), Place::ThisMachine, "{s}");
        }
    }

    #[test]
    fn the_boards_links_are_the_lan_whatever_their_class() {
        let j = board();
        for s in [
            "2001:470:77::20",    // a device on the board's own /64, global address
            "81.2.69.99",         // a public IPv4 LAN
            "2001:470:99::7",     // an address's prefix, no route for it
            "2001:db8::5",        // documentation class, but on a link
            "::ffff:81.2.69.99",  // embedded forms judged by their IPv4 address too
            "64:ff9b::5102:4563", // NAT64 of 81.2.69.99
            "192.168.1.20",       // on the link and private
            "10.9.9.9",           // private, off the links
            "fe80::1",
        ] {
            assert_eq!(j.place(ip(s)), Place::Lan, "{s}");
        }
    }

    #[test]
    fn routes_through_a_gateway_and_tunnels_to_everywhere_are_no_link() {
        let j = board();
        for s in [
            "93.184.216.34",
            "2001:470:88::1",  // routed through a gateway
            "2606:4700::1111", // covered only by ::/0 and 2000::/3 on wg0
            "8.8.8.8",         // covered only by 0.0.0.0/1 on tun0 and default on ppp0
            "2001:470:78::1",  // a reject route
            "2001:470:aaa::6", // a /128 address is no prefix
            "::ffff:1.1.1.1",
        ] {
            assert_eq!(j.place(ip(s)), Place::Public, "{s}");
        }
        for s in ["224.0.0.251", "255.255.255.255", "ff02::1", "2001:db8:1::1", "240.0.0.1"] {
            assert_eq!(j.place(ip(s)), Place::Special, "{s}");
        }
    }

    #[test]
    fn multicast_stays_special_where_everything_binds() {
        // ip_nonlocal_bind: every address binds, so every unicast one is this machine.
        let j = Judge::new(Links::default(), |_| true);
        assert_eq!(j.place(ip("8.8.8.8")), Place::ThisMachine);
        assert_eq!(j.place(ip("224.0.0.251")), Place::Special);
        assert_eq!(j.place(ip("ff02::fb")), Place::Special);
    }

    #[test]
    fn this_machines_tables_and_addresses_are_read_from_the_kernel() {
        let j = Judge::read().unwrap();
        assert_eq!(j.place(ip("127.0.0.1")), Place::ThisMachine);
        assert!(is_own_address(ip("127.0.0.1")) && is_own_address(ip("::ffff:127.0.0.1")));
        // TEST-NET-2 is on no interface.
        assert!(!is_own_address(ip("198.51.100.7")));
        let local = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
            s.connect("192.0.2.1:9")?; // No packet is sent: this only picks the outgoing address.
            s.local_addr()
        });
        if let Ok(local) = local {
            assert!(is_own_address(local.ip()), "{local}");
            assert_eq!(j.place(local.ip()), Place::ThisMachine, "{local}");
        }
    }
}
