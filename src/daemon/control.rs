//! The control socket: plain `bramble cron …` for members of the installed
//! service's group, served by the running daemon.
//!
//! The service's state directory is its user's alone (0700: sessions hold
//! private chats, and a group member who may write it could swap, plant or
//! symlink any file the daemon opens). So a member does not touch the state:
//! they ask the daemon, which edits its own job store the way `sudo bramble
//! cron …` would, as the service's user.
//!
//! Where: the installed service's config → `/run/bramble/control.sock` (the
//! unit's `RuntimeDirectory=bramble`, 0750 `bramble:bramble`; the socket 0660),
//! so the kernel lets in the `bramble` group and no one else; any other config
//! → `<state>/control.sock` (0600 in a 0700 directory: its own user only).
//!
//! Who: the kernel's word on the peer (`SO_PEERCRED`), not the request's.
//! Root and the daemon's own user are the service; a user whose process runs
//! with the daemon's group, or who has it among their groups in the group
//! database (`getgrouplist`, not `/proc`), is a member, subject to `[service]
//! members`; anyone else is refused. Every change is audited as `cli:<user>`.
//!
//! Protocol: one JSON line each way, one request per connection —
//! `{"argv": ["add", "tea", "--every", "1h", "--remind", "tea"]}` (the
//! arguments of a `cron` subcommand; `[]` only asks whether the daemon
//! answers) → `{"out": "…", "err": "…", "code": 0}`; `{"ask": "facts"}` gets
//! [`Facts`] (which secrets the daemon's environment holds, never their
//! values), so `status` and `pair` in another shell say what the daemon
//! sees. What the arguments mean
//! is the [`Handler`]'s business (the CLI's own `cron` code, handed in by
//! `bramble run`): this file is the transport and its limits. A request is at
//! most [`MAX_REQUEST`] bytes and must arrive within [`READ_TIMEOUT`]; at most
//! [`MAX_CONNECTIONS`] are served at once (more wait in the kernel's backlog),
//! each in its own task, all ended by the daemon's stop token. A member can
//! slow the socket down, never the scheduler or the channels.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::config::{self, Loaded, Members};
use crate::scheduler::SchedulerHandle;
use crate::tools::audit::Audit;

/// The socket's file name.
pub const SOCKET: &str = "control.sock";
/// The largest request read (a job's text included).
pub const MAX_REQUEST: usize = 64 * 1024;
/// How long a client has to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// How long a reply may take to be taken by the client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client sends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The arguments after `bramble cron`; empty: "do you answer?".
    #[serde(default)]
    pub argv: Vec<String>,
    /// Instead of a command: what the daemon's own environment says
    /// (`bramble status` and `pair` in another shell ask it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
}

/// A question that is not a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// [`Facts`], as JSON in the reply's `out`.
    Facts,
}

/// What the running daemon sees that another shell may not: which secrets
/// its environment holds (never their values), and its env file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    pub version: String,
    pub pid: u32,
    /// Each provider's name and where its key stands.
    pub providers: Vec<(String, crate::config::env::KeyState)>,
    /// Whether `[telegram] token_env` is set in the daemon.
    pub telegram_token: bool,
    /// Whether `[homeassistant]`'s token is set (`None`: no `url`).
    pub homeassistant_token: Option<bool>,
    /// Where the daemon's variables came from (`config::env::describe`).
    pub env_file: String,
}

impl Facts {
    /// This process's.
    pub fn of(loaded: &Loaded) -> Facts {
        let c = &loaded.config;
        Facts {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            providers: c.providers.iter().map(|p| (p.name().to_string(), config::env::key_state(p))).collect(),
            telegram_token: c.telegram.token().is_some(),
            homeassistant_token: c.homeassistant.url.as_ref().map(|_| c.homeassistant.token().is_some()),
            env_file: config::env::describe(&config::env::path()),
        }
    }
}

/// What the daemon answers: the command's output and exit code.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub out: String,
    #[serde(default)]
    pub err: String,
    pub code: i32,
}

impl Reply {
    /// A refusal or a failure: `bramble: error: …` and exit code 1.
    pub fn error(message: impl std::fmt::Display) -> Reply {
        Reply { out: String::new(), err: format!("bramble: error: {message}\n"), code: 1 }
    }
}

