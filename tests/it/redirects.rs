//! Credentials never follow a redirect to another origin (issue 36).
//!
//! Every client that holds a secret is pointed at a "mover": a server on
//! 127.0.0.1 that answers 307 to the same path on a second server, the
//! "trap", on another port (another origin). The trap records what reached it.
//! An HTTP library drops `Authorization` on such a hop, but not `x-api-key`,
//! `X-Subscription-Token`, an MCP server's custom header or a token in the
//! path: those are the secrets checked here. Each client must not go to the
//! trap at all, and must say where the redirect pointed and what to do.

// Some clients are left out of builds without their feature (the slim build).
#![cfg_attr(not(all(feature = "web-search", feature = "mcp")), allow(unused_imports, dead_code))]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::support::http::{Request, Response, TestServer};
use bramble::config::{Dur, HttpUrl, ProviderConfig, ProviderKind, SearchEngine, Secret, WebConfig};
use bramble::provider::{ChatRequest, Message, Provider};
use bramble::tools::{Tool, ToolContext};

const KEY: &str = "sk-redirect-5ecret-key";

/// What one server has received.
type Seen = Arc<Mutex<Vec<Request>>>;

/// The second origin: records every request, answers 200 `{}`.
async fn trap() -> (TestServer, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let server = TestServer::start(move |req| {
        log.lock().unwrap().push(req);
        Response::json(200, &json!({}))
    })
    .await;
    (server, seen)
}

/// The first origin: "moved", 307 to the same path and query on `to`.
async fn mover(to: &TestServer) -> TestServer {
    let to = to.url();
    TestServer::start(move |req: Request| Response::new(307).header("location", format!("{to}{}", req.path))).await
}

/// A trap and the mover in front of it.
async fn moved() -> (TestServer, TestServer, Seen) {
    let (trap, seen) = trap().await;
    let mover = mover(&trap).await;
    (mover, trap, seen)
}

/// That nothing reached the trap, and `secret` least of all; that `err` names the trap's origin.
fn assert_refused(seen: &Seen, secret: &str, trap: &TestServer, err: &str) {
    let seen = seen.lock().unwrap();
    let leaked = seen.iter().any(|r| r.path.contains(secret) || r.headers.iter().any(|(_, v)| v.contains(secret)));
    assert!(!leaked, "the secret reached another origin: {seen:?}");
    assert!(seen.is_empty(), "a request followed the redirect: {seen:?}");
    assert!(err.contains(&format!("redirect to {}", trap.url())), "{err}");
    assert!(err.contains("configure the final URL"), "{err}");
    assert!(!err.contains(secret), "{err}");
}

fn provider_config(kind: ProviderKind, base_url: &str) -> ProviderConfig {
    ProviderConfig {
        name: None,
        model: None,
        daily_token_budget: 0,
        kind,
        base_url: Some(HttpUrl(base_url.to_string())),
        api_key: Some(Secret::new(KEY)),
        api_key_env: Some("BRAMBLE_TEST_NO_SUCH_KEY_e41b".into()),
        timeout: Dur(Duration::from_secs(10)),
        job_timeout: Dur(Duration::from_secs(10)),
        max_retries: 0,
        extra_headers: BTreeMap::new(),
        context_window: None,
        ..ProviderConfig::default()
    }
}

async fn chat(p: &dyn Provider) -> String {
    let messages = [Message::user("hi")];
    let req = ChatRequest {
        model: "m",
        messages: &messages,
        tools: &[],
        max_tokens: 16,
        temperature: None,
        tool_choice: None,
        scheduled: false,
    };
    p.chat(req).await.expect_err("a redirect is not an answer").to_string()
}

#[tokio::test]
async fn anthropic_x_api_key_does_not_follow_a_redirect() {
    let (mover, trap, seen) = moved().await;
    let p = bramble::provider::anthropic::AnthropicProvider::new(&provider_config(
        ProviderKind::Anthropic,
        &format!("{}/v1", mover.url()),
    ))
    .unwrap();
    let err = chat(&p).await;
    assert_refused(&seen, KEY, &trap, &err);
    assert!(err.contains("HTTP 307"), "{err}");
}

