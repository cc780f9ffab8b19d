//! The `bramble` binary as a user runs it: init, check, status, agent.
//! Each test gets its own HOME and config, and talks to a fake LLM on 127.0.0.1.

use std::path::Path;
use std::process::Output;

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::{bramble, TestHome};

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
        text(&out.stderr)
            .starts_with(&format!("{}:2:1: unknown key `modle` in [agent]: did you mean `model`?", cfg.display())),
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
        let slim = if cfg!(feature = "slim") { " slim" } else { "" };
        assert_eq!(text(&out.stdout), format!("bramble {} ({head}){slim}\n", env!("CARGO_PKG_VERSION")));
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
    let lines: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "a header and two jobs: {list}");
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

/// A config with two providers (`cloud` first, `lan` as the fallback), both fakes on 127.0.0.1.
fn two_providers(home: &TestHome, cloud: &str, lan: &str, agent_extra: &str) {
    let text = format!(
        "[agent]\nworkspace = \"{ws}\"\ntimezone = \"UTC\"\nfallback = [\"lan\"]\nfallback_cooldown = \"10m\"\n{agent_extra}\n\
         [[provider]]\nname = \"cloud\"\nmodel = \"big\"\nbase_url = \"{cloud}\"\napi_key = \"k\"\nmax_retries = 0\n\
         daily_token_budget = 1000000\n\
         [[provider]]\nname = \"lan\"\nmodel = \"small\"\nbase_url = \"{lan}\"\n\
         [daemon]\nstate_dir = \"{st}\"\n",
        ws = home.workspace.display(),
        st = home.state.display(),
    );
    std::fs::write(&home.config, text).unwrap();
}

#[tokio::test]
async fn a_job_falls_back_to_the_next_model_and_says_who_answered() {
    let cloud = FakeLlm::start(Dialect::OpenAi).await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &cloud.base_url(), "", "", "");
    two_providers(&home, &cloud.base_url(), &lan.base_url(), "");
    let cfg = home.config.to_str().unwrap();
    let run = |args: &'static [&'static str]| {
        let mut all = vec!["--config", cfg];
        all.extend_from_slice(args);
        let home = home.path().to_path_buf();
        async move { bramble(&home, &all, None).await }
    };

    let out =
        run(&["cron", "add", "brief", "--every", "1d", "--message", "the 07:00 briefing", "--model", "cloud/huge"])
            .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("model:    cloud/huge"), "{}", text(&out.stdout));

    // The pinned model's provider is down (503): the LAN model answers, and the report says so.
    cloud.push(Reply::error(503, "overloaded"));
    lan.push(Reply::text("Sunny, 3 meetings, no news."));
    let out = run(&["cron", "run", "brief"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("Sunny, 3 meetings, no news.\n\n_— lan/small answered (fallback: cloud/huge: the provider answered HTTP 503: overloaded)_"), "{stdout}");
    assert_eq!(cloud.last_request().unwrap()["model"], "huge", "the pin was asked first");
    assert_eq!(lan.last_request().unwrap()["model"], "small");

    // The run history records it.
    let out = run(&["cron", "show", "brief"]).await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("model:     cloud/huge"), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains("ok") && l.ends_with("[lan/small]")), "{stdout}");
    let jobs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.state.join("jobs.json")).unwrap()).unwrap();
    let job = &jobs["jobs"][0];
    assert_eq!(job["model"], "cloud/huge");
    assert_eq!(job["state"]["history"][0]["model"], "lan/small");

    // Usage is counted per provider: the answer's tokens are the LAN's.
    let out = run(&["status"]).await;
    let stdout = text(&out.stdout);
    let lan_line = stdout.lines().find(|l| l.contains(" lan (openai at ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(!lan_line.contains(", 0 tokens today"), "{stdout}");
    assert!(stdout.contains("cloud (openai at") && stdout.contains("0 of 1000000 tokens today"), "{stdout}");
    assert!(stdout.contains("fallback:   lan (cooldown 10m)"), "{stdout}");
    assert!(stdout.contains("model:      cloud/big"), "{stdout}");
    assert!(stdout.contains("web search: duckduckgo\n") || !cfg!(feature = "web-search"), "{stdout}");

    // Everything down: one clear failure naming each model.
    cloud.push(Reply::error(401, "invalid key"));
    lan.push(Reply::error(404, "model 'small' not found"));
    let out = run(&["cron", "run", "brief"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("job brief failed: no model could answer: cloud/huge: the provider refused the credentials (HTTP 401): invalid key; lan/small: the provider answered HTTP 404: model 'small' not found"),
        "{err}"
    );
}

#[tokio::test]
async fn the_footer_follows_the_setting_and_status_shows_the_chain() {
    let cloud = FakeLlm::start(Dialect::OpenAi).await;
    let lan = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &cloud.base_url(), "", "", "");
    two_providers(&home, &cloud.base_url(), &lan.base_url(), "model_footer = \"always\"");
    let cfg = home.config.to_str().unwrap().to_string();
    cloud.push(Reply::text("from the cloud"));
    let out = bramble(home.path(), &["--config", &cfg, "agent", "-m", "hi"], None).await;
    assert_eq!(text(&out.stdout).trim(), "from the cloud\n\n_— cloud/big_");

    two_providers(&home, &cloud.base_url(), &lan.base_url(), "model_footer = \"never\"");
    cloud.push(Reply::error(500, "down"));
    lan.push(Reply::text("from the LAN"));
    let out = bramble(home.path(), &["--config", &cfg, "agent", "-m", "hi"], None).await;
    assert_eq!(text(&out.stdout).trim(), "from the LAN");

    // /status in a chat names who answered last and each provider's state.
    two_providers(&home, &cloud.base_url(), &lan.base_url(), "");
    cloud.push(Reply::error(500, "down"));
    lan.push(Reply::text("fine"));
    let out = bramble(home.path(), &["--config", &cfg, "agent"], Some("hello\n/status\n")).await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Model: cloud/big"), "{stdout}");
    assert!(
        stdout.contains("last answer: lan/small (fallback: cloud/big: the provider answered HTTP 500: down)"),
        "{stdout}"
    );
    assert!(stdout.contains("  cloud: cooling down for 9m"), "{stdout}");
    assert!(stdout.contains("  lan: ok · "), "{stdout}");
    assert!(stdout.contains("  fallback: lan/small"), "{stdout}");
}

#[tokio::test]
async fn provider_names_and_fallbacks_are_checked_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    let check = |body: &str| {
        std::fs::write(&cfg, body).unwrap();
        let (home, cfg) = (dir.path().to_path_buf(), cfg.to_str().unwrap().to_string());
        async move { text(&bramble(&home, &["--config", &cfg, "check"], None).await.stderr) }
    };
    let err = check("[agent]\nfallback = [\"lan/x\"]\n\n[provider]\nbase_url = \"http://h/v1\"\n").await;
    assert!(err.contains("config.toml:2:13: `lan/x` does not start with a provider's name"), "{err}");
    assert!(err.contains("no provider has a `name` yet"), "{err}");
    let err = check("[[provider]]\nname = \"a\"\n\n[[provider]]\nbase_url = \"http://h/v1\"\n").await;
    assert!(err.contains("config.toml:4:1: with several [[provider]] tables each needs a `name`"), "{err}");
    let err = check("[[provider]]\nname = \"a\"\n[[provider]]\nname = \"a\"\n").await;
    assert!(err.contains("config.toml:4:8: two providers are named `a`"), "{err}");
    let err = check("[[provider]]\nname = \"a/b\"\n").await;
    assert!(err.contains("config.toml:2:8: `a/b` is not a provider name"), "{err}");
    let err = check("provider = []\n").await;
    assert!(err.contains("at least one provider is needed"), "{err}");
}

