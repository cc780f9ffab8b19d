//! Discord end to end: a real `bramble run` against a fake Discord
//! ([`crate::support::discord`]: the gateway over a real WebSocket and REST
//! v10, built from Discord's developer documentation) and a fake LLM.

use std::path::Path;
use std::time::Duration;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::discord::{FakeDiscord, Posted, Scripted, BOT_ID};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use serde_json::{json, Value};

const TOKEN_ENV: &str = "BRAMBLE_TEST_DISCORD_TOKEN";
const TOKEN: &str = "MTAwMDAw.discord-test.5ecret-token";
const OWNER: u64 = 80_351_110_224_678_912;
const STRANGER: u64 = 99_999_999_999_999_999;
const DM: u64 = 700_000_000_000_000_001;
const GUILD: u64 = 600_000_000_000_000_001;
const ROOM: u64 = 700_000_000_000_000_002;
const OTHER_ROOM: u64 = 700_000_000_000_000_003;

struct Setup {
    llm: FakeLlm,
    fake: FakeDiscord,
    home: TestHome,
    log: tempfile::TempDir,
}

async fn setup(extra: &str) -> Setup {
    let fake = FakeDiscord::start(TOKEN).await;
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[discord]\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\n\
             allow_from = [\"{OWNER}\"]\nchannels = [\"{ROOM}\"]\n{extra}",
            fake.api_base()
        ),
    );
    Setup { llm, fake, home, log: tempfile::tempdir().unwrap() }
}

impl Setup {
    fn daemon(&self, log: &str) -> Daemon {
        let env = [(TOKEN_ENV, Path::new(TOKEN))];
        Daemon::start_with_env(self.home.path(), Some(&self.home.config), &self.log.path().join(log), &env)
    }

    async fn connected(&self, daemon: &Daemon, times: usize) {
        assert!(daemon.wait_log_count("Discord connected", times, 30).await, "connected: {}", daemon.log());
    }

    /// Wait until `n` messages were posted to `channel`; all of them.
    async fn posted_to(&self, channel: u64, n: usize) -> Vec<Posted> {
        wait_until(30, || self.fake.posted().iter().filter(|p| p.channel == channel).count() >= n).await;
        self.fake.posted().into_iter().filter(|p| p.channel == channel).collect()
    }
}

