//! A process's idle cost from `/proc`: its wake-ups (voluntary context
//! switches of all its threads, `/proc/<pid>/task/*/status`) and its RSS.

use std::collections::HashMap;

/// One reading of a process.
pub struct Sample {
    /// Voluntary context switches per thread id.
    switches: HashMap<String, u64>,
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
}

fn field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// Read process `pid` now.
pub fn sample(pid: u32) -> Sample {
    let mut switches = HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches.insert(task.file_name().to_string_lossy().into_owned(), field(&status, "voluntary_ctxt_switches:"));
    }
    let rss_kib = field(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(), "VmRSS:");
    Sample { switches, rss_kib }
}

impl Sample {
    /// Wake-ups since `earlier`: threads that came meanwhile count whole;
    /// those that left are not seen (a blocking-pool thread idles out).
    pub fn woke_since(&self, earlier: &Sample) -> u64 {
        self.switches.iter().map(|(t, n)| n.saturating_sub(earlier.switches.get(t).copied().unwrap_or(0))).sum()
    }
}
