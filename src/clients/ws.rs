//! A minimal WebSocket client (RFC 6455), the one every WebSocket peer of
//! bramble uses: Home Assistant's `/api/websocket` and the chat gateways
//! that push events over a socket. Nothing a crate would add on top
//! (tungstenite and friends bring their own TLS and HTTP stacks; this is
//! ~350 lines on tokio). Compression (permessage-deflate) is never offered,
//! so a server cannot send compressed frames (reserved bits are refused).
//!
//! - **Handshake** (§4.1): `GET` with `Upgrade: websocket`, a random
//!   `Sec-WebSocket-Key`, version 13; the answer must be `101` with
//!   `Sec-WebSocket-Accept` = base64(SHA-1(key + GUID)), or it is not a
//!   WebSocket server that understood us.
//! - **Frames** (§5.2): 7-, 16- and 64-bit lengths; every frame we send is
//!   masked with a fresh key (§5.3, a client must); a masked frame from the
//!   server is unmasked, though servers do not send them.
//! - **Messages** (§5.4): fragments (`FIN` = 0, then continuation frames) are
//!   joined; control frames (ping, pong, close) may arrive between them and
//!   are handed out at once.
//! - **A cap** ([`MAX_MESSAGE`]): a frame header announcing more, or
//!   fragments adding up to more, end the connection before the bytes are
//!   read — HA sends big `result`s, a broken peer could send anything.
//! - **Close** (§5.5.1): a close frame is answered with one, then the
//!   connection ends; the caller learns the code and reason.
//!
//! `ws://` is a plain `TcpStream`; `wss://` goes through tokio-rustls (already
//! in the tree for reqwest) with the crate's shared TLS config
//! ([`crate::util::tls::client_config`]: the platform verifier).
//!
//! [`Socket::recv`] is cancel-safe (bytes read stay in its buffer, a message
//! being joined stays in its state), so it can sit in a `select!`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest message (all fragments together) accepted by default; a
/// peer that needs more says so with [`Socket::connect_with_cap`].
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// The largest handshake answer accepted.
const MAX_HEAD: usize = 16 * 1024;
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Why the connection failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the WebSocket handshake failed: {0}")]
    Handshake(String),
    #[error("WebSocket protocol error: {0}")]
    Protocol(String),
    #[error("a WebSocket message of {0} bytes or more is over the limit")]
    TooLarge(u64),
    #[error("the server closed the connection{}", match .code { Some(c) => format!(" (code {c}{}{})", if .reason.is_empty() { "" } else { ": " }, .reason), None => String::new() })]
    Closed { code: Option<u16>, reason: String },
}

/// What `recv` hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(String),
    Binary(Vec<u8>),
    /// The caller answers with [`Socket::pong`] (outside any `select!`).
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

/// Frame opcodes (§5.2).
mod op {
    pub const CONTINUATION: u8 = 0x0;
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// One frame as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

/// A client frame: always masked with `mask`.
pub fn encode(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(if fin { 0x80 | opcode } else { opcode });
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// The first frame in `buf`, and how many bytes it took; `Ok(None)` while
/// it is incomplete. A length over `cap` is an error as soon as the header
/// is in, before its payload is read.
pub fn decode(buf: &[u8], cap: usize) -> Result<Option<(Frame, usize)>, WsError> {
    let [b0, b1, ..] = *buf else { return Ok(None) };
    if b0 & 0x70 != 0 {
        return Err(WsError::Protocol("reserved bits set (no extension was negotiated)".into()));
    }
    let (fin, opcode, masked) = (b0 & 0x80 != 0, b0 & 0x0F, b1 & 0x80 != 0);
    let (len, mut at) = match b1 & 0x7F {
        126 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => (u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]), 10),
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    if len > cap as u64 {
        return Err(WsError::TooLarge(len));
    }
    if opcode >= op::CLOSE && (!fin || len > 125) {
        return Err(WsError::Protocol("a control frame must be whole and at most 125 bytes".into()));
    }
    let mask = if masked {
        let Some(m) = buf.get(at..at + 4) else { return Ok(None) };
        at += 4;
        Some([m[0], m[1], m[2], m[3]])
    } else {
        None
    };
    let len = len as usize;
    let Some(body) = buf.get(at..at + len) else { return Ok(None) };
    let payload = match mask {
        Some(m) => body.iter().enumerate().map(|(i, b)| b ^ m[i % 4]).collect(),
        None => body.to_vec(),
    };
    Ok(Some((Frame { fin, opcode, payload }, at + len)))
}

/// Joins fragments into messages; control frames pass through.
#[derive(Debug)]
pub struct Assembler {
    partial: Option<(u8, Vec<u8>)>,
    cap: usize,
}

impl Default for Assembler {
    fn default() -> Self {
        Assembler::with_cap(MAX_MESSAGE)
    }
}

/// What a frame amounted to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A fragment was kept; nothing to hand out yet.
    More,
    Message(Message),
    Close {
        code: Option<u16>,
        reason: String,
    },
}

