//! A fake Discord on 127.0.0.1: the gateway over a real RFC 6455 WebSocket
//! and the REST API v10, both on one port.
//!
//! Built from Discord's published developer documentation:
//! - "Gateway" (https://discord.com/developers/docs/events/gateway):
//!   Hello with `heartbeat_interval`, Identify, Heartbeat / Heartbeat ACK,
//!   Resume with `session_id` and `seq` on `resume_gateway_url` (missed
//!   dispatches replayed, then RESUMED), Reconnect, Invalid Session;
//!   "Gateway Events" for READY, MESSAGE_CREATE and INTERACTION_CREATE;
//!   "Opcodes and Status Codes" for close code 4004 (authentication failed).
//! - "Message" resource: `POST /channels/{id}/messages` (JSON, or
//!   `multipart/form-data` with `payload_json` and `files[n]`), `PATCH` /
//!   `DELETE` of a message, `POST /channels/{id}/typing`.
//! - "Receiving and Responding" (interactions): `POST
//!   /interactions/{id}/{token}/callback`.
//! - "Rate Limits": `X-RateLimit-*` headers on every answer; a 429 with
//!   `{"message", "retry_after", "global"}` when scripted.
//! - "User" (`GET /users/@me`) and "Get Gateway Bot" (`GET /gateway/bot`).
//!
//! A wrong `Authorization: Bot <token>` gets 401 (REST) or close 4004 (gateway).
//! Every dispatch is kept in the session's log with its sequence number, so a
//! Resume replays exactly what came after the sequence the client names.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::http::{read_request, write_response, Multipart, Request, Response};

pub const BOT_ID: u64 = 1_000_000_000_000_001;
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A message the bot posted (or edited).
#[derive(Debug, Clone)]
pub struct Posted {
    pub id: u64,
    pub channel: u64,
    pub body: Value,
    /// The file's name and bytes, for a multipart post.
    pub file: Option<(String, Vec<u8>)>,
}

/// What the gateway saw.
#[derive(Debug, Clone, Default)]
pub struct GatewayStats {
    pub connections: usize,
    pub identifies: usize,
    /// (session id, seq) of each Resume.
    pub resumes: Vec<(String, Option<u64>)>,
    pub heartbeats: usize,
    /// The request paths of the upgrades (`/gateway`, `/resume`).
    pub paths: Vec<String>,
}

enum Out {
    Text(String),
    Raw(Vec<u8>),
    Close(u16),
    Drop,
}

#[derive(Default)]
struct State {
    token: String,
    session: Option<String>,
    sessions: u64,
    /// The session's dispatches, with their `s`.
    log: Vec<Value>,
    seq: u64,
    socket: Option<mpsc::Sender<Out>>,
    ready: bool,
    stats: GatewayStats,
    interval: u64,
    ack: bool,
    calls: Vec<Request>,
    posted: Vec<Posted>,
    next_id: u64,
    /// Scripted answers for the next message posts: 429 (retry_after seconds) or a redirect.
    script: VecDeque<Scripted>,
}

#[derive(Debug, Clone)]
pub enum Scripted {
    RateLimited(f64),
    Redirect(String),
    Status(u16),
}

