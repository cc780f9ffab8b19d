//! Telegram beyond text, end to end through a real `bramble run`: voice notes
//! (a real recording: espeak-ng's speech encoded to OGG/Opus by opusenc, as
//! Telegram's are), photos, documents, report buttons, the status message of
//! long turns, files sent by the `message` tool.
//!
//! Only fakes are possible for Telegram and for a transcription service: the
//! Bot API fake (`support::telegram`) and the transcription fake below speak
//! the published wire formats (Bot API JSON and multipart uploads; OpenAI's
//! `POST /v1/audio/transcriptions` multipart form with `file`, `model`,
//! `language`, `response_format`, answered with `{"text": …}`), and the
//! transcription fake checks the upload as a server would see it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::{Multipart, Response, TestServer};
use crate::support::setup::TestHome;
use crate::support::telegram::{FakeTelegram, BOT_ID};

const TOKEN: &str = "123456:TEST-token-do-not-log";
const ALICE: i64 = 1111;

struct Setup {
    llm: FakeLlm,
    tg: FakeTelegram,
    home: TestHome,
}

async fn setup(agent_extra: &str, extra: &str) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        agent_extra,
        "max_retries = 0\n",
        &format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\n\
             allow_from = [{ALICE}]\napi_base = \"{}\"\n{extra}",
            tg.url()
        ),
    );
    Setup { llm, tg, home }
}

impl Setup {
    fn daemon(&self) -> Daemon {
        Daemon::start(self.home.path(), Some(&self.home.config))
    }

    /// Every file under the workspace inbox, relative to the workspace.
    fn inbox(&self) -> Vec<String> {
        let mut out = Vec::new();
        collect(&self.home.workspace.join("inbox"), &mut out);
        let mut rel: Vec<String> =
            out.iter().map(|p| p.strip_prefix(&self.home.workspace).unwrap().to_string_lossy().into_owned()).collect();
        rel.sort();
        rel
    }