impl Assembler {
    /// Messages of up to `cap` bytes, all fragments together.
    pub fn with_cap(cap: usize) -> Assembler {
        Assembler { partial: None, cap }
    }

    pub fn push(&mut self, frame: Frame) -> Result<Step, WsError> {
        match frame.opcode {
            op::PING => Ok(Step::Message(Message::Ping(frame.payload))),
            op::PONG => Ok(Step::Message(Message::Pong(frame.payload))),
            op::CLOSE => {
                let code = frame.payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]));
                let reason = String::from_utf8_lossy(frame.payload.get(2..).unwrap_or_default()).into_owned();
                Ok(Step::Close { code, reason })
            }
            op::TEXT | op::BINARY if self.partial.is_some() => {
                Err(WsError::Protocol("a new message began inside a fragmented one".into()))
            }
            op::TEXT | op::BINARY if !frame.fin => {
                self.partial = Some((frame.opcode, frame.payload));
                Ok(Step::More)
            }
            op::TEXT | op::BINARY => finish(frame.opcode, frame.payload).map(Step::Message),
            op::CONTINUATION => {
                let Some((opcode, mut data)) = self.partial.take() else {
                    return Err(WsError::Protocol("a continuation frame without a message to continue".into()));
                };
                if data.len() + frame.payload.len() > self.cap {
                    return Err(WsError::TooLarge((data.len() + frame.payload.len()) as u64));
                }
                data.extend_from_slice(&frame.payload);
                if frame.fin {
                    finish(opcode, data).map(Step::Message)
                } else {
                    self.partial = Some((opcode, data));
                    Ok(Step::More)
                }
            }
            other => Err(WsError::Protocol(format!("unknown opcode {other:#x}"))),
        }
    }
}

fn finish(opcode: u8, data: Vec<u8>) -> Result<Message, WsError> {
    match opcode {
        op::TEXT => String::from_utf8(data)
            .map(Message::Text)
            .map_err(|_| WsError::Protocol("a text message that is not UTF-8".into())),
        _ => Ok(Message::Binary(data)),
    }
}

/// The byte stream under a socket: TCP, or TLS over TCP.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// An open WebSocket connection.
pub struct Socket {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    assembler: Assembler,
    cap: usize,
    closing: bool,
}

/// Where to connect, from a `ws://` or `wss://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The request target with its query, `/api/websocket` or `/?v=10`.
    pub path: String,
}

impl Endpoint {
    /// A whole `ws://` or `wss://` URL, as a gateway hands it out; the
    /// query stays part of the request target. `http(s)://` is accepted
    /// for the same host (some APIs hand out that form).
    pub fn parse(address: &str) -> Result<Endpoint, String> {
        let url = reqwest::Url::parse(address).map_err(|e| format!("`{address}` is not a URL: {e}"))?;
        let mut e = Endpoint::under(address, "")?;
        e.path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        Ok(e)
    }

