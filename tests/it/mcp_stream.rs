//! Streamable HTTP's event streams against servers that misbehave: one that
//! floods its GET stream (with malformed and oversized events among the
//! good ones), one with a hostile `retry:`, one that redirects its GET stream
//! elsewhere, one that dies while a call is being resumed. No SDK server does
//! these, so the server here is a raw one written from the published wire
//! formats: MCP 2025-11-25, "Transports" → "Streamable HTTP" (resumability
//! and redelivery, listening for messages from the server), and WHATWG's
//! server-sent events. The well-behaved paths are tested against the official
//! Python SDK in [`crate::mcp`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::mcp::{err, ok, setup};
use crate::support::daemon::wait_until;
use crate::support::http::{read_request, Request};

type Handler = Arc<dyn Fn(Request, TcpStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A server answering each connection's one request with `handler`, which writes the raw answer.
struct Raw {
    url: String,
    log: Arc<Mutex<Vec<Request>>>,
    accept: tokio::task::AbortHandle,
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Raw {
    async fn start(handler: Handler) -> Raw {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (handler, seen) = (handler.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut reader = BufReader::new(stream);
                    let Ok(Some((req, _))) = read_request(&mut reader).await else { return };
                    seen.lock().unwrap().push(req.clone());
                    handler(req, reader.into_inner()).await;
                });
            }
        });
        Raw { url, log, accept: task.abort_handle() }
    }

    fn requests(&self, f: impl Fn(&Request) -> bool) -> Vec<Request> {
        self.log.lock().unwrap().iter().filter(|r| f(r)).cloned().collect()
    }

    fn gets(&self) -> Vec<Request> {
        self.requests(|r| r.method == "GET")
    }
}

async fn write_json(mut stream: TcpStream, status: u16, body: &Value) {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
}

async fn write_status(mut stream: TcpStream, status: u16, extra: &str) {
    let head = format!("HTTP/1.1 {status} X\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
}

/// An event stream's head (the body runs until the connection closes).
async fn sse_head(stream: &mut TcpStream) {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: s1\r\nConnection: close\r\n\r\n";
    let _ = stream.write_all(head.as_bytes()).await;
}

fn answer(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn text(s: &str) -> Value {
    json!({"content": [{"type": "text", "text": s}]})
}

/// The plain part of the protocol every raw server here speaks: initialize,
/// notifications and replies (202), tools/list (`echo`, `slow`, and `grown`
/// once `grown` is set), tools/call `echo`. `None` for what the test decides.
async fn plain(req: &Request, stream: TcpStream, grown: bool) -> Option<TcpStream> {
    if req.method != "POST" {
        return Some(stream);
    }
    let Some(msg) = req.json() else { return Some(stream) };
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = msg["method"].as_str().unwrap_or("");
    match method {
        "initialize" => {
            let result = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "raw", "version": "1"}});
            write_json(stream, 200, &answer(&id, result)).await;
        }
        "" => write_status(stream, 202, "").await, // a reply to our ping answers
        _ if id.is_null() => write_status(stream, 202, "").await,
        "tools/list" => {
            let schema = json!({"type": "object", "properties": {}});
            let mut tools =
                vec![json!({"name": "echo", "inputSchema": schema}), json!({"name": "slow", "inputSchema": schema})];
            if grown {
                tools.push(json!({"name": "grown", "inputSchema": schema}));
            }
            write_json(stream, 200, &answer(&id, json!({"tools": tools}))).await;
        }
        "tools/call" if msg["params"]["name"] == "echo" => write_json(stream, 200, &answer(&id, text("echo"))).await,
        _ => return Some(stream),
    }
    None
}

fn server_toml(url: &str, extra: &str) -> String {
    format!(
        "[[mcp.server]]\nname = \"raw\"\nurl = \"{url}/mcp\"\ntransport = \"streamable-http\"\ntimeout = \"60s\"\n{extra}\n"
    )
}

/// Pings flood the server's stream among malformed events, then one event
/// larger than the 4 MiB cap: each ping is answered, the list change is
/// seen, the oversized event drops the stream (never held), the reconnects
/// back off and stop — and calls work throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_server_stream_is_bounded() {
    const PINGS: usize = 200;
    let grown = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = grown.clone();
    let raw = Raw::start(Arc::new(move |req, mut stream| {
        let flag = flag.clone();
        Box::pin(async move {
            if req.method == "GET" {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                sse_head(&mut stream).await;
                let mut body = String::from(": hello\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n");
                for i in 0..PINGS {
                    body.push_str(&format!("data: {{\"jsonrpc\":\"2.0\",\"id\":\"p{i}\",\"method\":\"ping\"}}\n\n"));
                    body.push_str("data: {not json\n\ndata: [1, 2\n\n");
                }
                let _ = stream.write_all(body.as_bytes()).await;
                let big = vec![b'x'; 1 << 20];
                let _ = stream.write_all(b"data: ").await;
                for _ in 0..6 {
                    if stream.write_all(&big).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                return;
            }
            let grown = flag.load(std::sync::atomic::Ordering::SeqCst);
            if let Some(stream) = plain(&req, stream, grown).await {
                write_status(stream, 400, "").await;
            }
        })
    }))
    .await;
    let s = setup(&server_toml(&raw.url, "")).await;
    let listed = wait_until(30, || s.registry.names().iter().any(|n| n == "raw__grown")).await;
    assert!(listed, "the list change on the server's stream was not seen: {:?}", s.registry.names());
    let pongs = || {
        raw.requests(|r| {
            r.json().is_some_and(|m| m["id"].as_str().is_some_and(|i| i.starts_with('p')) && m["result"] == json!({}))
        })
        .len()
    };
    assert!(wait_until(30, || pongs() >= PINGS).await, "{} of {PINGS} pings answered", pongs());
    assert_eq!(ok(&s.call("raw__echo", json!({})).await), "echo");
    // Each stream ends in an oversized event, a failure: after a bounded number of tries it is given up.
    assert!(raw.gets().len() <= 8, "{} GETs", raw.gets().len());
}