    /// The text of every session file in the state directory.
    fn sessions_text(&self) -> String {
        let mut files = Vec::new();
        collect(&self.home.state, &mut files);
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// A real voice recording: `text` spoken by espeak-ng, encoded to OGG/Opus by opusenc.
fn voice_recording(text: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (wav, ogg) = (dir.path().join("v.wav"), dir.path().join("v.ogg"));
    let spoke = std::process::Command::new("espeak-ng").arg("-w").arg(&wav).arg(text).status();
    assert!(
        spoke.is_ok_and(|s| s.success()),
        "espeak-ng is needed for the voice tests (apt-get install espeak-ng opus-tools; .ci/run does)"
    );
    let encoded = std::process::Command::new("opusenc").arg("--quiet").arg(&wav).arg(&ogg).status();
    assert!(encoded.is_ok_and(|s| s.success()), "opusenc is needed for the voice tests (apt-get install opus-tools)");
    let data = std::fs::read(&ogg).unwrap();
    assert!(data.starts_with(b"OggS"), "an Ogg file");
    data
}

/// A fake OpenAI-compatible transcription endpoint that answers `text` (or
/// `status` 500) and keeps every upload as it arrived.
struct FakeWhisper {
    server: TestServer,
    uploads: Arc<Mutex<Vec<(String, Multipart)>>>,
}

impl FakeWhisper {
    async fn start(answer: Result<&'static str, &'static str>) -> FakeWhisper {
        let uploads = Arc::new(Mutex::new(Vec::new()));
        let seen = uploads.clone();
        let server = TestServer::start(move |req| {
            let ctype = req.header("content-type").unwrap_or_default().to_string();
            let Some(form) = Multipart::parse(&ctype, &req.body) else {
                return Response::json(400, &json!({"error": {"message": "expected multipart/form-data"}}));
            };
            seen.lock().unwrap().push((req.path.clone(), form));
            match answer {
                Ok(text) => Response::json(200, &json!({"text": text})),
                Err(why) => Response::json(500, &json!({"error": {"message": why}})),
            }
        })
        .await;
        FakeWhisper { server, uploads }
    }

    fn config(&self) -> String {
        format!(
            "[transcription]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"whisper-small\"\nlanguage = \"en\"\n",
            self.server.url()
        )
    }

    fn uploads(&self) -> Vec<(String, Multipart)> {
        self.uploads.lock().unwrap().clone()
    }
}

fn voice_message(file_id: &str, seconds: u64, size: usize) -> Value {
    json!({"chat": {"id": ALICE, "type": "private"},
           "from": {"id": ALICE, "is_bot": false, "first_name": "Alice", "username": "alice"},
           "voice": {"file_id": file_id, "file_unique_id": format!("u-{file_id}"), "duration": seconds,
                     "mime_type": "audio/ogg", "file_size": size}})
}

/// The last user message of an LLM request (its `content`, string or parts).
fn last_user(req: &Value) -> Value {
    req["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| m["content"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_voice_note_is_transcribed_and_the_turn_runs_on_its_text() {
    let audio = voice_recording("remind me to water the plants at six");
    let whisper = FakeWhisper::start(Ok("Remind me to water the plants at six.")).await;
    let s = setup("", &whisper.config()).await;
    s.tg.add_file("voice-1", audio.clone(), None, 0);
    s.llm.push(Reply::text("I will remind you at six."));
    let daemon = s.daemon();
    s.tg.push(voice_message("voice-1", 3, audio.len()));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.tg.sent_texts(), ["I will remind you at six."]);

    // The upload, as the server saw it: the original OGG bytes, the model, the language.
    let uploads = whisper.uploads();
    assert_eq!(uploads.len(), 1);
    let (path, form) = &uploads[0];
    assert_eq!(path, "/v1/audio/transcriptions");
    let file = form.part("file").expect("a file part");
    assert_eq!(file.data, audio, "the audio arrives unchanged");
    assert_eq!(file.content_type.as_deref(), Some("audio/ogg"));
    assert!(file.file_name.as_deref().is_some_and(|n| n.ends_with(".ogg")), "{file:?}");
    assert_eq!(form.text("model").as_deref(), Some("whisper-small"));
    assert_eq!(form.text("language").as_deref(), Some("en"));
    assert_eq!(form.text("response_format").as_deref(), Some("json"));

    // The model got the transcript, marked as one; never a placeholder.
    let user = last_user(&s.llm.requests()[0]);
    let text = user.as_str().expect("plain text content");
    assert!(text.starts_with("[voice note 0:03, transcribed; audio at inbox/"), "{text}");
    assert!(text.ends_with("Remind me to water the plants at six."), "{text}");
    // The audio is in the inbox; the session holds the transcript, not the audio.
    let inbox = s.inbox();
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert!(inbox[0].ends_with(".ogg"));
    assert_eq!(std::fs::read(s.home.workspace.join(&inbox[0])).unwrap(), audio);
    let sessions = s.sessions_text();
    assert!(sessions.contains("water the plants at six") && sessions.contains("transcribed"), "{sessions}");
    assert!(!sessions.contains("T2dnUw"), "no base64 audio in the session");
}

#[tokio::test]
async fn voice_notes_that_cannot_be_transcribed_get_one_reply_each_and_are_kept() {
    let audio = voice_recording("hello");
    let whisper = FakeWhisper::start(Err("model overloaded")).await;
    let s = setup("", &format!("{}max_duration = \"5m\"\n", whisper.config())).await;
    s.tg.add_file("long", audio.clone(), None, 0);
    s.tg.add_file("short", audio.clone(), None, 0);
    let daemon = s.daemon();
    // A 20-minute note: refused by its length, not even sent for transcription.
    s.tg.push(voice_message("long", 20 * 60, audio.len()));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    // A short one the server fails on.
    s.tg.push(voice_message("short", 2, audio.len()));
    assert!(s.tg.wait_sent(2, 20).await, "{}", daemon.log());
    let (_, log) = daemon.stop().await;
    let sent = s.tg.sent_texts();
    assert!(sent[0].contains("20:00 long") && sent[0].contains("up to 5:00") && sent[0].contains("inbox/"), "{sent:?}");
    assert!(sent[1].contains("could not transcribe") && sent[1].contains("model overloaded"), "{sent:?}");
    assert!(sent[1].contains("The audio is kept at inbox/"), "{sent:?}");
    assert_eq!(whisper.uploads().len(), 1, "only the short note was sent");
    assert_eq!(s.llm.request_count(), 0, "the model never gets a placeholder: {log}");
    assert_eq!(s.inbox().len(), 2, "both notes are kept");
}

#[tokio::test]
async fn without_transcription_a_voice_note_is_kept_and_the_user_told_why() {
    let s = setup("", "").await;
    s.tg.add_file("v", b"OggS fake".to_vec(), None, 0);
    let daemon = s.daemon();
    s.tg.push(voice_message("v", 4, 9));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    s.tg.push_message(ALICE, "private", ALICE, "alice", "/status");
    assert!(s.tg.wait_sent(2, 20).await);
    daemon.stop().await;
    let sent = s.tg.sent_texts();
    assert!(sent[0].contains("voice transcription is not set up") && sent[0].contains("inbox/"), "{sent:?}");
    assert!(sent[1].contains("Voice notes: not transcribed"), "{}", sent[1]);
    assert_eq!(s.llm.request_count(), 0);
    assert_eq!(s.inbox().len(), 1);
}

fn photo_message(caption: &str) -> Value {
    json!({"chat": {"id": ALICE, "type": "private"},
           "from": {"id": ALICE, "is_bot": false, "first_name": "Alice"},
           "caption": caption,
           "photo": [
               {"file_id": "p-s", "file_unique_id": "s", "width": 90, "height": 67, "file_size": 4},
               {"file_id": "p-l", "file_unique_id": "l", "width": 1280, "height": 960, "file_size": 9},
               {"file_id": "p-xl", "file_unique_id": "xl", "width": 2560, "height": 1920, "file_size": 10}]})
}

#[tokio::test]
async fn a_photo_reaches_the_model_as_an_image_and_the_session_keeps_only_its_path() {
    let s = setup("", "").await;
    let large = b"\xff\xd8\xff\xe0large-jpeg".to_vec();
    s.tg.add_file("p-s", b"small".to_vec(), None, 0);
    s.tg.add_file("p-l", large.clone(), None, 0);
    s.tg.add_file("p-xl", b"extra-large".to_vec(), None, 0);
    s.llm.push(Reply::text("A cat on a sofa."));
    s.llm.push(Reply::text("Still a cat."));
    let daemon = s.daemon();
    s.tg.push(photo_message("what is this?"));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    s.tg.push_message(ALICE, "private", ALICE, "alice", "and now?");
    assert!(s.tg.wait_sent(2, 20).await);
    daemon.stop().await;
    assert_eq!(s.tg.downloads(), ["files/p-l"], "the largest size within 1280 px, only");

    let parts = last_user(&s.llm.requests()[0]);
    let parts = parts.as_array().expect("content parts");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(text.starts_with("[image: inbox/") && text.ends_with("what is this?"), "{text}");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&large);
    assert_eq!(parts[1], json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{b64}")}}));
    // The next turn replays the photo as its reference, in text.
    let history = s.llm.requests()[1]["messages"].clone();
    let earlier = history
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains("[image: inbox/")))
        .expect("the photo's turn in the history");
    assert!(earlier["content"].is_string());
    assert!(!s.sessions_text().contains(&b64), "no base64 in the session");
}

