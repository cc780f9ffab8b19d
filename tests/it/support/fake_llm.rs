//! A scripted fake LLM server speaking the OpenAI or the Anthropic wire format.
//!
//! Tests push [`Reply`]s; each request to the model endpoint takes the next one
//! (FIFO) and gets it rendered exactly as the real API would send it. Every
//! request is recorded (JSON body, headers, path) for assertions.
//!
//! Two things make translation bugs fail loudly instead of passing quietly:
//!
//! - Requests are **validated like the real APIs do**, where that is cheap:
//!   OpenAI wants `model` and `messages`, `content` on every message (`null`
//!   allowed only on an assistant message with tool calls), tool messages that
//!   answer the preceding assistant's tool calls, non-empty `tools`. Anthropic
//!   wants `x-api-key` (401 without) and `anthropic-version`, `max_tokens`,
//!   messages alternating user/assistant starting with user, no empty text
//!   blocks, `tool_use.input` objects, and `tool_result`s that answer exactly
//!   the previous assistant's `tool_use`s. A `tool_choice` must name an offered
//!   tool in both dialects. A rejected request gets a 400 in the
//!   dialect's error format and does **not** consume a scripted reply.
//! - When the script is exhausted the fake answers HTTP 500
//!   `{"error":{"message":"fake LLM: no scripted reply left"}}`, so a test that
//!   makes more calls than it scripted fails.
//!
//! Usage numbers are deterministic: `prompt_tokens` / `input_tokens` is
//! [`PROMPT_TOKENS_PER_MESSAGE`] × the number of request messages (Anthropic's
//! top-level `system` counts as one), `completion_tokens` / `output_tokens` is
//! [`COMPLETION_TOKENS_PER_PART`] × the parts of the reply (the text, if any,
//! and each tool call).
//!
//! [`FakeLlm::route`] answers some requests by their content instead (sub-agents,
//! benchmarks).
//!
//! Tool call ids are `call_1`, `call_2`, … (OpenAI) or `toolu_1`, … (Anthropic),
//! counted over the fake's lifetime.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::http::{Request, Response, TestServer};

/// See the module docs.
pub const PROMPT_TOKENS_PER_MESSAGE: u64 = 10;
/// See the module docs.
pub const COMPLETION_TOKENS_PER_PART: u64 = 5;

/// Which API the fake imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A final text answer (`finish_reason: "stop"` / `stop_reason: "end_turn"`).
    Text(String),
    /// Tool calls: `(name, raw arguments text)`. OpenAI sends the text as is;
    /// Anthropic sends it parsed as `input` (`{}` when it is not a JSON object).
    ToolCalls(Vec<(String, String)>),
    /// Text and tool calls in one answer.
    TextAndToolCalls(String, Vec<(String, String)>),
    /// An HTTP error: `status`, the body verbatim, and a `Retry-After` header (seconds) if given.
    Status { status: u16, body: String, retry_after: Option<u64> },
    /// Any status with this exact body (`Content-Type: application/json` regardless).
    Raw { status: u16, body: String },
    /// The inner reply, after a pause (for timeout tests).
    Delayed(Duration, Box<Reply>),
}

impl Reply {
    /// `Reply::Text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Text(text.into())
    }

    /// A single tool call.
    pub fn tool_call(name: impl Into<String>, arguments: impl Into<String>) -> Reply {
        Reply::ToolCalls(vec![(name.into(), arguments.into())])
    }

    /// An HTTP error with `{"error":{"message": message}}`, readable in both dialects.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::Status { status, body: json!({"error": {"message": message}}).to_string(), retry_after: None }
    }
}

/// Picks a reply from the request itself, before the script is consulted.
type Router = Arc<dyn Fn(&Value) -> Option<Reply> + Send + Sync>;

/// What the fake has seen and has left to say.
#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    router: Option<Router>,
    requests: Vec<Value>,
    headers: Vec<Vec<(String, String)>>,
    paths: Vec<String>,
    /// Answers rendered so far (for `id`s of the answers themselves).
    answers: u64,
    /// Tool calls rendered so far (for `call_N` / `toolu_N`).
    calls: u64,
}

