//! A fake Telegram Bot API on 127.0.0.1, speaking the published JSON.
//!
//! `POST /bot<token>/<method>` with a JSON body; answers `{"ok": true,
//! "result": …}` or `{"ok": false, "error_code", "description", "parameters"}`.
//! Implemented: `getMe`, `getUpdates` (a real long poll: it holds the request
//! until an update arrives or `timeout` passes), `sendMessage` (with an HTML
//! check like Telegram's "can't parse entities" and the 4096 limit),
//! `sendChatAction`, `setMyCommands`, `deleteWebhook`, `getFile` and the file
//! download (`GET /file/bot<token>/<file_path>`, with Telegram's 20 MB limit:
//! "Bad Request: file is too big"), `sendPhoto`/`sendDocument` (multipart/form-data,
//! parsed here: the file's bytes are kept as they arrived), `editMessageText`,
//! `deleteMessage`, `answerCallbackQuery`, and `callback_query` updates.
//! A wrong token gets 401.
//!
//! Stricter than Telegram in one way: it never forgets an update, so a client
//! that polls with an offset it already moved past sees the update again —
//! which is exactly what persisting the offset must prevent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Notify;

use super::http::{Multipart, Request, Response, TestServer};

pub const BOT_ID: i64 = 424242;
pub const BOT_USERNAME: &str = "bramble_test_bot";

/// A call the fake received.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub body: Value,
    pub at: Instant,
}

/// A file the fake can serve: its bytes, and how many downloads fail first.
#[derive(Default, Clone)]
struct FakeFile {
    data: Vec<u8>,
    /// The size `getFile` reports (the real one unless set).
    size: Option<u64>,
    /// Downloads that break off halfway (the connection closes mid-body) before one succeeds.
    fail_first: u32,
}

/// A file received by `sendPhoto` / `sendDocument`.
#[derive(Debug, Clone)]
pub struct Upload {
    pub method: String,
    pub chat_id: String,
    pub file_name: String,
    pub content_type: String,
    pub data: Vec<u8>,
    pub caption: Option<String>,
}

#[derive(Default)]
struct State {
    files: HashMap<String, FakeFile>,
    uploads: Vec<Upload>,
    updates: Vec<Value>,
    next_update_id: i64,
    next_message_id: i64,
    calls: Vec<Call>,
    /// Scripted answers per method, used before the normal behaviour.
    script: HashMap<String, VecDeque<Response>>,
    /// Refuse HTML messages as Telegram does when it cannot parse them.
    reject_html: bool,
}

pub struct FakeTelegram {
    server: TestServer,
    state: Arc<Mutex<State>>,
    arrived: Arc<Notify>,
    pub token: String,
}

impl FakeTelegram {
    pub async fn start(token: &str) -> FakeTelegram {
        let state = Arc::new(Mutex::new(State { next_update_id: 1000, next_message_id: 1, ..Default::default() }));
        let arrived = Arc::new(Notify::new());
        let (st, notify, tok) = (state.clone(), arrived.clone(), token.to_string());
        let server = TestServer::start_async(move |req| handle(req, st.clone(), notify.clone(), tok.clone())).await;
        FakeTelegram { server, state, arrived, token: token.into() }
    }

