//! LLM providers behind one trait.
//!
//! The agent loop speaks a single message format, close to OpenAI's chat format
//! (which is also what sessions store on disk, nanobot-compatible). Each backend
//! translates to and from its wire format:
//!
//! - [`openai`]: `/v1/chat/completions` — OpenAI, OpenRouter, DeepSeek, Ollama,
//!   llama.cpp server, vLLM, anything that speaks that dialect via `base_url`.
//! - [`anthropic`]: the Anthropic Messages API with tool use.
//! - [`transcribe`]: speech to text (`/v1/audio/transcriptions`) for voice notes.
//!
//! Both are thin, tolerant clients on `reqwest`: unknown fields are ignored and
//! odd-but-harmless values (an empty `finish_reason`, a missing `object`) are
//! accepted, because OpenAI-*compatible* servers differ in small ways that strict
//! SDK types turn into hard failures. Retries live in [`retry`] and are shared.

pub mod anthropic;
pub mod chain;
mod clients;
pub mod openai;
pub mod retry;
mod stream;
pub mod transcribe;
pub mod window;

use std::sync::Arc;

use crate::util::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation, in OpenAI chat format.
///
/// This is also the on-disk session line format (plus a `timestamp`), so the
/// field names follow OpenAI's: `tool_calls` on assistant messages, `tool_call_id`
/// on tool results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name on a tool result (Anthropic does not need it, some
    /// OpenAI-compatible servers want it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Images sent with a user message, for this turn's model calls only:
    /// never written to the session (its text names the inbox file instead,
    /// so session files stay small and history replays as text).
    #[serde(skip)]
    pub images: Vec<Image>,
}

/// An image part of a user message: sent as an OpenAI `image_url` data URL
/// or an Anthropic base64 `image` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `image/jpeg`, `image/png`, `image/webp`, `image/gif`.
    pub mime: String,
    /// The bytes, base64 (standard alphabet, padded).
    pub base64: std::sync::Arc<str>,
}

impl Image {
    /// An image of `mime` from its bytes.
    pub fn new(mime: impl Into<String>, bytes: &[u8]) -> Image {
        use base64::Engine as _;
        Image { mime: mime.into(), base64: base64::engine::general_purpose::STANDARD.encode(bytes).into() }
    }

    /// `data:<mime>;base64,<data>`.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime, self.base64)
    }
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Self::text(Role::System, text)
    }
    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::text(Role::Assistant, text)
    }
    fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            images: Vec::new(),
        }
    }
    /// An assistant message that asks for tool calls (with optional text).
    pub fn assistant_tool_calls(content: Option<String>, calls: Vec<ToolCall>) -> Self {
        Message {
            role: Role::Assistant,
            content,
            tool_calls: calls,
            tool_call_id: None,
            name: None,
            images: Vec::new(),
        }
    }
    /// The result of one tool call.
    pub fn tool_result(call_id: impl Into<String>, name: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            name: Some(name.into()),
            images: Vec::new(),
        }
    }
    /// The text content, or "" when there is none.
    pub fn text_content(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}

/// A tool call requested by the model, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

impl ToolCall {
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: id.into(),
            kind: function_kind(),
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
        }
    }
}

/// Name and raw arguments of a tool call. `arguments` is the model's text as
/// received: it is parsed by the tool registry, where bad JSON becomes an error
/// the model can read instead of a failure here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// A tool as offered to the model: name, description, JSON schema of the arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// One request to a model.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    /// Force a call of this tool (it must be in `tools`); `None` lets the model choose.
    pub tool_choice: Option<&'a str>,
    /// Nobody is waiting on the answer (a job, the heartbeat, a sub-agent):
    /// the provider's `job_timeout` applies instead of its `timeout`.
    pub scheduled: bool,
}

/// Token counts of one model call (or a sum of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// What a model answered: text, tool calls, or both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// As the server said it (`stop`, `tool_calls`, `length`, `end_turn`, …); may be empty.
    pub finish_reason: Option<String>,
    pub usage: Usage,
    /// Which provider and model answered, set by a fallback [`chain::Chain`].
    pub route: Option<Route>,
    /// The answering provider's `text_tool_calls`: whether a call written
    /// as text may be taken as one.
    pub text_tool_calls: crate::config::TextToolCalls,
}

