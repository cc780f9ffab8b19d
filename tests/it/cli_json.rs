//! `bramble status --json` and `bramble doctor --json` through the real
//! binary (issue 37): the JSON parses, carries the fields `--help` documents,
//! and says what the text says on the same home, since both are rendered
//! from one collected value; doctor's exit status is the text mode's.

use serde_json::Value;

use crate::support::setup::{bramble, TestHome};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A home whose provider is at a port nothing listens on.
fn dead_provider_home() -> TestHome {
    TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "")
}

async fn run(home: &TestHome, args: &[&str]) -> std::process::Output {
    let cfg = home.config.to_str().unwrap().to_string();
    let mut all = vec!["--config", cfg.as_str()];
    all.extend(args);
    bramble(home.path(), &all, None).await
}

/// The text's value after `label` (a line `label:   value`).
fn field<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")).map(str::trim))
        .unwrap_or_else(|| panic!("no {label}: line in {stdout}"))
}

/// The top-level fields `status --help` documents: each is in the JSON.
const STATUS_FIELDS: &[&str] = &[
    "source",
    "daemon_pid",
    "config",
    "env_file",
    "env_file_daemon",
    "providers",
    "model",
    "fallback",
    "fallback_cooldown",
    "time_zone",
    "workspace",
    "workspace_exists",
    "state_dir",
    "daemon",
    "service",
    "tools",
    "channels",
    "mcp",
    "channels_error",
    "exec",
    "web_search",
    "telegram",
    "mqtt",
    "matrix",
    "policy",
    "homeassistant",
    "webhooks",
    "email",
    "signal",
    "feishu",
    "discord",
    "ntfy",
    "fleet",
    "secrets_from",
    "private",
    "sessions",
    "tokens_today",
    "daily_token_budget",
    "skills",
    "skills_available",
    "skills_with_errors",
    "clock",
    "heartbeat",
    "job_count",
    "jobs",
    "jobs_error",
    "job_store_notice",
    "undelivered",
    "outbox",
    "outbox_error",
    "alerts_deliver",
    "open_alerts",
    "alerts",
];

#[tokio::test]
async fn status_json_has_the_documented_fields_and_agrees_with_the_text() {
    let home = dead_provider_home();
    for add in [
        &["cron", "add", "tea", "--every", "1h", "--remind", "tea"][..],
        &["cron", "add", "dentist", "--at", "2030-12-02 09:00", "--tz", "Europe/Berlin", "--remind", "go"][..],
    ] {
        let out = run(&home, add).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let plain = run(&home, &["status"]).await;
    let stdout = text(&plain.stdout);
    assert!(plain.status.success(), "{stdout}{}", text(&plain.stderr));
    let out = run(&home, &["status", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));

    let help = text(&run(&home, &["status", "--help"]).await.stdout);
    let keys = json.as_object().unwrap().keys().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(keys.len(), STATUS_FIELDS.len(), "a field not in --help: {keys:?}");
    for name in STATUS_FIELDS {
        assert!(json.get(name).is_some(), "{name} missing: {json:#}");
        assert!(help.contains(&format!("`{name}`")), "{name} not documented in --help: {help}");
    }
    // Read here: no daemon answers.
    assert_eq!(json["source"], "shell");
    assert_eq!(json["daemon_pid"], Value::Null);
    let provider = &json["providers"][0];
    assert_eq!(provider["kind"], "openai");
    assert_eq!(provider["base_url"], "http://127.0.0.1:9/v1");
    assert_eq!(provider["key"]["state"], "set");
    assert_eq!(provider["key_from"], "shell");
    assert_eq!(field(&stdout, "model"), json["model"].as_str().unwrap());
    assert_eq!(field(&stdout, "policy"), json["policy"].as_str().unwrap());
    assert_eq!(field(&stdout, "time zone"), json["time_zone"].as_str().unwrap());
    if let Some(sandbox) = json["exec"]["sandbox"].as_str() {
        assert_eq!(field(&stdout, "sandbox"), sandbox);
    }

    // The jobs: the same count, and each next run the same instant (text in the config's zone, JSON in UTC).
    assert_eq!(json["job_count"], 2);
    assert_eq!(field(&stdout, "jobs"), "2");
    let jobs = json["jobs"].as_array().unwrap();
    let names: Vec<&str> = jobs.iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"tea") && names.contains(&"dentist"), "{names:?}");
    for job in jobs {
        let next: jiff::Timestamp = job["next_run"].as_str().unwrap().parse().unwrap();
        assert!(job["next_run"].as_str().unwrap().ends_with('Z'), "{job}");
        let shown = bramble::scheduler::schedule::local_time(Some(next), &jiff::tz::TimeZone::UTC);
        let name = job["name"].as_str().unwrap();
        let line = format!("  {name:<20} next {shown}");
        assert!(stdout.lines().any(|l| l == line), "{line:?} not in {stdout}");
    }
    let dentist = jobs.iter().find(|j| j["name"] == "dentist").unwrap();
    assert_eq!(dentist["next_run"], "2030-12-02T08:00:00Z", "09:00 in Berlin");

    assert_eq!(json["undelivered"], 0);
    assert_eq!(field(&stdout, "outbox"), "nothing undelivered");
    assert_eq!(json["alerts"], serde_json::json!([]));
    assert!(field(&stdout, "alerts").starts_with("none open"), "{stdout}");
    // Nothing but the object on stdout.
    assert!(text(&out.stdout).trim_start().starts_with('{') && text(&out.stdout).trim_end().ends_with('}'));
}

