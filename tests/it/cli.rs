//! The `bramble` binary as a user runs it: init, check, status, agent.
//! Each test gets its own HOME and config, and talks to a fake LLM on 127.0.0.1.

use std::path::Path;
use std::process::Output;

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;

/// Run the binary with a clean environment rooted at `home`.
async fn bramble(home: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
    cmd.args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn bramble");
    let mut pipe = child.stdin.take().expect("stdin");
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes()).await.expect("write stdin");
    }
    drop(pipe);
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("bramble finished in time")
        .expect("bramble output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn check_reports_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[agent]\nmodel = \"m\"\n\n[exec]\ntimeout = \"soon\"\n").unwrap();
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "check"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with(&format!("{}:5:11: `soon` is not a duration", cfg.display())), "{err}");

    std::fs::write(&cfg, "[agent]\nmodle = \"m\"\n").unwrap();
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "check"], None).await;
    assert!(
        text(&out.stderr).starts_with(&format!("{}:2:1: unknown field `modle`", cfg.display())),
        "{}",
        text(&out.stderr)
    );

    let missing = dir.path().join("nope.toml");
    let out = bramble(dir.path(), &["--config", missing.to_str().unwrap(), "check"], None).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read the config file"), "{}", text(&out.stderr));
}

#[tokio::test]
async fn init_writes_templates_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("etc/config.toml");
    let ws = dir.path().join("ws");
    let args = ["--config", cfg.to_str().unwrap(), "init", "--workspace", ws.to_str().unwrap()];
    let out = bramble(dir.path(), &args, None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in ["AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "IDENTITY.md", "HEARTBEAT.md", "memory/MEMORY.md"] {
        assert!(ws.join(f).is_file(), "{f} written");
    }
    assert!(std::fs::read_to_string(ws.join("HEARTBEAT.md")).unwrap().contains("## Active Tasks"));
    let written = std::fs::read_to_string(&cfg).unwrap();
    assert!(written.contains(&format!("workspace = \"{}\"", ws.display())), "{written}");

    std::fs::write(ws.join("SOUL.md"), "mine").unwrap();
    std::fs::write(&cfg, format!("[agent]\nworkspace = \"{}\"\n", ws.display())).unwrap();
    let out = bramble(dir.path(), &args, None).await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("kept"), "{}", text(&out.stdout));
    assert_eq!(std::fs::read_to_string(ws.join("SOUL.md")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), format!("[agent]\nworkspace = \"{}\"\n", ws.display()));

    // The written config passes `check`.
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "check"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[tokio::test]
async fn agent_one_turn_with_an_exec_tool_call() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::ToolCalls(vec![("exec".into(), r#"{"command":"echo $((6*7))"}"#.into())]));
    fake.push(Reply::Text("The answer is 42.".into()));
    let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "agent", "-m", "compute"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "The answer is 42.\n");
    let second = &fake.requests()[1];
    let result = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(result["content"].as_str().unwrap().starts_with("42\n"), "{result}");
}

#[tokio::test]
async fn agent_exits_non_zero_with_the_reason_when_the_provider_fails() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::Status {
        status: 401,
        body: r#"{"error":{"message":"Incorrect API key provided"}}"#.into(),
        retry_after: None,
    });
    let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "agent", "-m", "hi"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("401") && err.contains("Incorrect API key provided"), "{err}");
    assert!(!err.contains("test-key"), "the key is never printed: {err}");
    assert_eq!(fake.request_count(), 1, "401 is not retried");
}

#[tokio::test]
async fn repl_answers_until_exit() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::Text("one".into()));
    fake.push(Reply::Text("two".into()));
    let out = bramble(
        home.path(),
        &["--config", home.config.to_str().unwrap(), "agent", "-s", "repl"],
        Some("first\nsecond\nexit\n"),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("bramble> one") && stdout.contains("bramble> two"), "{stdout}");
    // Same session: the second request carried the first exchange.
    let msgs = fake.requests()[1]["messages"].as_array().unwrap().clone();
    assert!(msgs.iter().any(|m| m["content"] == "first"));
}

