//! Running one command: its own process group, a bounded view of its output,
//! and nothing left behind.
//!
//! A shell command from a model is untrusted in a mundane way: it may print
//! gigabytes, hang forever, or start background jobs (`server &`) that outlive
//! it and hold its pipes open. So every command goes through [`run`], which
//!
//! - starts the child in a new process group (`process_group(0)`), so the
//!   child and everything it starts can be signalled as a unit. This keeps
//!   std on its `posix_spawn` path: cheaper than `fork` (no page-table copy)
//!   and the one that works under qemu-user, where a `fork` with a `pre_exec`
//!   hook hangs (seen with Debian 12's qemu-aarch64-static 7.2). A new *session* (`setsid`) is
//!   the sandbox helper's job, in ordinary code between its start and `exec`;
//! - clears the environment and passes exactly [`CommandSpec::env`];
//! - reads stdout and stderr concurrently into [`Capture`]s that keep the first
//!   half and a ring of the last half of `max_output` bytes — memory stays flat
//!   however much the child writes;
//! - on timeout or cancellation sends `SIGTERM` to the group, waits a short
//!   grace period, then `SIGKILL`s it;
//! - when the main child exits on its own, kills whatever is left in its group
//!   and then drains the pipes with a bounded wait (a grandchild that escaped
//!   the group cannot hang us);
//! - always reaps the child, and kills the group if the future is dropped.
//!
//! Kernel layers (namespaces, rlimits, Landlock) come later by re-executing
//! bramble as a `sandbox-exec` helper: that only changes `program` and `args`
//! of the [`CommandSpec`], nothing here.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Time between `SIGTERM` and `SIGKILL` when a command is stopped.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How long to keep reading pipes after the process group is gone. Only a
/// process that left the group (its own `setsid`) can keep them open longer.
const DRAIN_WAIT: Duration = Duration::from_millis(500);
/// Size of one read from a pipe.
const READ_CHUNK: usize = 16 * 1024;

/// What to run and under which limits.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// The complete environment of the child; everything else is cleared.
    pub env: Vec<(OsString, OsString)>,
    /// Bytes written to the child's stdin, which is then closed. `None`: stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Wall-clock limit; when reached the whole process group is stopped.
    pub timeout: Duration,
    /// Bytes kept per stream (head and tail); the rest is counted, not stored.
    pub max_output: usize,
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitState {
    /// Exited on its own with this status code.
    Exited(i32),
    /// Killed by this signal (not by us).
    Signaled(i32),
    /// Ran past [`CommandSpec::timeout`]; the group was killed.
    TimedOut,
    /// The cancellation token fired; the group was killed.
    Cancelled,
}

/// The kept part of one output stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Lossy UTF-8: all of it, or head + `\n... (N bytes truncated) ...\n` + tail.
    pub text: String,
    /// Bytes the child wrote to the stream in total.
    pub total_bytes: u64,
    /// Whether bytes were dropped from the middle.
    pub truncated: bool,
}

/// Everything known about a finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub state: ExitState,
    pub stdout: Captured,
    pub stderr: Captured,
    pub elapsed: Duration,
}

/// Run `spec` to completion, timeout or cancellation.
///
/// `Err` only when the command could not be started (missing program, bad
/// working directory); a command that fails is an `Ok` with its [`ExitState`].
pub async fn run(spec: CommandSpec, cancel: &CancellationToken) -> io::Result<Outcome> {
    let child = command(&spec).spawn()?;
    run_child(child, spec, cancel).await
}

