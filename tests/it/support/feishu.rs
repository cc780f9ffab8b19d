//! A fake Feishu / Lark Open Platform on 127.0.0.1: the long connection
//! and the few REST calls a chat bot makes, from the published wire format.
//!
//! It follows the official Go SDK (github.com/larksuite/oapi-sdk-go, `ws/`:
//! `client.go`, `model.go`, `const.go`, `pbbp2.pb.go`) for the long
//! connection, and the Open Platform's server API documentation for REST
//! ("Get custom app tenant_access_token", "Send message", "Update app
//! messages for delayed update", "Obtain bot information", "Receive
//! message" event, "Card callback communication", and for files and
//! progress "Upload image" (im/v1/image/create), "Upload file"
//! (im/v1/file/create), "Send message content" (im/v1/message/create_json),
//! "Update app-sent message card" (im/v1/message-card/patch) and "Recall
//! message" (im/v1/message/delete), as published on open.larksuite.com /
//! open.feishu.cn):
//!
//! - `POST /callback/ws/endpoint` `{"AppID","AppSecret"}` → `{"code":0,
//!   "data":{"URL":"ws://…/ws?device_id=…&service_id=…","ClientConfig":{…}}}`
//!   (a wrong secret: a non-zero code).
//! - `GET /ws`: an RFC 6455 server whose binary messages are `pbbp2.Frame`s,
//!   written and read by this file's own protobuf code (not bramble's, so a
//!   bug there is not shared): pings are answered with a pong frame whose
//!   payload is a `ClientConfig`; data frames (`type` event / card, `sum`,
//!   `seq`, `message_id`) are sent by the test; the client's answers
//!   (the same frame, payload `{"code":200,…}`) are recorded by `message_id`.
//!   Frames pushed while no socket is up wait and go out on the next
//!   connection (the platform keeps undelivered events).
//! - `POST /open-apis/auth/v3/tenant_access_token/internal` → `t-g1045fake<n>`, 2 h;
//!   [`FakeFeishu::expire_token`] makes the current one answer 99991663.
//! - `GET /open-apis/bot/v3/info`, `POST /open-apis/im/v1/messages?receive_id_type=chat_id`
//!   (recorded; an `image` / `file` message must name a key this fake
//!   issued, else HTTP 400 code 230001), `PATCH` and `DELETE
//!   /open-apis/im/v1/messages/{id}` (recorded, in order with the sends); a
//!   missing or wrong bearer token: code 99991661 / 99991663.
//! - `POST /open-apis/im/v1/images` (multipart: `image_type` message or
//!   avatar, `image`) and `POST /open-apis/im/v1/files` (`file_type` one of
//!   opus, mp4, pdf, doc, xls, ppt, stream; `file_name`; `file`): HTTP 400
//!   with 234001 for a bad form, 234006 over 10 MB / 30 MB, 234010 for an
//!   empty file; else `data.image_key` / `data.file_key` (recorded). The
//!   test can make the next upload answer 99991663, redirect, or make
//!   uploads stall.
//! - `GET /open-apis/im/v1/messages/{id}/resources/{key}?type=image|file`
//!   ("Get resources in a message"): the bytes the test added with their
//!   `Content-Type`, else HTTP 400 code 234003; the same 99991663 /
//!   redirect / stall switches apply.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::http::{read_request, write_response, Multipart, Request, Response};

pub const APP_ID: &str = "cli_test0feishu";
pub const APP_SECRET: &str = "feishu-test-secret-0123";
pub const BOT_OPEN_ID: &str = "ou_bot0000000000000000000000000001";
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const SERVICE_ID: u64 = 33554678;

enum Out {
    Binary(Vec<u8>),
    Drop,
}

