//! Feishu / Lark Open Platform, the wire only: the long connection's frames
//! ([`frame`]), the endpoint call that opens it, the tenant access token,
//! and the few REST calls a chat bot needs (send, update a card, recall,
//! upload an image or a file, who am I).
//!
//! Both platforms are one API at two hosts (`open.feishu.cn`,
//! `open.larksuite.com`): the caller passes the base URL.
//!
//! - **Endpoint** (`POST /callback/ws/endpoint`, body `{"AppID","AppSecret"}`,
//!   as the official SDKs' `ws` clients do): a `wss://` URL with
//!   `device_id` and `service_id` in its query, and a `ClientConfig`
//!   (ping interval, reconnect count / interval / nonce, in seconds). Code
//!   1 and 1000040343 are the server's trouble (retry); any other non-zero
//!   code is ours (a wrong secret, the long connection not enabled).
//! - **Token** (`POST /open-apis/auth/v3/tenant_access_token/internal`):
//!   kept until 5 minutes before `expire`, fetched again then, and at once
//!   when a call answers 99991663 / 99991661 / 99991668 (token invalid,
//!   missing, expired): that call is retried once with the new token.
//! - The token travels only in the `Authorization` header; no redirect is
//!   followed (a 3xx would take the header's secret elsewhere): it is an
//!   error naming where it pointed.
//! - **Uploads** ("Upload image" `POST /open-apis/im/v1/images`, "Upload
//!   file" `POST /open-apis/im/v1/files`, both `multipart/form-data`): an
//!   image at most 10 MB ([`MAX_IMAGE`]), a file at most 30 MB
//!   ([`MAX_FILE`]), neither empty (codes 234006 / 234010 otherwise); the
//!   answer's `image_key` / `file_key` goes into an `image` / `file` message.
//!   An upload has its own time limit ([`UPLOAD_TIMEOUT`] unless configured);
//!   the token refresh applies as to every call.
//! - Every answer is `{"code","msg",…}`; bodies are read up to 1 MiB.

pub mod frame;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Secret;

