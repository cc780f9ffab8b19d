//! What a new owner meets in the first hour, through the real binary: a dead
//! provider fails at once with one warning and the way to find out why.

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::refused_url;
use crate::support::setup::{bramble, TestHome};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The log lines at `WARN` in what the binary wrote to stderr.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(" WARN ")).collect()
}

/// Nothing listens at the provider's port: the turn fails without retries
/// (retrying within the turn cannot start the server), one warning is
/// logged, and the error ends with where the cause is looked for.
#[tokio::test]
async fn a_dead_provider_fails_at_once_in_one_warning_with_doctors_hint() {
    let dead = refused_url().await;
    let home = TestHome::new("openai", &format!("{dead}/v1"), "", "max_retries = 3", "");
    let config = home.config.to_str().unwrap();
    let out = bramble(home.path(), &["--config", config, "agent", "-m", "hello"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("bramble: error: could not reach the provider at "), "{err}");
    assert!(last.contains(&format!("{dead}/v1/chat/completions")), "names the URL it tried: {err}");
    assert!(last.to_lowercase().contains("connection refused"), "{err}");
    assert!(last.ends_with("Is the server running and `base_url` right? `bramble doctor` checks it"), "{err}");
    assert!(!err.contains("gave up after"), "not retried: {err}");
    assert_eq!(warnings(&err).len(), 1, "one warning, not one per attempt: {err}");
}

/// A server that answers 503 is still retried (it may be back in a second),
/// and the retries are one warning too.
#[tokio::test]
async fn an_overloaded_provider_is_still_retried_in_one_warning() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "max_retries = 1", "");
    fake.push(Reply::error(503, "overloaded"));
    fake.push(Reply::error(503, "overloaded"));
    let config = home.config.to_str().unwrap();
    let out = bramble(home.path(), &["--config", config, "agent", "-m", "hello"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(fake.request_count(), 2, "one retry: {err}");
    assert!(err.contains("gave up after 2 attempts: the provider answered HTTP 503: overloaded"), "{err}");
    assert!(!err.contains("bramble doctor"), "a server that answers is reachable: {err}");
    assert_eq!(warnings(&err).len(), 1, "{err}");
}

/// A fallback chain whose every server is down: one warning per model, the
/// hint once, at the end.
#[tokio::test]
async fn a_chain_of_dead_providers_gives_the_hint_once_at_the_end() {
    let (cloud, lan) = (refused_url().await, refused_url().await);
    let home = TestHome::new("openai", "http://127.0.0.1:1", "", "", "");
    let config = format!(
        "[agent]\nworkspace = \"{ws}\"\nfallback = [\"lan\"]\n\
         [[provider]]\nname = \"cloud\"\nmodel = \"big\"\nbase_url = \"{cloud}/v1\"\napi_key = \"k\"\n\
         [[provider]]\nname = \"lan\"\nmodel = \"small\"\nbase_url = \"{lan}/v1\"\n\
         [daemon]\nstate_dir = \"{st}\"\n",
        ws = home.workspace.display(),
        st = home.state.display(),
    );
    std::fs::write(&home.config, config).unwrap();
    let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "agent", "-m", "hello"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("bramble: error: no model could answer: cloud/big: could not reach"), "{err}");
    assert!(last.contains(&format!("; lan/small: could not reach the provider at {lan}/v1/chat/completions")), "{err}");
    assert_eq!(last.matches("bramble doctor").count(), 1, "{err}");
    assert!(last.ends_with("`bramble doctor` checks each"), "{err}");
    assert_eq!(warnings(&err).len(), 2, "one per model: {err}");
}

/// `bramble ARGS` with `COLUMNS` set and stdout a pipe: its stdout, after a success.
fn help(args: &[&str], columns: u16) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(args)
        .env_clear()
        .env("COLUMNS", columns.to_string())
        .output()
        .expect("run bramble");
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Help is wrapped to the terminal's width (`COLUMNS` when stdout is not a
/// terminal; never wider than 100), and `-h` at every level gives the global
/// `--config` one short line: where the file is looked for is `--help`'s.
#[test]
fn help_wraps_to_the_terminal_and_dash_h_is_short_at_every_level() {
    let levels: [&[&str]; 6] = [&[], &["cron"], &["cron", "add"], &["audit"], &["status"], &["agent"]];
    for level in levels {
        for (flag, columns) in [("-h", 60), ("--help", 60), ("-h", 200)] {
            let args = [level, &[flag]].concat();
            let out = help(&args, columns);
            let width = columns.min(100) as usize;
            // clap does not wrap the usage line: it fits 100 columns, not every width.
            for line in out.lines().filter(|l| columns >= 100 || !l.starts_with("Usage: ")) {
                assert!(line.chars().count() <= width, "{args:?} at {columns} columns: {line:?}\n{out}");
            }
            assert!(out.contains("--config <PATH>"), "{args:?}: {out}");
            if flag == "-h" {
                assert!(out.contains("Config file [default: see --help]"), "{args:?}: {out}");
                assert!(!out.contains("XDG_CONFIG_HOME"), "{args:?}: {out}");
            } else {
                assert!(out.contains("$XDG_CONFIG_HOME/bramble/config.toml"), "{args:?}: {out}");
            }
        }
    }
    // Wide enough, a line is not broken: `-h` at 200 columns is at most 100 wide, and some line uses them.
    let out = help(&["cron", "add", "-h"], 200);
    assert!(out.lines().any(|l| l.chars().count() > 90), "{out}");
}