/// A running fake LLM; stops when dropped.
pub struct FakeLlm {
    server: TestServer,
    dialect: Dialect,
    state: Arc<Mutex<State>>,
}

impl FakeLlm {
    /// Start a fake on `127.0.0.1:<random port>` with an empty script.
    pub async fn start(dialect: Dialect) -> FakeLlm {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let server = TestServer::start_async(move |req| {
            let (response, delay) = handle(dialect, &shared, req);
            async move {
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                response
            }
        })
        .await;
        FakeLlm { server, dialect, state }
    }

    /// The `base_url` to configure: `http://127.0.0.1:PORT/v1` for OpenAI,
    /// `http://127.0.0.1:PORT` for Anthropic (its client adds `/v1/messages`).
    pub fn base_url(&self) -> String {
        match self.dialect {
            Dialect::OpenAi => format!("{}/v1", self.server.url()),
            Dialect::Anthropic => self.server.url(),
        }
    }

    /// The dialect it speaks.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Script the next reply (served in FIFO order).
    pub fn push(&self, reply: Reply) {
        self.lock().script.push_back(reply);
    }

    /// Answer requests for which `router` returns a reply with that reply (the
    /// script is not consumed); others still take the next scripted reply.
    /// For concurrent callers (sub-agents) whose order is not deterministic,
    /// and for benchmarks that run many turns.
    pub fn route(&self, router: impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static) {
        self.lock().router = Some(Arc::new(router));
    }

    /// The JSON bodies received, in order (`null` for a body that was not JSON).
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// The last JSON body received.
    pub fn last_request(&self) -> Option<Value> {
        self.lock().requests.last().cloned()
    }

    /// How many requests arrived (valid or not).
    pub fn request_count(&self) -> usize {
        self.lock().requests.len()
    }

    /// The headers of each request, in order (names lower-cased).
    pub fn headers(&self) -> Vec<Vec<(String, String)>> {
        self.lock().headers.clone()
    }

    /// The path of each request, in order.
    pub fn paths(&self) -> Vec<String> {
        self.lock().paths.clone()
    }