#[derive(Default)]
struct State {
    tokens: u32,
    valid: Option<String>,
    endpoint_calls: u32,
    upgrades: u32,
    pings: u32,
    sockets: Vec<mpsc::Sender<Out>>,
    waiting: VecDeque<Vec<u8>>,
    /// The client's answers: (frame message_id, payload JSON).
    answers: Vec<(String, Value)>,
    /// `POST /open-apis/im/v1/messages` bodies.
    sent: Vec<Value>,
    /// `PATCH` calls: (message id, body).
    patches: Vec<(String, Value)>,
    /// The next message send is answered with a 307 to here.
    redirect: Option<String>,
    next_id: u64,
    /// Uploads taken, in order.
    uploads: Vec<Uploaded>,
    /// Sends, updates and recalls in order: `send:<id>`, `patch:<id>`, `recall:<id>`.
    ops: Vec<String>,
    /// The next upload answers 99991663 (its token is no longer valid).
    upload_token_error: bool,
    /// The next upload is answered with a 307 to here.
    upload_redirect: Option<String>,
    /// Uploads are answered only after this long.
    upload_stall: Option<std::time::Duration>,
    /// Files users sent: (message id, key, bytes, content type).
    resources: Vec<(String, String, Vec<u8>, String)>,
}

/// One upload the fake took.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// `image` or `file`.
    pub kind: String,
    /// `image_type`, or `file_type`.
    pub type_field: String,
    /// `file_name` (files), else the part's filename.
    pub name: String,
    pub content_type: Option<String>,
    pub data: Vec<u8>,
    /// The key answered.
    pub key: String,
}

pub struct FakeFeishu {
    addr: SocketAddr,
    task: JoinHandle<()>,
    state: Arc<Mutex<State>>,
}

