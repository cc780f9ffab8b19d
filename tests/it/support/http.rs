//! A tiny HTTP/1.1 server for tests, on `127.0.0.1:<random port>`.
//!
//! Fakes of remote APIs (an LLM, the Telegram Bot API, …) are built on it: the
//! code under test talks real HTTP through its real client (reqwest, rustls
//! setup, timeouts, connection reuse), and the test decides every answer.
//!
//! It understands what such clients send: a request line, headers, a body by
//! `Content-Length` or `Transfer-Encoding: chunked`, and keep-alive (reqwest
//! reuses connections; `Connection: close` and HTTP/1.0 are honoured). Each
//! request goes to a handler closure; its [`Response`] is written with a
//! correct `Content-Length`. Dropping the [`TestServer`] stops it, including
//! idle keep-alive connections.
//!
//! ```ignore
//! let server = TestServer::start(|req| Response::json(200, &serde_json::json!({"ok": true}))).await;
//! let url = format!("{}/path", server.url());
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Requests with a head or body larger than this are refused (a test bug, not a load test).
const MAX_BYTES: usize = 16 * 1024 * 1024;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// The request target as sent, query string included (`/v1/chat/completions`, `/bot123/getUpdates?offset=1`).
    pub path: String,
    /// Header names lower-cased, values trimmed, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The path without its query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or(&self.path)
    }
}

/// What the handler answers. `Content-Length` is added when written.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// An empty answer with `status`.
    pub fn new(status: u16) -> Self {
        Response { status, headers: Vec::new(), body: Vec::new() }
    }

    /// A JSON answer (`Content-Type: application/json`).
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Response::new(status).header("content-type", "application/json").body(body.to_string())
    }

    /// A plain-text answer.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Response::new(status).header("content-type", "text/plain; charset=utf-8").body(body.into())
    }

    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// A torn transfer: announce the whole body, send only its first `n`
    /// bytes, then close the connection (a Wi-Fi that drops mid-download).
    pub fn torn_after(self, n: usize) -> Self {
        self.header(TORN, n.to_string())
    }
}

/// The handler's future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;
type Handler = Arc<dyn Fn(Request) -> HandlerFuture + Send + Sync>;

/// A running test server; stops when dropped.
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Serve with a synchronous handler.
    pub async fn start<F>(handler: F) -> TestServer
    where
        F: Fn(Request) -> Response + Send + Sync + 'static,
    {
        let handler = Arc::new(handler);
        TestServer::start_async(move |req| {
            let handler = handler.clone();
            async move { handler(req) }
        })
        .await
    }

    /// Serve with an async handler (it may sleep, to test timeouts).
    pub async fn start_async<F, Fut>(handler: F) -> TestServer
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |req| Box::pin(handler(req)) as HandlerFuture);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task closes them all.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            // A zero-latency fake: no Nagle delay on our side either.
                            let _ = stream.set_nodelay(true);
                            connections.spawn(serve_connection(stream, handler.clone()));
                        }
                        Err(e) => eprintln!("test server: accept failed: {e}"),
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        TestServer { addr, task }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A URL on 127.0.0.1 where nothing listens (connections are refused): bind a
/// port, then let it go. Racy only in theory (another test would have to grab
/// the same port in between).
pub async fn refused_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    format!("http://{addr}")
}

