//! Pairing on Discord, Signal and Feishu / Lark end to end: a real `bramble
//! run` against each channel's fake (their `//!` headers name the documents
//! they follow: Discord's developer documentation, signal-cli-jsonrpc(5), the
//! official Feishu Go SDK and Open Platform pages) and a fake LLM, with
//! `bramble pair` run as the owner would.
//!
//! For each: a stranger's `/pair` with no code of that channel pending, with
//! another channel's code, or in a group/guild channel does nothing; a wrong
//! code is answered and counted; the right one pairs and the user is served;
//! revoking cuts them off at their next message. The owner's messages are the
//! sync points: events are handled in order, so once the owner's answer came,
//! everything sent before it was handled.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::pairing::{code_of, pair_cli};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use bramble::policy::pairing::{self, PairChannel};

/// What the model was asked, last user message of each request.
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

fn home(llm: &FakeLlm, section: &str) -> TestHome {
    TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!("[heartbeat]\nenabled = false\n{section}"),
    )
}

/// A pending code of `channel` written as `bramble pair --channel <channel>` writes it.
fn other_code(home: &TestHome, channel: PairChannel) -> String {
    pairing::new_code(&home.state, channel, jiff::Timestamp::now()).unwrap().0
}

/// A job `who` made, due in an hour, delivered to `target`: its id.
#[cfg_attr(not(feature = "discord"), allow(dead_code))]
fn job_made_by(home: &TestHome, who: bramble::bus::Principal, target: &str) -> String {
    let now = jiff::Timestamp::now();
    let mut job = bramble::scheduler::Job::new(
        "theirs",
        bramble::scheduler::Schedule::at(now + Duration::from_secs(3600)),
        bramble::scheduler::JobKind::Remind { text: "their reminder".into() },
        vec![target.parse().unwrap()],
        now,
        &jiff::tz::TimeZone::UTC,
    )
    .unwrap();
    job.creator = Some(who);
    bramble::scheduler::JobStore::open(&home.state).add(job).unwrap().id
}

/// One try per user per 5 s: wait past it before the next try.
async fn past_try_gap() {
    tokio::time::sleep(pairing::TRY_GAP + Duration::from_secs(1)).await;
}

#[cfg(feature = "discord")]
mod discord {
    use super::*;
    use crate::support::discord::{FakeDiscord, Posted};

    const TOKEN_ENV: &str = "BRAMBLE_TEST_DISCORD_TOKEN";
    const TOKEN: &str = "MTAwMDAw.discord-test.5ecret-token";
    const OWNER: u64 = 80_351_110_224_678_912;
    const BOB: u64 = 81_000_000_000_000_042;
    const OWNER_DM: u64 = 700_000_000_000_000_001;
    const BOB_DM: u64 = 700_000_000_000_000_042;
    const GUILD: u64 = 600_000_000_000_000_001;
    const ROOM: u64 = 700_000_000_000_000_002;
    const IGNORED: &str = "not in [discord] allow_from was ignored";

    fn to(fake: &FakeDiscord, channel: u64) -> Vec<Posted> {
        fake.posted().into_iter().filter(|p| p.channel == channel).collect()
    }

    async fn wait_posted(fake: &FakeDiscord, channel: u64, n: usize, daemon: &Daemon) -> Vec<Posted> {
        let ok = wait_until(30, || to(fake, channel).len() >= n).await;
        assert!(ok, "{n} message(s) in {channel}: {:?}\n{}", to(fake, channel), daemon.log());
        to(fake, channel)
    }

    #[tokio::test]
    async fn a_discord_stranger_pairs_in_a_dm_only_with_a_discord_code_and_revoking_cuts_them_off() {
        let fake = FakeDiscord::start(TOKEN).await;
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let home = home(
            &llm,
            &format!(
                "[discord]\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nallow_from = [\"{OWNER}\"]\n\
                 channels = [\"{ROOM}\"]\n",
                fake.api_base()
            ),
        );
        let logs = tempfile::tempdir().unwrap();
        let env = [(TOKEN_ENV, Path::new(TOKEN))];
        let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &logs.path().join("pair.log"), &env);
        assert!(daemon.wait_log("Discord connected", 30).await, "{}", daemon.log());

        // No Discord code pending, then only a Signal one: bob's /pair is not answered.
        fake.message(BOB_DM, None, BOB, false, "/pair ABCD-EFGH");
        let signal_code = other_code(&home, PairChannel::Signal);
        fake.message(BOB_DM, None, BOB, false, &format!("/pair {signal_code}"));
        llm.push(Reply::text("pong 1"));
        fake.message(OWNER_DM, None, OWNER, false, "ping 1");
        wait_posted(&fake, OWNER_DM, 1, &daemon).await;
        assert!(to(&fake, BOB_DM).is_empty(), "nothing said to a stranger: {}", daemon.log());