impl FakeFeishu {
    pub async fn start() -> FakeFeishu {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    Ok((stream, _)) = listener.accept() => {
                        let _ = stream.set_nodelay(true);
                        connections.spawn(serve(stream, st.clone(), addr));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        FakeFeishu { addr, task, state }
    }

    /// `http://127.0.0.1:PORT`, for `api_base`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A data frame to the bot (or waiting for its next connection).
    fn push(&self, frame: Vec<u8>) {
        let mut st = self.state.lock().unwrap();
        st.sockets.retain(|s| !s.is_closed());
        match st.sockets.first() {
            Some(s) => {
                let _ = s.try_send(Out::Binary(frame));
            }
            None => st.waiting.push_back(frame),
        }
    }

    /// An event (schema 2.0 JSON) in one data frame with `message_id` `frame_id`.
    pub fn event(&self, frame_id: &str, payload: &Value) {
        self.push(data_frame("event", frame_id, 1, 0, payload.to_string().as_bytes()));
    }

    /// An event split over `n` data frames (`sum` = n, `seq` 0..n), sent last part first.
    pub fn event_split(&self, frame_id: &str, payload: &[u8], n: usize) {
        let size = payload.len().div_ceil(n);
        let parts: Vec<&[u8]> = payload.chunks(size).collect();
        for (i, p) in parts.iter().enumerate().rev() {
            self.push(data_frame("event", frame_id, parts.len() as u64, i as u64, p));
        }
    }

    /// Bytes that are no frame at all, as one binary message.
    pub fn raw(&self, bytes: &[u8]) {
        self.push(bytes.to_vec());
    }

    /// A `card` frame: the older card callback.
    pub fn card_legacy(&self, frame_id: &str, payload: &Value) {
        self.push(data_frame("card", frame_id, 1, 0, payload.to_string().as_bytes()));
    }

    /// Drop every WebSocket connection (no close frame): a network cut.
    pub fn drop_sockets(&self) {
        for s in self.state.lock().unwrap().sockets.drain(..) {
            let _ = s.try_send(Out::Drop);
        }
    }

    /// The current tenant token stops working (code 99991663).
    pub fn expire_token(&self) {
        self.state.lock().unwrap().valid = None;
    }

    /// The next message send is answered with a redirect to `to`.
    pub fn redirect_next(&self, to: &str) {
        self.state.lock().unwrap().redirect = Some(to.to_string());
    }

    /// A file a user sent in message `message_id`, served by "Get resources in a message" under `key`.
    pub fn add_resource(&self, message_id: &str, key: &str, data: &[u8], content_type: &str) {
        let r = (message_id.to_string(), key.to_string(), data.to_vec(), content_type.to_string());
        self.state.lock().unwrap().resources.push(r);
    }

    /// The next upload or download answers 99991663, as for an expired token.
    pub fn token_error_at_next_file_call(&self) {
        self.state.lock().unwrap().upload_token_error = true;
    }

    /// The next upload or download is answered with a redirect to `to`.
    pub fn redirect_next_file_call(&self, to: &str) {
        self.state.lock().unwrap().upload_redirect = Some(to.to_string());
    }

    /// Uploads and downloads are answered only after `d` (`None`: at once again).
    pub fn stall_file_calls(&self, d: Option<std::time::Duration>) {
        self.state.lock().unwrap().upload_stall = d;
    }

    pub fn uploads(&self) -> Vec<Uploaded> {
        self.state.lock().unwrap().uploads.clone()
    }
    /// Sends, card updates and recalls, in order (`send:om_sent1`, `patch:…`, `recall:…`).
    pub fn ops(&self) -> Vec<String> {
        self.state.lock().unwrap().ops.clone()
    }
    pub fn tokens_issued(&self) -> u32 {
        self.state.lock().unwrap().tokens
    }
    pub fn upgrades(&self) -> u32 {
        self.state.lock().unwrap().upgrades
    }
    pub fn pings(&self) -> u32 {
        self.state.lock().unwrap().pings
    }
    pub fn sent(&self) -> Vec<Value> {
        self.state.lock().unwrap().sent.clone()
    }
    pub fn patches(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().patches.clone()
    }
    /// The answers to data frames, by frame `message_id`.
    pub fn answers(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().answers.clone()
    }
    /// The answer to frame `frame_id`, if any.
    pub fn answer(&self, frame_id: &str) -> Option<Value> {
        self.answers().into_iter().find(|(id, _)| id == frame_id).map(|(_, v)| v)
    }
}

impl Drop for FakeFeishu {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `im.message.receive_v1` as the platform sends it (schema 2.0).
pub fn message_event(event_id: &str, sender: &str, chat: &str, chat_type: &str, text: &str) -> Value {
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "im.message.receive_v1", "create_time": "1608725989000",
                   "token": "rvaYgkR", "app_id": APP_ID, "tenant_key": "2ca1d211f64f6438"},
        "event": {
            "sender": {"sender_id": {"open_id": sender, "union_id": "on_8ed6aa67826108097d9ee143816345",
                                     "user_id": null}, "sender_type": "user", "tenant_key": "2ca1d211f64f6438"},
            "message": {"message_id": format!("om_{event_id}"), "create_time": "1609073151345",
                        "chat_id": chat, "chat_type": chat_type, "message_type": "text",
                        "content": json!({"text": text}).to_string(), "mentions": []}
        }
    })
}

/// `card.action.trigger` as the platform sends it over the long connection.
pub fn card_event(event_id: &str, operator: &str, value: &Value, message_id: &str, chat: &str) -> Value {
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "card.action.trigger", "app_id": APP_ID},
        "event": {"operator": {"open_id": operator, "tenant_key": "t"},
                  "action": {"tag": "button", "value": value},
                  "context": {"open_message_id": message_id, "open_chat_id": chat}}
    })
}

