//! A thin Telegram Bot API client over the crate's reqwest and serde.
//!
//! Why our own: teloxide adds ~1.25 MB and a second reqwest; we need a dozen
//! methods (`getMe`, `getUpdates`, `sendMessage`, `sendChatAction`,
//! `setMyCommands`, `deleteWebhook`, `getFile` and the file download,
//! `sendPhoto`/`sendDocument`, `editMessageText`, `editMessageReplyMarkup`,
//! `deleteMessage`, `answerCallbackQuery`).
//!
//! - Every call is a JSON `POST` to `<api_base>/bot<token>/<method>` (uploads:
//!   `multipart/form-data`, [`crate::util::multipart`]); every
//!   answer is `{"ok", "result" | "description", "error_code", "parameters"}`.
//!   Types are tolerant: unknown fields are ignored, missing ones default.
//! - A 429 is waited out here when `parameters.retry_after` is short, so callers
//!   see it only when Telegram asks for a long pause.
//! - The token is part of every URL: errors never carry a URL (`without_url`)
//!   and every message is scrubbed of the token anyway. No redirect is
//!   followed (a "moved" answer would carry the path, token included, to
//!   another host): it is an error naming where it pointed.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Secret;

/// Long-poll timeout asked of `getUpdates`, in seconds.
pub const POLL_TIMEOUT_SECS: u64 = 50;
/// The HTTP limit for a long poll: the poll itself plus slack. A connection
/// that stays silent longer has stalled (a NAT dropped it): the poller reconnects.
pub const POLL_HTTP_TIMEOUT: Duration = Duration::from_secs(POLL_TIMEOUT_SECS + 15);
/// Idle connections to the Bot API the shared client keeps (no idle timeout:
/// see `shared_client`).
const POOL_MAX_IDLE: usize = 2;
/// The HTTP limit for the other calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A 429 asking for at most this long is waited out inside the call.
const MAX_INLINE_RETRY_AFTER: u64 = 30;
/// How often a call is retried after such a 429.
const MAX_429_RETRIES: u32 = 3;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// No answer: DNS, connection refused, TLS, timeout, reset.
    #[error("cannot reach the Telegram Bot API: {0}")]
    Transport(String),
    /// Telegram answered `ok: false`.
    #[error("Telegram refused {method} (HTTP {code}): {description}")]
    Refused { method: &'static str, code: u16, description: String, retry_after: Option<u64> },
    /// An answer we cannot read.
    #[error("cannot read Telegram's answer to {method}: {message}")]
    Decode { method: &'static str, message: String },
}

impl ApiError {
    /// HTTP-ish status of a refusal.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The token is wrong (Telegram answers 401, or 404 for a malformed one).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self.code(), Some(401 | 404))
    }

    /// Telegram could not parse the HTML we sent.
    pub fn is_bad_markup(&self) -> bool {
        match self {
            ApiError::Refused { code: 400, description, .. } => {
                let d = description.to_ascii_lowercase();
                d.contains("can't parse entities")
                    || d.contains("unsupported start tag")
                    || d.contains("can't find end")
            }
            _ => false,
        }
    }

    /// Whether trying later may succeed: network, 5xx, 429 (and 401/404: a
    /// config fix and reload may mend it, so reports are kept).
    pub fn is_retryable(&self) -> bool {
        match self {
            ApiError::Transport(_) => true,
            ApiError::Refused { code, .. } => *code == 429 || *code >= 500 || matches!(code, 401 | 404 | 409),
            ApiError::Decode { .. } => true,
        }
    }
}

/// A Telegram user (or bot).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct User {
    pub id: i64,
    pub is_bot: bool,
    pub first_name: String,
    pub username: Option<String>,
}

/// A chat.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Chat {
    pub id: i64,
    /// `private`, `group`, `supergroup`, `channel`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: Option<String>,
    pub username: Option<String>,
}

/// A file attached to a message: a photo size, a voice note, an audio file,
/// a round video note or a document. One type for all of them: the fields a
/// kind lacks stay `None`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct FileRef {
    pub file_id: String,
    pub file_unique_id: String,
    pub file_size: Option<u64>,
    /// Seconds (voice, audio, video notes).
    pub duration: Option<u64>,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
}

