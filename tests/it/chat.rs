//! The terminal chat (`bramble agent`, issue 37) as a user at a terminal
//! meets it: the real binary on a pseudo-terminal, keys as a terminal sends
//! them (VT100/xterm sequences: `ESC [ D` is Left, `ESC [ A` is Up, 0x03 is
//! Ctrl-C, 0x04 Ctrl-D, CR is Enter), the fake LLM recording what it got.
//! The terminal tests need the `line-editor` feature (on by default).

#[cfg(feature = "line-editor")]
use std::io::Write as _;
#[cfg(feature = "line-editor")]
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde_json::Value;

#[cfg(feature = "line-editor")]
use crate::support::daemon::wait_until;
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;

#[cfg(feature = "line-editor")]
const LEFT: &str = "\x1b[D";
#[cfg(feature = "line-editor")]
const UP: &str = "\x1b[A";
#[cfg(feature = "line-editor")]
const CTRL_C: &str = "\x03";
#[cfg(feature = "line-editor")]
const CTRL_D: &str = "\x04";

#[cfg(feature = "line-editor")]
/// `bramble agent` on a pseudo-terminal.
type Chat = crate::support::pty::Terminal;

#[cfg(feature = "line-editor")]
impl Chat {
    fn start(home: &TestHome) -> Chat {
        let config = home.config.to_str().unwrap();
        Chat::spawn(home.path(), &["--config", config, "agent"], Some("xterm"))
    }

    /// Wait for `what` after what was seen so far.
    async fn after(&mut self, what: &str) {
        let found = wait_until(30, || self.text()[self.seen..].contains(what)).await;
        let all = self.text();
        assert!(found, "no `{what}` after byte {}: {all:?}", self.seen);
        self.seen = all[self.seen..].find(what).map(|i| self.seen + i + what.len()).unwrap();
    }

    /// Wait for the prompt, then type `keys`.
    async fn at_prompt(&mut self, keys: &str) {
        self.after("you> ").await;
        self.input.write_all(keys.as_bytes()).unwrap();
    }

    async fn exit_code(&mut self) -> i32 {
        assert!(wait_until(30, || self.child.try_wait().unwrap().is_some()).await, "still running: {:?}", self.text());
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

/// The text of the last user message the model was sent.
fn last_user_text(fake: &FakeLlm) -> String {
    let req = fake.last_request().expect("a request");
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.iter().rev().find(|m| m["role"] == "user").cloned().unwrap_or(Value::Null);
    match &last["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn home(fake: &FakeLlm) -> TestHome {
    TestHome::new("openai", &fake.base_url(), "", "", "")
}

#[cfg(feature = "line-editor")]
#[tokio::test]
async fn arrow_left_edits_the_line_and_the_model_gets_the_edited_text() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::text("edited fine"));
    let mut chat = Chat::start(&home);
    // Typed "helo wrld", then moved back into the words to fix both.
    chat.at_prompt(&format!("helo wrld{LEFT}{LEFT}{LEFT}o{LEFT}{LEFT}{LEFT}{LEFT}{LEFT}l\r")).await;
    chat.after("edited fine").await;
    let sent = last_user_text(&fake);
    assert!(sent.contains("hello world"), "{sent:?}");
    assert!(!sent.contains('\u{1b}') && !sent.contains("[D"), "{sent:?}");
    chat.at_prompt(CTRL_D).await;
    assert_eq!(chat.exit_code().await, 0);
}

#[cfg(feature = "line-editor")]
#[tokio::test]
async fn up_recalls_the_last_run_and_the_history_file_is_private_and_skips_space_lines() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::text("first answer"));
    fake.push(Reply::text("secret answer"));
    let mut chat = Chat::start(&home);
    chat.at_prompt("what is the weather\r").await;
    chat.after("first answer").await;
    // A line that starts with a space is not kept, as in shells.
    chat.at_prompt(" my private thought\r").await;
    chat.after("secret answer").await;
    chat.at_prompt(CTRL_D).await;
    assert_eq!(chat.exit_code().await, 0);

    let file = home.state.join("chat_history");
    let mode = std::fs::metadata(&file).expect("chat_history").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", file.display());
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(kept.contains("what is the weather") && !kept.contains("private thought"), "{kept}");

    // A second run: Up brings back the first run's line.
    fake.push(Reply::text("recalled"));
    let mut chat = Chat::start(&home);
    chat.at_prompt(&format!("{UP}\r")).await;
    chat.after("recalled").await;
    assert!(last_user_text(&fake).contains("what is the weather"), "{:?}", fake.last_request());
    chat.at_prompt(CTRL_D).await;
    assert_eq!(chat.exit_code().await, 0);
}

