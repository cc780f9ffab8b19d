//! The provider backends against fake servers on 127.0.0.1: real HTTP through
//! the real client, wire formats checked on both sides, retries timed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::fake_llm::{Dialect, FakeLlm, Reply, COMPLETION_TOKENS_PER_PART, PROMPT_TOKENS_PER_MESSAGE};
use crate::support::http::{refused_url, Response, TestServer};
use bramble::config::{Dur, HttpUrl, ProviderConfig, ProviderKind, Secret};
use bramble::provider::anthropic::AnthropicProvider;
use bramble::provider::chain::{Backend, Chain};
use bramble::provider::openai::OpenAiProvider;
use bramble::provider::retry::{RetryPolicy, Retrying};
use bramble::provider::{
    client, ChatRequest, ChatResponse, Message, Provider, ProviderError, ToolCall, ToolSpec, Usage,
};
use serde_json::{json, Value};

const KEY: &str = "sk-test-5ecret-key";

/// A config pointing at `base_url` with the test key (or none: no `api_key_env`
/// either, since a named variable that is unset fails every call).
fn config(kind: ProviderKind, base_url: &str, key: Option<&str>) -> ProviderConfig {
    ProviderConfig {
        name: None,
        model: None,
        daily_token_budget: 0,
        kind,
        base_url: Some(HttpUrl(base_url.to_string())),
        api_key: key.map(Secret::new),
        api_key_env: None,
        timeout: Dur(Duration::from_secs(10)),
        job_timeout: Dur(Duration::from_secs(10)),
        max_retries: 3,
        extra_headers: BTreeMap::new(),
        context_window: None,
        ..ProviderConfig::default()
    }
}

/// Three retries with 10/20/40 ms backoff: the real schedule, shrunk.
fn fast() -> RetryPolicy {
    RetryPolicy { max_retries: 3, base_delay: Duration::from_millis(10), max_delay: Duration::from_secs(5) }
}

fn openai(fake: &FakeLlm) -> Retrying<OpenAiProvider> {
    let cfg = config(ProviderKind::Openai, &fake.base_url(), Some(KEY));
    Retrying::new(OpenAiProvider::new(&cfg).unwrap(), fast())
}

fn anthropic(fake: &FakeLlm) -> Retrying<AnthropicProvider> {
    let cfg = config(ProviderKind::Anthropic, &fake.base_url(), Some(KEY));
    Retrying::new(AnthropicProvider::new(&cfg).unwrap(), fast())
}

fn exec_tool() -> ToolSpec {
    ToolSpec {
        name: "exec".into(),
        description: "Run a shell command".into(),
        parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
    }
}

async fn chat(p: &impl Provider, messages: &[Message], tools: &[ToolSpec]) -> Result<ChatResponse, ProviderError> {
    p.chat(ChatRequest {
        model: "test-model",
        messages,
        tools,
        max_tokens: 256,
        temperature: None,
        tool_choice: None,
        scheduled: false,
    })
    .await
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

// ---------------------------------------------------------------------------
// Happy paths
// ---------------------------------------------------------------------------

#[tokio::test]
async fn openai_text_answer_and_request_format() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::text("Hello from the fake."));
    let mut cfg = config(ProviderKind::Openai, &fake.base_url(), Some(KEY));
    cfg.extra_headers.insert("X-Title".into(), "bramble-test".into());
    let p = OpenAiProvider::new(&cfg).unwrap();
    let msgs = [Message::system("You are terse."), Message::user("hi")];
    let tools = [exec_tool()];
    let r = p
        .chat(ChatRequest {
            model: "gpt-test",
            messages: &msgs,
            tools: &tools,
            max_tokens: 99,
            temperature: Some(0.5),
            tool_choice: None,
            scheduled: false,
        })
        .await
        .unwrap();

    assert_eq!(r.content.as_deref(), Some("Hello from the fake."));
    assert!(r.tool_calls.is_empty());
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        r.usage,
        Usage { input_tokens: 2 * PROMPT_TOKENS_PER_MESSAGE, output_tokens: COMPLETION_TOKENS_PER_PART }
    );

    let req = fake.last_request().unwrap();
    assert_eq!(req["model"], "gpt-test");
    assert_eq!(req["max_tokens"], 99);
    assert_eq!(req["temperature"], 0.5);
    assert_eq!(
        req["messages"],
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(
        req["tools"],
        json!([{"type": "function", "function": {
            "name": "exec", "description": "Run a shell command", "parameters": exec_tool().parameters}}])
    );
    assert_eq!(fake.paths(), ["/v1/chat/completions"]);
    let h = &fake.headers()[0];
    assert_eq!(header(h, "authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(header(h, "x-title"), Some("bramble-test"));
    assert_eq!(header(h, "content-type"), Some("application/json"));
    assert!(header(h, "user-agent").unwrap().starts_with("bramble/"), "{h:?}");
}

#[tokio::test]
async fn openai_without_a_key_sends_no_authorization() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::text("local model here"));
    let p = OpenAiProvider::new(&config(ProviderKind::Openai, &fake.base_url(), None)).unwrap();
    let r = chat(&p, &[Message::user("hi")], &[]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("local model here"));
    assert_eq!(header(&fake.headers()[0], "authorization"), None);
    assert!(fake.last_request().unwrap().get("tools").is_none(), "no tools key when there are none");
}