/// A message (the fields bramble reads).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Message {
    pub message_id: i64,
    pub from: Option<User>,
    pub chat: Chat,
    pub text: Option<String>,
    pub caption: Option<String>,
    pub reply_to_message: Option<Box<Message>>,
    /// The sizes Telegram made of a photo, smallest first.
    pub photo: Vec<FileRef>,
    pub voice: Option<FileRef>,
    pub audio: Option<FileRef>,
    pub video_note: Option<FileRef>,
    pub document: Option<FileRef>,
    /// The inline keyboard the message carries (our report buttons).
    pub reply_markup: Option<Value>,
}

/// A press of an inline keyboard button.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CallbackQuery {
    pub id: String,
    pub from: User,
    /// The message the button belongs to (absent when it is too old).
    pub message: Option<Message>,
    pub data: Option<String>,
}

/// One update from `getUpdates`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Update {
    pub update_id: i64,
    pub message: Option<Message>,
    pub callback_query: Option<CallbackQuery>,
}

/// What `getFile` answers: where to download the file from.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TgFile {
    pub file_id: String,
    pub file_size: Option<u64>,
    /// Valid for at least an hour; absent when the file is too big for bots (> 20 MB).
    pub file_path: Option<String>,
}

/// The largest file the Bot API lets a bot download.
pub const MAX_DOWNLOAD: u64 = 20 * 1024 * 1024;
/// The largest photo `sendPhoto` takes; larger images go as documents.
pub const MAX_PHOTO_UPLOAD: u64 = 10 * 1024 * 1024;
/// The largest file a bot may upload.
pub const MAX_UPLOAD: u64 = 50 * 1024 * 1024;
/// How long a download or an upload may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);

/// A request body: JSON, or a multipart upload (body, content type).
enum Body<'a> {
    Json(&'a Value),
    Form(&'a [u8], &'a str),
}

#[derive(Deserialize)]
#[serde(default)]
#[derive(Default)]
struct Envelope {
    ok: bool,
    result: Option<Value>,
    description: Option<String>,
    error_code: Option<i64>,
    parameters: Option<Parameters>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Parameters {
    retry_after: Option<u64>,
}

/// The Bot API for one token.
pub struct Api {
    client: reqwest::Client,
    /// `<api_base>/bot<token>/`: a secret, never logged.
    base: String,
    /// `<api_base>/file/bot<token>/`, where downloads come from.
    file_base: String,
    token: Secret,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Api(***)")
    }
}

impl Api {
    /// A client for `token` at `api_base` (`https://api.telegram.org`, a local Bot API server, a test fake).
    pub fn new(api_base: &str, token: Secret) -> Result<Api, ApiError> {
        let client = shared_client()?;
        let api_base = api_base.trim_end_matches('/');
        let base = format!("{api_base}/bot{}/", token.expose());
        let file_base = format!("{api_base}/file/bot{}/", token.expose());
        Ok(Api { client, base, file_base, token })
    }

    /// `getMe`: who the bot is; fails with 401 on a bad token.
    pub async fn get_me(&self) -> Result<User, ApiError> {
        self.call("getMe", &json!({}), CALL_TIMEOUT).await
    }

