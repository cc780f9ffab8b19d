//! One MCP session over a [`Transport`]: the handshake and the three requests
//! bramble makes.
//!
//! `initialize` (protocol 2025-11-25; a server answering with an older
//! revision we speak is spoken to in it, one we do not know is refused; no
//! client capabilities, clientInfo `bramble`) → `notifications/initialized`
//! (then a streamable HTTP server's GET event stream is opened, where it
//! offers one) → `tools/list` (following
//! `nextCursor`, bounded) → `tools/call`. Every request has a deadline; a
//! request that passes it, or whose turn is stopped, is forgotten and the
//! server is sent `notifications/cancelled` for it. A streamable HTTP session
//! the server has forgotten (404) is initialized again, once, and the
//! request repeated.

use std::sync::Mutex;

use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rpc::{self, McpError, Peer};
use super::transport::{Env, Transport};
use crate::config::McpServer;

/// Pages of `tools/list` followed at most.
const MAX_PAGES: usize = 20;
/// Tools of one server kept at most (each costs prompt tokens in every turn).
pub const MAX_TOOLS: usize = 128;
/// Longest wait for `notifications/cancelled` to be sent.
const CANCEL_SEND: std::time::Duration = std::time::Duration::from_secs(2);

/// An initialized session.
pub struct Connection {
    transport: Transport,
    timeout_secs: u64,
    /// `name version` from the server's `initialize` answer.
    server_info: Mutex<String>,
}

impl Connection {
    /// Connect and initialize, within the server's `timeout`. A `url` server
    /// whose streamable HTTP `initialize` gets a 4xx is tried with HTTP+SSE.
    pub async fn open(server: &McpServer, env: &Env<'_>) -> Result<Connection, McpError> {
        let timeout = server.timeout.get();
        let deadline = Instant::now() + timeout;
        let secs = timeout.as_secs().max(1);
        let transport = tokio::time::timeout_at(deadline, Transport::open(server, env))
            .await
            .map_err(|_| McpError::Timeout(secs))??;
        let conn = Connection { transport, timeout_secs: secs, server_info: Mutex::new(String::new()) };
        let err = match conn.handshake(deadline).await {
            Ok(()) => return Ok(conn),
            Err(e) => e,
        };
        match tokio::time::timeout_at(deadline, Transport::fallback(server, env, &err)).await {
            Err(_) => Err(McpError::Timeout(secs)),
            Ok(None) => Err(err),
            Ok(Some(Err(sse))) => Err(McpError::Connection(format!("streamable HTTP: {err}; HTTP+SSE: {sse}"))),
            Ok(Some(Ok(transport))) => {
                let conn = Connection { transport, timeout_secs: secs, server_info: Mutex::new(String::new()) };
                conn.handshake(deadline).await?;
                Ok(conn)
            }
        }
    }

    pub fn peer(&self) -> &Peer {
        self.transport.peer()
    }

    /// The transport's name, for `status`.
    pub fn kind(&self) -> &'static str {
        self.transport.kind()
    }

    /// The server's name and version, as it gave them.
    pub fn server_info(&self) -> String {
        self.server_info.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fired when the connection is gone (the process exited, the stream ended).
    pub fn closed(&self) -> &CancellationToken {
        &self.transport.peer().closed
    }

    async fn handshake(&self, deadline: Instant) -> Result<(), McpError> {
        self.transport.before_initialize();
        let result = self.once("initialize", rpc::initialize_params(), deadline, None).await?;
        let version = result.get("protocolVersion").and_then(Value::as_str).unwrap_or(rpc::PROTOCOL_VERSION);
        if !rpc::SUPPORTED_VERSIONS.contains(&version) {
            return Err(McpError::Protocol(format!(
                "the server speaks MCP revision {:?}, which bramble does not know (it speaks {})",
                version.chars().take(40).collect::<String>(),
                rpc::SUPPORTED_VERSIONS.join(", ")
            )));
        }
        self.transport.after_initialize(version);
        let info = result.get("serverInfo");
        let text = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_str).unwrap_or("").trim().to_string();
        let label = format!("{} {}", text("name"), text("version")).trim().chars().take(80).collect();
        *self.server_info.lock().unwrap_or_else(|p| p.into_inner()) = label;
        tracing::debug!(protocol = version, "mcp: initialized");
        let note = rpc::notification("notifications/initialized", None);
        tokio::time::timeout_at(deadline, self.transport.send(&note))
            .await
            .map_err(|_| McpError::Timeout(self.timeout_secs))??;
        self.transport.after_initialized();
        Ok(())
    }

    /// One request; a forgotten session is initialized again and the request repeated once.
    async fn request(
        &self,
        method: &str,
        params: Value,
        deadline: Instant,
        cancel: Option<&CancellationToken>,
    ) -> Result<Value, McpError> {
        match self.once(method, params.clone(), deadline, cancel).await {
            Err(McpError::SessionExpired) => {
                tracing::info!("mcp: the server ended the session; initializing again");
                self.handshake(deadline).await?;
                self.once(method, params, deadline, cancel).await
            }
            other => other,
        }
    }

    async fn once(
        &self,
        method: &str,
        params: Value,
        deadline: Instant,
        cancel: Option<&CancellationToken>,
    ) -> Result<Value, McpError> {
        let peer = self.transport.peer();
        let (id, body, rx) = peer.request(method, params);
        let exchange = async {
            self.transport.request(id, &body).await?;
            rx.await.unwrap_or_else(|_| Err(McpError::Connection("the connection was dropped".into())))
        };
        let never = CancellationToken::new();
        let cancel = cancel.unwrap_or(&never);
        let (err, reason) = tokio::select! {
            r = tokio::time::timeout_at(deadline, exchange) => match r {
                Ok(outcome) => return outcome,
                Err(_) => (McpError::Timeout(self.timeout_secs), "timed out"),
            },
            () = cancel.cancelled() => (McpError::Cancelled, "the user stopped the turn"),
        };
        peer.forget(id);
        let note = rpc::notification("notifications/cancelled", Some(json!({"requestId": id, "reason": reason})));
        if let Err(e) = tokio::time::timeout(CANCEL_SEND, self.transport.send(&note)).await.unwrap_or(Ok(())) {
            tracing::debug!("mcp: could not send notifications/cancelled: {e}");
        }
        Err(err)
    }

    /// Every tool the server lists (raw `Tool` objects), following pagination.
    pub async fn list_tools(&self, deadline: Instant) -> Result<Vec<Value>, McpError> {
        let mut tools: Vec<Value> = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let result = self.request("tools/list", params, deadline, None).await?;
            match result.get("tools") {
                Some(Value::Array(page)) => tools.extend(page.iter().cloned()),
                _ => return Err(McpError::Protocol("the answer to tools/list has no `tools` list".into())),
            }
            if tools.len() >= MAX_TOOLS {
                tracing::warn!("mcp: the server lists more than {MAX_TOOLS} tools; the rest are left out");
                tools.truncate(MAX_TOOLS);
                return Ok(tools);
            }
            match result.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() && cursor.as_deref() != Some(next) => cursor = Some(next.to_string()),
                _ => return Ok(tools),
            }
        }
        tracing::warn!("mcp: tools/list has more than {MAX_PAGES} pages; the rest are left out");
        Ok(tools)
    }

    /// Call a tool; the raw `CallToolResult`.
    pub async fn call(
        &self,
        name: &str,
        arguments: Value,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Value, McpError> {
        self.request("tools/call", json!({"name": name, "arguments": arguments}), deadline, Some(cancel)).await
    }
}