    /// The WebSocket endpoint under an HTTP base URL: `http://h:8123` →
    /// `ws://h:8123/<path>`, `https://…` → `wss://…`.
    pub fn under(base: &str, path: &str) -> Result<Endpoint, String> {
        let url = reqwest::Url::parse(base).map_err(|e| format!("`{base}` is not a URL: {e}"))?;
        let tls = match url.scheme() {
            "http" | "ws" => false,
            "https" | "wss" => true,
            other => return Err(format!("`{base}`: {other}:// cannot carry a WebSocket")),
        };
        let host = url.host_str().ok_or_else(|| format!("`{base}` has no host"))?.to_string();
        let port = url.port().unwrap_or(if tls { 443 } else { 80 });
        let path = format!("{}/{}", url.path().trim_end_matches('/'), path.trim_start_matches('/'));
        Ok(Endpoint { tls, host, port, path })
    }

    /// `ws://host:port/path`, for logs.
    pub fn describe(&self) -> String {
        format!("{}://{}:{}{}", if self.tls { "wss" } else { "ws" }, self.host, self.port, self.path)
    }
}

impl Socket {
    /// Connect and do the opening handshake, within `limit`.
    pub async fn connect(endpoint: &Endpoint, limit: Duration) -> Result<Socket, WsError> {
        Socket::connect_with_cap(endpoint, limit, MAX_MESSAGE).await
    }

    /// As [`Socket::connect`], accepting messages of up to `cap` bytes.
    pub async fn connect_with_cap(endpoint: &Endpoint, limit: Duration, cap: usize) -> Result<Socket, WsError> {
        tokio::time::timeout(limit, Socket::open(endpoint, cap))
            .await
            .unwrap_or_else(|_| Err(WsError::Handshake(format!("no answer within {} s", limit.as_secs()))))
    }

    async fn open(e: &Endpoint, cap: usize) -> Result<Socket, WsError> {
        let tcp = TcpStream::connect((e.host.as_str(), e.port)).await?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Stream> = if e.tls {
            crate::install_crypto();
            let mut config = crate::util::tls::client_config();
            config.alpn_protocols.clear(); // HTTP/1.1 upgrade, no ALPN needed
            let name = rustls::pki_types::ServerName::try_from(e.host.clone())
                .map_err(|_| WsError::Handshake(format!("`{}` is not a valid TLS server name", e.host)))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let mut socket = Socket { stream, buf: Vec::new(), assembler: Assembler::with_cap(cap), cap, closing: false };
        socket.handshake(e).await?;
        Ok(socket)
    }

    async fn handshake(&mut self, e: &Endpoint) -> Result<(), WsError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64.encode(random_bytes::<16>());
        let host = match (e.tls, e.port) {
            (false, 80) | (true, 443) => e.host.clone(),
            _ => format!("{}:{}", e.host, e.port),
        };
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nUser-Agent: bramble/{}\r\n\r\n",
            e.path,
            env!("CARGO_PKG_VERSION")
        );
        self.stream.write_all(request.as_bytes()).await?;
        self.stream.flush().await?;
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(WsError::Handshake("the answer's headers are too large".into()));
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(WsError::Handshake("the server closed the connection".into()));
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end);
        let status = head.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) != Some("101") {
            return Err(WsError::Handshake(format!("expected 101 Switching Protocols, got `{}`", status.trim())));
        }
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let expected = b64.encode(crate::util::sha1::sha1(format!("{key}{GUID}").as_bytes()));
        if header("sec-websocket-accept").as_deref() != Some(expected.as_str()) {
            return Err(WsError::Handshake("the server's Sec-WebSocket-Accept does not match our key".into()));
        }
        Ok(())
    }

    /// The next message. Cancel-safe. A close from the server is answered
    /// and returned as [`WsError::Closed`]; EOF without one is an I/O error.
    pub async fn recv(&mut self) -> Result<Message, WsError> {
        loop {
            while let Some((frame, used)) = decode(&self.buf, self.cap)? {
                self.buf.drain(..used);
                if self.buf.is_empty() && self.buf.capacity() > 64 * 1024 {
                    // A big message is over: do not keep its megabyte for an idle connection.
                    self.buf = Vec::new();
                }
                match self.assembler.push(frame)? {
                    Step::More => {}
                    Step::Message(m) => return Ok(m),
                    Step::Close { code, reason } => {
                        if !self.closing {
                            self.closing = true;
                            let echo = code.map(|c| c.to_be_bytes().to_vec()).unwrap_or_default();
                            let _ = self.write_frame(op::CLOSE, &echo).await;
                        }
                        return Err(WsError::Closed { code, reason });
                    }
                }
            }
            // Room for the frame being read, never beyond the cap (plus its header).
            self.buf.reserve(8 * 1024);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(WsError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the connection was closed without a close frame",
                )));
            }
        }
    }

    pub async fn send_text(&mut self, text: &str) -> Result<(), WsError> {
        self.write_frame(op::TEXT, text.as_bytes()).await
    }

    pub async fn send_binary(&mut self, data: &[u8]) -> Result<(), WsError> {
        self.write_frame(op::BINARY, data).await
    }

    pub async fn pong(&mut self, payload: &[u8]) -> Result<(), WsError> {
        self.write_frame(op::PONG, payload).await
    }

    /// Start the closing handshake (1000: normal) and wait briefly for its answer.
    pub async fn close(self) {
        self.close_with(1000).await
    }

    /// Close with `code` (§7.4): a gateway that keeps a session for a
    /// resume wants anything but 1000/1001 (Discord's 4000 or 1012, say).
    pub async fn close_with(mut self, code: u16) {
        if self.write_frame(op::CLOSE, &code.to_be_bytes()).await.is_err() {
            return;
        }
        self.closing = true;
        let _ = tokio::time::timeout(Duration::from_secs(2), async { while self.recv().await.is_ok() {} }).await;
    }

    async fn write_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<(), WsError> {
        let frame = encode(true, opcode, payload, random_bytes::<4>());
        self.stream.write_all(&frame).await?;
        self.stream.flush().await?;
        Ok(())
    }
}

