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

/// Resident memory by what it maps (`/proc/PID/smaps`): the binary, each
/// library, and anonymous memory (heap, stacks, relocated data), as
/// `(name, Rss KiB, Pss KiB)`, largest first.
pub fn rss_by_mapping(pid: u32) -> Vec<(String, u64, u64)> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else { return Vec::new() };
    let mut sums: Vec<(String, u64, u64)> = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            // A mapping's header: address range, perms, offset, dev, inode, path.
            let path = words.nth(4).unwrap_or("[anonymous]");
            current = path.rsplit('/').next().unwrap_or(path).to_string();
            continue;
        }
        let slot = match sums.iter().position(|(n, _, _)| *n == current) {
            Some(i) => i,
            None => {
                sums.push((current.clone(), 0, 0));
                sums.len() - 1
            }
        };
        match first {
            "Rss:" => sums[slot].1 += field(line, "Rss:").unwrap_or(0),
            "Pss:" => sums[slot].2 += field(line, "Pss:").unwrap_or(0),
            _ => {}
        }
    }
    sums.retain(|(_, rss, _)| *rss > 0);
    sums.sort_by_key(|s| std::cmp::Reverse(s.1));
    sums
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
    /// Page faults served from memory (the page cache, zeroed pages), all threads.
    pub minor_faults: u64,
    /// Page faults that read from the disk: each one a wait.
    pub major_faults: u64,
}

/// Context switches (voluntary + not) of each thread of `pid`, by thread id.
pub fn thread_switches(pid: u32) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else { continue };
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let n = field(&s, "voluntary_ctxt_switches:").unwrap_or(0)
                + field(&s, "nonvoluntary_ctxt_switches:").unwrap_or(0);
            out.insert(tid, n);
        }
    }
    out
}

/// The switches between two [`thread_switches`] readings: per thread alive at
/// the second, less what it had at the first. A thread that ended in between
/// (tokio's idle blocking threads end after 10 s) is not counted: summing all
/// threads at both ends would go below zero when one ends.
pub fn switches_between(
    before: &std::collections::BTreeMap<u32, u64>,
    after: &std::collections::BTreeMap<u32, u64>,
) -> u64 {
    after.iter().map(|(tid, n)| n.saturating_sub(before.get(tid).copied().unwrap_or(0))).sum()
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
    // /proc/PID/stat after the command's name: state is field 3, minflt 10, majflt 12.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let stat_field = |n: usize| after_name.get(n - 3).and_then(|v| v.parse().ok()).unwrap_or(0);
    ProcStats {
        rss: field(&status, "VmRSS:").unwrap_or(0),
        hwm: field(&status, "VmHWM:").unwrap_or(0),
        switches,
        voluntary,
        minor_faults: stat_field(10),
        major_faults: stat_field(12),
    }
}
