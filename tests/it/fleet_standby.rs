//! Tier 2 of fleet mode end to end (docs/fleet.md, "The chat survives the
//! primary"): a primary and a standby, two real `bramble run` processes with
//! their own state directories and models, one real mosquitto, and one fake
//! Telegram bot reached through two doors so each board's `getUpdates` is
//! counted apart (tests/it/support/telegram.rs: the Bot API's published JSON,
//! and its rule that a newer poll ends an older one with 409).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fleet::key_file;
use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::{bramble, TestHome};
use crate::support::telegram::{Door, Doors, FakeTelegram};

const TOKEN: &str = "123456:TEST-standby-token";
const ALICE: i64 = 4242;
const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";
/// `[fleet] takeover_after` here.
const GRACE: u64 = 5;

struct Pair {
    broker: Mosquitto,
    tg: FakeTelegram,
    doors: Arc<Doors>,
    _living_door: Door,
    _garage_door: Door,
    living_llm: FakeLlm,
    garage_llm: FakeLlm,
    living: TestHome,
    garage: TestHome,
}

/// The text of the last user message in a model request.
fn asked(req: &Value) -> String {
    let msgs = req["messages"].as_array().cloned().unwrap_or_default();
    let last = msgs.iter().rev().find(|m| m["role"] == "user").cloned().unwrap_or(Value::Null);
    match &last["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A model that answers `<word>` with `answer-<word>` (`tag`: which board).
async fn echo_llm(tag: &'static str) -> FakeLlm {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    llm.route(move |req| {
        let text = asked(req);
        let word = text.split_whitespace().last().unwrap_or("?").to_string();
        Some(Reply::text(format!("answer-{word} from {tag}")))
    });
    llm
}

async fn pair() -> Pair {
    pair_as("role = \"standby\"\nprimary = \"living\"\n").await
}

/// The pair, the garage's role given by `garage_fleet`.
async fn pair_as(garage_fleet: &str) -> Pair {
    let broker = Mosquitto::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let doors = Arc::new(Doors::default());
    let (living_door, garage_door) = (tg.door("living", &doors).await, tg.door("garage", &doors).await);
    let (living_llm, garage_llm) = (echo_llm("living").await, echo_llm("garage").await);
    let home = |name: &str, llm: &FakeLlm, door: &Door, fleet: &str| {
        let h = TestHome::new(
            "openai",
            &llm.base_url(),
            "",
            "max_retries = 0\n",
            &format!(
                "[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"{ALICE}\"]\napi_base = \"{}\"\n\
                 [mqtt]\nurl = \"{}\"\ndevice = \"{name}\"\ndiscovery = false\n\
                 [fleet]\nname = \"{name}\"\nkey_env = \"FLEET_KEY\"\ntakeover_after = \"{GRACE}s\"\n{fleet}",
                door.url(),
                broker.url()
            ),
        );
        key_file(&h, KEY);
        h
    };
    let living = home("living", &living_llm, &living_door, "role = \"primary\"\n");
    let garage = home("garage", &garage_llm, &garage_door, garage_fleet);
    Pair {
        broker,
        tg,
        doors,
        _living_door: living_door,
        _garage_door: garage_door,
        living_llm,
        garage_llm,
        living,
        garage,
    }
}

impl Pair {
    fn start(&self, home: &TestHome) -> Daemon {
        Daemon::start(home.path(), Some(&home.config))
    }

    fn polls_of(&self, door: &str) -> usize {
        self.doors.offsets_of(door).len()
    }

    fn sent_with(&self, needle: &str) -> usize {
        self.tg.sent_texts().iter().filter(|t| t.contains(needle)).count()
    }

    /// Alice says `word`; returns its update id.
    fn say(&self, word: &str) -> i64 {
        self.tg.push_message(ALICE, "private", ALICE, "alice", &format!("please {word}"))
    }

