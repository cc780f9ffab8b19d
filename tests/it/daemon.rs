//! The daemon as users run it: a real `bramble run` process, real signals,
//! real restarts; state read back through the library.

use std::path::Path;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;

use bramble::bus::ReportSource;
use bramble::delivery::outbox::Outbox;
use bramble::scheduler::{JobStore, RunStatus};

async fn bramble(home: &Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .await
        .expect("bramble")
}

fn in_secs(s: i64) -> String {
    jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(s)).unwrap().to_string()
}

#[tokio::test]
async fn runs_without_any_config_and_runs_exec_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let out = bramble(home, &["cron", "add", "tick", "--every", "1s", "--exec", "echo tick >> ticks.txt"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = Daemon::start(home, None);
    let ticks = home.join(".local/share/bramble/workspace/ticks.txt");
    let ran = wait_until(20, || std::fs::read_to_string(&ticks).is_ok_and(|t| t.lines().count() >= 2)).await;
    let daemon_line = |out: std::process::Output| {
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.lines().find(|l| l.starts_with("daemon:")).map(str::to_string).unwrap_or(s)
    };
    assert_eq!(daemon_line(bramble(home, &["status"]).await), "daemon:     running on this state directory");
    let (code, log) = daemon.stop().await;
    assert!(daemon_line(bramble(home, &["status"]).await).starts_with("daemon:     not running (start it:"));
    assert!(ran, "the exec job ran twice: {log}");
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("no LLM"), "says what is not configured: {log}");
    let state = home.join(".local/state/bramble");
    let job = JobStore::open(&state).get("tick").unwrap();
    assert!(job.state.history.iter().filter(|r| r.status == RunStatus::Ok).count() >= 2, "{:?}", job.state.history);
    // The job reports went to the log channel through the outbox.
    assert!(Outbox::new(&state)
        .recent()
        .unwrap()
        .iter()
        .any(|d| d.source == ReportSource::Job("tick".into()) && d.outcome == "delivered"));
}

/// A config for tests of wall-clock jobs: this machine's clock may not report
/// NTP sync, and the daemon would rightly hold `at` and cron jobs for a while.
fn trust_the_clock(home: &Path) -> std::path::PathBuf {
    let cfg = home.join("config.toml");
    std::fs::write(&cfg, "[daemon]\nclock_sync_wait = \"0s\"\n").unwrap();
    cfg
}

#[tokio::test]
async fn a_job_added_while_running_is_picked_up_and_a_one_shot_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let cfg = trust_the_clock(home);
    let daemon = Daemon::start(home, Some(&cfg));
    let state = home.join(".local/state/bramble");
    // A `cron add` from another process reaches it through the state directory's watch.
    assert!(daemon.wait_log("watching the state directory", 20).await, "{}", daemon.log());
    let at = in_secs(2);
    let out = bramble(home, &["cron", "add", "tea", "--at", &at, "--remind", "Tea is ready"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outbox = Outbox::new(&state);
    let delivered =
        wait_until(15, || outbox.recent().is_ok_and(|r| r.iter().any(|d| d.source == ReportSource::Job("tea".into()))))
            .await;
    let (_, log) = daemon.stop().await;
    assert!(delivered, "the reminder was delivered: {log}");
    assert!(log.contains("Tea is ready"), "the log channel got the text: {log}");

    // Restart: the one-shot is done and does not run again.
    let daemon = Daemon::start(home, Some(&cfg));
    daemon.scheduler_idle().await;
    let (_, log2) = daemon.stop().await;
    let job = JobStore::open(&state).get("tea").unwrap();
    assert!(job.state.done && !job.enabled, "{job:?}");
    assert_eq!(job.state.history.len(), 1, "ran exactly once: {:?}", job.state.history);
    assert!(!log2.contains("Tea is ready"), "{log2}");
}

#[tokio::test]
async fn a_one_shot_due_while_the_daemon_was_down_runs_once_when_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let at = in_secs(1);
    let out = bramble(home, &["cron", "add", "late", "--at", &at, "--remind", "You missed this"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The daemon is down at the due time. (Runs missed by more than the 60 s grace go through the
    // catch-up policy; the engine tests cover that on a fake clock.)
    let due: jiff::Timestamp =
        JobStore::open(&home.join(".local/state/bramble")).get("late").unwrap().state.next_run.unwrap();
    assert!(wait_until(10, || jiff::Timestamp::now() > due).await, "the due time passed");
    let cfg = trust_the_clock(home);
    let daemon = Daemon::start(home, Some(&cfg));
    let state = home.join(".local/state/bramble");
    let outbox = Outbox::new(&state);
    let delivered = wait_until(15, || {
        outbox.recent().is_ok_and(|r| r.iter().any(|d| d.source == ReportSource::Job("late".into())))
    })
    .await;
    let (_, log) = daemon.stop().await;
    assert!(delivered, "{log}");
    assert_eq!(JobStore::open(&state).get("late").unwrap().state.history.len(), 1);
}

#[tokio::test]
async fn reports_queued_while_down_are_delivered_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let state = home.join(".local/state/bramble");
    let outbox = Outbox::new(&state);
    outbox.enqueue(bramble::bus::Target::Log, "queued while the daemon was down", "agent").unwrap();
    let daemon = Daemon::start(home, None);
    let delivered = wait_until(15, || outbox.pending().is_ok_and(|p| p.is_empty())).await;
    let (_, log) = daemon.stop().await;
    assert!(delivered, "{log}");
    assert!(log.contains("queued while the daemon was down"), "{log}");
}

#[tokio::test]
async fn heartbeat_without_active_tasks_never_calls_the_model() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "[heartbeat]\nevery = \"10s\"\n");
    // The shipped HEARTBEAT.md template has no active tasks. A heartbeat that
    // never ran has run never before: it ticks at start. Wait for that tick.
    let log = home.path().join("daemon.log");
    let daemon = Daemon::start_logging_to(home.path(), Some(&home.config), &log);
    let ticked = wait_until(20, || {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.lines().any(|l| l.contains("heartbeat tick") && l.contains("NoTasks")))
    })
    .await;
    let (code, _) = daemon.stop().await;
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(ticked, "the heartbeat ticked and found no tasks: {log}");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(fake.request_count(), 0, "no LLM request: {log}");
    let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "heartbeat"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("no active tasks"), "{out:?}");
    assert_eq!(fake.request_count(), 0);
}

