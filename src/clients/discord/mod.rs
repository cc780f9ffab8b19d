//! Discord's REST API v10 and gateway wire format, over the crate's reqwest
//! and the shared WebSocket client ([`crate::clients::ws`]).
//!
//! Why our own (not serenity or twilight): a bot that reads DMs and a few
//! channels needs a handful of REST calls — `users/@me`, `gateway/bot`,
//! create / edit / delete a message, typing, an interaction's callback — and
//! the gateway messages in [`gateway`]; those crates bring their own HTTP,
//! TLS and WebSocket stacks and a cache.
//!
//! - **Auth**: `Authorization: Bot <token>` on every API call, never in a
//!   URL; no redirect is followed (it would take the header to another
//!   host): it is an error naming where it pointed. Attachment downloads go
//!   to Discord's CDN without the header.
//! - **Rate limits** ("Rate Limits" page): each answer's
//!   `X-RateLimit-Remaining` / `X-RateLimit-Reset-After` are kept per route
//!   (method + the channel or webhook the path names): a call to a route
//!   with none left waits out the reset when short, or fails as rate-limited
//!   without asking. A 429's `retry_after` (seconds, in the body; the
//!   `Retry-After` header otherwise) is waited out here when short and
//!   retried; a long one is handed up (the outbox retries later), and a
//!   global one holds every route.
//! - **Messages** ("Message" resource): JSON, or `multipart/form-data` with a
//!   `payload_json` part and `files[n]` for attachments.

pub mod gateway;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::Secret;

/// The HTTP limit for a call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// An upload or a download.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// A rate-limit wait up to this long happens inside the call.
pub const MAX_INLINE_WAIT: Duration = Duration::from_secs(10);
/// How often a call is retried after short 429s.
const MAX_429_RETRIES: u32 = 3;
/// The largest answer read.
const MAX_ANSWER: usize = 2 * 1024 * 1024;
/// Routes remembered; the map is cleared when full.
const MAX_ROUTES: usize = 512;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DiscordError {
    /// No answer: DNS, connection refused, TLS, timeout, reset.
    #[error("cannot reach Discord: {0}")]
    Transport(String),
    /// Discord answered with an error (`{"code", "message"}`).
    #[error("Discord refused {what} (HTTP {status}{}): {message}", code_part(*.code))]
    Refused { what: &'static str, status: u16, code: u64, message: String },
    /// Rate limited for longer than is waited out inside a call.
    #[error("Discord rate-limits {what} for {:.1} s more", .retry_after.as_secs_f64())]
    RateLimited { what: &'static str, retry_after: Duration },
    /// An answer we cannot read.
    #[error("cannot read Discord's answer to {what}: {message}")]
    Decode { what: &'static str, message: String },
}

fn code_part(code: u64) -> String {
    if code == 0 {
        String::new()
    } else {
        format!(", code {code}")
    }
}

impl DiscordError {
    pub fn status(&self) -> Option<u16> {
        match self {
            DiscordError::Refused { status, .. } => Some(*status),
            DiscordError::RateLimited { .. } => Some(429),
            _ => None,
        }
    }

    /// The token is wrong (401).
    pub fn is_unauthorized(&self) -> bool {
        self.status() == Some(401)
    }

    /// Whether trying later may succeed: network, 5xx, 429, and a refused
    /// token (a config fix and a restart may mend it, so reports are kept).
    pub fn is_retryable(&self) -> bool {
        match self {
            DiscordError::Transport(_) | DiscordError::Decode { .. } | DiscordError::RateLimited { .. } => true,
            DiscordError::Refused { status, .. } => *status >= 500 || *status == 401 || *status == 429,
        }
    }
}

/// Where a route may be called again.
#[derive(Default)]
struct Limits {
    routes: HashMap<String, Instant>,
    global: Option<Instant>,
}

/// The REST API for one bot token.
pub struct Rest {
    http: reqwest::Client,
    /// `https://discord.com/api/v10` without the trailing slash.
    base: String,
    token: Secret,
    limits: Mutex<Limits>,
}

impl std::fmt::Debug for Rest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "discord::Rest({}, ***)", self.base)
    }
}

/// A file to attach: its name, content type and bytes.
pub struct FilePart<'a> {
    pub name: &'a str,
    pub mime: &'a str,
    pub data: &'a [u8],
}

