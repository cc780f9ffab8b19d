//! MCP client: the tools of Model Context Protocol servers, offered to the model.
//!
//! `[[mcp.server]]` names servers reached over HTTP (Home Assistant's
//! `/api/mcp`, any streamable HTTP or HTTP+SSE server) or started as child
//! processes speaking stdio (through the exec sandbox). Each server's tools
//! become tools named `<server>__<tool>`, with their JSON schemas cleaned
//! for the providers ([`schema`]).
//!
//! **Our own client, not the official `rmcp` crate** (re-decided for issue 45
//! with the GET stream, resumption and OAuth on the table). Measured in a
//! scratch crate with bramble's tokio/reqwest/rustls: `rmcp` 3.11 with
//! `client`, `transport-streamable-http-client-reqwest`,
//! `reqwest-tls-no-provider`, `transport-child-process` and `auth` brings 31
//! crates bramble does not have (chrono, futures, oauth2, rand 0.8, two
//! sha2/digest generations, process-wrap, indexmap, …) and 1.38 MB to a
//! release x86-64 binary (a minimal client: 2,124,672 → 3,506,360 B; bramble
//! is 6.35 MB, so about +22 %). It has no HTTP+SSE (2024-11-05) client, which
//! older servers need, so that transport would stay ours anyway, as would the
//! sandboxing of stdio servers and the caps on what is read. Ours — the
//! transports, the session and JSON-RPC, ~1,850 lines without tests — adds
//! no crate and passes every client scenario of the conformance suite but
//! elicitation (refused by design; `tests/it/mcp_conformance.rs`). OAuth is where `rmcp`
//! (through `oauth2`) would have saved code; done here ([`auth`]) it is
//! about 1,400 lines over reqwest (discovery, registration, PKCE with ring's
//! SHA-256, already in the tree; refresh; the loopback callback), which does
//! not outweigh the rest. Decision: keep our own.
//!
//! - [`auth`]: OAuth 2.1 for servers that ask for it (`bramble mcp login`).
//! - [`rpc`]: JSON-RPC messages and the [`rpc::Peer`] that routes answers.
//! - [`sse`]: the server-sent events parser (bounded).
//! - [`transport`]: streamable HTTP with the HTTP+SSE fallback, and stdio.
//! - [`client`]: the session — handshake, `tools/list`, `tools/call`, cancellation.
//! - [`server`]: one server's supervisor: connect, list, reconnect with backoff.
//! - [`content`]: a call's result as text.
//!
//! The [`McpHub`] is the registry's [`ToolSource`]: its tools are those of the
//! servers as they are now. A server that is down keeps its last-listed
//! tools, marked unavailable in their descriptions, and a call gets
//! `MCP server "x" is not reachable: …`; a server never reached is one
//! placeholder tool `<server>__unavailable` saying why. Nothing connects
//! while the parts are built: the daemon starts the servers at its start
//! ([`ToolRegistry::run_sources`](super::ToolRegistry::run_sources)), a
//! one-off turn at its first need ([`ToolSource::prepare`]).
//!
//! **Origins:** an MCP tool can do whatever its server can (switch the
//! lights, write files), so it is treated like `exec`: turns from untrusted
//! origins (MQTT, unknown channels) are refused unless the server sets
//! `allow_untrusted = true`.

pub mod auth;
pub mod client;
pub mod content;
pub mod rpc;
pub mod schema;
pub mod server;
pub mod sse;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BoxFuture, Tool, ToolContext, ToolError, ToolSource};
use crate::config::{ExecConfig, McpConfig};
use server::{Phase, RemoteTool, Server, Shared};

/// Where OAuth grants are kept and who shows a login's URL ([`auth`]).
#[derive(Clone, Default)]
pub struct AuthEnv {
    /// The state directory (grants in `mcp-oauth/<name>.json`); `None`: in memory only.
    pub state_dir: Option<std::path::PathBuf>,
    /// Who shows (or visits) an authorization URL; `None` (the daemon): a login is asked of the owner.
    pub agent: Option<Arc<dyn auth::UserAgent>>,
}

/// Longest wait of a turn for servers still making their first connection.
const PREPARE_LIMIT: Duration = Duration::from_secs(15);

/// The configured MCP servers.
pub struct McpHub {
    servers: Vec<Arc<Server>>,
    cancel: CancellationToken,
}

impl Drop for McpHub {
    fn drop(&mut self) {
        // Supervisors and stdio children stop with the last registry holding the hub.
        self.cancel.cancel();
    }
}

impl McpHub {
    /// The servers of `[[mcp.server]]`, none started; `None` when there are none.
    /// Stdio servers run in `sandbox`. OAuth grants live in memory only ([`McpHub::with_auth`] keeps them).
    pub fn new(
        cfg: &McpConfig,
        exec: &ExecConfig,
        workspace: &std::path::Path,
        sandbox: Arc<crate::sandbox::Sandbox>,
    ) -> Option<Arc<McpHub>> {
        McpHub::with_auth(cfg, exec, workspace, sandbox, AuthEnv::default())
    }