/// Who answered a call of a [`chain::Chain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub provider: String,
    pub model: String,
    /// Set when it is not the model asked for: why that one did not answer.
    pub fallback: Option<String>,
}

impl Route {
    /// `provider/model`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// Why a model call failed. The text of each variant is what a user sees.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// No provider configured, or no API key for one that needs it.
    #[error("no LLM provider is configured: {0}")]
    NotConfigured(String),
    /// 401/403: the key is wrong or lacks access. Not retried.
    #[error("the provider refused the credentials (HTTP {status}): {message}")]
    Auth { status: u16, message: String },
    /// Any other HTTP error status from the server.
    #[error("the provider answered HTTP {status}: {message}")]
    Http { status: u16, message: String, retry_after: Option<std::time::Duration> },
    /// The connection broke after it was made (reset, closed early): retried.
    #[error("could not reach the provider at {url}: {message}")]
    Transport { url: String, message: String },
    /// No connection could be made: refused, no such host (DNS), no route,
    /// a TLS handshake that failed. Not retried: the server is down or
    /// `base_url` is wrong, and trying again within the turn changes neither.
    #[error(
        "could not reach the provider at {url}: {message}. Is the server running and `base_url` right? \
         `bramble doctor` checks it"
    )]
    Unreachable { url: String, message: String },
    /// No (whole) answer within `[provider] timeout`: a hung socket, a model
    /// still loading. Retried, except when a fallback is waiting.
    #[error("the provider at {url} did not answer in time: {message}")]
    Timeout { url: String, message: String },
    /// The server answered 2xx but not with something we can read.
    #[error("the provider's answer could not be read: {0}")]
    Decode(String),
    /// Retried and still failing; carries the last error.
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: Box<ProviderError> },
    /// Every model of a fallback chain failed (or was skipped): why, each.
    #[error("no model could answer: {}", .0.join("; "))]
    Exhausted(Vec<String>),
}

impl ProviderError {
    /// Whether trying again may help: 408, 409, 429, 5xx and transport errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Http { status, .. } => matches!(status, 408 | 409 | 429) || *status >= 500,
            ProviderError::Transport { .. } | ProviderError::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Whether a fallback chain moves on to its next model: the provider is
    /// unreachable or failing (retryable errors, after their retries), or
    /// this provider cannot serve the request at all — a refused key (401,
    /// 403), an unknown model (404), a redirect not followed (3xx), no key,
    /// an answer that is not one. A bad request (400, 413, 422) is ours and
    /// would fail anywhere: returned.
    pub fn falls_back(&self) -> bool {
        match self {
            ProviderError::GaveUp { .. }
            | ProviderError::Auth { .. }
            | ProviderError::NotConfigured(_)
            | ProviderError::Unreachable { .. }
            | ProviderError::Decode(_) => true,
            // 404: no such model; 3xx: a redirect we do not follow (the server moved).
            ProviderError::Http { status: 404 | 300..=399, .. } => true,
            other => other.is_retryable(),
        }
    }

    /// The server's `Retry-After`, if this (or the last retried) error carried one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ProviderError::Http { retry_after, .. } => *retry_after,
            ProviderError::GaveUp { last, .. } => last.retry_after(),
            _ => None,
        }
    }
}

/// Why no provider can be used (no API key where one is required, a header
/// that cannot be sent): the reason alone, as a sentence. A turn reports it
/// as "no LLM provider is configured: <reason>" ([`ProviderError::NotConfigured`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unconfigured {
    pub reason: String,
}

impl Unconfigured {
    pub fn new(reason: impl Into<String>) -> Unconfigured {
        Unconfigured { reason: reason.into() }
    }
}

impl From<Unconfigured> for ProviderError {
    fn from(u: Unconfigured) -> ProviderError {
        ProviderError::NotConfigured(u.reason)
    }
}

/// The provider a part talks to, or the explicit absence of one: an agent
/// without a usable provider still runs exec jobs, reminders and `/status`;
/// only its turns fail, with the reason.
#[derive(Clone)]
pub enum ProviderSlot {
    Ready(Arc<dyn Provider>),
    Unconfigured(Unconfigured),
}

impl ProviderSlot {
    /// The slot for `made`: the provider, or why there is none.
    pub fn of(made: Result<Arc<dyn Provider>, Unconfigured>) -> ProviderSlot {
        match made {
            Ok(p) => ProviderSlot::Ready(p),
            Err(u) => ProviderSlot::Unconfigured(u),
        }
    }

