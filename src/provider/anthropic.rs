//! The Anthropic Messages API: `POST {base_url}/v1/messages`.
//!
//! Our history is in OpenAI's shape, so this module is mostly translation, and
//! the Messages API is strict about shape where OpenAI is not:
//!
//! - system prompts are a top-level `system` string, not messages;
//! - messages must alternate `user` / `assistant` and start with `user`, so
//!   consecutive same-role messages are merged into one message with several
//!   content blocks (several tool results; a runtime-context note followed by
//!   the user's text), and leading messages before the first user message are
//!   dropped (a history window can start mid-conversation);
//! - tool calls are `tool_use` blocks whose `input` is a JSON *object*, and tool
//!   results are `tool_result` blocks inside a `user` message;
//! - empty text blocks are rejected, so empty texts are left out.
//!
//! Translation never fails: arguments that are not a JSON object become `{}`
//! (the model already saw its own bad call answered with an error).

use crate::util::BoxFuture;
use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{
    build_headers, excerpt, generated_call_id, null_default, post_json, ChatRequest, ChatResponse, Message, Provider,
    ProviderError, Role, ToolCall, Usage,
};
use crate::config::{ProviderConfig, Secret};

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A client for the Anthropic Messages API (or a proxy of it).
#[derive(Debug)]
pub struct AnthropicProvider {
    /// One per limit: `timeout`, `job_timeout` ([`super::clients`]).
    clients: super::clients::Clients,
    /// `{base_url}/v1/messages`.
    url: String,
    headers: HeaderMap,
    key: Option<Secret>,
    /// `api_key_env` names a variable that is not set: every call fails with this.
    unset: Option<String>,
    /// `[provider] text_tool_calls`, handed on with each answer.
    text_tool_calls: crate::config::TextToolCalls,
}

impl AnthropicProvider {
    /// A client for `cfg.base_url()` (`https://api.anthropic.com` by default).
    /// Sends `x-api-key` when a key is configured; a missing key is an error
    /// only when `cfg.key_required()`.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, ProviderError> {
        let key = cfg.api_key();
        if key.is_none() && cfg.key_required() {
            return Err(ProviderError::NotConfigured(format!(
                "the anthropic provider needs an API key: set {} in the environment (or `api_key_env` / `api_key` in [provider])",
                cfg.key_env()
            )));
        }
        let mut own = vec![("anthropic-version", ANTHROPIC_VERSION.to_string(), false)];
        if let Some(k) = &key {
            own.push(("x-api-key", k.expose().to_string(), true));
        }
        Ok(AnthropicProvider {
            clients: super::clients::Clients::new(cfg)?,
            url: format!("{}/v1/messages", cfg.base_url().trim_end_matches('/')),
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

impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
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
            let mut response = parse_response(&bytes)?;
            response.text_tool_calls = self.text_tool_calls;
            Ok(response)
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<super::Probe, ProviderError>> {
        let url = format!("{}/models", self.url.strip_suffix("/messages").unwrap_or(&self.url));
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

/// The JSON body of a Messages API request.
fn request_body(req: &ChatRequest<'_>) -> Value {
    let (system, messages) = translate(req.messages);
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "messages": messages,
    });
    if !system.is_empty() {
        body["system"] = Value::String(system);
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let schema = if t.parameters.is_object() { t.parameters.clone() } else { json!({"type": "object"}) };
                json!({"name": t.name, "description": t.description, "input_schema": schema})
            })
            .collect();
        body["tools"] = Value::Array(tools);
        if let Some(name) = req.tool_choice {
            body["tool_choice"] = json!({"type": "tool", "name": name});
        }
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

/// Our history → (`system` text, Messages API `messages`).
fn translate(history: &[Message]) -> (String, Vec<Value>) {
    let mut system: Vec<&str> = Vec::new();
    // (role, content blocks), merged as we go.
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut seen_user = false;
    for m in history {
        let (role, blocks) = match m.role {
            Role::System => {
                if !m.text_content().trim().is_empty() {
                    system.push(m.text_content());
                }
                continue;
            }
            Role::User => {
                seen_user = true;
                let mut blocks: Vec<Value> = m
                    .images
                    .iter()
                    .map(|i| json!({"type": "image", "source": {"type": "base64", "media_type": i.mime, "data": &*i.base64}}))
                    .collect();
                blocks.extend(text_block(m.text_content()));
                ("user", blocks)
            }
            Role::Tool => ("user", vec![tool_result_block(m)]),
            Role::Assistant => {
                let mut blocks: Vec<Value> = text_block(m.text_content()).into_iter().collect();
                blocks.extend(m.tool_calls.iter().map(tool_use_block));
                ("assistant", blocks)
            }
        };
        // The conversation must open with the user speaking: drop what comes before.
        if !seen_user || blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    let messages = out.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    (system.join("\n\n"), messages)
}

fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn tool_use_block(call: &ToolCall) -> Value {
    let input = match serde_json::from_str::<Value>(&call.function.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(Map::new()),
    };
    json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input})
}

fn tool_result_block(m: &Message) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default()});
    // `content` is optional, and an empty string is better left out.
    if !m.text_content().is_empty() {
        block["content"] = Value::String(m.text_content().to_string());
    }
    block
}