/// Who is asking, as the kernel says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    /// The user's name (`uid N` when it has none).
    pub name: String,
    /// A member of the service's group (not root, not the service's user):
    /// `[service] members` applies.
    pub member: bool,
}

/// One request for the [`Handler`].
pub struct Call {
    /// The daemon's config (this generation's).
    pub loaded: Arc<Loaded>,
    /// The running scheduler (`reload` after an edit, `run_now`).
    pub scheduler: SchedulerHandle,
    pub peer: Peer,
    /// The arguments after `bramble cron` (not empty).
    pub argv: Vec<String>,
}

/// The handler's answer.
pub struct Answer {
    pub reply: Reply,
    /// What changed (or was refused), for the audit trail; `None` for reads.
    pub audit: Option<String>,
}

/// What runs a request: the `cron` command's code (`src/cli/cron.rs`).
/// Called on a blocking thread (it uses the job store's file locks).
pub type Handler = Arc<dyn Fn(Call) -> Answer + Send + Sync>;

/// Why the socket could not be opened (the daemon runs on without it).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot create {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a directory of this user's that only it may write")]
    NotOurs { path: PathBuf },
    #[error("cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
}

/// Where the daemon for `loaded` listens, and whether its group may connect.
pub fn socket_path(loaded: &Loaded) -> (PathBuf, bool) {
    let service = config::Service::installed();
    match &loaded.path {
        Some(p) if config::same_file(p, &service.config) => (service.control, true),
        _ => (loaded.paths.state_dir.join(SOCKET), false),
    }
}

/// Listen on `path`: its directory made if missing (0750 when `shared`, else
/// 0700) and checked to be this user's and written by no one else; a stale
/// socket replaced; the new one 0660 (`shared`) or 0600.
pub fn bind(path: &Path, shared: bool) -> Result<UnixListener, ControlError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir_mode = if shared { 0o750 } else { 0o700 };
    match std::fs::DirBuilder::new().mode(dir_mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(ControlError::Dir { path: dir.to_path_buf(), source }),
    }
    let ours = std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0);
    if !ours {
        return Err(ControlError::NotOurs { path: dir.to_path_buf() });
    }
    let bind_err = |source| ControlError::Bind { path: path.to_path_buf(), source };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    let mode = if shared { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    Ok(listener)
}

/// What every connection of one daemon generation shares.
pub struct Shared {
    pub loaded: Arc<Loaded>,
    pub scheduler: SchedulerHandle,
    pub handler: Handler,
    pub audit: Audit,
}

/// The control socket's server ([`serve`]) for one daemon generation, until the stop.
pub struct ControlServer {
    pub listener: UnixListener,
    pub shared: Shared,
}