#[tokio::test]
async fn a_model_that_cannot_see_gets_the_path_and_the_user_is_told_once() {
    let s = setup("", "").await;
    s.tg.add_file("p-l", b"\xff\xd8jpeg".to_vec(), None, 0);
    // The first call refuses the image as llama.cpp does without a projector.
    s.llm.push(Reply::error(
        500,
        "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
    ));
    s.llm.push(Reply::text("I cannot see it, but the file is saved."));
    s.llm.push(Reply::text("Same again."));
    let daemon = s.daemon();
    s.tg.push(photo_message("look"));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    s.tg.push(photo_message("and this"));
    assert!(s.tg.wait_sent(2, 20).await);
    daemon.stop().await;
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 3);
    assert!(last_user(&requests[0]).is_array(), "first asked with the image");
    let retried = last_user(&requests[1]);
    assert!(retried.as_str().is_some_and(|t| t.starts_with("[image: inbox/") && t.ends_with("look")), "{retried}");
    let sent = s.tg.sent_texts();
    assert!(sent[0].contains("cannot see images"), "{sent:?}");
    assert!(!sent[1].contains("cannot see images"), "told once: {sent:?}");
}

#[tokio::test]
async fn vision_false_never_sends_an_image() {
    let s = setup("vision = false\n", "").await;
    s.tg.add_file("p-l", b"\xff\xd8jpeg".to_vec(), None, 0);
    s.llm.push(Reply::text("Noted."));
    let daemon = s.daemon();
    s.tg.push(photo_message("receipt"));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    daemon.stop().await;
    assert!(last_user(&s.llm.requests()[0]).is_string());
    assert!(s.tg.sent_texts()[0].contains("cannot see images"));
}

