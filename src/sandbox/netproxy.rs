//! `[exec] network = "internet" | "lan"`: the command's only way out is a
//! proxy that checks every address before it connects.
//!
//! The command runs in a network namespace of its own, as with `network =
//! "none"`, except that its loopback is up and one listener waits on it. The
//! listener was made *inside* that namespace by the helper and handed over
//! (`SCM_RIGHTS`) to this proxy, a process the helper forked *before* it left
//! the host's namespace: the proxy accepts in the command's namespace and
//! connects in the host's. The kernel is the boundary — the namespace has no
//! route anywhere — and the proxy is the one door, so nothing depends on
//! reading the command.
//!
//! The door speaks HTTP proxy (`CONNECT host:port` for TLS and anything else
//! on TCP, absolute `http://` URLs for plain HTTP); the command gets
//! `http_proxy`, `https_proxy` and `ALL_PROXY` pointing at it, which curl,
//! wget, git, pip, apt, Python, Go and Rust clients follow. Names are resolved
//! here, outside, and every address is judged before the connection is made,
//! by the judgement `web_fetch` uses too ([`crate::util::addr::Judge`]):
//! this machine (loopback, unspecified, any address it can bind: its own) is
//! never reachable; public addresses only with "internet"; the local network
//! (RFC 1918, CGNAT, link-local, IPv6 unique-local, and any prefix one of this
//! machine's interfaces is on, whatever its class) only with "lan"; anything
//! special-purpose (multicast, documentation, reserved) never. The prefixes
//! are read when the proxy starts, before its Landlock rules close `/proc`;
//! its own addresses are asked the kernel at each connection. A refusal is a
//! `403` whose body says why and what setting would allow it, and one line on
//! the command's stderr, so the model reads the reason.
//!
//! Programs that ignore proxy settings (ping, ssh, raw sockets, DNS tools) get
//! "network unreachable": there is no other way out.
//!
//! The proxy is small, blocking code with a thread per connection (at most
//! [`MAX_CONNECTIONS`]). It is outside the jail (it must reach the host's
//! network and resolver), so it gets what can be had there: the command's
//! user when bramble is root, `no_new_privs`, the helper's environment (the
//! command's: no secrets), Landlock rules that let it read only what name
//! resolution reads ([`super::landlock::restrict_proxy`]; bramble's state,
//! config and credentials unreadable) — and it dies with the helper
//! (parent-death signal, and the helper kills it when the command ends).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::prctl;
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{
    recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, getpid, getppid, setgroups, setresgid, setresuid, ForkResult, Gid, Pid, Uid};

use super::options::Options;
pub use super::options::Reach;
use crate::util::addr::{Judge, Place};

/// Connections served at once; more get `503`.
pub const MAX_CONNECTIONS: usize = 64;
/// Bytes of request head read at most.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection to the destination may take, per address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Reach {
    /// Whether a connection to a place is allowed.
    fn judge(self, place: Place) -> Result<(), &'static str> {
        match place {
            Place::ThisMachine => {
                Err("this machine itself (loopback or one of its own addresses), which commands never \
                                       reach unless [exec] network = \"all\"")
            }
            Place::Public if self.internet => Ok(()),
            Place::Public => Err("a public address, and [exec] network = \"lan\" allows the local network only"),
            Place::Lan if self.lan => Ok(()),
            Place::Lan => Err("on the local network (a private range, or a network this machine is on), and [exec] \
                               network = \"internet\" allows public addresses only (network = [\"internet\", \"lan\"] \
                               allows both)"),
            Place::Special => Err("a special-purpose address (multicast, documentation or reserved)"),
        }
    }
}

/// The proxy process, as the helper sees it.
pub struct Proxy {
    pid: Pid,
    /// Where the listener is sent.
    chan: OwnedFd,
}

