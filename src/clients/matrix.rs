//! A thin Matrix client-server API client over the crate's reqwest and serde.
//!
//! Why our own: matrix-sdk brings its own HTTP stack, a store, and (for
//! encrypted rooms) vodozemac and matrix-sdk-crypto — hundreds of crates
//! (docs/channels/matrix.md has the figures). An unencrypted room needs a
//! dozen plain HTTP calls: `whoami`, `login`, `/sync`, `join`, `leave`,
//! `send`, `typing`, `directory/room`, a room's state, the media repository's
//! upload and (authenticated) download.
//!
//! - The access token travels in the `Authorization` header, never in a URL,
//!   so an error cannot carry it; no redirect is followed anyway (a "moved"
//!   answer would take the header's secret to another host): it is an error
//!   naming where it pointed.
//! - Every refusal is `{"errcode", "error"}`; a 429's `retry_after_ms` is
//!   waited out here when short, so callers see it only for a long pause.
//! - Types are tolerant: events stay JSON values until the channel reads the
//!   few fields it needs ([`Event`]); an event it cannot read is skipped
//!   there, not a failed sync.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Secret;

/// How long `/sync` may hold the request open, in milliseconds.
pub const SYNC_TIMEOUT_MS: u64 = 30_000;
/// The HTTP limit for a long poll: the poll itself plus slack. Silence past it
/// is a stalled connection (a NAT dropped it): the poller reconnects.
pub const SYNC_HTTP_TIMEOUT: Duration = Duration::from_secs(SYNC_TIMEOUT_MS / 1000 + 15);
/// The HTTP limit for the other calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A 429 asking for at most this long is waited out inside the call.
const MAX_INLINE_RETRY_MS: u64 = 30_000;
/// How often a call is retried after such a 429.
const MAX_429_RETRIES: u32 = 3;
/// The largest answer read (a first `/sync` of a busy account is large).
const MAX_ANSWER: usize = 16 * 1024 * 1024;
/// The media repository's URI scheme.
const MXC_SCHEME: &str = "mxc://";
/// How long an upload or a download may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MatrixError {
    /// No answer: DNS, connection refused, TLS, timeout, reset.
    #[error("cannot reach the Matrix homeserver: {0}")]
    Transport(String),
    /// The homeserver answered with an error.
    #[error("the Matrix homeserver refused {what} (HTTP {code}{}): {message}", errcode_part(.errcode))]
    Refused { what: &'static str, code: u16, errcode: String, message: String, retry_after_ms: Option<u64> },
    /// An answer we cannot read.
    #[error("cannot read the Matrix homeserver's answer to {what}: {message}")]
    Decode { what: &'static str, message: String },
    /// No access token yet (password login has not happened).
    #[error("not logged in to Matrix: set [matrix] access_token_env, or user_id and password_env")]
    NoToken,
}

fn errcode_part(errcode: &str) -> String {
    if errcode.is_empty() {
        String::new()
    } else {
        format!(", {errcode}")
    }
}

impl MatrixError {
    pub fn code(&self) -> Option<u16> {
        match self {
            MatrixError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn errcode(&self) -> &str {
        match self {
            MatrixError::Refused { errcode, .. } => errcode,
            _ => "",
        }
    }

    /// The token is wrong or was logged out (`M_UNKNOWN_TOKEN`, `M_MISSING_TOKEN`, 401).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, MatrixError::NoToken)
            || self.code() == Some(401)
            || matches!(self.errcode(), "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN")
    }

    /// Whether trying later may succeed: network, 5xx, 429, and a refused
    /// token (a config fix and restart may mend it, so reports are kept).
    pub fn is_retryable(&self) -> bool {
        match self {
            MatrixError::Transport(_) | MatrixError::Decode { .. } | MatrixError::NoToken => true,
            MatrixError::Refused { code, .. } => *code == 429 || *code >= 500 || *code == 401,
        }
    }
}

/// One event, as the channel reads it; the rest stays in `content`/`unsigned`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub event_id: String,
    pub sender: String,
    pub state_key: Option<String>,
    pub content: Value,
    pub unsigned: Value,
    pub origin_server_ts: i64,
}

impl Event {
    /// A redacted event: its content is gone (`unsigned.redacted_because`, or an empty content).
    pub fn is_redacted(&self) -> bool {
        !self.unsigned["redacted_because"].is_null() || self.content.as_object().is_none_or(|c| c.is_empty())
    }

    /// `content.m.relates_to.rel_type` (`m.replace` for an edit, `m.annotation` for a reaction).
    pub fn rel_type(&self) -> Option<&str> {
        self.content["m.relates_to"]["rel_type"].as_str()
    }

    /// The event a reaction, an edit or a reply points at.
    pub fn relates_to(&self) -> Option<&str> {
        let r = &self.content["m.relates_to"];
        r["event_id"].as_str().or_else(|| r["m.in_reply_to"]["event_id"].as_str())
    }
}

/// Events as the server sent them: each read alone, so one odd event costs only itself.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Events {
    pub events: Vec<Value>,
}

