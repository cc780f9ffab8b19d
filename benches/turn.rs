//! Benchmarks of one agent turn (figures go to BENCHMARKS.md).
//!
//! 1. `bramble agent -m` as a user runs it: one turn with one `exec` tool call
//!    against a zero-latency fake OpenAI server on 127.0.0.1. Wall time and
//!    peak RSS of the child process (from `wait4`'s rusage), over many runs.
//! 2. Framework CPU time per turn: many such turns in one process; CPU time of
//!    the agent's thread only (`CLOCK_THREAD_CPUTIME_ID`), so the fake server
//!    (on its own thread) and the `sh` children are not counted.
//!
//! Run: `cargo bench --bench turn` (uses the release profile).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::setup::TestHome;

const CLI_RUNS: usize = 30;
const IN_PROCESS_TURNS: usize = 300;

fn exec_call() -> Reply {
    Reply::ToolCalls(vec![("exec".into(), r#"{"command":"true"}"#.into())])
}

fn main() {
    bramble::install_crypto();
    // The fake server runs on its own runtime thread for the whole benchmark.
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let fake = server_rt.block_on(FakeLlm::start(Dialect::OpenAi));
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");

    // 1. The binary, cold, one turn per process.
    let mut walls = Vec::new();
    let mut rss_kib = Vec::new();
    for run in 0..CLI_RUNS {
        fake.push(exec_call());
        fake.push(Reply::Text("done".into()));
        let (wall, rss) = run_binary(&home, run);
        walls.push(wall);
        rss_kib.push(rss);
    }
    walls.sort();
    rss_kib.sort();
    println!("bramble agent -m (one exec tool call), {CLI_RUNS} runs:");
    println!("  wall time  p50 {:?}  p90 {:?}  min {:?}", walls[CLI_RUNS / 2], walls[CLI_RUNS * 9 / 10], walls[0]);
    println!("  peak RSS   p50 {} KiB  max {} KiB", rss_kib[CLI_RUNS / 2], rss_kib[CLI_RUNS - 1]);

    // 2. Many turns in one process.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (agent, _out) = home.agent();
    for _ in 0..IN_PROCESS_TURNS + 10 {
        fake.push(exec_call());
        fake.push(Reply::Text("done".into()));
    }
    rt.block_on(async {
        // Warm up: connection pool, page cache.
        for i in 0..10 {
            let req = bramble::agent::TurnRequest::cli(format!("warm{i}"), "go");
            agent.turn(req).await.expect("turn");
        }
        let cpu0 = thread_cpu();
        let t0 = Instant::now();
        for i in 0..IN_PROCESS_TURNS {
            // A fresh session each time, so history does not grow the prompt.
            let req = bramble::agent::TurnRequest::cli(format!("bench{i}"), "go");
            agent.turn(req).await.expect("turn");
        }
        let cpu = thread_cpu() - cpu0;
        let wall = t0.elapsed();
        println!("in-process turns (one exec tool call each), {IN_PROCESS_TURNS} turns:");
        println!("  agent-thread CPU per turn {:?}", cpu / IN_PROCESS_TURNS as u32);
        println!("  wall time per turn        {:?}", wall / IN_PROCESS_TURNS as u32);
    });
    drop(fake);
}

/// Run `bramble agent -m` once; wall time and the child's peak RSS in KiB.
// The child is reaped by `wait4` (which also gives its rusage), not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run_binary(home: &TestHome, run: usize) -> (Duration, i64) {
    let t0 = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        // A fresh session per run: one long session would trigger consolidation, which this script does not answer.
        .args(["--config", home.config.to_str().expect("utf-8 path"), "agent", "-m", "go", "-s", &format!("cli{run}")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn bramble");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, zero is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `usage` are valid, exclusively borrowed out-parameters.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = t0.elapsed();
    assert_eq!(rc, pid, "wait4");
    assert!(std::process::ExitStatus::from_raw(status).success(), "bramble agent failed");
    (wall, usage.ru_maxrss)
}

fn thread_cpu() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread CPU clock");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}
