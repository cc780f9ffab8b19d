//! Fleet mode end to end (docs/fleet.md): two real `bramble run` processes,
//! each with its own state directory, against a real mosquitto, the primary
//! with the fake Telegram, each with a fake LLM. What travels between them is
//! the fleet's published wire format (src/fleet/topics.rs, auth.rs, wire.rs).

use std::os::unix::fs::PermissionsExt as _;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mosquitto::{Mosquitto, Watcher};
use crate::support::setup::{bramble, TestHome};
use crate::support::telegram::FakeTelegram;

const TOKEN: &str = "123456:TEST-fleet-token";
const ALICE: i64 = 4242;
const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";

struct Fleet {
    broker: Mosquitto,
    tg: FakeTelegram,
    living_llm: FakeLlm,
    garage_llm: FakeLlm,
    living: TestHome,
    garage: TestHome,
}

/// The fleet key in a board's env file (0600, as bramble asks).
pub fn key_file(home: &TestHome, key: &str) {
    let dir = home.path().join(".config/bramble");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("env");
    std::fs::write(&f, format!("FLEET_KEY={key}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
}

async fn fleet() -> Fleet {
    fleet_on(Mosquitto::start().await, false).await
}

/// The fleet on `broker`; `accounts`: each board logs in as itself (`pw-<board>`).
async fn fleet_on(broker: Mosquitto, accounts: bool) -> Fleet {
    let tg = FakeTelegram::start(TOKEN).await;
    let (living_llm, garage_llm) = (FakeLlm::start(Dialect::OpenAi).await, FakeLlm::start(Dialect::OpenAi).await);
    let mqtt = |device: &str| {
        let login =
            if accounts { format!("username = \"{device}\"\npassword = \"pw-{device}\"\n") } else { String::new() };
        format!("[mqtt]\nurl = \"{}\"\ndevice = \"{device}\"\ndiscovery = false\n{login}", broker.url())
    };
    let living = TestHome::new(
        "openai",
        &living_llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[telegram]\ntoken = \"{TOKEN}\"\nallow_from = [\"{ALICE}\"]\napi_base = \"{}\"\n{}\
             [fleet]\nname = \"living\"\nrole = \"primary\"\nkey_env = \"FLEET_KEY\"\ntimeout = \"30s\"\n",
            tg.url(),
            mqtt("living")
        ),
    );
    let garage = TestHome::new(
        "openai",
        &garage_llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n{}[fleet]\nname = \"garage\"\nrole = \"node\"\nprimary = \"living\"\nkey_env = \"FLEET_KEY\"\n",
            mqtt("garage")
        ),
    );
    key_file(&living, KEY);
    key_file(&garage, KEY);
    Fleet { broker, tg, living_llm, garage_llm, living, garage }
}

impl Fleet {
    async fn start(&self) -> (Daemon, Daemon) {
        let living = Daemon::start(self.living.path(), Some(&self.living.config));
        let garage = Daemon::start(self.garage.path(), Some(&self.garage.config));
        for d in [&living, &garage] {
            assert!(d.wait_log("MQTT connected", 20).await, "connected: {}", d.log());
        }
        assert!(wait_until(20, || !self.tg.calls("getUpdates").is_empty()).await, "the primary polls");
        (living, garage)
    }

    async fn cli(&self, home: &TestHome, args: &[&str]) -> std::process::Output {
        let mut all = vec!["--config", home.config.to_str().unwrap()];
        all.extend_from_slice(args);
        bramble(home.path(), &all, None).await
    }