#[tokio::test]
async fn anthropic_text_answer_and_request_format() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::text("Bonjour."));
    let p = anthropic(&fake);
    let r = chat(&p, &[Message::system("Be brief."), Message::user("hello")], &[exec_tool()]).await.unwrap();

    assert_eq!(r.content.as_deref(), Some("Bonjour."));
    assert_eq!(r.finish_reason.as_deref(), Some("end_turn"));
    // One message plus the top-level system prompt.
    assert_eq!(
        r.usage,
        Usage { input_tokens: 2 * PROMPT_TOKENS_PER_MESSAGE, output_tokens: COMPLETION_TOKENS_PER_PART }
    );

    let req = fake.last_request().unwrap();
    assert_eq!(req["model"], "test-model");
    assert_eq!(req["max_tokens"], 256);
    assert_eq!(req["system"], "Be brief.");
    assert_eq!(req["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]));
    assert_eq!(
        req["tools"],
        json!([{"name": "exec", "description": "Run a shell command", "input_schema": exec_tool().parameters}])
    );
    assert_eq!(fake.paths(), ["/v1/messages"]);
    let h = &fake.headers()[0];
    assert_eq!(header(h, "x-api-key"), Some(KEY));
    assert_eq!(header(h, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(h, "content-type"), Some("application/json"));
    assert_eq!(header(h, "authorization"), None);
}

#[tokio::test]
async fn openai_tool_calls_round_trip() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::ToolCalls(vec![
        ("exec".into(), r#"{"command":"date"}"#.into()),
        ("read_file".into(), r#"{"path":"notes.md"}"#.into()),
    ]));
    fake.push(Reply::text("It is Monday."));
    let p = openai(&fake);

    let mut history = vec![Message::user("what day is it?")];
    let r = chat(&p, &history, &[exec_tool()]).await.unwrap();
    assert_eq!(r.content, None);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        r.tool_calls,
        vec![
            ToolCall::new("call_1", "exec", r#"{"command":"date"}"#),
            ToolCall::new("call_2", "read_file", r#"{"path":"notes.md"}"#),
        ]
    );

    // Send the results back; the fake checks that they answer the calls.
    history.push(Message::assistant_tool_calls(None, r.tool_calls.clone()));
    history.push(Message::tool_result("call_1", "exec", "Mon"));
    history.push(Message::tool_result("call_2", "read_file", "(empty)"));
    let r = chat(&p, &history, &[exec_tool()]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("It is Monday."));

    let sent = &fake.requests()[1]["messages"];
    assert!(sent[1].as_object().unwrap().contains_key("content"), "content key must be present: {sent}");
    assert_eq!(sent[1]["content"], Value::Null);
    assert_eq!(sent[1]["tool_calls"][1]["function"]["arguments"], r#"{"path":"notes.md"}"#);
    assert_eq!(sent[2], json!({"role": "tool", "content": "Mon", "tool_call_id": "call_1", "name": "exec"}));
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn anthropic_tool_calls_round_trip() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::TextAndToolCalls(
        "Checking.".into(),
        vec![("exec".into(), r#"{"command": "uptime"}"#.into()), ("list_dir".into(), "not json".into())],
    ));
    fake.push(Reply::text("Up 3 days."));
    let p = anthropic(&fake);

    let mut history = vec![Message::user("uptime?")];
    let r = chat(&p, &history, &[exec_tool()]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("Checking."));
    assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
    assert_eq!(
        r.tool_calls,
        vec![ToolCall::new("toolu_1", "exec", r#"{"command":"uptime"}"#), ToolCall::new("toolu_2", "list_dir", "{}")]
    );
    assert_eq!(r.usage.output_tokens, 3 * COMPLETION_TOKENS_PER_PART);

    history.push(Message::assistant_tool_calls(r.content.clone(), r.tool_calls.clone()));
    history.push(Message::tool_result("toolu_1", "exec", "up 3 days"));
    history.push(Message::tool_result("toolu_2", "list_dir", "a b c"));
    let r = chat(&p, &history, &[exec_tool()]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("Up 3 days."));

    let sent = &fake.requests()[1]["messages"];
    assert_eq!(
        sent[1]["content"][1],
        json!({"type": "tool_use", "id": "toolu_1", "name": "exec", "input": {"command": "uptime"}})
    );
    assert_eq!(sent[2]["role"], "user");
    assert_eq!(sent[2]["content"].as_array().unwrap().len(), 2, "both results in one user message: {sent}");
}

#[tokio::test]
async fn anthropic_translates_a_multi_step_history() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::text("All done."));
    let p = anthropic(&fake);
    let history = vec![
        Message::system("You are bramble."),
        // A history window cut mid-conversation: these must not lead.
        Message::assistant("…and that is why."),
        Message::tool_result("toolu_0", "exec", "stale"),
        Message::user("[Runtime context: 2025-01-06 09:00 Europe/Berlin]"),
        Message::user("Check the disk, then tell me."),
        Message::assistant_tool_calls(
            Some("Looking.".into()),
            vec![ToolCall::new("c1", "exec", r#"{"command":"df -h"}"#), ToolCall::new("c2", "exec", "{broken")],
        ),
        Message::tool_result("c1", "exec", "/dev/root 40%"),
        Message::tool_result("c2", "exec", "Error: bad arguments"),
        Message::assistant("Disk is 40% full."),
        Message::system("Memory: the user likes short answers."),
        Message::user("thanks"),
    ];
    let r = chat(&p, &history, &[exec_tool()]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("All done."), "the fake accepted the translated history");

    let req = fake.last_request().unwrap();
    assert_eq!(req["system"], "You are bramble.\n\nMemory: the user likes short answers.");
    let msgs = req["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    assert_eq!(msgs[0]["content"].as_array().unwrap().len(), 2, "runtime context and question merged");
    assert_eq!(msgs[1]["content"][2]["input"], json!({}), "unparseable arguments become {{}}");
    assert_eq!(
        msgs[2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "c1", "content": "/dev/root 40%"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "Error: bad arguments"},
        ])
    );
}

#[tokio::test]
async fn a_one_provider_chain_is_a_working_backend_of_each_kind() {
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let fake = FakeLlm::start(dialect).await;
        fake.push(Reply::error(503, "warming up"));
        fake.push(Reply::text("ready"));
        let kind = if dialect == Dialect::OpenAi { ProviderKind::Openai } else { ProviderKind::Anthropic };
        let mut cfg = config(kind, &fake.base_url(), Some(KEY));
        cfg.max_retries = 1;
        let p = Chain::new(vec![Backend::from_config(&cfg)], &[], Duration::from_secs(300));
        assert_eq!(p.name(), kind.as_str());
        // The default policy waits 1 s before the retry.
        let start = Instant::now();
        let r = chat(&p, &[Message::user("hi")], &[]).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("ready"));
        assert_eq!(fake.request_count(), 2);
        assert!(start.elapsed() >= Duration::from_secs(1), "{:?}", start.elapsed());
        assert_eq!(r.route.map(|r| r.label()), Some(format!("{}/test-model", kind.as_str())));
        assert!(p.health().is_empty(), "one provider has no chain to show");
    }
}

#[tokio::test]
async fn missing_key_for_a_public_endpoint_is_not_configured() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let cfg =
            ProviderConfig { kind, api_key_env: Some("BRAMBLE_TEST_NO_SUCH_KEY_e41b".into()), ..Default::default() };
        let err = client(&cfg).err().expect("no key must be an error");
        assert!(matches!(err, ProviderError::NotConfigured(_)), "{err:?}");
        assert!(err.to_string().contains("BRAMBLE_TEST_NO_SUCH_KEY_e41b"), "{err}");
    }
}

// ---------------------------------------------------------------------------
// Errors and retries
// ---------------------------------------------------------------------------

#[tokio::test]
async fn rate_limit_then_success() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::Status {
        status: 429,
        body: json!({"error": {"message": "Rate limit reached"}}).to_string(),
        retry_after: Some(0),
    });
    fake.push(Reply::text("made it"));
    let start = Instant::now();
    let r = chat(&openai(&fake), &[Message::user("hi")], &[]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("made it"));
    assert_eq!(fake.request_count(), 2);
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::Status {
        status: 529,
        body: json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
        retry_after: Some(1),
    });
    fake.push(Reply::text("ok"));
    // Backoff alone would wait 10 ms: the 1 s can only come from the header.
    let start = Instant::now();
    chat(&anthropic(&fake), &[Message::user("hi")], &[]).await.unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn server_errors_until_giving_up() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    for _ in 0..4 {
        fake.push(Reply::error(500, "upstream exploded"));
    }
    let err = chat(&openai(&fake), &[Message::user("hi")], &[]).await.unwrap_err();
    assert_eq!(fake.request_count(), 4);
    let text = err.to_string();
    match err {
        ProviderError::GaveUp { attempts: 4, last } => {
            assert!(matches!(*last, ProviderError::Http { status: 500, .. }), "{last:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(text.contains("500") && text.contains("upstream exploded"), "{text}");
}

#[tokio::test]
async fn unauthorized_is_not_retried() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    // A server that echoes the key: it must not reach our error text.
    fake.push(Reply::error(401, &format!("Incorrect API key provided: {KEY}")));
    fake.push(Reply::text("never served"));
    let err = chat(&openai(&fake), &[Message::user("hi")], &[]).await.unwrap_err();
    assert_eq!(fake.request_count(), 1);
    match &err {
        ProviderError::Auth { status: 401, message } => assert_eq!(message, "Incorrect API key provided: ***"),
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains(KEY));
}

#[tokio::test]
async fn anthropic_auth_errors_carry_the_server_message() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::Status {
        status: 403,
        body: json!({"type": "error", "error": {"type": "permission_error", "message": "no access to this model"}})
            .to_string(),
        retry_after: None,
    });
    let err = chat(&anthropic(&fake), &[Message::user("hi")], &[]).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Auth { status: 403, message } if message == "no access to this model"),
        "{err:?}"
    );
    assert_eq!(fake.request_count(), 1);

    // The fake, like the real API, refuses a request without a key.
    let p = AnthropicProvider::new(&config(ProviderKind::Anthropic, &fake.base_url(), None)).unwrap();
    let err = chat(&p, &[Message::user("hi")], &[]).await.unwrap_err();
    assert!(matches!(&err, ProviderError::Auth { status: 401, message } if message.contains("x-api-key")), "{err:?}");
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::Status { status: 400, body: "context length exceeded".into(), retry_after: None });
    let err = chat(&openai(&fake), &[Message::user("hi")], &[]).await.unwrap_err();
    assert_eq!(fake.request_count(), 1);
    assert!(
        matches!(&err, ProviderError::Http { status: 400, message, retry_after: None } if message == "context length exceeded"),
        "{err:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_unreachable_and_not_retried() {
    let url = refused_url().await;
    let cfg = config(ProviderKind::Openai, &format!("{url}/v1"), Some(KEY));
    let p = Retrying::new(OpenAiProvider::new(&cfg).unwrap(), fast());
    let err = chat(&p, &[Message::user("hi")], &[]).await.unwrap_err();
    let text = err.to_string();
    match err {
        ProviderError::Unreachable { url: got, message } => {
            assert_eq!(got, format!("{url}/v1/chat/completions"));
            assert!(message.to_lowercase().contains("refused"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(text.ends_with("`bramble doctor` checks it"), "{text}");
    assert!(!text.contains(KEY), "{text}");
}

#[tokio::test]
async fn a_slow_server_is_a_timeout_error() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::Delayed(Duration::from_secs(3), Box::new(Reply::text("too late"))));
    let mut cfg = config(ProviderKind::Openai, &fake.base_url(), Some(KEY));
    cfg.timeout = Dur(Duration::from_millis(300));
    let p = OpenAiProvider::new(&cfg).unwrap();
    let start = Instant::now();
    let err = chat(&p, &[Message::user("hi")], &[]).await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    match err {
        ProviderError::Timeout { ref message, .. } => {
            assert!(message.contains("timed out"), "{message}");
            assert!(err.is_retryable() && err.falls_back(), "a hung host is worth another try, or another model");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn malformed_success_bodies_are_decode_errors() {
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let fake = FakeLlm::start(dialect).await;
        let bodies = ["not json", "{}", r#"{"choices":[]}"#, "", "[]", r#"{"content":"nope","choices":null}"#];
        for body in bodies {
            fake.push(Reply::Raw { status: 200, body: body.into() });
        }
        for body in bodies {
            let before = fake.request_count();
            let err = match dialect {
                Dialect::OpenAi => chat(&openai(&fake), &[Message::user("hi")], &[]).await,
                Dialect::Anthropic => chat(&anthropic(&fake), &[Message::user("hi")], &[]).await,
            }
            .unwrap_err();
            assert_eq!(fake.request_count(), before + 1, "decode errors are not retried");
            match err {
                ProviderError::Decode(m) => assert!(m.contains(body), "{dialect:?} {body:?}: {m}"),
                other => panic!("{dialect:?} {body:?}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn openai_compatible_oddities_are_accepted() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let odd = json!({
        "model": "local",
        "choices": [{
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "Part one, "}, {"type": "text", "text": "part two."}],
                "reasoning_content": "thinking out loud",
                "tool_calls": [
                    {"type": "function", "function": {"name": "exec", "arguments": {"command": "ls"}}},
                    {"id": "", "function": {"name": "read_file", "arguments": "{\"path\":\"x\"}"}},
                ],
            },
            "finish_reason": "",
        }],
        "usage": {"prompt_tokens": 7, "completion_tokens": null},
    });
    fake.push(Reply::Raw { status: 200, body: odd.to_string() });
    fake.push(Reply::Raw {
        status: 200,
        body: json!({"choices": [{"message": {"content": "plain"}, "finish_reason": "eos_token"}]}).to_string(),
    });
    let p = openai(&fake);

    let r = chat(&p, &[Message::user("hi")], &[]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("Part one, part two."));
    assert_eq!(r.finish_reason.as_deref(), Some(""));
    assert_eq!(r.usage, Usage { input_tokens: 7, output_tokens: 0 });
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(r.tool_calls[0].function.name, "exec");
    assert_eq!(serde_json::from_str::<Value>(&r.tool_calls[0].function.arguments).unwrap(), json!({"command": "ls"}));
    assert_eq!(r.tool_calls[1].function.arguments, r#"{"path":"x"}"#);
    for c in &r.tool_calls {
        assert!(c.id.starts_with("call_") && c.id.len() > 5, "{}", c.id);
    }
    assert_ne!(r.tool_calls[0].id, r.tool_calls[1].id);

    let r = chat(&p, &[Message::user("hi")], &[]).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("plain"));
    assert_eq!(r.finish_reason.as_deref(), Some("eos_token"));
}

// ---------------------------------------------------------------------------
// The fakes themselves
// ---------------------------------------------------------------------------

#[tokio::test]
async fn fake_llm_fails_loudly_when_the_script_runs_out() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let p = Retrying::new(
        OpenAiProvider::new(&config(ProviderKind::Openai, &fake.base_url(), None)).unwrap(),
        RetryPolicy { max_retries: 0, ..fast() },
    );
    let err = chat(&p, &[Message::user("hi")], &[]).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Http { status: 500, message, .. } if message == "fake LLM: no scripted reply left"),
        "{err:?}"
    );
}

#[tokio::test]
async fn fake_llm_rejects_malformed_histories_like_the_real_apis() {
    // OpenAI: a tool result that answers nothing.
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::text("unreachable"));
    let orphan = [Message::user("hi"), Message::tool_result("call_9", "exec", "x")];
    let err = chat(&openai(&fake), &orphan, &[]).await.unwrap_err();
    assert!(matches!(&err, ProviderError::Http { status: 400, message, .. } if message.contains("'tool'")), "{err:?}");
    assert_eq!(fake.remaining(), 1, "a rejected request does not consume the script");

    // Anthropic: a tool_use left unanswered.
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    fake.push(Reply::text("unreachable"));
    let unanswered = [
        Message::user("hi"),
        Message::assistant_tool_calls(None, vec![ToolCall::new("t1", "exec", "{}")]),
        Message::user("never mind"),
    ];
    let err = chat(&anthropic(&fake), &unanswered, &[]).await.unwrap_err();
    assert!(matches!(&err, ProviderError::Http { status: 400, message, .. } if message.contains("t1")), "{err:?}");
    assert_eq!(fake.remaining(), 1);
}

