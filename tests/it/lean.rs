//! The lean profile and the context window, through the real binary: the
//! first request of a CLI turn with one `exec` call (its size in tokens,
//! characters / 4, the measure of issue 43), a window learnt from the server
//! (llama.cpp's `GET /props` answer, as its server README documents it), and
//! what a server that lies about its window gets.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::{Response, TestServer};
use crate::support::setup::{bramble, TestHome};

/// The fixed budget of the lean first prompt, in tokens (characters / 4):
/// issue 43's goal, an eighth of nanobot 0.3.5's ≈ 8,200.
const LEAN_BUDGET: usize = 1_000;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tokens(request: &Value) -> usize {
    request.to_string().chars().count() / 4
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// The first request body of `bramble agent -m "run true"` (one exec call) with `agent_extra`.
async fn first_request(agent_extra: &str) -> Value {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), agent_extra, "", "");
    fake.push(Reply::tool_call("exec", r#"{"command":"true"}"#));
    fake.push(Reply::text("done"));
    let cfg = home.config.to_str().unwrap().to_string();
    let out = bramble(home.path(), &["--config", &cfg, "agent", "-m", "run true"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done\n");
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "one exec call, then the answer");
    assert!(requests[1]["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool"), "{}", requests[1]);
    requests[0].clone()
}

#[tokio::test]
async fn the_lean_first_prompt_is_smaller_than_the_default_and_within_its_budget() {
    let default = first_request("").await;
    let lean = first_request("profile = \"lean\"").await;
    let (d, l) = (tokens(&default), tokens(&lean));
    eprintln!(
        "first prompt: default {d} tokens, {} tools; lean {l} tokens, {} tools",
        tool_names(&default).len(),
        tool_names(&lean).len()
    );
    assert!(l < d, "lean {l} tokens, default {d}");
    assert!(l <= LEAN_BUDGET, "the lean first prompt is {l} tokens, over its budget of {LEAN_BUDGET}: {lean}");
    let names = tool_names(&lean);
    assert!(names.contains(&"exec".to_string()) && names.contains(&"cron".to_string()), "{names:?}");
    assert!(!names.contains(&"spawn".to_string()) && !names.contains(&"memory_search".to_string()), "{names:?}");
    assert!(tool_names(&default).contains(&"spawn".to_string()));
}

/// A provider that is llama.cpp's server: `GET /props` says `props`, the chat
/// endpoint answers "ok" (OpenAI's chat-completion object); chat bodies recorded.
async fn llama_server(props: Response) -> (TestServer, Arc<Mutex<Vec<Value>>>) {
    server_with(move |req| (req.path_only() == "/props").then(|| props.clone())).await
}

/// An OpenAI-compatible server whose other routes `extra` answers (404 where it says nothing).
async fn server_with(
    extra: impl Fn(&crate::support::http::Request) -> Option<Response> + Send + Sync + 'static,
) -> (TestServer, Arc<Mutex<Vec<Value>>>) {
    let chats = Arc::new(Mutex::new(Vec::new()));
    let seen = chats.clone();
    let server = TestServer::start(move |req| match req.path_only() {
        "/v1/chat/completions" => {
            seen.lock().unwrap().push(req.json().unwrap_or(Value::Null));
            Response::json(
                200,
                &json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
            )
        }
        _ => extra(&req).unwrap_or(Response::new(404)),
    })
    .await;
    (server, chats)
}

async fn turn_against(props: Response) -> (Value, String) {
    turn_on(llama_server(props).await).await
}

async fn turn_on((server, chats): (TestServer, Arc<Mutex<Vec<Value>>>)) -> (Value, String) {
    let home = TestHome::new("openai", &format!("{}/v1", server.url()), "", "", "");
    let cfg = home.config.to_str().unwrap().to_string();
    let out = bramble(home.path(), &["--config", &cfg, "agent", "-m", "hi"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ok\n");
    let first = chats.lock().unwrap().first().cloned().expect("a chat request");
    (first, text(&out.stderr))
}

#[tokio::test]
async fn a_small_window_reported_by_the_server_chooses_the_lean_profile() {
    let props = Response::json(200, &json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}));
    let (first, _) = turn_against(props).await;
    let names = tool_names(&first);
    assert!(names.len() <= 5 && names.contains(&"exec".to_string()), "{names:?}");
    assert!(tokens(&first) <= LEAN_BUDGET, "{}", tokens(&first));
}

#[tokio::test]
async fn a_window_the_server_lies_about_is_ignored_with_a_log_line() {
    // Huge, negative, a string, longer than a window answer can be: each ignored with a
    // warning; not JSON at all (a web UI's catch-all page): ignored quietly.
    for (props, logged) in [
        (Response::json(200, &json!({"default_generation_settings": {"n_ctx": 99_999_999_999u64}})), true),
        (Response::json(200, &json!({"default_generation_settings": {"n_ctx": -4096}})), true),
        (Response::json(200, &json!({"default_generation_settings": {"n_ctx": "4096"}})), true),
        (
            Response::json(200, &json!({"default_generation_settings": {"n_ctx": 4096}, "pad": "x".repeat(2 << 20)})),
            true,
        ),
        (Response::text(200, "<html>not json</html>"), false),
    ] {
        let (first, stderr) = turn_against(props).await;
        let names = tool_names(&first);
        assert!(names.contains(&"spawn".to_string()), "the default profile: {names:?}");
        assert_eq!(stderr.contains("/props: its context window is ignored"), logged, "{stderr}");
    }
}

#[tokio::test]
async fn check_and_doctor_warn_when_the_fixed_part_takes_over_half_the_window() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "profile = \"default\"", "context_window = 2048", "");
    let cfg = home.config.to_str().unwrap().to_string();
    let check = text(&bramble(home.path(), &["--config", &cfg, "check"], None).await.stdout);
    let warning = check.lines().find(|l| l.contains("the system prompt and tool specs take")).unwrap_or_default();
    assert!(
        warning.starts_with("warning: ")
            && warning.contains("of the model's 2048 tokens ([provider] context_window; profile default)")
            && warning.contains("more than half")
            && warning.contains("profile = \"lean\""),
        "{check}"
    );
    let doctor = text(&bramble(home.path(), &["--config", &cfg, "doctor"], None).await.stdout);
    let line = doctor.lines().find(|l| l.contains("context")).unwrap_or_default();
    assert!(line.starts_with("warning") && line.contains("more than half"), "{doctor}");
    // The lean profile fits the same window: no warning, and doctor says what it found.
    let lean = std::fs::read_to_string(&home.config).unwrap().replace("profile = \"default\"", "profile = \"lean\"");
    std::fs::write(&home.config, lean).unwrap();
    let check = text(&bramble(home.path(), &["--config", &cfg, "check"], None).await.stdout);
    assert!(!check.contains("tool specs take"), "{check}");
    let doctor = text(&bramble(home.path(), &["--config", &cfg, "doctor"], None).await.stdout);
    let line = doctor.lines().find(|l| l.contains("context")).unwrap_or_default();
    assert!(line.starts_with("ok") && line.contains("profile lean"), "{doctor}");
}

