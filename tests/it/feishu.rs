//! Feishu / Lark end to end: a real `bramble run` against a fake Open
//! Platform ([`crate::support::feishu`]: the long connection's protobuf
//! frames, the tenant token, the messages API) and a fake LLM.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::feishu::{self as fake, card_event, message_event, FakeFeishu, APP_SECRET, BOT_OPEN_ID};
use crate::support::http::TestServer;
use crate::support::setup::TestHome;

const SECRET_ENV: &str = "BRAMBLE_TEST_FEISHU_SECRET";
const OWNER: &str = "ou_owner00000000000000000000000001";
const STRANGER: &str = "ou_stranger000000000000000000000001";
const DM: &str = "oc_dm0000000000000000000000000000001";
const GROUP: &str = "oc_group000000000000000000000000001";

struct Setup {
    llm: FakeLlm,
    feishu: FakeFeishu,
    home: TestHome,
    log: tempfile::TempDir,
}

async fn setup(extra: &str) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let feishu = FakeFeishu::start().await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[feishu]\napp_id = \"{}\"\napp_secret_env = \"{SECRET_ENV}\"\n\
             domain = \"lark\"\napi_base = \"{}\"\nallow_from = [\"{OWNER}\"]\n{extra}",
            fake::APP_ID,
            feishu.url()
        ),
    );
    Setup { llm, feishu, home, log: tempfile::tempdir().unwrap() }
}

impl Setup {
    fn daemon(&self, log: &str) -> Daemon {
        let env = [(SECRET_ENV, Path::new(APP_SECRET))];
        Daemon::start_with_env(self.home.path(), Some(&self.home.config), &self.log.path().join(log), &env)
    }

    /// Wait for the long connection (`n` connections so far).
    async fn connected(&self, daemon: &Daemon, n: u32) {
        let ok = wait_until(30, || self.feishu.upgrades() >= n && self.feishu.pings() >= n).await;
        assert!(ok, "the long connection is up and pinging: {}", daemon.log());
    }

    async fn wait_sent(&self, n: usize, daemon: &Daemon) -> Vec<Value> {
        let ok = wait_until(30, || self.feishu.sent().len() >= n).await;
        assert!(ok, "{n} message(s) sent: {:?}\n{}", self.feishu.sent(), daemon.log());
        self.feishu.sent()
    }