#[tokio::test]
async fn test_server_speaks_keep_alive_chunked_and_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server =
        TestServer::start(|req| Response::text(200, format!("{} {} {}", req.method, req.path, req.text()))).await;
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").await.unwrap();
    s.write_all(b"POST /b?q=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3;x=y\r\nllo\r\n0\r\n\r\n")
        .await
        .unwrap();
    s.write_all(b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{out}");
    assert!(out.contains("\r\n\r\nPOST /a abc"), "{out}");
    assert!(out.contains("\r\n\r\nPOST /b?q=1 hello"), "{out}");
    assert!(out.ends_with("connection: close\r\n\r\nGET /c "), "{out}");

    // Dropping the server closes the port.
    let addr = server.addr();
    drop(server);
    let mut closed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            closed = true;
            break;
        }
    }
    assert!(closed, "the port still accepts connections after the drop");
}

// ---------------------------------------------------------------------------
// Fallback chains: real backends over HTTP, failing in each way
// ---------------------------------------------------------------------------

/// A named backend at `base_url` with the shrunk retry schedule.
fn backend(name: &str, base_url: &str, model: &str) -> Backend {
    let mut cfg = config(ProviderKind::Openai, base_url, Some(KEY));
    cfg.name = Some(toml::Spanned::new(0..0, name.to_string()));
    cfg.model = Some(model.to_string());
    cfg.timeout = Dur(Duration::from_secs(1));
    let mut b = Backend::from_config(&cfg);
    b.policy = fast();
    b
}