    /// The provider, when there is one.
    pub fn ready(&self) -> Option<&Arc<dyn Provider>> {
        match self {
            ProviderSlot::Ready(p) => Some(p),
            ProviderSlot::Unconfigured(_) => None,
        }
    }

    /// The provider, or the error a call to it would be.
    pub fn get(&self) -> Result<&Arc<dyn Provider>, ProviderError> {
        match self {
            ProviderSlot::Ready(p) => Ok(p),
            ProviderSlot::Unconfigured(u) => Err(u.clone().into()),
        }
    }

    /// Why there is no provider, if there is none.
    pub fn problem(&self) -> Option<&Unconfigured> {
        match self {
            ProviderSlot::Ready(_) => None,
            ProviderSlot::Unconfigured(u) => Some(u),
        }
    }
}

/// A chat backend.
pub trait Provider: Send + Sync {
    /// A short name for logs and `bramble status` (`openai`, `anthropic`).
    fn name(&self) -> &str;
    /// One model call. Implementations do not retry: see [`retry::with_retries`].
    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;
    /// `provider/model` for a model as a request would name it, for status
    /// lines; the model itself where there is only one provider.
    fn label(&self, model: &str) -> String {
        model.to_string()
    }
    /// One line per provider behind this one, for `/status`: its name and
    /// whether it is usable now (cooling down after a failure, over its
    /// budget). Empty for a single backend.
    fn health(&self) -> Vec<String> {
        Vec::new()
    }
    /// One cheap request that costs no tokens (the server's model list), for
    /// `bramble doctor`: what it found, or why it failed.
    fn probe(&self) -> BoxFuture<'_, Result<Probe, ProviderError>> {
        Box::pin(async { Err(ProviderError::NotConfigured("this provider cannot be probed".into())) })
    }
}

/// What [`Provider::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `GET …/models: HTTP 200, 12 models`.
    pub summary: String,
    /// The ids of the models listed (`data[].id`, or Ollama's `models[].name`);
    /// `None` when the answer has no list.
    pub models: Option<Vec<String>>,
}

/// `GET url`: the model list of a server, as `probe` reports it
/// (`GET …/models: HTTP 200, 12 models`). Errors are mapped as a chat call's are.
async fn probe_models(
    client: &reqwest::Client,
    url: &str,
    headers: reqwest::header::HeaderMap,
    secret: Option<&crate::config::Secret>,
) -> Result<Probe, ProviderError> {
    let sent = secrets_sent(&headers, secret);
    let transport = |e: reqwest::Error| ProviderError::Transport {
        url: url.to_string(),
        message: redact_sent(&transport_message(e), &sent),
    };
    let resp = client.get(url).headers(headers).send().await.map_err(transport)?;
    let status = resp.status();
    if let Some(message) = crate::util::secrets::redirect_refusal(&resp) {
        return Err(ProviderError::Http { status: status.as_u16(), message, retry_after: None });
    }
    let bytes = resp.bytes().await.map_err(transport)?;
    if !status.is_success() {
        let message = redact_sent(&error_message(&bytes, status.canonical_reason()), &sent);
        let status = status.as_u16();
        return Err(match status {
            401 | 403 => ProviderError::Auth { status, message },
            _ => ProviderError::Http { status, message, retry_after: None },
        });
    }
    let models = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| {
        let list = v.get("data").or_else(|| v.get("models")).and_then(Value::as_array)?;
        let id = |m: &Value| m.get("id").or_else(|| m.get("name")).and_then(Value::as_str).map(str::to_string);
        Some(list.iter().filter_map(id).collect::<Vec<_>>())
    });
    let summary = match &models {
        Some(m) => {
            let n = m.len();
            format!("GET {url}: HTTP {}, {n} model{}", status.as_u16(), if n == 1 { "" } else { "s" })
        }
        None => format!("GET {url}: HTTP {}", status.as_u16()),
    };
    Ok(Probe { summary, models })
}

// ---------------------------------------------------------------------------
// Construction and the HTTP plumbing both backends share.
// ---------------------------------------------------------------------------

