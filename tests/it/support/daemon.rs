//! A real `bramble run` process for tests: started with a clean environment,
//! stopped with real signals, its log collected in a file that tests can wait
//! on (`wait_log`): a test waits for what the daemon says it did, with a
//! deadline, not for a fixed time.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

pub struct Daemon {
    pub child: tokio::process::Child,
    /// Where its stderr goes.
    log: std::path::PathBuf,
    /// Holds the log file when the test did not name one.
    _own_log: Option<tempfile::TempDir>,
}

impl Daemon {
    /// `bramble run` with HOME at `home` and the given config (None: no config file at all).
    pub fn start(home: &Path, config: Option<&Path>) -> Daemon {
        let dir = tempfile::tempdir().expect("a temp dir for the log");
        let log = dir.path().join("bramble-run.log");
        let mut d = Daemon::start_with_env(home, config, &log, &[]);
        d._own_log = Some(dir);
        d
    }

    /// Like [`start`](Daemon::start), with the log written to `log` (for long
    /// runs: a pipe nobody reads would fill up and stall the daemon).
    pub fn start_logging_to(home: &Path, config: Option<&Path>, log: &Path) -> Daemon {
        Daemon::start_with_env(home, config, log, &[])
    }

    /// Like [`start_logging_to`](Daemon::start_logging_to), with more environment variables.
    pub fn start_with_env(home: &Path, config: Option<&Path>, log: &Path, env: &[(&str, &Path)]) -> Daemon {
        let file = std::fs::File::create(log).expect("log file");
        let child = Daemon::spawn(home, config, file.into(), env);
        Daemon { child, log: log.to_path_buf(), _own_log: None }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait up to `secs` until the log holds `needle` at least `times` times.
    pub async fn wait_log_count(&self, needle: &str, times: usize, secs: u64) -> bool {
        wait_until(secs, || self.log().matches(needle).count() >= times).await
    }

    /// Wait up to `secs` until the log holds `needle`.
    pub async fn wait_log(&self, needle: &str, secs: u64) -> bool {
        self.wait_log_count(needle, 1, secs).await
    }

    /// Wait until the scheduler has planned every job and gone to sleep: a job
    /// due now would have been started before this line.
    pub async fn scheduler_idle(&self) {
        assert!(self.wait_log("scheduler sleeping", 20).await, "the scheduler went to sleep: {}", self.log());
    }

    fn spawn(home: &Path, config: Option<&Path>, stderr: Stdio, env: &[(&str, &Path)]) -> tokio::process::Child {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        cmd.arg("run")
            .env_clear()
            .env("HOME", home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .kill_on_drop(true);
        cmd.spawn().expect("spawn bramble run")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Wait for the daemon to exit on its own (up to `secs`): its status and log.
    pub async fn exited(mut self, secs: u64) -> (Option<i32>, String) {
        let status = tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .expect("the daemon exits by itself")
            .expect("exit status");
        (status.code(), self.log())
    }

    /// Wait until the daemon catches SIGTERM and SIGHUP (`SigCgt` in
    /// /proc), so a signal is never sent before its handler is installed.
    pub async fn handlers_ready(&self) {
        let pid = self.child.id().expect("running");
        let caught = || {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| s.lines().find_map(|l| l.strip_prefix("SigCgt:").map(|v| v.trim().to_string())))
                .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
                .is_some_and(|mask| mask & (1 << 14) != 0 && mask & 1 != 0)
        };
        assert!(wait_until(20, caught).await, "the daemon installed its signal handlers");
    }

    pub async fn signal(&self, sig: nix::sys::signal::Signal) {
        self.handlers_ready().await;
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("running") as i32);
        nix::sys::signal::kill(pid, sig).expect("signal");
    }

    /// SIGTERM, then the exit status and everything it logged.
    pub async fn stop(mut self) -> (Option<i32>, String) {
        self.signal(nix::sys::signal::Signal::SIGTERM).await;
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("daemon stops within 20 s")
            .expect("exit status");
        (status.code(), self.log())
    }
}

/// Poll `check` every 50 ms for up to `secs` seconds.
pub async fn wait_until(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

impl Daemon {
    /// SIGKILL: no goodbye, no last words but the broker's last will.
    pub async fn kill9(mut self) -> String {
        let _ = self.child.start_kill();
        self.child.wait().await.expect("exit status");
        self.log()
    }
}
