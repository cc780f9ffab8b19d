//! A chat-completions answer that arrives as a stream of server-sent events.
//!
//! bramble asks for one JSON answer, but some OpenAI-compatible servers and
//! proxies stream regardless (`data: {chunk}` lines, then `data: [DONE]`).
//! Such an answer is put back together here: text deltas joined, tool-call
//! deltas joined per `index`, the usage of the last chunk that has one.
//!
//! A stream that ends with neither `[DONE]` nor a `finish_reason` stopped
//! half-way (the server died or a proxy cut it): delivering what came would
//! hand the user half a sentence, or a tool call with half its arguments.
//! It is a [`ProviderError::Transport`] instead, so it is retried and then,
//! in a fallback chain, the next model answers.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{generated_call_id, ChatResponse, ProviderError, ToolCall, Usage};

/// Whether a 2xx body is an event stream rather than one JSON document.
pub(crate) fn is_event_stream(body: &[u8]) -> bool {
    let start = body.iter().position(|b| !b.is_ascii_whitespace()).map_or(&[][..], |i| &body[i..]);
    start.starts_with(b"data:") || start.starts_with(b"event:") || start.starts_with(b":")
}

/// One tool call as its deltas build it.
#[derive(Default)]
struct Partial {
    id: String,
    name: String,
    arguments: String,
}

/// The answer an event stream carries, or why it is not a whole one.
pub(crate) fn parse(body: &[u8], url: &str) -> Result<ChatResponse, ProviderError> {
    let text = String::from_utf8_lossy(body);
    let mut content = String::new();
    let mut calls: BTreeMap<u64, Partial> = BTreeMap::new();
    let (mut finish, mut done, mut chunks, mut usage) = (None::<String>, false, 0u32, Usage::default());
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            ProviderError::Decode(format!(
                "a chunk of the streamed answer is not JSON ({e}): {}",
                super::excerpt(data.as_bytes(), 200)
            ))
        })?;
        if let Some(err) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = err.get("message").and_then(Value::as_str).map_or_else(|| err.to_string(), str::to_string);
            return Err(ProviderError::Decode(format!("the streamed answer carried an error: {message}")));
        }
        chunks += 1;
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            usage = Usage { input_tokens: n("prompt_tokens"), output_tokens: n("completion_tokens") };
        }
        let Some(choice) = chunk.pointer("/choices/0") else { continue };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str).filter(|f| !f.is_empty()) {
            finish = Some(f.to_string());
        }
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        match delta.get("content") {
            Some(Value::String(s)) => content.push_str(s),
            Some(Value::Array(parts)) => {
                content.extend(parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)));
            }
            _ => {}
        }
        for (i, call) in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
            add_call_delta(&mut calls, i, call);
        }
    }
    if !done && finish.is_none() {
        return Err(ProviderError::Transport {
            url: url.to_string(),
            message: format!(
                "the answer stopped half-way: its stream ended after {chunks} chunks ({} characters) \
                 without a finish or [DONE]",
                content.chars().count()
            ),
        });
    }
    let tool_calls = calls
        .into_values()
        .map(|p| {
            let id = if p.id.trim().is_empty() { generated_call_id("call") } else { p.id };
            let arguments = if p.arguments.trim().is_empty() { "{}".to_string() } else { p.arguments };
            ToolCall::new(id, p.name, arguments)
        })
        .collect();
    Ok(ChatResponse {
        content: (!content.is_empty()).then_some(content),
        tool_calls,
        finish_reason: finish,
        usage,
        route: None,
        text_tool_calls: Default::default(),
    })
}

/// One tool-call delta (`{index, id, function: {name, arguments}}`) added to its call.
fn add_call_delta(calls: &mut BTreeMap<u64, Partial>, position: usize, delta: &Value) {
    let index = delta.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
    let partial = calls.entry(index).or_default();
    if let Some(id) = delta.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        partial.id = id.to_string();
    }
    let function = delta.get("function").unwrap_or(&Value::Null);
    if let Some(name) = function.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        if partial.name.is_empty() {
            partial.name = name.to_string();
        }
    }
    match function.get("arguments") {
        Some(Value::String(s)) => partial.arguments.push_str(s),
        // Some servers send the whole object at once.
        Some(obj @ Value::Object(_)) => partial.arguments = obj.to_string(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(chunks: &[&str]) -> Vec<u8> {
        chunks.iter().map(|c| format!("data: {c}\n\n")).collect::<String>().into_bytes()
    }

    #[test]
    fn a_whole_stream_is_one_answer() {
        let body = sse(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"The disk"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":" is 97% full."},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}}"#,
            "[DONE]",
        ]);
        assert!(is_event_stream(&body));
        let r = parse(&body, "http://x").unwrap();
        assert_eq!(r.content.as_deref(), Some("The disk is 97% full."));
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert_eq!(r.usage, Usage { input_tokens: 12, output_tokens: 5 });
    }

    #[test]
    fn tool_call_deltas_are_joined_per_index() {
        let body = sse(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"exec","arguments":"{\"comm"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"read_file","arguments":{"path":"a"}}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\":\"df\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ]);
        let r = parse(&body, "http://x").unwrap();
        assert_eq!(r.tool_calls[0], ToolCall::new("call_a", "exec", r#"{"command":"df"}"#));
        assert_eq!(r.tool_calls[1], ToolCall::new("call_b", "read_file", r#"{"path":"a"}"#));
        assert_eq!(r.content, None);
    }

    #[test]
    fn a_stream_cut_half_way_is_a_transport_error() {
        let body = sse(&[
            r#"{"choices":[{"delta":{"content":"The backup"}}]}"#,
            r#"{"choices":[{"delta":{"content":" failed because"}}]}"#,
        ]);
        match parse(&body, "http://lan/v1/chat/completions") {
            Err(e @ ProviderError::Transport { .. }) => {
                assert!(e.is_retryable() && e.falls_back());
                assert!(e.to_string().contains("stopped half-way") && e.to_string().contains("2 chunks"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // Half a tool call is no call either.
        let body = sse(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"exec","arguments":"{\"command\":\"rm"}}]}}]}"#,
        ]);
        assert!(matches!(parse(&body, "u"), Err(ProviderError::Transport { .. })));
    }

    #[test]
    fn odd_streams() {
        assert!(!is_event_stream(br#"{"choices":[]}"#));
        assert!(is_event_stream(b"\n: keep-alive\n\ndata: [DONE]\n"));
        assert_eq!(parse(b": keep-alive\n\ndata: [DONE]\n", "u").unwrap(), ChatResponse::default());
        assert!(matches!(parse(b"data: {not json\n\n", "u"), Err(ProviderError::Decode(_))));
        let e = parse(&sse(&[r#"{"error":{"message":"model crashed"}}"#]), "u").unwrap_err();
        assert!(e.to_string().contains("model crashed"), "{e}");
        // A finish without [DONE] is whole (some servers end there).
        let r = parse(&sse(&[r#"{"choices":[{"delta":{"content":"ok"},"finish_reason":"length"}]}"#]), "u").unwrap();
        assert_eq!((r.content.as_deref(), r.finish_reason.as_deref()), (Some("ok"), Some("length")));
    }
}