#[tokio::test]
async fn heartbeat_runs_tasks_and_delivers_only_real_reports() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "[heartbeat]\nevery = \"1h\"\ndeliver = [\"log\"]\n");
    std::fs::write(home.workspace.join("HEARTBEAT.md"), "## Active Tasks\n- Check the disk\n").unwrap();
    fake.push(Reply::Text("HEARTBEAT_OK".into()));
    let daemon = Daemon::start(home.path(), Some(&home.config));
    assert!(wait_until(15, || fake.request_count() == 1).await);
    // The tick ends with its state saved and this line; a report would have been queued before it.
    assert!(daemon.wait_log("heartbeat ran", 15).await, "{}", daemon.log());
    let (_, log) = daemon.stop().await;
    let outbox = Outbox::new(&home.state);
    assert!(
        outbox.recent().unwrap().is_empty() && outbox.pending().unwrap().is_empty(),
        "HEARTBEAT_OK is not delivered: {log}"
    );
    let prompt =
        fake.requests()[0]["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
    assert!(prompt.contains("- Check the disk"), "{prompt}");

    // A restart within the interval does not run it again (the interval is anchored on the last run).
    let daemon = Daemon::start(home.path(), Some(&home.config));
    assert!(daemon.wait_log("heartbeat waiting", 20).await, "it waits for the next run: {}", daemon.log());
    daemon.stop().await;
    assert_eq!(fake.request_count(), 1);

    // `bramble heartbeat` runs one now; a real report is queued for the targets.
    fake.push(Reply::Text("The disk is 97% full.".into()));
    let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "heartbeat"]).await;
    assert!(out.status.success(), "{out:?}");
    let pending = outbox.pending().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].text, "The disk is 97% full.");
    assert_eq!(pending[0].source, ReportSource::Heartbeat);
}

#[tokio::test]
async fn sighup_reloads_and_a_bad_config_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[heartbeat]\nenabled = false\n").unwrap();
    let daemon = Daemon::start(dir.path(), Some(&cfg));
    let running = "bramble 0.1.0 running";
    assert!(daemon.wait_log_count(running, 1, 20).await, "{}", daemon.log());
    std::fs::write(&cfg, "[heartbeat]\nenabled = nope\n").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP).await;
    assert!(daemon.wait_log_count(running, 2, 20).await, "restarted with the old config: {}", daemon.log());
    std::fs::write(&cfg, "[heartbeat]\nenabled = false\n[exec]\ntimeout = \"5s\"\n").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP).await;
    assert!(daemon.wait_log_count(running, 3, 20).await, "restarted with the new config: {}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(log.matches("reloading the config").count(), 2, "{log}");
    assert!(log.contains(&format!("{}:2:11", cfg.display())), "the error names file, line and column: {log}");
    assert_eq!(log.matches("bramble 0.1.0 running").count(), 3, "{log}");
}

