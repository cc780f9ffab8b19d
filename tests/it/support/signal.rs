//! A fake signal-cli daemon in HTTP mode (`signal-cli daemon --http`), built
//! from signal-cli's own documentation: the man page signal-cli-jsonrpc(5)
//! (man/signal-cli-jsonrpc.5.adoc: `POST /api/v1/rpc` takes one JSON-RPC 2.0
//! request, `GET /api/v1/events` is a Server-Sent Events stream of incoming
//! messages with an `id` each, resumed after a `Last-Event-ID` — all kept
//! events when the id is unknown —, `GET /api/v1/check` answers 200), the
//! `send` / `sendTyping` / `getAttachment` commands of signal-cli(1), and the
//! envelope JSON of its `receive` notifications (`source`, `sourceNumber`,
//! `sourceUuid`, `timestamp`, `dataMessage`, `syncMessage`). An SSE event is
//! written as signal-cli's ServerSentEventSender writes it: `id:`,
//! `event:receive`, one `data:` line, an empty line; `:` keep-alives between.
//!
//! [`FakeSignal::start_tcp`] is the `daemon --tcp` mode instead: newline-
//! delimited JSON-RPC, `receive` notifications pushed to every connection.
//!
//! The test pushes envelopes ([`FakeSignal::push`]), cuts the streams
//! ([`FakeSignal::drop_streams`]), forgets the ids as a restarted signal-cli
//! would ([`FakeSignal::restart`]), scripts JSON-RPC errors
//! ([`FakeSignal::fail_next`]) and reads the calls made.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::http::{read_request, write_response, Response};

#[derive(Default)]
struct Inner {
    /// Kept events: (id, data line).
    events: Vec<(u64, String)>,
    next_id: u64,
    /// The ids restart from here after a `restart` (old ids are unknown).
    epoch: u64,
    calls: Vec<Value>,
    fail: VecDeque<(String, i64, String)>,
    attachments: HashMap<String, Vec<u8>>,
    next_ts: i64,
    connections: usize,
}

