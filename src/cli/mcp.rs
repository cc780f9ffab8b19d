//! `bramble mcp list | login NAME | logout NAME`: the OAuth grants of remote
//! MCP servers ([`crate::tools::mcp::auth`]).
//!
//! A board has no browser, so `login` prints the authorization URL to open on
//! any device. It finishes by itself when that browser can reach the board's
//! loopback (the same machine, or `ssh -L` forwarding the port); otherwise
//! the browser ends on a page that does not load, whose address — or just
//! its `code` — is pasted at the prompt. The grant goes to the server's token
//! file in the state directory (0600), where the daemon finds it at its next
//! connection attempt. `list` and `logout` make no connection.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};

use super::args::McpCommand;
use crate::config::{HttpKind, Loaded, McpServer, McpTransport};
use crate::tools::mcp::auth::{self, Auth, UserAgent};
use crate::util::BoxFuture;

pub(super) async fn mcp(loaded: &Loaded, cmd: McpCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        McpCommand::List => {
            let mut out = std::io::stdout().lock();
            if loaded.config.mcp.server.is_empty() {
                writeln!(out, "no MCP servers configured ([[mcp.server]] in the config)")?;
            }
            for s in &loaded.config.mcp.server {
                let (_, state) = auth_state(loaded, s);
                writeln!(out, "{}  {}  {state}", s.name, place(s))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Login { name } => login(loaded, &name).await,
        McpCommand::Logout { name } => {
            let server = find(loaded, &name)?;
            let file = auth::store::path(&loaded.paths.state_dir, &server.name);
            if auth::store::remove(&file)? {
                println!("forgot the OAuth grant of MCP server \"{name}\" ({})", file.display());
            } else {
                println!("MCP server \"{name}\" had no OAuth grant");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn find<'a>(loaded: &'a Loaded, name: &str) -> anyhow::Result<&'a McpServer> {
    let servers = &loaded.config.mcp.server;
    match servers.iter().find(|s| s.name == name) {
        Some(s) => Ok(s),
        None if servers.is_empty() => bail!("no MCP server is configured ([[mcp.server]]), so none is named `{name}`"),
        None => bail!(
            "no MCP server is named `{name}`; configured: {}",
            servers.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn place(s: &McpServer) -> String {
    match &s.transport {
        McpTransport::Http { url, .. } => url.as_str().to_string(),
        McpTransport::Stdio(st) => format!("`{}` (stdio)", st.command),
    }
}

/// Whether `s` is authorized with OAuth (not stdio, HTTP+SSE or its own header).
fn oauth_capable(s: &McpServer) -> Result<(), &'static str> {
    match &s.transport {
        McpTransport::Stdio(_) => Err("stdio: no OAuth"),
        McpTransport::Http { kind: HttpKind::Sse, .. } => Err("HTTP+SSE: no OAuth (its headers only)"),
        McpTransport::Http { headers, headers_env, .. }
            if auth::has_own_authorization(headers.keys().chain(headers_env.keys())) =>
        {
            Err("its own Authorization header (no OAuth)")
        }
        McpTransport::Http { .. } => Ok(()),
    }
}

/// A server's authorization state: `(None, …)` when OAuth does not apply, `(Some(ok), text)` when it does.
fn auth_state(loaded: &Loaded, s: &McpServer) -> (Option<bool>, String) {
    if let Err(why) = oauth_capable(s) {
        return (None, why.to_string());
    }
    let (ok, text) = auth::describe(&auth::store::path(&loaded.paths.state_dir, &s.name), &s.oauth);
    (Some(ok), text)
}

/// For `doctor`: `(server, ok, text)` of every server OAuth applies to.
pub(super) fn auth_lines(loaded: &Loaded) -> Vec<(String, bool, String)> {
    loaded
        .config
        .mcp
        .server
        .iter()
        .filter_map(|s| match auth_state(loaded, s) {
            (Some(ok), text) => Some((s.name.clone(), ok, text)),
            (None, _) => None,
        })
        .collect()
}

async fn login(loaded: &Loaded, name: &str) -> anyhow::Result<ExitCode> {
    let server = find(loaded, name)?;
    if let Err(why) = oauth_capable(server) {
        bail!("MCP server \"{name}\" is not authorized with OAuth ({why})");
    }
    let McpTransport::Http { url, .. } = &server.transport else { bail!("MCP server \"{name}\" has no URL") };
    let url = reqwest::Url::parse(url.as_str()).with_context(|| format!("the url of MCP server \"{name}\""))?;
    let file = auth::store::path(&loaded.paths.state_dir, name);
    let agent: Arc<dyn UserAgent> = Arc::new(Terminal);
    let auth = Auth::new(name, url, server.oauth.clone(), Some(file.clone()), server.timeout.get(), Some(agent));
    let record = auth.login().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let scope = record.scope.as_deref().map(|s| format!(" (scope \"{s}\")")).unwrap_or_default();
    println!(
        "\nbramble is authorized with MCP server \"{name}\"{scope}; the grant is in {}.\nThe running daemon uses it \
         at its next connection attempt (within a minute, at once when one of the server's tools is called).",
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The person at the terminal: shown the URL, may paste the redirect's address.
struct Terminal;

impl UserAgent for Terminal {
    fn visit<'a>(&'a self, url: &'a reqwest::Url) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            println!(
                "Open this address in a browser, on any device, and approve bramble:\n\n  {url}\n\nIf that browser \
                 runs on this machine, bramble continues by itself. Otherwise the browser ends on a page that does \
                 not load (http://127.0.0.1:…/callback?code=…): copy that page's address and paste it here (or \
                 only the code), then Enter. Waiting for 10 minutes at most."
            );
            let _ = std::io::stdout().flush();
            // A thread of its own, not the runtime's blocking pool: the process
            // exits after a loopback callback without waiting for a line.
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = tx.send(std::io::stdin().read_line(&mut line).map(|_| line));
            });
            match rx.await {
                Ok(Ok(line)) if !line.trim().is_empty() => Some(line),
                // No terminal input (EOF, an empty line): the loopback callback alone.
                _ => std::future::pending().await,
            }
        })
    }
}