/// The client for one configured provider, without retries (the [`chain`]
/// and [`retry::Retrying`] add them).
///
/// Fails with [`ProviderError::NotConfigured`] when a key is required but not
/// set, or when an `extra_headers` entry is not a valid HTTP header.
pub fn client(cfg: &crate::config::ProviderConfig) -> Result<std::sync::Arc<dyn Provider>, ProviderError> {
    use crate::config::ProviderKind;
    Ok(match cfg.kind {
        ProviderKind::Openai => std::sync::Arc::new(openai::OpenAiProvider::new(cfg)?),
        ProviderKind::Anthropic => std::sync::Arc::new(anthropic::AnthropicProvider::new(cfg)?),
    })
}

/// Why every call of `cfg`'s client must fail: its `api_key_env` names a
/// variable that is not set (a 401 from the server would hide the cause).
fn unset_key(cfg: &crate::config::ProviderConfig) -> Option<String> {
    match crate::config::env::key_state(cfg) {
        crate::config::env::KeyState::Unset(env) => Some(format!(
            "{env} is not set (`api_key_env` in [provider] names it): set it in the daemon's environment or in {}",
            crate::config::env::path().display()
        )),
        _ => None,
    }
}

/// The HTTP client both backends use: rustls (ring), HTTP/1.1 only, a
/// `bramble/<version>` user agent, a connect timeout of at most 10 s and
/// `timeout` for the whole call (connect to the last byte of the answer).
///
/// A zero `timeout` means no total limit (the connect limit stays).
pub fn http_client(timeout: std::time::Duration) -> Result<reqwest::Client, ProviderError> {
    http_client_builder(timeout)
        .build()
        .map_err(|e| ProviderError::NotConfigured(format!("cannot build the HTTP client: {e}")))
}

/// [`http_client`]'s settings, for a client that needs one more.
///
/// Every client built here carries a secret (an API key, a token in the URL,
/// an MCP server's headers), so none follows a redirect: an answer 3xx comes
/// back as it is and is turned into an error by
/// [`crate::util::secrets::redirect_refusal`]. The protocols spoken here have
/// no redirects; a moved server is configured at its new address.
pub fn http_client_builder(timeout: std::time::Duration) -> reqwest::ClientBuilder {
    crate::install_crypto();
    let connect = std::time::Duration::from_secs(10);
    let connect = if timeout.is_zero() { connect } else { connect.min(timeout) };
    let mut builder = reqwest::Client::builder()
        // The CA store is read at the first https handshake, not here (a LAN model over http never needs it).
        .tls_backend_preconfigured(crate::util::tls::client_config())
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("bramble/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(connect);
    if !timeout.is_zero() {
        builder = builder.timeout(timeout);
    }
    builder
}

/// Headers for a backend: its own (auth, version) first, then the user's
/// `extra_headers`, which win on a clash (a proxy may need to replace one).
fn build_headers(
    own: Vec<(&'static str, String, bool)>,
    extra: &std::collections::BTreeMap<String, String>,
) -> Result<reqwest::header::HeaderMap, ProviderError> {
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
    let mut map = HeaderMap::new();
    for (name, value, sensitive) in own {
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            // Never echo the value: it may be the API key.
            ProviderError::NotConfigured(format!("the value for the `{name}` header contains characters not allowed in HTTP headers (is the API key pasted correctly?)"))
        })?;
        value.set_sensitive(sensitive);
        map.insert(HeaderName::from_static(name), value);
    }
    for (name, value) in extra {
        let header = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            ProviderError::NotConfigured(format!("[provider] extra_headers: `{name}` is not a valid HTTP header name"))
        })?;
        let mut value = HeaderValue::from_str(value.trim()).map_err(|_| {
            ProviderError::NotConfigured(format!(
                "[provider] extra_headers: the value of `{name}` is not a valid HTTP header value"
            ))
        })?;
        // A proxy's key often comes this way: treated as a secret (never logged, scrubbed from errors).
        value.set_sensitive(true);
        map.insert(header, value);
    }
    Ok(map)
}

/// POST `body` as JSON and return the raw body of a 2xx answer.
///
/// Every failure is mapped here, the same way for both backends: 401/403 →
/// [`ProviderError::Auth`], other statuses → [`ProviderError::Http`] with
/// `Retry-After`, network trouble and timeouts → [`ProviderError::Transport`].
/// `secret` is scrubbed from every message, in case a server echoes it.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    headers: reqwest::header::HeaderMap,
    body: &Value,
    secret: Option<&crate::config::Secret>,
) -> Result<Vec<u8>, ProviderError> {
    let body =
        serde_json::to_vec(body).map_err(|e| ProviderError::Decode(format!("cannot encode the request: {e}")))?;
    post_body(client, url, headers, body, "application/json", secret).await
}

