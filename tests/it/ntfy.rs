//! ntfy end to end: a real `bramble run` against a fake ntfy server built
//! from ntfy's published docs ([`crate::support::ntfy`], which names the
//! pages) and a fake LLM. The "phone" is plain HTTP: publishing as the app
//! does, and pressing a notification's `http` action button.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::ntfy::FakeNtfy;
use crate::support::setup::TestHome;

const TOKEN_ENV: &str = "BRAMBLE_TEST_NTFY_TOKEN";
const TOKEN: &str = "tk_test0123456789abcdefghijklmno";

struct Setup {
    llm: FakeLlm,
    ntfy: FakeNtfy,
    home: TestHome,
    log: tempfile::TempDir,
}

async fn setup(extra: &str) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let ntfy = FakeNtfy::start(Some(TOKEN)).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [ntfy]\nserver = \"{}\"\ntoken_env = \"{TOKEN_ENV}\"\n{extra}",
            ntfy.url()
        ),
    );
    Setup { llm, ntfy, home, log: tempfile::tempdir().unwrap() }
}

impl Setup {
    fn daemon(&self, log: &str) -> Daemon {
        let env = [(TOKEN_ENV, Path::new(TOKEN))];
        Daemon::start_with_env(self.home.path(), Some(&self.home.config), &self.log.path().join(log), &env)
    }

    /// Wait until `n` messages are published on `topic`; they, in order.
    async fn published_on(&self, topic: &str, n: usize) -> Vec<Value> {
        let on = |all: Vec<Value>| all.into_iter().filter(|m| m["topic"] == topic).collect::<Vec<_>>();
        wait_until(60, || on(self.ntfy.published()).len() >= n).await;
        on(self.ntfy.published())
    }
}

/// A `remind` job due in a moment, delivered to `target`.
fn remind_job(home: &TestHome, name: &str, text: &str, target: &str) -> String {
    remind_with(home, name, text, target, &[])
}

/// The same with workspace files attached.
fn remind_with(home: &TestHome, name: &str, text: &str, target: &str, attach: &[&str]) -> String {
    let store = bramble::scheduler::JobStore::open(&home.state);
    let now = jiff::Timestamp::now();
    let mut job = bramble::scheduler::Job::new(
        name,
        bramble::scheduler::Schedule::at(now + Duration::from_secs(1)),
        bramble::scheduler::JobKind::Remind { text: text.into() },
        vec![target.parse().unwrap()],
        now,
        &jiff::tz::TimeZone::UTC,
    )
    .unwrap();
    job.attach = attach.iter().map(|a| a.to_string()).collect();
    store.add(job).unwrap().id
}

#[cfg(feature = "webhook")]
async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