// ---- pbbp2.Frame, written and read here (field numbers from pbbp2.pb.go) ----

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(out: &mut Vec<u8>, n: u64, b: &[u8]) {
    varint(out, (n << 3) | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn frame_bytes(method: u64, headers: &[(&str, String)], payload: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in [(1, 7), (2, 99), (3, SERVICE_ID), (4, method)] {
        varint(&mut out, n << 3);
        varint(&mut out, v);
    }
    for (k, v) in headers {
        let mut h = Vec::new();
        field_bytes(&mut h, 1, k.as_bytes());
        field_bytes(&mut h, 2, v.as_bytes());
        field_bytes(&mut out, 5, &h);
    }
    if let Some(p) = payload {
        field_bytes(&mut out, 8, p);
    }
    out
}

fn data_frame(kind: &str, id: &str, sum: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let headers = [
        ("type", kind.to_string()),
        ("message_id", id.to_string()),
        ("sum", sum.to_string()),
        ("seq", seq.to_string()),
        ("trace_id", format!("trace-{id}")),
    ];
    frame_bytes(1, &headers, Some(payload))
}

/// A frame read back: method, headers, payload.
struct Read {
    method: u64,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7F) << shift;
        if x < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Each field as (number, varint value, bytes).
fn fields(b: &[u8]) -> Option<Vec<(u64, u64, Vec<u8>)>> {
    let (mut at, mut out) = (0, Vec::new());
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        match tag & 7 {
            0 => out.push((tag >> 3, read_varint(b, &mut at)?, Vec::new())),
            2 => {
                let n = read_varint(b, &mut at)? as usize;
                out.push((tag >> 3, 0, b.get(at..at + n)?.to_vec()));
                at += n;
            }
            _ => return None,
        }
    }
    Some(out)
}

fn read_frame_bytes(b: &[u8]) -> Option<Read> {
    let mut r = Read { method: 9, headers: Vec::new(), payload: Vec::new() };
    for (n, v, bytes) in fields(b)? {
        match n {
            4 => r.method = v,
            5 => {
                let h = fields(&bytes)?;
                let get = |k| h.iter().find(|f| f.0 == k).map(|f| String::from_utf8_lossy(&f.2).into_owned());
                r.headers.push((get(1)?, get(2)?));
            }
            8 => r.payload = bytes,
            _ => {}
        }
    }
    Some(r)
}

// ---- the server ----

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>, addr: SocketAddr) {
    let mut stream = BufReader::new(stream);
    loop {
        let Ok(Some((req, keep_alive))) = read_request(&mut stream).await else { return };
        if req.path_only() == "/ws" {
            return websocket(stream, req, state).await;
        }
        let stall = state.lock().unwrap().upload_stall.filter(|_| is_file_call(&req));
        if let Some(d) = stall {
            tokio::time::sleep(d).await;
        }
        let resp = rest(&req, &state, addr);
        if write_response(stream.get_mut(), &resp, keep_alive).await.is_err() || !keep_alive {
            return;
        }
    }
}

fn api(code: i64, msg: &str, extra: Value) -> Response {
    let mut v = json!({"code": code, "msg": msg});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    Response::json(200, &v)
}