        let (ok, out) = pair_cli(&home, &["--channel", "discord"]);
        assert!(ok && out.contains("direct message"), "{out}");
        let code = code_of(&out);
        // In a guild channel (even one bramble reads) a /pair does nothing, and is not a try.
        fake.message(ROOM, Some(GUILD), BOB, false, &format!("/pair {code}"));
        fake.message(BOB_DM, None, BOB, false, "/pair WRON-GCOD");
        let said = wait_posted(&fake, BOB_DM, 1, &daemon).await;
        assert_eq!(said[0].body["content"], "That code is not right (4 tries left for it).");
        assert!(to(&fake, ROOM).is_empty(), "nothing in the guild channel");
        past_try_gap().await;
        fake.message(BOB_DM, None, BOB, false, &format!("/pair {}", code.to_lowercase()));
        let said = wait_posted(&fake, BOB_DM, 2, &daemon).await;
        assert_eq!(said[1].body["content"], "Paired: you can talk to me now.", "{}", daemon.log());
        llm.push(Reply::text("hello bob"));
        fake.message(BOB_DM, None, BOB, false, "hi, I am bob");
        let said = wait_posted(&fake, BOB_DM, 3, &daemon).await;
        assert_eq!(said[2].body["content"], "hello bob");
        let (ok, out) = pair_cli(&home, &["--channel", "discord", "--list"]);
        assert!(ok && out.contains(&format!("{BOB} (@user{BOB})")), "{out}");

        // A job bob made; revoking disables it, and bob's next message is a stranger's.
        let job = job_made_by(&home, bramble::bus::Principal::Discord(BOB), "discord:1");
        let (ok, out) = pair_cli(&home, &["--channel", "discord", "--revoke", &BOB.to_string()]);
        assert!(ok && out.contains("revoked") && out.contains("disabled 1 job"), "{out}");
        assert!(!bramble::scheduler::JobStore::open(&home.state).get(&job).unwrap().enabled);
        fake.message(BOB_DM, None, BOB, false, "still there?");
        // Logged as a stranger again (the first time was the guild /pair).
        assert!(daemon.wait_log_count(IGNORED, 2, 30).await, "{}", daemon.log());
        llm.push(Reply::text("pong 2"));
        fake.message(OWNER_DM, None, OWNER, false, "ping 2");
        wait_posted(&fake, OWNER_DM, 2, &daemon).await;
        let (exit, log) = daemon.stop().await;
        assert_eq!(exit, Some(0), "{log}");
        assert_eq!(to(&fake, BOB_DM).len(), 3, "nothing answered after the revoke: {log}");
        assert_eq!(asked(&llm), ["ping 1", "hi, I am bob", "ping 2"], "no stranger text reached the model");
        assert!(!log.contains(&code) && !log.contains("WRON-GCOD"), "no code in the log");
    }
}

#[cfg(feature = "discord")]
mod discord_status {
    use super::*;
    use crate::support::discord::FakeDiscord;

    const TOKEN_ENV: &str = "BRAMBLE_TEST_DISCORD_TOKEN";
    const TOKEN: &str = "MTAwMDAw.discord-test.5ecret-token";

    async fn discord_line(home: &TestHome) -> String {
        let config = home.config.to_str().unwrap();
        let out = crate::support::setup::bramble(home.path(), &["--config", config, "status", "--json"], None).await;
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        json["discord"].as_str().unwrap_or_else(|| panic!("no discord field: {json}")).to_string()
    }

