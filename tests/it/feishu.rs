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

/// The messages sent to `chat` of type `msg_type`, with their `content` parsed.
fn sent_of(s: &Setup, chat: &str, msg_type: &str) -> Vec<(Value, Value)> {
    s.feishu
        .sent()
        .into_iter()
        .filter(|m| m["receive_id"] == chat && m["msg_type"] == msg_type)
        .map(|m| {
            let content = serde_json::from_str(m["content"].as_str().unwrap_or("{}")).unwrap_or_default();
            (m, content)
        })
        .collect()
}

#[tokio::test]
async fn a_reports_image_and_file_are_uploaded_and_sent_by_key_and_an_oversize_or_empty_file_becomes_a_line() {
    let s = setup("").await;
    let ws = &s.home.workspace;
    let png = b"\x89PNG\r\n\x1a\nchart".to_vec();
    std::fs::write(ws.join("chart.png"), &png).unwrap();
    std::fs::write(ws.join("notes.pdf"), b"%PDF-1.4 notes").unwrap();
    // 31 MB (sparse: never read), over the 30 MB "Upload file" takes.
    std::fs::File::create(ws.join("big.bin")).unwrap().set_len(31 * 1024 * 1024).unwrap();
    std::fs::write(ws.join("empty.txt"), b"").unwrap();
    let attach = r#"{"content":"here you go","attach":["chart.png","notes.pdf","big.bin","empty.txt"]}"#;
    s.llm.push(Reply::tool_call("message", attach));
    s.llm.push(Reply::text("sent"));
    let daemon = s.daemon("files.log");
    s.connected(&daemon, 1).await;
    let before = s.feishu.tokens_issued();
    // The first upload is refused for its token (99991663): a new one is fetched and the upload made again.
    s.feishu.token_error_at_next_file_call();
    s.feishu.event("u1", &message_event("up1", OWNER, DM, "p2p", "send me the chart"));
    let answered = wait_until(60, || sent_of(&s, DM, "text").iter().any(|(_, c)| c["text"] == "sent")).await;
    let (code, log) = daemon.stop().await;
    assert!(answered, "{log}");
    assert_eq!(code, Some(0), "{log}");
    assert!(s.feishu.tokens_issued() > before, "a new token after the upload's 99991663: {log}");

    let uploads = s.feishu.uploads();
    assert_eq!(uploads.len(), 2, "only the image and the pdf go up: {uploads:?}");
    let (image, pdf) = (&uploads[0], &uploads[1]);
    assert_eq!(
        (image.kind.as_str(), image.type_field.as_str(), image.name.as_str()),
        ("image", "message", "chart.png")
    );
    assert_eq!((image.data.as_slice(), image.content_type.as_deref()), (png.as_slice(), Some("image/png")));
    assert_eq!((pdf.kind.as_str(), pdf.type_field.as_str(), pdf.name.as_str()), ("file", "pdf", "notes.pdf"));
    assert_eq!(pdf.data, b"%PDF-1.4 notes");

    let texts = sent_of(&s, DM, "text");
    let report = texts.iter().find(|(_, c)| c["text"].as_str().unwrap_or_default().starts_with("here you go"));
    let report = report.map(|(_, c)| c["text"].as_str().unwrap_or_default().to_string()).unwrap_or_default();
    assert!(
        report.contains("The file big.bin was not sent: it is 31.0 MB, over Feishu / Lark's limit of 30 MB"),
        "{report}"
    );
    assert!(report.contains("The file empty.txt was not sent: it is empty"), "{report}");
    let images = sent_of(&s, DM, "image");
    let files = sent_of(&s, DM, "file");
    assert_eq!(images.len(), 1, "{:?}", s.feishu.sent());
    assert_eq!(files.len(), 1, "{:?}", s.feishu.sent());
    assert_eq!(images[0].1["image_key"], image.key.as_str());
    assert_eq!(files[0].1["file_key"], pdf.key.as_str());
    let uuids: std::collections::HashSet<_> = s.feishu.sent().iter().map(|m| m["uuid"].to_string()).collect();
    assert_eq!(uuids.len(), s.feishu.sent().len(), "each message its own uuid");
    assert!(!log.contains("t-g1045fake") && !log.contains(APP_SECRET), "no secret in the log");
}