#[tokio::test]
async fn openai_extra_headers_do_not_follow_a_redirect() {
    let (mover, trap, seen) = moved().await;
    let mut cfg = provider_config(ProviderKind::Openai, &format!("{}/v1", mover.url()));
    cfg.extra_headers.insert("X-Proxy-Key".into(), "proxy-5ecret-77".into());
    let p = bramble::provider::openai::OpenAiProvider::new(&cfg).unwrap();
    let err = chat(&p).await;
    assert_refused(&seen, "proxy-5ecret-77", &trap, &err);
    assert_refused(&seen, KEY, &trap, &err);
    // The model list (`bramble doctor`) goes through the same client.
    let err = p.probe().await.unwrap_err().to_string();
    assert_refused(&seen, "proxy-5ecret-77", &trap, &err);
}

#[tokio::test]
async fn transcription_key_does_not_follow_a_redirect() {
    let (mover, trap, seen) = moved().await;
    let cfg = bramble::config::TranscriptionConfig {
        kind: bramble::config::TranscriptionKind::Openai,
        base_url: Some(HttpUrl(format!("{}/v1/", mover.url()))),
        api_key: Some(Secret::new(KEY)),
        ..Default::default()
    };
    let t = bramble::provider::transcribe::Transcriber::from_config(&cfg).unwrap().unwrap();
    let err = t.transcribe("a.ogg", "audio/ogg", b"OggS fake").await.unwrap_err().to_string();
    assert_refused(&seen, KEY, &trap, &err);
}

#[tokio::test]
async fn telegram_token_in_the_path_does_not_follow_a_redirect() {
    let (mover, trap, seen) = moved().await;
    let token = "123456:TEST-redirect-token";
    let api = bramble::clients::telegram::Api::new(&mover.url(), Secret::new(token)).unwrap();
    let err = api.get_me().await.unwrap_err().to_string();
    assert_refused(&seen, token, &trap, &err);
    let err = api.download("photos/a.jpg", 1024).await.unwrap_err().to_string();
    assert_refused(&seen, token, &trap, &err);
}

#[tokio::test]
#[cfg(feature = "homeassistant")]
async fn home_assistant_token_does_not_follow_a_redirect() {
    let (mover, trap, seen) = moved().await;
    let rest = bramble::clients::ha_rest::HaRest::new(&mover.url(), Secret::new("ha-redirect-token-9"));
    let err = rest.request("/api/", None).await.unwrap_err().to_string();
    assert_refused(&seen, "ha-redirect-token-9", &trap, &err);
}

/// The web config for keyed search engines behind `mover` (loopback allowed: the servers live there).
#[cfg(feature = "web-search")]
fn search_config(engine: SearchEngine, mover: &TestServer) -> WebConfig {
    WebConfig {
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        timeout: Dur(Duration::from_secs(5)),
        search: vec![engine],
        brave_api_key_env: "BRAMBLE_TEST_BRAVE_KEY_7d2e".into(),
        tavily_api_key_env: "BRAMBLE_TEST_TAVILY_KEY_7d2e".into(),
        brave_url: Some(HttpUrl(format!("{}/res/v1/web/search", mover.url()))),
        tavily_url: Some(HttpUrl(format!("{}/search", mover.url()))),
        ..WebConfig::default()
    }
}

#[cfg(feature = "web-search")]
async fn search(cfg: &WebConfig) -> String {
    let http = Arc::new(bramble::tools::web::GuardedHttp::new(cfg));
    let tool = bramble::tools::search::WebSearch::new(cfg, http).unwrap();
    match tool.execute(json!({"query": "pi"}), &ToolContext::detached("t")).await {
        Ok(text) => text,
        Err(e) => e.0,
    }
}

#[tokio::test]
#[cfg(feature = "web-search")]
async fn search_keys_do_not_follow_a_redirect() {
    let keys = [
        ("BRAMBLE_TEST_BRAVE_KEY_7d2e", "brave-redirect-key-1"),
        ("BRAMBLE_TEST_TAVILY_KEY_7d2e", "tvly-redirect-key-2"),
    ];
    let test = concat!(module_path!(), "::search_keys_do_not_follow_a_redirect");
    if !crate::support::env::in_child(test, &keys, &[]) {
        return;
    }
    for (engine, key) in [(SearchEngine::Brave, keys[0].1), (SearchEngine::Tavily, keys[1].1)] {
        let (mover, trap, seen) = moved().await;
        let err = search(&search_config(engine, &mover)).await;
        assert_refused(&seen, key, &trap, &err);
    }
}

