//! A signal-cli daemon's JSON-RPC interface (signal-cli-jsonrpc(5)), the
//! wire only: no policy, no bus.
//!
//! Two transports, as the man page describes them:
//!
//! - `daemon --http`: `POST /api/v1/rpc` takes one JSON-RPC 2.0 request and
//!   answers it; `GET /api/v1/events` is a Server-Sent Events stream whose
//!   events (`event:receive`, `data:<one JSON line>`, an `id` each in newer
//!   versions) are the `receive` notifications' params (`{"envelope", "account"}`);
//!   a `:` comment line every 15 s keeps it alive. A reconnect with
//!   `Last-Event-ID` first gets the events after that id.
//! - `daemon --tcp` / `--socket`: newline-delimited JSON-RPC; requests carry
//!   an `id`, answers echo it, and `receive` notifications (no `id`) are
//!   pushed to every connection. A call here opens its own short connection
//!   and skips the notifications it sees; the event stream is a connection
//!   of its own that only reads.
//!
//! signal-cli has no authentication on these endpoints and follows no
//! redirects; neither do we (a "moved" answer is an error).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::config::SignalEndpoint;

/// How long a call may take (a send to a big group can be slow).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Silence on the event stream past this is a stalled connection (signal-cli
/// sends a keep-alive every 15 s over HTTP; over a socket it sends nothing,
/// so there the stream is only re-opened on an error).
pub const STREAM_STALL: Duration = Duration::from_secs(45);
/// The largest event read; a longer one is skipped whole (receive events
/// carry attachment metadata, never their bytes).
pub const MAX_EVENT: usize = 256 * 1024;
/// The largest answer read (a `getAttachment` answer is base64 of the file).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SignalError {
    /// No answer: connection refused, reset, timeout.
    #[error("cannot reach the signal-cli daemon: {0}")]
    Transport(String),
    /// An HTTP status instead of an answer.
    #[error("the signal-cli daemon answered {what} with HTTP {code}")]
    Http { what: &'static str, code: u16 },
    /// A JSON-RPC error object.
    #[error("signal-cli refused {method} (JSON-RPC error {code}): {message}")]
    Rpc { method: String, code: i64, message: String },
    /// An answer we cannot read.
    #[error("cannot read signal-cli's answer to {what}: {message}")]
    Decode { what: String, message: String },
}

impl SignalError {
    /// Whether trying again later may work: the daemon away or busy, or an
    /// error signal-cli reports for the network (-32603 internal, -1
    /// unexpected). Invalid parameters (-32602) and unknown methods are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            SignalError::Transport(_) | SignalError::Decode { .. } => true,
            SignalError::Http { code, .. } => *code >= 500 || *code == 429,
            SignalError::Rpc { code, .. } => !matches!(code, -32602 | -32601 | -32600 | -32700),
        }
    }
}

/// One `receive` notification's params, and its stream id where it had one.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: Option<String>,
    /// `{"envelope": {...}, "account": "+…"}`.
    pub params: Value,
}

/// A signal-cli client for one endpoint.
pub struct Client {
    endpoint: SignalEndpoint,
    account: Option<String>,
    http: reqwest::Client,
    ids: AtomicU64,
}

