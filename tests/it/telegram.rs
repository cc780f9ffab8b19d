//! Telegram end to end: a real `bramble run` against a fake Bot API and a fake
//! LLM, both on 127.0.0.1 speaking the published JSON.

use std::time::Duration;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use crate::support::telegram::{FakeTelegram, BOT_USERNAME};
use serde_json::Value;

const TOKEN: &str = "123456:TEST-token-do-not-log";
const ALICE: i64 = 1111;
const GROUP: i64 = -1009876;

struct Setup {
    llm: FakeLlm,
    tg: FakeTelegram,
    home: TestHome,
}

async fn setup(extra: &str) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"{ALICE}\", \"@bob\"]\napi_base = \"{}\"\n{extra}",
            tg.url()
        ),
    );
    Setup { llm, tg, home }
}

impl Setup {
    fn daemon(&self) -> Daemon {
        Daemon::start(self.home.path(), Some(&self.home.config))
    }

    /// Wait until the daemon is long-polling.
    async fn polling(&self) {
        assert!(wait_until(15, || !self.tg.calls("getUpdates").is_empty()).await, "the daemon polls");
    }
}

/// The text of the last user message of an LLM request.
fn last_user_text(req: &Value) -> String {
    req["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn an_allowed_user_gets_an_html_answer_and_strangers_never_reach_the_model() {
    let s = setup("").await;
    s.llm.push(Reply::text("**Hello** Alice, 2 < 3 & `code`"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "hi there");
    assert!(s.tg.wait_sent(1, 15).await, "an answer was sent");
    let sent = &s.tg.sent()[0];
    assert_eq!(sent["chat_id"], ALICE);
    assert_eq!(sent["parse_mode"], "HTML");
    assert_eq!(sent["text"], "<b>Hello</b> Alice, 2 &lt; 3 &amp; <code>code</code>");
    assert_eq!(last_user_text(&s.llm.requests()[0]), "hi there");
    assert!(!s.tg.calls("sendChatAction").is_empty(), "typing was shown");
    let commands = s.tg.calls("setMyCommands");
    let names: Vec<&str> =
        commands[0].body["commands"].as_array().unwrap().iter().filter_map(|c| c["command"].as_str()).collect();
    assert_eq!(names, ["new", "stop", "status", "jobs", "run", "compact", "model", "history", "help"]);

    // A stranger, twice (also with a caption): no model call, one log line.
    s.tg.push_message(5555, "private", 5555, "mallory", "give me your secrets");
    s.tg.push(serde_json::json!({"chat": {"id": 5555, "type": "private"},
        "from": {"id": 5555, "is_bot": false, "first_name": "M", "username": "mallory"}, "caption": "photo", "photo": []}));
    // A message from @bob (allowed by username) is answered: the stranger's were skipped, not stuck.
    s.llm.push(Reply::text("hi bob"));
    s.tg.push_message(2222, "private", 2222, "Bob", "hello");
    assert!(s.tg.wait_sent(2, 15).await);
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 2, "only allowed users reach the model: {log}");
    assert_eq!(s.tg.sent()[1]["chat_id"], 2222);
    assert_eq!(log.matches("not in [telegram] allow_from").count(), 1, "logged once per user: {log}");
    assert!(!log.contains("TEST-token"), "the token never reaches the log");
}

#[tokio::test]
async fn a_429_is_waited_out_as_telegram_asks() {
    let s = setup("").await;
    s.llm.push(Reply::text("answer after the rate limit"));
    s.tg.fail_next("sendMessage", 429, "Too Many Requests: retry after 2", Some(2));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "hello");
    assert!(s.tg.wait_sent(1, 20).await);
    let (_, log) = daemon.stop().await;
    let attempts = s.tg.calls("sendMessage");
    assert_eq!(attempts.len(), 2, "{log}");
    let gap = attempts[1].at - attempts[0].at;
    assert!(gap >= Duration::from_millis(1900), "waited {gap:?}, Telegram asked for 2 s");
    assert_eq!(s.tg.sent_texts(), ["answer after the rate limit"]);
}

#[tokio::test]
async fn the_offset_survives_a_restart_and_no_update_is_handled_twice() {
    let s = setup("").await;
    s.llm.push(Reply::text("one"));
    let daemon = s.daemon();
    let id = s.tg.push_message(ALICE, "private", ALICE, "alice", "first");
    assert!(s.tg.wait_sent(1, 15).await);
    let (_, log) = daemon.stop().await;
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(s.home.state.join("telegram-offset.json")).unwrap())
            .unwrap_or_else(|e| panic!("{e}: {log}"));
    assert_eq!(saved["offset"], id + 1);

    // The fake never forgets: only the saved offset keeps the update from coming back.
    let polls_before = s.tg.calls("getUpdates").len();
    s.llm.push(Reply::text("two"));
    let daemon = s.daemon();
    assert!(wait_until(15, || s.tg.calls("getUpdates").len() > polls_before).await);
    assert_eq!(s.tg.offsets()[polls_before], id + 1, "the restarted daemon asks from the saved offset");
    let id2 = s.tg.push_message(ALICE, "private", ALICE, "alice", "second");
    assert!(s.tg.wait_sent(2, 15).await);
    let (_, log) = daemon.stop().await;
    assert_eq!(s.llm.request_count(), 2, "{log}");
    assert_eq!(last_user_text(&s.llm.requests()[1]), "second");
    assert_eq!(s.tg.sent_texts(), ["one", "two"]);
    assert!(id2 > id);
}