/// A call's stream ends after a priming event with a `retry:` of 10^23 ms:
/// the wait is clamped (10 s) and the answer taken from the resumed stream,
/// whose GET carries Last-Event-ID, the session and the revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_retry_is_clamped_and_the_answer_resumed() {
    let raw = Raw::start(Arc::new(|req, stream| {
        Box::pin(async move {
            let Some(mut stream) = plain(&req, stream, false).await else { return };
            match (req.method.as_str(), req.header("last-event-id")) {
                ("GET", Some("41")) => {
                    sse_head(&mut stream).await;
                    let _ = stream
                        .write_all(format!("id: 42\ndata: {}\n\n", answer(&json!(PENDING), text("late"))).as_bytes())
                        .await;
                }
                ("GET", _) => write_status(stream, 405, "Allow: POST\r\n").await,
                _ => {
                    let id = req.json().unwrap()["id"].clone();
                    assert_eq!(id, json!(PENDING), "the call's id (the test's assumption)");
                    sse_head(&mut stream).await;
                    let _ = stream.write_all(b"id: 41\nretry: 99999999999999999999999\ndata: \n\n").await;
                }
            }
        })
    }))
    .await;
    let s = setup(&server_toml(&raw.url, "")).await;
    assert_eq!(ok(&s.call("raw__slow", json!({})).await), "late");
    let resumed = raw.requests(|r| r.header("last-event-id").is_some());
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].header("last-event-id"), Some("41"));
    assert_eq!(resumed[0].header("mcp-session-id"), Some("s1"));
    assert_eq!(resumed[0].header("mcp-protocol-version"), Some("2025-11-25"));
}

/// The id of the first `tools/call` (initialize 1, tools/list 2).
const PENDING: i64 = 3;

/// The GET stream redirected elsewhere: not followed (the headers carry a token), not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirected_server_stream_is_refused() {
    let thief = Raw::start(Arc::new(|_, stream| Box::pin(async move { write_status(stream, 200, "").await }))).await;
    let to = format!("{}/steal", thief.url);
    let raw = Raw::start(Arc::new(move |req, stream| {
        let to = to.clone();
        Box::pin(async move {
            if let Some(stream) = plain(&req, stream, false).await {
                write_status(stream, 302, &format!("Location: {to}\r\n")).await;
            }
        })
    }))
    .await;
    let s = setup(&server_toml(&raw.url, "headers = { Authorization = \"Bearer sekrit-token-1\" }")).await;
    assert!(wait_until(30, || !raw.gets().is_empty()).await, "no GET stream was asked for");
    assert_eq!(raw.gets()[0].header("authorization"), Some("Bearer sekrit-token-1"));
    assert_eq!(ok(&s.call("raw__echo", json!({})).await), "echo");
    assert!(thief.log.lock().unwrap().is_empty(), "the redirect was followed");
    assert_eq!(raw.gets().len(), 1, "a refused redirect is not tried again");
}

/// The server dies between ending a call's stream (after a priming event) and
/// the resumption: the call fails with a clear error, not at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dead_mid_resumption_fails_the_call_clearly() {
    static ACCEPT: OnceLock<tokio::task::AbortHandle> = OnceLock::new();
    let raw = Raw::start(Arc::new(|req, stream| {
        Box::pin(async move {
            let Some(mut stream) = plain(&req, stream, false).await else { return };
            if req.method == "GET" {
                return write_status(stream, 405, "").await;
            }
            sse_head(&mut stream).await;
            let _ = stream.write_all(b"id: 7\nretry: 100\ndata: \n\n").await;
            if let Some(accept) = ACCEPT.get() {
                accept.abort(); // no one listens any more
            }
        })
    }))
    .await;
    ACCEPT.set(raw.accept.clone()).expect("once");
    let s = setup(&server_toml(&raw.url, "")).await;
    let out = s.call("raw__slow", json!({})).await;
    assert!(err(&out).contains("could not be reached to resume it (3 tries)"), "{}", out.text);
    assert!(!out.text.contains("no answer within"), "{}", out.text);
}
