//! MCP over stdio: a child process speaking newline-delimited JSON-RPC.
//!
//! The server is a program bramble starts, so it is confined like a command
//! of the `exec` tool: [`Sandbox::wrap`] with `[exec]`'s layers and the
//! server's own limits and network switch ([`StdioServer::exec_config`]), the
//! same minimal environment (plus the server's `env` / `env_from`), its own
//! process group. Three tasks serve it:
//!
//! - the reader splits stdout into lines and feeds each to the [`Peer`]; a
//!   line over [`MAX_MESSAGE`] is dropped as it streams past (never held) and
//!   fails the request it answered (its id is read from the line's start);
//! - the stderr reader keeps the last lines for error messages (`debug` log);
//! - the waiter notices the exit and closes the peer with the exit status and
//!   the last stderr line, so a call in flight fails at once with a reason.
//!   When the connection is dropped or bramble stops (the cancellation
//!   token), it sends the group SIGTERM, then SIGKILL after a second.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio as Pipe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio_util::sync::CancellationToken;

use super::super::rpc::{self, McpError, Peer, MAX_MESSAGE};
use crate::config::{ExecConfig, StdioServer};
use crate::sandbox::process::{CommandSpec, GroupGuard};
use crate::sandbox::Sandbox;

/// `PATH` for the server, as for `exec` commands.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Between SIGTERM and SIGKILL when the server is stopped.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// Bytes of stderr kept for error messages.
const STDERR_TAIL: usize = 2048;

/// A running stdio server.
pub struct Stdio {
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
    pub peer: Arc<Peer>,
    stop: CancellationToken,
}

impl Drop for Stdio {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The server's environment: `exec`'s minimal one, then its `env`, then `env_from`.
fn environment(server: &StdioServer, workspace: &Path) -> Result<Vec<(OsString, OsString)>, McpError> {
    let lang = std::env::var_os("LANG").filter(|v| !v.is_empty()).unwrap_or_else(|| "C.UTF-8".into());
    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), PATH.into()),
        ("HOME".into(), workspace.into()),
        ("LANG".into(), lang),
        ("TERM".into(), "dumb".into()),
    ];
    let mut set = |name: &str, value: OsString| {
        env.retain(|(k, _)| k != name);
        env.push((name.into(), value));
    };
    for (name, value) in &server.env {
        set(name, value.into());
    }
    for (name, var) in &server.env_from {
        let Some(secret) = crate::config::secret_from_env(var) else {
            return Err(McpError::Connection(format!("env_from `{name}`: the environment variable {var} is not set")));
        };
        set(name, secret.expose().into());
    }
    Ok(env)
}

impl Stdio {
    /// Start the server in the sandbox and the tasks that serve it.
    pub fn open(
        server: &StdioServer,
        exec: &ExecConfig,
        workspace: &Path,
        sandbox: &Arc<Sandbox>,
        cancel: &CancellationToken,
    ) -> Result<Stdio, McpError> {
        if !workspace.is_dir() {
            return Err(McpError::Connection(format!(
                "the workspace {} (the server's working directory) does not exist: run `bramble init`",
                workspace.display()
            )));
        }
        let spec = CommandSpec {
            program: server.command.clone().into(),
            args: server.args.iter().map(OsString::from).collect(),
            cwd: workspace.to_path_buf(),
            env: environment(server, workspace)?,
            stdin: None,
            timeout: Duration::MAX,
            max_output: 0,
        };
        let spec = sandbox.wrap(spec, &server.exec_config(exec), workspace).map_err(McpError::Connection)?;
        let mut child = tokio::process::Command::new(&spec.program)
            .args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Pipe::piped())
            .stdout(Pipe::piped())
            .stderr(Pipe::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| McpError::Connection(format!("cannot start `{}`: {e}", server.command)))?;
        let group = match child.id().and_then(|id| i32::try_from(id).ok()) {
            Some(pid) => GroupGuard::new(pid),
            None => return Err(McpError::Connection("the server process exited at once".into())),
        };
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(McpError::Connection("the server's pipes could not be set up".into()));
        };
        let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
        let peer = Arc::new(Peer::default());
        let stop = cancel.child_token();
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let reader = tokio::spawn(read_messages(stdout, peer.clone(), stdin.clone()));
        tokio::spawn(read_stderr(stderr, tail.clone()));
        tokio::spawn(supervise(child, group, stop.clone(), peer.clone(), tail, reader, Arc::clone(sandbox)));
        Ok(Stdio { stdin, peer, stop })
    }

    /// Write one message (a line).
    pub async fn send(&self, msg: &Value) -> Result<(), McpError> {
        write_line(&self.stdin, msg).await
    }

    /// Send request `id`; its answer arrives through the reader.
    pub async fn request(&self, id: i64, body: &Value) -> Result<(), McpError> {
        if let Err(e) = self.send(body).await {
            self.peer.fail(id, e.clone());
            return Err(e);
        }
        Ok(())
    }
}