impl Events {
    /// The readable events; an unreadable one is logged and skipped.
    pub fn read(&self) -> Vec<Event> {
        self.events
            .iter()
            .filter_map(|v| match serde_json::from_value::<Event>(v.clone()) {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::warn!(error = %e, "an unreadable Matrix event was skipped");
                    None
                }
            })
            .collect()
    }
}

/// A joined room in a sync answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct JoinedRoom {
    pub state: Events,
    pub timeline: Events,
}

/// A room we are invited to: its stripped state (the invite among it).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct InvitedRoom {
    pub invite_state: Events,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Rooms {
    pub join: BTreeMap<String, JoinedRoom>,
    pub invite: BTreeMap<String, InvitedRoom>,
    pub leave: BTreeMap<String, Value>,
}

/// One `/sync` answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Sync {
    pub next_batch: String,
    pub rooms: Rooms,
}

/// What a password login gives.
#[derive(Debug, Clone, Deserialize)]
pub struct LoginAnswer {
    pub user_id: String,
    pub access_token: String,
    #[serde(default)]
    pub device_id: String,
}

/// The sync filter: messages, reactions, membership and encryption only;
/// no presence, receipts, typing or account data (less to read on a Pi).
pub fn sync_filter() -> String {
    let types = ["m.room.message", "m.room.member", "m.room.encryption", "m.reaction"];
    json!({
        "presence": {"types": []},
        "account_data": {"types": []},
        "room": {
            "timeline": {"types": types, "limit": 50},
            "state": {"types": ["m.room.member", "m.room.encryption"], "lazy_load_members": true},
            "ephemeral": {"types": []},
            "account_data": {"types": []}
        }
    })
    .to_string()
}

/// The client-server API of one homeserver, for one account.
pub struct Client {
    http: reqwest::Client,
    /// `https://matrix.example.org` without the trailing slash.
    base: String,
    token: RwLock<Option<Secret>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "matrix::Client({}, ***)", self.base)
    }
}

impl Client {
    /// A client for `homeserver`; `token` may come later ([`Client::set_token`], after a password login).
    pub fn new(homeserver: &str, token: Option<Secret>) -> Result<Client, MatrixError> {
        // No idle timeout on pooled connections (as the Telegram client): hyper checks it with a
        // timer task started whenever the long poll hands its connection back, wake-ups for nothing.
        let http = crate::provider::http_client_builder(Duration::ZERO)
            .pool_idle_timeout(None)
            .pool_max_idle_per_host(2)
            .build()
            .map_err(|e| MatrixError::Transport(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client { http, base: homeserver.trim_end_matches('/').to_string(), token: RwLock::new(token) })
    }

    pub fn set_token(&self, token: Secret) {
        if let Ok(mut t) = self.token.write() {
            *t = Some(token);
        }
    }

    pub fn has_token(&self) -> bool {
        self.token.read().is_ok_and(|t| t.is_some())
    }

    fn token(&self) -> Option<Secret> {
        self.token.read().ok().and_then(|t| t.clone())
    }

    /// `POST /login` with a password: a new device and its token.
    pub async fn login_password(&self, user: &str, password: &Secret) -> Result<LoginAnswer, MatrixError> {
        let body = json!({
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user},
            "password": password.expose(),
            "initial_device_display_name": "bramble",
        });
        self.call("login", reqwest::Method::POST, "/_matrix/client/v3/login", Some(&body), false, CALL_TIMEOUT).await
    }