/// `primary` first (model `big`), then the fake `lan` (model `small`).
fn two(primary_url: &str, lan: &FakeLlm, cooldown: Duration) -> Chain {
    Chain::new(
        vec![backend("cloud", primary_url, "big"), backend("lan", &lan.base_url(), "small")],
        &["lan".to_string()],
        cooldown,
    )
}

async fn ask(p: &Chain, model: &str) -> Result<ChatResponse, ProviderError> {
    let msgs = [Message::user("the 07:00 briefing")];
    p.chat(ChatRequest {
        model,
        messages: &msgs,
        tools: &[],
        max_tokens: 64,
        temperature: None,
        tool_choice: None,
        scheduled: false,
    })
    .await
}

#[tokio::test]
async fn a_chain_moves_on_from_each_kind_of_failure() {
    // (what the primary does, the error the route must name, requests the primary may get)
    let cases: Vec<(&str, Vec<Reply>, &str, usize)> = vec![
        ("500 after one retry (another model waits)", vec![Reply::error(500, "boom"); 2], "HTTP 500", 2),
        (
            "429 with a long Retry-After: not waited",
            vec![Reply::Status {
                status: 429,
                body: json!({"error": {"message": "slow down"}}).to_string(),
                retry_after: Some(30),
            }],
            "HTTP 429",
            1,
        ),
        ("401: the key", vec![Reply::error(401, "bad key")], "refused the credentials", 1),
        ("404: no such model", vec![Reply::error(404, "The model `big` does not exist")], "does not exist", 1),
        (
            "a hung socket: one timeout, no retry",
            vec![Reply::Delayed(Duration::from_secs(20), Box::new(Reply::text("late")))],
            "did not answer in time",
            1,
        ),
    ];
    for (what, script, error, requests) in cases {
        let primary = FakeLlm::start(Dialect::OpenAi).await;
        for r in script {
            primary.push(r);
        }
        let lan = FakeLlm::start(Dialect::OpenAi).await;
        lan.push(Reply::text("briefing from the LAN"));
        let chain = two(&primary.base_url(), &lan, Duration::from_secs(300));
        let start = Instant::now();
        let r = ask(&chain, "big").await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.content.as_deref(), Some("briefing from the LAN"), "{what}");
        let route = r.route.expect("a chain says who answered");
        assert_eq!(route.label(), "lan/small", "{what}");
        let why = route.fallback.unwrap_or_else(|| panic!("{what}: a fallback says why"));
        assert!(why.starts_with("cloud/big: ") && why.contains(error), "{what}: {why}");
        assert_eq!(primary.request_count(), requests, "{what}");
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: took {:?}", start.elapsed());
        assert_eq!(lan.last_request().unwrap()["model"], "small", "{what}");
    }
}