/// `audit --help` names one default for --since (in words), not two.
#[test]
fn audit_help_names_one_default() {
    for flag in ["-h", "--help"] {
        let out = help(&["audit", flag], 100);
        let since = out.split("--since <WHEN>").nth(1).and_then(|rest| rest.split("--json").next()).unwrap_or_default();
        let since = since.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(since.matches("[default:").count(), 1, "{out}");
        assert!(since.contains("[default: the last day]"), "{out}");
    }
}

/// `bramble status` says what `[exec] network` means here, not only its
/// name: `auto` is the public internet through the proxy where the jail
/// works, else the host's whole network, and the sandbox line agrees.
#[tokio::test]
async fn status_says_what_the_exec_network_setting_means() {
    let home = TestHome::new("openai", "http://127.0.0.1:1/v1", "", "", "");
    let base = std::fs::read_to_string(&home.config).unwrap();
    let config = home.config.to_str().unwrap();
    let exec_line = |stdout: &str| -> (String, String) {
        let exec = stdout.lines().find(|l| l.starts_with("exec:")).unwrap_or_else(|| panic!("{stdout}")).to_string();
        let sandbox = stdout.lines().find(|l| l.starts_with("sandbox:")).unwrap_or_else(|| panic!("{stdout}"));
        (exec, sandbox.rsplit("; network: ").next().unwrap_or_default().to_string())
    };
    let out = bramble(home.path(), &["--config", config, "status"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (exec, reach) = exec_line(&text(&out.stdout));
    let (setting, means) = exec.split_once(", which here means: ").unwrap_or_else(|| panic!("{exec}"));
    assert!(setting.ends_with(r#", network "auto""#), "{exec}");
    assert!(
        means == "public internet only, through bramble's proxy (no LAN, not this machine)"
            || means == "the host's whole network (LAN and this machine's own services included)",
        "{exec}"
    );
    assert!(reach.starts_with(means), "the exec line and the sandbox line agree: {exec} / {reach}");

    for (written, said) in [
        ("\"none\"", r#"network "none", which here means: no network"#),
        ("true", r#"network "all", which here means: the host's whole network"#),
    ] {
        std::fs::write(&home.config, format!("{base}\n[exec]\nnetwork = {written}\n")).unwrap();
        let out = bramble(home.path(), &["--config", config, "status"], None).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let (exec, _) = exec_line(&text(&out.stdout));
        assert!(exec.contains(said), "{written}: {exec}");
    }
}

/// `[daemon] log_file`: a daemon started from a shell keeps its log in a
/// file (created with its directory, 0600, appended to, rotated at 10 MiB),
/// and stderr, not a terminal here, is left quiet (cron would mail it).
#[tokio::test]
async fn the_daemon_keeps_its_log_in_log_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("logs/bramble.log");
    let extra = format!("log_file = \"{}\"", log.display());
    let home = TestHome::new("openai", "http://127.0.0.1:1/v1", "", "", &extra);
    let daemon = crate::support::daemon::Daemon::start(home.path(), Some(&home.config));
    let in_file = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(crate::support::daemon::wait_until(20, || in_file().contains("scheduler sleeping")).await, "{}", in_file());
    let (_, stderr) = daemon.stop().await;
    assert!(in_file().contains(" INFO "), "{}", in_file());
    assert!(!stderr.contains(" INFO "), "stderr is not a terminal: the file has the lines: {stderr}");
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);

    // Started again: appended; a file at its cap becomes bramble.log.1.
    let first = in_file();
    let daemon = crate::support::daemon::Daemon::start(home.path(), Some(&home.config));
    assert!(crate::support::daemon::wait_until(20, || in_file().matches("scheduler sleeping").count() >= 2).await);
    daemon.stop().await;
    assert!(in_file().starts_with(&first), "appended, not truncated");
    let mut full = in_file().into_bytes();
    full.resize(10 * 1024 * 1024, b'x');
    std::fs::write(&log, &full).unwrap();
    let daemon = crate::support::daemon::Daemon::start(home.path(), Some(&home.config));
    assert!(crate::support::daemon::wait_until(20, || in_file().contains("scheduler sleeping")).await, "{}", in_file());
    daemon.stop().await;
    let old = std::fs::read(dir.path().join("logs/bramble.log.1")).unwrap();
    assert_eq!(old.len(), 10 * 1024 * 1024, "the full file, as it was");
    assert!(in_file().len() < 1024 * 1024 && !in_file().contains("xxxx"), "a fresh file");
}