impl ControlServer {
    /// Serve until the stop, then remove the socket (if it is still the one
    /// bound here): a clean stop leaves nothing behind for a client to find.
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let bound = self.listener.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf));
        let identity = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let ours = bound.as_deref().and_then(identity);
        serve(self.listener, self.shared, shutdown.stop_token().clone()).await;
        if let (Some(path), Some(ours)) = (bound, ours) {
            if identity(&path) == Some(ours) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Serve `listener` until `stop`.
pub async fn serve(listener: UnixListener, shared: Shared, stop: CancellationToken) {
    let shared = Arc::new(shared);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        // A permit first: past the limit, clients wait in the backlog, not in a task each.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p,
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        match accepted {
            Ok((stream, _)) => {
                let shared = shared.clone();
                let stop = stop.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        () = connection(stream, &shared) => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
            Err(e) => {
                // Out of descriptors, say: do not spin.
                tracing::warn!("control socket: accept failed: {e}");
                drop(permit);
                crate::util::timer::sleep(Duration::from_millis(200)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns.abort_all();
}

/// One connection: who, what, the answer.
async fn connection(mut stream: UnixStream, shared: &Shared) {
    let reply = match answer(&mut stream, shared).await {
        Some(reply) => reply,
        None => return,
    };
    let Ok(mut line) = serde_json::to_vec(&reply) else { return };
    line.push(b'\n');
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&line).await?;
        stream.shutdown().await
    })
    .await;
    // Closing with unread input resets the connection, and the client would
    // lose the answer (to a request too large, say): take the rest, bounded.
    let mut rest = (&mut stream).take(MAX_DRAIN);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, tokio::io::copy(&mut rest, &mut tokio::io::sink())).await;
}

/// Input read and dropped after the answer, at most.
const MAX_DRAIN: u64 = 1024 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The reply to the request on `stream` (`None`: the client went away or was too slow).
async fn answer(stream: &mut UnixStream, shared: &Shared) -> Option<Reply> {
    let cred = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => return Some(Reply::error(format!("the daemon cannot tell who you are: {e}"))),
    };
    let (uid, gid) = (cred.uid(), cred.gid());
    let peer = match crate::util::tasks::blocking(move || identify(uid, gid)).await {
        Ok(peer) => peer,
        Err(why) => {
            tracing::warn!(uid, "control socket: refused: {why}");
            return Some(Reply::error(why));
        }
    };
    let request = match read_request(stream).await {
        Ok(r) => r,
        Err(Bad::Slow) => {
            tracing::debug!(user = %peer.name, "control socket: no request within {READ_TIMEOUT:?}");
            return None;
        }
        Err(Bad::Gone) => return None,
        Err(Bad::Reply(reply)) => return Some(reply),
    };
    let members = shared.loaded.config.service.members;
    if peer.member && members == Members::None {
        let why = "the service does not take job commands from its group's members ([service] members = \"none\"): \
                   use sudo (`sudo bramble …` acts as the service's user)";
        if !request.argv.is_empty() {
            shared
                .audit
                .record_cli(&peer.name, &format!("{} (refused: members = none)", request.argv.join(" ")), false)
                .await;
        }
        return Some(Reply::error(why));
    }
    if request.ask == Some(Ask::Facts) {
        let facts = Facts::of(&shared.loaded);
        return Some(match serde_json::to_string(&facts) {
            Ok(out) => Reply { out, ..Reply::default() },
            Err(e) => Reply::error(format!("cannot write the facts: {e}")),
        });
    }
    if request.argv.is_empty() {
        let whom = if peer.member { format!("members may: {}", members.as_str()) } else { "the service".into() };
        return Some(Reply {
            out: format!("bramble {} answers ({whom})\n", env!("CARGO_PKG_VERSION")),
            ..Reply::default()
        });
    }
    let call = Call {
        loaded: shared.loaded.clone(),
        scheduler: shared.scheduler.clone(),
        peer: peer.clone(),
        argv: request.argv,
    };
    let handler = shared.handler.clone();
    let answer = crate::util::tasks::blocking(move || handler(call)).await;
    if let Some(detail) = &answer.audit {
        shared.audit.record_cli(&peer.name, detail, answer.reply.code == 0).await;
    }
    Some(answer.reply)
}

/// What went wrong reading a request.
enum Bad {
    /// Not within [`READ_TIMEOUT`].
    Slow,
    /// Closed, or a read error.
    Gone,
    /// Too large or not a request: say so.
    Reply(Reply),
}

async fn read_request(stream: &mut UnixStream) -> Result<Request, Bad> {
    let mut line = Vec::new();
    let limited = (&mut *stream).take(MAX_REQUEST as u64 + 1);
    let mut reader = tokio::io::BufReader::new(limited);
    match tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
        Err(_) => return Err(Bad::Slow),
        Ok(Err(_)) => return Err(Bad::Gone),
        Ok(Ok(_)) => {}
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_REQUEST {
        return Err(Bad::Reply(Reply::error(format!("the request is larger than {} KiB", MAX_REQUEST / 1024))));
    }
    if line.is_empty() {
        return Err(Bad::Gone);
    }
    serde_json::from_slice::<Request>(&line)
        .map_err(|e| Bad::Reply(Reply::error(format!("not a control request ({e}): {{\"argv\": [\"list\"]}}"))))
}