    /// `getUpdates`: a long poll for messages from `offset` on.
    pub async fn get_updates(&self, offset: i64) -> Result<Vec<Update>, ApiError> {
        let body =
            json!({"offset": offset, "timeout": POLL_TIMEOUT_SECS, "allowed_updates": ["message", "callback_query"]});
        // An update we cannot read must not stall the poller on it: keep its id, drop the rest.
        let raw: Vec<Value> = self.call("getUpdates", &body, POLL_HTTP_TIMEOUT).await?;
        Ok(raw
            .into_iter()
            .map(|v| {
                serde_json::from_value::<Update>(v.clone()).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "an unreadable Telegram update was skipped");
                    Update { update_id: v.get("update_id").and_then(Value::as_i64).unwrap_or(0), ..Default::default() }
                })
            })
            .collect())
    }

    /// `sendMessage`; `html` sets `parse_mode=HTML`.
    pub async fn send_message(&self, chat_id: &str, text: &str, html: bool) -> Result<(), ApiError> {
        self.send_message_with(chat_id, text, html, None).await.map(drop)
    }

    /// `sendMessage` with an optional inline keyboard; the new message's id.
    pub async fn send_message_with(
        &self,
        chat_id: &str,
        text: &str,
        html: bool,
        markup: Option<&Value>,
    ) -> Result<i64, ApiError> {
        let mut body =
            json!({"chat_id": chat_id_value(chat_id), "text": text, "link_preview_options": {"is_disabled": true}});
        if html {
            body["parse_mode"] = json!("HTML");
        }
        if let Some(markup) = markup {
            body["reply_markup"] = markup.clone();
        }
        let sent: Message = self.call("sendMessage", &body, CALL_TIMEOUT).await?;
        Ok(sent.message_id)
    }

    /// `editMessageText` (plain text, or HTML), replacing the inline keyboard
    /// with `markup` (`None`: none). "Not modified" counts as done.
    pub async fn edit_message_text(
        &self,
        chat_id: &str,
        message_id: i64,
        text: &str,
        html: bool,
        markup: Option<&Value>,
    ) -> Result<(), ApiError> {
        let mut body = json!({"chat_id": chat_id_value(chat_id), "message_id": message_id, "text": text,
                              "link_preview_options": {"is_disabled": true}});
        if html {
            body["parse_mode"] = json!("HTML");
        }
        if let Some(markup) = markup {
            body["reply_markup"] = markup.clone();
        }
        not_modified_is_ok(self.call::<Value>("editMessageText", &body, CALL_TIMEOUT).await)
    }

    /// `deleteMessage`.
    pub async fn delete_message(&self, chat_id: &str, message_id: i64) -> Result<(), ApiError> {
        let body = json!({"chat_id": chat_id_value(chat_id), "message_id": message_id});
        self.call::<Value>("deleteMessage", &body, CALL_TIMEOUT).await.map(drop)
    }

    /// `answerCallbackQuery`: stops the button's spinner, with an optional toast.
    pub async fn answer_callback_query(&self, id: &str, text: Option<&str>) -> Result<(), ApiError> {
        let mut body = json!({"callback_query_id": id});
        if let Some(text) = text {
            body["text"] = json!(text);
        }
        self.call::<Value>("answerCallbackQuery", &body, CALL_TIMEOUT).await.map(drop)
    }

    /// `getFile`: where a file can be downloaded from.
    pub async fn get_file(&self, file_id: &str) -> Result<TgFile, ApiError> {
        self.call("getFile", &json!({"file_id": file_id}), CALL_TIMEOUT).await
    }

    /// Download a file `getFile` pointed to, refusing more than `cap` bytes
    /// (whatever the server claims: the body is read in chunks and counted).
    pub async fn download(&self, file_path: &str, cap: u64) -> Result<Vec<u8>, ApiError> {
        const METHOD: &str = "file download";
        if file_path.contains("..") || file_path.starts_with('/') {
            return Err(ApiError::Decode { method: METHOD, message: "an odd file path in getFile's answer".into() });
        }
        let url = format!("{}{file_path}", self.file_base);
        let scrub = |text: String| crate::provider::redact(&text, Some(&self.token));
        let transport = |e: reqwest::Error| ApiError::Transport(scrub(crate::provider::transport_message(e)));
        let exchange = async {
            let mut resp = self.client.get(&url).send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(redirected(METHOD, status, why));
            }
            if status != 200 {
                return Err(ApiError::Refused {
                    method: METHOD,
                    code: status,
                    description: format!("HTTP {status}"),
                    retry_after: None,
                });
            }
            if resp.content_length().is_some_and(|n| n > cap) {
                return Err(too_big(cap));
            }
            let mut data = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(transport)? {
                if data.len() as u64 + chunk.len() as u64 > cap {
                    return Err(too_big(cap));
                }
                data.extend_from_slice(&chunk);
            }
            Ok(data)
        };
        tokio::select! {
            r = exchange => r,
            _ = crate::util::timer::sleep(FILE_TIMEOUT) => {
                Err(ApiError::Transport(format!("the download did not finish within {FILE_TIMEOUT:?}")))
            }
        }
    }

    /// `sendPhoto` (`photo = true`) or `sendDocument`: a file upload with a caption.
    pub async fn send_file(
        &self,
        chat_id: &str,
        photo: bool,
        file_name: &str,
        content_type: &str,
        data: &[u8],
        caption: Option<&str>,
    ) -> Result<(), ApiError> {
        let (method, field) = if photo { ("sendPhoto", "photo") } else { ("sendDocument", "document") };
        let mut form = crate::util::multipart::Form::new(data).text("chat_id", chat_id);
        if let Some(caption) = caption.filter(|c| !c.trim().is_empty()) {
            form = form.text("caption", caption);
        }
        let (body, ctype) = form.file(field, file_name, content_type, data).finish();
        self.call_body::<Value>(method, Body::Form(&body, &ctype), FILE_TIMEOUT).await.map(drop)
    }

    /// `sendChatAction` with `typing` (shown for ~5 s or until a message is sent).
    pub async fn send_typing(&self, chat_id: &str) -> Result<(), ApiError> {
        let body = json!({"chat_id": chat_id_value(chat_id), "action": "typing"});
        self.call::<Value>("sendChatAction", &body, CALL_TIMEOUT).await.map(drop)
    }

    /// `setMyCommands`: the menu of commands clients show.
    pub async fn set_my_commands(&self, commands: &[(&str, &str)]) -> Result<(), ApiError> {
        let list: Vec<Value> = commands.iter().map(|(c, d)| json!({"command": c, "description": d})).collect();
        self.call::<Value>("setMyCommands", &json!({"commands": list}), CALL_TIMEOUT).await.map(drop)
    }

    /// `deleteWebhook`: long polling is refused (409) while a webhook is set.
    pub async fn delete_webhook(&self) -> Result<(), ApiError> {
        self.call::<Value>("deleteWebhook", &json!({"drop_pending_updates": false}), CALL_TIMEOUT).await.map(drop)
    }

    /// One call, with short 429s waited out.
    async fn call<T: DeserializeOwned>(
        &self,
        method: &'static str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        self.call_body(method, Body::Json(body), timeout).await
    }

    async fn call_body<T: DeserializeOwned>(
        &self,
        method: &'static str,
        body: Body<'_>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let mut attempt = 0;
        loop {
            match self.call_once(method, &body, timeout).await {
                Err(ApiError::Refused { code: 429, retry_after: Some(secs), .. })
                    if secs <= MAX_INLINE_RETRY_AFTER && attempt < MAX_429_RETRIES =>
                {
                    attempt += 1;
                    tracing::warn!(method, retry_after = secs, "Telegram rate limit (429): waiting as asked");
                    tokio::time::sleep(Duration::from_secs(secs.max(1))).await;
                }
                other => return other,
            }
        }
    }

    async fn call_once<T: DeserializeOwned>(
        &self,
        method: &'static str,
        body: &Body<'_>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = format!("{}{method}", self.base);
        let scrub = |text: String| crate::provider::redact(&text, Some(&self.token));
        let transport = |e: reqwest::Error| ApiError::Transport(scrub(crate::provider::transport_message(e)));
        let exchange = async {
            let request = match body {
                Body::Json(v) => self.client.post(&url).json(v),
                Body::Form(data, ctype) => {
                    self.client.post(&url).header(reqwest::header::CONTENT_TYPE, *ctype).body(data.to_vec())
                }
            };
            let resp = request.send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(redirected(method, status, why));
            }
            let bytes = resp.bytes().await.map_err(transport)?;
            Ok::<_, ApiError>((status, bytes))
        };
        // The limit is a kernel timer (one wake-up) rather than reqwest's, which
        // sits in tokio's timer wheel and wakes an idle poller several times per poll.
        let (status, bytes) = tokio::select! {
            r = exchange => r?,
            _ = crate::util::timer::sleep(timeout) => {
                return Err(ApiError::Transport(format!("no answer to {method} within {timeout:?}")));
            }
        };
        let envelope: Envelope = serde_json::from_slice(&bytes).map_err(|e| {
            if status >= 400 {
                // A proxy's HTML error page, say: report the status.
                ApiError::Refused { method, code: status, description: format!("HTTP {status}"), retry_after: None }
            } else {
                ApiError::Decode { method, message: scrub(e.to_string()) }
            }
        })?;
        if !envelope.ok {
            let code = envelope.error_code.and_then(|c| u16::try_from(c).ok()).unwrap_or(status);
            return Err(ApiError::Refused {
                method,
                code,
                description: scrub(envelope.description.unwrap_or_else(|| format!("HTTP {status}"))),
                retry_after: envelope.parameters.and_then(|p| p.retry_after),
            });
        }
        serde_json::from_value(envelope.result.unwrap_or(Value::Null))
            .map_err(|e| ApiError::Decode { method, message: scrub(e.to_string()) })
    }
}