    async fn wait_line(home: &TestHome, daemon: &Daemon, starts: &str) -> String {
        let mut line = String::new();
        for _ in 0..120 {
            line = discord_line(home).await;
            if line.starts_with(starts) {
                return line;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("status never said `{starts}…`: {line}\n{}", daemon.log());
    }

    #[tokio::test]
    async fn discord_status_shows_the_connection_and_a_fatal_close_with_its_reason() {
        let fake = FakeDiscord::start(TOKEN).await;
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let section = format!("[discord]\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\n", fake.api_base());
        let home = home(&llm, &section);
        let logs = tempfile::tempdir().unwrap();
        let env = [(TOKEN_ENV, Path::new(TOKEN))];
        assert_eq!(discord_line(&home).await.split(';').next(), Some("never connected"));
        let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &logs.path().join("up.log"), &env);
        assert!(daemon.wait_log("Discord connected", 30).await, "{}", daemon.log());
        let line = wait_line(&home, &daemon, "connected since ").await;
        assert!(line.contains("bot (token from BRAMBLE_TEST_DISCORD_TOKEN") && !line.contains("MISSING"), "{line}");
        // A close Discord says not to reconnect after: stopped, with the reason and the code.
        fake.close_with(4014);
        assert!(daemon.wait_log("the Discord channel is off", 30).await, "{}", daemon.log());
        let line = wait_line(&home, &daemon, "STOPPED since ").await;
        assert!(line.contains("Message Content intent is not enabled") && line.contains("(close code 4014)"), "{line}");
        let (exit, log) = daemon.stop().await;
        assert_eq!(exit, Some(0), "{log}");
        assert!(discord_line(&home).await.starts_with("STOPPED since "), "the fatal reason is kept after the stop");

        // A gateway that cannot be reached: reconnecting, with the last error; after the stop, stopped.
        let dead = format!("{section}gateway = \"ws://127.0.0.1:1\"\n");
        let home = super::home(&llm, &dead);
        let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &logs.path().join("dead.log"), &env);
        let line = wait_line(&home, &daemon, "reconnecting since ").await;
        assert!(line.contains("(last error: cannot connect to "), "{line}");
        let (exit, log) = daemon.stop().await;
        assert_eq!(exit, Some(0), "{log}");
        let line = discord_line(&home).await;
        assert!(line.starts_with("stopped since ") && line.contains("bramble stopped"), "{line}");
    }
}

#[cfg(feature = "signal")]
mod signal {
    use super::*;
    use crate::support::signal::{text_envelope, FakeSignal};

    const OWNER: &str = "+4915112345678";
    const OWNER_UUID: &str = "7ccae375-cd51-4c82-8b1e-7be3280aa485";
    const BOB: &str = "+4915199999942";
    const BOB_UUID: &str = "5d1e2c3b-4a59-4687-9a1b-2c3d4e5f6a7b";
    const EVE_UUID: &str = "0b0e6f5a-3c1d-4e2f-9a8b-7c6d5e4f3a2b";
    const BOT: &str = "+4915100000000";
    const GROUP: &str = "UmVhbGx5IGEgZ3JvdXAgaWQgb2YgMzIgYnl0ZXMhIQ==";

    /// What was sent to `recipient`.
    fn to(fake: &FakeSignal, recipient: &str) -> Vec<String> {
        let sent = fake.sent().into_iter().filter(|s| s["recipient"] == json!([recipient]));
        sent.map(|s| s["message"].as_str().unwrap_or_default().to_string()).collect()
    }

    async fn wait_to(fake: &FakeSignal, recipient: &str, n: usize, daemon: &Daemon) -> Vec<String> {
        let ok = wait_until(30, || to(fake, recipient).len() >= n).await;
        assert!(ok, "{n} message(s) to {recipient}: {:?}\n{}", fake.sent(), daemon.log());
        to(fake, recipient)
    }

