//! Telegram benchmark (figures go to BENCHMARKS.md): a release `bramble run`
//! long-polling a fake Bot API on 127.0.0.1 (the fake holds each `getUpdates`
//! for its full 50 s, as Telegram does when nothing happens).
//!
//! 1. Idle: RSS, and wake-ups per minute as the context switches of all the
//!    daemon's threads over `BENCH_IDLE_SECS` (default 120), with the number
//!    of polls in that time.
//! 2. One message → one turn against a zero-latency fake LLM → one answer:
//!    round-trip time and RSS afterwards (and the peak, VmHWM).
//!
//! Run: `cargo bench --bench telegram`. `BRAMBLE_BIN=target/release/bramble`
//! measures a binary built by `cargo build --release` instead of the bench build.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::telegram::FakeTelegram;

const TOKEN: &str = "1:bench";

fn main() {
    let idle_secs: u64 = std::env::var("BENCH_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    rt.block_on(async {
        let tg = FakeTelegram::start(TOKEN).await;
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.toml");
        let text = format!(
            "[agent]\nmodel = \"m\"\nworkspace = \"{ws}\"\n[provider]\nbase_url = \"{llm}\"\napi_key = \"k\"\n\
             [heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"7\"]\napi_base = \"{tg}\"\n\
             [daemon]\nstate_dir = \"{st}\"\nlog_level = \"warn\"\n",
            ws = dir.path().join("ws").display(),
            llm = llm.base_url(),
            tg = tg.url(),
            st = dir.path().join("state").display(),
        );
        std::fs::write(&config, text).expect("config");
        let mut daemon = start(&config);
        while tg.calls("getUpdates").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (rss0, sw0, _) = proc_stats(daemon.id());
        let polls0 = tg.calls("getUpdates").len();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let (rss1, sw1, _) = proc_stats(daemon.id());
        let polls = tg.calls("getUpdates").len() - polls0;
        let per_min = (sw1 - sw0) as f64 * 60.0 / idle_secs as f64;
        println!("idle daemon long-polling Telegram, {idle_secs} s:");
        println!("  RSS {rss0} KiB after start, {rss1} KiB after idling");
        println!("  wake-ups (context switches, all threads) {per_min:.1} per minute; {polls} getUpdates in that time");

        llm.push(Reply::text("pong"));
        let t = Instant::now();
        tg.push_message(7, "private", 7, "u", "ping");
        assert!(tg.wait_sent(1, 30).await, "answered");
        let rtt = t.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss2, _, hwm) = proc_stats(daemon.id());
        println!(
            "one message → turn → answer: {:.1} ms; RSS after {rss2} KiB (peak {hwm} KiB)",
            rtt.as_secs_f64() * 1e3
        );
        stop(&mut daemon);
    });
}

fn start(config: &Path) -> Child {
    let bin = std::env::var_os("BRAMBLE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_bramble").into());
    Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bramble run")
}

fn stop(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}

/// VmRSS and VmHWM in KiB, and the sum of context switches over all threads.
fn proc_stats(pid: u32) -> (u64, u64, u64) {
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mut switches = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            switches += field(&s, "voluntary_ctxt_switches:") + field(&s, "nonvoluntary_ctxt_switches:");
        }
    }
    (field(&status, "VmRSS:"), switches, field(&status, "VmHWM:"))
}
