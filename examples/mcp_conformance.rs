//! The client adapter for the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, client mode; run by
//! `tests/it/mcp_conformance.rs`).
//!
//! The suite starts a test server per scenario and runs this program with the
//! server's URL as its last argument (and the scenario's name in
//! `MCP_CONFORMANCE_SCENARIO`). It does what the daemon does with a
//! `[[mcp.server]]` — the same hub, registry and transport code, nothing
//! written for the suite: connect over streamable HTTP, list the tools, then
//! call each tool once with arguments made from its schema (what a model
//! would do), printing the results. Exit status 1 when the server could not
//! be used.
//!
//! Auth scenarios: the server answers 401 and the suite's authorization
//! server approves every request at once. The adapter is the person at the
//! browser ([`Headless`]): it GETs the authorization URL and follows its
//! redirect to bramble's loopback callback, as a browser would. What the
//! suite hands over in `MCP_CONFORMANCE_CONTEXT` (a pre-registered client)
//! becomes the server's `client_id` / `client_secret_env` / `client_key_env`, as an owner would
//! configure it; `auth/client-credentials-*` sets `grant_type`, and
//! `auth/basic-cimd` a `client_metadata_url`.

use std::sync::Arc;

use bramble::config::Config;
use bramble::provider::ToolCall;
use bramble::tools::mcp::auth::UserAgent;
use bramble::tools::mcp::{AuthEnv, McpHub};
use bramble::tools::{ToolContext, ToolRegistry};
use serde_json::{json, Map, Value};

/// A value of the schema's type (the first of a union; the default or first enum value where given).
fn sample(schema: &Value) -> Value {
    if let Some(v) = schema.get("default").or_else(|| schema.get("enum").and_then(|e| e.get(0))) {
        return v.clone();
    }
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str).unwrap_or("string"),
        Some(Value::String(k)) => k.as_str(),
        _ => "string",
    };
    match kind {
        "integer" | "number" => json!(1),
        "boolean" => json!(true),
        "array" => json!([]),
        "object" => arguments(schema),
        "null" => Value::Null,
        _ => json!("conformance"),
    }
}

/// Arguments for a tool: every property of its schema.
fn arguments(schema: &Value) -> Value {
    let mut args = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            args.insert(name.clone(), sample(prop));
        }
    }
    Value::Object(args)
}

/// The browser of an auth scenario: visits the URL and follows the one redirect to the callback.
struct Headless(reqwest::Client);

impl UserAgent for Headless {
    fn visit<'a>(&'a self, url: &'a reqwest::Url) -> bramble::util::BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let answer = self.0.get(url.clone()).send().await;
            let location = answer.ok().and_then(|r| {
                r.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).map(str::to_string)
            });
            match location {
                Some(to) => {
                    if let Err(e) = self.0.get(to).send().await {
                        eprintln!("the callback failed: {e}");
                    }
                }
                None => eprintln!("the authorization server did not redirect"),
            }
            None
        })
    }
}

/// The `[[mcp.server]]` keys an owner would set for this scenario (OAuth).
fn oauth_keys(scenario: &str) -> anyhow::Result<String> {
    let context: Value = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
        Ok(text) => serde_json::from_str(&text)?,
        Err(_) => Value::Null,
    };
    let mut keys = String::new();
    if let Some(id) = context.get("client_id").and_then(Value::as_str) {
        keys.push_str(&format!("client_id = {id:?}\n"));
    }
    if let Some(secret) = context.get("client_secret").and_then(Value::as_str) {
        // Set before any task runs (one thread): the adapter reads it as the daemon reads credentials.
        std::env::set_var("CONFORMANCE_CLIENT_SECRET", secret);
        keys.push_str("client_secret_env = \"CONFORMANCE_CLIENT_SECRET\"\n");
    }
    if let Some(pem) = context.get("private_key_pem").and_then(Value::as_str) {
        std::env::set_var("CONFORMANCE_CLIENT_KEY", pem);
        keys.push_str("client_key_env = \"CONFORMANCE_CLIENT_KEY\"\n");
    }
    if scenario.starts_with("auth/client-credentials") {
        keys.push_str("grant_type = \"client_credentials\"\n");
    }
    if scenario == "auth/basic-cimd" {
        keys.push_str("client_metadata_url = \"https://conformance-test.local/client-metadata.json\"\n");
    }
    Ok(keys)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .next_back()
        .filter(|a| a.starts_with("http"))
        .ok_or_else(|| anyhow::anyhow!("usage: mcp_conformance <server URL> (run by the MCP conformance suite)"))?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?}, server {url}");
    bramble::install_crypto();
    let toml = format!(
        "[[mcp.server]]\nname = \"c\"\nurl = {:?}\ntransport = \"streamable-http\"\ntimeout = \"20s\"\n{}",
        url,
        oauth_keys(&scenario)?
    );
    let config = Config::parse(&toml, std::path::Path::new("conformance.toml"))?;
    let workspace = tempfile::tempdir()?;
    let sandbox = Arc::new(bramble::sandbox::Sandbox::new());
    let state = tempfile::tempdir()?;
    let browser = Headless(bramble::provider::http_client(std::time::Duration::from_secs(10))?);
    let auth = AuthEnv { state_dir: Some(state.path().to_path_buf()), agent: Some(Arc::new(browser)) };
    let hub = McpHub::with_auth(&config.mcp, &config.exec, workspace.path(), sandbox, auth)
        .ok_or_else(|| anyhow::anyhow!("no server configured"))?;
    let mut registry = ToolRegistry::new(16_000);
    registry.register_source(hub.clone());
    registry.prepare().await;
    println!("{}", hub.status().join("\n"));
    let specs: Vec<_> = registry.specs().into_iter().filter(|s| s.name.starts_with("c__")).collect();
    if specs.iter().any(|s| s.name == "c__unavailable") {
        anyhow::bail!("the server could not be used: {}", hub.status().join("; "));
    }
    let ctx = ToolContext::detached("conformance").from_chat("cli", "conformance");
    for spec in specs {
        let args = arguments(&spec.parameters);
        let out = registry.execute(&ToolCall::new("c1", &spec.name, args.to_string()), &ctx).await;
        println!("{} {args} -> {}{}", spec.name, if out.is_error { "error: " } else { "" }, out.text);
    }
    bramble::tools::ToolSource::shutdown(hub.as_ref()).await;
    Ok(())
}
