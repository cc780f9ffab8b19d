//! Home Assistant benchmark (figures go to BENCHMARKS.md): a release `bramble
//! run` connected to the fake HA of the tests (`support::fake_ha`: HA's
//! WebSocket protocol on a real RFC 6455 server) with one trigger.
//!
//! 1. Idle RSS and wake-ups with the WebSocket connected and subscribed, after
//!    `BENCH_IDLE_SECS` (default 30), against the same daemon without
//!    `[homeassistant]`: what the connection costs.
//! 2. Events → `exec` trigger runs: `BENCH_EVENTS` (default 50) state changes,
//!    each waiting for its run's line in a file; the daemon's CPU per event.
//!
//! Run: `cargo build --release && BRAMBLE_BIN=$CARGO_TARGET_DIR/release/bramble
//! cargo bench --bench homeassistant --profile dev` (the harness in dev, the
//! daemon the release binary).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::fake_ha::FakeHa;

mod common;
use common::{proc_field, proc_stats, start_daemon, stop_daemon};

const TOKEN: &str = "bench-token";

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = &stat[stat.rfind(')').map(|i| i + 2).unwrap_or(0)..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn main() {
    let idle: u64 = std::env::var("BENCH_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let events: usize = std::env::var("BENCH_EVENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    rt.block_on(async {
        let ha = FakeHa::start(TOKEN).await;
        for with_ha in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let ws = dir.path().join("workspace");
            std::fs::create_dir_all(&ws).expect("workspace");
            let section = if with_ha {
                format!(
                    "[homeassistant]\nurl = \"{}\"\ntoken = \"{TOKEN}\"\nallow = [\"light.*\"]\n\
                     [[homeassistant.trigger]]\nentity_id = \"sensor.bench_*\"\nexec = \"echo x >> runs.txt\"\nmin_interval = \"0s\"\n",
                    ha.url()
                )
            } else {
                String::new()
            };
            let config = dir.path().join("config.toml");
            std::fs::write(
                &config,
                format!(
                    "[agent]\nworkspace = \"{}\"\n[daemon]\nstate_dir = \"{}\"\nclock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n{section}",
                    ws.display(),
                    dir.path().join("state").display()
                ),
            )
            .expect("config");
            let mut child = start_daemon(&config);
            let pid = child.id();
            if with_ha {
                let deadline = Instant::now() + Duration::from_secs(20);
                while ha.subscribed() == 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(ha.subscribed(), 1, "the daemon subscribed");
            }
            // Past the start-up (the sandbox probe runs after READY).
            tokio::time::sleep(Duration::from_secs(2)).await;
            // The runtime thread's wake-ups (blocking-pool threads come and go,
            // taking their counts with them).
            let switches = || {
                proc_field(pid, "status", "voluntary_ctxt_switches:").unwrap_or(0)
                    + proc_field(pid, "status", "nonvoluntary_ctxt_switches:").unwrap_or(0)
            };
            let before = switches();
            tokio::time::sleep(Duration::from_secs(idle)).await;
            let after = proc_stats(pid);
            let woken = switches().saturating_sub(before);
            println!(
                "{}: idle {idle} s: VmRSS {:.2} MB, wake-ups {:.1}/min",
                if with_ha { "with [homeassistant], WebSocket subscribed" } else { "without [homeassistant]" },
                after.rss as f64 / 1000.0,
                woken as f64 * 60.0 / idle as f64
            );
            if with_ha {
                let runs = ws.join("runs.txt");
                let count = || std::fs::read_to_string(&runs).map(|t| t.lines().count()).unwrap_or(0);
                let cpu0 = cpu_ticks(pid);
                let t0 = Instant::now();
                for i in 0..events {
                    ha.state_changed(&format!("sensor.bench_{}", i % 4), &i.to_string(), &(i + 1).to_string(), serde_json::json!({}));
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while count() < i + 1 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                let took = t0.elapsed();
                let ticks = cpu_ticks(pid) - cpu0;
                let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
                println!(
                    "{events} events → {} exec runs in {:.2} s ({:.1} ms each, sandboxed command included); daemon CPU {:.2} ms per event; VmRSS after {:.2} MB",
                    count(),
                    took.as_secs_f64(),
                    took.as_secs_f64() * 1000.0 / events as f64,
                    ticks as f64 / hz * 1000.0 / events as f64,
                    proc_stats(pid).rss as f64 / 1000.0
                );
            }
            stop_daemon(&mut child);
        }
    });
}