    /// [`McpHub::new`], with OAuth grants kept under `auth.state_dir` and logins shown by `auth.agent`.
    pub fn with_auth(
        cfg: &McpConfig,
        exec: &ExecConfig,
        workspace: &std::path::Path,
        sandbox: Arc<crate::sandbox::Sandbox>,
        auth: AuthEnv,
    ) -> Option<Arc<McpHub>> {
        if cfg.server.is_empty() {
            return None;
        }
        let cancel = CancellationToken::new();
        let shared = Arc::new(Shared {
            exec: exec.clone(),
            workspace: workspace.to_path_buf(),
            sandbox,
            client: std::sync::OnceLock::new(),
            auth,
        });
        let servers =
            cfg.server.iter().map(|s| Server::new(s.clone(), Arc::clone(&shared), cancel.child_token())).collect();
        Some(Arc::new(McpHub { servers, cancel }))
    }

    /// One line per server: state, transport, tool count.
    pub fn status(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.status_line()).collect()
    }

    fn server_of(&self, name: &str) -> Option<&Arc<Server>> {
        self.servers.iter().find(|s| name.strip_prefix(s.name()).is_some_and(|rest| rest.starts_with("__")))
    }
}

impl ToolSource for McpHub {
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for server in &self.servers {
            let state = server.state();
            let down = match &state.phase {
                Phase::Connected | Phase::Connecting => None,
                Phase::Down(why) => Some(why.clone()),
                Phase::Idle => Some("not connected yet".to_string()),
            };
            if state.tools.is_empty() && state.phase != Phase::Connected {
                out.push(Arc::new(Placeholder::new(Arc::clone(server), down.as_deref())));
                continue;
            }
            for tool in state.tools.iter() {
                out.push(Arc::new(McpTool::new(Arc::clone(server), tool, down.as_deref())));
            }
        }
        out
    }

    fn prepare(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for server in &self.servers {
                server.start();
            }
            let deadline = Instant::now() + PREPARE_LIMIT;
            for server in &self.servers {
                server.settled(deadline.min(Instant::now() + server.cfg.timeout.get())).await;
            }
        })
    }

    fn missing(&self, name: &str) -> Option<String> {
        let server = self.server_of(name)?;
        let state = server.state();
        Some(match state.phase {
            Phase::Down(why) => server.unreachable(&why).0,
            _ if state.tools.is_empty() => format!("MCP server \"{}\" offers no tools (yet)", server.name()),
            _ => format!(
                "MCP server \"{}\" has no tool `{name}`; its tools are: {}",
                server.name(),
                state.tools.iter().map(|t| t.exposed.as_str()).collect::<Vec<_>>().join(", ")
            ),
        })
    }

    fn start(&self) {
        for server in &self.servers {
            server.start();
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.cancel.cancel();
            for server in &self.servers {
                server.stopped(Duration::from_secs(5)).await;
            }
        })
    }

    fn status(&self) -> Vec<String> {
        McpHub::status(self)
    }
}

/// The origin rule: untrusted turns only where the server allows them.
fn check_origin(server: &Server, ctx: &ToolContext) -> Result<(), ToolError> {
    if ctx.origin.trusted() || server.cfg.allow_untrusted {
        return Ok(());
    }
    Err(ToolError::new(format!(
        "this turn came from {} (an untrusted origin): the tools of MCP server \"{}\" can act on anything its \
         server can, so they are refused (the owner may set allow_untrusted = true in its [[mcp.server]])",
        ctx.origin.name(),
        server.name()
    )))
}

/// One tool of a server, as offered in this turn.
struct McpTool {
    server: Arc<Server>,
    exposed: String,
    remote: String,
    description: String,
    schema: Value,
}

impl McpTool {
    fn new(server: Arc<Server>, tool: &RemoteTool, down: Option<&str>) -> McpTool {
        let description = match down {
            Some(why) => {
                format!("[UNAVAILABLE: MCP server \"{}\" is not reachable: {why}] {}", server.name(), tool.description)
            }
            None => tool.description.clone(),
        };
        McpTool {
            server,
            exposed: tool.exposed.clone(),
            remote: tool.remote.clone(),
            description,
            schema: tool.schema.clone(),
        }
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.exposed
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.schema.clone()
    }

    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { self.execute_rich(args, ctx).await.map(|out| out.text) })
    }

    fn execute_rich<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<super::ToolOutput, ToolError>> {
        Box::pin(async move {
            check_origin(&self.server, ctx)?;
            self.server.call(&self.remote, args, &ctx.cancel).await
        })
    }
}

/// What the model sees of a server whose tools were never listed: one tool that says why.
struct Placeholder {
    server: Arc<Server>,
    name: String,
    description: String,
}

impl Placeholder {
    fn new(server: Arc<Server>, down: Option<&str>) -> Placeholder {
        let name = format!("{}__unavailable", server.name());
        let description = match down {
            Some(why) => format!(
                "MCP server \"{}\" is configured but not reachable ({why}): its tools are unavailable. Calling this \
                 tries it again and says why.",
                server.name()
            ),
            None => format!(
                "MCP server \"{}\" is still connecting: its tools are not listed yet. Calling this waits for it.",
                server.name()
            ),
        };
        Placeholder { server, name, description }
    }
}

impl Tool for Placeholder {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        serde_json::json!({"type": "object", "properties": {}})
    }

    fn execute<'a>(&'a self, _args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            check_origin(&self.server, ctx)?;
            let deadline = Instant::now() + self.server.cfg.timeout.get().min(PREPARE_LIMIT);
            match self.server.connection(deadline).await {
                Ok(_) => Ok(format!(
                    "MCP server \"{}\" is reachable now, with {} tools; they are offered from the next message on.",
                    self.server.name(),
                    self.server.state().tools.len()
                )),
                Err(why) => Err(self.server.unreachable(&why)),
            }
        })
    }
}