/// [`run`] for a child already started by [`command`] (a warm sandbox helper,
/// [`super::warm`], which got its order on stdin): `spec`'s stdin is not fed
/// (it must be `None`), its timeout counts from now.
pub(crate) async fn run_child(
    mut child: tokio::process::Child,
    spec: CommandSpec,
    cancel: &CancellationToken,
) -> io::Result<Outcome> {
    let start = Instant::now();
    let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        // Only possible if the child was already reaped, which nothing here does.
        return Err(io::Error::other("spawned child has no pid"));
    };
    // The child leads a new process group whose id is its pid.
    let mut group = GroupGuard::new(pid);

    let mut out = Capture::new(spec.max_output);
    let mut err = Capture::new(spec.max_output);
    let state = {
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let io = pump_all(pipes, spec.stdin, &mut out, &mut err);
        tokio::pin!(io);
        let mut io_done = false;
        let deadline = start + spec.timeout;

        // Phase 1: the child runs while its output is read.
        let state = loop {
            tokio::select! {
                () = &mut io, if !io_done => io_done = true,
                status = child.wait() => break exit_state(status?),
                () = tokio::time::sleep_until(deadline) => break ExitState::TimedOut,
                () = cancel.cancelled() => break ExitState::Cancelled,
            }
        };

        // Phase 2: stop a command that did not finish: TERM, a grace period, then KILL below.
        if matches!(state, ExitState::TimedOut | ExitState::Cancelled) {
            group.signal(Signal::SIGTERM);
            let grace = Instant::now() + KILL_GRACE;
            loop {
                tokio::select! {
                    () = &mut io, if !io_done => io_done = true,
                    _ = child.wait() => break,
                    () = tokio::time::sleep_until(grace) => break,
                }
            }
        }

        // Phase 3: nothing the command started outlives it; reap, then drain what is buffered.
        group.signal(Signal::SIGKILL);
        child.wait().await?;
        group.disarm();
        if !io_done {
            let _ = tokio::time::timeout(DRAIN_WAIT, &mut io).await;
        }
        state
    };

    Ok(Outcome { state, stdout: out.finish(), stderr: err.finish(), elapsed: start.elapsed() })
}

/// The `Command` for a spec: new process group, cleared environment, piped output.
pub(crate) fn command(spec: &CommandSpec) -> Command {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    cmd
}

fn exit_state(status: ExitStatus) -> ExitState {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitState::Exited(code),
        (None, Some(sig)) => ExitState::Signaled(sig),
        // Neither code nor signal cannot happen for a reaped process.
        (None, None) => ExitState::Exited(-1),
    }
}

/// The child's three pipes, taken out of the `Child` so waiting and reading can overlap.
type Pipes = (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>);

/// Feed stdin and read both output streams until all three are done.
async fn pump_all(pipes: Pipes, input: Option<Vec<u8>>, out: &mut Capture, err: &mut Capture) {
    let (stdin, stdout, stderr) = pipes;
    tokio::join!(feed(stdin, input), pump(stdout, out), pump(stderr, err));
}

/// Write `input` and close stdin. A child that exits without reading it is fine.
async fn feed(stdin: Option<ChildStdin>, input: Option<Vec<u8>>) {
    if let (Some(mut stdin), Some(input)) = (stdin, input) {
        let _ = stdin.write_all(&input).await;
        let _ = stdin.shutdown().await;
    }
}

/// Read `reader` to its end (or first error) into `cap`.
async fn pump<R: AsyncRead + Unpin>(reader: Option<R>, cap: &mut Capture) {
    let Some(mut reader) = reader else { return };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => cap.push(&buf[..n]),
        }
    }
}

/// Kills the process group when dropped while armed: a `run` future dropped
/// mid-command (a cancelled turn) leaves nothing running. Also used by the
/// long-lived MCP server children (`tools::mcp::transport::stdio`).
pub(crate) struct GroupGuard {
    pgid: Option<Pid>,
}

impl GroupGuard {
    /// The group led by `pid` (a child started with `process_group(0)`).
    pub(crate) fn new(pid: i32) -> GroupGuard {
        GroupGuard { pgid: Some(Pid::from_raw(pid)) }
    }

    pub(crate) fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH (the group is already empty) is the expected case.
            let _ = killpg(pgid, sig);
        }
    }

    /// The group is dead and its leader reaped: its id may be reused, never signal it again.
    pub(crate) fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// A bounded record of one stream: the first `max/2` bytes and a ring of the last `max - max/2`.