impl Client {
    pub fn new(endpoint: SignalEndpoint, account: Option<String>) -> Result<Client, SignalError> {
        let http = crate::provider::http_client_builder(Duration::ZERO)
            .pool_idle_timeout(None)
            .pool_max_idle_per_host(2)
            .build()
            .map_err(|e| SignalError::Transport(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client { endpoint, account, http, ids: AtomicU64::new(1) })
    }

    pub fn endpoint(&self) -> &SignalEndpoint {
        &self.endpoint
    }

    /// Call `method` with `params` (an object; `account` is added when
    /// configured) and return its `result`.
    pub async fn call(&self, method: &str, mut params: Value) -> Result<Value, SignalError> {
        if let (Some(a), Some(obj)) = (&self.account, params.as_object_mut()) {
            obj.insert("account".into(), json!(a));
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let request = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id});
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, self.exchange(method, &request, id)).await.map_err(|_| {
                SignalError::Transport(format!("{} (no answer to {method} within {CALL_TIMEOUT:?})", self.endpoint))
            })??;
        rpc_result(method, answer)
    }

    async fn exchange(&self, method: &str, request: &Value, id: u64) -> Result<Value, SignalError> {
        match &self.endpoint {
            SignalEndpoint::Http(base) => {
                let resp = self
                    .http
                    .post(format!("{base}/api/v1/rpc"))
                    .header("content-type", "application/json")
                    .body(request.to_string())
                    .send()
                    .await
                    .map_err(|e| SignalError::Transport(format!("{base}: {}", chain(&e))))?;
                let status = resp.status().as_u16();
                if status != 200 {
                    return Err(SignalError::Http { what: "a call", code: status });
                }
                let body = read_capped(resp, MAX_ANSWER).await?;
                serde_json::from_slice(&body)
                    .map_err(|e| SignalError::Decode { what: method.to_string(), message: e.to_string() })
            }
            _ => {
                let mut lines = self.connect().await?;
                let mut line = request.to_string();
                line.push('\n');
                lines.get_mut().write_all(line.as_bytes()).await.map_err(|e| self.transport(e))?;
                loop {
                    let Some(l) = read_line(&mut lines, MAX_ANSWER).await.map_err(|e| self.transport(e))? else {
                        return Err(SignalError::Transport(format!(
                            "{} (closed before answering {method})",
                            self.endpoint
                        )));
                    };
                    let Ok(v) = serde_json::from_str::<Value>(&l) else { continue };
                    if v["id"] == json!(id) {
                        return Ok(v);
                    }
                }
            }
        }
    }

    fn transport(&self, e: std::io::Error) -> SignalError {
        SignalError::Transport(format!("{}: {e}", self.endpoint))
    }

    /// A line connection to a `--tcp` or `--socket` daemon.
    async fn connect(&self) -> Result<BufReader<Box<dyn Duplex>>, SignalError> {
        let stream: Box<dyn Duplex> = match &self.endpoint {
            SignalEndpoint::Tcp(addr) => {
                Box::new(tokio::net::TcpStream::connect(addr).await.map_err(|e| self.transport(e))?)
            }
            SignalEndpoint::Unix(path) => {
                Box::new(tokio::net::UnixStream::connect(path).await.map_err(|e| self.transport(e))?)
            }
            SignalEndpoint::Http(_) => return Err(SignalError::Transport("not a line endpoint".into())),
        };
        Ok(BufReader::new(stream))
    }

    /// Whether the daemon answers: `GET /api/v1/check`, or `version` over a socket.
    pub async fn check(&self) -> Result<(), SignalError> {
        match &self.endpoint {
            SignalEndpoint::Http(base) => {
                let resp = tokio::time::timeout(CALL_TIMEOUT, self.http.get(format!("{base}/api/v1/check")).send())
                    .await
                    .map_err(|_| SignalError::Transport(format!("{base} (no answer)")))?
                    .map_err(|e| SignalError::Transport(format!("{base}: {}", chain(&e))))?;
                match resp.status().as_u16() {
                    200 => Ok(()),
                    code => Err(SignalError::Http { what: "the check", code }),
                }
            }
            _ => self.call("version", json!({})).await.map(drop),
        }
    }

    /// `send` to `chat` (`+number`, uuid, or `group.<id>`); the message's timestamp.
    pub async fn send(&self, chat: &str, message: &str, attachments: Vec<String>) -> Result<i64, SignalError> {
        let mut params = to(chat);
        params["message"] = json!(message);
        if !attachments.is_empty() {
            params["attachments"] = json!(attachments);
        }
        let r = self.call("send", params).await?;
        Ok(r["timestamp"].as_i64().unwrap_or_default())
    }

    /// `sendTyping` (or its stop) in `chat`.
    pub async fn typing(&self, chat: &str, stop: bool) -> Result<(), SignalError> {
        let mut params = to(chat);
        if stop {
            params["stop"] = json!(true);
        }
        self.call("sendTyping", params).await.map(drop)
    }

    /// `getAttachment`: the bytes of attachment `id` that `sender` sent (in `group`, if any).
    pub async fn attachment(&self, id: &str, sender: &str, group: Option<&str>) -> Result<Vec<u8>, SignalError> {
        use base64::Engine as _;
        let mut params = json!({"id": id});
        match group {
            Some(g) => params["groupId"] = json!(g),
            None => params["recipient"] = json!(sender),
        }
        let r = self.call("getAttachment", params).await?;
        let data = r["data"].as_str().or(r.as_str()).unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| SignalError::Decode { what: "getAttachment".into(), message: e.to_string() })
    }

    /// Open the event stream (after `last_id`, where the daemon keeps events).
    pub async fn events(&self, last_id: Option<&str>) -> Result<Events, SignalError> {
        match &self.endpoint {
            SignalEndpoint::Http(base) => {
                let mut url = format!("{base}/api/v1/events");
                if let Some(a) = &self.account {
                    url.push_str("?account=");
                    url.push_str(&a.replace('+', "%2B"));
                }
                let mut req = self.http.get(url).header("accept", "text/event-stream");
                if let Some(id) = last_id {
                    req = req.header("last-event-id", id);
                }
                let resp = tokio::time::timeout(CALL_TIMEOUT, req.send())
                    .await
                    .map_err(|_| SignalError::Transport(format!("{base} (no answer to the event stream)")))?
                    .map_err(|e| SignalError::Transport(format!("{base}: {}", chain(&e))))?;
                if resp.status().as_u16() != 200 {
                    return Err(SignalError::Http { what: "the event stream", code: resp.status().as_u16() });
                }
                Ok(Events::Sse { resp: Box::new(resp), sse: Sse::default() })
            }
            _ => Ok(Events::Lines(self.connect().await?)),
        }
    }
}