/// Fork the proxy. Called by the helper while it is still in the host's
/// network namespace, before any limit of the command is set.
pub fn start(reach: Reach, o: &Options) -> Result<Proxy, String> {
    let (ours, theirs) = socketpair().map_err(|e| format!("socketpair for the network proxy: {e}"))?;
    let helper = getpid();
    // SAFETY: the helper is single-threaded (see `super::helper`), so the child may run ordinary code.
    match unsafe { fork() }.map_err(|e| format!("fork for the network proxy: {}", io::Error::from(e)))? {
        ForkResult::Child => {
            drop(ours);
            let code = match serve(reach, o, theirs, helper) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = writeln!(io::stderr(), "bramble network: the proxy stopped: {e}");
                    1
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => Ok(Proxy { pid: child, chan: ours }),
    }
}

impl Proxy {
    /// In the command's new network namespace: bring its loopback up, listen
    /// on it and hand the listener to the proxy. Returns the port.
    pub fn hand_over(&self) -> Result<u16, String> {
        loopback_up().map_err(|e| format!("cannot bring up the command's loopback: {e}"))?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("cannot listen for the network proxy: {e}"))?;
        let port = listener.local_addr().map_err(|e| format!("the network proxy's port: {e}"))?.port();
        send_fd(&self.chan, listener.as_raw_fd()).map_err(|e| format!("cannot hand over the proxy's listener: {e}"))?;
        Ok(port)
    }

    /// End the proxy (the command has ended) and reap it.
    pub fn stop(self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

/// The proxy process: wait for the listener, then serve until killed.
fn serve(reach: Reach, o: &Options, chan: OwnedFd, helper: Pid) -> Result<(), String> {
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    if getppid() != helper {
        return Ok(()); // The helper is gone already.
    }
    // The links now, while /proc is readable: Landlock closes it below.
    let judge = Arc::new(Judge::read().map_err(|e| e.to_string())?);
    if let Some((uid, gid)) = o.run_as {
        let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
        setgroups(&[gid]).map_err(|e| format!("setgroups: {e}"))?;
        setresgid(gid, gid, gid).map_err(|e| format!("cannot switch to group {gid}: {e}"))?;
        setresuid(uid, uid, uid).map_err(|e| format!("cannot switch to user {uid}: {e}"))?;
        // Switching users clears the death signal.
        prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    }
    prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))?;
    // The command's stdout is not ours to hold open; stderr carries refusals to the model.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        for fd in [0, 1] {
            // SAFETY: dup2 onto the standard descriptors replaces them; nothing else refers to them here.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    if o.landlock {
        // Only what name resolution reads: bramble's state, config and credentials out of reach.
        super::landlock::restrict_proxy(o)?;
    }
    let Some(listener) = recv_fd(&chan).map_err(|e| format!("receiving the listener: {e}"))? else {
        return Ok(()); // The helper failed before handing it over.
    };
    drop(chan);
    let listener = TcpListener::from(listener);
    let live = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(mut client) = conn else { continue };
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            live.fetch_sub(1, Ordering::SeqCst);
            let _ = client.write_all(&response(503, "too many connections through bramble's proxy at once\n"));
            continue;
        }
        let (count, judge) = (live.clone(), judge.clone());
        let spawned = std::thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            handle(client, reach, &judge);
            count.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
    Ok(())
}

/// One connection: read the request, judge and connect, then relay bytes both ways.
fn handle(mut client: TcpStream, reach: Reach, judge: &Judge) {
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let (head, rest) = match read_head(&mut client) {
        Ok(v) => v,
        Err(e) => {
            let _ = client.write_all(&response(400, &format!("{e}\n")));
            return;
        }
    };
    let req = match Request::parse(&head) {
        Ok(r) => r,
        Err(e) => {
            let _ = client.write_all(&response(400, &format!("{e}\n")));
            return;
        }
    };
    let mut upstream = match connect(&req.host, req.port, reach, judge) {
        Ok(s) => s,
        Err(Failure::Refused(ip, why)) => {
            let msg = format!("bramble: {}:{} ({ip}) is {why}", req.host, req.port);
            let _ = writeln!(io::stderr(), "bramble network: refused {}:{} ({ip}): {why}", req.host, req.port);
            let _ = client.write_all(&response(403, &format!("{msg}\n")));
            return;
        }
        Err(Failure::Unreachable(e)) => {
            let _ =
                client.write_all(&response(502, &format!("bramble: cannot reach {}:{}: {e}\n", req.host, req.port)));
            return;
        }
    };
    let _ = client.set_read_timeout(None);
    let opened = if req.connect {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
    } else {
        upstream.write_all(&req.forward)
    };
    if opened.and_then(|()| upstream.write_all(&rest)).is_err() {
        return;
    }
    relay(client, upstream);
}

/// Copy both ways until both sides have finished; a side that ends its
/// sending ends ours to the other.
fn relay(client: TcpStream, upstream: TcpStream) {
    let (Ok(mut client_r), Ok(mut upstream_w)) = (client.try_clone(), upstream.try_clone()) else { return };
    let (mut upstream_r, mut client_w) = (upstream, client);
    let back = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
        let _ = io::copy(&mut upstream_r, &mut client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut client_r, &mut upstream_w);
    let _ = upstream_w.shutdown(Shutdown::Write);
    if let Ok(back) = back {
        let _ = back.join();
    }
}

/// Read up to the blank line that ends the request head; returns the head and
/// whatever came after it.
fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find_head_end(&buf) {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("bramble: the request head is longer than {MAX_HEAD} bytes"));
        }
        match client.read(&mut chunk) {
            Ok(0) => return Err("bramble: the connection closed before a request".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("bramble: no request: {e}")),
        }
    }
}

