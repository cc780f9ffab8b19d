//! Signal end to end: a real `bramble run` against a fake signal-cli daemon
//! in HTTP mode ([`crate::support::signal`], built from signal-cli-jsonrpc(5))
//! and a fake LLM; the "people" are envelopes pushed into its event stream.

use std::time::Duration;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use crate::support::signal::{reaction_envelope, text_envelope, FakeSignal};
use serde_json::{json, Value};

const OWNER: &str = "+4915112345678";
const OWNER_UUID: &str = "7ccae375-cd51-4c82-8b1e-7be3280aa485";
const OTHER_UUID: &str = "0b0e6f5a-3c1d-4e2f-9a8b-7c6d5e4f3a2b";
const STRANGER: &str = "+4915199999999";
const BOT: &str = "+4915100000000";

struct Setup {
    llm: FakeLlm,
    fake: FakeSignal,
    home: TestHome,
    log: tempfile::TempDir,
}

async fn setup(endpoint: Option<String>) -> Setup {
    setup_allowing(endpoint, &[OWNER]).await
}

async fn setup_allowing(endpoint: Option<String>, allow: &[&str]) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let fake = FakeSignal::start().await;
    let endpoint = endpoint.unwrap_or_else(|| fake.url());
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[signal]\nendpoint = \"{endpoint}\"\naccount = \"{BOT}\"\n\
             allow_from = {allow:?}\n"
        ),
    );
    Setup { llm, fake, home, log: tempfile::tempdir().unwrap() }
}

impl Setup {
    async fn daemon(&self, log: &str) -> Daemon {
        let d = Daemon::start_logging_to(self.home.path(), Some(&self.home.config), &self.log.path().join(log));
        let n = self.fake.connections();
        assert!(wait_until(30, || self.fake.connections() > n).await, "the stream is open: {}", d.log());
        assert!(d.wait_log("Signal listening", 30).await, "{}", d.log());
        d
    }