/// POST `body` of `content_type`; errors mapped as [`post_json`] says.
async fn post_body(
    client: &reqwest::Client,
    url: &str,
    mut headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
    content_type: &str,
    secret: Option<&crate::config::Secret>,
) -> Result<Vec<u8>, ProviderError> {
    if let Ok(v) = reqwest::header::HeaderValue::from_str(content_type) {
        headers.insert(reqwest::header::CONTENT_TYPE, v);
    }
    let sent = secrets_sent(&headers, secret);
    let transport = |e: reqwest::Error| {
        let (timed_out, unreachable) = (e.is_timeout(), e.is_connect());
        let message = redact_sent(&transport_message(e), &sent);
        if timed_out {
            ProviderError::Timeout { url: url.to_string(), message }
        } else if unreachable {
            ProviderError::Unreachable { url: url.to_string(), message }
        } else {
            ProviderError::Transport { url: url.to_string(), message }
        }
    };
    let resp = client.post(url).headers(headers).body(body).send().await.map_err(transport)?;
    let status = resp.status();
    let retry_after = retry_after(resp.headers());
    if let Some(message) = crate::util::secrets::redirect_refusal(&resp) {
        return Err(ProviderError::Http { status: status.as_u16(), message, retry_after: None });
    }
    let bytes = resp.bytes().await.map_err(transport)?;
    if status.is_success() {
        return Ok(bytes.to_vec());
    }
    let message = redact_sent(&error_message(&bytes, status.canonical_reason()), &sent);
    let status = status.as_u16();
    Err(match status {
        401 | 403 => ProviderError::Auth { status, message },
        _ => ProviderError::Http { status, message, retry_after },
    })
}

/// A reqwest error as one line: its own text and every cause below it
/// (`error sending request: client error (Connect): tcp connect error: Connection refused`).
pub(crate) fn transport_message(e: reqwest::Error) -> String {
    let timed_out = e.is_timeout();
    let e = e.without_url();
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    let mut message = parts.join(": ");
    if timed_out && !message.contains("timed out") {
        message.push_str(" (timed out)");
    }
    message
}

/// `Retry-After` in seconds (the HTTP-date form is ignored), or OpenAI's
/// `retry-after-ms` when that is all there is.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<std::time::Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(secs) = text("retry-after").and_then(|t| t.parse::<f64>().ok()) {
        if secs.is_finite() && secs >= 0.0 {
            return Some(std::time::Duration::from_secs_f64(secs.min(86_400.0)));
        }
    }
    let ms = text("retry-after-ms").and_then(|t| t.parse::<f64>().ok())?;
    (ms.is_finite() && ms >= 0.0).then(|| std::time::Duration::from_secs_f64(ms.min(86_400_000.0) / 1000.0))
}

/// What the server said went wrong: `error.message` (OpenAI and Anthropic),
/// `error` as a string or a top-level `message` (Ollama and friends), else the
/// start of the body, else the status' reason phrase.
fn error_message(body: &[u8], reason: Option<&str>) -> String {
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        let found = json
            .pointer("/error/message")
            .or_else(|| json.get("error").filter(|e| e.is_string()))
            .or_else(|| json.get("message"))
            .or_else(|| json.get("detail"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty());
        if let Some(m) = found {
            return excerpt(m.as_bytes(), 300);
        }
    }
    let text = excerpt(body, 300);
    if text.is_empty() {
        reason.unwrap_or("no details").to_string()
    } else {
        text
    }
}

/// At most `max` characters of `body`, whitespace collapsed, `…` when cut.
fn excerpt(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= max {
        return collapsed;
    }
    let mut cut: String = collapsed.chars().take(max).collect();
    cut.push('…');
    cut
}

/// `text` with the secret and every echoed credential replaced by `***`
/// ([`crate::util::secrets::redact`]).
pub(crate) fn redact(text: &str, secret: Option<&crate::config::Secret>) -> String {
    crate::util::secrets::redact(text, &[secret.map_or("", |s| s.expose())])
}