#[tokio::test]
async fn a_reload_applies_a_new_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    let config = |level: &str| format!("[heartbeat]\nenabled = false\n[daemon]\nlog_level = \"{level}\"\n");
    std::fs::write(&cfg, config("info")).unwrap();
    let log = dir.path().join("daemon.log");
    // No RUST_LOG (it would win over the config, at start and at reloads alike).
    let daemon = Daemon::start_with_env(dir.path(), Some(&cfg), &log, &[("RUST_LOG", Path::new(""))]);
    let running = "bramble 0.1.0 running";
    assert!(daemon.wait_log_count(running, 1, 20).await, "{}", daemon.log());
    std::fs::write(&cfg, config("debug")).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP).await;
    assert!(daemon.wait_log_count(running, 2, 20).await, "{}", daemon.log());
    // The scheduler's debug line, at its restart after the reload.
    assert!(daemon.wait_log("scheduler sleeping", 20).await, "debug lines after the reload: {}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let first_run = &log[..log.find("reloading the config").unwrap()];
    assert!(!first_run.contains("DEBUG"), "no debug lines at info: {first_run}");
}

/// What the unit's `ExecReload=` runs before SIGHUP: `systemctl reload` fails,
/// with the error on its terminal, where the daemon's reload would refuse.
#[tokio::test]
async fn check_reload_fails_where_the_reload_would() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    let good = "[heartbeat]\nenabled = false\n";
    std::fs::write(&cfg, good).unwrap();
    let check = || async {
        let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "check", "--reload"]).await;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let (ok, text) = check().await;
    assert!(!ok && text.contains("no running daemon uses the state directory"), "no daemon, nothing to reload: {text}");
    let daemon = Daemon::start(dir.path(), Some(&cfg));
    assert!(daemon.wait_log("bramble 0.1.0 running", 20).await, "{}", daemon.log());
    let (ok, text) = check().await;
    assert!(ok && text.contains("ok to reload"), "{text}");
    std::fs::write(&cfg, "[heartbeat]\nenabled = nope\n").unwrap();
    let (ok, text) = check().await;
    assert!(!ok, "{text}");
    assert!(text.contains(&format!("{}:2:11", cfg.display())), "file, line and column: {text}");
    assert!(text.contains("the running daemon keeps its config"), "{text}");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&cfg, format!("{good}[daemon]\nstate_dir = \"{}\"\n", elsewhere.display())).unwrap();
    let (ok, text) = check().await;
    assert!(!ok && text.contains("restart instead"), "a reload cannot move the state directory: {text}");
    std::fs::write(&cfg, good).unwrap();
    assert!(check().await.0);
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Daemon::start(dir.path(), None);
    let state = dir.path().join(".local/state/bramble");
    assert!(wait_until(10, || state.join("daemon.lock").exists()).await);
    // The lock is taken before anything starts; "running" comes after.
    assert!(first.wait_log("bramble 0.1.0 running", 20).await, "{}", first.log());
    let out = bramble(dir.path(), &["run"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another bramble daemon is already running"), "{err}");
    let (code, _) = first.stop().await;
    assert_eq!(code, Some(0));
}

/// A job still running at SIGTERM gets the grace period, is recorded, and
/// does not run again after the restart.
#[tokio::test]
async fn a_job_running_at_shutdown_finishes_and_is_recorded_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let cfg = trust_the_clock(home);
    let at = in_secs(1);
    let out =
        bramble(home, &["cron", "add", "slow", "--at", &at, "--exec", "sleep 2; echo finished >> done.txt"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = Daemon::start(home, Some(&cfg));
    let state = home.join(".local/state/bramble");
    // Wait until it has started, then stop the daemon mid-run.
    assert!(wait_until(15, || JobStore::open(&state).get("slow").is_ok_and(|j| j.state.running_since.is_some())).await);
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let done = home.join(".local/share/bramble/workspace/done.txt");
    assert_eq!(std::fs::read_to_string(&done).unwrap_or_default(), "finished\n", "{log}");
    let job = JobStore::open(&state).get("slow").unwrap();
    assert!(job.state.done, "{job:?}");
    assert_eq!(job.state.history.len(), 1, "{:?}", job.state.history);
    // Restarted: not run again.
    let daemon = Daemon::start(home, Some(&cfg));
    daemon.scheduler_idle().await;
    daemon.stop().await;
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "finished\n");
}

/// Reports for a channel that is not configured wait in the outbox without a
/// write per attempt (SD cards), and are kept.
#[tokio::test]
async fn reports_for_an_unconfigured_channel_wait_without_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let state = home.join(".local/state/bramble");
    let outbox = Outbox::new(&state);
    outbox.enqueue(bramble::bus::Target::Telegram("42".into()), "for telegram", "agent").unwrap();
    let before = std::fs::metadata(outbox.path()).unwrap().modified().unwrap();
    let daemon = Daemon::start(home, None);
    // The dispatcher's first pass says why it holds the report; no write comes of it.
    assert!(daemon.wait_log("no `telegram` channel is configured", 20).await, "{}", daemon.log());
    let (_, log) = daemon.stop().await;
    let pending = outbox.pending().unwrap();
    assert_eq!(pending.len(), 1, "{log}");
    assert_eq!(pending[0].attempts, 0);
    assert_eq!(std::fs::metadata(outbox.path()).unwrap().modified().unwrap(), before, "no rewrite: {log}");
    assert!(log.contains("no `telegram` channel is configured"), "{log}");
}