/// The HTTP limit for one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest image "Upload image" takes (10 MB).
pub const MAX_IMAGE: u64 = 10 * 1024 * 1024;
/// The largest file "Upload file" takes (30 MB).
pub const MAX_FILE: u64 = 30 * 1024 * 1024;
/// The default limit for one upload (a file of up to 30 MB over a slow uplink).
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest answer read.
const MAX_ANSWER: usize = 1024 * 1024;
/// A token is fetched again this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);
/// Codes that say the tenant token is invalid, missing or expired.
pub const TOKEN_CODES: [i64; 3] = [99991663, 99991661, 99991668];

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FeishuError {
    /// No answer: DNS, connection refused, TLS, timeout, reset.
    #[error("cannot reach the Feishu / Lark API: {0}")]
    Transport(String),
    /// An answer with an HTTP error or a non-zero `code`.
    #[error("the Feishu / Lark API refused {what} (HTTP {status}, code {code}): {msg}")]
    Refused { what: &'static str, status: u16, code: i64, msg: String },
    /// A redirect: not followed (it would carry the token).
    #[error("the Feishu / Lark API answered {what} with a redirect (HTTP {status}) to `{to}`: not followed; check [feishu] api_base")]
    Redirect { what: &'static str, status: u16, to: String },
    /// An answer we cannot read.
    #[error("cannot read the Feishu / Lark API's answer to {what}: {msg}")]
    Decode { what: &'static str, msg: String },
    /// A download larger than the caller takes.
    #[error("{what} is larger than the limit of {limit} bytes: not downloaded")]
    TooLarge { what: &'static str, limit: usize },
}

impl FeishuError {
    pub fn code(&self) -> Option<i64> {
        match self {
            FeishuError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            FeishuError::Refused { status, .. } | FeishuError::Redirect { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The token was refused (the call may be retried with a new one).
    pub fn is_token(&self) -> bool {
        self.code().is_some_and(|c| TOKEN_CODES.contains(&c))
    }

    /// Whether trying later may succeed: network, 5xx, 429, rate limits,
    /// an unreadable answer. A wrong app secret, a chat the bot is not in,
    /// a redirect: no.
    pub fn is_retryable(&self) -> bool {
        match self {
            FeishuError::Transport(_) | FeishuError::Decode { .. } => true,
            FeishuError::Redirect { .. } | FeishuError::TooLarge { .. } => false,
            FeishuError::Refused { status, code, .. } => {
                *status == 429 || *status >= 500 || *code == 99991400 || self.is_token()
            }
        }
    }
}

/// What the endpoint call gives: where to connect, and the server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsEndpoint {
    pub url: String,
    pub config: ClientConfig,
}

impl WsEndpoint {
    /// `service_id` from the URL's query (pings carry it), 0 when absent.
    pub fn service_id(&self) -> i32 {
        reqwest::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.query_pairs().find(|(k, _)| k == "service_id").and_then(|(_, v)| v.parse().ok()))
            .unwrap_or(0)
    }
}

/// `ClientConfig`, pushed by the server with the endpoint and in pongs (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ClientConfig {
    #[serde(rename = "ReconnectCount")]
    pub reconnect_count: i64,
    #[serde(rename = "ReconnectInterval")]
    pub reconnect_interval: u64,
    #[serde(rename = "ReconnectNonce")]
    pub reconnect_nonce: u64,
    #[serde(rename = "PingInterval")]
    pub ping_interval: u64,
}

impl Default for ClientConfig {
    /// The SDKs' defaults: ping every 2 min, reconnect for ever every 2 min, 30 s jitter.
    fn default() -> Self {
        ClientConfig { reconnect_count: -1, reconnect_interval: 120, reconnect_nonce: 30, ping_interval: 120 }
    }
}

/// One app's API client: the credentials, the cached tenant token.
pub struct Client {
    http: reqwest::Client,
    base: String,
    app_id: String,
    secret: Secret,
    token: Mutex<Option<(Secret, Instant)>>,
    /// How long one upload may take.
    upload_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "feishu::Client({}, {}, ***)", self.base, self.app_id)
    }
}

impl Client {
    /// A client for the app `app_id` at `base` (`https://open.feishu.cn`).
    pub fn new(base: &str, app_id: &str, secret: Secret) -> Result<Client, FeishuError> {
        let http = crate::provider::http_client_builder(Duration::ZERO)
            .pool_max_idle_per_host(2)
            .build()
            .map_err(|e| FeishuError::Transport(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            app_id: app_id.to_string(),
            secret,
            token: Mutex::new(None),
            upload_timeout: UPLOAD_TIMEOUT,
        })
    }

    /// The same client with another limit for one upload.
    pub fn with_upload_timeout(mut self, limit: Duration) -> Client {
        self.upload_timeout = limit;
        self
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// `POST /callback/ws/endpoint`: where to open the long connection.
    pub async fn ws_endpoint(&self) -> Result<WsEndpoint, FeishuError> {
        let body = json!({"AppID": self.app_id, "AppSecret": self.secret.expose()});
        let req = self
            .http
            .post(format!("{}/callback/ws/endpoint", self.base))
            .header("locale", "zh")
            .json(&body)
            .timeout(CALL_TIMEOUT);
        let v = self.send("the long-connection endpoint", req).await?;
        let data = &v["data"];
        let url = data["URL"]
            .as_str()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| FeishuError::Decode { what: "the long-connection endpoint", msg: "no URL".into() })?;
        let config = serde_json::from_value(data["ClientConfig"].clone()).unwrap_or_default();
        Ok(WsEndpoint { url: url.to_string(), config })
    }

    /// The tenant access token: the kept one while it is good, else a new one.
    pub async fn token(&self) -> Result<Secret, FeishuError> {
        if let Some((t, until)) = self.token.lock().ok().and_then(|t| t.clone()) {
            if Instant::now() < until {
                return Ok(t);
            }
        }
        let body = json!({"app_id": self.app_id, "app_secret": self.secret.expose()});
        let req = self
            .http
            .post(format!("{}/open-apis/auth/v3/tenant_access_token/internal", self.base))
            .json(&body)
            .timeout(CALL_TIMEOUT);
        let v = self.send("the tenant token", req).await?;
        let token = v["tenant_access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| FeishuError::Decode { what: "the tenant token", msg: "no tenant_access_token".into() })?;
        let expire = Duration::from_secs(v["expire"].as_u64().unwrap_or(7200));
        let until = Instant::now() + expire.saturating_sub(TOKEN_MARGIN);
        let token = Secret::new(token);
        if let Ok(mut t) = self.token.lock() {
            *t = Some((token.clone(), until));
        }
        Ok(token)
    }

    /// Forget the kept token (it was refused).
    pub fn drop_token(&self) {
        if let Ok(mut t) = self.token.lock() {
            *t = None;
        }
    }

    /// An authorized call; a refused token is fetched again and the call retried once.
    async fn authed(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Body<'_>,
    ) -> Result<Value, FeishuError> {
        for attempt in 0..2 {
            let token = self.token().await?;
            let mut req = self.http.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(token.expose());
            let mut timeout = CALL_TIMEOUT;
            match body {
                Body::None => {}
                Body::Json(b) => req = req.json(b),
                Body::Form(data, ctype) => {
                    req = req.header(reqwest::header::CONTENT_TYPE, ctype).body(data.to_vec());
                    timeout = self.upload_timeout;
                }
            }
            match self.send(what, req.timeout(timeout)).await {
                Err(e) if e.is_token() && attempt == 0 => {
                    tracing::info!(error = %e, "the Feishu / Lark tenant token was refused; fetching a new one");
                    self.drop_token();
                }
                r => return r,
            }
        }
        Err(FeishuError::Decode { what, msg: "the token was refused twice".into() })
    }

    /// `GET /open-apis/bot/v3/info`: the bot's own open_id and name.
    pub async fn bot_info(&self) -> Result<(String, String), FeishuError> {
        let v = self.authed("the bot info", reqwest::Method::GET, "/open-apis/bot/v3/info", Body::None).await?;
        let bot = &v["bot"];
        let id = bot["open_id"].as_str().unwrap_or_default().to_string();
        Ok((id, bot["app_name"].as_str().unwrap_or_default().to_string()))
    }

    /// `POST /open-apis/im/v1/messages?receive_id_type=chat_id`: the new message's id.
    /// `uuid` makes a retry of the same send one message (the API de-duplicates it for an hour).
    pub async fn send_message(
        &self,
        chat_id: &str,
        msg_type: &str,
        content: &Value,
        uuid: &str,
    ) -> Result<String, FeishuError> {
        let body = json!({"receive_id": chat_id, "msg_type": msg_type, "content": content.to_string(), "uuid": uuid});
        let v = self
            .authed(
                "a message",
                reqwest::Method::POST,
                "/open-apis/im/v1/messages?receive_id_type=chat_id",
                Body::Json(&body),
            )
            .await?;
        Ok(v["data"]["message_id"].as_str().unwrap_or_default().to_string())
    }

    /// `PATCH /open-apis/im/v1/messages/{id}`: a sent card replaced by `card`.
    pub async fn update_card(&self, message_id: &str, card: &Value) -> Result<(), FeishuError> {
        let path = format!("/open-apis/im/v1/messages/{}", enc(message_id));
        let body = json!({"content": card.to_string()});
        self.authed("a card update", reqwest::Method::PATCH, &path, Body::Json(&body)).await.map(drop)
    }

    /// `GET /open-apis/im/v1/messages/{id}/resources/{key}?type=image|file`
    /// ("Get resources in a message": the bytes of an image or file a user
    /// sent, up to the platform's 100 MB): at most `cap` bytes, else
    /// [`FeishuError::TooLarge`]; the answer's `Content-Type` with it.
    pub async fn resource(
        &self,
        message_id: &str,
        key: &str,
        image: bool,
        cap: usize,
    ) -> Result<(Vec<u8>, Option<String>), FeishuError> {
        let what = "a message's file";
        let kind = if image { "image" } else { "file" };
        let url =
            format!("{}/open-apis/im/v1/messages/{}/resources/{}?type={kind}", self.base, enc(message_id), enc(key));
        for attempt in 0..2 {
            let token = self.token().await?;
            let req = self.http.get(&url).bearer_auth(token.expose()).timeout(self.upload_timeout);
            let resp = req.send().await.map_err(|e| FeishuError::Transport(chain(&e)))?;
            let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
            let got = match resp.status().is_success() {
                true => bytes(resp, cap).await.map(|data| (data, ctype.clone())),
                false => {
                    self.answer(what, resp).await.and_then(|_| Err(FeishuError::Decode { what, msg: "no file".into() }))
                }
            };
            // A JSON answer may be the API's error (a JSON file the user sent is not one: it has no `code`).
            let refused = match &got {
                Ok((data, Some(t))) if t.starts_with("application/json") => refusal(what, data),
                _ => None,
            };
            match refused.map_or(got, Err) {
                Err(e) if e.is_token() && attempt == 0 => self.drop_token(),
                r => return r,
            }
        }
        Err(FeishuError::Decode { what, msg: "the token was refused twice".into() })
    }

    /// `DELETE /open-apis/im/v1/messages/{id}`: a message of ours recalled
    /// (the bot's own, within the tenant's recall window, 24 h by default).
    pub async fn recall(&self, message_id: &str) -> Result<(), FeishuError> {
        let path = format!("/open-apis/im/v1/messages/{}", enc(message_id));
        self.authed("a recall", reqwest::Method::DELETE, &path, Body::None).await.map(drop)
    }

    /// `POST /open-apis/im/v1/images` (multipart: `image_type=message`, `image`): the `image_key`.
    pub async fn upload_image(&self, name: &str, mime: &str, data: Vec<u8>) -> Result<String, FeishuError> {
        let form =
            crate::util::multipart::Form::new(&data).text("image_type", "message").file("image", name, mime, &data);
        drop(data);
        let (body, ctype) = form.finish();
        let v = self
            .authed("an image upload", reqwest::Method::POST, "/open-apis/im/v1/images", Body::Form(&body, &ctype))
            .await?;
        key(&v, "image_key", "an image upload")
    }

    /// `POST /open-apis/im/v1/files` (multipart: `file_type`, `file_name`, `file`): the `file_key`.
    pub async fn upload_file(&self, file: Upload<'_>) -> Result<String, FeishuError> {
        let Upload { file_type, name, mime, data } = file;
        let form = crate::util::multipart::Form::new(&data)
            .text("file_type", file_type)
            .text("file_name", name)
            .file("file", name, mime, &data);
        drop(data);
        let (body, ctype) = form.finish();
        let v = self
            .authed("a file upload", reqwest::Method::POST, "/open-apis/im/v1/files", Body::Form(&body, &ctype))
            .await?;
        key(&v, "file_key", "a file upload")
    }

    /// Send `req`; the answer's JSON when HTTP and `code` say success.
    async fn send(&self, what: &'static str, req: reqwest::RequestBuilder) -> Result<Value, FeishuError> {
        let resp = req.send().await.map_err(|e| FeishuError::Transport(chain(&e)))?;
        self.answer(what, resp).await
    }

    /// An answer's JSON when HTTP and `code` say success.
    async fn answer(&self, what: &'static str, resp: reqwest::Response) -> Result<Value, FeishuError> {
        let status = resp.status().as_u16();
        if resp.status().is_redirection() {
            let to = resp.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or("").to_string();
            return Err(FeishuError::Redirect { what, status, to });
        }
        let (body, _) = super::read_capped(resp, MAX_ANSWER).await.map_err(|e| FeishuError::Transport(chain(&e)))?;
        let v: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) if status >= 400 => {
                let msg = String::from_utf8_lossy(&body).chars().take(200).collect();
                return Err(FeishuError::Refused { what, status, code: -1, msg });
            }
            Err(e) => return Err(FeishuError::Decode { what, msg: e.to_string() }),
        };
        let code = v["code"].as_i64().unwrap_or(if status >= 400 { -1 } else { 0 });
        if status >= 400 || code != 0 {
            let msg = v["msg"].as_str().unwrap_or_default().to_string();
            return Err(FeishuError::Refused { what, status, code, msg });
        }
        Ok(v)
    }
}

/// A file for "Upload file": its `file_type` (opus, mp4, pdf, doc, xls,
/// ppt or stream), its name and MIME type, its bytes.
#[derive(Debug)]
pub struct Upload<'a> {
    pub file_type: &'a str,
    pub name: &'a str,
    pub mime: &'a str,
    pub data: Vec<u8>,
}

