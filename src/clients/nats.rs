//! A small NATS client for exactly what "once across the fleet" needs: one
//! short connection per claim, request-reply through an inbox, and JetStream's
//! key-value `create` (a put-if-absent) on one bucket.
//!
//! Why our own and not the official `async-nats`: that crate always pulls
//! `regex` (not otherwise in bramble's tree), `rand` 0.10, `pin-project`,
//! `serde_repr` and `portable-atomic`, plus `time`, `serde_nanos` and
//! `tryhard` for JetStream, to keep a connection task with reconnects,
//! subscriptions and flow control we do not use. A claim is a handful of
//! lines of the text protocol; this file is that handful.
//!
//! Written from the published wire formats: docs.nats.io "Client Protocol"
//! (INFO, CONNECT, PING/PONG, PUB, HPUB, SUB, MSG, HMSG, +OK/-ERR), the
//! headers format `NATS/1.0[ <status>]` of ADR-4, JetStream's API subjects
//! and PubAck / error JSON (docs.nats.io "JetStream wire API"), and ADR-8
//! (JetStream-based key-value stores) for the bucket's stream and `create`.
//!
//! Plain `nats://` only (a home LAN's server, its own account per board);
//! a server that requires TLS is refused with the reason.

use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The longest protocol line read (INFO is the long one, ~1 KB).
const MAX_LINE: usize = 16 * 1024;
/// The largest reply accepted (a PubAck is ~60 bytes, a stream's info ~2 KB).
pub const MAX_REPLY: usize = 64 * 1024;
/// The JetStream error code for "stream not found".
const STREAM_NOT_FOUND: u64 = 10059;
/// The JetStream error code for "wrong last sequence": the key exists.
const WRONG_LAST_SEQUENCE: u64 = 10071;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Settings {
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<crate::config::Secret>,
    /// For the connection and for each request.
    pub timeout: Duration,
}

/// Why a NATS exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("`{0}` is not a NATS URL: expected nats://host[:port]")]
    Url(String),
    #[error("cannot connect to NATS at {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("NATS: no answer within {0} s ({1})")]
    Timeout(u64, &'static str),
    #[error("NATS: the connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("NATS: the server closed the connection")]
    Closed,
    #[error("NATS refused: {0}")]
    Server(String),
    #[error(
        "NATS at {0} requires TLS, which bramble's NATS client does not speak: use a plain nats:// listener on the LAN"
    )]
    Tls(String),
    #[error("NATS said something that is not the protocol: {0}")]
    Protocol(String),
    #[error("NATS: an answer of {0} bytes is over the {MAX_REPLY}-byte limit")]
    TooLarge(usize),
    #[error("NATS: no JetStream answers on {0}: start nats-server with JetStream (`-js`)")]
    NoResponders(String),
    #[error("NATS JetStream refused ({code}/{err_code}): {description}")]
    JetStream { code: u64, err_code: u64, description: String },
}

impl Settings {
    /// `nats://host[:port]` (port 4222 when left out).
    pub fn from_url(url: &str, timeout: Duration) -> Result<Settings, NatsError> {
        let bad = || NatsError::Url(url.to_string());
        let rest = url.trim().strip_prefix("nats://").ok_or_else(bad)?.trim_end_matches('/');
        if rest.contains(['@', '/', '?', '#']) || rest.is_empty() {
            return Err(bad());
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, p.parse().map_err(|_| bad())?),
            _ => (rest, 4222),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Settings { host: host.to_string(), port, user: None, password: None, timeout })
    }

    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A reply: its status (from `NATS/1.0 503`, for instance) and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: Option<u16>,
    pub payload: Vec<u8>,
}

/// What a server line is.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Info(String),
    Msg { subject: String, headers: usize, total: usize },
    Ping,
    Pong,
    Ok,
    Err(String),
}

/// One server line, parsed (without its CRLF).
fn parse_line(line: &str) -> Result<Line, NatsError> {
    let bad = || NatsError::Protocol(clip(line));
    let mut words = line.split_ascii_whitespace();
    let op = words.next().ok_or_else(bad)?.to_ascii_uppercase();
    let size = |w: Option<&str>| -> Result<usize, NatsError> { w.and_then(|w| w.parse().ok()).ok_or_else(bad) };
    Ok(match op.as_str() {
        "INFO" => Line::Info(line[4..].trim().to_string()),
        "PING" => Line::Ping,
        "PONG" => Line::Pong,
        "+OK" => Line::Ok,
        "-ERR" => Line::Err(line[4..].trim().trim_matches('\'').to_string()),
        "MSG" | "HMSG" => {
            let parts: Vec<&str> = words.collect();
            let headers = op == "HMSG";
            // MSG <subject> <sid> [reply-to] <#bytes>; HMSG … [reply-to] <#header bytes> <#total bytes>
            let (min, max) = if headers { (4, 5) } else { (3, 4) };
            if parts.len() < min || parts.len() > max {
                return Err(bad());
            }
            let total = size(parts.last().copied())?;
            let head = if headers { size(parts.get(parts.len() - 2).copied())? } else { 0 };
            if head > total {
                return Err(bad());
            }
            Line::Msg { subject: parts[0].to_string(), headers: head, total }
        }
        _ => return Err(bad()),
    })
}