/// Unpredictable bytes for masking keys and the handshake key: SipHash
/// under std's randomly keyed `RandomState`, over a counter and the time.
fn random_bytes<const N: usize>() -> [u8; N] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(crate::util::unique::next());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server frame (unmasked), as RFC 6455 §5.7's examples.
    fn server(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = encode(fin, opcode, payload, [0; 4]);
        // Drop the mask bit and key: the payload XOR 0 is itself.
        let at = match payload.len() {
            n if n < 126 => 2,
            n if n <= 0xFFFF => 4,
            _ => 10,
        };
        f[1] &= 0x7F;
        f.drain(at..at + 4);
        f
    }

    #[test]
    fn rfc_6455_examples_decode() {
        // §5.7: a single-frame unmasked text message "Hello".
        let (f, n) = decode(&[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f], 100).unwrap().unwrap();
        assert_eq!((f.fin, f.opcode, f.payload.as_slice(), n), (true, 1, &b"Hello"[..], 7));
        // A single-frame masked text message "Hello".
        let masked = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
        assert_eq!(decode(&masked, 100).unwrap().unwrap().0.payload, b"Hello");
        assert_eq!(encode(true, 1, b"Hello", [0x37, 0xfa, 0x21, 0x3d]), masked);
        // Incomplete input waits for more.
        for cut in 0..masked.len() {
            assert!(decode(&masked[..cut], 100).unwrap().is_none(), "{cut}");
        }
    }

    #[test]
    fn lengths_of_16_and_64_bits() {
        for len in [125usize, 126, 65_535, 65_536, 300_000] {
            let payload = vec![b'a'; len];
            let bytes = encode(true, op::BINARY, &payload, [1, 2, 3, 4]);
            let (f, used) = decode(&bytes, MAX_MESSAGE).unwrap().unwrap();
            assert_eq!((f.payload.len(), used), (len, bytes.len()), "{len}");
            assert_eq!(
                bytes[1] & 0x7F,
                if len < 126 {
                    len as u8
                } else if len <= 0xFFFF {
                    126
                } else {
                    127
                }
            );
            assert_eq!(f.payload, payload);
            assert_eq!(decode(&server(true, op::BINARY, &payload), MAX_MESSAGE).unwrap().unwrap().0.payload, payload);
        }
    }

    #[test]
    fn the_cap_is_checked_from_the_header() {
        // A 64-bit length of 2 GiB: refused with only the header in.
        let mut head = vec![0x82, 127];
        head.extend_from_slice(&(2u64 << 30).to_be_bytes());
        assert!(matches!(decode(&head, MAX_MESSAGE), Err(WsError::TooLarge(n)) if n == 2 << 30));
        // Fragments adding up to more than the cap.
        let mut a = Assembler::default();
        let half = vec![b'x'; MAX_MESSAGE / 2 + 1];
        assert_eq!(a.push(Frame { fin: false, opcode: op::TEXT, payload: half.clone() }).unwrap(), Step::More);
        assert!(matches!(
            a.push(Frame { fin: true, opcode: op::CONTINUATION, payload: half.clone() }),
            Err(WsError::TooLarge(_))
        ));
        // A larger cap, asked for, lets the same message through.
        let mut a = Assembler::with_cap(MAX_MESSAGE * 2);
        a.push(Frame { fin: false, opcode: op::TEXT, payload: half.clone() }).unwrap();
        assert!(matches!(a.push(Frame { fin: true, opcode: op::CONTINUATION, payload: half }), Ok(Step::Message(_))));
    }

    #[test]
    fn fragments_join_around_control_frames() {
        let mut a = Assembler::default();
        let frames = [
            Frame { fin: false, opcode: op::TEXT, payload: b"Hel".to_vec() },
            Frame { fin: true, opcode: op::PING, payload: b"hb".to_vec() },
            Frame { fin: false, opcode: op::CONTINUATION, payload: b"lo, ".to_vec() },
            Frame { fin: true, opcode: op::CONTINUATION, payload: "wörld".as_bytes().to_vec() },
        ];
        let steps: Vec<Step> = frames.into_iter().map(|f| a.push(f).unwrap()).collect();
        assert_eq!(steps[0], Step::More);
        assert_eq!(steps[1], Step::Message(Message::Ping(b"hb".to_vec())));
        assert_eq!(steps[2], Step::More);
        assert_eq!(steps[3], Step::Message(Message::Text("Hello, wörld".into())));
        // Protocol errors.
        assert!(a.push(Frame { fin: true, opcode: op::CONTINUATION, payload: vec![] }).is_err());
        a.push(Frame { fin: false, opcode: op::TEXT, payload: vec![] }).unwrap();
        assert!(a.push(Frame { fin: true, opcode: op::TEXT, payload: vec![] }).is_err());
        let close = a.push(Frame { fin: true, opcode: op::CLOSE, payload: b"\x03\xe8bye".to_vec() }).unwrap();
        assert_eq!(close, Step::Close { code: Some(1000), reason: "bye".into() });
        assert!(decode(&[0x09, 0x00], 100).is_err(), "a fragmented control frame");
        assert!(decode(&[0xC1, 0x00], 100).is_err(), "reserved bits");
    }

    #[test]
    fn masks_differ_and_endpoints_follow_the_base_url() {
        assert_ne!(random_bytes::<4>(), random_bytes::<4>());
        let e = Endpoint::under("http://homeassistant.local:8123", "/api/websocket").unwrap();
        assert_eq!(e.describe(), "ws://homeassistant.local:8123/api/websocket");
        let e = Endpoint::under("https://ha.example.org/base/", "api/websocket").unwrap();
        assert_eq!((e.tls, e.port, e.path.as_str()), (true, 443, "/base/api/websocket"));
        // A whole gateway URL keeps its query.
        let e = Endpoint::parse("wss://gateway.example.com/?v=10&encoding=json").unwrap();
        assert_eq!((e.tls, e.port, e.path.as_str()), (true, 443, "/?v=10&encoding=json"));
        let e = Endpoint::parse("ws://127.0.0.1:9000/ws?device_id=7").unwrap();
        assert_eq!(e.describe(), "ws://127.0.0.1:9000/ws?device_id=7");
        assert!(Endpoint::parse("ftp://x/").is_err());
        assert!(Endpoint::parse("not a url").is_err());
    }
}