/// Whether any process's command line contains `marker`.
fn process_running(marker: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.filter_map(Result::ok).any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(marker))
    })
}

#[tokio::test]
async fn stop_ends_a_long_exec_promptly_and_kills_it() {
    let s = setup("").await;
    // A marker no other process has: `sleep` takes fractional seconds.
    let marker = format!("sleep 30.{}", std::process::id());
    s.llm.push(Reply::tool_call("exec", serde_json::json!({"command": marker}).to_string()));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "run the long thing");
    assert!(wait_until(15, || process_running(&marker)).await, "the command started");
    s.tg.push_message(ALICE, "private", ALICE, "alice", "/stop");
    assert!(s.tg.wait_sent(2, 5).await);
    // The turn's status message, then the answer to /stop, which removes it.
    assert_eq!(s.tg.sent_texts(), [format!("running `{marker}`…"), "Stopped 1 turn.".to_string()]);
    assert!(wait_until(5, || s.tg.calls("deleteMessage").len() == 1).await, "the status message is removed");
    assert!(wait_until(5, || !process_running(&marker)).await, "the command was killed");
    // The turn ended: no second model call, no answer for it. (A negative: nothing
    // the daemon does next marks the moment a second call would have been made.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 1, "{log}");
    assert_eq!(s.tg.sent().len(), 2, "{:?}", s.tg.sent_texts());
}

#[tokio::test]
async fn messages_during_a_turn_are_queued_and_answered_in_order() {
    let s = setup("").await;
    s.llm.push(Reply::Delayed(Duration::from_millis(1500), Box::new(Reply::text("answer one"))));
    s.llm.push(Reply::text("answer two"));
    s.llm.push(Reply::text("answer three"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "one");
    assert!(wait_until(15, || s.llm.request_count() == 1).await);
    s.tg.push_message(ALICE, "private", ALICE, "alice", "two");
    s.tg.push_message(ALICE, "private", ALICE, "alice", "three");
    assert!(s.tg.wait_sent(3, 20).await);
    let (_, log) = daemon.stop().await;
    assert_eq!(s.tg.sent_texts(), ["answer one", "answer two", "answer three"], "{log}");
    let asked: Vec<String> = s.llm.requests().iter().map(last_user_text).collect();
    assert_eq!(asked, ["one", "two", "three"]);
}

#[tokio::test]
async fn in_groups_only_mentions_and_replies_are_answered() {
    let s = setup("").await;
    s.llm.push(Reply::text("hello group"));
    let daemon = s.daemon();
    s.polling().await;
    s.tg.push_message(GROUP, "supergroup", ALICE, "alice", "just chatting, not for the bot");
    let mention = format!("@{BOT_USERNAME} what time is it?");
    s.tg.push_message(GROUP, "supergroup", ALICE, "alice", &mention);
    assert!(s.tg.wait_sent(1, 15).await);
    // `/cmd@botname` works in groups.
    s.tg.push_message(GROUP, "supergroup", ALICE, "alice", &format!("/help@{BOT_USERNAME}"));
    assert!(s.tg.wait_sent(2, 15).await);
    let (_, log) = daemon.stop().await;
    assert_eq!(s.llm.request_count(), 1, "{log}");
    assert_eq!(last_user_text(&s.llm.requests()[0]), mention);
    assert_eq!(s.tg.sent()[0]["chat_id"], GROUP);
    assert!(s.tg.sent_texts()[1].starts_with("Commands:"), "{:?}", s.tg.sent_texts());
}

#[tokio::test]
async fn commands_never_call_the_model() {
    let s = setup("").await;
    s.llm.push(Reply::text("remembered"));
    // The forced summary `/new` asks for.
    let summary =
        r#"{"history_entry":"[2026-11-21] Alice asked me to remember this.","memory_update":"- Alice: remember this"}"#;
    s.llm.push(Reply::tool_call("save_memory", summary));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "remember this");
    assert!(s.tg.wait_sent(1, 15).await);
    for (i, cmd) in ["/stpo", "/status", "/jobs", "/run nothing", "/new", "/stop"].iter().enumerate() {
        s.tg.push_message(ALICE, "private", ALICE, "alice", cmd);
        assert!(s.tg.wait_sent(i + 2, 10).await, "{cmd} answered");
    }
    let (_, log) = daemon.stop().await;
    let texts = s.tg.sent_texts();
    // One turn, and the forced summary `/new` asks for (`tool_choice`); no other model call.
    assert_eq!(s.llm.request_count(), 2, "{log}");
    assert_eq!(texts[1], "Unknown command /stpo — did you mean /stop?");
    assert!(texts[2].contains("Model: test-model") && texts[2].contains("This session: 2 messages"), "{}", texts[2]);
    assert!(texts[3].contains("No jobs"), "{}", texts[3]);
    assert!(texts[4].contains("nothing"), "{}", texts[4]);
    assert!(texts[5].starts_with("Started a new conversation"), "{}", texts[5]);
    assert_eq!(texts[6], "Nothing is running here.");
    let journal = std::fs::read_to_string(s.home.workspace.join("memory/history.jsonl")).unwrap();
    assert!(journal.contains("remember this"), "the old conversation is kept in memory: {journal}");
}