// ---- issue 23: a recurring occurrence is not run again after a kill -9 during it ----

/// The `scheduled=` values of the "running job" lines for `job` in a daemon log.
fn scheduled_runs(log: &str, job: &str) -> Vec<String> {
    // Drop the ANSI colour codes (ESC [ ... m) of the log lines.
    let mut plain = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
        .lines()
        .filter(|l| l.contains("running job") && l.contains(&format!("job={job}")))
        .filter_map(|l| l.split("scheduled=").nth(1))
        .filter_map(|s| s.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_recurring_run_killed_mid_run_is_not_run_again_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let cmd = "echo run >> runs.txt; sleep 30";
    let out = bramble(home, &["cron", "add", "e3", "--every", "4s", "--exec", cmd]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = home.join(".local/share/bramble/workspace/runs.txt");
    let daemon = Daemon::start(home, None);
    let started = wait_until(20, || std::fs::read_to_string(&runs).is_ok_and(|t| !t.is_empty())).await;
    let log1 = daemon.kill9().await;
    assert!(started, "the job started: {log1}");
    let first = scheduled_runs(&log1, "e3");
    assert_eq!(first.len(), 1, "{log1}");
    // Restart at once: the interrupted occurrence is well inside the 60 s grace.
    let daemon = Daemon::start(home, None);
    let state = home.join(".local/state/bramble");
    let recorded = wait_until(20, || {
        JobStore::open(&state)
            .get("e3")
            .is_ok_and(|j| j.state.history.iter().any(|r| r.summary.starts_with("interrupted")))
    })
    .await;
    let (_, log2) = daemon.stop().await;
    assert!(recorded, "the interrupted run is recorded: {log2}");
    assert!(log2.contains("run was interrupted"), "{log2}");
    assert!(!scheduled_runs(&log2, "e3").contains(&first[0]), "{} ran twice: {log2}", first[0]);
}

/// Alert lines (added reports whose source is `alert`) in the outbox journal that contain `needle`.
fn alerts_in_outbox(state: &Path, needle: &str) -> usize {
    let journal = std::fs::read_to_string(state.join("outbox.jsonl")).unwrap_or_default();
    journal.lines().filter(|l| l.starts_with("{\"add\":") && l.contains("\"alert\"") && l.contains(needle)).count()
}

#[tokio::test]
async fn a_run_cut_off_by_a_crash_is_one_alert_not_repeated_by_later_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let config = home.join(".config/bramble/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "[heartbeat]\nenabled = false\n[alerts]\ndeliver = [\"log\"]\n").unwrap();
    // The first run hangs (and is killed with the daemon); later ones are quick.
    let cmd = "test -e runs.txt && exit 0; echo run >> runs.txt; sleep 30";
    let out = bramble(home, &["cron", "add", "e3", "--every", "4s", "--exec", cmd]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = home.join(".local/share/bramble/workspace/runs.txt");
    let state = home.join(".local/state/bramble");
    let daemon = Daemon::start(home, None);
    let started = wait_until(20, || std::fs::read_to_string(&runs).is_ok_and(|t| !t.is_empty())).await;
    let log1 = daemon.kill9().await;
    assert!(started, "the job started: {log1}");
    let needle = "`e3`: the run of";
    for restart in 0..2 {
        let daemon = Daemon::start(home, None);
        daemon.scheduler_idle().await;
        let told = wait_until(10, || alerts_in_outbox(&state, needle) >= 1).await;
        let (_, log) = daemon.stop().await;
        assert!(told, "restart {restart}: alerted: {log}");
        assert_eq!(alerts_in_outbox(&state, needle), 1, "restart {restart}: one alert in all: {log}");
    }
}

// ---- issue 23: a corrupt job store is an ERROR in the daemon's log, with the kept copy ----

#[tokio::test]
async fn a_corrupt_job_store_is_logged_as_an_error_with_the_kept_copy() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let state = home.join(".local/state/bramble");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("jobs.json"), b"{ not json").unwrap();
    let daemon = Daemon::start(home, None);
    let kept = || {
        std::fs::read_dir(&state).ok().and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("jobs.json.corrupt-")))
        })
    };
    let set_aside = wait_until(10, || kept().is_some()).await;
    daemon.handlers_ready().await;
    let (_, log) = daemon.stop().await;
    assert!(set_aside, "{log}");
    let kept = kept().unwrap().display().to_string();
    let errors: Vec<_> = log.lines().filter(|l| l.contains("ERROR") && l.contains(&kept)).collect();
    assert!(!errors.is_empty(), "an ERROR line names {kept}: {log}");
}