#[derive(Debug)]
pub(crate) struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: std::collections::VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl Capture {
    pub(crate) fn new(max: usize) -> Self {
        let head_cap = max / 2;
        let tail_cap = max - head_cap;
        Capture {
            head: Vec::with_capacity(head_cap.min(64 * 1024)),
            head_cap,
            tail: std::collections::VecDeque::new(),
            tail_cap,
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return;
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    pub(crate) fn finish(self) -> Captured {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let dropped = self.total - kept;
        let (front, back) = self.tail.as_slices();
        let text = if dropped == 0 {
            let mut all = self.head;
            all.extend_from_slice(front);
            all.extend_from_slice(back);
            String::from_utf8_lossy(&all).into_owned()
        } else {
            let tail: Vec<u8> = [front, back].concat();
            format!(
                "{}\n... ({dropped} bytes truncated) ...\n{}",
                String::from_utf8_lossy(&self.head),
                String::from_utf8_lossy(&tail)
            )
        };
        Captured { text, total_bytes: self.total, truncated: dropped > 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> CommandSpec {
        CommandSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: std::env::temp_dir(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            stdin: None,
            timeout: Duration::from_secs(20),
            max_output: 4096,
        }
    }

    async fn run_ok(spec: CommandSpec) -> Outcome {
        run(spec, &CancellationToken::new()).await.unwrap()
    }

    /// Live processes (not zombies) whose command line contains `marker`.
    fn live_with_marker(marker: &str) -> Vec<String> {
        scan_marker(marker).into_iter().map(|(_, cmdline)| cmdline).collect()
    }

    fn pids_with_marker(marker: &str) -> Vec<i32> {
        scan_marker(marker).into_iter().map(|(pid, _)| pid).collect()
    }

    fn scan_marker(marker: &str) -> Vec<(i32, String)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let dir = entry.path();
            let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let zombie = std::fs::read_to_string(dir.join("stat"))
                .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
                .unwrap_or(true);
            if cmdline.contains(marker) && !zombie {
                found.push((pid, cmdline));
            }
        }
        found
    }

    /// Wait (briefly) until no live process carries `marker`; SIGKILL delivery is not instantaneous.
    async fn assert_gone(marker: &str) {
        for _ in 0..50 {
            if live_with_marker(marker).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("still running: {:?}", live_with_marker(marker));
    }

    fn marker(tag: &str) -> String {
        // A sleep duration unique to this test run, findable in /proc.
        format!("100.{}{}", std::process::id(), tag)
    }

    #[tokio::test]
    async fn exit_codes_and_separate_streams() {
        let o = run_ok(sh("echo out; echo err >&2; exit 3")).await;
        assert_eq!(o.state, ExitState::Exited(3));
        assert_eq!(o.stdout.text, "out\n");
        assert_eq!(o.stderr.text, "err\n");
        assert_eq!(o.stdout.total_bytes, 4);
        assert!(!o.stdout.truncated);
        assert_eq!(run_ok(sh("true")).await.state, ExitState::Exited(0));
        assert_eq!(run_ok(sh("kill -9 $$")).await.state, ExitState::Signaled(9));
    }

    #[tokio::test]
    async fn spawn_failure_is_an_error() {
        let mut spec = sh("true");
        spec.program = "/nonexistent/program".into();
        assert!(run(spec, &CancellationToken::new()).await.is_err());
        let mut spec = sh("true");
        spec.cwd = "/nonexistent/dir".into();
        assert!(run(spec, &CancellationToken::new()).await.is_err());
    }

    #[tokio::test]
    async fn child_leads_its_own_process_group() {
        // Field 5 of /proc/<pid>/stat is the process group (the shell's comm, `sh`, has no spaces).
        let o = run_ok(sh("cut -d' ' -f5 /proc/$$/stat; echo $$")).await;
        let lines: Vec<&str> = o.stdout.text.split_whitespace().collect();
        assert_eq!(lines.len(), 2, "{o:?}");
        assert_eq!(lines[0], lines[1], "pgid should equal the shell's pid");
        let ours = nix::unistd::getpgrp().as_raw().to_string();
        assert_ne!(lines[0], ours, "not the test's own group");
    }

    #[tokio::test]
    async fn timeout_kills_grandchildren() {
        let m = marker("1");
        let mut spec = sh(&format!("sleep {m} & sleep {m}"));
        spec.timeout = Duration::from_millis(500);
        let o = run_ok(spec).await;
        assert_eq!(o.state, ExitState::TimedOut);
        assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
        assert_gone(&m).await;
    }

    #[tokio::test]
    async fn term_ignoring_children_are_killed_after_grace() {
        let m = marker("2");
        let mut spec = sh(&format!("trap '' TERM; sleep {m} & trap '' TERM; sleep {m}"));
        spec.timeout = Duration::from_millis(300);
        let o = run_ok(spec).await;
        assert_eq!(o.state, ExitState::TimedOut);
        assert_gone(&m).await;
    }

    #[tokio::test]
    async fn background_child_is_killed_after_normal_exit() {
        let m = marker("3");
        // The background sleep holds stdout open: the read must not wait for it.
        let o = run_ok(sh(&format!("sleep {m} & echo started"))).await;
        assert_eq!(o.state, ExitState::Exited(0));
        assert_eq!(o.stdout.text, "started\n");
        assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
        assert_gone(&m).await;
    }

    #[tokio::test]
    async fn escaped_grandchild_cannot_hang_the_drain() {
        let m = marker("4");
        // setsid leaves our group; its inherited stdout stays open. `run` must still return.
        let script = format!("if command -v setsid >/dev/null; then setsid sleep {m} & fi; echo done");
        let o = run_ok(sh(&script)).await;
        assert_eq!(o.state, ExitState::Exited(0));
        assert!(o.stdout.text.starts_with("done"));
        assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
        // Clean up the escapee ourselves, by pid.
        for pid in pids_with_marker(&m) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    #[tokio::test]
    async fn cancellation_stops_the_group() {
        let m = marker("5");
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            trigger.cancel();
        });
        let o = run(sh(&format!("sleep {m} & sleep {m}")), &cancel).await.unwrap();
        assert_eq!(o.state, ExitState::Cancelled);
        assert_gone(&m).await;
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_group() {
        let m = marker("6");
        let cancel = CancellationToken::new();
        let fut = run(sh(&format!("sleep {m} & sleep {m}")), &cancel);
        assert!(tokio::time::timeout(Duration::from_millis(300), fut).await.is_err());
        assert_gone(&m).await;
    }

    #[tokio::test]
    async fn huge_output_stays_capped() {
        let mut spec = sh("head -c 100000000 /dev/zero | tr '\\0' a; echo END >&2; printf 'TAIL'");
        spec.max_output = 1000;
        let o = run_ok(spec).await;
        assert_eq!(o.state, ExitState::Exited(0));
        assert_eq!(o.stdout.total_bytes, 100_000_004);
        assert!(o.stdout.truncated);
        assert!(o.stdout.text.len() < 1100, "{}", o.stdout.text.len());
        assert!(o.stdout.text.starts_with(&"a".repeat(500)));
        assert!(o.stdout.text.ends_with("aaaTAIL"));
        assert!(o.stdout.text.contains("\n... (99999004 bytes truncated) ...\n"));
        assert_eq!(o.stderr.text, "END\n");
    }

    #[tokio::test]
    async fn endless_output_is_bounded_by_the_timeout() {
        let mut spec = sh("yes");
        spec.timeout = Duration::from_millis(500);
        spec.max_output = 100;
        let o = run_ok(spec).await;
        assert_eq!(o.state, ExitState::TimedOut);
        assert!(o.stdout.total_bytes > 1000);
        assert!(o.stdout.text.len() < 200);
    }

    #[tokio::test]
    async fn environment_is_exactly_the_spec() {
        // This process has variables (PATH at least): none of them may reach the child.
        assert!(std::env::var_os("PATH").is_some());
        let mut spec = sh("env");
        spec.program = "/usr/bin/env".into();
        spec.args = vec![];
        spec.env = vec![("ONLY".into(), "this".into()), ("AND".into(), "that".into())];
        let o = run_ok(spec).await;
        let mut lines: Vec<&str> = o.stdout.text.lines().collect();
        lines.sort();
        assert_eq!(lines, ["AND=that", "ONLY=this"]);
    }

    #[tokio::test]
    async fn stdin_is_delivered_or_null() {
        let mut spec = sh("cat; echo; wc -c < /dev/stdin");
        spec.stdin = Some(b"hello".to_vec());
        let o = run_ok(spec).await;
        assert_eq!(o.stdout.text, "hello\n0\n");
        // Without input, stdin is /dev/null: cat ends at once instead of hanging.
        let mut spec = sh("cat");
        spec.timeout = Duration::from_secs(5);
        let o = run_ok(spec).await;
        assert_eq!(o.state, ExitState::Exited(0));
        // A child that never reads a large input does not block completion.
        let mut spec = sh("exit 0");
        spec.stdin = Some(vec![b'x'; 10 << 20]);
        assert_eq!(run_ok(spec).await.state, ExitState::Exited(0));
    }

    #[test]
    fn capture_keeps_head_and_tail() {
        let mut c = Capture::new(10);
        c.push(b"0123");
        c.push(b"456789abcdef");
        c.push(b"gh");
        let got = c.finish();
        assert_eq!(got.total_bytes, 18);
        assert!(got.truncated);
        assert_eq!(got.text, "01234\n... (8 bytes truncated) ...\ndefgh");

        let mut c = Capture::new(10);
        c.push(b"0123456789");
        let got = c.finish();
        assert_eq!(got.text, "0123456789");
        assert!(!got.truncated);

        let mut c = Capture::new(0);
        c.push(b"abc");
        assert_eq!(c.finish().text, "\n... (3 bytes truncated) ...\n");
    }
}
