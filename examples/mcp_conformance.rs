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

use std::sync::Arc;

use bramble::config::Config;
use bramble::provider::ToolCall;
use bramble::tools::mcp::McpHub;
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .next_back()
        .filter(|a| a.starts_with("http"))
        .ok_or_else(|| anyhow::anyhow!("usage: mcp_conformance <server URL> (run by the MCP conformance suite)"))?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?}, server {url}");
    bramble::install_crypto();
    let toml =
        format!("[[mcp.server]]\nname = \"c\"\nurl = {:?}\ntransport = \"streamable-http\"\ntimeout = \"20s\"\n", url);
    let config = Config::parse(&toml, std::path::Path::new("conformance.toml"))?;
    let workspace = tempfile::tempdir()?;
    let sandbox = Arc::new(bramble::sandbox::Sandbox::new());
    let hub = McpHub::new(&config.mcp, &config.exec, workspace.path(), sandbox)
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