/// An MCP server behind the mover, with a secret custom header from the environment.
#[cfg(feature = "mcp")]
async fn mcp_status(mover: &TestServer, transport: &str) -> String {
    let toml = format!(
        "[[mcp.server]]\nname = \"moved\"\nurl = \"{}/mcp\"\ntransport = \"{transport}\"\ntimeout = \"5s\"\n\
         headers_env = {{ X-Api-Key = \"BRAMBLE_TEST_MCP_KEY_7d2e\" }}\n",
        mover.url()
    );
    let c = bramble::config::Config::parse(&toml, "/test/config.toml".as_ref()).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let hub = bramble::tools::mcp::McpHub::new(&c.mcp, &c.exec, ws.path(), Default::default()).expect("a server");
    let mut registry = bramble::tools::ToolRegistry::new(16_000);
    registry.register_source(hub.clone());
    registry.prepare().await;
    hub.status().join("\n")
}

#[tokio::test]
#[cfg(feature = "mcp")]
async fn mcp_headers_do_not_follow_a_redirect() {
    let key = "mcp-redirect-key-3";
    let test = concat!(module_path!(), "::mcp_headers_do_not_follow_a_redirect");
    if !crate::support::env::in_child(test, &[("BRAMBLE_TEST_MCP_KEY_7d2e", key)], &[]) {
        return;
    }
    bramble::install_crypto();
    for transport in ["streamable-http", "sse"] {
        let (mover, trap, seen) = moved().await;
        let status = mcp_status(&mover, transport).await;
        assert_refused(&seen, key, &trap, &status);
    }
}

// ---------------------------------------------------------------------------
// Echoes: a server (or a proxy before it) that quotes the request back.
// ---------------------------------------------------------------------------

/// Answers every request 401 with its head quoted back, as a debugging proxy does.
#[cfg(all(feature = "web-search", feature = "mcp"))]
async fn echo_server() -> TestServer {
    TestServer::start(|req: Request| {
        let head: Vec<String> = req.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        Response::text(401, format!("denied {} {}\n{}\n", req.method, req.path, head.join("\n")))
    })
    .await
}

#[tokio::test]
#[cfg(all(feature = "web-search", feature = "mcp"))]
async fn servers_quoting_the_request_back_do_not_reveal_the_secret() {
    let keys = [
        ("BRAMBLE_TEST_BRAVE_KEY_7d2e", "brave-echo-key-1"),
        ("BRAMBLE_TEST_TAVILY_KEY_7d2e", "tvly-echo-key-2"),
        ("BRAMBLE_TEST_MCP_KEY_7d2e", "mcp-echo-key-3"),
    ];
    let test = concat!(module_path!(), "::servers_quoting_the_request_back_do_not_reveal_the_secret");
    if !crate::support::env::in_child(test, &keys, &[]) {
        return;
    }
    bramble::install_crypto();
    let echo = echo_server().await;
    let said = |text: &str, secret: &str| {
        assert!(text.contains("denied"), "the server's words are kept: {text}");
        assert!(!text.contains(secret), "the secret came back: {text}");
    };
    // Keyed search engines.
    for (engine, key) in [(SearchEngine::Brave, keys[0].1), (SearchEngine::Tavily, keys[1].1)] {
        said(&search(&search_config(engine, &echo)).await, key);
    }
    // A provider's extra header (a proxy's key), and its own key.
    let mut cfg = provider_config(ProviderKind::Openai, &format!("{}/v1", echo.url()));
    cfg.extra_headers.insert("X-Proxy-Key".into(), "proxy-echo-5ecret".into());
    let p = bramble::provider::openai::OpenAiProvider::new(&cfg).unwrap();
    let err = chat(&p).await;
    said(&err, "proxy-echo-5ecret");
    said(&err, KEY);
    // An MCP server's secret header.
    said(&mcp_status(&echo, "streamable-http").await, keys[2].1);
}
