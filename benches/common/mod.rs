//! Helpers the benches share: a real `bramble run` process and what
//! `/proc` says about it. (A folder, so cargo does not take it for a bench.)
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `bramble run --config CONFIG`, quiet. `BRAMBLE_BIN` picks another binary
/// (a release build measured by a dev-profile harness).
pub fn start_daemon(config: &Path) -> Child {
    let bin = std::env::var_os("BRAMBLE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_bramble").into());
    Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        // `BENCH_DAEMON_LOG=FILE`: the daemon's log (its `log_level` still applies).
        .stderr(match std::env::var_os("BENCH_DAEMON_LOG") {
            Some(path) => Stdio::from(std::fs::File::create(&path).unwrap_or_else(|e| {
                panic!("BENCH_DAEMON_LOG: cannot create {}: {e}", std::path::Path::new(&path).display())
            })),
            None => Stdio::null(),
        })
        .spawn()
        .expect("spawn bramble run")
}

/// SIGTERM, then wait for the exit.
pub fn stop_daemon(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}

/// The number after `key` in `/proc/<pid>/<file>` (`status`: `VmRSS:` in KiB, …).
pub fn proc_field(pid: u32, file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    field(&text, key)
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A process's memory and how often its threads were woken.
#[derive(Debug, Clone, Copy)]
pub struct ProcStats {
    /// VmRSS, KiB.
    pub rss: u64,
    /// VmHWM (peak RSS), KiB.
    pub hwm: u64,
    /// Voluntary plus involuntary context switches, summed over all threads.
    pub switches: u64,
    /// Of those, the voluntary ones: the threads went to sleep (a wake-up
    /// each); the rest are preemptions, which other load on the machine adds.
    pub voluntary: u64,
}

pub fn proc_stats(pid: u32) -> ProcStats {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let (mut switches, mut voluntary) = (0, 0);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let v = field(&s, "voluntary_ctxt_switches:").unwrap_or(0);
            voluntary += v;
            switches += v + field(&s, "nonvoluntary_ctxt_switches:").unwrap_or(0);
        }
    }
    ProcStats {
        rss: field(&status, "VmRSS:").unwrap_or(0),
        hwm: field(&status, "VmHWM:").unwrap_or(0),
        switches,
        voluntary,
    }
}