/// Serve requests on one connection until the client closes it or asks to.
async fn serve_connection(stream: TcpStream, handler: Handler) {
    let mut stream = BufReader::new(stream);
    loop {
        let (request, keep_alive) = match read_request(&mut stream).await {
            Ok(Some(r)) => r,
            Ok(None) => return, // clean close between requests
            Err(e) => {
                let _ = write_response(stream.get_mut(), &Response::text(400, e), false).await;
                return;
            }
        };
        let response = handler(request).await;
        if write_response(stream.get_mut(), &response, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

/// Read one request; `None` when the connection closed before a new one began.
/// Also says whether the connection stays open afterwards.
pub async fn read_request(stream: &mut BufReader<TcpStream>) -> Result<Option<(Request, bool)>, String> {
    let mut line = String::new();
    // Tolerate stray empty lines between requests (RFC 9112 §2.2).
    loop {
        line.clear();
        if stream.read_line(&mut line).await.map_err(|e| e.to_string())? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("bad request line: {line:?}"));
    };
    let (method, path, version) = (method.to_string(), path.to_string(), version.to_string());

    let mut headers = Vec::new();
    let mut head_bytes = line.len();
    loop {
        line.clear();
        let n = stream.read_line(&mut line).await.map_err(|e| e.to_string())?;
        head_bytes += n;
        if n == 0 {
            return Err("connection closed inside the headers".into());
        }
        if head_bytes > MAX_BYTES {
            return Err("headers too large".into());
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            return Err(format!("bad header line: {l:?}"));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.to_ascii_lowercase());

    let body = if get("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
        read_chunked(stream).await?
    } else {
        let len = match get("content-length") {
            Some(v) => v.parse::<usize>().map_err(|_| format!("bad Content-Length: {v}"))?,
            None => 0,
        };
        if len > MAX_BYTES {
            return Err("body too large".into());
        }
        let mut body = vec![0; len];
        stream.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        body
    };

    let connection = get("connection").unwrap_or_default();
    let keep_alive =
        if version == "HTTP/1.0" { connection.contains("keep-alive") } else { !connection.contains("close") };
    Ok(Some((Request { method, path, headers, body }, keep_alive)))
}

/// A `Transfer-Encoding: chunked` body (trailers are read and dropped).
async fn read_chunked(stream: &mut BufReader<TcpStream>) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        stream.read_line(&mut line).await.map_err(|e| e.to_string())?;
        let size_text = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size: {line:?}"))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                line.clear();
                let n = stream.read_line(&mut line).await.map_err(|e| e.to_string())?;
                if n == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BYTES {
            return Err("body too large".into());
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..]).await.map_err(|e| e.to_string())?;
        let mut crlf = [0u8; 2];
        stream.read_exact(&mut crlf).await.map_err(|e| e.to_string())?;
    }
}

/// The header [`Response::torn_after`] sets; never sent.
const TORN: &str = "x-test-torn-after";

pub async fn write_response(stream: &mut TcpStream, resp: &Response, keep_alive: bool) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    let torn = resp.headers.iter().find(|(n, _)| n == TORN).and_then(|(_, v)| v.parse::<usize>().ok());
    for (name, value) in &resp.headers {
        if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("connection") || name == TORN {
            continue;
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n", resp.body.len()));
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    // One write: a separate body write would wait for the client's delayed ACK (Nagle), ~40 ms.
    let mut out = head.into_bytes();
    match torn {
        Some(n) => {
            out.extend_from_slice(&resp.body[..n.min(resp.body.len())]);
            stream.write_all(&out).await?;
            stream.flush().await?;
            Err(std::io::Error::other("torn on purpose"))
        }
        None => {
            out.extend_from_slice(&resp.body);
            stream.write_all(&out).await?;
            stream.flush().await
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// A `multipart/form-data` body (RFC 7578) taken apart: what a server sees of
/// an upload (Telegram's sendPhoto, a transcription endpoint).
#[derive(Debug, Clone)]
pub struct Multipart {
    pub parts: Vec<Part>,
}

/// One part of a form.
#[derive(Debug, Clone)]
pub struct Part {
    pub name: String,
    pub file_name: Option<String>,
    pub content_type: Option<String>,
    /// The bytes as they arrived.
    pub data: Vec<u8>,
}

impl Multipart {
    /// Parse `body` sent with `content_type` (`multipart/form-data; boundary=…`); `None` if malformed.
    pub fn parse(content_type: &str, body: &[u8]) -> Option<Multipart> {
        let boundary = content_type.split("boundary=").nth(1)?.trim_matches('"');
        let delim = format!("--{boundary}").into_bytes();
        let mut parts = Vec::new();
        let mut at = find(body, &delim, 0)? + delim.len();
        while !body.get(at..)?.starts_with(b"--") {
            let start = at + 2; // the CRLF after the delimiter
            let end = find(body, &delim, start)?;
            let part = body.get(start..end.checked_sub(2)?)?; // the CRLF before the next one
            let split = find(part, b"\r\n\r\n", 0)?;
            let head = String::from_utf8_lossy(&part[..split]).to_string();
            let param = |key: &str| {
                head.split(&format!("{key}=\"")).nth(1).and_then(|r| r.split('"').next()).map(str::to_string)
            };
            parts.push(Part {
                name: param("name")?,
                file_name: param("filename"),
                content_type: head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Type:").or_else(|| l.strip_prefix("content-type:")))
                    .map(|v| v.trim().to_string()),
                data: part[split + 4..].to_vec(),
            });
            at = end + delim.len();
        }
        Some(Multipart { parts })
    }

    pub fn part(&self, name: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.name == name)
    }

    /// A text field's value.
    pub fn text(&self, name: &str) -> Option<String> {
        self.part(name).map(|p| String::from_utf8_lossy(&p.data).into_owned())
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|i| i + from)
}