#[cfg(feature = "line-editor")]
#[tokio::test]
async fn ctrl_c_at_the_prompt_gives_a_fresh_prompt_and_twice_quits() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::text("still here"));
    let mut chat = Chat::start(&home);
    // Half a line, then Ctrl-C: the line is dropped, the chat goes on and says how to quit.
    chat.at_prompt(&format!("never mind{CTRL_C}")).await;
    chat.after("Ctrl-C again").await;
    chat.at_prompt("next question\r").await;
    chat.after("still here").await;
    let sent = last_user_text(&fake);
    assert!(sent.contains("next question") && !sent.contains("never mind"), "{sent:?}");
    assert_eq!(fake.request_count(), 1);
    chat.at_prompt(CTRL_C).await;
    chat.at_prompt(CTRL_C).await;
    assert_eq!(chat.exit_code().await, 0);
    // Said once, not at every Ctrl-C.
    assert_eq!(chat.text().matches("Ctrl-C again").count(), 1, "{:?}", chat.text());
}

#[tokio::test]
async fn a_piped_chat_reads_plain_lines_and_keeps_no_history() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::text("piped answer"));
    let cfg = home.config.to_str().unwrap();
    let out = crate::support::setup::bramble(home.path(), &["--config", cfg, "agent"], Some("from a script\n")).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(last_user_text(&fake).contains("from a script"));
    assert!(!Path::new(&home.state.join("chat_history")).exists());
}

#[tokio::test]
async fn status_in_the_chat_is_one_block() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::text("noted"));
    let cfg = home.config.to_str().unwrap();
    let out =
        crate::support::setup::bramble(home.path(), &["--config", cfg, "agent"], Some("hello\n/status\nexit\n")).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let block = stdout.split("bramble> ").find(|b| b.starts_with("bramble ")).expect("a /status block");
    let block = block.split("you> ").next().unwrap().trim_end();
    // Each fact once, in one block without a blank line.
    for label in ["model:", "session", "tokens today", "provider:"] {
        assert_eq!(block.to_lowercase().matches(label).count(), 1, "`{label}` in:\n{block}");
    }
    assert!(block.contains("Model: test-model\n") && block.contains("This session: 2 messages, prompt ≈ "), "{block}");
    assert!(!block.contains("\n\n"), "{block}");
}

#[tokio::test]
async fn a_job_made_in_the_chat_says_its_reports_go_only_to_the_log() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home(&fake);
    fake.push(Reply::tool_call("cron", r#"{"action":"add","name":"tea","every":"1h","remind":"Drink tea"}"#));
    fake.push(Reply::text("done"));
    let cfg = home.config.to_str().unwrap();
    let out =
        crate::support::setup::bramble(home.path(), &["--config", cfg, "agent"], Some("remind me of tea hourly\n"))
            .await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // What the tool answered, as the model got it.
    let sent = fake.last_request().unwrap().to_string();
    assert!(sent.contains("Scheduled `tea`") && sent.contains("Its reports go only to the log"), "{sent}");
    assert!(sent.contains("--deliver telegram:<chat id>"), "{sent}");
}
