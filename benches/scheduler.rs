//! Scheduler benchmarks (figures go to BENCHMARKS.md). Runs the release
//! `bramble run` as a real process.
//!
//! 1. Idle daemon with 100 jobs: RSS, and wake-ups per minute counted as the
//!    context switches of all its threads (`/proc/<pid>/task/*/status`) over
//!    `BENCH_IDLE_SECS` (default 60) with nothing due.
//! 2. 10,000 jobs: time to load `jobs.json`; RSS of the idle daemon holding them.
//! 3. Firing jitter: 200 reminders due at the same second; started − scheduled
//!    from each job's run record (p50, p99, max).
//!
//! Run: `cargo bench --bench scheduler`.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use bramble::bus::Target;
use bramble::scheduler::{Job, JobKind, JobStore, Schedule};
use common::{proc_stats, start_daemon, stop_daemon, switches_between, thread_switches, ProcStats};

fn main() {
    let idle_secs: u64 = std::env::var("BENCH_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let tz = jiff::tz::TimeZone::UTC;

    // 1. Idle with 100 jobs, none due within the next minutes.
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path());
    let store = JobStore::open(&state(dir.path()));
    let now = jiff::Timestamp::now();
    store
        .update(|jobs| {
            for i in 0..100 {
                let schedule = match i % 3 {
                    0 => Schedule::Cron { expr: format!("{} 3 * * *", i % 60), tz: Some("Europe/Berlin".into()) },
                    1 => Schedule::Every { every: "6h".parse().expect("dur"), anchor: now },
                    _ => Schedule::at(now.checked_add(jiff::SignedDuration::from_hours(48 + i)).expect("time")),
                };
                let kind = JobKind::Remind { text: format!("reminder {i}") };
                jobs.push(Job::new(&format!("job{i}"), schedule, kind, vec![Target::Log], now, &tz).expect("job"));
            }
            Ok(())
        })
        .expect("store");
    let mut daemon = start_daemon(&dir.path().join("config.toml"));
    std::thread::sleep(Duration::from_secs(3));
    let (ProcStats { rss: rss0, .. }, threads0) = (proc_stats(daemon.id()), thread_switches(daemon.id()));
    std::thread::sleep(Duration::from_secs(idle_secs));
    let (ProcStats { rss: rss1, .. }, threads1) = (proc_stats(daemon.id()), thread_switches(daemon.id()));
    stop_daemon(&mut daemon);
    let per_min = switches_between(&threads0, &threads1) as f64 * 60.0 / idle_secs as f64;
    println!("idle daemon, 100 jobs, {idle_secs} s:");
    println!("  RSS {} KiB after start, {} KiB after idling", rss0, rss1);
    println!("  wake-ups (context switches, all threads) {per_min:.1} per minute");

    // 2. 10,000 jobs.
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path());
    let store = JobStore::open(&state(dir.path()));
    store
        .update(|jobs| {
            for i in 0..10_000 {
                let schedule = Schedule::Cron { expr: format!("{} {} * * *", i % 60, i % 24), tz: None };
                let kind = JobKind::Message { text: format!("check sensor {i} and report anything unusual") };
                jobs.push(Job::new(&format!("job{i}"), schedule, kind, vec![Target::Log], now, &tz).expect("job"));
            }
            Ok(())
        })
        .expect("store");
    let size = std::fs::metadata(store.path()).map(|m| m.len()).unwrap_or(0);
    let t0 = Instant::now();
    let n = store.load().expect("load").len();
    let load = t0.elapsed();
    let mut daemon = start_daemon(&dir.path().join("config.toml"));
    std::thread::sleep(Duration::from_secs(5));
    let rss = proc_stats(daemon.id()).rss;
    stop_daemon(&mut daemon);
    println!("10,000 jobs ({} KiB jobs.json):", size / 1024);
    println!("  load {n} jobs in {load:?} (in process)");
    println!("  idle daemon RSS {rss} KiB");

    // 3. A burst: 200 reminders due at the same second.
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path());
    let store = JobStore::open(&state(dir.path()));
    let mut daemon = start_daemon(&dir.path().join("config.toml"));
    std::thread::sleep(Duration::from_secs(1));
    let due = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 3).expect("time");
    store
        .update(|jobs| {
            for i in 0..200 {
                let kind = JobKind::Remind { text: format!("burst {i}") };
                let schedule = Schedule::at(due);
                jobs.push(Job::new(&format!("burst{i}"), schedule, kind, vec![Target::Log], now, &tz).expect("job"));
            }
            Ok(())
        })
        .expect("store");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut jitters: Vec<i64> = Vec::new();
    while Instant::now() < deadline {
        let jobs = store.list().expect("list");
        jitters = jobs
            .iter()
            .filter_map(|j| j.state.history.front())
            .map(|r| r.started.duration_since(r.scheduled).as_micros() as i64)
            .collect();
        if jitters.len() == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_daemon(&mut daemon);
    jitters.sort_unstable();
    let pct = |p: usize| jitters.get(jitters.len().saturating_sub(1) * p / 100).copied().unwrap_or(-1);
    println!("burst of 200 reminders due at the same second ({} ran):", jitters.len());
    println!("  start jitter p50 {} µs, p99 {} µs, max {} µs", pct(50), pct(99), pct(100));
}

fn state(home: &Path) -> std::path::PathBuf {
    home.join("state")
}

fn write_config(home: &Path) {
    let text = format!(
        "[agent]\nworkspace = \"{}\"\n[daemon]\nstate_dir = \"{}\"\nclock_sync_wait = \"0s\"\nlog_level = \"warn\"\n",
        home.join("ws").display(),
        state(home).display()
    );
    std::fs::write(home.join("config.toml"), text).expect("config");
}