/// Under systemd, log lines go to journald's native socket with syslog
/// priorities as journald users expect: info 6 (not notice, 5), debug 7,
/// warn 4. The socket is a datagram socket of the test's, bound over
/// `/run/systemd/journal/socket` in a mount namespace of the daemon's own
/// (root only: that is how it reaches the path the library writes to);
/// the datagrams are journald's published native protocol.
#[tokio::test]
async fn journal_lines_carry_syslog_priorities() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("NOTE: journal_lines_carry_syslog_priorities needs root for its mount namespace; not run");
        return;
    }
    let home = TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "");
    let sock_path = home.path().join("journal.socket");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
    let stderr_path = home.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let script = "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && : > /run/systemd/journal/socket \
                  && mount --bind \"$SOCK\" /run/systemd/journal/socket && exec \"$BRAMBLE\" --config \"$CFG\" run";
    let mut child = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("SOCK", &sock_path)
        .env("BRAMBLE", env!("CARGO_BIN_EXE_bramble"))
        .env("CFG", &home.config)
        .env("RUST_LOG", "debug")
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("util-linux unshare");
    // (priority, message) of each datagram, until an info and a debug line have come.
    let mut seen: Vec<(String, String)> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut buf = vec![0u8; 64 * 1024];
    while std::time::Instant::now() < deadline {
        // (An empty datagram is the library's check that the socket is there.)
        let Some(n) = sock.recv(&mut buf).ok().filter(|n| *n > 0) else { continue };
        let fields = journal_fields(&buf[..n]);
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
        assert_eq!(field("SYSLOG_IDENTIFIER"), "bramble", "{fields:?}");
        seen.push((field("PRIORITY"), field("MESSAGE")));
        let has = |p: &str, m: &str| seen.iter().any(|(pp, mm)| pp == p && mm.contains(m));
        if has("6", "provider ready") && has("7", "watching the state directory") && has("4", "") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let has = |p: &str, m: &str| seen.iter().any(|(pp, mm)| pp == p && mm.contains(m));
    let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(has("6", "provider ready"), "info is priority 6: {seen:?}\nstderr: {log}");
    assert!(has("7", "watching the state directory"), "debug is priority 7: {seen:?}");
    assert!(has("4", ""), "a warning (the config file others can read holds the API key) is priority 4: {seen:?}");
    assert!(!seen.iter().any(|(p, _)| p == "5"), "nothing at notice: {seen:?}");
    assert!(log.is_empty(), "with the journal as stderr, nothing is written there: {log}");
}

