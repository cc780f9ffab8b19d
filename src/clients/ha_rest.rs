//! A client of Home Assistant's REST API ([`HaRest`]): the `ha_call_service`
//! and `ha_get_state` tools (`tools::homeassistant`) and the
//! `ha:notify.<service>` delivery channel (`channels::homeassistant`) share it.
//!
//! - **The operator's URL.** Every request goes to `[homeassistant] url`, a
//!   LAN address the owner wrote down; callers put only checked names into
//!   the path. Redirects are not followed (the token must not travel).
//! - **The token.** It is sent as `Authorization: Bearer` (marked sensitive
//!   for reqwest) and never appears in an error: errors name the path and HA's
//!   answer, not the request, and that answer is scrubbed of the token and of
//!   any credential it quotes (a proxy's error page may echo the request).
//! - **Bounded.** A response is read up to [`BODY_CAP`].

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::config::{HomeAssistantConfig, Secret};

/// Bytes of a response read at most (HA's answer to a service call lists every changed state).
pub const BODY_CAP: usize = 1024 * 1024;
/// One REST call, connect to the last byte: Home Assistant is on the LAN.
const TIMEOUT: Duration = Duration::from_secs(15);
/// Characters of an error body shown.
const ERROR_EXCERPT: usize = 300;

/// Why a REST call failed. Never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaError {
    #[error("Home Assistant at {url} cannot be reached: {reason}")]
    Transport { url: String, reason: String },
    #[error("Home Assistant answered {status} to {path}: {message}")]
    Status { status: u16, path: String, message: String },
}

impl HaError {
    /// Whether trying again later may help: the network, a timeout, 408/429/5xx.
    pub fn retryable(&self) -> bool {
        match self {
            HaError::Transport { .. } => true,
            HaError::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
        }
    }
}

/// Why `[homeassistant]` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaConfigError {
    #[error("[homeassistant] has no token: set {0} in the environment (or `token_env` / `token`)")]
    NoToken(String),
}

/// A client of one Home Assistant's REST API (`/api/...`).
pub struct HaRest {
    base: String,
    token: Secret,
    /// Built on first use (the daemon may never call HA).
    client: OnceLock<reqwest::Client>,
}

impl HaRest {
    /// `Ok(None)` without `[homeassistant] url`.
    pub fn from_config(c: &HomeAssistantConfig) -> Result<Option<HaRest>, HaConfigError> {
        let Some(url) = &c.url else { return Ok(None) };
        let token = c.token().ok_or_else(|| HaConfigError::NoToken(c.token_env().to_string()))?;
        Ok(Some(HaRest::new(url.as_str(), token)))
    }

    pub fn new(base: &str, token: Secret) -> HaRest {
        HaRest { base: base.trim_end_matches('/').to_string(), token, client: OnceLock::new() }
    }

    /// The base URL (`http://homeassistant.local:8123`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The token (the WebSocket client authenticates with it too).
    pub fn token(&self) -> &Secret {
        &self.token
    }

    fn client(&self) -> Result<&reqwest::Client, HaError> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        // The one policy of every client that carries a secret: no redirects.
        let client = crate::provider::http_client_builder(TIMEOUT)
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| HaError::Transport { url: self.base.clone(), reason: e.to_string() })?;
        Ok(self.client.get_or_init(|| client))
    }

    /// `GET` or `POST` (with a JSON body) `path`; the body of a 2xx answer.
    pub async fn request(&self, path: &str, body: Option<&Value>) -> Result<Vec<u8>, HaError> {
        let client = self.client()?;
        let url = format!("{}{path}", self.base);
        let mut auth =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {}", self.token.expose())).map_err(|_| {
                HaError::Status { status: 401, path: path.into(), message: "the token is not valid header text".into() }
            })?;
        auth.set_sensitive(true);
        let req = match body {
            Some(b) => client.post(&url).json(b),
            None => client.get(&url),
        };
        let transport = |e: reqwest::Error| HaError::Transport {
            url: self.base.clone(),
            reason: self.scrub(&error_chain(&e.without_url())),
        };
        let resp = req.header(reqwest::header::AUTHORIZATION, auth).send().await.map_err(transport)?;
        let status = resp.status();
        if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
            let message = format!("{why} ([homeassistant] url)");
            return Err(HaError::Status { status: status.as_u16(), path: path.to_string(), message });
        }
        let (bytes, _cut) = super::read_capped(resp, BODY_CAP).await.map_err(transport)?;
        if status.is_success() {
            return Ok(bytes);
        }
        let text = String::from_utf8_lossy(&bytes);
        // HA's errors are `{"message": "…"}` or plain text.
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| text.chars().take(ERROR_EXCERPT).collect());
        let message = self.scrub(message.trim());
        let message = match status.as_u16() {
            401 | 403 => format!("the token was refused ({message})"),
            _ => message,
        };
        Err(HaError::Status { status: status.as_u16(), path: path.to_string(), message })
    }

    /// `text` from Home Assistant (or a proxy before it) without the token or
    /// any credential it quoted back.
    pub fn scrub(&self, text: &str) -> String {
        crate::util::secrets::redact(text, &[self.token.expose()])
    }

    /// `POST /api/services/<domain>/<service>` with `data`.
    pub async fn call_service(&self, domain: &str, service: &str, data: &Value) -> Result<Vec<u8>, HaError> {
        self.request(&format!("/api/services/{domain}/{service}"), Some(data)).await
    }
}

/// An error and its causes, `a: b: c` (reqwest's own text is only "error sending request").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_to_retry_and_never_hold_the_token() {
        let e = HaError::Status { status: 503, path: "/api/x".into(), message: "busy".into() };
        assert!(e.retryable());
        assert!(!HaError::Status { status: 400, path: "/api/x".into(), message: "bad".into() }.retryable());
        let c = crate::config::Config::parse(
            "[homeassistant]\nurl = \"http://ha:8123\"\ntoken_env = \"BRAMBLE_TEST_NO_SUCH_HA_TOKEN\"\n",
            "c.toml".as_ref(),
        )
        .unwrap();
        let err = HaRest::from_config(&c.homeassistant).err().unwrap().to_string();
        assert!(err.contains("BRAMBLE_TEST_NO_SUCH_HA_TOKEN"), "{err}");
    }
}