/// The end of the head (just past `\r\n\r\n`, or a bare `\n\n`).
fn find_head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a client asked the proxy for.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    /// `CONNECT`: a tunnel; else a plain HTTP request to forward.
    connect: bool,
    host: String,
    port: u16,
    /// For a plain request: its head as the origin server should get it.
    forward: Vec<u8>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(head).map_err(|_| "bramble: the request head is not text".to_string())?;
        let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
        let first = lines.next().unwrap_or_default();
        let mut parts = first.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("bramble: not an HTTP request line: {:?}", truncate(first)));
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!("bramble: not an HTTP/1 request line: {:?}", truncate(first)));
        }
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_host_port(target, None)?;
            return Ok(Request { connect: true, host, port, forward: Vec::new() });
        }
        let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
        if lower.starts_with("https://") {
            return Err("bramble: https goes through CONNECT (set https_proxy, not only http_proxy)".into());
        }
        if !lower.starts_with("http://") {
            return Err(format!(
                "bramble: this is an HTTP proxy: it takes absolute http:// URLs or CONNECT, not {:?}",
                truncate(target)
            ));
        }
        let after = &target[7..];
        let end = after.find(['/', '?', '#']).unwrap_or(after.len());
        let authority = &after[..end];
        let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
        let (host, port) = split_host_port(authority, Some(80))?;
        let path = match &after[end..] {
            "" => "/".to_string(),
            p if p.starts_with('/') => p.split('#').next().unwrap_or("/").to_string(),
            p => format!("/{}", p.split('#').next().unwrap_or_default()),
        };
        let mut forward = format!("{method} {path} {version}\r\n");
        let mut has_host = false;
        for line in lines.filter(|l| !l.is_empty()) {
            let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
            if matches!(name.as_str(), "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive") {
                continue;
            }
            has_host |= name == "host";
            forward.push_str(line);
            forward.push_str("\r\n");
        }
        if !has_host {
            forward.push_str(&format!("Host: {authority}\r\n"));
        }
        // One request per connection: the next one may be for another host.
        forward.push_str("Connection: close\r\n\r\n");
        Ok(Request { connect: false, host, port, forward: forward.into_bytes() })
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(100).collect()
}