#[tokio::test]
async fn status_without_a_config_file_uses_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let out = bramble(dir.path(), &["status"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("config:     (none: defaults)"), "{s}");
    assert!(s.contains("MISSING: set OPENAI_API_KEY"), "{s}");
    assert!(s.contains(&format!("{}/.local/state/bramble", dir.path().display())), "{s}");
}

#[tokio::test]
async fn help_on_every_level() {
    let dir = tempfile::tempdir().unwrap();
    for args in [vec!["--help"], vec!["agent", "--help"], vec!["init", "--help"], vec!["check", "--help"]] {
        let out = bramble(dir.path(), &args, None).await;
        assert!(out.status.success(), "{args:?}");
        assert!(text(&out.stdout).contains("Usage: bramble"), "{args:?}");
    }
    let out = bramble(dir.path(), &["--version"], None).await;
    assert_eq!(text(&out.stdout), format!("bramble {}\n", env!("BRAMBLE_VERSION")));
    // Built from a checkout: the version names the commit.
    let head = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_string());
    if let Some(head) = head {
        assert_eq!(text(&out.stdout), format!("bramble {} ({head})\n", env!("CARGO_PKG_VERSION")));
    }
}

#[tokio::test]
async fn repl_handles_slash_commands_without_the_model() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "[telegram]\ntoken = \"1:x\"\nallow_from = [\"7\"]\n");
    fake.push(Reply::Text("noted".into()));
    // The forced summary `/new` asks for.
    let summary = r#"{"history_entry":"[2026-11-21] The user said: remember me.","memory_update":"- remember me"}"#;
    fake.push(Reply::tool_call("save_memory", summary));
    let cfg = home.config.to_str().unwrap();
    let out = bramble(
        home.path(),
        &["--config", cfg, "agent", "-s", "repl"],
        Some("remember me\n/status\n/stpo\n/run backup\n/new\n/status\nexit\n"),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // One turn, and the forced summary `/new` asks for; commands make no other model call.
    assert_eq!(fake.request_count(), 2, "{stdout}");
    assert!(stdout.contains("This session: 2 messages"), "{stdout}");
    assert!(stdout.contains("Unknown command /stpo — did you mean /stop?"), "{stdout}");
    assert!(stdout.contains("here use `bramble cron run backup`"), "{stdout}");
    assert!(stdout.contains("Started a new conversation. 2 messages summarised"), "{stdout}");
    assert!(stdout.contains("This session: 0 messages"), "{stdout}");
    // `status` and `check` say whether Telegram is configured, without any network.
    let status = text(&bramble(home.path(), &["--config", cfg, "status"], None).await.stdout);
    assert!(status.contains("telegram:   configured, 1 allowed user"), "{status}");
    let check = text(&bramble(home.path(), &["--config", cfg, "check"], None).await.stdout);
    assert!(check.contains("telegram: configured, 1 allowed user"), "{check}");
}

// ---- issue 23: a corrupt job store is surfaced by every reader ----

#[tokio::test]
async fn a_corrupt_job_store_is_reported_by_status_and_cron_list() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join(".local/state/bramble");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("jobs.json"), b"{\"version\": 1, \"jobs\": [ trunc").unwrap();
    // The first reader sets the file aside and says so.
    let first = text(&bramble(dir.path(), &["status"], None).await.stdout);
    let kept: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("jobs.json.corrupt-")))
        .collect();
    assert_eq!(kept.len(), 1, "the corrupt file is kept aside");
    let kept = kept[0].display().to_string();
    assert!(first.contains("corrupt") && first.contains(&kept), "{first}");
    // Every later reader still says so, with the path of the copy.
    let list = bramble(dir.path(), &["cron", "list"], None).await;
    assert!(list.status.success(), "{}", text(&list.stderr));
    let list = text(&list.stdout);
    assert!(list.contains("was corrupt") && list.contains(&kept), "{list}");
    assert!(!list.contains("no jobs. Add one"), "{list}");
    let status = text(&bramble(dir.path(), &["status"], None).await.stdout);
    assert!(status.contains("was corrupt") && status.contains(&kept), "{status}");
}