/// The recipient part of a call's params for `chat`.
fn to(chat: &str) -> Value {
    match chat.strip_prefix("group.") {
        Some(g) => json!({"groupId": g}),
        None => json!({"recipient": [chat]}),
    }
}

/// A JSON-RPC answer's `result`, or its error.
fn rpc_result(method: &str, answer: Value) -> Result<Value, SignalError> {
    if let Some(e) = answer.get("error").filter(|e| !e.is_null()) {
        return Err(SignalError::Rpc {
            method: method.to_string(),
            code: e["code"].as_i64().unwrap_or_default(),
            message: e["message"].as_str().unwrap_or("no message").chars().take(500).collect(),
        });
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}

/// A stream to read and write (a TCP or unix socket).
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// One line (without its end), at most `cap` bytes: a longer line is an
/// error; `None` at the end of the stream.
async fn read_line<R: AsyncBufReadExt + Unpin>(r: &mut R, cap: usize) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok((!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned()));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        buf.extend_from_slice(&chunk[..take]);
        r.consume(take);
        if buf.len() > cap {
            return Err(std::io::Error::other(format!("a line longer than {cap} bytes")));
        }
        if done {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
    }
}

/// A body, at most `cap` bytes.
async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, SignalError> {
    let (body, more) = super::read_capped(resp, cap).await.map_err(|e| SignalError::Transport(chain(&e)))?;
    if more {
        return Err(SignalError::Decode { what: "an answer".into(), message: format!("larger than {cap} bytes") });
    }
    Ok(body)
}

/// A transport error with its causes (the URL has no secret: there is none).
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// What the event stream gave.
#[derive(Debug)]
pub enum Next {
    Event(Event),
    /// An event that could not be used (too long, not JSON, not `receive`): why.
    Skipped(String),
}

/// An open event stream.
pub enum Events {
    Sse { resp: Box<reqwest::Response>, sse: Sse },
    Lines(BufReader<Box<dyn Duplex>>),
}

impl Events {
    /// The next event; `Ok(None)`: the stream ended; a stall is an error.
    /// Cancel-safe only between events (a cancelled read drops the stream).
    pub async fn next(&mut self) -> Result<Option<Next>, SignalError> {
        match self {
            Events::Sse { resp, sse } => loop {
                if let Some(n) = sse.pop() {
                    return Ok(Some(n));
                }
                let chunk = tokio::time::timeout(STREAM_STALL, resp.chunk())
                    .await
                    .map_err(|_| SignalError::Transport(format!("the event stream was silent for {STREAM_STALL:?}")))?
                    .map_err(|e| SignalError::Transport(chain(&e)))?;
                match chunk {
                    Some(c) => sse.feed(&c),
                    None => return Ok(None),
                }
            },
            Events::Lines(r) => {
                let line = match read_line(r, MAX_EVENT).await {
                    Ok(Some(l)) => l,
                    Ok(None) => return Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::Other => {
                        // An over-long line: the rest of it cannot be found reliably; reconnect.
                        return Err(SignalError::Transport(e.to_string()));
                    }
                    Err(e) => return Err(SignalError::Transport(e.to_string())),
                };
                Ok(Some(line_event(&line)))
            }
        }
    }
}

/// A line of a socket stream as an event: a `receive` notification
/// (automatic mode: `params` is the event; `subscribeReceive` mode: `params.result` is).
fn line_event(line: &str) -> Next {
    let Ok(v) = serde_json::from_str::<Value>(line) else { return Next::Skipped("a line that is not JSON".into()) };
    if v["method"] != "receive" {
        return Next::Skipped("not a receive notification".into());
    }
    let params = if v["params"]["result"].is_object() { &v["params"]["result"] } else { &v["params"] };
    Next::Event(Event { id: None, params: params.clone() })
}