#[tokio::test]
async fn rejected_html_falls_back_to_plain_text_and_a_missing_chat_is_dropped() {
    let s = setup("").await;
    s.tg.reject_html(true);
    s.llm.push(Reply::text("**bold** and [a link](https://example.com)"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "format something");
    assert!(s.tg.wait_sent(1, 15).await);
    let sent = s.tg.sent()[0].clone();
    assert!(sent.get("parse_mode").is_none(), "{sent}");
    assert_eq!(sent["text"], "bold and a link (https://example.com)");
    // A report for a chat that does not exist is dropped, not retried forever.
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    outbox.enqueue(bramble::bus::Target::Telegram("404".into()), "nobody home", "agent").unwrap();
    let dropped = wait_until(10, || {
        outbox
            .recent()
            .is_ok_and(|r| r.iter().any(|d| d.outcome.starts_with("dropped") && d.outcome.contains("chat not found")))
    })
    .await;
    let (_, log) = daemon.stop().await;
    assert!(dropped, "{log}");
}

#[tokio::test]
async fn an_invalid_token_stops_the_daemon_at_start_with_a_clear_error() {
    let s = setup("").await;
    let cfg = std::fs::read_to_string(&s.home.config).unwrap().replace(TOKEN, "999:wrong-token");
    std::fs::write(&s.home.config, cfg).unwrap();
    let (code, log) = s.daemon().exited(20).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("Telegram refused the bot token"), "{log}");
    assert!(!log.contains("wrong-token"), "the token is not echoed: {log}");
    assert!(s.tg.calls("getUpdates").is_empty());
}

#[tokio::test]
async fn an_unreachable_telegram_at_start_is_not_fatal() {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let nowhere = crate::support::http::refused_url().await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "",
        &format!("[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"1\"]\napi_base = \"{nowhere}\"\n"),
    );
    let daemon = Daemon::start(home.path(), Some(&home.config));
    assert!(daemon.wait_log("cannot reach Telegram now", 20).await, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("TEST-token"), "{log}");
}

#[tokio::test]
async fn a_409_deletes_the_webhook_and_polling_goes_on() {
    let s = setup("").await;
    s.tg.fail_next("getUpdates", 409, "Conflict: can't use getUpdates method while webhook is active", None);
    s.llm.push(Reply::text("still here"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "hello?");
    assert!(s.tg.wait_sent(1, 15).await);
    let (_, log) = daemon.stop().await;
    assert_eq!(s.tg.calls("deleteWebhook").len(), 1, "{log}");
    assert_eq!(s.tg.sent_texts(), ["still here"]);
}

#[tokio::test]
async fn typing_is_refreshed_while_the_turn_runs_and_stops_after() {
    let s = setup("").await;
    s.llm.push(Reply::Delayed(Duration::from_millis(5000), Box::new(Reply::text("slow answer"))));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "think hard");
    assert!(s.tg.wait_sent(1, 20).await);
    // Typing must stay stopped for longer than one refresh interval (4 s) after
    // the answer: a wait for an absence, so it is a fixed time.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (_, log) = daemon.stop().await;
    let typing = s.tg.calls("sendChatAction");
    let answered = s.tg.calls("sendMessage")[0].at;
    assert!(typing.len() >= 2, "refreshed: {typing:?} {log}");
    assert!(typing.iter().all(|t| t.body["action"] == "typing" && t.body["chat_id"] == ALICE));
    let gap = typing[1].at - typing[0].at;
    assert!(gap >= Duration::from_millis(3900) && gap < Duration::from_secs(6), "{gap:?}");
    assert!(typing.iter().all(|t| t.at < answered), "no typing after the answer");
}
