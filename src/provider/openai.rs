//! The OpenAI chat-completions dialect: `POST {base_url}/chat/completions`.
//!
//! This one client serves OpenAI itself and the long tail of servers that
//! imitate it (OpenRouter, DeepSeek, Ollama, llama.cpp, vLLM, LM Studio, …).
//! The imitations differ in small ways — an empty `finish_reason`, `content`
//! as an array of parts, tool-call `arguments` as an object instead of a JSON
//! string, a tool call without an `id` — so the response types here are
//! deliberately loose: every field has a default, `null` means "absent", and
//! anything odd but readable is normalised instead of rejected. Only a 2xx
//! answer with no `choices[0]` at all is an error. An answer streamed as
//! server-sent events although none was asked for is read by
//! [`super::stream`], which refuses one that stopped half-way.
//!
//! Requests, on the other hand, are strict OpenAI: `content: null` is sent on an
//! assistant message that only carries tool calls (OpenAI wants the key), and
//! `tools` is omitted when there are none (some servers reject `[]`).

use crate::util::BoxFuture;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{
    build_headers, excerpt, generated_call_id, null_default, post_json, ChatRequest, ChatResponse, Message, Provider,
    ProviderError, Role, ToolCall, Usage,
};
use crate::config::{ProviderConfig, Secret};

/// A client for one OpenAI-compatible endpoint.
#[derive(Debug)]
pub struct OpenAiProvider {
    /// One per limit: `timeout`, `job_timeout` ([`super::clients`]).
    clients: super::clients::Clients,
    /// `{base_url}/chat/completions`.
    url: String,
    headers: HeaderMap,
    key: Option<Secret>,
    /// `api_key_env` names a variable that is not set: every call fails with this.
    unset: Option<String>,
    /// `[provider] text_tool_calls`, handed on with each answer.
    text_tool_calls: crate::config::TextToolCalls,
}

impl OpenAiProvider {
    /// A client for `cfg.base_url()`. Sends `Authorization: Bearer <key>` only
    /// when a key is configured; a missing key is an error only when
    /// `cfg.key_required()` (the public endpoint), not for a local server.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, ProviderError> {
        let key = cfg.api_key();
        if key.is_none() && cfg.key_required() {
            return Err(ProviderError::NotConfigured(format!(
                "the openai provider needs an API key: set {} in the environment (or `api_key_env` / `api_key` in [provider])",
                cfg.key_env()
            )));
        }
        let own = match &key {
            Some(k) => vec![("authorization", format!("Bearer {}", k.expose()), true)],
            None => Vec::new(),
        };
        Ok(OpenAiProvider {
            clients: super::clients::Clients::new(cfg)?,
            url: format!("{}/chat/completions", cfg.base_url().trim_end_matches('/')),
            headers: build_headers(own, &cfg.extra_headers)?,
            key,
            unset: super::unset_key(cfg),
            text_tool_calls: cfg.text_tool_calls,
        })
    }

    /// The endpoint this client posts to.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            if let Some(e) = &self.unset {
                return Err(ProviderError::NotConfigured(e.clone()));
            }
            let body = request_body(&req);
            let client = self.clients.get(req.scheduled);
            let bytes = post_json(client, &self.url, self.headers.clone(), &body, self.key.as_ref())
                .await
                .map_err(|e| self.clients.explain(e, req.scheduled))?;
            // A server that streams although not asked to: put together, and refused when cut.
            let mut response = if super::stream::is_event_stream(&bytes) {
                super::stream::parse(&bytes, &self.url)?
            } else {
                parse_response(&bytes)?
            };
            response.text_tool_calls = self.text_tool_calls;
            Ok(response)
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<super::Probe, ProviderError>> {
        let base = self.url.strip_suffix("/chat/completions").unwrap_or(&self.url);
        let url = format!("{base}/models");
        Box::pin(async move {
            if let Some(e) = &self.unset {
                return Err(ProviderError::NotConfigured(e.clone()));
            }
            super::probe_models(self.clients.get(false), &url, self.headers.clone(), self.key.as_ref()).await
        })
    }
}

// ---------------------------------------------------------------------------
// Request
// ---------------------------------------------------------------------------

/// A message as sent: like [`Message`], but `content` is always present.
#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    /// `null` only on an assistant message with tool calls and no text.
    content: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// A message's content: text, or (a user message with images) an array of