pub struct FakeDiscord {
    addr: SocketAddr,
    task: JoinHandle<()>,
    state: Arc<Mutex<State>>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeDiscord {
    pub async fn start(token: &str) -> FakeDiscord {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            token: token.into(),
            interval: 41_250,
            ack: true,
            next_id: 5_000_000_000_000_000,
            ..Default::default()
        }));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, st.clone(), addr));
            }
        });
        FakeDiscord { addr, task, state }
    }

    /// The REST base for `[discord] api_base`.
    pub fn api_base(&self) -> String {
        format!("http://{}/api/v10", self.addr)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next Hello's interval (ms), and whether heartbeats are acknowledged.
    pub fn heartbeats(&self, interval_ms: u64, ack: bool) {
        let mut st = self.state.lock().unwrap();
        st.interval = interval_ms;
        st.ack = ack;
    }

    pub fn stats(&self) -> GatewayStats {
        self.state.lock().unwrap().stats.clone()
    }

    pub fn posted(&self) -> Vec<Posted> {
        self.state.lock().unwrap().posted.clone()
    }

    pub fn calls(&self) -> Vec<Request> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn script(&self, s: Scripted) {
        self.state.lock().unwrap().script.push_back(s);
    }

    /// The last sequence number dispatched.
    pub fn seq(&self) -> u64 {
        self.state.lock().unwrap().seq
    }

    /// A dispatch: logged with the next sequence, sent if a session is live.
    pub fn dispatch(&self, t: &str, d: Value) -> u64 {
        let mut st = self.state.lock().unwrap();
        st.seq += 1;
        let event = json!({"op": 0, "t": t, "s": st.seq, "d": d});
        st.log.push(event.clone());
        if let (true, Some(tx)) = (st.ready, &st.socket) {
            let _ = tx.try_send(Out::Text(event.to_string()));
        }
        st.seq
    }

    /// A user's message (a DM when `guild` is `None`).
    pub fn message(&self, channel: u64, guild: Option<u64>, author: u64, bot: bool, content: &str) -> u64 {
        let id = self.new_id();
        let mut d = json!({
            "id": id.to_string(), "channel_id": channel.to_string(), "type": 0, "content": content,
            "author": {"id": author.to_string(), "username": format!("user{author}"), "bot": bot},
            "attachments": [], "timestamp": "2026-11-27T03:00:00.000000+00:00",
        });
        if let Some(g) = guild {
            d["guild_id"] = json!(g.to_string());
        }
        self.dispatch("MESSAGE_CREATE", d);
        id
    }

    /// A button press on message `message` by `user` in a DM channel.
    pub fn press(&self, channel: u64, user: u64, custom_id: &str, message: &Posted) -> u64 {
        let id = self.new_id();
        let content = message.body["content"].clone();
        self.dispatch(
            "INTERACTION_CREATE",
            json!({"id": id.to_string(), "application_id": BOT_ID.to_string(), "type": 3,
                   "token": format!("itok{id}"), "channel_id": channel.to_string(),
                   "user": {"id": user.to_string()},
                   "data": {"custom_id": custom_id, "component_type": 2},
                   "message": {"id": message.id.to_string(), "content": content}}),
        );
        id
    }

    /// Raw text on the live socket (malformed payloads).
    pub fn send_raw(&self, text: &str) {
        if let Some(tx) = &self.state.lock().unwrap().socket {
            let _ = tx.try_send(Out::Text(text.to_string()));
        }
    }

    /// One text frame announcing `len` bytes (over any sane cap), header only.
    pub fn send_oversize(&self, len: u64) {
        let mut frame = vec![0x81, 127];
        frame.extend(len.to_be_bytes());
        frame.extend(b"{\"op\":0");
        if let Some(tx) = &self.state.lock().unwrap().socket {
            let _ = tx.try_send(Out::Raw(frame));
        }
    }

    /// Drop the TCP connection without a close frame (a NAT timeout).
    pub fn drop_socket(&self) {
        let mut st = self.state.lock().unwrap();
        st.ready = false;
        if let Some(tx) = st.socket.take() {
            let _ = tx.try_send(Out::Drop);
        }
    }

    /// op 9 Invalid Session, not resumable: the session is forgotten.
    pub fn invalidate(&self) {
        let mut st = self.state.lock().unwrap();
        st.session = None;
        st.ready = false;
        if let Some(tx) = &st.socket {
            let _ = tx.try_send(Out::Text(json!({"op": 9, "d": false}).to_string()));
        }
    }

    /// op 7 Reconnect.
    pub fn reconnect(&self) {
        if let Some(tx) = &self.state.lock().unwrap().socket {
            let _ = tx.try_send(Out::Text(json!({"op": 7, "d": null}).to_string()));
        }
    }

    fn new_id(&self) -> u64 {
        let mut st = self.state.lock().unwrap();
        st.next_id += 1;
        st.next_id
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>, addr: SocketAddr) {
    let mut stream = BufReader::new(stream);
    loop {
        let Ok(Some((req, keep_alive))) = read_request(&mut stream).await else { return };
        if req.header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
            return gateway(stream, req, state, addr).await;
        }
        let resp = rest(&req, &state, addr);
        state.lock().unwrap().calls.push(req);
        if write_response(stream.get_mut(), &resp, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

fn limits(resp: Response) -> Response {
    resp.header("x-ratelimit-limit", "5")
        .header("x-ratelimit-remaining", "4")
        .header("x-ratelimit-reset-after", "1.0")
        .header("x-ratelimit-bucket", "fake")
}

fn rest(req: &Request, state: &Mutex<State>, addr: SocketAddr) -> Response {
    let path = req.path_only().to_string();
    if let Some(file) = path.strip_prefix("/attachments/") {
        return Response::new(200).header("content-type", "text/plain").body(format!("contents of {file}"));
    }
    let Some(path) = path.strip_prefix("/api/v10") else {
        return Response::json(404, &json!({"message": "404: Not Found", "code": 0}));
    };
    let mut st = state.lock().unwrap();
    if req.header("authorization") != Some(&format!("Bot {}", st.token)) {
        return Response::json(401, &json!({"message": "401: Unauthorized", "code": 0}));
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method.as_str(), parts.as_slice()) {
        ("GET", ["users", "@me"]) => {
            limits(Response::json(200, &json!({"id": BOT_ID.to_string(), "username": "bramble", "bot": true})))
        }
        ("GET", ["gateway", "bot"]) => Response::json(
            200,
            &json!({"url": format!("ws://{addr}/gateway"), "shards": 1,
                    "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}}),
        ),
        ("POST", ["channels", channel, "messages"]) => {
            match st.script.pop_front() {
                Some(Scripted::RateLimited(secs)) => {
                    return Response::json(
                        429,
                        &json!({"message": "You are being rate limited.", "retry_after": secs, "global": false}),
                    )
                    .header("retry-after", format!("{}", secs.ceil() as u64))
                    .header("x-ratelimit-remaining", "0")
                    .header("x-ratelimit-reset-after", format!("{secs}"));
                }
                Some(Scripted::Redirect(to)) => return Response::new(307).header("location", to),
                Some(Scripted::Status(s)) => return Response::json(s, &json!({"message": "scripted", "code": 0})),
                None => {}
            }
            let Ok(channel) = channel.parse::<u64>() else {
                return Response::json(404, &json!({"message": "Unknown Channel", "code": 10003}));
            };
            let (body, file) = match req.header("content-type") {
                Some(ct) if ct.starts_with("multipart/form-data") => {
                    let Some(form) = Multipart::parse(ct, &req.body) else {
                        return Response::json(400, &json!({"message": "bad form"}));
                    };
                    let body: Value =
                        form.text("payload_json").and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default();
                    let file = form.part("files[0]").map(|p| (p.file_name.clone().unwrap_or_default(), p.data.clone()));
                    (body, file)
                }
                _ => (req.json().unwrap_or_default(), None),
            };
            if body["content"].as_str().is_some_and(|c| c.chars().count() > 2000) {
                return Response::json(400, &json!({"message": "Invalid Form Body", "code": 50035}));
            }
            st.next_id += 1;
            let id = st.next_id;
            st.posted.push(Posted { id, channel, body: body.clone(), file });
            limits(Response::json(
                200,
                &json!({"id": id.to_string(), "channel_id": channel.to_string(), "content": body["content"]}),
            ))
        }
        ("PATCH", ["channels", _, "messages", id]) => {
            let body = req.json().unwrap_or_default();
            if let Some(p) = st.posted.iter_mut().find(|p| p.id.to_string() == *id) {
                p.body["content"] = body["content"].clone();
            }
            limits(Response::json(200, &json!({"id": id})))
        }
        ("DELETE", ["channels", _, "messages", _]) => Response::new(204),
        ("POST", ["channels", _, "typing"]) => Response::new(204),
        ("POST", ["interactions", _, _, "callback"]) => Response::new(204),
        _ => Response::json(404, &json!({"message": "404: Not Found", "code": 0})),
    }
}

async fn gateway(mut stream: BufReader<TcpStream>, req: Request, state: Arc<Mutex<State>>, addr: SocketAddr) {
    let Some(key) = req.header("sec-websocket-key") else { return };
    use base64::Engine as _;
    let accept =
        base64::engine::general_purpose::STANDARD.encode(bramble::util::sha1::sha1(format!("{key}{GUID}").as_bytes()));
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.get_mut().write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let (tx, mut rx) = mpsc::channel::<Out>(256);
    let interval = {
        let mut st = state.lock().unwrap();
        st.stats.connections += 1;
        st.stats.paths.push(req.path_only().to_string());
        if let Some(old) = st.socket.replace(tx.clone()) {
            let _ = old.try_send(Out::Drop);
        }
        st.ready = false;
        st.interval
    };
    let _ = tx.try_send(Out::Text(json!({"op": 10, "d": {"heartbeat_interval": interval}}).to_string()));
    let (mut reader, mut writer) = tokio::io::split(stream);
    let dropped = Arc::new(tokio::sync::Notify::new());
    let signal = dropped.clone();
    let writer_task = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let bytes = match out {
                Out::Text(t) => frame(0x1, t.as_bytes()),
                Out::Raw(b) => b,
                Out::Close(code) => frame(0x8, &code.to_be_bytes()),
                Out::Drop => {
                    signal.notify_one();
                    return;
                }
            };
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    loop {
        let msg = tokio::select! {
            m = read_message(&mut reader) => m,
            _ = dropped.notified() => None,
        };
        let Some((opcode, payload)) = msg else { break };
        if opcode == 0x8 {
            break;
        }
        if opcode != 0x1 {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&payload) else { continue };
        on_client(&v, &state, &tx, addr);
    }
    {
        let mut st = state.lock().unwrap();
        if st.socket.as_ref().is_some_and(|s| s.same_channel(&tx)) {
            st.socket = None;
            st.ready = false;
        }
    }
    writer_task.abort();
}

/// What the client sent: Identify, Resume, Heartbeat.
fn on_client(v: &Value, state: &Mutex<State>, tx: &mpsc::Sender<Out>, addr: SocketAddr) {
    let mut st = state.lock().unwrap();
    match v["op"].as_u64() {
        Some(1) => {
            st.stats.heartbeats += 1;
            if st.ack {
                let _ = tx.try_send(Out::Text(json!({"op": 11}).to_string()));
            }
        }
        Some(2) => {
            if v["d"]["token"] != st.token.as_str() {
                let _ = tx.try_send(Out::Close(4004));
                return;
            }
            st.stats.identifies += 1;
            st.sessions += 1;
            let session = format!("session{}", st.sessions);
            st.session = Some(session.clone());
            st.log.clear();
            st.seq += 1;
            let ready = json!({"op": 0, "t": "READY", "s": st.seq, "d": {
                "v": 10, "session_id": session, "resume_gateway_url": format!("ws://{addr}/resume"),
                "user": {"id": BOT_ID.to_string(), "username": "bramble", "bot": true}, "guilds": [],
                "application": {"id": BOT_ID.to_string()}}});
            st.log.push(ready.clone());
            st.ready = true;
            let _ = tx.try_send(Out::Text(ready.to_string()));
        }
        Some(6) => {
            let (session, seq) =
                (v["d"]["session_id"].as_str().unwrap_or_default().to_string(), v["d"]["seq"].as_u64());
            st.stats.resumes.push((session.clone(), seq));
            if v["d"]["token"] != st.token.as_str() || st.session.as_deref() != Some(session.as_str()) {
                let _ = tx.try_send(Out::Text(json!({"op": 9, "d": false}).to_string()));
                return;
            }
            for e in st.log.iter().filter(|e| e["s"].as_u64() > seq) {
                let _ = tx.try_send(Out::Text(e.to_string()));
            }
            st.seq += 1;
            let _ = tx.try_send(Out::Text(json!({"op": 0, "t": "RESUMED", "s": st.seq, "d": {}}).to_string()));
            st.ready = true;
        }
        _ => {}
    }
}

fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
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

/// One whole client message (opcode, payload); `None` on EOF.
async fn read_message<R: AsyncReadExt + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
    let mut message: Option<(u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 2];
        r.read_exact(&mut head).await.ok()?;
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0F);
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
        let mut mask = [0u8; 4];
        if head[1] & 0x80 != 0 {
            r.read_exact(&mut mask).await.ok()?;
        }
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.ok()?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            0x8..=0xA => return Some((opcode, payload)),
            0x0 => message.as_mut()?.1.extend(payload),
            _ => message = Some((opcode, payload)),
        }
        if fin {
            return message;
        }
    }
}

impl FakeDiscord {
    /// Close the live gateway socket with `code` ("Opcodes and Status Codes":
    /// 4014 Disallowed intent(s) is one the bot must not reconnect after).
    pub fn close_with(&self, code: u16) {
        let mut st = self.state.lock().unwrap();
        st.ready = false;
        if let Some(tx) = st.socket.take() {
            let _ = tx.try_send(Out::Close(code));
        }
    }
}