async fn write_line(stdin: &tokio::sync::Mutex<ChildStdin>, msg: &Value) -> Result<(), McpError> {
    let mut line = serde_json::to_vec(msg).map_err(|e| McpError::Protocol(e.to_string()))?;
    line.push(b'\n');
    let mut stdin = stdin.lock().await;
    let gone = |e: std::io::Error| McpError::Connection(format!("the server process does not read its input ({e})"));
    stdin.write_all(&line).await.map_err(gone)?;
    stdin.flush().await.map_err(gone)
}

/// Split stdout into messages; answer the server's requests.
async fn read_messages(
    mut stdout: impl AsyncRead + Unpin,
    peer: Arc<Peer>,
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
) {
    let mut lines = LineSplitter::new(MAX_MESSAGE);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for item in lines.feed(&chunk[..n]) {
            match item {
                Line::Message(bytes) => match rpc::parse(&bytes) {
                    Ok(msg) => {
                        for reply in peer.incoming(msg) {
                            if let Err(e) = write_line(&stdin, &reply).await {
                                tracing::debug!("mcp: a reply to the server failed: {e}");
                            }
                        }
                    }
                    // A stdio server's stdout is for MCP messages only: whoever waits learns it is broken.
                    Err(McpError::Protocol(why)) => peer.fail_all(&McpError::Protocol(format!(
                        "{why} (a stdio server must write only JSON-RPC lines to its stdout)"
                    ))),
                    Err(e) => peer.fail_all(&e),
                },
                Line::TooLarge(prefix) => match rpc::id_in_prefix(&prefix) {
                    Some(id) => peer.fail(id, McpError::TooLarge),
                    None => peer.fail_all(&McpError::TooLarge),
                },
            }
        }
    }
}

/// What a [`LineSplitter`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A complete, non-empty line.
    Message(Vec<u8>),
    /// A line over the limit, dropped; its first bytes.
    TooLarge(Vec<u8>),
}

/// Newline-delimited messages with a size cap: an oversized line is reported
/// once, at the moment it passes the cap, and skipped to its end.
struct LineSplitter {
    buf: Vec<u8>,
    skipping: bool,
    max: usize,
}

impl LineSplitter {
    fn new(max: usize) -> LineSplitter {
        LineSplitter { buf: Vec::new(), skipping: false, max }
    }

    fn feed(&mut self, mut data: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let end = data.iter().position(|&b| b == b'\n');
            let part = &data[..end.unwrap_or(data.len())];
            if !self.skipping {
                if self.buf.len() + part.len() > self.max {
                    let mut prefix = std::mem::take(&mut self.buf);
                    prefix.extend_from_slice(&part[..part.len().min(256)]);
                    prefix.truncate(256);
                    out.push(Line::TooLarge(prefix));
                    self.skipping = true;
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            match end {
                Some(i) => {
                    if !self.skipping {
                        let line = std::mem::take(&mut self.buf);
                        if !line.trim_ascii().is_empty() {
                            out.push(Line::Message(line));
                        }
                    }
                    self.skipping = false;
                    data = &data[i + 1..];
                }
                None => data = &[],
            }
        }
        out
    }
}

/// Keep the end of stderr for error messages; log its lines at debug.
async fn read_stderr(mut stderr: impl AsyncRead + Unpin, tail: Arc<Mutex<VecDeque<u8>>>) {
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tracing::debug!("mcp server stderr: {}", String::from_utf8_lossy(&chunk[..n]).trim_end());
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        let len = tail.len();
        let overflow = (len + n).saturating_sub(STDERR_TAIL);
        tail.drain(..overflow.min(len));
        tail.extend(&chunk[n.saturating_sub(STDERR_TAIL)..n]);
    }
}