/// (level, name) of each check line of doctor's text.
fn text_checks(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let tag = ["ok", "warning", "error"].into_iter().find(|t| l.starts_with(&format!("{t} ")))?;
            Some((tag.to_string(), l.get(9..25)?.trim().to_string()))
        })
        .collect()
}

#[tokio::test]
async fn doctor_json_fails_as_the_text_does_with_a_dead_provider() {
    let home = dead_provider_home();
    let plain = run(&home, &["doctor"]).await;
    let out = run(&home, &["doctor", "--json"]).await;
    let stdout = text(&plain.stdout);
    assert_eq!(plain.status.code(), Some(1), "{stdout}");
    assert_eq!(out.status.code(), plain.status.code(), "{}", text(&out.stdout));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(json["result"], "fail");
    let checks = json["checks"].as_array().unwrap();
    for c in checks {
        let keys: Vec<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["detail", "hint", "name", "status"], "{c}");
        assert!(["ok", "warn", "fail", "skip"].contains(&c["status"].as_str().unwrap()), "{c}");
    }
    // The same checks in the same order, each at the text's level (skip prints as ok).
    let from_json: Vec<(String, String)> = checks
        .iter()
        .map(|c| {
            let level = match c["status"].as_str().unwrap() {
                "ok" | "skip" => "ok",
                "warn" => "warning",
                _ => "error",
            };
            (level.to_string(), c["name"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(from_json, text_checks(&stdout), "{stdout}");
    assert_eq!(json["errors"].as_u64().unwrap() as usize, from_json.iter().filter(|(l, _)| l == "error").count());
    let provider = checks.iter().find(|c| c["name"] == "provider openai").unwrap();
    assert_eq!(provider["status"], "fail");
    assert_eq!(provider["hint"], "is http://127.0.0.1:9/v1 right and up?");
    let mqtt = checks.iter().find(|c| c["name"] == "mqtt").unwrap();
    assert_eq!(mqtt["status"], "skip", "not configured");
    assert_eq!(mqtt["hint"], Value::Null);
}

#[tokio::test]
async fn doctor_json_reports_a_broken_config_as_one_failed_check() {
    let home = dead_provider_home();
    std::fs::write(&home.config, "[agent\nmodel = 3\n").unwrap();
    let plain = run(&home, &["doctor"]).await;
    let out = run(&home, &["doctor", "--json"]).await;
    assert_eq!(plain.status.code(), Some(1));
    assert_eq!(out.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(json["result"], "fail");
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 1, "{json:#}");
    assert_eq!(checks[0]["name"], "config");
    assert_eq!(checks[0]["status"], "fail");
    assert!(checks[0]["hint"].as_str().unwrap().contains("bramble check"), "{json:#}");
}

#[tokio::test]
async fn status_json_says_whether_the_running_daemon_answered() {
    use crate::support::daemon::{wait_until, Daemon};
    use crate::support::fake_llm::{Dialect, FakeLlm};
    use std::path::Path;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let cfg = std::fs::read_to_string(&home.config).unwrap();
    std::fs::write(&home.config, cfg.replace("api_key = \"test-key\"", "api_key_env = \"BRAMBLE_IT_JSON_KEY\""))
        .unwrap();
    // The key is in the daemon's environment only.
    let log = home.path().join("daemon.log");
    let daemon =
        Daemon::start_with_env(home.path(), Some(&home.config), &log, &[("BRAMBLE_IT_JSON_KEY", Path::new("k"))]);
    let socket = home.state.join("control.sock");
    assert!(wait_until(30, || socket.exists()).await, "the control socket: {}", daemon.log());
    let status = |home: &TestHome| {
        let home = home.config.clone();
        let dir = home.parent().unwrap().to_path_buf();
        async move {
            let out = bramble(&dir, &["--config", home.to_str().unwrap(), "status", "--json"], None).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
        }
    };
    let json = status(&home).await;
    assert_eq!(json["source"], "daemon", "{json:#}");
    assert_eq!(json["daemon_pid"], daemon.pid());
    assert_eq!(json["providers"][0]["key"]["state"], "set");
    assert_eq!(json["providers"][0]["key_from"], "daemon");
    daemon.stop().await;

    // No daemon: this shell's reading, where the key is not set.
    let json = status(&home).await;
    assert_eq!(json["source"], "shell");
    assert_eq!(json["daemon_pid"], Value::Null);
    assert_eq!(json["providers"][0]["key"], serde_json::json!({"state": "unset", "env": "BRAMBLE_IT_JSON_KEY"}));
    assert_eq!(json["providers"][0]["key_from"], "shell");

    // Something else on the socket, answering nonsense, is not believed.
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            use std::io::Write as _;
            let _ = stream.write_all(b"{\"out\": \"{\\\"pid\\\": 1}\", \"code\": 0}\n");
        }
    });
    let json = status(&home).await;
    assert_eq!(json["source"], "shell", "{json:#}");
    assert_eq!(json["daemon_pid"], Value::Null);
}
