//! Telegram benchmark (figures go to BENCHMARKS.md): a release `bramble run`
//! long-polling a fake Bot API on 127.0.0.1 (the fake holds each `getUpdates`
//! for its full 50 s, as Telegram does when nothing happens).
//!
//! 1. Idle: RSS, and wake-ups per minute as the context switches of all the
//!    daemon's threads over `BENCH_IDLE_SECS` (default 120), with the number
//!    of polls in that time.
//! 2. One message → one turn against a zero-latency fake LLM → one answer:
//!    round-trip time and RSS afterwards (and the peak, VmHWM).
//! 3. The daemon's CPU per turn (utime + stime from `/proc/<pid>/stat`) over
//!    `BENCH_TURNS` (default 50) text messages, voice notes (a real espeak-ng +
//!    opusenc recording when those are installed, transcribed by an instant fake
//!    in this process: the provider's time is not the daemon's) and photos.
//!
//! `BENCH_NO_MEDIA=1` leaves out `[transcription]` and part 3 (to measure a
//! binary from before voice notes). `BENCH_MQTT=1` also connects the daemon to
//! a real mosquitto (`[mqtt]`, discovery on), and `BENCH_JOBS=N` gives it N
//! jobs (cron / every / at, none due in the idle window), for the idle figures
//! with Telegram, MQTT and jobs together; idle RSS also prints PSS and
//! anonymous memory from `smaps_rollup`.
//!
//! Run: `cargo bench --bench telegram`. `BRAMBLE_BIN=target/release/bramble`
//! measures a binary built by `cargo build --release` instead of the bench build.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::http::{Response, TestServer};
use support::mosquitto::Mosquitto;
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
        let no_media = std::env::var_os("BENCH_NO_MEDIA").is_some();
        let whisper = TestServer::start(|_| Response::json(200, &serde_json::json!({"text": "what is the temperature"}))).await;
        let broker = match std::env::var("BENCH_MQTT").is_ok_and(|v| v == "1") {
            true => Some(Mosquitto::start().await),
            false => None,
        };
        let jobs: usize = std::env::var("BENCH_JOBS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        write_jobs(&dir.path().join("state"), jobs);
        let config = dir.path().join("config.toml");
        let text = format!(
            "[agent]\nmodel = \"m\"\nworkspace = \"{ws}\"\nhistory_messages = 200\n[provider]\nbase_url = \"{llm}\"\napi_key = \"k\"\n\
             [heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"7\", \"8\", \"9\"]\napi_base = \"{tg}\"\n\
             {transcription}{mqtt}\
             [daemon]\nstate_dir = \"{st}\"\nlog_level = \"{level}\"\n",
            ws = dir.path().join("ws").display(),
            llm = llm.base_url(),
            tg = tg.url(),
            transcription = if no_media {
                String::new()
            } else {
                format!("[transcription]\nkind = \"openai\"\nbase_url = \"{}/v1\"\n", whisper.url())
            },
            mqtt = broker.as_ref().map(|b| format!("[mqtt]\nurl = \"{}\"\ndevice = \"bench\"\n", b.url())).unwrap_or_default(),
            st = dir.path().join("state").display(),
            level = std::env::var("BENCH_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
        );
        std::fs::write(&config, text).expect("config");
        let mut daemon = start_daemon(&config);
        while tg.calls("getUpdates").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // tokio's blocking threads of the start-up exit after 10 s idle, taking
        // their switch counts with them, and the daemon lets go of its
        // start-up pages 20 s after the start: measure after both. With MQTT,
        // `BENCH_SETTLE_SECS=330` starts after rumqttc's one keep-alive ping
        // (5 min after connecting; the daemon pings itself from then on).
        let settle: u64 = std::env::var("BENCH_SETTLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(35);
        tokio::time::sleep(Duration::from_secs(settle)).await;
        let before = proc_stats(daemon.id());
        let ProcStats { rss: rss0, switches: sw0, voluntary: vol0, .. } = before;
        let polls0 = tg.calls("getUpdates").len();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let after = proc_stats(daemon.id());
        let ProcStats { rss: rss1, switches: sw1, voluntary: vol1, .. } = after;
        let polls = tg.calls("getUpdates").len() - polls0;
        let per_min = sw1.saturating_sub(sw0) as f64 * 60.0 / idle_secs as f64;
        let voluntary_per_min = vol1.saturating_sub(vol0) as f64 * 60.0 / idle_secs as f64;
        println!(
            "idle daemon long-polling Telegram{}, {jobs} jobs, {idle_secs} s:",
            if broker.is_some() { ", MQTT connected" } else { "" }
        );
        println!("  RSS {rss0} KiB after start, {rss1} KiB after idling");
        let anon = common::proc_field(daemon.id(), "status", "RssAnon:").unwrap_or(0);
        let file = common::proc_field(daemon.id(), "status", "RssFile:").unwrap_or(0);
        let pss = common::proc_field(daemon.id(), "smaps_rollup", "Pss:").unwrap_or(0);
        let pss_anon = common::proc_field(daemon.id(), "smaps_rollup", "Pss_Anon:").unwrap_or(0);
        println!("  of which anonymous {anon} KiB, file-backed (the binary's pages, libc) {file} KiB; PSS {pss} KiB (anonymous {pss_anon} KiB)");
        let parts: Vec<String> = common::rss_by_mapping(daemon.id())
            .iter()
            .take(6)
            .map(|(name, rss, pss)| format!("{name} {rss}/{pss}"))
            .collect();
        println!("  by mapping, RSS/PSS KiB: {}", parts.join(", "));
        println!(
            "  page faults while idle: {} minor, {} major (read from the disk)",
            after.minor_faults.saturating_sub(before.minor_faults),
            after.major_faults.saturating_sub(before.major_faults)
        );
        println!(
            "  wake-ups (context switches, all threads) {per_min:.1} per minute, {voluntary_per_min:.1} of them voluntary; \
             {polls} getUpdates in that time (from {settle} s after the start)"
        );

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
        if no_media {
            stop_daemon(&mut daemon);
            return;
        }
        // 3. CPU per turn, by kind of message.
        let turns: usize = std::env::var("BENCH_TURNS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
        let audio = recording().unwrap_or_else(|| {
            println!("  (espeak-ng/opusenc not installed: a synthetic 12 KB OGG stands in for the recording)");
            let mut a = b"OggS".to_vec();
            a.resize(12 * 1024, 7);
            a
        });
        tg.add_file("voice", audio.clone(), None, 0);
        tg.add_file("photo", vec![0xff; 90 * 1024], None, 0);
        // Each kind in its own chat (users 7, 8, 9), so each session grows the same way;
        // `history_messages = 200` keeps consolidation (an extra model call) out of the figures.
        let who = |id: i64| {
            (serde_json::json!({"id": id, "type": "private"}), serde_json::json!({"id": id, "is_bot": false, "first_name": "u"}))
        };
        let ((c7, f7), (c8, f8), (c9, f9)) = (who(7), who(8), who(9));
        let kinds: [(&str, serde_json::Value); 3] = [
            ("text", serde_json::json!({"chat": c7, "from": f7, "text": "what is the temperature"})),
            ("voice note", serde_json::json!({"chat": c8, "from": f8, "voice": {"file_id": "voice", "file_unique_id": "v",
                "duration": 2, "mime_type": "audio/ogg", "file_size": audio.len()}})),
            ("photo (90 KB)", serde_json::json!({"chat": c9, "from": f9, "caption": "what is this",
                "photo": [{"file_id": "photo", "file_unique_id": "p", "width": 1280, "height": 960, "file_size": 92160}]})),
        ];
        let mut sent = tg.sent().len();
        for (name, message) in kinds {
            let cpu0 = cpu_ticks(daemon.id());
            let t = Instant::now();
            for _ in 0..turns {
                llm.push(Reply::text("21 °C"));
                tg.push(message.clone());
                sent += 1;
                assert!(tg.wait_sent(sent, 30).await, "answered");
            }
            let cpu = cpu_ticks(daemon.id()) - cpu0;
            let per_turn = cpu as f64 * 1e3 / ticks_per_second() as f64 / turns as f64;
            println!(
                "{name}: {turns} turns, daemon CPU {per_turn:.2} ms per turn, {:.1} ms wall per turn",
                t.elapsed().as_secs_f64() * 1e3 / turns as f64
            );
        }
        let ProcStats { rss: rss3, hwm: hwm3, .. } = proc_stats(daemon.id());
        println!("after the media turns: RSS {rss3} KiB (peak {hwm3} KiB)");
        stop_daemon(&mut daemon);
    });
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let f: Vec<&str> = stat.rsplit_once(')').expect("comm").1.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// A real voice note: espeak-ng's speech, encoded to OGG/Opus by opusenc.
fn recording() -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().ok()?;
    let (wav, ogg) = (dir.path().join("v.wav"), dir.path().join("v.ogg"));
    let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
    if !ok(std::process::Command::new("espeak-ng").arg("-w").arg(&wav).arg("what is the temperature in the garden")) {
        return None;
    }
    if !ok(std::process::Command::new("opusenc").arg("--quiet").arg(&wav).arg(&ogg)) {
        return None;
    }
    std::fs::read(&ogg).ok()
}

/// `n` jobs in the state directory's `jobs.json`, none due in the next hours:
/// a third daily cron jobs at 03:xx Berlin time, a third every 6 h, a third
/// one-shots two days or more ahead (as the scheduler bench).
fn write_jobs(state: &std::path::Path, n: usize) {
    use bramble::bus::Target;
    use bramble::scheduler::{Job, JobKind, JobStore, Schedule};
    if n == 0 {
        return;
    }
    let tz = jiff::tz::TimeZone::UTC;
    let now = jiff::Timestamp::now();
    let away = (now.to_zoned(jiff::tz::TimeZone::UTC).hour() + 12) % 24;
    JobStore::open(state)
        .update(|jobs| {
            for i in 0..n {
                let schedule = match i % 3 {
                    // Half a day away, whatever the hour of the run: none runs in the bench.
                    0 => Schedule::Cron { expr: format!("{} {away} * * *", i % 60), tz: Some("UTC".into()) },
                    1 => Schedule::Every { every: "6h".parse().expect("dur"), anchor: now },
                    _ => Schedule::at(now.checked_add(jiff::SignedDuration::from_hours(48 + i as i64)).expect("time")),
                };
                let kind = JobKind::Remind { text: format!("reminder {i}") };
                jobs.push(Job::new(&format!("job{i}"), schedule, kind, vec![Target::Log], now, &tz).expect("job"));
            }
            Ok(())
        })
        .expect("jobs");
}