/// The status in a header block's first line (`NATS/1.0 503 No Responders`).
fn header_status(block: &[u8]) -> Result<Option<u16>, NatsError> {
    let first = block.split(|&b| b == b'\n').next().unwrap_or_default();
    let first = String::from_utf8_lossy(first);
    let rest =
        first.trim().strip_prefix("NATS/1.0").ok_or_else(|| NatsError::Protocol(format!("headers `{first}`")))?;
    Ok(rest.split_ascii_whitespace().next().and_then(|code| code.parse().ok()))
}

/// The server's INFO, as far as it matters here.
#[derive(Debug, Deserialize)]
struct Info {
    #[serde(default)]
    tls_required: bool,
    #[serde(default)]
    headers: bool,
}

/// One connection: handshake done, its inbox subscribed.
pub struct Conn {
    io: BufReader<TcpStream>,
    inbox: String,
    next: u64,
    timeout: Duration,
}

impl Conn {
    /// Connect, say CONNECT (with the account, if any), and wait for the
    /// server's PONG: a refused login is an error here, not later.
    pub async fn connect(s: &Settings) -> Result<Conn, NatsError> {
        let secs = s.timeout.as_secs().max(1);
        let tcp = tokio::time::timeout(s.timeout, TcpStream::connect(s.address()))
            .await
            .map_err(|_| NatsError::Timeout(secs, "connecting"))?
            .map_err(|e| NatsError::Connect(s.address(), e))?;
        let mut conn =
            Conn { io: BufReader::new(tcp), inbox: format!("_INBOX.{}", random_token()), next: 0, timeout: s.timeout };
        tokio::time::timeout(s.timeout, conn.handshake(s))
            .await
            .map_err(|_| NatsError::Timeout(secs, "the handshake"))??;
        Ok(conn)
    }

    async fn handshake(&mut self, s: &Settings) -> Result<(), NatsError> {
        let info = match self.read_line().await? {
            Line::Info(json) => serde_json::from_str::<Info>(&json)
                .map_err(|e| NatsError::Protocol(format!("INFO that is not JSON: {e}")))?,
            other => return Err(NatsError::Protocol(format!("{other:?} before INFO"))),
        };
        if info.tls_required {
            return Err(NatsError::Tls(s.address()));
        }
        if !info.headers {
            return Err(NatsError::Server(
                "the server does not support headers (needs nats-server 2.2 or later)".into(),
            ));
        }
        let mut connect = serde_json::json!({
            "verbose": false, "pedantic": false, "lang": "rust-bramble", "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1, "headers": true, "no_responders": true,
        });
        if let Some(user) = &s.user {
            connect["user"] = user.clone().into();
        }
        if let Some(pass) = &s.password {
            connect["pass"] = pass.expose().into();
        }
        let text = format!("CONNECT {connect}\r\nPING\r\nSUB {}.* 1\r\n", self.inbox);
        self.io.get_mut().write_all(text.as_bytes()).await?;
        loop {
            match self.read_line().await? {
                Line::Pong => return Ok(()),
                Line::Err(why) => return Err(NatsError::Server(why)),
                Line::Ping => self.io.get_mut().write_all(b"PONG\r\n").await?,
                _ => {}
            }
        }
    }

