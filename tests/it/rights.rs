//! A job runs with the rights of who made it, as they are when it runs: the
//! red team's walk-arounds of wave 2 (issue 36) through the real binary —
//! `bramble agent`, `bramble cron run`, `bramble pair --revoke` and a daemon
//! with a Telegram fake that follows the Bot API's `getUpdates`/`sendMessage`
//! (<https://core.telegram.org/bots/api>).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use crate::support::telegram::FakeTelegram;

const TOKEN: &str = "123456:rights-test-token";
const ALICE: i64 = 1111;
const BOB: i64 = 3333;

/// The real binary with this home's config (success, stdout, stderr).
async fn bramble(home: &TestHome, args: &[&str]) -> (bool, String, String) {
    let config = home.config.to_string_lossy().into_owned();
    let all: Vec<&str> = ["--config", config.as_str()].into_iter().chain(args.iter().copied()).collect();
    let out = crate::support::setup::bramble(home.path(), &all, None).await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text of every tool result the model was shown, across its requests.
fn tool_results(llm: &FakeLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect()
}

fn jobs(state: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(state.join("jobs.json")).unwrap_or_else(|_| "{\"jobs\":[]}".into());
    serde_json::from_str::<Value>(&text).unwrap()["jobs"].as_array().cloned().unwrap_or_default()
}

/// `bramble agent`'s cron tool stores the terminal's conversation as the job's
/// origin; the red team's job then ran `exec` under `[policy.terminal]` although
/// `[policy.job]` denied it. A job's turn is a job's, whatever chat made it.
#[tokio::test]
async fn a_job_made_in_the_terminal_chat_runs_under_policy_job() {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        "[heartbeat]\nenabled = false\n[policy.job]\ndeny = [\"exec\"]\n",
    );
    let marker = home.workspace.join("pwned");
    llm.push(Reply::tool_call(
        "cron",
        json!({"action": "add", "name": "nightly", "every": "1d", "message": "tidy up"}).to_string(),
    ));
    llm.push(Reply::text("Scheduled."));
    let (ok, out, err) = bramble(&home, &["agent", "-m", "every night, tidy up"]).await;
    assert!(ok, "{out}{err}");
    let job = jobs(&home.state).into_iter().find(|j| j["name"] == "nightly").expect("the job was made");
    assert_eq!(job["origin"]["channel"], "cli", "made in the terminal chat: {job}");
    assert_eq!(job["creator"], "owner", "{job}");

    // Due: the model tries a command; [policy.job] has no `exec`.
    llm.push(Reply::tool_call("exec", json!({"command": format!("touch {}", marker.display())}).to_string()));
    llm.push(Reply::text("done"));
    let (ok, out, err) = bramble(&home, &["cron", "run", "nightly"]).await;
    assert!(ok, "{out}{err}");
    let results = tool_results(&llm);
    let refusal = results.last().expect("the exec call was answered");
    assert!(refusal.contains("`exec` is not offered") && refusal.contains("[policy.job]"), "{results:?}");
    assert!(!marker.exists(), "the command did not run");
    // Nor was it offered.
    let offered: Vec<String> = llm.requests().last().unwrap()["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    assert!(!offered.is_empty() && !offered.contains(&"exec".to_string()), "{offered:?}");
}

/// A Telegram daemon for the revocation test: Alice in `allow_from`, Bob paired.
struct Chat {
    llm: FakeLlm,
    tg: FakeTelegram,
    home: TestHome,
}

async fn chat(extra: &str) -> Chat {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\n\
             allow_from = [{ALICE}]\napi_base = \"{}\"\n{extra}",
            tg.url()
        ),
    );
    std::fs::create_dir_all(&home.state).unwrap();
    // Bob as `bramble pair` and his `/pair` leave him (the format of telegram-paired.json).
    std::fs::write(
        home.state.join("telegram-paired.json"),
        json!([{"id": BOB, "username": "bob", "paired": "2026-11-20T10:00:00Z"}]).to_string(),
    )
    .unwrap();
    Chat { llm, tg, home }
}