/// One HTTP client for every `Api` in the process: the start-up token check,
/// the poller and the channel, across reloads. Each client loads the system's
/// CA store; memory freed by a dropped one is not given back to the OS.
fn shared_client() -> Result<reqwest::Client, ApiError> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    // No total timeout on the client: each call sets its own (the long poll needs > 50 s).
    let client = crate::provider::http_client_builder(Duration::ZERO)
        // No idle timeout on pooled connections: hyper's pool checks it with a
        // task sleeping on tokio's timer wheel, started whenever a connection
        // comes back idle and ended when the pool is found empty. The long
        // poll takes its connection back out at once, so one such 90 s sleep
        // ran every other poll (three wake-ups each: 1.8 a minute for nothing).
        // An idle connection is still dropped when Telegram closes it; at most
        // two are kept (the poll's and one for sending).
        .pool_idle_timeout(None)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .build()
        .map_err(|e| ApiError::Transport(format!("cannot build the HTTP client: {e}")))?;
    Ok(CLIENT.get_or_init(|| client).clone())
}

/// A redirect, not followed: the token is in the URL path ([`crate::util::secrets::redirect_refusal`]).
fn redirected(method: &'static str, code: u16, why: String) -> ApiError {
    ApiError::Refused { method, code, description: format!("{why} ([telegram] api_base)"), retry_after: None }
}