    async fn wait_answer(&self, frame: &str, daemon: &Daemon) -> Value {
        let ok = wait_until(30, || self.feishu.answer(frame).is_some()).await;
        assert!(ok, "frame {frame} answered: {:?}\n{}", self.feishu.answers(), daemon.log());
        self.feishu.answer(frame).unwrap_or_default()
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

/// A sent message's text (`content` is a JSON string).
fn sent_text(m: &Value) -> String {
    let content: Value = serde_json::from_str(m["content"].as_str().unwrap_or("{}")).unwrap_or_default();
    content["text"].as_str().unwrap_or_default().to_string()
}

/// A `remind` job due in a moment, delivered to `target`.
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
async fn the_owner_is_answered_and_a_reminder_card_is_done_by_the_owner_not_a_stranger() {
    let s = setup("").await;
    s.llm.push(Reply::text("Hello owner"));
    let daemon = s.daemon("happy.log");
    s.connected(&daemon, 1).await;
    s.feishu.event("f1", &message_event("ev1", OWNER, DM, "p2p", "hi there"));
    let sent = s.wait_sent(1, &daemon).await;
    assert_eq!((sent[0]["receive_id"].as_str(), sent[0]["msg_type"].as_str()), (Some(DM), Some("text")));
    assert_eq!(sent_text(&sent[0]), "Hello owner");
    assert_eq!(s.wait_answer("f1", &daemon).await["code"], 200, "the event frame is answered");
    assert_eq!(last_user_text(&s.llm.requests()[0]), "hi there");

    // A reminder's report comes as a card with Done / Snooze buttons.
    let id = remind_job(&s.home, "water", "water the plants", &format!("feishu:{DM}"));
    let sent = s.wait_sent(2, &daemon).await;
    assert_eq!(sent[1]["msg_type"], "interactive", "{:?}", sent[1]);
    let card: Value = serde_json::from_str(sent[1]["content"].as_str().unwrap()).unwrap();
    let done = card["elements"][1]["actions"][0]["value"].clone();
    assert_eq!(done["r"], format!("r:d:{id}"));
    // A stranger presses Done: told no, nothing changes.
    s.feishu.event("f2", &card_event("ev2", STRANGER, &done, "om_sent2", DM));
    let answer = s.wait_answer("f2", &daemon).await;
    assert_eq!(answer["code"], 200);
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    let marked = |store: &bramble::scheduler::JobStore| {
        store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done"))
    };
    assert!(!marked(&store) && s.feishu.patches().is_empty(), "a stranger's press does nothing");
    // The owner presses it (the older callback form, a `card` frame): done, the card updated.
    s.feishu.card_legacy(
        "f3",
        &json!({"open_id": OWNER, "open_message_id": "om_sent2", "open_chat_id": DM,
                                        "action": {"tag": "button", "value": done}}),
    );
    s.wait_answer("f3", &daemon).await;
    assert!(marked(&store), "{}", daemon.log());
    let patches = s.feishu.patches();
    assert_eq!(patches.len(), 1, "{}", daemon.log());
    assert_eq!(patches[0].0, "om_sent2");
    assert!(patches[0].1["content"].as_str().unwrap().contains("✅"), "{:?}", patches[0]);
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 1, "{log}");
    assert!(!log.contains(APP_SECRET) && !log.contains("t-g1045fake"), "no secret in the log");
    assert!(log.contains("card button press from a Feishu / Lark user not in [feishu] allow_from"), "{log}");
}

#[tokio::test]
async fn strangers_bots_ourselves_other_apps_and_malformed_or_oversize_frames_are_not_commands() {
    let s = setup("max_message_chars = 100\n").await;
    s.llm.push(Reply::text("group answer"));
    let daemon = s.daemon("strangers.log");
    s.connected(&daemon, 1).await;
    s.feishu.event("s1", &message_event("e1", STRANGER, DM, "p2p", "give me your secrets"));
    let mut bot = message_event("e2", OWNER, DM, "p2p", "from a bot");
    bot["event"]["sender"]["sender_type"] = json!("app");
    s.feishu.event("s2", &bot);
    s.feishu.event("s3", &message_event("e3", BOT_OPEN_ID, DM, "p2p", "our own words fed back"));
    let mut other = message_event("e4", OWNER, DM, "p2p", "for another app");
    other["header"]["app_id"] = json!("cli_someone_else");
    s.feishu.event("s4", &other);
    s.feishu.event("s5", &message_event("e5", OWNER, GROUP, "group", "no mention"));
    s.feishu.raw(b"\x0a\x05not a frame");
    s.feishu.event("s6", &json!({"not": "an event"}));
    // Oversize: 1.2 MB in three parts.
    s.feishu.event_split("s7", &vec![b'x'; 1_200_000], 3);
    // The one command: a group message @mentioning the bot, long, split in three frames.
    let mut group = message_event("e8", OWNER, GROUP, "group", &format!("@_user_1 {}", "y".repeat(300)));
    group["event"]["message"]["mentions"] =
        json!([{"key": "@_user_1", "id": {"open_id": BOT_OPEN_ID}, "name": "bramble"}]);
    s.feishu.event_split("s8", group.to_string().as_bytes(), 3);
    let sent = s.wait_sent(1, &daemon).await;
    assert_eq!(sent[0]["receive_id"], GROUP);
    for f in ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"] {
        assert_eq!(s.wait_answer(f, &daemon).await["code"], 200, "{f} answered (so not delivered again)");
    }
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 1, "only the mention reached the model: {log}");
    let text = last_user_text(&requests[0]);
    assert!(text.starts_with(&"y".repeat(100)) && text.contains("cut to 100 characters"), "{text}");
    assert!(!text.contains("@_user_1"), "the mention is taken out: {text}");
    assert_eq!(s.feishu.sent().len(), 1, "{log}");
    assert!(log.contains("not in [feishu] allow_from"), "{log}");
    assert!(!log.contains("give me your secrets"), "a stranger's text is not logged");
    assert!(log.contains("a malformed Feishu frame was skipped"), "{log}");
    assert!(log.contains("a Feishu payload was refused"), "{log}");
    assert!(log.contains("a Feishu event for another app was skipped"), "{log}");
}