#[tokio::test]
async fn cron_list_is_a_compact_table_and_show_has_the_details() {
    let dir = tempfile::tempdir().unwrap();
    let add = |args: &'static [&'static str]| {
        let home = dir.path().to_path_buf();
        async move {
            let out = bramble(&home, args, None).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            (text(&out.stdout), text(&out.stderr))
        }
    };
    let (added, warning) = add(&[
        "cron",
        "add",
        "standup",
        "--cron",
        "0 9 * * 1-5",
        "--tz",
        "Europe/Berlin",
        "--remind",
        "standup",
        "--ha-button",
    ])
    .await;
    assert!(added.contains("At 09:00, on Monday"), "add reads the expression out: {added}");
    assert!(warning.contains("--ha-button needs [mqtt] with discovery = true"), "{warning}");
    add(&["cron", "add", "tea", "--every", "2h", "--remind", "tea"]).await;
    let (list, _) = add(&["cron", "list"]).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(lines[0].contains("standup") && lines[0].contains("cron `0 9 * * 1-5` (Europe/Berlin)"), "{list}");
    assert!(!lines[0].contains("Monday"), "the table stays compact: {list}");
    assert!(lines[1].contains("tea") && lines[1].contains("every 2h"), "{list}");
    let (show, _) = add(&["cron", "show", "standup"]).await;
    assert!(show.contains("At 09:00, on Monday"), "{show}");
    assert!(show.contains("HA button: yes (`run_standup`)"), "{show}");
    let (show, _) = add(&["cron", "show", "tea"]).await;
    assert!(!show.contains("HA button"), "{show}");
}

#[tokio::test]
async fn no_key_is_one_clear_error_line_without_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = bramble(dir.path(), &["agent", "-m", "hi"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(
        err.trim_end(),
        "bramble: error: no LLM provider is configured: the openai provider needs an API key: set OPENAI_API_KEY \
         in the environment (or `api_key_env` / `api_key` in [provider])",
        "one line, the reason once: {err:?}"
    );
    // Log lines into a pipe (here: a daemon's warnings) carry no ANSI codes.
    let out = bramble(dir.path(), &["status"], None).await;
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!all.contains('\u{1b}'), "no escape codes in a pipe: {all:?}");
}

#[tokio::test]
async fn empty_xdg_directories_mean_unset() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
    cmd.arg("status")
        .env_clear()
        .env("HOME", &home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("XDG_STATE_HOME", "")
        .env("XDG_DATA_HOME", "")
        .env("XDG_CONFIG_HOME", "relative/not/allowed");
    let out = cmd.output().await.unwrap();
    let s = text(&out.stdout);
    assert!(s.contains(&format!("{}/.local/state/bramble", home.display())), "{s}");
    assert!(s.contains(&format!("{}/.local/share/bramble/workspace", home.display())), "{s}");
    assert!(s.contains("config:     (none: defaults)"), "{s}");
}

#[tokio::test]
async fn a_slash_command_in_agent_m_is_a_command_not_a_model_call() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let config = home.config.to_str().unwrap();
    let out = bramble(home.path(), &["--config", config, "agent", "-m", "/status"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("test-model"), "the status names the model: {}", text(&out.stdout));
    let out = bramble(home.path(), &["--config", config, "agent", "-m", "/stauts"], None).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("Unknown command /stauts — did you mean /status?"), "{}", text(&out.stderr));
    assert_eq!(fake.request_count(), 0, "no model call for either");
    // A path is not a command: it goes to the model.
    fake.push(Reply::text("that is a file"));
    let out = bramble(home.path(), &["--config", config, "agent", "-m", "/etc/hosts"], None).await;
    assert_eq!(text(&out.stdout).trim(), "that is a file");
}