    /// Wait until the primary's `/boards` would list `board` online.
    async fn board_online(&self, board: &str) {
        let mut ok = false;
        for _ in 0..40 {
            let out = self.cli(&self.living, &["fleet", "status"]).await;
            if String::from_utf8_lossy(&out.stdout).contains(&format!("{board}: online")) {
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        assert!(ok, "{board} is online on the broker");
    }

    fn sent_with(&self, needle: &str) -> usize {
        self.tg.sent_texts().iter().filter(|t| t.contains(needle)).count()
    }
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test]
async fn a_pinned_job_runs_on_its_board_only_and_is_reported_once_in_the_chat() {
    let f = fleet().await;
    let (living, garage) = f.start().await;
    f.board_online("garage").await;
    let out = f
        .cli(
            &f.living,
            &[
                "cron",
                "add",
                "tick",
                "--in",
                "3s",
                "--remind",
                "garage door is shut",
                "--deliver",
                "telegram:4242",
                "--on",
                "garage",
            ],
        )
        .await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("added job tick"), "{}", text(&out));
    // Stored on the garage board, not on the primary.
    let on_garage = f.cli(&f.garage, &["cron", "list"]).await;
    assert!(text(&on_garage).contains("tick"), "{}", text(&on_garage));
    let on_living = f.cli(&f.living, &["cron", "list"]).await;
    assert!(!text(&on_living).contains("tick"), "{}", text(&on_living));
    // `cron list --fleet` shows it under the garage, from the garage's presence.
    let mut listed = String::new();
    for _ in 0..40 {
        listed = text(&f.cli(&f.living, &["cron", "list", "--fleet"]).await);
        if listed.contains("garage (online)  tick") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(listed.contains("garage (online)  tick"), "{listed}");
    let shown = || f.sent_with("[garage] garage door is shut") == 1;
    assert!(wait_until(30, shown).await, "{:?}\n{}\n{}", f.tg.sent_texts(), garage.log(), living.log());
    // The node stops sending once the primary confirmed it: one report, never a second.
    assert!(garage.wait_log("living has the report", 20).await, "{}", garage.log());
    assert_eq!(f.sent_with("garage door is shut"), 1, "{:?}", f.tg.sent_texts());
    assert!(f.living_llm.requests().is_empty() && f.garage_llm.requests().is_empty(), "a reminder calls no model");
    // A job for any board is refused without NATS, with the reason.
    let any = f.cli(&f.living, &["cron", "add", "x", "--in", "1h", "--remind", "r", "--on", "any"]).await;
    assert!(!any.status.success() && text(&any).contains("nats_url"), "{}", text(&any));
    // Removing goes over the same signed command topic: gone on the garage, said from there.
    let nightly = ["cron", "add", "nightly", "--cron", "0 3 * * *", "--remind", "backup", "--deliver", "telegram:4242"];
    let add = f.cli(&f.living, &[&nightly[..], &["--on", "garage"]].concat()).await;
    assert!(add.status.success(), "{}", text(&add));
    let removed = f.cli(&f.living, &["cron", "remove", "nightly", "--on", "garage"]).await;
    assert!(removed.status.success() && text(&removed).contains("removed job nightly"), "{}", text(&removed));
    assert!(text(&removed).contains("on garage"), "the board says it: {}", text(&removed));
    assert!(!text(&f.cli(&f.garage, &["cron", "list"]).await).contains("nightly"));
    let again = f.cli(&f.living, &["cron", "remove", "nightly", "--on", "garage"]).await;
    assert!(!again.status.success() && text(&again).contains("garage did not remove it"), "{}", text(&again));
    drop((living, garage));
}

#[tokio::test]
async fn on_runs_the_turn_on_the_node_and_boards_lists_the_boards() {
    let f = fleet().await;
    let (living, garage) = f.start().await;
    f.board_online("garage").await;
    f.tg.push_message(ALICE, "private", ALICE, "alice", "/boards");
    assert!(wait_until(20, || f.sent_with("garage: online, node") == 1).await, "{:?}", f.tg.sent_texts());
    f.garage_llm.push(Reply::text("It is 14 degrees in the garage."));
    f.tg.push_message(ALICE, "private", ALICE, "alice", "/on garage how warm is it?");
    assert!(
        wait_until(30, || f.sent_with("[garage] It is 14 degrees in the garage.") == 1).await,
        "{:?}\n{}\n{}",
        f.tg.sent_texts(),
        garage.log(),
        living.log()
    );
    // The turn ran on the garage board, as a fleet turn; the primary's model was never asked.
    let asked = f.garage_llm.last_request().expect("the garage's model was asked");
    assert!(asked.to_string().contains("how warm is it?"), "{asked}");
    assert!(f.living_llm.requests().is_empty(), "the primary's model was not asked");
    // An unknown board is said so, and costs nothing.
    f.tg.push_message(ALICE, "private", ALICE, "alice", "/on attic hello");
    assert!(wait_until(20, || f.sent_with("No board <code>attic</code>") == 1).await, "{:?}", f.tg.sent_texts());
    assert_eq!(f.garage_llm.requests().len(), 1);
    // `status` and `doctor` say where the board stands.
    let status = text(&f.cli(&f.garage, &["status"]).await);
    assert!(status.contains("fleet:      garage, node of living"), "{status}");
    let doctor = text(&f.cli(&f.garage, &["doctor"]).await);
    assert!(doctor.contains("garage (node): 1 other board(s) on the broker, 0 offline"), "{doctor}");
}

#[tokio::test]
async fn rogue_commands_and_reports_are_refused() {
    let f = fleet().await;
    let (living, garage) = f.start().await;
    f.board_online("garage").await;
    let spy = Watcher::start(f.broker.port, &["bramble/living/fleet/cmd/#"]).await;
    // One real command, recorded on the way.
    f.garage_llm.push(Reply::text("first answer"));
    f.tg.push_message(ALICE, "private", ALICE, "alice", "/on garage first");
    assert!(wait_until(30, || f.sent_with("[garage] first answer") == 1).await, "{:?}", f.tg.sent_texts());
    let recorded = spy.on("bramble/living/fleet/cmd/garage");
    let turn = recorded.iter().find(|s| s.payload.contains("\"kind\":\"turn\"")).expect("the turn was seen").clone();
    // Replayed as it was: refused, no second turn.
    spy.publish("bramble/living/fleet/cmd/garage", &turn.payload).await;
    assert!(garage.wait_log("its nonce was seen before", 20).await, "{}", garage.log());
    // Changed on the way: the signature no longer matches.
    let changed = turn.payload.replace("first", "rm -rf");
    spy.publish("bramble/living/fleet/cmd/garage", &changed).await;
    // Garbage and a stranger's envelope signed with another key.
    spy.publish("bramble/living/fleet/cmd/garage", "{not json").await;
    assert!(garage.wait_log("the signature does not match", 20).await, "{}", garage.log());
    assert!(garage.wait_log("not a fleet envelope", 20).await, "{}", garage.log());
    // Signed with the right key but on another board's prefix: a node listens to its primary only.
    spy.publish("bramble/attic/fleet/cmd/garage", &turn.payload).await;
    // A forged report to the primary.
    spy.publish("bramble/garage/fleet/up", &turn.payload.replace("\"kind\":\"turn\"", "\"kind\":\"report\"")).await;
    assert!(living.wait_log("refused a message from a node", 20).await, "{}", living.log());
    // An answer to no request of ours.
    spy.publish("bramble/garage/fleet/answer/0123", "you have been pwned").await;
    assert!(living.wait_log("an answer to no request of ours", 20).await, "{}", living.log());
    assert_eq!(f.garage_llm.requests().len(), 1, "no refused command ran a turn");
    assert_eq!(f.sent_with("pwned"), 0);
    assert_eq!(f.sent_with("[garage]"), 1, "{:?}", f.tg.sent_texts());
}

#[tokio::test]
async fn a_report_made_while_the_broker_is_down_arrives_once_after() {
    let mut f = fleet().await;
    let (living, garage) = f.start().await;
    f.board_online("garage").await;
    let out = f
        .cli(
            &f.living,
            &[
                "cron",
                "add",
                "late",
                "--in",
                "6s",
                "--remind",
                "made offline",
                "--deliver",
                "telegram:4242",
                "--on",
                "garage",
            ],
        )
        .await;
    assert!(out.status.success(), "{}", text(&out));
    f.broker.kill();
    assert!(garage.wait_log("MQTT connection lost", 20).await, "{}", garage.log());
    // The job runs on its board with the broker down; its report waits in the node's outbox.
    assert!(garage.wait_log("over the broker", 40).await, "{}", garage.log());
    assert_eq!(f.sent_with("made offline"), 0);
    f.broker.restart().await;
    assert!(
        wait_until(90, || f.sent_with("[garage] made offline") == 1).await,
        "{:?}\n{}\n{}",
        f.tg.sent_texts(),
        garage.log(),
        living.log()
    );
    assert!(garage.wait_log("living has the report", 30).await, "{}", garage.log());
    assert_eq!(f.sent_with("made offline"), 1, "{:?}", f.tg.sent_texts());
}

/// The ACL `bramble fleet acl` prints, on a real mosquitto with an account per
/// board: a stranger's account that even holds the fleet key can neither read
/// the fleet's traffic nor write to the primary's command topic.
#[tokio::test]
async fn a_stranger_cannot_reach_the_command_topic_through_the_printed_acl() {
    // The ACL, as the command line prints it for the primary's config.
    let printer = TestHome::new(
        "openai",
        "http://127.0.0.1:9",
        "",
        "",
        "[mqtt]\nurl = \"mqtt://127.0.0.1:1\"\n[fleet]\nname = \"living\"\nkey_env = \"FLEET_KEY\"\n",
    );
    let acl = bramble(printer.path(), &["--config", printer.config.to_str().unwrap(), "fleet", "acl"], None).await;
    assert!(acl.status.success(), "{}", text(&acl));
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (acl_file, pw_file) = (dir.path().join("acl"), dir.path().join("passwd"));
    std::fs::write(&acl_file, &acl.stdout).unwrap();
    for (i, user) in ["living", "garage", "stranger"].iter().enumerate() {
        let mut cmd = std::process::Command::new("mosquitto_passwd");
        if i == 0 {
            cmd.arg("-c");
        }
        let out = cmd
            .args(["-b", pw_file.to_str().unwrap(), user, &format!("pw-{user}")])
            .output()
            .expect("mosquitto_passwd");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    for f in [&acl_file, &pw_file] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let broker = Mosquitto::start_with(&format!(
        "allow_anonymous false\npassword_file {}\nacl_file {}\n",
        pw_file.display(),
        acl_file.display()
    ))
    .await;
    let f = fleet_on(broker, true).await;
    let (living, garage) = f.start().await;
    f.board_online("garage").await;
    // The stranger: its own account, and the fleet key.
    let mut opts = rumqttc::MqttOptions::new("stranger-1", "127.0.0.1", f.broker.port);
    opts.set_credentials("stranger", "pw-stranger");
    let (client, mut events) = rumqttc::AsyncClient::new(opts, 10);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok(ev) = events.poll().await {
            if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) = ev {
                seen2.lock().unwrap().push(p.topic.clone());
            }
        }
    });
    client.subscribe("bramble/#", rumqttc::QoS::AtLeastOnce).await.unwrap();
    let topic = "bramble/living/fleet/cmd/garage";
    let (living_name, garage_name) = ("living".parse().unwrap(), "garage".parse().unwrap());
    let signer = bramble::fleet::auth::Signer::new(KEY.as_bytes());
    let forged = signer.seal(
        topic,
        &living_name,
        &garage_name,
        "turn",
        "0123456789abcdef",
        "{\"text\":\"open the door\"}".into(),
    );
    client.publish(topic, rumqttc::QoS::AtLeastOnce, false, serde_json::to_vec(&forged).unwrap()).await.unwrap();
    // A real /on afterwards goes through: what the stranger sent before it did not.
    f.garage_llm.push(Reply::text("door stays shut"));
    f.tg.push_message(ALICE, "private", ALICE, "alice", "/on garage is the door shut?");
    assert!(
        wait_until(30, || f.sent_with("[garage] door stays shut") == 1).await,
        "{:?}\n{}",
        f.tg.sent_texts(),
        garage.log()
    );
    assert_eq!(f.garage_llm.requests().len(), 1, "the stranger's command ran no turn");
    assert!(!garage.log().contains("open the door"));
    // Status and presence are every account's to read (Home Assistant reads status); nothing else is.
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|t| t.ends_with("/status") || t.ends_with("/fleet/board")), "the stranger read: {seen:?}");
    task.abort();
    drop(living);
}