#[tokio::test]
async fn a_redelivered_event_is_handled_once_across_a_restart_and_a_dropped_connection_loses_nothing() {
    let s = setup("").await;
    s.llm.push(Reply::text("one"));
    s.llm.push(Reply::text("two"));
    let daemon = s.daemon("first.log");
    s.connected(&daemon, 1).await;
    let first = message_event("ev-once", OWNER, DM, "p2p", "first");
    s.feishu.event("r1", &first);
    s.wait_sent(1, &daemon).await;
    s.feishu.event("r2", &first); // the platform delivers it again
    s.wait_answer("r2", &daemon).await;
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");

    let daemon = s.daemon("second.log");
    s.connected(&daemon, 2).await;
    s.feishu.event("r3", &first); // and again after our restart
    s.wait_answer("r3", &daemon).await;
    // The connection drops; what is sent meanwhile arrives after the reconnect.
    s.feishu.drop_sockets();
    s.feishu.event("r4", &message_event("ev-two", OWNER, DM, "p2p", "second"));
    s.connected(&daemon, 3).await;
    let sent = s.wait_sent(2, &daemon).await;
    assert_eq!(sent_text(&sent[1]), "two");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    let texts: Vec<String> = s.llm.requests().iter().map(last_user_text).collect();
    assert_eq!(texts, ["first", "second"], "{log}");
    assert!(log.contains("delivered again was skipped"), "{log}");
    assert!(log.contains("reconnecting"), "{log}");
}

#[tokio::test]
async fn an_expired_token_is_fetched_again_and_a_redirect_does_not_carry_it() {
    let s = setup("").await;
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reached.clone();
    let elsewhere = TestServer::start(move |req| {
        seen.lock().unwrap().push(format!("{} {:?}", req.path, req.headers));
        crate::support::http::Response::json(200, &json!({"code": 0, "data": {"message_id": "om_x"}}))
    })
    .await;
    s.llm.push(Reply::text("one"));
    s.llm.push(Reply::text("two"));
    s.llm.push(Reply::text("three"));
    let daemon = s.daemon("token.log");
    s.connected(&daemon, 1).await;
    s.feishu.event("t1", &message_event("tk1", OWNER, DM, "p2p", "one"));
    s.wait_sent(1, &daemon).await;
    let before = s.feishu.tokens_issued();
    s.feishu.expire_token();
    s.feishu.event("t2", &message_event("tk2", OWNER, DM, "p2p", "two"));
    s.wait_sent(2, &daemon).await;
    assert_eq!(s.feishu.tokens_issued(), before + 1, "a new token after 99991663: {}", daemon.log());

    s.feishu.redirect_next(&elsewhere.url());
    s.feishu.event("t3", &message_event("tk3", OWNER, DM, "p2p", "three"));
    // The outbox keeps the report and delivers it on a later try.
    let ok = wait_until(90, || s.feishu.sent().len() >= 3).await;
    let (code, log) = daemon.stop().await;
    assert!(ok, "delivered after the redirect: {log}");
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("redirect"), "{log}");
    assert!(reached.lock().unwrap().is_empty(), "nothing reached the other host: {:?}", reached.lock().unwrap());
    assert!(!log.contains("Bearer") && !log.contains("t-g1045fake"), "{log}");
}