    /// `api_base` for the config.
    pub fn url(&self) -> String {
        self.server.url()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A user's message arrives; returns its update id.
    pub fn push_message(&self, chat_id: i64, chat_type: &str, from_id: i64, username: &str, text: &str) -> i64 {
        self.push(json!({
            "message_id": 0, "date": 1_700_000_000,
            "chat": {"id": chat_id, "type": chat_type},
            "from": {"id": from_id, "is_bot": false, "first_name": username, "username": username},
            "text": text,
        }))
    }

    /// A message object (its ids are filled in) arrives as an update.
    pub fn push(&self, mut message: Value) -> i64 {
        let id = {
            let mut st = self.lock();
            st.next_update_id += 1;
            st.next_message_id += 1;
            message["message_id"] = json!(st.next_message_id);
            let id = st.next_update_id;
            st.updates.push(json!({"update_id": id, "message": message}));
            id
        };
        self.arrived.notify_waiters();
        id
    }

    /// A raw update (a `callback_query`, say) arrives; returns its id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let id = {
            let mut st = self.lock();
            st.next_update_id += 1;
            let id = st.next_update_id;
            update["update_id"] = json!(id);
            st.updates.push(update);
            id
        };
        self.arrived.notify_waiters();
        id
    }

    /// Serve `data` as file `file_id` (`size`: what getFile claims, when it differs;
    /// `fail_first`: downloads that break off before one works).
    pub fn add_file(&self, file_id: &str, data: Vec<u8>, size: Option<u64>, fail_first: u32) {
        self.lock().files.insert(file_id.into(), FakeFile { data, size, fail_first });
    }

    /// Files received by sendPhoto / sendDocument.
    pub fn uploads(&self) -> Vec<Upload> {
        self.lock().uploads.clone()
    }

    /// Downloads asked for (file paths), failed ones included.
    pub fn downloads(&self) -> Vec<String> {
        self.calls("GET file").iter().map(|c| c.body.as_str().unwrap_or_default().to_string()).collect()
    }

    /// The next answer to `method` is `status` with this error (and `retry_after`).
    pub fn fail_next(&self, method: &str, code: u16, description: &str, retry_after: Option<u64>) {
        let mut body = json!({"ok": false, "error_code": code, "description": description});
        if let Some(s) = retry_after {
            body["parameters"] = json!({"retry_after": s});
        }
        self.lock().script.entry(method.into()).or_default().push_back(Response::json(code, &body));
    }

    pub fn reject_html(&self, yes: bool) {
        self.lock().reject_html = yes;
    }

    pub fn calls(&self, method: &str) -> Vec<Call> {
        self.lock().calls.iter().filter(|c| c.method == method).cloned().collect()
    }

    /// Messages accepted by `sendMessage` (bodies), in order.
    pub fn sent(&self) -> Vec<Value> {
        self.lock().calls.iter().filter(|c| c.method == "sendMessage#ok").map(|c| c.body.clone()).collect()
    }

    pub fn sent_texts(&self) -> Vec<String> {
        self.sent().iter().map(|b| b["text"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// Wait up to `secs` until at least `n` messages were sent.
    pub async fn wait_sent(&self, n: usize, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if self.sent().len() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.sent().len() >= n
    }

    /// Offsets asked for by `getUpdates`, in order.
    pub fn offsets(&self) -> Vec<i64> {
        self.calls("getUpdates").iter().map(|c| c.body["offset"].as_i64().unwrap_or(0)).collect()
    }
}

fn refuse(code: u16, description: &str) -> Response {
    Response::json(code, &json!({"ok": false, "error_code": code, "description": description}))
}

fn ok(result: Value) -> Response {
    Response::json(200, &json!({"ok": true, "result": result}))
}

async fn handle(req: Request, state: Arc<Mutex<State>>, arrived: Arc<Notify>, token: String) -> Response {
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rest) = req.path_only().strip_prefix("/file/bot") {
        // The download: GET /file/bot<token>/<file_path>.
        let Some((tok, path)) = rest.split_once('/') else { return refuse(404, "Not Found") };
        if tok != token || req.method != "GET" {
            return Response::new(404);
        }
        let mut st = lock();
        st.calls.push(Call { method: "GET file".into(), body: json!(path), at: Instant::now() });
        let id = path.strip_prefix("files/").unwrap_or(path).to_string();
        let Some(file) = st.files.get_mut(&id) else { return Response::new(404) };
        if file.fail_first > 0 {
            file.fail_first -= 1;
            let half = file.data.len() / 2;
            return Response::new(200)
                .header("content-type", "application/octet-stream")
                .body(file.data.clone())
                .torn_after(half);
        }
        return Response::new(200).header("content-type", "application/octet-stream").body(file.data.clone());
    }
    let Some(rest) = req.path_only().strip_prefix("/bot") else { return refuse(404, "Not Found") };
    let Some((tok, method)) = rest.split_once('/') else { return refuse(404, "Not Found") };
    if tok != token {
        return refuse(401, "Unauthorized");
    }
    let ctype = req.header("content-type").unwrap_or_default().to_string();
    if matches!(method, "sendPhoto" | "sendDocument") && ctype.starts_with("multipart/form-data") {
        return upload(&req, method, &ctype, &state);
    }
    if req.method != "POST" || !ctype.contains("application/json") {
        return refuse(400, "Bad Request: expected a JSON POST");
    }
    let body = req.json().unwrap_or(Value::Null);
    let method = method.to_string();
    {
        let mut st = lock();
        st.calls.push(Call { method: method.clone(), body: body.clone(), at: Instant::now() });
        if let Some(r) = st.script.get_mut(&method).and_then(VecDeque::pop_front) {
            return r;
        }
    }
    match method.as_str() {
        "getMe" => ok(json!({"id": BOT_ID, "is_bot": true, "first_name": "Bramble", "username": BOT_USERNAME,
                             "can_join_groups": true, "supports_inline_queries": false})),
        "getUpdates" => {
            let offset = body["offset"].as_i64().unwrap_or(0);
            let timeout = body["timeout"].as_u64().unwrap_or(0).min(60);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
            loop {
                let notified = arrived.notified();
                let ready: Vec<Value> =
                    lock().updates.iter().filter(|u| u["update_id"].as_i64().unwrap_or(0) >= offset).cloned().collect();
                if !ready.is_empty() {
                    return ok(Value::Array(ready));
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return ok(json!([]));
                }
            }
        }
        "sendMessage" => {
            let (Some(chat), Some(text)) = (body.get("chat_id").filter(|c| !c.is_null()), body["text"].as_str()) else {
                return refuse(400, "Bad Request: chat_id and text are required");
            };
            if text.trim().is_empty() {
                return refuse(400, "Bad Request: message text is empty");
            }
            if text.encode_utf16().count() > 4096 {
                return refuse(400, "Bad Request: message is too long");
            }
            if chat.as_i64() == Some(404) {
                return refuse(400, "Bad Request: chat not found");
            }
            if body["parse_mode"] == "HTML" {
                if let Err(why) = check_html(text) {
                    return refuse(400, &format!("Bad Request: can't parse entities: {why}"));
                }
                if lock().reject_html {
                    return refuse(400, "Bad Request: can't parse entities: unsupported start tag");
                }
            }
            let mut st = lock();
            st.next_message_id += 1;
            let id = st.next_message_id;
            st.calls.push(Call { method: "sendMessage#ok".into(), body: body.clone(), at: Instant::now() });
            ok(json!({"message_id": id, "date": 1_700_000_000, "chat": {"id": chat, "type": "private"}, "text": text}))
        }
        "getFile" => {
            let id = body["file_id"].as_str().unwrap_or_default().to_string();
            let Some(file) = lock().files.get(&id).cloned() else {
                return refuse(400, "Bad Request: invalid file_id");
            };
            let size = file.size.unwrap_or(file.data.len() as u64);
            if size > 20 * 1024 * 1024 {
                return refuse(400, "Bad Request: file is too big");
            }
            ok(
                json!({"file_id": id, "file_unique_id": format!("u{id}"), "file_size": size, "file_path": format!("files/{id}")}),
            )
        }
        "editMessageText" => {
            if body["text"].as_str().is_none_or(|t| t.trim().is_empty()) {
                return refuse(400, "Bad Request: text is empty");
            }
            ok(
                json!({"message_id": body["message_id"], "date": 1_700_000_000, "chat": {"id": body["chat_id"], "type": "private"}, "text": body["text"]}),
            )
        }
        "sendChatAction" | "setMyCommands" | "deleteWebhook" | "deleteMessage" | "answerCallbackQuery" => {
            ok(json!(true))
        }
        _ => refuse(404, "Not Found: method not found"),
    }
}

/// Telegram's HTML rules, the part that matters: only known tags, balanced, and
/// `<`/`&` escaped elsewhere.
fn check_html(text: &str) -> Result<(), String> {
    const TAGS: &[&str] = &[
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-spoiler",
        "span",
    ];
    let mut stack: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(['<', '&']) {
        let tail = &rest[i..];
        if tail.starts_with('&') {
            let end = tail.find(';').ok_or("unterminated entity")?;
            if !matches!(&tail[..=end], "&lt;" | "&gt;" | "&amp;" | "&quot;") {
                return Err(format!("unsupported entity {}", &tail[..=end]));
            }
            rest = &tail[end + 1..];
            continue;
        }
        let end = tail.find('>').ok_or("unclosed start tag")?;
        let tag = &tail[1..end];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop().as_deref() != Some(name) {
                return Err(format!("unexpected end tag {name}"));
            }
        } else {
            let name = tag.split_whitespace().next().unwrap_or("");
            if !TAGS.contains(&name) {
                return Err(format!("unsupported start tag \"{name}\""));
            }
            stack.push(name.to_string());
        }
        rest = &tail[end + 1..];
    }
    match stack.pop() {
        Some(open) => Err(format!("can't find end tag corresponding to start tag \"{open}\"")),
        None => Ok(()),
    }
}

