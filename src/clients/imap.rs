//! A small IMAP4rev1 client (RFC 3501, IDLE from RFC 2177, SASL-IR PLAIN
//! from RFC 4959/4616): the handful of commands the email channel needs —
//! log in, select a folder, search by UID, fetch a message, set `\Seen`,
//! wait in IDLE. Wire only: no policy, no bus.
//!
//! Why our own and not `async-imap`: 0.12 needs rustc 1.88 and brings
//! chrono, nom 8, imap-proto, async-channel, stop-token, pin-project and a
//! second thiserror (1.x) — ten direct dependencies for what is ~450 lines
//! over the tokio and tokio-rustls already in the tree (the rustls/ring
//! setup and the platform verifier of `util::tls`).
//!
//! Every read is bounded: a line by [`MAX_LINE`], a literal by the caller's
//! limit, every exchange by a timeout, so a slow or hostile server costs a
//! reconnect, never memory or a hung task. With STARTTLS, bytes the server
//! sends after its `OK` and before the handshake are refused (the STARTTLS
//! injection of CVE-2011-0411's kind), and the capabilities are asked again
//! over TLS.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::config::email::{MailServer, MailTls};
use crate::config::Secret;

/// The longest response line taken (literals are counted apart).
pub const MAX_LINE: u64 = 64 * 1024;
/// How long connecting, the TLS handshake and each command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Why an IMAP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ImapError {
    #[error("cannot connect to the IMAP server {server}: {error}")]
    Connect { server: String, error: std::io::Error },
    #[error("the TLS handshake with {server} failed: {error}")]
    Tls { server: String, error: std::io::Error },
    #[error("the IMAP server did not answer {0} within {1:?}")]
    Timeout(&'static str, Duration),
    #[error("the IMAP server refused the login as {user}: {text}; check [email] username and password_env")]
    Login { user: String, text: String },
    #[error("the IMAP server refused {command}: {text}")]
    Refused { command: &'static str, text: String },
    #[error("the IMAP server offers no STARTTLS: use imaps:// (port 993)")]
    NoStartTls,
    #[error("the IMAP server sent data before the TLS handshake (a STARTTLS injection?); connection closed")]
    Injected,
    #[error("the IMAP server said something unexpected: {0}")]
    Protocol(String),
    #[error("the IMAP server closed the connection: {0}")]
    Bye(String),
    #[error("the IMAP connection failed: {0}")]
    Io(#[from] std::io::Error),
}

impl ImapError {
    /// A login refused: trying again will not help until the config changes.
    pub fn is_login(&self) -> bool {
        matches!(self, ImapError::Login { .. })
    }
}

/// One response: its text (literals replaced by their `{N}` markers) and the literals' bytes.
#[derive(Debug, Default)]
pub struct Line {
    pub text: Vec<u8>,
    pub literals: Vec<Vec<u8>>,
}

impl Line {
    fn text_lossy(&self) -> String {
        String::from_utf8_lossy(&self.text).into_owned()
    }
}

/// What a folder is, after `SELECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Folder {
    pub uid_validity: u32,
    pub exists: u32,
}

/// How an IDLE ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The folder changed (`EXISTS`, `RECENT`, `FETCH`, `EXPUNGE`).
    Changed,
    /// The time was up (re-issued before the server's 30-minute limit).
    Timeout,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection, logged in.
pub struct Imap {
    conn: Conn<Box<dyn Io>>,
    caps: Vec<String>,
}

/// The transport under a session: a buffered stream and the tag counter.
struct Conn<S> {
    io: BufReader<S>,
    tag: u32,
    /// The largest literal read (a fetched message's size limit, plus slack).
    max_literal: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    fn new(io: S, max_literal: usize) -> Conn<S> {
        Conn { io: BufReader::new(io), tag: 0, max_literal }
    }

    /// One response line, with the literals it announces (`{N}` at a line's end).
    async fn read_line(&mut self) -> Result<Line, ImapError> {
        let mut line = Line::default();
        loop {
            let mut part = Vec::new();
            let n = (&mut self.io).take(MAX_LINE).read_until(b'\n', &mut part).await?;
            if n == 0 {
                return Err(ImapError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            if !part.ends_with(b"\n") {
                return Err(ImapError::Protocol(format!("a line longer than {MAX_LINE} bytes")));
            }
            while part.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                part.pop();
            }
            let literal = literal_len(&part);
            line.text.extend_from_slice(&part);
            let Some(len) = literal else { return Ok(line) };
            if len > self.max_literal {
                return Err(ImapError::Protocol(format!(
                    "a literal of {len} bytes (the limit is {})",
                    self.max_literal
                )));
            }
            let mut buf = vec![0; len];
            self.io.read_exact(&mut buf).await?;
            line.literals.push(buf);
        }
    }

    /// `read_line` within [`COMMAND_TIMEOUT`].
    async fn read_line_timed(&mut self, what: &'static str) -> Result<Line, ImapError> {
        tokio::time::timeout(COMMAND_TIMEOUT, self.read_line())
            .await
            .map_err(|_| ImapError::Timeout(what, COMMAND_TIMEOUT))?
    }

    /// Send `tag command`; the tag.
    async fn send(&mut self, command: &str) -> Result<String, ImapError> {
        self.tag += 1;
        let tag = format!("b{}", self.tag);
        let io = self.io.get_mut();
        io.write_all(format!("{tag} {command}\r\n").as_bytes()).await?;
        io.flush().await?;
        Ok(tag)
    }

    /// Read until `tag`'s completion: the untagged responses on `OK`.
    async fn complete(&mut self, tag: &str, what: &'static str) -> Result<Vec<Line>, ImapError> {
        let mut untagged = Vec::new();
        loop {
            let line = self.read_line_timed(what).await?;
            if let Some(rest) = line.text.strip_prefix(tag.as_bytes()).and_then(|r| r.strip_prefix(b" ")) {
                let rest = String::from_utf8_lossy(rest).into_owned();
                return match rest.get(..2) {
                    Some(s) if s.eq_ignore_ascii_case("OK") => Ok(untagged),
                    _ => Err(ImapError::Refused { command: what, text: rest }),
                };
            }
            if starts_with_ci(&line.text, b"* BYE") {
                return Err(ImapError::Bye(line.text_lossy()));
            }
            if line.text.starts_with(b"+") {
                return Err(ImapError::Protocol(format!("a continuation request during {what}")));
            }
            untagged.push(line);
        }
    }

    async fn command(&mut self, command: &str, what: &'static str) -> Result<Vec<Line>, ImapError> {
        let tag = self.send(command).await?;
        self.complete(&tag, what).await
    }

    /// The server's greeting (`* OK`, or `* PREAUTH`); its capabilities if it names them.
    async fn greeting(&mut self) -> Result<Vec<String>, ImapError> {
        let line = self.read_line_timed("the greeting").await?;
        if !starts_with_ci(&line.text, b"* OK") && !starts_with_ci(&line.text, b"* PREAUTH") {
            return Err(ImapError::Protocol(format!("greeting {:?}", line.text_lossy())));
        }
        Ok(capabilities_in(&line.text))
    }

    async fn capabilities(&mut self) -> Result<Vec<String>, ImapError> {
        let lines = self.command("CAPABILITY", "CAPABILITY").await?;
        Ok(lines.iter().flat_map(|l| capabilities_in(&l.text)).collect())
    }
}

impl Imap {
    /// Connect to `server` and log in as `user`. `max_message` bounds what a fetch may read.
    pub async fn connect(
        server: &MailServer,
        user: &str,
        password: &Secret,
        max_message: usize,
    ) -> Result<Imap, ImapError> {
        let addr = (server.host.as_str(), server.port);
        let tcp = tokio::time::timeout(COMMAND_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| ImapError::Timeout("the connection", COMMAND_TIMEOUT))?
            .map_err(|error| ImapError::Connect { server: server.to_string(), error })?;
        let max_literal = max_message + 64 * 1024;
        let (mut conn, caps): (Conn<Box<dyn Io>>, _) = match server.tls {
            MailTls::Implicit => {
                let tls = handshake(server, tcp).await?;
                let mut conn = Conn::new(Box::new(tls) as Box<dyn Io>, max_literal);
                let caps = conn.greeting().await?;
                (conn, caps)
            }
            MailTls::StartTls => {
                let mut plain = Conn::new(tcp, max_literal);
                let caps = plain.greeting().await?;
                let caps = if caps.is_empty() { plain.capabilities().await? } else { caps };
                if !has(&caps, "STARTTLS") {
                    return Err(ImapError::NoStartTls);
                }
                plain.command("STARTTLS", "STARTTLS").await?;
                if !plain.io.buffer().is_empty() {
                    return Err(ImapError::Injected);
                }
                let tls = handshake(server, plain.io.into_inner()).await?;
                let conn = Conn { io: BufReader::new(Box::new(tls) as Box<dyn Io>), tag: plain.tag, max_literal };
                (conn, Vec::new())
            }
            MailTls::None => {
                let mut conn = Conn::new(Box::new(tcp) as Box<dyn Io>, max_literal);
                let caps = conn.greeting().await?;
                (conn, caps)
            }
        };
        let caps = if caps.is_empty() { conn.capabilities().await? } else { caps };
        let mut imap = Imap { conn, caps };
        imap.login(user, password).await?;
        // The capabilities may grow after the login (IDLE among them).
        imap.caps = imap.conn.capabilities().await?;
        Ok(imap)
    }

    /// AUTHENTICATE PLAIN where offered, LOGIN otherwise.
    async fn login(&mut self, user: &str, password: &Secret) -> Result<(), ImapError> {
        let refused = |e: ImapError| match e {
            ImapError::Refused { text, .. } => ImapError::Login { user: user.to_string(), text },
            e => e,
        };
        if has(&self.caps, "AUTH=PLAIN") {
            use base64::Engine as _;
            let sasl = format!("\0{user}\0{}", password.expose());
            let b64 = base64::engine::general_purpose::STANDARD.encode(sasl);
            let tag = self.conn.send("AUTHENTICATE PLAIN").await?;
            let line = self.conn.read_line_timed("AUTHENTICATE").await?;
            if !line.text.starts_with(b"+") {
                return Err(ImapError::Login { user: user.to_string(), text: line.text_lossy() });
            }
            let io = self.conn.io.get_mut();
            io.write_all(format!("{b64}\r\n").as_bytes()).await?;
            io.flush().await?;
            return self.conn.complete(&tag, "AUTHENTICATE").await.map(drop).map_err(refused);
        }
        if has(&self.caps, "LOGINDISABLED") {
            return Err(ImapError::Login { user: user.to_string(), text: "the server allows no LOGIN here".into() });
        }
        let cmd = format!("LOGIN {} {}", quote(user)?, quote(password.expose())?);
        self.conn.command(&cmd, "LOGIN").await.map(drop).map_err(refused)
    }

    /// Whether the server offers `cap` (`IDLE`).
    pub fn has(&self, cap: &str) -> bool {
        has(&self.caps, cap)
    }

    /// `SELECT folder`: its UIDVALIDITY and message count.
    pub async fn select(&mut self, folder: &str) -> Result<Folder, ImapError> {
        let lines = self.conn.command(&format!("SELECT {}", quote(folder)?), "SELECT").await?;
        let mut f = Folder { uid_validity: 0, exists: 0 };
        for l in &lines {
            let t = String::from_utf8_lossy(&l.text);
            if let Some(v) = after_ci(&t, "[UIDVALIDITY ").and_then(number) {
                f.uid_validity = v;
            }
            let words: Vec<&str> = t.split_whitespace().collect();
            if let ["*", n, kw] = words.as_slice() {
                if kw.eq_ignore_ascii_case("EXISTS") {
                    f.exists = n.parse().unwrap_or(0);
                }
            }
        }
        if f.uid_validity == 0 {
            return Err(ImapError::Protocol(format!("SELECT {folder:?} named no UIDVALIDITY")));
        }
        Ok(f)
    }

    /// The UIDs of unseen messages above `after`, ascending.
    pub async fn unseen_after(&mut self, after: u32) -> Result<Vec<u32>, ImapError> {
        let cmd = format!("UID SEARCH UNSEEN UID {}:*", after.saturating_add(1));
        let lines = self.conn.command(&cmd, "UID SEARCH").await?;
        let mut uids: Vec<u32> = lines
            .iter()
            .filter(|l| starts_with_ci(&l.text, b"* SEARCH"))
            .flat_map(|l| {
                String::from_utf8_lossy(&l.text[8..])
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .filter(|&u| u > after) // `n:*` includes the last message even below n
            .collect();
        uids.sort_unstable();
        uids.dedup();
        Ok(uids)
    }

    /// The size of message `uid` (`RFC822.SIZE`); `None` if it is gone.
    pub async fn size(&mut self, uid: u32) -> Result<Option<u64>, ImapError> {
        let lines = self.conn.command(&format!("UID FETCH {uid} (RFC822.SIZE)"), "UID FETCH").await?;
        Ok(lines.iter().find(|l| fetch_uid(&l.text) == Some(uid)).and_then(|l| {
            let t = String::from_utf8_lossy(&l.text);
            after_ci(&t, "RFC822.SIZE ").and_then(number).map(u64::from)
        }))
    }

    /// Message `uid` whole, without setting `\Seen`; `None` if it is gone.
    pub async fn fetch(&mut self, uid: u32) -> Result<Option<Vec<u8>>, ImapError> {
        let lines = self.conn.command(&format!("UID FETCH {uid} BODY.PEEK[]"), "UID FETCH").await?;
        Ok(lines.into_iter().find(|l| fetch_uid(&l.text) == Some(uid)).and_then(|l| l.literals.into_iter().next()))
    }

    /// Set `\Seen` on `uid`.
    pub async fn mark_seen(&mut self, uid: u32) -> Result<(), ImapError> {
        self.conn.command(&format!("UID STORE {uid} +FLAGS.SILENT (\\Seen)"), "UID STORE").await.map(drop)
    }

    /// `NOOP`: keeps the connection, and lets the server report changes.
    pub async fn noop(&mut self) -> Result<(), ImapError> {
        self.conn.command("NOOP", "NOOP").await.map(drop)
    }

    /// `APPEND` a message to `folder` (for tests and tools that file mail).
    pub async fn append(&mut self, folder: &str, message: &[u8]) -> Result<(), ImapError> {
        let tag = self.conn.send(&format!("APPEND {} {{{}}}", quote(folder)?, message.len())).await?;
        let line = self.conn.read_line_timed("APPEND").await?;
        if !line.text.starts_with(b"+") {
            return Err(ImapError::Refused { command: "APPEND", text: line.text_lossy() });
        }
        let io = self.conn.io.get_mut();
        io.write_all(message).await?;
        io.write_all(b"\r\n").await?;
        io.flush().await?;
        self.conn.complete(&tag, "APPEND").await.map(drop)
    }

    /// Wait in IDLE until the folder changes or `max` passes (keep it under
    /// 29 minutes: servers may drop an IDLE after 30).
    pub async fn idle(&mut self, max: Duration) -> Result<Woken, ImapError> {
        let tag = self.conn.send("IDLE").await?;
        let line = self.conn.read_line_timed("IDLE").await?;
        if !line.text.starts_with(b"+") {
            return Err(ImapError::Refused { command: "IDLE", text: line.text_lossy() });
        }
        let deadline = tokio::time::Instant::now() + max;
        let woken = loop {
            // Waiting for bytes is cancel-safe (nothing is consumed); the line is then read whole.
            let ready = tokio::time::timeout_at(deadline, self.conn.io.fill_buf()).await;
            match ready {
                Err(_) => break Woken::Timeout,
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok([])) => return Err(ImapError::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(Ok(_)) => {}
            }
            let line = self.conn.read_line_timed("IDLE").await?;
            if starts_with_ci(&line.text, b"* BYE") {
                return Err(ImapError::Bye(line.text_lossy()));
            }
            let t = String::from_utf8_lossy(&line.text).to_ascii_uppercase();
            if t.starts_with("* ") && ["EXISTS", "RECENT", "EXPUNGE", "FETCH"].iter().any(|k| t.contains(k)) {
                break Woken::Changed;
            }
        };
        let io = self.conn.io.get_mut();
        io.write_all(b"DONE\r\n").await?;
        io.flush().await?;
        self.conn.complete(&tag, "IDLE").await?;
        Ok(woken)
    }

    /// `LOGOUT`, best effort.
    pub async fn logout(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.conn.command("LOGOUT", "LOGOUT")).await;
    }
}

/// The TLS handshake with `server`'s name, through the platform verifier.
async fn handshake(
    server: &MailServer,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ImapError> {
    let mut config = crate::util::tls::client_config();
    config.alpn_protocols.clear();
    let name = rustls::pki_types::ServerName::try_from(server.host.clone()).map_err(|e| ImapError::Tls {
        server: server.to_string(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tokio::time::timeout(COMMAND_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| ImapError::Timeout("the TLS handshake", COMMAND_TIMEOUT))?
        .map_err(|error| ImapError::Tls { server: server.to_string(), error })
}

/// `{N}` or `{N+}` at the end of a line: a literal of N bytes follows.
fn literal_len(line: &[u8]) -> Option<usize> {
    let body = line.strip_suffix(b"}")?;
    let open = body.iter().rposition(|&b| b == b'{')?;
    let digits = body[open + 1..].strip_suffix(b"+").unwrap_or(&body[open + 1..]);
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The UID in a `* n FETCH (… UID u …)` response.
fn fetch_uid(text: &[u8]) -> Option<u32> {
    let t = String::from_utf8_lossy(text);
    let words: Vec<&str> = t.splitn(4, ' ').collect();
    if words.len() < 4 || words[0] != "*" || !words[2].eq_ignore_ascii_case("FETCH") {
        return None;
    }
    let rest = words[3].trim_start_matches('(');
    let mut it = rest.split([' ', '(', ')']);
    while let Some(w) = it.next() {
        if w.eq_ignore_ascii_case("UID") {
            return it.next().and_then(|n| n.parse().ok());
        }
    }
    None
}

/// Capabilities named in a line: `* CAPABILITY …` or `[CAPABILITY …]`.
fn capabilities_in(text: &[u8]) -> Vec<String> {
    let t = String::from_utf8_lossy(text);
    let list = if let Some(r) = after_ci(&t, "[CAPABILITY ") {
        r.split(']').next().unwrap_or("")
    } else if starts_with_ci(text, b"* CAPABILITY ") {
        t.get("* CAPABILITY ".len()..).unwrap_or("")
    } else {
        return Vec::new();
    };
    list.split_whitespace().map(str::to_ascii_uppercase).collect()
}

fn has(caps: &[String], cap: &str) -> bool {
    caps.iter().any(|c| c.eq_ignore_ascii_case(cap))
}

fn starts_with_ci(text: &[u8], prefix: &[u8]) -> bool {
    text.len() >= prefix.len() && text[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// The text after the first `needle` (ASCII case-insensitive).
fn after_ci<'a>(text: &'a str, needle: &str) -> Option<&'a str> {
    let i = text.to_ascii_uppercase().find(&needle.to_ascii_uppercase())?;
    text.get(i + needle.len()..)
}

/// The leading number of `text`.
fn number(text: &str) -> Option<u32> {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    text[..end].parse().ok()
}

/// A quoted string; a CR, LF or NUL cannot be quoted (and has no place in a login or folder name).
fn quote(text: &str) -> Result<String, ImapError> {
    if text.contains(['\r', '\n', '\0']) {
        return Err(ImapError::Protocol("a line break in a login, password or folder name".into()));
    }
    Ok(format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_as_the_rfc_writes_them() {
        assert_eq!(literal_len(b"* 1 FETCH (UID 7 BODY[] {342}"), Some(342));
        assert_eq!(literal_len(b"* 1 FETCH (BODY[] {12+}"), Some(12));
        assert_eq!(literal_len(b"* OK {not}"), None);
        assert_eq!(literal_len(b"* OK {99999999999}"), None);
        assert_eq!(fetch_uid(b"* 3 FETCH (UID 17 RFC822.SIZE 2048)"), Some(17));
        assert_eq!(fetch_uid(b"* 3 FETCH (FLAGS (\\Seen) UID 9 BODY[] {4})"), Some(9));
        assert_eq!(fetch_uid(b"* 3 EXISTS"), None);
        let caps = capabilities_in(b"* OK [CAPABILITY IMAP4rev1 IDLE AUTH=PLAIN] ready");
        assert!(has(&caps, "idle") && has(&caps, "AUTH=PLAIN"));
        assert!(has(&capabilities_in(b"* CAPABILITY IMAP4rev1 STARTTLS"), "STARTTLS"));
        assert!(capabilities_in(b"* OK hello").is_empty());
        assert_eq!(quote("a\"b\\c").unwrap(), "\"a\\\"b\\\\c\"");
        assert!(quote("x\r\nb1 LOGOUT").is_err());
    }

    /// A server that sends more than a line's worth without a newline, or a
    /// literal above the limit, is refused rather than buffered.
    #[tokio::test]
    async fn a_hostile_server_costs_no_memory() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let mut conn = Conn::new(client, 100);
        server.write_all(&vec![b'a'; MAX_LINE as usize + 10]).await.unwrap();
        assert!(matches!(conn.read_line().await, Err(ImapError::Protocol(_))));
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let mut conn = Conn::new(client, 100);
        server.write_all(b"* 1 FETCH (UID 1 BODY[] {5000}\r\n").await.unwrap();
        let err = conn.read_line().await.unwrap_err().to_string();
        assert!(err.contains("5000"), "{err}");
    }

    /// A server that slips a response in after its STARTTLS `OK` (to be read
    /// as if it came over TLS) is refused; one that offers no STARTTLS is not
    /// logged in to in the clear.
    #[tokio::test]
    async fn starttls_is_required_and_not_injected_into() {
        let serve = |script: &'static [u8]| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (mut sock, _) = listener.accept().await.unwrap();
                sock.write_all(script).await.unwrap();
                let mut buf = [0u8; 256];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
            MailServer { host: "127.0.0.1".into(), port, tls: MailTls::StartTls }
        };
        let pw = Secret::new("pw");
        let server = serve(b"* OK [CAPABILITY IMAP4rev1 STARTTLS] hi\r\nb1 OK go\r\n* OK injected\r\n").await;
        let err = Imap::connect(&server, "u", &pw, 1024).await.err().unwrap();
        assert!(matches!(err, ImapError::Injected), "{err}");
        let server = serve(b"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] hi\r\n").await;
        let err = Imap::connect(&server, "u", &pw, 1024).await.err().unwrap();
        assert!(matches!(err, ImapError::NoStartTls), "{err}");
    }
}