fn document_message(file_id: &str, name: &str, size: u64) -> Value {
    json!({"chat": {"id": ALICE, "type": "private"},
           "from": {"id": ALICE, "is_bot": false, "first_name": "Alice"},
           "caption": "summarise",
           "document": {"file_id": file_id, "file_unique_id": file_id, "file_name": name,
                        "mime_type": "application/pdf", "file_size": size}})
}

#[tokio::test]
async fn documents_are_saved_safely_and_big_or_torn_ones_handled() {
    let s = setup("", "").await;
    // Telegram's own limit: getFile refuses files over 20 MB.
    s.tg.add_file("huge", b"x".to_vec(), Some(25 * 1024 * 1024), 0);
    // The download breaks off twice, then works: not lost, not stuck.
    s.tg.add_file("torn", b"%PDF-1.7 report".to_vec(), None, 2);
    s.tg.add_file("again", b"%PDF-1.7 second".to_vec(), None, 0);
    s.llm.push(Reply::text("It is a report."));
    s.llm.push(Reply::text("Another report."));
    let daemon = s.daemon();
    s.tg.push(document_message("huge", "big.iso", 25 * 1024 * 1024));
    assert!(s.tg.wait_sent(1, 20).await, "{}", daemon.log());
    s.tg.push(document_message("torn", "../../report.pdf", 15));
    assert!(s.tg.wait_sent(2, 30).await, "{}", daemon.log());
    s.tg.push(document_message("again", "../../report.pdf", 15));
    assert!(s.tg.wait_sent(3, 20).await);
    let (_, log) = daemon.stop().await;
    let sent = s.tg.sent_texts();
    assert!(sent[0].contains("That file is 25.0 MB") && sent[0].contains("20.0 MB"), "{sent:?}");
    assert_eq!(s.tg.downloads().iter().filter(|d| d.ends_with("torn")).count(), 3, "{log}");
    let inbox = s.inbox();
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    assert!(inbox[0].ends_with("/report-1.pdf") && inbox[1].ends_with("/report.pdf"), "never overwritten: {inbox:?}");
    assert_eq!(std::fs::read(s.home.workspace.join(&inbox[1])).unwrap(), b"%PDF-1.7 report");
    let first = last_user(&s.llm.requests()[0]);
    let first = first.as_str().unwrap();
    assert!(
        first.starts_with("[file: inbox/")
            && first.contains("/report.pdf, 15 B, application/pdf; read it with read_file]"),
        "{first}"
    );
    assert!(first.ends_with("summarise"));
    assert_eq!(s.llm.request_count(), 2, "the refused file never reached the model");
}

/// A `remind` job due in a moment, delivered to Alice.
fn remind_job(home: &TestHome, name: &str, text: &str) -> String {
    let store = bramble::scheduler::JobStore::open(&home.state);
    let now = jiff::Timestamp::now();
    let job = bramble::scheduler::Job::new(
        name,
        bramble::scheduler::Schedule::at(now + Duration::from_secs(2)),
        bramble::scheduler::JobKind::Remind { text: text.into() },
        vec![format!("telegram:{ALICE}").parse().unwrap()],
        now,
        &jiff::tz::TimeZone::UTC,
    )
    .unwrap();
    store.add(job).unwrap().id
}

fn press(from: i64, data: &str, message_id: i64, text: &str) -> Value {
    json!({"callback_query": {"id": format!("cb-{data}-{from}"), "chat_instance": "x", "data": data,
        "from": {"id": from, "is_bot": false, "first_name": "U"},
        "message": {"message_id": message_id, "date": 0, "chat": {"id": ALICE, "type": "private"}, "text": text,
                    "from": {"id": BOT_ID, "is_bot": true, "first_name": "Bramble"}}}})
}