/// `sendPhoto` / `sendDocument` as multipart/form-data (RFC 7578), parsed the
/// way Telegram does: fields by name, the file part with its name, type and bytes.
fn upload(req: &Request, method: &str, ctype: &str, state: &Arc<Mutex<State>>) -> Response {
    let Some(form) = Multipart::parse(ctype, &req.body) else {
        return refuse(400, "Bad Request: bad multipart body");
    };
    let file_field = if method == "sendPhoto" { "photo" } else { "document" };
    let (Some(chat), Some(file)) = (form.text("chat_id"), form.part(file_field)) else {
        return refuse(400, "Bad Request: chat_id and the file are required");
    };
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    st.calls.push(Call { method: method.into(), body: json!({"file_name": file.file_name}), at: Instant::now() });
    st.uploads.push(Upload {
        method: method.into(),
        chat_id: chat,
        file_name: file.file_name.clone().unwrap_or_default(),
        content_type: file.content_type.clone().unwrap_or_default(),
        data: file.data.clone(),
        caption: form.text("caption"),
    });
    st.next_message_id += 1;
    ok(json!({"message_id": st.next_message_id, "date": 1_700_000_000, "chat": {"id": 1, "type": "private"}}))
}

/// A `getUpdates` call that came through a [`Door`]: whose, and from which offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub door: String,
    pub offset: i64,
}