/// A fake installed service under a temp root: `/etc/bramble/{config.toml,env,credentials/}` and
/// `/var/lib/bramble` owned by the service user (here `nobody`, as the test cannot add users).
struct FakeService {
    root: tempfile::TempDir,
    state: std::path::PathBuf,
}

impl FakeService {
    fn new(llm: &str) -> FakeService {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let etc = root.path().join("etc/bramble");
        let state = root.path().join("var/lib/bramble");
        std::fs::create_dir_all(etc.join("credentials")).unwrap();
        std::fs::create_dir_all(state.join("workspace")).unwrap();
        std::fs::write(
            etc.join("config.toml"),
            format!(
                "[agent]\nmodel = \"m\"\nworkspace = \"{ws}\"\ntimezone = \"UTC\"\n[provider]\nbase_url = \"{llm}\"\n\
                 api_key_env = \"BRAMBLE_SVC_KEY\"\n[daemon]\nstate_dir = \"{st}\"\n[heartbeat]\nenabled = false\n",
                ws = state.join("workspace").display(),
                st = state.display()
            ),
        )
        .unwrap();
        std::fs::write(etc.join("env"), "# the unit's EnvironmentFile\nBRAMBLE_SVC_KEY=\"sk-service-env\"\n").unwrap();
        std::fs::write(etc.join("credentials/BRAMBLE_SVC_TOKEN"), "tok\n").unwrap();
        for dir in [root.path().join("etc"), etc.clone(), root.path().join("var"), root.path().join("var/lib")] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // As the .deb makes them: root's secrets, the service's state.
        std::fs::set_permissions(etc.join("env"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(etc.join("config.toml"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("a nobody user");
        for dir in [&state, &state.join("workspace")] {
            nix::unistd::chown(dir.as_path(), Some(nobody.uid), Some(nobody.gid)).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        // The unit's RuntimeDirectory=bramble, RuntimeDirectoryMode=0750: the control socket's directory.
        let run = root.path().join("run/bramble");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::set_permissions(root.path().join("run"), std::fs::Permissions::from_mode(0o755)).unwrap();
        nix::unistd::chown(run.as_path(), Some(nobody.uid), Some(nobody.gid)).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o750)).unwrap();
        FakeService { root, state }
    }

    /// `bramble run` as the service's user (`nobody`), as the unit starts it; its log in `log`.
    fn daemon(&self, log: &Path) -> tokio::process::Child {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("run")
            .env_clear()
            .env("HOME", "/nonexistent-home")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "debug")
            .env("BRAMBLE_TEST_SYSTEM_ROOT", self.root.path())
            .env("BRAMBLE_TEST_SERVICE_USER", "nobody")
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn bramble run")
    }

    fn config(&self) -> std::path::PathBuf {
        self.root.path().join("etc/bramble/config.toml")
    }

    /// `bramble ARGS` with no --config, as `uid` (None: root), HOME without a config of its own.
    async fn bramble(&self, args: &[&str], uid: Option<u32>) -> Output {
        self.bramble_with_user(args, uid.map(|u| (u, u)), "nobody").await
    }

    /// As `uid` with the primary group `gid` (a member of that group).
    async fn bramble_as(&self, args: &[&str], uid: u32, gid: u32) -> Output {
        self.bramble_with_user(args, Some((uid, gid)), "nobody").await
    }

    async fn bramble_with_user(&self, args: &[&str], ids: Option<(u32, u32)>, service_user: &str) -> Output {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        cmd.args(args)
            .env_clear()
            .env("HOME", "/nonexistent-home")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BRAMBLE_TEST_SYSTEM_ROOT", self.root.path())
            .env("BRAMBLE_TEST_SERVICE_USER", service_user)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output()).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn sudo_bramble_acts_on_the_installed_service_as_its_user() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (the privilege drop is what is tested)");
        return;
    }
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let svc = FakeService::new(&llm.base_url());
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();

    let out = svc.bramble(&["cron", "add", "brief", "--every", "1h", "--message", "the briefing"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let jobs = std::fs::metadata(svc.state.join("jobs.json")).expect("the job is in the service's state");
    assert_eq!((jobs.uid(), jobs.gid()), (nobody.uid.as_raw(), nobody.gid.as_raw()), "written as the service user");

    // The run has the service's API key (its EnvironmentFile, read as root before the drop).
    llm.push(Reply::text("Good morning."));
    let out = svc.bramble(&["cron", "run", "brief"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("Good morning."), "{}", text(&out.stdout));
    let auth = llm.headers().last().unwrap().iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some("Bearer sk-service-env"));
    for entry in walk(&svc.state) {
        let m = std::fs::symlink_metadata(&entry).unwrap();
        assert_eq!(m.uid(), nobody.uid.as_raw(), "{} is the service's", entry.display());
    }

    let out = svc.bramble(&["status"], None).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("etc/bramble/config.toml (the installed service's; acting as its user nobody)"),
        "{stdout}"
    );

    // Another user reads the config, but the kernel keeps them from the service's control socket.
    let out = svc.bramble(&["cron", "list"], Some(1)).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("permission denied: only members of the service's group (`bramble`) may ask"),
        "{}",
        text(&out.stderr)
    );

    // A member of the service's group sees the status (the state's parts shown as private, no
    // warnings about what they may not read), its job commands go to the running service, and the rest is sent to sudo.
    let member = |args: &'static [&'static str]| svc.bramble_as(args, 1, nobody.gid.as_raw());
    let out = member(&["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("(the installed service's; its state with `sudo bramble status`)"), "{stdout}");
    for part in ["sessions:   ", "jobs:       ", "outbox:     ", "alerts:     "] {
        assert!(stdout.contains(&format!("{part}private to the service")), "{part}: {stdout}");
    }
    assert!(text(&out.stderr).is_empty(), "no warnings about what a member may not read: {}", text(&out.stderr));
    assert!(stdout.contains(&format!("daemon:     {NOT_RUNNING}")), "{stdout}");
    for (args, why) in [
        // The job commands go to the running service: not running here.
        (&["cron", "add", "tea", "--every", "1h", "--remind", "t"][..], NOT_RUNNING),
        (&["cron", "run", "brief"][..], NOT_RUNNING),
        (&["agent", "-m", "hi"][..], "this runs as the service, with its secrets: use sudo"),
        (&["run"][..], "the service runs under systemd"),
    ] {
        let out = svc.bramble_as(args, 1, nobody.gid.as_raw()).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(text(&out.stderr).contains(why), "{args:?}: {}", text(&out.stderr));
    }
    assert_eq!(llm.request_count(), 1, "no model call for a member");
    // The service user itself (`runuser -u bramble`, the unit's `bramble run`) is not a mere member.
    let out = svc.bramble_as(&["cron", "list"], nobody.uid.as_raw(), nobody.gid.as_raw()).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = svc.bramble_as(&["status"], nobody.uid.as_raw(), nobody.gid.as_raw()).await;
    assert!(text(&out.stdout).contains("acting as its user nobody"), "{}", text(&out.stdout));

    // No service user: a clear error, nothing done as root.
    let out =
        svc.bramble_with_user(&["cron", "add", "x", "--every", "1h", "--remind", "r"], None, "no-such-user-b7").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("its user `no-such-user-b7` does not exist: is bramble installed from its .deb?"),
        "{}",
        text(&out.stderr)
    );
    let jobs = std::fs::read_to_string(svc.state.join("jobs.json")).unwrap();
    assert!(!jobs.contains("\"x\""), "{jobs}");
}

/// Plain `bramble cron …` by a member of the service's group: the running
/// daemon does it, as the service, through its control socket; the state
/// directory stays the service's alone; `[service] members` limits it.
#[tokio::test]
async fn a_member_edits_the_services_jobs_through_its_control_socket() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (the daemon runs as the service's user, the client as a member)");
        return;
    }
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let svc = FakeService::new(&llm.base_url());
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log_path = logs.path().join("run.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut daemon = svc.daemon(&log_path);
    let member = |args: &'static [&'static str]| svc.bramble_as(args, 1, nobody.gid.as_raw());
    let member_name = nix::unistd::User::from_uid(1.into()).unwrap().map(|u| u.name).unwrap_or("uid 1".into());
    let answers = |needle: &'static str| {
        let svc = &svc;
        async move {
            for _ in 0..100 {
                let out = svc.bramble_as(&["status"], 1, nobody.gid.as_raw()).await;
                let line = text(&out.stdout).lines().find(|l| l.starts_with("daemon:")).unwrap_or("").to_string();
                if line.contains(needle) {
                    return line;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            panic!("the status never said `{needle}`: {}", log());
        }
    };
    let line = answers("members may: jobs").await;
    assert!(line.contains("answers (members may: jobs) at "), "{line}");
    let socket = svc.root.path().join("run/bramble/control.sock");
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!((mode.mode() & 0o777, mode.uid()), (0o660, nobody.uid.as_raw()), "the socket is the group's");

    // Add: written by the service, into its store, and the running scheduler has it at once.
    let out = member(&["cron", "add", "tea", "--every", "2s", "--remind", "tea time"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("added job tea ("), "{}", text(&out.stdout));
    let jobs = std::fs::metadata(svc.state.join("jobs.json")).unwrap();
    assert_eq!(jobs.uid(), nobody.uid.as_raw(), "written by the service");
    let delivered = crate::support::daemon::wait_until(20, || log().matches("tea time").count() >= 2).await;
    assert!(delivered, "the daemon runs the member's reminder: {}", log());
    let out = member(&["cron", "list"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).lines().any(|l| l.contains(" tea ") && l.contains("remind")), "{}", text(&out.stdout));
    // Issue 37 through the socket, as in a terminal (tests/it/cli_daily.rs): --tz is the zone of
    // --at, refused with --every; a number needs its unit; a cron field names its range; the
    // list has a header, and --json.
    let out =
        member(&["cron", "add", "dentist", "--at", "2030-12-02 09:00", "--tz", "Europe/Berlin", "--remind", "go"])
            .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = member(&["cron", "show", "dentist", "--json"]).await;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["next_run"], "2030-12-02T08:00:00Z", "{shown}");
    for (args, why) in [
        (
            &["cron", "add", "x", "--every", "1h", "--tz", "Europe/Berlin", "--remind", "r"][..],
            "--tz is for --cron and --at",
        ),
        (&["cron", "add", "x", "--every", "10", "--remind", "r"][..], "`10` has no unit: did you mean `10m`?"),
        (&["cron", "add", "x", "--cron", "61 * * * *", "--remind", "r"][..], "minute 61 is out of range 0–59"),
    ] {
        let out = svc.bramble_as(args, 1, nobody.gid.as_raw()).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(text(&out.stderr).contains(why), "{args:?}: {}", text(&out.stderr));
    }
    let out = member(&["cron", "list"]).await;
    assert!(text(&out.stdout).starts_with("ID "), "{}", text(&out.stdout));
    let out = member(&["cron", "list", "--json"]).await;
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(jobs.as_array().unwrap().iter().any(|j| j["name"] == "dentist"), "{jobs}");

    // An exec job, started by hand in the daemon: it runs as the service.
    let out = member(&["cron", "add", "who", "--every", "1h", "--exec", "echo ran-as-$(id -un)"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = member(&["cron", "run", "who"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("started job who ("), "{}", text(&out.stdout));
    let ran = crate::support::daemon::wait_until(20, || log().contains("ran-as-nobody")).await;
    assert!(ran, "the exec job ran in the daemon as the service: {}", log());

    // Errors come back as the command's own, with its exit code.
    let out = member(&["cron", "show", "no-such-job"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("bramble: error: "), "{}", text(&out.stderr));
    let out = member(&["cron", "remove", "tea"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = member(&["cron", "list"]).await;
    assert!(!text(&out.stdout).contains(" tea "), "{}", text(&out.stdout));

    // Who did it is in the audit trail (no journal here: `<state>/audit.jsonl`).
    let audit = std::fs::read_to_string(svc.state.join("audit.jsonl")).unwrap();
    let session = format!("\"session\":\"cli:{member_name}\"");
    for what in ["add tea remind: tea time", "add who exec: echo ran-as-$(id -un)", "run who", "remove tea"] {
        assert!(audit.lines().any(|l| l.contains(&session) && l.contains(what)), "{what}: {audit}");
    }
    // Nothing in the state directory is open to the group or others.
    for entry in walk(&svc.state) {
        let m = std::fs::symlink_metadata(&entry).unwrap();
        assert_eq!(m.uid(), nobody.uid.as_raw(), "{} is the service's", entry.display());
    }
    let top = std::fs::metadata(&svc.state).unwrap().permissions().mode() & 0o777;
    assert_eq!(top, 0o700, "the state directory stays private");

    // [service] members = "reminders": reading and reminders only.
    let config = std::fs::read_to_string(svc.config()).unwrap();
    std::fs::write(svc.config(), format!("{config}[service]\nmembers = \"reminders\"\n")).unwrap();
    let pid = nix::unistd::Pid::from_raw(daemon.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    answers("members may: reminders").await;
    let out = member(&["cron", "add", "sh", "--every", "1h", "--exec", "id"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("may add reminders (--remind) only ([service] members = \"reminders\")"),
        "{}",
        text(&out.stderr)
    );
    let out = member(&["cron", "add", "peek", "--every", "1h", "--remind", "x", "--attach", "USER.md"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("may not attach workspace files"), "{}", text(&out.stderr));
    // A delivery target is a capability: a member's reminder goes to chats and report topics, never into
    // bramble's own inputs (a turn, the owner's exec job) nor to a device's command topic.
    for (target, why) in [
        ("mqtt:bramble/test/in", "not in [mqtt] publish_allow"),
        ("mqtt:bramble/test/run/who", "not in [mqtt] publish_allow"),
        ("mqtt:zigbee2mqtt/front_door/set", "not in [mqtt] publish_allow"),
        ("telegram:999", "is not the chat of a user bramble serves"),
    ] {
        let args =
            ["cron", "add", "unlock", "--every", "1h", "--remind", "{\"state\": \"UNLOCK\"}", "--deliver", target];
        let out = svc.bramble_as(&args, 1, nobody.gid.as_raw()).await;
        assert_eq!(out.status.code(), Some(1), "{target}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains(why), "{target}: {}", text(&out.stderr));
    }
    let out = member(&["cron", "show", "unlock"]).await;
    assert_eq!(out.status.code(), Some(1), "no such job was made");
    let out = member(&["cron", "disable", "who"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("job who is an exec job: members"), "{}", text(&out.stderr));
    let out = member(&["cron", "add", "water", "--every", "1h", "--remind", "water"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = member(&["cron", "show", "who"]).await;
    assert_eq!(out.status.code(), Some(0), "reading is allowed: {}", text(&out.stderr));

    // [service] members = "none": refused; the service's own user still acts directly.
    std::fs::write(svc.config(), format!("{config}[service]\nmembers = \"none\"\n")).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    answers("members = \"none\"").await;
    let out = member(&["cron", "list"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("([service] members = \"none\"): use sudo"), "{}", text(&out.stderr));
    let out = svc.bramble_as(&["cron", "list"], nobody.uid.as_raw(), nobody.gid.as_raw()).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("water"), "{}", text(&out.stdout));

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), daemon.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0), "{}", log());
}

const NOT_RUNNING: &str = "the bramble service is not running (systemctl status bramble); start it, or use sudo";

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[tokio::test]
async fn doctor_checks_each_part_against_real_servers() {
    use crate::support::http::{Response, TestServer};
    use crate::support::mosquitto::Mosquitto;
    use crate::support::telegram::{FakeTelegram, BOT_ID, BOT_USERNAME};
    // An OpenAI-compatible model list (GET /v1/models), with the key checked.
    let models = TestServer::start(|req| match (req.path_only(), req.header("authorization")) {
        ("/v1/models", Some("Bearer test-key")) => Response::json(
            200,
            &serde_json::json!({"object": "list", "data": [{"id": "test-model", "object": "model"}, {"id": "other", "object": "model"}]}),
        ),
        ("/v1/models", _) => Response::json(401, &serde_json::json!({"error": {"message": "Incorrect API key provided"}})),
        _ => Response::new(404),
    })
    .await;
    let broker = Mosquitto::start().await;
    let tg = FakeTelegram::start("123:doctor").await;
    let extra = format!(
        "[telegram]\ntoken = \"123:doctor\"\napi_base = \"{}\"\nallow_from = [1]\n[mqtt]\nurl = \"{}\"\n",
        tg.url(),
        broker.url()
    );
    let home = TestHome::new("openai", &format!("{}/v1", models.url()), "", "", &extra);
    let cfg = home.config.to_str().unwrap().to_string();
    let out = bramble(home.path(), &["--config", &cfg, "doctor"], None).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let line = |what: &str| line_of(&stdout, what);
    assert!(line("config").starts_with("ok"), "{stdout}");
    let provider = line("provider openai");
    assert!(
        provider.starts_with("ok")
            && provider.contains("key set; reachable (GET ")
            && provider.contains("/v1/models: HTTP 200, 2 models; no tokens spent)"),
        "{provider}"
    );
    assert_eq!(line("telegram"), format!("ok       telegram         the bot is @{BOT_USERNAME} (id {BOT_ID})"));
    let mqtt = line("mqtt");
    assert!(mqtt.starts_with("ok") && mqtt.contains("-doctor (MQTT 5, plain)"), "{mqtt}");
    assert!(line("sandbox").starts_with("ok") || line("sandbox").starts_with("warning"), "{stdout}");
    assert!(line("disk").starts_with("ok") && line("disk").contains("MiB free"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("0 errors")), "{stdout}");

    // A refused key, a bad bot token and a broker that is gone: each an error with the fix, exit 1.
    let bad = std::fs::read_to_string(&home.config).unwrap().replace("api_key = \"test-key\"", "api_key = \"wrong\"");
    std::fs::write(&home.config, bad).unwrap();
    tg.fail_next("getMe", 401, "Unauthorized", None);
    drop(broker);
    let out = bramble(home.path(), &["--config", &cfg, "doctor"], None).await;
    let stdout = text(&out.stdout);
    let line = |what: &str| line_of(&stdout, what);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let provider = line("provider openai");
    assert!(
        provider.starts_with("error") && provider.contains("Incorrect API key provided: check the key"),
        "{provider}"
    );
    assert!(line("telegram").contains("the token is wrong; get it again from @BotFather"), "{stdout}");
    assert!(line("mqtt").starts_with("error"), "{stdout}");
    assert!(stdout.contains("3 errors"), "{stdout}");
}

#[tokio::test]
async fn completions_and_the_man_page_come_from_the_cli_definition() {
    let dir = tempfile::tempdir().unwrap();
    let bash = text(&bramble(dir.path(), &["completions", "bash"], None).await.stdout);
    assert!(bash.contains("complete -F _bramble") && bash.contains("doctor") && bash.contains("--ha-button"), "{bash}");
    let zsh = text(&bramble(dir.path(), &["completions", "zsh"], None).await.stdout);
    assert!(zsh.starts_with("#compdef bramble"), "{zsh}");
    let fish = text(&bramble(dir.path(), &["completions", "fish"], None).await.stdout);
    assert!(fish.contains("complete -c bramble"), "{fish}");
    let man = text(&bramble(dir.path(), &["man"], None).await.stdout);
    assert!(man.contains(".TH bramble 1") && man.contains(env!("BRAMBLE_VERSION")) && man.contains("doctor"), "{man}");
    let out = bramble(dir.path(), &["completions", "tcsh"], None).await;
    assert_eq!(out.status.code(), Some(2));
}

/// The doctor's line about `what` (after its 9-column level).
fn line_of(stdout: &str, what: &str) -> String {
    stdout
        .lines()
        .find(|l| l.get(9..).is_some_and(|rest| rest.starts_with(what)))
        .unwrap_or_else(|| panic!("{what}: {stdout}"))
        .to_string()
}

#[tokio::test]
async fn a_watcher_calls_the_model_only_when_its_output_changes() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let cfg = home.config.to_str().unwrap().to_string();
    let reading = home.workspace.join("reading.txt");
    std::fs::write(&reading, "20.0\n").unwrap();
    let run = |args: Vec<&str>| {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend(args);
        let all: Vec<String> = all.into_iter().map(String::from).collect();
        let home = home.path().to_path_buf();
        async move {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            bramble(&home, &refs, None).await
        }
    };
    let out = run(vec![
        "cron",
        "add",
        "temp",
        "--every",
        "5m",
        "--watch",
        "cat reading.txt",
        "--message",
        "The reading is {output} (was {previous}). Say if it is dangerous.",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("watch:    cat reading.txt (the turn runs when: changed)"),
        "{}",
        text(&out.stdout)
    );

    // The first reading is news: one turn, with the output in the message.
    fake.push(Reply::text("20.0 is fine."));
    let out = run(vec!["cron", "run", "temp"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let asked = fake.last_request().unwrap().to_string();
    assert!(asked.contains("The reading is 20.0 (was (nothing: this is the first reading))"), "{asked}");

    // Ten polls of the same value: no model call, no report.
    for _ in 0..10 {
        let out = run(vec!["cron", "run", "temp"]).await;
        assert_eq!(text(&out.stdout).trim(), "no change (no model call)");
    }
    assert_eq!(fake.request_count(), 1, "unchanged polls cost no model call");

    // It changes: one turn, with the previous reading.
    std::fs::write(&reading, "31.5\n").unwrap();
    fake.push(Reply::text("31.5 is hot."));
    let out = run(vec!["cron", "run", "temp"]).await;
    assert!(text(&out.stdout).starts_with("31.5 is hot."), "{}", text(&out.stdout));
    let asked = fake.last_request().unwrap().to_string();
    assert!(asked.contains("The reading is 31.5 (was 20.0)"), "{asked}");
    assert_eq!(fake.request_count(), 2, "12 polls, 2 changes, 2 model calls");

    let out = run(vec!["cron", "show", "temp"]).await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("kind:      watch") && stdout.contains("last seen: 31.5"), "{stdout}");
    assert_eq!(stdout.matches("no change (no model call)").count(), 9, "history keeps the last 10 runs: {stdout}");

    // A failing watch command is an error in the history, and no model call.
    std::fs::remove_file(&reading).unwrap();
    let out = run(vec!["cron", "run", "temp"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("the watch command failed"), "{}", text(&out.stderr));
    assert_eq!(fake.request_count(), 2);

    // exit-nonzero: the turn runs when the command fails.
    let out = run(vec![
        "cron",
        "add",
        "disk",
        "--every",
        "1h",
        "--watch",
        "test -e ok-marker",
        "--watch-mode",
        "exit-nonzero",
        "--message",
        "The check failed: {output}",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    fake.push(Reply::text("The marker is gone."));
    let out = run(vec!["cron", "run", "disk"]).await;
    assert!(text(&out.stdout).starts_with("The marker is gone."), "{}", text(&out.stdout));
    assert!(fake.last_request().unwrap().to_string().contains("The check failed: Exit code: 1"));
    std::fs::write(home.workspace.join("ok-marker"), "").unwrap();
    let out = run(vec!["cron", "run", "disk"]).await;
    assert_eq!(text(&out.stdout).trim(), "the command succeeded (no model call)");
    let out = run(vec!["cron", "add", "x", "--every", "1h", "--watch", "true", "--remind", "r"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--model and --watch are for --message jobs"), "{}", text(&out.stderr));
}

#[tokio::test]
async fn jitter_max_runs_and_until_are_kept_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let args = [
        "cron",
        "add",
        "tea",
        "--cron",
        "0 16 * * *",
        "--remind",
        "Tea",
        "--jitter",
        "5m",
        "--max-runs",
        "3",
        "--until",
        "2031-01-01 00:00",
    ];
    let out = bramble(home, &args, None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("jitter:   up to 5m (this job starts "), "{stdout}");
    assert!(stdout.contains("runs:     0 of 3") && stdout.contains("until:    2031-01-01 00:00"), "{stdout}");
    let show = text(&bramble(home, &["cron", "show", "tea"], None).await.stdout);
    assert!(show.contains("jitter:    up to 5m") && show.contains("runs:      0 of 3"), "{show}");
    for (bad, why) in [
        (vec!["--max-runs", "0"], "--max-runs must be at least 1"),
        (vec!["--until", "2020-01-01 00:00"], "is already past"),
        (vec!["--jitter", "soon"], "--jitter:"),
    ] {
        let mut a = vec!["cron", "add", "bad", "--every", "1h", "--remind", "x"];
        a.extend(bad);
        let out = bramble(home, &a, None).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains(why), "{why}: {}", text(&out.stderr));
    }
}

#[tokio::test]
async fn a_job_failing_in_a_row_raises_one_alert_and_one_recovery_note() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new(
        "openai",
        &fake.base_url(),
        "",
        "",
        "[alerts]\ndeliver = [\"mqtt:alerts\"]\nafter_failures = 2\n",
    );
    let cfg = home.config.to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut all = vec!["--config".to_string(), cfg.clone()];
        all.extend(args.iter().map(|a| a.to_string()));
        let home = home.path().to_path_buf();
        async move {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            bramble(&home, &refs, None).await
        }
    };
    let out = run(&["cron", "add", "backup", "--every", "1d", "--exec", "test -e backup-ok"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let alerts = || {
        let outbox = std::fs::read_to_string(home.state.join("outbox.jsonl")).unwrap_or_default();
        let count = |needle: &str| outbox.lines().filter(|l| l.starts_with("{\"add\":") && l.contains(needle)).count();
        (count("Alert: job `backup` has failed 2 times in a row"), count("Recovered: job `backup` works again"))
    };
    for _ in 0..4 {
        assert_eq!(run(&["cron", "run", "backup"]).await.status.code(), Some(1));
    }
    assert_eq!(alerts(), (1, 0), "one alert for four failures, at the second");
    std::fs::write(home.workspace.join("backup-ok"), "").unwrap();
    assert_eq!(run(&["cron", "run", "backup"]).await.status.code(), Some(0));
    assert_eq!(run(&["cron", "run", "backup"]).await.status.code(), Some(0));
    assert_eq!(alerts(), (1, 1), "one recovery note");
    // Failing again starts a new incident: a new alert at the second failure.
    std::fs::remove_file(home.workspace.join("backup-ok")).unwrap();
    run(&["cron", "run", "backup"]).await;
    assert_eq!(alerts(), (1, 1));
    run(&["cron", "run", "backup"]).await;
    assert_eq!(alerts(), (2, 1));
}

/// The bytes a terminal would act on: ESC, BEL and C1's CSI (U+009B, in UTF-8 `C2 9B`).
fn raw_controls(out: &[u8]) -> Vec<u8> {
    out.iter().copied().filter(|b| matches!(b, 0x1b | 0x07 | 0x9b)).collect()
}

/// Issue 36: an audit entry keeps the command as it was asked; `bramble audit`
/// printed it raw, so an OSC 52 in it wrote the owner's clipboard. Now every
/// control character is shown escaped (the model's answer printed by
/// `bramble agent` too).
#[tokio::test]
async fn audit_prints_recorded_commands_with_their_controls_escaped() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let evil = "echo \u{1b}]52;c;Y3VybCBldmlsIHwgc2g=\u{7}\u{9b}2J\u{202e}done";
    let args = serde_json::json!({ "command": evil }).to_string();
    fake.push(Reply::ToolCalls(vec![("exec".into(), args)]));
    fake.push(Reply::Text("Done \u{1b}]0;owned\u{7}".into()));
    let cfg = home.config.to_str().unwrap();
    let out = bramble(home.path(), &["--config", cfg, "agent", "-m", "run it"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(raw_controls(&out.stdout), b"", "{:?}", text(&out.stdout));
    assert_eq!(text(&out.stdout), "Done \\x1b]0;owned\\x07\n");
    let recorded = std::fs::read_to_string(home.state.join("audit.jsonl")).unwrap();
    assert!(recorded.contains(r#"\u001b]52;c;"#), "the record keeps what was asked: {recorded}");

    let out = bramble(home.path(), &["--config", cfg, "audit", "--since", "1h"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(raw_controls(&out.stdout), b"", "{shown:?}");
    assert!(
        shown.contains(r"exec           ok      echo \x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\u{9b}2J\u{202e}done"),
        "{shown}"
    );
}

/// `cron show` prints a job's run history (its output), `cron run` the
/// output itself: a command's escape sequences are shown, never run.
#[tokio::test]
async fn cron_show_and_run_print_job_output_with_its_controls_escaped() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let cfg = home.config.to_str().unwrap();
    let printf = r"printf '\033]52;c;ZXZpbA==\007\302\233 31m\342\200\256 done'";
    let add = ["--config", cfg, "cron", "add", "esc", "--every", "1h", "--exec", printf];
    let out = bramble(home.path(), &add, None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = bramble(home.path(), &["--config", cfg, "cron", "run", "esc"], None).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(raw_controls(&out.stdout), b"", "{:?}", text(&out.stdout));
    assert!(text(&out.stdout).contains(r"\x1b]52;c;ZXZpbA==\x07\u{9b} 31m\u{202e} done"), "{}", text(&out.stdout));

    let out = bramble(home.path(), &["--config", cfg, "cron", "show", "esc"], None).await;
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(raw_controls(&out.stdout), b"", "{shown:?}");
    let run = shown.lines().find(|l| l.contains("ZXZpbA==") && !l.contains("command:")).expect(&shown);
    assert!(run.contains(r"\x1b]52;c;ZXZpbA==\x07\u{9b} 31m\u{202e} done"), "{shown}");
}

/// An error quotes what it was given (a name, a server's answer): `bramble`
/// prints it with its control characters escaped.
#[tokio::test]
async fn errors_quote_their_input_with_controls_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let out =
        bramble(dir.path(), &["cron", "add", "a\u{1b}]52;c;eA==\u{7}b", "--every", "1h", "--remind", "x"], None).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(raw_controls(&out.stderr), b"", "{:?}", text(&out.stderr));
    assert!(text(&out.stderr).contains(r"`a\x1b]52;c;eA==\x07b` is not a job name"), "{}", text(&out.stderr));
}

/// `bramble cron next` prints what the scheduler will do (Debian's cron rules
/// across DST, the day rule), refuses what cannot work with the fix, and a
/// job's times are shown in its own zone.
#[tokio::test]
async fn cron_next_prints_the_runs_the_scheduler_will_make() {
    let home = TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "");
    let cfg = home.config.to_str().unwrap().to_string();
    let run = |args: Vec<&str>| {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend(args);
        let all: Vec<String> = all.into_iter().map(str::to_string).collect();
        let home = home.path().to_path_buf();
        async move {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            bramble(&home, &args, None).await
        }
    };
    let out =
        run(vec!["cron", "next", "30 1-3 * * *", "--tz", "Europe/Berlin", "--from", "2026-10-24T22:00:00Z", "-n", "4"])
            .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("cron `30 1-3 * * *` (Europe/Berlin): At minute 30"), "{stdout}");
    assert!(stdout.contains("fixed-time"), "{stdout}");
    let times: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(times.len(), 4, "{stdout}");
    assert!(times[1].contains("2026-10-25 02:30:00 CEST (+02:00)"), "{stdout}");
    assert!(times[2].contains("2026-10-25 03:30:00 CET (+01:00)"), "the repeated 02:30 runs once: {stdout}");
    // The "first Sunday" idiom runs on one day a month.
    let out =
        run(vec!["cron", "next", "1 1 1-7 * */7", "--tz", "UTC", "--from", "2026-11-01T02:00:00Z", "-n", "2"]).await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("(if it is also Sunday)") && stdout.contains("Sun 2026-12-06 01:01:00"), "{stdout}");
    for (expr, why) in [
        ("0 22-2 * * *", "write it as two, like `22-23,0-2`"),
        ("@reboot", "@reboot is not supported"),
        ("0 0 30 2 *", "can never fire: day 30 does not occur in February"),
    ] {
        let out = run(vec!["cron", "next", expr]).await;
        assert_eq!(out.status.code(), Some(1), "{expr}");
        assert!(text(&out.stderr).contains(why), "{expr}: {}", text(&out.stderr));
    }
    // A job in its own zone shows its next run there (the config's zone is UTC).
    let out = run(vec!["cron", "add", "ny", "--cron", "0 9 * * *", "--tz", "America/New_York", "--remind", "hi"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let next = stdout.lines().find(|l| l.contains("next run:")).unwrap_or_default();
    assert!(next.contains("09:00:00 E"), "{stdout}");
    let out = run(vec!["cron", "list"]).await;
    assert!(text(&out.stdout).contains(" 09:00 E"), "{}", text(&out.stdout));
}

/// An exec job that worked reports what it printed; "Exit code: 0" is for the
/// model's tool results, not the person reading the report. One that failed
/// still says how it ended.
#[tokio::test]
async fn an_exec_jobs_report_is_what_it_printed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let out = bramble(home, &["init"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for (name, command) in [("said", "echo 42 degrees"), ("quiet", "true"), ("broke", "echo half; exit 3")] {
        let out = bramble(home, &["cron", "add", name, "--every", "1d", "--exec", command], None).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let out = bramble(home, &["cron", "run", "said"], None).await;
    let report = |out: &Output| text(&out.stdout).split("\n\n(report queued").next().unwrap_or_default().to_string();
    assert_eq!(report(&out), "42 degrees", "{}", text(&out.stderr));
    let out = bramble(home, &["cron", "run", "quiet"], None).await;
    assert_eq!(report(&out), "Done (the command printed nothing).", "{}", text(&out.stderr));
    let out = bramble(home, &["cron", "run", "broke"], None).await;
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("half") && all.contains("Exit code: 3"), "{all}");
}

/// Under systemd `ExecReload=bramble check --reload` writes to the journal:
/// its errors carry journald's `<3>` prefix, so they are errors there (a
/// plain line is filed at priority 6, which `journalctl -p warning` hides).
/// Outside the journal the text is plain.
#[tokio::test]
async fn a_refused_reload_is_an_error_in_the_journal() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[heartbeat]\nevery = \"soon\"\n").unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&write))).unwrap();
    let run = |journal: Option<String>, stderr: std::process::Stdio| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        cmd.args(["--config", cfg.to_str().unwrap(), "check", "--reload"])
            .env_clear()
            .env("HOME", dir.path())
            .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
            .stdout(std::process::Stdio::null())
            .stderr(stderr);
        if let Some(j) = journal {
            cmd.env("JOURNAL_STREAM", j);
        }
        cmd.status().unwrap()
    };
    let status = run(Some(format!("{}:{}", meta.dev(), meta.ino())), std::process::Stdio::from(write));
    assert_eq!(status.code(), Some(1));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut text).unwrap();
    assert!(!text.is_empty());
    assert!(text.lines().all(|l| l.starts_with("<3>")), "every line an error for journald: {text}");
    assert!(text.contains("config.toml:2:") && text.contains("not reloaded"), "{text}");

    // A terminal (or any other stderr) gets the plain text.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", cfg.to_str().unwrap(), "check", "--reload"])
        .env_clear()
        .env("HOME", dir.path())
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .output()
        .unwrap();
    let plain = String::from_utf8_lossy(&out.stderr);
    assert!(plain.contains("config.toml:2:") && !plain.contains("<3>"), "{plain}");
}

/// A config file that is not there has no line and column to point at: the
/// error says so plainly and what to do.
#[tokio::test]
async fn a_missing_config_file_is_named_without_a_made_up_position() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let out = bramble(dir.path(), &["--config", missing.to_str().unwrap(), "check"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with(&format!("{}: cannot read the config file", missing.display())), "{err}");
    assert!(!err.contains(":1:1"), "{err}");
    assert!(err.contains("bramble init"), "{err}");
}