    #[tokio::test]
    async fn a_signal_stranger_pairs_by_uuid_the_same_number_with_another_uuid_cannot_and_revoking_cuts_them_off() {
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let fake = FakeSignal::start().await;
        let home = home(
            &llm,
            &format!("[signal]\nendpoint = \"{}\"\naccount = \"{BOT}\"\nallow_from = [\"{OWNER}\"]\n", fake.url()),
        );
        let logs = tempfile::tempdir().unwrap();
        let daemon = Daemon::start_logging_to(home.path(), Some(&home.config), &logs.path().join("pair.log"));
        assert!(daemon.wait_log("Signal listening", 30).await, "{}", daemon.log());
        let mut ts = 1_000;
        let mut say = |number: &str, uuid: &str, text: &str| {
            ts += 1;
            fake.push(text_envelope(number, uuid, ts, text));
        };

        // No Signal code pending, then only a Discord one: not answered.
        say(BOB, BOB_UUID, "/pair ABCD-EFGH");
        let discord_code = other_code(&home, PairChannel::Discord);
        say(BOB, BOB_UUID, &format!("/pair {discord_code}"));
        llm.push(Reply::text("pong 1"));
        say(OWNER, OWNER_UUID, "ping 1");
        wait_to(&fake, OWNER_UUID, 1, &daemon).await;
        assert!(to(&fake, BOB_UUID).is_empty() && to(&fake, BOB).is_empty(), "nothing said: {:?}", fake.sent());

        let (ok, out) = pair_cli(&home, &["--channel", "signal"]);
        assert!(ok && out.contains(&format!("send this to {BOT}")), "{out}");
        let code = code_of(&out);
        // In a group: nothing, and not a try. Without a uuid: nothing.
        ts += 1;
        let mut in_group = text_envelope(BOB, BOB_UUID, ts, &format!("/pair {code}"));
        in_group["dataMessage"]["groupInfo"] = json!({"groupId": GROUP, "type": "DELIVER"});
        fake.push(in_group);
        ts += 1;
        let mut no_uuid = text_envelope(BOB, BOB_UUID, ts, &format!("/pair {code}"));
        no_uuid.as_object_mut().unwrap().remove("sourceUuid");
        fake.push(no_uuid);
        let mut say = |number: &str, uuid: &str, text: &str| {
            ts += 1;
            fake.push(text_envelope(number, uuid, ts, text));
        };
        say(BOB, BOB_UUID, "/pair WRON-GCOD");
        let said = wait_to(&fake, BOB_UUID, 1, &daemon).await;
        assert_eq!(said, ["That code is not right (4 tries left for it)."], "{}", daemon.log());
        past_try_gap().await;
        say(BOB, BOB_UUID, &format!("/pair {code}"));
        let said = wait_to(&fake, BOB_UUID, 2, &daemon).await;
        assert_eq!(said[1], "Paired: you can talk to me now.", "{}", daemon.log());
        llm.push(Reply::text("hello bob"));
        say(BOB, BOB_UUID, "hi, I am bob");
        assert_eq!(wait_to(&fake, BOB_UUID, 3, &daemon).await[2], "hello bob");
        let (ok, out) = pair_cli(&home, &["--channel", "signal", "--list"]);
        assert!(ok && out.contains(&format!("{BOB_UUID} ({BOB})")), "{out}");

        // Bob's number with another uuid (a re-registered number) is not bob, and cannot pair with a fresh code.
        let (ok, out) = pair_cli(&home, &["--channel", "signal"]);
        assert!(ok, "{out}");
        let fresh = code_of(&out);
        say(BOB, EVE_UUID, "it is me, bob, on a new phone");
        say(BOB, EVE_UUID, &format!("/pair {fresh}"));
        llm.push(Reply::text("pong 2"));
        say(OWNER, OWNER_UUID, "ping 2");
        wait_to(&fake, OWNER_UUID, 2, &daemon).await;
        assert!(to(&fake, EVE_UUID).is_empty(), "nothing said to the other uuid: {:?}", fake.sent());
        assert!(daemon.log().contains("refused as spoofed"), "{}", daemon.log());
        assert!(pairing::pending(&home.state, PairChannel::Signal, jiff::Timestamp::now()), "the code is not used up");

        // Revoked by the number bob came with: his next message is a stranger's.
        let (ok, out) = pair_cli(&home, &["--channel", "signal", "--revoke", BOB]);
        assert!(ok && out.contains("revoked"), "{out}");
        say(BOB, BOB_UUID, "still there?");
        // A stranger again: logged (before: bob in the group, then the other uuid).
        let ignored = "a Signal message from someone not in [signal] allow_from";
        assert!(daemon.wait_log_count(ignored, 3, 30).await, "{}", daemon.log());
        llm.push(Reply::text("pong 3"));
        say(OWNER, OWNER_UUID, "ping 3");
        wait_to(&fake, OWNER_UUID, 3, &daemon).await;
        let (exit, log) = daemon.stop().await;
        assert_eq!(exit, Some(0), "{log}");
        assert_eq!(to(&fake, BOB_UUID).len(), 3, "nothing answered after the revoke: {log}");
        assert_eq!(asked(&llm), ["ping 1", "hi, I am bob", "ping 2", "ping 3"], "no stranger text reached the model");
    }
}

#[cfg(feature = "feishu")]
mod feishu {
    use super::*;
    use crate::support::feishu::{self as fake, message_event, FakeFeishu, APP_SECRET};

    const SECRET_ENV: &str = "BRAMBLE_TEST_FEISHU_SECRET";
    const OWNER: &str = "ou_owner00000000000000000000000001";
    const BOB: &str = "ou_bob000000000000000000000000000042";
    const BOB_DM: &str = "oc_dm0000000000000000000000000000042";
    const GROUP: &str = "oc_group000000000000000000000000001";

    /// The texts sent to `chat`.
    fn to(feishu: &FakeFeishu, chat: &str) -> Vec<String> {
        let sent = feishu.sent().into_iter().filter(|m| m["receive_id"] == chat);
        sent.map(|m| {
            let content: Value = serde_json::from_str(m["content"].as_str().unwrap_or("{}")).unwrap_or_default();
            content["text"].as_str().unwrap_or_default().to_string()
        })
        .collect()
    }