/// The doors of one fake: every `getUpdates` through them, and the long poll
/// now open (Telegram's rule for two pollers of one bot: the newer request
/// ends the older one with 409 "Conflict: terminated by other getUpdates
/// request", https://core.telegram.org/bots/api#getupdates and the Bot API's
/// error list).
#[derive(Default)]
pub struct Doors {
    polls: Mutex<Vec<Poll>>,
    open: Mutex<Option<(String, Arc<Notify>)>>,
}

impl Doors {
    /// Every `getUpdates` so far, in order.
    pub fn polls(&self) -> Vec<Poll> {
        self.polls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The offsets door `name` polled with, in order.
    pub fn offsets_of(&self, name: &str) -> Vec<i64> {
        self.polls().into_iter().filter(|p| p.door == name).map(|p| p.offset).collect()
    }
}

/// Another address of the same bot (same updates, same sent messages), so a
/// test tells two boards' pollers apart.
pub struct Door {
    server: TestServer,
}

impl Door {
    pub fn url(&self) -> String {
        self.server.url()
    }
}

impl FakeTelegram {
    /// A door named `name` onto this bot, counted in `doors`.
    pub async fn door(&self, name: &str, doors: &Arc<Doors>) -> Door {
        let (st, notify, tok, doors, name) =
            (self.state.clone(), self.arrived.clone(), self.token.clone(), doors.clone(), name.to_string());
        let server = TestServer::start_async(move |req| {
            let (st, notify, tok, doors, name) = (st.clone(), notify.clone(), tok.clone(), doors.clone(), name.clone());
            async move {
                if !req.path_only().ends_with("/getUpdates") {
                    return handle(req, st, notify, tok).await;
                }
                let offset = req.json().and_then(|b| b["offset"].as_i64()).unwrap_or(0);
                doors.polls.lock().unwrap_or_else(|e| e.into_inner()).push(Poll { door: name.clone(), offset });
                let mine = Arc::new(Notify::new());
                if let Some((door, older)) =
                    doors.open.lock().unwrap_or_else(|e| e.into_inner()).replace((name.clone(), mine.clone()))
                {
                    if door != name {
                        older.notify_one();
                    }
                }
                let answer = tokio::select! {
                    r = handle(req, st, notify, tok) => r,
                    () = mine.notified() => refuse(409, "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"),
                };
                let mut open = doors.open.lock().unwrap_or_else(|e| e.into_inner());
                if open.as_ref().is_some_and(|(_, n)| Arc::ptr_eq(n, &mine)) {
                    *open = None;
                }
                answer
            }
        })
        .await;
        Door { server }
    }
}