#[tokio::test]
async fn a_refused_connection_moves_on_and_the_cooldown_holds() {
    let dead = refused_url().await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let chain = two(&format!("{dead}/v1"), &lan, Duration::from_millis(600));
    lan.push(Reply::text("one"));
    let r = ask(&chain, "big").await.unwrap();
    let why = r.route.unwrap().fallback.unwrap();
    assert!(why.contains("could not reach") && !why.contains("attempts"), "not retried: {why}");
    // Within the cooldown the dead host is skipped: at once, and the reason says so.
    lan.push(Reply::text("two"));
    let start = Instant::now();
    let r = ask(&chain, "big").await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(60), "no retries against a cooling host: {:?}", start.elapsed());
    assert!(r.route.unwrap().fallback.unwrap().contains("cooling down"));
    let health = chain.health();
    assert!(health[0].starts_with("cloud: cooling down for"), "{health:?}");
    assert_eq!(health[1], "lan: ok");
    assert_eq!(health[2], "fallback: lan/small");
    // After it, the primary is tried first again (a host back up is used again).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let back = FakeLlm::start(Dialect::OpenAi).await;
    let chain = two(&back.base_url(), &lan, Duration::from_millis(600));
    back.push(Reply::error(503, "down"));
    back.push(Reply::error(503, "down"));
    lan.push(Reply::text("three"));
    ask(&chain, "big").await.unwrap();
    assert_eq!(back.request_count(), 2, "hurried: one retry while another model waits");
    tokio::time::sleep(Duration::from_millis(700)).await;
    back.push(Reply::text("the cloud again"));
    let r = ask(&chain, "big").await.unwrap();
    assert_eq!(r.content.as_deref(), Some("the cloud again"));
    let route = r.route.unwrap();
    assert_eq!((route.label().as_str(), route.fallback), ("cloud/big", None));
    assert_eq!(chain.health()[0], "cloud: ok", "a success ends the cooldown");
}