/// What an authorized call carries.
#[derive(Clone, Copy)]
enum Body<'a> {
    None,
    Json(&'a Value),
    /// A `multipart/form-data` body and its content type: an upload, with the upload timeout.
    Form(&'a [u8], &'a str),
}

/// At most `cap` bytes of a download, else [`FeishuError::TooLarge`].
async fn bytes(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, FeishuError> {
    let what = "a message's file";
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(FeishuError::TooLarge { what, limit: cap });
    }
    let (data, _) = super::read_capped(resp, cap + 1).await.map_err(|e| FeishuError::Transport(chain(&e)))?;
    match data.len() > cap {
        true => Err(FeishuError::TooLarge { what, limit: cap }),
        false => Ok(data),
    }
}

/// A JSON body `{"code": <non-zero>, "msg"}`: the API refusing.
fn refusal(what: &'static str, body: &[u8]) -> Option<FeishuError> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let code = v.get("code")?.as_i64().filter(|c| *c != 0)?;
    Some(FeishuError::Refused { what, status: 200, code, msg: v["msg"].as_str().unwrap_or_default().to_string() })
}

/// `data.<name>` of an answer, which must be there.
fn key(v: &Value, name: &str, what: &'static str) -> Result<String, FeishuError> {
    match v["data"][name].as_str().filter(|k| !k.is_empty()) {
        Some(k) => Ok(k.to_string()),
        None => Err(FeishuError::Decode { what, msg: format!("no {name} in the answer") }),
    }
}