fn too_big(cap: u64) -> ApiError {
    ApiError::Refused {
        method: "file download",
        code: 413,
        description: format!("the file is larger than {} MB", cap / (1024 * 1024)),
        retry_after: None,
    }
}

/// Editing a message to what it already says is refused with "message is not
/// modified": for us that is success.
fn not_modified_is_ok(r: Result<Value, ApiError>) -> Result<(), ApiError> {
    match r {
        Err(ApiError::Refused { code: 400, description, .. }) if description.contains("not modified") => Ok(()),
        other => other.map(drop),
    }
}

/// A chat id as the API wants it: a number, or a `@channelname` string.
fn chat_id_value(chat_id: &str) -> Value {
    chat_id.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::from(chat_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_are_read_tolerantly() {
        let v = json!({"update_id": 7, "message": {"message_id": 1, "date": 0, "chat": {"id": -100, "type": "supergroup", "title": "x"},
            "from": {"id": 5, "is_bot": false, "first_name": "A", "username": "ann", "language_code": "en"},
            "caption": "a photo", "photo": [{"file_id": "x"}], "new_field": {"deep": true}}});
        let u: Update = serde_json::from_value(v).unwrap();
        let m = u.message.unwrap();
        assert_eq!((u.update_id, m.chat.id, m.chat.kind.as_str()), (7, -100, "supergroup"));
        assert_eq!(m.caption.as_deref(), Some("a photo"));
        assert_eq!(m.from.unwrap().username.as_deref(), Some("ann"));
    }

    #[test]
    fn errors_are_classified() {
        let refused =
            |code, d: &str| ApiError::Refused { method: "sendMessage", code, description: d.into(), retry_after: None };
        assert!(refused(400, "Bad Request: can't parse entities: unclosed tag").is_bad_markup());
        assert!(!refused(400, "Bad Request: chat not found").is_retryable());
        assert!(!refused(403, "Forbidden: bot was blocked by the user").is_retryable());
        assert!(refused(429, "Too Many Requests").is_retryable());
        assert!(refused(502, "Bad Gateway").is_retryable());
        assert!(refused(401, "Unauthorized").is_unauthorized());
        assert!(ApiError::Transport("refused".into()).is_retryable());
    }

    #[test]
    fn chat_ids_are_numbers_or_names() {
        assert_eq!(chat_id_value("-100123"), json!(-100123));
        assert_eq!(chat_id_value("@news"), json!("@news"));
    }

    /// The stall watchdog: a server that accepts and then says nothing.
    #[tokio::test]
    async fn a_silent_server_times_out_without_leaking_the_token() {
        crate::install_crypto();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let api = Api::new(&format!("http://{addr}"), Secret::new("123:SECRET")).unwrap();
        let err = api.call::<Value>("getUpdates", &json!({}), Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(err, ApiError::Transport(_)) && err.is_retryable(), "{err}");
        assert!(err.to_string().contains("no answer to getUpdates"), "{err}");
        assert!(!err.to_string().contains("SECRET"));
        // A refused connection names no URL either.
        hold.abort();
        let refused = Api::new("http://127.0.0.1:1", Secret::new("123:SECRET")).unwrap();
        let err = refused.get_me().await.unwrap_err();
        assert!(!err.to_string().contains("SECRET") && !err.to_string().contains("/bot"), "{err}");
    }

    #[test]
    fn the_token_is_not_in_debug_output() {
        crate::install_crypto();
        let api = Api::new("http://127.0.0.1:1", Secret::new("123:SECRET")).unwrap();
        assert!(!format!("{api:?}").contains("SECRET"));
    }
}