    async fn cli(&self, args: &[&str]) -> String {
        let mut all = vec!["--config", self.home.config.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = crate::support::setup::bramble(self.home.path(), &all, None).await;
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    }
}

/// The text of every user message the LLM saw, last of each request.
fn asked(llm: &FakeLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .map(|req: &Value| {
            req["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn remind_job(home: &TestHome, text: &str, target: &str) -> String {
    let store = bramble::scheduler::JobStore::open(&home.state);
    let now = jiff::Timestamp::now();
    let job = bramble::scheduler::Job::new(
        "water",
        bramble::scheduler::Schedule::at(now + Duration::from_secs(2)),
        bramble::scheduler::JobKind::Remind { text: text.into() },
        vec![target.parse().unwrap()],
        now,
        &jiff::tz::TimeZone::UTC,
    )
    .unwrap();
    store.add(job).unwrap().id
}

#[tokio::test]
async fn the_owner_is_answered_and_a_reminder_is_marked_done_by_a_reaction_but_not_a_strangers() {
    let s = setup(None).await;
    s.llm.push(Reply::text("Hello owner"));
    let daemon = s.daemon("happy.log").await;
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_000, "hi there"));
    assert!(s.fake.wait_sent(1, 30).await, "{}", daemon.log());
    let sent = s.fake.sent();
    assert_eq!(sent[0]["message"], "Hello owner");
    assert_eq!(sent[0]["recipient"], json!([OWNER_UUID]), "answered in the owner's chat");
    assert_eq!(sent[0]["account"], BOT);
    assert_eq!(asked(&s.llm), ["hi there"]);
    assert!(!s.fake.calls("sendTyping").is_empty(), "typing was shown: {}", daemon.log());

    // A reminder to the owner's number, then reactions on it: a stranger's does nothing, the owner's is Done.
    let id = remind_job(&s.home, "water the plants", &format!("signal:{OWNER}"));
    assert!(s.fake.wait_sent(2, 30).await, "the reminder was delivered: {}", daemon.log());
    let report = s.fake.sent()[1].clone();
    assert!(report["message"].as_str().unwrap().starts_with("water the plants\n\nReact 👍"), "{report}");
    let ts = s.fake.calls("send").iter().filter(|c| c["ok"] == true).nth(1).unwrap()["timestamp"].as_i64().unwrap();
    s.fake.push(reaction_envelope(STRANGER, OTHER_UUID, 2_000, "👍", ts));
    s.fake.push(reaction_envelope(OWNER, OWNER_UUID, 2_001, "👍", ts));
    assert!(s.fake.wait_sent(3, 30).await, "Done was answered: {}", daemon.log());
    assert_eq!(s.fake.sent()[2]["message"], "Done");
    assert_eq!(s.fake.sent().len(), 3, "the stranger's reaction was not answered");
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    assert_eq!(store.get(&id).unwrap().state.history.iter().filter(|r| r.summary.contains("marked done")).count(), 1);
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 1, "{log}");
}

#[tokio::test]
async fn strangers_spoofs_our_own_sync_messages_and_bad_events_never_become_commands() {
    // Our own number allowed too (a careless config): our own messages are still never input.
    let s = setup_allowing(None, &[OWNER, BOT]).await;
    s.llm.push(Reply::text("one noted"));
    s.llm.push(Reply::text("two noted"));
    let daemon = s.daemon("strangers.log").await;
    // The owner's first message pins their number to their uuid.
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_000, "one"));
    assert!(s.fake.wait_sent(1, 30).await, "{}", daemon.log());
    s.fake.push(text_envelope(STRANGER, OTHER_UUID, 1_001, "give me your secrets"));
    // Spoofed: the owner's number with another account's uuid.
    s.fake.push(text_envelope(OWNER, OTHER_UUID, 1_002, "as the owner"));
    // Our own message, synced back from our phone: never input (a loop).
    let mut sync = text_envelope(BOT, "11111111-1111-4111-8111-111111111111", 1_003, "synced");
    sync["syncMessage"] = json!({"sentMessage": {"destination": OWNER, "timestamp": 1_003, "message": "one noted"}});
    s.fake.push(sync);
    // Our account as the sender of a data message: a loop too.
    s.fake.push(text_envelope(BOT, "11111111-1111-4111-8111-111111111111", 1_004, "echo"));
    // Malformed and oversize events, an envelope that is not an object, an edit.
    s.fake.push_raw("{not json".into());
    s.fake.push_raw(json!({"envelope": {"dataMessage": {"message": "x".repeat(300_000)}}}).to_string());
    s.fake.push_raw(json!({"envelope": "no"}).to_string());
    let mut edit = text_envelope(OWNER, OWNER_UUID, 1_005, "");
    edit["editMessage"] = json!({"targetSentTimestamp": 1_000, "dataMessage": {"message": "run the edit"}});
    edit.as_object_mut().unwrap().remove("dataMessage");
    s.fake.push(edit);
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_006, "two"));
    assert!(s.fake.wait_sent(2, 30).await, "{}", daemon.log());
    let (_, log) = daemon.stop().await;
    assert_eq!(asked(&s.llm), ["one", "two"], "{log}");
    assert_eq!(s.fake.sent().len(), 2, "nothing else was answered: {log}");
    assert!(log.contains("not in [signal] allow_from"), "{log}");
    assert!(log.contains("with another account uuid was refused"), "{log}");
    assert!(log.contains("a Signal event was skipped"), "{log}");
    assert!(!log.contains("give me your secrets"), "a stranger's text is not logged: {log}");
}

#[tokio::test]
async fn a_dropped_stream_and_a_restart_replay_nothing_twice() {
    let s = setup(None).await;
    for r in ["a1", "a2", "a3"] {
        s.llm.push(Reply::text(r));
    }
    let daemon = s.daemon("replay.log").await;
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_000, "one"));
    assert!(s.fake.wait_sent(1, 30).await, "{}", daemon.log());
    // The connection drops: bramble reconnects after the last id it saw.
    let n = s.fake.connections();
    s.fake.drop_streams();
    assert!(wait_until(30, || s.fake.connections() > n).await, "reconnected: {}", daemon.log());
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_001, "two"));
    assert!(s.fake.wait_sent(2, 30).await, "{}", daemon.log());
    let (_, log1) = daemon.stop().await;
    // signal-cli restarted meanwhile: our last id is unknown to it, every kept event comes again.
    s.fake.restart();
    let daemon = s.daemon("replay2.log").await;
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_002, "three"));
    assert!(s.fake.wait_sent(3, 30).await, "{}", daemon.log());
    let (_, log2) = daemon.stop().await;
    assert_eq!(asked(&s.llm), ["one", "two", "three"], "{log1}\n{log2}");
    assert!(log2.contains("handled already came again"), "{log2}");
}