#[cfg(feature = "webhook")]
async fn press(url: &str) -> (u16, String) {
    let r = reqwest::Client::new().post(url).send().await.expect("the listener answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[cfg(feature = "webhook")]
#[tokio::test]
async fn a_reminder_is_a_notification_whose_done_button_calls_back_once() {
    let port = free_port().await;
    let s = setup(&format!(
        "callback_base = \"http://127.0.0.1:{port}\"\n\
         [ntfy.topics.reports]\npriority = 5\ntags = [\"robot\"]\nclick = \"https://example.org/board\"\n\
         [webhooks]\nlisten = \"127.0.0.1:{port}\"\n"
    ))
    .await;
    let daemon = s.daemon("remind.log");
    assert!(daemon.wait_log("webhooks listening", 30).await, "{}", daemon.log());
    let id = remind_job(&s.home, "water-plants", "water the plants", "ntfy:reports");
    let sent = s.published_on("reports", 1).await;
    assert_eq!(sent.len(), 1, "the reminder was published: {}", daemon.log());
    let m = &sent[0];
    assert_eq!(m["message"], "water the plants");
    assert_eq!(m["title"], "water-plants", "the job's name is the title");
    assert_eq!(m["priority"], 5, "the topic's default");
    assert_eq!(m["click"], "https://example.org/board");
    assert_eq!(m["tags"], serde_json::json!(["robot", "bramble"]));
    let publish = s.ntfy.requests().into_iter().find(|r| r.method == "POST" && r.path == "/").unwrap();
    assert_eq!(publish.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(publish.header("content-type"), Some("application/json"));
    let actions = m["actions"].as_array().expect("buttons");
    assert_eq!(actions.len(), 2);
    assert_eq!(
        (&actions[0]["action"], &actions[0]["label"], &actions[0]["method"]),
        (&"http".into(), &"Done".into(), &"POST".into())
    );
    let done = actions[0]["url"].as_str().unwrap().to_string();
    let snooze = actions[1]["url"].as_str().unwrap().to_string();
    assert!(done.starts_with(&format!("http://127.0.0.1:{port}/ntfy/")) && done.ends_with("/done"), "{done}");

    // A forged token does nothing; a GET does nothing.
    let forged = format!("http://127.0.0.1:{port}/ntfy/{}/done", "0".repeat(32));
    assert_eq!(press(&forged).await.0, 404);
    let get = reqwest::get(&done).await.unwrap().status().as_u16();
    assert_eq!(get, 405);
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    assert!(!store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));
    // Done works once; the same token again (either button) does nothing.
    assert_eq!(press(&done).await, (200, "Done\n".into()), "{}", daemon.log());
    assert!(store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));
    assert_eq!(press(&done).await.0, 404, "reused");
    assert_eq!(press(&snooze).await.0, 404, "one press per notification");
    let jobs = store.list().unwrap().len();
    // A report with a workspace file: uploaded by PUT to the topic, the fields as query parameters.
    let image = b"\x89PNG fake image";
    std::fs::write(s.home.workspace.join("plot.png"), image).unwrap();
    remind_with(&s.home, "plot", "today's plot", "ntfy:reports", &["plot.png"]);
    let sent = s.published_on("reports", 2).await;
    assert_eq!(sent.len(), 2, "the report with a file: {}", daemon.log());
    assert_eq!(sent[1]["attachment"]["name"], "plot.png");
    assert_eq!(sent[1]["upload"], image.len());
    assert_eq!((&sent[1]["message"], &sent[1]["title"]), (&"today's plot".into(), &"plot".into()));
    let put = s.ntfy.requests().into_iter().find(|r| r.method == "PUT").unwrap();
    assert_eq!(put.path_only(), "/reports");
    assert_eq!(put.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(jobs, 1, "no snooze was made by a reused token");
    assert!(!log.contains(TOKEN), "the token never reaches the log");
    assert!(log.contains("unknown, used or expired token"), "{log}");
}

#[tokio::test]
async fn a_command_typed_in_the_app_runs_a_turn_answered_on_the_topic_without_looping() {
    let s = setup("subscribe = [\"cmd-x7\"]\n").await;
    s.llm.push(Reply::text("all good"));
    s.llm.push(Reply::text("second answer"));
    let daemon = s.daemon("turn.log");
    assert!(daemon.wait_log("ntfy: subscribed", 30).await, "{}", daemon.log());
    s.ntfy.type_in_app("other-topic", "not for bramble").await;
    s.ntfy.type_in_app("cmd-x7", "how is the board?").await;
    let answers = s.published_on("cmd-x7", 2).await;
    assert_eq!(answers[1]["message"], "all good", "{}", daemon.log());
    assert!(answers[1]["tags"].as_array().unwrap().iter().any(|t| t == "bramble"));
    // The answer came back on the stream: not a turn. The next command is.
    s.ntfy.type_in_app("cmd-x7", "and now?").await;
    let answers = s.published_on("cmd-x7", 4).await;
    assert_eq!(answers[3]["message"], "second answer", "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(log.matches("ntfy: a message from the topic").count(), 2, "{log}");
    assert_eq!(s.llm.request_count(), 2, "{log}");
    // Only the allowed topic was ever subscribed, with the token.
    for r in s.ntfy.requests().iter().filter(|r| r.method == "GET") {
        assert_eq!(r.path_only(), "/cmd-x7/json");
        assert_eq!(r.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    }
    // The turn had the ntfy source's tools: no commands, no file writes.
    let tools: Vec<String> = s.llm.requests()[0]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    assert!(tools.iter().any(|t| t == "read_file"), "{tools:?}");
    assert!(!tools.iter().any(|t| t == "exec" || t == "write_file"), "{tools:?}");
    assert!(!log.contains(TOKEN));
}

#[tokio::test]
async fn the_stream_resumes_after_a_drop_and_a_restart_with_nothing_doubled_or_lost() {
    let s = setup("subscribe = [\"cmd-x7\"]\n").await;
    for _ in 0..3 {
        s.llm.push(Reply::text("ok"));
    }
    let daemon = s.daemon("resume1.log");
    assert!(daemon.wait_log("ntfy: subscribed", 30).await, "{}", daemon.log());
    // Malformed and oversize lines are skipped; reading goes on.
    s.ntfy.raw_line("{not json");
    s.ntfy.raw_line(&format!("{{\"event\":\"message\",\"topic\":\"cmd-x7\",\"message\":\"{}\"}}", "x".repeat(100_000)));
    s.ntfy.type_in_app("cmd-x7", "one").await;
    s.published_on("cmd-x7", 2).await;
    assert!(daemon.wait_log_count("ntfy: a message from the topic", 1, 30).await, "{}", daemon.log());
    // The stream drops: the reconnect asks for what came after the last id.
    s.ntfy.drop_streams();
    assert!(daemon.wait_log_count("ntfy: subscribed", 2, 30).await, "{}", daemon.log());
    s.ntfy.type_in_app("cmd-x7", "two").await;
    s.published_on("cmd-x7", 4).await;
    assert!(daemon.wait_log_count("ntfy: a message from the topic", 2, 30).await, "{}", daemon.log());
    let (code, log1) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log1}");
    assert!(log1.contains("not an ntfy event") && log1.contains("a line over"), "{log1}");
    // Published while bramble is down: read once after the restart.
    s.ntfy.type_in_app("cmd-x7", "three").await;
    let daemon = s.daemon("resume2.log");
    assert!(daemon.wait_log("ntfy: subscribed", 30).await, "{}", daemon.log());
    s.published_on("cmd-x7", 6).await;
    assert!(daemon.wait_log_count("ntfy: a message from the topic", 1, 30).await, "{}", daemon.log());
    let (code, log2) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log2}");
    let subs = s.ntfy.subscriptions();
    assert_eq!(subs[0].1, None, "the first start reads from now");
    assert!(subs[1..].iter().all(|(_, since)| since.is_some()), "every reconnect resumes: {subs:?}");
    let turns =
        log1.matches("ntfy: a message from the topic").count() + log2.matches("ntfy: a message from the topic").count();
    assert_eq!(turns, 3, "one, two, three: each once\n{log1}\n{log2}");
    let said: Vec<String> = s.llm.requests().iter().map(|r| r.to_string()).collect();
    for word in ["\"one\"", "\"two\"", "\"three\""] {
        assert_eq!(said.iter().filter(|r| r.contains(word)).count().min(1), 1, "{word} reached the model");
    }
}

#[tokio::test]
async fn a_failing_server_keeps_the_report_and_a_redirect_carries_no_token() {
    let s = setup("alert_topic = \"alerts\"\n[ntfy.topics.reports]\n").await;
    s.ntfy.fail_next(&[503, 429]);
    let daemon = s.daemon("fail.log");
    daemon.scheduler_idle().await;
    remind_job(&s.home, "kept", "kept through a 503 and a 429", "ntfy:reports");
    let sent = s.published_on("reports", 1).await;
    assert_eq!(sent.len(), 1, "delivered after the retries: {}", daemon.log());
    assert_eq!(sent[0]["message"], "kept through a 503 and a 429");
    // A topic not named in [ntfy] is refused, with a clear reason.
    remind_job(&s.home, "stray", "to a stranger's topic", "ntfy:somebody-elses");
    assert!(daemon.wait_log("is not named in [ntfy]", 30).await, "{}", daemon.log());
    // A redirect is not followed: the token goes nowhere else.
    let elsewhere = FakeNtfy::start(None).await;
    s.ntfy.redirect_to(&elsewhere.url());
    remind_job(&s.home, "moved", "to a moved server", "ntfy:reports");
    assert!(daemon.wait_log("redirected to", 30).await, "{}", daemon.log());
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert!(elsewhere.requests().is_empty(), "nothing reached the redirect's target");
    assert!(!log.contains(TOKEN));
    assert_eq!(s.ntfy.published().iter().filter(|m| m["topic"] == "somebody-elses").count(), 0);
}

/// `bramble doctor --json`'s `ntfy` checks and `bramble status`'s line, with `token` in the environment.
async fn doctor_and_status(s: &Setup, token: &str) -> (Vec<Value>, String) {
    let run = |args: &'static [&'static str]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        cmd.arg("--config").arg(&s.home.config).args(args);
        cmd.env_clear()
            .env("HOME", s.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(TOKEN_ENV, token);
        cmd
    };
    let doctor = run(&["doctor", "--json"]).output().await.unwrap();
    let v: Value = serde_json::from_slice(&doctor.stdout).unwrap_or_default();
    let checks =
        v["checks"].as_array().cloned().unwrap_or_default().into_iter().filter(|c| c["name"] == "ntfy").collect();
    let status = run(&["status"]).output().await.unwrap();
    (checks, String::from_utf8_lossy(&status.stdout).into_owned())
}

#[tokio::test]
async fn doctor_reads_a_topic_with_the_token_and_status_says_where_alerts_go() {
    let s = setup("subscribe = [\"cmd-x7\"]\nalert_topic = \"alerts\"\n").await;
    let (checks, status) = doctor_and_status(&s, TOKEN).await;
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0]["status"], "ok", "{checks:?}");
    assert!(checks[0]["detail"].as_str().unwrap().contains("cmd-x7 can be read"), "{checks:?}");
    let line = status.lines().find(|l| l.starts_with("ntfy:")).unwrap_or_default();
    assert!(line.contains(&s.ntfy.url()) && line.contains(&format!("token from {TOKEN_ENV}")), "{status}");
    assert!(line.contains("alerts and the dead-man to ntfy:alerts"), "{line}");
    let (checks, _) = doctor_and_status(&s, "tk_wrong").await;
    assert_eq!(checks[0]["status"], "fail", "{checks:?}");
    assert!(checks[0]["detail"].as_str().unwrap().contains("401"), "{checks:?}");
}