impl Rest {
    pub fn new(base: &str, token: Secret) -> Result<Rest, DiscordError> {
        let http = crate::provider::http_client_builder(Duration::ZERO)
            .pool_idle_timeout(None)
            .pool_max_idle_per_host(2)
            .build()
            .map_err(|e| DiscordError::Transport(format!("cannot build the HTTP client: {e}")))?;
        Ok(Rest { http, base: base.trim_end_matches('/').to_string(), token, limits: Mutex::new(Limits::default()) })
    }

    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// `GET /users/@me`: the bot's user (`id`, `username`).
    pub async fn me(&self) -> Result<Value, DiscordError> {
        self.call("users/@me", reqwest::Method::GET, "/users/@me", None).await
    }

    /// `GET /gateway/bot`: the gateway's URL.
    pub async fn gateway_url(&self) -> Result<String, DiscordError> {
        let v = self.call("gateway/bot", reqwest::Method::GET, "/gateway/bot", None).await?;
        v["url"]
            .as_str()
            .map(str::to_string)
            .ok_or(DiscordError::Decode { what: "gateway/bot", message: "no url".into() })
    }

    /// `POST /channels/{id}/messages` (JSON): the new message's id.
    pub async fn create_message(&self, channel: u64, body: &Value) -> Result<u64, DiscordError> {
        let path = format!("/channels/{channel}/messages");
        let v = self.call("create message", reqwest::Method::POST, &path, Some(body)).await?;
        message_id(v, "create message")
    }

    /// `POST /channels/{id}/messages` with one file (`files[0]` and `payload_json`).
    pub async fn create_message_with_file(
        &self,
        channel: u64,
        body: &Value,
        file: FilePart<'_>,
    ) -> Result<u64, DiscordError> {
        let mut payload = body.clone();
        payload["attachments"] = json!([{"id": 0, "filename": file.name}]);
        let form = crate::util::multipart::Form::new(file.data)
            .text("payload_json", &payload.to_string())
            .file("files[0]", file.name, file.mime, file.data);
        let (data, ctype) = form.finish();
        let path = format!("/channels/{channel}/messages");
        let v = self.send("upload", reqwest::Method::POST, &path, Body::Form(data, ctype), FILE_TIMEOUT).await?;
        message_id(v, "upload")
    }

    /// `PATCH /channels/{id}/messages/{id}`.
    pub async fn edit_message(&self, channel: u64, message: u64, body: &Value) -> Result<(), DiscordError> {
        let path = format!("/channels/{channel}/messages/{message}");
        self.call("edit message", reqwest::Method::PATCH, &path, Some(body)).await.map(drop)
    }

    /// `DELETE /channels/{id}/messages/{id}`.
    pub async fn delete_message(&self, channel: u64, message: u64) -> Result<(), DiscordError> {
        let path = format!("/channels/{channel}/messages/{message}");
        self.call("delete message", reqwest::Method::DELETE, &path, None).await.map(drop)
    }

    /// `POST /channels/{id}/typing`: "typing…" for about 10 s.
    pub async fn typing(&self, channel: u64) -> Result<(), DiscordError> {
        self.call("typing", reqwest::Method::POST, &format!("/channels/{channel}/typing"), None).await.map(drop)
    }

