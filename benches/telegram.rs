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

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::telegram::FakeTelegram;

mod common;
use common::{proc_stats, start_daemon, stop_daemon, ProcStats};

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
        let mut daemon = start_daemon(&config);
        while tg.calls("getUpdates").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let ProcStats { rss: rss0, switches: sw0, .. } = proc_stats(daemon.id());
        let polls0 = tg.calls("getUpdates").len();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let ProcStats { rss: rss1, switches: sw1, .. } = proc_stats(daemon.id());
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
        let ProcStats { rss: rss2, hwm, .. } = proc_stats(daemon.id());
        println!(
            "one message → turn → answer: {:.1} ms; RSS after {rss2} KiB (peak {hwm} KiB)",
            rtt.as_secs_f64() * 1e3
        );
        stop_daemon(&mut daemon);
    });
}