#[tokio::test]
async fn an_exhausted_chain_is_one_clear_error_and_bad_requests_do_not_fall_back() {
    let primary = FakeLlm::start(Dialect::OpenAi).await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let chain = two(&primary.base_url(), &lan, Duration::from_secs(300));
    primary.push(Reply::error(401, "bad key"));
    lan.push(Reply::error(404, "model `small` not found, try pulling it first"));
    let err = ask(&chain, "big").await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("no model could answer: cloud/big: the provider refused the credentials"), "{text}");
    assert!(text.contains("; lan/small: the provider answered HTTP 404: model `small` not found"), "{text}");

    // Both cooling now: still tried (last rather than not at all), in order.
    primary.push(Reply::text("back"));
    assert_eq!(ask(&chain, "big").await.unwrap().content.as_deref(), Some("back"));

    // A request the server calls bad would fail anywhere: no fallback, the error as it is.
    let fresh = two(&primary.base_url(), &lan, Duration::from_secs(300));
    primary.push(Reply::error(400, "context length exceeded"));
    let before = lan.request_count();
    let err = ask(&fresh, "big").await.unwrap_err();
    assert!(matches!(err, ProviderError::Http { status: 400, .. }), "{err:?}");
    assert_eq!(lan.request_count(), before);
}

#[tokio::test]
async fn models_are_named_by_provider_and_a_single_provider_keeps_its_errors() {
    let a = FakeLlm::start(Dialect::OpenAi).await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let chain = two(&a.base_url(), &lan, Duration::from_secs(300));
    assert_eq!(chain.label("lan/qwen2.5:3b"), "lan/qwen2.5:3b");
    assert_eq!(chain.label("lan"), "lan/small");
    assert_eq!(chain.label("openai/gpt-4o"), "cloud/openai/gpt-4o", "a plain model of the first provider");
    lan.push(Reply::text("pinned"));
    let r = ask(&chain, "lan/qwen2.5:3b").await.unwrap();
    assert_eq!(lan.last_request().unwrap()["model"], "qwen2.5:3b");
    assert_eq!(r.route.unwrap().fallback, None, "the model asked for answered");
    assert_eq!(a.request_count(), 0);

    // One provider, no fallback: exactly the old behaviour (its own error).
    let only = Chain::new(vec![backend("cloud", &a.base_url(), "big")], &[], Duration::from_secs(300));
    for _ in 0..4 {
        a.push(Reply::error(503, "overloaded"));
    }
    let err = ask(&only, "big").await.unwrap_err();
    assert!(matches!(err, ProviderError::GaveUp { attempts: 4, .. }), "{err:?}");
}

