//! A fake ntfy server on 127.0.0.1, built from ntfy's published docs (the
//! server is a Go binary in no package repository this machine or CI has):
//!
//! - <https://docs.ntfy.sh/publish/>: "Publish as JSON" (`POST /` with
//!   `{topic, message, title, priority, tags, click, attach, filename,
//!   actions}`), a plain publish (`POST /<topic>`, the body is the message,
//!   `X-Tags` header), "Attach local file" (`PUT /<topic>?filename=…`, the
//!   body is the file), each answered with the message as JSON; "Access
//!   tokens" (`Authorization: Bearer tk_…`, else `401`).
//! - <https://docs.ntfy.sh/subscribe/api/>: `GET /<topic>[,<topic>…]/json`
//!   streams one JSON object a line: an `open` event, then with
//!   `since=<id>` the cached messages after that id, then new ones as they
//!   are published, for as long as the connection stays open, with a
//!   `keepalive` event every 45 s.
//!
//! The test drives it: failing publishes with a status, dropping every open
//! stream, writing raw lines (oversize, malformed), redirecting everything.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

use super::http::{read_request, write_response, Request, Response};

#[derive(Default)]
struct State {
    /// Every request, in order.
    requests: Vec<Request>,
    /// Every message published, in order (the cache).
    messages: Vec<Value>,
    /// Statuses to answer the next publishes with.
    fail: Vec<u16>,
    /// Answer everything with `307` to this URL.
    redirect: Option<String>,
    next_id: u64,
}

pub struct FakeNtfy {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
    /// A line for the open streams (`None`: close them).
    lines: broadcast::Sender<Option<String>>,
    token: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeNtfy {
    /// A server that wants `token` (or none).
    pub async fn start(token: Option<&str>) -> FakeNtfy {
        bramble::install_crypto(); // the test side's reqwest (the phone)
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state: Arc<Mutex<State>> = Arc::default();
        let (lines, _) = broadcast::channel(256);
        let token = token.map(str::to_string);
        let (st, tx, tok) = (state.clone(), lines.clone(), token.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (st, tx, tok) = (st.clone(), tx.clone(), tok.clone());
                tokio::spawn(async move { serve(stream, st, tx, tok).await });
            }
        });
        FakeNtfy { addr, state, lines, token, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The publishes (JSON bodies, or the upload's query and size), in order.
    pub fn published(&self) -> Vec<Value> {
        self.state.lock().unwrap().messages.clone()
    }

    /// The `since` of every subscription, in order (`None`: from now).
    pub fn subscriptions(&self) -> Vec<(String, Option<String>)> {
        self.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path_only().ends_with("/json"))
            .map(|r| (r.path_only().to_string(), query(&r.path, "since")))
            .collect()
    }

    /// Answer the next publishes with these statuses.
    pub fn fail_next(&self, statuses: &[u16]) {
        self.state.lock().unwrap().fail.extend_from_slice(statuses);
    }

    pub fn redirect_to(&self, url: &str) {
        self.state.lock().unwrap().redirect = Some(url.to_string());
    }

    /// Close every open stream.
    pub fn drop_streams(&self) {
        let _ = self.lines.send(None);
    }

    /// Write a raw line to the open streams.
    pub fn raw_line(&self, line: &str) {
        let _ = self.lines.send(Some(line.to_string()));
    }

    /// Publish as the ntfy app does: a plain `POST /<topic>` with the token.
    pub async fn type_in_app(&self, topic: &str, text: &str) -> Value {
        let client = reqwest::Client::new();
        let mut req = client.post(format!("{}/{topic}", self.url())).body(text.to_string());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("publish").json().await.expect("json")
    }
}

impl Drop for FakeNtfy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = self.lines.send(None);
    }
}

