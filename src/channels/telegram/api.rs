//! A thin Telegram Bot API client over the crate's reqwest and serde.
//!
//! Why our own: teloxide adds ~1.25 MB and a second reqwest; we need six
//! methods (`getMe`, `getUpdates`, `sendMessage`, `sendChatAction`,
//! `setMyCommands`, `deleteWebhook`).
//!
//! - Every call is a JSON `POST` to `<api_base>/bot<token>/<method>`; every
//!   answer is `{"ok", "result" | "description", "error_code", "parameters"}`.
//!   Types are tolerant: unknown fields are ignored, missing ones default.
//! - A 429 is waited out here when `parameters.retry_after` is short, so callers
//!   see it only when Telegram asks for a long pause.
//! - The token is part of every URL: errors never carry a URL (`without_url`)
//!   and every message is scrubbed of the token anyway.

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
}

/// One update from `getUpdates`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Update {
    pub update_id: i64,
    pub message: Option<Message>,
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
        let base = format!("{}/bot{}/", api_base.trim_end_matches('/'), token.expose());
        Ok(Api { client, base, token })
    }

    /// `getMe`: who the bot is; fails with 401 on a bad token.
    pub async fn get_me(&self) -> Result<User, ApiError> {
        self.call("getMe", &json!({}), CALL_TIMEOUT).await
    }

    /// `getUpdates`: a long poll for messages from `offset` on.
    pub async fn get_updates(&self, offset: i64) -> Result<Vec<Update>, ApiError> {
        let body = json!({"offset": offset, "timeout": POLL_TIMEOUT_SECS, "allowed_updates": ["message"]});
        // An update we cannot read must not stall the poller on it: keep its id, drop the rest.
        let raw: Vec<Value> = self.call("getUpdates", &body, POLL_HTTP_TIMEOUT).await?;
        Ok(raw
            .into_iter()
            .map(|v| {
                serde_json::from_value::<Update>(v.clone()).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "an unreadable Telegram update was skipped");
                    Update { update_id: v.get("update_id").and_then(Value::as_i64).unwrap_or(0), message: None }
                })
            })
            .collect())
    }

    /// `sendMessage`; `html` sets `parse_mode=HTML`.
    pub async fn send_message(&self, chat_id: &str, text: &str, html: bool) -> Result<(), ApiError> {
        let mut body =
            json!({"chat_id": chat_id_value(chat_id), "text": text, "link_preview_options": {"is_disabled": true}});
        if html {
            body["parse_mode"] = json!("HTML");
        }
        self.call::<Value>("sendMessage", &body, CALL_TIMEOUT).await.map(drop)
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
        let mut attempt = 0;
        loop {
            match self.call_once(method, body, timeout).await {
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
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = format!("{}{method}", self.base);
        let scrub = |text: String| crate::provider::redact(&text, Some(&self.token));
        let transport = |e: reqwest::Error| ApiError::Transport(scrub(crate::provider::transport_message(e)));
        let exchange = async {
            let resp = self.client.post(&url).json(body).send().await.map_err(transport)?;
            let status = resp.status().as_u16();
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
    let client = crate::provider::http_client(Duration::ZERO).map_err(|e| ApiError::Transport(e.to_string()))?;
    Ok(CLIENT.get_or_init(|| client).clone())
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