    async fn status(&self, home: &TestHome) -> String {
        let out = bramble(home.path(), &["--config", home.config.to_str().unwrap(), "fleet", "status"], None).await;
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// How many model turns were asked `word`, on both boards.
    fn turns_for(&self, word: &str) -> usize {
        let needle = format!("please {word}");
        [&self.living_llm, &self.garage_llm].iter().flat_map(|l| l.requests()).filter(|r| asked(r) == needle).count()
    }
}

#[tokio::test]
async fn the_standby_takes_the_chat_when_the_primary_dies_and_hands_it_back() {
    let p = pair().await;
    let living = p.start(&p.living);
    let garage = p.start(&p.garage);
    assert!(wait_until(30, || p.polls_of("living") > 0).await, "the primary polls: {}", living.log());
    assert!(garage.wait_log("MQTT connected", 20).await, "{}", garage.log());
    p.say("alpha");
    assert!(wait_until(30, || p.sent_with("answer-alpha from living") == 1).await, "{:?}", p.tg.sent_texts());
    assert_eq!(p.polls_of("garage"), 0, "the standby never polls while the primary is online");
    let mut shown = String::new();
    for _ in 0..40 {
        shown = p.status(&p.garage).await;
        if shown.contains("living: online, primary") && shown.contains("holds the chat") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(shown.contains("holds the chat") && shown.contains("garage (this board): online, standby"), "{shown}");

    // The primary dies without a word; Alice writes in the gap; a 409 greets the standby's first poll.
    let died = Instant::now();
    let living_log = living.kill9().await;
    p.tg.fail_next("getUpdates", 409, "Conflict: terminated by other getUpdates request", None);
    let bravo = p.say("bravo");
    assert!(wait_until(GRACE + 30, || p.polls_of("garage") > 0).await, "the standby polls: {}", garage.log());
    assert!(died.elapsed() >= Duration::from_secs(GRACE), "not before the grace period");
    assert!(
        wait_until(30, || p.sent_with("answer-bravo from garage") == 1).await,
        "{:?}\n{}\n{living_log}",
        p.tg.sent_texts(),
        garage.log()
    );
    assert!(garage.log().contains("another poller or a webhook holds this bot"), "a 409, met: {}", garage.log());
    // It started at the offset the primary published: alpha is not handled again.
    assert_eq!(p.doors.offsets_of("garage").first(), Some(&bravo), "{:?}", p.doors.polls());
    let charlie = p.say("charlie");
    assert!(wait_until(30, || p.sent_with("answer-charlie from garage") == 1).await, "{:?}", p.tg.sent_texts());

    // The primary comes back: the standby lets go, the primary resumes from the shared offset.
    let living = p.start(&p.living);
    assert!(garage.wait_log("handed the chat back", 40).await, "{}\n{}", garage.log(), living.log());
    let garage_polls = p.polls_of("garage");
    assert!(wait_until(30, || p.doors.offsets_of("living").last() > Some(&charlie)).await, "{:?}", p.doors.polls());
    p.say("delta");
    assert!(
        wait_until(30, || p.sent_with("answer-delta from living") == 1).await,
        "{:?}\n{}",
        p.tg.sent_texts(),
        living.log()
    );
    assert_eq!(p.polls_of("garage"), garage_polls, "the standby polls no more");

    // No update answered twice, none lost.
    for word in ["alpha", "bravo", "charlie", "delta"] {
        assert_eq!(p.turns_for(word), 1, "{word}: {:?}", p.tg.sent_texts());
        assert_eq!(p.sent_with(&format!("answer-{word} ")), 1, "{word}: {:?}", p.tg.sent_texts());
    }
    drop((living, garage, p.broker));
}

#[tokio::test]
async fn a_forged_offset_is_ignored() {
    let p = pair().await;
    let living = p.start(&p.living);
    let garage = p.start(&p.garage);
    assert!(wait_until(30, || p.polls_of("living") > 0).await, "the primary polls: {}", living.log());
    assert!(garage.wait_log("MQTT connected", 20).await, "{}", garage.log());
    let rogue = Watcher::start(p.broker.port, &["bramble/+/fleet/chat"]).await;
    // The garage says it holds the chat and is far ahead: signed with another key, and unsigned.
    let (garage_name, topic) = ("garage".parse().unwrap(), "bramble/garage/fleet/chat");
    let other = bramble::fleet::auth::Signer::new(b"r".repeat(48).as_slice());
    let body = "{\"bot\":424242,\"next\":99999999,\"holding\":true}".to_string();
    let forged = other.seal(topic, &garage_name, &garage_name, "chat", "", body.clone());
    rogue.publish_retained(topic, &serde_json::to_string(&forged).unwrap()).await;
    rogue.publish_retained("bramble/attic/fleet/chat", &body).await;
    assert!(living.wait_log("ignored a chat offset", 20).await, "{}", living.log());
    assert!(living.wait_log("not a fleet envelope", 20).await, "{}", living.log());
    // The primary still polls from where it was, and answers.
    p.say("echo");
    assert!(wait_until(30, || p.sent_with("answer-echo from living") == 1).await, "{:?}", p.tg.sent_texts());
    assert!(p.doors.offsets_of("living").iter().all(|o| *o < 99999999), "{:?}", p.doors.polls());
    assert_eq!(p.polls_of("garage"), 0);
    drop((living, garage));
}

/// The idle cost of a standby while the primary holds the chat, next to the
/// same board as a plain node without the bot (wake-ups a minute). A
/// measurement, not a check: `cargo test --test it fleet_standby::idle -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn idle_cost_of_a_standby() {
    for (name, fleet, telegram) in [
        ("standby", "role = \"standby\"\nprimary = \"living\"\n", true),
        ("node", "role = \"node\"\nprimary = \"living\"\n", false),
    ] {
        let p = pair_as(fleet).await;
        if !telegram {
            let config = std::fs::read_to_string(&p.garage.config).unwrap();
            let without = config.replace(&format!("token = \"{TOKEN}\""), "");
            std::fs::write(&p.garage.config, without).unwrap();
        }
        let living = p.start(&p.living);
        let garage = p.start(&p.garage);
        assert!(wait_until(30, || p.polls_of("living") > 0).await, "{}", living.log());
        assert!(garage.wait_log("MQTT connected", 20).await, "{}", garage.log());
        tokio::time::sleep(Duration::from_secs(10)).await;
        let before = crate::support::procstat::sample(garage.pid());
        tokio::time::sleep(Duration::from_secs(60)).await;
        let woke = crate::support::procstat::sample(garage.pid()).woke_since(&before);
        println!("idle {name}: {woke} wake-ups in 60 s, {} getUpdates", p.polls_of("garage"));
        drop((living, garage));
    }
}