/// `text` and `image_url` parts.
#[derive(Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(&'a str),
    Parts(Vec<Value>),
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> WireMessage<'a> {
    fn from_message(m: &'a Message) -> Self {
        let content = match (&m.content, m.role) {
            (_, Role::User) if !m.images.is_empty() => {
                let mut parts = vec![json!({"type": "text", "text": m.text_content()})];
                parts.extend(m.images.iter().map(|i| json!({"type": "image_url", "image_url": {"url": i.data_url()}})));
                Some(WireContent::Parts(parts))
            }
            (Some(text), _) => Some(WireContent::Text(text.as_str())),
            (None, Role::Assistant) if !m.tool_calls.is_empty() => None,
            (None, _) => Some(WireContent::Text("")),
        };
        let tool_calls = m
            .tool_calls
            .iter()
            .map(|c| WireToolCall {
                id: &c.id,
                kind: "function",
                function: WireFunction {
                    name: &c.function.name,
                    // OpenAI rejects an empty string here; "no arguments" is `{}`.
                    arguments: if c.function.arguments.trim().is_empty() { "{}" } else { &c.function.arguments },
                },
            })
            .collect();
        WireMessage {
            role: m.role,
            content,
            tool_calls,
            tool_call_id: m.tool_call_id.as_deref(),
            name: if m.role == Role::Tool { m.name.as_deref() } else { None },
        }
    }
}

/// The JSON body of a chat-completions request.
fn request_body(req: &ChatRequest<'_>) -> Value {
    let messages: Vec<WireMessage<'_>> = req.messages.iter().map(WireMessage::from_message).collect();
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens,
    });
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
        if let Some(name) = req.tool_choice {
            body["tool_choice"] = json!({"type": "function", "function": {"name": name}});
        }
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