    /// Publish `payload` (with `headers`, if any) to `subject` and wait for
    /// the one reply on this connection's inbox.
    pub async fn request(
        &mut self,
        subject: &str,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> Result<Reply, NatsError> {
        let secs = self.timeout.as_secs().max(1);
        tokio::time::timeout(self.timeout, self.exchange(subject, headers, payload))
            .await
            .map_err(|_| NatsError::Timeout(secs, "waiting for a reply"))?
    }

    async fn exchange(&mut self, subject: &str, headers: &[(&str, &str)], payload: &[u8]) -> Result<Reply, NatsError> {
        self.next += 1;
        let reply_to = format!("{}.{}", self.inbox, self.next);
        let mut out = Vec::with_capacity(payload.len() + 128);
        if headers.is_empty() {
            out.extend_from_slice(format!("PUB {subject} {reply_to} {}\r\n", payload.len()).as_bytes());
        } else {
            let mut block = String::from("NATS/1.0\r\n");
            for (k, v) in headers {
                block.push_str(&format!("{k}: {v}\r\n"));
            }
            block.push_str("\r\n");
            let total = block.len() + payload.len();
            out.extend_from_slice(format!("HPUB {subject} {reply_to} {} {total}\r\n{block}", block.len()).as_bytes());
        }
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.io.get_mut().write_all(&out).await?;
        loop {
            match self.read_line().await? {
                Line::Msg { subject: s, headers, total } => {
                    if total > MAX_REPLY {
                        return Err(NatsError::TooLarge(total));
                    }
                    let mut body = vec![0; total + 2];
                    self.io.read_exact(&mut body).await.map_err(eof)?;
                    if !body.ends_with(b"\r\n") {
                        return Err(NatsError::Protocol("a message not ended by CRLF".into()));
                    }
                    body.truncate(total);
                    if s != reply_to {
                        continue; // a late reply to an earlier request
                    }
                    let status = if headers > 0 { header_status(&body[..headers])? } else { None };
                    return Ok(Reply { status, payload: body.split_off(headers) });
                }
                Line::Ping => self.io.get_mut().write_all(b"PONG\r\n").await?,
                Line::Err(why) => return Err(NatsError::Server(why)),
                _ => {}
            }
        }
    }

    /// Say goodbye (best effort: the server cleans up on close anyway).
    pub async fn close(mut self) {
        let _ = self.io.get_mut().shutdown().await;
    }

    async fn read_line(&mut self) -> Result<Line, NatsError> {
        let mut buf = Vec::new();
        let n = (&mut self.io).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).await?;
        if n == 0 {
            return Err(NatsError::Closed);
        }
        if !buf.ends_with(b"\r\n") {
            return Err(match buf.len() > MAX_LINE {
                true => NatsError::Protocol(format!("a line over {MAX_LINE} bytes")),
                false => NatsError::Closed,
            });
        }
        buf.truncate(buf.len() - 2);
        parse_line(&String::from_utf8_lossy(&buf))
    }
}

/// At most 120 characters of what the server said, controls escaped (for an error message).
fn clip(text: &str) -> String {
    crate::util::text::escape_controls(&text.chars().take(120).collect::<String>()).into_owned()
}

fn eof(e: std::io::Error) -> NatsError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => NatsError::Closed,
        _ => NatsError::Io(e),
    }
}