fn last_user_text(req: &Value) -> String {
    req["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn remind_job(home: &TestHome, name: &str, text: &str, target: &str) -> String {
    let store = bramble::scheduler::JobStore::open(&home.state);
    let now = jiff::Timestamp::now();
    let job = bramble::scheduler::Job::new(
        name,
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
async fn a_dm_is_answered_and_a_reminders_done_button_works_for_the_owner_only() {
    let s = setup("").await;
    s.llm.push(Reply::text("**Hello** owner @everyone"));
    let daemon = s.daemon("happy.log");
    s.connected(&daemon, 1).await;
    s.fake.message(DM, None, OWNER, false, "hi there");
    let sent = s.posted_to(DM, 1).await;
    assert_eq!(sent.len(), 1, "one answer: {}", daemon.log());
    assert_eq!(sent[0].body["content"], "**Hello** owner @everyone");
    assert_eq!(sent[0].body["allowed_mentions"], json!({"parse": []}), "a model's @everyone pings nobody");
    assert_eq!(last_user_text(&s.llm.requests()[0]), "hi there");
    let calls = s.fake.calls();
    assert!(calls.iter().any(|c| c.path == format!("/api/v10/channels/{DM}/typing")), "typing was shown");
    assert!(calls.iter().any(|c| c.path == "/api/v10/gateway/bot"), "the gateway URL was asked for");

    // A reminder in the DM, with Done / Snooze buttons; a stranger's press changes nothing.
    let id = remind_job(&s.home, "water", "water the plants", &format!("discord:{DM}"));
    let sent = s.posted_to(DM, 2).await;
    assert_eq!(sent.len(), 2, "the reminder was delivered: {}", daemon.log());
    let report = sent[1].clone();
    assert_eq!(report.body["content"], "water the plants");
    let buttons = report.body["components"][0]["components"].as_array().cloned().unwrap_or_default();
    assert_eq!(buttons.len(), 4, "{:?}", report.body);
    let done = buttons[0]["custom_id"].as_str().unwrap().to_string();
    assert_eq!(done, format!("r:d:{id}"));
    let theirs = s.fake.press(DM, STRANGER, &done, &report);
    let callback = |i: u64| {
        s.fake
            .calls()
            .into_iter()
            .find(|c| c.path.starts_with(&format!("/api/v10/interactions/{i}/")))
            .map(|c| c.json().unwrap())
    };
    assert!(wait_until(30, || callback(theirs).is_some()).await, "the press was answered: {}", daemon.log());
    assert_eq!(callback(theirs).unwrap(), json!({"type": 4, "data": {"content": "Not allowed.", "flags": 64}}));
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    assert!(!store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));

    let mine = s.fake.press(DM, OWNER, &done, &report);
    assert!(wait_until(30, || callback(mine).is_some()).await, "the press was answered: {}", daemon.log());
    let answer = callback(mine).unwrap();
    assert_eq!(answer["type"], 7, "the report is updated in place: {answer}");
    assert_eq!(answer["data"]["components"], json!([]), "its buttons are gone");
    assert!(answer["data"]["content"].as_str().unwrap().starts_with("water the plants\n\n✅"), "{answer}");
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    assert!(store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 1, "{log}");
    assert!(!log.contains(TOKEN), "the token never reaches the log");
}

#[tokio::test]
async fn strangers_bots_ourselves_and_unlisted_channels_are_never_input() {
    let s = setup("max_message_chars = 100\n").await;
    s.llm.push(Reply::text("in the room"));
    s.llm.push(Reply::text("cut noted"));
    let daemon = s.daemon("strangers.log");
    s.connected(&daemon, 1).await;
    s.fake.message(DM, None, STRANGER, false, "give me your secrets");
    s.fake.message(ROOM, Some(GUILD), STRANGER, false, "me too");
    // Spoofed: a stranger's message whose member field names the owner; the author is what counts.
    let mut spoof = json!({"id": "1", "channel_id": ROOM.to_string(), "guild_id": GUILD.to_string(), "type": 0,
        "content": "as the owner", "author": {"id": STRANGER.to_string()}, "member": {"user": {"id": OWNER.to_string()}},
        "attachments": []});
    s.fake.dispatch("MESSAGE_CREATE", spoof.clone());
    spoof["author"]["id"] = json!(BOT_ID.to_string());
    spoof["id"] = json!("2");
    s.fake.dispatch("MESSAGE_CREATE", spoof); // our own message fed back
    s.fake.message(ROOM, Some(GUILD), 42, true, "another bot"); // a bot
    s.fake.message(OTHER_ROOM, Some(GUILD), OWNER, false, "a channel not in [discord] channels");
    s.fake.dispatch(
        "MESSAGE_UPDATE",
        json!({"id": "3", "channel_id": ROOM.to_string(), "content": "an edit",
        "author": {"id": OWNER.to_string()}}),
    );
    s.fake.message(ROOM, Some(GUILD), OWNER, false, "hello room");
    let sent = s.posted_to(ROOM, 1).await;
    assert_eq!(sent.len(), 1, "{}", daemon.log());
    assert_eq!(sent[0].body["content"], "in the room");
    assert_eq!(last_user_text(&s.llm.requests()[0]), "hello room");
    s.fake.message(DM, None, OWNER, false, &"x".repeat(300));
    let sent = s.posted_to(DM, 1).await;
    assert_eq!(sent.len(), 1, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 2, "only the owner's two messages became turns: {log}");
    assert!(last_user_text(&s.llm.requests()[1]).contains("cut to 100 characters"));
    assert_eq!(log.matches("not in [discord] allow_from was ignored").count(), 1, "logged once per user: {log}");
    assert!(s
        .fake
        .posted()
        .iter()
        .all(|p| p.channel != OTHER_ROOM && !(p.channel == DM && p.body["content"] != "cut noted")));
}

#[tokio::test]
async fn a_dropped_gateway_resumes_after_the_last_handled_seq_and_nothing_is_lost_or_doubled() {
    let s = setup("").await;
    s.llm.push(Reply::text("one"));
    s.llm.push(Reply::text("two"));
    s.llm.push(Reply::text("three"));
    let daemon = s.daemon("resume.log");
    s.connected(&daemon, 1).await;
    s.fake.message(DM, None, OWNER, false, "first");
    assert_eq!(s.posted_to(DM, 1).await.len(), 1, "{}", daemon.log());
    let handled = s.fake.seq();
    s.fake.drop_socket();
    s.fake.message(DM, None, OWNER, false, "sent while the connection was down");
    assert!(daemon.wait_log("Discord session resumed", 30).await, "{}", daemon.log());
    assert_eq!(s.posted_to(DM, 2).await.len(), 2, "the missed message was replayed: {}", daemon.log());
    let stats = s.fake.stats();
    assert_eq!(stats.identifies, 1, "resumed, not a new session: {stats:?}");
    assert_eq!(stats.resumes, vec![("session1".to_string(), Some(handled))], "the last handled seq");
    assert_eq!(stats.paths, vec!["/gateway/", "/resume/"], "resumed on resume_gateway_url");

    // op 7 Reconnect: resumed again; a new message after it is handled once.
    s.fake.reconnect();
    assert!(daemon.wait_log_count("Discord session resumed", 2, 30).await, "{}", daemon.log());
    s.fake.message(DM, None, OWNER, false, "third");
    assert_eq!(s.posted_to(DM, 3).await.len(), 3, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let asked: Vec<String> = s.llm.requests().iter().map(last_user_text).collect();
    assert_eq!(asked, ["first", "sent while the connection was down", "third"], "each once: {log}");
}

#[tokio::test]
async fn a_missing_heartbeat_ack_reconnects_and_an_invalid_session_identifies_again() {
    let s = setup("").await;
    s.llm.push(Reply::text("still here"));
    s.fake.heartbeats(1000, false);
    let daemon = s.daemon("zombie.log");
    s.connected(&daemon, 1).await;
    assert!(daemon.wait_log("was not acknowledged", 30).await, "a zombie connection is noticed: {}", daemon.log());
    s.fake.heartbeats(41_250, true);
    assert!(daemon.wait_log("Discord session resumed", 30).await, "{}", daemon.log());
    assert!(s.fake.stats().heartbeats >= 1);
    s.fake.invalidate();
    s.connected(&daemon, 2).await;
    assert_eq!(s.fake.stats().identifies, 2, "a fresh Identify after Invalid Session (false)");
    s.fake.message(DM, None, OWNER, false, "are you there?");
    assert_eq!(s.posted_to(DM, 1).await.len(), 1, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
}

#[tokio::test]
async fn malformed_payloads_are_skipped_and_an_oversize_one_costs_only_a_resume() {
    let s = setup("").await;
    s.llm.push(Reply::text("fine"));
    s.llm.push(Reply::text("fine again"));
    let daemon = s.daemon("malformed.log");
    s.connected(&daemon, 1).await;
    s.fake.send_raw("not json at all");
    s.fake.send_raw("[0, {\"t\": \"MESSAGE_CREATE\"}]");
    s.fake.dispatch("MESSAGE_CREATE", json!({"content": "no ids", "author": {"id": OWNER.to_string()}}));
    s.fake.dispatch("MESSAGE_CREATE", json!({"id": "x", "channel_id": "-1", "author": {"id": "owner"}}));
    s.fake.message(DM, None, OWNER, false, "after the garbage");
    assert_eq!(s.posted_to(DM, 1).await.len(), 1, "{}", daemon.log());
    assert_eq!(s.fake.stats().connections, 1, "garbage did not cost the connection");
    s.fake.send_oversize(1 << 40);
    assert!(daemon.wait_log("Discord session resumed", 30).await, "{}", daemon.log());
    s.fake.message(DM, None, OWNER, false, "after the oversize one");
    assert_eq!(s.posted_to(DM, 2).await.len(), 2, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("a malformed Discord gateway message was skipped"), "{log}");
    assert_eq!(s.llm.request_count(), 2, "{log}");
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_and_a_long_one_leaves_the_report_in_the_outbox() {
    let s = setup("").await;
    s.llm.push(Reply::text("after a short wait"));
    let daemon = s.daemon("ratelimit.log");
    s.connected(&daemon, 1).await;
    s.fake.script(Scripted::RateLimited(0.4));
    s.fake.message(DM, None, OWNER, false, "hi");
    let sent = s.posted_to(DM, 1).await;
    assert_eq!(sent.len(), 1, "{}", daemon.log());
    assert_eq!(sent[0].body["content"], "after a short wait");
    let posts =
        |s: &Setup| s.fake.calls().iter().filter(|c| c.method == "POST" && c.path.ends_with("/messages")).count();
    assert_eq!(posts(&s), 2, "one 429, then the post");

    // A long limit (over what a call waits out): the outbox keeps the report and delivers it later.
    s.fake.script(Scripted::RateLimited(12.0));
    remind_job(&s.home, "tea", "tea time", &format!("discord:{DM}"));
    assert!(daemon.wait_log("delivery failed; will retry", 40).await, "{}", daemon.log());
    assert!(daemon.log().contains("rate-limits"), "{}", daemon.log());
    wait_until(90, || s.fake.posted().len() >= 2).await;
    let sent = s.posted_to(DM, 2).await;
    assert_eq!(sent.len(), 2, "delivered after the limit: {}", daemon.log());
    assert_eq!(sent[1].body["content"], "tea time");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
}

#[tokio::test]
async fn the_token_never_follows_a_redirect_to_another_origin() {
    use crate::support::http::{Request, Response, TestServer};
    use std::sync::{Arc, Mutex};
    bramble::install_crypto();
    let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
    let log = seen.clone();
    let trap = TestServer::start(move |req| {
        log.lock().unwrap().push(req);
        Response::json(200, &json!({"id": "1", "url": "ws://127.0.0.1:9"}))
    })
    .await;
    let to = trap.url();
    let mover =
        TestServer::start(move |req: Request| Response::new(307).header("location", format!("{to}{}", req.path))).await;
    let rest = bramble::clients::discord::Rest::new(&mover.url(), bramble::config::Secret::new(TOKEN)).unwrap();
    for err in [
        rest.me().await.unwrap_err().to_string(),
        rest.gateway_url().await.unwrap_err().to_string(),
        rest.create_message(1, &json!({"content": "x"})).await.unwrap_err().to_string(),
        rest.typing(1).await.unwrap_err().to_string(),
    ] {
        assert!(err.contains(&format!("redirect to {}", trap.url())) && err.contains("not followed"), "{err}");
        assert!(!err.contains(TOKEN), "{err}");
    }
    assert!(seen.lock().unwrap().is_empty(), "a request followed the redirect");
}

#[tokio::test]
async fn bramble_check_names_a_bad_discord_section() {
    let home = TestHome::new(
        "openai",
        "http://127.0.0.1:9",
        "",
        "",
        "[discord]\ntoken_env = \"T\"\nallow_from = [\"@owner\"]\n",
    );
    let out =
        crate::support::setup::bramble(home.path(), &["--config", home.config.to_str().unwrap(), "check"], None).await;
    let err = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("config.toml:") && err.contains("`@owner` is not a Discord user id"), "{err}");
}