/// Root and this daemon's user are the service; members of its group
/// (the process's group, or the user's groups in the group database) are
/// members; anyone else is refused with the reason.
fn identify(uid: u32, gid: u32) -> Result<Peer, String> {
    use nix::unistd::{Gid, Group, Uid, User};
    let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
    let name = user.as_ref().map(|u| u.name.clone()).unwrap_or_else(|| format!("uid {uid}"));
    if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
        return Ok(Peer { uid, name, member: false });
    }
    let group = nix::unistd::getegid();
    let in_group = gid == group.as_raw()
        || user.as_ref().is_some_and(|u| {
            std::ffi::CString::new(u.name.clone())
                .ok()
                .and_then(|n| nix::unistd::getgrouplist(&n, u.gid).ok())
                .is_some_and(|groups| groups.contains(&group))
        });
    if in_group {
        return Ok(Peer { uid, name, member: true });
    }
    let group_name = Group::from_gid(Gid::from_raw(group.as_raw()))
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| format!("gid {group}"));
    Err(format!(
        "{name} is not in the service's group `{group_name}`: ask an administrator (`sudo adduser {name} {group_name}`, \
         then log in again), or use sudo"
    ))
}

/// Ask the daemon at `path`: send `argv`, return its reply.
pub async fn request(path: &Path, argv: &[String], timeout: Duration) -> Result<Reply, ClientError> {
    exchange(path, &Request { argv: argv.to_vec(), ask: None }, timeout).await
}

/// Ask the daemon at `path` for its [`Facts`].
pub async fn facts(path: &Path, timeout: Duration) -> Result<Facts, ClientError> {
    let reply = exchange(path, &Request { argv: Vec::new(), ask: Some(Ask::Facts) }, timeout).await?;
    if reply.code != 0 {
        return Err(ClientError::Refused(reply.err.trim().trim_start_matches("bramble: error: ").to_string()));
    }
    serde_json::from_str(&reply.out).map_err(ClientError::Json)
}

/// One request, one reply.
async fn exchange(path: &Path, request: &Request, timeout: Duration) -> Result<Reply, ClientError> {
    let mut stream = UnixStream::connect(path).await.map_err(|source| ClientError::Connect { source })?;
    let mut line = serde_json::to_vec(request).map_err(ClientError::Json)?;
    line.push(b'\n');
    let exchange = async {
        stream.write_all(&line).await?;
        let mut reply = Vec::new();
        // Replies can be long (a list of thousands of jobs), never endless.
        (&mut stream).take(MAX_REPLY as u64).read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ClientError::Timeout)?
        .map_err(|source| ClientError::Io { source })?;
    serde_json::from_slice(&reply).map_err(ClientError::Json)
}

/// The largest reply a client reads.
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Why a client got no reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect: {source}")]
    Connect { source: std::io::Error },
    #[error("the daemon did not answer in time")]
    Timeout,
    #[error("{source}")]
    Io { source: std::io::Error },
    #[error("the daemon's answer is not a reply: {0}")]
    Json(serde_json::Error),
    #[error("{0}")]
    Refused(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_one_json_line() {
        let r: Request = serde_json::from_str(r#"{"argv": ["list"]}"#).unwrap();
        assert_eq!(r.argv, ["list"]);
        assert!(serde_json::from_str::<Request>(r#"{"argv": [], "config": "/tmp/x"}"#).is_err(), "no other fields");
        let reply = serde_json::to_string(&Reply::error("no")).unwrap();
        assert_eq!(reply, r#"{"out":"","err":"bramble: error: no\n","code":1}"#);
    }

    #[tokio::test]
    async fn the_socket_is_made_only_in_a_directory_no_one_else_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // The service's: a 0750 directory made, the socket the group's; a stale one replaced.
        let shared = dir.path().join("run/control.sock");
        std::fs::create_dir(dir.path().join("run")).unwrap();
        std::fs::set_permissions(dir.path().join("run"), std::fs::Permissions::from_mode(0o750)).unwrap();
        std::fs::write(&shared, "stale").unwrap();
        drop(bind(&shared, true).unwrap());
        assert_eq!(mode(&shared), 0o660);
        // Anyone else's: 0700, the socket 0600.
        let own = dir.path().join("own/control.sock");
        drop(bind(&own, false).unwrap());
        assert_eq!((mode(own.parent().unwrap()), mode(&own)), (0o700, 0o600));
        // A directory others may write: someone could swap the socket; refused.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(bind(&open.join(SOCKET), true), Err(ControlError::NotOurs { .. })));
    }

    #[test]
    fn root_and_the_daemons_user_are_the_service() {
        let me = nix::unistd::geteuid().as_raw();
        let peer = identify(me, nix::unistd::getegid().as_raw()).unwrap();
        assert!(!peer.member);
        assert!(!identify(0, 0).unwrap().member);
    }
}
