//! Benchmarks of the MQTT channel (figures go to BENCHMARKS.md).
//!
//! A release `bramble run` as a real process, connected to Debian's mosquitto
//! on 127.0.0.1, answering through a zero-latency fake OpenAI server.
//!
//! 1. Idle RSS with MQTT connected (after `BENCH_IDLE_SECS`, default 5).
//! 2. `<prefix>/in` → reply round trips per second, 4 sessions in parallel,
//!    each sending its next message when the previous answer arrived.
//! 3. CPU time of the daemon per turn (user + system from `/proc/<pid>/stat`,
//!    so MQTT, the agent, the session append with fsync and the outbox write
//!    are all counted; the broker and the fake server are other processes/threads).
//!
//! 4. Latency of each round trip (p50, p99), and with `BENCH_STRACE=1` the
//!    fsync/fdatasync calls per reply (`strace -f -c` attached to the daemon
//!    for the measured run only; strace slows the daemon, so throughput and
//!    latency of that run are not comparable).
//!
//! Run: `cargo bench --bench mqtt` (needs mosquitto: `apt-get install mosquitto`);
//! `BENCH_BROKER_NODELAY=1` starts the broker with `set_tcp_nodelay true`.
//! The state directory is under `$TMPDIR` (default `/tmp`): compare a disk
//! (`TMPDIR=/var/tmp`) with a RAM disk (`TMPDIR=/dev/shm`).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

use support::daemon::Daemon;
use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::mosquitto::{Mosquitto, Watcher};
use support::setup::TestHome;

mod common;
use common::proc_field;

const SESSIONS: usize = 4;
const TURNS_PER_SESSION: usize = 250;
const WARMUP_PER_SESSION: usize = 5;