    /// Scripted replies not served yet.
    pub fn remaining(&self) -> usize {
        self.lock().script.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Record the request, validate it, and pick the answer (and how long to wait first).
fn handle(dialect: Dialect, state: &Mutex<State>, req: Request) -> (Response, Option<Duration>) {
    // The context-window probe (llama.cpp's `/props`, Ollama's `/api/show`) is
    // no model call: answered 404 as a plain OpenAI server does, not recorded.
    if matches!(req.path_only(), "/props" | "/api/show") {
        return (Response::new(404), None);
    }
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    let body = req.json();
    st.requests.push(body.clone().unwrap_or(Value::Null));
    st.headers.push(req.headers.clone());
    st.paths.push(req.path.clone());

    let endpoint = match dialect {
        Dialect::OpenAi => "/v1/chat/completions",
        Dialect::Anthropic => "/v1/messages",
    };
    if req.path_only() != endpoint {
        return (error(dialect, 404, "not_found_error", &format!("no route for {}", req.path)), None);
    }
    if req.method != "POST" {
        return (error(dialect, 405, "invalid_request_error", "use POST"), None);
    }
    let Some(body) = body.filter(Value::is_object) else {
        return (error(dialect, 400, "invalid_request_error", "the body is not a JSON object"), None);
    };
    let checked = match dialect {
        Dialect::OpenAi => validate_openai(&body),
        Dialect::Anthropic => validate_anthropic(&req, &body),
    };
    if let Err((status, message)) = checked {
        let kind = if status == 401 { "authentication_error" } else { "invalid_request_error" };
        return (error(dialect, status, kind, &format!("fake LLM: {message}")), None);
    }

    if let Some(reply) = st.router.clone().and_then(|r| r(&body)) {
        return render(dialect, &mut st, &body, reply);
    }
    let Some(reply) = st.script.pop_front() else {
        let body = json!({"error": {"message": "fake LLM: no scripted reply left"}});
        return (Response::json(500, &body), None);
    };
    render(dialect, &mut st, &body, reply)
}

/// The reply as the real API would send it.
fn render(dialect: Dialect, st: &mut State, request: &Value, reply: Reply) -> (Response, Option<Duration>) {
    let (text, calls) = match reply {
        Reply::Delayed(delay, inner) => {
            let (response, more) = render(dialect, st, request, *inner);
            return (response, Some(delay + more.unwrap_or_default()));
        }
        Reply::Status { status, body, retry_after } => {
            let is_json = serde_json::from_str::<Value>(&body).is_ok();
            let mut r = Response::new(status).body(body);
            if is_json {
                r = r.header("content-type", "application/json");
            }
            if let Some(secs) = retry_after {
                r = r.header("retry-after", secs.to_string());
            }
            return (r, None);
        }
        Reply::Raw { status, body } => {
            return (Response::new(status).header("content-type", "application/json").body(body), None);
        }
        Reply::Text(t) => (Some(t), Vec::new()),
        Reply::ToolCalls(c) => (None, c),
        Reply::TextAndToolCalls(t, c) => (Some(t), c),
    };
    st.answers += 1;
    let serial = st.answers;
    let model = request.get("model").cloned().unwrap_or(Value::Null);
    let messages = request.get("messages").and_then(Value::as_array).map_or(0, Vec::len) as u64;
    let system = u64::from(dialect == Dialect::Anthropic && request.get("system").is_some());
    let prompt_tokens = PROMPT_TOKENS_PER_MESSAGE * (messages + system);
    let completion_tokens = COMPLETION_TOKENS_PER_PART * (u64::from(text.is_some()) + calls.len() as u64);
    let mut ids = Vec::new();
    for _ in &calls {
        st.calls += 1;
        ids.push(st.calls);
    }
    let body = match dialect {
        Dialect::OpenAi => {
            let mut message = json!({"role": "assistant", "content": text, "refusal": null});
            if !calls.is_empty() {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .zip(&ids)
                    .map(|((name, args), id)| {
                        json!({"id": format!("call_{id}"), "type": "function", "function": {"name": name, "arguments": args}})
                    })
                    .collect();
                message["tool_calls"] = Value::Array(tool_calls);
            }
            json!({
                "id": format!("chatcmpl-fake{serial}"),
                "object": "chat.completion",
                "created": 1_700_000_000 + serial,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" },
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            })
        }
        Dialect::Anthropic => {
            let mut content: Vec<Value> = text.iter().map(|t| json!({"type": "text", "text": t})).collect();
            for ((name, args), id) in calls.iter().zip(&ids) {
                let input = match serde_json::from_str::<Value>(args) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({}),
                };
                content.push(json!({"type": "tool_use", "id": format!("toolu_{id}"), "name": name, "input": input}));
            }
            json!({
                "id": format!("msg_fake{serial}"),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" },
                "stop_sequence": null,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
            })
        }
    };
    (Response::json(200, &body), None)
}

/// An error in the dialect's own format.
fn error(dialect: Dialect, status: u16, kind: &str, message: &str) -> Response {
    let body = match dialect {
        Dialect::OpenAi => json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
        Dialect::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
    };
    Response::json(status, &body)
}

type Check = Result<(), (u16, String)>;

fn bad(message: impl Into<String>) -> Check {
    Err((400, message.into()))
}

/// Whether `v[key]` is a string with something other than whitespace in it.
fn has_text(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_str).is_some_and(|s| !s.trim().is_empty())
}

fn is_positive_int(v: Option<&Value>) -> bool {
    v.and_then(Value::as_u64).is_some_and(|n| n > 0)
}

