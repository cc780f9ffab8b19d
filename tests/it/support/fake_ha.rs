//! A fake Home Assistant on 127.0.0.1, built from HA's published wire
//! format (developers.home-assistant.io: "REST API" and "WebSocket API"), not
//! from bramble's code: HA itself is far too heavy for a test.
//!
//! One port, as HA's 8123:
//! - REST: `GET /api/` (`{"message": "API running."}`), `POST /api/services/<domain>/<service>` (answers the list of
//!   states it changed: `turn_on` → `on`, `turn_off` → `off`), `GET
//!   /api/states/<entity_id>` (404 `{"message":"Entity not found."}`), and
//!   401 for a wrong `Authorization: Bearer`. `fail_next` scripts statuses.
//! - WebSocket: `GET /api/websocket` upgraded by a real RFC 6455 server
//!   (`Sec-WebSocket-Accept` = base64(SHA-1(key + GUID)), frames parsed
//!   here, client frames *must* be masked — an unmasked one is a protocol
//!   error, as in RFC 6455 §5.1). The HA protocol on it: `auth_required` →
//!   `auth` → `auth_ok` or `auth_invalid` (then the server closes), then
//!   `subscribe_events` → `result`, `ping` → `pong`, and `event` messages
//!   from [`FakeHa::state_changed`]. It can also send control-frame pings,
//!   fragment its messages with a ping between the fragments, send a very
//!   large `result`, and drop every socket at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::http::{read_request, write_response, Request, Response};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// What the fake's WebSocket side has seen.
#[derive(Debug, Default, Clone)]
pub struct WsStats {
    pub upgrades: usize,
    pub auth_ok: usize,
    pub auth_invalid: usize,
    pub subscriptions: usize,
    /// Control-frame pongs received (answers to our pings).
    pub pongs: usize,
    /// `{"type":"ping"}` messages received.
    pub app_pings: usize,
    /// Client frames that broke RFC 6455 (unmasked, bad opcode).
    pub protocol_errors: Vec<String>,
    /// Close frames received from the client.
    pub closes: usize,
}

enum Out {
    Text(String),
    /// A text message in fragments of `n` bytes, with a ping between the first two.
    Fragmented(String, usize),
    Ping(Vec<u8>),
    /// Drop the TCP connection without a close frame.
    Drop,
}

struct Socket {
    tx: mpsc::Sender<Out>,
    /// The `id` of its `subscribe_events` (events are sent with it).
    subscription: Option<u64>,
}

#[derive(Default)]
struct State {
    calls: Vec<Request>,
    states: std::collections::HashMap<String, Value>,
    fail_next: VecDeque<u16>,
    /// Answers that quote the request's headers back (a proxy's debug page, a verbose error).
    echo_next: VecDeque<Echo>,
    sockets: Vec<Socket>,
    ws: WsStats,
    /// Fragment every event into pieces of this many bytes.
    fragment: Option<usize>,
}

/// How an error quotes the request back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// HA's own shape, `{"message": "…"}`, quoting the headers as a dict.
    Json,
    /// A proxy's plain-text page, the request's head line by line.
    Text,
}

pub struct FakeHa {
    addr: SocketAddr,
    task: JoinHandle<()>,
    state: Arc<Mutex<State>>,
    pub token: String,
}