/// A query parameter, percent-decoded.
pub fn query(path: &str, name: &str) -> Option<String> {
    let q = path.split_once('?')?.1;
    let url = reqwest::Url::parse(&format!("http://x/?{q}")).ok()?;
    url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

async fn serve(
    stream: TcpStream,
    state: Arc<Mutex<State>>,
    lines: broadcast::Sender<Option<String>>,
    token: Option<String>,
) {
    let mut stream = BufReader::new(stream);
    while let Ok(Some((req, keep_alive))) = read_request(&mut stream).await {
        state.lock().unwrap().requests.push(req.clone());
        let redirect = state.lock().unwrap().redirect.clone();
        if let Some(to) = redirect {
            let r = Response::new(307).header("location", format!("{to}{}", req.path));
            let _ = write_response(stream.get_mut(), &r, false).await;
            return;
        }
        let authed = match &token {
            None => true,
            Some(t) => req.header("authorization") == Some(&format!("Bearer {t}")),
        };
        if !authed {
            let r = Response::json(401, &json!({"code": 40101, "http": 401, "error": "unauthorized"}));
            let _ = write_response(stream.get_mut(), &r, keep_alive).await;
            continue;
        }
        if req.method == "GET" && req.path_only().ends_with("/json") {
            let rx = lines.subscribe();
            stream_topics(stream.get_mut(), &req, &state, rx).await;
            return;
        }
        let resp = publish(&req, &state, &lines);
        if write_response(stream.get_mut(), &resp, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

/// A publish: JSON to `/`, text to `/<topic>`, a file by PUT.
fn publish(req: &Request, state: &Mutex<State>, lines: &broadcast::Sender<Option<String>>) -> Response {
    let mut st = state.lock().unwrap();
    if !st.fail.is_empty() {
        let status = st.fail.remove(0);
        return Response::json(status, &json!({"http": status, "error": "failing on purpose"}));
    }
    st.next_id += 1;
    let id = format!("m{:04}", st.next_id);
    let topic = req.path_only().trim_start_matches('/').to_string();
    let mut msg = match (req.method.as_str(), topic.is_empty()) {
        ("POST", true) => match req.json() {
            Some(v) if v["topic"].is_string() => v,
            _ => return Response::json(400, &json!({"http": 400, "error": "invalid request: JSON"})),
        },
        ("POST", false) => {
            let tags: Vec<String> =
                req.header("x-tags").map(|t| t.split(',').map(str::to_string).collect()).unwrap_or_default();
            json!({"topic": topic, "message": req.text(), "tags": tags})
        }
        ("PUT", false) => {
            let mut v =
                json!({"topic": topic, "attachment": {"name": query(&req.path, "filename"), "size": req.body.len()}});
            for k in ["message", "title", "priority", "tags", "click", "actions"] {
                if let Some(q) = query(&req.path, k) {
                    v[k] = json!(q);
                }
            }
            v["upload"] = json!(req.body.len());
            v
        }
        _ => return Response::json(404, &json!({"http": 404, "error": "page not found"})),
    };
    msg["id"] = json!(id);
    msg["event"] = json!("message");
    msg["time"] = json!(1_700_000_000 + st.next_id);
    st.messages.push(msg.clone());
    drop(st);
    let _ = lines.send(Some(msg.to_string()));
    Response::json(200, &msg)
}

/// The JSON stream: `open`, the cache after `since`, then new lines until dropped.
async fn stream_topics(
    out: &mut TcpStream,
    req: &Request,
    state: &Mutex<State>,
    mut rx: broadcast::Receiver<Option<String>>,
) {
    let path = req.path_only().trim_start_matches('/').trim_end_matches("/json").to_string();
    let topics: Vec<String> = path.split(',').map(str::to_string).collect();
    let since = query(&req.path, "since");
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson; charset=utf-8\r\nconnection: close\r\n\r\n";
    let mut text = format!("{}\n", json!({"id": "open1", "time": 1, "event": "open", "topic": path}));
    {
        let st = state.lock().unwrap();
        if let Some(since) = since {
            let after = st.messages.iter().position(|m| m["id"] == since.as_str()).map_or(st.messages.len(), |i| i + 1);
            for m in &st.messages[after..] {
                if topics.iter().any(|t| m["topic"] == t.as_str()) {
                    text.push_str(&format!("{m}\n"));
                }
            }
        }
    }
    if out.write_all(format!("{head}{text}").as_bytes()).await.is_err() {
        return;
    }
    loop {
        // ntfy's server sends a `keepalive` event every 45 s (its default
        // `keepalive-interval`; "Subscribe API", "JSON message format").
        let line = tokio::select! {
            r = rx.recv() => match r {
                Ok(line) => line,
                Err(_) => return,
            },
            () = tokio::time::sleep(std::time::Duration::from_secs(45)) => {
                Some(json!({"id": "keep1", "time": 2, "event": "keepalive", "topic": path}).to_string())
            }
        };
        let Some(line) = line else { return };
        let ours = match serde_json::from_str::<Value>(&line) {
            Ok(v) if v["topic"].is_string() => topics.iter().any(|t| v["topic"] == t.as_str()),
            _ => true, // raw lines go to every stream
        };
        if ours && out.write_all(format!("{line}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}