#[tokio::test]
async fn reminder_reports_carry_buttons_that_snooze_mark_done_and_take_replies() {
    let s = setup("", "").await;
    std::fs::create_dir_all(&s.home.state).unwrap();
    let id = remind_job(&s.home, "water", "water the plants");
    s.llm.push(Reply::text("Yes, tomorrow too."));
    let daemon = s.daemon();
    assert!(s.tg.wait_sent(1, 20).await, "the reminder: {}", daemon.log());
    let report = s.tg.sent()[0].clone();
    assert_eq!(report["text"], "water the plants");
    let keyboard = report["reply_markup"].clone();
    let data: Vec<&str> = keyboard["inline_keyboard"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["callback_data"].as_str().unwrap())
        .collect();
    assert_eq!(data, [format!("r:d:{id}"), format!("r:s10:{id}"), format!("r:s60:{id}"), format!("r:t:{id}")]);

    let store = bramble::scheduler::JobStore::open(&s.home.state);
    // A stranger's press: answered (the spinner stops), nothing done.
    s.tg.push_update(press(5555, &format!("r:s10:{id}"), 2, "water the plants"));
    assert!(wait_until(15, || s.tg.calls("answerCallbackQuery").len() == 1).await);
    assert_eq!(s.tg.calls("answerCallbackQuery")[0].body["text"], "Not allowed.");
    assert_eq!(store.list().unwrap().len(), 1);

    // Alice snoozes: a new one-shot for her chat, the message edited.
    s.tg.push_update(press(ALICE, &format!("r:s10:{id}"), 2, "water the plants"));
    assert!(wait_until(15, || s.tg.calls("answerCallbackQuery").len() == 2).await);
    let toast = s.tg.calls("answerCallbackQuery")[1].body["text"].as_str().unwrap().to_string();
    assert!(toast.starts_with("Snoozed until "), "{toast}");
    let edit = s.tg.calls("editMessageText")[0].body.clone();
    assert_eq!(edit["message_id"], 2);
    assert_eq!(edit["text"], format!("water the plants\n\n💤 {toast}"));
    let jobs = store.list().unwrap();
    assert_eq!(jobs.len(), 2);
    let snooze = &jobs[1];
    assert!(snooze.name.starts_with("water-snooze-"), "{}", snooze.name);
    assert_eq!(snooze.kind, bramble::scheduler::JobKind::Remind { text: "water the plants".into() });
    let bramble::scheduler::Schedule::At { at, .. } = snooze.schedule else { panic!("an at job") };
    let in_ten = at.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((500..=601).contains(&in_ten), "{in_ten}");

    // Done: recorded in the job's history.
    s.tg.push_update(press(ALICE, &format!("r:d:{id}"), 2, "water the plants"));
    assert!(wait_until(15, || s.tg.calls("answerCallbackQuery").len() == 3).await);
    assert_eq!(s.tg.calls("answerCallbackQuery")[2].body["text"], "Done");
    assert!(store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));

    // A reply to the report continues the job's session.
    s.tg.push(json!({"chat": {"id": ALICE, "type": "private"}, "from": {"id": ALICE, "is_bot": false, "first_name": "A"},
        "text": "and tomorrow?",
        "reply_to_message": {"message_id": 2, "date": 0, "chat": {"id": ALICE, "type": "private"}, "text": "water the plants",
            "from": {"id": BOT_ID, "is_bot": true, "first_name": "Bramble"}, "reply_markup": keyboard}}));
    assert!(s.tg.wait_sent(2, 20).await);
    let asked = last_user(&s.llm.requests()[0]);
    assert_eq!(asked, "[In reply to the report: \"water the plants\"]\nand tomorrow?");

    // The job is deleted; its old buttons say so and change nothing.
    store.remove(&id).unwrap();
    s.tg.push_update(press(ALICE, &format!("r:s60:{id}"), 2, "water the plants"));
    assert!(wait_until(15, || s.tg.calls("answerCallbackQuery").len() == 4).await);
    let (_, log) = daemon.stop().await;
    assert!(s.tg.calls("answerCallbackQuery")[3].body["text"].as_str().unwrap().contains("no longer exists"), "{log}");
    assert_eq!(store.list().unwrap().len(), 1, "only the snooze is left");
    assert!(
        s.home
            .state
            .join("sessions")
            .read_dir()
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("cron")),
        "the reply went to the job's session (cron:water)"
    );
}