fn rest(req: &Request, state: &Mutex<State>, addr: SocketAddr) -> Response {
    let body = req.json().unwrap_or(Value::Null);
    let mut st = state.lock().unwrap();
    match (req.method.as_str(), req.path_only()) {
        ("POST", "/callback/ws/endpoint") => {
            st.endpoint_calls += 1;
            if body["AppID"] != APP_ID || body["AppSecret"] != APP_SECRET {
                return api(1000040344, "app secret invalid", json!({}));
            }
            let url = format!("ws://{addr}/ws?device_id=7240001&service_id={SERVICE_ID}");
            let config =
                json!({"PingInterval": 120, "ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 30});
            api(0, "ok", json!({"data": {"URL": url, "ClientConfig": config}}))
        }
        ("POST", "/open-apis/auth/v3/tenant_access_token/internal") => {
            if body["app_id"] != APP_ID || body["app_secret"] != APP_SECRET {
                return api(10014, "app secret invalid", json!({}));
            }
            st.tokens += 1;
            let token = format!("t-g1045fake{}", st.tokens);
            st.valid = Some(token.clone());
            api(0, "ok", json!({"tenant_access_token": token, "expire": 7200}))
        }
        (method, path) => {
            if is_file_call(req) && std::mem::take(&mut st.upload_token_error) {
                st.valid = None;
                return api(99991663, "Invalid access token for authorization", json!({}));
            }
            let auth = req.header("authorization").unwrap_or_default();
            match &st.valid {
                _ if auth.is_empty() => return api(99991661, "Missing access token for authorization", json!({})),
                Some(t) if auth == format!("Bearer {t}") => {}
                _ => return api(99991663, "Invalid access token for authorization", json!({})),
            }
            authed(&mut st, method, path, req, body)
        }
    }
}

fn authed(st: &mut State, method: &str, path: &str, req: &Request, body: Value) -> Response {
    match (method, path) {
        ("GET", "/open-apis/bot/v3/info") => {
            api(0, "ok", json!({"bot": {"open_id": BOT_OPEN_ID, "app_name": "bramble", "activate_status": 2}}))
        }
        ("POST", "/open-apis/im/v1/messages") => {
            if let Some(to) = st.redirect.take() {
                return Response::new(307).header("Location", format!("{to}/open-apis/im/v1/messages"));
            }
            if !req.path.contains("receive_id_type=chat_id") {
                return api(99992402, "field validation failed: receive_id_type", json!({}));
            }
            if let Some(refused) = unknown_key(st, &body) {
                return refused;
            }
            st.next_id += 1;
            let id = format!("om_sent{}", st.next_id);
            st.sent.push(body);
            st.ops.push(format!("send:{id}"));
            api(0, "success", json!({"data": {"message_id": id}}))
        }
        ("PATCH", p) if p.starts_with("/open-apis/im/v1/messages/") => {
            let id = p.trim_start_matches("/open-apis/im/v1/messages/").to_string();
            st.ops.push(format!("patch:{id}"));
            st.patches.push((id, body));
            api(0, "success", json!({}))
        }
        ("DELETE", p) if p.starts_with("/open-apis/im/v1/messages/") => {
            st.ops.push(format!("recall:{}", p.trim_start_matches("/open-apis/im/v1/messages/")));
            api(0, "success", json!({}))
        }
        ("POST", "/open-apis/im/v1/images" | "/open-apis/im/v1/files") => {
            if let Some(to) = st.upload_redirect.take() {
                return Response::new(307).header("Location", format!("{to}{path}"));
            }
            upload(st, path, req)
        }
        ("GET", p) if is_file_call(req) => {
            if let Some(to) = st.upload_redirect.take() {
                return Response::new(307).header("Location", format!("{to}{}", req.path));
            }
            let rest = p.trim_start_matches("/open-apis/im/v1/messages/");
            let (id, key) = rest.split_once("/resources/").unwrap_or_default();
            let typed = req.path.contains("type=image") || req.path.contains("type=file");
            match st.resources.iter().find(|r| r.0 == id && r.1 == key) {
                Some((_, _, data, ctype)) if typed => {
                    Response::new(200).header("content-type", ctype).body(data.clone())
                }
                _ => refuse(400, 234003, "File not in msg."),
            }
        }
        _ => Response::json(404, &json!({"code": 404, "msg": "not found"})),
    }
}

/// An upload, or a download of a message's resource.
fn is_file_call(req: &Request) -> bool {
    let path = req.path_only();
    (req.method == "POST" && matches!(path, "/open-apis/im/v1/images" | "/open-apis/im/v1/files"))
        || (req.method == "GET" && path.starts_with("/open-apis/im/v1/messages/") && path.contains("/resources/"))
}

fn refuse(status: u16, code: i64, msg: &str) -> Response {
    Response::json(status, &json!({"code": code, "msg": msg}))
}

/// "Upload image" / "Upload file": the form checked, the key answered.
fn upload(st: &mut State, path: &str, req: &Request) -> Response {
    let image = path.ends_with("/images");
    let ctype = req.header("content-type").unwrap_or_default();
    let Some(form) = Multipart::parse(ctype, &req.body) else { return refuse(400, 234001, "Invalid request param.") };
    let (field, cap) = if image { ("image", 10 << 20) } else { ("file", 30 << 20) };
    let type_field = form.text(if image { "image_type" } else { "file_type" }).unwrap_or_default();
    let types: &[&str] =
        if image { &["message", "avatar"] } else { &["opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"] };
    let name = if image { form.part(field).and_then(|p| p.file_name.clone()) } else { form.text("file_name") };
    let (Some(part), Some(name)) = (form.part(field), name) else {
        return refuse(400, 234001, "Invalid request param.");
    };
    if !types.contains(&type_field.as_str()) {
        return refuse(400, 234001, "Invalid request param.");
    }
    if part.data.is_empty() {
        return refuse(400, 234010, "File's size can't be 0.");
    }
    if part.data.len() > cap {
        return refuse(400, 234006, "The file size exceed the max value.");
    }
    st.next_id += 1;
    let key = if image { format!("img_v3_fake{}", st.next_id) } else { format!("file_v3_fake{}", st.next_id) };
    st.uploads.push(Uploaded {
        kind: field.to_string(),
        type_field,
        name,
        content_type: part.content_type.clone(),
        data: part.data.clone(),
        key: key.clone(),
    });
    let data = if image { json!({"image_key": key}) } else { json!({"file_key": key}) };
    api(0, "success", json!({ "data": data }))
}

/// An `image` / `file` message naming a key this fake did not issue: refused as the platform does.
fn unknown_key(st: &State, body: &Value) -> Option<Response> {
    let field = match body["msg_type"].as_str() {
        Some("image") => "image_key",
        Some("file") => "file_key",
        _ => return None,
    };
    let content: Value = serde_json::from_str(body["content"].as_str().unwrap_or_default()).unwrap_or_default();
    let key = content[field].as_str().unwrap_or_default();
    match st.uploads.iter().any(|u| u.key == key) {
        true => None,
        false => Some(refuse(400, 230001, "Your request contains an invalid request parameter.")),
    }
}

async fn websocket(mut stream: BufReader<TcpStream>, req: Request, state: Arc<Mutex<State>>) {
    let Some(key) = req.header("sec-websocket-key") else {
        let _ = write_response(stream.get_mut(), &Response::text(400, "not a WebSocket request"), false).await;
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
    let (tx, mut rx) = mpsc::channel::<Out>(256);
    {
        let mut st = state.lock().unwrap();
        st.upgrades += 1;
        while let Some(f) = st.waiting.pop_front() {
            let _ = tx.try_send(Out::Binary(f));
        }
        st.sockets.push(tx.clone());
    }
    let (mut reader, mut writer) = tokio::io::split(stream);
    let dropped = Arc::new(tokio::sync::Notify::new());
    let drop_signal = dropped.clone();
    let writer_task = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let bytes = match out {
                Out::Binary(b) => ws_frame(0x2, &b),
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
    loop {
        let msg = tokio::select! {
            m = read_ws(&mut reader) => m,
            _ = dropped.notified() => None,
        };
        let Some((opcode, payload)) = msg else { break };
        if opcode == 0x8 {
            break;
        }
        let Some(f) = read_frame_bytes(&payload).filter(|_| opcode == 0x2) else { continue };
        let kind = f.headers.iter().find(|h| h.0 == "type").map(|h| h.1.clone()).unwrap_or_default();
        if f.method == 0 && kind == "ping" {
            state.lock().unwrap().pings += 1;
            let conf =
                json!({"PingInterval": 120, "ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 30});
            let pong = frame_bytes(0, &[("type", "pong".into())], Some(conf.to_string().as_bytes()));
            let _ = tx.try_send(Out::Binary(pong));
        } else if f.method == 1 {
            let id = f.headers.iter().find(|h| h.0 == "message_id").map(|h| h.1.clone()).unwrap_or_default();
            let v: Value = serde_json::from_slice(&f.payload).unwrap_or(Value::Null);
            state.lock().unwrap().answers.push((id, v));
        }
    }
    state.lock().unwrap().sockets.retain(|s| !s.same_channel(&tx));
    writer_task.abort();
}

/// A server frame: never masked.
fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
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

/// One whole client frame (clients send unfragmented ones here), unmasked.
async fn read_ws<R: AsyncReadExt + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await.ok()?;
    let len = match head[1] & 0x7F {
        126 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).await.ok()?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).await.ok()?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mut mask = [0u8; 4];
    if head[1] & 0x80 != 0 {
        r.read_exact(&mut mask).await.ok()?;
    }
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    r.read_exact(&mut payload).await.ok()?;
    payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
    Some((head[0] & 0x0F, payload))
}
