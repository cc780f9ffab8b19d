//! How bytes reach an MCP server: [`http`] (streamable HTTP, HTTP+SSE) and
//! [`stdio`] (a sandboxed child process); [`stream`] reads streamable
//! HTTP's event streams (resumption, the server's own GET stream).
//!
//! A transport sends a request and routes whatever comes back through its
//! [`Peer`](super::rpc::Peer); the caller waits on the request's receiver.
//! Nothing above this module knows which transport a server uses — except
//! [`Transport::kind`], for `status`.

pub mod http;
pub mod stdio;
pub mod stream;

use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::rpc::{McpError, Peer};
use crate::config::{ExecConfig, HttpKind, McpServer, McpTransport};

/// One connection to a server.
pub enum Transport {
    Streamable(http::Streamable),
    Sse(http::LegacySse),
    Stdio(stdio::Stdio),
}

/// What opening a transport needs besides the server's table.
pub struct Env<'a> {
    pub exec: &'a ExecConfig,
    pub workspace: &'a std::path::Path,
    /// Where stdio servers run (the composition root's sandbox).
    pub sandbox: &'a Arc<crate::sandbox::Sandbox>,
    pub client: &'a reqwest::Client,
    /// The server's OAuth (streamable HTTP only).
    pub auth: Option<&'a Arc<super::auth::Auth>>,
    /// Stops the transport's tasks and child (bramble is stopping).
    pub cancel: &'a CancellationToken,
}

impl Transport {
    pub fn peer(&self) -> &Arc<Peer> {
        match self {
            Transport::Streamable(t) => &t.peer,
            Transport::Sse(t) => &t.peer,
            Transport::Stdio(t) => &t.peer,
        }
    }

    /// `streamable HTTP`, `HTTP+SSE` or `stdio`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Streamable(_) => "streamable HTTP",
            Transport::Sse(_) => "HTTP+SSE",
            Transport::Stdio(_) => "stdio",
        }
    }

    /// Send request `id` (made by [`Peer::request`]); the answer reaches its receiver.
    pub async fn request(&self, id: i64, body: &Value) -> Result<(), McpError> {
        match self {
            Transport::Streamable(t) => t.request(id, body).await,
            Transport::Sse(t) => t.request(id, body).await,
            Transport::Stdio(t) => t.request(id, body).await,
        }
    }

    /// Send a notification.
    pub async fn send(&self, msg: &Value) -> Result<(), McpError> {
        match self {
            Transport::Streamable(t) => t.send(msg).await,
            Transport::Sse(t) => t.send(msg).await,
            Transport::Stdio(t) => t.send(msg).await,
        }
    }

    /// The first transport to try for `server`. A `url` server with
    /// `transport = "auto"` starts with streamable HTTP; [`Transport::fallback`]
    /// gives the HTTP+SSE one when `initialize` is refused with a 4xx.
    pub async fn open(server: &McpServer, env: &Env<'_>) -> Result<Transport, McpError> {
        match &server.transport {
            McpTransport::Http { url, kind, headers, headers_env } => {
                let url = reqwest::Url::parse(url.as_str()).map_err(|e| McpError::Connection(e.to_string()))?;
                let headers = http::build_headers(headers, headers_env)?;
                match kind {
                    HttpKind::Auto | HttpKind::StreamableHttp => {
                        let auth = env.auth.cloned();
                        Ok(Transport::Streamable(http::Streamable::new(
                            env.client.clone(),
                            url,
                            headers,
                            auth,
                            env.cancel,
                        )))
                    }
                    HttpKind::Sse => {
                        Ok(Transport::Sse(http::LegacySse::open(env.client.clone(), url, headers, env.cancel).await?))
                    }
                }
            }
            McpTransport::Stdio(s) => {
                Ok(Transport::Stdio(stdio::Stdio::open(s, env.exec, env.workspace, env.sandbox, env.cancel)?))
            }
        }
    }

    /// The HTTP+SSE transport for a server whose streamable HTTP `initialize`
    /// failed with `err`, if the spec's fallback applies (`transport = "auto"`, a 4xx).
    pub async fn fallback(server: &McpServer, env: &Env<'_>, err: &McpError) -> Option<Result<Transport, McpError>> {
        let McpTransport::Http { url, kind: HttpKind::Auto, headers, headers_env } = &server.transport else {
            return None;
        };
        let McpError::Protocol(text) = err else { return None };
        let status: u16 = text.strip_prefix("HTTP ")?.get(..3)?.parse().ok()?;
        // 4xx but not an authentication failure: the server does not do streamable HTTP here.
        if !(400..500).contains(&status) || status == 401 || status == 403 {
            return None;
        }
        let url = match reqwest::Url::parse(url.as_str()) {
            Ok(u) => u,
            Err(e) => return Some(Err(McpError::Connection(e.to_string()))),
        };
        let headers = match http::build_headers(headers, headers_env) {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        Some(http::LegacySse::open(env.client.clone(), url, headers, env.cancel).await.map(Transport::Sse))
    }

    /// The streamable HTTP transport's session handling around `initialize`.
    pub fn before_initialize(&self) {
        if let Transport::Streamable(t) = self {
            t.reset_session();
        }
    }

    pub fn after_initialize(&self, protocol: &str) {
        if let Transport::Streamable(t) = self {
            t.set_protocol(protocol);
        }
    }

    /// The session is ready: open the server's own event stream (streamable HTTP).
    pub fn after_initialized(&self) {
        if let Transport::Streamable(t) = self {
            t.listen();
        }
    }
}
