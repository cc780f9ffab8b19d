//! One configured server over time: connecting, connected, down — and back.
//!
//! A supervisor task per server owns the connection: it connects (for a
//! stdio server: starts the process), lists the tools, then waits until the
//! connection is gone (the process died, the stream ended, a call found the
//! HTTP server unreachable) or the server says its tools changed (listed
//! again). After a failure it waits 1 s, doubling to 60 s (reset by a
//! connection that lasted 10 s) before the next attempt; a call that finds
//! the server down cuts that wait short once, so a server that came back is
//! used at once. The state is published on a `watch` channel: calls wait on
//! it (bounded by their deadline), `status` reads it. The tools last listed
//! are kept while the server is down, so the model still sees them — marked
//! unavailable — instead of losing them silently.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::client::Connection;
use super::content;
use super::schema;
use super::transport::Env;
use crate::config::{ExecConfig, McpServer};
use crate::tools::ToolError;
use crate::util::timer::Backoff;

/// Longest wait between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A connection that lasted this long resets the backoff.
const STABLE: Duration = Duration::from_secs(10);
/// Characters of a tool's description kept.
const MAX_DESCRIPTION: usize = 1000;

/// Where a server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Not started yet (nothing asked for it).
    Idle,
    Connecting,
    Connected,
    /// The last attempt failed, or the connection was lost: why.
    Down(String),
}

/// A tool as the model sees it, and the server's name for it.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    pub exposed: String,
    pub remote: String,
    pub description: String,
    pub schema: Value,
}

/// A server's published state.
#[derive(Clone)]
pub struct State {
    pub phase: Phase,
    pub conn: Option<Arc<Connection>>,
    /// The tools last listed (kept while down).
    pub tools: Arc<Vec<RemoteTool>>,
    /// Tools left out and why (a name too long, not in the allow-list…).
    pub left_out: Arc<Vec<String>>,
    /// The first connection attempt is over.
    pub settled: bool,
}

/// What every server shares: how to open transports.
pub struct Shared {
    pub exec: ExecConfig,
    pub workspace: std::path::PathBuf,
    pub sandbox: Arc<crate::sandbox::Sandbox>,
    /// The HTTP client, made at the first HTTP connection.
    pub client: std::sync::OnceLock<reqwest::Client>,
    /// Where OAuth grants are kept (`None`: in memory only) and who shows a login URL.
    pub auth: super::AuthEnv,
}

impl Shared {
    fn client(&self) -> Result<&reqwest::Client, String> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        // No overall timeout: the HTTP+SSE stream lives long; calls have their own deadlines.
        let c = crate::provider::http_client(Duration::ZERO).map_err(|e| e.to_string())?;
        Ok(self.client.get_or_init(|| c))
    }
}

/// The OAuth of `cfg`, if it may need one: streamable HTTP (or `auto`)
/// without an `Authorization` header of its own.
fn auth_for(cfg: &McpServer, env: &super::AuthEnv) -> Option<Auth> {
    let crate::config::McpTransport::Http { url, kind, headers, headers_env } = &cfg.transport else { return None };
    if *kind == crate::config::HttpKind::Sse
        || super::auth::has_own_authorization(headers.keys().chain(headers_env.keys()))
    {
        return None;
    }
    let url = reqwest::Url::parse(url.as_str()).ok()?;
    let file = env.state_dir.as_deref().map(|d| super::auth::store::path(d, &cfg.name));
    Some(Auth::new(&cfg.name, url, cfg.oauth.clone(), file, cfg.timeout.get(), env.agent.clone()))
}