/// What OpenAI's chat completions endpoint checks, roughly.
fn validate_openai(body: &Value) -> Check {
    if !has_text(body, "model") {
        return bad("you must provide a model parameter");
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return bad("missing required parameter: 'messages'");
    };
    if messages.is_empty() {
        return bad("'messages' must contain at least one message");
    }
    if body.get("max_tokens").is_some() && !is_positive_int(body.get("max_tokens")) {
        return bad("'max_tokens' must be a positive integer");
    }
    if let Some(t) = body.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t)) {
            return bad("'temperature' must be a number between 0 and 2");
        }
    }
    if let Some(tools) = body.get("tools") {
        let Some(tools) = tools.as_array().filter(|t| !t.is_empty()) else {
            return bad("'tools' must be a non-empty array");
        };
        for (i, t) in tools.iter().enumerate() {
            let ok = t.get("type").and_then(Value::as_str) == Some("function")
                && t.pointer("/function/name").and_then(Value::as_str).is_some_and(|n| !n.is_empty())
                && t.pointer("/function/parameters").is_none_or(Value::is_object);
            if !ok {
                return bad(format!("tools[{i}] must be {{type: function, function: {{name, parameters}}}}"));
            }
        }
    }
    if let Some(choice) = body.get("tool_choice") {
        let names: Vec<&str> = body
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
            .collect();
        let ok = match choice {
            Value::String(s) => matches!(s.as_str(), "none" | "auto" | "required"),
            _ => {
                choice.get("type").and_then(Value::as_str) == Some("function")
                    && choice.pointer("/function/name").and_then(Value::as_str).is_some_and(|n| names.contains(&n))
            }
        };
        if !ok {
            return bad("'tool_choice' must be none/auto/required or name a function in 'tools'");
        }
    }
    // Tool call ids the last assistant message asked for and no tool message answered yet.
    let mut pending: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let Some(fields) = m.as_object() else {
            return bad(format!("messages[{i}] is not an object"));
        };
        if role != "tool" && !pending.is_empty() {
            return bad(format!(
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id' (missing before messages[{i}])"
            ));
        }
        let content = fields.get("content");
        match role {
            "system" | "developer" | "user" => {
                if !content.is_some_and(|c| c.is_string() || c.is_array()) {
                    return bad(format!("messages[{i}].content must be a string or an array"));
                }
            }
            "assistant" => {
                let calls = fields.get("tool_calls");
                let Some(content) = content else {
                    return bad(format!("messages[{i}]: missing required key 'content'"));
                };
                let has_calls = calls.and_then(Value::as_array).is_some_and(|c| !c.is_empty());
                if content.is_null() && !has_calls {
                    return bad(format!("messages[{i}].content may be null only with tool_calls"));
                }
                for (j, c) in calls.and_then(Value::as_array).into_iter().flatten().enumerate() {
                    let ok = c.get("id").and_then(Value::as_str).is_some_and(|id| !id.is_empty())
                        && c.get("type").and_then(Value::as_str) == Some("function")
                        && c.pointer("/function/name").and_then(Value::as_str).is_some()
                        && c.pointer("/function/arguments").is_some_and(Value::is_string);
                    if !ok {
                        return bad(format!(
                            "messages[{i}].tool_calls[{j}] must be {{id, type: function, function: {{name, arguments: string}}}}"
                        ));
                    }
                    pending.insert(c["id"].as_str().unwrap_or_default().to_string());
                }
            }
            "tool" => {
                if !content.is_some_and(|c| c.is_string() || c.is_array()) {
                    return bad(format!("messages[{i}].content must be a string or an array"));
                }
                let id = fields.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
                if !pending.remove(id) {
                    return bad(format!(
                        "messages with role 'tool' must be a response to a preceding message with 'tool_calls' (messages[{i}], tool_call_id {id:?})"
                    ));
                }
            }
            other => return bad(format!("messages[{i}]: invalid role {other:?}")),
        }
    }
    Ok(())
}