#[tokio::test]
async fn ollamas_show_answer_gives_the_window_and_a_redirect_is_not_followed() {
    // Ollama's `POST /api/show` (docs/api.md): `parameters` as Modelfile lines, `model_info` from the GGUF.
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let ollama = server_with(move |req| {
        (req.path_only() == "/api/show").then(|| {
            seen.lock().unwrap().push((req.method.clone(), req.json().unwrap_or(Value::Null)));
            Response::json(
                200,
                &json!({"parameters": "stop \"<|im_end|>\"\nnum_ctx                        2048",
                        "model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}}),
            )
        })
    })
    .await;
    let (first, _) = turn_on(ollama).await;
    assert_eq!(*asked.lock().unwrap(), [("POST".to_string(), json!({"model": "test-model"}))]);
    assert!(tool_names(&first).len() <= 5, "a 2048-token window is lean: {:?}", tool_names(&first));

    // A `/props` that redirects elsewhere: not followed (the other server hears nothing), the default profile.
    let elsewhere_hits = Arc::new(Mutex::new(0));
    let hits = elsewhere_hits.clone();
    let elsewhere = TestServer::start(move |_| {
        *hits.lock().unwrap() += 1;
        Response::json(200, &json!({"default_generation_settings": {"n_ctx": 1024}}))
    })
    .await;
    let to = format!("{}/props", elsewhere.url());
    let (first, _) = turn_against(Response::new(302).header("location", to)).await;
    assert_eq!(*elsewhere_hits.lock().unwrap(), 0);
    assert!(tool_names(&first).contains(&"spawn".to_string()), "{:?}", tool_names(&first));
}

#[tokio::test]
async fn a_small_window_starts_consolidation_before_the_prompt_overflows_it() {
    use bramble::agent::TurnRequest;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    // `[agent] context_tokens` stays at its 24,000: the 4,096-token window (a
    // prompt budget of 3,072) is what starts consolidation.
    let home = TestHome::new("openai", &fake.base_url(), "", "context_window = 4096", "");
    let (agent, _out) = home.agent();
    // Messages of ~1,000 tokens: the third turn's prompt would pass the budget.
    let big = |c: char| c.to_string().repeat(4000);
    for c in ['a', 'b'] {
        fake.push(Reply::text("ok"));
        agent.turn(TurnRequest::cli("s", big(c))).await.unwrap();
    }
    assert_eq!(fake.request_count(), 2, "still under the budget");
    let summary = json!({"history_entry": "[2026-05-01 10:00] Two long messages.", "memory_update": ""});
    fake.push(Reply::tool_call("save_memory", summary.to_string()));
    fake.push(Reply::text("ok"));
    agent.turn(TurnRequest::cli("s", big('c'))).await.unwrap();
    let reqs = fake.requests();
    assert!(reqs[2].get("tool_choice").is_some(), "the third turn consolidated first: {}", reqs[2]);
    assert!(tokens(&reqs[3]) <= 3072, "the turn's prompt fits the budget: {}", tokens(&reqs[3]));
    assert!(tool_names(&reqs[3]).len() <= 5, "4,096 tokens choose the lean profile");
}

#[tokio::test]
async fn a_server_whose_chat_template_drops_the_tools_is_said_by_the_turn_and_doctor() {
    // llama.cpp's `/props` (tools/server/README.md): `chat_template_caps` says whether its template holds tools.
    let caps = |tools: bool| {
        Response::json(
            200,
            &json!({"default_generation_settings": {"n_ctx": 8192},
                    "chat_template_caps": {"supports_tools": tools, "supports_tool_calls": tools}}),
        )
    };
    let (_, stderr) = turn_against(caps(false)).await;
    assert!(stderr.contains("/props: the model's chat template has no tools section"), "{stderr}");
    let (_, stderr) = turn_against(caps(true)).await;
    assert!(!stderr.contains("no tools section"), "a template with tools is fine: {stderr}");

    let (server, _) = llama_server(caps(false)).await;
    let home = TestHome::new("openai", &format!("{}/v1", server.url()), "", "", "");
    let cfg = home.config.to_str().unwrap().to_string();
    let doctor = text(&bramble(home.path(), &["--config", &cfg, "doctor"], None).await.stdout);
    let line = doctor.lines().find(|l| l.contains("context")).unwrap_or_default();
    assert!(
        line.starts_with("warning") && line.contains("no tools section") && line.contains("small-models.md"),
        "{doctor}"
    );
}