#[tokio::test]
async fn a_provider_over_its_daily_budget_is_skipped() {
    struct Spent;
    impl bramble::provider::chain::Meter for Spent {
        fn used_today(&self, provider: &str) -> u64 {
            if provider == "cloud" {
                5000
            } else {
                0
            }
        }
    }
    let cloud = FakeLlm::start(Dialect::OpenAi).await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let mut primary = backend("cloud", &cloud.base_url(), "big");
    primary.budget = 5000;
    let chain = Chain::new(vec![primary, backend("lan", &lan.base_url(), "small")], &["lan".into()], Duration::ZERO)
        .with_meter(std::sync::Arc::new(Spent));
    lan.push(Reply::text("local"));
    let r = ask(&chain, "big").await.unwrap();
    assert!(r.route.unwrap().fallback.unwrap().contains("budget of this provider is used up (5000 of 5000"));
    assert_eq!(cloud.request_count(), 0);
    assert!(chain.health()[0].contains("budget used up today"), "{:?}", chain.health());
}

/// https through the real binary against a real TLS server (mosquitto's TLS
/// listener: it speaks no HTTP, but the handshake is what is tested). The CA
/// store is loaded lazily, at the handshake: an unknown issuer is refused, and
/// one the platform trusts (SSL_CERT_FILE) passes the handshake.
#[tokio::test]
async fn https_verifies_the_certificate_with_the_platform_store_loaded_at_the_handshake() {
    use crate::support::mosquitto::Mosquitto;
    let (broker, ca) = Mosquitto::start_tls().await;
    let port = broker.tls_port.expect("tls");
    let home = crate::support::setup::TestHome::new("openai", &format!("https://localhost:{port}/v1"), "", "", "");
    let run = |cert: Option<&std::path::Path>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        cmd.arg("--config")
            .arg(&home.config)
            .args(["agent", "-m", "hi"])
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(cert) = cert {
            cmd.env("SSL_CERT_FILE", cert);
        }
        async move { tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.unwrap().unwrap() }
    };
    let out = run(None).await;
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("certificate") && err.contains("unknownissuer"), "refused for its issuer: {err}");
    let out = run(Some(&ca)).await;
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert_eq!(out.status.code(), Some(1), "mosquitto is no LLM: {err}");
    assert!(!err.contains("certificate"), "the trusted certificate passed the handshake: {err}");
}