/// User + system CPU time of a process, from `/proc/<pid>/stat` (in clock ticks).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which is in parentheses): utime is the 14th field overall.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn main() {
    bramble::install_crypto();
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let fake = server_rt.block_on(FakeLlm::start(Dialect::OpenAi));
    // Twice what the turns need: long sessions are consolidated now and then (one model call each).
    for _ in 0..2 * SESSIONS * (TURNS_PER_SESSION + WARMUP_PER_SESSION) {
        fake.push(Reply::text("pong"));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        // Debian's mosquitto.conf leaves Nagle on: with BENCH_BROKER_NODELAY=1
        // the broker sets TCP_NODELAY (`set_tcp_nodelay true`).
        let nodelay = std::env::var("BENCH_BROKER_NODELAY").is_ok_and(|v| v == "1");
        let broker = Mosquitto::start_with(if nodelay { "set_tcp_nodelay true" } else { "" }).await;
        println!("broker: mosquitto, set_tcp_nodelay {nodelay}");
        let extra = format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [mqtt]\nurl = \"{}\"\ndevice = \"bench\"\ndiscovery = true\n",
            broker.url()
        );
        let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
        let log = home.path().join("daemon.log");
        // Info level, as a board runs it (the test helper's default is debug).
        let level = std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "info".into());
        let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, &[("RUST_LOG", level.as_ref())]);
        let pid = daemon.child.id().expect("pid");
        let status = Watcher::start(broker.port, &["bramble/bench/status"]).await;
        assert!(status.wait_last(20, "bramble/bench/status", "online").await, "daemon connected");

        // 1. Idle RSS, connected.
        let idle: u64 = std::env::var("BENCH_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let rss = proc_field(pid, "status", "VmRSS:").expect("VmRSS");
        println!("bramble run, MQTT connected, idle {idle} s: VmRSS {rss} KiB ({:.2} MB)", rss as f64 / 1000.0);

        // 2 and 3. Round trips.
        let mut opts = MqttOptions::new("bench-client", "127.0.0.1", broker.port);
        opts.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut events) = AsyncClient::new(opts, 100);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        events.set_network_options(net);
        let mut routes: HashMap<String, mpsc::UnboundedSender<()>> = HashMap::new();
        let mut inboxes = Vec::new();
        for k in 0..SESSIONS {
            let (tx, rx) = mpsc::unbounded_channel();
            routes.insert(format!("bench/reply/{k}"), tx);
            inboxes.push(rx);
        }
        client.subscribe("bench/reply/+", QoS::AtLeastOnce).await.expect("subscribe");
        let (subscribed_tx, mut subscribed) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Some(tx) = routes.get(&p.topic) {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => panic!("bench client: {e}"),
                }
            }
        });
        subscribed.recv().await.expect("suback");

        let session = |k: usize, n: usize, mut inbox: mpsc::UnboundedReceiver<()>| {
            let client = client.clone();
            async move {
                let mut took = Vec::with_capacity(n);
                for i in 0..n {
                    let msg = format!(r#"{{"text":"ping {i}","session":"s{k}","reply_to":"bench/reply/{k}"}}"#);
                    let sent = Instant::now();
                    client.publish("bramble/bench/in", QoS::AtLeastOnce, false, msg).await.expect("publish");
                    inbox.recv().await.expect("reply");
                    took.push(sent.elapsed());
                }
                (inbox, took)
            }
        };
        // Warm-up.
        let warm: Vec<_> = inboxes.into_iter().enumerate().map(|(k, inbox)| session(k, WARMUP_PER_SESSION, inbox)).collect();
        let inboxes: Vec<_> = join_all(warm).await.into_iter().map(|(inbox, _)| inbox).collect();

        let strace = std::env::var("BENCH_STRACE").is_ok_and(|v| v == "1").then(|| {
            let out = home.path().join("strace.txt");
            // -y: each call with its file's path, to tell which writes they were.
            let child = std::process::Command::new("strace")
                .args(["-f", "-y", "-e", "trace=fsync,fdatasync,sync_file_range", "-o"])
                .arg(&out)
                .args(["-p", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("strace (apt-get install strace)");
            // Attached once it has printed its first line; a short wait is enough here.
            std::thread::sleep(Duration::from_millis(500));
            (child, out)
        });
        let cpu0 = cpu_ticks(pid);
        let t0 = Instant::now();
        let runs: Vec<_> =
            inboxes.into_iter().enumerate().map(|(k, inbox)| session(k, TURNS_PER_SESSION, inbox)).collect();
        let mut took: Vec<Duration> = join_all(runs).await.into_iter().flat_map(|(_, t)| t).collect();
        let wall = t0.elapsed();
        let cpu = cpu_ticks(pid) - cpu0;
        let turns = SESSIONS * TURNS_PER_SESSION;
        if let Some((child, out)) = strace {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let _ = child.wait_with_output();
            let trace = std::fs::read_to_string(&out).unwrap_or_default();
            // Lines like `1234  fdatasync(7</tmp/x/state/sessions/s0.jsonl>) = 0`: count by file,
            // session files as one.
            let mut by_file: std::collections::BTreeMap<String, u64> = Default::default();
            for l in trace.lines().filter(|l| l.contains("sync") && l.contains('<') && !l.contains("resumed")) {
                let path = l.split('<').nth(1).and_then(|p| p.split('>').next()).unwrap_or("?");
                let name = std::path::Path::new(path).file_name().map_or("?".into(), |n| n.to_string_lossy().into_owned());
                let name = if path.contains("/sessions/") { "sessions/*.jsonl".to_string() } else { name };
                let call = l.split_whitespace().nth(1).and_then(|c| c.split('(').next()).unwrap_or("?");
                *by_file.entry(format!("{call} {name}")).or_default() += 1;
            }
            let calls: u64 = by_file.values().sum();
            for (what, n) in &by_file {
                println!("  {n:6} {what}");
            }
            println!("fsync + fdatasync calls: {calls} for {turns} replies = {:.2} per reply", calls as f64 / turns as f64);
        }
        took.sort();
        let pct = |p: f64| took[((took.len() as f64 * p) as usize).min(took.len() - 1)].as_secs_f64() * 1000.0;
        println!("round trip latency: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", pct(0.5), pct(0.99), pct(1.0));
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        println!(
            "<prefix>/in -> reply, {SESSIONS} sessions in parallel, {turns} turns: {:.0} round trips/s ({:.2} ms wall per turn)",
            turns as f64 / wall.as_secs_f64(),
            wall.as_secs_f64() * 1000.0 / turns as f64
        );
        println!("daemon CPU (user+sys) per turn: {:.2} ms", cpu as f64 / hz * 1000.0 / turns as f64);
        let rss_after = proc_field(pid, "status", "VmRSS:").expect("VmRSS");
        let hwm = proc_field(pid, "status", "VmHWM:").expect("VmHWM");
        println!("after the load: VmRSS {rss_after} KiB, peak (VmHWM) {hwm} KiB");
        daemon.stop().await;
        if let Ok(keep) = std::env::var("BENCH_KEEP_LOG") {
            let _ = std::fs::copy(&log, keep);
        }
    });
}

/// Run the sessions as tasks; their inboxes come back in order.
async fn join_all<F>(futs: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("session task"));
    }
    out
}