/// A Server-Sent Events parser (the WHATWG rules signal-cli's sender follows:
/// `field:value` lines, an empty line ends an event, `:` lines are comments).
#[derive(Debug, Default)]
pub struct Sse {
    line: Vec<u8>,
    data: String,
    id: Option<String>,
    kind: String,
    /// The current event ran past [`MAX_EVENT`]: dropped up to its end.
    oversize: bool,
    ready: std::collections::VecDeque<Next>,
}

impl Sse {
    /// Take bytes from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() <= MAX_EVENT {
                    self.line.push(b);
                } else {
                    self.oversize = true;
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line)).into_owned();
            self.field(&line);
        }
    }

    fn field(&mut self, line: &str) {
        if line.is_empty() {
            self.dispatch();
            return;
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "" => {} // a comment: the keep-alive
            "data" => {
                if self.data.len() + value.len() > MAX_EVENT {
                    self.oversize = true;
                } else {
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                }
            }
            "id" => self.id = Some(value.to_string()),
            "event" => self.kind = value.to_string(),
            _ => {}
        }
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        let kind = std::mem::take(&mut self.kind);
        let id = self.id.clone();
        if std::mem::take(&mut self.oversize) {
            self.ready.push_back(Next::Skipped(format!("an event longer than {MAX_EVENT} bytes")));
            return;
        }
        if data.is_empty() {
            return;
        }
        if !kind.is_empty() && kind != "receive" {
            self.ready.push_back(Next::Skipped(format!("an event of type {kind}")));
            return;
        }
        match serde_json::from_str::<Value>(&data) {
            Ok(params) if params.is_object() => self.ready.push_back(Next::Event(Event { id, params })),
            _ => self.ready.push_back(Next::Skipped("an event whose data is not a JSON object".into())),
        }
    }

    /// The next complete event, if any.
    pub fn pop(&mut self) -> Option<Next> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(sse: &mut Sse) -> Vec<Next> {
        std::iter::from_fn(|| sse.pop()).collect()
    }

    #[test]
    fn sse_events_split_across_chunks_and_keep_alives_are_skipped() {
        let mut sse = Sse::default();
        sse.feed(b":\n\nid:7\nevent:receive\ndata:{\"envelope\":");
        assert!(events(&mut sse).is_empty());
        sse.feed(b"{\"timestamp\":1}}\n\n:\nevent:receive\ndata:not json\n\n");
        let got = events(&mut sse);
        assert!(
            matches!(&got[0], Next::Event(e) if e.id.as_deref() == Some("7") && e.params["envelope"]["timestamp"] == 1)
        );
        assert!(matches!(&got[1], Next::Skipped(_)));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn an_oversize_event_is_skipped_whole_and_the_next_one_read() {
        let mut sse = Sse::default();
        let big = format!("event:receive\ndata:{}\n\n", "x".repeat(MAX_EVENT + 10));
        sse.feed(big.as_bytes());
        sse.feed(b"data:{\"a\":1}\n\n");
        let got = events(&mut sse);
        assert!(matches!(&got[0], Next::Skipped(why) if why.contains("longer than")));
        assert!(matches!(&got[1], Next::Event(e) if e.params["a"] == 1));
    }

    #[test]
    fn socket_lines_in_both_receive_modes_and_rpc_errors() {
        let auto = r#"{"jsonrpc":"2.0","method":"receive","params":{"envelope":{"timestamp":5},"account":"+1"}}"#;
        let manual =
            r#"{"jsonrpc":"2.0","method":"receive","params":{"subscription":0,"result":{"envelope":{"timestamp":6}}}}"#;
        assert!(matches!(line_event(auto), Next::Event(e) if e.params["envelope"]["timestamp"] == 5));
        assert!(matches!(line_event(manual), Next::Event(e) if e.params["envelope"]["timestamp"] == 6));
        assert!(matches!(line_event(r#"{"jsonrpc":"2.0","result":{},"id":1}"#), Next::Skipped(_)));
        let err =
            rpc_result("send", json!({"jsonrpc":"2.0","error":{"code":-32602,"message":"bad"},"id":1})).unwrap_err();
        assert!(!err.is_retryable() && err.to_string().contains("bad"));
        let err = rpc_result("send", json!({"error":{"code":-1,"message":"network"}})).unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(to("group.abc"), json!({"groupId": "abc"}));
        assert_eq!(to("+491"), json!({"recipient": ["+491"]}));
    }
}