/// The secrets a request carries: the key and every sensitive header value
/// (the auth header, `extra_headers`).
fn secrets_sent(headers: &reqwest::header::HeaderMap, key: Option<&crate::config::Secret>) -> Vec<String> {
    let mut sent = crate::util::secrets::sensitive_values(headers);
    sent.extend(key.map(|k| k.expose().to_string()));
    sent
}

/// `text` scrubbed of what [`secrets_sent`] found.
fn redact_sent(text: &str, sent: &[String]) -> String {
    crate::util::secrets::redact(text, sent)
}

/// A fresh id for a tool call the server sent without one (`call_1`, `call_2`, …),
/// unique within the process so ids never clash inside a session.
fn generated_call_id(prefix: &str) -> String {
    format!("{prefix}_{}", crate::util::unique::next())
}

/// For `#[serde(deserialize_with)]`: a `null` where a value was expected is the default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

#[cfg(test)]
mod shared_tests {
    use super::*;

    /// A client for a LAN model over plain http never reads the CA store
    /// (147 files under /etc/ssl/certs): it is loaded at the first https
    /// handshake. In a child process (the store is loaded once per process)
    /// whose CA store is empty: a client that loaded it while being built
    /// would fail to build ("no CA certificates found").
    #[tokio::test]
    async fn plain_http_never_loads_the_ca_store() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let test = concat!(module_path!(), "::plain_http_never_loads_the_ca_store");
        let no_store = [("SSL_CERT_FILE", "/nonexistent-bramble-ca.pem"), ("SSL_CERT_DIR", "/nonexistent-bramble-ca")];
        if !crate::util::test_env::in_child(test, &no_store, &[]) {
            return;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
        });
        let client = http_client(std::time::Duration::from_secs(5)).unwrap();
        let body = client.get(format!("http://{addr}/")).send().await.unwrap().text().await.unwrap();
        assert_eq!(body, "ok");
        assert!(!crate::util::tls::ca_store_loaded(), "a plain http call loaded the CA store");
    }

    #[test]
    fn error_message_prefers_the_json_message() {
        let body = br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#;
        assert_eq!(error_message(body, Some("Unauthorized")), "Incorrect API key provided");
        let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(error_message(body, None), "Overloaded");
        assert_eq!(error_message(br#"{"error":"model 'x' not found"}"#, None), "model 'x' not found");
        assert_eq!(error_message(b"<html>\n  Bad   Gateway</html>", None), "<html> Bad Gateway</html>");
        assert_eq!(error_message(b"", Some("Too Many Requests")), "Too Many Requests");
        let long = "x".repeat(1000);
        assert_eq!(error_message(long.as_bytes(), None).chars().count(), 301);
    }

    #[test]
    fn retry_after_seconds_ms_and_dates() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(std::time::Duration::from_secs(7)));
        h.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h), Some(std::time::Duration::from_millis(1500)));
        h.insert("retry-after", HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&h), Some(std::time::Duration::from_millis(1500)));
    }

    #[test]
    fn a_redirect_falls_back_and_is_not_retried() {
        let e = ProviderError::Http { status: 307, message: "moved".into(), retry_after: None };
        assert!(e.falls_back() && !e.is_retryable());
    }

    #[test]
    fn secrets_are_redacted() {
        let key = crate::config::Secret::new("sk-secret-123");
        assert_eq!(redact("bad key sk-secret-123!", Some(&key)), "bad key ***!");
        assert_eq!(redact("nothing", None), "nothing");
    }

    #[test]
    fn bad_header_values_never_echo_the_key() {
        let err = build_headers(vec![("authorization", "Bearer sk-1\n2".into(), true)], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("authorization") && !err.contains("sk-1"), "{err}");
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("bad header".to_string(), "v".to_string());
        let err = build_headers(Vec::new(), &extra).unwrap_err().to_string();
        assert!(err.contains("`bad header`"), "{err}");
        extra.clear();
        extra.insert("HTTP-Referer".to_string(), "https://example.org".to_string());
        let map = build_headers(vec![("x-api-key", "k".into(), true)], &extra).unwrap();
        assert_eq!(map.get("http-referer").unwrap(), "https://example.org");
        assert!(map.get("x-api-key").unwrap().is_sensitive());
    }
}