/// The last non-empty line of stderr, shortened.
fn last_line(tail: &Mutex<VecDeque<u8>>) -> Option<String> {
    let bytes: Vec<u8> = tail.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Some(line.chars().take(300).collect())
}

/// Wait for the server to exit (or to be stopped) and close the connection with the reason.
async fn supervise(
    mut child: Child,
    mut group: GroupGuard,
    stop: CancellationToken,
    peer: Arc<Peer>,
    tail: Arc<Mutex<VecDeque<u8>>>,
    reader: tokio::task::JoinHandle<()>,
    sandbox: Arc<Sandbox>,
) {
    let exited = tokio::select! {
        status = child.wait() => Some(status),
        () = stop.cancelled() => None,
    };
    let why = match exited {
        Some(status) => {
            group.signal(Signal::SIGKILL); // whatever it left behind
                                           // The last messages it wrote are still in the pipe: let the reader hand them over.
            let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
            let status = match status {
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(crate::sandbox::options::SETUP_FAILED), _) => {
                        // A sandbox layer failed: the next start uses what the kernel really offers.
                        let _ = tokio::task::spawn_blocking(move || sandbox.recheck()).await;
                        "the sandbox could not be set up".to_string()
                    }
                    (Some(code), _) => format!("exit status {code}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    (None, None) => "unknown status".to_string(),
                },
                Err(e) => format!("cannot wait for it: {e}"),
            };
            match last_line(&tail) {
                Some(line) => format!("the server process exited ({status}); its last words: {line}"),
                None => format!("the server process exited ({status})"),
            }
        }
        None => {
            group.signal(Signal::SIGTERM);
            if tokio::time::timeout(KILL_GRACE, child.wait()).await.is_err() {
                group.signal(Signal::SIGKILL);
                let _ = child.wait().await;
            } else {
                group.signal(Signal::SIGKILL);
            }
            "the server was stopped".to_string()
        }
    };
    group.disarm();
    peer.close(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_oversized_ones_skipped() {
        let mut s = LineSplitter::new(10);
        assert_eq!(s.feed(b"{\"a\":1}\n\n{\"b\""), [Line::Message(b"{\"a\":1}".to_vec())]);
        assert_eq!(s.feed(b":2}\n"), [Line::Message(b"{\"b\":2}".to_vec())]);
        // 25 bytes in three chunks: reported once, when it passes the cap; the next line is whole.
        assert_eq!(s.feed(b"{\"id\":4,\"x"), []);
        assert_eq!(s.feed(b"xxxxxxxx"), [Line::TooLarge(b"{\"id\":4,\"xxxxxxxxx".to_vec())]);
        assert_eq!(s.feed(b"xxxxxx\n{}\n"), [Line::Message(b"{}".to_vec())]);
        assert!(s.buf.capacity() <= 64, "nothing big is kept");
    }

    #[test]
    fn the_environment_is_minimal_plus_the_servers() {
        let server = StdioServer {
            command: "srv".into(),
            args: vec![],
            env: [("LEVEL".to_string(), "debug".to_string()), ("PATH".to_string(), "/opt/bin".to_string())].into(),
            env_from: Default::default(),
            network: crate::config::Network::All,
            max_memory_mb: None,
            max_cpu_seconds: None,
            max_processes: None,
            max_open_files: None,
        };
        let env = environment(&server, Path::new("/ws")).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.to_string_lossy().into_owned());
        assert_eq!(get("PATH").as_deref(), Some("/opt/bin"));
        assert_eq!(get("HOME").as_deref(), Some("/ws"));
        assert_eq!(get("LEVEL").as_deref(), Some("debug"));
        assert_eq!(env.len(), 5);
        let missing =
            StdioServer { env_from: [("TOKEN".to_string(), "BRAMBLE_UNSET_VAR_1f".to_string())].into(), ..server };
        let err = environment(&missing, Path::new("/ws")).unwrap_err();
        assert!(err.to_string().contains("BRAMBLE_UNSET_VAR_1f is not set"), "{err}");
    }
}