/// What the Anthropic Messages API checks, roughly.
fn validate_anthropic(req: &Request, body: &Value) -> Check {
    if req.header("x-api-key").is_none_or(str::is_empty) {
        return Err((401, "x-api-key header is required".into()));
    }
    if req.header("anthropic-version").is_none() {
        return bad("anthropic-version: header is required");
    }
    if !has_text(body, "model") {
        return bad("model: Field required");
    }
    if !is_positive_int(body.get("max_tokens")) {
        return bad("max_tokens: Field required (a positive integer)");
    }
    if let Some(t) = body.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)) {
            return bad("temperature: must be between 0 and 1");
        }
    }
    if let Some(system) = body.get("system") {
        if !(system.is_string() || system.is_array()) {
            return bad("system: must be a string or an array of text blocks");
        }
    }
    if let Some(tools) = body.get("tools") {
        for (i, t) in tools.as_array().into_iter().flatten().enumerate() {
            if !has_text(t, "name") || !t.get("input_schema").is_some_and(Value::is_object) {
                return bad(format!("tools.{i}: needs name and input_schema (an object)"));
            }
        }
        if !tools.is_array() {
            return bad("tools: must be an array");
        }
    }
    if let Some(choice) = body.get("tool_choice") {
        let named = |n: &str| {
            body.get("tools").and_then(Value::as_array).into_iter().flatten().any(|t| t["name"].as_str() == Some(n))
        };
        let ok = match choice.get("type").and_then(Value::as_str) {
            Some("auto" | "any" | "none") => true,
            Some("tool") => choice.get("name").and_then(Value::as_str).is_some_and(named),
            _ => false,
        };
        if !ok {
            return bad("tool_choice: must be {type: auto|any|none} or {type: tool, name} naming a tool");
        }
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty()) else {
        return bad("messages: at least one message is required");
    };
    // tool_use ids of the previous assistant message, to be answered in the next user message.
    let mut asked: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != "user" && role != "assistant" {
            return bad(format!("messages.{i}.role: Input should be 'user' or 'assistant' (got {role:?})"));
        }
        if role != expected {
            return bad(format!(
                "messages: roles must alternate between \"user\" and \"assistant\", starting with \"user\" (messages.{i} is {role:?})"
            ));
        }
        let blocks: Vec<Value> = match m.get("content") {
            Some(Value::String(s)) if !s.trim().is_empty() => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) if !b.is_empty() => b.clone(),
            _ => return bad(format!("messages.{i}: content must be a non-empty string or a non-empty array")),
        };
        let mut answered: HashSet<String> = HashSet::new();
        let mut next_asked = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => {
                    if !has_text(b, "text") {
                        return bad(format!("messages.{i}.content.{j}: text content blocks must be non-empty"));
                    }
                }
                Some("tool_use") if role == "assistant" => {
                    let id = b.get("id").and_then(Value::as_str).unwrap_or_default();
                    if id.is_empty() || !has_text(b, "name") || !b.get("input").is_some_and(Value::is_object) {
                        return bad(format!("messages.{i}.content.{j}: tool_use needs id, name and an object input"));
                    }
                    next_asked.push(id.to_string());
                }
                Some("tool_result") if role == "user" => {
                    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
                    if !asked.iter().any(|a| a == id) {
                        return bad(format!(
                            "messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ));
                    }
                    if let Some(c) = b.get("content") {
                        if !(c.is_string() || c.is_array()) {
                            return bad(format!(
                                "messages.{i}.content.{j}: tool_result content must be a string or an array"
                            ));
                        }
                    }
                    answered.insert(id.to_string());
                }
                other => return bad(format!("messages.{i}.content.{j}: unexpected block type {other:?} for {role}")),
            }
        }
        if role == "user" {
            if let Some(missing) = asked.iter().find(|a| !answered.contains(*a)) {
                return bad(format!(
                    "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {missing}"
                ));
            }
        }
        asked = next_asked;
    }
    Ok(())
}