/// One configured server.
pub struct Server {
    pub cfg: McpServer,
    /// OAuth for a streamable HTTP server without its own `Authorization` header.
    pub auth: Option<Arc<Auth>>,
    shared: Arc<Shared>,
    state: watch::Sender<State>,
    kick: Notify,
    cancel: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Server {
    pub fn new(cfg: McpServer, shared: Arc<Shared>, cancel: CancellationToken) -> Arc<Server> {
        let state = State {
            phase: Phase::Idle,
            conn: None,
            tools: Arc::new(Vec::new()),
            left_out: Arc::new(Vec::new()),
            settled: false,
        };
        let auth = auth_for(&cfg, &shared.auth).map(Arc::new);
        Arc::new(Server {
            cfg,
            auth,
            shared,
            state: watch::Sender::new(state),
            kick: Notify::new(),
            cancel,
            task: Mutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// Start the supervisor (once; no-op when stopping).
    pub fn start(self: &Arc<Self>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_some() || self.cancel.is_cancelled() {
            return;
        }
        self.state.send_modify(|s| s.phase = Phase::Connecting);
        *task = Some(tokio::spawn(Arc::clone(self).supervise()));
    }

    /// Wait for the supervisor to end (after the cancellation token fired), at most `limit`.
    pub async fn stopped(&self, limit: Duration) {
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(limit, task).await;
        }
    }

    /// Wait until the first attempt is over, at most until `deadline`.
    pub async fn settled(&self, deadline: Instant) {
        let mut rx = self.state.subscribe();
        let _ = tokio::time::timeout_at(deadline, rx.wait_for(|s| s.settled)).await;
    }

    fn publish(&self, f: impl FnOnce(&mut State)) {
        self.state.send_modify(f);
    }

    async fn supervise(self: Arc<Self>) {
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let name = self.cfg.name.clone();
        loop {
            self.publish(|s| s.phase = Phase::Connecting);
            let attempt = tokio::select! {
                r = self.connect() => r,
                () = self.cancel.cancelled() => return,
            };
            match attempt {
                Ok((conn, tools, left_out)) => {
                    let names: Vec<&str> = tools.iter().map(|t| t.exposed.as_str()).collect();
                    tracing::info!(
                        server = %name,
                        "mcp: {name} connected ({}{}): {} tools: {}",
                        conn.kind(),
                        match conn.server_info() { i if i.is_empty() => String::new(), i => format!(", {i}") },
                        tools.len(),
                        names.join(", ")
                    );
                    for why in &left_out {
                        tracing::warn!(server = %name, "mcp: {name}: tool left out: {why}");
                    }
                    let since = Instant::now();
                    self.publish(|s| {
                        s.phase = Phase::Connected;
                        s.conn = Some(conn.clone());
                        s.tools = Arc::new(tools);
                        s.left_out = Arc::new(left_out);
                        s.settled = true;
                    });
                    self.serve(&conn).await;
                    if self.cancel.is_cancelled() {
                        // The transport stops with the same token: wait (briefly) until its process is gone.
                        let _ = tokio::time::timeout(Duration::from_secs(3), conn.closed().cancelled()).await;
                        return;
                    }
                    let why = conn.peer().closed_why().unwrap_or_else(|| "the connection was closed".into());
                    tracing::warn!(server = %name, "mcp: {name} lost: {why}");
                    if since.elapsed() >= STABLE {
                        backoff.reset();
                    }
                    self.publish(|s| {
                        s.phase = Phase::Down(why);
                        s.conn = None;
                    });
                }
                Err(why) => {
                    let first = !self.state.borrow().settled;
                    let changed = self.state.borrow().phase != Phase::Down(why.clone());
                    if first || changed {
                        tracing::warn!(server = %name, "mcp: {name} is not reachable: {why}");
                    }
                    self.publish(|s| {
                        s.phase = Phase::Down(why);
                        s.conn = None;
                        s.settled = true;
                    });
                }
            }
            let wait = backoff.next_wait();
            tokio::select! {
                () = crate::util::timer::sleep(wait) => {}
                () = self.kick.notified() => {}
                () = self.cancel.cancelled() => return,
            }
        }
    }

    /// While connected: re-list on `list_changed`, return when the connection is gone or bramble stops.
    async fn serve(&self, conn: &Arc<Connection>) {
        loop {
            tokio::select! {
                () = conn.closed().cancelled() => return,
                () = self.cancel.cancelled() => return,
                () = conn.peer().list_changed.notified() => {
                    let deadline = Instant::now() + self.cfg.timeout.get();
                    match conn.list_tools(deadline).await {
                        Ok(raw) => {
                            let (tools, left_out) = self.expose(&raw);
                            tracing::info!(server = %self.cfg.name, "mcp: {} changed its tools: now {}", self.cfg.name, tools.len());
                            self.publish(|s| {
                                s.tools = Arc::new(tools);
                                s.left_out = Arc::new(left_out);
                            });
                        }
                        Err(e) => tracing::warn!(server = %self.cfg.name, "mcp: {}: listing the changed tools failed: {e}", self.cfg.name),
                    }
                }
            }
        }
    }

    async fn connect(&self) -> Result<(Arc<Connection>, Vec<RemoteTool>, Vec<String>), String> {
        let client = self.shared.client()?;
        let env = Env {
            exec: &self.shared.exec,
            workspace: &self.shared.workspace,
            sandbox: &self.shared.sandbox,
            client,
            auth: self.auth.as_ref(),
            cancel: &self.cancel,
        };
        let conn = Connection::open(&self.cfg, &env).await.map_err(|e| e.to_string())?;
        let deadline = Instant::now() + self.cfg.timeout.get();
        let raw = conn.list_tools(deadline).await.map_err(|e| format!("tools/list: {e}"))?;
        let (tools, left_out) = self.expose(&raw);
        Ok((Arc::new(conn), tools, left_out))
    }

    /// The server's tools as the model will see them: allow-listed, named, cleaned.
    fn expose(&self, raw: &[Value]) -> (Vec<RemoteTool>, Vec<String>) {
        let mut tools: Vec<RemoteTool> = Vec::new();
        let mut left_out = Vec::new();
        for t in raw {
            let Some(remote) = t.get("name").and_then(Value::as_str) else {
                left_out.push("a tool without a name".to_string());
                continue;
            };
            if self.cfg.tools.as_ref().is_some_and(|allow| !allow.iter().any(|a| a == remote)) {
                continue;
            }
            let exposed = match schema::exposed_name(&self.cfg.name, remote) {
                Ok(n) => n,
                Err(why) => {
                    left_out.push(format!("`{remote}`: {why}"));
                    continue;
                }
            };
            if let Some(other) = tools.iter().find(|o| o.exposed == exposed) {
                left_out.push(format!("`{remote}`: its name becomes `{exposed}`, like `{}`'s", other.remote));
                continue;
            }
            let description = t.get("description").and_then(Value::as_str).unwrap_or("").trim();
            let description = if description.is_empty() {
                format!("Tool `{remote}` of MCP server {}", self.cfg.name)
            } else {
                description.chars().take(MAX_DESCRIPTION).collect()
            };
            let schema = schema::clean(t.get("inputSchema").unwrap_or(&Value::Null));
            tools.push(RemoteTool { exposed, remote: remote.to_string(), description, schema });
        }
        if let Some(allow) = &self.cfg.tools {
            for wanted in
                allow.iter().filter(|w| !raw.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(w.as_str())))
            {
                left_out.push(format!("`{wanted}` is in `tools` but the server does not offer it"));
            }
        }
        (tools, left_out)
    }

    /// A usable connection, waiting (until `deadline`) while one is being made;
    /// a server found down is retried at once, once. `Err` is why it is not reachable.
    pub async fn connection(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Connection>, String> {
        self.start();
        let mut rx = self.state.subscribe();
        let mut kicked = false;
        loop {
            let state = rx.borrow_and_update().clone();
            match &state.phase {
                Phase::Connected => {
                    if let Some(conn) = state.conn.filter(|c| !c.closed().is_cancelled()) {
                        return Ok(conn);
                    }
                }
                Phase::Down(why) if kicked => return Err(why.clone()),
                Phase::Down(_) => {
                    kicked = true;
                    self.kick.notify_one();
                }
                Phase::Idle | Phase::Connecting => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("bramble is stopping".into()),
                Err(_) => {
                    return Err(match &rx.borrow().phase {
                        Phase::Down(why) => why.clone(),
                        _ => format!("still connecting after {}", self.cfg.timeout),
                    })
                }
            }
        }
    }

    /// Why the server cannot be used now, for the model.
    pub fn unreachable(&self, why: &str) -> ToolError {
        ToolError::new(format!("MCP server \"{}\" is not reachable: {why}", self.cfg.name))
    }

    /// Call `remote` with `args`: the result's text, or an error the model can act on.
    pub async fn call(
        self: &Arc<Self>,
        remote: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> Result<crate::tools::ToolOutput, ToolError> {
        let deadline = Instant::now() + self.cfg.timeout.get();
        let conn = self.connection(deadline).await.map_err(|why| self.unreachable(&why))?;
        let name = &self.cfg.name;
        match conn.call(remote, args, deadline, cancel).await {
            Ok(result) => match content::render_all(&result) {
                content::Rendered { text, is_error: false, images } => Ok(crate::tools::ToolOutput { text, images }),
                content::Rendered { text, .. } => {
                    Err(ToolError::new(format!("`{remote}` of MCP server \"{name}\" failed: {text}")))
                }
            },
            Err(e) => {
                let lost = e.breaks_connection();
                if lost {
                    // The supervisor notices and reconnects (restarts a stdio server).
                    conn.peer().close(e.to_string());
                }
                Err(ToolError::new(format!(
                    "MCP server \"{name}\", tool `{remote}`: {e}{}",
                    if lost { " (bramble reconnects for the next call)" } else { "" }
                )))
            }
        }
    }

    /// One line for `status`: state, tools, what was left out.
    pub fn status_line(&self) -> String {
        let s = self.state();
        let kind = match &self.cfg.transport {
            crate::config::McpTransport::Http { url, .. } => url.as_str().to_string(),
            crate::config::McpTransport::Stdio(st) => format!("`{}` (stdio, sandboxed)", st.command),
        };
        let mut line = match &s.phase {
            Phase::Idle => format!("{}: not started ({kind})", self.cfg.name),
            Phase::Connecting => format!("{}: connecting ({kind})", self.cfg.name),
            Phase::Connected => {
                let info = s.conn.as_ref().map(|c| format!("{}, {}", c.kind(), c.server_info())).unwrap_or_default();
                format!(
                    "{}: connected ({kind}; {}), {} tool{}",
                    self.cfg.name,
                    info.trim_end_matches([',', ' ']),
                    s.tools.len(),
                    if s.tools.len() == 1 { "" } else { "s" }
                )
            }
            Phase::Down(why) => format!("{}: down ({kind}): {why}", self.cfg.name),
        };
        if !s.left_out.is_empty() {
            line.push_str(&format!("; left out: {}", s.left_out.join("; ")));
        }
        if self.cfg.allow_untrusted {
            line.push_str("; untrusted origins allowed");
        }
        line
    }
}