/// The red team's paired user made an every-2-s job with every tool and was
/// revoked; the job kept running with exec. Now: the job acts for Bob, gets no
/// tool `[policy.telegram]` denies him, `pair --revoke` disables it (and says so,
/// and audits it), and a job re-enabled behind the owner's back is refused at
/// its next run.
#[tokio::test]
async fn a_revoked_users_jobs_stop_and_never_have_more_than_his_tools() {
    let c = chat("[policy.telegram]\ndeny = [\"exec\"]\n").await;
    let marker = c.home.workspace.join("pwned");
    let touch = json!({"command": format!("touch {}", marker.display())}).to_string();
    // Bob's chat turn makes the job; each job turn tries `exec`, then answers.
    c.llm.route(move |req| {
        let messages = req["messages"].as_array()?;
        let last = messages.last()?;
        let user_text = messages.iter().rev().find(|m| m["role"] == "user")?["content"].to_string();
        if !user_text.contains("Scheduled job") {
            return None;
        }
        Some(if last["role"] == "tool" { Reply::text("checked") } else { Reply::tool_call("exec", touch.clone()) })
    });
    c.llm.push(Reply::tool_call(
        "cron",
        json!({"action": "add", "name": "poll", "every": "2s", "message": "check the door"}).to_string(),
    ));
    c.llm.push(Reply::text("Will do."));
    let daemon = Daemon::start(c.home.path(), Some(&c.home.config));
    c.tg.push_message(BOB, "private", BOB, "bob", "check the door every 2 seconds");
    assert!(c.tg.wait_sent(1, 20).await, "{}", daemon.log());
    let job = jobs(&c.home.state).into_iter().find(|j| j["name"] == "poll").expect("Bob's job");
    assert_eq!(job["creator"], format!("telegram:{BOB}"), "{job}");
    // It runs, as a job of Bob's: [policy.telegram] takes exec from it.
    assert!(c.tg.wait_sent(3, 30).await, "two runs reported: {}", daemon.log());
    let results = tool_results(&c.llm);
    assert!(
        results
            .iter()
            .any(|r| r.contains("`exec` is not offered")
                && r.contains("[policy.job] and its creator's [policy.telegram]")),
        "{results:?}"
    );
    assert!(!marker.exists(), "no command ran for Bob's job");

    // Revoked: the job is disabled at once, the output and the audit trail say so.
    let (ok, out, err) = bramble(&c.home, &["pair", "--revoke", &BOB.to_string()]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("revoked 3333") && out.contains("disabled 1 job they made: poll ("), "{out}");
    let audit = std::fs::read_to_string(c.home.state.join("audit.jsonl")).unwrap_or_default();
    assert!(audit.contains("pair --revoke 3333: disabled poll ("), "{audit}");
    let job = jobs(&c.home.state).into_iter().find(|j| j["name"] == "poll").unwrap();
    assert_eq!(job["enabled"], false, "{job}");
    let settled = c.llm.request_count();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.llm.request_count(), settled, "no turn of the revoked user's job: {}", daemon.log());

    // Enabled again (by a member, a restore of an old jobs.json …): refused when due, disabled again.
    let (ok, out, err) = bramble(&c.home, &["cron", "enable", "poll"]).await;
    assert!(ok, "{out}{err}");
    let refused = wait_until(20, || daemon.log().contains("job not run and disabled")).await;
    assert!(refused, "{}", daemon.log());
    assert!(daemon.log().contains("its creator, Telegram user 3333, is no longer allowed"), "{}", daemon.log());
    let disabled =
        wait_until(10, || jobs(&c.home.state).iter().any(|j| j["name"] == "poll" && j["enabled"] == false)).await;
    assert!(disabled, "{:?}", jobs(&c.home.state));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.llm.request_count(), settled, "still no model call for it");
    let (_, log) = daemon.stop().await;
    assert!(!log.contains("panicked"), "{log}");
}

/// Alice is in the config's `allow_from`: revoking a pairing she never needed
/// leaves her jobs alone, and says why.
#[tokio::test]
async fn revoking_a_user_the_config_still_lists_keeps_their_jobs() {
    let c = chat("").await;
    std::fs::write(
        c.home.state.join("telegram-paired.json"),
        json!([{"id": ALICE, "paired": "2026-11-20T10:00:00Z"}]).to_string(),
    )
    .unwrap();
    let (ok, out, err) = bramble(&c.home, &["pair", "--revoke", &ALICE.to_string()]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("still in [telegram] allow_from: their jobs keep running"), "{out}");
}