    /// `GET /account/whoami`: our user id; 401 on a bad token.
    pub async fn whoami(&self) -> Result<String, MatrixError> {
        let v: Value = self.get("whoami", "/_matrix/client/v3/account/whoami").await?;
        v["user_id"]
            .as_str()
            .map(str::to_string)
            .ok_or(MatrixError::Decode { what: "whoami", message: "no user_id".into() })
    }

    /// `GET /sync`: a long poll (`timeout_ms`) from `since` (`None`: the first sync).
    pub async fn sync(&self, since: Option<&str>, filter: &str, timeout_ms: u64) -> Result<Sync, MatrixError> {
        let mut path = format!("/_matrix/client/v3/sync?timeout={timeout_ms}&filter={}", enc(filter));
        if let Some(since) = since {
            path.push_str(&format!("&since={}", enc(since)));
        }
        let limit = Duration::from_millis(timeout_ms) + Duration::from_secs(15);
        self.call("sync", reqwest::Method::GET, &path, None, true, limit).await
    }

    /// `POST /join/{room}` (a room id or an alias); the joined room's id.
    pub async fn join(&self, room: &str) -> Result<String, MatrixError> {
        let v: Value = self.post("join", &format!("/_matrix/client/v3/join/{}", enc(room)), &json!({})).await?;
        Ok(v["room_id"].as_str().unwrap_or(room).to_string())
    }

    /// `POST /rooms/{room}/leave` (also rejects an invite).
    pub async fn leave(&self, room: &str) -> Result<(), MatrixError> {
        self.post::<Value>("leave", &format!("/_matrix/client/v3/rooms/{}/leave", enc(room)), &json!({}))
            .await
            .map(drop)
    }

    /// `PUT /rooms/{room}/send/{type}/{txn}`: the new event's id. The same
    /// `txn` sent twice is one event (the server remembers it per device).
    pub async fn send(&self, room: &str, kind: &str, txn: &str, content: &Value) -> Result<String, MatrixError> {
        let path = format!("/_matrix/client/v3/rooms/{}/send/{}/{}", enc(room), enc(kind), enc(txn));
        let v: Value = self.call("send", reqwest::Method::PUT, &path, Some(content), true, CALL_TIMEOUT).await?;
        v["event_id"]
            .as_str()
            .map(str::to_string)
            .ok_or(MatrixError::Decode { what: "send", message: "no event_id".into() })
    }

    /// `PUT /rooms/{room}/redact/{event}/{txn}`: remove an event's content (our status message).
    pub async fn redact(&self, room: &str, event: &str, txn: &str) -> Result<(), MatrixError> {
        let path = format!("/_matrix/client/v3/rooms/{}/redact/{}/{}", enc(room), enc(event), enc(txn));
        self.call::<Value>("redact", reqwest::Method::PUT, &path, Some(&json!({})), true, CALL_TIMEOUT).await.map(drop)
    }

    /// `PUT /rooms/{room}/typing/{user}`: typing for `timeout_ms`, or stopped.
    pub async fn typing(&self, room: &str, user: &str, on: bool, timeout_ms: u64) -> Result<(), MatrixError> {
        let path = format!("/_matrix/client/v3/rooms/{}/typing/{}", enc(room), enc(user));
        let body = if on { json!({"typing": true, "timeout": timeout_ms}) } else { json!({"typing": false}) };
        self.call::<Value>("typing", reqwest::Method::PUT, &path, Some(&body), true, CALL_TIMEOUT).await.map(drop)
    }

    /// `GET /directory/room/{alias}`: the room id an alias names.
    pub async fn resolve_alias(&self, alias: &str) -> Result<String, MatrixError> {
        let v: Value = self.get("alias lookup", &format!("/_matrix/client/v3/directory/room/{}", enc(alias))).await?;
        v["room_id"]
            .as_str()
            .map(str::to_string)
            .ok_or(MatrixError::Decode { what: "alias lookup", message: "no room_id".into() })
    }

    /// `GET /rooms/{room}/state/{type}/{key}`: one state event's content (404: none).
    pub async fn state(&self, room: &str, kind: &str, key: &str) -> Result<Value, MatrixError> {
        let path = format!("/_matrix/client/v3/rooms/{}/state/{}/{}", enc(room), enc(kind), enc(key));
        self.get("room state", &path).await
    }