    /// `POST /interactions/{id}/{token}/callback`: the answer to a button press.
    pub async fn interaction_callback(&self, id: u64, token: &str, body: &Value) -> Result<(), DiscordError> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(DiscordError::Decode { what: "interaction", message: "an odd interaction token".into() });
        }
        let path = format!("/interactions/{id}/{token}/callback");
        self.call("interaction callback", reqwest::Method::POST, &path, Some(body)).await.map(drop)
    }

    /// An attachment from Discord's CDN (no token sent), at most `cap` bytes.
    pub async fn download(&self, url: &str, cap: u64) -> Result<Vec<u8>, DiscordError> {
        const WHAT: &str = "attachment download";
        let fetch = async {
            let resp = self.http.get(url).send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(refused(WHAT, status, why));
            }
            if status != 200 {
                return Err(refused(WHAT, status, format!("HTTP {status}")));
            }
            if resp.content_length().is_some_and(|n| n > cap) {
                return Err(refused(WHAT, 413, format!("the file is larger than {cap} bytes")));
            }
            let (data, more) = super::read_capped(resp, cap as usize).await.map_err(transport)?;
            if more {
                return Err(refused(WHAT, 413, format!("the file is larger than {cap} bytes")));
            }
            Ok(data)
        };
        tokio::select! {
            r = fetch => r,
            _ = crate::util::timer::sleep(FILE_TIMEOUT) => Err(DiscordError::Transport(format!("the download did not finish within {FILE_TIMEOUT:?}"))),
        }
    }

    async fn call(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DiscordError> {
        let body = body.map_or(Body::None, |b| Body::Json(b.to_string()));
        self.send(what, method, path, body, CALL_TIMEOUT).await
    }

    /// One call: a route's known limit waited out, short 429s retried.
    async fn send(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Body,
        timeout: Duration,
    ) -> Result<Value, DiscordError> {
        let route = route_key(&method, path);
        let mut attempt = 0;
        loop {
            if let Some(wait) = self.wait_for(&route) {
                if wait > MAX_INLINE_WAIT {
                    return Err(DiscordError::RateLimited { what, retry_after: wait });
                }
                tokio::time::sleep(wait).await;
            }
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .header(reqwest::header::AUTHORIZATION, format!("Bot {}", self.token.expose()));
            req = match &body {
                Body::None if method == reqwest::Method::POST => req.header(reqwest::header::CONTENT_LENGTH, "0"),
                Body::None => req,
                Body::Json(j) => req.header(reqwest::header::CONTENT_TYPE, "application/json").body(j.clone()),
                Body::Form(d, t) => req.header(reqwest::header::CONTENT_TYPE, t.as_str()).body(d.clone()),
            };
            match self.exchange(what, &route, req, timeout).await {
                Err(DiscordError::RateLimited { retry_after, .. })
                    if retry_after <= MAX_INLINE_WAIT && attempt < MAX_429_RETRIES =>
                {
                    attempt += 1;
                    tracing::warn!(what, retry_after = ?retry_after, "Discord rate limit (429): waiting as asked");
                    tokio::time::sleep(retry_after).await;
                }
                other => return other,
            }
        }
    }

    /// How long `route` (or every route) must wait, if at all.
    fn wait_for(&self, route: &str) -> Option<Duration> {
        let limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let until = [limits.global, limits.routes.get(route).copied()].into_iter().flatten().max()?;
        until.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// Remember what the answer's headers say about `route`.
    fn learn(&self, route: &str, headers: &reqwest::header::HeaderMap, retry_after: Option<(Duration, bool)>) {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let remaining = header("x-ratelimit-remaining").and_then(|v| v.parse::<u64>().ok());
        let reset_after = header("x-ratelimit-reset-after").and_then(seconds);
        let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        if limits.routes.len() >= MAX_ROUTES {
            limits.routes.clear();
        }
        let now = Instant::now();
        match (retry_after, remaining, reset_after) {
            (Some((d, true)), _, _) => limits.global = Some(now + d),
            (Some((d, false)), _, _) => {
                limits.routes.insert(route.to_string(), now + d);
            }
            (None, Some(0), Some(d)) => {
                limits.routes.insert(route.to_string(), now + d);
            }
            _ => {
                limits.routes.remove(route);
            }
        }
    }

    async fn exchange(
        &self,
        what: &'static str,
        route: &str,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Value, DiscordError> {
        let exchange = async {
            let resp = req.send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
                return Err(refused(what, status, format!("{why} ([discord] api_base)")));
            }
            let headers = resp.headers().clone();
            let (bytes, more) = super::read_capped(resp, MAX_ANSWER).await.map_err(transport)?;
            if more {
                return Err(DiscordError::Decode { what, message: format!("the answer is over {MAX_ANSWER} bytes") });
            }
            Ok::<_, DiscordError>((status, headers, bytes))
        };
        let (status, headers, bytes) = tokio::select! {
            r = exchange => r?,
            _ = crate::util::timer::sleep(timeout) => {
                return Err(DiscordError::Transport(format!("no answer to {what} within {timeout:?}")));
            }
        };
        let v: Value =
            if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        if status == 429 {
            let header = headers.get("retry-after").and_then(|v| v.to_str().ok()).and_then(seconds);
            let wait = v["retry_after"].as_f64().and_then(|s| seconds(&s.to_string())).or(header);
            let wait = wait.unwrap_or(Duration::from_secs(1));
            let global = v["global"].as_bool().unwrap_or(false)
                || headers.get("x-ratelimit-global").is_some_and(|g| g.as_bytes().eq_ignore_ascii_case(b"true"));
            self.learn(route, &headers, Some((wait, global)));
            return Err(DiscordError::RateLimited { what, retry_after: wait });
        }
        self.learn(route, &headers, None);
        if !(200..300).contains(&status) {
            let message =
                v["message"].as_str().map(|s| s.chars().take(300).collect()).unwrap_or(format!("HTTP {status}"));
            return Err(DiscordError::Refused { what, status, code: v["code"].as_u64().unwrap_or(0), message });
        }
        if status != 204 && !bytes.is_empty() && v.is_null() {
            return Err(DiscordError::Decode { what, message: "not JSON".into() });
        }
        Ok(v)
    }
}

enum Body {
    None,
    Json(String),
    Form(Vec<u8>, String),
}

/// The route a limit applies to: the method and the path with ids kept only
/// for the top-level resource (Discord's "major parameters": channel,
/// guild, webhook), message ids folded.
fn route_key(method: &reqwest::Method, path: &str) -> String {
    let mut parts = Vec::new();
    for (i, seg) in path.split('/').filter(|s| !s.is_empty()).enumerate() {
        let id = seg.bytes().all(|b| b.is_ascii_digit());
        parts.push(if id && i > 1 { ":id" } else { seg });
        if parts.first() == Some(&"interactions") && i >= 1 {
            parts.truncate(1);
            break;
        }
    }
    format!("{method} /{}", parts.join("/"))
}

/// A count of seconds, whole or fractional (`"0.5"`, `"3"`), as a duration (at most a day).
fn seconds(text: &str) -> Option<Duration> {
    let s: f64 = text.trim().parse().ok()?;
    (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(86_400.0)))
}

