//! Start-up benchmark: time from exec of `bramble run` to its `READY=1`, as
//! systemd sees it with `Type=notify` (figures go to BENCHMARKS.md).
//!
//! The bench plays systemd's part: it binds a datagram socket, passes it as
//! `NOTIFY_SOCKET`, starts the release binary and waits for the datagram with
//! `READY=1`; then it stops the daemon with SIGTERM and starts the next one.
//! No network waits: no provider key, no Telegram or MQTT, `clock_sync_wait = "0s"`,
//! a workspace from the templates and 20 jobs in the state directory.
//! Also prints the idle RSS of the last daemon, 2 s after READY.
//!
//! Run: `cargo bench --bench ready` (`BENCH_RUNS`, default 100;
//! `BENCH_JOBS=10000` for many jobs: the 20 added with `bramble cron add`
//! are copied with new ids, names and cron expressions).

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    let config = home.join("config.toml");
    let text = format!(
        "[agent]\nworkspace = \"{}\"\n[daemon]\nstate_dir = \"{}\"\nclock_sync_wait = \"0s\"\nlog_level = \"warn\"\n",
        home.join("ws").display(),
        home.join("state").display()
    );
    std::fs::write(&config, text).expect("config");
    let status = Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", config.to_str().expect("utf-8 path"), "init"])
        .stdout(Stdio::null())
        .status()
        .expect("bramble init");
    assert!(status.success(), "bramble init failed");
    for i in 0..20 {
        let status = Command::new(env!("CARGO_BIN_EXE_bramble"))
            .args(["--config", config.to_str().expect("utf-8 path"), "cron", "add", &format!("job{i}")])
            .args(["--cron", &format!("{} 3 * * *", i), "--remind", "bench"])
            .stdout(Stdio::null())
            .status()
            .expect("bramble cron add");
        assert!(status.success(), "bramble cron add failed");
    }

    let jobs: usize = std::env::var("BENCH_JOBS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    if jobs > 20 {
        let path = home.join("state/jobs.json");
        let mut file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("jobs.json")).expect("json");
        let list = file["jobs"].as_array_mut().expect("jobs");
        let model = list.clone();
        for i in 20..jobs {
            let mut j = model[i % model.len()].clone();
            j["id"] = format!("{:08x}", 0x1000_0000 + i).into();
            j["name"] = format!("job{i}").into();
            j["schedule"]["expr"] = format!("{} {} * * *", i % 60, i / 60 % 24).into();
            list.push(j);
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&file).expect("json")).expect("write jobs.json");
    }

    let sock_path = home.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut times = Vec::with_capacity(runs);
    let mut rss_kib = 0;
    for run in 0..runs {
        let t0 = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_bramble"))
            .args(["--config", config.to_str().expect("utf-8 path"), "run"])
            .env("NOTIFY_SOCKET", &sock_path)
            .env_remove("RUST_LOG")
            .env_remove("WATCHDOG_USEC")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn bramble run");
        wait_for(&sock, "READY=1");
        times.push(t0.elapsed());
        if run + 1 == runs {
            std::thread::sleep(Duration::from_secs(2));
            rss_kib = common::proc_field(child.id(), "status", "VmRSS:").unwrap_or(0);
        }
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        wait_for(&sock, "STOPPING=1");
        let _ = child.wait();
    }
    times.sort_unstable();
    let pct = |p: usize| times[(times.len() - 1) * p / 100];
    println!("exec → READY=1, {runs} runs ({jobs} jobs, no network):");
    println!(
        "  p50 {:.1} ms, p95 {:.1} ms, min {:.1} ms, max {:.1} ms",
        ms(pct(50)),
        ms(pct(95)),
        ms(pct(0)),
        ms(pct(100))
    );
    println!("idle RSS 2 s after READY: {} KiB", rss_kib);
}

/// Read datagrams until one carries `what` (panics after the socket's timeout).
fn wait_for(sock: &UnixDatagram, what: &str) {
    let mut buf = [0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no {what} from bramble run: {e}"));
        if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == what) {
            return;
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