    /// `GET /joined_rooms`.
    pub async fn joined_rooms(&self) -> Result<Vec<String>, MatrixError> {
        let v: Value = self.get("joined_rooms", "/_matrix/client/v3/joined_rooms").await?;
        Ok(v["joined_rooms"].as_array().into_iter().flatten().filter_map(|r| r.as_str().map(str::to_string)).collect())
    }

    /// `POST /media/v3/upload`: the file's `mxc://` URI.
    pub async fn upload(&self, name: &str, content_type: &str, data: Vec<u8>) -> Result<String, MatrixError> {
        const WHAT: &str = "upload";
        let url = format!("{}/_matrix/media/v3/upload?filename={}", self.base, enc(name));
        let token = self.token().ok_or(MatrixError::NoToken)?;
        let req = self
            .http
            .post(&url)
            .bearer_auth(token.expose())
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(data);
        let v: Value = self.exchange(WHAT, req, FILE_TIMEOUT).await?;
        v["content_uri"]
            .as_str()
            .map(str::to_string)
            .ok_or(MatrixError::Decode { what: WHAT, message: "no content_uri".into() })
    }

    /// Download `mxc://server/id` (authenticated media, `/client/v1/media`),
    /// refusing more than `cap` bytes whatever the server claims.
    pub async fn download(&self, mxc: &str, cap: u64) -> Result<Vec<u8>, MatrixError> {
        const WHAT: &str = "media download";
        let not_mxc = || MatrixError::Decode { what: WHAT, message: format!("`{mxc}` is not a media URI") };
        let Some((server, id)) = mxc.strip_prefix(MXC_SCHEME).and_then(|r| r.split_once('/')) else {
            return Err(not_mxc());
        };
        if server.is_empty() || id.is_empty() || id.contains('/') {
            return Err(not_mxc());
        }
        let url = format!("{}/_matrix/client/v1/media/download/{}/{}", self.base, enc(server), enc(id));
        let token = self.token().ok_or(MatrixError::NoToken)?;
        let fetch = async {
            let mut resp = self.http.get(&url).bearer_auth(token.expose()).send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(refused(WHAT, status, "", why));
            }
            if status != 200 {
                return Err(refused(WHAT, status, "", format!("HTTP {status}")));
            }
            if resp.content_length().is_some_and(|n| n > cap) {
                return Err(refused(WHAT, 413, "", format!("the file is larger than {} bytes", cap)));
            }
            let mut data = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(transport)? {
                if data.len() as u64 + chunk.len() as u64 > cap {
                    return Err(refused(WHAT, 413, "", format!("the file is larger than {} bytes", cap)));
                }
                data.extend_from_slice(&chunk);
            }
            Ok(data)
        };
        tokio::select! {
            r = fetch => r,
            _ = crate::util::timer::sleep(FILE_TIMEOUT) => {
                Err(MatrixError::Transport(format!("the download did not finish within {FILE_TIMEOUT:?}")))
            }
        }
    }

    async fn get<T: DeserializeOwned>(&self, what: &'static str, path: &str) -> Result<T, MatrixError> {
        self.call(what, reqwest::Method::GET, path, None, true, CALL_TIMEOUT).await
    }

    async fn post<T: DeserializeOwned>(&self, what: &'static str, path: &str, body: &Value) -> Result<T, MatrixError> {
        self.call(what, reqwest::Method::POST, path, Some(body), true, CALL_TIMEOUT).await
    }

    /// One call, with short 429s waited out.
    async fn call<T: DeserializeOwned>(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        auth: bool,
        timeout: Duration,
    ) -> Result<T, MatrixError> {
        let mut attempt = 0;
        loop {
            let mut req = self.http.request(method.clone(), format!("{}{path}", self.base));
            if auth {
                let token = self.token().ok_or(MatrixError::NoToken)?;
                req = req.bearer_auth(token.expose());
            }
            if let Some(body) = body {
                req = req.json(body);
            }
            match self.exchange(what, req, timeout).await {
                Err(MatrixError::Refused { code: 429, retry_after_ms, .. })
                    if retry_after_ms.unwrap_or(1000) <= MAX_INLINE_RETRY_MS && attempt < MAX_429_RETRIES =>
                {
                    attempt += 1;
                    let ms = retry_after_ms.unwrap_or(1000).max(100);
                    tracing::warn!(what, retry_after_ms = ms, "Matrix rate limit (429): waiting as asked");
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                other => return other,
            }
        }
    }

    /// Send `req`, read the answer (capped), map an error answer to [`MatrixError::Refused`].
    async fn exchange<T: DeserializeOwned>(
        &self,
        what: &'static str,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, MatrixError> {
        let exchange = async {
            let resp = req.send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(refused(what, status, "", format!("{why} ([matrix] homeserver)")));
            }
            let (bytes, more) = super::read_capped(resp, MAX_ANSWER).await.map_err(transport)?;
            if more {
                return Err(MatrixError::Decode { what, message: format!("the answer is over {MAX_ANSWER} bytes") });
            }
            Ok::<_, MatrixError>((status, bytes))
        };
        let (status, bytes) = tokio::select! {
            r = exchange => r?,
            _ = crate::util::timer::sleep(timeout) => {
                return Err(MatrixError::Transport(format!("no answer to {what} within {timeout:?}")));
            }
        };
        if !(200..300).contains(&status) {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let errcode = v["errcode"].as_str().unwrap_or_default();
            let message =
                v["error"].as_str().map(|s| s.chars().take(300).collect()).unwrap_or(format!("HTTP {status}"));
            let mut e = refused(what, status, errcode, message);
            if let MatrixError::Refused { retry_after_ms, .. } = &mut e {
                *retry_after_ms = v["retry_after_ms"].as_u64();
            }
            return Err(e);
        }
        serde_json::from_slice(&bytes).map_err(|e| MatrixError::Decode { what, message: e.to_string() })
    }
}