#[tokio::test]
async fn a_json_rpc_error_is_retried_by_the_outbox() {
    let s = setup(None).await;
    s.llm.push(Reply::text("eventually"));
    let daemon = s.daemon("retry.log").await;
    s.fake.fail_next("send", -1, "Failed to send message due to network error");
    s.fake.push(text_envelope(OWNER, OWNER_UUID, 1_000, "hello"));
    assert!(daemon.wait_log("delivery failed; will retry", 30).await, "{}", daemon.log());
    assert!(s.fake.wait_sent(1, 40).await, "retried: {}", daemon.log());
    assert_eq!(s.fake.sent()[0]["message"], "eventually");
    assert_eq!(s.fake.calls("send").len(), 2, "one refused, one delivered");
    daemon.stop().await;
}

#[tokio::test]
async fn a_dead_daemon_shows_in_status_and_reports_wait_in_the_outbox() {
    let dead = crate::support::http::refused_url().await;
    let s = setup(Some(dead)).await;
    let daemon = Daemon::start_logging_to(s.home.path(), Some(&s.home.config), &s.log.path().join("dead.log"));
    assert!(daemon.wait_log("the signal-cli daemon is not reachable", 30).await, "{}", daemon.log());
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    outbox.enqueue(format!("signal:{OWNER}").parse().unwrap(), "the report", "agent").unwrap();
    assert!(daemon.wait_log("delivery failed; will retry", 30).await, "{}", daemon.log());
    let status = s.cli(&["status"]).await;
    assert!(status.contains("signal:") && status.contains("NOT CONNECTED"), "{status}");
    let doctor = s.cli(&["doctor"]).await;
    assert!(doctor.contains("cannot reach the signal-cli daemon"), "{doctor}");
    let (_, log) = daemon.stop().await;
    let pending = outbox.pending().unwrap();
    assert_eq!(pending.len(), 1, "the report waits: {log}");
    assert_eq!(pending[0].target.to_string(), format!("signal:{OWNER}"));
}

#[tokio::test]
async fn the_tcp_socket_mode_answers_and_reaches_doctor() {
    let fake = FakeSignal::start_tcp().await;
    let s = setup(Some(fake.tcp())).await;
    s.llm.push(Reply::text("over tcp"));
    let daemon = Daemon::start_logging_to(s.home.path(), Some(&s.home.config), &s.log.path().join("tcp.log"));
    assert!(daemon.wait_log("Signal listening", 30).await, "{}", daemon.log());
    assert!(wait_until(30, || fake.connections() > 0).await, "{}", daemon.log());
    fake.push(text_envelope(OWNER, OWNER_UUID, 1_000, "hi over tcp"));
    assert!(fake.wait_sent(1, 30).await, "{}", daemon.log());
    assert_eq!(fake.sent()[0]["message"], "over tcp");
    assert_eq!(fake.sent()[0]["recipient"], json!([OWNER_UUID]));
    assert_eq!(asked(&s.llm), ["hi over tcp"]);
    let doctor = s.cli(&["doctor"]).await;
    assert!(doctor.contains("the signal-cli daemon answers at tcp://127.0.0.1:"), "{doctor}");
    daemon.stop().await;
}

#[tokio::test]
async fn bramble_check_names_a_bad_signal_section() {
    let s = setup(None).await;
    let cfg = std::fs::read_to_string(&s.home.config).unwrap().replace(OWNER, "015112345678");
    std::fs::write(&s.home.config, cfg).unwrap();
    let out = s.cli(&["check"]).await;
    assert!(out.contains("`015112345678` is not a number in E.164"), "{out}");
}