#[tokio::test]
async fn a_turn_shows_its_steps_in_one_card_edited_in_place_and_recalled_before_the_answer() {
    let s = setup("").await;
    // Two tool steps 4 s apart (more than the 2 s between updates), then the answer.
    s.llm.push(Reply::tool_call("read_file", r#"{"path":"notes.md"}"#));
    s.llm.push(Reply::Delayed(Duration::from_secs(4), Box::new(Reply::tool_call("list_dir", r#"{"path":"."}"#))));
    s.llm.push(Reply::Delayed(Duration::from_secs(4), Box::new(Reply::text("all read"))));
    let daemon = s.daemon("progress.log");
    s.connected(&daemon, 1).await;
    s.feishu.event("p1", &message_event("pr1", OWNER, DM, "p2p", "read my notes"));
    let answered = wait_until(60, || sent_of(&s, DM, "text").iter().any(|(_, c)| c["text"] == "all read")).await;
    let (code, log) = daemon.stop().await;
    assert!(answered, "{log}");
    assert_eq!(code, Some(0), "{log}");

    let cards = sent_of(&s, DM, "interactive");
    assert_eq!(cards.len(), 1, "one status card: {:?}", s.feishu.sent());
    let first = cards[0].1["elements"][0]["text"]["content"].as_str().unwrap_or_default().to_string();
    assert!(first.starts_with('⏳') && first.contains("notes.md"), "{first}");
    assert_eq!(cards[0].1["config"]["update_multi"], true, "a shared card, so it may be updated");
    let ops = s.feishu.ops();
    let card_id = ops[0].trim_start_matches("send:").to_string();
    let patches = s.feishu.patches();
    assert_eq!(patches.len(), 1, "{ops:?}");
    assert_eq!(patches[0].0, card_id);
    let edited: Value = serde_json::from_str(patches[0].1["content"].as_str().unwrap()).unwrap();
    assert_eq!(edited["elements"][0]["text"]["content"], "⏳ reading .…", "{edited}");
    assert_eq!(edited["config"]["update_multi"], true);
    let answer = s.feishu.sent().iter().position(|m| sent_text(m) == "all read").unwrap();
    let pos = |op: &str| ops.iter().position(|o| o == op);
    let (edit, recall, sent) = (
        pos(&format!("patch:{card_id}")),
        pos(&format!("recall:{card_id}")),
        pos(&format!("send:om_sent{}", answer + 1)),
    );
    assert!(edit.is_some() && edit < recall && recall < sent, "created, edited, recalled, then the answer: {ops:?}");
}

#[tokio::test]
async fn a_stalled_upload_holds_back_only_its_own_report_and_a_redirected_upload_does_not_carry_the_token() {
    let s = setup(&format!("chats = [\"{GROUP}\"]\nupload_timeout_secs = 2\n")).await;
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reached.clone();
    let elsewhere = TestServer::start(move |req| {
        seen.lock().unwrap().push(format!("{} {:?}", req.path, req.headers));
        crate::support::http::Response::json(200, &json!({"code": 0, "data": {"file_key": "file_elsewhere"}}))
    })
    .await;
    std::fs::write(s.home.workspace.join("log.txt"), "line one\n").unwrap();
    let post = json!({"content": "the log", "target": format!("feishu:{GROUP}"), "attach": ["log.txt"]});
    s.llm.push(Reply::tool_call("message", post.to_string()));
    s.llm.push(Reply::text("posted"));
    let daemon = s.daemon("stall.log");
    s.connected(&daemon, 1).await;
    // A dead upload endpoint: no answer for an hour.
    s.feishu.stall_file_calls(Some(Duration::from_secs(3600)));
    s.feishu.event("st1", &message_event("stall1", OWNER, DM, "p2p", "post the log to the group"));
    let answered = wait_until(60, || sent_of(&s, DM, "text").iter().any(|(_, c)| c["text"] == "posted")).await;
    assert!(answered, "the DM's answer is not held back by the group's upload: {}", daemon.log());
    assert!(sent_of(&s, GROUP, "text").is_empty(), "the group's report waits in the outbox: {:?}", s.feishu.sent());

    // The endpoint is back but redirects once: not followed, the report kept and sent on a later try.
    s.feishu.redirect_next_file_call(&elsewhere.url());
    s.feishu.stall_file_calls(None);
    let delivered = wait_until(120, || !sent_of(&s, GROUP, "file").is_empty()).await;
    let (code, log) = daemon.stop().await;
    assert!(delivered, "{log}");
    assert_eq!(code, Some(0), "{log}");
    let texts = sent_of(&s, GROUP, "text");
    assert_eq!(texts.len(), 1, "the text went once: {:?}", s.feishu.sent());
    assert_eq!(texts[0].1["text"], "the log");
    let uploads = s.feishu.uploads();
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    assert_eq!((uploads[0].type_field.as_str(), uploads[0].data.as_slice()), ("stream", b"line one\n".as_slice()));
    assert_eq!(sent_of(&s, GROUP, "file")[0].1["file_key"], uploads[0].key.as_str());
    assert!(reached.lock().unwrap().is_empty(), "nothing reached the other host: {:?}", reached.lock().unwrap());
    assert!(log.contains("delivery failed; will retry"), "the stalled upload timed out: {log}");
    assert!(log.contains("redirect"), "{log}");
    assert!(!log.contains("Bearer") && !log.contains("t-g1045fake"), "{log}");
}

/// The client the channel uses for a file a user sent (the event handler's
/// hook is not in yet, so this goes through the library, against the fake).
#[tokio::test]
async fn a_file_a_user_sent_is_fetched_within_its_cap_after_a_token_refresh_and_never_through_a_redirect() {
    use bramble::clients::feishu::{Client, FeishuError};
    bramble::install_crypto();
    let feishu = FakeFeishu::start().await;
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reached.clone();
    let elsewhere = TestServer::start(move |req| {
        seen.lock().unwrap().push(format!("{} {:?}", req.path, req.headers));
        crate::support::http::Response::new(200).body("stolen")
    })
    .await;
    feishu.add_resource("om_in1", "file_v3_in1", b"%PDF in", "application/pdf");
    feishu.add_resource("om_in2", "file_v3_big", &vec![7u8; 2 << 20], "application/octet-stream");
    feishu.add_resource("om_in3", "file_v3_json", br#"{"a": 1}"#, "application/json");
    let secret = bramble::config::Secret::new(APP_SECRET);
    let client = Client::new(&feishu.url(), fake::APP_ID, secret).unwrap();
    client.token().await.unwrap();
    feishu.token_error_at_next_file_call();
    let (data, ctype) = client.resource("om_in1", "file_v3_in1", false, 1 << 20).await.unwrap();
    assert_eq!((data.as_slice(), ctype.as_deref()), (b"%PDF in".as_slice(), Some("application/pdf")));
    assert_eq!(feishu.tokens_issued(), 2, "a new token after 99991663");
    let big = client.resource("om_in2", "file_v3_big", false, 1 << 20).await;
    assert!(matches!(big, Err(FeishuError::TooLarge { .. })), "{big:?}");
    let json_file = client.resource("om_in3", "file_v3_json", false, 1 << 20).await.unwrap();
    assert_eq!(json_file.0, br#"{"a": 1}"#, "a JSON file the user sent is a file, not an error");
    let missing = client.resource("om_in1", "file_v3_other", false, 1 << 20).await;
    assert_eq!(missing.as_ref().err().and_then(FeishuError::code), Some(234003), "{missing:?}");
    feishu.redirect_next_file_call(&elsewhere.url());
    let redirected = client.resource("om_in1", "file_v3_in1", false, 1 << 20).await;
    assert!(matches!(redirected, Err(FeishuError::Redirect { .. })), "{redirected:?}");
    assert!(reached.lock().unwrap().is_empty(), "the token went nowhere else: {:?}", reached.lock().unwrap());
}

/// A message event carrying a file (`message_type` file / image / sticker).
fn file_event(event_id: &str, message_type: &str, content: &Value) -> Value {
    let mut ev = message_event(event_id, OWNER, DM, "p2p", "");
    ev["event"]["message"]["message_type"] = json!(message_type);
    ev["event"]["message"]["content"] = json!(content.to_string());
    ev
}

#[tokio::test]
async fn a_file_the_owner_sends_reaches_the_turn_an_oversize_one_is_told_and_a_sticker_is_skipped() {
    let s = setup("max_file_mb = 1\n").await;
    s.llm.push(Reply::text("Got your notes"));
    s.feishu.add_resource("om_evf1", "file_v3_notes", b"%PDF notes", "application/pdf");
    s.feishu.add_resource("om_evf2", "file_v3_big", &vec![7u8; 2 << 20], "application/octet-stream");
    let daemon = s.daemon("files-in.log");
    s.connected(&daemon, 1).await;
    // A sticker carries no file: skipped, nobody is asked anything.
    s.feishu.event("f0", &file_event("evf0", "sticker", &json!({"file_key": "sticker_v3_x"})));
    assert_eq!(s.wait_answer("f0", &daemon).await["code"], 200);
    // Over [feishu] max_file_mb: the owner is told why, the model is not called.
    s.feishu.event("f2", &file_event("evf2", "file", &json!({"file_key": "file_v3_big", "file_name": "big.bin"})));
    let sent = s.wait_sent(1, &daemon).await;
    assert!(sent_text(&sent[0]).starts_with("I could not take your file: it is larger than 1 MB"), "{:?}", sent[0]);
    assert!(s.llm.requests().is_empty(), "no turn for a file not taken");
    // A file within the cap: kept in the inbox and named in the turn.
    s.feishu.event("f1", &file_event("evf1", "file", &json!({"file_key": "file_v3_notes", "file_name": "notes.pdf"})));
    let sent = s.wait_sent(2, &daemon).await;
    assert_eq!(sent_text(&sent[1]), "Got your notes");
    let asked = last_user_text(&s.llm.requests()[0]);
    let at = asked.strip_prefix("[file: ").and_then(|r| r.split([']', ' ', ',']).next()).unwrap_or_default();
    assert!(at.starts_with("inbox/") && at.ends_with("notes.pdf"), "{asked}");
    assert_eq!(std::fs::read(s.home.workspace.join(at)).unwrap(), b"%PDF notes");
    daemon.stop().await;
}
