//! LLM providers behind one trait.
//!
//! The agent loop speaks a single message format, close to OpenAI's chat format
//! (which is also what sessions store on disk, nanobot-compatible). Each backend
//! translates to and from its wire format:
//!
//! - [`openai`]: `/v1/chat/completions` — OpenAI, OpenRouter, DeepSeek, Ollama,
//!   llama.cpp server, vLLM, anything that speaks that dialect via `base_url`.
//! - [`anthropic`]: the Anthropic Messages API with tool use.
//!
//! Both are thin, tolerant clients on `reqwest`: unknown fields are ignored and
//! odd-but-harmless values (an empty `finish_reason`, a missing `object`) are
//! accepted, because OpenAI-*compatible* servers differ in small ways that strict
//! SDK types turn into hard failures. Retries live in [`retry`] and are shared.

pub mod anthropic;
pub mod openai;
pub mod retry;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A boxed, sendable future: how async trait methods are spelled without a macro crate.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
        Message { role, content: Some(text.into()), tool_calls: Vec::new(), tool_call_id: None, name: None }
    }
    /// An assistant message that asks for tool calls (with optional text).
    pub fn assistant_tool_calls(content: Option<String>, calls: Vec<ToolCall>) -> Self {
        Message { role: Role::Assistant, content, tool_calls: calls, tool_call_id: None, name: None }
    }
    /// The result of one tool call.
    pub fn tool_result(call_id: impl Into<String>, name: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            name: Some(name.into()),
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
    /// Connection refused, DNS, TLS, timeout, reset.
    #[error("could not reach the provider at {url}: {message}")]
    Transport { url: String, message: String },
    /// The server answered 2xx but not with something we can read.
    #[error("the provider's answer could not be read: {0}")]
    Decode(String),
    /// Retried and still failing; carries the last error.
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: Box<ProviderError> },
}

impl ProviderError {
    /// Whether trying again may help: 408, 409, 429, 5xx and transport errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Http { status, .. } => matches!(status, 408 | 409 | 429) || *status >= 500,
            ProviderError::Transport { .. } => true,
            _ => false,
        }
    }
}

/// A chat backend.
pub trait Provider: Send + Sync {
    /// A short name for logs and `bramble status` (`openai`, `anthropic`).
    fn name(&self) -> &str;
    /// One model call. Implementations do not retry: see [`retry::with_retries`].
    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;
}