    struct Chat<'a> {
        feishu: &'a FakeFeishu,
        daemon: &'a Daemon,
        n: u32,
    }

    impl Chat<'_> {
        /// `text` from `sender` in `chat`; returns once bramble answered the frame (handled).
        async fn say(&mut self, sender: &str, chat: &str, kind: &str, text: &str) {
            self.n += 1;
            let frame = format!("f{}", self.n);
            self.feishu.event(&frame, &message_event(&format!("ev{}", self.n), sender, chat, kind, text));
            let ok = wait_until(30, || self.feishu.answer(&frame).is_some()).await;
            assert!(ok, "frame {frame} answered: {}", self.daemon.log());
        }
    }

    #[tokio::test]
    async fn a_feishu_stranger_pairs_in_a_p2p_chat_only_with_a_feishu_code_and_revoking_cuts_them_off() {
        let llm = FakeLlm::start(Dialect::OpenAi).await;
        let feishu = FakeFeishu::start().await;
        let home = home(
            &llm,
            &format!(
                "[feishu]\napp_id = \"{}\"\napp_secret_env = \"{SECRET_ENV}\"\ndomain = \"lark\"\napi_base = \"{}\"\n\
                 allow_from = [\"{OWNER}\"]\n",
                fake::APP_ID,
                feishu.url()
            ),
        );
        let logs = tempfile::tempdir().unwrap();
        let env = [(SECRET_ENV, Path::new(APP_SECRET))];
        let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &logs.path().join("pair.log"), &env);
        assert!(wait_until(30, || feishu.upgrades() >= 1).await, "{}", daemon.log());
        let mut chat = Chat { feishu: &feishu, daemon: &daemon, n: 0 };

        // No Feishu code pending, then only a Discord one: not answered.
        chat.say(BOB, BOB_DM, "p2p", "/pair ABCD-EFGH").await;
        let discord_code = other_code(&home, PairChannel::Discord);
        chat.say(BOB, BOB_DM, "p2p", &format!("/pair {discord_code}")).await;
        assert!(to(&feishu, BOB_DM).is_empty(), "nothing said to a stranger: {:?}", feishu.sent());

        let (ok, out) = pair_cli(&home, &["--channel", "feishu"]);
        assert!(ok && out.contains("one-to-one chat"), "{out}");
        let code = code_of(&out);
        // In a group: nothing, and not a try.
        chat.say(BOB, GROUP, "group", &format!("/pair {code}")).await;
        assert!(to(&feishu, GROUP).is_empty());
        chat.say(BOB, BOB_DM, "p2p", "/pair WRON-GCOD").await;
        let ok = wait_until(30, || to(&feishu, BOB_DM).len() == 1).await;
        assert!(ok, "{:?}", feishu.sent());
        assert_eq!(to(&feishu, BOB_DM), ["That code is not right (4 tries left for it)."]);
        past_try_gap().await;
        chat.say(BOB, BOB_DM, "p2p", &format!("/pair {code}")).await;
        assert!(wait_until(30, || to(&feishu, BOB_DM).len() == 2).await, "{}", daemon.log());
        assert_eq!(to(&feishu, BOB_DM)[1], "Paired: you can talk to me now.");
        llm.push(Reply::text("hello bob"));
        chat.say(BOB, BOB_DM, "p2p", "hi, I am bob").await;
        assert!(wait_until(30, || to(&feishu, BOB_DM).len() == 3).await, "{}", daemon.log());
        assert_eq!(to(&feishu, BOB_DM)[2], "hello bob");
        let (ok, out) = pair_cli(&home, &["--channel", "feishu", "--list"]);
        assert!(ok && out.contains(BOB), "{out}");

        // Revoked: bob's next message is a stranger's.
        let (ok, out) = pair_cli(&home, &["--channel", "feishu", "--revoke", BOB]);
        assert!(ok && out.contains("revoked"), "{out}");
        chat.say(BOB, BOB_DM, "p2p", "still there?").await;
        // A stranger again: logged (the first time was the group /pair).
        let ignored = "not in [feishu] allow_from was ignored";
        assert!(daemon.wait_log_count(ignored, 2, 30).await, "{}", daemon.log());
        let (exit, log) = daemon.stop().await;
        assert_eq!(exit, Some(0), "{log}");
        assert_eq!(to(&feishu, BOB_DM).len(), 3, "nothing answered after the revoke: {log}");
        assert_eq!(asked(&llm), ["hi, I am bob"], "no stranger text reached the model");
    }
}