// ---------------------------------------------------------------------------
// Response
// ---------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireResponse {
    #[serde(deserialize_with = "null_default")]
    choices: Vec<WireChoice>,
    #[serde(deserialize_with = "null_default")]
    usage: WireUsage,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireChoice {
    #[serde(deserialize_with = "null_default")]
    message: WireReply,
    /// A string normally; `null`, `""` or anything else is tolerated.
    finish_reason: Value,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireReply {
    /// `null`, a string, or an array of `{type: "text", text}` parts.
    content: Value,
    #[serde(deserialize_with = "null_default")]
    tool_calls: Vec<WireReplyCall>,
    // `reasoning_content` (DeepSeek, vLLM) and anything else: ignored.
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireReplyCall {
    id: Value,
    #[serde(deserialize_with = "null_default")]
    function: WireReplyFunction,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireReplyFunction {
    #[serde(deserialize_with = "null_default")]
    name: String,
    /// A JSON string normally; some servers send the object itself.
    arguments: Value,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUsage {
    #[serde(deserialize_with = "null_default")]
    prompt_tokens: u64,
    #[serde(deserialize_with = "null_default")]
    completion_tokens: u64,
}

/// Read a 2xx chat-completions body.
fn parse_response(bytes: &[u8]) -> Result<ChatResponse, ProviderError> {
    let wire: WireResponse = serde_json::from_slice(bytes).map_err(|e| {
        ProviderError::Decode(format!("expected a chat completion in JSON ({e}), got: {}", excerpt(bytes, 200)))
    })?;
    let Some(choice) = wire.choices.into_iter().next() else {
        return Err(ProviderError::Decode(format!("the answer has no choices: {}", excerpt(bytes, 200))));
    };
    let tool_calls = choice
        .message
        .tool_calls
        .into_iter()
        .map(|c| {
            let id = match c.id {
                Value::String(s) if !s.trim().is_empty() => s,
                Value::Number(n) => n.to_string(),
                _ => generated_call_id("call"),
            };
            ToolCall::new(id, c.function.name, arguments_text(c.function.arguments))
        })
        .collect();
    Ok(ChatResponse {
        content: content_text(choice.message.content),
        tool_calls,
        finish_reason: choice.finish_reason.as_str().map(str::to_string),
        usage: Usage { input_tokens: wire.usage.prompt_tokens, output_tokens: wire.usage.completion_tokens },
        route: None,
        text_tool_calls: Default::default(),
    })
}

/// Message text from a string or an array of parts; `None` when there is none.
fn content_text(content: Value) -> Option<String> {
    let text = match content {
        Value::String(s) => s,
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) if matches!(o.get("type").and_then(Value::as_str), None | Some("text")) => {
                    o.get("text").and_then(Value::as_str)
                }
                _ => None,
            })
            .collect(),
        _ => String::new(),
    };
    (!text.is_empty()).then_some(text)
}

/// Tool-call arguments as JSON text: a string as is, an object as its JSON.
fn arguments_text(arguments: Value) -> String {
    match arguments {
        Value::String(s) => s,
        Value::Null => "{}".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ToolCall, ToolSpec};

    fn req<'a>(messages: &'a [Message], tools: &'a [ToolSpec]) -> ChatRequest<'a> {
        ChatRequest {
            model: "m",
            messages,
            tools,
            max_tokens: 100,
            temperature: None,
            tool_choice: None,
            scheduled: false,
        }
    }

    #[test]
    fn assistant_tool_calls_send_content_null() {
        let msgs = vec![
            Message::user("hi"),
            Message::assistant_tool_calls(None, vec![ToolCall::new("c1", "exec", "")]),
            Message::tool_result("c1", "exec", "ok"),
        ];
        let body = request_body(&req(&msgs, &[]));
        let m = &body["messages"];
        assert!(m[1].as_object().unwrap().contains_key("content"));
        assert!(m[1]["content"].is_null());
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(m[1]["tool_calls"][0]["type"], "function");
        assert_eq!(m[2]["tool_call_id"], "c1");
        assert_eq!(m[2]["name"], "exec");
        assert!(body.get("tools").is_none());
        assert!(body.get("temperature").is_none());
        assert_eq!(body["max_tokens"], 100);
    }

    #[test]
    fn images_go_as_image_url_parts_of_the_user_message() {
        let mut user = Message::user("what is this?");
        user.images.push(crate::provider::Image::new("image/jpeg", b"\xff\xd8jpeg"));
        let msgs = vec![Message::system("s"), user];
        let body = request_body(&req(&msgs, &[]));
        assert_eq!(body["messages"][0]["content"], "s");
        assert_eq!(
            body["messages"][1]["content"],
            json!([{"type": "text", "text": "what is this?"},
                   {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9hqcGVn"}}])
        );
    }

    #[test]
    fn tools_and_temperature() {
        let tools = [ToolSpec { name: "t".into(), description: "d".into(), parameters: json!({"type": "object"}) }];
        let msgs = [Message::user("x")];
        let mut r = req(&msgs, &tools);
        r.temperature = Some(0.5);
        let body = request_body(&r);
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "t", "description": "d", "parameters": {"type": "object"}}}])
        );
        assert_eq!(body["temperature"], 0.5);
        assert!(body.get("tool_choice").is_none());
        r.tool_choice = Some("t");
        assert_eq!(request_body(&r)["tool_choice"], json!({"type": "function", "function": {"name": "t"}}));
    }

    #[test]
    fn parses_the_standard_answer() {
        let body = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(r.content.as_deref(), Some("hello"));
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert_eq!(r.usage, Usage { input_tokens: 12, output_tokens: 3 });
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn tolerates_compatible_server_oddities() {
        let body = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}],
            "reasoning_content":"hmm","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}},{"id":"","function":{"name":"g","arguments":null}}]},
            "finish_reason":""}],"usage":null}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(r.content.as_deref(), Some("ab"));
        assert_eq!(r.finish_reason.as_deref(), Some(""));
        assert_eq!(r.tool_calls[0].function.arguments, r#"{"x":1}"#);
        assert_eq!(r.tool_calls[1].function.arguments, "{}");
        assert!(r.tool_calls[0].id.starts_with("call_"));
        assert_ne!(r.tool_calls[0].id, r.tool_calls[1].id);
        assert_eq!(r.usage, Usage::default());
        let r = parse_response(br#"{"choices":[{"message":{"content":null,"tool_calls":null},"finish_reason":null}]}"#)
            .unwrap();
        assert_eq!(r, ChatResponse::default());
    }

    #[test]
    fn unreadable_answers_are_decode_errors() {
        for body in [&b"not json"[..], b"{}", br#"{"choices":[]}"#, b"[1,2]", b"", br#"{"choices":"x"}"#] {
            match parse_response(body) {
                Err(ProviderError::Decode(m)) => assert!(!m.is_empty()),
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn missing_key_for_the_public_endpoint() {
        let cfg = ProviderConfig { api_key_env: Some("BRAMBLE_TEST_UNSET_KEY_91c2".into()), ..Default::default() };
        let err = OpenAiProvider::new(&cfg).unwrap_err();
        assert!(matches!(err, ProviderError::NotConfigured(_)));
        assert!(err.to_string().contains("BRAMBLE_TEST_UNSET_KEY_91c2"), "{err}");
    }
}