// ---------------------------------------------------------------------------
// Response
// ---------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireResponse {
    /// Required: an answer without a `content` array is not an answer.
    content: Option<Vec<Value>>,
    stop_reason: Value,
    #[serde(deserialize_with = "null_default")]
    usage: WireUsage,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUsage {
    #[serde(deserialize_with = "null_default")]
    input_tokens: u64,
    #[serde(deserialize_with = "null_default")]
    output_tokens: u64,
    #[serde(deserialize_with = "null_default")]
    cache_creation_input_tokens: u64,
    #[serde(deserialize_with = "null_default")]
    cache_read_input_tokens: u64,
}

/// Read a 2xx Messages API body. Text blocks are joined, `tool_use` blocks
/// become tool calls with the JSON text of their `input`; other blocks
/// (`thinking`, …) are ignored. Cached input tokens count as input.
fn parse_response(bytes: &[u8]) -> Result<ChatResponse, ProviderError> {
    let wire: WireResponse = serde_json::from_slice(bytes).map_err(|e| {
        ProviderError::Decode(format!("expected a Messages API answer in JSON ({e}), got: {}", excerpt(bytes, 200)))
    })?;
    let Some(blocks) = wire.content else {
        return Err(ProviderError::Decode(format!("the answer has no content: {}", excerpt(bytes, 200))));
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => {
                let id = match block.get("id").and_then(Value::as_str) {
                    Some(id) if !id.trim().is_empty() => id.to_string(),
                    _ => generated_call_id("toolu"),
                };
                let name = block.get("name").and_then(Value::as_str).unwrap_or_default();
                let input = match block.get("input") {
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(v) => v.to_string(),
                };
                tool_calls.push(ToolCall::new(id, name, input));
            }
            _ => {}
        }
    }
    let u = wire.usage;
    Ok(ChatResponse {
        content: (!text.is_empty()).then_some(text),
        tool_calls,
        finish_reason: wire.stop_reason.as_str().map(str::to_string),
        usage: Usage {
            input_tokens: u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
        },
        route: None,
        text_tool_calls: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ToolSpec;

    #[test]
    fn multi_step_history_is_translated_and_merged() {
        let history = vec![
            Message::system("You are bramble."),
            Message::assistant("stale greeting from a cut history"),
            Message::tool_result("old", "exec", "orphaned result"),
            Message::user("[runtime context] 09:00"),
            Message::user("list files and the date"),
            Message::assistant_tool_calls(
                Some("Let me look.".into()),
                vec![ToolCall::new("c1", "list_dir", r#"{"path":"."}"#), ToolCall::new("c2", "exec", "not json")],
            ),
            Message::tool_result("c1", "list_dir", "a.txt"),
            Message::tool_result("c2", "exec", ""),
            Message::system("Second system note."),
            Message::assistant("Done."),
        ];
        let (system, messages) = translate(&history);
        assert_eq!(system, "You are bramble.\n\nSecond system note.");
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "[runtime context] 09:00"},
                    {"type": "text", "text": "list files and the date"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "c1", "name": "list_dir", "input": {"path": "."}},
                    {"type": "tool_use", "id": "c2", "name": "exec", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "c2"},
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
            ])
        );
    }

    #[test]
    fn images_go_as_base64_image_blocks_before_the_text() {
        let mut user = Message::user("what is this?");
        user.images.push(crate::provider::Image::new("image/png", b"png"));
        let (_, messages) = translate(&[user]);
        assert_eq!(
            messages,
            vec![json!({"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "cG5n"}},
                {"type": "text", "text": "what is this?"}]})]
        );
    }

    #[test]
    fn body_has_tools_system_and_max_tokens() {
        let msgs = [Message::system("s"), Message::user("u")];
        let tools = [ToolSpec { name: "t".into(), description: "d".into(), parameters: Value::Null }];
        let body = request_body(&ChatRequest {
            model: "claude",
            messages: &msgs,
            tools: &tools,
            max_tokens: 64,
            temperature: Some(0.25),
            tool_choice: Some("t"),
            scheduled: false,
        });
        assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "t"}));
        assert_eq!(body["system"], "s");
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["temperature"], 0.25);
        assert_eq!(body["tools"], json!([{"name": "t", "description": "d", "input_schema": {"type": "object"}}]));
        let body = request_body(&ChatRequest {
            model: "c",
            messages: &msgs[1..],
            tools: &[],
            max_tokens: 1,
            temperature: None,
            tool_choice: None,
            scheduled: false,
        });
        assert!(body.get("system").is_none() && body.get("tools").is_none() && body.get("temperature").is_none());
    }

    #[test]
    fn parses_text_and_tool_use() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","content":[
            {"type":"thinking","thinking":"..."},{"type":"text","text":"On it. "},
            {"type":"tool_use","id":"toolu_1","name":"exec","input":{"command":"date"}},{"type":"text","text":"Wait."}],
            "stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":90}}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(r.content.as_deref(), Some("On it. Wait."));
        assert_eq!(r.tool_calls, vec![ToolCall::new("toolu_1", "exec", r#"{"command":"date"}"#)]);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(r.usage, Usage { input_tokens: 100, output_tokens: 4 });
    }

    #[test]
    fn unreadable_answers_are_decode_errors() {
        for body in [&b"not json"[..], b"{}", br#"{"content":"text"}"#, b""] {
            assert!(matches!(parse_response(body), Err(ProviderError::Decode(_))), "{body:?}");
        }
        let empty = parse_response(br#"{"content":[],"stop_reason":"end_turn"}"#).unwrap();
        assert_eq!(empty.content, None);
    }
}