/// The fields of one datagram of journald's native protocol: `NAME=value\n`,
/// or `NAME\n` + 64-bit little-endian length + value + `\n` (values with newlines).
fn journal_fields(mut d: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !d.is_empty() {
        let end = d.iter().position(|b| *b == b'=' || *b == b'\n').expect("a field name");
        let name = String::from_utf8_lossy(&d[..end]).into_owned();
        let value;
        if d[end] == b'=' {
            let rest = &d[end + 1..];
            let nl = rest.iter().position(|b| *b == b'\n').expect("a field ends in a newline");
            value = &rest[..nl];
            d = &rest[nl + 1..];
        } else {
            let len = u64::from_le_bytes(d[end + 1..end + 9].try_into().unwrap()) as usize;
            value = &d[end + 9..end + 9 + len];
            assert_eq!(d[end + 9 + len], b'\n', "a binary field ends in a newline");
            d = &d[end + 10 + len..];
        }
        out.push((name, String::from_utf8_lossy(value).into_owned()));
    }
    out
}

/// One request to a control socket, as raw bytes; the raw reply.
async fn control_raw(socket: &Path, request: Vec<u8>) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(socket).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    // The daemon may answer (and close) before a too-large request is all written.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut reply = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), rd.read_to_end(&mut reply))
        .await
        .expect("an answer in time")
        .expect("read");
    drop(writer.await);
    serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply)))
}

async fn control(socket: &Path, argv: &[&str]) -> serde_json::Value {
    let mut line = serde_json::to_vec(&serde_json::json!({ "argv": argv })).unwrap();
    line.push(b'\n');
    control_raw(socket, line).await
}

/// The control socket (`bramble cron …` for the service's group): a request
/// too large, clients that never send, more of them than it serves at once —
/// none of it stops other clients or the daemon.
#[tokio::test]
async fn the_control_socket_outlasts_oversize_and_stalled_clients() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let cfg = trust_the_clock(home);
    let daemon = Daemon::start(home, Some(&cfg));
    let socket = home.join(".local/state/bramble/control.sock");
    assert!(wait_until(20, || socket.exists()).await, "{}", daemon.log());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600, "its own user only");

    // One client that never sends: the next is answered at once.
    let mut stalled = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let started = std::time::Instant::now();
    let reply = control(&socket, &["add", "tea", "--every", "1h", "--remind", "tea"]).await;
    assert_eq!(reply["code"], 0, "{reply}");
    assert!(reply["out"].as_str().unwrap().starts_with("added job tea ("), "{reply}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "not held up: {:?}", started.elapsed());
    // The daemon hangs up on it after its read timeout.
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(std::time::Duration::from_secs(15), stalled.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0))), "the stalled client is closed: {n:?}");

    // Too large: refused with a reason, the connection closed.
    let reply = control_raw(&socket, vec![b'x'; 200 * 1024]).await;
    assert_eq!(reply["code"], 1, "{reply}");
    assert!(reply["err"].as_str().unwrap().contains("larger than 64 KiB"), "{reply}");
    let reply = control_raw(&socket, b"{\"argv\": [\"list\"], \"config\": \"/etc/passwd\"}\n".to_vec()).await;
    assert!(reply["err"].as_str().unwrap().contains("not a control request"), "{reply}");
    let reply = control(&socket, &["--config", "/tmp/x", "list"]).await;
    assert_eq!(reply["code"], 2, "clap's usage error: {reply}");

    // Three times as many silent clients as it serves at once: the others wait, then are served.
    let mut silent = Vec::new();
    for _ in 0..24 {
        silent.push(tokio::net::UnixStream::connect(&socket).await.unwrap());
    }
    let started = std::time::Instant::now();
    let reply = control(&socket, &["list"]).await;
    assert_eq!(reply["code"], 0, "{reply}");
    assert!(reply["out"].as_str().unwrap().contains("tea"), "{reply}");
    assert!(started.elapsed() < std::time::Duration::from_secs(25), "{:?}", started.elapsed());
    drop(silent);

    // The jobs were the store's, and the daemon stops as always.
    assert!(JobStore::open(&home.join(".local/state/bramble")).get("tea").is_ok());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
}

/// A clean stop removes the control socket: nothing is left for a client to
/// connect to and wait on.
#[tokio::test]
async fn a_clean_stop_leaves_no_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let cfg = trust_the_clock(home);
    let daemon = Daemon::start(home, Some(&cfg));
    let socket = home.join(".local/state/bramble/control.sock");
    assert!(wait_until(20, || socket.exists()).await, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!socket.exists(), "control.sock is still there after a clean stop: {log}");
}
