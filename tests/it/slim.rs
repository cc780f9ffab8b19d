//! The slim build (`--no-default-features --features slim`, issue 44) through
//! the real binary: what it leaves out is refused by name, never ignored, and
//! what a user sends it that it cannot take is answered, not lost. Each test
//! runs only in a build without the feature it is about (CI's slim test run).

#![cfg_attr(
    all(feature = "homeassistant", feature = "mcp", feature = "telegram-media"),
    allow(dead_code, unused_imports)
)]

use crate::support::daemon::Daemon;
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::{bramble, TestHome};
use crate::support::telegram::FakeTelegram;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `bramble check` on `config` (in a fresh directory): its exit code and stderr.
async fn check(config: &str) -> (Option<i32>, String, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, config).unwrap();
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "check"], None).await;
    (out.status.code(), text(&out.stderr), cfg, dir)
}

#[tokio::test]
#[cfg(not(feature = "homeassistant"))]
async fn check_and_run_refuse_home_assistant_by_name_with_file_and_line() {
    let config = "[agent]\nmodel = \"m\"\n\n[homeassistant]\nurl = \"http://ha.lan:8123\"\n";
    let (code, err, cfg, dir) = check(config).await;
    assert_eq!(code, Some(1), "{err}");
    let want = format!(
        "{}:4:2: [homeassistant]: this build has no Home Assistant support (feature `homeassistant`)",
        cfg.display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("full `bramble` binary"), "says what to do: {err}");
    // The daemon does not start without it either.
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "run"], None).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("no Home Assistant support"), "{}", text(&out.stderr));
    // The shipped template's empty `[homeassistant]` (every key commented out) asks for nothing.
    let (code, err, _, _) = check("[homeassistant]\n# url = \"http://ha.lan:8123\"\n").await;
    assert_eq!(code, Some(0), "{err}");
}

#[tokio::test]
#[cfg(not(feature = "mcp"))]
async fn mcp_servers_and_the_mcp_command_are_refused_by_name() {
    let (code, err, cfg, dir) = check("[[mcp.server]]\nname = \"x\"\ncommand = \"/bin/true\"\n").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("[mcp]: this build has no MCP support (feature `mcp`)"), "{err}");
    std::fs::write(&cfg, "").unwrap();
    let out = bramble(dir.path(), &["--config", cfg.to_str().unwrap(), "mcp", "list"], None).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("this build has no MCP support (feature `mcp`)"), "{}", text(&out.stderr));
}

#[tokio::test]
#[cfg(not(feature = "web-search"))]
async fn web_search_engines_are_refused_but_turning_search_off_is_fine() {
    let (code, err, _, _) = check("[web]\nsearch = [\"searxng\"]\nsearxng_url = \"http://s.lan\"\n").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(":2:1: [web] search: this build has no web_search tool (feature `web-search`)"), "{err}");
    let (code, err, _, _) = check("[web]\nsearch = []\n").await;
    assert_eq!(code, Some(0), "{err}");
}

#[tokio::test]
#[cfg(not(feature = "telegram-media"))]
async fn a_photo_sent_to_the_slim_build_is_answered_and_text_still_works() {
    const TOKEN: &str = "123456:TEST-slim-token";
    const ALICE: i64 = 1111;
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let tg = FakeTelegram::start(TOKEN).await;
    let section = format!(
        "[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"{ALICE}\"]\napi_base = \"{}\"\n",
        tg.url()
    );
    let home = TestHome::new("openai", &llm.base_url(), "", "max_retries = 0\n", &section);
    tg.add_file("p-l", b"\xff\xd8\xff\xe0jpeg".to_vec(), None, 0);
    llm.push(Reply::text("text still works"));
    let daemon = Daemon::start(home.path(), Some(&home.config));
    tg.push(serde_json::json!({"chat": {"id": ALICE, "type": "private"},
        "from": {"id": ALICE, "is_bot": false, "first_name": "Alice"}, "caption": "what is this?",
        "photo": [{"file_id": "p-l", "file_unique_id": "l", "width": 1280, "height": 960, "file_size": 8}]}));
    assert!(tg.wait_sent(1, 20).await, "{}", daemon.log());
    tg.push_message(ALICE, "private", ALICE, "alice", "hello");
    assert!(tg.wait_sent(2, 20).await, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let sent = tg.sent_texts();
    assert!(sent[0].contains("slim build") && sent[0].contains("`telegram-media`"), "{sent:?}");
    assert_eq!(sent[1], "text still works");
    assert!(tg.downloads().is_empty(), "nothing downloaded");
    assert_eq!(llm.request_count(), 1, "the photo never reached the model");
}
