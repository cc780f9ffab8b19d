//! Overhead of the exec sandbox per command (figures go to BENCHMARKS.md).
//!
//! Spawn-to-exit of `/bin/true` through `sandbox::process::run`, as the exec
//! tool runs it: plain (`[exec] isolation = "off"`), then through the
//! `bramble sandbox-exec` helper with more and more layers, ending with what
//! `Sandbox::wrap` builds from the default config (every layer this kernel
//! offers) for each `[exec] network`: "all" (the host's network), "none" (an
//! empty network namespace), "internet" (a namespace of its own plus the
//! filtering proxy process: the default where the jail works).
//!
//! Run: `cargo bench --bench sandbox` (release profile; the helper is the
//! release binary).

use std::time::{Duration, Instant};

use bramble::config::{ExecConfig, Network};
use bramble::sandbox::options::Options;
use bramble::sandbox::process::{self, CommandSpec, ExitState};
use bramble::sandbox::Sandbox;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 300;

fn main() {
    let helper = env!("CARGO_BIN_EXE_bramble");
    let ws = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let sandbox = Sandbox::new().with_helper(helper).protect([state.path().to_path_buf()]);
    let probe = sandbox.probe();
    println!("kernel: {}", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim());
    println!("probe:  {:?} (took {:?})", probe.namespaces, probe.took);
    println!("layers: {}", sandbox.layers_summary(&ExecConfig::default()));

    let plain = CommandSpec {
        program: "/bin/true".into(),
        args: vec![],
        cwd: ws.path().to_path_buf(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        stdin: None,
        timeout: Duration::from_secs(10),
        max_output: 4096,
    };
    let through = |opts: Options| {
        let mut args = vec!["sandbox-exec".into()];
        args.extend(Options { command: vec!["/bin/true".into()], ..opts }.to_args());
        CommandSpec { program: helper.into(), args, ..plain.clone() }
    };
    let wrapped = |cfg: ExecConfig| sandbox.wrap(plain.clone(), &cfg, ws.path()).expect("wrap");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let cases: Vec<(&str, CommandSpec)> = vec![
        ("plain /bin/true (isolation = off)", plain.clone()),
        ("helper: rlimits + no_new_privs", through(Options::default())),
        ("helper: + Landlock", through(Options { landlock: true, ..Options::default() })),
        ("wrap(network = all): every layer", wrapped(ExecConfig { network: Network::All, ..ExecConfig::default() })),
        (
            "wrap(network = none): + empty netns",
            wrapped(ExecConfig { network: Network::None, ..ExecConfig::default() }),
        ),
        ("wrap(network = internet): + netns, proxy", wrapped(ExecConfig::default())),
    ];
    let mut base = Duration::ZERO;
    println!("\nspawn-to-exit of /bin/true, {RUNS} runs each:");
    let warm_case = ("wrap(network = internet), jail built ahead", wrapped(ExecConfig::default()));
    let cases = cases.into_iter().map(|(n, s)| (n, s, false)).chain([(warm_case.0, warm_case.1, true)]);
    for (name, spec, warm) in cases {
        if warm {
            sandbox.warm_ahead();
        }
        let times = rt.block_on(measure(&sandbox, &spec, warm));
        let p50 = times[RUNS / 2];
        if base.is_zero() {
            base = p50;
        }
        println!(
            "  {name:<40} p50 {:>9.3?}  p90 {:>9.3?}  min {:>9.3?}  extra (p50) {:>9.3?}",
            p50,
            times[RUNS * 9 / 10],
            times[0],
            p50.saturating_sub(base)
        );
    }
}

/// `warm`: through `Sandbox::run` (a model's commands in the daemon), with a
/// 20 ms pause between runs, untimed, standing in for the model's turn: the
/// next jail is built then. The time includes starting that next helper.
async fn measure(sandbox: &Sandbox, spec: &CommandSpec, warm: bool) -> Vec<Duration> {
    let cancel = CancellationToken::new();
    for _ in 0..10 {
        run_once(sandbox, spec, &cancel, warm).await;
    }
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        if warm {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let start = Instant::now();
        run_once(sandbox, spec, &cancel, warm).await;
        times.push(start.elapsed());
    }
    if warm {
        println!("  ({} of {} runs found their jail ready)", sandbox.warm_runs(), RUNS + 10);
    }
    times.sort();
    times
}

async fn run_once(sandbox: &Sandbox, spec: &CommandSpec, cancel: &CancellationToken, warm: bool) {
    let out =
        if warm { sandbox.run(spec.clone(), cancel, true).await } else { process::run(spec.clone(), cancel).await };
    let out = out.expect("runs");
    assert_eq!(out.state, ExitState::Exited(0), "{out:?}");
}