/// 16 random hex characters for the inbox (unique per connection).
fn random_token() -> String {
    let mut b = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        b = crate::util::unique::next().to_be_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A JetStream answer: a PubAck or an API response, or its error.
#[derive(Debug, Deserialize)]
struct JsAnswer {
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    error: Option<JsError>,
}

#[derive(Debug, Deserialize)]
struct JsError {
    #[serde(default)]
    code: u64,
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

/// A reply read as a JetStream answer: `Err` for no responders, non-JSON or an error.
fn js_answer(subject: &str, reply: &Reply) -> Result<JsAnswer, NatsError> {
    if reply.status == Some(503) {
        return Err(NatsError::NoResponders(subject.to_string()));
    }
    let a: JsAnswer = serde_json::from_slice(&reply.payload).map_err(|e| {
        let text = String::from_utf8_lossy(&reply.payload);
        NatsError::Protocol(format!("a JetStream answer that is not JSON ({e}): {}", clip(&text)))
    })?;
    match a.error {
        Some(e) => Err(NatsError::JetStream { code: e.code, err_code: e.err_code, description: e.description }),
        None => Ok(a),
    }
}

/// A key-value bucket (ADR-8): the stream `KV_<bucket>` on `$KV.<bucket>.>`.
#[derive(Debug, Clone)]
pub struct Bucket {
    pub name: String,
    /// How long a key lives (the stream's `max_age`): old slots are cleaned.
    pub max_age: Duration,
}

/// What a `create` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The key is ours, at this revision (the stream sequence).
    Won(u64),
    /// The key was there already.
    Taken,
}

impl Bucket {
    fn stream(&self) -> String {
        format!("KV_{}", self.name)
    }

    /// The bucket's stream exists (made now, if missing): file storage, one
    /// value per key, `max_age` for cleaning, new writes refused when full.
    pub async fn ensure(&self, conn: &mut Conn) -> Result<(), NatsError> {
        let info = format!("$JS.API.STREAM.INFO.{}", self.stream());
        match js_answer(&info, &conn.request(&info, &[], b"").await?) {
            Ok(_) => return Ok(()),
            Err(NatsError::JetStream { err_code: STREAM_NOT_FOUND, .. }) => {}
            Err(e) => return Err(e),
        }
        let ns = |d: Duration| d.as_nanos().min(i64::MAX as u128) as i64;
        let config = serde_json::json!({
            "name": self.stream(),
            "subjects": [format!("$KV.{}.>", self.name)],
            "retention": "limits",
            "max_consumers": -1, "max_msgs": -1, "max_bytes": -1, "max_msg_size": -1,
            "max_msgs_per_subject": 1,
            "max_age": ns(self.max_age),
            "duplicate_window": ns(self.max_age.min(Duration::from_secs(120))),
            "storage": "file",
            "discard": "new",
            "num_replicas": 1,
            "deny_delete": true,
            "allow_rollup_hdrs": true,
            "allow_direct": true,
        });
        let create = format!("$JS.API.STREAM.CREATE.{}", self.stream());
        js_answer(&create, &conn.request(&create, &[], config.to_string().as_bytes()).await?).map(|_| ())
    }

    /// Put `value` at `key` only if the key has no value (ADR-8's `create`:
    /// `Nats-Expected-Last-Subject-Sequence: 0`). A bucket that is not there
    /// yet is made, and the put tried once more.
    pub async fn create(&self, conn: &mut Conn, key: &str, value: &[u8]) -> Result<Created, NatsError> {
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_=./".contains(&b)) {
            return Err(NatsError::Protocol(format!("`{key}` is not a key-value key")));
        }
        let subject = format!("$KV.{}.{key}", self.name);
        let headers = [("Nats-Expected-Last-Subject-Sequence", "0")];
        let mut made = false;
        loop {
            let reply = conn.request(&subject, &headers, value).await?;
            return match js_answer(&subject, &reply) {
                Ok(JsAnswer { seq: Some(seq), .. }) => Ok(Created::Won(seq)),
                Ok(_) => Err(NatsError::Protocol("a PubAck without its sequence".into())),
                Err(NatsError::JetStream { err_code: WRONG_LAST_SEQUENCE, .. }) => Ok(Created::Taken),
                Err(NatsError::NoResponders(_)) if !made => {
                    self.ensure(conn).await?;
                    made = true;
                    continue;
                }
                Err(e) => Err(e),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lines_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_line("PING").unwrap(), Line::Ping);
        assert_eq!(parse_line("-ERR 'Authorization Violation'").unwrap(), Line::Err("Authorization Violation".into()));
        assert_eq!(
            parse_line("MSG _INBOX.a.1 1 12").unwrap(),
            Line::Msg { subject: "_INBOX.a.1".into(), headers: 0, total: 12 }
        );
        assert_eq!(
            parse_line("HMSG _INBOX.a.1 1 rep 16 20").unwrap(),
            Line::Msg { subject: "_INBOX.a.1".into(), headers: 16, total: 20 }
        );
        for bad in ["HMSG x 1 30 20", "MSG x", "MSG x 1 -3", "HELLO", "", "MSG a b c d e f"] {
            assert!(matches!(parse_line(bad), Err(NatsError::Protocol(_))), "{bad}");
        }
    }

    #[test]
    fn statuses_urls_and_jetstream_answers() {
        assert_eq!(header_status(b"NATS/1.0 503\r\n\r\n").unwrap(), Some(503));
        assert_eq!(header_status(b"NATS/1.0\r\nA: b\r\n\r\n").unwrap(), None);
        assert!(header_status(b"HTTP/1.1 200\r\n").is_err());
        let s = Settings::from_url("nats://127.0.0.1:4333", Duration::from_secs(1)).unwrap();
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 4333));
        assert_eq!(Settings::from_url("nats://nats.lan", Duration::from_secs(1)).unwrap().port, 4222);
        for bad in ["http://x", "nats://", "nats://u:p@h", "nats://h:port", "tls://h"] {
            assert!(Settings::from_url(bad, Duration::from_secs(1)).is_err(), "{bad}");
        }
        let reply = |p: &str| Reply { status: None, payload: p.as_bytes().to_vec() };
        assert_eq!(js_answer("s", &reply(r#"{"stream":"KV_b","seq":7}"#)).unwrap().seq, Some(7));
        let taken =
            js_answer("s", &reply(r#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}"#));
        assert!(matches!(taken, Err(NatsError::JetStream { err_code: WRONG_LAST_SEQUENCE, .. })));
        assert!(matches!(js_answer("s", &reply("<html>")), Err(NatsError::Protocol(_))));
        let none = Reply { status: Some(503), payload: Vec::new() };
        assert!(matches!(js_answer("s", &none), Err(NatsError::NoResponders(_))));
    }
}