fn message_id(v: Value, what: &'static str) -> Result<u64, DiscordError> {
    v["id"].as_str().and_then(|s| s.parse().ok()).ok_or(DiscordError::Decode { what, message: "no message id".into() })
}

fn refused(what: &'static str, status: u16, message: String) -> DiscordError {
    DiscordError::Refused { what, status, code: 0, message }
}

/// A transport error without its URL.
fn transport(e: reqwest::Error) -> DiscordError {
    DiscordError::Transport(crate::provider::transport_message(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_keep_the_major_id_only() {
        let post = reqwest::Method::POST;
        assert_eq!(route_key(&post, "/channels/12/messages"), "POST /channels/12/messages");
        assert_eq!(
            route_key(&reqwest::Method::PATCH, "/channels/12/messages/99"),
            route_key(&reqwest::Method::PATCH, "/channels/12/messages/98")
        );
        assert_ne!(route_key(&post, "/channels/12/messages"), route_key(&post, "/channels/13/messages"));
        assert_eq!(route_key(&post, "/interactions/5/tok/callback"), "POST /interactions");
    }

    #[test]
    fn seconds_and_errors() {
        assert_eq!(seconds("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(seconds("-1"), None);
        assert_eq!(seconds("NaN"), None);
        assert!(DiscordError::RateLimited { what: "x", retry_after: Duration::from_secs(60) }.is_retryable());
        assert!(!refused("x", 403, "Missing Access".into()).is_retryable());
        assert!(refused("x", 502, "x".into()).is_retryable());
    }

    #[test]
    fn a_used_up_route_waits() {
        crate::install_crypto();
        let r = Rest::new("http://127.0.0.1:1", Secret::new("SECRET")).unwrap();
        assert!(!format!("{r:?}").contains("SECRET"));
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("x-ratelimit-remaining", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-after", "30".parse().unwrap());
        r.learn("POST /channels/1/messages", &h, None);
        assert!(r.wait_for("POST /channels/1/messages").is_some_and(|d| d > MAX_INLINE_WAIT));
        assert!(r.wait_for("POST /channels/2/messages").is_none());
        r.learn("POST /channels/1/messages", &reqwest::header::HeaderMap::new(), None);
        assert!(r.wait_for("POST /channels/1/messages").is_none());
        r.learn("x", &reqwest::header::HeaderMap::new(), Some((Duration::from_secs(30), true)));
        assert!(r.wait_for("POST /channels/2/messages").is_some(), "a global limit holds every route");
    }
}
