//! Matrix end to end: a real `bramble run` against a real homeserver
//! (Synapse from PyPI, [`crate::support::synapse`]) and a fake LLM; the
//! "human" side is plain client-server API calls to Synapse.

use std::path::Path;
use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use crate::support::synapse::{Synapse, User};
use serde_json::{json, Value};

const TOKEN_ENV: &str = "BRAMBLE_TEST_MATRIX_TOKEN";

struct Setup {
    llm: FakeLlm,
    synapse: &'static Synapse,
    bot: User,
    owner: User,
    home: TestHome,
    log: tempfile::TempDir,
}

async fn setup(extra: &str) -> Setup {
    let synapse = Synapse::shared().await;
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let (bot, owner) = tokio::join!(synapse.user("bot"), synapse.user("owner"));
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[matrix]\nhomeserver = \"{}\"\nuser_id = \"{}\"\n\
             allow_from = [\"{}\"]\n{extra}",
            synapse.url(),
            bot.id,
            owner.id
        ),
    );
    Setup { llm, synapse, bot, owner, home, log: tempfile::tempdir().unwrap() }
}

impl Setup {
    /// `bramble run` with the bot's access token in the environment.
    fn daemon(&self, log: &str) -> Daemon {
        let config = std::fs::read_to_string(&self.home.config).unwrap();
        if !config.contains("access_token_env") && !config.contains("password_env") {
            let config = config.replace("[matrix]\n", &format!("[matrix]\naccess_token_env = \"{TOKEN_ENV}\"\n"));
            std::fs::write(&self.home.config, config).unwrap();
        }
        let token = Path::new(&self.bot.token);
        Daemon::start_with_env(
            self.home.path(),
            Some(&self.home.config),
            &self.log.path().join(log),
            &[(TOKEN_ENV, token)],
        )
    }

    /// A direct room of the owner's with the bot in it (invited, and joined by the daemon).
    async fn dm(&self, daemon: &Daemon) -> String {
        assert!(daemon.wait_log("Matrix syncing", 30).await, "the daemon syncs: {}", daemon.log());
        let room = self.owner.create_room(&[&self.bot.id], false).await;
        assert!(self.owner.wait_member(&room, &self.bot.id, 30).await, "the bot joined: {}", daemon.log());
        room
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
async fn the_owner_is_answered_in_the_room_and_a_reminder_is_marked_done_by_a_reaction() {
    let s = setup("").await;
    s.llm.push(Reply::text("**Hello** owner, 2 < 3"));
    let daemon = s.daemon("happy.log");
    let room = s.dm(&daemon).await;
    s.owner.say(&room, "hi there").await;
    let answers = s.owner.wait_messages(&room, &s.bot.id, 1, 30).await;
    assert_eq!(answers.len(), 1, "one answer: {}", daemon.log());
    let content = &answers[0]["content"];
    assert_eq!(content["msgtype"], "m.text");
    assert_eq!(content["body"], "**Hello** owner, 2 < 3");
    assert_eq!(content["format"], "org.matrix.custom.html");
    assert_eq!(content["formatted_body"], "<b>Hello</b> owner, 2 &lt; 3");
    assert_eq!(last_user_text(&s.llm.requests()[0]), "hi there");

    // A reminder's report in the room, answered with a ✅ reaction.
    let id = remind_job(&s.home, "water", "water the plants", &format!("matrix:{room}"));
    let sent = s.owner.wait_messages(&room, &s.bot.id, 2, 30).await;
    assert_eq!(sent.len(), 2, "the reminder was delivered: {}", daemon.log());
    let body = sent[1]["content"]["body"].as_str().unwrap().to_string();
    assert!(body.starts_with("water the plants\n\nReact ✅"), "{body}");
    let report = sent[1]["event_id"].as_str().unwrap().to_string();
    s.owner.react(&room, &report, "✅").await;
    let sent = s.owner.wait_messages(&room, &s.bot.id, 3, 30).await;
    assert_eq!(sent.len(), 3, "Done was answered: {}", daemon.log());
    assert_eq!(sent[2]["content"]["body"], "Done");
    assert_eq!(sent[2]["content"]["msgtype"], "m.notice");
    let store = bramble::scheduler::JobStore::open(&s.home.state);
    assert!(store.get(&id).unwrap().state.history.iter().any(|r| r.summary.contains("marked done")));
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.llm.request_count(), 1, "{log}");
    assert!(!log.contains(&s.bot.token), "the token never reaches the log");
    let _ = (&s.synapse, json!({}));
}