/// A running fake; stops when dropped.
pub struct FakeSignal {
    port: u16,
    inner: Arc<Mutex<Inner>>,
    /// Bumped on a new event (wakes the streams) or a cut (closes them).
    wake: watch::Sender<(u64, u64)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeSignal {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeSignal {
    pub async fn start() -> FakeSignal {
        FakeSignal::start_mode(false).await
    }

    /// The `daemon --tcp` mode (`tcp://` endpoint: [`FakeSignal::tcp`]).
    pub async fn start_tcp() -> FakeSignal {
        FakeSignal::start_mode(true).await
    }

    async fn start_mode(tcp: bool) -> FakeSignal {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(Mutex::new(Inner { next_ts: 1_700_000_000_000, next_id: 1, ..Default::default() }));
        let (wake, _) = watch::channel((0, 0));
        let (i, w) = (inner.clone(), wake.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                match tcp {
                    true => tokio::spawn(serve_lines(stream, i.clone(), w.subscribe())),
                    false => tokio::spawn(serve(stream, i.clone(), w.clone())),
                };
            }
        });
        FakeSignal { port, inner, wake, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `tcp://127.0.0.1:PORT`.
    pub fn tcp(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// Push a `receive` event: `{"envelope": envelope, "account": account}` as its data.
    pub fn push(&self, envelope: Value) {
        self.push_raw(json!({"envelope": envelope, "account": "+4915100000000"}).to_string());
    }

    /// Push an event whose data line is `data` as it is (malformed, oversize).
    pub fn push_raw(&self, data: String) {
        let mut i = self.inner.lock().unwrap();
        let id = i.next_id;
        i.next_id += 1;
        i.events.push((id, data));
        drop(i);
        self.wake.send_modify(|(n, _)| *n += 1);
    }

    /// Close every open event stream (the daemon's connection drops).
    pub fn drop_streams(&self) {
        self.wake.send_modify(|(_, cut)| *cut += 1);
    }

    /// As if signal-cli restarted: its event ids are new (a `Last-Event-ID`
    /// is unknown, so a reconnect gets every kept event), and the streams close.
    pub fn restart(&self) {
        let mut i = self.inner.lock().unwrap();
        i.epoch += 1000;
        let epoch = i.epoch;
        for (n, (id, _)) in i.events.iter_mut().enumerate() {
            *id = epoch + n as u64 + 1;
        }
        i.next_id = epoch + i.events.len() as u64 + 1;
        drop(i);
        self.drop_streams();
    }

    /// The next call of `method` gets a JSON-RPC error.
    pub fn fail_next(&self, method: &str, code: i64, message: &str) {
        self.inner.lock().unwrap().fail.push_back((method.into(), code, message.into()));
    }

    pub fn add_attachment(&self, id: &str, data: Vec<u8>) {
        self.inner.lock().unwrap().attachments.insert(id.into(), data);
    }

    /// The JSON-RPC requests received, in order.
    pub fn calls(&self, method: &str) -> Vec<Value> {
        self.inner.lock().unwrap().calls.iter().filter(|c| c["method"] == method).cloned().collect()
    }

    /// The params of the successful `send` calls.
    pub fn sent(&self) -> Vec<Value> {
        self.calls("send").into_iter().filter(|c| c["ok"] == true).map(|c| c["params"].clone()).collect()
    }

    pub async fn wait_sent(&self, n: usize, secs: u64) -> bool {
        super::daemon::wait_until(secs, || self.sent().len() >= n).await
    }

    /// How many event streams were opened.
    pub fn connections(&self) -> usize {
        self.inner.lock().unwrap().connections
    }
}

async fn serve(stream: TcpStream, inner: Arc<Mutex<Inner>>, wake: watch::Sender<(u64, u64)>) {
    let _ = stream.set_nodelay(true);
    let mut stream = BufReader::new(stream);
    loop {
        let Ok(Some((req, keep_alive))) = read_request(&mut stream).await else { return };
        let resp = match (req.method.as_str(), req.path_only()) {
            ("GET", "/api/v1/check") => Response::new(200),
            ("GET", "/api/v1/events") => {
                let last = req.header("last-event-id").and_then(|v| v.parse::<u64>().ok());
                events(stream.into_inner(), inner, wake.subscribe(), last).await;
                return;
            }
            ("POST", "/api/v1/rpc") if !req.header("content-type").unwrap_or("").starts_with("application/json") => {
                Response::new(415)
            }
            ("POST", "/api/v1/rpc") => match req.json() {
                Some(r) => Response::json(200, &rpc(&inner, r)),
                None => Response::json(
                    200,
                    &json!({"jsonrpc":"2.0","error":{"code":-32700,"message":"parse error","data":null},"id":null}),
                ),
            },
            _ => Response::new(404),
        };
        if write_response(stream.get_mut(), &resp, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

/// One JSON-RPC request's answer (and its record).
fn rpc(inner: &Mutex<Inner>, req: Value) -> Value {
    let mut i = inner.lock().unwrap();
    let method = req["method"].as_str().unwrap_or_default().to_string();
    let id = req["id"].clone();
    let mut record = req.clone();
    if let Some(pos) = i.fail.iter().position(|(m, _, _)| *m == method) {
        let (_, code, message) = i.fail.remove(pos).unwrap();
        i.calls.push(record);
        return json!({"jsonrpc":"2.0","error":{"code":code,"message":message,"data":null},"id":id});
    }
    record["ok"] = json!(true);
    let result = match method.as_str() {
        "send" => {
            i.next_ts += 1000;
            record["timestamp"] = json!(i.next_ts);
            json!({"timestamp": i.next_ts, "results": []})
        }
        "sendTyping" | "version" => json!({}),
        "getAttachment" => {
            use base64::Engine as _;
            let a = req["params"]["id"].as_str().and_then(|a| i.attachments.get(a).cloned());
            match a {
                Some(data) => json!({"data": base64::engine::general_purpose::STANDARD.encode(data)}),
                None => {
                    i.calls.push(req.clone());
                    return json!({"jsonrpc":"2.0","error":{"code":-1,"message":"attachment not found"},"id":id});
                }
            }
        }
        _ => {
            i.calls.push(req.clone());
            return json!({"jsonrpc":"2.0","error":{"code":-32601,"message":"method not found"},"id":id});
        }
    };
    i.calls.push(record);
    json!({"jsonrpc":"2.0","result":result,"id":id})
}

/// An event stream: the kept events after `last` (all if `last` is
/// unknown, none without it), then new ones as they come, `:` keep-alives
/// in between, until a cut.
async fn events(
    mut stream: TcpStream,
    inner: Arc<Mutex<Inner>>,
    mut wake: watch::Receiver<(u64, u64)>,
    last: Option<u64>,
) {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let cut_at = wake.borrow().1;
    let mut cursor = {
        let mut i = inner.lock().unwrap();
        i.connections += 1;
        match last {
            Some(id) if i.events.iter().any(|(e, _)| *e == id) => id,
            Some(_) => 0,
            None => i.events.last().map_or(0, |(e, _)| *e),
        }
    };
    loop {
        let fresh: Vec<(u64, String)> =
            inner.lock().unwrap().events.iter().filter(|(e, _)| *e > cursor).cloned().collect();
        for (id, data) in fresh {
            let ev = format!("id:{id}\nevent:receive\ndata:{data}\n\n");
            if chunk(&mut stream, ev.as_bytes()).await.is_err() {
                return;
            }
            cursor = id;
        }
        tokio::select! {
            r = wake.changed() => if r.is_err() { return },
            // signal-cli's HttpServerHandler sends its keep-alive every 15 s.
            _ = tokio::time::sleep(Duration::from_secs(15)) => {
                if chunk(&mut stream, b":\n").await.is_err() { return; }
            }
        }
        if wake.borrow().1 != cut_at {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// A `--tcp` connection: requests answered line by line, and every new
/// event pushed as a `receive` notification.
async fn serve_lines(stream: TcpStream, inner: Arc<Mutex<Inner>>, mut wake: watch::Receiver<(u64, u64)>) {
    use tokio::io::AsyncBufReadExt;
    let (read, write) = stream.into_split();
    let write = Arc::new(tokio::sync::Mutex::new(write));
    let mut cursor = {
        let mut i = inner.lock().unwrap();
        i.connections += 1;
        i.events.last().map_or(0, |(e, _)| *e)
    };
    let (inner2, write2) = (inner.clone(), write.clone());
    let pusher = tokio::spawn(async move {
        loop {
            let fresh: Vec<(u64, String)> =
                inner2.lock().unwrap().events.iter().filter(|(e, _)| *e > cursor).cloned().collect();
            for (id, data) in fresh {
                let line = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"receive\",\"params\":{data}}}\n");
                if write2.lock().await.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
                cursor = id;
            }
            if wake.changed().await.is_err() {
                return;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(req) = serde_json::from_str::<Value>(&line) else { continue };
        let mut answer = rpc(&inner, req).to_string();
        answer.push('\n');
        if write.lock().await.write_all(answer.as_bytes()).await.is_err() {
            break;
        }
    }
    pusher.abort();
}

async fn chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    stream.write_all(format!("{:x}\r\n", data.len()).as_bytes()).await?;
    stream.write_all(data).await?;
    stream.write_all(b"\r\n").await?;
    stream.flush().await
}

/// An envelope of a text message from `number` / `uuid` at `timestamp`.
pub fn text_envelope(number: &str, uuid: &str, timestamp: i64, text: &str) -> Value {
    json!({
        "source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceName": "someone",
        "sourceDevice": 1, "timestamp": timestamp, "serverReceivedTimestamp": timestamp + 5,
        "serverDeliveredTimestamp": timestamp + 6,
        "dataMessage": {"timestamp": timestamp, "message": text, "expiresInSeconds": 0, "viewOnce": false,
                        "mentions": [], "attachments": [], "contacts": []}
    })
}

/// A reaction `emoji` by `number` / `uuid` on our message sent at `target_ts`.
pub fn reaction_envelope(number: &str, uuid: &str, timestamp: i64, emoji: &str, target_ts: i64) -> Value {
    json!({
        "source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceDevice": 1, "timestamp": timestamp,
        "dataMessage": {"timestamp": timestamp, "message": null, "reaction": {
            "emoji": emoji, "targetAuthor": "+4915100000000", "targetAuthorNumber": "+4915100000000",
            "targetAuthorUuid": "11111111-1111-4111-8111-111111111111", "targetSentTimestamp": target_ts,
            "isRemove": false}}
    })
}