impl FakeHa {
    pub async fn start(token: &str) -> FakeHa {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State::default()));
        let (st, tok) = (state.clone(), token.to_string());
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    Ok((stream, _)) = listener.accept() => {
                        let _ = stream.set_nodelay(true);
                        connections.spawn(serve(stream, st.clone(), tok.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        FakeHa { addr, task, state, token: token.to_string() }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_state(&self, entity: &str, state: &str, attributes: Value) {
        let v = json!({"entity_id": entity, "state": state, "attributes": attributes,
                       "last_changed": "2026-11-23T20:00:00+00:00", "last_updated": "2026-11-23T20:00:00+00:00"});
        self.state.lock().unwrap().states.insert(entity.to_string(), v);
    }

    /// Answer the next REST requests with these statuses.
    pub fn fail_next(&self, statuses: &[u16]) {
        self.state.lock().unwrap().fail_next.extend(statuses);
    }

    /// Answer the next REST requests with a 400 (JSON) or a 502 (text) that quotes the request's headers.
    pub fn echo_next(&self, echoes: &[Echo]) {
        self.state.lock().unwrap().echo_next.extend(echoes);
    }

    /// The REST requests received.
    pub fn calls(&self) -> Vec<Request> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn ws(&self) -> WsStats {
        self.state.lock().unwrap().ws.clone()
    }

    /// Sockets that are authenticated and subscribed.
    pub fn subscribed(&self) -> usize {
        self.state.lock().unwrap().sockets.iter().filter(|s| s.subscription.is_some() && !s.tx.is_closed()).count()
    }

    /// Send events in fragments of `n` bytes from now on (a ping between the first two).
    pub fn fragment_events(&self, n: Option<usize>) {
        self.state.lock().unwrap().fragment = n;
    }

    /// A `state_changed` event to every subscribed socket; the entity's state is updated.
    pub fn state_changed(&self, entity: &str, old: &str, new: &str, attributes: Value) {
        let now = jiff::Timestamp::now().to_string();
        let old_state = json!({"entity_id": entity, "state": old, "attributes": attributes, "last_changed": now});
        let new_state = json!({"entity_id": entity, "state": new, "attributes": attributes, "last_changed": now});
        self.set_state(entity, new, attributes.clone());
        let st = self.state.lock().unwrap();
        let fragment = st.fragment;
        for s in st.sockets.iter().filter(|s| s.subscription.is_some()) {
            let msg = json!({"id": s.subscription, "type": "event", "event": {
                "event_type": "state_changed",
                "data": {"entity_id": entity, "old_state": old_state, "new_state": new_state},
                "origin": "LOCAL", "time_fired": now, "context": {"id": "01J", "parent_id": null, "user_id": null}
            }})
            .to_string();
            let out = match fragment {
                Some(n) => Out::Fragmented(msg, n),
                None => Out::Text(msg),
            };
            let _ = s.tx.try_send(out);
        }
    }

    /// A large message (a `result` for an id never asked): `bytes` long.
    pub fn send_big(&self, bytes: usize) {
        let pad = "x".repeat(bytes.saturating_sub(60));
        let msg = json!({"id": 999_999, "type": "result", "success": true, "result": pad}).to_string();
        for s in &self.state.lock().unwrap().sockets {
            let _ = s.tx.try_send(Out::Text(msg.clone()));
        }
    }

    /// A control-frame ping to every socket.
    pub fn ping(&self) {
        for s in &self.state.lock().unwrap().sockets {
            let _ = s.tx.try_send(Out::Ping(b"hb".to_vec()));
        }
    }

    /// Drop every WebSocket connection (no close frame): a restart or a network cut.
    pub fn drop_sockets(&self) {
        for s in self.state.lock().unwrap().sockets.drain(..) {
            let _ = s.tx.try_send(Out::Drop);
        }
    }
}

impl Drop for FakeHa {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>, token: String) {
    let mut stream = BufReader::new(stream);
    loop {
        let Ok(Some((req, keep_alive))) = read_request(&mut stream).await else { return };
        if req.path_only() == "/api/websocket" {
            return websocket(stream, req, state, token).await;
        }
        let resp = rest(&req, &state, &token);
        state.lock().unwrap().calls.push(req);
        if write_response(stream.get_mut(), &resp, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

fn rest(req: &Request, state: &Mutex<State>, token: &str) -> Response {
    if req.header("authorization") != Some(&format!("Bearer {token}")) {
        return Response::text(401, "401: Unauthorized");
    }
    let mut st = state.lock().unwrap();
    if let Some(status) = st.fail_next.pop_front() {
        return Response::json(status, &json!({"message": format!("scripted {status}")}));
    }
    if let Some(echo) = st.echo_next.pop_front() {
        let head: Vec<String> = req.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        return match echo {
            Echo::Json => {
                let dict: Vec<String> = req.headers.iter().map(|(k, v)| format!("'{k}': '{v}'")).collect();
                let message = format!("Invalid request, headers: {{{}}}", dict.join(", "));
                Response::json(400, &json!({ "message": message }))
            }
            Echo::Text => {
                Response::text(502, format!("502 Bad Gateway\n{} {}\n{}\n", req.method, req.path, head.join("\n")))
            }
        };
    }
    let path = req.path_only().to_string();
    if path == "/api/" && req.method == "GET" {
        return Response::json(200, &json!({"message": "API running."}));
    }
    if let (Some(rest), "POST") = (path.strip_prefix("/api/services/"), req.method.as_str()) {
        let Some((_domain, service)) = rest.split_once('/') else { return Response::new(404) };
        let body = req.json().unwrap_or(json!({}));
        let ids: Vec<String> = match &body["entity_id"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            _ => vec![],
        };
        let mut changed = Vec::new();
        for id in ids {
            let new = match service {
                "turn_on" => "on",
                "turn_off" => "off",
                _ => continue,
            };
            let v =
                json!({"entity_id": id, "state": new, "attributes": {}, "last_changed": "2026-11-23T20:00:00+00:00"});
            st.states.insert(id, v.clone());
            changed.push(v);
        }
        return Response::json(200, &Value::Array(changed));
    }
    if let (Some(id), "GET") = (path.strip_prefix("/api/states/"), req.method.as_str()) {
        return match st.states.get(id) {
            Some(v) => Response::json(200, v),
            None => Response::json(404, &json!({"message": "Entity not found."})),
        };
    }
    Response::json(404, &json!({"message": "Not found"}))
}

async fn websocket(mut stream: BufReader<TcpStream>, req: Request, state: Arc<Mutex<State>>, token: String) {
    let upgrade = req.header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = req.header("sec-websocket-key").filter(|_| upgrade) else {
        let _ = write_response(stream.get_mut(), &Response::text(400, "Can \"Upgrade\" only to \"WebSocket\"."), false)
            .await;
        return;
    };
    use base64::Engine as _;
    let accept =
        base64::engine::general_purpose::STANDARD.encode(bramble::util::sha1::sha1(format!("{key}{GUID}").as_bytes()));
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.get_mut().write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let (tx, mut rx) = mpsc::channel::<Out>(64);
    let index = {
        let mut st = state.lock().unwrap();
        st.ws.upgrades += 1;
        st.sockets.push(Socket { tx: tx.clone(), subscription: None });
        st.sockets.len() - 1
    };
    let _ = tx.try_send(Out::Text(json!({"type": "auth_required", "ha_version": "2026.11.0"}).to_string()));
    let (mut reader, mut writer) = tokio::io::split(stream);
    // `Drop` ends the writer; the reader must go too, or the TCP connection stays open.
    let dropped = Arc::new(tokio::sync::Notify::new());
    let drop_signal = dropped.clone();
    let writer_task = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let bytes = match out {
                Out::Text(t) => frame(true, 0x1, t.as_bytes()),
                Out::Ping(p) => frame(true, 0x9, &p),
                Out::Fragmented(t, n) => {
                    let chunks: Vec<&[u8]> = t.as_bytes().chunks(n.max(1)).collect();
                    let mut bytes = Vec::new();
                    for (i, c) in chunks.iter().enumerate() {
                        let opcode = if i == 0 { 0x1 } else { 0x0 };
                        bytes.extend(frame(i == chunks.len() - 1, opcode, c));
                        if i == 0 {
                            bytes.extend(frame(true, 0x9, b"mid")); // a control frame between fragments
                        }
                    }
                    bytes
                }
                Out::Drop => {
                    drop_signal.notify_one();
                    return;
                }
            };
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut authed = false;
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut reader, &state) => f,
            _ = dropped.notified() => None,
        };
        let Some((opcode, payload)) = frame else { break };
        match opcode {
            0x1 => {
                let Ok(msg) = serde_json::from_slice::<Value>(&payload) else { continue };
                let id = msg["id"].as_u64();
                match (authed, msg["type"].as_str()) {
                    (false, Some("auth")) if msg["access_token"] == token.as_str() => {
                        authed = true;
                        state.lock().unwrap().ws.auth_ok += 1;
                        let _ =
                            tx.send(Out::Text(json!({"type": "auth_ok", "ha_version": "2026.11.0"}).to_string())).await;
                    }
                    (false, _) => {
                        state.lock().unwrap().ws.auth_invalid += 1;
                        let m = json!({"type": "auth_invalid", "message": "Invalid access token or password"});
                        let _ = tx.send(Out::Text(m.to_string())).await;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        break;
                    }
                    (true, Some("subscribe_events")) => {
                        let mut st = state.lock().unwrap();
                        st.ws.subscriptions += 1;
                        if let Some(s) = st.sockets.get_mut(index).filter(|s| s.tx.same_channel(&tx)) {
                            s.subscription = id;
                        } else if let Some(s) = st.sockets.iter_mut().find(|s| s.tx.same_channel(&tx)) {
                            s.subscription = id;
                        }
                        let _ = tx.try_send(Out::Text(
                            json!({"id": id, "type": "result", "success": true, "result": null}).to_string(),
                        ));
                    }
                    (true, Some("ping")) => {
                        state.lock().unwrap().ws.app_pings += 1;
                        let _ = tx.try_send(Out::Text(json!({"id": id, "type": "pong"}).to_string()));
                    }
                    (true, _) => {
                        let m = json!({"id": id, "type": "result", "success": false, "error": {"code": "unknown_command", "message": "Unknown command."}});
                        let _ = tx.try_send(Out::Text(m.to_string()));
                    }
                }
            }
            0x8 => {
                state.lock().unwrap().ws.closes += 1;
                break;
            }
            0xA => state.lock().unwrap().ws.pongs += 1,
            _ => {}
        }
    }
    state.lock().unwrap().sockets.retain(|s| !s.tx.same_channel(&tx));
    drop(tx);
    writer_task.abort();
}

/// One frame as a server writes it: never masked.
fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xFFFF => {
            out.push(126);
            out.extend((n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend((n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// One whole message (fragments joined) from the client: (opcode, payload).
/// Control frames come back on their own. `None` on EOF or a protocol error.
async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R, state: &Mutex<State>) -> Option<(u8, Vec<u8>)> {
    let mut message: Option<(u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 2];
        r.read_exact(&mut head).await.ok()?;
        let (fin, opcode, masked) = (head[0] & 0x80 != 0, head[0] & 0x0F, head[1] & 0x80 != 0);
        let len = match head[1] & 0x7F {
            126 => {
                let mut b = [0u8; 2];
                r.read_exact(&mut b).await.ok()?;
                u16::from_be_bytes(b) as usize
            }
            127 => {
                let mut b = [0u8; 8];
                r.read_exact(&mut b).await.ok()?;
                u64::from_be_bytes(b) as usize
            }
            n => n as usize,
        };
        if !masked {
            state.lock().unwrap().ws.protocol_errors.push(format!("unmasked client frame (opcode {opcode})"));
            return None;
        }
        let mut mask = [0u8; 4];
        r.read_exact(&mut mask).await.ok()?;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.ok()?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            0x8..=0xA => return Some((opcode, payload)),
            0x1 | 0x2 if message.is_none() => message = Some((opcode, payload)),
            0x0 if message.is_some() => message.as_mut()?.1.extend(payload),
            _ => {
                state.lock().unwrap().ws.protocol_errors.push(format!("unexpected opcode {opcode}"));
                return None;
            }
        }
        if fin {
            return message;
        }
    }
}