/// `host:port`, `[v6]:port`, or without the port when `default` is given.
fn split_host_port(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("bramble: not a host and port: {:?}", truncate(authority));
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(bad)?;
        v6.parse::<Ipv6Addr>().map_err(|_| bad())?;
        (v6, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match (port, default) {
        (Some(p), _) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        (None, Some(d)) => d,
        (None, None) => return Err(format!("bramble: CONNECT needs host:port, not {:?}", truncate(authority))),
    };
    let name_ok = |h: &str| {
        !h.is_empty()
            && h.len() <= 253
            && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    if !(name_ok(host) || host.parse::<IpAddr>().is_ok()) {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

enum Failure {
    Refused(IpAddr, &'static str),
    Unreachable(String),
}

/// Resolve `host` here (outside the command's namespace), judge every address,
/// and connect to the first allowed one that answers.
fn connect(host: &str, port: u16, reach: Reach, judge: &Judge) -> Result<TcpStream, Failure> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host, port)
            .to_socket_addrs()
            .map_err(|e| Failure::Unreachable(format!("cannot resolve {host}: {e}")))?
            .collect(),
    };
    let mut refused: Option<Failure> = None;
    let mut last: Option<io::Error> = None;
    for addr in addrs {
        match reach.judge(judge.place(addr.ip())) {
            Err(why) => {
                refused.get_or_insert(Failure::Refused(addr.ip(), why));
            }
            Ok(()) => match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            },
        }
    }
    Err(match (last, refused) {
        (Some(e), _) => Failure::Unreachable(e.to_string()),
        (None, Some(r)) => r,
        (None, None) => Failure::Unreachable(format!("{host} has no address")),
    })
}

fn response(code: u16, body: &str) -> Vec<u8> {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Set `IFF_UP` on `lo` in the current network namespace.
fn loopback_up() -> io::Result<()> {
    let sock =
        socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(io::Error::from)?;
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags member of `ifr`, a valid ifreq naming `lo`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the union holds the flags.
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the name and flags of `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::sys::socket::socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
        .map_err(io::Error::from)
}

fn send_fd(chan: &OwnedFd, fd: RawFd) -> io::Result<()> {
    let fds = [fd];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(chan.as_raw_fd(), &[IoSlice::new(&[0])], &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)?;
    Ok(())
}

/// The descriptor sent with [`send_fd`]; `None` when the other end closed first.
fn recv_fd(chan: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = loop {
        match recvmsg::<()>(chan.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    if msg.bytes == 0 {
        return Ok(None);
    }
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this descriptor in our table; nothing else owns it.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "no descriptor came"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn reach_round_trips_and_rejects_unknown_parts() {
        for r in [
            Reach { internet: true, lan: false },
            Reach { internet: false, lan: true },
            Reach { internet: true, lan: true },
        ] {
            assert_eq!(Reach::parse(r.as_arg()), Some(r));
        }
        assert_eq!(Reach::parse("all"), None);
        assert_eq!(Reach::parse(""), None);
    }

    #[test]
    fn judging_addresses() {
        use crate::util::addr::Links;
        // The board is 192.168.1.10 and 2001:470::10 on 2001:470::/64.
        let links = Links::parse("", "20010470000000000000000000000000 40 0 00 0 0 0 0 00000001 eth0\n", "");
        let own = |a: IpAddr| [ip("192.168.1.10"), ip("2001:470::10")].contains(&a);
        let j = Judge::new(links, own);
        let internet = Reach { internet: true, lan: false };
        let lan = Reach { internet: false, lan: true };
        let both = Reach { internet: true, lan: true };
        assert!(internet.judge(j.place(ip("93.184.216.34"))).is_ok());
        assert!(internet.judge(j.place(ip("192.168.1.20"))).unwrap_err().contains("local network"));
        assert!(internet.judge(j.place(ip("169.254.169.254"))).is_err(), "cloud metadata is link-local");
        assert!(internet.judge(j.place(ip("2001:470::20"))).unwrap_err().contains("local network"), "on-link");
        assert!(lan.judge(j.place(ip("2001:470::20"))).is_ok(), "on-link is the LAN");
        assert!(lan.judge(j.place(ip("192.168.1.20"))).is_ok());
        assert!(lan.judge(j.place(ip("8.8.8.8"))).unwrap_err().contains("public"));
        for this_host in ["127.0.0.1", "::1", "0.0.0.0", "::ffff:127.0.0.1", "192.168.1.10", "2001:470::10"] {
            let why = both.judge(j.place(ip(this_host))).unwrap_err();
            assert!(why.contains("this machine"), "{this_host}: {why}");
        }
        assert!(both.judge(j.place(ip("224.0.0.251"))).unwrap_err().contains("special"));
        assert!(both.judge(j.place(ip("::ffff:10.0.0.1"))).is_ok(), "a mapped LAN address is LAN");
    }

    #[test]
    fn connect_requests_name_host_and_port() {
        let r = Request::parse(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap();
        assert_eq!((r.connect, r.host.as_str(), r.port), (true, "example.com", 443));
        let r = Request::parse(b"CONNECT [2606:4700::1111]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("2606:4700::1111", 443));
        for bad in [
            &b"CONNECT example.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT example.com:0 HTTP/1.1\r\n\r\n",
            b"CONNECT exa mple.com:443 HTTP/1.1\r\n\r\n",
            b"CONNECT [::1:443 HTTP/1.1\r\n\r\n",
            b"CONNECT a:b:c HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET https://example.com/ HTTP/1.1\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert!(Request::parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn plain_requests_are_forwarded_in_origin_form_one_per_connection() {
        let head = b"GET http://user:pw@example.com:8080/a/b?q=1#frag HTTP/1.1\r\nHost: example.com:8080\r\n\
                     Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n";
        let r = Request::parse(head).unwrap();
        assert_eq!((r.connect, r.host.as_str(), r.port), (false, "example.com", 8080));
        assert_eq!(
            String::from_utf8(r.forward).unwrap(),
            "GET /a/b?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let r = Request::parse(b"GET http://example.com HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(r.port, 80);
        assert_eq!(
            String::from_utf8(r.forward).unwrap(),
            "GET / HTTP/1.0\r\nHost: example.com\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn the_head_ends_at_the_blank_line_and_keeps_what_follows() {
        assert_eq!(find_head_end(b"CONNECT a:1 HTTP/1.1\r\n\r\nTLS"), Some(24));
        assert_eq!(find_head_end(b"GET http://a/ HTTP/1.0\n\nbody"), Some(24));
        assert_eq!(find_head_end(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n"), None);
    }

    #[test]
    fn a_descriptor_crosses_the_socket_pair() {
        let (a, b) = socketpair().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        send_fd(&a, listener.as_raw_fd()).unwrap();
        let got = TcpListener::from(recv_fd(&b).unwrap().unwrap());
        assert_eq!(got.local_addr().unwrap(), listener.local_addr().unwrap());
        drop(a);
        assert!(recv_fd(&b).unwrap().is_none(), "a closed end is no descriptor");
    }
}