fn refused(what: &'static str, code: u16, errcode: &str, message: String) -> MatrixError {
    MatrixError::Refused { what, code, errcode: errcode.to_string(), message, retry_after_ms: None }
}

/// A transport error without its URL (it may name a room; never a token: that is a header).
fn transport(e: reqwest::Error) -> MatrixError {
    MatrixError::Transport(crate::provider::transport_message(e))
}

/// Percent-encode a path segment or a query value (everything but RFC 3986's unreserved characters).
pub fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(enc("!abc:example.org"), "%21abc%3Aexample.org");
        assert_eq!(enc("#room:x/../y"), "%23room%3Ax%2F..%2Fy");
        assert_eq!(enc("é"), "%C3%A9");
    }

    #[test]
    fn events_are_read_one_by_one() {
        let e: Events = serde_json::from_value(json!({"events": [
            {"type": "m.room.message", "event_id": "$1", "sender": "@a:x", "content": {"body": "hi", "msgtype": "m.text"}},
            {"type": 5},
            {"type": "m.room.message", "event_id": "$2", "sender": "@a:x", "content": {},
             "unsigned": {"redacted_because": {}}},
            {"type": "m.room.message", "event_id": "$3", "sender": "@a:x",
             "content": {"body": "* fix", "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}}}
        ]}))
        .unwrap();
        let read = e.read();
        assert_eq!(read.len(), 3, "the malformed one is skipped");
        assert!(!read[0].is_redacted() && read[1].is_redacted());
        assert_eq!((read[2].rel_type(), read[2].relates_to()), (Some("m.replace"), Some("$1")));
    }

    #[test]
    fn errors_are_classified() {
        let r = |code, errcode: &str| refused("send", code, errcode, "x".into());
        assert!(r(401, "M_UNKNOWN_TOKEN").is_unauthorized() && r(401, "M_UNKNOWN_TOKEN").is_retryable());
        assert!(!r(403, "M_FORBIDDEN").is_retryable());
        assert!(r(429, "M_LIMIT_EXCEEDED").is_retryable() && r(502, "").is_retryable());
        assert!(r(403, "M_FORBIDDEN").to_string().contains("HTTP 403, M_FORBIDDEN"));
    }

    #[test]
    fn the_token_is_not_in_debug_output() {
        crate::install_crypto();
        let c = Client::new("http://127.0.0.1:1", Some(Secret::new("syt_SECRET"))).unwrap();
        assert!(!format!("{c:?}").contains("SECRET"));
    }
}