#[tokio::test]
async fn a_long_turn_shows_one_status_message_that_goes_with_the_answer() {
    let s = setup("", "").await;
    s.llm.push(Reply::tool_call("exec", r#"{"command":"sleep 1; echo hi"}"#));
    s.llm.push(Reply::text("done"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "run it");
    assert!(s.tg.wait_sent(2, 30).await, "{}", daemon.log());
    assert!(wait_until(10, || !s.tg.calls("deleteMessage").is_empty()).await);
    daemon.stop().await;
    let sent = s.tg.sent();
    assert_eq!(sent[0]["text"], "running `sleep 1; echo hi`…");
    assert_eq!(sent[1]["text"], "done");
    let status_id = s.tg.calls("sendMessage#ok")[0].body["chat_id"].clone();
    assert_eq!(status_id, ALICE);
    assert_eq!(s.tg.calls("deleteMessage").len(), 1, "the status message is removed");
}

#[tokio::test]
async fn progress_can_be_turned_off() {
    let s = setup("", "progress = false\n").await;
    s.llm.push(Reply::tool_call("exec", r#"{"command":"echo hi"}"#));
    s.llm.push(Reply::text("done"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "run it");
    assert!(s.tg.wait_sent(1, 30).await, "{}", daemon.log());
    daemon.stop().await;
    assert_eq!(s.tg.sent_texts(), ["done"]);
}

#[tokio::test]
async fn the_message_tool_sends_workspace_files_as_photos_and_documents() {
    let s = setup("", "").await;
    let png = b"\x89PNG\r\n\x1a\nchart".to_vec();
    std::fs::write(s.home.workspace.join("chart.png"), &png).unwrap();
    std::fs::write(s.home.workspace.join("notes.txt"), "line one\n").unwrap();
    s.llm.push(Reply::tool_call("message", r#"{"content":"bad","attach":["/etc/passwd"]}"#));
    s.llm.push(Reply::tool_call("message", r#"{"content":"here you go","attach":["chart.png","notes.txt"]}"#));
    s.llm.push(Reply::text("sent"));
    let daemon = s.daemon();
    s.tg.push_message(ALICE, "private", ALICE, "alice", "send me the chart");
    assert!(wait_until(30, || s.tg.uploads().len() == 2).await, "{}", daemon.log());
    assert!(s.tg.wait_sent(2, 20).await);
    daemon.stop().await;
    let refused =
        s.llm.requests()[1]["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap()
            ["content"]
            .clone();
    assert!(refused.as_str().unwrap().starts_with("Error: cannot attach /etc/passwd"), "{refused}");
    let uploads = s.tg.uploads();
    assert_eq!((uploads[0].method.as_str(), uploads[0].file_name.as_str()), ("sendPhoto", "chart.png"));
    assert_eq!(uploads[0].data, png);
    assert_eq!(uploads[0].content_type, "image/png");
    assert_eq!((uploads[1].method.as_str(), uploads[1].file_name.as_str()), ("sendDocument", "notes.txt"));
    assert_eq!(uploads[1].data, b"line one\n");
    assert!(uploads.iter().all(|u| u.chat_id == ALICE.to_string()));
    assert!(s.tg.sent_texts().contains(&"here you go".to_string()));
}

#[tokio::test]
async fn an_exec_job_sends_the_file_it_made_with_its_report() {
    let s = setup("", "").await;
    std::fs::create_dir_all(&s.home.state).unwrap();
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    let now = jiff::Timestamp::now();
    let mut job = bramble::scheduler::Job::new(
        "daily-csv",
        bramble::scheduler::Schedule::at(now + Duration::from_secs(2)),
        bramble::scheduler::JobKind::Exec { command: "printf 'a,b\\n1,2\\n' > out.csv && echo written".into() },
        vec![format!("telegram:{ALICE}").parse().unwrap()],
        now,
        &jiff::tz::TimeZone::UTC,
    )
    .unwrap();
    job.attach = vec!["out.csv".into()];
    store.add(job).unwrap();
    let daemon = s.daemon();
    assert!(wait_until(30, || s.tg.uploads().len() == 1).await, "{}", daemon.log());
    daemon.stop().await;
    let up = &s.tg.uploads()[0];
    assert_eq!((up.method.as_str(), up.file_name.as_str()), ("sendDocument", "out.csv"));
    assert_eq!(up.data, b"a,b\n1,2\n");
    assert!(s.tg.sent_texts()[0].contains("written"), "{:?}", s.tg.sent_texts());
    // An exec job's report carries no buttons (only reminders do, by default).
    assert!(s.tg.sent()[0].get("reply_markup").is_none());
}

/// `bramble pair` (the real binary) as the owner would run it; its code.
fn pair_code(home: &TestHome, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .arg("--config")
        .arg(&home.config)
        .arg("pair")
        .args(args)
        .env("HOME", home.path())
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn pairing_adds_a_user_once_and_revoking_removes_them() {
    const BOB: i64 = 3333;
    const CAROL: i64 = 4444;
    let s = setup("", "").await;
    // The code is made before the daemon starts: it survives the start.
    let (ok, out) = pair_code(&s.home, &[]);
    assert!(ok, "{out}");
    let code = out.lines().find_map(|l| l.trim().strip_prefix("/pair ")).expect("a code").to_string();
    s.llm.push(Reply::text("hello Bob"));
    let daemon = s.daemon();
    // A stranger is not served; a wrong code is answered and counted.
    s.tg.push_message(BOB, "private", BOB, "bob", "hello?");
    s.tg.push_message(CAROL, "private", CAROL, "carol", "/pair AAAA-AAAA");
    assert!(s.tg.wait_sent(1, 15).await, "{}", daemon.log());
    assert_eq!(s.tg.sent_texts()[0], "That code is not right (4 tries left for it).");
    // The right code, as a phone might type it.
    s.tg.push_message(BOB, "private", BOB, "bob", &format!("/pair {}", code.to_lowercase()));
    assert!(s.tg.wait_sent(2, 15).await);
    assert_eq!(s.tg.sent_texts()[1], "Paired: you can talk to me now.");
    s.tg.push_message(BOB, "private", BOB, "bob", "hi, I am new");
    assert!(s.tg.wait_sent(3, 15).await);
    assert_eq!(s.tg.sent_texts()[2], "hello Bob");
    // Used once: Carol cannot reuse it.
    tokio::time::sleep(Duration::from_millis(5100)).await; // Carol's one try per 5 s
    s.tg.push_message(CAROL, "private", CAROL, "carol", &format!("/pair {code}"));
    assert!(s.tg.wait_sent(4, 15).await);
    assert!(s.tg.sent_texts()[3].starts_with("There is no valid pairing code"), "{:?}", s.tg.sent_texts());
    let (ok, list) = pair_code(&s.home, &["--list"]);
    assert!(ok && list.contains("3333 (@bob)"), "{list}");
    // Revoked while the daemon runs: Bob's next message is not served.
    let (ok, out) = pair_code(&s.home, &["--revoke", "3333"]);
    assert!(ok, "{out}");
    s.tg.push_message(BOB, "private", BOB, "bob", "still there?");
    s.tg.push_message(ALICE, "private", ALICE, "alice", "/status");
    assert!(s.tg.wait_sent(5, 15).await);
    let (_, log) = daemon.stop().await;
    assert!(s.tg.sent()[4]["chat_id"] == ALICE, "{:?}", s.tg.sent_texts());
    assert_eq!(s.llm.request_count(), 1, "only Bob's paired message reached the model: {log}");
    assert!(log.contains("paired a Telegram user") && log.contains("a wrong Telegram pairing code"), "{log}");
    let (ok, out) = pair_code(&s.home, &["--revoke", "3333"]);
    assert!(!ok && out.contains("not a paired user"), "{out}");
}

#[tokio::test]
async fn a_download_that_keeps_breaking_off_is_given_up_with_a_reply() {
    let s = setup("", "").await;
    s.tg.add_file("flaky", b"%PDF-1.7 never whole".to_vec(), None, 99);
    let daemon = s.daemon();
    s.tg.push(document_message("flaky", "r.pdf", 20));
    assert!(s.tg.wait_sent(1, 30).await, "{}", daemon.log());
    let (_, log) = daemon.stop().await;
    let sent = s.tg.sent_texts();
    assert!(
        sent[0].starts_with("I could not download your file after 3 tries") && sent[0].contains("send it again"),
        "{sent:?}"
    );
    assert_eq!(s.tg.downloads().len(), 3, "{log}");
    assert!(s.inbox().is_empty(), "no half file is left");
    assert_eq!(s.llm.request_count(), 0);
}