/// An error and its causes, `a: b: c` (reqwest's own text is only "error sending request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = Some(e);
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.join(": ")
}

/// Percent-encode one path segment.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_to_retry() {
        let refused = |status, code| FeishuError::Refused { what: "x", status, code, msg: String::new() };
        assert!(refused(200, 99991663).is_token() && refused(200, 99991663).is_retryable());
        assert!(refused(503, 0).is_retryable() && refused(429, 0).is_retryable());
        assert!(!refused(400, 230002).is_retryable(), "the bot is not in the chat");
        assert!(!FeishuError::Redirect { what: "x", status: 302, to: "http://elsewhere".into() }.is_retryable());
        assert!(FeishuError::Transport("down".into()).is_retryable());
    }

    #[test]
    fn the_endpoint_names_its_service() {
        let e = WsEndpoint {
            url: "wss://msg-frontier.feishu.cn/ws/v2?fpid=493&device_id=7&service_id=33554678&ticket=x".into(),
            config: ClientConfig::default(),
        };
        assert_eq!(e.service_id(), 33554678);
        assert_eq!(WsEndpoint { url: "wss://h/ws".into(), ..e }.service_id(), 0);
        let c: ClientConfig = serde_json::from_str(
            r#"{"ReconnectCount":-1,"ReconnectInterval":120,"ReconnectNonce":30,"PingInterval":90}"#,
        )
        .unwrap();
        assert_eq!(c.ping_interval, 90);
        assert_eq!(enc("om_a/b"), "om_a%2Fb");
    }

    #[test]
    fn an_upload_without_its_key_is_an_error() {
        let ok = json!({"code": 0, "data": {"image_key": "img_v3_1"}});
        assert_eq!(key(&ok, "image_key", "x").unwrap(), "img_v3_1");
        assert!(key(&ok, "file_key", "x").is_err());
        assert!(key(&json!({"code": 0, "data": {"file_key": ""}}), "file_key", "x").is_err());
    }
}
